/*
 * nccl_comm.c - communicator creation of the NCCL backend: init (opens NCCL
 * and the CUDA runtime on first use, nccl_lib.c; checks the device; unique
 * id from rank 0 through the group's store), split (ncclCommSplit) and
 * shrink (a fresh communicator through the store). The group's state, destroy and the backend's
 * description are in nccl_state.c.
 *
 * Threads: everything here runs on a caller thread (tdist/backend.h) and may
 * block within the group's timeout. Every communicator is created
 * non-blocking (config.blocking = 0), so no NCCL call here can hang the
 * caller: ncclInProgress is polled with ncclCommGetAsyncError under the
 * timeout (tdist__nccl_wait_ready). The ncclCommAbort calls here (a failed
 * creation) run on the caller thread too; only the progress thread's abort
 * hands its ncclCommAbort to the worker (nccl_progress.c).
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nccl/nccl_backend.h"
#include "util/alloc.h"
#include "util/clock.h"
#include "util/param.h"

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

/*
 * The unique ids of a new communicator, through the group's store. `n`
 * roots (1: rank 0 makes the only id, as ever). For a scalable init
 * (ncclCommInitRankScalable, NCCL 2.23) root k's id is made by the first
 * rank that root serves -- NCCL's bootstrap.cc firstRankFromRoot(k) =
 * k * (size / n) + min(k, size % n), so each root's ranks sit next to it --
 * and every rank reads all n ids, in root order (NCCL wants the same array
 * on every rank). A root waits for nobody but the other roots.
 */
static int first_rank_of_root(int k, int size, int n) {
  return k * (size / n) + (k < size % n ? k : size % n);
}

static int exchange_ids(const tdist_backend_params_t *p, const char *gname, int n,
                        ncclUniqueId *ids) {
  int rc = 0, mine = -1;
  int *from = NULL;
  void **vals = NULL;
  size_t *lens = NULL;
  for (int k = 0; k < n; k++)
    if (first_rank_of_root(k, p->size, n) == p->rank) mine = k;
  if (mine >= 0) NCCLCHECKGOTO(ncclGetUniqueId(&ids[mine]), NULL, rc, out);
  if (p->size == 1) return 0;
  from = tdist__calloc((size_t)n, sizeof(*from));
  vals = tdist__calloc((size_t)p->size, sizeof(*vals));
  lens = tdist__calloc((size_t)p->size, sizeof(*lens));
  if (!from || !vals || !lens) {
    rc = tdist__error(TDIST_ERR_NO_MEMORY, "group '%s': NCCL id exchange: out of memory", gname);
    goto out;
  }
  for (int k = 0; k < n; k++)
    from[k] = first_rank_of_root(k, p->size, n);
  TDIST_CHECKGOTO(tdist_backend_allgather(p->store, n == 1 ? "nccl_id" : "nccl_ids", p->rank,
                                          p->size, mine >= 0 ? &ids[mine] : NULL, sizeof(*ids),
                                          from, n, vals, lens, p->timeout_ms),
                  rc, out);
  for (int k = 0; k < n; k++) {
    int r = from[k];
    if (r == p->rank) continue;
    if (!vals[r] || lens[r] != sizeof(*ids)) {
      rc = tdist__error(TDIST_ERR_PROTOCOL,
                        "group '%s': NCCL unique id of root %d (rank %d): %zu bytes (want %zu)",
                        gname, k, r, lens[r], sizeof(*ids));
      goto out;
    }
    memcpy(&ids[k], vals[r], sizeof(*ids));
  }
out:
  for (int i = 0; vals && i < p->size; i++)
    tdist_store_free(vals[i]);
  tdist__free(vals);
  tdist__free(lens);
  tdist__free(from);
  return rc;
}

/* How many roots an init of `size` ranks uses: ceil(size /
 * TDIST_NCCL_RANKS_PER_ROOT) when the loaded NCCL has
 * ncclCommInitRankScalable, else 1. As torch (ProcessGroupNCCL
 * useScalableInit), one root -- the classic ncclCommInitRankConfig -- while
 * the group fits under one. */
static int root_count(int size) {
  int64_t per = tdist__param_NcclRanksPerRoot();
  if (per < 1) per = 1;
  int64_t n = ((int64_t)size + per - 1) / per;
  if (n <= 1) return 1;
  if (!NC.ncclCommInitRankScalable) {
    static atomic_int told;
    if (atomic_fetch_add(&told, 1) == 0)
      TDIST_INFO(NCCL,
                 "NCCL %s has no ncclCommInitRankScalable (2.23): %d ranks start from one root",
                 NC.version_str, size);
    return 1;
  }
  return (int)n;
}

/* ---- NCCL's configuration (tdist_nccl_opts_t) ----------------------------------------- */

#define KNOB_BAD(...) tdist__error(TDIST_ERR_INVALID_ARGUMENT, __VA_ARGS__)

int tdist__nccl_knobs(tdist__nccl_t *nc, const tdist_nccl_opts_t *own,
                      const tdist_nccl_opts_t *inherited, ncclConfig_t *cfg) {
  const uint64_t known = TDIST_NCCL_FIELD_MIN_CTAS | TDIST_NCCL_FIELD_MAX_CTAS |
                         TDIST_NCCL_FIELD_CGA_CLUSTER_SIZE | TDIST_NCCL_FIELD_NET_NAME |
                         TDIST_NCCL_FIELD_SPLIT_SHARE | TDIST_NCCL_FIELD_TRAFFIC_CLASS |
                         TDIST_NCCL_FIELD_HIGH_PRIORITY;
  tdist_nccl_opts_t k;
  memset(&k, 0, sizeof(k));
  if (inherited) k = *inherited;
  if (own) {
    if (own->mask & ~known)
      return KNOB_BAD("group '%s': tdist_nccl_opts_t.mask has unknown bits 0x%llx", nc->name,
                      (unsigned long long)(own->mask & ~known));
#define TAKE(bit, f) \
  if (own->mask & (bit)) k.f = own->f
    TAKE(TDIST_NCCL_FIELD_MIN_CTAS, min_ctas);
    TAKE(TDIST_NCCL_FIELD_MAX_CTAS, max_ctas);
    TAKE(TDIST_NCCL_FIELD_CGA_CLUSTER_SIZE, cga_cluster_size);
    TAKE(TDIST_NCCL_FIELD_NET_NAME, net_name);
    TAKE(TDIST_NCCL_FIELD_SPLIT_SHARE, split_share);
    TAKE(TDIST_NCCL_FIELD_TRAFFIC_CLASS, traffic_class);
    TAKE(TDIST_NCCL_FIELD_HIGH_PRIORITY, high_priority);
#undef TAKE
    k.mask |= own->mask;
  }
  /* The ranges of NCCL's documentation and parseCommConfig (init.cc, 2.28):
   * minCTAs/maxCTAs > 0 and at most MAXCHANNELS (64; NCCL caps larger
   * values), cgaClusterSize 0..8 (NCCL_MAX_CGA_CLUSTER_SIZE), splitShare 0/1.
   * parseCommConfig compares minCTAs with maxCTAs even when maxCTAs is left
   * undefined (INT_MIN), so a lone minCTAs is an error there: say so here. */
  if ((k.mask & TDIST_NCCL_FIELD_MIN_CTAS) && (k.min_ctas < 1 || k.min_ctas > 64))
    return KNOB_BAD("group '%s': NCCL min_ctas %d out of range 1..64", nc->name, k.min_ctas);
  if ((k.mask & TDIST_NCCL_FIELD_MAX_CTAS) && (k.max_ctas < 1 || k.max_ctas > 64))
    return KNOB_BAD("group '%s': NCCL max_ctas %d out of range 1..64", nc->name, k.max_ctas);
  if ((k.mask & TDIST_NCCL_FIELD_MIN_CTAS) && !(k.mask & TDIST_NCCL_FIELD_MAX_CTAS))
    return KNOB_BAD("group '%s': NCCL min_ctas %d needs max_ctas too (NCCL 2.28's "
                    "parseCommConfig refuses minCTAs above an undefined maxCTAs)",
                    nc->name, k.min_ctas);
  if ((k.mask & TDIST_NCCL_FIELD_MIN_CTAS) && k.min_ctas > k.max_ctas)
    return KNOB_BAD("group '%s': NCCL min_ctas %d above max_ctas %d", nc->name, k.min_ctas,
                    k.max_ctas);
  if ((k.mask & TDIST_NCCL_FIELD_CGA_CLUSTER_SIZE) &&
      (k.cga_cluster_size < 0 || k.cga_cluster_size > 8))
    return KNOB_BAD("group '%s': NCCL cga_cluster_size %d out of range 0..8", nc->name,
                    k.cga_cluster_size);
  if (k.mask & TDIST_NCCL_FIELD_NET_NAME) {
    size_t len = k.net_name ? strlen(k.net_name) : 0;
    if (len == 0 || len >= sizeof(nc->net_name_buf))
      return KNOB_BAD("group '%s': NCCL net_name %s", nc->name,
                      len ? "longer than 63 characters" : "empty or NULL");
    memcpy(nc->net_name_buf, k.net_name, len + 1);
    k.net_name = nc->net_name_buf;
  }
  if ((k.mask & TDIST_NCCL_FIELD_SPLIT_SHARE) && k.split_share != 0 && k.split_share != 1)
    return KNOB_BAD("group '%s': NCCL split_share %d is not 0 or 1", nc->name, k.split_share);
  if ((k.mask & TDIST_NCCL_FIELD_HIGH_PRIORITY) && k.high_priority != 0 && k.high_priority != 1)
    return KNOB_BAD("group '%s': high_priority %d is not 0 or 1", nc->name, k.high_priority);
  if (k.mask & TDIST_NCCL_FIELD_TRAFFIC_CLASS) {
    if (k.traffic_class < 0)
      return KNOB_BAD("group '%s': NCCL traffic_class %d is negative", nc->name, k.traffic_class);
    /* An older NCCL resets the field to its default (parseCommConfig's
     * version check): refuse rather than drop the user's value. */
    if (NC.version < TDIST__NCCL_VERSION(2, 25, 0))
      return tdist__error(TDIST_ERR_NOT_SUPPORTED,
                          "group '%s': NCCL traffic_class needs NCCL 2.25.0 (ncclConfig_t."
                          "trafficClass); the loaded NCCL is %s",
                          nc->name, NC.version_str);
  }
  if ((k.mask & TDIST_NCCL_FIELD_HIGH_PRIORITY) && k.high_priority &&
      (!NC.cudaDeviceGetStreamPriorityRange || !NC.cudaStreamCreateWithPriority))
    return tdist__error(TDIST_ERR_NOT_SUPPORTED,
                        "group '%s': high_priority needs cudaStreamCreateWithPriority, which the "
                        "loaded CUDA runtime lacks",
                        nc->name);
  if (k.mask & TDIST_NCCL_FIELD_MIN_CTAS) cfg->minCTAs = k.min_ctas;
  if (k.mask & TDIST_NCCL_FIELD_MAX_CTAS) cfg->maxCTAs = k.max_ctas;
  if (k.mask & TDIST_NCCL_FIELD_CGA_CLUSTER_SIZE) cfg->cgaClusterSize = k.cga_cluster_size;
  if (k.mask & TDIST_NCCL_FIELD_NET_NAME) cfg->netName = k.net_name;
  if (k.mask & TDIST_NCCL_FIELD_SPLIT_SHARE) cfg->splitShare = k.split_share;
  if (k.mask & TDIST_NCCL_FIELD_TRAFFIC_CLASS) cfg->trafficClass = k.traffic_class;
  nc->knobs = k;
  return 0;
}

/* The caller's own options for a new group (init: tdist_init_opts_t; split,
 * shrink: tdist_group_opts_t), or NULL. */
static const tdist_nccl_opts_t *own_knobs(const tdist_backend_params_t *p) {
  if (p->group_opts && (p->group_opts->mask & TDIST_GROUP_FIELD_NCCL)) return p->group_opts->nccl;
  if (p->init_opts && (p->init_opts->mask & TDIST_INIT_FIELD_NCCL)) return p->init_opts->nccl;
  return NULL;
}

/* The parent's options (split, shrink), or NULL for a world. */
static const tdist_nccl_opts_t *parent_knobs(const tdist_backend_params_t *p) {
  return p->parent ? &((const tdist__nccl_t *)p->parent)->knobs : NULL;
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
  ncclUniqueId *ids = NULL;
  ncclConfig_t cfg;
  ncclComm_t comm = NULL;
  tdist__nccl_dev_t dev = {0, 0};
  int nroots = root_count(p->size);
  const char *how = nroots > 1 ? "ncclCommInitRankScalable" : "ncclCommInitRankConfig";
  TDIST_CHECKGOTO(tdist__nccl_state_new(device, p, &nc), rc, fail);
  tdist__nccl_config(&cfg, nc->name);
  TDIST_CHECKGOTO(tdist__nccl_knobs(nc, own_knobs(p), parent_knobs(p), &cfg), rc, fail);
  ids = tdist__calloc((size_t)nroots, sizeof(*ids));
  if (!ids) {
    rc = tdist__error(TDIST_ERR_NO_MEMORY, "group '%s': out of memory", nc->name);
    goto fail;
  }
  TDIST_CHECKGOTO(tdist__nccl_dev_enter(nc->device, &dev), rc, fail);
  TDIST_CHECKGOTO(exchange_ids(p, nc->name, nroots, ids), rc, fail);
  if (nroots > 1)
    NCCLCHECKGOTO(ncclCommInitRankScalable(&comm, p->size, p->rank, nroots, ids, &cfg), comm, rc,
                  fail);
  else
    NCCLCHECKGOTO(ncclCommInitRankConfig(&comm, p->size, ids[0], p->rank, &cfg), comm, rc, fail);
  TDIST_CHECKGOTO(comm_ready(comm, p->group, nc->name, how, p->timeout_ms), rc, fail);
  tdist__free(ids);
  ids = NULL;
  /* Every rank is there now (NCCL's init waited for them all). */
  TDIST_CHECKGOTO(exchange_cc(p, nc->device, &nc->min_cc), rc, fail);
  TDIST_CHECKGOTO(tdist__nccl_state_setup(nc), rc, fail);
  TDIST_CHECKGOTO(tdist__nccl_connect_now(nc, comm), rc, fail);
  tdist__nccl_dev_leave(&dev);
  tdist__nccl_state_publish(nc, comm, out);
  TDIST_INFO(NCCL, "group '%s': NCCL communicator ready, rank %d/%d on device %d (%s, %d root%s)",
             nc->name, p->rank, p->size, nc->device, how, nroots, nroots > 1 ? "s" : "");
  return 0;
fail:
  tdist__free(ids);
  if (comm) ncclCommAbort(comm);
  tdist__nccl_dev_leave(&dev);
  tdist__nccl_state_free(nc);
  return rc;
}

/* A new communicator (split or shrink) becomes the child's state; on failure
 * it is aborted and nc freed. */
static int adopt(tdist__nccl_t *nc, ncclComm_t comm, tdist_backend_out_t *out) {
  tdist__nccl_dev_t dev;
  int rc = tdist__nccl_dev_enter(nc->device, &dev);
  if (rc == 0) {
    rc = tdist__nccl_state_setup(nc);
    if (rc == 0) rc = tdist__nccl_connect_now(nc, comm);
    tdist__nccl_dev_leave(&dev);
  }
  if (rc != 0) {
    ncclCommAbort(comm);
    tdist__nccl_state_free(nc);
    return rc;
  }
  tdist__nccl_state_publish(nc, comm, out);
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
 * `call` held, the parent's device current. A split or shrink was started
 * with `r` (NCCL writes the child into *slot, heap memory, when its job ends
 * -- on a non-blocking parent after the call returned ncclInProgress, from
 * NCCL's job thread: init.cc ncclCommInitChildComm). Wait until the parent
 * is ready, then the child is in *slot. On failure the parent is aborted
 * here -- ncclCommAbort joins NCCL's job, so *slot is final afterwards --
 * then the child, as NCCL's user guide says of a failed non-blocking split,
 * and *failed is set: the caller fails the parent group after releasing
 * `call`. The progress thread never waits for this: its abort takes only
 * mu, and poll only trylocks `call`. `gate`: give up when this group is
 * aborted (NULL: never).
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
  pthread_mutex_lock(&pn->mu);
  ncclComm_t parent = pn->comm;
  tdist__nccl_forget_locked(pn);
  pn->comm = NULL; /* both locks held: the abort thread finds nothing to do */
  pthread_mutex_unlock(&pn->mu);
  TDIST_WARN(NCCL, "group '%s': %s; aborting the communicator, then its child", pn->name, msg);
  if (parent) ncclCommAbort(parent);
  if (*slot) ncclCommAbort(*slot);
  *slot = NULL;
  *failed = 1; /* the caller fails the parent group once `call` is released */
  return tdist__error(rc, "%s", msg);
}

/* No lock held: the parent's communicator was aborted by finish_child; its
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
  if (member) TDIST_CHECKGOTO(tdist__nccl_state_new(child_device(p, pn), p, &nc), rc, fail);
  tdist__nccl_config(&cfg, member ? nc->name : pn->name);
  /* The child's configuration: its own options over the parent's (what
   * ncclCommSplit with a NULL config would inherit, init.cc copyCommConfig). */
  if (member) TDIST_CHECKGOTO(tdist__nccl_knobs(nc, own_knobs(p), &pn->knobs, &cfg), rc, fail);
  TDIST_CHECKGOTO(drain_parent(pn, "split", p->timeout_ms), rc, fail);
  slot = tdist__calloc(1, sizeof(*slot));
  if (!slot) {
    rc = tdist__error(TDIST_ERR_NO_MEMORY, "split of group '%s': out of memory", pn->name);
    goto fail;
  }
  TDIST_CHECKGOTO(tdist__nccl_dev_enter(pn->device, &dev), rc, fail);
  if (tdist__nccl_call_enter(pn, "split") != 0) {
    rc = tdist__error(TDIST_ERR_ABORTED, "split of group '%s': its communicator was aborted",
                      pn->name);
  } else {
    /* drain_parent saw no op in flight, so none is launching. */
    ncclResult_t r =
        ncclCommSplit(pn->comm, member ? p->color : NCCL_SPLIT_NOCOLOR, key, slot, &cfg);
    rc = finish_child(pn, pn->group, r, slot, "ncclCommSplit", p->timeout_ms, &comm, &failed);
    pthread_mutex_unlock(&pn->call);
  }
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
  /* The child's own members' devices decide float8 reductions, not the
   * parent's oldest (a subset may be all sm_90 where the parent is not). */
  rc = exchange_cc(p, nc->device, &nc->min_cc);
  if (rc != 0) goto fail;
  return adopt(nc, comm, out);
fail:
  if (comm) ncclCommAbort(comm);
  tdist__free(slot);
  tdist__nccl_state_free(nc);
  return rc;
}

/* Survivors only (tdist_group_shrink): a rank failed. The survivors make a
 * communicator of their own over the new group's store, as init does, and
 * never ncclCommShrink the parent's: once NCCL's proxy has seen a peer die,
 * every shrink of that communicator fails (NCCL 2.28.9: the remote error is
 * permanent, ncclCommInitChildComm -> ncclCommEnsureReady), and whether a
 * survivor's proxy saw it differs per rank (only network peers are
 * watched), so a per-rank choice would split the survivors. Taking the same
 * path after every failure, they agree without a word. A parent the core
 * has not aborted yet (the shrink got ahead of the death record) is failed
 * first: its kernels, waiting for the dead rank, must not stay on the GPU.
 * The old communicator's abort (its own thread) is not waited for. */
int tdist__nccl_shrink(const tdist_backend_params_t *p, tdist_backend_out_t *out) {
  tdist__nccl_t *pn = p->parent;
  pthread_mutex_lock(&pn->mu);
  int live = !pn->dead;
  pthread_mutex_unlock(&pn->mu);
  if (live && !tdist_backend_aborted(pn->group))
    tdist__nccl_fail_group(pn, TDIST_ERR_ABORTED,
                           "group '%s' was shrunk while its communicator was live: aborted, so "
                           "that none of its kernels waits on the GPU for a rank left out",
                           pn->name);
  return init_on(p, child_device(p, pn), out);
}
