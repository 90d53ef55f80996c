/*
 * agent_rdzv.c - the host agent's part of the world rendezvous (issue 30,
 * docs/scale.md "Rendezvous per host"): the agent counts its local ranks in
 * on the store with one tdist_store_rendezvous_host call per batch, instead
 * of every rank doing its own three or four requests.
 *
 *   - A rank's tdist_init_process_group (store/rdzv_host.c) connects to
 *     TDIST_HOST_AGENT and says "rdzv <rank> <size> <timeout_ms> <me>". The
 *     loop thread checks it (one of this host's ranks, the job's world
 *     size, not claimed twice this round: else "err <code> <message>") and
 *     keeps the connection pending.
 *   - When every local rank is pending or counted, or no new one came for
 *     RDZV_WINDOW_MS (a rank that joins the store by itself, or one that is
 *     slow to start: the others need not wait for it), the pending ones
 *     become a batch: a thread of its own, owning their descriptors, opens
 *     a store connection, calls tdist_store_rendezvous_host for them, and
 *     answers each "go <job>" (or the error), then closes. Batches run
 *     concurrently (one may wait for the next one's ranks).
 *   - A rank whose connection closes before its batch is withdrawn.
 *
 * Threads: the loop thread (agent.c) runs everything here but batch_main;
 * a batch thread is detached and touches nothing of the agent's.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "agent_impl.h"

/* How long the agent waits for more of its ranks before counting in those
 * that came (a partial batch costs the store one more request, not time). */
#define RDZV_WINDOW_MS 200

typedef struct batch {
  char addr[256];
  int port, host, world, n;
  int64_t timeout_ms;
  int fds[]; /* the batch's ranks' connections, owned here */
} batch_t;

/* (batch thread) Count the batch in and answer every rank of it. */
static void *batch_main(void *arg) {
  batch_t *b = arg;
  tdist_store_t *s = NULL;
  char job[128] = "", line[640];
  tdist_store_opts_t so = {.mask = TDIST_STORE_FIELD_TIMEOUT, .timeout_ms = b->timeout_ms};
  int rc = tdist_store_connect(b->addr, b->port, &so, &s);
  if (rc == 0)
    rc = tdist_store_rendezvous_host(s, b->host, b->n, b->world, b->timeout_ms, job, sizeof(job));
  int len = rc == 0 ? snprintf(line, sizeof(line), "go %s\n", job)
                    : snprintf(line, sizeof(line), "err %d %.560s\n", rc, tdist_last_error());
  if (len >= (int)sizeof(line)) len = (int)sizeof(line) - 1;
  for (int i = 0; i + 1 < len; i++)
    if (line[i] == '\n') line[i] = ' ';
  line[len - 1] = '\n';
  for (int i = 0; i < b->n; i++) {
    /* a small line into an empty socket: a rank gone meanwhile loses it */
    if (send(b->fds[i], line, (size_t)len, MSG_NOSIGNAL) < 0) {
    }
    close(b->fds[i]);
  }
  tdist_store_release(s);
  free(b);
  return NULL;
}

/* (loop, holding mu) Refuse entry r's request with code and message. */
static void refuse(arank_t *r, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void refuse(arank_t *r, int code, const char *fmt, ...) {
  char line[512];
  int n = snprintf(line, sizeof(line), "err %d ", code);
  va_list ap;
  va_start(ap, fmt);
  n += vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
  va_end(ap);
  if (n > (int)sizeof(line) - 2) n = (int)sizeof(line) - 2;
  line[n++] = '\n';
  trun_agent_tell(r, line, (size_t)n);
  r->state = A_DONE; /* closed by the rank on the answer; then by the loop */
}

void trun_rdzv_line(trun_agent_t *a, arank_t *r, const char *args) {
  int rank = -1, size = -1, off = 0;
  long long timeout = 0;
  if (sscanf(args, "%d %d %lld %n", &rank, &size, &timeout, &off) != 3 || timeout <= 0 ||
      off <= 0) {
    refuse(r, TDIST_ERR_PROTOCOL, "host agent %d: malformed rendezvous request", a->host);
    return;
  }
  if (size != a->world || rank < a->first || rank >= a->first + a->nlocal) {
    refuse(r, TDIST_ERR_INVALID_ARGUMENT,
           "RANK=%d WORLD_SIZE=%d is not one of host %d's ranks (%d-%d of %d): set by hand "
           "under tdistrun?",
           rank, size, a->host, a->first, a->first + a->nlocal - 1, a->world);
    return;
  }
  if (!a->seen && !(a->seen = calloc((size_t)a->nlocal, sizeof(char *)))) {
    refuse(r, TDIST_ERR_NO_MEMORY, "host agent %d: out of memory", a->host);
    return;
  }
  char **seen = &a->seen[rank - a->first];
  if (*seen) {
    refuse(r, TDIST_ERR_INVALID_ARGUMENT, "RANK=%d is claimed by two processes: %s and %s", rank,
           *seen, args + off);
    return;
  }
  *seen = strdup(args + off);
  r->rank = rank;
  r->next = timeout;
  snprintf(r->why, sizeof(r->why), "%s", args + off);
  r->state = A_RDZV;
  a->pending++;
  a->last_arrival_ms = trun_now_ms();
}

void trun_rdzv_gone(trun_agent_t *a, arank_t *r) {
  a->pending--;
  if (a->seen) {
    free(a->seen[r->rank - a->first]);
    a->seen[r->rank - a->first] = NULL;
  }
  r->state = A_DONE;
}

/* (loop) Hand the pending entries to a new batch thread. */
static void start_batch(trun_agent_t *a) {
  batch_t *b = calloc(1, sizeof(*b) + sizeof(int) * (size_t)a->pending);
  if (!b) return; /* tried again next round */
  snprintf(b->addr, sizeof(b->addr), "%s", a->addr);
  b->port = a->port;
  b->host = a->host;
  b->world = a->world;
  pthread_mutex_lock(&a->mu);
  for (int i = 0; i < a->n; i++) {
    arank_t *r = &a->r[i];
    if (r->state != A_RDZV) continue;
    if (r->next > b->timeout_ms) b->timeout_ms = r->next;
    b->fds[b->n++] = r->fd; /* the batch's now */
    r->fd = -1;
    r->state = A_DONE;
  }
  pthread_mutex_unlock(&a->mu);
  pthread_t t;
  pthread_attr_t at;
  pthread_attr_init(&at);
  pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
  if (pthread_create(&t, &at, batch_main, b) != 0) {
    /* No thread: the ranks are told, and fail their init with it. */
    for (int i = 0; i < b->n; i++) {
      const char *no = "err -11 host agent: no thread for the rendezvous\n";
      if (send(b->fds[i], no, strlen(no), MSG_NOSIGNAL) < 0) {
      }
      close(b->fds[i]);
    }
    free(b);
  }
  pthread_attr_destroy(&at);
  a->counted += a->pending;
  a->pending = 0;
  if (a->counted >= a->nlocal) { /* the round is complete here: a new one may come */
    a->counted = 0;
    for (int i = 0; i < a->nlocal; i++) {
      free(a->seen[i]);
      a->seen[i] = NULL;
    }
  }
}

int64_t trun_rdzv_tick(trun_agent_t *a, int64_t wait_ms) {
  if (!a->pending) return wait_ms;
  int64_t quiet = trun_now_ms() - a->last_arrival_ms;
  if (a->pending + a->counted >= a->nlocal || quiet >= RDZV_WINDOW_MS) {
    start_batch(a);
    return wait_ms;
  }
  return RDZV_WINDOW_MS - quiet < wait_ms ? RDZV_WINDOW_MS - quiet : wait_ms;
}

void trun_rdzv_free(trun_agent_t *a) {
  for (int i = 0; a->seen && i < a->nlocal; i++)
    free(a->seen[i]);
  free(a->seen);
  a->seen = NULL;
}
