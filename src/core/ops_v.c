/*
 * ops_v.c - the variable-size collectives (all_to_all_v, all_gather_v,
 * reduce_scatter_v, gather_v, scatter_v) and the wildcard-receive check
 * (layer 6, beside ops.c).
 *
 * Caller thread, like ops.c: validate with ops.c's own checks (so a v-op
 * fails exactly like its fixed sibling: capabilities, dtype, reduction,
 * root, NULL or device buffers), then submit through ops.c. The count and
 * displacement arrays are NOT copied (tdist/ops.h, MPI's rule for its
 * nonblocking *v calls): the op's arguments point at the caller's arrays,
 * which stay valid until completion, so submission allocates nothing, and
 * the backends read them while the op runs (core/backend.h).
 *
 * What is checked here is what one rank can check alone: array pointers,
 * overflow of displacement + count and of the byte extent, buffers large
 * enough to be non-NULL, the rank's own block agreeing with its own count.
 * Agreement between ranks (rank i's send_counts[j] == rank j's
 * recv_counts[i]) needs the other rank's view: the CPU backend compares
 * them in its message headers (cpu/algos_v.c) and fails MISMATCH.
 */
#include <stdio.h>
#include <string.h>

#include "core/ops_int.h"
#include "util/error.h"

/* The elements a buffer must hold for these blocks: the largest displacement
 * + count (displs NULL: the packed sum). *sum is the sum of the counts. */
static int extent(const tdist_group_t *g, const size_t *counts, const size_t *displs,
                  const char *what, const char *fn, size_t *ext, size_t *sum) {
  size_t e = 0, s = 0;
  if (!counts) return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, what);
  for (int j = 0; j < g->size; j++) {
    if (counts[j] > SIZE_MAX - s)
      return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "%s: the sum of %s overflows", fn, what);
    size_t lo = displs ? displs[j] : s;
    s += counts[j];
    if (counts[j] > SIZE_MAX - lo)
      return tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                          "%s: %s[%d] = %zu at displacement %zu overflows the address space", fn,
                          what, j, counts[j], lo);
    if (counts[j] && lo + counts[j] > e) e = lo + counts[j];
  }
  *ext = e;
  if (sum) *sum = s;
  return 0;
}

/* A buffer of `ext` elements of dt: the byte size fits, the pointer is fine. */
static int vbuf(const tdist_group_t *g, const void *buf, size_t ext, tdist_dtype_t dt,
                const char *what, const char *fn) {
  TDIST_CHECK(tdist__ops_check_dtype(g, dt, ext, 1, fn));
  return tdist__ops_check_buf(g, buf, ext, what, fn);
}

static size_t at(const size_t *displs, const size_t *counts, int j) {
  if (displs) return displs[j];
  size_t s = 0;
  for (int i = 0; i < j; i++)
    s += counts[i];
  return s;
}

int tdist_all_to_all_v(tdist_group_t *g, const void *sendbuf, const size_t *send_counts,
                       const size_t *send_displs, void *recvbuf, const size_t *recv_counts,
                       const size_t *recv_displs, tdist_dtype_t dtype, const tdist_op_opts_t *opts,
                       tdist_work_t **work) {
  static const char fn[] = "tdist_all_to_all_v";
  tdist__error_clear();
  TDIST_CHECK(tdist__ops_check_group(g, TDIST_OP_ALL_TO_ALL_V, fn));
  TDIST_CHECK(tdist__ops_check_dtype(g, dtype, 0, 1, fn));
  size_t sext, rext, stotal;
  TDIST_CHECK(extent(g, send_counts, send_displs, "send_counts", fn, &sext, &stotal));
  TDIST_CHECK(extent(g, recv_counts, recv_displs, "recv_counts", fn, &rext, NULL));
  TDIST_CHECK(vbuf(g, sendbuf, sext, dtype, "sendbuf", fn));
  TDIST_CHECK(vbuf(g, recvbuf, rext, dtype, "recvbuf", fn));
  if (sext && rext && sendbuf == recvbuf)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "%s: in-place is not supported", fn);
  tdist__op_args_t a;
  tdist__ops_args_init(&a, TDIST_OP_ALL_TO_ALL_V, opts);
  a.sendbuf = sendbuf;
  a.recvbuf = recvbuf;
  a.count = stotal;
  a.dtype = dtype;
  a.scounts = send_counts;
  a.sdispls = send_displs;
  a.rcounts = recv_counts;
  a.rdispls = recv_displs;
  return tdist__ops_submit(g, &a, opts, work);
}

/* all_gather_v and gather_v: one send_count block from every rank, laid
 * out by recv_counts/recv_displs (on root only for gather_v). */
static int gather_like(tdist_group_t *g, tdist_optype_t type, const char *fn, const void *sendbuf,
                       size_t send_count, void *recvbuf, const size_t *recv_counts,
                       const size_t *recv_displs, tdist_dtype_t dtype, int root,
                       const tdist_op_opts_t *opts, tdist_work_t **work) {
  tdist__error_clear();
  TDIST_CHECK(tdist__ops_check_group(g, type, fn));
  TDIST_CHECK(tdist__ops_check_dtype(g, dtype, send_count, 1, fn));
  int receives = 1;
  if (type == TDIST_OP_GATHER_V) {
    TDIST_CHECK(tdist__ops_check_rank(g, root, "root", fn));
    receives = g->rank == root;
  }
  TDIST_CHECK(tdist__ops_check_buf(g, sendbuf, send_count, "sendbuf", fn));
  if (receives) {
    size_t rext;
    TDIST_CHECK(extent(g, recv_counts, recv_displs, "recv_counts", fn, &rext, NULL));
    TDIST_CHECK(vbuf(g, recvbuf, rext, dtype, "recvbuf", fn));
    if (recv_counts[g->rank] != send_count)
      return tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                          "%s: recv_counts[%d] = %zu but this rank's send_count is %zu", fn,
                          g->rank, recv_counts[g->rank], send_count);
  } else {
    recv_counts = recv_displs = NULL; /* not read off root */
  }
  tdist__op_args_t a;
  tdist__ops_args_init(&a, type, opts);
  a.sendbuf = sendbuf;
  a.recvbuf = recvbuf;
  a.count = send_count;
  a.dtype = dtype;
  a.root = root;
  a.rcounts = recv_counts;
  a.rdispls = recv_displs;
  return tdist__ops_submit(g, &a, opts, work);
}

int tdist_all_gather_v(tdist_group_t *g, const void *sendbuf, size_t send_count, void *recvbuf,
                       const size_t *recv_counts, const size_t *recv_displs, tdist_dtype_t dtype,
                       const tdist_op_opts_t *opts, tdist_work_t **work) {
  return gather_like(g, TDIST_OP_ALL_GATHER_V, "tdist_all_gather_v", sendbuf, send_count, recvbuf,
                     recv_counts, recv_displs, dtype, 0, opts, work);
}

int tdist_gather_v(tdist_group_t *g, const void *sendbuf, size_t send_count, void *recvbuf,
                   const size_t *recv_counts, const size_t *recv_displs, tdist_dtype_t dtype,
                   int root, const tdist_op_opts_t *opts, tdist_work_t **work) {
  return gather_like(g, TDIST_OP_GATHER_V, "tdist_gather_v", sendbuf, send_count, recvbuf,
                     recv_counts, recv_displs, dtype, root, opts, work);
}

int tdist_scatter_v(tdist_group_t *g, const void *sendbuf, const size_t *send_counts,
                    const size_t *send_displs, void *recvbuf, size_t recv_count,
                    tdist_dtype_t dtype, int root, const tdist_op_opts_t *opts,
                    tdist_work_t **work) {
  static const char fn[] = "tdist_scatter_v";
  tdist__error_clear();
  TDIST_CHECK(tdist__ops_check_group(g, TDIST_OP_SCATTER_V, fn));
  TDIST_CHECK(tdist__ops_check_dtype(g, dtype, recv_count, 1, fn));
  TDIST_CHECK(tdist__ops_check_rank(g, root, "root", fn));
  TDIST_CHECK(tdist__ops_check_buf(g, recvbuf, recv_count, "recvbuf", fn));
  if (g->rank == root) {
    size_t sext;
    TDIST_CHECK(extent(g, send_counts, send_displs, "send_counts", fn, &sext, NULL));
    TDIST_CHECK(vbuf(g, sendbuf, sext, dtype, "sendbuf (on root)", fn));
    if (send_counts[root] != recv_count)
      return tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                          "%s: send_counts[%d] = %zu but root's recv_count is %zu", fn, root,
                          send_counts[root], recv_count);
  } else {
    send_counts = send_displs = NULL;
  }
  tdist__op_args_t a;
  tdist__ops_args_init(&a, TDIST_OP_SCATTER_V, opts);
  a.sendbuf = sendbuf;
  a.recvbuf = recvbuf;
  a.count = recv_count;
  a.dtype = dtype;
  a.root = root;
  a.scounts = send_counts;
  a.sdispls = send_displs;
  return tdist__ops_submit(g, &a, opts, work);
}

int tdist_reduce_scatter_v(tdist_group_t *g, const void *sendbuf, void *recvbuf,
                           const size_t *recv_counts, tdist_dtype_t dtype, tdist_redop_t op,
                           const tdist_op_opts_t *opts, tdist_work_t **work) {
  static const char fn[] = "tdist_reduce_scatter_v";
  tdist__error_clear();
  TDIST_CHECK(tdist__ops_check_group(g, TDIST_OP_REDUCE_SCATTER_V, fn));
  TDIST_CHECK(tdist__ops_check_dtype(g, dtype, 0, 1, fn));
  TDIST_CHECK(tdist__ops_check_redop(g, op, fn));
  size_t sext, total;
  TDIST_CHECK(extent(g, recv_counts, NULL, "recv_counts", fn, &sext, &total));
  TDIST_CHECK(vbuf(g, sendbuf, total, dtype, "sendbuf", fn));
  TDIST_CHECK(tdist__ops_check_buf(g, recvbuf, recv_counts[g->rank], "recvbuf", fn));
  /* In place is recvbuf at this rank's own block; any other overlap is
   * refused (the sends read sendbuf while receives land in recvbuf). */
  size_t es = tdist_dtype_size(dtype), mine = at(NULL, recv_counts, g->rank);
  const char *sb = sendbuf, *rb = recvbuf;
  if (recv_counts[g->rank] && total && rb != sb + mine * es &&
      rb + recv_counts[g->rank] * es > sb && rb < sb + total * es)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                        "%s: recvbuf overlaps sendbuf other than at this rank's block "
                        "(sendbuf + %zu elements)",
                        fn, mine);
  tdist__op_args_t a;
  tdist__ops_args_init(&a, TDIST_OP_REDUCE_SCATTER_V, opts);
  a.sendbuf = sendbuf;
  a.recvbuf = recvbuf;
  a.count = recv_counts[g->rank];
  a.dtype = dtype;
  a.redop = op;
  a.rcounts = recv_counts;
  return tdist__ops_submit(g, &a, opts, work);
}

/* ---- wildcard receives --------------------------------------------------------- */

int tdist__ops_check_any(const tdist_group_t *g, const char *what, const char *fn) {
  if (g->bk->caps.any_source) return 0;
  return tdist__error(TDIST_ERR_NOT_SUPPORTED,
                      "%s: backend '%s' of group '%s' cannot match %s (receives must name the "
                      "peer and the tag; NCCL matches point-to-point messages by call order)",
                      fn, g->bk->name, g->name, what);
}
