/*
 * nccl_backend.h - the NCCL backend's private state (internal to src/nccl/).
 *
 * The backend follows the contract of tdist/backend.h: it never sees the
 * core's group or work structs. One tdist__nccl_t per group (the `state` the
 * core hands back to every vtable entry). It owns the group's communicator,
 * an internal CUDA stream on which every NCCL call of the group is enqueued,
 * a pool of end events, and the FIFO of launched ops. Sends and receives to
 * other ranks run on communicators of their own, one per direction of each
 * pair of peers, each state a tdist__nccl_t like the group's (nccl_p2p.c).
 *
 * Threads (who runs what):
 *   caller threads   init, split, shrink (nccl_comm.c), destroy (nccl_state.c), submit
 *                    (nccl_ops.c), wait_stream (nccl_progress.c). They may
 *                    block, within the group's timeout.
 *   progress thread  post, poll, abort (nccl_progress.c). Never blocks and
 *                    never waits on NCCL: poll only trylocks `call`; abort
 *                    takes only `mu`, which nobody holds across an NCCL or
 *                    CUDA call that can wait, and hands ncclCommAbort (which
 *                    waits for the communicator's kernels) to an abort thread.
 *   abort threads    one per abort (nccl_progress.c abort_main): waits until
 *                    no caller is inside an NCCL call on the communicator
 *                    (lock and unlock `call`: later callers see `dead` and
 *                    make none), then ncclCommAbort, holding no lock, so a
 *                    kernel stuck behind a user's spinning kernel delays
 *                    nothing but this thread.
 *   CUDA's thread    a graph's user object destructor (nccl_capture.c):
 *                    takes `mu` only, makes no CUDA call, and hands the
 *                    deferred destroy of an orphaned state to the worker
 *                    thread (tdist_backend_worker_run).
 *
 * Two locks, taken in this order: call, then mu.
 *   - `call` serialises the NCCL calls on `comm` (NCCL is not thread-safe per
 *     communicator) and the CUDA calls that go with an enqueue. A caller may
 *     hold it across a wait (an enqueue NCCL has not finished, finalize, a
 *     split); the progress thread only trylocks it.
 *   - `mu` guards the fields marked (mu): short sections only, never across
 *     a call that can wait. The progress thread takes it.
 *   - `dead` is set (under mu) by abort: no new NCCL call, and the launched
 *     ops are forgotten (unlinked; the core fails them). The communicator
 *     stays in `comm` until the abort thread has aborted it (then NULL);
 *     `comm` is written with both locks held, so either one reads it.
 *     `jobs` counts abort threads not yet done; destroy waits on `idle`
 *     until it is 0.
 *   - After a peer failure the communicator is aborted like after any other
 *     failure, never revoked for ncclCommShrink: once NCCL's proxy has seen
 *     a peer die the communicator's error is permanent and every shrink of
 *     it fails (NCCL 2.28.9 on an H200), and whether a rank's proxy saw it
 *     differs from rank to rank, so the survivors could not agree on a
 *     path. tdist_group_shrink then makes a fresh communicator through the
 *     new group's store (nccl_comm.c).
 *   - An enqueue that NCCL answers with ncclInProgress (a non-blocking
 *     communicator launches from its own job thread) is not waited for in
 *     submit: the op is `launching` until the communicator is ready again;
 *     whoever holds `call` next (poll, a test, the next submit,
 *     wait_stream) records its end event then (launch_done). So submit
 *     never sleeps, the op is numbered and watched by the core like any
 *     other, and an enqueue stuck waiting for a peer (NCCL connects an
 *     algorithm at its first use, waiting for every rank) times out through
 *     the watchdog, whose diagnosis names the rank that never came.
 *
 * Per-op state lives in op->scratch (tdist__nccl_op_t): the end event that
 * poll queries and that wait_stream makes a stream wait on. An op is on
 * `inflight` from its launch (submit) until poll completes it or abort
 * forgets it; its event goes back to the pool in the same critical section
 * that unlinks it, so a wait_stream that finds the op still linked (under
 * mu) always waits on this op's own record.
 *
 * CUDA and NCCL types stay in this header (and nccl_api.h) and out of the
 * public ones. NCCL and the CUDA runtime are not linked: every call goes
 * through the function table tdist__nccl_fn (the NC macro), filled by
 * tdist__nccl_load (nccl_lib.c) on the first init of a group.
 */
#ifndef TDIST_NCCL_BACKEND_H
#define TDIST_NCCL_BACKEND_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "tdist/backend.h"
#include "util/param.h"
#include "nccl/nccl_api.h"
#include "util/error.h"
#include "util/list.h"
#include "util/log.h"

typedef struct tdist__nccl {
  pthread_mutex_t call; /* NCCL calls on comm (see above) */
  pthread_mutex_t mu;
  pthread_cond_t idle; /* signalled (under mu) when `jobs` drops to 0 or `telling` clears */
  ncclComm_t comm;     /* (call and mu to write) NULL once destroyed or aborted */
  int dead;            /* (mu) aborted: no new NCCL call */
  int jobs;            /* (mu) abort threads not yet finished on this state */
  /* (mu) The core's group is gone (destroy gave up waiting for an abort
   * thread): abort_main calls tdist_backend_released no more. `telling`:
   * an abort thread is inside that call, which destroy waits out. */
  int detached, telling;
  /* (mu) The op whose enqueue NCCL has not finished (ncclInProgress): on
   * `inflight`, its end event not yet recorded. At most one: the next NCCL
   * call waits until the communicator is ready, which finishes it. */
  tdist_backend_op_t *launching;
  int64_t launch_deadline_ns; /* (mu) when `launching` times out (its op's deadline) */
  ncclRedOp_t premul;         /* (call) PreMulSum of `launching`, destroyed once launched */
  int has_premul;             /* (call) */

  /* Set at creation (caller thread), then read-only. */
  tdist_backend_group_t *group; /* the core's handle: tdist_backend_fail, tdist_backend_aborted */
  tdist_backend_progress_t *progress; /* the progress thread (caller-side failure reports) */
  char name[64];                      /* the group's name, for messages and the NCCL config */
  int64_t timeout_ms;                 /* the group's timeout at creation: bounds destroy */
  int rank, size;                     /* in the group (v-ops: nccl_ops_v.c) */
  int device;
  int min_cc;           /* smallest compute capability of the group's devices (90 = 9.0) */
  int64_t remote_ns;    /* (call) when poll first saw ncclRemoteError, else 0 */
  cudaStream_t stream;  /* internal, non-blocking; every NCCL call goes here */
  cudaStream_t notify;  /* waits for each end event, then wakes the progress thread and waiters */
  cudaEvent_t start_ev; /* (mu) recorded on the caller's stream, waited by `stream` */
  void *scratch;        /* one float of device memory for barrier */

  /* NCCL's configuration (nccl_comm.c, set at creation, then read-only):
   * the options in force -- the group's own over its parent's -- which its
   * splits inherit. net_name points into net_name_buf. */
  tdist_nccl_opts_t knobs;
  char net_name_buf[64];
  /* (call) Registrations made and not undone (nccl_mem.c): destroy
   * releases what the user left. */
  struct tdist__nccl_reg *regs;
  /* CUDA graph capture (nccl_capture.c). The graphs that captured ops of
   * this group hold it through a CUDA user object each: destroy while one
   * exists only marks it orphaned, and the last graph's release destroys
   * it (on the worker thread). */
  int graphs;                     /* (mu) user objects of this state not yet released */
  int orphaned;                   /* (mu) destroy ran while graphs > 0 */
  int held;                       /* (call) held_id's graph holds a user object already */
  unsigned long long held_id;     /* (call) */
  cudaStream_t capst[4];          /* (call) streams forked from captures, made on demand */
  int ncap;                       /* (call) */
  cudaEvent_t cap_fork, cap_join; /* (call) fork from / join back to the caller's stream */

  /* (mu) Launched ops (tdist_backend_op_t.link), in launch order = stream order. */
  tdist__list_t inflight;

  /* Event pool (mu): `all` holds every event created (destroyed at destroy),
   * `free` the ones not attached to a launched op. Grows only when empty, so
   * steady state allocates nothing. */
  cudaEvent_t *all, *free;
  int nall, nfree, cap;

  /* Point-to-point on communicators of two ranks, one per pair of peers
   * (nccl_p2p.c). A pair's state is a tdist__nccl_t of its own (its own
   * `call` and `mu`, communicator, internal stream, event pool and FIFO),
   * made on the first send/recv between the two ranks; the group's own
   * state (the "main" one) lists them. Lock order: main mu, then a pair's
   * mu (abort only); no pair lock is held while taking main mu. Entries of
   * `pairs` only go from NULL to a state while the group lives (freed at
   * destroy). A pair's `rank` and `size` are its own (0 or 1, of 2). */
  tdist_store_t *store;       /* main: the group's store view (pair ids); set at creation */
  uint64_t uid;               /* the group's uid (the pairs' store keys) */
  struct tdist__nccl **pairs; /* main (mu): [2 * size]: [2p] sends to p, [2p+1] receives from p */
  struct tdist__nccl *owner;  /* pair: the group's main state (NULL on main) */
  int peer;                   /* pair: the peer's rank in the group; `rank` 0: we send */
  int ready;                  /* pair (mu; written with call and mu): comm made, pending drained */
  int stop;                   /* pair (mu): destroy runs: the setup thread gives up */
  tdist__list_t pending;      /* pair (mu): ops submitted before `ready`, in submit order */
  pthread_t setup;            /* pair: the setup thread (nccl_p2p.c), joined by destroy */
  int has_setup;              /* pair (mu): `setup` was started */
} tdist__nccl_t;

/* What an op keeps in op->scratch (initialised by submit, under mu). */
typedef struct tdist__nccl_op {
  cudaEvent_t end;   /* (mu) this op's end event, from the pool */
  atomic_int posted; /* (atomic) post ran (progress): poll may complete the op,
                       and test may report it (backend.h, submit) */
  int completed;     /* (mu) poll completed it (unlinked, not forgotten by abort) */
  int recorded;      /* (mu) its end event is recorded (the enqueue finished) */
  /* A send/recv submitted before its pair's communicator was ready
   * (nccl_p2p.c): on the pair's `pending` list until the setup thread
   * launches it; `start` was recorded on the caller's stream at submit, so
   * the launch orders after what the caller had queued then, not later. */
  int pending;       /* (pair mu) on `pending` */
  cudaEvent_t start; /* (pair mu) from the pair's pool, or NULL: use start_ev */
} tdist__nccl_op_t;

_Static_assert(sizeof(tdist__nccl_op_t) <= TDIST_BACKEND_SCRATCH, "op scratch too small");

static inline tdist__nccl_op_t *tdist__nccl_op(tdist_backend_op_t *op) {
  return (tdist__nccl_op_t *)(void *)op->scratch;
}

/* ---- the loaded libraries (nccl_lib.c) ------------------------------------------ */

/* Required calls: every NCCL release from TDIST__NCCL_MIN_VERSION has them.
 * X(name) */
// clang-format off (the lists stay one entry per line: clang-format staircases them)
#define TDIST__NCCL_REQUIRED(X) \
  X(ncclGetErrorString)         \
  X(ncclGetLastError)           \
  X(ncclGetUniqueId)            \
  X(ncclCommInitRankConfig)     \
  X(ncclCommSplit)              \
  X(ncclCommGetAsyncError)      \
  X(ncclCommFinalize)           \
  X(ncclCommDestroy)            \
  X(ncclCommAbort)              \
  X(ncclRedOpCreatePreMulSum)   \
  X(ncclRedOpDestroy)           \
  X(ncclGroupStart)             \
  X(ncclGroupEnd)               \
  X(ncclAllReduce)              \
  X(ncclBroadcast)              \
  X(ncclReduce)                 \
  X(ncclAllGather)              \
  X(ncclReduceScatter)          \
  X(ncclSend)                   \
  X(ncclRecv)

/* Newer calls, looked up one by one: a missing one (NULL) fails only the
 * call that needs it. X(name, major, minor): the release that added it. */
#define TDIST__NCCL_OPTIONAL(X)      \
  X(ncclAlltoAll, 2, 28)             \
  X(ncclGather, 2, 28)               \
  X(ncclScatter, 2, 28)              \
  X(ncclCommInitRankScalable, 2, 23) \
  X(ncclCommRegister, 2, 19)         \
  X(ncclCommDeregister, 2, 19)       \
  X(ncclCommWindowRegister, 2, 27)   \
  X(ncclCommWindowDeregister, 2, 27) \
  X(ncclMemAlloc, 2, 19)             \
  X(ncclMemFree, 2, 19)

/* The CUDA runtime calls (all in CUDA 11.2 and later). */
#define TDIST__CUDART_REQUIRED(X)        \
  X(cudaGetErrorString)                  \
  X(cudaGetErrorName)                    \
  X(cudaGetLastError)                    \
  X(cudaGetDeviceCount)                  \
  X(cudaSetDevice)                       \
  X(cudaPointerGetAttributes)            \
  X(cudaStreamCreateWithFlags)           \
  X(cudaStreamDestroy)                   \
  X(cudaEventCreateWithFlags)            \
  X(cudaEventDestroy)                    \
  X(cudaEventRecord)                     \
  X(cudaEventQuery)                      \
  X(cudaStreamWaitEvent)                 \
  X(cudaMallocAsync)                     \
  X(cudaFreeAsync)                       \
  X(cudaMemsetAsync)                     \
  X(cudaGetDevice)                       \
  X(cudaDeviceGetAttribute)              \
  X(cudaStreamIsCapturing)               \
  X(cudaThreadExchangeStreamCaptureMode) \
  X(cudaLaunchHostFunc)

/* CUDA runtime calls looked up one by one: a runtime without them (the
 * call recorder) refuses only what needs them. The stream priorities: the
 * high-priority stream (nccl_comm.c); the user objects (CUDA 11.3+): graph
 * capture, which names the missing call (nccl_capture.c). X(name) */
#define TDIST__CUDART_OPTIONAL(X)     \
  X(cudaDeviceGetStreamPriorityRange) \
  X(cudaStreamCreateWithPriority)     \
  X(cudaUserObjectCreate)             \
  X(cudaUserObjectRelease)            \
  X(cudaGraphRetainUserObject)
// clang-format on

/*
 * The minimum NCCL: 2.18.0. The backend cannot do without non-blocking
 * communicators with ncclCommGetAsyncError/ncclCommFinalize (2.14),
 * ncclGetLastError (2.13), ncclCommSplit (2.18) and PreMulSum/ncclAvg/bf16
 * (2.10/2.11); 2.18 is the first release with all of them. Newer calls are
 * optional (TDIST__NCCL_OPTIONAL): shrink needs 2.27, gather,
 * scatter and all_to_all need 2.28.
 */
#define TDIST__NCCL_MIN_VERSION TDIST__NCCL_VERSION(2, 18, 0)

#define TDIST__NCCL_FIELD_(name) tdist__##name##_fn name;
#define TDIST__NCCL_FIELD_OPT_(name, maj, min) tdist__##name##_fn name;
typedef struct tdist__nccl_api {
  TDIST__NCCL_REQUIRED(TDIST__NCCL_FIELD_)
  TDIST__NCCL_OPTIONAL(TDIST__NCCL_FIELD_OPT_)
  TDIST__CUDART_REQUIRED(TDIST__NCCL_FIELD_)
  TDIST__CUDART_OPTIONAL(TDIST__NCCL_FIELD_)
  /* The capture query, optional: _v3 (CUDA 12.3+; CUDA 13's plain name has
   * its signature) when the runtime has it, else the CUDA 12 signature
   * (cudaStreamGetCaptureInfo_v2, or the plain name). */
  tdist__cudaStreamGetCaptureInfo_v3_fn cudaStreamGetCaptureInfo_v3;
  tdist__cudaStreamGetCaptureInfo_fn cudaStreamGetCaptureInfo;
  /* The driver's, optional: NULL without libcuda (then a caller's device is
   * always put back, even one without a context). */
  tdist__cuDevicePrimaryCtxGetState_fn cuDevicePrimaryCtxGetState;
  int version;          /* ncclGetVersion's code, e.g. 22809 */
  char version_str[16]; /* "2.28.9" */
} tdist__nccl_api_t;

/* Filled once by tdist__nccl_load, then read-only. */
extern tdist__nccl_api_t tdist__nccl_fn;
#define NC tdist__nccl_fn

/* Calls keep their library names in the sources: each goes through the
 * table (an optional one must be checked with TDIST__NCCL_NEED first). */
#define ncclGetErrorString(...) tdist__nccl_fn.ncclGetErrorString(__VA_ARGS__)
#define ncclGetLastError(...) tdist__nccl_fn.ncclGetLastError(__VA_ARGS__)
#define ncclGetUniqueId(...) tdist__nccl_fn.ncclGetUniqueId(__VA_ARGS__)
#define ncclCommInitRankConfig(...) tdist__nccl_fn.ncclCommInitRankConfig(__VA_ARGS__)
#define ncclCommSplit(...) tdist__nccl_fn.ncclCommSplit(__VA_ARGS__)
#define ncclCommGetAsyncError(...) tdist__nccl_fn.ncclCommGetAsyncError(__VA_ARGS__)
#define ncclCommFinalize(...) tdist__nccl_fn.ncclCommFinalize(__VA_ARGS__)
#define ncclCommDestroy(...) tdist__nccl_fn.ncclCommDestroy(__VA_ARGS__)
#define ncclCommAbort(...) tdist__nccl_fn.ncclCommAbort(__VA_ARGS__)
#define ncclRedOpCreatePreMulSum(...) tdist__nccl_fn.ncclRedOpCreatePreMulSum(__VA_ARGS__)
#define ncclRedOpDestroy(...) tdist__nccl_fn.ncclRedOpDestroy(__VA_ARGS__)
#define ncclGroupStart(...) tdist__nccl_fn.ncclGroupStart(__VA_ARGS__)
#define ncclGroupEnd(...) tdist__nccl_fn.ncclGroupEnd(__VA_ARGS__)
#define ncclAllReduce(...) tdist__nccl_fn.ncclAllReduce(__VA_ARGS__)
#define ncclBroadcast(...) tdist__nccl_fn.ncclBroadcast(__VA_ARGS__)
#define ncclReduce(...) tdist__nccl_fn.ncclReduce(__VA_ARGS__)
#define ncclAllGather(...) tdist__nccl_fn.ncclAllGather(__VA_ARGS__)
#define ncclReduceScatter(...) tdist__nccl_fn.ncclReduceScatter(__VA_ARGS__)
#define ncclSend(...) tdist__nccl_fn.ncclSend(__VA_ARGS__)
#define ncclRecv(...) tdist__nccl_fn.ncclRecv(__VA_ARGS__)
#define ncclAlltoAll(...) tdist__nccl_fn.ncclAlltoAll(__VA_ARGS__)
#define ncclGather(...) tdist__nccl_fn.ncclGather(__VA_ARGS__)
#define ncclScatter(...) tdist__nccl_fn.ncclScatter(__VA_ARGS__)
#define ncclCommInitRankScalable(...) tdist__nccl_fn.ncclCommInitRankScalable(__VA_ARGS__)
#define ncclCommRegister(...) tdist__nccl_fn.ncclCommRegister(__VA_ARGS__)
#define ncclCommDeregister(...) tdist__nccl_fn.ncclCommDeregister(__VA_ARGS__)
#define ncclCommWindowRegister(...) tdist__nccl_fn.ncclCommWindowRegister(__VA_ARGS__)
#define ncclCommWindowDeregister(...) tdist__nccl_fn.ncclCommWindowDeregister(__VA_ARGS__)
#define ncclMemAlloc(...) tdist__nccl_fn.ncclMemAlloc(__VA_ARGS__)
#define ncclMemFree(...) tdist__nccl_fn.ncclMemFree(__VA_ARGS__)
#define cudaDeviceGetStreamPriorityRange(...) \
  tdist__nccl_fn.cudaDeviceGetStreamPriorityRange(__VA_ARGS__)
#define cudaStreamCreateWithPriority(...) tdist__nccl_fn.cudaStreamCreateWithPriority(__VA_ARGS__)
#define cudaGetErrorString(...) tdist__nccl_fn.cudaGetErrorString(__VA_ARGS__)
#define cudaGetErrorName(...) tdist__nccl_fn.cudaGetErrorName(__VA_ARGS__)
#define cudaGetLastError(...) tdist__nccl_fn.cudaGetLastError(__VA_ARGS__)
#define cudaGetDeviceCount(...) tdist__nccl_fn.cudaGetDeviceCount(__VA_ARGS__)
#define cudaSetDevice(...) tdist__nccl_fn.cudaSetDevice(__VA_ARGS__)
#define cudaPointerGetAttributes(...) tdist__nccl_fn.cudaPointerGetAttributes(__VA_ARGS__)
#define cudaStreamCreateWithFlags(...) tdist__nccl_fn.cudaStreamCreateWithFlags(__VA_ARGS__)
#define cudaStreamDestroy(...) tdist__nccl_fn.cudaStreamDestroy(__VA_ARGS__)
#define cudaEventCreateWithFlags(...) tdist__nccl_fn.cudaEventCreateWithFlags(__VA_ARGS__)
#define cudaEventDestroy(...) tdist__nccl_fn.cudaEventDestroy(__VA_ARGS__)
#define cudaEventRecord(...) tdist__nccl_fn.cudaEventRecord(__VA_ARGS__)
#define cudaEventQuery(...) tdist__nccl_fn.cudaEventQuery(__VA_ARGS__)
#define cudaStreamWaitEvent(...) tdist__nccl_fn.cudaStreamWaitEvent(__VA_ARGS__)
#define cudaMallocAsync(...) tdist__nccl_fn.cudaMallocAsync(__VA_ARGS__)
#define cudaFreeAsync(...) tdist__nccl_fn.cudaFreeAsync(__VA_ARGS__)
#define cudaMemsetAsync(...) tdist__nccl_fn.cudaMemsetAsync(__VA_ARGS__)
#define cudaGetDevice(...) tdist__nccl_fn.cudaGetDevice(__VA_ARGS__)
#define cudaLaunchHostFunc(...) tdist__nccl_fn.cudaLaunchHostFunc(__VA_ARGS__)
#define cudaDeviceGetAttribute(...) tdist__nccl_fn.cudaDeviceGetAttribute(__VA_ARGS__)
#define cudaStreamIsCapturing(...) tdist__nccl_fn.cudaStreamIsCapturing(__VA_ARGS__)
#define cudaThreadExchangeStreamCaptureMode(...) \
  tdist__nccl_fn.cudaThreadExchangeStreamCaptureMode(__VA_ARGS__)
#define cudaUserObjectCreate(...) tdist__nccl_fn.cudaUserObjectCreate(__VA_ARGS__)
#define cudaUserObjectRelease(...) tdist__nccl_fn.cudaUserObjectRelease(__VA_ARGS__)
#define cudaGraphRetainUserObject(...) tdist__nccl_fn.cudaGraphRetainUserObject(__VA_ARGS__)

/* Ranks per bootstrap root of a scalable init (ncclCommInitRankScalable,
 * NCCL 2.23+): a group of more ranks makes ceil(size / this) unique ids,
 * torch's TORCH_NCCL_RANKS_PER_ROOT (default 128). */
TDIST_PARAM(NcclRanksPerRoot, "TDIST_NCCL_RANKS_PER_ROOT", 128)

/* Caller thread: open NCCL and the CUDA runtime (once per process; later
 * calls return the first outcome). 0, or TDIST_ERR_NOT_SUPPORTED with a
 * message for the user ("backend 'nccl': libnccl.so.2 not found; ..."). */
int tdist__nccl_load(void);

/* The error for a missing optional call `fn`, added in NCCL maj.min:
 * TDIST_ERR_NOT_SUPPORTED naming the version found and the one needed. */
int tdist__nccl_missing(const char *what, const char *fn, int maj, int min);
#define TDIST__NCCL_NEED(what, fn, maj, min) \
  (NC.fn ? 0 : tdist__nccl_missing((what), #fn, (maj), (min)))

/* The backend as the core's table lists it (nccl_state.c). */
extern const tdist_backend_t tdist__nccl_backend;

/* Error conversion at the boundary: the tdist code, with the library's own
 * text (and, for NCCL, ncclGetLastError of the communicator) recorded with
 * tdist__error for tdist_last_error(). `what` names the call. Any thread. */
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
 * Caller thread, `call` held (or comm private to the caller): poll
 * ncclCommGetAsyncError(comm) until it leaves ncclInProgress, for at most
 * timeout_ms. Gives up early when group `g` (may be NULL) gets aborted.
 * Returns 0, TDIST_ERR_NCCL_ERROR (the async error), TDIST_ERR_TIMEOUT or
 * TDIST_ERR_ABORTED; the message is recorded and names `what` and the group
 * `gname`.
 */
int tdist__nccl_wait_ready(ncclComm_t comm, const tdist_backend_group_t *g, const char *gname,
                           const char *what, int64_t timeout_ms);

/* ---- the current device (nccl_device.c) -------------------------------------------- */
/*
 * Caller threads (init, split, shrink, destroy, submit, wait_stream): make
 * `dev` the calling thread's device for a span of CUDA calls, then put the
 * caller's own device back, as NCCL's entry points do (enqueue.cc,
 * group.cc: cudaGetDevice, cudaSetDevice, ..., cudaSetDevice(saved)). The
 * device is not put back when it has no primary context in this process:
 * setting it would create one (about 0.5 GiB on an H100), which PyTorch's
 * MaybeSetDevice avoids the same way. enter returns 0 or the CUDA error.
 */
typedef struct tdist__nccl_dev {
  int saved;    /* the caller's device */
  int switched; /* enter changed it */
} tdist__nccl_dev_t;
int tdist__nccl_dev_enter(int dev, tdist__nccl_dev_t *g);
void tdist__nccl_dev_leave(const tdist__nccl_dev_t *g);

/* How long a peer failure NCCL saw first (ncclRemoteError) may stand before
 * it is reported unnamed: poll, and a submit whose enqueue it broke, leave
 * the monitor that long to name the dead rank (its death record). */
TDIST_PARAM(NcclRemoteGraceMs, "TDIST_NCCL_REMOTE_GRACE_MS", 1000)

/* How long submit polls (ncclCommGetAsyncError between yields, no sleep)
 * for NCCL's job thread to finish an enqueue before it returns with the op
 * `launching` (µs). NCCL's job usually ends within tens of µs; recording the
 * end event in submit then keeps completion as quick as the raw calls'. */
TDIST_PARAM(NcclLaunchSpinUs, "TDIST_NCCL_LAUNCH_SPIN_US", 200)

/* Threads tdist owns (progress thread, abort threads): `dev` current and
 * the thread's capture mode relaxed, so that its event queries neither make
 * a context on device 0 nor fail during a user's graph capture (PyTorch's
 * watchdog does both). Cached per thread: cheap when nothing changes. */
int tdist__nccl_dev_own(int dev);

/* Mappings (return -1 for values NCCL lacks). */
int tdist__nccl_dtype(tdist_dtype_t dt, ncclDataType_t *out);
int tdist__nccl_redop(tdist_redop_t op, ncclRedOp_t *out);

/* Caller thread: fail nc's group as the progress thread's tdist_backend_fail
 * would (which only that thread may call): run there, and wait for it. */
void tdist__nccl_fail_group(tdist__nccl_t *nc, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* mu held: the state is dead (no new ops) and its launched ops forgotten
 * (unlinked; the core fails them). nccl_progress.c. */
void tdist__nccl_forget_locked(tdist__nccl_t *nc);

/* Caller thread: take `call` for NCCL calls on nc->comm. Contention (another
 * caller's call, an abort thread's barrier) is waited out, but never past
 * the state's death: 0 with `call` held and nc alive, else TDIST_ERR_ABORTED
 * (not held). nccl_progress.c. */
int tdist__nccl_call_enter(tdist__nccl_t *nc, const char *what);

/* `call` held, nc's device current, the communicator ready (its last
 * ncclCommGetAsyncError said ncclSuccess): record the end event of the
 * `launching` op, if any, and destroy its PreMulSum. 0 or the CUDA error.
 * Any thread that holds `call` (poll's trylock included). nccl_progress.c. */
int tdist__nccl_launch_done(tdist__nccl_t *nc);

/* Caller thread, `call` held, nc's device current: if an op is
 * `launching`, wait until NCCL finished its enqueue (launch_done), giving
 * up when the group aborts -- the launching op's timeout does that, naming
 * who never came -- or, as a last resort, 5 s past that op's deadline. 0;
 * TDIST_ERR_ABORTED; or the failure (that last resort, an NCCL error, a
 * peer gone) with its message, which the caller must fail the group with
 * once `call` is released. */
int tdist__nccl_settle_launch(tdist__nccl_t *nc);

/* ---- a group's state (nccl_state.c), caller thread --------------------------------- */
/* A non-blocking config named `name` (copied by NCCL during init). */
void tdist__nccl_config(ncclConfig_t *cfg, const char *name);
/* nccl_comm.c: the options of a new group -- `own` (its caller's, may be
 * NULL) over `inherited` (its parent's, NULL for a world) -- checked
 * (INVALID_ARGUMENT / NOT_SUPPORTED naming the field) into nc->knobs,
 * and written into cfg. */
int tdist__nccl_knobs(tdist__nccl_t *nc, const tdist_nccl_opts_t *own,
                      const tdist_nccl_opts_t *inherited, ncclConfig_t *cfg);
/* nccl_mem.c, caller thread: the vtable's mem_register/mem_deregister, and
 * destroy's release of what the user left (`call` not held, comm live). */
int tdist__nccl_mem_register(void *state, void *ptr, size_t bytes, unsigned flags, void **handle);
int tdist__nccl_mem_deregister(void *state, void *handle);
int tdist__nccl_mem_alloc(void *state, size_t bytes, void **ptr);
int tdist__nccl_mem_free(void *state, void *ptr);
void tdist__nccl_mem_release_all(tdist__nccl_t *nc);
/* A zeroed state for a group of p on `device`; no CUDA object yet. */
int tdist__nccl_state_new(int device, const tdist_backend_params_t *p, tdist__nccl_t **out);
/* The device current: create the streams, the start event and the scratch. */
int tdist__nccl_state_setup(tdist__nccl_t *nc);
/* The state set up, comm ready: make NCCL's connections now (a one-float
 * all_reduce), so a rank that never came shows as a timed-out op. */
int tdist__nccl_connect_now(tdist__nccl_t *nc, ncclComm_t comm);
/* Publish nc, with its communicator, as the new group's state. */
void tdist__nccl_state_publish(tdist__nccl_t *nc, ncclComm_t comm, tdist_backend_out_t *out);
/* Free what new, setup and the event pool made; comm gone, no job pending. */
void tdist__nccl_state_free(tdist__nccl_t *nc);
/* mu held: wait (within nc->timeout_ms) for the worker's abort jobs to end. */
int tdist__nccl_wait_jobs(tdist__nccl_t *nc);

/* Event pool, mu held. get may create an event (caller thread, `call` held). */
int tdist__nccl_event_get(tdist__nccl_t *nc, cudaEvent_t *ev);
void tdist__nccl_event_put(tdist__nccl_t *nc, cudaEvent_t ev);

/* Vtable entries (tdist/backend.h), by file:
 *   nccl_comm.c     init, split, shrink                (caller thread)
 *   nccl_state.c    destroy                            (caller thread)
 *   nccl_ops.c      submit (nccl_capture.c under capture) (caller thread)
 *   nccl_progress.c post, poll, abort                  (progress thread)
 *                   wait_stream                        (caller thread)
 *                   test                               (any caller thread) */
int tdist__nccl_init(const tdist_backend_params_t *p, tdist_backend_out_t *out);
int tdist__nccl_split(const tdist_backend_params_t *p, tdist_backend_out_t *out);
int tdist__nccl_shrink(const tdist_backend_params_t *p, tdist_backend_out_t *out);
int tdist__nccl_destroy(void *state);
int tdist__nccl_submit(void *state, tdist_backend_op_t *op);
int tdist__nccl_post(void *state, tdist_backend_op_t *op);
int tdist__nccl_poll(void *state);
void tdist__nccl_abort(void *state, int status, const char *reason, int local);
int tdist__nccl_wait_stream(void *state, tdist_backend_op_t *op, void *stream);
int tdist__nccl_test(void *state, tdist_backend_op_t *op, unsigned flags);

/* ---- point-to-point communicators per pair of peers (nccl_p2p.c) ------------------- */
/* Caller thread (submit): the state of the direction this rank -> `peer`
 * (send) or `peer` -> this rank (!send), made on first use,
 * whose setup thread then makes its communicator. 0 and *out, or the
 * error (group aborted, no memory, no thread). */
int tdist__nccl_pair_get(tdist__nccl_t *nc, int peer, int send, tdist__nccl_t **out);
/* Caller thread (destroy), no lock held: stop and join every pair's setup
 * thread, finalize or abort its communicator, free it. 0 or the first error. */
int tdist__nccl_pairs_destroy(tdist__nccl_t *nc);
/* Progress thread (abort): the pairs dead, their ops forgotten, under each
 * pair's mu. Returns how many have a communicator for the abort thread. */
int tdist__nccl_pairs_forget(tdist__nccl_t *nc);
/* Abort thread: ncclCommAbort every pair's communicator (a barrier on its
 * `call` first, as for the main one). */
void tdist__nccl_pairs_abort(tdist__nccl_t *nc);
/* Progress thread: poll every pair (tdist__nccl_poll on each). */
int tdist__nccl_pairs_poll(tdist__nccl_t *nc);
/* Setup thread, the pair's `call` held, its device current: launch `op`
 * (pending until now) on the pair (nccl_ops.c). *doomed as submit's. */
int tdist__nccl_launch_pending(tdist__nccl_t *pc, tdist_backend_op_t *op, int *doomed);
/* Does the op go on a pair communicator? (a send or recv to another rank) */
int tdist__nccl_is_pair_op(const tdist__nccl_t *nc, const tdist_backend_args_t *a);
/* Poll one state (main or pair): tdist__nccl_poll's body. */
int tdist__nccl_poll_one(tdist__nccl_t *nc);

/* ---- variable-size collectives (nccl_ops_v.c), caller thread, `call` held ---------- */
/* The NCCL calls of a v-op (tdist_backend_op_is_v) on stream s, in one NCCL group. */
ncclResult_t tdist__nccl_launch_v(tdist__nccl_t *nc, const tdist_backend_args_t *a,
                                  ncclDataType_t dt, ncclRedOp_t op, cudaStream_t s);
/* nccl_ops.c, `call` held: the op's NCCL calls on stream s, inside an NCCL
 * group (one of ours, or the v-op's and batch's own). */
ncclResult_t tdist__nccl_launch_on(tdist__nccl_t *nc, const tdist_backend_args_t *a,
                                   ncclDataType_t dt, ncclRedOp_t op, cudaStream_t s);
/* nccl_ops.c: the PREMUL_SUM factor in the op's own type (8 bytes at most). */
void tdist__nccl_premul_scalar(tdist_dtype_t dt, double s, void *out);

/* ---- CUDA graph capture (nccl_capture.c), caller thread ---------------------------- */
/* The device current: is the op's stream capturing? *capturing = 1 for an
 * active capture that this backend can capture into; 0 when not capturing.
 * TDIST_ERR_NOT_SUPPORTED for an op kind that cannot be captured or a CUDA
 * runtime without the capture calls; TDIST_ERR_CUDA_ERROR for an
 * invalidated capture. */
int tdist__nccl_capture_check(const tdist__nccl_t *nc, const tdist_backend_args_t *a,
                              int *capturing);
/* `call` held, the device current, no enqueue in progress: capture the op's
 * NCCL calls into the caller's graph (fork from its stream, join back),
 * the graph holding nc. TDIST_BACKEND_CAPTURED, or an error; *doomed as
 * for an enqueue (the caller fails the group). */
int tdist__nccl_capture_locked(tdist__nccl_t *nc, tdist_backend_op_t *op, ncclDataType_t dt,
                               ncclRedOp_t rop, int *doomed);
/* nccl_state.c: destroy's work, now (nc no longer held by any graph). */
int tdist__nccl_destroy_now(tdist__nccl_t *nc);
/* submit's buffer check for a v-op: every non-empty block's buffer is device
 * memory (tdist__nccl_check_ptr, nccl_ops.c). */
int tdist__nccl_check_v(const tdist__nccl_t *nc, const tdist_backend_args_t *a);
int tdist__nccl_check_ptr(const tdist__nccl_t *nc, const void *ptr, const char *what,
                          tdist_optype_t t);

/* util/memkind.h's classifier (nccl_ops.c), registered by tdist__nccl_load. */
int tdist__nccl_memkind(const void *ptr);

#endif
