/*
 * liveness.c - see liveness.h. A table indexed by world rank; a timer that
 * asks for a scan every quarter of the timeout (at most every 250 ms).
 *
 * The scan never runs from the timer itself. libuv runs timers before it
 * polls for I/O, so after the loop stalled (the server's process starved of
 * CPU or stopped for a while) a scan run from the timer would judge every
 * rank by heartbeats that are waiting, unread, in its sockets, and declare
 * live ranks dead. So the timer starts an idle handle (the next poll does
 * not block) and a check handle, and the check callback, which libuv runs
 * right after that poll read what was pending, does the scan: a rank is
 * declared silent only by a scan that has read everything it sent.
 */
#include "store/liveness.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/alloc.h"
#include "util/log.h"
#include "util/param.h"

TDIST_PARAM(HeartbeatTimeoutMs, "TDIST_HEARTBEAT_TIMEOUT_MS", 5000)

#define HB_PREFIX "tdist/hb/"
#define HOST_PREFIX "tdist/hbh/"
#define MAX_RANKS (1 << 20)
#define MAX_HOSTS (1 << 20)

enum { R_NONE = 0, R_ALIVE, R_LEFT, R_DEAD };

/* A rank: beating itself (host -1: last_ms and conn are its own) or listed
 * in host `host`'s heartbeat (that host's last_ms and conn judge it). */
typedef struct rank_state {
  uint64_t last_ms;
  const void *conn;
  int state;
  int host;
} rank_state_t;

/* A host agent: its heartbeat "tdist/hbh/<host>" lists its ranks. */
typedef struct host_state {
  uint64_t last_ms;
  const void *conn;
  int state; /* R_ALIVE, R_LEFT ("bye"), R_DEAD (its ranks were declared) */
} host_state_t;

struct tdist__live {
  uv_timer_t timer;
  uv_idle_t idle;   /* active while a scan is due: the poll after it never blocks */
  uv_check_t check; /* runs the due scan, after that poll */
  int open_handles; /* freed when the last one is closed */
  uv_loop_t *loop;
  tdist__kv_t *kv;
  int64_t timeout_ms;
  rank_state_t *ranks;
  int cap;
  host_state_t *hosts;
  int hcap;
  int ndirect;                 /* ranks that ever beat for themselves: the scan reads ranks too */
  int in_publish;              /* our own writes come back through on_write */
  void (*declared)(void *arg); /* after a scan that declared deaths */
  void *declared_arg;
};

/* Run one request body through the engine; returns the reply frame in out. */
static int exec(tdist__live_t *l, tdist__buf_t *req, tdist__buf_t *out) {
  tdist__exec_t x = {.final = 1};
  out->len = 0;
  l->in_publish = 1;
  int rc = tdist__kv_exec(l->kv, req->p, req->len, out, &x);
  l->in_publish = 0;
  return rc;
}

static void declare_dead(tdist__live_t *l, int rank, const char *why) {
  rank_state_t *r = &l->ranks[rank];
  r->state = R_DEAD;
  TDIST_WARN(STORE, "store server: rank %d declared dead: %s", rank, why);
  tdist__buf_t req = {0}, out = {0};
  const char *count_key = "tdist/aborts/count";
  if (tdist__buf_reserve(&req, 512)) goto done;
  tdist__put_u8(&req, TDIST__OP_ADD);
  tdist__put_bytes(&req, count_key, (uint32_t)strlen(count_key));
  int64_t one = 1;
  tdist__put(&req, &one, 8);
  if (exec(l, &req, &out) != TDIST__EXEC_DONE || out.len < 4 + 1 + 8 || out.p[4] != 0) goto done;
  int64_t n;
  memcpy(&n, out.p + 5, 8);
  char key[64], val[300];
  snprintf(key, sizeof(key), "tdist/aborts/%" PRId64, n);
  int vl = snprintf(val, sizeof(val), "dead %d %s", rank, why);
  /* The dead set first (tdist_group_shrink reads it), then the record that
   * wakes the monitors. */
  char dkey[48];
  snprintf(dkey, sizeof(dkey), "tdist/dead/%d", rank);
  req.len = 0;
  tdist__put_u8(&req, TDIST__OP_SET);
  tdist__put_bytes(&req, dkey, (uint32_t)strlen(dkey));
  tdist__put_bytes(&req, why, (uint32_t)strlen(why));
  exec(l, &req, &out);
  req.len = 0;
  tdist__put_u8(&req, TDIST__OP_SET);
  tdist__put_bytes(&req, key, (uint32_t)strlen(key));
  tdist__put_bytes(&req, val, (uint32_t)vl);
  exec(l, &req, &out);
done:
  tdist__buf_free(&req);
  tdist__buf_free(&out);
}

/* Write key = val through the engine (an internal write: not a heartbeat). */
static void put(tdist__live_t *l, const char *key, const char *val, size_t vl) {
  tdist__buf_t req = {0}, out = {0};
  if (tdist__buf_reserve(&req, strlen(key) + vl + 16) == 0) {
    tdist__put_u8(&req, TDIST__OP_SET);
    tdist__put_bytes(&req, key, (uint32_t)strlen(key));
    tdist__put_bytes(&req, val, (uint32_t)vl);
    exec(l, &req, &out);
  }
  tdist__buf_free(&req);
  tdist__buf_free(&out);
}

/* Host h is gone (its agent silent or its connection closed): every rank it
 * listed alive is declared dead (O(ranks) once, not per scan). 1 if any. */
static int host_gone(tdist__live_t *l, int h, const char *why) {
  int declared = 0;
  l->hosts[h].state = R_DEAD;
  l->hosts[h].conn = NULL;
  for (int i = 0; i < l->cap; i++)
    if (l->ranks[i].state == R_ALIVE && l->ranks[i].host == h) {
      declare_dead(l, i, why);
      declared = 1;
    }
  return declared;
}

/* (server loop) Check phase, after the poll that followed a timer tick. */
static void on_check(uv_check_t *c) {
  tdist__live_t *l = c->data;
  uv_idle_stop(&l->idle);
  uv_check_stop(&l->check);
  uint64_t now = uv_now(l->loop);
  int declared = 0;
  for (int h = 0; h < l->hcap; h++) {
    host_state_t *hs = &l->hosts[h];
    if (hs->state == R_ALIVE && now - hs->last_ms > (uint64_t)l->timeout_ms) {
      char why[160];
      snprintf(why, sizeof(why),
               "its host agent %d sent no heartbeat for %" PRIu64 " ms (timeout %" PRId64 " ms)", h,
               now - hs->last_ms, l->timeout_ms);
      declared |= host_gone(l, h, why);
    }
  }
  for (int i = 0; l->ndirect && i < l->cap; i++) {
    rank_state_t *r = &l->ranks[i];
    if (r->state == R_ALIVE && r->host < 0 && now - r->last_ms > (uint64_t)l->timeout_ms) {
      char why[128];
      snprintf(why, sizeof(why), "no heartbeat for %" PRIu64 " ms (timeout %" PRId64 " ms)",
               now - r->last_ms, l->timeout_ms);
      declare_dead(l, i, why);
      declared = 1;
    }
  }
  if (declared && l->declared) l->declared(l->declared_arg);
}

void tdist__live_on_declared(tdist__live_t *l, void (*fn)(void *arg), void *arg) {
  if (!l) return;
  l->declared = fn;
  l->declared_arg = arg;
}

static void on_idle(uv_idle_t *h) { (void)h; }

/* (server loop) A scan is due: run it after the next poll (see the top). */
static void on_timer(uv_timer_t *t) {
  tdist__live_t *l = t->data;
  uv_idle_start(&l->idle, on_idle);
  uv_check_start(&l->check, on_check);
}

int tdist__live_start(uv_loop_t *loop, tdist__kv_t *kv, tdist__live_t **out) {
  *out = NULL;
  int64_t timeout = tdist__param_HeartbeatTimeoutMs();
  if (timeout <= 0) return 0;
  tdist__live_t *l = tdist__calloc(1, sizeof(*l));
  if (!l) return -1;
  l->loop = loop;
  l->kv = kv;
  l->timeout_ms = timeout;
  uv_timer_init(loop, &l->timer);
  uv_idle_init(loop, &l->idle);
  uv_check_init(loop, &l->check);
  l->timer.data = l->idle.data = l->check.data = l;
  l->open_handles = 3;
  uint64_t every = (uint64_t)(timeout / 4 < 250 ? timeout / 4 : 250);
  if (every < 10) every = 10;
  uv_timer_start(&l->timer, on_timer, every, every);
  /* never keep the server loop alive */
  uv_unref((uv_handle_t *)&l->timer);
  uv_unref((uv_handle_t *)&l->idle);
  uv_unref((uv_handle_t *)&l->check);
  *out = l;
  return 0;
}

static int grow(tdist__live_t *l, int rank) {
  if (rank < l->cap) return 0;
  int cap = l->cap ? l->cap : 64;
  while (cap <= rank)
    cap *= 2;
  rank_state_t *n = tdist__realloc(l->ranks, sizeof(*n) * (size_t)cap);
  if (!n) return -1;
  memset(n + l->cap, 0, sizeof(*n) * (size_t)(cap - l->cap));
  l->ranks = n;
  l->cap = cap;
  return 0;
}

static int grow_hosts(tdist__live_t *l, int h) {
  if (h < l->hcap) return 0;
  int cap = l->hcap ? l->hcap : 16;
  while (cap <= h)
    cap *= 2;
  host_state_t *n = tdist__realloc(l->hosts, sizeof(*n) * (size_t)cap);
  if (!n) return -1;
  memset(n + l->hcap, 0, sizeof(*n) * (size_t)(cap - l->hcap));
  l->hosts = n;
  l->hcap = cap;
  return 0;
}

/* One line of a host heartbeat: "<rank> a <value>" (alive; value as a rank's
 * own heartbeat), "<rank> b" (left cleanly) or "<rank> d <reason>" (the
 * agent saw it die: its connection closed, or its local beats stopped). */
static int host_line(tdist__live_t *l, int h, const char *p, const char *end) {
  char *e = NULL;
  long rank = strtol(p, &e, 10);
  if (e == p || e + 2 > end || *e != ' ' || rank < 0 || rank >= MAX_RANKS || grow(l, (int)rank))
    return 0;
  rank_state_t *r = &l->ranks[rank];
  if (r->state == R_DEAD) return 0;
  char what = e[1];
  if (what == 'a') {
    if (r->host != h || r->state != R_ALIVE) {
      /* First seen here: where its diagnosis values are (monitor.c). */
      char key[48], val[16];
      snprintf(key, sizeof(key), "tdist/hbat/%ld", rank);
      int vl = snprintf(val, sizeof(val), "%d", h);
      put(l, key, val, (size_t)vl);
    }
    r->state = R_ALIVE;
    r->host = h;
    r->conn = NULL;
  } else if (what == 'b') {
    if (r->state == R_LEFT) return 0;
    r->state = R_LEFT;
    r->conn = NULL;
    /* Its own "bye", as a rank beating itself leaves it (core/ops/mesh.c
     * reads it: a rank that left is not a failure). */
    char key[48];
    snprintf(key, sizeof(key), "tdist/hb/%ld", rank);
    put(l, key, "bye", 3);
  } else if (what == 'd') {
    char why[200];
    const char *w = e + 2 < end && e[2] == ' ' ? e + 3 : end;
    snprintf(why, sizeof(why), "%.*s", (int)(end - w), w);
    declare_dead(l, (int)rank, why[0] ? why : "its host agent saw it die");
    return 1;
  }
  return 0;
}

/* "tdist/hbh/<host>": the agent's beat (every listed rank alive), or "bye". */
static void host_beat(tdist__live_t *l, const tdist__kv_entry_t *e, const void *conn) {
  char *end = NULL;
  long h = strtol(e->key + sizeof(HOST_PREFIX) - 1, &end, 10);
  if (!end || *end || h < 0 || h >= MAX_HOSTS || grow_hosts(l, (int)h)) return;
  host_state_t *hs = &l->hosts[h];
  if (hs->state == R_DEAD) return; /* its ranks were declared; no revival */
  /* An empty value has no buffer (val NULL): no arithmetic on it. */
  const char *p = e->val ? (const char *)e->val : "", *vend = p + (e->val ? e->vlen : 0);
  int declared = 0;
  if (e->vlen == 3 && memcmp(p, "bye", 3) == 0) {
    /* Leaving cleanly after its ranks: one still listed alive did not say
     * goodbye to it. */
    declared = host_gone(l, (int)h, "its host agent left while it was still listed alive");
    hs->state = R_LEFT;
  } else {
    hs->state = R_ALIVE;
    hs->last_ms = uv_now(l->loop);
    hs->conn = conn;
    while (p < vend) {
      const char *nl = memchr(p, '\n', (size_t)(vend - p));
      const char *le = nl ? nl : vend;
      declared |= host_line(l, (int)h, p, le);
      p = le + 1;
    }
  }
  /* No l->declared here: we run inside the request that wrote the beat,
   * and the server drains the woken waiters after it (server_conn.c). */
  (void)declared;
}

void tdist__live_on_write(tdist__live_t *l, const tdist__kv_entry_t *e, const void *conn) {
  if (!l || l->in_publish) return;
  if (e->klen > sizeof(HOST_PREFIX) - 1 &&
      memcmp(e->key, HOST_PREFIX, sizeof(HOST_PREFIX) - 1) == 0) {
    host_beat(l, e, conn);
    return;
  }
  if (e->klen <= sizeof(HB_PREFIX) - 1 || memcmp(e->key, HB_PREFIX, sizeof(HB_PREFIX) - 1) != 0)
    return;
  char *end = NULL;
  long rank = strtol(e->key + sizeof(HB_PREFIX) - 1, &end, 10);
  if (!end || *end || rank < 0 || rank >= MAX_RANKS || grow(l, (int)rank)) return;
  rank_state_t *r = &l->ranks[rank];
  if (r->state == R_DEAD) return; /* declared once; a late heartbeat does not revive */
  if (e->vlen == 3 && memcmp(e->val, "bye", 3) == 0) {
    r->state = R_LEFT;
    r->conn = NULL;
    return;
  }
  l->ndirect = 1;
  r->state = R_ALIVE;
  r->host = -1;
  r->last_ms = uv_now(l->loop);
  r->conn = conn;
}

void tdist__live_on_close(tdist__live_t *l, const void *conn) {
  if (!l || !conn) return;
  for (int h = 0; h < l->hcap; h++)
    if (l->hosts[h].state == R_ALIVE && l->hosts[h].conn == conn)
      host_gone(l, h, "its host agent's store connection closed without a goodbye (host gone?)");
  for (int i = 0; i < l->cap; i++)
    if (l->ranks[i].state == R_ALIVE && l->ranks[i].conn == conn)
      declare_dead(l, i, "its store connection closed without a goodbye (process gone?)");
}

static void on_closed(uv_handle_t *h) {
  tdist__live_t *l = h->data;
  if (--l->open_handles > 0) return;
  tdist__free(l->ranks);
  tdist__free(l->hosts);
  tdist__free(l);
}

void tdist__live_stop(tdist__live_t *l) {
  if (!l) return;
  uv_close((uv_handle_t *)&l->timer, on_closed);
  uv_close((uv_handle_t *)&l->idle, on_closed);
  uv_close((uv_handle_t *)&l->check, on_closed);
}
