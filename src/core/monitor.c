/*
 * monitor.c - see monitor.h. One thread, one store connection of its own
 * (so its long waits never hold up the groups' store calls).
 *
 * Ownership: `mon` and its queue are guarded by mon_mu; the connection and
 * `next` are the monitor thread's.
 */
#include "core/monitor.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/group.h"
#include "core/param.h"
#include "core/progress.h"

TDIST_PARAM(MonitorIntervalMs, "TDIST_MONITOR_INTERVAL_MS", 200)
TDIST_PARAM(HeartbeatIntervalMs, "TDIST_HEARTBEAT_INTERVAL_MS", 1000)

#define QUEUE_MAX 32
#define COUNT_KEY "tdist/aborts/count"

static pthread_mutex_t mon_mu = PTHREAD_MUTEX_INITIALIZER;
static struct monitor {
  int refs;
  int stop;
  pthread_t thread;
  tdist_store_t *conn;
  struct tdist_progress *progress;
  int world_rank;
  int64_t next; /* next record number to wait for (monitor thread) */
  int nq;
  char queue[QUEUE_MAX][320];
  int ndiag; /* timeout diagnoses asked for by the progress thread */
  struct diag_req {
    uint64_t uid, seq;
  } diag[QUEUE_MAX];
  int64_t last_hb_ms; /* monitor thread */
} * mon;

void tdist__monitor_publish(uint64_t uid, int status, const char *reason) {
  pthread_mutex_lock(&mon_mu);
  if (mon && mon->nq < QUEUE_MAX) {
    snprintf(mon->queue[mon->nq++], sizeof(mon->queue[0]), "%016" PRIx64 " %d %d %s", uid,
             mon->world_rank, status, reason);
  }
  pthread_mutex_unlock(&mon_mu);
}

int tdist__monitor_diagnose(uint64_t uid, uint64_t seq) {
  int queued = 0;
  pthread_mutex_lock(&mon_mu);
  if (mon && mon->ndiag < QUEUE_MAX) {
    mon->diag[mon->ndiag].uid = uid;
    mon->diag[mon->ndiag].seq = seq;
    mon->ndiag++;
    queued = 1;
  }
  pthread_mutex_unlock(&mon_mu);
  return queued;
}

/* A second connection to the store `s` talks to. */
static int reconnect(tdist_store_t *s, tdist_store_t **out) {
  const char *addr = tdist_store_address(s);
  tdist_store_opts_t o = {.mask = TDIST_STORE_FIELD_TIMEOUT, .timeout_ms = 30000};
  if (strncmp(addr, "file:", 5) == 0) return tdist_store_open_file(addr + 5, &o, out);
  const char *colon = strrchr(addr, ':');
  if (!colon) return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "monitor: bad address '%s'", addr);
  char host[256];
  snprintf(host, sizeof(host), "%.*s", (int)(colon - addr), addr);
  return tdist_store_connect(host, atoi(colon + 1), &o, out);
}

struct remote_abort {
  struct tdist_progress *progress;
  int dead;     /* a death record: every group containing `rank` fails */
  uint64_t uid; /* an abort record: the group with this uid aborts */
  int status;   /* ... with this status (the cause's: ABORTED, MISMATCH...) */
  int rank;     /* world rank */
  const char *reason;
};

static int group_rank_of(const tdist_group_t *g, int world_rank) {
  for (int i = 0; i < g->size; i++)
    if (g->global_ranks[i] == world_rank) return i;
  return -1;
}

/* Progress thread: abort the local copies of the groups a record names. */
static void apply_task(void *arg) {
  struct remote_abort *r = arg;
  for (tdist_group_t *g = tdist__progress_groups(r->progress); g; g = g->pnext) {
    if (atomic_load(&g->aborted)) continue;
    if (r->dead) {
      int gr = group_rank_of(g, r->rank);
      if (gr >= 0 && gr != g->rank)
        tdist__group_fail_remote(g, TDIST_ERR_REMOTE_FAILED,
                                 "rank %d (world rank %d) failed: the store declared it dead: %s",
                                 gr, r->rank, r->reason);
    } else if (g->uid == r->uid) {
      int gr = group_rank_of(g, r->rank);
      tdist__group_fail_remote(g, r->status, "rank %d aborted the group: %s",
                               gr >= 0 ? gr : r->rank, r->reason);
    }
  }
}

static void apply_record(struct monitor *m, const char *rec, size_t len) {
  char buf[400];
  snprintf(buf, sizeof(buf), "%.*s", (int)len, rec);
  char *end = NULL;
  int dead = strncmp(buf, "dead ", 5) == 0;
  uint64_t uid = dead ? 0 : strtoull(buf, &end, 16);
  if (dead) end = buf + 4;
  if (!end || *end != ' ') return;
  int rank = (int)strtol(end + 1, &end, 10);
  if (!end || *end != ' ' || rank == m->world_rank) return; /* about ourselves */
  int status = TDIST_ERR_REMOTE_FAILED;
  if (!dead) {
    status = (int)strtol(end + 1, &end, 10);
    if (!end || *end != ' ' || status >= 0 || status <= TDIST_ERR_MIN_) return;
  }
  struct remote_abort r = {m->progress, dead, uid, status, rank, end + 1};
  TDIST_INFO(CORE, "abort record from rank %d for group %016" PRIx64 ": %s", rank, uid, end + 1);
  tdist__progress_call(m->progress, apply_task, &r);
}

static void heartbeat(struct monitor *m, int bye);

static void publish_queued(struct monitor *m) {
  char recs[QUEUE_MAX][320];
  pthread_mutex_lock(&mon_mu);
  int n = m->nq;
  memcpy(recs, m->queue, sizeof(recs[0]) * (size_t)n);
  m->nq = 0;
  pthread_mutex_unlock(&mon_mu);
  for (int i = 0; i < n; i++) {
    int64_t idx = 0;
    char key[64];
    if (tdist_store_add(m->conn, COUNT_KEY, 1, &idx) != 0) goto fail;
    snprintf(key, sizeof(key), "tdist/aborts/%" PRId64, idx);
    if (tdist_store_set(m->conn, key, recs[i], strlen(recs[i])) != 0) goto fail;
    continue;
  fail:
    TDIST_WARN(CORE, "monitor: could not publish an abort record: %s", tdist_last_error());
  }
}

/* ---- heartbeats and timeout diagnosis (monitor thread) ---------------------- */

struct snap {
  struct tdist_progress *p;
  char buf[4096];
  size_t len;
};

/* Progress thread: "uid:next_seq ..." of every group, the heartbeat's value. */
static void snap_task(void *arg) {
  struct snap *s = arg;
  s->len = 0;
  for (tdist_group_t *g = tdist__progress_groups(s->p); g; g = g->pnext) {
    int n = snprintf(s->buf + s->len, sizeof(s->buf) - s->len, "%016" PRIx64 ":%" PRIu64 " ",
                     g->uid, (uint64_t)atomic_load(&g->next_seq));
    if (n < 0 || (size_t)n >= sizeof(s->buf) - s->len) break;
    s->len += (size_t)n;
  }
  if (s->len == 0) s->len = (size_t)snprintf(s->buf, sizeof(s->buf), "-");
}

static void heartbeat(struct monitor *m, int bye) {
  char key[48];
  snprintf(key, sizeof(key), "tdist/hb/%d", m->world_rank);
  struct snap s = {.p = m->progress};
  if (bye)
    s.len = (size_t)snprintf(s.buf, sizeof(s.buf), "bye");
  else
    tdist__progress_call(m->progress, snap_task, &s);
  if (tdist_store_set(m->conn, key, s.buf, s.len) != 0)
    TDIST_INFO(CORE, "monitor: heartbeat failed: %s", tdist_last_error());
}

/* next_seq of group `uid` in a heartbeat value (not NUL-terminated); -1 if
 * absent. */
static int64_t seq_in(const char *val, size_t len, uint64_t uid) {
  char want[24];
  snprintf(want, sizeof(want), "%016" PRIx64 ":", uid);
  for (size_t i = 0; i + 17 < len; i++) {
    if ((i != 0 && val[i - 1] != ' ') || memcmp(val + i, want, 17) != 0) continue;
    int64_t v = 0;
    for (size_t j = i + 17; j < len && val[j] >= '0' && val[j] <= '9'; j++)
      v = v * 10 + (val[j] - '0');
    return v;
  }
  return -1;
}

struct members {
  struct tdist_progress *p;
  uint64_t uid;
  int size, rank, found;
  int ranks[4096];
  char name[96];
};

static void members_task(void *arg) {
  struct members *r = arg;
  for (tdist_group_t *g = tdist__progress_groups(r->p); g; g = g->pnext)
    if (g->uid == r->uid) {
      r->found = 1;
      r->rank = g->rank;
      r->size = g->size < 4096 ? g->size : 4096;
      memcpy(r->ranks, g->global_ranks, sizeof(int) * (size_t)r->size);
      snprintf(r->name, sizeof(r->name), "%s", g->name);
      return;
    }
}

struct verdict {
  struct tdist_progress *p;
  uint64_t uid, seq;
  const char *text;
};

static void verdict_task(void *arg) {
  struct verdict *v = arg;
  for (tdist_group_t *g = tdist__progress_groups(v->p); g; g = g->pnext) {
    if (g->uid != v->uid) continue;
    g->diag_pending = 0;
    for (tdist_work_t *w = g->inflight_head; w; w = w->next)
      if (w->seq == v->seq) {
        tdist__group_timeout(g, w, v->text);
        return;
      }
  }
}

/* Which members of the group never submitted op `seq`? Learnt from their
 * heartbeats (at most one heartbeat interval old). */
static void diagnose(struct monitor *m, uint64_t uid, uint64_t seq) {
  struct members *mb = tdist__calloc(1, sizeof(*mb));
  if (!mb) return;
  mb->p = m->progress;
  mb->uid = uid;
  tdist__progress_call(m->progress, members_task, mb);
  char text[256] = "";
  size_t tl = 0;
  int behind = 0;
  for (int i = 0; mb->found && i < mb->size; i++) {
    if (i == mb->rank) continue;
    char key[48];
    snprintf(key, sizeof(key), "tdist/hb/%d", mb->ranks[i]);
    void *val = NULL;
    size_t len = 0;
    int64_t next = -1;
    if (tdist_store_get(m->conn, key, &val, &len, 100) == 0) {
      next = seq_in(val, len, uid);
      tdist_store_free(val);
    }
    if (next > (int64_t)seq) continue; /* it submitted this op */
    int n = snprintf(text + tl, sizeof(text) - tl, "%s%d", behind ? ", " : "", i);
    if (n > 0 && (size_t)n < sizeof(text) - tl) tl += (size_t)n;
    behind++;
  }
  char verdict_text[320];
  if (!mb->found)
    verdict_text[0] = '\0';
  else if (behind)
    snprintf(verdict_text, sizeof(verdict_text),
             "rank%s %s of group '%s' had not reached seq %" PRIu64, behind > 1 ? "s" : "", text,
             mb->name, seq);
  else
    snprintf(verdict_text, sizeof(verdict_text),
             "every rank of group '%s' had reached seq %" PRIu64 " (stuck in the backend)",
             mb->name, seq);
  struct verdict v = {m->progress, uid, seq, verdict_text[0] ? verdict_text : NULL};
  tdist__progress_call(m->progress, verdict_task, &v);
  tdist__free(mb);
}

static void run_diagnoses(struct monitor *m) {
  struct diag_req reqs[QUEUE_MAX];
  pthread_mutex_lock(&mon_mu);
  int n = m->ndiag;
  memcpy(reqs, m->diag, sizeof(reqs[0]) * (size_t)n);
  m->ndiag = 0;
  pthread_mutex_unlock(&mon_mu);
  for (int i = 0; i < n; i++)
    diagnose(m, reqs[i].uid, reqs[i].seq);
}

static void *monitor_main(void *arg) {
  struct monitor *m = arg;
  int64_t interval = tdist__param_MonitorIntervalMs();
  int warned = 0;
  for (;;) {
    pthread_mutex_lock(&mon_mu);
    int stop = m->stop;
    pthread_mutex_unlock(&mon_mu);
    publish_queued(m); /* also on the way out: a final abort must get out */
    run_diagnoses(m);
    if (stop) {
      heartbeat(m, 1); /* leaving cleanly: not a death */
      break;
    }
    int64_t now = tdist__now_ms();
    if (now - m->last_hb_ms >= tdist__param_HeartbeatIntervalMs()) {
      heartbeat(m, 0);
      m->last_hb_ms = now;
    }
    char key[64];
    snprintf(key, sizeof(key), "tdist/aborts/%" PRId64, m->next);
    const char *keys[1] = {key};
    int rc = tdist_store_wait(m->conn, keys, 1, interval);
    if (rc == TDIST_ERR_TIMEOUT) continue;
    if (rc != 0) {
      if (!warned++) TDIST_WARN(CORE, "monitor: store unreachable: %s", tdist_last_error());
      struct timespec ts = {0, (long)interval * 1000000};
      nanosleep(&ts, NULL);
      continue;
    }
    void *val = NULL;
    size_t len = 0;
    if (tdist_store_get(m->conn, key, &val, &len, interval) == 0) {
      apply_record(m, val, len);
      tdist_store_free(val);
    }
    m->next++;
  }
  return NULL;
}

int tdist__monitor_acquire(tdist_store_t *store, int world_rank, struct tdist_progress *p) {
  int rc = 0;
  pthread_mutex_lock(&mon_mu);
  if (mon) {
    mon->refs++;
    goto done;
  }
  struct monitor *m = tdist__calloc(1, sizeof(*m));
  if (!m) {
    rc = tdist__error(TDIST_ERR_NO_MEMORY, "monitor: out of memory");
    goto done;
  }
  m->refs = 1;
  m->world_rank = world_rank;
  m->progress = p;
  TDIST_CHECKGOTO(reconnect(store, &m->conn), rc, fail);
  int64_t count = 0;
  TDIST_CHECKGOTO(tdist_store_add(m->conn, COUNT_KEY, 0, &count), rc, fail);
  m->next = count + 1; /* records of earlier jobs on this store are history */
  /* Register with the liveness detector before the group exists, so a rank
   * that dies at once is still known (and declared dead). */
  heartbeat(m, 0);
  m->last_hb_ms = tdist__now_ms();
  if (pthread_create(&m->thread, NULL, monitor_main, m) != 0) {
    rc = tdist__error(TDIST_ERR_INTERNAL, "monitor: cannot start its thread");
    goto fail;
  }
  mon = m;
  goto done;
fail:
  if (m->conn) tdist_store_release(m->conn);
  tdist__free(m);
done:
  pthread_mutex_unlock(&mon_mu);
  return rc;
}

int tdist__monitor_release(void) {
  pthread_mutex_lock(&mon_mu);
  struct monitor *m = mon;
  if (!m || --m->refs > 0) {
    pthread_mutex_unlock(&mon_mu);
    return 0;
  }
  m->stop = 1;
  pthread_mutex_unlock(&mon_mu);
  pthread_join(m->thread, NULL); /* returns within one wait interval */
  pthread_mutex_lock(&mon_mu);
  mon = NULL;
  pthread_mutex_unlock(&mon_mu);
  tdist_store_release(m->conn);
  tdist__free(m);
  return 1;
}
