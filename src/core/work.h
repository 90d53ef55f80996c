/*
 * work.h - work handles inside the runtime (internal).
 *
 * Ownership: a work is created by the submitting thread with two references,
 * the caller's (dropped by tdist_work_release) and the runtime's (dropped by
 * the progress thread after the completion callback ran). It returns to the
 * pool when both are gone. Only the progress thread changes its state, always
 * through tdist__work_finish; other threads only read it.
 */
#ifndef TDIST_CORE_WORK_H
#define TDIST_CORE_WORK_H

#include <pthread.h>
#include <stdatomic.h>

#include "tdist/tdist.h"

/* A node of the caller -> progress thread queue (works and control tasks). */
typedef struct tdist__qnode {
  struct tdist__qnode *next;
  void (*run)(struct tdist__qnode *node); /* called on the progress thread */
} tdist__qnode_t;

#define TDIST__P2P_INLINE 4
#define TDIST__WORK_BK_INLINE 256

/* The op as the caller described it, after validation. The meaning of count
 * is the public one (per rank block for all_gather, scatter, ...). */
typedef struct tdist__op_args {
  tdist_optype_t type;
  const void *sendbuf;
  void *recvbuf; /* == sendbuf-equivalent for in-place ops; broadcast: buf */
  size_t count;
  tdist_dtype_t dtype;
  tdist_redop_t redop;
  double scalar; /* PREMUL_SUM factor */
  int root;      /* root (rooted collectives) or peer (send/recv), group rank */
  int tag;
  void *stream;        /* caller's CUDA stream, or NULL */
  tdist_p2p_op_t *p2p; /* batch ops (points at p2p_inline or an allocation) */
  int np2p;
} tdist__op_args_t;

struct tdist_work {
  tdist__qnode_t qnode;           /* submission queue link */
  struct tdist_work *prev, *next; /* group's in-flight list (progress thread) */
  struct tdist_work *pool_next;   /* free list */
  _Atomic int refs;
  _Atomic int state; /* tdist_work_state_t, release-stored */
  int status;        /* valid once state is terminal */
  tdist_group_t *group;
  uint64_t seq;
  tdist__op_args_t args;
  int64_t timeout_ms;
  int64_t t_enqueue_ns, t_start_ns, t_end_ns, deadline_ns;

  /* Completion: waiters block on cv; cb runs once. Guarded by mu. */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int waiters;
  tdist_work_cb_t cb;
  void *cb_arg;
  int cb_state; /* 0 none, 1 registered, 2 ran */

  /* Backend-private per-op state: bk is the backend's to use; bk_inline is
   * scratch it may use without allocating. Both are left as they were by the
   * previous use of the handle: the backend initialises what it reads. */
  void *bk;
  _Alignas(16) unsigned char bk_inline[TDIST__WORK_BK_INLINE];

  tdist_p2p_op_t p2p_inline[TDIST__P2P_INLINE];
  char msg[320];
};

/* Caller thread: a fresh work (refs = 2, state QUEUED) for group g; the
 * caller fills in w->args whole (they are left as the last use had them). */
tdist_work_t *tdist__work_alloc(tdist_group_t *g);
/* Drop one reference; the last returns the work to the pool. Any thread. */
void tdist__work_unref(tdist_work_t *w);

/*
 * Progress thread only: move w to its terminal state. status 0 -> COMPLETED,
 * TDIST_ERR_TIMEOUT -> TIMED_OUT, ABORTED/REMOTE_FAILED -> ABORTED, other
 * negatives -> FAILED. For failures the message is "<op> seq <n> of group
 * '<name>' (rank r/size): <fmt...>". Removes w from its group's in-flight
 * list, wakes waiters, runs the callback and drops the runtime's reference:
 * w must not be used by the caller of this function afterwards.
 * Calling it twice for one work is a bug (asserted).
 */
void tdist__work_finish(tdist_work_t *w, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static inline int tdist__work_done(const tdist_work_t *w) {
  return atomic_load_explicit(&((tdist_work_t *)w)->state, memory_order_acquire) >=
         TDIST_WORK_COMPLETED;
}

/* Size in bytes of `count` elements of the work's dtype. */
static inline size_t tdist__work_bytes(const tdist_work_t *w, size_t count) {
  return count * tdist_dtype_size(w->args.dtype);
}

/* Total works ever carved from the heap (benchmark: steady state = flat). */
uint64_t tdist__work_pool_size(void);

#endif
