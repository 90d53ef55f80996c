/*
 * client.c - the public store operations: argument checks, request encoding
 * (with the view's prefix in front of every key), reply decoding, prefix
 * views, reference counting, and opening a store by URL. Transport is the
 * root's vtable (tcp.c, file.c, etcd.c). Any thread; a call is serialised on its root's connection.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/alloc.h"
#include "util/clock.h"
#include "util/error.h"
#include "store/etcd.h"
#include "store/store_impl.h"

#define DEFAULT_TIMEOUT_MS 600000

void tdist__store_init_root(tdist_store_t *s, const tdist__store_vt_t *vt, int64_t timeout_ms) {
  s->vt = vt;
  atomic_init(&s->refs, 1);
  s->root = s;
  s->prefix = NULL;
  s->plen = 0;
  s->timeout_ms = timeout_ms;
}

int64_t tdist__store_opts_timeout(const tdist_store_opts_t *opts) {
  if (opts && (opts->mask & TDIST_STORE_FIELD_TIMEOUT) && opts->timeout_ms > 0)
    return opts->timeout_ms;
  return DEFAULT_TIMEOUT_MS;
}

const char *tdist_store_address(const tdist_store_t *s) { return s ? s->address : ""; }

void tdist_store_free(void *value) { tdist__free(value); }

int tdist_store_release(tdist_store_t *s) {
  if (!s) return 0;
  if (atomic_fetch_sub_explicit(&s->refs, 1, memory_order_acq_rel) != 1) return 0;
  if (s->vt) {
    s->vt->close(s);
  } else {
    tdist_store_t *root = s->root;
    tdist__free(s->prefix);
    tdist__free(s);
    tdist_store_release(root);
  }
  return 0;
}

int tdist_store_prefix(tdist_store_t *base, const char *prefix, tdist_store_t **view) {
  if (!base || !prefix || !view)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "tdist_store_prefix: NULL argument");
  size_t pl = strlen(prefix);
  if (base->plen + pl >= TDIST_STORE_MAX_KEY)
    return tdist__error(TDIST_ERR_TOO_LARGE, "store prefix '%s%s' is longer than %d bytes",
                        base->prefix ? base->prefix : "", prefix, TDIST_STORE_MAX_KEY - 1);
  tdist_store_t *v = tdist__calloc(1, sizeof(*v));
  char *p = tdist__malloc(base->plen + pl + 1);
  if (!v || !p) {
    tdist__free(v);
    tdist__free(p);
    return tdist__error(TDIST_ERR_NO_MEMORY, "store prefix view: out of memory");
  }
  if (base->plen) memcpy(p, base->prefix, base->plen);
  memcpy(p + base->plen, prefix, pl + 1);
  atomic_init(&v->refs, 1);
  v->root = base->root;
  v->prefix = p;
  v->plen = base->plen + pl;
  v->timeout_ms = base->timeout_ms;
  memcpy(v->address, base->address, sizeof(v->address));
  atomic_fetch_add_explicit(&v->root->refs, 1, memory_order_relaxed);
  *view = v;
  return 0;
}

int tdist__store_root_view(tdist_store_t *s, tdist_store_t **out) {
  return tdist_store_prefix(s->root, "", out);
}

int tdist__store_count_prefix(tdist_store_t *s, const char *prefix, int64_t *count) {
  tdist_store_t *r = s->root;
  size_t pl = strlen(prefix);
  if (!r->vt->count_prefix) return TDIST_ERR_NOT_SUPPORTED;
  if (s->plen + pl == 0)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "store count: empty prefix");
  char *full = tdist__malloc(s->plen + pl + 1);
  if (!full) return tdist__error(TDIST_ERR_NO_MEMORY, "store count: out of memory");
  if (s->plen) memcpy(full, s->prefix, s->plen);
  memcpy(full + s->plen, prefix, pl + 1);
  int rc = r->vt->count_prefix(r, full, s->plen + pl, count);
  tdist__free(full);
  return rc;
}

int tdist__store_reconnect(tdist_store_t *s, int64_t timeout_ms, tdist_store_t **out) {
  const tdist_store_t *r = s->root;
  tdist_store_opts_t o = {.mask = TDIST_STORE_FIELD_TIMEOUT | TDIST_STORE_FIELD_TOKEN,
                          .timeout_ms = timeout_ms,
                          .token = r->token};
  if (r->agent) return tdist__store_connect_agent(r->agent, r->address, &o, out);
  if (strncmp(r->address, "file:", 5) == 0) return tdist_store_open_file(r->address + 5, &o, out);
  if (strncmp(r->address, "etcd://", 7) == 0) /* the whole URL: address may be cut short */
    return tdist__etcd_open(((const tdist__etcd_t *)r)->url, &o, out);
  const char *colon = strrchr(r->address, ':');
  if (!colon)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "store: bad address '%s'", r->address);
  char host[256];
  snprintf(host, sizeof(host), "%.*s", (int)(colon - r->address), r->address);
  return tdist_store_connect(host, atoi(colon + 1), &o, out);
}

int tdist_store_open_url(const char *url, const tdist_store_opts_t *opts, tdist_store_t **store) {
  if (!url || !store)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "tdist_store_open_url: NULL argument");
  if (strncmp(url, "etcd://", 7) == 0) return tdist__etcd_open(url, opts, store);
  if (strncmp(url, "file://", 7) == 0) return tdist_store_open_file(url + 7, opts, store);
  if (strncmp(url, "tcp://", 6) == 0) {
    const char *hp = url + 6, *colon = strrchr(hp, ':');
    char host[256], *end = NULL;
    long port = colon ? strtol(colon + 1, &end, 10) : 0;
    if (colon && colon > hp && (size_t)(colon - hp) < sizeof(host) && *end == '\0' && port > 0 &&
        port < 65536) {
      int bracket = hp[0] == '[' && colon[-1] == ']'; /* [v6]:port */
      snprintf(host, sizeof(host), "%.*s", (int)(colon - hp) - 2 * bracket, hp + bracket);
      return tdist_store_connect(host, (int)port, opts, store);
    }
  }
  return tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                      "store URL '%s' is not tcp://host:port, file:///path or "
                      "etcd://host:port[,host:port...][/prefix]",
                      url);
}

/* ---- encoding ---------------------------------------------------------------- */

static int check_key(const tdist_store_t *s, const char *what, const char *key, size_t *klen) {
  if (!key || !*key)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "store %s on %s: empty or NULL key", what,
                        s->address);
  size_t n = strlen(key);
  if (n + s->plen > TDIST_STORE_MAX_KEY)
    return tdist__error(TDIST_ERR_TOO_LARGE, "store %s: key '%.64s...' is longer than %d bytes",
                        what, key, TDIST_STORE_MAX_KEY);
  *klen = n;
  return 0;
}

static void put_key(tdist__buf_t *b, const tdist_store_t *s, const char *key, size_t klen) {
  tdist__put_u32(b, (uint32_t)(s->plen + klen));
  tdist__put(b, s->prefix, s->plen);
  tdist__put(b, key, klen);
}

static int64_t eff_timeout(const tdist_store_t *s, int64_t t) { return t > 0 ? t : s->timeout_ms; }

/* Send req (frame begun at offset 0) and decode the status. On TIMEOUT /
 * INVALID / AUTH the error is recorded here. `keys` names keys for a TIMEOUT. */
static int roundtrip(tdist_store_t *s, tdist__buf_t *req, tdist__buf_t *rep, int64_t wait_ms,
                     const char *what, const char *const *keys, size_t nkeys) {
  tdist__frame_end(req, 0);
  if (req->len - 4 > TDIST__STORE_MAX_FRAME)
    return tdist__error(TDIST_ERR_TOO_LARGE,
                        "store %s '%s' on %s: request of %zu bytes exceeds "
                        "the protocol limit",
                        what, keys ? keys[0] : "", s->address, req->len);
  int64_t t0 = tdist__now_ms();
  int rc = s->root->vt->call(s->root, req, rep, wait_ms, what, keys ? keys[0] : "");
  if (rc) return rc;
  if (rep->len < 1)
    return tdist__error(TDIST_ERR_PROTOCOL, "store %s: empty reply from %s", what, s->address);
  tdist__rd_t r = {rep->p, rep->len, 1};
  switch (rep->p[0]) {
  case TDIST__ST_OK: return 0;
  case TDIST__ST_TIMEOUT: {
    uint32_t idx = 0;
    tdist__get_u32(&r, &idx);
    const char *k = (keys && idx < nkeys) ? keys[idx] : "?";
    return tdist__error(TDIST_ERR_TIMEOUT, "store %s '%s%s' from %s timed out after %" PRId64 " ms",
                        what, s->prefix ? s->prefix : "", k, s->address, tdist__now_ms() - t0);
  }
  case TDIST__ST_INVALID: {
    const uint8_t *m = (const uint8_t *)"";
    uint32_t ml = 0;
    tdist__get_bytes(&r, &m, &ml, 4096);
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "store %s '%s%s' on %s: %.*s", what,
                        s->prefix ? s->prefix : "", keys ? keys[0] : "", s->address, (int)ml,
                        (const char *)m);
  }
  case TDIST__ST_FULL: {
    const uint8_t *m = (const uint8_t *)"";
    uint32_t ml = 0;
    tdist__get_bytes(&r, &m, &ml, 4096);
    return tdist__error(TDIST_ERR_NO_MEMORY, "store %s '%s%s' on %s: %.*s", what,
                        s->prefix ? s->prefix : "", keys ? keys[0] : "", s->address, (int)ml,
                        (const char *)m);
  }
  default:
    return tdist__error(TDIST_ERR_PROTOCOL, "store %s: unexpected reply status %u from %s", what,
                        rep->p[0], s->address);
  }
}

#define BEGIN(op, extra)                                            \
  tdist__buf_t req = {0};                                           \
  int rc;                                                           \
  if (tdist__buf_reserve(&req, (extra) + 64)) {                     \
    rc = tdist__error(TDIST_ERR_NO_MEMORY, "store: out of memory"); \
    goto out;                                                       \
  }                                                                 \
  tdist__frame_begin(&req, (op))

static int check_len(const tdist_store_t *s, const char *what, const char *key, size_t len) {
  if (len > TDIST_STORE_MAX_VALUE)
    return tdist__error(TDIST_ERR_TOO_LARGE,
                        "store %s '%s' on %s: value of %zu bytes exceeds "
                        "TDIST_STORE_MAX_VALUE",
                        what, key, s->address, len);
  return 0;
}

static int set_like(tdist_store_t *s, uint8_t op, const char *what, const char *key,
                    const void *value, size_t len) {
  size_t kl = 0;
  if (!s) return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "store %s: NULL store", what);
  TDIST_CHECK(check_key(s, what, key, &kl));
  TDIST_CHECK(check_len(s, what, key, len));
  if (len && !value) return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "store %s: NULL value", what);
  tdist__buf_t rep = {0};
  BEGIN(op, s->plen + kl + len);
  put_key(&req, s, key, kl);
  tdist__put_bytes(&req, value, (uint32_t)len);
  rc = roundtrip(s, &req, &rep, 0, what, &key, 1);
out:
  tdist__buf_free(&req);
  tdist__buf_free(&rep);
  return rc;
}

int tdist_store_set(tdist_store_t *s, const char *key, const void *value, size_t len) {
  return set_like(s, TDIST__OP_SET, "set", key, value, len);
}

int tdist_store_append(tdist_store_t *s, const char *key, const void *value, size_t len) {
  return set_like(s, TDIST__OP_APPEND, "append", key, value, len);
}

/* Copy a length-prefixed value out of a reply into a fresh allocation. */
static int take_value(tdist__rd_t *r, void **value, size_t *len) {
  const uint8_t *p;
  uint32_t n;
  if (tdist__get_bytes(r, &p, &n, TDIST_STORE_MAX_VALUE))
    return tdist__error(TDIST_ERR_PROTOCOL, "store: truncated value in reply");
  void *v = tdist__malloc(n ? n : 1);
  if (!v) return tdist__error(TDIST_ERR_NO_MEMORY, "store: out of memory for a %u-byte value", n);
  if (n) memcpy(v, p, n);
  *value = v;
  if (len) *len = n;
  return 0;
}

static int check_keys(tdist_store_t *s, const char *what, const char *const *keys, size_t n,
                      size_t *total) {
  if (!s) return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "store %s: NULL store", what);
  if (!keys || n == 0 || n > TDIST__STORE_MAX_KEYS)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "store %s on %s: %zu keys (1..%u allowed)",
                        what, s->address, n, TDIST__STORE_MAX_KEYS);
  *total = 0;
  for (size_t i = 0; i < n; i++) {
    size_t kl = 0;
    TDIST_CHECK(check_key(s, what, keys[i], &kl));
    *total += kl + s->plen + 4;
  }
  return 0;
}

/* get / wait / multi_get share one request shape. */
static int waiting_call(tdist_store_t *s, uint8_t op, const char *what, const char *const *keys,
                        size_t n, int64_t timeout_ms, tdist__buf_t *rep) {
  size_t total = 0;
  TDIST_CHECK(check_keys(s, what, keys, n, &total));
  int64_t t = eff_timeout(s, timeout_ms);
  BEGIN(op, total + 16);
  tdist__put_u64(&req, (uint64_t)t);
  if (op != TDIST__OP_GET) tdist__put_u32(&req, (uint32_t)n);
  for (size_t i = 0; i < n; i++)
    put_key(&req, s, keys[i], strlen(keys[i]));
  rc = roundtrip(s, &req, rep, t, what, keys, n);
out:
  tdist__buf_free(&req);
  return rc;
}

int tdist_store_get(tdist_store_t *s, const char *key, void **value, size_t *len,
                    int64_t timeout_ms) {
  if (!value) return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "store get: NULL value pointer");
  tdist__buf_t rep = {0};
  int rc = waiting_call(s, TDIST__OP_GET, "get", &key, 1, timeout_ms, &rep);
  if (rc == 0) {
    tdist__rd_t r = {rep.p, rep.len, 1};
    rc = take_value(&r, value, len);
  }
  tdist__buf_free(&rep);
  return rc;
}

int tdist_store_wait(tdist_store_t *s, const char *const *keys, size_t n, int64_t timeout_ms) {
  tdist__buf_t rep = {0};
  int rc = waiting_call(s, TDIST__OP_WAIT, "wait", keys, n, timeout_ms, &rep);
  tdist__buf_free(&rep);
  return rc;
}

int tdist_store_multi_get(tdist_store_t *s, const char *const *keys, size_t n, void **values,
                          size_t *lens, int64_t timeout_ms) {
  if (!values || !lens)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "store multi_get: NULL output array");
  tdist__buf_t rep = {0};
  int rc = waiting_call(s, TDIST__OP_MULTI_GET, "multi_get", keys, n, timeout_ms, &rep);
  if (rc == 0) {
    tdist__rd_t r = {rep.p, rep.len, 1};
    for (size_t i = 0; i < n && rc == 0; i++) {
      rc = take_value(&r, &values[i], &lens[i]);
      if (rc)
        for (size_t j = 0; j < i; j++)
          tdist__free(values[j]);
    }
  }
  tdist__buf_free(&rep);
  return rc;
}

int tdist_store_check(tdist_store_t *s, const char *const *keys, size_t n, int *all_exist) {
  size_t total = 0;
  TDIST_CHECK(check_keys(s, "check", keys, n, &total));
  tdist__buf_t rep = {0};
  BEGIN(TDIST__OP_CHECK, total + 8);
  tdist__put_u32(&req, (uint32_t)n);
  for (size_t i = 0; i < n; i++)
    put_key(&req, s, keys[i], strlen(keys[i]));
  rc = roundtrip(s, &req, &rep, 0, "check", keys, n);
  if (rc == 0 && all_exist) *all_exist = rep.len > 1 && rep.p[1] == 1;
out:
  tdist__buf_free(&req);
  tdist__buf_free(&rep);
  return rc;
}

int tdist_store_add(tdist_store_t *s, const char *key, int64_t delta, int64_t *result) {
  size_t kl = 0;
  if (!s) return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "store add: NULL store");
  TDIST_CHECK(check_key(s, "add", key, &kl));
  tdist__buf_t rep = {0};
  BEGIN(TDIST__OP_ADD, s->plen + kl + 8);
  put_key(&req, s, key, kl);
  tdist__put_u64(&req, (uint64_t)delta);
  rc = roundtrip(s, &req, &rep, 0, "add", &key, 1);
  if (rc == 0) {
    uint64_t v;
    tdist__rd_t r = {rep.p, rep.len, 1};
    if (tdist__get_u64(&r, &v))
      rc = tdist__error(TDIST_ERR_PROTOCOL, "store add: truncated reply from %s", s->address);
    else if (result)
      *result = (int64_t)v;
  }
out:
  tdist__buf_free(&req);
  tdist__buf_free(&rep);
  return rc;
}

int tdist_store_compare_set(tdist_store_t *s, const char *key, const void *expected,
                            size_t expected_len, const void *desired, size_t desired_len,
                            void **current, size_t *current_len) {
  size_t kl = 0;
  if (!s) return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "store compare_set: NULL store");
  TDIST_CHECK(check_key(s, "compare_set", key, &kl));
  TDIST_CHECK(check_len(s, "compare_set", key, expected_len));
  TDIST_CHECK(check_len(s, "compare_set", key, desired_len));
  if ((expected_len && !expected) || (desired_len && !desired))
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "store compare_set: NULL value");
  tdist__buf_t rep = {0};
  BEGIN(TDIST__OP_CAS, s->plen + kl + expected_len + desired_len + 8);
  put_key(&req, s, key, kl);
  tdist__put_bytes(&req, expected, (uint32_t)expected_len);
  tdist__put_bytes(&req, desired, (uint32_t)desired_len);
  rc = roundtrip(s, &req, &rep, 0, "compare_set", &key, 1);
  if (rc == 0 && current) {
    tdist__rd_t r = {rep.p, rep.len, 1};
    rc = take_value(&r, current, current_len);
  }
out:
  tdist__buf_free(&req);
  tdist__buf_free(&rep);
  return rc;
}

int tdist_store_delete(tdist_store_t *s, const char *key, int *deleted) {
  size_t kl = 0;
  if (!s) return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "store delete: NULL store");
  TDIST_CHECK(check_key(s, "delete", key, &kl));
  tdist__buf_t rep = {0};
  BEGIN(TDIST__OP_DELETE, s->plen + kl);
  put_key(&req, s, key, kl);
  rc = roundtrip(s, &req, &rep, 0, "delete", &key, 1);
  if (rc == 0 && deleted) *deleted = rep.len > 1 && rep.p[1] == 1;
out:
  tdist__buf_free(&req);
  tdist__buf_free(&rep);
  return rc;
}

int tdist_store_num_keys(tdist_store_t *s, int64_t *n) {
  if (!s || !n) return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "store num_keys: NULL argument");
  tdist__buf_t rep = {0};
  BEGIN(TDIST__OP_NUM_KEYS, 0);
  rc = roundtrip(s, &req, &rep, 0, "num_keys", NULL, 0);
  if (rc == 0) {
    uint64_t v = 0;
    tdist__rd_t r = {rep.p, rep.len, 1};
    if (tdist__get_u64(&r, &v))
      rc = tdist__error(TDIST_ERR_PROTOCOL, "store num_keys: truncated reply from %s", s->address);
    *n = (int64_t)v;
  }
out:
  tdist__buf_free(&req);
  tdist__buf_free(&rep);
  return rc;
}

int tdist_store_multi_set(tdist_store_t *s, const char *const *keys, const void *const *values,
                          const size_t *lens, size_t n) {
  size_t total = 0;
  TDIST_CHECK(check_keys(s, "multi_set", keys, n, &total));
  if (!values || !lens)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "store multi_set: NULL values");
  for (size_t i = 0; i < n; i++) {
    TDIST_CHECK(check_len(s, "multi_set", keys[i], lens[i]));
    if (lens[i] && !values[i])
      return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "store multi_set: NULL value for '%s'",
                          keys[i]);
    total += lens[i] + 4;
    if (total > TDIST__STORE_MAX_FRAME)
      return tdist__error(TDIST_ERR_TOO_LARGE,
                          "store multi_set on %s: %zu keys and values "
                          "exceed the protocol's %u-byte message limit",
                          s->address, n, TDIST__STORE_MAX_FRAME);
  }
  tdist__buf_t rep = {0};
  BEGIN(TDIST__OP_MULTI_SET, total + 8);
  tdist__put_u32(&req, (uint32_t)n);
  for (size_t i = 0; i < n; i++) {
    put_key(&req, s, keys[i], strlen(keys[i]));
    tdist__put_bytes(&req, values[i], (uint32_t)lens[i]);
  }
  rc = roundtrip(s, &req, &rep, 0, "multi_set", keys, n);
out:
  tdist__buf_free(&req);
  tdist__buf_free(&rep);
  return rc;
}
