/*
 * ops.c - the public collective and point-to-point calls (layer 6).
 *
 * Caller thread: validate (against the backend's declared capabilities, so
 * an unsupported combination fails the same way on every backend), fill a
 * work from the pool, give the backend its caller-thread hook (NCCL launches
 * there), push the work to the progress thread. Nothing here allocates in
 * steady state (batches of more than TDIST__P2P_INLINE point-to-point ops
 * copy their array to the heap).
 */
#include <stdio.h>
#include <string.h>

#include "core/group.h"
#include "core/ops_int.h"
#include "util/alloc.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/memkind.h"
#include "util/param.h"

/* The group can run an op of `type`: it exists, is not aborted, and its
 * backend declares the op. */
static int check_group(tdist_group_t *g, tdist_optype_t type, const char *fn) {
  if (!g) return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "%s: NULL group", fn);
  if (atomic_load(&g->aborted)) /* the cause's code: ABORTED, REMOTE_FAILED, MISMATCH... */
    return tdist__error(g->abort_status, "%s: group '%s' was aborted: %s", fn, g->name,
                        g->abort_reason);
  if (!(g->bk->caps.ops & (1u << type)))
    return tdist__error(TDIST_ERR_NOT_SUPPORTED, "%s: backend '%s' does not run %s", fn,
                        g->bk->name, tdist_op_name(type));
  return 0;
}

static int check_dtype(const tdist_group_t *g, tdist_dtype_t dt, size_t count, size_t blocks,
                       const char *fn) {
  if ((unsigned)dt >= TDIST_DTYPE_COUNT)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "%s: unknown dtype %d", fn, (int)dt);
  if (!(g->bk->caps.dtypes & (1u << dt)))
    return tdist__error(TDIST_ERR_NOT_SUPPORTED, "%s: backend '%s' has no %s", fn, g->bk->name,
                        tdist_dtype_name(dt));
  size_t es = tdist_dtype_size(dt);
  if (count > SIZE_MAX / es / (blocks ? blocks : 1))
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "%s: count %zu overflows the address space", fn,
                        count);
  return 0;
}

static int check_redop(const tdist_group_t *g, tdist_redop_t op, const char *fn) {
  if ((unsigned)op >= TDIST_REDOP_COUNT)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "%s: unknown reduction %d", fn, (int)op);
  if (!(g->bk->caps.redops & (1u << op)))
    return tdist__error(TDIST_ERR_NOT_SUPPORTED, "%s: backend '%s' has no %s reduction", fn,
                        g->bk->name, tdist_redop_name(op));
  return 0;
}

static int is_float_dtype(tdist_dtype_t dt) {
  return dt == TDIST_FLOAT16 || dt == TDIST_BFLOAT16 || dt == TDIST_FLOAT32 ||
         dt == TDIST_FLOAT64 || dt == TDIST_FLOAT8_E4M3 || dt == TDIST_FLOAT8_E5M2;
}

/* A reduction that means nothing for the element type, on any backend (so
 * INVALID_ARGUMENT, checked before the backend's capabilities): a bitwise op
 * on a float type; AVG or PREMUL_SUM of BOOL. Values out of range are left
 * to check_dtype / check_redop. */
static int check_redop_dtype(tdist_redop_t op, tdist_dtype_t dt, const char *fn) {
  if ((op == TDIST_BAND || op == TDIST_BOR || op == TDIST_BXOR) && is_float_dtype(dt))
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                        "%s: %s is a bitwise reduction, for integer and bool types; %s is a "
                        "float type",
                        fn, tdist_redop_name(op), tdist_dtype_name(dt));
  if ((op == TDIST_AVG || op == TDIST_PREMUL_SUM) && dt == TDIST_BOOL)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                        "%s: %s of bool is not defined (use sum for or, prod for and)", fn,
                        tdist_redop_name(op));
  return 0;
}

/* Byte ranges [a, a + al) and [b, b + bl) share a byte. */
static int overlaps(const void *a, size_t al, const void *b, size_t bl) {
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  return al && bl && x < y + bl && y < x + al;
}

/* The op's send and receive buffers (sl and rl bytes) may overlap only in
 * its in-place form (`in_place`: the caller checked the exact positions,
 * described by `form`; NULL: the op has none). Anything else would have the
 * backend read what it has already written (all_to_all, a scatter root) or
 * overlap its own copy: success with wrong elements, so it is refused. */
static int check_overlap(const void *sendbuf, size_t sl, const void *recvbuf, size_t rl,
                         int in_place, const char *form, const char *fn) {
  if (in_place || !overlaps(sendbuf, sl, recvbuf, rl)) return 0;
  if (!form)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                        "%s: sendbuf [%p, +%zu bytes) and recvbuf [%p, +%zu bytes) overlap; the "
                        "op has no in-place form, the buffers must be disjoint",
                        fn, sendbuf, sl, (void *)recvbuf, rl);
  return tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                      "%s: sendbuf [%p, +%zu bytes) and recvbuf [%p, +%zu bytes) overlap; they "
                      "must be disjoint, or in place exactly (%s)",
                      fn, sendbuf, sl, (void *)recvbuf, rl, form);
}

static int check_rank(const tdist_group_t *g, int r, const char *what, const char *fn) {
  if (r < 0 || r >= g->size)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "%s: %s %d is not in [0, %d) of group '%s'", fn,
                        what, r, g->size, g->name);
  return 0;
}

/* A buffer of `count` elements: not NULL, and not CUDA device memory when
 * g's backend takes host memory only (util/memkind.h). */
static int check_buf(const tdist_group_t *g, const void *buf, size_t count, const char *what,
                     const char *fn) {
  if (!buf && count)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "%s: %s is NULL with count %zu", fn, what,
                        count);
  if (count && !(g->bk->caps.mem & TDIST_BACKEND_MEM_DEVICE) &&
      tdist__memkind(buf) == TDIST__MEMKIND_DEVICE)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                        "%s: %s (%p) is CUDA device memory, but group '%s' runs on backend '%s', "
                        "which takes host memory (use an NCCL group for device buffers)",
                        fn, what, buf, g->name, g->bk->name);
  return 0;
}

TDIST_PARAM(LazyPost, "TDIST_LAZY_POST", 1)

/* Hand a filled-in work to the backend and the progress thread. */
static int submit(tdist_group_t *g, const tdist_backend_args_t *a, const tdist_op_opts_t *opts,
                  tdist_work_t **out) {
  if (!out && tdist__progress_on_thread())
    return tdist__error(TDIST_ERR_INVALID_STATE,
                        "%s: a synchronous op on the progress thread (from a completion "
                        "callback) would wait for itself; pass a work out-param",
                        tdist_op_name(a->type));
  /* Every op passes here, those of ops_v.c too: a reduction/type pair that
   * means nothing never reaches a backend's kernels (ops that do not reduce
   * carry TDIST_SUM). */
  TDIST_CHECK(check_redop_dtype(a->redop, a->dtype, tdist_op_name(a->type)));
  tdist_work_t *w = tdist__work_alloc(g);
  if (!w) return tdist__error(TDIST_ERR_NO_MEMORY, "cannot allocate a work handle");
  w->args = *a;
  if (a->np2p > 0) {
    size_t bytes = sizeof(tdist_p2p_op_t) * (size_t)a->np2p;
    w->args.p2p = a->np2p <= TDIST__P2P_INLINE ? w->p2p_inline : tdist__malloc(bytes);
    if (!w->args.p2p) {
      w->args.np2p = 0;
      tdist__work_unref(w);
      tdist__work_unref(w);
      return tdist__error(TDIST_ERR_NO_MEMORY, "cannot copy %d point-to-point ops", a->np2p);
    }
    memcpy(w->args.p2p, a->p2p, bytes);
  }
  w->bop.timeout_ms = (opts && (opts->mask & TDIST_OP_FIELD_TIMEOUT) && opts->timeout_ms > 0)
                          ? opts->timeout_ms
                          : atomic_load_explicit(&g->timeout_ms, memory_order_relaxed);
  w->t_enqueue_ns = tdist__now_ns();
  w->deadline_ns = w->t_enqueue_ns + w->bop.timeout_ms * 1000000;
  w->qnode.run = tdist__group_start_work;
  /* The synchronous form waits right after: a backend that drives from the
   * waiter is told before the op starts, so the peers' first answers find
   * it polling (backend.h, drive_mark; work.c). */
  void (*mark)(void *, int) = g->bk->caps.drives ? g->bk->ops->drive_mark : NULL;
  if (!out && mark) {
    mark(g->bstate, 1);
    w->marked = 1;
  }
  w->bop.quiet = !out;
  int started = 0; /* the backend started the op in submit (backend.h) */
  if (g->bk->ops->submit) {
    int rc = g->bk->ops->submit(g->bstate, &w->bop);
    started = rc > 0;
    if (rc < 0) {
      if (w->marked) mark(g->bstate, 0);
      w->marked = 0;
      tdist__work_unref(w);
      tdist__work_unref(w);
      /* Refused because the group failed meanwhile: report the group's
       * cause (which names a dead rank), as check_group does. */
      if (atomic_load(&g->aborted))
        return tdist__error(g->abort_status, "%s: group '%s' was aborted: %s",
                            tdist_op_name(a->type), g->name, g->abort_reason);
      return rc;
    }
  }
  /* Numbered only once it is certain to run: a refused op takes no number,
   * so every rank's sequence stays in step (work.h). */
  w->bop.seq = atomic_fetch_add_explicit(&g->next_seq, 1, memory_order_relaxed);
  /* Waiters may test it themselves (backend.h, vtable->test; work.c). */
  w->test = g->bk->ops->test;
  w->test_state = g->bstate;
  w->drives = w->test && g->bk->caps.drives;
  w->drive_mark = w->drives ? g->bk->ops->drive_mark : NULL;
  w->progress = g->ctx->progress;
  if (started) w->t_start_ns = tdist__now_ns(); /* the flight recorder's start (work.c) */
  atomic_fetch_add_explicit(&g->pending, 1, memory_order_relaxed);
  /* A synchronous op the backend started and this thread now drives needs
   * the progress thread only for bookkeeping: it is not woken for it unless
   * the wait outlasts its spin (work.c), which saves a wake-up per small op. */
  if (!out && started && w->drives && tdist__param_LazyPost())
    tdist__progress_push_lazy(g->ctx->progress, &w->qnode);
  else
    tdist__progress_push(g->ctx->progress, &w->qnode);
  if (out) {
    *out = w;
    return 0;
  }
  /* Synchronous form: wait for the op (its deadline bounds the wait). */
  int rc = tdist_work_wait(w, 0);
  if (rc != 0) tdist__error(rc, "%s", w->msg[0] ? w->msg : tdist_strerror(rc));
  tdist__work_unref(w);
  return rc;
}

static void args_init(tdist_backend_args_t *a, tdist_optype_t type, const tdist_op_opts_t *opts) {
  memset(a, 0, sizeof(*a));
  a->type = type;
  a->scalar = (opts && (opts->mask & TDIST_OP_FIELD_SCALAR)) ? opts->premul_scalar : 1.0;
  a->stream = (opts && (opts->mask & TDIST_OP_FIELD_STREAM)) ? opts->stream : NULL;
  a->tag = (opts && (opts->mask & TDIST_OP_FIELD_TAG)) ? opts->tag : 0;
}

/* Fill in the op's arguments and submit it. */
static int submit_op(tdist_group_t *g, tdist_optype_t type, const void *sendbuf, void *recvbuf,
                     size_t count, tdist_dtype_t dtype, tdist_redop_t redop, int root,
                     const tdist_op_opts_t *opts, tdist_work_t **work) {
  tdist_backend_args_t a;
  args_init(&a, type, opts);
  a.sendbuf = sendbuf;
  a.recvbuf = recvbuf;
  a.count = count;
  a.dtype = dtype;
  a.redop = redop;
  a.root = root;
  return submit(g, &a, opts, work);
}

int tdist_all_reduce(tdist_group_t *g, const void *sendbuf, void *recvbuf, size_t count,
                     tdist_dtype_t dtype, tdist_redop_t op, const tdist_op_opts_t *opts,
                     tdist_work_t **work) {
  static const char fn[] = "tdist_all_reduce";
  tdist__error_clear();
  TDIST_CHECK(check_group(g, TDIST_OP_ALL_REDUCE, fn));
  TDIST_CHECK(check_dtype(g, dtype, count, 1, fn));
  TDIST_CHECK(check_redop_dtype(op, dtype, fn));
  TDIST_CHECK(check_redop(g, op, fn));
  TDIST_CHECK(check_buf(g, sendbuf, count, "sendbuf", fn));
  TDIST_CHECK(check_buf(g, recvbuf, count, "recvbuf", fn));
  size_t bytes = count * tdist_dtype_size(dtype);
  TDIST_CHECK(
      check_overlap(sendbuf, bytes, recvbuf, bytes, sendbuf == recvbuf, "sendbuf == recvbuf", fn));
  return submit_op(g, TDIST_OP_ALL_REDUCE, sendbuf, recvbuf, count, dtype, op, 0, opts, work);
}

int tdist_broadcast(tdist_group_t *g, void *buf, size_t count, tdist_dtype_t dtype, int root,
                    const tdist_op_opts_t *opts, tdist_work_t **work) {
  static const char fn[] = "tdist_broadcast";
  tdist__error_clear();
  TDIST_CHECK(check_group(g, TDIST_OP_BROADCAST, fn));
  TDIST_CHECK(check_dtype(g, dtype, count, 1, fn));
  TDIST_CHECK(check_rank(g, root, "root", fn));
  TDIST_CHECK(check_buf(g, buf, count, "buf", fn));
  return submit_op(g, TDIST_OP_BROADCAST, buf, buf, count, dtype, TDIST_SUM, root, opts, work);
}

int tdist_reduce(tdist_group_t *g, const void *sendbuf, void *recvbuf, size_t count,
                 tdist_dtype_t dtype, tdist_redop_t op, int root, const tdist_op_opts_t *opts,
                 tdist_work_t **work) {
  static const char fn[] = "tdist_reduce";
  tdist__error_clear();
  TDIST_CHECK(check_group(g, TDIST_OP_REDUCE, fn));
  TDIST_CHECK(check_dtype(g, dtype, count, 1, fn));
  TDIST_CHECK(check_redop_dtype(op, dtype, fn));
  TDIST_CHECK(check_redop(g, op, fn));
  TDIST_CHECK(check_rank(g, root, "root", fn));
  TDIST_CHECK(check_buf(g, sendbuf, count, "sendbuf", fn));
  if (g->rank == root) {
    TDIST_CHECK(check_buf(g, recvbuf, count, "recvbuf (on root)", fn));
    size_t bytes = count * tdist_dtype_size(dtype);
    TDIST_CHECK(check_overlap(sendbuf, bytes, recvbuf, bytes, sendbuf == recvbuf,
                              "sendbuf == recvbuf", fn));
  }
  return submit_op(g, TDIST_OP_REDUCE, sendbuf, recvbuf, count, dtype, op, root, opts, work);
}

/* all_gather, gather, scatter, reduce_scatter, all_to_all share a shape: one
 * block of `count` on one side, size blocks on the other. */
static int blocked_op(tdist_group_t *g, tdist_optype_t type, const char *fn, const void *sendbuf,
                      void *recvbuf, size_t count, tdist_dtype_t dtype, tdist_redop_t op, int root,
                      const tdist_op_opts_t *opts, tdist_work_t **work) {
  tdist__error_clear();
  TDIST_CHECK(check_group(g, type, fn));
  TDIST_CHECK(check_dtype(g, dtype, count, (size_t)g->size, fn));
  size_t whole = count * (size_t)g->size;
  int is_root = 1;
  if (type == TDIST_OP_GATHER || type == TDIST_OP_SCATTER) {
    TDIST_CHECK(check_rank(g, root, "root", fn));
    is_root = g->rank == root;
  }
  switch (type) {
  case TDIST_OP_ALL_GATHER:
  case TDIST_OP_GATHER:
    TDIST_CHECK(check_buf(g, sendbuf, count, "sendbuf", fn));
    if (is_root) TDIST_CHECK(check_buf(g, recvbuf, whole, "recvbuf", fn));
    break;
  case TDIST_OP_SCATTER:
    if (is_root) TDIST_CHECK(check_buf(g, sendbuf, whole, "sendbuf (on root)", fn));
    TDIST_CHECK(check_buf(g, recvbuf, count, "recvbuf", fn));
    /* The root sends its other blocks from sendbuf after copying its own
     * into recvbuf: a recvbuf over another block would be sent clobbered. */
    if (is_root) {
      size_t bytes = count * tdist_dtype_size(dtype);
      TDIST_CHECK(
          check_overlap(sendbuf, bytes * (size_t)g->size, recvbuf, bytes,
                        (const char *)recvbuf == (const char *)sendbuf + (size_t)g->rank * bytes,
                        "recvbuf == sendbuf + rank * count elements", fn));
    }
    break;
  case TDIST_OP_REDUCE_SCATTER:
    TDIST_CHECK(check_redop_dtype(op, dtype, fn));
    TDIST_CHECK(check_redop(g, op, fn));
    TDIST_CHECK(check_buf(g, sendbuf, whole, "sendbuf", fn));
    TDIST_CHECK(check_buf(g, recvbuf, count, "recvbuf", fn));
    break;
  default: /* all_to_all */
    TDIST_CHECK(check_buf(g, sendbuf, whole, "sendbuf", fn));
    TDIST_CHECK(check_buf(g, recvbuf, whole, "recvbuf", fn));
    if (count && sendbuf == recvbuf)
      return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "%s: in-place is not supported", fn);
    /* Overlapping but not identical is just as wrong: blocks are sent from
     * sendbuf while others arrive in recvbuf. */
    size_t wb = whole * tdist_dtype_size(dtype);
    TDIST_CHECK(check_overlap(sendbuf, wb, recvbuf, wb, 0, NULL, fn));
  }
  return submit_op(g, type, sendbuf, recvbuf, count, dtype, op, root, opts, work);
}

int tdist_all_gather(tdist_group_t *g, const void *sendbuf, void *recvbuf, size_t count,
                     tdist_dtype_t dtype, const tdist_op_opts_t *opts, tdist_work_t **work) {
  return blocked_op(g, TDIST_OP_ALL_GATHER, "tdist_all_gather", sendbuf, recvbuf, count, dtype,
                    TDIST_SUM, 0, opts, work);
}

int tdist_gather(tdist_group_t *g, const void *sendbuf, void *recvbuf, size_t count,
                 tdist_dtype_t dtype, int root, const tdist_op_opts_t *opts, tdist_work_t **work) {
  return blocked_op(g, TDIST_OP_GATHER, "tdist_gather", sendbuf, recvbuf, count, dtype, TDIST_SUM,
                    root, opts, work);
}

int tdist_scatter(tdist_group_t *g, const void *sendbuf, void *recvbuf, size_t count,
                  tdist_dtype_t dtype, int root, const tdist_op_opts_t *opts, tdist_work_t **work) {
  return blocked_op(g, TDIST_OP_SCATTER, "tdist_scatter", sendbuf, recvbuf, count, dtype, TDIST_SUM,
                    root, opts, work);
}

int tdist_reduce_scatter(tdist_group_t *g, const void *sendbuf, void *recvbuf, size_t count,
                         tdist_dtype_t dtype, tdist_redop_t op, const tdist_op_opts_t *opts,
                         tdist_work_t **work) {
  return blocked_op(g, TDIST_OP_REDUCE_SCATTER, "tdist_reduce_scatter", sendbuf, recvbuf, count,
                    dtype, op, 0, opts, work);
}

int tdist_all_to_all(tdist_group_t *g, const void *sendbuf, void *recvbuf, size_t count,
                     tdist_dtype_t dtype, const tdist_op_opts_t *opts, tdist_work_t **work) {
  return blocked_op(g, TDIST_OP_ALL_TO_ALL, "tdist_all_to_all", sendbuf, recvbuf, count, dtype,
                    TDIST_SUM, 0, opts, work);
}

int tdist_barrier(tdist_group_t *g, const tdist_op_opts_t *opts, tdist_work_t **work) {
  tdist__error_clear();
  TDIST_CHECK(check_group(g, TDIST_OP_BARRIER, "tdist_barrier"));
  tdist_backend_args_t a;
  args_init(&a, TDIST_OP_BARRIER, opts);
  a.dtype = TDIST_UINT8;
  return submit(g, &a, opts, work);
}

static int p2p(tdist_group_t *g, tdist_optype_t type, const char *fn, void *buf, size_t count,
               tdist_dtype_t dtype, int peer, const tdist_op_opts_t *opts, tdist_work_t **work) {
  tdist__error_clear();
  TDIST_CHECK(check_group(g, type, fn));
  TDIST_CHECK(check_dtype(g, dtype, count, 1, fn));
  /* Wildcards (receives only, ops_v.c says whether the backend takes them). */
  int any_src = type == TDIST_OP_RECV && peer == TDIST_ANY_SOURCE;
  if (any_src)
    TDIST_CHECK(tdist__ops_check_any(g, "TDIST_ANY_SOURCE", fn));
  else
    TDIST_CHECK(check_rank(g, peer, "peer", fn));
  TDIST_CHECK(check_buf(g, buf, count, "buf", fn));
  tdist_backend_args_t a;
  args_init(&a, type, opts);
  if (type == TDIST_OP_RECV && a.tag == TDIST_ANY_TAG)
    TDIST_CHECK(tdist__ops_check_any(g, "TDIST_ANY_TAG", fn));
  else if (a.tag < 0)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "%s: tag %d < 0", fn, a.tag);
  a.sendbuf = buf;
  a.recvbuf = buf;
  a.count = count;
  a.dtype = dtype;
  a.root = peer;
  return submit(g, &a, opts, work);
}

int tdist_isend(tdist_group_t *g, const void *buf, size_t count, tdist_dtype_t dtype, int peer,
                const tdist_op_opts_t *opts, tdist_work_t **work) {
  if (!work) return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "tdist_isend: NULL work out-param");
  return p2p(g, TDIST_OP_SEND, "tdist_isend", (void *)buf, count, dtype, peer, opts, work);
}

int tdist_irecv(tdist_group_t *g, void *buf, size_t count, tdist_dtype_t dtype, int peer,
                const tdist_op_opts_t *opts, tdist_work_t **work) {
  if (!work) return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "tdist_irecv: NULL work out-param");
  return p2p(g, TDIST_OP_RECV, "tdist_irecv", buf, count, dtype, peer, opts, work);
}

int tdist_send(tdist_group_t *g, const void *buf, size_t count, tdist_dtype_t dtype, int peer,
               const tdist_op_opts_t *opts) {
  return p2p(g, TDIST_OP_SEND, "tdist_send", (void *)buf, count, dtype, peer, opts, NULL);
}

int tdist_recv(tdist_group_t *g, void *buf, size_t count, tdist_dtype_t dtype, int peer,
               const tdist_op_opts_t *opts) {
  return p2p(g, TDIST_OP_RECV, "tdist_recv", buf, count, dtype, peer, opts, NULL);
}

int tdist_batch_isend_irecv(tdist_group_t *g, const tdist_p2p_op_t *ops, int n,
                            const tdist_op_opts_t *opts, tdist_work_t **work) {
  static const char fn[] = "tdist_batch_isend_irecv";
  tdist__error_clear();
  TDIST_CHECK(check_group(g, TDIST_OP_BATCH_P2P, fn));
  if (n < 1 || !ops) return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "%s: empty batch", fn);
  for (int i = 0; i < n; i++) {
    char what[48];
    snprintf(what, sizeof(what), "ops[%d].peer", i);
    if (ops[i].kind != TDIST_P2P_SEND && ops[i].kind != TDIST_P2P_RECV)
      return tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                          "%s: ops[%d].kind %d is neither SEND nor RECV", fn, i, (int)ops[i].kind);
    TDIST_CHECK(check_dtype(g, ops[i].dtype, ops[i].count, 1, fn));
    TDIST_CHECK(check_rank(g, ops[i].peer, what, fn));
    TDIST_CHECK(check_buf(g, ops[i].buf, ops[i].count, "ops[].buf", fn));
    if (ops[i].tag < 0)
      return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "%s: ops[%d].tag %d < 0", fn, i, ops[i].tag);
  }
  tdist_backend_args_t a;
  args_init(&a, TDIST_OP_BATCH_P2P, opts);
  a.p2p = (tdist_p2p_op_t *)ops;
  a.np2p = n;
  a.dtype = ops[0].dtype;
  return submit(g, &a, opts, work);
}

int tdist_work_wait_stream(tdist_work_t *w, void *stream) {
  if (!w) return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "tdist_work_wait_stream: NULL work");
  tdist_group_t *g = w->group;
  if (!g->bk->caps.stream_wait || !g->bk->ops->wait_stream)
    return tdist__error(TDIST_ERR_NOT_SUPPORTED,
                        "tdist_work_wait_stream: backend '%s' has no streams; use "
                        "tdist_work_wait",
                        g->bk->name);
  if (tdist__work_done(w)) return w->status;
  return g->bk->ops->wait_stream(g->bstate, &w->bop, stream);
}

/* ---- for ops_v.c (core/ops_int.h): the same checks and submission ----------- */

int tdist__ops_check_group(tdist_group_t *g, tdist_optype_t type, const char *fn) {
  return check_group(g, type, fn);
}
int tdist__ops_check_dtype(const tdist_group_t *g, tdist_dtype_t dt, size_t count, size_t blocks,
                           const char *fn) {
  return check_dtype(g, dt, count, blocks, fn);
}
int tdist__ops_check_redop(const tdist_group_t *g, tdist_redop_t op, const char *fn) {
  return check_redop(g, op, fn);
}
int tdist__ops_check_rank(const tdist_group_t *g, int r, const char *what, const char *fn) {
  return check_rank(g, r, what, fn);
}
int tdist__ops_check_buf(const tdist_group_t *g, const void *buf, size_t count, const char *what,
                         const char *fn) {
  return check_buf(g, buf, count, what, fn);
}
void tdist__ops_args_init(tdist_backend_args_t *a, tdist_optype_t type,
                          const tdist_op_opts_t *opts) {
  args_init(a, type, opts);
}
int tdist__ops_submit(tdist_group_t *g, const tdist_backend_args_t *a, const tdist_op_opts_t *opts,
                      tdist_work_t **out) {
  return submit(g, a, opts, out);
}
