/*
 * store_impl.h - the store object behind tdist_store_t (internal).
 *
 * Every store is a struct tdist_store. A root store (TCP connection, file)
 * has a vtable that carries one request frame to its data and brings the
 * reply back; the operations themselves are encoded once, in client.c, with
 * the wire format of proto.h, and executed by kv.c on the server or, for the
 * file store, in the calling process. A prefix view has no vtable: it points
 * to its root (holding a reference) and a prefix that client.c writes in
 * front of every key, so views of views flatten to one root + one prefix.
 *
 * Ownership: refs counts tdist_store_release calls still owed; the last one
 * calls vt->close (root) or releases the root (view). address and prefix are
 * immutable after creation, so they are read without locks.
 */
#ifndef TDIST_STORE_IMPL_H
#define TDIST_STORE_IMPL_H

#include <stdatomic.h>

#include "store/proto.h"

typedef struct tdist__store_vt {
  /* Any thread. Send the request frame in `req`, put the reply body (status
   * byte first) in `rep` (rep->len reset by the callee). `wait_ms` is how long
   * the server may legitimately hold the request (0 if it never waits); `what`
   * and `key` name the call in error messages. Returns 0, or TDIST_ERR_CLOSED,
   * TDIST_ERR_IO, TDIST_ERR_TIMEOUT with the error recorded. */
  int (*call)(tdist_store_t *s, const tdist__buf_t *req, tdist__buf_t *rep, int64_t wait_ms,
              const char *what, const char *key);
  /* Last reference gone: close and free. */
  void (*close)(tdist_store_t *s);
  /* Optional (NULL: not offered). Any thread. *count = the number of keys
   * that begin with `prefix` (a root key prefix, plen > 0 bytes), read in
   * one linearizable step: every write completed before the call is
   * counted. Offered where a counter that many clients add to is costly
   * (etcd: an add is a compare-txn retried on conflict), so that callers
   * can count arrivals as one key per client instead (store/rendezvous.c).
   * 0, or an error code with the error recorded. */
  int (*count_prefix)(tdist_store_t *s, const char *prefix, size_t plen, int64_t *count);
} tdist__store_vt_t;

struct tdist_store {
  const tdist__store_vt_t *vt; /* NULL for a prefix view */
  _Atomic int refs;
  tdist_store_t *root; /* the root store; itself for a root */
  char *prefix;        /* view: full prefix (root's keys = prefix + key) */
  size_t plen;
  int64_t timeout_ms; /* default for calls given <= 0 */
  char address[280];  /* "host:port" or "file:path" */
  char *token;        /* root of a TCP store: the token it connected with, or NULL */
  char *agent;        /* root of a TCP store reached through a host agent: its
                         socket's name (tdist__store_connect_agent), or NULL */
  _Atomic int broken; /* root: the connection was closed by a failed call */
};

/* (caller) *count = the keys of view `s` that begin with `prefix` (s's
 * own prefix in front), through the root's count_prefix. 0;
 * TDIST_ERR_NOT_SUPPORTED, nothing recorded, where the store does not
 * offer it (TCP, file: their add is one op, use a counter); or the
 * count's error. */
int tdist__store_count_prefix(tdist_store_t *s, const char *prefix, int64_t *count);

/* 1 where tdist__store_count_prefix is offered (etcd), else 0. Any thread. */
static inline int tdist__store_counts_prefixes(const tdist_store_t *s) {
  return s->root->vt->count_prefix != NULL;
}

/* A new reference to the root of `s` with no prefix (for the core's
 * store-wide keys: the dead set, heartbeats, abort records). */
int tdist__store_root_view(tdist_store_t *s, tdist_store_t **out);

/* A new root store talking to the same server (or file) as s, with the
 * same token: a second connection for a thread that waits long (the
 * monitor). Caller thread. */
int tdist__store_reconnect(tdist_store_t *s, int64_t timeout_ms, tdist_store_t **out);

/*
 * tdist__store_connect_agent - a TCP store reached through the host agent
 * `agent` (the abstract unix socket TDIST_HOST_AGENT): the agent answers the
 * handshake and forwards every request to the store `address` ("host:port",
 * for messages and tdist_store_address) on a few connections of its own
 * (tools/launcher/agent_proxy.c), so the store holds O(hosts) connections.
 * Same calls, replies and errors as tdist_store_connect's handle. Caller.
 */
int tdist__store_connect_agent(const char *agent, const char *address,
                               const tdist_store_opts_t *opts, tdist_store_t **store);

/* 1 while the connection of s's root still works (a failed call, such as
 * a reply that never came, closes it for good). Any thread. */
static inline int tdist__store_alive(const tdist_store_t *s) {
  return !atomic_load_explicit(&((tdist_store_t *)s->root)->broken, memory_order_relaxed);
}

/* Initialise the common part of a new root store (refs = 1). */
void tdist__store_init_root(tdist_store_t *s, const tdist__store_vt_t *vt, int64_t timeout_ms);

/* The default timeout: opts->timeout_ms if set and > 0, else 600000. */
int64_t tdist__store_opts_timeout(const tdist_store_opts_t *opts);

#endif
