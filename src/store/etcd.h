/*
 * etcd.h - the etcd v3 store (internal): "etcd://host:port[,host:port...]
 * [/prefix]" (docs/store-protocol.md, section "The etcd store").
 *
 * Five files:
 *   etcd_http.c  HTTP to etcd's JSON gateway (libcurl, json-c): one POST with
 *                failover over the endpoint list, base64, and a watch stream;
 *   etcd.c       the handle: URL, open, close, the vtable's call;
 *   etcd_ops.c   the operations: it decodes the request frames client.c
 *                encodes (store/proto.h) and runs each op as etcd requests,
 *                answering with the reply frames kv.c would write, so the
 *                etcd store has the TCP store's semantics and error codes;
 *   etcd_read.c  of those, the reads (get, wait, multi_get, check): one
 *                watch over the missing keys for a waiting one;
 *   etcd_live.c  lease liveness (store/liveness.h): heartbeats are lease
 *                keep-alives, an expired lease is a death every rank sees.
 *
 * Key layout under the URL's prefix P (default "tdist"): a store key K is the
 * etcd key "P/kv/K"; "P/op/<client id>" records each handle's last add or
 * append (so one retried after a lost reply is not applied twice).
 *
 * Threads: a tdist__etcd_http_t belongs to one thread at a time (its owner
 * serialises calls); only tdist__etcd_http_wake may be called from another.
 */
#ifndef TDIST_STORE_ETCD_H
#define TDIST_STORE_ETCD_H

#include <pthread.h>
#include <stdatomic.h>

#include <json.h>

#include "store/store_impl.h"

/* ---- HTTP (etcd_http.c) ------------------------------------------------------ */

typedef struct tdist__etcd_http tdist__etcd_http_t;

/* endpoints: "host:port" strings (copied). 0 or TDIST_ERR_NO_MEMORY. */
int tdist__etcd_http_new(char *const *endpoints, int n, tdist__etcd_http_t **out);
void tdist__etcd_http_free(tdist__etcd_http_t *h);
/* Any thread: make a running watch of h return (TDIST_ERR_CLOSED) soon, and
 * every later one at once; woken says whether that happened. */
void tdist__etcd_http_wake(tdist__etcd_http_t *h);
int tdist__etcd_http_woken(tdist__etcd_http_t *h);
/* Give up with TDIST_ERR_CLOSED once no member accepted a connection for ms
 * (default 3000, also for ms < 0; 0: retry until the deadline, as opening a
 * store does). */
void tdist__etcd_http_set_giveup(tdist__etcd_http_t *h, int64_t ms);
/* Why the last failed call of h failed (for error messages). */
const char *tdist__etcd_http_why(const tdist__etcd_http_t *h);

/*
 * POST `req` (consumed) to `path` ("/v3/kv/put"...) and parse the answer into
 * *rep (the caller puts it). Connection errors and an unavailable cluster
 * ("no leader") move on to the next endpoint, with backoff after a full
 * round, until deadline_ms. *ambiguous (may be NULL) is set to 1 when a
 * request may have been applied although its answer was lost.
 * @return 0; TDIST_ERR_CLOSED (no endpoint reachable), TDIST_ERR_TIMEOUT
 *         (deadline), TDIST_ERR_TOO_LARGE, TDIST_ERR_INVALID_ARGUMENT (etcd
 *         refused the request), TDIST_ERR_PROTOCOL, TDIST_ERR_NO_MEMORY.
 *         The cause is in tdist__etcd_http_why(); nothing is recorded.
 */
int tdist__etcd_post(tdist__etcd_http_t *h, const char *path, json_object *req, int64_t deadline_ms,
                     json_object **rep, int *ambiguous);

/* One watch event: PUT or DELETE of key (decoded) at revision rev. Return 1
 * to stop the watch after the events of this message. */
typedef int (*tdist__etcd_event_fn)(void *arg, int is_delete, const uint8_t *key, size_t klen,
                                    const uint8_t *val, size_t vlen, int64_t rev);
/*
 * Watch [key, range_end) (range_end NULL: the key alone) from revision
 * start_rev until fn returns 1 (0), the deadline passes (TDIST_ERR_TIMEOUT),
 * tdist__etcd_http_wake (TDIST_ERR_CLOSED) or an error (the revision was
 * compacted: TDIST_ERR_PROTOCOL; re-read and watch again).
 */
int tdist__etcd_watch(tdist__etcd_http_t *h, const void *key, size_t klen, const void *range_end,
                      size_t elen, int64_t start_rev, int64_t deadline_ms, tdist__etcd_event_fn fn,
                      void *arg);

/* base64 of n bytes as a new json string; NULL on no memory. */
json_object *tdist__etcd_b64(const void *p, size_t n);
/* Decode the base64 json string field `name` of o into a fresh allocation
 * (*out NULL and *n 0 when absent: proto3 leaves out empty fields). 0 or -1. */
int tdist__etcd_unb64(json_object *o, const char *name, uint8_t **out, size_t *n);
/* An int64 field (the gateway writes them as strings); dflt when absent. */
int64_t tdist__etcd_i64(json_object *o, const char *name, int64_t dflt);

/* ---- the store (etcd.c) ----------------------------------------------------- */

typedef struct tdist__etcd_live tdist__etcd_live_t;

typedef struct tdist__etcd {
  struct tdist_store base;  /* first: a tdist_store_t* is a tdist__etcd_t* */
  pthread_mutex_t mu;       /* serialises calls: http, op_seq, live */
  tdist__etcd_http_t *http; /* the callers' connection */
  char *url;                /* the whole URL (address may be truncated) */
  char **endpoints;         /* "host:port" */
  int nendpoints;
  char *kv; /* "P/kv/": the prefix of every store key */
  size_t kvlen;
  char *op_key;             /* "P/op/<client id>" */
  uint64_t op_seq;          /* add/append number of this handle */
  tdist__etcd_live_t *live; /* lease liveness, once a heartbeat was written */
} tdist__etcd_t;

/* Run one request frame (req, as client.c encodes it) and write the reply
 * body into rep (etcd_ops.c). The caller holds e->mu. 0, or an error code
 * with the cause in tdist__etcd_http_why(e->http). */
int tdist__etcd_exec(tdist__etcd_t *e, const tdist__buf_t *req, tdist__buf_t *rep,
                     int64_t deadline_ms);

/* ---- shared by etcd_ops.c and etcd_read.c (the caller holds e->mu) ---- */

/* One key as read: absent, or its value (owned) and mod_revision. */
typedef struct tdist__etcd_kstate {
  int exists;
  uint8_t *val;
  size_t vlen;
  int64_t mod;
} tdist__etcd_kstate_t;

/* Free the values of s[0..n) (the array is the caller's). */
void tdist__etcd_kstates_free(tdist__etcd_kstate_t *s, size_t n);

/* Read n etcd keys into st with txns of 128 ranges (one key: a range);
 * revs[i / 128] the revision of the txn that read key i (a watch for a key
 * missing in it starts at that + 1). 0, or an error code (the cause in
 * tdist__etcd_http_why); *ambiguous as tdist__etcd_post. */
int tdist__etcd_read_keys(tdist__etcd_t *e, char **ek, size_t *el, size_t n,
                          tdist__etcd_kstate_t *st, int64_t *revs, int64_t deadline,
                          int *ambiguous);

/* Start the reply body in rep with a status byte, room for `extra` more
 * bytes; or a whole TDIST__ST_INVALID reply carrying msg. 0 or
 * TDIST_ERR_NO_MEMORY. */
int tdist__etcd_rep_begin(tdist__buf_t *rep, uint8_t status, size_t extra);
int tdist__etcd_rep_invalid(tdist__buf_t *rep, const char *msg);

/* get, wait, multi_get, check (op): decode the rest of the request from rd
 * and write the reply into rep (etcd_read.c). 0 or an error code. */
int tdist__etcd_op_read(tdist__etcd_t *e, tdist__rd_t *rd, tdist__buf_t *rep, uint8_t op);

/* Open a store on `url` (etcd://...). Caller thread. */
int tdist__etcd_open(const char *url, const tdist_store_opts_t *opts, tdist_store_t **out);

/* The etcd key of store key (k, kl) in a fresh allocation (NULL: no memory). */
char *tdist__etcd_key(const tdist__etcd_t *e, const void *k, size_t kl, size_t *outlen);

/* Small request builders shared with etcd_live.c. Each returns a new object
 * or NULL (no memory). lease 0: none. */
json_object *tdist__etcd_put_op(const void *key, size_t kl, const void *val, size_t vl,
                                int64_t lease);
json_object *tdist__etcd_range_op(const void *key, size_t kl);

#endif
