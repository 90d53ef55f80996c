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
/* Job: map the segment, take the rank's slot, wait for every rank (the
 * bootstrap's all-gather of ranks' info; it waits as long as a rank is
 * missing, until the communicator is aborted). */
ncclResult_t gs_comm_init_job(ncclComm_t c, void *arg) {
  (void)arg;
  ncclResult_t r = gs_seg_attach(&c->seg, c->key, c->nranks);
  if (r != ncclSuccess) return r;
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
  ncclComm_t c = comm_new(key, rank, nranks, dev, cfg, blocking_default, name);
  if (!c) return gs_fail(ncclSystemError, "out of host memory for a communicator");
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

GS_API ncclResult_t ncclCommInitRankConfig(ncclComm_t *newcomm, int nranks, ncclUniqueId id,
                                           int rank, ncclConfig_t *config) {
  if (!newcomm) return gs_fail(ncclInvalidArgument, "CommInitRank : newcomm argument is NULL");
  *newcomm = NULL;
  ncclResult_t r = check_config(config);
  if (r != ncclSuccess) return r;
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return gs_fail(ncclInvalidArgument, "Invalid rank requested : %d/%d", rank, nranks);
  if (nranks > GS_MAX_RANKS)
    return gs_fail(ncclSystemError, "the simulated NCCL supports at most %d ranks, asked %d",
                   GS_MAX_RANKS, nranks);
  if (memcmp(id.internal, GS_ID_MAGIC, 8) != 0)
    return gs_fail(ncclInvalidArgument, "unique id was not made by this library's ncclGetUniqueId");
  /* The communicator's device is the caller's current one (init.cc
   * ncclCommInitRankConfig: cudaGetDevice), and init uses its context. */
  int dev = gs_current_device();
  cudaError_t ce = gs_context_use(dev);
  if (ce != cudaSuccess)
    return gs_fail(ncclUnhandledCudaError, "Cuda failure '%s'", cudaGetErrorString(ce));
  ncclComm_t c = NULL;
  r = gs_comm_create(&c, (const unsigned char *)id.internal + 8, rank, nranks, dev, config, 1, "",
                     0);
  if (r != ncclSuccess) return r;
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
  reg_del(c);
  job_join(c);
  gs_comm_drain(c);
  pthread_mutex_lock(&c->mu);
  c->destroyed = 1;
  pthread_mutex_unlock(&c->mu);
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
