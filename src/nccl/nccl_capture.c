/*
 * nccl_capture.c - ops submitted on a stream under CUDA graph capture
 * (caller thread; submit's branch, nccl_ops.c).
 *
 * When the caller's stream is capturing, the op's NCCL calls are captured
 * into the caller's graph instead of run, as torch's ProcessGroupNCCL and
 * torchcomms do: fork from the caller's stream onto a stream of ours (an
 * event recorded on the caller's stream, waited on by ours: that joins our
 * stream to the capture), enqueue the NCCL calls there (NCCL captures them
 * as kernel nodes: enqueue.cc, persistent plans), and join back (an event
 * recorded on ours, waited on by the caller's stream, so the capture can
 * end: CUDA Programming Guide, Stream Capture / Cross-stream Dependencies).
 *
 *   caller stream (capturing): ... [cap_fork]              wait(cap_join) ...
 *   cap[i] (joins the capture):        wait(cap_fork) -> NCCL -> [cap_join]
 *
 * The fork streams are ours, not nc->stream: a stream that joined a capture
 * stays in it until the capture ends, so anything else enqueued on it
 * meanwhile (the group's uncaptured ops) would be captured too. A fork
 * stream is reused by later ops of the same capture, and by any capture
 * once its own has ended; captures in progress at the same time on one
 * group get one each (at most 4).
 *
 * The op is captured, not launched: it never goes on the FIFO (no end
 * event, no poll, no watchdog deadline: torch keeps captured works out of
 * its watchdog the same way), and submit answers TDIST_BACKEND_CAPTURED,
 * so the core finishes the work at once as a captured work (work.h).
 *
 * Lifetime: the graph may be launched long after this call, after the
 * group was destroyed. Each graph that captured ops of a group holds its
 * state through a CUDA user object (cudaUserObjectCreate +
 * cudaGraphRetainUserObject with cudaGraphUserObjectMove, on the capture's
 * graph from cudaStreamGetCaptureInfo), as torchcomms ties a communicator
 * to its graphs and NCCL ties its persistent plans to theirs
 * (misc/strongstream.cc ncclCudaGraphAddDestructor). A group destroyed
 * while such graphs exist is finished for tdist, but its communicator (and
 * the barrier's scratch, which a captured barrier reads) stays until the
 * last graph is released: CUDA then runs our destructor on an internal
 * thread, which may not call CUDA, so it only hands the destroy to the
 * worker thread (tdist_backend_worker_run).
 *
 * Exit: a graph destroyed just before the process exits hands its destroy
 * to the worker while exit runs the CUDA runtime's exit handlers; NCCL's
 * job thread then called cudaSetDevice on the freed runtime and the H200's
 * graph step died of SIGSEGV. So the first hold registers an exit handler
 * (after NCCL and the runtime registered theirs: it runs before them) that
 * waits for the destroys already handed over, bounded by their groups'
 * timeouts, and makes later destructors leave the communicator to the
 * process's end (no CUDA or NCCL call once exit began).
 *
 * Ops that are refused under capture, with NOT_SUPPORTED: a separate send
 * or recv (the graph runs its nodes in capture order on one stream, so a
 * ring of captured send-then-recv would deadlock at every launch; batch
 * them with tdist_batch_isend_irecv, one NCCL group, which is captured
 * whole). Everything else tdist runs on NCCL is NCCL calls only, with no
 * host step, and captures: the collectives, their v-forms (one NCCL group
 * each), barrier (an all_reduce on the group's scratch), batches, and
 * PREMUL_SUM, whose op is made per op with a host-immediate scalar: NCCL
 * copies the scalar into the captured kernel's arguments
 * (enqueue.cc hostToDevRedOp), and an op may be destroyed once the last
 * call that uses it returned (nccl.h, ncclRedOpDestroy), which here is once
 * the enqueue is ready.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nccl/nccl_backend.h"

/* The capture state of s: the CUDA 12.3+ query when the runtime has it, else
 * the CUDA 12 one (nccl_lib.c looked them up). Caller checked one exists. */
static cudaError_t capture_info(cudaStream_t s, enum cudaStreamCaptureStatus *st,
                                unsigned long long *id, cudaGraph_t *graph) {
  if (NC.cudaStreamGetCaptureInfo_v3)
    return NC.cudaStreamGetCaptureInfo_v3(s, st, id, graph, NULL, NULL, NULL);
  return NC.cudaStreamGetCaptureInfo(s, st, id, graph, NULL, NULL);
}

/* The CUDA calls capture needs and this runtime lacks: the first one's
 * name, or NULL. */
static const char *missing_call(void) {
  if (!NC.cudaStreamGetCaptureInfo_v3 && !NC.cudaStreamGetCaptureInfo)
    return "cudaStreamGetCaptureInfo";
#define MISSING_(name) \
  if (!NC.name) return #name;
  TDIST__CUDART_OPTIONAL(MISSING_)
#undef MISSING_
  return NULL;
}

int tdist__nccl_capture_check(const tdist__nccl_t *nc, const tdist_backend_args_t *a,
                              int *capturing) {
  enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  *capturing = 0;
  cudaError_t e = cudaStreamIsCapturing((cudaStream_t)a->stream, &st);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return tdist__cuda_err(e, "cudaStreamIsCapturing");
  }
  if (st == cudaStreamCaptureStatusNone) return 0;
  if (st != cudaStreamCaptureStatusActive)
    return tdist__error(TDIST_ERR_CUDA_ERROR,
                        "backend 'nccl': %s on group '%s': the stream's graph capture was "
                        "invalidated (cudaStreamCaptureStatusInvalidated); end it and capture "
                        "again",
                        tdist_op_name(a->type), nc->name);
  const char *fn = missing_call();
  if (fn)
    return tdist__error(TDIST_ERR_NOT_SUPPORTED,
                        "backend 'nccl': %s on group '%s': the stream is being captured into a "
                        "CUDA graph, and the CUDA runtime has no %s (CUDA 11.3 or later); submit "
                        "the op outside the capture",
                        tdist_op_name(a->type), nc->name, fn);
  if (a->type == TDIST_OP_SEND || a->type == TDIST_OP_RECV)
    return tdist__error(TDIST_ERR_NOT_SUPPORTED,
                        "backend 'nccl': %s on group '%s' under CUDA graph capture: a graph runs "
                        "its captured ops in order, so separate sends and receives could "
                        "deadlock at each launch; capture them as one "
                        "tdist_batch_isend_irecv",
                        tdist_op_name(a->type), nc->name);
  *capturing = 1;
  return 0;
}

/* Destroys handed to the worker and not finished, and whether the process
 * is exiting (the exit handler ran). Any thread, under exit_mu. */
static pthread_mutex_t exit_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t exit_cv = PTHREAD_COND_INITIALIZER;
static pthread_once_t exit_once = PTHREAD_ONCE_INIT;
static int exit_pending, exit_begun;
static int64_t exit_wait_ms; /* the longest timeout of a pending destroy's group */

/* The exit handler: wait for the destroys under way (each ends within its
 * group's timeout: tdist__nccl_destroy_now bounds its waits by it), then
 * let none start. */
static void at_exit(void) {
  pthread_mutex_lock(&exit_mu);
  exit_begun = 1;
  if (exit_pending > 0) {
    struct timespec until; /* exit_cv keeps the default clock, CLOCK_REALTIME */
    clock_gettime(CLOCK_REALTIME, &until);
    int64_t ns = (int64_t)until.tv_nsec + (exit_wait_ms > 0 ? exit_wait_ms : 600000) * 1000000;
    until.tv_sec += (time_t)(ns / 1000000000);
    until.tv_nsec = (long)(ns % 1000000000);
    while (exit_pending > 0)
      if (pthread_cond_timedwait(&exit_cv, &exit_mu, &until) != 0) break;
    if (exit_pending > 0)
      TDIST_WARN(NCCL, "exit: %d communicator destroy(s) of released CUDA graphs still running",
                 exit_pending);
  }
  pthread_mutex_unlock(&exit_mu);
}

/* A child of fork has none of the parent's worker jobs: it waits for none. */
static void at_fork_child(void) {
  pthread_mutex_init(&exit_mu, NULL);
  pthread_cond_init(&exit_cv, NULL);
  exit_pending = 0;
}

static void register_at_exit(void) {
  if (atexit(at_exit) != 0 || pthread_atfork(NULL, NULL, at_fork_child) != 0)
    TDIST_WARN(NCCL, "atexit or pthread_atfork failed: a graph's destroy may race exit");
}

/* The user object's destructor: CUDA runs it on an internal thread once
 * the last graph holding it is gone, and it may not call CUDA (Runtime
 * API, cudaUserObjectCreate). A group destroyed meanwhile is destroyed now,
 * by the worker thread (which may block and call CUDA and NCCL). */
static void destroy_job(void *arg) {
  tdist__nccl_t *nc = arg;
  /* Our thread: its capture mode relaxed, so the destroy's calls never
   * touch a user's capture in progress. */
  tdist__nccl_dev_own(nc->device);
  TDIST_INFO(NCCL,
             "group '%s': the last CUDA graph that captured its ops is gone: destroying "
             "its communicator",
             nc->name);
  tdist__nccl_destroy_now(nc);
  pthread_mutex_lock(&exit_mu);
  exit_pending--;
  pthread_cond_broadcast(&exit_cv);
  pthread_mutex_unlock(&exit_mu);
}

static void graph_released(void *arg) {
  tdist__nccl_t *nc = arg;
  pthread_mutex_lock(&nc->mu);
  int last = --nc->graphs == 0 && nc->orphaned;
  pthread_mutex_unlock(&nc->mu);
  if (!last) return;
  pthread_mutex_lock(&exit_mu);
  int go = !exit_begun;
  if (go) {
    exit_pending++;
    if (nc->timeout_ms > exit_wait_ms) exit_wait_ms = nc->timeout_ms;
  }
  pthread_mutex_unlock(&exit_mu);
  /* Exiting: the runtime may be gone; the process's end frees it all. */
  if (go) tdist_backend_worker_run(destroy_job, nc);
}

/* `call` held: the capture's graph holds nc (once per capture). */
static int hold(tdist__nccl_t *nc, unsigned long long id, cudaGraph_t graph) {
  int rc = 0;
  cudaUserObject_t obj = NULL;
  if (nc->held && nc->held_id == id) return 0;
  pthread_once(&exit_once, register_at_exit);
  pthread_mutex_lock(&nc->mu);
  nc->graphs++;
  pthread_mutex_unlock(&nc->mu);
  cudaError_t e = cudaUserObjectCreate(&obj, nc, graph_released, 1, cudaUserObjectNoDestructorSync);
  if (e != cudaSuccess) {
    pthread_mutex_lock(&nc->mu);
    nc->graphs--;
    pthread_mutex_unlock(&nc->mu);
    return tdist__cuda_err(e, "cudaUserObjectCreate");
  }
  CUDACHECKGOTO(cudaGraphRetainUserObject(graph, obj, 1, cudaGraphUserObjectMove), rc, fail);
  nc->held = 1;
  nc->held_id = id;
  return 0;
fail:
  cudaUserObjectRelease(obj, 1); /* its destructor gives the count back */
  return rc;
}

/* `call` held: a stream of ours to fork capture `id` onto: one already in
 * it, else one in no capture, else a new one. Made with the thread's
 * capture mode relaxed, so that creating it never touches the capture. */
static int fork_stream(tdist__nccl_t *nc, unsigned long long id, cudaStream_t *out) {
  int rc = 0;
  cudaStream_t idle = NULL;
  for (int i = 0; i < nc->ncap; i++) {
    enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    unsigned long long cid = 0;
    CUDACHECKGOTO(capture_info(nc->capst[i], &st, &cid, NULL), rc, fail);
    if (st != cudaStreamCaptureStatusNone && cid == id) {
      *out = nc->capst[i];
      return 0;
    }
    if (st == cudaStreamCaptureStatusNone && !idle) idle = nc->capst[i];
  }
  if (idle) {
    *out = idle;
    return 0;
  }
  if (nc->ncap == (int)(sizeof(nc->capst) / sizeof(nc->capst[0])))
    return tdist__error(TDIST_ERR_NOT_SUPPORTED,
                        "backend 'nccl': group '%s' captures into %d CUDA graphs at once "
                        "already; end one of those captures first",
                        nc->name, nc->ncap);
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  CUDACHECKGOTO(cudaThreadExchangeStreamCaptureMode(&mode), rc, fail);
  cudaError_t e = cudaSuccess;
  if (!nc->cap_fork) e = cudaEventCreateWithFlags(&nc->cap_fork, cudaEventDisableTiming);
  if (e == cudaSuccess && !nc->cap_join)
    e = cudaEventCreateWithFlags(&nc->cap_join, cudaEventDisableTiming);
  cudaStream_t s = NULL;
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaThreadExchangeStreamCaptureMode(&mode);
  CUDACHECKGOTO(e, rc, fail);
  nc->capst[nc->ncap++] = s;
  *out = s;
fail:
  return rc;
}

int tdist__nccl_capture_locked(tdist__nccl_t *nc, tdist_backend_op_t *op, ncclDataType_t dt,
                               ncclRedOp_t rop, int *doomed) {
  int rc = 0, premul = 0;
  const tdist_backend_args_t *a = op->args;
  cudaStream_t user = (cudaStream_t)a->stream, cs = NULL;
  enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  cudaGraph_t graph = NULL;
  CUDACHECKGOTO(capture_info(user, &st, &id, &graph), rc, fail);
  if (st != cudaStreamCaptureStatusActive || !graph)
    return tdist__error(TDIST_ERR_CUDA_ERROR,
                        "backend 'nccl': %s on group '%s': the stream's graph capture is no "
                        "longer active",
                        tdist_op_name(a->type), nc->name);
  /* The graph holds nc before any node of ours is in it. */
  TDIST_CHECK(hold(nc, id, graph));
  TDIST_CHECK(fork_stream(nc, id, &cs));
  CUDACHECKGOTO(cudaEventRecord(nc->cap_fork, user), rc, fail);
  CUDACHECKGOTO(cudaStreamWaitEvent(cs, nc->cap_fork, 0), rc, fail);
  if (tdist_backend_op_is_reducing(a->type) && a->redop == TDIST_PREMUL_SUM) {
    _Alignas(8) unsigned char scalar[8] = {0};
    tdist__nccl_premul_scalar(a->dtype, a->scalar, scalar);
    NCCLCHECKGOTO(ncclRedOpCreatePreMulSum(&rop, scalar, dt, ncclScalarHostImmediate, nc->comm),
                  nc->comm, rc, fail);
    premul = 1;
  }
  ncclResult_t r = tdist__nccl_launch_on(nc, a, dt, rop, cs);
  if (r != ncclSuccess && r != ncclInProgress) {
    rc = tdist__nccl_err(nc->comm, r, tdist_op_name(a->type));
    *doomed = 1; /* a non-blocking communicator keeps the error */
    premul = 0;
    goto fail;
  }
  if (r == ncclInProgress) {
    /* NCCL's job thread captures the kernels; our join must follow them.
     * Waited for here (`call` held, as any caller may): a capture's
     * enqueue does not wait on the device, only, at a first use, for the
     * peers' connection, bounded by the op's timeout. */
    rc = tdist__nccl_wait_ready(nc->comm, nc->group, nc->name, "the captured enqueue",
                                op->timeout_ms > 0 ? op->timeout_ms : nc->timeout_ms);
    if (rc != 0) {
      if (rc != TDIST_ERR_ABORTED) *doomed = 1;
      premul = 0;
      goto fail;
    }
  }
  if (premul) ncclRedOpDestroy(rop, nc->comm); /* the scalar is in the captured node */
  premul = 0;
  CUDACHECKGOTO(cudaEventRecord(nc->cap_join, cs), rc, fail);
  CUDACHECKGOTO(cudaStreamWaitEvent(user, nc->cap_join, 0), rc, fail);
  TDIST_TRACE(NCCL, "%s on group '%s' captured into CUDA graph capture %llu",
              tdist_op_name(a->type), nc->name, id);
  return TDIST_BACKEND_CAPTURED;
fail:
  if (premul) ncclRedOpDestroy(rop, nc->comm);
  return rc;
}
