/*
 * enqueue.c - the NCCL calls that enqueue work: the collectives, send and
 * recv, ncclGroupStart/End, PreMulSum ops, and the launch of a group's
 * kernels (with the runtime connection they need first).
 *
 * Follows NCCL 2.28:
 *   - enqueue.cc ncclEnqueueCheck: a revoked communicator is
 *     ncclInvalidUsage; otherwise an implicit group around the call,
 *     ncclCommEnsureReady, ArgsCheck (misc/argcheck.cc: root, type, op),
 *     taskAppend (empty collectives are discarded; fp8 reductions below
 *     sm_90 are ncclInvalidArgument from comm->minCompCap); a failure is
 *     stored as the non-blocking communicator's async error, and a
 *     non-blocking call returns the async state afterwards;
 *   - group.cc ncclGroupEndInternal: a depth-0 end without a start is
 *     ncclInvalidUsage; an error recorded inside the group fails the whole
 *     group; blocking and non-blocking communicators cannot be mixed; a
 *     non-blocking group with work is launched by a job thread and returns
 *     ncclInProgress -- not only when connections are needed (a group whose
 *     calls were all empty launches nothing and returns ncclSuccess);
 *   - runtime connection (NCCL_RUNTIME_CONNECT=1, the default since 2.22):
 *     the first collective connects with every rank, the first send/recv
 *     with a peer connects with that peer; the launch waits for them, so a
 *     missing rank keeps a non-blocking communicator ncclInProgress; at 3
 *     ranks and more the first collective above GS_ALGO_BYTES connects a
 *     second algorithm and waits again for every rank's first such use
 *     (measured on an H200);
 *   - group.cc: a non-blocking launch links its group job to the
 *     communicator (comm->groupJob), unlinked by ncclCommGetAsyncError.
 * Group state is per thread, as NCCL's (thread_local ncclGroupDepth).
 */
#include <stdlib.h>
#include <string.h>

#include "gpusim/nccl_sim.h"

#define GS_NUM_OPS 5 /* ncclNumOps: ncclSum .. ncclAvg */

typedef struct plan {
  ncclComm_t c;
  gs_task_t *tasks;
  int n, cap;
} plan_t;

static __thread int depth;
static __thread ncclResult_t group_err;
static __thread plan_t *plans;
static __thread int nplans, capplans;

static ncclResult_t group_err_check(ncclResult_t r) {
  if (depth > 0 && r != ncclSuccess && r != ncclInProgress) group_err = r;
  return r;
}

static const char *func_name(gs_func_t f) {
  static const char *const n[] = {"AllReduce", "Broadcast", "Reduce",  "AllGather", "ReduceScatter",
                                  "AlltoAll",  "Gather",    "Scatter", "Send",      "Recv"};
  return n[f];
}

static int is_reducing(gs_func_t f) {
  return f == GS_ALLREDUCE || f == GS_REDUCE || f == GS_REDUCESCATTER;
}

/* Resolve the reduction as taskAppend does, copying a PreMulSum's state
 * (the op may be destroyed before ncclGroupEnd). */
static ncclResult_t resolve_op(ncclComm_t c, gs_task_t *t, ncclRedOp_t op, const char *name) {
  if ((int)op < 0)
    return gs_fail(ncclInvalidArgument, "%s : invalid reduction operation %d", name, (int)op);
  if ((int)op < GS_NUM_OPS) return gs_redop_builtin(&t->red, op, t->dt, c->nranks);
  int ix = (int)op - GS_NUM_OPS;
  pthread_mutex_lock(&c->mu);
  int ok = ix < GS_MAX_PREMUL && c->premul[ix].used && c->premul[ix].dt == t->dt;
  gs_premul_t pm = ok ? c->premul[ix] : (gs_premul_t){0};
  pthread_mutex_unlock(&c->mu);
  if (!ok)
    return gs_fail(ncclInvalidArgument, "%s : reduction operation %d unknown to this communicator",
                   name, (int)op);
  if (pm.residence == ncclScalarHostImmediate) {
    gs_redop_premul(&t->red, t->dt, pm.host);
  } else {
    unsigned char zero[8] = {0};
    gs_redop_premul(&t->red, t->dt, zero);
    t->dev_scalar = pm.dev_scalar; /* read by the kernel, in stream order */
  }
  return ncclSuccess;
}

static ncclResult_t plan_add(ncclComm_t c, const gs_task_t *t) {
  plan_t *p = NULL;
  for (int i = 0; i < nplans; i++)
    if (plans[i].c == c) p = &plans[i];
  if (!p) {
    if (nplans == capplans) {
      int cap = capplans ? capplans * 2 : 4;
      plan_t *n = realloc(plans, sizeof(*n) * (size_t)cap);
      if (!n) return gs_fail(ncclSystemError, "out of host memory");
      plans = n;
      capplans = cap;
    }
    p = &plans[nplans++];
    memset(p, 0, sizeof(*p));
    p->c = c;
    gs_comm_retain(c);
  }
  if (p->n == p->cap) {
    int cap = p->cap ? p->cap * 2 : 8;
    gs_task_t *n = realloc(p->tasks, sizeof(*n) * (size_t)cap);
    if (!n) return gs_fail(ncclSystemError, "out of host memory");
    p->tasks = n;
    p->cap = cap;
  }
  p->tasks[p->n++] = *t;
  return ncclSuccess;
}

static ncclResult_t check_and_append(ncclComm_t c, gs_task_t *t, ncclRedOp_t op) {
  const char *name = func_name(t->func);
  /* misc/argcheck.cc ArgsCheck: root (the peer for send/recv) and type. */
  if (t->root < 0 || t->root >= c->nranks)
    return gs_fail(ncclInvalidArgument, "%s : invalid root %d (root should be in the 0..%d range)",
                   name, t->root, c->nranks);
  if (gs_dtype_size(t->dt) == 0)
    return gs_fail(ncclInvalidArgument, "%s : invalid type %d", name, (int)t->dt);
  if (is_reducing(t->func)) {
    t->has_red = 1;
    ncclResult_t r = resolve_op(c, t, op, name);
    if (r != ncclSuccess) return r;
  }
  if (t->func != GS_SEND && t->func != GS_RECV) {
    if (t->count == 0) return ncclSuccess; /* taskAppend: empty collectives are discarded */
    if ((t->dt == ncclFloat8e4m3 || t->dt == ncclFloat8e5m2) && c->min_cc < 90 &&
        t->func != GS_ALLGATHER && t->func != GS_BROADCAST && t->func != GS_ALLTOALL &&
        t->func != GS_SCATTER && t->func != GS_GATHER)
      return gs_fail(ncclInvalidArgument,
                     "FP8 reduction support begins with sm90 capable devices.");
  }
  return plan_add(c, t);
}

static ncclResult_t group_end_internal(void);

static ncclResult_t enqueue(gs_task_t *t, ncclRedOp_t op, ncclComm_t c) {
  /* Our own reference for the whole call: a blocking call can wait inside
   * (runtime connection) while another thread's ncclCommAbort frees the
   * communicator's API reference; the abort flag ends the wait and this
   * call must still find its memory. */
  if (!gs_comm_acquire(c))
    return group_err_check(
        gs_fail(ncclInvalidArgument, "%s : comm argument is invalid", func_name(t->func)));
  pthread_mutex_lock(&c->mu);
  int revoked = c->revoked;
  pthread_mutex_unlock(&c->mu);
  if (revoked) {
    gs_comm_release(c);
    gs_fail(ncclInvalidUsage, "%s: communicator was revoked", func_name(t->func));
    return group_err_check(ncclInvalidUsage);
  }
  gs_comm_enter(c);
  depth++;
  ncclResult_t r = gs_comm_ensure_ready(c);
  if (r == ncclSuccess) r = check_and_append(c, t, op);
  if (r != ncclSuccess && !c->blocking) gs_comm_set_async(c, r);
  group_err_check(r);
  ncclResult_t e = group_end_internal(); /* a blocking launch runs inside the call */
  if (e != ncclSuccess && e != ncclInProgress) r = e;
  if (!c->blocking) r = gs_comm_async_error(c); /* ncclEnqueueCheck's ncclCommGetAsyncError */
  gs_comm_leave(c);
  gs_comm_release(c);
  return r;
}

/* ---- launch ------------------------------------------------------------------------- */
/* Wait until rank j has raised its side of a connection (coll: its
 * collective flag; else its flag for this rank). */
enum { AWAIT_P2P, AWAIT_COLL, AWAIT_COLL_BIG };
static ncclResult_t await_peer(ncclComm_t c, int j, int what) {
  gs_seg_t *seg = &c->seg;
  gs_slot_t *s = gs_slot(seg, j);
  for (;;) {
    uint32_t w = gs_seg_word(seg);
    int done = what == AWAIT_COLL       ? atomic_load(&s->coll_connected) != 0
               : what == AWAIT_COLL_BIG ? atomic_load(&s->coll_big_connected) != 0
                                        : atomic_load(&s->peer_connected[c->rank]) != 0;
    if (done) return ncclSuccess;
    if (atomic_load(&c->abort_flag)) return ncclInternalError;
    if (gs_peer_gone(seg, j))
      return gs_fail(ncclRemoteError, "connection to rank %d of %s: peer is gone", j, c->name);
    gs_seg_sleep(seg, w);
  }
}

/* Runtime connection with the ranks `plan` needs (transport.cc
 * ncclTransportP2pSetup, run at the first use). Every flag of this rank is
 * raised first, then the peers' are awaited, so rings of peers connecting
 * in different orders cannot deadlock. Blocks until they arrive. */
static ncclResult_t connect(ncclComm_t c, const plan_t *p) {
  gs_seg_t *seg = &c->seg;
  gs_slot_t *me = gs_slot(seg, c->rank);
  int coll = 0, big = 0;
  for (int i = 0; i < p->n; i++) {
    const gs_task_t *t = &p->tasks[i];
    if (t->func != GS_SEND && t->func != GS_RECV) {
      coll = 1;
      if (t->count * gs_dtype_size(t->dt) > GS_ALGO_BYTES) big = 1;
    } else {
      atomic_store(&me->peer_connected[t->root], 1);
    }
  }
  coll = coll && !atomic_load(&c->coll_connected);
  /* The first collective large enough for another algorithm connects it at
   * its first use (transport.cc ncclTransportP2pSetup, runtime connect),
   * which waits for every peer to reach that same first use: measured on
   * an H200 (NCCL 2.28.9, non-blocking, one rank 4 s late after an 8-float
   * all_reduce), the first 256K- or 4M-float all_reduce stayed
   * ncclInProgress 4.0 s at 3 and 4 ranks, a 64-float one 0.6 ms, and at 2
   * ranks none waited. GS_ALGO_BYTES is the simulation's line between the
   * sizes measured. Job thread (non-blocking) or the caller's (blocking). */
  big = big && c->nranks >= 3 && !atomic_load(&c->coll_big_connected);
  if (coll) atomic_store(&me->coll_connected, 1);
  if (big) atomic_store(&me->coll_big_connected, 1);
  gs_seg_wake(seg);
  for (int j = 0; coll && j < c->nranks; j++) {
    ncclResult_t r = await_peer(c, j, AWAIT_COLL);
    if (r != ncclSuccess) return r;
  }
  if (coll) atomic_store(&c->coll_connected, 1);
  /* The abort flag (ncclCommAbort from another thread, revoke) ends this
   * wait as NCCL's abortFlag ends its connection loops: await_peer polls it. */
  for (int j = 0; big && j < c->nranks; j++) {
    ncclResult_t r = await_peer(c, j, AWAIT_COLL_BIG);
    if (r != ncclSuccess) return r;
  }
  if (big) atomic_store(&c->coll_big_connected, 1);
  for (int i = 0; i < p->n; i++) {
    const gs_task_t *t = &p->tasks[i];
    if ((t->func != GS_SEND && t->func != GS_RECV) || atomic_load(&c->p2p_connected[t->root]))
      continue;
    ncclResult_t r = await_peer(c, t->root, AWAIT_P2P);
    if (r != ncclSuccess) return r;
    atomic_store(&c->p2p_connected[t->root], 1);
  }
  return ncclSuccess;
}

/* Room in the communicator's work FIFO (enqueue.cc waitWorkFifoAvailable:
 * the host writes each launch's work into a ring of NCCL_WORK_FIFO_BYTES,
 * 1 MiB by default, that the kernels consume; full, the launch spins until
 * a kernel has consumed its part). Kernels stuck on a peer that never
 * comes consume nothing, so past GS_WORK_FIFO_KERNELS launches in flight
 * (the simulation's capacity: it does not size the work) the next enqueue
 * waits, ncclInProgress, until one finishes or the communicator is aborted
 * (the abort flag ends the spin, as in NCCL). Job thread (non-blocking) or
 * the caller's (blocking). */
static ncclResult_t fifo_room(ncclComm_t c) {
  ncclResult_t r = ncclSuccess;
  pthread_mutex_lock(&c->mu);
  while (c->inflight >= GS_WORK_FIFO_KERNELS) {
    if (atomic_load(&c->abort_flag)) {
      r = ncclInternalError;
      break;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += GS_POLL_MS * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&c->cv, &c->mu, &ts); /* nk_finish broadcasts */
  }
  pthread_mutex_unlock(&c->mu);
  return r;
}

/* The launch of one communicator's part of a group (doLaunches): connect,
 * room in the work FIFO, then one kernel on the first task's stream; the
 * other streams of the group are joined before and after (NCCL's
 * strong-stream joins). */
static ncclResult_t launch_plan(ncclComm_t c, void *arg) {
  plan_t *p = arg;
  ncclResult_t r = connect(c, p);
  if (r != ncclSuccess) goto out;
  r = fifo_room(c);
  if (r != ncclSuccess) goto out;
  cudaStream_t s0 = p->tasks[0].stream;
  int prio = gs_stream_priority(s0); /* what tdist_gpusim_comm_config reports */
  pthread_mutex_lock(&c->mu);
  c->last_prio = prio;
  pthread_mutex_unlock(&c->mu);
  for (int i = 1; i < p->n; i++)
    if (p->tasks[i].stream != s0) gs_stream_join(s0, p->tasks[i].stream);
  gs_kernel_t *k = gs_kernel_new(c, p->tasks, p->n);
  if (!k) {
    r = gs_fail(ncclSystemError, "out of host memory for a kernel");
    goto out;
  }
  int captured = 0;
  const char *kname = k->name; /* static; gs_launch consumes k, even on failure */
  cudaError_t e = gs_launch(s0, k, &captured);
  if (e != cudaSuccess) {
    r = gs_fail(ncclUnhandledCudaError, "Cuda failure '%s' (launching %s)", cudaGetErrorString(e),
                kname);
    goto out;
  }
  for (int i = 1; i < p->n; i++)
    if (p->tasks[i].stream != s0) gs_stream_join(p->tasks[i].stream, s0);
out:
  gs_comm_release(c);
  free(p->tasks);
  free(p);
  return r;
}

static ncclResult_t group_end_internal(void) {
  if (depth == 0) return gs_fail(ncclInvalidUsage, "ncclGroupEnd: not in a group call.");
  if (--depth > 0) return ncclSuccess;
  ncclResult_t r = group_err;
  group_err = ncclSuccess;
  plan_t *ps = plans;
  int n = nplans;
  plans = NULL;
  nplans = capplans = 0;
  int blocking = -1;
  for (int i = 0; r == ncclSuccess && i < n; i++) {
    if (blocking < 0)
      blocking = ps[i].c->blocking;
    else if (blocking != ps[i].c->blocking)
      r = gs_fail(ncclInvalidUsage,
                  "Blocking and nonblocking communicators are not allowed in the same group.");
  }
  ncclResult_t out = r;
  for (int i = 0; i < n; i++) {
    ncclComm_t c = ps[i].c;
    if (r != ncclSuccess) { /* groupCleanup: nothing launches */
      if (!c->blocking) gs_comm_set_async(c, r);
      free(ps[i].tasks);
      gs_comm_release(c);
      continue;
    }
    plan_t *p = malloc(sizeof(*p));
    if (!p) {
      out = gs_fail(ncclSystemError, "out of host memory");
      free(ps[i].tasks);
      gs_comm_release(c);
      continue;
    }
    *p = ps[i];
    if (!c->blocking) gs_comm_link_group_job(c); /* group.cc: comm->groupJob = groupJob */
    ncclResult_t lr = gs_comm_job(c, launch_plan, p);
    if (lr != ncclSuccess && out == ncclSuccess) out = lr;
  }
  free(ps);
  return out;
}

GS_API ncclResult_t ncclGroupStart(void) {
  depth++;
  return ncclSuccess;
}

GS_API ncclResult_t ncclGroupEnd(void) { return group_end_internal(); }

/* ---- the calls ----------------------------------------------------------------------- */
#define TASK(f, sb, rb, n, d, rt, s) \
  gs_task_t t = {.func = (f),        \
                 .send = (sb),       \
                 .recv = (rb),       \
                 .count = (n),       \
                 .dt = (d),          \
                 .root = (rt),       \
                 .stream = (s)}

GS_API ncclResult_t ncclAllReduce(const void *sb, void *rb, size_t n, ncclDataType_t dt,
                                  ncclRedOp_t op, ncclComm_t c, cudaStream_t s) {
  TASK(GS_ALLREDUCE, sb, rb, n, dt, 0, s);
  return enqueue(&t, op, c);
}
GS_API ncclResult_t ncclBroadcast(const void *sb, void *rb, size_t n, ncclDataType_t dt, int root,
                                  ncclComm_t c, cudaStream_t s) {
  TASK(GS_BROADCAST, sb, rb, n, dt, root, s);
  return enqueue(&t, ncclSum, c);
}
GS_API ncclResult_t ncclReduce(const void *sb, void *rb, size_t n, ncclDataType_t dt,
                               ncclRedOp_t op, int root, ncclComm_t c, cudaStream_t s) {
  TASK(GS_REDUCE, sb, rb, n, dt, root, s);
  return enqueue(&t, op, c);
}
GS_API ncclResult_t ncclAllGather(const void *sb, void *rb, size_t n, ncclDataType_t dt,
                                  ncclComm_t c, cudaStream_t s) {
  TASK(GS_ALLGATHER, sb, rb, n, dt, 0, s);
  return enqueue(&t, ncclSum, c);
}
GS_API ncclResult_t ncclReduceScatter(const void *sb, void *rb, size_t n, ncclDataType_t dt,
                                      ncclRedOp_t op, ncclComm_t c, cudaStream_t s) {
  TASK(GS_REDUCESCATTER, sb, rb, n, dt, 0, s);
  return enqueue(&t, op, c);
}
GS_API ncclResult_t ncclAlltoAll(const void *sb, void *rb, size_t n, ncclDataType_t dt,
                                 ncclComm_t c, cudaStream_t s) {
  TASK(GS_ALLTOALL, sb, rb, n, dt, 0, s);
  return enqueue(&t, ncclSum, c);
}
GS_API ncclResult_t ncclGather(const void *sb, void *rb, size_t n, ncclDataType_t dt, int root,
                               ncclComm_t c, cudaStream_t s) {
  TASK(GS_GATHER, sb, rb, n, dt, root, s);
  return enqueue(&t, ncclSum, c);
}
GS_API ncclResult_t ncclScatter(const void *sb, void *rb, size_t n, ncclDataType_t dt, int root,
                                ncclComm_t c, cudaStream_t s) {
  TASK(GS_SCATTER, sb, rb, n, dt, root, s);
  return enqueue(&t, ncclSum, c);
}
GS_API ncclResult_t ncclSend(const void *sb, size_t n, ncclDataType_t dt, int peer, ncclComm_t c,
                             cudaStream_t s) {
  TASK(GS_SEND, sb, NULL, n, dt, peer, s);
  return enqueue(&t, ncclSum, c);
}
GS_API ncclResult_t ncclRecv(void *rb, size_t n, ncclDataType_t dt, int peer, ncclComm_t c,
                             cudaStream_t s) {
  TASK(GS_RECV, NULL, rb, n, dt, peer, s);
  return enqueue(&t, ncclSum, c);
}

/* ---- PreMulSum (enqueue.cc ncclRedOpCreatePreMulSum / ncclRedOpDestroy) ------------- */
GS_API ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t dt,
                                             ncclScalarResidence_t residence, ncclComm_t c) {
  if (!gs_comm_valid(c))
    return gs_fail(ncclInvalidArgument, "ncclRedOpCreatePreMulSum : comm is not valid");
  ncclResult_t r = gs_comm_ensure_ready(c); /* join the init thread first */
  if (r != ncclSuccess) return r;
  size_t es = gs_dtype_size(dt);
  if (!op || !scalar || es == 0)
    return gs_fail(ncclInvalidArgument, "ncclRedOpCreatePreMulSum : invalid arguments");
  gs_comm_enter(c);
  pthread_mutex_lock(&c->mu);
  int ix = -1;
  for (int i = 0; i < GS_MAX_PREMUL && ix < 0; i++)
    if (!c->premul[i].used) ix = i;
  if (ix >= 0) {
    gs_premul_t *p = &c->premul[ix];
    memset(p, 0, sizeof(*p));
    p->used = 1;
    p->dt = dt;
    p->residence = residence;
    if (residence == ncclScalarHostImmediate)
      memcpy(p->host, scalar, es);
    else
      p->dev_scalar = scalar;
  }
  pthread_mutex_unlock(&c->mu);
  gs_comm_leave(c);
  if (ix < 0)
    return gs_fail(ncclInvalidUsage, "too many PreMulSum ops on communicator %s", c->name);
  *op = (ncclRedOp_t)(GS_NUM_OPS + ix);
  return ncclSuccess;
}

GS_API ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t c) {
  if ((int)op < GS_NUM_OPS)
    return gs_fail(ncclInvalidArgument, "ncclRedOpDestroy : operator is a NCCL builtin.");
  if (!gs_comm_valid(c))
    return gs_fail(ncclInvalidArgument, "ncclRedOpDestroy : comm is not valid");
  int ix = (int)op - GS_NUM_OPS;
  gs_comm_enter(c);
  pthread_mutex_lock(&c->mu);
  int ok = ix < GS_MAX_PREMUL && c->premul[ix].used;
  if (ok) c->premul[ix].used = 0;
  pthread_mutex_unlock(&c->mu);
  gs_comm_leave(c);
  if (!ok)
    return gs_fail(ncclInvalidArgument,
                   "ncclRedOpDestroy : operator unknown to this communicator.");
  return ncclSuccess;
}
