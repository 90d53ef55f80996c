/*
 * nccl_progress.c - completion, errors and abort of the NCCL backend
 * (progress thread), the worker job that aborts a communicator (worker
 * thread), and the stream-ordered wait (caller thread).
 *
 * post (progress thread): the op was launched by submit on the caller's
 * thread; post only marks it posted, so poll never completes an op before
 * the core has posted it.
 *
 * poll (progress thread), while the group has ops in flight:
 *   1. ncclCommGetAsyncError once for the communicator. An error fails the
 *      group (tdist__bk_fail with TDIST_ERR_NCCL_ERROR and NCCL's own text);
 *      the core then calls abort, which forgets every launched op, and fails
 *      them itself.
 *   2. cudaEventQuery on the end event of the op at the head of our FIFO
 *      (`inflight`, launch order); while it is done (and posted), unlink it,
 *      return its event to the pool and complete it. The first one not
 *      ready stops the scan: all ops of a group share one stream, so later
 *      events cannot be done before it in stream order.
 *   Completions and failures are reported with mu released (the core's
 *   services only queue, but keep no lock order with them).
 *   poll only trylocks mu: a caller thread that holds it (a long enqueue, a
 *   split) makes this tick skip the group rather than stall the thread.
 *
 * abort (progress thread): marks the state dead and forgets the launched
 * ops under mu; after a peer failure it revokes the communicator (on our
 * non-blocking communicators ncclCommRevoke returns at once; quiescence is
 * polled later by shrink), otherwise it takes the communicator out of the
 * state and hands ncclCommAbort, which blocks until NCCL's threads and
 * kernels stop, to the worker thread (abort_job). destroy waits for the job.
 */
#include <stdio.h>

#include "nccl/nccl_backend.h"
#include "util/worker.h"

/* At most this many completions per poll (bounded stack array). */
#define BATCH 64

int tdist__nccl_post(void *state, tdist__bk_op_t *op) {
  /* Already launched by submit on the caller's thread; poll completes it.
   * Progress thread, like poll: no lock needed for `posted`. */
  tdist__nccl_op(op)->posted = 1;
  return 0;
}

int tdist__nccl_poll(void *state) {
  tdist__nccl_t *nc = state;
  tdist__bk_op_t *done[BATCH];
  int n = 0;
  ncclResult_t st = ncclSuccess;
  cudaError_t qerr = cudaSuccess;
  char msg[200];

  if (pthread_mutex_trylock(&nc->mu) != 0) return 0;
  if (nc->dead || !nc->comm) {
    pthread_mutex_unlock(&nc->mu);
    return 0;
  }
  ncclResult_t r = ncclCommGetAsyncError(nc->comm, &st);
  if (r != ncclSuccess) st = r;
  if (st != ncclSuccess && st != ncclInProgress) {
    const char *last = ncclGetLastError(nc->comm);
    snprintf(msg, sizeof(msg), "%s%s%s", ncclGetErrorString(st), last && *last ? ": " : "",
             last ? last : "");
    pthread_mutex_unlock(&nc->mu);
    tdist__bk_fail(nc->group, TDIST_ERR_NCCL_ERROR, "NCCL asynchronous error: %s", msg);
    return 0;
  }
  tdist__list_t *l;
  while (n < BATCH && (l = tdist__list_first(&nc->inflight)) != NULL) {
    tdist__bk_op_t *op = tdist__list_entry(l, tdist__bk_op_t, link);
    tdist__nccl_op_t *no = tdist__nccl_op(op);
    if (!no->posted) break; /* launched before an op the core posted first */
    cudaError_t q = cudaEventQuery(no->end);
    if (q == cudaErrorNotReady) break;
    if (q != cudaSuccess) {
      qerr = q;
      break;
    }
    /* Unlinked and its event recycled together: wait_stream (under mu) then
     * sees it complete and never waits on a reused event. */
    tdist__list_remove(&op->link);
    tdist__nccl_event_put(nc, no->end);
    no->end = NULL;
    no->completed = 1;
    done[n++] = op;
  }
  pthread_mutex_unlock(&nc->mu);

  for (int i = 0; i < n; i++)
    tdist__bk_complete(done[i], 0, "completed");
  if (qerr != cudaSuccess)
    tdist__bk_fail(nc->group, TDIST_ERR_CUDA_ERROR, "CUDA error on the group's stream: %s (%s)",
                   cudaGetErrorString(qerr), cudaGetErrorName(qerr));
  return n;
}

/* Worker thread: abort the communicator abort took out of the state. nc
 * stays allocated until `jobs` is 0 (destroy waits for it). */
static void abort_job(void *arg) {
  tdist__nccl_t *nc = arg;
  pthread_mutex_lock(&nc->mu);
  ncclComm_t comm = nc->doomed;
  nc->doomed = NULL;
  pthread_mutex_unlock(&nc->mu);
  if (comm) {
    /* No one else can reach comm any more: nothing to serialise with. */
    cudaSetDevice(nc->device);
    /* Frees the communicator and stops its kernels. The launched ops'
     * events may never complete: they are not queried again, and stay out
     * of the free list until destroy releases every event. */
    ncclResult_t r = ncclCommAbort(comm);
    if (r != ncclSuccess && r != ncclInProgress)
      TDIST_WARN(NCCL, "group '%s': ncclCommAbort: %s", nc->name, ncclGetErrorString(r));
  }
  pthread_mutex_lock(&nc->mu);
  if (--nc->jobs == 0) pthread_cond_broadcast(&nc->idle);
  pthread_mutex_unlock(&nc->mu);
}

void tdist__nccl_abort(void *state, int status, const char *reason, int local) {
  tdist__nccl_t *nc = state;
  int job = 0;
  if (!nc) return;
  /* Caller-side holders of mu give up within one poll turn: the group reads
   * as aborted (tdist__bk_aborted) before the core calls us. */
  pthread_mutex_lock(&nc->mu);
  if (!nc->dead) {
    nc->dead = 1;
    /* Forget every launched op: the core finishes them after we return. */
    tdist__list_t *l;
    while ((l = tdist__list_first(&nc->inflight)) != NULL)
      tdist__list_remove(l);
    if (nc->comm && status == TDIST_ERR_REMOTE_FAILED && !NC.ncclCommRevoke) {
      /* NCCL before 2.28: no revoke, so nothing left to shrink. */
      TDIST_WARN(NCCL, "group '%s': NCCL %s has no ncclCommRevoke (2.28); aborting", nc->name,
                 NC.version_str);
      job = 1;
    } else if (nc->comm && status == TDIST_ERR_REMOTE_FAILED) {
      /* A peer is gone: stop the in-flight ops but keep the communicator,
       * so the survivors can ncclCommShrink it (tdist_group_shrink). */
      cudaSetDevice(nc->device);
      ncclResult_t r = ncclCommRevoke(nc->comm, NCCL_REVOKE_DEFAULT);
      if (r == ncclSuccess || r == ncclInProgress) {
        nc->revoked = 1;
      } else {
        TDIST_WARN(NCCL, "group '%s': ncclCommRevoke: %s; aborting", nc->name,
                   ncclGetErrorString(r));
        job = 1;
      }
    } else if (nc->comm) {
      job = 1;
    }
    if (job) {
      nc->doomed = nc->comm;
      nc->comm = NULL;
      nc->jobs++;
    }
    TDIST_INFO(NCCL, "group '%s': communicator %s (%s: %s)", nc->name,
               nc->revoked ? "revoked" : "aborted", tdist_err_name(status), reason);
  }
  pthread_mutex_unlock(&nc->mu);
  /* Without mu: if the worker cannot take it, the job runs here and now. */
  if (job) tdist__worker_run(abort_job, nc);
}

int tdist__nccl_wait_stream(void *state, tdist__bk_op_t *op, void *stream) {
  int rc = 0;
  tdist__nccl_t *nc = state;
  tdist__nccl_op_t *no = tdist__nccl_op(op);
  pthread_mutex_lock(&nc->mu);
  /* Under mu the end event of a linked op cannot be recycled: it returns to
   * the pool only when poll unlinks the op. An op off the FIFO is complete
   * (poll) or was forgotten by abort (the core reports its status). */
  if (no->completed) {
    rc = 0;
  } else if (!tdist__list_linked(&op->link)) {
    rc =
        tdist__error(TDIST_ERR_ABORTED, "tdist_work_wait_stream: group '%s' was aborted", nc->name);
  } else {
    CUDACHECKGOTO(cudaSetDevice(nc->device), rc, out);
    CUDACHECKGOTO(cudaStreamWaitEvent((cudaStream_t)stream, no->end, 0), rc, out);
  }
out:
  pthread_mutex_unlock(&nc->mu);
  return rc;
}
