/*
 * nccl_progress.c - completion, errors and abort of the NCCL backend (progress
 * thread), and the stream-ordered wait (caller thread).
 *
 * poll, once per progress tick for a group with work in flight:
 *   1. ncclCommGetAsyncError once for the communicator. An error fails the
 *      group (tdist__group_fail with TDIST_ERR_NCCL_ERROR and NCCL's own
 *      text), which aborts the communicator and fails every pending op.
 *   2. cudaEventQuery on the end event of the oldest in-flight work; while
 *      it is done, finish it and look at the next. The first one not ready
 *      stops the scan: all ops of a group share one stream, so later events
 *      cannot be done before it in stream order.
 * Completions are finished with the mutex released (a completion callback
 * may submit a new op, which takes it), and their events return to the pool
 * afterwards, under the mutex again (see nccl_backend.h for why).
 *
 * poll only trylocks: a caller thread that holds the mutex (a long enqueue,
 * a split) makes this tick skip the group rather than stall the thread.
 */
#include <stdio.h>

#include "nccl/nccl_backend.h"

/* At most this many completions per tick and group (bounded stack arrays). */
#define BATCH 32

int tdist__nccl_post(tdist_group_t *g, tdist_work_t *w) {
  /* Already launched by submit on the caller's thread; poll completes it. */
  return 0;
}

int tdist__nccl_poll(tdist_group_t *g) {
  tdist__nccl_t *nc = g->bstate;
  tdist_work_t *done[BATCH];
  cudaEvent_t evs[BATCH];
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
    tdist__group_fail(g, TDIST_ERR_NCCL_ERROR, "NCCL asynchronous error: %s", msg);
    return 0;
  }
  for (tdist_work_t *w = g->inflight_head; w && n < BATCH; w = w->next) {
    cudaEvent_t ev = tdist__nccl_op(w)->end;
    cudaError_t q = cudaEventQuery(ev);
    if (q == cudaErrorNotReady) break;
    if (q != cudaSuccess) {
      qerr = q;
      break;
    }
    done[n] = w;
    evs[n] = ev;
    n++;
  }
  pthread_mutex_unlock(&nc->mu);

  for (int i = 0; i < n; i++)
    tdist__work_finish(done[i], 0, "ok");
  if (n > 0) {
    pthread_mutex_lock(&nc->mu); /* brief: only submit and wait_stream hold it long */
    for (int i = 0; i < n; i++)
      tdist__nccl_event_put(nc, evs[i]);
    pthread_mutex_unlock(&nc->mu);
  }
  if (qerr != cudaSuccess)
    tdist__group_fail(g, TDIST_ERR_CUDA_ERROR, "CUDA error on the group's stream: %s (%s)",
                      cudaGetErrorString(qerr), cudaGetErrorName(qerr));
  return n;
}

void tdist__nccl_abort(tdist_group_t *g, int status, const char *reason) {
  tdist__nccl_t *nc = g->bstate;
  if (!nc) return;
  /* Caller-side holders of mu give up within one poll turn once g->aborted
   * is set (it is, before the core calls us). */
  pthread_mutex_lock(&nc->mu);
  if (!nc->dead) {
    nc->dead = 1;
    if (nc->comm && status == TDIST_ERR_REMOTE_FAILED) {
      /* A peer is gone: stop the in-flight ops but keep the communicator,
       * so the survivors can ncclCommShrink it (tdist_group_shrink). */
      cudaSetDevice(nc->device);
      ncclResult_t r = ncclCommRevoke(nc->comm, 0);
      if (r == ncclSuccess || r == ncclInProgress) {
        nc->revoked = 1;
      } else {
        TDIST_WARN(NCCL, "group '%s': ncclCommRevoke: %s; aborting", g->name,
                   ncclGetErrorString(r));
        ncclCommAbort(nc->comm);
        nc->comm = NULL;
      }
    } else if (nc->comm) {
      cudaSetDevice(nc->device);
      /* Frees the communicator and stops its kernels. Its in-flight works'
       * events may never complete: they are not queried again, and stay
       * out of the free list until destroy releases every event. */
      ncclResult_t r = ncclCommAbort(nc->comm);
      if (r != ncclSuccess && r != ncclInProgress)
        TDIST_WARN(NCCL, "group '%s': ncclCommAbort: %s", g->name, ncclGetErrorString(r));
      nc->comm = NULL;
    }
    TDIST_INFO(NCCL, "group '%s': communicator aborted (%s: %s)", g->name, tdist_err_name(status),
               reason);
  }
  pthread_mutex_unlock(&nc->mu);
}

int tdist__nccl_wait_stream(tdist_group_t *g, tdist_work_t *w, void *stream) {
  int rc = 0;
  tdist__nccl_t *nc = g->bstate;
  pthread_mutex_lock(&nc->mu);
  /* Under mu the end event cannot be recycled: it returns to the pool only
   * after the work is finished, and a finished work needs no waiting. */
  if (tdist__work_done(w)) {
    rc = w->status;
  } else if (nc->dead) {
    rc = tdist__error(TDIST_ERR_ABORTED, "tdist_work_wait_stream: group '%s' was aborted", g->name);
  } else {
    CUDACHECKGOTO(cudaSetDevice(nc->device), rc, out);
    CUDACHECKGOTO(cudaStreamWaitEvent((cudaStream_t)stream, tdist__nccl_op(w)->end, 0), rc, out);
  }
out:
  pthread_mutex_unlock(&nc->mu);
  return rc;
}
