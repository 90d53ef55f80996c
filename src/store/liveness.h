/*
 * liveness.h - the store server's dead-rank detector (internal).
 *
 * Ranks heartbeat by writing "tdist/hb/<world rank>" (core/monitor.c does it
 * every TDIST_HEARTBEAT_INTERVAL_MS); the value "bye" says the rank is
 * leaving cleanly. The server declares a registered rank dead when
 *   - it has been silent for TDIST_HEARTBEAT_TIMEOUT_MS (the server's
 *     environment; default 5000, 0 disables the detector), or
 *   - the connection its heartbeats came on closed without a "bye" (a killed
 *     process: detected at once).
 * A death is recorded as "tdist/dead/<rank>" = reason (the dead set that
 * tdist_group_shrink agrees on) and published like an abort record
 * (core/monitor.h): "tdist/aborts/
 * <n>" = "dead <rank> <reason>", n from "tdist/aborts/count", written
 * through the key-value engine so that every monitor waiting on that key is
 * woken by the write. Each rank is declared dead at most once.
 *
 * Thread: the server's loop thread only.
 */
#ifndef TDIST_STORE_LIVENESS_H
#define TDIST_STORE_LIVENESS_H

#include <uv.h>

#include "store/kv.h"

typedef struct tdist__live tdist__live_t;

/* NULL (and 0) when the detector is disabled; -1 on allocation failure. */
int tdist__live_start(uv_loop_t *loop, tdist__kv_t *kv, tdist__live_t **out);
/* A write of entry e happened on connection `conn` (NULL: internal write). */
void tdist__live_on_write(tdist__live_t *l, const tdist__kv_entry_t *e, const void *conn);
/* Connection `conn` closed (the server is not stopping). */
void tdist__live_on_close(tdist__live_t *l, const void *conn);
/* Stop the timer and free (from the server's stop path, on its loop). */
void tdist__live_stop(tdist__live_t *l);

#endif
