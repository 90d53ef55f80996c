/*
 * nccl_progress.c - completion, errors and abort of the NCCL backend
 * (progress thread), the worker job that aborts a communicator (worker
 * thread), and the stream-ordered wait (caller thread).
 *
 * post (progress thread): the op was launched by submit on the caller's
 * thread; post only marks it posted, so poll never completes an op before
 * the core has posted it.
 *
 * poll (progress thread), while the group has ops in flight, with the
 * group's device current and the capture mode relaxed (nccl_device.c):
 *   1. ncclCommGetAsyncError once for the communicator. ncclRemoteError (a
 *      peer gone) is a peer failure: TDIST_ERR_REMOTE_FAILED, reported only
 *      if the monitor has not named the dead rank within the grace period.
 *      Any other error fails the group (tdist_backend_fail with
 *      TDIST_ERR_NCCL_ERROR and NCCL's own text); the core then calls
 *      abort, which forgets every launched op, and fails them itself.
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
 * test (any caller thread): poll's verdict on one op, success only, for a
 * caller that waits on it (backend.h, vtable->test).
 *
 * abort (progress thread): marks the state dead and forgets the launched
 * ops under mu; after a peer failure the communicator is revoked and kept
 * (quiescence is polled later by shrink), otherwise it is taken out of the
 * state and aborted. Both calls may block -- ncclCommAbort until NCCL's
 * threads and kernels stop, ncclCommRevoke may join an NCCL job thread --
 * so each runs on an abort thread of its own (abort_main): one stuck abort
 * delays no other group. destroy waits for the thread.
 */
#include <stdarg.h>
#include <stdio.h>

#include "nccl/nccl_backend.h"
#include "util/alloc.h"
#include "util/clock.h"
#include "util/param.h"

/* At most this many completions per poll (bounded stack array). */
#define BATCH 64

int tdist__nccl_post(void *state, tdist_backend_op_t *op) {
  /* Already launched by submit on the caller's thread; poll completes it.
   * Progress thread, like poll: no lock needed for `posted`. */
  tdist__nccl_op(op)->posted = 1;
  return 0;
}

int tdist__nccl_poll(void *state) {
  tdist__nccl_t *nc = state;
  tdist_backend_op_t *done[BATCH];
  int n = 0;
  ncclResult_t st = ncclSuccess;
  cudaError_t qerr = cudaSuccess;
  char msg[200];

  if (pthread_mutex_trylock(&nc->mu) != 0) return 0;
  if (nc->dead || !nc->comm) {
    pthread_mutex_unlock(&nc->mu);
    return 0;
  }
  /* The group's device, never device 0 by default (nccl_device.c). */
  int drc = tdist__nccl_dev_own(nc->device);
  if (drc != 0) {
    pthread_mutex_unlock(&nc->mu);
    tdist_backend_fail(nc->group, drc, "%s", tdist_last_error());
    return 0;
  }
  ncclResult_t r = ncclCommGetAsyncError(nc->comm, &st);
  if (r != ncclSuccess) st = r;
  if (st == ncclRemoteError) {
    /* A peer is gone, as NCCL's proxy saw it: a peer failure (revoke, then
     * shrink), not an NCCL fault. NCCL cannot say which rank; the monitor
     * usually names it within milliseconds (the dead rank's store
     * connection closes) and its death record aborts the group with the
     * name. Only if it stays silent for the grace period is the failure
     * reported from here, unnamed. Meanwhile the ops keep waiting. */
    int64_t now = tdist__now_ns();
    if (!nc->remote_ns) nc->remote_ns = now;
    int64_t waited = (now - nc->remote_ns) / 1000000;
    pthread_mutex_unlock(&nc->mu);
    if (waited >= tdist__param_NcclRemoteGraceMs())
      tdist_backend_fail(nc->group, TDIST_ERR_REMOTE_FAILED,
                         "NCCL reports a failed peer in group '%s' (%s: %s), and no rank of it was "
                         "declared dead within %lld ms",
                         nc->name, ncclGetErrorString(st), ncclGetLastError(nc->comm),
                         (long long)waited);
    return 0;
  }
  if (st != ncclSuccess && st != ncclInProgress) {
    const char *last = ncclGetLastError(nc->comm);
    snprintf(msg, sizeof(msg), "%s%s%s", ncclGetErrorString(st), last && *last ? ": " : "",
             last ? last : "");
    pthread_mutex_unlock(&nc->mu);
    tdist_backend_fail(nc->group, TDIST_ERR_NCCL_ERROR, "NCCL asynchronous error: %s", msg);
    return 0;
  }
  tdist__list_t *l;
  while (n < BATCH && (l = tdist__list_first(&nc->inflight)) != NULL) {
    tdist_backend_op_t *op = tdist__list_entry(l, tdist_backend_op_t, link);
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
    tdist_backend_complete(done[i], 0, "completed");
  if (qerr != cudaSuccess)
    tdist_backend_fail(nc->group, TDIST_ERR_CUDA_ERROR, "CUDA error on the group's stream: %s (%s)",
                       cudaGetErrorString(qerr), cudaGetErrorName(qerr));
  return n;
}

typedef struct fail_call {
  tdist__nccl_t *nc;
  int status;
  char msg[300];
} fail_call_t;

static void fail_on_progress(void *arg) {
  fail_call_t *f = arg;
  tdist_backend_fail(f->nc->group, f->status, "%s", f->msg);
}

void tdist__nccl_fail_group(tdist__nccl_t *nc, int status, const char *fmt, ...) {
  fail_call_t f = {nc, status, {0}};
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(f.msg, sizeof(f.msg), fmt, ap);
  va_end(ap);
  tdist_backend_call(nc->progress, fail_on_progress, &f);
}

void tdist__nccl_forget_locked(tdist__nccl_t *nc) {
  nc->dead = 1;
  tdist__list_t *l;
  while ((l = tdist__list_first(&nc->inflight)) != NULL)
    tdist__list_remove(l);
}

/* What an abort thread does with the communicator abort took. */
typedef struct abort_job {
  tdist__nccl_t *nc;
  ncclComm_t comm;
  int revoke; /* ncclCommRevoke and keep it for shrink; else ncclCommAbort */
} abort_job_t;

/* Abort thread (one per abort, detached): the blocking NCCL call, then the
 * job count down. nc stays allocated until `jobs` is 0 (destroy waits). */
static void *abort_main(void *arg) {
  abort_job_t j = *(abort_job_t *)arg;
  tdist__free(arg);
  tdist__nccl_t *nc = j.nc;
  tdist__nccl_dev_own(nc->device);
  if (j.revoke) {
    /* Stops the in-flight kernels and keeps the communicator, so that the
     * survivors can ncclCommShrink it (tdist_group_shrink); on a
     * non-blocking communicator it returns ncclInProgress, and shrink polls
     * it to quiescence. */
    ncclResult_t r = ncclCommRevoke(j.comm, NCCL_REVOKE_DEFAULT);
    if (r != ncclSuccess && r != ncclInProgress) {
      TDIST_WARN(NCCL, "group '%s': ncclCommRevoke: %s; aborting", nc->name, ncclGetErrorString(r));
      pthread_mutex_lock(&nc->mu);
      if (nc->comm == j.comm) nc->comm = NULL;
      nc->revoked = 0;
      pthread_mutex_unlock(&nc->mu);
      j.revoke = 0;
    }
  }
  if (!j.revoke) {
    /* Frees the communicator and stops its kernels; returns once they
     * stopped, which a kernel stuck behind a user's kernel delays: on this
     * thread, that delays nothing else. */
    ncclResult_t r = ncclCommAbort(j.comm);
    if (r != ncclSuccess && r != ncclInProgress)
      TDIST_WARN(NCCL, "group '%s': ncclCommAbort: %s", nc->name, ncclGetErrorString(r));
  }
  pthread_mutex_lock(&nc->mu);
  if (--nc->jobs == 0) pthread_cond_broadcast(&nc->idle);
  pthread_mutex_unlock(&nc->mu);
  return NULL;
}

/* Start an abort thread; without one (out of memory or threads), run the
 * job here, as a last resort. mu not held. */
static void start_abort(tdist__nccl_t *nc, ncclComm_t comm, int revoke) {
  abort_job_t *j = tdist__malloc(sizeof(*j));
  pthread_t t;
  pthread_attr_t at;
  if (j) {
    j->nc = nc;
    j->comm = comm;
    j->revoke = revoke;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&t, &at, abort_main, j);
    pthread_attr_destroy(&at);
    if (rc == 0) return;
  }
  abort_job_t local = {nc, comm, revoke};
  abort_job_t *copy = tdist__malloc(sizeof(*copy));
  tdist__free(j);
  TDIST_WARN(NCCL, "group '%s': no thread for the abort; running it on this thread", nc->name);
  if (copy) {
    *copy = local;
    abort_main(copy);
  }
}

void tdist__nccl_abort(void *state, int status, const char *reason, int local) {
  tdist__nccl_t *nc = state;
  ncclComm_t comm = NULL;
  int revoke = 0;
  if (!nc) return;
  /* Caller-side holders of mu give up within one poll turn: the group reads
   * as aborted (tdist_backend_aborted) before the core calls us. */
  pthread_mutex_lock(&nc->mu);
  if (!nc->dead) {
    /* Forget every launched op: the core finishes them after we return. */
    tdist__nccl_forget_locked(nc);
    if (nc->comm && status == TDIST_ERR_REMOTE_FAILED && !NC.ncclCommRevoke) {
      /* NCCL before 2.28: no revoke, so nothing left to shrink. */
      TDIST_WARN(NCCL, "group '%s': NCCL %s has no ncclCommRevoke (2.28); aborting", nc->name,
                 NC.version_str);
    } else if (nc->comm && status == TDIST_ERR_REMOTE_FAILED) {
      /* A peer is gone: stop the in-flight ops but keep the communicator. */
      revoke = 1;
      nc->revoked = 1;
    }
    comm = nc->comm;
    if (comm) {
      if (!revoke) nc->comm = NULL;
      nc->jobs++;
    }
    TDIST_INFO(NCCL, "group '%s': communicator %s (%s: %s)", nc->name,
               revoke ? "revoked" : "aborted", tdist_err_name(status), reason);
  }
  pthread_mutex_unlock(&nc->mu);
  if (comm) start_abort(nc, comm, revoke);
}

/* Any caller thread (backend.h, vtable->test): what poll would decide for
 * this one op, read-only. A caller blocked in tdist_work_wait, or spinning
 * on tdist_work_is_completed, sees its op's end event complete without
 * waiting for the progress thread (torch's isCompleted queries the event
 * the same way). Success only: the communicator alive, not revoked, no
 * asynchronous error (a remote error within its grace counts as one), and
 * the end event complete. An op a shrink abort cut short reads as not done
 * here: the shrink forgets the ops (dead) before NCCL stops them. The
 * caller's device and capture mode come back as they were; a busy mu (poll,
 * a submit, an abort) answers "not yet" rather than wait. */
int tdist__nccl_test(void *state, tdist_backend_op_t *op) {
  tdist__nccl_t *nc = state;
  tdist__nccl_op_t *no = tdist__nccl_op(op);
  int done = 0;
  if (pthread_mutex_trylock(&nc->mu) != 0) return 0;
  /* Linked with its event: launched and not yet unlinked by poll or
   * forgotten by abort (both under mu), so the event is not recycled. */
  if (nc->dead || !nc->comm || nc->revoked || nc->remote_ns || !no->end ||
      !tdist__list_linked(&op->link))
    goto out;
  tdist__nccl_dev_t dev;
  if (tdist__nccl_dev_enter(nc->device, &dev) != 0) goto out;
  /* Relaxed for this thread meanwhile: a query during another thread's
   * global-mode capture would otherwise invalidate that capture. */
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  int relaxed = cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess;
  ncclResult_t st = ncclSuccess;
  if (ncclCommGetAsyncError(nc->comm, &st) == ncclSuccess &&
      (st == ncclSuccess || st == ncclInProgress))
    done = cudaEventQuery(no->end) == cudaSuccess;
  if (relaxed) cudaThreadExchangeStreamCaptureMode(&mode);
  tdist__nccl_dev_leave(&dev);
out:
  pthread_mutex_unlock(&nc->mu);
  return done;
}

int tdist__nccl_wait_stream(void *state, tdist_backend_op_t *op, void *stream) {
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
    /* On the group's device (it has a context); the caller's comes back. */
    tdist__nccl_dev_t dev;
    TDIST_CHECKGOTO(tdist__nccl_dev_enter(nc->device, &dev), rc, out);
    cudaError_t e = cudaStreamWaitEvent((cudaStream_t)stream, no->end, 0);
    tdist__nccl_dev_leave(&dev);
    if (e != cudaSuccess) rc = tdist__cuda_err(e, "cudaStreamWaitEvent");
  }
out:
  pthread_mutex_unlock(&nc->mu);
  return rc;
}
