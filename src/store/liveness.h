/*
 * liveness.h - the store server's dead-rank detector (internal).
 *
 * Ranks heartbeat by writing "tdist/hb/<world rank>" (core/group/heartbeat.c does it
 * every TDIST_HEARTBEAT_INTERVAL_MS); the value "bye" says the rank is
 * leaving cleanly. The server declares a registered rank dead when
 *   - it has been silent for TDIST_HEARTBEAT_TIMEOUT_MS (the server's
 *     environment; default 5000, 0 disables the detector), judged only
 *     right after the loop polled its sockets, so heartbeats that arrived
 *     while the loop stalled are counted first, or
 *   - the connection its heartbeats came on closed without a "bye" (a killed
 *     process: detected at once).
 * A death is recorded as "tdist/dead/<rank>" = reason (the dead set that
 * tdist_group_shrink agrees on) and published like an abort record
 * (core/monitor.h): "tdist/aborts/
 * <n>" = "dead <rank> <reason>", n from "tdist/aborts/count", written
 * through the key-value engine so that every monitor waiting on that key is
 * woken by the write. Each rank is declared dead at most once.
 *
 * Thread: the server's loop thread only. (The etcd store's lease variant is
 * declared at the end.)
 */
#ifndef TDIST_STORE_LIVENESS_H
#define TDIST_STORE_LIVENESS_H

#include <uv.h>

#include "store/kv.h"

typedef struct tdist__live tdist__live_t;

/* NULL (and 0) when the detector is disabled; -1 on allocation failure. */
int tdist__live_start(uv_loop_t *loop, tdist__kv_t *kv, tdist__live_t **out);
/* fn(arg) runs after the detector's own scan declared ranks dead (the
 * server wakes the connections waiting for the records it wrote). */
void tdist__live_on_declared(tdist__live_t *l, void (*fn)(void *arg), void *arg);
/* A write of entry e happened on connection `conn` (NULL: internal write). */
void tdist__live_on_write(tdist__live_t *l, const tdist__kv_entry_t *e, const void *conn);
/* Connection `conn` closed (the server is not stopping). */
void tdist__live_on_close(tdist__live_t *l, const void *conn);
/* Stop the timer and free (from the server's stop path, on its loop). */
void tdist__live_stop(tdist__live_t *l);

/*
 * The etcd store's variant (etcd_live.c): there is no server to notice a
 * silent rank, so liveness rides on etcd leases.
 *   - The first heartbeat a handle writes grants a lease whose TTL is
 *     TDIST_HEARTBEAT_TIMEOUT_MS (rounded up to seconds; etcd's minimum is
 *     about 2 s) and puts "tdist/alive/<rank>" = "host:pid" on it; every
 *     heartbeat then keeps the lease alive and writes "tdist/hb/<rank>"
 *     (the progress snapshot, without a lease). "bye" writes the heartbeat
 *     and revokes the lease.
 *   - The handle also starts a detector thread with a connection of its
 *     own, watching "tdist/alive/". A deleted alive key whose heartbeat is
 *     not "bye" is a rank whose lease expired: killed or stopped. Every
 *     rank's detector sees it, and one txn (creating "tdist/dead/<rank>"
 *     only if absent) records the death exactly once: "tdist/dead/<rank>",
 *     the next "tdist/aborts/<n>" = "dead <rank> <reason>" and the count,
 *     as the TCP server's detector does. So failure detection needs no rank
 *     in particular, only a quorum of the etcd cluster.
 * Threads: beat on the caller's thread holding the store's mutex; the
 * detector on its own thread; stop from the store's close.
 */
struct tdist__etcd;
typedef struct tdist__etcd_live tdist__etcd_live_t;
/* A heartbeat of `rank` with value (v, vl) through store e. 0 or an error
 * (the reason in the etcd connection's why). */
int tdist__live_etcd_beat(struct tdist__etcd *e, int rank, const void *v, size_t vl,
                          int64_t deadline_ms);
/* Stop the detector and free; the lease is left to expire unless "bye"
 * revoked it. NULL is ignored. */
void tdist__live_etcd_stop(tdist__etcd_live_t *l);

#endif
