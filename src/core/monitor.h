/*
 * monitor.h - cross-rank abort records (internal).
 *
 * When a group aborts on one rank (an op timed out, tdist_group_abort, a
 * backend failure), the other ranks should not sit in their copy of the
 * collective until their own timeout. The monitor is a per-process thread
 * with its own store connection that
 *   - publishes this process's aborts as records "tdist/aborts/<n>" =
 *     "<group uid hex> <world rank> <status> <reason>" (n from an atomic
 *     counter), and
 *   - blocks on the next record key, so a record written by any rank wakes
 *     it at once; for a record naming a group this process is in, it aborts
 *     the local copy with the same status (ABORTED after a timeout or an
 *     abort on demand, MISMATCH...), the message naming the rank and reason.
 * It is started by the first world group that has a store and stopped with
 * the last one. Publishing waits for the monitor's current store wait to end
 * (at most TDIST_MONITOR_INTERVAL_MS, default 200 ms).
 *
 * Liveness: it also writes a heartbeat "tdist/hb/<world rank>" every
 * TDIST_HEARTBEAT_INTERVAL_MS (default 1000) whose value lists each group's
 * next sequence number, and "bye" when the process leaves cleanly. The store
 * server declares a silent rank dead (store/liveness.h) with a record
 * "dead <rank> <reason>"; every group containing that rank then fails with
 * TDIST_ERR_REMOTE_FAILED naming it.
 *
 * Threads: publish from any thread (it never blocks; the progress thread
 * calls it); acquire/release from the caller's thread.
 */
#ifndef TDIST_CORE_MONITOR_H
#define TDIST_CORE_MONITOR_H

#include <stdint.h>

#include "tdist/tdist.h"

struct tdist_progress;

/* Start (or share) the monitor; every group with a store holds a reference.
 * `world_rank` is this process's rank. A store-less process has no monitor. */
int tdist__monitor_acquire(tdist_store_t *store, int world_rank, struct tdist_progress *p);
/* Drop a reference; returns 1 if it was the last (the monitor stopped). */
int tdist__monitor_release(void);

/*
 * Ask the monitor to find which ranks of group `uid` never submitted op `seq`
 * (from their heartbeats: "tdist/hb/<rank>" = "<uid>:<next_seq> ..."), then
 * time the op out on the progress thread with that finding
 * (tdist__group_timeout). Returns 1 if queued, 0 without a monitor. Never
 * blocks; any thread.
 */
int tdist__monitor_diagnose(uint64_t uid, uint64_t seq);

/* Queue an abort record for group `uid` with the abort's status (no-op
 * without a monitor). */
void tdist__monitor_publish(uint64_t uid, int status, const char *reason);

#endif
