/*
 * etcd_read.c - the etcd store's reading operations (see etcd.h): get,
 * wait, multi_get and check, answered as kv.c answers them.
 *
 * A read is a txn of ranges (etcd_ops.c tdist__etcd_read_keys: 128 keys per
 * txn, one revision each). A waiting read that found keys missing opens one
 * watch over the range from the smallest to the largest missing key,
 * starting after the read's (lowest) revision, and applies each event of a
 * key it waits for to what it read: a put gives the key's value at that
 * revision, a delete takes it away again. So the keys are read once and
 * every later write reaches the reader once, O(keys) in all, where a watch
 * on the first missing key followed by a read of all n keys was O(n) per
 * arrival (O(n^2) for n ranks that wait for each other's addresses: the
 * TCP store's stage 2 change, docs/scale.md). Replaying an event the read
 * already saw (a later txn's revision, or a watch resumed on another
 * member) leads to the same state: events come in revision order.
 *
 * Threads: the caller's, holding the store's mutex (etcd.c).
 */
#include <stdlib.h>
#include <string.h>

#include "store/etcd.h"
#include "util/alloc.h"
#include "util/clock.h"
#include "util/error.h"

/* A key of the request, for the events' lookups (sorted by key bytes). */
typedef struct skey {
  const char *k;
  size_t l;
  uint32_t i; /* its index in the request */
} skey_t;

static int skey_cmp(const void *a, const void *b) {
  const skey_t *x = a, *y = b;
  int c = memcmp(x->k, y->k, x->l < y->l ? x->l : y->l);
  return c ? c : (x->l > y->l) - (x->l < y->l);
}

/* A waiting read: its keys, what is known of them, the watch's progress. */
typedef struct wread {
  char **ek; /* etcd keys (owned) */
  size_t *el;
  uint32_t n;
  tdist__etcd_kstate_t *st; /* each key as of revision rev */
  skey_t *sorted;           /* the keys by bytes */
  uint32_t missing;         /* keys with !st[i].exists */
  int64_t rev;              /* the last revision applied */
  int nomem;
} wread_t;

/* Watch callback: a put or delete of a key in [min, max] of the missing
 * ones; apply it to every request key it names (one key may be asked for
 * twice). Stops the watch once none is missing. */
static int on_event(void *arg, int del, const uint8_t *k, size_t kl, const uint8_t *v, size_t vl,
                    int64_t rev) {
  wread_t *w = arg;
  skey_t probe = {(const char *)k, kl, 0},
         *hit = bsearch(&probe, w->sorted, w->n, sizeof(skey_t), skey_cmp);
  if (rev > w->rev) w->rev = rev;
  if (!hit) return w->missing == 0;
  while (hit > w->sorted && skey_cmp(hit - 1, &probe) == 0)
    hit--;
  for (; hit < w->sorted + w->n && skey_cmp(hit, &probe) == 0; hit++) {
    tdist__etcd_kstate_t *s = &w->st[hit->i];
    uint8_t *copy = NULL;
    if (!del && vl && !(copy = tdist__malloc(vl))) {
      w->nomem = 1;
      return 1;
    }
    if (copy) memcpy(copy, v, vl);
    w->missing += s->exists && del ? 1u : 0u;
    w->missing -= !s->exists && !del ? 1u : 0u;
    tdist__free(s->val);
    s->exists = !del;
    s->val = copy;
    s->vlen = del ? 0 : vl;
    s->mod = rev;
  }
  return w->missing == 0;
}

/* Read every key (again: the start, or after a compaction) into w->st; w->rev
 * the lowest revision of the txns, from which the watch may start. */
static int read_all(tdist__etcd_t *e, wread_t *w) {
  int64_t *revs = tdist__calloc(w->n / 128 + 1, sizeof(int64_t));
  if (!revs) return TDIST_ERR_NO_MEMORY;
  tdist__etcd_kstates_free(w->st, w->n);
  int rc = tdist__etcd_read_keys(e, w->ek, w->el, w->n, w->st, revs,
                                 tdist__now_ms() + e->base.timeout_ms, NULL);
  w->rev = revs[0];
  for (uint32_t c = 1; c < w->n / 128 + (w->n % 128 != 0); c++)
    if (revs[c] < w->rev) w->rev = revs[c];
  tdist__free(revs);
  w->missing = 0;
  for (uint32_t i = 0; rc == 0 && i < w->n; i++)
    w->missing += !w->st[i].exists;
  return rc;
}

/* Watch [smallest, largest missing key] from w->rev + 1 until none is
 * missing, the deadline, or an error (TDIST_ERR_PROTOCOL: compacted). */
static int watch_missing(tdist__etcd_t *e, wread_t *w, int64_t deadline) {
  const skey_t *lo = NULL, *hi = NULL;
  for (uint32_t j = 0; j < w->n; j++) /* sorted: the first and last missing */
    if (!w->st[w->sorted[j].i].exists) {
      if (!lo) lo = &w->sorted[j];
      hi = &w->sorted[j];
    }
  char *end = tdist__malloc(hi->l + 1); /* the largest + "\0": the first key past it */
  if (!end) return TDIST_ERR_NO_MEMORY;
  memcpy(end, hi->k, hi->l);
  end[hi->l] = 0;
  int rc =
      tdist__etcd_watch(e->http, lo->k, lo->l, end, hi->l + 1, w->rev + 1, deadline, on_event, w);
  tdist__free(end);
  return w->nomem ? TDIST_ERR_NO_MEMORY : rc;
}

/* The answer once every key exists (or check's at once). */
static int reply(tdist__buf_t *rep, uint8_t op, const wread_t *w) {
  size_t total = 0;
  if (op == TDIST__OP_CHECK) {
    TDIST_CHECK(tdist__etcd_rep_begin(rep, TDIST__ST_OK, 1));
    tdist__put_u8(rep, (uint8_t)(w->missing == 0));
    return 0;
  }
  if (op == TDIST__OP_WAIT) return tdist__etcd_rep_begin(rep, TDIST__ST_OK, 0);
  for (uint32_t i = 0; i < w->n; i++)
    total += w->st[i].vlen + 4;
  if (total > TDIST__STORE_MAX_FRAME) return tdist__etcd_rep_invalid(rep, "reply too large");
  TDIST_CHECK(tdist__etcd_rep_begin(rep, TDIST__ST_OK, total));
  for (uint32_t i = 0; i < w->n; i++)
    tdist__put_bytes(rep, w->st[i].val, (uint32_t)w->st[i].vlen);
  return 0;
}

/* The request's keys as etcd keys, and sorted. */
static int take_keys(tdist__etcd_t *e, tdist__rd_t *rd, wread_t *w) {
  w->ek = tdist__calloc(w->n, sizeof(char *));
  w->el = tdist__calloc(w->n, sizeof(size_t));
  w->st = tdist__calloc(w->n, sizeof(*w->st));
  w->sorted = tdist__calloc(w->n, sizeof(skey_t));
  if (!w->ek || !w->el || !w->st || !w->sorted) return TDIST_ERR_NO_MEMORY;
  for (uint32_t i = 0; i < w->n; i++) {
    const uint8_t *k;
    uint32_t kl;
    if (tdist__get_key(rd, &k, &kl)) return TDIST_ERR_PROTOCOL;
    if (!(w->ek[i] = tdist__etcd_key(e, k, kl, &w->el[i]))) return TDIST_ERR_NO_MEMORY;
    w->sorted[i] = (skey_t){w->ek[i], w->el[i], i};
  }
  qsort(w->sorted, w->n, sizeof(skey_t), skey_cmp);
  return 0;
}

int tdist__etcd_op_read(tdist__etcd_t *e, tdist__rd_t *rd, tdist__buf_t *rep, uint8_t op) {
  uint64_t timeout = 0;
  wread_t w = {.n = 1};
  if (op != TDIST__OP_CHECK && tdist__get_u64(rd, &timeout)) return TDIST_ERR_PROTOCOL;
  if (op != TDIST__OP_GET && tdist__get_u32(rd, &w.n)) return TDIST_ERR_PROTOCOL;
  if (w.n == 0 || w.n > TDIST__STORE_MAX_KEYS) return TDIST_ERR_PROTOCOL;
  int64_t deadline = tdist__now_ms() + (int64_t)timeout;
  int rc = take_keys(e, rd, &w);
  if (rc == 0) rc = read_all(e, &w);
  while (rc == 0) {
    if (op == TDIST__OP_CHECK || w.missing == 0) {
      rc = reply(rep, op, &w);
      break;
    }
    if (tdist__now_ms() >= deadline) { /* kv.c's TIMEOUT: the first key missing */
      uint32_t miss = 0;
      while (w.st[miss].exists)
        miss++;
      if (!(rc = tdist__etcd_rep_begin(rep, TDIST__ST_TIMEOUT, 4))) tdist__put_u32(rep, miss);
      break;
    }
    rc = watch_missing(e, &w, deadline);
    if (rc == TDIST_ERR_TIMEOUT) rc = 0;                /* answered above */
    if (rc == TDIST_ERR_PROTOCOL) rc = read_all(e, &w); /* compacted: read, watch anew */
  }
  tdist__etcd_kstates_free(w.st, w.n);
  for (uint32_t i = 0; w.ek && i < w.n; i++)
    tdist__free(w.ek[i]);
  tdist__free(w.ek);
  tdist__free(w.el);
  tdist__free(w.st);
  tdist__free(w.sorted);
  return rc;
}
