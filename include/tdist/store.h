/*
 * tdist/store.h - key-value store used for rendezvous and control messages.
 *
 * A TCP store server (tdist_store_server_*) runs on its own thread with a libuv
 * loop, hosted by rank 0, by the launcher or by the `tdist-store` tool. Clients
 * (tdist_store_t) talk to it over one TCP connection with a small binary
 * protocol (docs/store-protocol.md). A file store offers the same operations
 * on a shared filesystem. Prefix views share their parent's connection and put
 * a prefix in front of every key, so groups and backends never clash.
 *
 * Keys are non-empty strings of at most TDIST_STORE_MAX_KEY bytes; values are
 * byte strings of at most TDIST_STORE_MAX_VALUE bytes.
 *
 * Timeouts: every call that may wait takes `timeout_ms` (> 0; 0 or less means
 * the store's default, see tdist_store_opts_t). Errors are recorded for
 * tdist_last_error(), naming the key, the server's host:port and the time
 * waited.
 *
 * Thread safety: a store handle may be used by several threads at once (calls
 * are serialised on its connection). Do not call store functions from a work
 * completion callback.
 */
#ifndef TDIST_STORE_H
#define TDIST_STORE_H

#include "tdist/types.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TDIST_STORE_MAX_KEY 4096
#define TDIST_STORE_MAX_VALUE (64u << 20)

/* ---- server ---------------------------------------------------------------- */

enum {
  TDIST_STORE_SERVER_FIELD_HOST = 1u << 0,
  TDIST_STORE_SERVER_FIELD_PORT = 1u << 1,
  TDIST_STORE_SERVER_FIELD_TOKEN = 1u << 2,
  TDIST_STORE_SERVER_FIELD_BACKLOG = 1u << 3,
};
typedef struct tdist_store_server_opts {
  uint64_t mask;
  const char *host;  /* address to bind; default "0.0.0.0" */
  int port;          /* port to bind; 0 (default) picks a free one */
  const char *token; /* shared secret clients must present; default
                        $TDIST_STORE_TOKEN, none if unset */
  int backlog;       /* listen backlog; default /proc/sys/net/core/somaxconn */
} tdist_store_server_opts_t;

/*
 * tdist_store_server_start - start a server thread and bind its socket.
 * Returns once the server listens, so clients may connect right away.
 * @return 0; TDIST_ERR_IO if the address cannot be bound (message names it);
 *         TDIST_ERR_NO_MEMORY. Any thread.
 */
int tdist_store_server_start(const tdist_store_server_opts_t *opts, tdist_store_server_t **server);
/* The port the server listens on (useful with port 0). */
int tdist_store_server_port(const tdist_store_server_t *server);
/* Number of keys currently stored (for tools and tests). */
int64_t tdist_store_server_num_keys(const tdist_store_server_t *server);
/*
 * tdist_store_server_stop - close every connection, stop and join the server
 * thread, free it. Waiting clients get TDIST_ERR_CLOSED. NULL is ignored.
 */
int tdist_store_server_stop(tdist_store_server_t *server);

/* ---- clients ---------------------------------------------------------------- */

enum {
  TDIST_STORE_FIELD_TIMEOUT = 1u << 0,
  TDIST_STORE_FIELD_TOKEN = 1u << 1,
};
typedef struct tdist_store_opts {
  uint64_t mask;
  int64_t timeout_ms; /* default for calls given timeout_ms <= 0, and the
                         connect budget; default 600000 (10 minutes) */
  const char *token;  /* shared secret; default $TDIST_STORE_TOKEN */
} tdist_store_opts_t;

/*
 * tdist_store_connect - connect to a TCP store server. Retries with jittered
 * backoff until the timeout, so a client may start before its server.
 * @return 0; TDIST_ERR_TIMEOUT if no server answered in time;
 *         TDIST_ERR_AUTH if the server refused the token;
 *         TDIST_ERR_PROTOCOL on a version mismatch;
 *         TDIST_ERR_STORE_ERROR at once (not retried) if the server is out of
 *         file descriptors (the message names its RLIMIT_NOFILE).
 */
int tdist_store_connect(const char *host, int port, const tdist_store_opts_t *opts,
                        tdist_store_t **store);

/*
 * tdist_store_open_file - a store kept in one file, for processes sharing a
 * filesystem. Operations lock the file (fcntl) and are atomic across
 * processes; waits poll the file at a short interval.
 */
int tdist_store_open_file(const char *path, const tdist_store_opts_t *opts, tdist_store_t **store);

/*
 * tdist_store_open_url - a store named by a URL: "tcp://host:port"
 * (tdist_store_connect), "file:///path" (tdist_store_open_file), or
 * "etcd://host:port[,host:port...][/prefix]": an etcd v3 cluster through
 * its JSON gateway, keys under "<prefix>/kv/" (default prefix "tdist"),
 * failing over to the next endpoint when one is unreachable; it survives the
 * loss of any process of the job and of a minority of its members
 * (docs/store-protocol.md, "The etcd store"). Like connect, waits up to the
 * timeout for the store to answer.
 * @return 0; TDIST_ERR_INVALID_ARGUMENT for a malformed URL; as connect.
 */
int tdist_store_open_url(const char *url, const tdist_store_opts_t *opts, tdist_store_t **store);

/*
 * tdist_store_prefix - a view of `base` whose keys are `prefix` + key. The view
 * shares base's connection and holds a reference on it; release both
 * independently. Views of views concatenate prefixes.
 */
int tdist_store_prefix(tdist_store_t *base, const char *prefix, tdist_store_t **view);

/* tdist_store_release - drop a reference; the connection closes with the last. */
int tdist_store_release(tdist_store_t *store);

/* tdist_store_free - free a value returned by get, compare_set or multi_get. */
void tdist_store_free(void *value);

/* set: create or overwrite. */
int tdist_store_set(tdist_store_t *s, const char *key, const void *value, size_t len);

/*
 * get: wait until the key exists (woken by the write that creates it), then
 * return a copy of its value in *value (free with tdist_store_free; a
 * zero-length value is returned as a non-NULL pointer) and its length.
 * @return 0; TDIST_ERR_TIMEOUT; TDIST_ERR_CLOSED if the server went away.
 */
int tdist_store_get(tdist_store_t *s, const char *key, void **value, size_t *len,
                    int64_t timeout_ms);

/* add: atomically add `delta` to the int64 counter at key (created at 0;
 * stored as decimal text) and return the new value in *result (may be NULL).
 * TDIST_ERR_INVALID_ARGUMENT if the key holds something else. */
int tdist_store_add(tdist_store_t *s, const char *key, int64_t delta, int64_t *result);

/*
 * compare_set: if the key's value equals `expected` (or the key is missing and
 * expected_len == 0), set it to `desired`. Either way return the value now
 * stored in *current and *current_len (may be NULL to skip).
 */
int tdist_store_compare_set(tdist_store_t *s, const char *key, const void *expected,
                            size_t expected_len, const void *desired, size_t desired_len,
                            void **current, size_t *current_len);

/* wait: block until every key exists. TDIST_ERR_TIMEOUT names a missing key. */
int tdist_store_wait(tdist_store_t *s, const char *const *keys, size_t n, int64_t timeout_ms);

/* check: *all_exist = 1 if every key exists now, else 0. Does not wait. */
int tdist_store_check(tdist_store_t *s, const char *const *keys, size_t n, int *all_exist);

/* delete: remove the key; *deleted = 1 if it existed (may be NULL). */
int tdist_store_delete(tdist_store_t *s, const char *key, int *deleted);

/* num_keys: number of keys in the whole store (prefix views count all keys). */
int tdist_store_num_keys(tdist_store_t *s, int64_t *n);

/* multi_get: get of n keys at once, waiting for all; values[i] freed by the
 * caller with tdist_store_free. On failure nothing is returned. */
int tdist_store_multi_get(tdist_store_t *s, const char *const *keys, size_t n, void **values,
                          size_t *lens, int64_t timeout_ms);

/* multi_set: set n keys in one round trip, atomically on the server. */
int tdist_store_multi_set(tdist_store_t *s, const char *const *keys, const void *const *values,
                          const size_t *lens, size_t n);

/* append: append bytes to the key's value (created if missing). */
int tdist_store_append(tdist_store_t *s, const char *key, const void *value, size_t len);

/* The "host:port", "file:path" or etcd URL this store talks to (static per
 * handle). */
const char *tdist_store_address(const tdist_store_t *s);

/*
 * tdist_store_rendezvous_host - the world rendezvous of tdist_init_process_group
 * done once for a whole host: what a host agent (tdistrun's, or a launcher of
 * your own) calls for the ranks it started, so that the store sees a few
 * requests per host instead of per rank (docs/scale.md). The ranks reach the
 * agent over TDIST_HOST_AGENT (docs/launcher.md "The host agent"); ranks that
 * join the store directly can be part of the same world.
 * @param store       the root store the ranks would have used (the launcher's);
 *                    keys go under "tdist/rdzv/"
 * @param host        the host's index (the node rank); two agents (processes)
 *                    claiming one index fail with TDIST_ERR_INVALID_ARGUMENT
 *                    naming both. One agent may call several times (ranks
 *                    that arrived later), each call blocking until the round
 *                    is complete.
 * @param nranks      how many ranks arrive with this call (>= 1)
 * @param world_size  WORLD_SIZE of the job
 * @param timeout_ms  how long to wait for the rest of the world (> 0)
 * @param job         out: the job's id for this round (TDIST_JOB_ID, else agreed
 *                    on the store), NUL-terminated, cut to job_len - 1
 * @return 0 once every rank of the world arrived; TDIST_ERR_INVALID_ARGUMENT for
 *         bad arguments or a host claimed twice; TDIST_ERR_TIMEOUT naming how
 *         many ranks arrived; TDIST_ERR_NOT_SUPPORTED on an etcd store (it
 *         counts arrivals with a key per rank); store errors.
 * Thread: any (blocks up to timeout_ms on the store).
 */
int tdist_store_rendezvous_host(tdist_store_t *store, int host, int nranks, int world_size,
                                int64_t timeout_ms, char *job, size_t job_len);

#ifdef __cplusplus
}
#endif
#endif /* TDIST_STORE_H */
