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
#include "core/error.h"
#include "core/group.h"
#include "core/param.h"
#include "core/progress.h"

TDIST_PARAM(MonitorIntervalMs, "TDIST_MONITOR_INTERVAL_MS", 200)

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
} *mon;

void tdist__monitor_publish(uint64_t uid, const char *reason) {
  pthread_mutex_lock(&mon_mu);
  if (mon && mon->nq < QUEUE_MAX) {
    snprintf(mon->queue[mon->nq++], sizeof(mon->queue[0]), "%016" PRIx64 " %d %s", uid,
             mon->world_rank, reason);
  }
  pthread_mutex_unlock(&mon_mu);
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
  uint64_t uid;
  int rank;
  const char *reason;
};

/* Progress thread: abort the local copy of the group named by a record. */
static void apply_task(void *arg) {
  struct remote_abort *r = arg;
  for (tdist_group_t *g = tdist__progress_groups(r->progress); g; g = g->pnext)
    if (g->uid == r->uid && !atomic_load(&g->aborted))
      tdist__group_fail_remote(g, TDIST_ERR_ABORTED, "rank %d aborted the group: %s", r->rank,
                               r->reason);
}

static void apply_record(struct monitor *m, const char *rec, size_t len) {
  char buf[400];
  snprintf(buf, sizeof(buf), "%.*s", (int)len, rec);
  char *end = NULL;
  uint64_t uid = strtoull(buf, &end, 16);
  if (!end || *end != ' ') return;
  int rank = (int)strtol(end + 1, &end, 10);
  if (!end || *end != ' ' || rank == m->world_rank) return; /* our own record */
  struct remote_abort r = {m->progress, uid, rank, end + 1};
  TDIST_INFO(CORE, "abort record from rank %d for group %016" PRIx64 ": %s", rank, uid, end + 1);
  tdist__progress_call(m->progress, apply_task, &r);
}

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

static void *monitor_main(void *arg) {
  struct monitor *m = arg;
  int64_t interval = tdist__param_MonitorIntervalMs();
  int warned = 0;
  for (;;) {
    pthread_mutex_lock(&mon_mu);
    int stop = m->stop;
    pthread_mutex_unlock(&mon_mu);
    publish_queued(m); /* also on the way out: a final abort must get out */
    if (stop) break;
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

void tdist__monitor_release(void) {
  pthread_mutex_lock(&mon_mu);
  struct monitor *m = mon;
  if (!m || --m->refs > 0) {
    pthread_mutex_unlock(&mon_mu);
    return;
  }
  m->stop = 1;
  pthread_mutex_unlock(&mon_mu);
  pthread_join(m->thread, NULL); /* returns within one wait interval */
  pthread_mutex_lock(&mon_mu);
  mon = NULL;
  pthread_mutex_unlock(&mon_mu);
  tdist_store_release(m->conn);
  tdist__free(m);
}
