/*
 * etcd_live.c - lease liveness for the etcd store (see store/liveness.h).
 *
 * Threads: tdist__live_etcd_beat runs on the thread writing the heartbeat
 * (the monitor), holding the store's mutex, and uses the store's connection;
 * the detector thread has its own connection (its watch blocks) and reads
 * only immutable fields of the store (key prefixes); stop runs in the
 * store's close, after every other call has returned.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "store/etcd.h"
#include "store/liveness.h"
#include "util/alloc.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/param.h"

TDIST_PARAM(HeartbeatTimeoutMs, "TDIST_HEARTBEAT_TIMEOUT_MS", 5000)

#define ALIVE "tdist/alive/"
#define STEP_MS 5000   /* bound of one detector request */
#define MAX_PENDING 64 /* deaths seen in one watch message */

struct tdist__etcd_live {
  tdist__etcd_t *e;
  int rank;
  int64_t lease, ttl_s;
  int expired; /* keep-alive found the lease gone: the others declared us dead */
  pthread_t thread;
  int started;
  tdist__etcd_http_t *wh; /* the detector's connection */
  int pending[MAX_PENDING], npending;
  int64_t pending_rev; /* revision of the last event handled */
};

/* ---- the detector thread ------------------------------------------------------------ */

/* Store key `k` (NUL-terminated) read on the detector's connection. */
static int etcd_get(tdist__etcd_live_t *l, const char *k, uint8_t **v, size_t *vl, int64_t *mod,
                    int *exists) {
  size_t el;
  char *ek = tdist__etcd_key(l->e, k, strlen(k), &el);
  json_object *rep = NULL, *kvs = NULL;
  int rc = ek ? tdist__etcd_post(l->wh, "/v3/kv/range", tdist__etcd_range_op(ek, el),
                                 tdist__now_ms() + STEP_MS, &rep, NULL)
              : TDIST_ERR_NO_MEMORY;
  tdist__free(ek);
  *exists = 0;
  *v = NULL;
  *vl = 0;
  if (rc == 0 && json_object_object_get_ex(rep, "kvs", &kvs) && json_object_array_length(kvs)) {
    json_object *kv = json_object_array_get_idx(kvs, 0);
    *exists = 1;
    *mod = tdist__etcd_i64(kv, "mod_revision", 0);
    if (tdist__etcd_unb64(kv, "value", v, vl)) rc = TDIST_ERR_NO_MEMORY;
  }
  json_object_put(rep);
  return rc;
}

static json_object *op(const char *name, json_object *inner) {
  json_object *o = json_object_new_object();
  if (o) json_object_object_add(o, name, inner);
  return o;
}

static json_object *cmp(const char *ek, size_t el, const char *target, const char *field,
                        int64_t v) {
  json_object *o = json_object_new_object();
  if (!o) return NULL;
  json_object_object_add(o, "key", tdist__etcd_b64(ek, el));
  json_object_object_add(o, "target", json_object_new_string(target));
  json_object_object_add(o, "result", json_object_new_string("EQUAL"));
  json_object_object_add(o, field, json_object_new_int64(v));
  return o;
}

/*
 * Record the death of `rank` once: a txn that succeeds only while
 * "tdist/dead/<rank>" is absent and the record count is unchanged since we
 * read it, and then writes the dead key, the next record and the count.
 * Every detector tries; the losers find the dead key and stop.
 */
static void declare_dead(tdist__etcd_live_t *l, int rank) {
  char hb[48], dead[48], why[160];
  uint8_t *v = NULL;
  size_t vl = 0;
  int64_t mod = 0;
  int exists = 0;
  snprintf(hb, sizeof(hb), "tdist/hb/%d", rank);
  if (etcd_get(l, hb, &v, &vl, &mod, &exists) != 0) goto fail;
  int bye = exists && vl == 3 && memcmp(v, "bye", 3) == 0;
  tdist__free(v);
  if (bye) return; /* left cleanly: "bye" revoked its lease */
  snprintf(dead, sizeof(dead), "tdist/dead/%d", rank);
  snprintf(why, sizeof(why),
           "no heartbeat for %" PRId64 " s: its etcd lease expired (process gone or stopped?)",
           l->ttl_s);
  size_t dl, cl;
  char *dk = tdist__etcd_key(l->e, dead, strlen(dead), &dl);
  char *ck = tdist__etcd_key(l->e, "tdist/aborts/count", 18, &cl);
  for (int tries = 0; dk && ck && tries < 100; tries++) {
    if (etcd_get(l, dead, &v, &vl, &mod, &exists) != 0) break;
    tdist__free(v);
    if (exists) break; /* another rank's detector recorded it */
    int64_t n = 0, cmod = 0;
    if (etcd_get(l, "tdist/aborts/count", &v, &vl, &cmod, &exists) != 0) break;
    char num[32] = "0";
    if (exists && vl < sizeof(num)) {
      memcpy(num, v, vl);
      num[vl] = 0;
    }
    tdist__free(v);
    n = strtoll(num, NULL, 10) + 1;
    char rec[48], recv[240], nv[32];
    snprintf(rec, sizeof(rec), "tdist/aborts/%" PRId64, n);
    int rvl = snprintf(recv, sizeof(recv), "dead %d %s", rank, why);
    int nl = snprintf(nv, sizeof(nv), "%" PRId64, n);
    size_t rl;
    char *rk = tdist__etcd_key(l->e, rec, strlen(rec), &rl);
    json_object *t = json_object_new_object(), *c = json_object_new_array(),
                *ok = json_object_new_array(), *rep = NULL;
    if (!rk || !t || !c || !ok) {
      tdist__free(rk);
      json_object_put(t);
      json_object_put(c);
      json_object_put(ok);
      break;
    }
    json_object_object_add(t, "compare", c);
    json_object_object_add(t, "success", ok);
    json_object_array_add(c, cmp(dk, dl, "CREATE", "create_revision", 0));
    json_object_array_add(c, exists ? cmp(ck, cl, "MOD", "mod_revision", cmod)
                                    : cmp(ck, cl, "CREATE", "create_revision", 0));
    json_object_array_add(ok, op("request_put", tdist__etcd_put_op(dk, dl, why, strlen(why), 0)));
    json_object_array_add(ok, op("request_put", tdist__etcd_put_op(rk, rl, recv, (size_t)rvl, 0)));
    json_object_array_add(ok, op("request_put", tdist__etcd_put_op(ck, cl, nv, (size_t)nl, 0)));
    tdist__free(rk);
    int rc = tdist__etcd_post(l->wh, "/v3/kv/txn", t, tdist__now_ms() + STEP_MS, &rep, NULL);
    json_object *f = NULL;
    int won =
        rc == 0 && json_object_object_get_ex(rep, "succeeded", &f) && json_object_get_boolean(f);
    json_object_put(rep);
    if (won) {
      TDIST_WARN(STORE, "etcd store: rank %d declared dead: %s", rank, why);
      break;
    }
    if (rc) break;
  }
  tdist__free(dk);
  tdist__free(ck);
  return;
fail:
  TDIST_WARN(STORE, "etcd store: could not check rank %d's death: %s", rank,
             tdist__etcd_http_why(l->wh));
}

/* Watch callback: a deleted alive key is a candidate death. */
static int on_alive(void *arg, int del, const uint8_t *k, size_t kl, const uint8_t *v, size_t vl,
                    int64_t rev) {
  tdist__etcd_live_t *l = arg;
  size_t pl = l->e->kvlen + sizeof(ALIVE) - 1;
  if (!del || kl <= pl || kl > pl + 9) return 0;
  int rank = 0;
  for (size_t i = pl; i < kl; i++) {
    if (k[i] < '0' || k[i] > '9') return 0;
    rank = rank * 10 + (k[i] - '0');
  }
  if (l->npending < MAX_PENDING) l->pending[l->npending++] = rank;
  l->pending_rev = rev;
  return 1; /* handle it outside the transfer, then resume after rev */
}

static void *detect_main(void *arg) {
  tdist__etcd_live_t *l = arg;
  size_t al;
  char *ak = tdist__etcd_key(l->e, ALIVE, sizeof(ALIVE) - 1, &al);
  char *end = ak ? tdist__strdup(ak) : NULL;
  if (!end) {
    TDIST_WARN(STORE, "etcd store: the death detector is out of memory");
    tdist__free(ak);
    return NULL;
  }
  end[al - 1]++; /* ".../alive/" -> ".../alive0": the whole prefix */
  int64_t from = 0;
  for (;;) {
    if (from == 0) { /* (re)start at the current revision */
      json_object *r = tdist__etcd_range_op(ak, al), *rep = NULL, *hdr = NULL;
      if (r) json_object_object_add(r, "count_only", json_object_new_boolean(1));
      int rc = tdist__etcd_post(l->wh, "/v3/kv/range", r, tdist__now_ms() + STEP_MS, &rep, NULL);
      json_object_object_get_ex(rep, "header", &hdr);
      from = rc == 0 ? tdist__etcd_i64(hdr, "revision", 0) + 1 : 0;
      json_object_put(rep);
      if (from == 0) {
        if (tdist__etcd_http_woken(l->wh)) break;
        struct timespec ts = {0, 200 * 1000000};
        nanosleep(&ts, NULL);
        continue;
      }
    }
    l->npending = 0;
    int rc =
        tdist__etcd_watch(l->wh, ak, al, end, al, from, tdist__now_ms() + 3600 * 1000, on_alive, l);
    if (rc == TDIST_ERR_CLOSED) break;      /* woken by stop */
    if (rc == TDIST_ERR_PROTOCOL) from = 0; /* compacted past us: start again from now */
    if (rc == 0) {
      from = l->pending_rev + 1;
      for (int i = 0; i < l->npending; i++)
        declare_dead(l, l->pending[i]);
    }
  }
  tdist__free(ak);
  tdist__free(end);
  return NULL;
}

/* ---- heartbeats (the store's caller, holding its mutex) ------------------------------ */

static int post(tdist__etcd_t *e, const char *path, json_object *req, int64_t deadline,
                json_object **rep) {
  *rep = NULL;
  return tdist__etcd_post(e->http, path, req, deadline, rep, NULL);
}

static int put(tdist__etcd_t *e, const char *k, const void *v, size_t vl, int64_t lease,
               int64_t deadline) {
  size_t el;
  char *ek = tdist__etcd_key(e, k, strlen(k), &el);
  json_object *rep = NULL;
  int rc = ek ? post(e, "/v3/kv/put", tdist__etcd_put_op(ek, el, v, vl, lease), deadline, &rep)
              : TDIST_ERR_NO_MEMORY;
  tdist__free(ek);
  json_object_put(rep);
  return rc;
}

static json_object *lease_req(const char *field, int64_t v) {
  json_object *o = json_object_new_object();
  if (o) json_object_object_add(o, field, json_object_new_int64(v));
  return o;
}

/* First heartbeat: the lease, the alive key on it, the detector. */
static int live_start(tdist__etcd_t *e, int rank, int64_t deadline) {
  int64_t timeout = tdist__param_HeartbeatTimeoutMs();
  tdist__etcd_live_t *l = tdist__calloc(1, sizeof(*l));
  if (!l) return TDIST_ERR_NO_MEMORY;
  l->e = e;
  l->rank = rank;
  l->ttl_s = (timeout + 999) / 1000;
  json_object *rep = NULL;
  int rc = post(e, "/v3/lease/grant", lease_req("TTL", l->ttl_s), deadline, &rep);
  l->lease = tdist__etcd_i64(rep, "ID", 0);
  l->ttl_s = tdist__etcd_i64(rep, "TTL", l->ttl_s); /* etcd raises a TTL below its minimum */
  json_object_put(rep);
  char alive[48], me[128], host[64] = "?";
  gethostname(host, sizeof(host) - 1);
  snprintf(alive, sizeof(alive), ALIVE "%d", rank);
  int ml = snprintf(me, sizeof(me), "%s:%d", host, (int)getpid());
  if (rc == 0 && l->lease == 0) rc = TDIST_ERR_PROTOCOL;
  if (rc == 0) rc = put(e, alive, me, (size_t)ml, l->lease, deadline);
  if (rc == 0) rc = tdist__etcd_http_new(e->endpoints, e->nendpoints, &l->wh);
  if (rc == 0) rc = pthread_create(&l->thread, NULL, detect_main, l) ? TDIST_ERR_INTERNAL : 0;
  if (rc) {
    tdist__etcd_http_free(l->wh);
    tdist__free(l);
    return rc;
  }
  l->started = 1;
  e->live = l;
  TDIST_INFO(STORE, "etcd store: rank %d alive on lease %" PRIx64 " (TTL %" PRId64 " s)", rank,
             (uint64_t)l->lease, l->ttl_s);
  return 0;
}

int tdist__live_etcd_beat(tdist__etcd_t *e, int rank, const void *v, size_t vl,
                          int64_t deadline_ms) {
  char hb[48];
  json_object *rep = NULL;
  snprintf(hb, sizeof(hb), "tdist/hb/%d", rank);
  tdist__etcd_live_t *l = e->live;
  if (vl == 3 && memcmp(v, "bye", 3) == 0) {
    /* Leaving cleanly: "bye" first, so the detectors that see the alive key
     * go read it and do not take the revoke for a death. */
    TDIST_CHECK(put(e, hb, v, vl, 0, deadline_ms));
    if (l && l->lease && !l->expired) {
      int rc = post(e, "/v3/lease/revoke", lease_req("ID", l->lease), deadline_ms, &rep);
      json_object_put(rep);
      l->lease = 0;
      TDIST_CHECK(rc);
    }
    return 0;
  }
  if (tdist__param_HeartbeatTimeoutMs() > 0 && !l) {
    TDIST_CHECK(live_start(e, rank, deadline_ms));
  } else if (l && l->lease && !l->expired) {
    int rc = post(e, "/v3/lease/keepalive", lease_req("ID", l->lease), deadline_ms, &rep);
    json_object *res = NULL;
    json_object_object_get_ex(rep, "result", &res);
    if (rc == 0 && tdist__etcd_i64(res, "TTL", 0) <= 0) {
      /* Expired while we were stopped or cut off: the others have declared
       * this rank dead, and a death is never undone (as with the TCP store). */
      l->expired = 1;
      TDIST_WARN(STORE, "etcd store: rank %d's lease expired; the other ranks count it as dead",
                 rank);
    }
    json_object_put(rep);
    TDIST_CHECK(rc);
  }
  return put(e, hb, v, vl, 0, deadline_ms);
}

void tdist__live_etcd_stop(tdist__etcd_live_t *l) {
  if (!l) return;
  if (l->started) {
    tdist__etcd_http_wake(l->wh);
    pthread_join(l->thread, NULL);
  }
  tdist__etcd_http_free(l->wh);
  tdist__free(l);
}
