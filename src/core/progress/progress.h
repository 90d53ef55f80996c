/*
 * progress.h - the progress thread (internal; above util only).
 *
 * One per process, shared by every group, started with the first reference
 * and joined with the last. It runs a libuv loop and knows nothing of
 * groups or works: it offers
 *   - a lock-free submission queue (tdist__progress_push): nodes whose run
 *     function is called on the progress thread, oldest first; producers
 *     wake the loop with uv_async_send only when it sleeps;
 *   - synchronous calls (tdist__progress_call): run a function there and wait;
 *   - a deferred queue (tdist__progress_defer): nodes queued on the progress
 *     thread, run after the current I/O step (libuv's check phase), never
 *     inside the call chain that queued them. Completions travel this way;
 *   - pollers that others register (tdist__progress_poller_add), called while
 *     they report work in flight: spinning for TDIST_SPIN_US after the last
 *     activity (TDIST_POLL_SPIN_US while a poller is busy), then backing off
 *     to timers (1 ms .. TDIST_POLL_MAX_MS) for busy pollers, and sleeping
 *     with no timer at all otherwise, so an idle process uses no CPU;
 *   - tickers (tdist__progress_ticker_add): a periodic check, every
 *     TDIST_WATCHDOG_MS while armed and busy (op deadlines);
 *   - the loop itself (tdist__progress_loop), for sockets and timers that
 *     code running on the progress thread registers.
 */
#ifndef TDIST_CORE_PROGRESS_H
#define TDIST_CORE_PROGRESS_H

#include <stdint.h>
#include <uv.h>

#include "util/list.h"

typedef struct tdist_progress tdist_progress_t;

/* A node of the submission or deferred queue. */
typedef struct tdist__qnode {
  struct tdist__qnode *next;
  void (*run)(struct tdist__qnode *node); /* called on the progress thread */
} tdist__qnode_t;

/* A registered poller. fn runs on the progress thread; it returns the number
 * of things it finished (0 lets the loop back off) and sets *busy when it
 * still has work in flight (so it wants to be called again):
 * TDIST__POLL_BUSY, or TDIST__POLL_BUSY_WOKEN when whatever completes that
 * work also calls tdist__progress_wake_any (then the loop does not spin for
 * it, only polls on its back-off timers, for errors). */
enum { TDIST__POLL_IDLE = 0, TDIST__POLL_BUSY = 1, TDIST__POLL_BUSY_WOKEN = 2 };
typedef struct tdist__poller {
  tdist__list_t link; /* (progress) */
  int (*fn)(struct tdist__poller *self, int *busy);
} tdist__poller_t;

/* A registered ticker: fn runs on the progress thread every
 * TDIST_WATCHDOG_MS once armed, until every ticker returns 0 (not busy). */
typedef struct tdist__ticker {
  tdist__list_t link; /* (progress) */
  int (*fn)(struct tdist__ticker *self);
} tdist__ticker_t;

/* Caller thread: take a reference on the process's progress thread,
 * starting it if needed. */
int tdist__progress_acquire(tdist_progress_t **out);
/* Caller thread: a reference on the running progress thread, if any;
 * TDIST_ERR_INVALID_STATE when none runs (nothing is started). */
int tdist__progress_acquire_existing(tdist_progress_t **out);
/* Caller thread (never the progress thread): drop it; the last reference
 * stops the loop and joins the thread. */
void tdist__progress_release(tdist_progress_t *p);

/* Any thread: hand a node to the progress thread. */
void tdist__progress_push(tdist_progress_t *p, tdist__qnode_t *node);
/* Any thread: run fn(arg) on the progress thread and wait for it to return.
 * On the progress thread itself, runs fn inline. */
void tdist__progress_call(tdist_progress_t *p, void (*fn)(void *arg), void *arg);

/* Progress thread: run node->run(node) after the current I/O step. */
void tdist__progress_defer(tdist_progress_t *p, tdist__qnode_t *node);

/* Progress thread: take a node off the deferred queue (its owner goes away
 * before it ran; O(queue length)). */
void tdist__progress_undefer(tdist_progress_t *p, tdist__qnode_t *node);

/* Progress thread: (un)register a poller. */
void tdist__progress_poller_add(tdist_progress_t *p, tdist__poller_t *poller);
void tdist__progress_poller_remove(tdist_progress_t *p, tdist__poller_t *poller);

/* Progress thread: (un)register a ticker; arm the ticks (no-op if running). */
void tdist__progress_ticker_add(tdist_progress_t *p, tdist__ticker_t *t);
void tdist__progress_ticker_remove(tdist_progress_t *p, tdist__ticker_t *t);
void tdist__progress_ticker_arm(tdist_progress_t *p);

/* Progress thread: the loop (sockets, timers). */
uv_loop_t *tdist__progress_loop(tdist_progress_t *p);
/* Progress thread: note activity so the pollers keep spinning. */
void tdist__progress_kick(tdist_progress_t *p);
/* Any thread, a CUDA host function included (it takes a mutex, calls no
 * CUDA): make the process's progress thread poll now, and wake the callers
 * sleeping in tdist__wakeup_sleep. */
void tdist__progress_wake_any(void);

/* The wake-up of caller threads that drive their own completion (wakeup.c):
 * prepare counts the caller as a sleeper and returns the generation; the
 * caller then tests its condition once more and either cancels (it holds) or
 * sleeps until the generation moves or the absolute CLOCK_MONOTONIC deadline
 * (ns) passes (spurious returns are allowed: test again). wakeup_all, after
 * making a condition true, wakes every sleeper (one fence and one load when
 * none sleeps). Any thread, CUDA host functions included. */
uint32_t tdist__wakeup_prepare(void);
void tdist__wakeup_cancel(void);
void tdist__wakeup_sleep(uint32_t seen, int64_t deadline_ns);
void tdist__wakeup_all(void);

/* Any thread: 1 if the calling thread is a progress thread. */
int tdist__progress_on_thread(void);

#endif
