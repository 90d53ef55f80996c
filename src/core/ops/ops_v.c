/*
 * ops_v.c - the variable-size collectives (all_to_all_v, all_gather_v,
 * reduce_scatter_v, gather_v, scatter_v) (beside ops.c).
 *
 * Caller thread, like ops.c: fill the op's descriptor, validate it with the
 * same checker as the fixed ops (opcheck.c: capabilities, dtype, reduction,
 * root, sizes, NULL or device buffers, overlap), so a v-op fails exactly
 * like its fixed sibling, then submit it (ops.c). The count and
 * displacement arrays are NOT copied (tdist/ops.h, MPI's rule for its
 * nonblocking *v calls): the op's arguments point at the caller's arrays,
 * which stay valid until completion, so submission allocates nothing, and
 * the backends read them while the op runs (tdist/backend.h).
 */
#include "core/ops/ops_int.h"
#include "util/error.h"

int tdist_all_to_all_v(tdist_group_t *g, const void *sendbuf, const size_t *send_counts,
                       const size_t *send_displs, void *recvbuf, const size_t *recv_counts,
                       const size_t *recv_displs, tdist_dtype_t dtype, const tdist_op_opts_t *opts,
                       tdist_work_t **work) {
  tdist__error_clear();
  tdist_backend_args_t a;
  tdist__op_desc_init(&a, TDIST_OP_ALL_TO_ALL_V, opts);
  a.sendbuf = sendbuf;
  a.recvbuf = recvbuf;
  a.dtype = dtype;
  a.scounts = send_counts;
  a.sdispls = send_displs;
  a.rcounts = recv_counts;
  a.rdispls = recv_displs;
  return tdist__ops_check_submit(g, &a, "tdist_all_to_all_v", opts, work);
}

/* all_gather_v and gather_v: one send_count block from every rank, laid
 * out by recv_counts/recv_displs (on root only for gather_v). */
static int gather_like(tdist_group_t *g, tdist_optype_t type, const char *fn, const void *sendbuf,
                       size_t send_count, void *recvbuf, const size_t *recv_counts,
                       const size_t *recv_displs, tdist_dtype_t dtype, int root,
                       const tdist_op_opts_t *opts, tdist_work_t **work) {
  tdist__error_clear();
  tdist_backend_args_t a;
  tdist__op_desc_init(&a, type, opts);
  a.sendbuf = sendbuf;
  a.recvbuf = recvbuf;
  a.count = send_count;
  a.dtype = dtype;
  a.root = root;
  a.rcounts = recv_counts;
  a.rdispls = recv_displs;
  return tdist__ops_check_submit(g, &a, fn, opts, work);
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
  tdist__error_clear();
  tdist_backend_args_t a;
  tdist__op_desc_init(&a, TDIST_OP_SCATTER_V, opts);
  a.sendbuf = sendbuf;
  a.recvbuf = recvbuf;
  a.count = recv_count;
  a.dtype = dtype;
  a.root = root;
  a.scounts = send_counts;
  a.sdispls = send_displs;
  return tdist__ops_check_submit(g, &a, "tdist_scatter_v", opts, work);
}

int tdist_reduce_scatter_v(tdist_group_t *g, const void *sendbuf, void *recvbuf,
                           const size_t *recv_counts, tdist_dtype_t dtype, tdist_redop_t op,
                           const tdist_op_opts_t *opts, tdist_work_t **work) {
  tdist__error_clear();
  tdist_backend_args_t a;
  tdist__op_desc_init(&a, TDIST_OP_REDUCE_SCATTER_V, opts);
  a.sendbuf = sendbuf;
  a.recvbuf = recvbuf;
  a.dtype = dtype;
  a.redop = op;
  a.rcounts = recv_counts;
  return tdist__ops_check_submit(g, &a, "tdist_reduce_scatter_v", opts, work);
}
