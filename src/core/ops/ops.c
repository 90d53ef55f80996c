/*
 * ops.c - the public collective and point-to-point calls.
 *
 * Caller thread: fill the op's descriptor and validate it (opcheck.c, against
 * the backend's declared capabilities, so an unsupported combination fails
 * the same way on every backend), fill a work from the pool, give the
 * backend its caller-thread hook (NCCL launches there), push the work to the
 * progress thread (submit, also the v-ops' of ops_v.c). Nothing here
 * allocates in steady state (batches of more than TDIST__P2P_INLINE
 * point-to-point ops copy their array to the heap).
 */
#include <string.h>

#include "core/ops/ops_int.h"
#include "util/alloc.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/param.h"

/* Hand a validated op to the backend and the progress thread (ops_int.h). */
int tdist__ops_submit(tdist_group_t *g, const tdist_backend_args_t *a, const tdist_op_opts_t *opts,
                      tdist_work_t **out) {
  if (!out && tdist__progress_on_thread())
    return tdist__error(TDIST_ERR_INVALID_STATE,
                        "%s: a synchronous op on the progress thread (from a completion "
                        "callback) would wait for itself; pass a work out-param",
                        tdist_op_name(a->type));
  tdist_work_t *w = tdist__work_alloc(g);
  if (!w) return tdist__error(TDIST_ERR_NO_MEMORY, "cannot allocate a work handle");
  w->args = *a;
  if (a->np2p > 0) {
    size_t bytes = sizeof(tdist_p2p_op_t) * (size_t)a->np2p;
    w->args.p2p = a->np2p <= TDIST__P2P_INLINE ? w->p2p_inline : tdist__malloc(bytes);
    if (!w->args.p2p) {
      w->args.np2p = 0;
      tdist__work_release_owned(w);
      return tdist__error(TDIST_ERR_NO_MEMORY, "cannot copy %d point-to-point ops", a->np2p);
    }
    memcpy(w->args.p2p, a->p2p, bytes);
  }
  w->bop.timeout_ms = (opts && (opts->mask & TDIST_OP_FIELD_TIMEOUT) && opts->timeout_ms > 0)
                          ? opts->timeout_ms
                          : atomic_load_explicit(&g->timeout_ms, memory_order_relaxed);
  w->qnode.run = tdist__group_start_work;
  /* The flight recorder's start: a backend with a submit hook may start the
   * op there (NCCL launches it, the CPU backend posts it to its engine),
   * and a waiter may claim its end before the progress thread ever posts
   * it, so the start is the submission (work.c keeps a start already set).
   * Submission time and deadline: stamped after the submit and the first
   * test (tdist__work_stamp). */
  w->start_at_stamp = g->bk->ops->submit != NULL;
  int captured = 0; /* captured into a CUDA graph: finished here (backend.h) */
  if (g->bk->ops->submit) {
    int rc = g->bk->ops->submit(g->bstate, &w->bop);
    captured = rc == TDIST_BACKEND_CAPTURED;
    if (rc < 0) {
      tdist__work_release_owned(w);
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
  w->coll = tdist_backend_op_is_p2p(a->type)
                ? atomic_load_explicit(&g->next_coll, memory_order_relaxed)
                : atomic_fetch_add_explicit(&g->next_coll, 1, memory_order_relaxed);
  /* Every rank captures the same ops in the same order, so a captured op
   * takes its number once, here; its launches are the graph's. */
  if (captured) return tdist__group_finish_captured(w, out);
  /* The caller-driven path (work.c): this thread looks at the op first
   * (and drives a synchronous one through its spin); one that succeeded
   * here needs the progress thread for nothing: it is recorded and
   * released here. Each hand-off cost a wake-up of the progress thread,
   * which on a host with a core per rank took a caller's core. */
  w->test = g->bk->ops->test;
  w->test_state = g->bstate;
  if (tdist__work_start(w, !out, &g->aborted)) return tdist__group_finish_inline(w, out);
  /* Not done (or its group aborted): the progress thread takes it over as
   * any op, and a synchronous wait below sleeps. */
  if (!w->t_enqueue_ns) tdist__work_stamp(w, tdist__now_ns()); /* where no test did */
  atomic_fetch_add_explicit(&g->pending, 1, memory_order_relaxed);
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

/* The collectives of one buffer pair and one count. */
static int coll(tdist_group_t *g, tdist_optype_t type, const char *fn, const void *sendbuf,
                void *recvbuf, size_t count, tdist_dtype_t dtype, tdist_redop_t op, int root,
                const tdist_op_opts_t *opts, tdist_work_t **work) {
  tdist__error_clear();
  tdist_backend_args_t a;
  tdist__op_desc_init(&a, type, opts);
  a.sendbuf = sendbuf;
  a.recvbuf = recvbuf;
  a.count = count;
  a.dtype = dtype;
  a.redop = op;
  a.root = root;
  return tdist__ops_check_submit(g, &a, fn, opts, work);
}

int tdist_all_reduce(tdist_group_t *g, const void *sendbuf, void *recvbuf, size_t count,
                     tdist_dtype_t dtype, tdist_redop_t op, const tdist_op_opts_t *opts,
                     tdist_work_t **work) {
  return coll(g, TDIST_OP_ALL_REDUCE, "tdist_all_reduce", sendbuf, recvbuf, count, dtype, op, 0,
              opts, work);
}

int tdist_broadcast(tdist_group_t *g, void *buf, size_t count, tdist_dtype_t dtype, int root,
                    const tdist_op_opts_t *opts, tdist_work_t **work) {
  return coll(g, TDIST_OP_BROADCAST, "tdist_broadcast", buf, buf, count, dtype, TDIST_SUM, root,
              opts, work);
}

int tdist_reduce(tdist_group_t *g, const void *sendbuf, void *recvbuf, size_t count,
                 tdist_dtype_t dtype, tdist_redop_t op, int root, const tdist_op_opts_t *opts,
                 tdist_work_t **work) {
  return coll(g, TDIST_OP_REDUCE, "tdist_reduce", sendbuf, recvbuf, count, dtype, op, root, opts,
              work);
}

int tdist_all_gather(tdist_group_t *g, const void *sendbuf, void *recvbuf, size_t count,
                     tdist_dtype_t dtype, const tdist_op_opts_t *opts, tdist_work_t **work) {
  return coll(g, TDIST_OP_ALL_GATHER, "tdist_all_gather", sendbuf, recvbuf, count, dtype, TDIST_SUM,
              0, opts, work);
}

int tdist_gather(tdist_group_t *g, const void *sendbuf, void *recvbuf, size_t count,
                 tdist_dtype_t dtype, int root, const tdist_op_opts_t *opts, tdist_work_t **work) {
  return coll(g, TDIST_OP_GATHER, "tdist_gather", sendbuf, recvbuf, count, dtype, TDIST_SUM, root,
              opts, work);
}

int tdist_scatter(tdist_group_t *g, const void *sendbuf, void *recvbuf, size_t count,
                  tdist_dtype_t dtype, int root, const tdist_op_opts_t *opts, tdist_work_t **work) {
  return coll(g, TDIST_OP_SCATTER, "tdist_scatter", sendbuf, recvbuf, count, dtype, TDIST_SUM, root,
              opts, work);
}

int tdist_reduce_scatter(tdist_group_t *g, const void *sendbuf, void *recvbuf, size_t count,
                         tdist_dtype_t dtype, tdist_redop_t op, const tdist_op_opts_t *opts,
                         tdist_work_t **work) {
  return coll(g, TDIST_OP_REDUCE_SCATTER, "tdist_reduce_scatter", sendbuf, recvbuf, count, dtype,
              op, 0, opts, work);
}

int tdist_all_to_all(tdist_group_t *g, const void *sendbuf, void *recvbuf, size_t count,
                     tdist_dtype_t dtype, const tdist_op_opts_t *opts, tdist_work_t **work) {
  return coll(g, TDIST_OP_ALL_TO_ALL, "tdist_all_to_all", sendbuf, recvbuf, count, dtype, TDIST_SUM,
              0, opts, work);
}

int tdist_barrier(tdist_group_t *g, const tdist_op_opts_t *opts, tdist_work_t **work) {
  tdist__error_clear();
  tdist_backend_args_t a;
  tdist__op_desc_init(&a, TDIST_OP_BARRIER, opts);
  a.dtype = TDIST_UINT8;
  return tdist__ops_check_submit(g, &a, "tdist_barrier", opts, work);
}

/* send and recv: one buffer, a peer (in root) and the options' tag. */
static int p2p(tdist_group_t *g, tdist_optype_t type, const char *fn, void *buf, size_t count,
               tdist_dtype_t dtype, int peer, const tdist_op_opts_t *opts, tdist_work_t **work) {
  tdist__error_clear();
  tdist_backend_args_t a;
  tdist__op_desc_init(&a, type, opts);
  a.sendbuf = buf;
  a.recvbuf = buf;
  a.count = count;
  a.dtype = dtype;
  a.root = peer;
  return tdist__ops_check_submit(g, &a, fn, opts, work);
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
  tdist__error_clear();
  tdist_backend_args_t a;
  tdist__op_desc_init(&a, TDIST_OP_BATCH_P2P, opts);
  a.p2p = (tdist_p2p_op_t *)ops;
  a.np2p = n;
  a.dtype = ops && n > 0 ? ops[0].dtype : TDIST_UINT8;
  return tdist__ops_check_submit(g, &a, "tdist_batch_isend_irecv", opts, work);
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
