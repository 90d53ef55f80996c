/*
 * fake_nccl.c - see fake_nccl.h. Built as a shared library exporting the
 * NCCL and CUDA runtime names the backend looks up with dlsym.
 *
 * Log fields per call: a = count (ops), color (split), nranks (init), peer
 * (send/recv), datatype in b; for ncclRedOpCreatePreMulSum b = datatype and
 * `scalar` the factor read as that type; ops with a reduction put it in
 * `scalar` as (double)op.
 */
#include "fake_nccl.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct ncclComm {
  int used, dead; /* dead: aborted or destroyed */
  int busy;       /* GetAsyncError answers InProgress this many more times */
  atomic_int in_call;
  int rank, nranks;
};
struct CUstream_st {
  int id; /* streams created by the backend (its internal ones) */
};
struct CUevent_st {
  int used, recorded, done;
  int internal;        /* last recorded on a stream the backend created */
  unsigned long order; /* record order, for fake_complete_events */
};

#define MAX_COMMS 64
#define MAX_STREAMS 64
#define MAX_EVENTS 4096
#define MAX_LOG 8192

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct ncclComm comms[MAX_COMMS];
static struct CUstream_st streams[MAX_STREAMS];
static struct CUevent_st events[MAX_EVENTS];
static int nstreams;
static unsigned long record_seq;
static fake_script_t script;
static fake_call_t logv[MAX_LOG];
static int nlog;
static atomic_int violations;
static ncclResult_t async_err = ncclSuccess;
static char async_text[128];
static int init_id_ok;
static int next_premul = 100;
static int ndevices = 1;
static cudaError_t devices_err = cudaSuccess;
static const char *host_lo, *host_hi;

void fake_reset(void) {
  pthread_mutex_lock(&mu);
  memset(comms, 0, sizeof(comms));
  memset(streams, 0, sizeof(streams));
  memset(events, 0, sizeof(events));
  nstreams = 0;
  record_seq = 0;
  memset(&script, 0, sizeof(script));
  nlog = 0;
  atomic_store(&violations, 0);
  async_err = ncclSuccess;
  async_text[0] = '\0';
  init_id_ok = 0;
  ndevices = 1;
  devices_err = cudaSuccess;
  host_lo = host_hi = NULL;
  pthread_mutex_unlock(&mu);
}

void fake_set_devices(int n, cudaError_t err) {
  pthread_mutex_lock(&mu);
  ndevices = n;
  devices_err = err;
  pthread_mutex_unlock(&mu);
}

void fake_mark_host(const void *p, size_t len) {
  pthread_mutex_lock(&mu);
  host_lo = len ? p : NULL;
  host_hi = len ? (const char *)p + len : NULL;
  pthread_mutex_unlock(&mu);
}

void fake_set_script(const fake_script_t *s) {
  pthread_mutex_lock(&mu);
  script = *s;
  pthread_mutex_unlock(&mu);
}

void fake_set_async_error(ncclResult_t err, const char *text) {
  pthread_mutex_lock(&mu);
  async_err = err;
  snprintf(async_text, sizeof(async_text), "%s", text);
  pthread_mutex_unlock(&mu);
}

static int is_internal(cudaStream_t s) { return s >= &streams[0] && s < &streams[MAX_STREAMS]; }

void fake_complete_events(int n) {
  pthread_mutex_lock(&mu);
  while (n != 0) {
    struct CUevent_st *best = NULL;
    for (int i = 0; i < MAX_EVENTS; i++) {
      struct CUevent_st *e = &events[i];
      if (e->used && e->recorded && !e->done && e->internal && (!best || e->order < best->order))
        best = e;
    }
    if (!best) break;
    best->done = 1;
    if (n > 0) n--;
  }
  pthread_mutex_unlock(&mu);
}

int fake_log_size(void) {
  pthread_mutex_lock(&mu);
  int n = nlog;
  pthread_mutex_unlock(&mu);
  return n;
}

fake_call_t fake_log_get(int i) {
  fake_call_t c;
  memset(&c, 0, sizeof(c));
  pthread_mutex_lock(&mu);
  if (i >= 0 && i < nlog) c = logv[i];
  pthread_mutex_unlock(&mu);
  return c;
}

int fake_count(const char *name) {
  int n = 0;
  pthread_mutex_lock(&mu);
  for (int i = 0; i < nlog; i++)
    n += strcmp(logv[i].name, name) == 0;
  pthread_mutex_unlock(&mu);
  return n;
}

int fake_find(const char *name, int from) {
  int r = -1;
  pthread_mutex_lock(&mu);
  for (int i = from < 0 ? 0 : from; i < nlog && r < 0; i++)
    if (strcmp(logv[i].name, name) == 0) r = i;
  pthread_mutex_unlock(&mu);
  return r;
}

int fake_violations(void) { return atomic_load(&violations); }

int fake_last_init_id_ok(void) {
  pthread_mutex_lock(&mu);
  int ok = init_id_ok;
  pthread_mutex_unlock(&mu);
  return ok;
}

/* mu held */
static void logc(const char *name, void *comm, void *stream, void *event, long a, long b,
                 double scalar) {
  if (nlog >= MAX_LOG) return;
  fake_call_t *c = &logv[nlog++];
  snprintf(c->name, sizeof(c->name), "%s", name);
  c->comm = comm;
  c->stream = stream;
  c->event = event;
  c->a = a;
  c->b = b;
  c->scalar = scalar;
}

static struct ncclComm *comm_new(int rank, int nranks, int busy) {
  for (int i = 0; i < MAX_COMMS; i++)
    if (!comms[i].used) {
      memset(&comms[i], 0, sizeof(comms[i]));
      comms[i].used = 1;
      comms[i].rank = rank;
      comms[i].nranks = nranks;
      comms[i].busy = busy;
      return &comms[i];
    }
  atomic_fetch_add(&violations, 1);
  return NULL;
}

/* The library's own (core/progress.h): 1 on its progress thread. */
int tdist__progress_on_thread(void);

/* Calls that may block (communicator creation, finalize, destroy, abort)
 * must never run on the progress thread: ncclCommAbort after an abort goes
 * to the worker thread. Any thread; without mu. */
static void not_on_progress(const char *name) {
  if (tdist__progress_on_thread()) {
    fprintf(stderr, "fake_nccl: %s on the progress thread\n", name);
    atomic_fetch_add(&violations, 1);
  }
}

/* Entry/exit of a call on a communicator: rule checks. Called without mu.
 * The ncclCommAbort of an aborted group arrives on the library's worker
 * thread: these checks are atomic or under mu, so any thread may call. */
static void enter(struct ncclComm *c, const char *name) {
  if (!c) return;
  if (atomic_fetch_add(&c->in_call, 1) != 0) {
    fprintf(stderr, "fake_nccl: concurrent calls on one communicator (%s)\n", name);
    atomic_fetch_add(&violations, 1);
  }
  pthread_mutex_lock(&mu);
  int dead = c->dead, slow = script.slow_us;
  pthread_mutex_unlock(&mu);
  if (dead) {
    fprintf(stderr, "fake_nccl: %s on an aborted/destroyed communicator\n", name);
    atomic_fetch_add(&violations, 1);
  }
  if (slow) usleep((useconds_t)slow);
}
static void leave(struct ncclComm *c) {
  if (c) atomic_fetch_sub(&c->in_call, 1);
}

/* ---- NCCL ---------------------------------------------------------------------- */

#ifdef FAKE_NCCL_OLD
#define FAKE_VERSION 22700 /* 2.27.0: no ncclCommRevoke, ncclAlltoAll, ncclGather, ncclScatter */
#else
#define FAKE_VERSION 22809 /* 2.28.9 */
#endif

/* FAKE_NCCL_VERSION (tests only) overrides the version reported. */
ncclResult_t ncclGetVersion(int *v) {
  const char *e = getenv("FAKE_NCCL_VERSION");
  *v = e ? atoi(e) : FAKE_VERSION;
  return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r) {
  switch (r) {
  case ncclSuccess: return "no error";
  case ncclSystemError: return "unhandled system error";
  case ncclInternalError: return "internal error";
  case ncclRemoteError: return "remote process exited or there was a network error";
  case ncclInProgress: return "NCCL operation in progress";
  default: return "fake NCCL error";
  }
}

/* The text is set before the error is raised and never changed while a
 * backend may read it (tests set it once per scenario). */
const char *ncclGetLastError(ncclComm_t comm) { return async_text; }

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  memset(id, 0, sizeof(*id));
  snprintf(id->internal, sizeof(id->internal), "FAKEID pid %d", (int)getpid());
  pthread_mutex_lock(&mu);
  logc("ncclGetUniqueId", NULL, NULL, NULL, 0, 0, 0);
  pthread_mutex_unlock(&mu);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t *cfg) {
  not_on_progress("ncclCommInitRankConfig");
  pthread_mutex_lock(&mu);
  int ok = strncmp(id.internal, "FAKEID pid ", 11) == 0;
  init_id_ok = ok;
  if (!cfg || cfg->blocking != 0 || !cfg->commName) atomic_fetch_add(&violations, 1);
  *comm = comm_new(rank, nranks, script.init_busy);
  logc("ncclCommInitRankConfig", *comm, NULL, NULL, nranks, rank, 0);
  pthread_mutex_unlock(&mu);
  return ok ? ncclInProgress : ncclInvalidArgument;
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                           ncclConfig_t *cfg) {
  not_on_progress("ncclCommSplit");
  enter(comm, "ncclCommSplit");
  pthread_mutex_lock(&mu);
  if (!cfg || cfg->blocking != 0) atomic_fetch_add(&violations, 1);
  *newcomm = color == NCCL_SPLIT_NOCOLOR ? NULL : comm_new(key, 0, script.split_busy);
  logc("ncclCommSplit", comm, NULL, *newcomm, color, key, 0);
  pthread_mutex_unlock(&mu);
  leave(comm);
  return ncclInProgress;
}

ncclResult_t ncclCommShrink(ncclComm_t comm, int *excl, int nexcl, ncclComm_t *newcomm,
                            ncclConfig_t *cfg, int flags) {
  not_on_progress("ncclCommShrink");
  enter(comm, "ncclCommShrink");
  pthread_mutex_lock(&mu);
  if (!cfg || cfg->blocking != 0 || comm->dead) atomic_fetch_add(&violations, 1);
  *newcomm = comm_new(comm->rank, 0, script.split_busy);
  logc("ncclCommShrink", comm, NULL, *newcomm, nexcl > 0 ? excl[0] : -1, flags, nexcl);
  pthread_mutex_unlock(&mu);
  leave(comm);
  return ncclInProgress;
}

#ifndef FAKE_NCCL_OLD
/* Revoke leaves the communicator alive but busy for a few polls. */
ncclResult_t ncclCommRevoke(ncclComm_t comm, int flags) {
  enter(comm, "ncclCommRevoke");
  pthread_mutex_lock(&mu);
  if (flags != 0) atomic_fetch_add(&violations, 1);
  comm->busy = 2;
  logc("ncclCommRevoke", comm, NULL, NULL, flags, 0, 0);
  pthread_mutex_unlock(&mu);
  leave(comm);
  return ncclSuccess;
}
#endif

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *st) {
  enter(comm, "ncclCommGetAsyncError");
  pthread_mutex_lock(&mu);
  logc("ncclCommGetAsyncError", comm, NULL, NULL, 0, 0, 0);
  if (comm && comm->busy != 0) {
    if (comm->busy > 0) comm->busy--;
    *st = ncclInProgress;
  } else {
    *st = async_err;
  }
  pthread_mutex_unlock(&mu);
  leave(comm);
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  not_on_progress("ncclCommFinalize");
  enter(comm, "ncclCommFinalize");
  pthread_mutex_lock(&mu);
  logc("ncclCommFinalize", comm, NULL, NULL, 0, 0, 0);
  comm->busy = script.finalize_busy;
  pthread_mutex_unlock(&mu);
  leave(comm);
  return ncclInProgress;
}

static ncclResult_t end_comm(ncclComm_t comm, const char *name) {
  not_on_progress(name);
  enter(comm, name);
  pthread_mutex_lock(&mu);
  logc(name, comm, NULL, NULL, 0, 0, 0);
  if (comm) comm->dead = 1;
  pthread_mutex_unlock(&mu);
  leave(comm);
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) { return end_comm(comm, "ncclCommDestroy"); }
ncclResult_t ncclCommAbort(ncclComm_t comm) { return end_comm(comm, "ncclCommAbort"); }

ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t dt,
                                      ncclScalarResidence_t res, ncclComm_t comm) {
  enter(comm, "ncclRedOpCreatePreMulSum");
  double v = 0;
  switch (dt) {
  case ncclFloat32: v = *(float *)scalar; break;
  case ncclFloat64: v = *(double *)scalar; break;
  case ncclInt32: v = *(int32_t *)scalar; break;
  case ncclInt64: v = (double)*(int64_t *)scalar; break;
  default: v = *(uint16_t *)scalar; break; /* raw bits for 16-bit and 8-bit types */
  }
  pthread_mutex_lock(&mu);
  if (res != ncclScalarHostImmediate) atomic_fetch_add(&violations, 1);
  *op = (ncclRedOp_t)next_premul++;
  logc("ncclRedOpCreatePreMulSum", comm, NULL, NULL, (long)*op, dt, v);
  pthread_mutex_unlock(&mu);
  leave(comm);
  return ncclSuccess;
}

ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  enter(comm, "ncclRedOpDestroy");
  pthread_mutex_lock(&mu);
  logc("ncclRedOpDestroy", comm, NULL, NULL, (long)op, 0, 0);
  pthread_mutex_unlock(&mu);
  leave(comm);
  return ncclSuccess;
}

static int group_depth; /* ncclGroupStart/End nesting (mu) */

/* An enqueue on comm: logged; maybe InProgress per the script. */
static ncclResult_t enqueue(const char *name, ncclComm_t comm, cudaStream_t s, long a, long b,
                            double op) {
  enter(comm, name);
  pthread_mutex_lock(&mu);
  logc(name, comm, s, NULL, a, b, op);
  ncclResult_t r = ncclSuccess;
  if (script.enqueue_returns_inprogress && group_depth == 0) {
    comm->busy = script.enqueue_busy;
    r = ncclInProgress;
  }
  pthread_mutex_unlock(&mu);
  leave(comm);
  return r;
}

ncclResult_t ncclAllReduce(const void *sb, void *rb, size_t n, ncclDataType_t dt, ncclRedOp_t op,
                           ncclComm_t c, cudaStream_t s) {
  return enqueue("ncclAllReduce", c, s, (long)n, dt, op);
}
ncclResult_t ncclBroadcast(const void *sb, void *rb, size_t n, ncclDataType_t dt, int root,
                           ncclComm_t c, cudaStream_t s) {
  return enqueue("ncclBroadcast", c, s, (long)n, dt, root);
}
ncclResult_t ncclReduce(const void *sb, void *rb, size_t n, ncclDataType_t dt, ncclRedOp_t op,
                        int root, ncclComm_t c, cudaStream_t s) {
  return enqueue("ncclReduce", c, s, (long)n, dt, op);
}
ncclResult_t ncclAllGather(const void *sb, void *rb, size_t n, ncclDataType_t dt, ncclComm_t c,
                           cudaStream_t s) {
  return enqueue("ncclAllGather", c, s, (long)n, dt, 0);
}
ncclResult_t ncclReduceScatter(const void *sb, void *rb, size_t n, ncclDataType_t dt,
                               ncclRedOp_t op, ncclComm_t c, cudaStream_t s) {
  return enqueue("ncclReduceScatter", c, s, (long)n, dt, op);
}
#ifndef FAKE_NCCL_OLD
ncclResult_t ncclAlltoAll(const void *sb, void *rb, size_t n, ncclDataType_t dt, ncclComm_t c,
                          cudaStream_t s) {
  return enqueue("ncclAlltoAll", c, s, (long)n, dt, 0);
}
#endif
#ifndef FAKE_NCCL_OLD
ncclResult_t ncclGather(const void *sb, void *rb, size_t n, ncclDataType_t dt, int root,
                        ncclComm_t c, cudaStream_t s) {
  return enqueue("ncclGather", c, s, (long)n, dt, root);
}
#endif
#ifndef FAKE_NCCL_OLD
ncclResult_t ncclScatter(const void *sb, void *rb, size_t n, ncclDataType_t dt, int root,
                         ncclComm_t c, cudaStream_t s) {
  return enqueue("ncclScatter", c, s, (long)n, dt, root);
}
#endif
ncclResult_t ncclSend(const void *b, size_t n, ncclDataType_t dt, int peer, ncclComm_t c,
                      cudaStream_t s) {
  return enqueue("ncclSend", c, s, peer, dt, (double)n);
}
ncclResult_t ncclRecv(void *b, size_t n, ncclDataType_t dt, int peer, ncclComm_t c,
                      cudaStream_t s) {
  return enqueue("ncclRecv", c, s, peer, dt, (double)n);
}

ncclResult_t ncclGroupStart(void) {
  pthread_mutex_lock(&mu);
  group_depth++;
  logc("ncclGroupStart", NULL, NULL, NULL, 0, 0, 0);
  pthread_mutex_unlock(&mu);
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
  pthread_mutex_lock(&mu);
  group_depth--;
  logc("ncclGroupEnd", NULL, NULL, NULL, 0, 0, 0);
  ncclResult_t r = ncclSuccess;
  if (script.enqueue_returns_inprogress) {
    /* The group's comm: the one of the last enqueue. */
    for (int i = nlog - 1; i >= 0; i--)
      if (logv[i].comm) {
        ((struct ncclComm *)logv[i].comm)->busy = script.enqueue_busy;
        break;
      }
    r = ncclInProgress;
  }
  pthread_mutex_unlock(&mu);
  return r;
}

/* ---- CUDA runtime ----------------------------------------------------------------- */

const char *cudaGetErrorString(cudaError_t e) {
  switch (e) {
  case cudaSuccess: return "no error";
  case cudaErrorInsufficientDriver:
    return "CUDA driver version is insufficient for CUDA runtime version";
  case cudaErrorNoDevice: return "no CUDA-capable device is detected";
  default: return "fake CUDA error";
  }
}
const char *cudaGetErrorName(cudaError_t e) {
  return e == cudaSuccess ? "cudaSuccess" : "cudaErrorFake";
}

cudaError_t cudaSetDevice(int dev) { return cudaSuccess; }

cudaError_t cudaGetLastError(void) { return cudaSuccess; }

cudaError_t cudaGetDeviceCount(int *n) {
  pthread_mutex_lock(&mu);
  cudaError_t r = devices_err;
  *n = r == cudaSuccess ? ndevices : 0;
  pthread_mutex_unlock(&mu);
  return r;
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *at, const void *p) {
  pthread_mutex_lock(&mu);
  int host = host_lo && (const char *)p >= host_lo && (const char *)p < host_hi;
  pthread_mutex_unlock(&mu);
  memset(at, 0, sizeof(*at));
  at->type = host ? cudaMemoryTypeUnregistered : cudaMemoryTypeDevice;
  at->device = host ? -1 : 0;
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
  pthread_mutex_lock(&mu);
  if (nstreams >= MAX_STREAMS) {
    pthread_mutex_unlock(&mu);
    return cudaErrorMemoryAllocation;
  }
  streams[nstreams].id = nstreams + 1;
  *s = &streams[nstreams++];
  if (!(flags & cudaStreamNonBlocking)) atomic_fetch_add(&violations, 1);
  logc("cudaStreamCreateWithFlags", NULL, *s, NULL, (long)flags, 0, 0);
  pthread_mutex_unlock(&mu);
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s) {
  pthread_mutex_lock(&mu);
  logc("cudaStreamDestroy", NULL, s, NULL, 0, 0, 0);
  pthread_mutex_unlock(&mu);
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *ev, unsigned flags) {
  pthread_mutex_lock(&mu);
  cudaError_t r = cudaErrorMemoryAllocation;
  for (int i = 0; i < MAX_EVENTS; i++)
    if (!events[i].used) {
      memset(&events[i], 0, sizeof(events[i]));
      events[i].used = 1;
      *ev = &events[i];
      r = cudaSuccess;
      break;
    }
  if (!(flags & cudaEventDisableTiming)) atomic_fetch_add(&violations, 1);
  logc("cudaEventCreateWithFlags", NULL, NULL, r == cudaSuccess ? *ev : NULL, (long)flags, 0, 0);
  pthread_mutex_unlock(&mu);
  return r;
}

cudaError_t cudaEventDestroy(cudaEvent_t ev) {
  pthread_mutex_lock(&mu);
  if (!ev->used) atomic_fetch_add(&violations, 1);
  ev->used = 0;
  logc("cudaEventDestroy", NULL, NULL, ev, 0, 0, 0);
  pthread_mutex_unlock(&mu);
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t s) {
  pthread_mutex_lock(&mu);
  if (!ev->used) atomic_fetch_add(&violations, 1);
  ev->recorded = 1;
  ev->done = script.ev_mode == FAKE_EV_AUTO;
  ev->order = ++record_seq;
  ev->internal = is_internal(s);
  logc("cudaEventRecord", NULL, s, ev, 0, 0, 0);
  pthread_mutex_unlock(&mu);
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t ev) {
  pthread_mutex_lock(&mu);
  if (!ev->used || !ev->recorded) atomic_fetch_add(&violations, 1);
  cudaError_t r = ev->done ? cudaSuccess : cudaErrorNotReady;
  pthread_mutex_unlock(&mu);
  return r; /* not logged: the progress thread queries at its own pace */
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t ev, unsigned flags) {
  pthread_mutex_lock(&mu);
  if (!ev->used || !ev->recorded) atomic_fetch_add(&violations, 1);
  logc("cudaStreamWaitEvent", NULL, s, ev, (long)flags, 0, 0);
  pthread_mutex_unlock(&mu);
  return cudaSuccess;
}

static float scratch_mem[64];

cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t s) {
  pthread_mutex_lock(&mu);
  *p = scratch_mem;
  logc("cudaMallocAsync", NULL, s, NULL, (long)n, 0, 0);
  pthread_mutex_unlock(&mu);
  return n <= sizeof(scratch_mem) ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaFreeAsync(void *p, cudaStream_t s) {
  pthread_mutex_lock(&mu);
  logc("cudaFreeAsync", NULL, s, NULL, 0, 0, 0);
  pthread_mutex_unlock(&mu);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s) { return cudaSuccess; }

/* The device calls the backend makes since it restores the caller's device
 * and reads compute capabilities: device 0, sm_90, nothing captured. */
cudaError_t cudaGetDevice(int *dev) {
  *dev = 0;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int dev) {
  *v = a == cudaDevAttrComputeCapabilityMajor ? 9 : 0;
  return cudaSuccess;
}
/* FAKE_CAPTURING_STREAM: the stream handle that reports an active capture
 * (a runtime without the capture calls: capture refused, naming them). */
cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *st) {
  *st = s == FAKE_CAPTURING_STREAM ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
  return cudaSuccess;
}
/* FAKE_CUDA_VERSION (tests only): the runtime version reported; unset, the
 * call fails, as if the runtime could not say. The capture query is
 * exported under its plain name only, with CUDA 13's signature (seven
 * arguments, edgeData_out before numDependencies_out), as libcudart.so.13
 * exports it: which signature the backend takes it for depends on the
 * version (nccl_load_cuda13, nccl_load_cuda12). Never called by a test. */
cudaError_t cudaRuntimeGetVersion(int *v) {
  const char *e = getenv("FAKE_CUDA_VERSION");
  if (!e) return cudaErrorUnknown;
  *v = atoi(e);
  return cudaSuccess;
}
cudaError_t cudaStreamGetCaptureInfo(cudaStream_t s, enum cudaStreamCaptureStatus *st,
                                     unsigned long long *id, cudaGraph_t *graph,
                                     const cudaGraphNode_t **deps, const void **edges,
                                     size_t *ndeps) {
  return cudaErrorUnknown;
}
cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *m) {
  return cudaSuccess;
}
/* The wake after each end event: the fake's events complete when a test
 * says so, and the progress thread polls them; nothing to run. */
cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *arg) { return cudaSuccess; }
