/*
 * nccl_comm.c - communicator life cycle of the NCCL backend: init (unique id
 * through the group's store), split (ncclCommSplit), destroy (finalize, then
 * destroy, abort on failure), and the backend's vtable.
 *
 * Threads: everything here runs on the caller's thread (backend.h). Every
 * communicator is created non-blocking (config.blocking = 0), so no NCCL call
 * here can hang the caller: ncclInProgress is polled with
 * ncclCommGetAsyncError under the group's timeout (tdist__nccl_wait_ready).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/param.h"
#include "nccl/nccl_backend.h"

/* How long a ncclInProgress poll sleeps between two checks (µs): short, as
 * init and enqueue usually finish within microseconds to milliseconds. */
TDIST_PARAM(NcclPollSleepUs, "TDIST_NCCL_POLL_SLEEP_US", 20)

int tdist__nccl_err(ncclComm_t comm, ncclResult_t r, const char *what) {
  const char *last = comm ? ncclGetLastError(comm) : ncclGetLastError(NULL);
  return tdist__error(TDIST_ERR_NCCL_ERROR, "%s failed: %s%s%s", what, ncclGetErrorString(r),
                      last && *last ? ": " : "", last ? last : "");
}

int tdist__cuda_err(cudaError_t e, const char *what) {
  return tdist__error(TDIST_ERR_CUDA_ERROR, "%s failed: %s (%s)", what, cudaGetErrorString(e),
                      cudaGetErrorName(e));
}

int tdist__nccl_wait_ready(ncclComm_t comm, tdist_group_t *g, const char *what,
                           int64_t timeout_ms) {
  int64_t deadline = tdist__now_ns() + timeout_ms * 1000000;
  int64_t sleep_ns = tdist__param_NcclPollSleepUs() * 1000;
  for (;;) {
    ncclResult_t st = ncclInProgress;
    ncclResult_t r = ncclCommGetAsyncError(comm, &st);
    if (r != ncclSuccess) return tdist__nccl_err(comm, r, "ncclCommGetAsyncError");
    if (st == ncclSuccess) return 0;
    if (st != ncclInProgress)
      return tdist__error(TDIST_ERR_NCCL_ERROR, "%s for group '%s': %s: %s", what,
                          g ? g->name : "?", ncclGetErrorString(st), ncclGetLastError(comm));
    if (g && atomic_load(&g->aborted))
      return tdist__error(TDIST_ERR_ABORTED, "%s for group '%s': group aborted: %s", what, g->name,
                          g->abort_reason);
    if (tdist__now_ns() >= deadline)
      return tdist__error(TDIST_ERR_TIMEOUT, "%s for group '%s' timed out after %lld ms", what,
                          g ? g->name : "?", (long long)timeout_ms);
    if (sleep_ns > 0) {
      struct timespec ts = {0, (long)sleep_ns};
      nanosleep(&ts, NULL);
    }
  }
}

void tdist__nccl_config(ncclConfig_t *cfg, const tdist_group_t *g) {
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  c.blocking = 0;
  c.commName = g->name; /* copied by NCCL during init */
  *cfg = c;
}

/* ---- per-group state ------------------------------------------------------------ */

/* Create the stream, start event and barrier scratch on nc->device. */
static int state_setup(tdist__nccl_t *nc) {
  int rc = 0;
  CUDACHECKGOTO(cudaSetDevice(nc->device), rc, fail);
  CUDACHECKGOTO(cudaStreamCreateWithFlags(&nc->stream, cudaStreamNonBlocking), rc, fail);
  CUDACHECKGOTO(cudaEventCreateWithFlags(&nc->start_ev, cudaEventDisableTiming), rc, fail);
  /* Stream-ordered, so freeing it at destroy never synchronises the device. */
  CUDACHECKGOTO(cudaMallocAsync(&nc->scratch, sizeof(float), nc->stream), rc, fail);
  CUDACHECKGOTO(cudaMemsetAsync(nc->scratch, 0, sizeof(float), nc->stream), rc, fail);
fail:
  return rc;
}

/* Release what state_setup and the event pool made; comm must be gone. */
static void state_free(tdist__nccl_t *nc) {
  if (!nc) return;
  if (nc->device >= 0) cudaSetDevice(nc->device);
  if (nc->scratch && nc->stream) cudaFreeAsync(nc->scratch, nc->stream);
  for (int i = 0; i < nc->nall; i++)
    cudaEventDestroy(nc->all[i]);
  if (nc->start_ev) cudaEventDestroy(nc->start_ev);
  /* Destroying a stream with work pending is allowed: CUDA releases it once
   * the work is done (or never, for a kernel that never ends). */
  if (nc->stream) cudaStreamDestroy(nc->stream);
  tdist__free(nc->all);
  tdist__free(nc->free);
  pthread_mutex_destroy(&nc->mu);
  tdist__free(nc);
}

static int state_new(int device, tdist__nccl_t **out) {
  tdist__nccl_t *nc = tdist__calloc(1, sizeof(*nc));
  if (!nc) return tdist__error(TDIST_ERR_NO_MEMORY, "cannot allocate NCCL group state");
  pthread_mutex_init(&nc->mu, NULL);
  nc->device = device;
  *out = nc;
  return 0;
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

/* The device: the options, else the local rank as torchrun, srun or mpirun
 * set it (LOCAL_RANK, SLURM_LOCALID, OMPI_COMM_WORLD_LOCAL_RANK), else 0. */
static int pick_device(const tdist_init_opts_t *o) {
  static const char *vars[] = {"LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"};
  if (o && (o->mask & TDIST_INIT_FIELD_DEVICE) && o->device >= 0) return o->device;
  for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
    const char *lr = tdist__env_raw(vars[i]);
    if (!lr) continue;
    char *end;
    long v = strtol(lr, &end, 10);
    if (*end == '\0' && v >= 0 && v < 4096) return (int)v;
    TDIST_WARN(NCCL, "ignoring %s='%s' (not a device number)", vars[i], lr);
  }
  return 0;
}

/* Rank 0 makes the unique id and publishes it in the group's store. */
static int exchange_id(tdist_group_t *g, ncclUniqueId *id) {
  int rc = 0;
  void *val = NULL;
  size_t len = 0;
  if (g->rank == 0) {
    NCCLCHECKGOTO(ncclGetUniqueId(id), NULL, rc, fail);
    if (g->size > 1)
      TDIST_CHECKGOTO(tdist_store_set(g->store, "nccl_id", id, sizeof(*id)), rc, fail);
    return 0;
  }
  TDIST_CHECKGOTO(tdist_store_get(g->store, "nccl_id", &val, &len, atomic_load(&g->timeout_ms)), rc,
                  fail);
  if (len != sizeof(*id)) {
    rc = tdist__error(TDIST_ERR_PROTOCOL, "group '%s': NCCL unique id of %zu bytes (want %zu)",
                      g->name, len, sizeof(*id));
    goto fail;
  }
  memcpy(id, val, sizeof(*id));
fail:
  tdist_store_free(val);
  return rc;
}

/* Poll a freshly created communicator (init or split) to readiness. On
 * failure the caller aborts it, so no NCCL thread is left behind. */
static int comm_ready(ncclComm_t comm, tdist_group_t *g, const char *what) {
  int rc = tdist__nccl_wait_ready(comm, g, what, atomic_load(&g->timeout_ms));
  if (rc != 0) TDIST_WARN(NCCL, "%s", tdist_last_error());
  return rc;
}

int tdist__nccl_init(tdist_group_t *g, const void *arg) {
  int rc = 0;
  tdist__nccl_t *nc = NULL;
  ncclUniqueId id;
  ncclConfig_t cfg;
  ncclComm_t comm = NULL;
  if (g->size > 1 && !g->store)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "nccl: group '%s' of %d ranks has no store",
                        g->name, g->size);
  TDIST_CHECKGOTO(state_new(pick_device(arg), &nc), rc, fail);
  CUDACHECKGOTO(cudaSetDevice(nc->device), rc, fail);
  TDIST_CHECKGOTO(exchange_id(g, &id), rc, fail);
  tdist__nccl_config(&cfg, g);
  NCCLCHECKGOTO(ncclCommInitRankConfig(&comm, g->size, id, g->rank, &cfg), comm, rc, fail);
  TDIST_CHECKGOTO(comm_ready(comm, g, "ncclCommInitRankConfig"), rc, fail);
  TDIST_CHECKGOTO(state_setup(nc), rc, fail);
  nc->comm = comm;
  g->device = nc->device;
  g->bstate = nc;
  g->needs_poll = 1;
  TDIST_INFO(NCCL, "group '%s': NCCL communicator ready, rank %d/%d on device %d", g->name, g->rank,
             g->size, nc->device);
  return 0;
fail:
  if (comm) ncclCommAbort(comm);
  state_free(nc);
  return rc;
}

/* A new communicator (split or shrink) becomes child's backend state; on
 * failure it is aborted and nc freed. */
static int adopt(tdist__nccl_t *nc, ncclComm_t comm, tdist_group_t *child) {
  int rc = state_setup(nc);
  if (rc != 0) {
    ncclCommAbort(comm);
    state_free(nc);
    return rc;
  }
  nc->comm = comm;
  child->device = nc->device;
  child->bstate = nc;
  child->needs_poll = 1;
  return 0;
}

/* ---- split ---------------------------------------------------------------------- */

int tdist__nccl_split(tdist_group_t *parent, int color, tdist_group_t *child) {
  int rc = 0;
  tdist__nccl_t *pn = parent->bstate, *nc = NULL;
  ncclComm_t comm = NULL;
  ncclConfig_t cfg;
  int member = color != TDIST__NOCOLOR && child;
  int key = member ? child->rank : parent->rank;
  if (member) TDIST_CHECKGOTO(state_new(pn->device, &nc), rc, fail);
  tdist__nccl_config(&cfg, member ? child : parent);
  pthread_mutex_lock(&pn->mu);
  if (pn->dead || !pn->comm) {
    pthread_mutex_unlock(&pn->mu);
    rc = tdist__error(TDIST_ERR_ABORTED, "split of group '%s': its communicator was aborted",
                      parent->name);
    goto fail;
  }
  cudaSetDevice(pn->device);
  ncclResult_t r = ncclCommSplit(pn->comm, member ? color : NCCL_SPLIT_NOCOLOR, key, &comm, &cfg);
  if (r != ncclSuccess && r != ncclInProgress) {
    rc = tdist__nccl_err(pn->comm, r, "ncclCommSplit");
    pthread_mutex_unlock(&pn->mu);
    goto fail;
  }
  /* The new communicator (members) and the parent (everyone) are both in
   * progress until the split is done. */
  if (comm) rc = comm_ready(comm, member ? child : parent, "ncclCommSplit");
  if (rc == 0)
    rc = tdist__nccl_wait_ready(pn->comm, parent, "ncclCommSplit (parent)",
                                atomic_load(&parent->timeout_ms));
  pthread_mutex_unlock(&pn->mu);
  if (rc != 0) goto fail;
  if (!member) {
    if (comm) ncclCommAbort(comm); /* NCCL gave a non-member one: not expected */
    return 0;
  }
  if (!comm) {
    rc = tdist__error(TDIST_ERR_NCCL_ERROR, "ncclCommSplit gave no communicator to rank %d of '%s'",
                      child->rank, child->name);
    goto fail;
  }
  return adopt(nc, comm, child);
fail:
  if (comm) ncclCommAbort(comm);
  state_free(nc);
  return rc;
}

/* ---- shrink (survivors only, after a peer failure) ----------------------------- */

int tdist__nccl_shrink(tdist_group_t *parent, const int *exclude, int nexclude,
                       tdist_group_t *child) {
  int rc = 0;
  tdist__nccl_t *pn = parent->bstate, *nc = NULL;
  ncclComm_t comm = NULL;
  ncclConfig_t cfg;
  TDIST_CHECKGOTO(state_new(pn->device, &nc), rc, fail);
  tdist__nccl_config(&cfg, child);
  pthread_mutex_lock(&pn->mu);
  if (!pn->comm) {
    pthread_mutex_unlock(&pn->mu);
    rc = tdist__error(TDIST_ERR_ABORTED,
                      "shrink of group '%s': its communicator was aborted, not revoked (only a "
                      "peer failure leaves one to shrink)",
                      parent->name);
    goto fail;
  }
  cudaSetDevice(pn->device);
  /* A revoked communicator must be quiescent first; a live one (shrinking
   * without a failure seen here) has its ongoing work terminated by NCCL. */
  if (pn->revoked)
    rc = tdist__nccl_wait_ready(pn->comm, NULL, "ncclCommRevoke", atomic_load(&parent->timeout_ms));
  if (rc == 0) {
    ncclResult_t r = ncclCommShrink(pn->comm, (int *)exclude, nexclude, &comm, &cfg,
                                    pn->revoked ? NCCL_SHRINK_DEFAULT : NCCL_SHRINK_ABORT);
    if (r != ncclSuccess && r != ncclInProgress)
      rc = tdist__nccl_err(pn->comm, r, "ncclCommShrink");
    else if (comm)
      rc = comm_ready(comm, child, "ncclCommShrink");
    else
      rc = tdist__error(TDIST_ERR_NCCL_ERROR, "ncclCommShrink gave no communicator");
  }
  pthread_mutex_unlock(&pn->mu);
  if (rc != 0) goto fail;
  return adopt(nc, comm, child);
fail:
  if (comm) ncclCommAbort(comm);
  state_free(nc);
  return rc;
}

/* ---- destroy -------------------------------------------------------------------- */

int tdist__nccl_destroy(tdist_group_t *g) {
  int rc = 0;
  tdist__nccl_t *nc = g->bstate;
  if (!nc) return 0;
  pthread_mutex_lock(&nc->mu);
  if (nc->comm && !nc->dead) {
    cudaSetDevice(nc->device);
    ncclResult_t r = ncclCommFinalize(nc->comm);
    if (r != ncclSuccess && r != ncclInProgress)
      rc = tdist__nccl_err(nc->comm, r, "ncclCommFinalize");
    else
      rc = tdist__nccl_wait_ready(nc->comm, NULL, "ncclCommFinalize", atomic_load(&g->timeout_ms));
    if (rc == 0) {
      r = ncclCommDestroy(nc->comm);
      if (r != ncclSuccess && r != ncclInProgress) {
        rc = tdist__nccl_err(NULL, r, "ncclCommDestroy");
        TDIST_WARN(NCCL, "group '%s': %s", g->name, tdist_last_error());
      }
    } else {
      TDIST_WARN(NCCL, "group '%s': %s; aborting the communicator", g->name, tdist_last_error());
      ncclCommAbort(nc->comm);
    }
    nc->comm = NULL;
  } else if (nc->comm) { /* revoked: finalize is not allowed, abort frees it */
    cudaSetDevice(nc->device);
    ncclCommAbort(nc->comm);
    nc->comm = NULL;
  }
  pthread_mutex_unlock(&nc->mu);
  g->bstate = NULL;
  state_free(nc);
  return rc;
}

const tdist__backend_ops_t tdist__nccl_backend = {
    .name = "nccl",
    .init = tdist__nccl_init,
    .split = tdist__nccl_split,
    .submit = tdist__nccl_submit,
    .post = tdist__nccl_post,
    .poll = tdist__nccl_poll,
    .abort = tdist__nccl_abort,
    .destroy = tdist__nccl_destroy,
    .wait_stream = tdist__nccl_wait_stream,
    .shrink = tdist__nccl_shrink,
};
