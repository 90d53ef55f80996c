/*
 * nccl_ops_v.c - the variable-size collectives on the NCCL backend (caller
 * thread, inside submit with the group's mutex held: nccl_ops.c).
 *
 * NCCL has no *v collectives, so each is one NCCL group (ncclGroupStart /
 * ncclGroupEnd) of point-to-point calls, which NCCL runs concurrently and
 * never deadlocks against itself (the pattern torch's ProcessGroupNCCL uses
 * for all_to_all_single with split sizes and for uneven all_gather):
 *
 *   all_to_all_v      ncclSend of send block j to j, ncclRecv of block j
 *                     from j, for every j (self included: NCCL copies)
 *   all_gather_v      ncclSend of the own block to every rank, ncclRecv of
 *                     block j from j (self skipped when in place)
 *   gather_v          ncclSend to root; root ncclRecv's every block
 *   scatter_v         root ncclSend's every block; ncclRecv from root
 *   reduce_scatter_v  one ncclReduce per block j, rooted at j (count
 *                     recv_counts[j]), all in the group: NCCL aggregates
 *                     collectives of one group
 *
 * Empty blocks make no call on either side: both sides skip them when the
 * ranks agree on the counts. They must (tdist/ops.h): unlike the CPU
 * backend, NCCL sends no header that could show a disagreement, and a
 * disagreement hangs until the op's timeout, as in NCCL itself.
 *
 * The counts are the caller's arrays (tdist/backend.h), read here only, on
 * the submitting thread, before submit returns.
 */
#include "nccl/nccl_backend.h"

static const char *elem(const void *base, size_t el, size_t es) {
  return base && el ? (const char *)base + el * es : (const char *)base;
}

static size_t displ(const size_t *displs, int j, size_t packed) {
  return displs ? displs[j] : packed;
}

/* One send or receive, skipped when empty; the first error sticks. */
static void p2p(ncclResult_t *r, int send, const void *buf, size_t count, ncclDataType_t dt,
                int peer, ncclComm_t c, cudaStream_t s) {
  if (*r != ncclSuccess || count == 0) return;
  *r = send ? ncclSend(buf, count, dt, peer, c, s) : ncclRecv((void *)buf, count, dt, peer, c, s);
}

ncclResult_t tdist__nccl_launch_v(tdist__nccl_t *nc, const tdist_backend_args_t *a,
                                  ncclDataType_t dt, ncclRedOp_t op, cudaStream_t s) {
  ncclComm_t c = nc->comm;
  int n = nc->size, me = nc->rank;
  size_t es = tdist_dtype_size(a->dtype), so = 0, ro = 0;
  ncclResult_t r = ncclGroupStart();
  if (r != ncclSuccess) return r;
  switch (a->type) {
  case TDIST_OP_ALL_TO_ALL_V:
    for (int j = 0; j < n; j++) {
      p2p(&r, 1, elem(a->sendbuf, displ(a->sdispls, j, so), es), a->scounts[j], dt, j, c, s);
      p2p(&r, 0, elem(a->recvbuf, displ(a->rdispls, j, ro), es), a->rcounts[j], dt, j, c, s);
      so += a->scounts[j];
      ro += a->rcounts[j];
    }
    break;
  case TDIST_OP_ALL_GATHER_V:
  case TDIST_OP_GATHER_V: {
    int all = a->type == TDIST_OP_ALL_GATHER_V;
    for (int j = 0; j < n; j++) {
      size_t rd = a->rcounts ? displ(a->rdispls, j, ro) : 0;
      if (a->rcounts) ro += a->rcounts[j];
      int receives = all || me == a->root, in_place = elem(a->recvbuf, rd, es) == a->sendbuf;
      if (j == me && receives && in_place) continue; /* already in place */
      if (all || j == a->root) p2p(&r, 1, a->sendbuf, a->count, dt, j, c, s);
      if (receives) p2p(&r, 0, elem(a->recvbuf, rd, es), a->rcounts[j], dt, j, c, s);
    }
    break;
  }
  case TDIST_OP_SCATTER_V: {
    int in_place = 0; /* root's own block is already in its recvbuf */
    for (int j = 0; j < n && me == a->root; j++) {
      const char *blk = elem(a->sendbuf, displ(a->sdispls, j, so), es);
      so += a->scounts[j];
      if (j == me && blk == (const char *)a->recvbuf) {
        in_place = 1;
        continue;
      }
      p2p(&r, 1, blk, a->scounts[j], dt, j, c, s);
    }
    if (!in_place) p2p(&r, 0, a->recvbuf, a->count, dt, a->root, c, s);
    break;
  }
  case TDIST_OP_REDUCE_SCATTER_V:
    for (int j = 0; j < n && r == ncclSuccess; j++) {
      size_t cnt = a->rcounts[j];
      if (cnt) r = ncclReduce(elem(a->sendbuf, so, es), a->recvbuf, cnt, dt, op, j, c, s);
      so += cnt;
    }
    break;
  default: r = ncclInvalidArgument;
  }
  ncclResult_t e = ncclGroupEnd(); /* always closes the group, even after an error */
  return r != ncclSuccess ? r : e;
}

int tdist__nccl_check_v(const tdist__nccl_t *nc, const tdist_backend_args_t *a) {
  size_t send = 0, recv = 0; /* elements each side moves */
  int n = nc->size;
  switch (a->type) {
  case TDIST_OP_ALL_TO_ALL_V:
    for (int j = 0; j < n; j++) {
      send += a->scounts[j];
      recv += a->rcounts[j];
    }
    break;
  case TDIST_OP_ALL_GATHER_V:
  case TDIST_OP_GATHER_V:
    send = a->count;
    for (int j = 0; a->rcounts && j < n; j++)
      recv += a->rcounts[j];
    break;
  case TDIST_OP_SCATTER_V:
    recv = a->count;
    for (int j = 0; a->scounts && j < n; j++)
      send += a->scounts[j];
    break;
  default: /* reduce_scatter_v */
    for (int j = 0; j < n; j++)
      send += a->rcounts[j];
    recv = a->count;
  }
  if (send) TDIST_CHECK(tdist__nccl_check_ptr(nc, a->sendbuf, "sendbuf", a->type));
  if (recv && a->recvbuf != a->sendbuf)
    TDIST_CHECK(tdist__nccl_check_ptr(nc, a->recvbuf, "recvbuf", a->type));
  return 0;
}
