/*
 * nccl_comm.c - communicator life cycle of the NCCL backend: init (opens
 * NCCL and the CUDA runtime on first use, nccl_lib.c; checks the device;
 * unique id from rank 0 through the group's store), split (ncclCommSplit), shrink
 * (ncclCommShrink), destroy (finalize, then destroy, abort on failure), and
 * the backend's description for the core's table.
 *
 * Threads: everything here runs on a caller thread (core/backend.h) and may
 * block within the group's timeout. Every communicator is created
 * non-blocking (config.blocking = 0), so no NCCL call here can hang the
 * caller: ncclInProgress is polled with ncclCommGetAsyncError under the
 * timeout (tdist__nccl_wait_ready). The ncclCommAbort calls here (a failed
 * creation, a revoked communicator at destroy) run on the caller thread too;
 * only the progress thread's abort hands its ncclCommAbort to the worker
 * (nccl_progress.c), and destroy waits for that job before freeing.
 */
#include <errno.h>
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
  for (;;) {
    ncclResult_t st = ncclInProgress;
    ncclResult_t r = ncclCommGetAsyncError(comm, &st);
    if (r != ncclSuccess) return tdist__nccl_err(comm, r, "ncclCommGetAsyncError");
    if (st == ncclSuccess) return 0;
    if (st != ncclInProgress)
      return tdist__error(st == ncclRemoteError ? TDIST_ERR_REMOTE_FAILED : TDIST_ERR_NCCL_ERROR,
                          "%s for group '%s': %s: %s", what, gname, ncclGetErrorString(st),
                          ncclGetLastError(comm));
    /* The progress thread's abort waits for mu, which our caller holds:
     * give up at once so it waits at most one turn. */
    if (g && tdist_backend_aborted(g))
      return tdist__error(TDIST_ERR_ABORTED, "%s for group '%s': group aborted", what, gname);
    if (tdist__now_ns() >= deadline)
      return tdist__error(TDIST_ERR_TIMEOUT, "%s for group '%s' timed out after %lld ms", what,
                          gname, (long long)timeout_ms);
    if (sleep_ns > 0) {
      struct timespec ts = {0, (long)sleep_ns};
      nanosleep(&ts, NULL);
    }
  }
}

/* A non-blocking config named `name` (copied by NCCL during init). */
static void nccl_config(ncclConfig_t *cfg, const char *name) {
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  c.blocking = 0;
  c.commName = name;
  *cfg = c;
}

/* ---- per-group state ------------------------------------------------------------ */

/* Create the stream, start event and barrier scratch on nc->device. */
static int state_setup(tdist__nccl_t *nc) {
  int rc = 0; /* the caller made nc->device current */
  CUDACHECKGOTO(cudaStreamCreateWithFlags(&nc->stream, cudaStreamNonBlocking), rc, fail);
  CUDACHECKGOTO(cudaStreamCreateWithFlags(&nc->notify, cudaStreamNonBlocking), rc, fail);
  CUDACHECKGOTO(cudaEventCreateWithFlags(&nc->start_ev, cudaEventDisableTiming), rc, fail);
  /* Stream-ordered, so freeing it at destroy never synchronises the device. */
  CUDACHECKGOTO(cudaMallocAsync(&nc->scratch, sizeof(float), nc->stream), rc, fail);
  CUDACHECKGOTO(cudaMemsetAsync(nc->scratch, 0, sizeof(float), nc->stream), rc, fail);
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
static int connect_now(tdist__nccl_t *nc, ncclComm_t comm) {
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
static void state_free(tdist__nccl_t *nc) {
  if (!nc) return;
  tdist__nccl_dev_t dev = {0, 0};
  if (nc->device >= 0) tdist__nccl_dev_enter(nc->device, &dev);
  if (nc->scratch && nc->stream) cudaFreeAsync(nc->scratch, nc->stream);
  for (int i = 0; i < nc->nall; i++)
    cudaEventDestroy(nc->all[i]);
  if (nc->start_ev) cudaEventDestroy(nc->start_ev);
  /* Destroying a stream with work pending is allowed: CUDA releases it once
   * the work is done (or never, for a kernel that never ends). */
  if (nc->stream) cudaStreamDestroy(nc->stream);
  if (nc->notify) cudaStreamDestroy(nc->notify);
  tdist__nccl_dev_leave(&dev);
  tdist__free(nc->all);
  tdist__free(nc->free);
  pthread_cond_destroy(&nc->idle);
  pthread_mutex_destroy(&nc->mu);
  tdist__free(nc);
}

static int state_new(int device, const tdist_backend_params_t *p, tdist__nccl_t **out) {
  tdist__nccl_t *nc = tdist__calloc(1, sizeof(*nc));
  if (!nc) return tdist__error(TDIST_ERR_NO_MEMORY, "cannot allocate NCCL group state");
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* destroy's timed wait */
  pthread_cond_init(&nc->idle, &ca);
  pthread_condattr_destroy(&ca);
  pthread_mutex_init(&nc->mu, NULL);
  tdist__list_init(&nc->inflight);
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
static void state_publish(tdist__nccl_t *nc, ncclComm_t comm, tdist_backend_out_t *out) {
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

/* ---- init ----------------------------------------------------------------------- */

/* The devices this process sees: the user's words for what is missing
 * rather than the first CUDA call's error code. */
static int device_count(int *n) {
  *n = 0;
  cudaError_t e = cudaGetDeviceCount(n);
  if (e != cudaSuccess) {
    cudaGetLastError(); /* not sticky: leave no error for the next call */
    return tdist__error(TDIST_ERR_CUDA_ERROR, "backend 'nccl': no CUDA device: %s",
                        cudaGetErrorString(e));
  }
  if (*n <= 0)
    return tdist__error(TDIST_ERR_CUDA_ERROR, "backend 'nccl': no CUDA device: none found");
  return 0;
}

/* The device: the options' (which must exist), else the local rank as
 * torchrun, srun or mpirun set it (LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK,
 * SLURM_LOCALID: mpirun inside a Slurm step leaves every rank the same
 * SLURM_LOCALID) modulo the devices this process sees, as PyTorch does --
 * with CUDA_VISIBLE_DEVICES giving each process one GPU, every local rank
 * uses its device 0 -- else 0. */
static int pick_device(const tdist_init_opts_t *o, int n, int *device) {
  static const char *vars[] = {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"};
  *device = 0;
  if (o && (o->mask & TDIST_INIT_FIELD_DEVICE) && o->device >= 0) {
    *device = o->device;
    if (o->device >= n)
      return tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                          "backend 'nccl': CUDA device %d out of range: this process sees %d (the "
                          "device is the options' device)",
                          o->device, n);
    return 0;
  }
  for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
    const char *lr = tdist__env_raw(vars[i]);
    if (!lr) continue;
    char *end;
    long v = strtol(lr, &end, 10);
    if (*end == '\0' && v >= 0 && v < 1L << 20) {
      *device = (int)(v % n);
      return 0;
    }
    TDIST_WARN(NCCL, "ignoring %s='%s' (not a device number)", vars[i], lr);
  }
  return 0;
}

/* Every rank's compute capability, gathered: the smallest decides whether
 * NCCL reduces float8 (enqueue.cc: comm->minCompCap >= 90). */
static int exchange_cc(const tdist_backend_params_t *p, int device, int *min_cc) {
  int rc = 0, major = 0, minor = 0;
  CUDACHECKGOTO(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), rc, out);
  CUDACHECKGOTO(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device), rc, out);
  int mine = major * 10 + minor;
  *min_cc = mine;
  if (p->size == 1) return 0;
  void **vals = tdist__calloc((size_t)p->size, sizeof(*vals));
  size_t *lens = tdist__calloc((size_t)p->size, sizeof(*lens));
  if (!vals || !lens) {
    rc = tdist__error(TDIST_ERR_NO_MEMORY, "group '%s': out of memory", p->name);
  } else {
    rc = tdist_backend_allgather(p->store, "nccl_cc", p->rank, p->size, &mine, sizeof(mine), NULL,
                                 0, vals, lens, p->timeout_ms);
    for (int i = 0; rc == 0 && i < p->size; i++) {
      int cc;
      if (!vals[i] || lens[i] != sizeof(cc)) {
        rc =
            tdist__error(TDIST_ERR_PROTOCOL, "group '%s': compute capability of rank %d: %zu bytes",
                         p->name, i, lens[i]);
        break;
      }
      memcpy(&cc, vals[i], sizeof(cc));
      if (cc < *min_cc) *min_cc = cc;
    }
  }
  for (int i = 0; vals && i < p->size; i++)
    tdist_store_free(vals[i]);
  tdist__free(vals);
  tdist__free(lens);
out:
  return rc;
}

/* Rank 0 makes the unique id; everyone reads rank 0's through the group's
 * store (rank 0 waits for nobody: its `from` list is empty). */
static int exchange_id(const tdist_backend_params_t *p, const char *gname, ncclUniqueId *id) {
  int rc = 0;
  static const int from[1] = {0};
  void **vals = NULL;
  size_t *lens = NULL;
  if (p->rank == 0) NCCLCHECKGOTO(ncclGetUniqueId(id), NULL, rc, out);
  if (p->size == 1) return 0;
  vals = tdist__calloc((size_t)p->size, sizeof(*vals));
  lens = tdist__calloc((size_t)p->size, sizeof(*lens));
  if (!vals || !lens) {
    rc = tdist__error(TDIST_ERR_NO_MEMORY, "group '%s': NCCL id exchange: out of memory", gname);
    goto out;
  }
  TDIST_CHECKGOTO(tdist_backend_allgather(p->store, "nccl_id", p->rank, p->size,
                                          p->rank == 0 ? id : NULL, sizeof(*id), from,
                                          p->rank == 0 ? 0 : 1, vals, lens, p->timeout_ms),
                  rc, out);
  if (p->rank != 0) {
    if (!vals[0] || lens[0] != sizeof(*id)) {
      rc = tdist__error(TDIST_ERR_PROTOCOL, "group '%s': NCCL unique id of %zu bytes (want %zu)",
                        gname, lens[0], sizeof(*id));
      goto out;
    }
    memcpy(id, vals[0], sizeof(*id));
  }
out:
  if (vals) tdist_store_free(vals[0]);
  tdist__free(vals);
  tdist__free(lens);
  return rc;
}

/* Poll a freshly created communicator (init, split, shrink) to readiness. On
 * failure the caller aborts it, so no NCCL thread is left behind. */
static int comm_ready(ncclComm_t comm, const tdist_backend_group_t *g, const char *gname,
                      const char *what, int64_t timeout_ms) {
  int rc = tdist__nccl_wait_ready(comm, g, gname, what, timeout_ms);
  if (rc != 0) TDIST_WARN(NCCL, "%s", tdist_last_error());
  return rc;
}

static int init_on(const tdist_backend_params_t *p, int device, tdist_backend_out_t *out);

int tdist__nccl_init(const tdist_backend_params_t *p, tdist_backend_out_t *out) {
  if (p->size > 1 && !p->store)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "nccl: group '%s' of %d ranks has no store",
                        p->name, p->size);
  TDIST_CHECK(tdist__nccl_load());
  int ndev = 0, device = 0;
  TDIST_CHECK(device_count(&ndev));
  TDIST_CHECK(pick_device(p->init_opts, ndev, &device));
  return init_on(p, device, out);
}

/* A communicator of its own for the group of `p` on `device`: a fresh
 * unique id through the group's store (init, or a new group naming its
 * device: ncclCommSplit would keep the parent's). */
static int init_on(const tdist_backend_params_t *p, int device, tdist_backend_out_t *out) {
  int rc = 0;
  tdist__nccl_t *nc = NULL;
  ncclUniqueId id;
  ncclConfig_t cfg;
  ncclComm_t comm = NULL;
  tdist__nccl_dev_t dev = {0, 0};
  TDIST_CHECKGOTO(state_new(device, p, &nc), rc, fail);
  TDIST_CHECKGOTO(tdist__nccl_dev_enter(nc->device, &dev), rc, fail);
  TDIST_CHECKGOTO(exchange_id(p, nc->name, &id), rc, fail);
  nccl_config(&cfg, nc->name);
  NCCLCHECKGOTO(ncclCommInitRankConfig(&comm, p->size, id, p->rank, &cfg), comm, rc, fail);
  TDIST_CHECKGOTO(comm_ready(comm, p->group, nc->name, "ncclCommInitRankConfig", p->timeout_ms), rc,
                  fail);
  /* Every rank is there now (NCCL's init waited for them all). */
  TDIST_CHECKGOTO(exchange_cc(p, nc->device, &nc->min_cc), rc, fail);
  TDIST_CHECKGOTO(state_setup(nc), rc, fail);
  TDIST_CHECKGOTO(connect_now(nc, comm), rc, fail);
  tdist__nccl_dev_leave(&dev);
  state_publish(nc, comm, out);
  TDIST_INFO(NCCL, "group '%s': NCCL communicator ready, rank %d/%d on device %d", nc->name,
             p->rank, p->size, nc->device);
  return 0;
fail:
  if (comm) ncclCommAbort(comm);
  tdist__nccl_dev_leave(&dev);
  state_free(nc);
  return rc;
}

/* A new communicator (split or shrink) becomes the child's state; on failure
 * it is aborted and nc freed. */
static int adopt(tdist__nccl_t *nc, ncclComm_t comm, tdist_backend_out_t *out) {
  tdist__nccl_dev_t dev;
  int rc = tdist__nccl_dev_enter(nc->device, &dev);
  if (rc == 0) {
    rc = state_setup(nc);
    if (rc == 0) rc = connect_now(nc, comm);
    tdist__nccl_dev_leave(&dev);
  }
  if (rc != 0) {
    ncclCommAbort(comm);
    state_free(nc);
    return rc;
  }
  state_publish(nc, comm, out);
  return 0;
}

/* The child's device: the parent's, as the core reports it. */
static int child_device(const tdist_backend_params_t *p, const tdist__nccl_t *pn) {
  return p->device >= 0 ? p->device : pn->device;
}

/* ---- split and shrink ---------------------------------------------------------------- */

/* Caller thread, mu not held (poll completes the ops): the parent's ops in
 * flight first -- NCCL's user guide warns that operations outstanding during
 * a split may deadlock. */
static int drain_parent(tdist__nccl_t *pn, const char *what, int64_t timeout_ms) {
  int64_t deadline = tdist__now_ns() + timeout_ms * 1000000;
  for (;;) {
    pthread_mutex_lock(&pn->mu);
    int busy = !pn->dead && tdist__list_first(&pn->inflight) != NULL;
    pthread_mutex_unlock(&pn->mu);
    if (!busy) return 0;
    if (tdist_backend_aborted(pn->group))
      return tdist__error(TDIST_ERR_ABORTED, "%s of group '%s': group aborted", what, pn->name);
    if (timeout_ms > 0 && tdist__now_ns() >= deadline)
      return tdist__error(TDIST_ERR_TIMEOUT,
                          "%s of group '%s': its ops in flight did not finish within %lld ms", what,
                          pn->name, (long long)timeout_ms);
    struct timespec ts = {0, 50000};
    nanosleep(&ts, NULL);
  }
}

/*
 * mu held, the parent's device current. A split or shrink was started with
 * `r` (NCCL writes the child into *slot, heap memory, when its job ends --
 * on a non-blocking parent after the call returned ncclInProgress, from
 * NCCL's job thread: init.cc ncclCommInitChildComm). Wait until the parent
 * is ready, then the child is in *slot. On failure the parent is aborted
 * here -- ncclCommAbort joins NCCL's job, so *slot is final afterwards --
 * then the child, as NCCL's user guide says of a failed non-blocking split,
 * and *failed is set: the caller fails the parent group after releasing mu
 * (the progress thread's abort takes it). `gate`: give up when this group
 * is aborted (NULL: never; a shrink's parent is aborted already).
 */
static int finish_child(tdist__nccl_t *pn, const tdist_backend_group_t *gate, ncclResult_t r,
                        ncclComm_t *slot, const char *what, int64_t timeout_ms, ncclComm_t *child,
                        int *failed) {
  int rc;
  if (r != ncclSuccess && r != ncclInProgress)
    rc = tdist__nccl_err(pn->comm, r, what);
  else
    rc = tdist__nccl_wait_ready(pn->comm, gate, pn->name, what, timeout_ms);
  if (rc == 0) {
    *child = *slot;
    return 0;
  }
  char msg[256];
  snprintf(msg, sizeof(msg), "%s", tdist_last_error());
  ncclComm_t parent = pn->comm;
  tdist__nccl_forget_locked(pn);
  pn->comm = NULL;
  TDIST_WARN(NCCL, "group '%s': %s; aborting the communicator, then its child", pn->name, msg);
  ncclCommAbort(parent);
  if (*slot) ncclCommAbort(*slot);
  *slot = NULL;
  *failed = 1; /* the caller fails the parent group once mu is released */
  return tdist__error(rc, "%s", msg);
}

/* mu not held: the parent's communicator was aborted by finish_child; its
 * group fails with the reason (kept for the caller's tdist_last_error). */
static void parent_failed(tdist__nccl_t *pn, int rc) {
  char msg[300];
  snprintf(msg, sizeof(msg), "%s", tdist_last_error());
  tdist__nccl_fail_group(pn, rc, "%s", msg);
  tdist__error(rc, "%s", msg);
}

/* Collective over the parent: non-members (TDIST_BACKEND_NOCOLOR) call ncclCommSplit
 * with NCCL_SPLIT_NOCOLOR and leave out->state NULL. */
int tdist__nccl_split(const tdist_backend_params_t *p, tdist_backend_out_t *out) {
  int rc = 0;
  tdist__nccl_t *pn = p->parent, *nc = NULL;
  ncclComm_t comm = NULL, *slot = NULL;
  ncclConfig_t cfg;
  tdist__nccl_dev_t dev = {0, 0};
  int member = p->color != TDIST_BACKEND_NOCOLOR, failed = 0;
  int key = member ? p->rank : p->parent_rank;
  if (p->own_device) {
    /* The group names its device: a communicator of its own, made by the
     * members alone (the core checked that every rank named one). */
    if (!member) return 0;
    int ndev = 0;
    TDIST_CHECK(device_count(&ndev));
    if (p->device >= ndev)
      return tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                          "new group '%s': CUDA device %d out of range: this process sees %d",
                          p->name, p->device, ndev);
    return init_on(p, p->device, out);
  }
  if (member) TDIST_CHECKGOTO(state_new(child_device(p, pn), p, &nc), rc, fail);
  nccl_config(&cfg, member ? nc->name : pn->name);
  TDIST_CHECKGOTO(drain_parent(pn, "split", p->timeout_ms), rc, fail);
  slot = tdist__calloc(1, sizeof(*slot));
  if (!slot) {
    rc = tdist__error(TDIST_ERR_NO_MEMORY, "split of group '%s': out of memory", pn->name);
    goto fail;
  }
  TDIST_CHECKGOTO(tdist__nccl_dev_enter(pn->device, &dev), rc, fail);
  pthread_mutex_lock(&pn->mu);
  if (pn->dead || !pn->comm) {
    rc = tdist__error(TDIST_ERR_ABORTED, "split of group '%s': its communicator was aborted",
                      pn->name);
  } else {
    ncclResult_t r =
        ncclCommSplit(pn->comm, member ? p->color : NCCL_SPLIT_NOCOLOR, key, slot, &cfg);
    rc = finish_child(pn, pn->group, r, slot, "ncclCommSplit", p->timeout_ms, &comm, &failed);
  }
  pthread_mutex_unlock(&pn->mu);
  tdist__nccl_dev_leave(&dev);
  if (failed) parent_failed(pn, rc);
  if (rc != 0) goto fail;
  if (!member) {
    if (comm) ncclCommAbort(comm); /* NCCL gave a non-member one: not expected */
    tdist__free(slot);
    return 0;
  }
  if (!comm) {
    rc = tdist__error(TDIST_ERR_NCCL_ERROR, "ncclCommSplit gave no communicator to rank %d of '%s'",
                      p->rank, nc->name);
    goto fail;
  }
  tdist__free(slot);
  nc->min_cc = pn->min_cc; /* a subset: at least as new */
  return adopt(nc, comm, out);
fail:
  if (comm) ncclCommAbort(comm);
  tdist__free(slot);
  state_free(nc);
  return rc;
}

/* mu held: wait until the abort threads of nc finished (a revoke issued),
 * up to nc->timeout_ms (<= 0: no bound). */
static int wait_jobs(tdist__nccl_t *nc);

/* Survivors only, after a peer failure (a revoked parent), or a live group
 * cut down by the caller. */
int tdist__nccl_shrink(const tdist_backend_params_t *p, tdist_backend_out_t *out) {
  int rc = 0;
  tdist__nccl_t *pn = p->parent, *nc = NULL;
  ncclComm_t comm = NULL, *slot = NULL;
  ncclConfig_t cfg;
  tdist__nccl_dev_t dev = {0, 0};
  int failed = 0, stopped = 0;
  /* No communicator left to shrink (the parent was aborted: a timeout, a
   * failed enqueue) or nobody to leave out (every rank survived, e.g. a
   * rank that skipped an op): the survivors make a communicator of their
   * own over the new group's store, as init does. */
  pthread_mutex_lock(&pn->mu);
  int own = wait_jobs(pn) == 0 && (!pn->comm || p->nexclude == 0 || !NC.ncclCommShrink);
  pthread_mutex_unlock(&pn->mu);
  if (own) return init_on(p, child_device(p, pn), out);
  TDIST_CHECKGOTO(state_new(child_device(p, pn), p, &nc), rc, fail);
  nccl_config(&cfg, nc->name);
  slot = tdist__calloc(1, sizeof(*slot));
  if (!slot) {
    rc = tdist__error(TDIST_ERR_NO_MEMORY, "shrink of group '%s': out of memory", pn->name);
    goto fail;
  }
  TDIST_CHECKGOTO(tdist__nccl_dev_enter(pn->device, &dev), rc, fail);
  pthread_mutex_lock(&pn->mu);
  rc = wait_jobs(pn);       /* the revoke was issued */
  if (rc == 0 && !pn->comm) /* aborted since the check above */
    rc = tdist__error(TDIST_ERR_ABORTED, "shrink of group '%s': its communicator was aborted",
                      pn->name);
  /* A revoked communicator must be quiescent first (the parent is aborted,
   * so no abort check). A live one has its ongoing work terminated by NCCL
   * (NCCL_SHRINK_ABORT): its kernels exit early and their end events
   * complete over data never reduced, so those ops fail here rather than
   * complete as if done. */
  if (rc == 0 && pn->revoked)
    rc = tdist__nccl_wait_ready(pn->comm, NULL, pn->name, "ncclCommRevoke", p->timeout_ms);
  if (rc == 0 && !pn->revoked && !pn->dead && tdist__list_first(&pn->inflight)) {
    tdist__nccl_forget_locked(pn);
    stopped = 1;
  }
  if (rc == 0) {
    ncclResult_t r = ncclCommShrink(pn->comm, (int *)p->exclude, p->nexclude, slot, &cfg,
                                    pn->revoked ? NCCL_SHRINK_DEFAULT : NCCL_SHRINK_ABORT);
    /* The parent group is aborted by now (a peer failed): no abort check. */
    rc = finish_child(pn, NULL, r, slot, "ncclCommShrink", p->timeout_ms, &comm, &failed);
    if (rc == 0 && !comm)
      rc = tdist__error(TDIST_ERR_NCCL_ERROR, "ncclCommShrink gave no communicator");
    if (rc == 0) rc = comm_ready(comm, p->group, nc->name, "ncclCommShrink", p->timeout_ms);
  }
  pthread_mutex_unlock(&pn->mu);
  tdist__nccl_dev_leave(&dev);
  if (stopped)
    tdist__nccl_fail_group(pn, TDIST_ERR_ABORTED,
                           "group '%s' was shrunk with ops in flight: NCCL_SHRINK_ABORT stopped "
                           "their kernels before they finished",
                           pn->name);
  if (failed) parent_failed(pn, rc);
  if (rc != 0) goto fail;
  tdist__free(slot);
  nc->min_cc = pn->min_cc;
  return adopt(nc, comm, out);
fail:
  if (comm) ncclCommAbort(comm);
  tdist__free(slot);
  state_free(nc);
  return rc;
}

/* ---- destroy -------------------------------------------------------------------- */

static int wait_jobs(tdist__nccl_t *nc) {
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

int tdist__nccl_destroy(void *state) {
  int rc = 0;
  tdist__nccl_t *nc = state;
  if (!nc) return 0;
  pthread_mutex_lock(&nc->mu);
  rc = wait_jobs(nc);
  if (rc != 0) {
    /* The job still uses nc: leak it rather than free it under the job. */
    pthread_mutex_unlock(&nc->mu);
    TDIST_WARN(NCCL, "%s", tdist_last_error());
    return rc;
  }
  tdist__nccl_dev_t dev = {0, 0};
  if (nc->comm) tdist__nccl_dev_enter(nc->device, &dev);
  if (nc->comm && !nc->dead) {
    ncclResult_t r = ncclCommFinalize(nc->comm);
    if (r != ncclSuccess && r != ncclInProgress)
      rc = tdist__nccl_err(nc->comm, r, "ncclCommFinalize");
    else
      rc = tdist__nccl_wait_ready(nc->comm, NULL, nc->name, "ncclCommFinalize", nc->timeout_ms);
    if (rc == 0) {
      r = ncclCommDestroy(nc->comm);
      if (r != ncclSuccess && r != ncclInProgress) {
        rc = tdist__nccl_err(NULL, r, "ncclCommDestroy");
        TDIST_WARN(NCCL, "group '%s': %s", nc->name, tdist_last_error());
      }
    } else {
      TDIST_WARN(NCCL, "group '%s': %s; aborting the communicator", nc->name, tdist_last_error());
      ncclCommAbort(nc->comm);
    }
  } else if (nc->comm) { /* revoked: finalize is not allowed, abort frees it */
    ncclCommAbort(nc->comm);
  }
  tdist__nccl_dev_leave(&dev);
  nc->comm = NULL;
  nc->dead = 1; /* a late abort finds nothing to do */
  pthread_mutex_unlock(&nc->mu);
  state_free(nc);
  return rc;
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
