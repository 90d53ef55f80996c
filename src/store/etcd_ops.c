/*
 * etcd_ops.c - the etcd store's operations (see etcd.h): each request frame
 * that client.c encodes is decoded here and run as etcd v3 requests, and the
 * reply body is written as kv.c would write it, so every status, timeout
 * and INVALID message is the TCP store's.
 *
 * Mapping (docs/store-protocol.md, "The etcd store"):
 *   set, multi_set      put; a txn of puts (atomic per MAX_TXN_OPS keys)
 *   get, wait, multi_get etcd_read.c: a txn of ranges, then one watch over
 *                       the missing keys from the read's revision
 *   add, append         read-modify-write: a txn that compares the key's
 *                       mod_revision (or its absence) and, on success, puts
 *                       the new value and this handle's op record; adding
 *                       0 (or "") to a key that exists is the read alone
 *   compare_set         the same loop, comparing the value read
 *   check, delete       a txn of count-only ranges; deleterange
 *   num_keys            a count-only range over "P/kv/"
 * A heartbeat ("tdist/hb/<rank>", written by the monitor) also keeps this
 * handle's lease alive (etcd_live.c).
 *
 * Threads: the caller's, holding the store's mutex (etcd.c), which
 * serialises the calls of one handle on its curl handle.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/etcd.h"
#include "store/liveness.h"
#include "util/alloc.h"
#include "util/clock.h"
#include "util/error.h"

/* etcd's default --max-txn-ops: larger requests go in several txns. */
#define MAX_TXN_OPS 128
#define CAS_TRIES 1000 /* read-modify-write rounds lost to other writers */

/* ---- request builders -------------------------------------------------------------- */

json_object *tdist__etcd_put_op(const void *key, size_t kl, const void *val, size_t vl,
                                int64_t lease) {
  json_object *o = json_object_new_object();
  if (!o) return NULL;
  json_object_object_add(o, "key", tdist__etcd_b64(key, kl));
  json_object_object_add(o, "value", tdist__etcd_b64(val, vl));
  if (lease) json_object_object_add(o, "lease", json_object_new_int64(lease));
  return o;
}

json_object *tdist__etcd_range_op(const void *key, size_t kl) {
  json_object *o = json_object_new_object();
  if (o) json_object_object_add(o, "key", tdist__etcd_b64(key, kl));
  return o;
}

static json_object *wrap(const char *name, json_object *inner) {
  json_object *o = json_object_new_object();
  if (o)
    json_object_object_add(o, name, inner);
  else
    json_object_put(inner);
  return o;
}

/* {"compare": [], "success": [], "failure": []}; the arrays are returned. */
static json_object *txn_new(json_object **cmp, json_object **ok) {
  json_object *t = json_object_new_object();
  *cmp = json_object_new_array();
  *ok = json_object_new_array();
  if (!t || !*cmp || !*ok) {
    json_object_put(t);
    json_object_put(*cmp);
    json_object_put(*ok);
    return NULL;
  }
  json_object_object_add(t, "compare", *cmp);
  json_object_object_add(t, "success", *ok);
  return t;
}

/* The key is absent (rev 0) or still at mod_revision rev. */
static json_object *cmp_unchanged(const void *key, size_t kl, int64_t rev) {
  json_object *o = json_object_new_object();
  if (!o) return NULL;
  json_object_object_add(o, "key", tdist__etcd_b64(key, kl));
  json_object_object_add(o, "target", json_object_new_string(rev ? "MOD" : "CREATE"));
  json_object_object_add(o, "result", json_object_new_string("EQUAL"));
  json_object_object_add(o, rev ? "mod_revision" : "create_revision", json_object_new_int64(rev));
  return o;
}

char *tdist__etcd_key(const tdist__etcd_t *e, const void *k, size_t kl, size_t *outlen) {
  char *p = tdist__malloc(e->kvlen + kl + 1);
  if (!p) return NULL;
  memcpy(p, e->kv, e->kvlen);
  memcpy(p + e->kvlen, k, kl);
  p[e->kvlen + kl] = 0;
  *outlen = e->kvlen + kl;
  return p;
}

/* ---- reading keys ---------------------------------------------------------------------- */

typedef tdist__etcd_kstate_t kstate_t;

void tdist__etcd_kstates_free(kstate_t *s, size_t n) {
  for (size_t i = 0; s && i < n; i++)
    tdist__free(s[i].val);
}

/* The first kv of a range answer into *s. 0 or TDIST_ERR_NO_MEMORY. */
static int take_range(json_object *range, kstate_t *s) {
  json_object *kvs = NULL;
  memset(s, 0, sizeof(*s));
  if (!json_object_object_get_ex(range, "kvs", &kvs) || json_object_array_length(kvs) == 0)
    return 0;
  json_object *kv = json_object_array_get_idx(kvs, 0);
  s->exists = 1;
  s->mod = tdist__etcd_i64(kv, "mod_revision", 0);
  return tdist__etcd_unb64(kv, "value", &s->val, &s->vlen) ? TDIST_ERR_NO_MEMORY : 0;
}

int tdist__etcd_read_keys(tdist__etcd_t *e, char **ek, size_t *el, size_t n, kstate_t *st,
                          int64_t *revs, int64_t deadline, int *ambiguous) {
  memset(st, 0, sizeof(*st) * n);
  if (n == 1) {
    json_object *rep = NULL, *hdr = NULL;
    TDIST_CHECK(tdist__etcd_post(e->http, "/v3/kv/range", tdist__etcd_range_op(ek[0], el[0]),
                                 deadline, &rep, ambiguous));
    json_object_object_get_ex(rep, "header", &hdr);
    revs[0] = tdist__etcd_i64(hdr, "revision", 0);
    int rc = take_range(rep, &st[0]);
    json_object_put(rep);
    return rc;
  }
  for (size_t c = 0; c < n; c += MAX_TXN_OPS) {
    json_object *cmp, *ok, *t = txn_new(&cmp, &ok), *rep = NULL;
    for (size_t i = c; t && i < n && i < c + MAX_TXN_OPS; i++)
      json_object_array_add(ok, wrap("request_range", tdist__etcd_range_op(ek[i], el[i])));
    TDIST_CHECK(tdist__etcd_post(e->http, "/v3/kv/txn", t, deadline, &rep, ambiguous));
    json_object *hdr = NULL, *rs = NULL;
    json_object_object_get_ex(rep, "header", &hdr);
    revs[c / MAX_TXN_OPS] = tdist__etcd_i64(hdr, "revision", 0);
    json_object_object_get_ex(rep, "responses", &rs);
    int rc = 0;
    for (size_t i = c; i < n && i < c + MAX_TXN_OPS && rc == 0; i++) {
      json_object *r = json_object_array_get_idx(rs, i - c), *range = NULL;
      json_object_object_get_ex(r, "response_range", &range);
      rc = take_range(range, &st[i]);
    }
    json_object_put(rep);
    TDIST_CHECK(rc);
  }
  return 0;
}

static int txn_succeeded(json_object *rep) {
  json_object *f = NULL;
  return json_object_object_get_ex(rep, "succeeded", &f) && json_object_get_boolean(f);
}

/* A read-modify-write txn: if the key (ek) is unchanged since the read that
 * found it at mod_revision `mod` (0: absent), do the puts in `ok`;
 * otherwise read it, into *now: the next round needs no read of its own.
 * Returns 0 with *won, or an error; *ambiguous as tdist__etcd_post. */
static int rmw_txn(tdist__etcd_t *e, const char *ek, size_t el, int64_t mod, json_object *t,
                   int64_t deadline, int *won, kstate_t *now, int *ambiguous) {
  json_object *cmp = NULL, *fail = json_object_new_array(), *rep = NULL, *rs = NULL, *r0 = NULL,
              *range = NULL;
  memset(now, 0, sizeof(*now));
  *won = 0;
  if (t && fail) {
    json_object_object_get_ex(t, "compare", &cmp);
    json_object_array_add(cmp, cmp_unchanged(ek, el, mod));
    json_object_array_add(fail, wrap("request_range", tdist__etcd_range_op(ek, el)));
    json_object_object_add(t, "failure", fail);
  } else {
    json_object_put(fail);
  }
  TDIST_CHECK(tdist__etcd_post(e->http, "/v3/kv/txn", t, deadline, &rep, ambiguous));
  *won = txn_succeeded(rep);
  int rc = 0;
  if (!*won && json_object_object_get_ex(rep, "responses", &rs) &&
      (r0 = json_object_array_get_idx(rs, 0)) &&
      json_object_object_get_ex(r0, "response_range", &range))
    rc = take_range(range, now);
  json_object_put(rep);
  return rc;
}

/* ---- replies (bodies, status byte first: what kv.c writes, less the length) ------ */

int tdist__etcd_rep_begin(tdist__buf_t *rep, uint8_t status, size_t extra) {
  rep->len = 0;
  if (tdist__buf_reserve(rep, 16 + extra)) return TDIST_ERR_NO_MEMORY;
  tdist__put_u8(rep, status);
  return 0;
}

int tdist__etcd_rep_invalid(tdist__buf_t *rep, const char *msg) {
  TDIST_CHECK(tdist__etcd_rep_begin(rep, TDIST__ST_INVALID, strlen(msg)));
  tdist__put_bytes(rep, msg, (uint32_t)strlen(msg));
  return 0;
}

/* ---- operations (the caller holds e->mu) ------------------------------------------- */

typedef struct call {
  tdist__etcd_t *e;
  tdist__rd_t rd;
  tdist__buf_t *rep;
  int64_t deadline; /* of one non-waiting step: now + the handle's timeout */
  int ambiguous;
} call_t;

static int is_heartbeat(const uint8_t *k, uint32_t kl, int *rank) {
  static const char hb[] = "tdist/hb/";
  if (kl <= sizeof(hb) - 1 || kl > sizeof(hb) + 8 || memcmp(k, hb, sizeof(hb) - 1)) return 0;
  int r = 0;
  for (uint32_t i = sizeof(hb) - 1; i < kl; i++) {
    if (k[i] < '0' || k[i] > '9') return 0;
    r = r * 10 + (k[i] - '0');
  }
  *rank = r;
  return 1;
}

static int op_set(call_t *c) {
  const uint8_t *k, *v;
  uint32_t kl, vl;
  int rank;
  if (tdist__get_key(&c->rd, &k, &kl) || tdist__get_bytes(&c->rd, &v, &vl, TDIST_STORE_MAX_VALUE))
    return TDIST_ERR_PROTOCOL;
  if (is_heartbeat(k, kl, &rank)) {
    TDIST_CHECK(tdist__live_etcd_beat(c->e, rank, v, vl, c->deadline));
    return tdist__etcd_rep_begin(c->rep, TDIST__ST_OK, 0);
  }
  size_t el;
  char *ek = tdist__etcd_key(c->e, k, kl, &el);
  json_object *rep = NULL;
  int rc = ek ? tdist__etcd_post(c->e->http, "/v3/kv/put", tdist__etcd_put_op(ek, el, v, vl, 0),
                                 c->deadline, &rep, NULL)
              : TDIST_ERR_NO_MEMORY;
  tdist__free(ek);
  json_object_put(rep);
  TDIST_CHECK(rc);
  return tdist__etcd_rep_begin(c->rep, TDIST__ST_OK, 0);
}

static int op_multi_set(call_t *c) {
  uint32_t n;
  if (tdist__get_u32(&c->rd, &n) || n == 0 || n > TDIST__STORE_MAX_KEYS) return TDIST_ERR_PROTOCOL;
  int rc = 0;
  for (uint32_t b = 0; b < n && rc == 0; b += MAX_TXN_OPS) {
    json_object *cmp, *ok, *t = txn_new(&cmp, &ok), *rep = NULL;
    for (uint32_t i = b; i < n && i < b + MAX_TXN_OPS; i++) {
      const uint8_t *k, *v;
      uint32_t kl, vl;
      size_t el;
      if (tdist__get_key(&c->rd, &k, &kl) ||
          tdist__get_bytes(&c->rd, &v, &vl, TDIST_STORE_MAX_VALUE)) {
        json_object_put(t);
        return TDIST_ERR_PROTOCOL;
      }
      char *ek = tdist__etcd_key(c->e, k, kl, &el);
      if (t && ek)
        json_object_array_add(ok, wrap("request_put", tdist__etcd_put_op(ek, el, v, vl, 0)));
      tdist__free(ek);
    }
    rc = tdist__etcd_post(c->e->http, "/v3/kv/txn", t, c->deadline, &rep, NULL);
    json_object_put(rep);
  }
  TDIST_CHECK(rc);
  return tdist__etcd_rep_begin(c->rep, TDIST__ST_OK, 0);
}

/* Parse a decimal int64 of exactly n bytes (kv.c's rule). */
static int parse_i64(const uint8_t *p, size_t n, int64_t *v) {
  char tmp[32], *end;
  if (n == 0 || n >= sizeof(tmp)) return -1;
  memcpy(tmp, p, n);
  tmp[n] = 0;
  errno = 0;
  long long r = strtoll(tmp, &end, 10);
  if (errno || *end) return -1;
  *v = r;
  return 0;
}

/*
 * add and append: read the key and this handle's op record in one txn; if
 * an earlier attempt of this very op may have been applied without us
 * hearing (c->ambiguous) and the record says it was, answer from it;
 * otherwise compute the new value and write it and the record in a txn that
 * compares the key's revision, and go round again when another writer won.
 */
typedef struct {
  uint8_t op;       /* TDIST__OP_ADD or TDIST__OP_APPEND */
  uint64_t delta;   /* add */
  const uint8_t *v; /* append: the bytes to add */
  uint32_t vl;
  char *keys[2]; /* the etcd key (owned), this handle's op record key */
  size_t lens[2];
  char tag[64]; /* "<seq> ": this op's mark in the op record */
  int tl;
  kstate_t st[2]; /* the key and the op record as last read */
  int64_t cur;    /* add: the counter after this op */
  char num[32];   /* add: cur in decimal, the value written */
} rmw_t;

/* Was this op applied by an attempt whose answer was lost? Then cur is
 * what the op record says it left. */
static int rmw_applied(const call_t *c, rmw_t *m) {
  m->cur = 0;
  if (!c->ambiguous || m->st[1].vlen <= (size_t)m->tl ||
      memcmp(m->st[1].val, m->tag, (size_t)m->tl) != 0)
    return 0;
  if (m->op == TDIST__OP_ADD)
    parse_i64(m->st[1].val + m->tl, m->st[1].vlen - (size_t)m->tl, &m->cur);
  return 1;
}

/* The value to write over st[0]: 0 and *nv, *nl (append: *nv is the
 * caller's to free; add: it is m->num); 1 when there is none to write, with
 * *rc the result (an INVALID reply sent, or no memory). */
static int rmw_value(call_t *c, rmw_t *m, uint8_t **nv, size_t *nl, int *rc) {
  const kstate_t *s = &m->st[0];
  if (m->op == TDIST__OP_ADD) {
    if (s->exists && parse_i64(s->val, s->vlen, &m->cur)) {
      *rc = tdist__etcd_rep_invalid(c->rep, "the key holds a value that is not an int64 counter");
      return 1;
    }
    m->cur = (int64_t)((uint64_t)m->cur + m->delta); /* wraps like the TCP store */
    *nl = (size_t)snprintf(m->num, sizeof(m->num), "%" PRId64, m->cur);
    *nv = (uint8_t *)m->num;
    return 0;
  }
  if ((uint64_t)s->vlen + m->vl > TDIST_STORE_MAX_VALUE) {
    *rc = tdist__etcd_rep_invalid(c->rep, "appended value would exceed TDIST_STORE_MAX_VALUE");
    return 1;
  }
  if (!(*nv = tdist__malloc(s->vlen + m->vl + 1))) {
    *rc = TDIST_ERR_NO_MEMORY;
    return 1;
  }
  if (s->vlen) memcpy(*nv, s->val, s->vlen);
  if (m->vl) memcpy(*nv + s->vlen, m->v, m->vl);
  *nl = s->vlen + m->vl;
  return 0;
}

/* Write the new value and the op record, if the key is unchanged since
 * st[0] was read; *won says whether it was, *now holds what another writer
 * left when not. */
static int rmw_write(call_t *c, rmw_t *m, uint8_t *nv, size_t nl, int *won, kstate_t *now) {
  tdist__etcd_t *e = c->e;
  char rec[96];
  int rl = snprintf(rec, sizeof(rec), "%s%s", m->tag, m->op == TDIST__OP_ADD ? m->num : "");
  json_object *cmp, *ok, *t = txn_new(&cmp, &ok);
  if (t) {
    json_object_array_add(
        ok, wrap("request_put", tdist__etcd_put_op(m->keys[0], m->lens[0], nv, nl, 0)));
    json_object_array_add(
        ok, wrap("request_put", tdist__etcd_put_op(m->keys[1], m->lens[1], rec, (size_t)rl, 0)));
  }
  if (m->op != TDIST__OP_ADD) tdist__free(nv);
  return rmw_txn(e, m->keys[0], m->lens[0], m->st[0].exists ? m->st[0].mod : 0, t, c->deadline, won,
                 now, &c->ambiguous);
}

/* Read, compute, write until the write wins or was applied already
 * (*done: then the caller answers), or the request is answered otherwise. */
static int rmw_loop(call_t *c, rmw_t *m, int *done) {
  int rc = 0, reread = 1;
  for (int tries = 0; rc == 0; tries++) {
    int64_t revs[1];
    if (reread) { /* the op record too, only when it may tell */
      tdist__etcd_kstates_free(m->st, 2);
      memset(m->st, 0, sizeof(m->st));
      if ((rc = tdist__etcd_read_keys(c->e, m->keys, m->lens, c->ambiguous ? 2 : 1, m->st, revs,
                                      c->deadline, NULL)))
        break;
    }
    if ((*done = rmw_applied(c, m))) return 0; /* applied by the attempt whose answer was lost */
    if (tries == CAS_TRIES)
      return tdist__error(TDIST_ERR_TIMEOUT, "lost %d read-modify-write rounds", CAS_TRIES);
    uint8_t *nv = NULL;
    size_t nl = 0;
    if (rmw_value(c, m, &nv, &nl, &rc)) return rc;
    if (m->st[0].exists && (m->op == TDIST__OP_ADD ? m->delta == 0 : m->vl == 0)) {
      /* Adds nothing to a key that exists (the monitor's "add
       * tdist/aborts/count 0" is a read of the counter): the answer is what
       * was read, at one revision, with no write - a txn would contend with
       * every other reader of the key (docs/scale.md). A missing key is
       * written, as the TCP store creates it. */
      if (m->op != TDIST__OP_ADD) tdist__free(nv);
      *done = 1;
      return 0;
    }
    int won = 0;
    kstate_t now;
    rc = rmw_write(c, m, nv, nl, &won, &now);
    if ((*done = rc == 0 && won)) return 0;
    tdist__etcd_kstates_free(m->st, 1);
    m->st[0] = now; /* another writer won: what it wrote (a lost answer: read again) */
    reread = rc == 0 && c->ambiguous;
  }
  return rc;
}

static int op_rmw(call_t *c, uint8_t op) {
  const uint8_t *k;
  uint32_t kl;
  rmw_t m = {.op = op};
  if (tdist__get_key(&c->rd, &k, &kl)) return TDIST_ERR_PROTOCOL;
  if (op == TDIST__OP_ADD ? tdist__get_u64(&c->rd, &m.delta)
                          : tdist__get_bytes(&c->rd, &m.v, &m.vl, TDIST_STORE_MAX_VALUE))
    return TDIST_ERR_PROTOCOL;
  tdist__etcd_t *e = c->e;
  m.keys[0] = tdist__etcd_key(e, k, kl, &m.lens[0]);
  m.keys[1] = e->op_key;
  m.lens[1] = strlen(e->op_key);
  m.tl = snprintf(m.tag, sizeof(m.tag), "%" PRIu64 " ", ++e->op_seq);
  int done = 0, rc = m.keys[0] ? rmw_loop(c, &m, &done) : TDIST_ERR_NO_MEMORY;
  if (done && op == TDIST__OP_ADD) {
    if (!(rc = tdist__etcd_rep_begin(c->rep, TDIST__ST_OK, 8)))
      tdist__put_u64(c->rep, (uint64_t)m.cur);
  } else if (done) {
    rc = tdist__etcd_rep_begin(c->rep, TDIST__ST_OK, 0);
  }
  tdist__etcd_kstates_free(m.st, 2);
  tdist__free(m.keys[0]);
  return rc;
}

/* compare_set: set `desired` if the value read equals `expected` (or the key
 * is missing and expected is empty), in a txn that checks nothing changed
 * since that read; answer the value now stored. */
static int op_cas(call_t *c) {
  const uint8_t *k, *x, *d;
  uint32_t kl, xl, dl;
  if (tdist__get_key(&c->rd, &k, &kl) || tdist__get_bytes(&c->rd, &x, &xl, TDIST_STORE_MAX_VALUE) ||
      tdist__get_bytes(&c->rd, &d, &dl, TDIST_STORE_MAX_VALUE))
    return TDIST_ERR_PROTOCOL;
  size_t el;
  char *ek = tdist__etcd_key(c->e, k, kl, &el);
  kstate_t st = {0};
  int rc = ek ? 0 : TDIST_ERR_NO_MEMORY;
  if (rc == 0) {
    int64_t revs[1];
    rc = tdist__etcd_read_keys(c->e, &ek, &el, 1, &st, revs, c->deadline, NULL);
  }
  for (int tries = 0; rc == 0; tries++) {
    int match = st.exists ? st.vlen == xl && (xl == 0 || memcmp(st.val, x, xl) == 0) : xl == 0;
    if (!match) {
      if (!(rc = tdist__etcd_rep_begin(c->rep, TDIST__ST_OK, st.vlen + 4)))
        tdist__put_bytes(c->rep, st.val, (uint32_t)st.vlen);
      break;
    }
    if (tries == CAS_TRIES) {
      rc = tdist__error(TDIST_ERR_TIMEOUT, "lost %d compare-and-set rounds", CAS_TRIES);
      break;
    }
    json_object *cmp, *ok, *t = txn_new(&cmp, &ok);
    if (t) json_object_array_add(ok, wrap("request_put", tdist__etcd_put_op(ek, el, d, dl, 0)));
    int won = 0;
    kstate_t now;
    rc = rmw_txn(c->e, ek, el, st.exists ? st.mod : 0, t, c->deadline, &won, &now, NULL);
    if (rc == 0 && won) {
      if (!(rc = tdist__etcd_rep_begin(c->rep, TDIST__ST_OK, dl + 4)))
        tdist__put_bytes(c->rep, d, dl);
      break;
    }
    tdist__etcd_kstates_free(&st, 1);
    st = now; /* lost to another writer: decide again on what it wrote */
  }
  tdist__etcd_kstates_free(&st, 1);
  tdist__free(ek);
  return rc;
}

static int op_delete(call_t *c) {
  const uint8_t *k;
  uint32_t kl;
  if (tdist__get_key(&c->rd, &k, &kl)) return TDIST_ERR_PROTOCOL;
  size_t el;
  char *ek = tdist__etcd_key(c->e, k, kl, &el);
  json_object *rep = NULL;
  int rc = ek ? tdist__etcd_post(c->e->http, "/v3/kv/deleterange", tdist__etcd_range_op(ek, el),
                                 c->deadline, &rep, NULL)
              : TDIST_ERR_NO_MEMORY;
  tdist__free(ek);
  if (rc == 0 && !(rc = tdist__etcd_rep_begin(c->rep, TDIST__ST_OK, 1)))
    tdist__put_u8(c->rep, tdist__etcd_i64(rep, "deleted", 0) > 0);
  json_object_put(rep);
  return rc;
}

static int op_num_keys(call_t *c) {
  json_object *r = tdist__etcd_range_op(c->e->kv, c->e->kvlen), *rep = NULL;
  if (r) {
    char end[512];
    memcpy(end, c->e->kv, c->e->kvlen); /* "P/kv/" -> "P/kv0": every key under it */
    end[c->e->kvlen - 1]++;
    json_object_object_add(r, "range_end", tdist__etcd_b64(end, c->e->kvlen));
    json_object_object_add(r, "count_only", json_object_new_boolean(1));
  }
  int rc = tdist__etcd_post(c->e->http, "/v3/kv/range", r, c->deadline, &rep, NULL);
  if (rc == 0 && !(rc = tdist__etcd_rep_begin(c->rep, TDIST__ST_OK, 8)))
    tdist__put_u64(c->rep, (uint64_t)tdist__etcd_i64(rep, "count", 0));
  json_object_put(rep);
  return rc;
}

int tdist__etcd_exec(tdist__etcd_t *e, const tdist__buf_t *req, tdist__buf_t *rep,
                     int64_t deadline_ms) {
  call_t c = {.e = e, .rd = {req->p + 4, req->len - 4, 1}, .rep = rep, .deadline = deadline_ms};
  switch (req->len > 4 ? req->p[4] : 0) {
  case TDIST__OP_SET: return op_set(&c);
  case TDIST__OP_MULTI_SET: return op_multi_set(&c);
  case TDIST__OP_GET:
  case TDIST__OP_WAIT:
  case TDIST__OP_MULTI_GET:
  case TDIST__OP_CHECK: return tdist__etcd_op_read(e, &c.rd, rep, req->p[4]);
  case TDIST__OP_ADD: return op_rmw(&c, TDIST__OP_ADD);
  case TDIST__OP_APPEND: return op_rmw(&c, TDIST__OP_APPEND);
  case TDIST__OP_CAS: return op_cas(&c);
  case TDIST__OP_DELETE: return op_delete(&c);
  case TDIST__OP_NUM_KEYS: return op_num_keys(&c);
  default: return TDIST_ERR_PROTOCOL;
  }
}
