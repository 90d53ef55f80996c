/*
 * comm.c - the simulated communicator's life: registry, async errors, jobs,
 * ncclGetUniqueId, init, finalize, destroy, abort, revoke and the queries.
 * Split and shrink are in split.c.
 *
 * Follows NCCL 2.28's src/init.cc unless a comment says otherwise:
 *   - non-blocking communicators (config.blocking = 0) run init, split,
 *     shrink, finalize, revoke and every group launch as an async job on
 *     its own thread; the communicator answers ncclInProgress meanwhile
 *     (group.cc ncclGroupEndInternal, ncclAsyncLaunch);
 *   - ncclCommSetAsyncError simply stores the state (init.cc): an error
 *     stays until a later job stores its own result;
 *   - ncclCommEnsureReady: using a communicator that is in progress is
 *     ncclInvalidArgument ("Attempt to use communicator before the previous
 *     operation returned ncclSuccess"), which the enqueue path then stores
 *     as the async error (enqueue.cc ncclEnqueueCheck) -- so misuse becomes
 *     the communicator's error for good;
 *   - the proxy's error (a dead peer on another host, kernel.c) is kept for
 *     good: revoke does not clear it (proxy.cc asyncResult), so a shrink
 *     after it fails in ncclCommEnsureReady;
 *   - ncclCommGetAsyncError completes and unlinks the group job a
 *     non-blocking launch linked (comm->groupJob); revoke frees that job
 *     and leaves the link, which the simulation counts as a use after free
 *     when it is next completed (group.cc ncclGroupJobAbort).
 * Threads: caller threads, job threads, stream workers (kernel.c holds
 * references). `mu` guards the fields marked (mu) in nccl_sim.h.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "gpusim/nccl_sim.h"

atomic_long gs_comm_violations;
atomic_long gs_mismatches;

/* ---- last error (ncclGetLastError: one process-wide buffer in NCCL) ---------------- */
static pthread_mutex_t err_mu = PTHREAD_MUTEX_INITIALIZER;
static char last_error[1024];

void gs_set_last_error(const char *fmt, ...) {
  char buf[sizeof(last_error)];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&err_mu);
  memcpy(last_error, buf, sizeof(buf));
  pthread_mutex_unlock(&err_mu);
}

ncclResult_t gs_fail(ncclResult_t r, const char *fmt, ...) {
  char buf[sizeof(last_error)];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  gs_warn("%s", buf);
  gs_set_last_error("%s", buf);
  return r;
}

GS_API const char *ncclGetLastError(ncclComm_t comm) {
  (void)comm; /* NCCL keeps one buffer for the process (debug.cc ncclLastError) */
  static __thread char copy[sizeof(last_error)];
  pthread_mutex_lock(&err_mu);
  memcpy(copy, last_error, sizeof(copy));
  pthread_mutex_unlock(&err_mu);
  return copy;
}

/* The strings of NCCL's ncclGetErrorString (src/misc/... init.cc). */
GS_API const char *ncclGetErrorString(ncclResult_t r) {
  switch (r) {
  case ncclSuccess: return "no error";
  case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
  case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
  case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
  case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
  case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
  case ncclRemoteError: return "remote process exited or there was a network error";
  case ncclInProgress: return "NCCL operation in progress";
  default: return "unknown result code";
  }
}

GS_API ncclResult_t ncclGetVersion(int *version) {
  if (!version) return ncclInvalidArgument;
  *version = GS_NCCL_VERSION;
  return ncclSuccess;
}

/* An id: the magic, then 16 random bytes that name the segment. NCCL's
 * holds the root's bootstrap address (bootstrap.cc bootstrapGetUniqueId). */
GS_API ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  if (!id) return gs_fail(ncclInvalidArgument, "ncclGetUniqueId : uniqueId argument is NULL");
  memset(id, 0, sizeof(*id));
  memcpy(id->internal, GS_ID_MAGIC, 8);
  size_t got = 0;
  while (got < 16) {
    ssize_t n = getrandom(id->internal + 8 + got, 16 - got, 0);
    if (n < 0 && errno != EINTR) return gs_fail(ncclSystemError, "getrandom: %s", strerror(errno));
    if (n > 0) got += (size_t)n;
  }
  return ncclSuccess;
}

/* ---- registry (CommCheck: NCCL checks magics; a stale pointer is found here) ---- */
static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static ncclComm_t *reg;
static int nreg, capreg;

static void reg_add(ncclComm_t c) {
  pthread_mutex_lock(&reg_mu);
  if (nreg == capreg) {
    int cap = capreg ? capreg * 2 : 16;
    ncclComm_t *n = realloc(reg, sizeof(*n) * (size_t)cap);
    if (n) {
      reg = n;
      capreg = cap;
    }
  }
  if (nreg < capreg) reg[nreg++] = c;
  pthread_mutex_unlock(&reg_mu);
}

static void reg_del(ncclComm_t c) {
  pthread_mutex_lock(&reg_mu);
  for (int i = 0; i < nreg; i++)
    if (reg[i] == c) {
      reg[i] = reg[--nreg];
      break;
    }
  pthread_mutex_unlock(&reg_mu);
}

int gs_comm_valid(ncclComm_t c) {
  int ok = 0;
  pthread_mutex_lock(&reg_mu);
  for (int i = 0; i < nreg && !ok; i++)
    ok = reg[i] == c;
  pthread_mutex_unlock(&reg_mu);
  return ok;
}

int gs_comm_acquire(ncclComm_t c) {
  /* Under reg_mu: a registered communicator still holds its API reference
   * (comm_free unregisters before it drops it), so refs > 0 here. */
  int ok = 0;
  pthread_mutex_lock(&reg_mu);
  for (int i = 0; i < nreg && !ok; i++)
    ok = reg[i] == c;
  if (ok) {
    pthread_mutex_lock(&c->mu);
    c->refs++;
    pthread_mutex_unlock(&c->mu);
  }
  pthread_mutex_unlock(&reg_mu);
  return ok;
}

/* ---- references, async state ------------------------------------------------------ */
static ncclComm_t comm_new(const unsigned char key[16], int rank, int nranks, int dev,
                           const ncclConfig_t *cfg, int blocking_default, const char *name) {
  ncclComm_t c = calloc(1, sizeof(*c));
  if (!c) return NULL;
  c->p2p_connected = calloc((size_t)nranks, 1);
  if (!c->p2p_connected) {
    free(c);
    return NULL;
  }
  c->magic = GS_COMM_MAGIC;
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cv, NULL);
  c->refs = 1;
  memcpy(c->key, key, 16);
  c->rank = rank;
  c->nranks = nranks;
  c->dev = dev;
  c->seg.fd = -1;
  /* parseCommConfig (init.cc): NCCL_CONFIG_UNDEF_INT means the default,
   * blocking; a child without a config inherits its parent's. */
  c->blocking = blocking_default;
  if (cfg && cfg->blocking != NCCL_CONFIG_UNDEF_INT) c->blocking = cfg->blocking != 0;
  snprintf(c->name, sizeof(c->name), "%s", cfg && cfg->commName ? cfg->commName : name);
  atomic_store(&c->async_err, ncclSuccess);
  reg_add(c);
  return c;
}

void gs_comm_retain(ncclComm_t c) {
  pthread_mutex_lock(&c->mu);
  c->refs++;
  pthread_mutex_unlock(&c->mu);
}

void gs_comm_release(ncclComm_t c) {
  pthread_mutex_lock(&c->mu);
  int last = --c->refs == 0;
  pthread_mutex_unlock(&c->mu);
  if (!last) return;
  gs_seg_detach(&c->seg);
  pthread_mutex_destroy(&c->mu);
  pthread_cond_destroy(&c->cv);
  free(c->p2p_connected);
  free(c);
}

void gs_comm_set_async(ncclComm_t c, ncclResult_t r) {
  atomic_store_explicit(&c->async_err, (int)r, memory_order_release);
}

ncclResult_t gs_comm_get_async(ncclComm_t c) {
  ncclResult_t r = (ncclResult_t)atomic_load_explicit(&c->async_err, memory_order_acquire);
  if (r == ncclSuccess) r = (ncclResult_t)atomic_load_explicit(&c->proxy_err, memory_order_acquire);
  return r;
}

void gs_comm_set_proxy_error(ncclComm_t c, ncclResult_t r) {
  atomic_store_explicit(&c->proxy_err, (int)r, memory_order_release);
}

atomic_long gs_use_after_free;

void gs_comm_link_group_job(ncclComm_t c) {
  pthread_mutex_lock(&c->mu);
  if (!c->group_job) { /* group.cc: linked only when comm->groupJob == NULL */
    c->group_job = 1;
    c->group_job_freed = 0;
  }
  pthread_mutex_unlock(&c->mu);
}

/* ncclGroupJobAbort(comm->groupJob) from ncclCommEnsureReady with the abort
 * flag set (ncclCommRevoke): the job is joined and deleted (its only
 * reference), comm->groupJob is left as it was. A second abort of the same
 * dangling pointer reads freed memory too. Caller thread. */
static void group_job_abort(ncclComm_t c) {
  pthread_mutex_lock(&c->mu);
  int uaf = c->group_job && c->group_job_freed;
  if (c->group_job) c->group_job_freed = 1;
  pthread_mutex_unlock(&c->mu);
  if (uaf) {
    atomic_fetch_add(&gs_use_after_free, 1);
    gs_warn("comm %p (%s): ncclGroupJobAbort on comm->groupJob, already freed by an earlier "
            "revoke (use after free in NCCL 2.28 group.cc)",
            (void *)c, c->name);
  }
}

ncclResult_t gs_comm_async_error(ncclComm_t c) {
  ncclResult_t r = gs_comm_get_async(c);
  if (r != ncclSuccess) return r;
  /* init.cc ncclCommGetAsyncError: "if there is linked group job, we should
   * complete it": ncclGroupJobComplete(comm->groupJob); comm->groupJob = NULL. */
  pthread_mutex_lock(&c->mu);
  int uaf = c->group_job && c->group_job_freed;
  c->group_job = c->group_job_freed = 0;
  pthread_mutex_unlock(&c->mu);
  if (uaf) {
    /* On a GPU this reads (and may delete again) the job revoke freed: a
     * heap use after free. The simulation counts it instead of crashing. */
    atomic_fetch_add(&gs_use_after_free, 1);
    gs_warn("comm %p (%s): ncclCommGetAsyncError completes comm->groupJob, which "
            "ncclCommRevoke freed while an enqueue was in flight (use after free in NCCL 2.28 "
            "init.cc/group.cc)",
            (void *)c, c->name);
  }
  return r;
}

ncclResult_t gs_comm_ensure_ready(ncclComm_t c) {
  if (atomic_load(&c->abort_flag)) return ncclSuccess; /* the job is being aborted */
  ncclResult_t r = gs_comm_async_error(c);
  if (r == ncclInProgress)
    return gs_fail(
        ncclInvalidArgument,
        "Attempt to use communicator before the previous operation returned ncclSuccess");
  return r;
}

void gs_comm_enter(ncclComm_t c) {
  if (atomic_fetch_add(&c->in_call, 1) > 0) {
    atomic_fetch_add(&gs_comm_violations, 1);
    gs_warn("communicator %p (%s): two threads inside NCCL calls on it at once", (void *)c,
            c->name);
  }
}

void gs_comm_leave(ncclComm_t c) { atomic_fetch_sub(&c->in_call, 1); }

/* ---- jobs --------------------------------------------------------------------------- */
typedef struct gs_job {
  ncclComm_t c;
  gs_job_fn fn;
  void *arg;
} gs_job_t;

static void *job_main(void *p) {
  gs_job_t j = *(gs_job_t *)p;
  free(p);
  gs_check_exit("an NCCL job's cudaSetDevice");
  gs_set_current_device(j.c->dev); /* NCCL's job threads cudaSetDevice(comm->cudaDev) */
  ncclResult_t r = j.fn(j.c, j.arg);
  gs_comm_set_async(j.c, r);
  /* Detached: the end is announced, not joined, so a process that exits
   * with a job just finished leaves no thread behind. */
  pthread_mutex_lock(&j.c->mu);
  j.c->job_running = 0;
  pthread_cond_broadcast(&j.c->cv);
  pthread_mutex_unlock(&j.c->mu);
  return NULL;
}

/* Wait until the job thread (if any) has ended. Caller thread, not under mu
 * (NCCL joins its job thread the same way before the next job). */
static void job_join(ncclComm_t c) {
  pthread_mutex_lock(&c->mu);
  while (c->job_running)
    pthread_cond_wait(&c->cv, &c->mu);
  pthread_mutex_unlock(&c->mu);
}

ncclResult_t gs_comm_job(ncclComm_t c, gs_job_fn fn, void *arg) {
  if (c->blocking) {
    int saved = gs_current_device(); /* NCCL saves and restores the caller's device */
    gs_set_current_device(c->dev);
    ncclResult_t r = fn(c, arg);
    gs_set_current_device(saved);
    return r;
  }
  job_join(c); /* the previous job ended: the communicator was ready */
  gs_job_t *j = malloc(sizeof(*j));
  if (!j) return gs_fail(ncclSystemError, "out of host memory for a job");
  j->c = c;
  j->fn = fn;
  j->arg = arg;
  gs_comm_set_async(c, ncclInProgress);
  pthread_attr_t at;
  pthread_attr_init(&at);
  pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
  pthread_mutex_lock(&c->mu);
  c->job_running = 1;
  int rc = pthread_create(&c->job, &at, job_main, j);
  if (rc != 0) c->job_running = 0;
  pthread_mutex_unlock(&c->mu);
  pthread_attr_destroy(&at);
  if (rc != 0) {
    free(j);
    gs_comm_set_async(c, ncclSystemError);
    return gs_fail(ncclSystemError, "pthread_create: %s", strerror(rc));
  }
  return ncclInProgress;
}

void gs_comm_wake(ncclComm_t c) {
  /* `ready` is set (under mu) once the init job mapped the segment; before
   * that, the job's own waits notice the abort flag within GS_POLL_MS. */
  pthread_mutex_lock(&c->mu);
  int ready = c->ready;
  pthread_mutex_unlock(&c->mu);
  if (ready) gs_seg_wake(&c->seg);
}

void gs_comm_drain(ncclComm_t c) {
  pthread_mutex_lock(&c->mu);
  while (c->inflight > 0)
    pthread_cond_wait(&c->cv, &c->mu);
  pthread_mutex_unlock(&c->mu);
}

/* ---- init --------------------------------------------------------------------------- */
/* FNV-1a over the ids an init was given (the simulation's own digest). */
static uint64_t ids_digest(const ncclUniqueId *ids, int n) {
  uint64_t h = 1469598103934665603ULL;
  const unsigned char *b = (const unsigned char *)ids;
  for (size_t i = 0; i < (size_t)n * sizeof(*ids); i++)
    h = (h ^ b[i]) * 1099511628211ULL;
  return h ^ (uint64_t)n;
}

/* Every rank joined: did they pass the same ids? NCCL never compares them:
 * with ncclCommInitRankScalable each rank contacts the root its rank maps
 * to (bootstrap.cc rootIdFromRank) at the address in that id, so a rank
 * given another array reaches a root that does not expect it, or none, and
 * the bootstrap ring never closes -- every rank waits until the
 * communicator is aborted. The simulation does the same wait, but first
 * counts the mismatch (tdist_gpusim_mismatches) and says why. Split and
 * shrink children (nids 0) are keyed by their parent: nothing to check. */
static ncclResult_t ids_agree(ncclComm_t c) {
  if (c->nids == 0) return ncclSuccess;
  int bad = -1;
  for (int j = 0; j < c->nranks && bad < 0; j++) {
    gs_slot_t *o = gs_slot(&c->seg, j);
    if (o->nids != c->nids || o->ids_digest != c->ids_digest) bad = j;
  }
  if (bad < 0) return ncclSuccess;
  atomic_fetch_add(&gs_mismatches, 1);
  gs_warn("comm %p rank %d: rank %d passed other unique ids to its init (%u ids here, %u there): "
          "NCCL's bootstrap would never complete; waiting for the abort",
          (void *)c, c->rank, bad, c->nids, gs_slot(&c->seg, bad)->nids);
  while (!atomic_load(&c->abort_flag) &&
         !(c->init_parent && atomic_load(&c->init_parent->abort_flag))) {
    uint32_t w = gs_seg_word(&c->seg);
    gs_seg_sleep(&c->seg, w);
  }
  gs_seg_unlink(&c->seg);
  return ncclInternalError;
}

/* Job: map the segment, take the rank's slot, wait for every rank (the
 * bootstrap's all-gather of ranks' info; it waits as long as a rank is
 * missing, until the communicator is aborted). */
ncclResult_t gs_comm_init_job(ncclComm_t c, void *arg) {
  (void)arg;
  ncclResult_t r = gs_seg_attach(&c->seg, c->key, c->nranks);
  if (r != ncclSuccess) return r;
  gs_slot(&c->seg, c->rank)->nids = c->nids; /* published by the claim's store */
  gs_slot(&c->seg, c->rank)->ids_digest = c->ids_digest;
  r = gs_slot_claim(&c->seg, c->rank, c->dev, gs_device_cc(c->dev));
  if (r != ncclSuccess) return r;
  int min_cc = 1000;
  for (int j = 0; j < c->nranks; j++) {
    for (;;) {
      uint32_t w = gs_seg_word(&c->seg);
      if (atomic_load(&gs_slot(&c->seg, j)->state) != GS_SLOT_FREE) break;
      if (atomic_load(&c->abort_flag) ||
          (c->init_parent && atomic_load(&c->init_parent->abort_flag))) {
        /* The init is abandoned (a rank never came): take the name away, so
         * no file is left in /dev/shm (a rank still to come would make a
         * new one and wait alone, as it would for a job that is gone). */
        gs_seg_unlink(&c->seg);
        return ncclInternalError;
      }
      gs_seg_sleep(&c->seg, w);
    }
    int cc = gs_slot(&c->seg, j)->cc;
    if (cc < min_cc) min_cc = cc;
  }
  r = ids_agree(c);
  if (r != ncclSuccess) return r;
  gs_seg_unlink(&c->seg); /* every rank has it open: the name is no longer needed */
  pthread_mutex_lock(&c->mu);
  c->min_cc = min_cc;
  c->ready = 1;
  pthread_mutex_unlock(&c->mu);
  gs_info("comm %p rank %d nranks %d cudaDev %d - Init COMPLETE", (void *)c, c->rank, c->nranks,
          c->dev);
  return ncclSuccess;
}

ncclResult_t gs_comm_create(ncclComm_t *out, const unsigned char key[16], int rank, int nranks,
                            int dev, const ncclConfig_t *cfg, int blocking_default,
                            const char *name, int run_init) {
  gs_config_t parsed;
  ncclResult_t r = gs_config_parse(cfg, &parsed);
  if (r != ncclSuccess) return r;
  ncclComm_t c = comm_new(key, rank, nranks, dev, cfg, blocking_default, name);
  if (!c) return gs_fail(ncclSystemError, "out of host memory for a communicator");
  c->cfg = parsed;
  *out = c;
  if (!run_init) return ncclSuccess;
  return gs_comm_init_job(c, NULL);
}

static ncclResult_t check_config(const ncclConfig_t *cfg) {
  /* parseCommConfig: a config not made by NCCL_CONFIG_INITIALIZER is refused. */
  if (cfg && (cfg->magic != 0xcafebeefu || cfg->size < 5 * sizeof(int)))
    return gs_fail(ncclInvalidArgument,
                   "ncclConfig_t argument not initialized via NCCL_CONFIG_INITIALIZER");
  return ncclSuccess;
}

/* parseCommConfig, NCCL 2.28.9 init.cc: a layout older than a field's
 * release gets that field's default; then the checks (an error is
 * ncclInvalidArgument with NCCL's WARN text), the defaults
 * (NCCL_CONFIG_DEFAULT: cgaClusterSize 4, minCTAs 1, maxCTAs MAXCHANNELS = 64,
 * netName NULL, splitShare 0, trafficClass undefined) and envConfigOverride's
 * caps (minCTAs and maxCTAs above MAXCHANNELS become 64, then minCTAs above
 * maxCTAs becomes maxCTAs). The NCCL_* environment overrides are not
 * modelled. */
ncclResult_t gs_config_parse(const ncclConfig_t *in, gs_config_t *out) {
  const int U = NCCL_CONFIG_UNDEF_INT;
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  if (in) {
    size_t n = in->size < sizeof(c) ? in->size : sizeof(c); /* realSize */
    memcpy(&c, in, n);
    if (c.version < TDIST__NCCL_VERSION(2, 17, 0)) {
      c.cgaClusterSize = c.minCTAs = c.maxCTAs = U;
      c.netName = NULL;
    }
    if (c.version < TDIST__NCCL_VERSION(2, 25, 0)) c.trafficClass = U;
  }
  if (c.cgaClusterSize != U && c.cgaClusterSize < 0)
    return gs_fail(ncclInvalidArgument, "Invalid config cgaClusterSize attribute value %d",
                   c.cgaClusterSize);
  if ((c.minCTAs != U && c.minCTAs <= 0) || (c.maxCTAs != U && c.maxCTAs <= 0) ||
      (c.minCTAs > c.maxCTAs))
    return gs_fail(ncclInvalidArgument, "Invalid config min/max channels attribute value %d/%d",
                   c.minCTAs, c.maxCTAs);
  if (c.splitShare != U && c.splitShare != 0 && c.splitShare != 1)
    return gs_fail(ncclInvalidArgument, "Invalid config splitShare attribute value %d",
                   c.splitShare);
  memset(out, 0, sizeof(*out));
  out->cgaClusterSize = c.cgaClusterSize == U ? 4 : c.cgaClusterSize;
  out->minCTAs = c.minCTAs == U ? 1 : c.minCTAs;
  out->maxCTAs = c.maxCTAs == U ? 64 : c.maxCTAs;
  out->splitShare = c.splitShare == U ? 0 : c.splitShare;
  out->trafficClass = c.trafficClass;
  if (c.netName) snprintf(out->netName, sizeof(out->netName), "%s", c.netName);
  if (out->minCTAs > 64) out->minCTAs = 64;
  if (out->maxCTAs > 64) out->maxCTAs = 64;
  if (out->minCTAs > out->maxCTAs) out->minCTAs = out->maxCTAs;
  return ncclSuccess;
}

/* Both inits: the checks, then a communicator keyed by the first id (the
 * bootstrap ring's magic is handle 0's, bootstrap.cc bootstrapInit), with
 * the digest of all `nids` ids to compare with the other ranks'. */
static ncclResult_t init_rank(ncclComm_t *newcomm, int nranks, int rank, int nids,
                              const ncclUniqueId *ids, ncclConfig_t *config) {
  ncclResult_t r = check_config(config);
  if (r != ncclSuccess) return r;
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return gs_fail(ncclInvalidArgument, "Invalid rank requested : %d/%d", rank, nranks);
  if (nranks > GS_MAX_RANKS)
    return gs_fail(ncclSystemError, "the simulated NCCL supports at most %d ranks, asked %d",
                   GS_MAX_RANKS, nranks);
  for (int i = 0; i < nids; i++)
    if (memcmp(ids[i].internal, GS_ID_MAGIC, 8) != 0)
      return gs_fail(ncclInvalidArgument,
                     "unique id %d was not made by this library's ncclGetUniqueId", i);
  /* The communicator's device is the caller's current one (init.cc
   * ncclCommInitRankConfig: cudaGetDevice), and init uses its context. */
  int dev = gs_current_device();
  cudaError_t ce = gs_context_use(dev);
  if (ce != cudaSuccess)
    return gs_fail(ncclUnhandledCudaError, "Cuda failure '%s'", cudaGetErrorString(ce));
  ncclComm_t c = NULL;
  r = gs_comm_create(&c, (const unsigned char *)ids[0].internal + 8, rank, nranks, dev, config, 1,
                     "", 0);
  if (r != ncclSuccess) return r;
  c->nids = (uint32_t)nids;
  c->ids_digest = ids_digest(ids, nids);
  /* Non-blocking: *newcomm is written before the job starts, so the
   * caller can poll it (init.cc ncclCommInitRankDev). */
  if (!c->blocking) *newcomm = c;
  r = gs_comm_job(c, gs_comm_init_job, NULL);
  if (c->blocking) {
    if (r != ncclSuccess) {
      reg_del(c);
      gs_comm_release(c);
      return r;
    }
    *newcomm = c;
  }
  return r;
}

/* init.cc ncclCommInitRankScalable -> ncclCommInitRankDev (2.23+): nId ids,
 * one per bootstrap root, the same array on every rank; 1 <= nId <= nranks
 * ("improper usage of ncclCommInitRank"). */
GS_API ncclResult_t ncclCommInitRankScalable(ncclComm_t *newcomm, int nranks, int myrank, int nId,
                                             ncclUniqueId *commId, ncclConfig_t *config) {
  if (nId <= 0 || nId > nranks)
    return gs_fail(ncclInvalidArgument, "improper usage of ncclCommInitRank: nId = %d, nranks=%d",
                   nId, nranks);
  if (!newcomm) return gs_fail(ncclInvalidArgument, "CommInitRank : newcomm argument is NULL");
  *newcomm = NULL;
  if (!commId) return gs_fail(ncclInvalidArgument, "CommInitRank : commId argument is NULL");
  return init_rank(newcomm, nranks, myrank, nId, commId, config);
}

GS_API ncclResult_t ncclCommInitRankConfig(ncclComm_t *newcomm, int nranks, ncclUniqueId id,
                                           int rank, ncclConfig_t *config) {
  if (!newcomm) return gs_fail(ncclInvalidArgument, "CommInitRank : newcomm argument is NULL");
  *newcomm = NULL;
  return init_rank(newcomm, nranks, rank, 1, &id, config);
}

GS_API ncclResult_t ncclCommInitRank(ncclComm_t *newcomm, int nranks, ncclUniqueId id, int rank) {
  return ncclCommInitRankConfig(newcomm, nranks, id, rank, NULL);
}

/* ---- finalize, destroy, abort, revoke ------------------------------------------------ */
static ncclResult_t drain_job(ncclComm_t c, void *arg) {
  (void)arg;
  gs_comm_drain(c);
  return ncclSuccess;
}

GS_API ncclResult_t ncclCommFinalize(ncclComm_t c) {
  if (!gs_comm_valid(c)) return gs_fail(ncclInvalidArgument, "CommFinalize : comm is not valid");
  gs_comm_enter(c);
  ncclResult_t r = gs_comm_ensure_ready(c);
  if (r == ncclSuccess) {
    pthread_mutex_lock(&c->mu);
    int again = c->finalized;
    c->finalized = 1;
    pthread_mutex_unlock(&c->mu);
    /* init.cc ncclCommFinalize: "prevent double finalize", ncclInvalidArgument. */
    r = again ? gs_fail(ncclInvalidArgument, "comm %p has already been finalized", (void *)c)
              : gs_comm_job(c, drain_job, NULL);
  }
  gs_comm_leave(c);
  return r;
}

/* Leave the communicator for good: peers now see this rank gone. */
static void comm_leave_seg(ncclComm_t c) {
  if (c->seg.hdr) {
    atomic_store(&gs_slot(&c->seg, c->rank)->state, GS_SLOT_LEFT);
    gs_seg_wake(&c->seg);
  }
}

void gs_comm_discard(ncclComm_t c) {
  reg_del(c);
  comm_leave_seg(c);
  gs_comm_release(c);
}

static void comm_free(ncclComm_t c) {
  /* No launch from here on (nk_instance): ncclCommAbort sets the abort
   * flags before it reclaims anything (init.cc, setCommAbortFlags, then
   * commReclaim), and what a graph launched on an aborted communicator does
   * NCCL leaves undefined; the simulation refuses it from the start. Set
   * before the communicator leaves the live count, which tests wait on: a
   * graph launched after the count dropped ran while the drain below still
   * did (nccl_sim_graph abort_then_replay, TSan on a loaded machine). */
  pthread_mutex_lock(&c->mu);
  c->destroyed = 1;
  pthread_mutex_unlock(&c->mu);
  reg_del(c);
  job_join(c);
  gs_comm_drain(c);
  gs_reg_free_all(c); /* commReclaim frees the registration cache */
  comm_leave_seg(c);
  gs_comm_release(c); /* kernels or graphs may hold it a little longer */
}

GS_API ncclResult_t ncclCommDestroy(ncclComm_t c) {
  if (c == NULL) return ncclSuccess;
  if (!gs_comm_valid(c))
    return gs_fail(ncclInvalidArgument, "comm %p has already been destroyed", (void *)c);
  gs_comm_enter(c);
  /* init.cc ncclCommDestroy: NCCLCHECK(ncclCommEnsureReady(comm)) -- a
   * communicator in progress or with an async error is NOT destroyed; the
   * error comes back and the caller must abort it instead. */
  ncclResult_t r = gs_comm_ensure_ready(c);
  gs_comm_leave(c);
  if (r != ncclSuccess) return r;
  /* Destroy without finalize waits for the communicator's work (commReclaim). */
  comm_free(c);
  return ncclSuccess;
}

GS_API ncclResult_t ncclCommAbort(ncclComm_t c) {
  if (c == NULL) return ncclSuccess;
  if (!gs_comm_valid(c)) return gs_fail(ncclInvalidArgument, "CommAbort : comm is not valid");
  /* setCommAbortFlags: kernels and jobs stop at their next check. Then
   * commReclaim waits for them: abort blocks until the kernels stop, which
   * a kernel stuck behind other work on its stream delays. */
  atomic_store(&c->abort_flag, 1);
  gs_comm_wake(c);
  gs_info("comm %p rank %d - Abort START", (void *)c, c->rank);
  comm_free(c);
  return ncclSuccess;
}

static ncclResult_t revoke_job(ncclComm_t c, void *arg) {
  (void)arg;
  gs_comm_drain(c); /* commRevokeAsync: synchronise the streams */
  /* The proxy's error stays: proxy.cc keeps proxyState->asyncResult and
   * nothing clears it (ncclProxyStop does not), so ncclCommGetAsyncError
   * still answers ncclRemoteError after the revoke, and a shrink then fails
   * in ncclCommInitChildComm -> ncclCommEnsureReady (measured on an H200,
   * NCCL 2.28.9). */
  atomic_store(&c->abort_flag, 0); /* setCommAbortFlags(comm, 0) */
  return ncclSuccess;
}

GS_API ncclResult_t ncclCommRevoke(ncclComm_t c, int flags) {
  if (c == NULL) return ncclSuccess;
  if (!gs_comm_valid(c)) return gs_fail(ncclInvalidArgument, "CommRevoke : comm is not valid");
  if (flags != NCCL_REVOKE_DEFAULT) return ncclInvalidArgument;
  pthread_mutex_lock(&c->mu);
  int bad = c->finalized || c->revoked;
  if (!bad) c->revoked = c->finalized = 1;
  pthread_mutex_unlock(&c->mu);
  if (bad) return ncclInvalidArgument; /* revoke after finalize or revoke (init.cc) */
  gs_comm_enter(c);
  atomic_store(&c->abort_flag, 1);
  gs_comm_wake(c);
  /* init.cc calls ncclCommEnsureReady here to join a running init; with the
   * abort flag set it runs ncclGroupJobAbort(comm->groupJob) (freeing a
   * linked group job, the pointer left in place) and succeeds, and
   * gs_comm_job joins the thread. */
  group_job_abort(c);
  ncclResult_t r = gs_comm_job(c, revoke_job, NULL);
  gs_comm_leave(c);
  return r;
}

/* init.cc ncclCommGetAsyncError. It writes the communicator (it completes
 * and unlinks comm->groupJob), so the concurrency checker counts it like
 * any call that enters: a watchdog thread polling it while another thread
 * is inside a call on the communicator races with that call. */
GS_API ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *st) {
  if (!gs_comm_valid(c) || !st) return ncclInvalidArgument;
  gs_comm_enter(c);
  *st = gs_comm_async_error(c);
  gs_comm_leave(c);
  return ncclSuccess;
}

GS_API ncclResult_t ncclCommCount(const ncclComm_t c, int *count) {
  if (!gs_comm_valid(c) || !count) return ncclInvalidArgument;
  *count = c->nranks;
  return ncclSuccess;
}

GS_API ncclResult_t ncclCommCuDevice(const ncclComm_t c, int *device) {
  if (!gs_comm_valid(c) || !device) return ncclInvalidArgument;
  *device = c->dev;
  return ncclSuccess;
}

GS_API ncclResult_t ncclCommUserRank(const ncclComm_t c, int *rank) {
  if (!gs_comm_valid(c) || !rank) return ncclInvalidArgument;
  *rank = c->rank;
  return ncclSuccess;
}

GS_API int tdist_gpusim_live_comms(void) {
  pthread_mutex_lock(&reg_mu);
  int n = nreg;
  pthread_mutex_unlock(&reg_mu);
  return n;
}
GS_API long tdist_gpusim_comm_violations(void) { return atomic_load(&gs_comm_violations); }
GS_API long tdist_gpusim_mismatches(void) { return atomic_load(&gs_mismatches); }
GS_API long tdist_gpusim_use_after_free(void) { return atomic_load(&gs_use_after_free); }

/* Inspection (tdist/gpusim.h): the configuration a live communicator of
 * this process named `name` (its commName) got from parseCommConfig, and
 * the priority of the stream its last kernel was launched on. */
GS_API int tdist_gpusim_comm_config(const char *name, int *min_ctas, int *max_ctas,
                                    int *cga_cluster_size, int *split_share, int *traffic_class,
                                    char *net_name, size_t net_name_len, int *stream_priority) {
  int found = -1;
  if (!name) return -1;
  pthread_mutex_lock(&reg_mu);
  for (int i = 0; i < nreg && found < 0; i++) {
    ncclComm_t c = reg[i];
    if (strcmp(c->name, name) != 0) continue;
    found = 0;
    if (min_ctas) *min_ctas = c->cfg.minCTAs;
    if (max_ctas) *max_ctas = c->cfg.maxCTAs;
    if (cga_cluster_size) *cga_cluster_size = c->cfg.cgaClusterSize;
    if (split_share) *split_share = c->cfg.splitShare;
    if (traffic_class) *traffic_class = c->cfg.trafficClass;
    if (net_name && net_name_len) snprintf(net_name, net_name_len, "%s", c->cfg.netName);
    if (stream_priority) {
      pthread_mutex_lock(&c->mu);
      *stream_priority = c->last_prio;
      pthread_mutex_unlock(&c->mu);
    }
  }
  pthread_mutex_unlock(&reg_mu);
  return found;
}

/* Inspection (tdist/gpusim.h): live registrations of the communicators of
 * this process named `name`; -1 when none has that name. */
GS_API long tdist_gpusim_registrations(const char *name, int windows) {
  long n = -1;
  if (!name) return -1;
  pthread_mutex_lock(&reg_mu);
  for (int i = 0; i < nreg; i++)
    if (strcmp(reg[i]->name, name) == 0) n = (n < 0 ? 0 : n) + gs_reg_count(reg[i], windows);
  pthread_mutex_unlock(&reg_mu);
  return n;
}

/* Inspection (tdist/gpusim.h): the unique ids the init of the live
 * communicator named `name` was given (ncclCommInitRankScalable's nId; 1
 * for ncclCommInitRankConfig; 0 for a split or shrink child); -1 when none
 * has that name. */
GS_API int tdist_gpusim_comm_roots(const char *name) {
  int n = -1;
  if (!name) return -1;
  pthread_mutex_lock(&reg_mu);
  for (int i = 0; i < nreg && n < 0; i++)
    if (strcmp(reg[i]->name, name) == 0) n = (int)reg[i]->nids;
  pthread_mutex_unlock(&reg_mu);
  return n;
}
