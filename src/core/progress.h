/*
 * progress.h - the progress thread (internal).
 *
 * One per process, shared by every group, started by the first group and
 * joined when the last is destroyed. It runs a libuv loop that:
 *   - takes submitted works and control tasks from a lock-free queue
 *     (producers wake it with uv_async_send only when it sleeps);
 *   - posts works to their backend, and polls backends that asked for it,
 *     spinning for TDIST_SPIN_US after the last activity, then backing off
 *     to timers (1 ms .. TDIST_POLL_MAX_MS), and sleeping with no timer at
 *     all when nothing is in flight, so an idle process uses no CPU;
 *   - enforces op deadlines every TDIST_WATCHDOG_MS while work is in flight;
 *   - fires completion callbacks (from tdist__work_finish).
 * Backends register sockets and timers on tdist__progress_loop() from the
 * progress thread only.
 */
#ifndef TDIST_CORE_PROGRESS_H
#define TDIST_CORE_PROGRESS_H

#include <uv.h>

#include "core/work.h"

typedef struct tdist_progress tdist_progress_t;

/* Caller thread: take a reference on the process's progress thread,
 * starting it if needed. */
int tdist__progress_acquire(tdist_progress_t **out);
/* Caller thread: a reference on the running progress thread, if any;
 * TDIST_ERR_INVALID_STATE when none runs (nothing is started). */
int tdist__progress_acquire_existing(tdist_progress_t **out);
/* Caller thread (never the progress thread): drop it; the last reference
 * stops the loop and joins the thread. */
void tdist__progress_release(tdist_progress_t *p);

/* Any thread: hand a work (or a task's node) to the progress thread. */
void tdist__progress_push(tdist_progress_t *p, tdist__qnode_t *node);

/*
 * Any thread: run fn(arg) on the progress thread and wait for it to return.
 * Called on the progress thread itself, runs fn inline. Used by backends to
 * touch the loop from init/split/destroy, and by the core for group
 * (un)registration and on-demand abort.
 */
void tdist__progress_call(tdist_progress_t *p, void (*fn)(void *arg), void *arg);

/* Progress thread: the loop. */
uv_loop_t *tdist__progress_loop(tdist_progress_t *p);
/* 1 if the calling thread is the progress thread. */
int tdist__progress_is_current(const tdist_progress_t *p);
/* Progress thread: note activity so the poller keeps spinning. */
void tdist__progress_kick(tdist_progress_t *p);

/* Queue-node run function of a submitted work (ops.c sets it). */
void tdist__progress_start_work(tdist__qnode_t *node);

/* Progress thread: group registry (called through tdist__progress_call). */
void tdist__progress_add_group(tdist_progress_t *p, tdist_group_t *g);
void tdist__progress_remove_group(tdist_progress_t *p, tdist_group_t *g);
/* Progress thread: the first registered group (follow g->pnext). */
tdist_group_t *tdist__progress_groups(tdist_progress_t *p);

#endif
