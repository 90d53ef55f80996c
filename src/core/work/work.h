/*
 * work.h - work handles inside the runtime (internal; above the
 * progress layer and util).
 *
 * Ownership: a work is created by the submitting thread with two references,
 * the caller's (dropped by tdist_work_release) and the runtime's (dropped by
 * the progress thread once the work is finished and its callback ran). It
 * returns to the pool when both are gone.
 *
 * Owner: the submitting thread from allocation until it hands the work to
 * the progress thread (tdist__work_start says whether it must: a work that
 * succeeded on its thread never reaches the progress thread at all); the
 * progress thread from then on.
 *
 * State: QUEUED at allocation; RUNNING when the progress thread starts it
 * (tdist__work_running); terminal when its owner publishes it: the
 * submitting thread (tdist__work_start), or the progress thread
 * (tdist__work_publish, which the group layer calls when it finishes a work:
 * a backend's deferred completion, a failure, a timeout, an abort) -- with
 * one exception: a caller thread that waits on or tests a handed-over work
 * whose backend offers vtable->test may see it succeed first, claim it
 * (w->claim, one CAS: exactly one of it and the progress thread decides the
 * outcome) and publish COMPLETED itself (work.c). The progress thread then
 * only finishes it (lists, trace, callback) and keeps the status.
 */
#ifndef TDIST_CORE_WORK_H
#define TDIST_CORE_WORK_H

#include <pthread.h>
#include <stdatomic.h>

#include "tdist/backend.h"
#include "core/progress/progress.h"
#include "tdist/tdist.h"
#include "util/list.h"

struct tdist_group;

#define TDIST__P2P_INLINE 4

struct tdist_work {
  tdist__qnode_t qnode;         /* submission queue link (first member) */
  tdist__qnode_t dnode;         /* deferred completion (progress) */
  tdist__list_t inflight;       /* group's in-flight list (progress) */
  struct tdist_work *pool_next; /* free list (pool mutex) */
  _Atomic int refs;
  _Atomic int state;  /* tdist_work_state_t, release-stored */
  int status;         /* valid once state is terminal */
  int completing;     /* (progress) a completion is queued: status and msg are set */
  int captured;       /* (caller) captured into a CUDA graph (TDIST_BACKEND_CAPTURED):
                         finished at submission, never seen by the progress thread */
  int start_at_stamp; /* (caller) its backend starts ops at submit: its flight-recorder
                         start is its submission's stamp (tdist__work_stamp) */
  /* Caller-observed completion (backend.h, vtable->test; work.c): the
   * backend's test and its state, set at submission (caller), NULL when the
   * backend has none; and who decides the outcome, once: TDIST__CLAIM_*. */
  int (*test)(void *state, tdist_backend_op_t *op, unsigned flags);
  void *test_state;
  int spun; /* (caller) its thread drove it for the whole spin already
               (tdist__work_start): a wait sleeps at once */
  _Atomic int claim;
  struct tdist_group *group;
  tdist_backend_args_t args; /* (caller) the validated op */
  tdist_backend_op_t bop;    /* what the backend sees: bop.args == &args */
  /* (caller, then read-only) Its submission's time and deadline, stamped
   * by tdist__work_stamp after the backend's submit (0 until then); the
   * start too where start_at_stamp. */
  int64_t t_enqueue_ns, t_start_ns, t_end_ns, deadline_ns;
  /* (caller, then read-only) Its place among the group's collectives: a
   * collective's number among them, or, for a send, receive or batch of
   * them, how many this rank had submitted before it (ops.c). seq counts
   * every op, and point-to-point ops only on the ranks that run them, so
   * seqs of different ranks do not line up once some ranks ran p2p ops;
   * the timeout's diagnosis compares this number (monitor.c diagnose). */
  uint64_t coll;
  /* (atomic) When a caller claimed the success (drive, work.c): written
   * before its claim CAS, so whoever sees the claim sees it; the record's
   * end time then (a quiet op's completion may reach the loop later). */
  _Atomic int64_t t_claimed_ns;

  /* Completion: waiters block on cv; cb runs once. Guarded by mu. */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int waiters;
  tdist_work_cb_t cb;
  void *cb_arg;
  int cb_state; /* 0 none, 1 registered, 2 ran */

  tdist_p2p_op_t p2p_inline[TDIST__P2P_INLINE];
  char msg[344];
};
/* A work is a whole number of cache lines, so every work of a slab (work.c)
 * sits the same way across its lines and the hot words of neighbours (a
 * caller filling in one while the progress thread finishes the next) fall
 * as measured. At 1232 bytes (16 more, none of them hot) the runtime's
 * per-op overhead grew by a third (bench/core, pipelined, 1 thread: 435 ->
 * 549 ns; roundtrip 1156 -> 1460); at 1216 it is back (448, 1186). msg
 * takes up the slack. */
_Static_assert(sizeof(struct tdist_work) % 64 == 0, "tdist_work_t: a whole number of cache lines");

/* Who decides a work's outcome (w->claim): nobody yet; a caller thread that
 * saw it succeed (backend test) and published it; the progress thread, which
 * writes the status and message itself. */
enum { TDIST__CLAIM_OPEN = 0, TDIST__CLAIM_CALLER = 1, TDIST__CLAIM_PROGRESS = 2 };

/* The work that holds a backend op. */
static inline tdist_work_t *tdist__work_of(tdist_backend_op_t *op) {
  return tdist__list_entry(op, tdist_work_t, bop);
}

/* Caller thread: a fresh work (refs = 2, state QUEUED) of group g; the
 * caller fills in w->args whole (they are left as the last use had them). */
tdist_work_t *tdist__work_alloc(struct tdist_group *g);
/* Drop one reference; the last returns the work to the pool. Any thread. */
void tdist__work_unref(tdist_work_t *w);
/* Return w to the pool with no atomic operation: the calling thread holds
 * every reference and no other thread has seen w (a synchronous op that
 * finished inline, or one refused before it was handed over); what a
 * locked subtraction cost, about a twentieth of a small op, is saved. */
void tdist__work_release_owned(tdist_work_t *w);

/* Progress thread: QUEUED -> RUNNING. */
void tdist__work_running(tdist_work_t *w);

/*
 * Progress thread: publish the terminal state for w->status (0 ->
 * COMPLETED, TIMEOUT -> TIMED_OUT, ABORTED/REMOTE_FAILED -> ABORTED, others
 * FAILED; w->msg already written, tdist__work_claim called), wake the
 * waiters and run the callback. Of a work a caller claimed, only the
 * callback is left to run.
 * The caller (group layer) drops the runtime's reference afterwards.
 */
void tdist__work_publish(tdist_work_t *w);

/* Progress thread, before it writes a work's status: 1 when the progress
 * thread decides the outcome, 0 when a caller already published success
 * (then the status stands; this returns once that publication is visible).
 * Either way the progress thread still finishes the work (lists, trace,
 * callback, references). */
int tdist__work_claim(tdist_work_t *w);

/* 1 when a caller thread published the work's success (backend test). */
static inline int tdist__work_caller_claimed(const tdist_work_t *w) {
  return atomic_load(&((tdist_work_t *)w)->claim) == TDIST__CLAIM_CALLER;
}

/*
 * tdist__work_start - the submitting thread's part of the caller-driven
 * path (work.c; backend.h, submit), right after the backend's submit: with
 * a backend test, test the op once ("progress once inline"); a synchronous
 * op (sync) its thread then keeps testing (busy for TDIST_DRIVE_BUSY_US,
 * then yielding) until it succeeds, the group aborts (*aborted) or
 * TDIST_DRIVE_SPIN_US ends.
 * Returns 1: it succeeded here (COMPLETED, status 0, claimed by this
 * thread) and the progress thread must never hear of it; 0: not done, and
 * the work is still only this thread's: hand it over (push it).
 * Thread: the submitting caller, before anyone else knows the work.
 */
int tdist__work_start(tdist_work_t *w, int sync, const atomic_int *aborted);

/*
 * tdist__work_stamp - the submission's time (now, a tdist__now_ns reading)
 * and its deadline (now + bop.timeout_ms), if not stamped yet. The
 * submitting thread reads the clock once its first test answered (work.c,
 * test_once): an op that succeeded there is stamped with the reading that
 * also ends it, one clock read where there were two (each 26 ns where the
 * kernel keeps time with kvm-clock, a sixth of an 8-byte broadcast root's
 * op); an op the backend has no test for is stamped before it is handed
 * over (ops.c). The stamp is late by the backend's submit and one test
 * (a microsecond; a NCCL launch), which the deadline allows.
 * Thread: the submitting caller, before anyone else knows the work.
 */
void tdist__work_stamp(tdist_work_t *w, int64_t now);

/* Caller thread: return once no caller thread is inside a backend's test,
 * so a group whose works are all finished may free its backend state. */
void tdist__work_quiesce_tests(void);

/* The terminal state a status leads to. */
int tdist__work_state_for(int status);

static inline int tdist__work_done(const tdist_work_t *w) {
  return atomic_load_explicit(&((tdist_work_t *)w)->state, memory_order_acquire) >=
         TDIST_WORK_COMPLETED;
}

/* Total works ever carved from the heap (benchmark: steady state = flat). */
uint64_t tdist__work_pool_size(void);

#endif
