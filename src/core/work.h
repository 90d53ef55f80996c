/*
 * work.h - work handles inside the runtime (internal; layer 3, above the
 * progress layer and util).
 *
 * Ownership: a work is created by the submitting thread with two references,
 * the caller's (dropped by tdist_work_release) and the runtime's (dropped by
 * the progress thread once the work is finished and its callback ran). It
 * returns to the pool when both are gone.
 *
 * State: QUEUED at allocation; RUNNING when the progress thread starts it
 * (tdist__work_running); terminal when the progress thread publishes it
 * (tdist__work_publish), which the group layer calls when it finishes a work
 * (a backend's deferred completion, a failure, a timeout, an abort). Only the
 * progress thread changes the state; other threads read it (acquire).
 */
#ifndef TDIST_CORE_WORK_H
#define TDIST_CORE_WORK_H

#include <pthread.h>
#include <stdatomic.h>

#include "core/backend.h"
#include "core/progress.h"
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
  _Atomic int state; /* tdist_work_state_t, release-stored */
  int status;        /* valid once state is terminal */
  int completing;    /* (progress) a completion is queued: status and msg are set */
  struct tdist_group *group;
  tdist__op_args_t args; /* (caller) the validated op */
  tdist__bk_op_t bop;    /* what the backend sees: bop.args == &args */
  int64_t t_enqueue_ns, t_start_ns, t_end_ns, deadline_ns;

  /* Completion: waiters block on cv; cb runs once. Guarded by mu. */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int waiters;
  tdist_work_cb_t cb;
  void *cb_arg;
  int cb_state; /* 0 none, 1 registered, 2 ran */

  tdist_p2p_op_t p2p_inline[TDIST__P2P_INLINE];
  char msg[320];
};

/* The work that holds a backend op. */
static inline tdist_work_t *tdist__work_of(tdist__bk_op_t *op) {
  return tdist__list_entry(op, tdist_work_t, bop);
}

/* Caller thread: a fresh work (refs = 2, state QUEUED) of group g; the
 * caller fills in w->args whole (they are left as the last use had them). */
tdist_work_t *tdist__work_alloc(struct tdist_group *g);
/* Drop one reference; the last returns the work to the pool. Any thread. */
void tdist__work_unref(tdist_work_t *w);

/* Progress thread: QUEUED -> RUNNING. */
void tdist__work_running(tdist_work_t *w);

/*
 * Progress thread: publish the terminal state for w->status (0 ->
 * COMPLETED, TIMEOUT -> TIMED_OUT, ABORTED/REMOTE_FAILED -> ABORTED, others
 * FAILED; w->msg already written), wake the waiters and run the callback.
 * The caller (group layer) drops the runtime's reference afterwards.
 */
void tdist__work_publish(tdist_work_t *w);

/* The terminal state a status leads to. */
int tdist__work_state_for(int status);

static inline int tdist__work_done(const tdist_work_t *w) {
  return atomic_load_explicit(&((tdist_work_t *)w)->state, memory_order_acquire) >=
         TDIST_WORK_COMPLETED;
}

/* Total works ever carved from the heap (benchmark: steady state = flat). */
uint64_t tdist__work_pool_size(void);

#endif
