/*
 * kv.c - hash table and request semantics shared by the TCP server and the
 * file store. See kv.h. Runs on whichever single thread owns the table.
 */
#include "store/kv.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "util/alloc.h"

/* ---- buffers ---------------------------------------------------------------- */

int tdist__buf_reserve(tdist__buf_t *b, size_t extra) {
  if (b->cap - b->len >= extra) return 0;
  /* Double (appends stay amortised O(1)), but never past what is needed when
   * one reservation is larger: a 64 MiB reply must not take 128 MiB. */
  size_t cap = b->cap ? b->cap * 2 : 256;
  if (cap - b->len < extra) cap = b->len + extra;
  uint8_t *p = tdist__realloc(b->p, cap);
  if (!p) return TDIST_ERR_NO_MEMORY;
  b->p = p;
  b->cap = cap;
  return 0;
}

void tdist__buf_free(tdist__buf_t *b) {
  tdist__free(b->p);
  b->p = NULL;
  b->len = b->cap = 0;
}

const char *tdist__store_op_name(int op) {
  static const char *names[] = {"?",           "hello",     "set",   "get",    "add",
                                "compare_set", "wait",      "check", "delete", "num_keys",
                                "multi_get",   "multi_set", "append"};
  return (op > 0 && op < TDIST__OP_MAX_) ? names[op] : "unknown";
}

/* ---- hash table --------------------------------------------------------------- */

static uint64_t hash_key(const void *key, uint32_t n) {
  /* FNV-1a, 8 bytes at a time where possible: keys are short ASCII paths. */
  const uint8_t *p = key;
  uint64_t h = 0xcbf29ce484222325ull;
  while (n >= 8) {
    uint64_t w;
    memcpy(&w, p, 8);
    h = (h ^ w) * 0x100000001b3ull;
    h ^= h >> 29;
    p += 8;
    n -= 8;
  }
  while (n--)
    h = (h ^ *p++) * 0x100000001b3ull;
  return h ^ (h >> 32);
}

int tdist__kv_init(tdist__kv_t *kv) {
  memset(kv, 0, sizeof(*kv));
  kv->buckets = tdist__calloc(1024, sizeof(*kv->buckets));
  if (!kv->buckets) return TDIST_ERR_NO_MEMORY;
  kv->mask = 1023;
  kv->bytes = 1024 * sizeof(*kv->buckets);
  return 0;
}

/* A value block the table let go: kept as a spare when it is large and
 * there is a free slot (kv->keep_spares), freed otherwise. */
static void free_block(tdist__kv_t *kv, uint8_t *base, uint64_t bytes) {
  if (kv->keep_spares && bytes >= TDIST__KV_SPARE_MIN)
    for (int i = 0; i < TDIST__KV_SPARES; i++)
      if (!kv->spare[i].base) {
        kv->spare[i].base = base;
        kv->spare[i].bytes = bytes;
        kv->spare_bytes += bytes;
        return;
      }
  tdist__free(base);
}

uint8_t *tdist__kv_spare_take(tdist__kv_t *kv, uint64_t bytes) {
  for (int i = 0; i < TDIST__KV_SPARES; i++)
    if (kv->spare[i].base && kv->spare[i].bytes == bytes) {
      uint8_t *p = kv->spare[i].base;
      kv->spare[i].base = NULL;
      kv->spare_bytes -= bytes;
      kv->spare_taken = 1;
      return p;
    }
  return NULL;
}

void tdist__kv_spare_trim(tdist__kv_t *kv, int if_unused) {
  if (!(if_unused && kv->spare_taken))
    for (int i = 0; i < TDIST__KV_SPARES; i++)
      if (kv->spare[i].base) {
        tdist__free(kv->spare[i].base);
        kv->spare[i].base = NULL;
        kv->spare_bytes -= kv->spare[i].bytes;
      }
  kv->spare_taken = 0;
}

/* e lets go of its value block (the caller then gives it another or none and
 * takes vcap + voff off kv->bytes): freed, unless replies hold it (e->pin):
 * then it stays until the last unpin, counted in kv->held meanwhile. */
static void drop_value(tdist__kv_t *kv, tdist__kv_entry_t *e) {
  if (e->pin) {
    e->pin->e = NULL;
    kv->held += e->pin->bytes;
    e->pin = NULL;
  } else if (e->val) {
    free_block(kv, e->val - e->voff, (uint64_t)e->vcap + e->voff);
  }
  e->val = NULL;
}

void tdist__kv_unpin(tdist__kv_t *kv, tdist__kv_pin_t *pin) {
  if (--pin->refs > 0) return;
  if (pin->e) {
    pin->e->pin = NULL; /* the entry's again, to write in place */
  } else {
    kv->held -= pin->bytes;
    free_block(kv, pin->base, pin->bytes);
  }
  tdist__free(pin);
}

void tdist__kv_destroy(tdist__kv_t *kv) {
  if (!kv->buckets) return;
  for (size_t i = 0; i <= kv->mask; i++) {
    tdist__kv_entry_t *e = kv->buckets[i];
    while (e) {
      tdist__kv_entry_t *next = e->next;
      drop_value(kv, e); /* a pin left (none once the replies closed) keeps its block */
      tdist__free(e);
      e = next;
    }
  }
  tdist__free(kv->buckets);
  kv->buckets = NULL;
  kv->bytes = 0;
  tdist__kv_spare_trim(kv, 0);
}

static tdist__kv_entry_t *find_h(tdist__kv_t *kv, const void *key, uint32_t klen, uint64_t h) {
  for (tdist__kv_entry_t *e = kv->buckets[h & kv->mask]; e; e = e->next)
    if (e->hash == h && e->klen == klen && memcmp(e->key, key, klen) == 0) return e;
  return NULL;
}

tdist__kv_entry_t *tdist__kv_find(tdist__kv_t *kv, const void *key, uint32_t klen) {
  return find_h(kv, key, klen, hash_key(key, klen));
}

static void grow(tdist__kv_t *kv) {
  size_t nb = (kv->mask + 1) * 2;
  tdist__kv_entry_t **b = tdist__calloc(nb, sizeof(*b));
  if (!b) return; /* keep the old table: longer chains, still correct */
  for (size_t i = 0; i <= kv->mask; i++) {
    tdist__kv_entry_t *e = kv->buckets[i];
    while (e) {
      tdist__kv_entry_t *next = e->next;
      e->next = b[e->hash & (nb - 1)];
      b[e->hash & (nb - 1)] = e;
      e = next;
    }
  }
  tdist__free(kv->buckets);
  kv->buckets = b;
  kv->bytes += (nb / 2) * sizeof(*b);
  kv->mask = nb - 1;
}

/* What an entry of a klen-byte key costs, its value aside (kv->bytes). */
#define ENTRY_BYTES(klen) (sizeof(tdist__kv_entry_t) + (klen) + 1)

/* The entry for key, created as a placeholder if missing; NULL: no memory. */
static tdist__kv_entry_t *get_or_make(tdist__kv_t *kv, const void *key, uint32_t klen) {
  uint64_t h = hash_key(key, klen);
  tdist__kv_entry_t *e = find_h(kv, key, klen, h);
  if (e) return e;
  e = tdist__calloc(1, ENTRY_BYTES(klen));
  if (!e) return NULL;
  kv->bytes += ENTRY_BYTES(klen);
  e->hash = h;
  e->klen = klen;
  memcpy(e->key, key, klen);
  if (kv->nentries >= kv->mask + 1) grow(kv);
  e->next = kv->buckets[h & kv->mask];
  kv->buckets[h & kv->mask] = e;
  kv->nentries++;
  return e;
}

static void unlink_entry(tdist__kv_t *kv, tdist__kv_entry_t *e) {
  tdist__kv_entry_t **pp = &kv->buckets[e->hash & kv->mask];
  while (*pp != e)
    pp = &(*pp)->next;
  *pp = e->next;
  kv->nentries--;
  kv->bytes -= ENTRY_BYTES(e->klen) + e->vcap + e->voff;
  drop_value(kv, e);
  tdist__free(e);
}

void tdist__kv_drop_if_unused(tdist__kv_t *kv, tdist__kv_entry_t *e) {
  if (!e->present && !e->waiters) unlink_entry(kv, e);
}

/* The capacity e's value buffer gets for a write of n bytes (e->vcap when it
 * is kept). One rule for write_entry and for what a request would cost. */
static uint32_t value_cap(const tdist__kv_entry_t *e, uint32_t n, int append) {
  uint32_t need = ((append && e && e->present) ? e->vlen : 0) + n;
  uint32_t vcap = e ? e->vcap : 0;
  if (need <= vcap && !(need < vcap / 4 && vcap > 4096)) return vcap;
  uint32_t cap = need < 16 ? 16 : need;
  if (append && cap < vcap * 2 && vcap * 2 <= TDIST_STORE_MAX_VALUE) cap = vcap * 2;
  return cap;
}

/* Bytes a write of n bytes to key (k, kl) would add to what is charged: a
 * new entry and a larger value buffer, or all of a fresh one when replies
 * hold the old (what x->admit is asked about). */
static uint64_t write_cost(tdist__kv_t *kv, const uint8_t *k, uint32_t kl, uint32_t n, int append) {
  tdist__kv_entry_t *e = tdist__kv_find(kv, k, kl);
  uint32_t cap = value_cap(e, n, append), vcap = (e && !e->pin) ? e->vcap : 0;
  return (e ? 0 : ENTRY_BYTES(kl)) + (cap > vcap ? cap - vcap : 0);
}

/* Write v into e (replace or append), mark it present and tell the server. */
static int write_entry(tdist__kv_t *kv, tdist__kv_entry_t *e, const void *v, uint32_t n,
                       int append) {
  uint32_t base = (append && e->present) ? e->vlen : 0;
  if ((uint64_t)base + n > TDIST_STORE_MAX_VALUE) return -2;
  uint32_t need = base + n;
  uint32_t cap = value_cap(e, n, append);
  /* A taken-over block, or one that replies hold (never written while they
   * send it): a plain new one replaces it. */
  if ((cap != e->vcap && e->voff) || e->pin) {
    uint8_t *p = tdist__malloc(cap);
    if (!p) return -1;
    if (base) memcpy(p, e->val, base);
    kv->bytes = kv->bytes + cap - e->vcap - e->voff;
    drop_value(kv, e);
    e->val = p;
    e->vcap = cap;
    e->voff = 0;
  } else if (cap != e->vcap) {
    uint8_t *p = tdist__realloc(e->val, cap);
    if (!p) return -1;
    kv->bytes += (uint64_t)cap - e->vcap;
    e->val = p;
    e->vcap = cap;
  }
  if (n) memcpy(e->val + base, v, n);
  e->vlen = need;
  if (!e->present) kv->npresent++;
  e->present = 1;
  kv->version++;
  if (kv->on_write) kv->on_write(kv->ctx, e);
  return 0;
}

int tdist__kv_load(tdist__kv_t *kv, const void *key, uint32_t klen, const void *v, uint32_t vlen) {
  tdist__kv_entry_t *e = get_or_make(kv, key, klen);
  return (e && write_entry(kv, e, v, vlen, 0) == 0) ? 0 : -1;
}

/* ---- requests ----------------------------------------------------------------- */

#define BAD(msg)            \
  do {                      \
    x->why = (msg);         \
    return TDIST__EXEC_BAD; \
  } while (0)
#define RESERVE(n)                                              \
  do {                                                          \
    if (tdist__buf_reserve(out, (n))) return TDIST__EXEC_NOMEM; \
  } while (0)

static int reply_simple(tdist__buf_t *out, uint8_t status) {
  RESERVE(5);
  tdist__frame_end(out, tdist__frame_begin(out, status));
  return TDIST__EXEC_DONE;
}

static int reply_msg(tdist__buf_t *out, uint8_t status, const char *msg) {
  uint32_t n = (uint32_t)strlen(msg);
  RESERVE(9 + n);
  size_t f = tdist__frame_begin(out, status);
  tdist__put_bytes(out, msg, n);
  tdist__frame_end(out, f);
  return TDIST__EXEC_DONE;
}

static int reply_invalid(tdist__buf_t *out, const char *msg) {
  return reply_msg(out, TDIST__ST_INVALID, msg);
}

/* Ask the owner's budget whether a request may add `store` bytes to the table
 * and a `reply`-byte frame to `out`; NULL: yes (or no budget). Otherwise the
 * message the request is answered FULL with. */
static const char *refused(tdist__exec_t *x, uint64_t store, uint64_t reply) {
  return x->admit ? x->admit(x->ctx, store, reply) : NULL;
}

/* Parse a decimal int64 value of exactly n bytes. */
static int parse_i64(const uint8_t *p, uint32_t n, int64_t *v) {
  char tmp[32];
  if (n == 0 || n >= sizeof(tmp)) return -1;
  memcpy(tmp, p, n);
  tmp[n] = 0;
  char *end;
  errno = 0;
  long long r = strtoll(tmp, &end, 10);
  if (errno || *end) return -1;
  *v = r;
  return 0;
}

/* An OK frame holding one u8 or one u64. */
static int reply_u8(tdist__buf_t *out, uint8_t v) {
  RESERVE(6);
  size_t f = tdist__frame_begin(out, TDIST__ST_OK);
  tdist__put_u8(out, v);
  tdist__frame_end(out, f);
  return TDIST__EXEC_DONE;
}

static int reply_u64(tdist__buf_t *out, uint64_t v) {
  RESERVE(13);
  size_t f = tdist__frame_begin(out, TDIST__ST_OK);
  tdist__put_u64(out, v);
  tdist__frame_end(out, f);
  return TDIST__EXEC_DONE;
}

/* Park a request on its missing key (k, kl), the idx-th of its keys, whose
 * length prefix is at byte `at` of the body: one waiter (x->on_missing), and
 * the position the owner re-runs it from when that key is written. */
static int park(tdist__kv_t *kv, const uint8_t *k, uint32_t kl, uint32_t idx, size_t at,
                uint64_t timeout, tdist__exec_t *x) {
  if (x->on_missing) { /* without it (the file store) the owner polls from the start */
    tdist__kv_entry_t *e = get_or_make(kv, k, kl);
    if (!e || x->on_missing(x->ctx, e)) return TDIST__EXEC_NOMEM;
    x->resume = 1;
    x->resume_idx = idx;
    x->resume_off = at;
  }
  x->timeout_ms = timeout;
  return TDIST__EXEC_BLOCKED;
}

/* One large value (the key at keys_off, present) sent from where it is
 * stored: the frame's head goes to out, the value is pinned into x->ref.
 * Nothing is copied, so nothing is asked of the budget: the block is
 * charged to the table, or to kv->held once a write lets go of it. */
static int reply_ref(tdist__kv_t *kv, const tdist__rd_t *r, size_t keys_off, tdist__buf_t *out,
                     tdist__exec_t *x) {
  tdist__rd_t r3 = {r->p, r->n, keys_off};
  const uint8_t *k = NULL;
  uint32_t kl = 0;
  tdist__get_key(&r3, &k, &kl);
  tdist__kv_entry_t *e = tdist__kv_find(kv, k, kl);
  RESERVE(9);
  if (!e->pin) {
    if (!(e->pin = tdist__malloc(sizeof(*e->pin)))) return TDIST__EXEC_NOMEM;
    e->pin->e = e;
    e->pin->base = e->val - e->voff;
    e->pin->bytes = (uint64_t)e->vcap + e->voff;
    e->pin->refs = 0;
  }
  e->pin->refs++;
  uint32_t flen = 1 + 4 + e->vlen;
  tdist__put_u32(out, flen);
  tdist__put_u8(out, TDIST__ST_OK);
  tdist__put_u32(out, e->vlen);
  x->ref->pin = e->pin;
  x->ref->p = e->val;
  x->ref->len = e->vlen;
  x->ref->at = out->len;
  return TDIST__EXEC_DONE;
}

/* The values of the n validated keys at `keys_off` (all present), `total`
 * bytes with their length prefixes, in one OK frame. */
static int reply_values(tdist__kv_t *kv, const tdist__rd_t *r, size_t keys_off, uint32_t n,
                        uint64_t total, tdist__buf_t *out, tdist__exec_t *x) {
  if (total > TDIST__STORE_MAX_FRAME) return reply_invalid(out, "reply too large");
  if (n == 1 && x->ref && !x->ref->pin && total >= TDIST__KV_REF_MIN + 4)
    return reply_ref(kv, r, keys_off, out, x);
  const char *no = refused(x, 0, 5 + total);
  if (no) return reply_msg(out, TDIST__ST_FULL, no);
  RESERVE(5 + total);
  size_t f = tdist__frame_begin(out, TDIST__ST_OK);
  tdist__rd_t r3 = {r->p, r->n, keys_off};
  for (uint32_t i = 0; i < n; i++) {
    const uint8_t *k = NULL;
    uint32_t kl = 0;
    tdist__get_key(&r3, &k, &kl);
    tdist__kv_entry_t *e = tdist__kv_find(kv, k, kl);
    tdist__put_bytes(out, e->val, e->vlen);
  }
  tdist__frame_end(out, f);
  return TDIST__EXEC_DONE;
}

/* get, wait, multi_get: u64 timeout, then one key (get) or u32 n + n keys.
 *
 * Cost: a request waits on one missing key at a time. Re-run after that key
 * was written (x->resume), it goes on from that key: the keys before it were
 * present and validated at the last run. Only when the rest are present too
 * does it read all n keys again (one of the earlier ones may have been
 * deleted meanwhile: then it waits on that one). So a multi_get of n keys
 * that k writes complete costs O(n + k) key look-ups in all and holds one
 * waiter, where waking it on every write and re-reading all n keys each time
 * cost O(n k) (with n ranks asking for all n addresses at once: n^3). */
static int exec_waiting(tdist__kv_t *kv, uint8_t op, tdist__rd_t *r, tdist__buf_t *out,
                        tdist__exec_t *x) {
  uint64_t timeout;
  uint32_t n = 1;
  const uint8_t *k = NULL;
  uint32_t kl = 0;
  if (tdist__get_u64(r, &timeout)) BAD("truncated timeout");
  if (op != TDIST__OP_GET && tdist__get_u32(r, &n)) BAD("truncated key count");
  if (n == 0 || n > TDIST__STORE_MAX_KEYS) BAD("bad key count");
  size_t keys_off = r->off;
  int blocking = !x->final && timeout > 0;
  if (x->resume && blocking && x->resume_idx < n && x->resume_off >= keys_off &&
      x->resume_off < r->n) {
    tdist__rd_t r2 = {r->p, r->n, x->resume_off};
    for (uint32_t i = x->resume_idx; i < n; i++) {
      size_t at = r2.off;
      if (tdist__get_key(&r2, &k, &kl)) BAD("bad key"); /* validated before: cannot happen */
      tdist__kv_entry_t *e = tdist__kv_find(kv, k, kl);
      if (!e || !e->present) return park(kv, k, kl, i, at, timeout, x);
    }
  }
  x->resume = 0;
  int64_t missing = -1;
  size_t missing_at = 0;
  const uint8_t *mk = NULL;
  uint32_t mkl = 0;
  uint64_t total = 0;
  for (uint32_t i = 0; i < n; i++) {
    size_t at = r->off;
    if (tdist__get_key(r, &k, &kl)) BAD("bad key");
    tdist__kv_entry_t *e = tdist__kv_find(kv, k, kl);
    if (!e || !e->present) {
      if (missing < 0) {
        missing = i;
        missing_at = at;
        mk = k;
        mkl = kl;
      }
    } else {
      total += e->vlen + 4u;
    }
  }
  if (r->off != r->n) BAD("trailing bytes");
  if (missing >= 0 && blocking) return park(kv, mk, mkl, (uint32_t)missing, missing_at, timeout, x);
  if (missing >= 0) {
    RESERVE(9);
    size_t f = tdist__frame_begin(out, TDIST__ST_TIMEOUT);
    tdist__put_u32(out, (uint32_t)missing);
    tdist__frame_end(out, f);
    return TDIST__EXEC_DONE;
  }
  if (op == TDIST__OP_WAIT) return reply_simple(out, TDIST__ST_OK);
  return reply_values(kv, r, keys_off, n, total, out, x);
}

/* A large SET whose value ends the caller's block (x->take): the entry takes
 * the block over, the value where it is. Its cost to the budget is only a
 * new entry: the block was already charged to the caller, who stops
 * counting it once it is taken. */
static int take_value(tdist__kv_t *kv, const uint8_t *k, uint32_t kl, const uint8_t *v, uint32_t vl,
                      tdist__buf_t *out, tdist__exec_t *x) {
  tdist__kv_entry_t *e = tdist__kv_find(kv, k, kl);
  const char *no = refused(x, e ? 0 : ENTRY_BYTES(kl), 5);
  if (no) return reply_msg(out, TDIST__ST_FULL, no);
  RESERVE(5); /* before the entry changes: a NOMEM must leave it as it was */
  if (!e && !(e = get_or_make(kv, k, kl))) return TDIST__EXEC_NOMEM;
  uint8_t *blk = *x->take;
  kv->bytes = kv->bytes - e->vcap - e->voff + x->take_cap;
  drop_value(kv, e);
  e->voff = (uint32_t)(v - blk);
  e->val = (uint8_t *)v;
  e->vcap = vl;
  e->vlen = vl;
  *x->take = NULL;
  if (!e->present) kv->npresent++;
  e->present = 1;
  kv->version++;
  if (kv->on_write) kv->on_write(kv->ctx, e);
  return reply_simple(out, TDIST__ST_OK);
}

/* set, append: key, value. */
static int exec_set(tdist__kv_t *kv, uint8_t op, tdist__rd_t *r, tdist__buf_t *out,
                    tdist__exec_t *x) {
  const uint8_t *k = NULL, *v = NULL;
  uint32_t kl = 0, vl = 0;
  const char *no;
  tdist__kv_entry_t *e;
  if (tdist__get_key(r, &k, &kl) || tdist__get_bytes(r, &v, &vl, TDIST_STORE_MAX_VALUE))
    BAD("bad key or value");
  if (r->off != r->n) BAD("trailing bytes");
  if (op == TDIST__OP_SET && x->take && *x->take && vl >= TDIST__KV_TAKE_MIN &&
      v + vl == *x->take + x->take_cap)
    return take_value(kv, k, kl, v, vl, out, x);
  if ((no = refused(x, write_cost(kv, k, kl, vl, op == TDIST__OP_APPEND), 5)))
    return reply_msg(out, TDIST__ST_FULL, no);
  if (!(e = get_or_make(kv, k, kl))) return TDIST__EXEC_NOMEM;
  switch (write_entry(kv, e, v, vl, op == TDIST__OP_APPEND)) {
  case -1: return TDIST__EXEC_NOMEM;
  case -2: return reply_invalid(out, "appended value would exceed TDIST_STORE_MAX_VALUE");
  }
  return reply_simple(out, TDIST__ST_OK);
}

/* add: key, u64 delta; the value is a decimal int64 counter. */
static int exec_add(tdist__kv_t *kv, tdist__rd_t *r, tdist__buf_t *out, tdist__exec_t *x) {
  const uint8_t *k = NULL;
  uint32_t kl = 0;
  uint64_t d;
  int64_t cur = 0;
  const char *no;
  if (tdist__get_key(r, &k, &kl) || tdist__get_u64(r, &d)) BAD("bad key or delta");
  if (r->off != r->n) BAD("trailing bytes");
  tdist__kv_entry_t *e = tdist__kv_find(kv, k, kl);
  if (e && e->present && parse_i64(e->val, e->vlen, &cur))
    return reply_invalid(out, "the key holds a value that is not an int64 counter");
  cur = (int64_t)((uint64_t)cur + d); /* wraps like torch's TCPStore */
  char num[32];
  int len = snprintf(num, sizeof(num), "%" PRId64, cur);
  if ((no = refused(x, write_cost(kv, k, kl, (uint32_t)len, 0), 13)))
    return reply_msg(out, TDIST__ST_FULL, no);
  if (!e && !(e = get_or_make(kv, k, kl))) return TDIST__EXEC_NOMEM;
  if (write_entry(kv, e, num, (uint32_t)len, 0)) return TDIST__EXEC_NOMEM;
  return reply_u64(out, (uint64_t)cur);
}

/* compare_set: key, expected, desired; replies the value after. An absent
 * key matches an empty expected value. */
static int exec_cas(tdist__kv_t *kv, tdist__rd_t *r, tdist__buf_t *out, tdist__exec_t *x) {
  const uint8_t *k = NULL, *v = NULL, *v2 = NULL;
  uint32_t kl = 0, vl = 0, vl2 = 0;
  const char *no;
  if (tdist__get_key(r, &k, &kl) || tdist__get_bytes(r, &v, &vl, TDIST_STORE_MAX_VALUE) ||
      tdist__get_bytes(r, &v2, &vl2, TDIST_STORE_MAX_VALUE))
    BAD("bad key or values");
  if (r->off != r->n) BAD("trailing bytes");
  tdist__kv_entry_t *e = tdist__kv_find(kv, k, kl);
  int match =
      (e && e->present) ? (e->vlen == vl && (vl == 0 || memcmp(e->val, v, vl) == 0)) : vl == 0;
  uint64_t after = match ? vl2 : (e && e->present) ? e->vlen : 0;
  if ((no = refused(x, match ? write_cost(kv, k, kl, vl2, 0) : 0, 9 + after)))
    return reply_msg(out, TDIST__ST_FULL, no);
  if (match) {
    if (!e && !(e = get_or_make(kv, k, kl))) return TDIST__EXEC_NOMEM;
    if (write_entry(kv, e, v2, vl2, 0)) return TDIST__EXEC_NOMEM;
  }
  uint32_t cl = (e && e->present) ? e->vlen : 0;
  RESERVE(9 + cl);
  size_t f = tdist__frame_begin(out, TDIST__ST_OK);
  tdist__put_bytes(out, cl ? e->val : NULL, cl);
  tdist__frame_end(out, f);
  return TDIST__EXEC_DONE;
}

/* check: u32 n + n keys; replies 1 when all are present. */
static int exec_check(tdist__kv_t *kv, tdist__rd_t *r, tdist__buf_t *out, tdist__exec_t *x) {
  const uint8_t *k = NULL;
  uint32_t kl = 0, cnt;
  uint8_t all = 1;
  if (tdist__get_u32(r, &cnt) || cnt == 0 || cnt > TDIST__STORE_MAX_KEYS) BAD("bad key count");
  for (uint32_t i = 0; i < cnt; i++) {
    if (tdist__get_key(r, &k, &kl)) BAD("bad key");
    tdist__kv_entry_t *e = tdist__kv_find(kv, k, kl);
    if (!e || !e->present) all = 0;
  }
  if (r->off != r->n) BAD("trailing bytes");
  return reply_u8(out, all);
}

/* delete: key; replies whether it existed. An entry with waiters stays as
 * their placeholder. */
static int exec_delete(tdist__kv_t *kv, tdist__rd_t *r, tdist__buf_t *out, tdist__exec_t *x) {
  const uint8_t *k = NULL;
  uint32_t kl = 0;
  uint8_t existed = 0;
  if (tdist__get_key(r, &k, &kl)) BAD("bad key");
  if (r->off != r->n) BAD("trailing bytes");
  tdist__kv_entry_t *e = tdist__kv_find(kv, k, kl);
  if (e && e->present) {
    existed = 1;
    e->present = 0;
    e->vlen = 0;
    kv->npresent--;
    kv->version++;
    if (!e->waiters) unlink_entry(kv, e);
  }
  return reply_u8(out, existed);
}

/* multi_set: u32 n + n (key, value). */
static int exec_multi_set(tdist__kv_t *kv, tdist__rd_t *r, tdist__buf_t *out, tdist__exec_t *x) {
  const uint8_t *k = NULL, *v = NULL;
  uint32_t kl = 0, vl = 0, cnt;
  const char *no;
  tdist__kv_entry_t *e;
  if (tdist__get_u32(r, &cnt) || cnt == 0 || cnt > TDIST__STORE_MAX_KEYS) BAD("bad key count");
  size_t start = r->off;
  /* Validate everything first so the set is all-or-nothing; its cost is
   * an upper bound (a key named twice is counted twice). */
  uint64_t cost = 0;
  for (uint32_t i = 0; i < cnt; i++) {
    if (tdist__get_key(r, &k, &kl) || tdist__get_bytes(r, &v, &vl, TDIST_STORE_MAX_VALUE))
      BAD("bad key or value");
    cost += write_cost(kv, k, kl, vl, 0);
  }
  if (r->off != r->n) BAD("trailing bytes");
  if ((no = refused(x, cost, 5))) return reply_msg(out, TDIST__ST_FULL, no);
  r->off = start;
  for (uint32_t i = 0; i < cnt; i++) {
    tdist__get_key(r, &k, &kl);
    tdist__get_bytes(r, &v, &vl, TDIST_STORE_MAX_VALUE);
    if (!(e = get_or_make(kv, k, kl)) || write_entry(kv, e, v, vl, 0)) return TDIST__EXEC_NOMEM;
  }
  return reply_simple(out, TDIST__ST_OK);
}

int tdist__kv_exec(tdist__kv_t *kv, const uint8_t *body, size_t n, tdist__buf_t *out,
                   tdist__exec_t *x) {
  tdist__rd_t r = {body, n, 0};
  uint8_t op;
  x->why = NULL;
  if (tdist__get_u8(&r, &op)) BAD("empty message");
  switch (op) {
  case TDIST__OP_GET:
  case TDIST__OP_WAIT:
  case TDIST__OP_MULTI_GET: return exec_waiting(kv, op, &r, out, x);
  case TDIST__OP_SET:
  case TDIST__OP_APPEND: return exec_set(kv, op, &r, out, x);
  case TDIST__OP_ADD: return exec_add(kv, &r, out, x);
  case TDIST__OP_CAS: return exec_cas(kv, &r, out, x);
  case TDIST__OP_CHECK: return exec_check(kv, &r, out, x);
  case TDIST__OP_DELETE: return exec_delete(kv, &r, out, x);
  case TDIST__OP_NUM_KEYS:
    if (r.off != r.n) BAD("trailing bytes");
    return reply_u64(out, (uint64_t)kv->npresent);
  case TDIST__OP_MULTI_SET: return exec_multi_set(kv, &r, out, x);
  case TDIST__OP_HELLO: BAD("repeated handshake");
  default: BAD("unknown operation");
  }
}
