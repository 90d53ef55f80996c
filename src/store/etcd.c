/*
 * etcd.c - the etcd store's handle (see etcd.h): the URL, opening (which
 * waits for the cluster like tdist_store_connect waits for a server), the
 * vtable's call - etcd_ops.c runs the operation - and close.
 *
 * Threads: any; `mu` serialises the calls of one handle (one curl handle),
 * as the TCP client serialises them on its socket. A failure that left no
 * member reachable marks the handle broken, as a closed TCP connection.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "store/etcd.h"
#include "store/liveness.h"
#include "util/alloc.h"
#include "util/clock.h"
#include "util/error.h"

/* ---- the vtable -------------------------------------------------------------------------- */

static int etcd_call(tdist_store_t *s, const tdist__buf_t *req, tdist__buf_t *rep, int64_t wait_ms,
                     const char *what, const char *key) {
  tdist__etcd_t *e = (tdist__etcd_t *)s;
  int64_t t0 = tdist__now_ms();
  char why[320];
  if (atomic_load_explicit(&s->broken, memory_order_relaxed))
    return tdist__error(TDIST_ERR_CLOSED,
                        "store %s '%s': connection to %s was closed by an earlier failure", what,
                        key, s->address);
  pthread_mutex_lock(&e->mu);
  int rc = tdist__etcd_exec(e, req, rep, t0 + s->timeout_ms);
  snprintf(why, sizeof(why), "%s", tdist__etcd_http_why(e->http));
  pthread_mutex_unlock(&e->mu);
  if (rc == 0) return 0;
  /* No member accepted a connection: the TCP store's closed connection, for
   * good (the monitor reconnects; shrink fails at once). */
  if (rc == TDIST_ERR_CLOSED) atomic_store_explicit(&s->broken, 1, memory_order_relaxed);
  int64_t waited = tdist__now_ms() - t0;
  if (rc == TDIST_ERR_TIMEOUT)
    return tdist__error(rc, "store %s '%s' from %s timed out after %" PRId64 " ms (no reply: %s)",
                        what, key, s->address, waited, why);
  if (rc == TDIST_ERR_CLOSED)
    return tdist__error(rc, "store %s '%s': etcd %s closed the connection after %" PRId64 " ms: %s",
                        what, key, s->address, waited, why);
  return tdist__error(rc, "store %s '%s' on %s: %s (%s)", what, key, s->address, tdist_strerror(rc),
                      rc == TDIST_ERR_PROTOCOL ? "malformed request" : why);
}

static void etcd_close(tdist_store_t *s) {
  tdist__etcd_t *e = (tdist__etcd_t *)s;
  tdist__live_etcd_stop(e->live); /* stops keep-alives; a lease not revoked by "bye" expires */
  if (e->op_seq && e->http) {     /* this handle's op record is of no use any more */
    json_object *rep = NULL;
    tdist__etcd_post(e->http, "/v3/kv/deleterange",
                     tdist__etcd_range_op(e->op_key, strlen(e->op_key)), tdist__now_ms() + 500,
                     &rep, NULL);
    json_object_put(rep);
  }
  tdist__etcd_http_free(e->http);
  for (int i = 0; i < e->nendpoints; i++)
    tdist__free(e->endpoints[i]);
  tdist__free(e->endpoints);
  tdist__free(e->url);
  tdist__free(e->kv);
  tdist__free(e->op_key);
  pthread_mutex_destroy(&e->mu);
  tdist__free(e);
}

/* The vtable's count_prefix: one count-only range over [P/kv/<prefix>,
 * P/kv/<prefix with its last byte + 1>). A range is linearizable in etcd
 * (the gateway's default, not "serializable"): it sees every write that
 * completed before it was sent, which store/rendezvous.c relies on. */
static int etcd_count_prefix(tdist_store_t *s, const char *prefix, size_t plen, int64_t *count) {
  tdist__etcd_t *e = (tdist__etcd_t *)s;
  char why[320];
  size_t el = 0;
  if (atomic_load_explicit(&s->broken, memory_order_relaxed))
    return tdist__error(TDIST_ERR_CLOSED,
                        "store count '%s': connection to %s was closed by an earlier failure",
                        prefix, s->address);
  char *ek = tdist__etcd_key(e, prefix, plen, &el), *end = ek ? tdist__malloc(el) : NULL;
  if (!end) {
    tdist__free(ek);
    return tdist__error(TDIST_ERR_NO_MEMORY, "store count: out of memory");
  }
  memcpy(end, ek, el);
  size_t k = el;
  while (k > 0 && (uint8_t)end[k - 1] == 0xff) /* "a\xff" -> "b": the first key past the prefix */
    k--;
  if (k) end[k - 1]++;
  json_object *r = tdist__etcd_range_op(ek, el), *rep = NULL;
  if (r) {
    json_object_object_add(r, "range_end", tdist__etcd_b64(k ? end : "\0", k ? k : 1));
    json_object_object_add(r, "count_only", json_object_new_boolean(1));
  }
  pthread_mutex_lock(&e->mu);
  int rc =
      tdist__etcd_post(e->http, "/v3/kv/range", r, tdist__now_ms() + s->timeout_ms, &rep, NULL);
  snprintf(why, sizeof(why), "%s", tdist__etcd_http_why(e->http));
  pthread_mutex_unlock(&e->mu);
  tdist__free(ek);
  tdist__free(end);
  if (rc == 0) *count = tdist__etcd_i64(rep, "count", 0);
  json_object_put(rep);
  if (rc == TDIST_ERR_CLOSED) atomic_store_explicit(&s->broken, 1, memory_order_relaxed);
  if (rc)
    return tdist__error(rc, "store count '%s' on %s: %s (%s)", prefix, s->address,
                        tdist_strerror(rc), why);
  return 0;
}

static const tdist__store_vt_t etcd_vt = {etcd_call, etcd_close, etcd_count_prefix};

/* "etcd://h:p,h:p/prefix" -> endpoints and "prefix/kv/", "prefix/op/<id>". */
static int parse_url(tdist__etcd_t *e, const char *url) {
  const char *hp = url + 7, *slash = strchr(hp, '/');
  size_t hl = slash ? (size_t)(slash - hp) : strlen(hp);
  const char *pfx = slash && slash[1] ? slash + 1 : "tdist";
  size_t pl = strlen(pfx);
  while (pl && pfx[pl - 1] == '/')
    pl--;
  if (hl == 0 || pl == 0 || pl > 256) return -1;
  e->endpoints = tdist__calloc(hl / 2 + 2, sizeof(char *));
  if (!e->endpoints) return TDIST_ERR_NO_MEMORY;
  for (const char *p = hp; p < hp + hl;) {
    const char *comma = memchr(p, ',', (size_t)(hp + hl - p)), *end = comma ? comma : hp + hl;
    const char *colon = memchr(p, ':', (size_t)(end - p));
    if (end == p || !colon || colon == p || colon + 1 == end || end - p > 250) return -1;
    for (const char *d = colon + 1; d < end; d++)
      if (*d < '0' || *d > '9') return -1;
    char *ep = tdist__malloc((size_t)(end - p) + 1);
    if (!ep) return TDIST_ERR_NO_MEMORY;
    memcpy(ep, p, (size_t)(end - p));
    ep[end - p] = 0;
    e->endpoints[e->nendpoints++] = ep;
    p = comma ? comma + 1 : end;
  }
  e->kv = tdist__malloc(pl + 5);
  e->op_key = tdist__malloc(pl + 32);
  if (!e->kv || !e->op_key) return TDIST_ERR_NO_MEMORY;
  e->kvlen = (size_t)snprintf(e->kv, pl + 5, "%.*s/kv/", (int)pl, pfx);
  uint64_t id = (uint64_t)tdist__now_ns() ^ ((uint64_t)getpid() << 32) ^ (uintptr_t)e;
  snprintf(e->op_key, pl + 32, "%.*s/op/%016" PRIx64, (int)pl, pfx, id);
  return 0;
}

int tdist__etcd_open(const char *url, const tdist_store_opts_t *opts, tdist_store_t **out) {
  int rc = 0;
  tdist__etcd_t *e = tdist__calloc(1, sizeof(*e));
  if (!e) return tdist__error(TDIST_ERR_NO_MEMORY, "etcd store: out of memory");
  pthread_mutex_init(&e->mu, NULL);
  tdist__store_init_root(&e->base, &etcd_vt, tdist__store_opts_timeout(opts));
  snprintf(e->base.address, sizeof(e->base.address), "%s", url);
  if (!(e->url = tdist__strdup(url))) rc = TDIST_ERR_NO_MEMORY;
  if (rc == 0 && (rc = parse_url(e, url)) == -1)
    rc = tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                      "store URL '%s' is not etcd://host:port[,host:port...][/prefix]", url);
  TDIST_CHECKGOTO(rc, rc, fail);
  TDIST_CHECKGOTO(tdist__etcd_http_new(e->endpoints, e->nendpoints, &e->http), rc, fail);
  /* Like tdist_store_connect: retry until the timeout, so a job may start
   * before its cluster answers. */
  tdist__etcd_http_set_giveup(e->http, 0);
  json_object *r = tdist__etcd_range_op(e->kv, e->kvlen), *rep = NULL;
  if (r) json_object_object_add(r, "count_only", json_object_new_boolean(1));
  rc = tdist__etcd_post(e->http, "/v3/kv/range", r, tdist__now_ms() + e->base.timeout_ms, &rep,
                        NULL);
  json_object_put(rep);
  if (rc) { /* refused everywhere until the deadline: the connect timeout */
    rc = tdist__error(rc == TDIST_ERR_CLOSED ? TDIST_ERR_TIMEOUT : rc,
                      "etcd store %s: no member answered within %" PRId64 " ms: %s", url,
                      e->base.timeout_ms, tdist__etcd_http_why(e->http));
    goto fail;
  }
  tdist__etcd_http_set_giveup(e->http, -1); /* back to the default */
  *out = &e->base;
  return 0;
fail:
  etcd_close(&e->base);
  return rc == TDIST_ERR_NO_MEMORY ? tdist__error(rc, "etcd store: out of memory") : rc;
}
