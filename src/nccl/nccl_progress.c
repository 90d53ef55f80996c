/*
 * nccl_progress.c - completion, errors and abort of the NCCL backend
 * (progress thread), the abort threads, the end of an enqueue NCCL answered
 * with ncclInProgress (whoever holds `call`), and the stream-ordered wait
 * (caller thread).
 *
 * post (progress thread): the op was launched by submit on the caller's
 * thread; post only marks it posted, so poll never completes an op before
 * the core has posted it.
 *
 * poll (progress thread), while the group has ops in flight, with the
 * group's device current and the capture mode relaxed (nccl_device.c),
 * holding `call` by trylock (a caller inside an NCCL call makes this tick
 * skip the group rather than stall the thread):
 *   1. ncclCommGetAsyncError once. ncclRemoteError (a peer gone) is a peer
 *      failure: TDIST_ERR_REMOTE_FAILED, reported only if the monitor has
 *      not named the dead rank within the grace period. Any other error
 *      fails the group (tdist_backend_fail with TDIST_ERR_NCCL_ERROR and
 *      NCCL's own text); the core then calls abort, which forgets every
 *      launched op, and fails them itself. ncclSuccess with an op
 *      `launching`: its enqueue ended, its end event is recorded now.
 *   2. cudaEventQuery on the end event of the op at the head of our FIFO
 *      (`inflight`, launch order); while it is done (and posted), unlink it,
 *      return its event to the pool and complete it. The first one not
 *      ready (or not yet recorded) stops the scan: all ops of a group share
 *      one stream, so later events cannot be done before it in stream order.
 *   Completions and failures are reported with the locks released (the
 *   core's services only queue, but keep no lock order with them).
 *
 * test (any caller thread): poll's verdict on one op, success only, for a
 * caller that waits on it (backend.h, vtable->test).
 *
 * abort (progress thread): marks the state dead and forgets the launched
 * ops under mu, then hands the communicator to an abort thread
 * (abort_main): it waits until no caller is inside an NCCL call (callers
 * give up within one turn of their loops once the group reads as aborted,
 * and later ones see `dead`), then calls ncclCommAbort, which returns only
 * once NCCL's threads and kernels stopped. One stuck abort delays no other
 * group, and the progress thread never waits for it. destroy waits for the
 * thread (bounded by the group's timeout).
 */
#include <stdarg.h>
#include <sched.h>
#include <stdio.h>
#include <time.h>

#include "nccl/nccl_backend.h"
#include "util/alloc.h"
#include "util/clock.h"
#include "util/inject.h"
#include "util/param.h"

/* At most this many completions per poll (bounded stack array). */
#define BATCH 64

int tdist__nccl_post(void *state, tdist_backend_op_t *op) {
  /* Already launched by submit on the caller's thread; poll completes it.
   * Progress thread, like poll: no lock needed for `posted`. */
  atomic_store_explicit(&tdist__nccl_op(op)->posted, 1, memory_order_release);
  return 0;
}

/* A CUDA host function (CUDA's callback thread): no CUDA call in it. */
static void wake_progress(void *arg) {
  (void)arg;
  tdist_backend_wake_any();
}

int tdist__nccl_launch_done(tdist__nccl_t *nc) {
  int rc = 0;
  pthread_mutex_lock(&nc->mu);
  tdist_backend_op_t *op = nc->dead ? NULL : nc->launching;
  cudaEvent_t end = op ? tdist__nccl_op(op)->end : NULL;
  pthread_mutex_unlock(&nc->mu);
  if (!op) return 0;
  /* The event is the pool's (nc's): recording it is safe even if an abort
   * forgets the op meanwhile; the op itself is touched only under mu while
   * the state is alive (the core fails a forgotten op after abort). */
  CUDACHECKGOTO(cudaEventRecord(end, nc->stream), rc, out);
  /* Wake the progress thread and the waiters when the end event completes:
   * the thread may sleep on a back-off timer, and a completion must not
   * wait for it. On a side stream, so the NCCL stream never waits for a
   * host function; the function touches nothing of nc. */
  CUDACHECKGOTO(cudaStreamWaitEvent(nc->notify, end, 0), rc, out);
  CUDACHECKGOTO(cudaLaunchHostFunc(nc->notify, wake_progress, NULL), rc, out);
out:
  if (nc->has_premul) {
    /* The enqueue that used it finished: NCCL no longer reads it. */
    ncclRedOpDestroy(nc->premul, nc->comm);
    nc->has_premul = 0;
  }
  pthread_mutex_lock(&nc->mu);
  if (rc == 0 && nc->launching == op && !nc->dead) tdist__nccl_op(op)->recorded = 1;
  if (nc->launching == op) nc->launching = NULL;
  pthread_mutex_unlock(&nc->mu);
  return rc;
}

int tdist__nccl_settle_launch(tdist__nccl_t *nc) {
  pthread_mutex_lock(&nc->mu);
  int busy = nc->launching != NULL && !nc->dead;
  int64_t left_ms = (nc->launch_deadline_ns - tdist__now_ns()) / 1000000;
  pthread_mutex_unlock(&nc->mu);
  if (!busy) return 0;
  int64_t timeout_ms = (left_ms > 0 ? left_ms : 0) + 5000;
  /* The previous op's enqueue still runs (NCCL's job thread: usually
   * microseconds; until every peer arrives at an algorithm's first use).
   * That op is numbered and watched: past its deadline the watchdog names
   * who never came and aborts the group, which ends this wait. */
  int rc = tdist__nccl_wait_ready(nc->comm, nc->group, nc->name, "the previous op's enqueue",
                                  timeout_ms);
  if (rc == 0) rc = tdist__nccl_launch_done(nc);
  return rc;
}

int tdist__nccl_call_enter(tdist__nccl_t *nc, const char *what) {
  for (int turn = 0;; turn++) {
    if (pthread_mutex_trylock(&nc->call) == 0) {
      pthread_mutex_lock(&nc->mu);
      int dead = nc->dead;
      pthread_mutex_unlock(&nc->mu);
      if (!dead) return 0;
      pthread_mutex_unlock(&nc->call);
      break;
    }
    /* Held by another caller's NCCL call or an abort thread's barrier; an
     * abort stuck in ncclCommAbort (behind a kernel that never ends) holds
     * it no longer than the barrier, so this never waits on NCCL. */
    pthread_mutex_lock(&nc->mu);
    int dead = nc->dead;
    pthread_mutex_unlock(&nc->mu);
    if (dead || tdist_backend_aborted(nc->group)) break;
    if (turn < 64) {
      sched_yield();
    } else {
      struct timespec ts = {0, 20000};
      nanosleep(&ts, NULL);
    }
  }
  return tdist__error(TDIST_ERR_ABORTED, "nccl: %s: the communicator of group '%s' was aborted",
                      what, nc->name);
}

/* Every communicator of the group: the main one, then each pair's (its own
 * stream, so its own FIFO: each completes in its own order). */
int tdist__nccl_poll(void *state) {
  tdist__nccl_t *nc = state;
  int n = tdist__nccl_poll_one(nc);
  return n + tdist__nccl_pairs_poll(nc);
}

int tdist__nccl_poll_one(tdist__nccl_t *nc) {
  tdist_backend_op_t *done[BATCH];
  int n = 0;
  ncclResult_t st = ncclSuccess;
  cudaError_t qerr = cudaSuccess;
  int lerr = 0;
  char msg[200];

  if (pthread_mutex_trylock(&nc->call) != 0) return 0;
  pthread_mutex_lock(&nc->mu);
  int dead = nc->dead || !nc->comm;
  pthread_mutex_unlock(&nc->mu);
  if (dead) {
    pthread_mutex_unlock(&nc->call);
    return 0;
  }
  /* The group's device, never device 0 by default (nccl_device.c). */
  int drc = tdist__nccl_dev_own(nc->device);
  if (drc != 0) {
    pthread_mutex_unlock(&nc->call);
    tdist_backend_fail(nc->group, drc, "%s", tdist_last_error());
    return 0;
  }
  ncclResult_t r = ncclCommGetAsyncError(nc->comm, &st);
  if (r != ncclSuccess) st = r;
  if (st == ncclRemoteError) {
    /* A peer is gone, as NCCL's proxy saw it: a peer failure, not an NCCL
     * fault. NCCL cannot say which rank; the monitor usually names it
     * within milliseconds (the dead rank's store connection closes) and its
     * death record aborts the group with the name. Only if it stays silent
     * for the grace period is the failure reported from here, unnamed.
     * Meanwhile the ops keep waiting. */
    int64_t now = tdist__now_ns();
    if (!nc->remote_ns) nc->remote_ns = now;
    int64_t waited = (now - nc->remote_ns) / 1000000;
    snprintf(msg, sizeof(msg), "%s: %s", ncclGetErrorString(st), ncclGetLastError(nc->comm));
    pthread_mutex_unlock(&nc->call);
    if (waited >= tdist__param_NcclRemoteGraceMs())
      tdist_backend_fail(nc->group, TDIST_ERR_REMOTE_FAILED,
                         "NCCL reports a failed peer in group '%s' (%s), and no rank of it was "
                         "declared dead within %lld ms",
                         nc->name, msg, (long long)waited);
    return 0;
  }
  if (st != ncclSuccess && st != ncclInProgress) {
    const char *last = ncclGetLastError(nc->comm);
    snprintf(msg, sizeof(msg), "%s%s%s", ncclGetErrorString(st), last && *last ? ": " : "",
             last ? last : "");
    pthread_mutex_unlock(&nc->call);
    tdist_backend_fail(nc->group, TDIST_ERR_NCCL_ERROR, "NCCL asynchronous error: %s", msg);
    return 0;
  }
  /* Ready again: an enqueue that was in progress has launched. While one
   * still runs, no host function will wake this thread for it: keep the
   * loop polling. */
  if (st == ncclSuccess) lerr = tdist__nccl_launch_done(nc);
  if (st == ncclInProgress) tdist_backend_kick(nc->progress);
  pthread_mutex_lock(&nc->mu);
  tdist__list_t *l;
  while (lerr == 0 && n < BATCH && (l = tdist__list_first(&nc->inflight)) != NULL) {
    tdist_backend_op_t *op = tdist__list_entry(l, tdist_backend_op_t, link);
    tdist__nccl_op_t *no = tdist__nccl_op(op);
    if (!no->posted || !no->recorded) break; /* not posted, or still launching */
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
  pthread_mutex_unlock(&nc->call);

  for (int i = 0; i < n; i++)
    tdist_backend_complete(done[i], 0, "completed");
  if (lerr != 0)
    tdist_backend_fail(nc->group, lerr, "recording an end event: %s", tdist_last_error());
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
  nc->launching = NULL; /* the core fails it with the others */
  tdist__list_t *l;
  while ((l = tdist__list_first(&nc->inflight)) != NULL)
    tdist__list_remove(l);
  /* A pair's ops not launched yet: their start events back to the pool. */
  while ((l = tdist__list_first(&nc->pending)) != NULL) {
    tdist_backend_op_t *op = tdist__list_entry(l, tdist_backend_op_t, link);
    tdist__nccl_op_t *no = tdist__nccl_op(op);
    tdist__list_remove(l);
    no->pending = 0;
    if (no->start) tdist__nccl_event_put(nc, no->start);
    no->start = NULL;
  }
}

/* Abort thread (one per abort, detached). nc stays allocated until `jobs`
 * is 0 (destroy waits). */
static void *abort_main(void *arg) {
  tdist__nccl_t *nc = arg;
  tdist__nccl_dev_own(nc->device);
  /* A barrier, not a hold: once a caller inside an NCCL call on the
   * communicator has left (its loops give up within one turn of the abort),
   * nobody makes another (every path checks `dead` under `call`). */
  pthread_mutex_lock(&nc->call);
  pthread_mutex_lock(&nc->mu);
  ncclComm_t comm = nc->comm;
  pthread_mutex_unlock(&nc->mu);
  pthread_mutex_unlock(&nc->call);
  if (comm) {
    /* Frees the communicator and stops its kernels; returns once they
     * stopped (NCCL joins its job thread, so a launch in progress is over),
     * which a kernel stuck behind a user's kernel delays: on this thread,
     * holding no lock, that delays nothing else. */
    ncclResult_t r = ncclCommAbort(comm);
    if (r != ncclSuccess && r != ncclInProgress)
      TDIST_WARN(NCCL, "group '%s': ncclCommAbort: %s", nc->name, ncclGetErrorString(r));
  }
  /* Then the pairs' communicators (nccl_p2p.c), on this same thread: the
   * group's failures are released once every kernel of it stopped. */
  tdist__nccl_pairs_abort(nc);
  /* NCCL's kernels and job thread are done: the aborted ops' buffers are
   * the callers' again, and their failures may be published. Not once the
   * core's group is gone (destroy gave up waiting: detached); destroy waits
   * for a call in progress (telling), which only queues a task. */
  (void)tdist__inject("nccl.abort.released"); /* a slow abort thread (tests: a delay) */
  pthread_mutex_lock(&nc->mu);
  int tell = !nc->detached;
  nc->telling = tell;
  pthread_mutex_unlock(&nc->mu);
  if (tell) tdist_backend_released(nc->group);
  pthread_mutex_lock(&nc->call);
  pthread_mutex_lock(&nc->mu);
  nc->telling = 0;
  if (nc->comm == comm) nc->comm = NULL;
  nc->has_premul = 0;                                             /* freed with the communicator */
  if (--nc->jobs == 0 || tell) pthread_cond_broadcast(&nc->idle); /* destroy waits on either */
  pthread_mutex_unlock(&nc->mu);
  pthread_mutex_unlock(&nc->call);
  return NULL;
}

/* Start an abort thread; without one (out of threads), run the job here,
 * as a last resort. No lock held. */
static void start_abort(tdist__nccl_t *nc) {
  pthread_t t;
  pthread_attr_t at;
  pthread_attr_init(&at);
  pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
  int rc = pthread_create(&t, &at, abort_main, nc);
  pthread_attr_destroy(&at);
  if (rc == 0) return;
  TDIST_WARN(NCCL, "group '%s': no thread for the abort; running it on this thread", nc->name);
  abort_main(nc);
}

void tdist__nccl_abort(void *state, int status, const char *reason, int local) {
  tdist__nccl_t *nc = state;
  int start = 0;
  (void)local;
  if (!nc) return;
  /* mu is held by nobody across a call that can wait: this never stalls. */
  pthread_mutex_lock(&nc->mu);
  if (!nc->dead) {
    /* Forget every launched op: the core finishes them after we return. */
    tdist__nccl_forget_locked(nc);
    /* The pairs' ops too; their communicators go with the abort thread's. */
    int pairs = tdist__nccl_pairs_forget(nc);
    if (nc->comm || pairs > 0) {
      nc->jobs++;
      start = 1;
      /* Until ncclCommAbort returns, NCCL's kernels (and a launch still in
       * its job thread) may write the ops' buffers: the core publishes their
       * failures only once abort_main says so. */
      tdist_backend_hold_failures(nc->group);
    }
    TDIST_INFO(NCCL, "group '%s': communicator aborted (%s: %s)", nc->name, tdist_err_name(status),
               reason);
  }
  pthread_mutex_unlock(&nc->mu);
  if (start) start_abort(nc);
}

/* Any caller thread (backend.h, vtable->test): what poll would decide for
 * this one op. A caller blocked in tdist_work_wait, or spinning on
 * tdist_work_is_completed, sees its op's end event complete without waiting
 * for the progress thread (torch's isCompleted queries the event the same
 * way); if the group's last enqueue has just finished, the test records its
 * end event as poll would (launch_done). Success only: the communicator
 * alive, no asynchronous error (a remote error within its grace counts as
 * one), and the end event complete. An op a shrink abort cut short reads as
 * not done: the shrink forgets the ops (dead) before NCCL stops them. The
 * caller's device and capture mode come back as they were; a busy `call`
 * (poll, a submit, an abort's barrier) answers "not yet" rather than wait. */
int tdist__nccl_test(void *state, tdist_backend_op_t *op, unsigned flags) {
  (void)flags; /* nothing here counts on the caller's polling */
  /* A send/recv lives on its pair's state (op->priv, set by submit). */
  tdist__nccl_t *nc = op->priv ? op->priv : state;
  tdist__nccl_op_t *no = tdist__nccl_op(op);
  int done = 0;
  /* Not posted yet: the core may still finish an op test calls done
   * without ever posting it (backend.h, submit), and this one is linked on
   * the poll list, which only poll unlinks. "Not yet" until the progress
   * thread took it over. */
  if (!atomic_load_explicit(&no->posted, memory_order_acquire)) return 0;
  if (pthread_mutex_trylock(&nc->call) != 0) return 0;
  pthread_mutex_lock(&nc->mu);
  /* Linked with its event: launched and not yet unlinked by poll or
   * forgotten by abort (both under mu), so the event is not recycled. */
  int live = !nc->dead && nc->comm && !nc->remote_ns && no->end && tdist__list_linked(&op->link);
  cudaEvent_t end = no->end;
  pthread_mutex_unlock(&nc->mu);
  if (!live) goto out;
  tdist__nccl_dev_t dev;
  if (tdist__nccl_dev_enter(nc->device, &dev) != 0) goto out;
  /* Relaxed for this thread meanwhile: a query during another thread's
   * global-mode capture would otherwise invalidate that capture. */
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  int relaxed = cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess;
  /* Ready: a launch that was in progress ends here. Still in progress
   * (another op's enqueue): ours is recorded if launched before it. */
  ncclResult_t st = ncclSuccess;
  int ok = ncclCommGetAsyncError(nc->comm, &st) == ncclSuccess &&
           ((st == ncclSuccess && tdist__nccl_launch_done(nc) == 0) || st == ncclInProgress);
  if (ok) {
    pthread_mutex_lock(&nc->mu);
    int recorded = no->recorded && tdist__list_linked(&op->link);
    pthread_mutex_unlock(&nc->mu);
    done = recorded && cudaEventQuery(end) == cudaSuccess;
  }
  if (relaxed) cudaThreadExchangeStreamCaptureMode(&mode);
  tdist__nccl_dev_leave(&dev);
out:
  pthread_mutex_unlock(&nc->call);
  return done;
}

int tdist__nccl_wait_stream(void *state, tdist_backend_op_t *op, void *stream) {
  int rc = 0, failed = 0;
  tdist__nccl_t *nc = op->priv ? op->priv : state; /* a send/recv: its pair's */
  tdist__nccl_op_t *no = tdist__nccl_op(op);
  /* A send/recv whose pair communicator is still being made has no end
   * event yet: wait until the pair's setup thread launched it (the setup
   * is bounded by the group's timeout, and an abort ends it). */
  for (;;) {
    pthread_mutex_lock(&nc->mu);
    int pending = no->pending && !nc->dead;
    pthread_mutex_unlock(&nc->mu);
    if (!pending) break;
    if (tdist_backend_aborted(nc->group))
      return tdist__error(TDIST_ERR_ABORTED, "tdist_work_wait_stream: group '%s' was aborted",
                          nc->name);
    struct timespec ts = {0, 100000};
    nanosleep(&ts, NULL);
  }
  pthread_mutex_lock(&nc->mu);
  int completed = no->completed;
  pthread_mutex_unlock(&nc->mu);
  if (completed) return 0;
  tdist__nccl_dev_t dev;
  TDIST_CHECK(tdist__nccl_dev_enter(nc->device, &dev));
  /* The op's end event must be recorded before a stream can wait on it: if
   * its enqueue is still in progress, wait for it (as the next submit
   * would). */
  rc = tdist__nccl_call_enter(nc, "tdist_work_wait_stream");
  if (rc != 0) {
    rc =
        tdist__error(TDIST_ERR_ABORTED, "tdist_work_wait_stream: group '%s' was aborted", nc->name);
    goto out;
  }
  rc = tdist__nccl_settle_launch(nc);
  if (rc != 0 && rc != TDIST_ERR_ABORTED) failed = 1;
  if (rc == 0) {
    /* Under mu the end event of a linked op cannot be recycled: it returns
     * to the pool only when poll unlinks the op. An op off the FIFO is
     * complete (poll) or was forgotten by abort (the core reports its
     * status). */
    pthread_mutex_lock(&nc->mu);
    if (no->completed) {
      rc = 0;
    } else if (!tdist__list_linked(&op->link) || !no->recorded) {
      rc = tdist__error(TDIST_ERR_ABORTED, "tdist_work_wait_stream: group '%s' was aborted",
                        nc->name);
    } else {
      cudaError_t e = cudaStreamWaitEvent((cudaStream_t)stream, no->end, 0);
      if (e != cudaSuccess) rc = tdist__cuda_err(e, "cudaStreamWaitEvent");
    }
    pthread_mutex_unlock(&nc->mu);
  }
  pthread_mutex_unlock(&nc->call);
  if (failed) {
    char msg[300];
    snprintf(msg, sizeof(msg), "%s", tdist_last_error());
    tdist__nccl_fail_group(nc, rc, "%s", msg);
    tdist__error(rc, "%s", msg);
  }
out:
  tdist__nccl_dev_leave(&dev);
  return rc;
}
