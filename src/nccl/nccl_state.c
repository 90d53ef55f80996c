/*
 * nccl_state.c - a NCCL group's state and its end: the error conversions at
 * the backend's boundary (tdist__nccl_err, tdist__cuda_err), the
 * ncclInProgress poll every non-blocking call goes through, the per-group
 * state (streams, start event, scratch, the event pool) made and freed for
 * init, split and shrink (nccl_comm.c), destroy (finalize, then destroy,
 * abort on failure), and the backend's description for the core's table.
 *
 * Threads: everything here runs on a caller thread (tdist/backend.h) and may
 * block within the group's timeout, except the event pool, which the
 * submitting caller uses under nc->mu. Destroy first waits for the worker
 * job of a progress-thread abort (nccl_progress.c) before it frees.
 */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nccl/nccl_backend.h"
#include "util/alloc.h"
#include "util/clock.h"
#include "util/param.h"

/* How long a ncclInProgress poll sleeps between two checks (µs): short, as
 * init and enqueue usually finish within microseconds to milliseconds. */
TDIST_PARAM(NcclPollSleepUs, "TDIST_NCCL_POLL_SLEEP_US", 20)

int tdist__nccl_err(ncclComm_t comm, ncclResult_t r, const char *what) {
  const char *last = comm ? ncclGetLastError(comm) : ncclGetLastError(NULL);
  /* A peer gone (NCCL's proxy or bootstrap saw its connection close) is a
   * peer failure, on every path (issue 24 #8), not an NCCL fault. */
  int code = r == ncclRemoteError ? TDIST_ERR_REMOTE_FAILED : TDIST_ERR_NCCL_ERROR;
  return tdist__error(code, "%s failed: %s%s%s", what, ncclGetErrorString(r),
                      last && *last ? ": " : "", last ? last : "");
}

int tdist__cuda_err(cudaError_t e, const char *what) {
  return tdist__error(TDIST_ERR_CUDA_ERROR, "%s failed: %s (%s)", what, cudaGetErrorString(e),
                      cudaGetErrorName(e));
}

int tdist__nccl_wait_ready(ncclComm_t comm, const tdist_backend_group_t *g, const char *gname,
                           const char *what, int64_t timeout_ms) {
  int64_t deadline = tdist__now_ns() + timeout_ms * 1000000;
  int64_t sleep_ns = tdist__param_NcclPollSleepUs() * 1000;
  for (int turn = 0;; turn++) {
    ncclResult_t st = ncclInProgress;
    ncclResult_t r = ncclCommGetAsyncError(comm, &st);
    if (r != ncclSuccess) return tdist__nccl_err(comm, r, "ncclCommGetAsyncError");
    if (st == ncclSuccess) return 0;
    if (st != ncclInProgress)
      return tdist__error(st == ncclRemoteError ? TDIST_ERR_REMOTE_FAILED : TDIST_ERR_NCCL_ERROR,
                          "%s for group '%s': %s: %s", what, gname, ncclGetErrorString(st),
                          ncclGetLastError(comm));
    /* The abort thread waits until our caller leaves `call`: give up at
     * once so it waits at most one turn. */
    if (g && tdist_backend_aborted(g))
      return tdist__error(TDIST_ERR_ABORTED, "%s for group '%s': group aborted", what, gname);
    if (tdist__now_ns() >= deadline)
      return tdist__error(TDIST_ERR_TIMEOUT, "%s for group '%s' timed out after %lld ms", what,
                          gname, (long long)timeout_ms);
    /* NCCL's job thread usually ends within microseconds: yield a few
     * turns before sleeping. */
    if (turn < 32) {
      sched_yield();
    } else if (sleep_ns > 0) {
      struct timespec ts = {0, (long)sleep_ns};
      nanosleep(&ts, NULL);
    }
  }
}

/* A non-blocking config named `name` (copied by NCCL during init). */
void tdist__nccl_config(ncclConfig_t *cfg, const char *name) {
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  c.blocking = 0;
  c.commName = name;
  *cfg = c;
}

/* ---- per-group state ------------------------------------------------------------ */

/* Create the stream, start event and barrier scratch on nc->device. */
int tdist__nccl_state_setup(tdist__nccl_t *nc) {
  int rc = 0; /* the caller made nc->device current */
  if (nc->knobs.mask & TDIST_NCCL_FIELD_HIGH_PRIORITY && nc->knobs.high_priority) {
    /* torch's TORCH_NCCL_HIGH_PRIORITY: the device's greatest priority
     * (the lowest number of cudaDeviceGetStreamPriorityRange). The
     * functions were checked present by tdist__nccl_knobs. */
    int least = 0, greatest = 0;
    CUDACHECKGOTO(cudaDeviceGetStreamPriorityRange(&least, &greatest), rc, fail);
    CUDACHECKGOTO(cudaStreamCreateWithPriority(&nc->stream, cudaStreamNonBlocking, greatest), rc,
                  fail);
  } else {
    CUDACHECKGOTO(cudaStreamCreateWithFlags(&nc->stream, cudaStreamNonBlocking), rc, fail);
  }
  CUDACHECKGOTO(cudaStreamCreateWithFlags(&nc->notify, cudaStreamNonBlocking), rc, fail);
  CUDACHECKGOTO(cudaEventCreateWithFlags(&nc->start_ev, cudaEventDisableTiming), rc, fail);
  /* Stream-ordered, so freeing it at destroy never synchronises the device. */
  /* Two floats: barrier's all_reduce uses the first; a pair's connecting
   * send and receive (nccl_p2p.c) one each. */
  CUDACHECKGOTO(cudaMallocAsync(&nc->scratch, 2 * sizeof(float), nc->stream), rc, fail);
  CUDACHECKGOTO(cudaMemsetAsync(nc->scratch, 0, 2 * sizeof(float), nc->stream), rc, fail);
fail:
  return rc;
}

/* The device current, the state set up, comm ready: make NCCL's runtime
 * connection for collectives now, with a one-float all_reduce that every
 * rank of the new group runs as it is created. NCCL (2.22 and later)
 * connects at a communicator's first collective, inside the enqueue, which
 * blocks until every rank arrives; a rank that never came would then stall
 * the first op's submit, where the core cannot tell who is missing. With
 * the connection made here, a late rank shows as an op in flight, which the
 * watchdog times out naming it. */
int tdist__nccl_connect_now(tdist__nccl_t *nc, ncclComm_t comm) {
  int rc = 0;
  ncclResult_t r =
      ncclAllReduce(nc->scratch, nc->scratch, 1, ncclFloat32, ncclSum, comm, nc->stream);
  if (r != ncclSuccess && r != ncclInProgress)
    rc = tdist__nccl_err(comm, r, "ncclAllReduce (connecting)");
  else
    rc = tdist__nccl_wait_ready(comm, nc->group, nc->name, "the first all_reduce (connecting)",
                                nc->timeout_ms);
  return rc;
}

/* Release what state_setup and the event pool made; comm must be gone and no
 * worker job pending. */
void tdist__nccl_state_free(tdist__nccl_t *nc) {
  if (!nc) return;
  tdist__nccl_dev_t dev = {0, 0};
  if (nc->device >= 0) tdist__nccl_dev_enter(nc->device, &dev);
  if (nc->scratch && nc->stream) cudaFreeAsync(nc->scratch, nc->stream);
  for (int i = 0; i < nc->nall; i++)
    cudaEventDestroy(nc->all[i]);
  if (nc->start_ev) cudaEventDestroy(nc->start_ev);
  /* Capture's (nccl_capture.c): no capture uses them once no graph holds nc. */
  if (nc->cap_fork) cudaEventDestroy(nc->cap_fork);
  if (nc->cap_join) cudaEventDestroy(nc->cap_join);
  for (int i = 0; i < nc->ncap; i++)
    cudaStreamDestroy(nc->capst[i]);
  /* Destroying a stream with work pending is allowed: CUDA releases it once
   * the work is done (or never, for a kernel that never ends). */
  if (nc->stream) cudaStreamDestroy(nc->stream);
  if (nc->notify) cudaStreamDestroy(nc->notify);
  tdist__nccl_dev_leave(&dev);
  tdist__nccl_mem_release_all(nc); /* comm gone: our records only */
  tdist__free(nc->all);
  tdist__free(nc->free);
  tdist__free(nc->pairs);
  pthread_cond_destroy(&nc->idle);
  pthread_mutex_destroy(&nc->mu);
  pthread_mutex_destroy(&nc->call);
  tdist__free(nc);
}

int tdist__nccl_state_new(int device, const tdist_backend_params_t *p, tdist__nccl_t **out) {
  tdist__nccl_t *nc = tdist__calloc(1, sizeof(*nc));
  if (!nc) return tdist__error(TDIST_ERR_NO_MEMORY, "cannot allocate NCCL group state");
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* destroy's timed wait */
  pthread_cond_init(&nc->idle, &ca);
  pthread_condattr_destroy(&ca);
  pthread_mutex_init(&nc->mu, NULL);
  pthread_mutex_init(&nc->call, NULL);
  tdist__list_init(&nc->inflight);
  tdist__list_init(&nc->pending);
  nc->store = p->store; /* the pairs' ids (nccl_p2p.c) */
  nc->uid = p->uid;
  nc->device = device;
  nc->group = p->group;
  nc->progress = p->progress;
  nc->rank = p->rank; /* the v-ops' loops over peers (nccl_ops_v.c) */
  nc->size = p->size;
  nc->timeout_ms = p->timeout_ms;
  snprintf(nc->name, sizeof(nc->name), "%s", p->name ? p->name : "?");
  *out = nc;
  return 0;
}

/* Publish nc, with its communicator, as the new group's state. */
void tdist__nccl_state_publish(tdist__nccl_t *nc, ncclComm_t comm, tdist_backend_out_t *out) {
  nc->comm = comm;
  out->state = nc;
  out->needs_poll = 1;
  out->device = nc->device;
}

int tdist__nccl_event_get(tdist__nccl_t *nc, cudaEvent_t *ev) {
  int rc = 0;
  if (nc->nfree > 0) {
    *ev = nc->free[--nc->nfree];
    return 0;
  }
  if (nc->nall == nc->cap) {
    int cap = nc->cap ? nc->cap * 2 : 64;
    cudaEvent_t *all = tdist__realloc(nc->all, sizeof(*all) * (size_t)cap);
    if (!all) return tdist__error(TDIST_ERR_NO_MEMORY, "cannot grow the NCCL event pool");
    nc->all = all;
    cudaEvent_t *fr = tdist__realloc(nc->free, sizeof(*fr) * (size_t)cap);
    if (!fr) return tdist__error(TDIST_ERR_NO_MEMORY, "cannot grow the NCCL event pool");
    nc->free = fr;
    nc->cap = cap;
  }
  CUDACHECKGOTO(cudaEventCreateWithFlags(ev, cudaEventDisableTiming), rc, fail);
  nc->all[nc->nall++] = *ev;
fail:
  return rc;
}

void tdist__nccl_event_put(tdist__nccl_t *nc, cudaEvent_t ev) {
  /* free has room for every event ever created, so this cannot overflow. */
  nc->free[nc->nfree++] = ev;
}

/* ---- destroy -------------------------------------------------------------------- */

int tdist__nccl_wait_jobs(tdist__nccl_t *nc) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  int64_t ns = (int64_t)ts.tv_nsec + (nc->timeout_ms > 0 ? nc->timeout_ms : 0) * 1000000;
  ts.tv_sec += (time_t)(ns / 1000000000);
  ts.tv_nsec = (long)(ns % 1000000000);
  while (nc->jobs > 0) {
    if (nc->timeout_ms <= 0) {
      pthread_cond_wait(&nc->idle, &nc->mu);
    } else if (pthread_cond_timedwait(&nc->idle, &nc->mu, &ts) == ETIMEDOUT && nc->jobs > 0) {
      return tdist__error(TDIST_ERR_TIMEOUT,
                          "group '%s': ncclCommAbort still running after %lld ms; its state is "
                          "left allocated",
                          nc->name, (long long)nc->timeout_ms);
    }
  }
  return 0;
}

/* A group whose ops CUDA graphs captured (nccl_capture.c) is destroyed for
 * tdist at once, but its state -- the communicator above all, which the
 * graphs' kernels use at every launch -- is destroyed only when the last of
 * those graphs is released (tdist__nccl_destroy_now, then, on the worker
 * thread). */
int tdist__nccl_destroy(void *state) {
  tdist__nccl_t *nc = state;
  if (!nc) return 0;
  pthread_mutex_lock(&nc->mu);
  /* The core frees its group once this returns, also when graphs keep nc:
   * an abort thread, which calls back into that group
   * (tdist_backend_released), ends first. One that outlives the wait is
   * detached from the group. */
  int rc = tdist__nccl_wait_jobs(nc);
  if (rc != 0) {
    nc->detached = 1;
    while (nc->telling) /* abort_main signals `idle` as it clears it */
      pthread_cond_wait(&nc->idle, &nc->mu);
  }
  int graphs = nc->graphs;
  if (graphs > 0) nc->orphaned = 1;
  pthread_mutex_unlock(&nc->mu);
  if (rc != 0) {
    /* The abort thread still uses nc: leak it rather than free it under
     * the thread (destroy_now's rule). */
    TDIST_WARN(NCCL, "%s", tdist_last_error());
    return rc;
  }
  if (graphs > 0) {
    TDIST_INFO(NCCL,
               "group '%s' destroyed while %d CUDA graph%s that captured its ops exist: its "
               "communicator is destroyed with the last of them",
               nc->name, graphs, graphs > 1 ? "s" : "");
    return 0;
  }
  return tdist__nccl_destroy_now(nc);
}

int tdist__nccl_destroy_now(tdist__nccl_t *nc) {
  int rc = 0;
  pthread_mutex_lock(&nc->mu);
  rc = tdist__nccl_wait_jobs(nc);
  pthread_mutex_unlock(&nc->mu);
  if (rc != 0) {
    /* The abort thread still uses nc: leak it rather than free it under
     * the thread. */
    TDIST_WARN(NCCL, "%s", tdist_last_error());
    return rc;
  }
  /* The pairs' communicators first (nccl_p2p.c): their setup threads
   * stopped and joined, each finalized like the group's own. */
  int prc = tdist__nccl_pairs_destroy(nc);
  /* No abort thread any more and no op in flight: `call` is free but for a
   * caller's test, which holds it for a moment. */
  pthread_mutex_lock(&nc->call);
  pthread_mutex_lock(&nc->mu);
  ncclComm_t comm = nc->comm;
  int dead = nc->dead;
  nc->dead = 1; /* a late abort finds nothing to do */
  pthread_mutex_unlock(&nc->mu);
  tdist__nccl_dev_t dev = {0, 0};
  if (comm) tdist__nccl_dev_enter(nc->device, &dev);
  if (comm && !dead) tdist__nccl_mem_release_all(nc); /* what the user left registered */
  if (comm && !dead) {
    ncclResult_t r = ncclCommFinalize(comm);
    if (r != ncclSuccess && r != ncclInProgress)
      rc = tdist__nccl_err(comm, r, "ncclCommFinalize");
    else
      rc = tdist__nccl_wait_ready(comm, NULL, nc->name, "ncclCommFinalize", nc->timeout_ms);
    if (rc == 0) {
      r = ncclCommDestroy(comm);
      if (r != ncclSuccess && r != ncclInProgress) {
        rc = tdist__nccl_err(NULL, r, "ncclCommDestroy");
        TDIST_WARN(NCCL, "group '%s': %s", nc->name, tdist_last_error());
      }
    } else {
      TDIST_WARN(NCCL, "group '%s': %s; aborting the communicator", nc->name, tdist_last_error());
      ncclCommAbort(comm);
    }
  } else if (comm) { /* dead, its abort thread never started: abort frees it */
    ncclCommAbort(comm);
  }
  tdist__nccl_dev_leave(&dev);
  pthread_mutex_lock(&nc->mu);
  nc->comm = NULL;
  pthread_mutex_unlock(&nc->mu);
  pthread_mutex_unlock(&nc->call);
  tdist__nccl_state_free(nc);
  return rc != 0 ? rc : prc;
}

/* ---- the backend ------------------------------------------------------------------ */

static const tdist_backend_ops_t nccl_ops = {
    .init = tdist__nccl_init,
    .split = tdist__nccl_split,
    .shrink = tdist__nccl_shrink,
    .submit = tdist__nccl_submit,
    .post = tdist__nccl_post,
    .poll = tdist__nccl_poll,
    .abort = tdist__nccl_abort,
    .destroy = tdist__nccl_destroy,
    .wait_stream = tdist__nccl_wait_stream,
    .test = tdist__nccl_test,
    .mem_register = tdist__nccl_mem_register,
    .mem_deregister = tdist__nccl_mem_deregister,
    .mem_alloc = tdist__nccl_mem_alloc,
    .mem_free = tdist__nccl_mem_free,
};

#define BIT(x) (1u << (x))

const tdist_backend_t tdist__nccl_backend = {
    .abi_version = TDIST_BACKEND_ABI_VERSION,
    .name = "nccl",
    .ops = &nccl_ops,
    .caps =
        {
            .mem = TDIST_BACKEND_MEM_DEVICE,
            .ops = TDIST_BACKEND_ALL_OPS,
            /* What tdist__nccl_dtype maps. NCCL has no bool, int16 or uint16, so
             * the core refuses them (NOT_SUPPORTED) before submit; the float8
             * types also need NCCL 2.24, checked at submit (nccl_ops.c). */
            .dtypes = BIT(TDIST_INT8) | BIT(TDIST_UINT8) | BIT(TDIST_INT32) | BIT(TDIST_INT64) |
                      BIT(TDIST_UINT32) | BIT(TDIST_UINT64) | BIT(TDIST_FLOAT16) |
                      BIT(TDIST_BFLOAT16) | BIT(TDIST_FLOAT32) | BIT(TDIST_FLOAT64) |
                      BIT(TDIST_FLOAT8_E4M3) | BIT(TDIST_FLOAT8_E5M2),
            /* tdist__nccl_redop, plus PREMUL_SUM made per op (nccl_ops.c). No
             * BAND/BOR/BXOR: NCCL has no bitwise reductions. */
            .redops = BIT(TDIST_SUM) | BIT(TDIST_PROD) | BIT(TDIST_MIN) | BIT(TDIST_MAX) |
                      BIT(TDIST_AVG) | BIT(TDIST_PREMUL_SUM),
            .shrink = 1,
            .stream_wait = 1,
            .wakes = 1, /* nccl_ops.c: a host function after each end event */
        },
};

/* The entry the core's registry calls, as it calls a plug-in's
 * tdist_backend_plugin (tdist/backend.h). */
const tdist_backend_t *tdist__nccl_plugin(void) { return &tdist__nccl_backend; }
