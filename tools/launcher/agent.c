/*
 * agent.c - the host agent (tdistrun.h, docs/architecture.md "Liveness"):
 * the launcher stands for its ranks before the store, as torchelastic's
 * agent does, so the store sees O(hosts) heartbeats and record watchers,
 * not O(ranks).
 *
 *   - Every local rank's monitor (core/group/heartbeat.c) connects to the
 *     agent's abstract unix socket (TDIST_HOST_AGENT) and says
 *     "hello <rank> <next record>", then "hb <value>" every heartbeat
 *     interval and "bye" when it leaves.
 *   - The agent writes "tdist/hbh/<host>" (host = node rank) every
 *     TDIST_HEARTBEAT_INTERVAL_MS, and at once when something changed:
 *     a line per rank, "<rank> a <value>" (alive), "<rank> b" (left) or
 *     "<rank> d <reason>" (dead). The store's detector (store/liveness.c)
 *     declares a "d" rank dead with today's records, and every listed rank
 *     when this host's beats stop or its connection closes.
 *   - A rank is dead when its connection closes without "bye" (killed:
 *     known at once) or its "hb" lines stop for TDIST_HEARTBEAT_TIMEOUT_MS
 *     (hung or stopped), judged right after reading what was pending.
 *   - One watcher per host: the relay thread waits on the next
 *     "tdist/aborts/<n>", reads every new record in one multi_get and
 *     sends "rec <n> <record>" to each local rank whose monitor started
 *     before record n; "ok" follows each beat that reached the store (the
 *     ranks' sign that the store answers).
 *   - The agent's death is the launcher's, which kills its ranks
 *     (PR_SET_PDEATHSIG, ranks.c), and closes its store connection, so the
 *     store declares its ranks dead at once: true, since they are killed.
 *
 * Threads: the loop thread (socket, beats, judging), the relay thread
 * (records); start and stop from the launcher's main thread. `mu` guards
 * the rank table against the relay thread's sends; the loop thread alone
 * changes it. No store call is made holding `mu`.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "tdist/tdist.h"
#include "tdistrun.h"

#include "agent_impl.h"
#include "agent_proxy.h"

int64_t trun_now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static int64_t env_ms(const char *name, int64_t def) {
  const char *v = getenv(name);
  return v && *v ? strtoll(v, NULL, 10) : def;
}

/* (loop or relay, holding mu) One line to a rank; never blocks: a rank that
 * does not read (stopped) loses it, and is judged by its beats. */
void trun_agent_tell(arank_t *r, const char *line, size_t len) {
  if (r->fd < 0) return;
  ssize_t n = send(r->fd, line, len, MSG_DONTWAIT | MSG_NOSIGNAL);
  if (n >= 0 && (size_t)n != len)
    fprintf(stderr, "tdistrun: host agent: rank %d's socket is full, a line was cut\n", r->rank);
}

/* (loop) Rank r died: closed without goodbye or silent. */
static void mark_dead(trun_agent_t *a, arank_t *r, const char *why) {
  pthread_mutex_lock(&a->mu);
  r->state = A_DEAD;
  snprintf(r->why, sizeof(r->why), "%s", why);
  if (r->fd >= 0) close(r->fd);
  r->fd = -1;
  pthread_mutex_unlock(&a->mu);
  a->urgent = 1;
}

/* (loop, holding mu) One line from a rank. */
static void on_line(trun_agent_t *a, arank_t *r, char *line) {
  if (!strncmp(line, "hb ", 3) && (r->state == A_ALIVE || r->state == A_HELLO)) {
    char *v = strdup(line + 3);
    if (!v) return;
    free(r->val);
    r->val = v;
    r->last_ms = trun_now_ms();
    if (r->state == A_HELLO) {
      r->state = A_ALIVE;
      a->urgent = 1;               /* registers it with the store now */
      pthread_cond_signal(&a->cv); /* the relay has someone to relay to */
    }
  } else if (!strncmp(line, "hello ", 6) && r->state == A_HELLO) {
    long long next = 0;
    if (sscanf(line + 6, "%d %lld", &r->rank, &next) == 2) r->next = next;
    r->last_ms = trun_now_ms();
  } else if (!strcmp(line, "store") && r->state == A_HELLO && r->rank < 0) {
    /* a store client (agent_proxy.c); without a proxy it sees the
     * connection close and connects to the store itself */
    if (a->proxy)
      r->state = A_PROXY;
    else
      shutdown(r->fd, SHUT_RDWR);
  } else if (!strncmp(line, "rdzv ", 5) && r->state == A_HELLO && r->rank < 0) {
    trun_rdzv_line(a, r, line + 5); /* a rank's init, not a monitor (agent_rdzv.c) */
  } else if (!strcmp(line, "bye") && (r->state == A_ALIVE || r->state == A_HELLO)) {
    /* (a monitor whose start failed after its hello says bye at once) */
    r->state = A_LEFT;
    a->urgent = 1; /* peers read its "bye" (core/ops/mesh.c) */
  }
}

/* (loop) Read everything pending from rank r. */
static void on_readable(trun_agent_t *a, arank_t *r) {
  for (;;) {
    ssize_t n = recv(r->fd, r->in + r->inlen, sizeof(r->in) - r->inlen, MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    if (n <= 0) {
      if (r->state == A_ALIVE || (r->state == A_HELLO && r->rank >= 0))
        mark_dead(a, r,
                  "its connection to the host agent closed without a goodbye (process gone?)");
      else {
        pthread_mutex_lock(&a->mu);
        close(r->fd);
        r->fd = -1;
        if (r->state == A_HELLO) r->state = A_DONE;   /* never said who it was */
        if (r->state == A_RDZV) trun_rdzv_gone(a, r); /* left before its batch */
        pthread_mutex_unlock(&a->mu);
      }
      return;
    }
    r->inlen += (size_t)n;
    char *p = r->in, *end = r->in + r->inlen, *nl;
    pthread_mutex_lock(&a->mu); /* the relay reads state and next */
    while ((nl = memchr(p, '\n', (size_t)(end - p)))) {
      *nl = '\0';
      on_line(a, r, p);
      p = nl + 1;
      if (r->state == A_PROXY) break;
    }
    if (r->state == A_PROXY) { /* store frames follow: the proxy's now */
      trun_proxy_adopt(a->proxy, r->fd, p, (size_t)(end - p));
      r->fd = -1;
      r->state = A_DONE;
      r->inlen = 0;
      pthread_mutex_unlock(&a->mu);
      return;
    }
    pthread_mutex_unlock(&a->mu);
    r->inlen = (size_t)(end - p);
    memmove(r->in, p, r->inlen);
    if (r->inlen == sizeof(r->in)) r->inlen = 0; /* too long: dropped */
  }
}

/* (loop) Accept the ranks that connected. */
static void on_accept(trun_agent_t *a) {
  for (;;) {
    int fd = accept4(a->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return;
    pthread_mutex_lock(&a->mu);
    if (a->n == a->cap) {
      int cap = a->cap ? a->cap * 2 : 16;
      arank_t *t = realloc(a->r, sizeof(*t) * (size_t)cap);
      if (!t) {
        pthread_mutex_unlock(&a->mu);
        close(fd);
        return;
      }
      a->r = t;
      a->cap = cap;
    }
    arank_t *r = &a->r[a->n++];
    memset(r, 0, offsetof(arank_t, in));
    r->fd = fd;
    r->rank = -1;
    r->inlen = 0;
    pthread_mutex_unlock(&a->mu);
  }
}

/* (the thread that owns *s: the loop for beat, the relay for watch) A call
 * on *s failed other than by a wait the store answered: the client closed
 * the connection (a reply later than the call's grace, as on a loaded host)
 * or the store went away. Open a new one and drop the old, as a rank's
 * monitor does (core/group/monitor.c): an agent left with a dead connection
 * would stop beating, and its live ranks would be declared dead. Returns 0,
 * or -1 while the store cannot be reached (the next failure tries again). */
static int reopen(trun_agent_t *a, tdist_store_t **s) {
  tdist_store_t *fresh = NULL;
  if (tdist_store_connect(a->addr, a->port, &a->so, &fresh) != 0) return -1;
  tdist_store_release(*s);
  *s = fresh;
  return 0;
}

/* (loop) Write the host's heartbeat; "ok" to the ranks if it reached the
 * store. Ranks reported left or dead are then forgotten. */
static void beat(trun_agent_t *a, int bye) {
  size_t cap = 256, len = 0;
  for (int i = 0; i < a->n; i++)
    cap += 200 + (a->r[i].val ? strlen(a->r[i].val) : 0);
  char *v = malloc(cap);
  if (!v) return;
  for (int i = 0; i < a->n; i++) {
    arank_t *r = &a->r[i];
    if (r->state == A_ALIVE)
      len += (size_t)snprintf(v + len, cap - len, "%d a %s\n", r->rank, r->val ? r->val : "-");
    else if (r->state == A_LEFT)
      len += (size_t)snprintf(v + len, cap - len, "%d b\n", r->rank);
    else if (r->state == A_DEAD)
      len += (size_t)snprintf(v + len, cap - len, "%d d %s\n", r->rank, r->why);
  }
  char key[48];
  snprintf(key, sizeof(key), "tdist/hbh/%d", a->host);
  int rc = tdist_store_set(a->beat, key, v, len);
  if (rc != 0 && reopen(a, &a->beat) == 0) rc = tdist_store_set(a->beat, key, v, len);
  free(v);
  if (rc != 0) return; /* no "ok": the ranks count the store as silent */
  if (bye) tdist_store_set(a->beat, key, "bye", 3);
  pthread_mutex_lock(&a->mu);
  for (int i = 0; i < a->n; i++) {
    arank_t *r = &a->r[i];
    if (r->state == A_LEFT || r->state == A_DEAD) r->state = A_DONE;
    if (r->state == A_ALIVE) trun_agent_tell(r, "ok\n", 3);
  }
  pthread_mutex_unlock(&a->mu);
}

static void *loop_main(void *arg) {
  trun_agent_t *a = arg;
  int64_t next_beat = trun_now_ms();
  struct pollfd *p = NULL;
  int pcap = 0;
  while (!a->stop) {
    if (pcap < a->n + 2) {
      pcap = (a->n + 2) * 2;
      struct pollfd *t = realloc(p, sizeof(*p) * (size_t)pcap);
      if (!t) break;
      p = t;
    }
    int np = 0;
    p[np++] = (struct pollfd){.fd = a->lfd, .events = POLLIN};
    p[np++] = (struct pollfd){.fd = a->wake[0], .events = POLLIN};
    for (int i = 0; i < a->n; i++)
      p[np++] = (struct pollfd){.fd = a->r[i].fd, .events = POLLIN};
    int64_t wait = next_beat - trun_now_ms(),
            judge = a->timeout_ms / 4 < 250 ? a->timeout_ms / 4 : 250;
    if (wait > judge) wait = judge;
    if (wait < 0 || a->urgent) wait = 0;
    wait = trun_rdzv_tick(a, wait); /* a batch due now, or when it will be */
    poll(p, (nfds_t)np, (int)wait);
    if (p[0].revents) on_accept(a);
    for (int i = 0; i < a->n && 2 + i < np; i++)
      if (p[2 + i].revents && a->r[i].fd >= 0) on_readable(a, &a->r[i]);
    /* Judged after reading what was pending (a stalled agent's first round
     * reads the beats that waited), as the store's detector does. */
    int64_t now = trun_now_ms();
    for (int i = 0; a->timeout_ms > 0 && i < a->n; i++) {
      arank_t *r = &a->r[i];
      if (r->state == A_ALIVE && now - r->last_ms > a->timeout_ms) {
        char why[160];
        snprintf(why, sizeof(why), "no heartbeat for %" PRId64 " ms (timeout %" PRId64 " ms)",
                 now - r->last_ms, a->timeout_ms);
        mark_dead(a, r, why);
      }
    }
    if (a->urgent || now >= next_beat) {
      a->urgent = 0;
      beat(a, 0);
      next_beat = trun_now_ms() + a->interval_ms;
    }
  }
  free(p);
  beat(a, 1); /* the last word: what changed, then "bye" */
  return NULL;
}

/* (relay) Send records first..first+n-1 to the ranks that want them: one
 * buffer, one send per rank for the batch (a lost host's records arrive
 * together). */
static void relay(trun_agent_t *a, int64_t first, void **vals, size_t *lens, size_t n) {
  size_t cap = n * 540 + 1, len = 0;
  char *buf = malloc(cap);
  size_t *at = malloc(sizeof(*at) * (n + 1)); /* where record k's line starts */
  if (!buf || !at) goto done;
  for (size_t k = 0; k < n; k++) {
    at[k] = len;
    int l = snprintf(buf + len, cap - len, "rec %" PRId64 " %.*s\n", first + (int64_t)k,
                     (int)(lens[k] < 500 ? lens[k] : 500), (char *)vals[k]);
    for (size_t j = len; j + 1 < len + (size_t)l; j++)
      if (buf[j] == '\n') buf[j] = ' ';
    len += (size_t)l;
  }
  at[n] = len;
  pthread_mutex_lock(&a->mu);
  for (int i = 0; i < a->n; i++) {
    arank_t *r = &a->r[i];
    if (r->state != A_ALIVE) continue;
    /* from the first record its monitor wants */
    int64_t skip = r->next - first;
    if (skip >= (int64_t)n) continue;
    size_t from = skip > 0 ? at[skip] : 0;
    trun_agent_tell(r, buf + from, len - from);
  }
  pthread_mutex_unlock(&a->mu);
done:
  free(buf);
  free(at);
}

/* (relay) Whether to watch the store: 1 once a local rank's monitor is
 * alive, 0 at stop. While none is, nobody wants a record, and the relay
 * waits here, not in a store wait: the launcher's exit (trun_agent_stop)
 * would wait for that one to time out (up to 500 ms) - every job whose
 * ranks are gone, and all of a job whose ranks never start a monitor
 * (`tdistrun -n 2 true`). Records that come meanwhile are not lost: `next`
 * stays, and the first wait after finds them. */
static int relay_wanted(trun_agent_t *a) {
  int want = 0;
  pthread_mutex_lock(&a->mu);
  while (!a->stop) {
    for (int i = 0; i < a->n && !want; i++)
      want = a->r[i].state == A_ALIVE;
    if (want) break;
    pthread_cond_wait(&a->cv, &a->mu);
  }
  pthread_mutex_unlock(&a->mu);
  return want;
}

/* (the last of the relay and trun_agent_stop) Free what both use: the rank
 * table, the relay's store connection, the lock and the agent. */
static void agent_unref(trun_agent_t *a) {
  if (atomic_fetch_sub(&a->refs, 1) != 1) return;
  for (int i = 0; i < a->n; i++) {
    if (a->r[i].fd >= 0) close(a->r[i].fd);
    free(a->r[i].val);
  }
  free(a->r);
  tdist_store_release(a->watch);
  pthread_mutex_destroy(&a->mu);
  pthread_cond_destroy(&a->cv);
  free(a);
}

static void *relay_main(void *arg) {
  trun_agent_t *a = arg;
  int64_t next = 0;
  while (!a->stop && tdist_store_add(a->watch, "tdist/aborts/count", 0, &next) != 0)
    sleep(1);
  next++;
  while (relay_wanted(a)) {
    char key[BATCH][48];
    const char *keys[BATCH];
    snprintf(key[0], sizeof(key[0]), "tdist/aborts/%" PRId64, next);
    keys[0] = key[0];
    int rc = tdist_store_wait(a->watch, keys, 1, 500);
    if (rc == TDIST_ERR_TIMEOUT) continue;
    if (rc != 0) {
      /* At stop: the hosting launcher stopped the store server (main.c). */
      if (a->stop) break;
      /* The connection is gone (a reply the client stopped waiting for
       * closes it: that TIMEOUT is followed by CLOSED here): a new one. The
       * store unreachable: the ranks learn it from the missing "ok". */
      if (reopen(a, &a->watch) != 0) usleep(200 * 1000);
      continue;
    }
    int64_t count = next;
    if (tdist_store_add(a->watch, "tdist/aborts/count", 0, &count) != 0 || count < next)
      count = next;
    size_t n = (size_t)(count - next + 1);
    if (n > BATCH) n = BATCH;
    for (size_t k = 1; k < n; k++) {
      snprintf(key[k], sizeof(key[k]), "tdist/aborts/%" PRId64, next + (int64_t)k);
      keys[k] = key[k];
    }
    void *vals[BATCH];
    size_t lens[BATCH];
    /* Counted records are written right after the count: a short wait. */
    if (tdist_store_multi_get(a->watch, keys, n, vals, lens, 1000) != 0) {
      n = 1;
      if (tdist_store_multi_get(a->watch, keys, 1, vals, lens, 1000) != 0) continue;
    }
    relay(a, next, vals, lens, n);
    for (size_t k = 0; k < n; k++)
      tdist_store_free(vals[k]);
    next += (int64_t)n;
  }
  agent_unref(a); /* detached by trun_agent_stop, or about to be */
  return NULL;
}

int trun_agent_start(const char *addr, int port, int host, int first, int nlocal, int world,
                     trun_agent_t **out) {
  *out = NULL;
  trun_agent_t *a = calloc(1, sizeof(*a));
  if (!a) return -1;
  a->host = host;
  a->first = first;
  a->nlocal = nlocal;
  a->world = world;
  a->lfd = a->wake[0] = a->wake[1] = -1;
  a->interval_ms = env_ms("TDIST_HEARTBEAT_INTERVAL_MS", 1000);
  a->timeout_ms = env_ms("TDIST_HEARTBEAT_TIMEOUT_MS", 5000);
  if (a->interval_ms < 1) a->interval_ms = 1;
  pthread_mutex_init(&a->mu, NULL);
  pthread_cond_init(&a->cv, NULL);
  snprintf(a->name, sizeof(a->name), "tdist-agent-%d-%d-%lld", (int)getpid(), host,
           (long long)trun_now_ms());
  /* A beat may wait for a slow store up to the timeout (as a rank's does). */
  tdist_store_opts_t so = {.mask = TDIST_STORE_FIELD_TIMEOUT,
                           .timeout_ms = a->timeout_ms > 1000 ? a->timeout_ms : 1000};
  snprintf(a->addr, sizeof(a->addr), "%s", addr);
  a->port = port;
  a->so = so;
  if (tdist_store_connect(addr, port, &so, &a->beat) != 0 ||
      tdist_store_connect(addr, port, &so, &a->watch) != 0)
    goto fail;
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  size_t nl = strlen(a->name);
  memcpy(sa.sun_path + 1, a->name, nl);
  a->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (a->lfd < 0 ||
      bind(a->lfd, (struct sockaddr *)&sa,
           (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + nl)) != 0 ||
      listen(a->lfd, 4096) != 0 || pipe2(a->wake, O_CLOEXEC) != 0)
    goto fail;
  /* Without a proxy the ranks' "store" connections are closed at once, and
   * they connect to the store themselves (store/rdzv_host.c). */
  if (trun_proxy_start(addr, port, &a->proxy) != 0) a->proxy = NULL;
  if (pthread_create(&a->loop, NULL, loop_main, a) != 0) goto fail;
  atomic_store(&a->refs, 2); /* trun_agent_stop's and the relay's */
  if (pthread_create(&a->relay, NULL, relay_main, a) != 0) {
    a->stop = 1;
    if (write(a->wake[1], "x", 1) < 0) { /* the loop polls it */
    }
    pthread_join(a->loop, NULL);
    goto fail;
  }
  *out = a;
  return 0;
fail:
  fprintf(stderr, "tdistrun: no host agent (%s): the ranks beat to the store themselves\n",
          tdist_last_error());
  trun_proxy_stop(a->proxy);
  if (a->lfd >= 0) close(a->lfd);
  if (a->wake[0] >= 0) close(a->wake[0]);
  if (a->wake[1] >= 0) close(a->wake[1]);
  tdist_store_release(a->beat);
  tdist_store_release(a->watch);
  pthread_mutex_destroy(&a->mu);
  pthread_cond_destroy(&a->cv);
  free(a);
  return -1;
}

const char *trun_agent_name(const trun_agent_t *a) { return a->name; }

void trun_agent_stop(trun_agent_t *a) {
  if (!a) return;
  pthread_mutex_lock(&a->mu); /* under mu: the relay may be checking, then waiting */
  a->stop = 1;
  pthread_cond_broadcast(&a->cv);
  pthread_mutex_unlock(&a->mu);
  if (write(a->wake[1], "x", 1) < 0) { /* the loop polls it */
  }
  pthread_join(a->loop, NULL); /* its last beat and "bye" */
  trun_proxy_stop(a->proxy);   /* its ranks have ended */
  pthread_mutex_lock(&a->mu);  /* the relay sends under mu: not to a closed fd */
  for (int i = 0; i < a->n; i++) {
    if (a->r[i].fd >= 0) close(a->r[i].fd);
    a->r[i].fd = -1;
  }
  pthread_mutex_unlock(&a->mu);
  trun_rdzv_free(a);
  close(a->lfd);
  close(a->wake[0]);
  close(a->wake[1]);
  tdist_store_release(a->beat);
  /* The relay is not joined: it may be in a store wait for the next record
   * (up to 500 ms; no call ends one early), which would hold the launcher's
   * exit that long after its ranks are gone. Idle (no monitor alive) it
   * returns at once; in a wait, when the wait ends or the store closes its
   * connection (a hosting launcher stops the server next, main.c), or the
   * process exits first (libtdist has no exit-time teardown it could meet).
   * The last of the two frees what both use. */
  pthread_detach(a->relay);
  agent_unref(a);
}
