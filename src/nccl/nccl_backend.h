/*
 * nccl_backend.h - the NCCL backend's private state (internal to src/nccl/).
 *
 * One tdist__nccl_t per group (g->bstate). It owns the group's communicator,
 * an internal CUDA stream on which every NCCL call of the group is enqueued,
 * and a pool of end events.
 *
 * Who touches what:
 *   - mu serialises every NCCL call on `comm` (NCCL is not thread-safe per
 *     communicator) and every change to the event pool: submit and
 *     wait_stream on caller threads, poll and abort on the progress thread,
 *     destroy on the caller. poll only ever trylocks it, so the progress
 *     thread never waits behind a caller that holds it.
 *   - Caller-side loops that wait for ncclInProgress while holding mu check
 *     g->aborted on every turn, so abort's lock waits at most one turn.
 *   - `dead` is set (under mu) by abort: no new op may be enqueued, and the
 *     in-flight events may never complete. After a peer failure the
 *     communicator is revoked (ncclCommRevoke) rather than aborted and kept
 *     in `comm` (`revoked`): tdist_group_shrink needs it for ncclCommShrink;
 *     destroy aborts it. After any other failure it was ncclCommAbort'ed and
 *     `comm` is NULL.
 *
 * Per-op state lives in w->bk_inline (tdist__nccl_op_t): the end event that
 * the progress thread queries and that tdist_work_wait_stream makes a stream
 * wait on. The event goes back to the pool (under mu) only after the work is
 * finished, so a wait_stream that saw the work unfinished (under mu) always
 * waited on this op's own record.
 *
 * CUDA and NCCL types stay in this header and out of the public ones.
 */
#ifndef TDIST_NCCL_BACKEND_H
#define TDIST_NCCL_BACKEND_H

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <pthread.h>
#include <stdatomic.h>

#include "core/backend.h"
#include "core/error.h"
#include "core/group.h"

typedef struct tdist__nccl {
  pthread_mutex_t mu;
  ncclComm_t comm; /* NULL once destroyed or aborted */
  int dead;        /* aborted: no new ops (under mu) */
  int revoked;     /* dead, but comm kept for shrink (peer failure) */
  int device;
  cudaStream_t stream;  /* internal, non-blocking; every NCCL call goes here */
  cudaEvent_t start_ev; /* recorded on the caller's stream, waited by `stream` */
  void *scratch;        /* one float of device memory for barrier */

  /* Event pool (under mu): `all` holds every event created (destroyed at
   * destroy), `free` the ones not attached to a live work. Grows only when
   * empty, so steady state allocates nothing. */
  cudaEvent_t *all, *free;
  int nall, nfree, cap;
} tdist__nccl_t;

/* What an op keeps in w->bk_inline. */
typedef struct tdist__nccl_op {
  cudaEvent_t end;
} tdist__nccl_op_t;

_Static_assert(sizeof(tdist__nccl_op_t) <= TDIST__WORK_BK_INLINE, "bk_inline too small");

static inline tdist__nccl_op_t *tdist__nccl_op(tdist_work_t *w) {
  return (tdist__nccl_op_t *)(void *)w->bk_inline;
}

/* Error conversion at the boundary: the tdist code, with the library's own
 * text (and, for NCCL, ncclGetLastError of the communicator) recorded with
 * tdist__error for tdist_last_error(). `what` names the call. */
int tdist__nccl_err(ncclComm_t comm, ncclResult_t r, const char *what);
int tdist__cuda_err(cudaError_t e, const char *what);

#define NCCLCHECKGOTO(call, comm, rc, label)         \
  do {                                               \
    ncclResult_t r_ = (call);                        \
    if (r_ != ncclSuccess && r_ != ncclInProgress) { \
      (rc) = tdist__nccl_err((comm), r_, #call);     \
      goto label;                                    \
    }                                                \
  } while (0)

#define CUDACHECKGOTO(call, rc, label)   \
  do {                                   \
    cudaError_t e_ = (call);             \
    if (e_ != cudaSuccess) {             \
      (rc) = tdist__cuda_err(e_, #call); \
      goto label;                        \
    }                                    \
  } while (0)

/*
 * Caller thread, mu held (or comm private to the caller): poll
 * ncclCommGetAsyncError(comm) until it leaves ncclInProgress, for at most
 * timeout_ms. Gives up early when `g` (may be NULL) gets aborted.
 * Returns 0, TDIST_ERR_NCCL_ERROR (the async error), TDIST_ERR_TIMEOUT or
 * TDIST_ERR_ABORTED; the message is recorded and names `what` and the group.
 */
int tdist__nccl_wait_ready(ncclComm_t comm, tdist_group_t *g, const char *what, int64_t timeout_ms);

/* A non-blocking config named after the group. */
void tdist__nccl_config(ncclConfig_t *cfg, const tdist_group_t *g);

/* Mappings (return -1 for values NCCL lacks). */
int tdist__nccl_dtype(tdist_dtype_t dt, ncclDataType_t *out);
int tdist__nccl_redop(tdist_redop_t op, ncclRedOp_t *out);

/* Event pool, mu held. get may create an event (caller thread only). */
int tdist__nccl_event_get(tdist__nccl_t *nc, cudaEvent_t *ev);
void tdist__nccl_event_put(tdist__nccl_t *nc, cudaEvent_t ev);

/* Vtable entries, one file each side (nccl_comm.c, nccl_ops.c, nccl_progress.c). */
int tdist__nccl_init(tdist_group_t *g, const void *arg);
int tdist__nccl_split(tdist_group_t *parent, int color, tdist_group_t *child);
int tdist__nccl_shrink(tdist_group_t *parent, const int *exclude, int nexclude,
                       tdist_group_t *child);
int tdist__nccl_destroy(tdist_group_t *g);
int tdist__nccl_submit(tdist_group_t *g, tdist_work_t *w);
int tdist__nccl_post(tdist_group_t *g, tdist_work_t *w);
int tdist__nccl_poll(tdist_group_t *g);
void tdist__nccl_abort(tdist_group_t *g, int status, const char *reason);
int tdist__nccl_wait_stream(tdist_group_t *g, tdist_work_t *w, void *stream);

#endif
