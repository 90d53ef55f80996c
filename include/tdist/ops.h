/*
 * tdist/ops.h - collectives and point-to-point operations.
 *
 * Every call validates its arguments on the calling thread, hands the op to
 * the progress thread and returns at once with a work handle in *work
 * (see tdist/work.h). With work == NULL the call is synchronous: it waits for
 * completion (bounded by the op's timeout) and returns the op's status.
 *
 * Common parameters:
 *   group  the group; every member must make the same call (same op, count,
 *          dtype, reduction and root) in the same order. A rank that differs
 *          makes the op fail on every rank with TDIST_ERR_MISMATCH (CPU
 *          backend) instead of hanging or corrupting memory; a rank that
 *          only sends in it, or a broadcast receiver that got the root's
 *          data, may complete it and fail a later op on the group instead,
 *          at the latest its first op that receives data, its first
 *          point-to-point op or its 17th collective from that one on
 *          (docs/cpu-backend.md "Mismatch").
 *   count  number of elements (not bytes); 0 is allowed and completes at once
 *          after the ranks agree.
 *   opts   NULL or per-op options (timeout, PREMUL_SUM scalar, CUDA stream).
 *   work   out: the handle; NULL for a synchronous call.
 * Buffers are host memory on the "cpu" backend and device memory on "nccl",
 * and belong to tdist until the work is complete.
 *
 * Overlap (MPI's rule, the same for a fixed op and its v sibling): the bytes
 * an op reads from sendbuf and those it writes to recvbuf must be disjoint,
 * except in the op's in-place form, given by exact pointers below (e.g.
 * all_reduce: sendbuf == recvbuf; reduce_scatter: recvbuf == sendbuf +
 * rank x count elements). all_to_all and all_to_all_v have none: any
 * overlap is refused. Buffers a rank does not use (gather's recvbuf off
 * root) and empty ones are not compared.
 *
 * Returns (immediately): 0 when the op was submitted (for the synchronous
 * form: when it completed successfully); TDIST_ERR_INVALID_ARGUMENT for a bad
 * argument (NULL buffer with count > 0, root/peer out of range, unknown dtype
 * or op, a reduction that means nothing for the dtype, a count whose byte
 * size overflows, overlapping buffers, negative tag), with tdist_last_error()
 * naming it; if the group was aborted, the code of what aborted it
 * (TDIST_ERR_ABORTED after a timeout or an abort on demand,
 * TDIST_ERR_REMOTE_FAILED, TDIST_ERR_MISMATCH, TDIST_ERR_NCCL_ERROR...);
 * TDIST_ERR_NOT_SUPPORTED if the backend lacks the op, dtype or reduction.
 * Failures after submission are reported by the work handle.
 *
 * Thread: any, except blocking (work == NULL) calls from a completion callback.
 */
#ifndef TDIST_OPS_H
#define TDIST_OPS_H

#include "tdist/types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* all_reduce: recvbuf[i] = op over ranks of sendbuf[i], on every rank.
 * In place when sendbuf == recvbuf. */
int tdist_all_reduce(tdist_group_t *group, const void *sendbuf, void *recvbuf, size_t count,
                     tdist_dtype_t dtype, tdist_redop_t op, const tdist_op_opts_t *opts,
                     tdist_work_t **work);

/* broadcast: buf on every rank receives root's buf (in place, as torch). */
int tdist_broadcast(tdist_group_t *group, void *buf, size_t count, tdist_dtype_t dtype, int root,
                    const tdist_op_opts_t *opts, tdist_work_t **work);

/* reduce: root's recvbuf = op over ranks of sendbuf; recvbuf is only used on
 * root (may be NULL elsewhere). In place on root when sendbuf == recvbuf. */
int tdist_reduce(tdist_group_t *group, const void *sendbuf, void *recvbuf, size_t count,
                 tdist_dtype_t dtype, tdist_redop_t op, int root, const tdist_op_opts_t *opts,
                 tdist_work_t **work);

/* all_gather: recvbuf (size * count elements) holds every rank's sendbuf in
 * rank order. In place when sendbuf == recvbuf + rank * count elements. */
int tdist_all_gather(tdist_group_t *group, const void *sendbuf, void *recvbuf, size_t count,
                     tdist_dtype_t dtype, const tdist_op_opts_t *opts, tdist_work_t **work);

/* gather: root's recvbuf (size * count elements) holds every rank's sendbuf
 * in rank order; recvbuf only used on root. In place on root when sendbuf ==
 * recvbuf + root * count elements. */
int tdist_gather(tdist_group_t *group, const void *sendbuf, void *recvbuf, size_t count,
                 tdist_dtype_t dtype, int root, const tdist_op_opts_t *opts, tdist_work_t **work);

/* scatter: rank r's recvbuf (count elements) receives block r of root's
 * sendbuf (size * count elements); sendbuf only used on root. In place on
 * root when recvbuf == sendbuf + root * count elements. */
int tdist_scatter(tdist_group_t *group, const void *sendbuf, void *recvbuf, size_t count,
                  tdist_dtype_t dtype, int root, const tdist_op_opts_t *opts, tdist_work_t **work);

/* reduce_scatter: rank r's recvbuf (count elements) = op over ranks of block
 * r of sendbuf (size * count elements). In place when recvbuf == sendbuf +
 * rank * count elements. */
int tdist_reduce_scatter(tdist_group_t *group, const void *sendbuf, void *recvbuf, size_t count,
                         tdist_dtype_t dtype, tdist_redop_t op, const tdist_op_opts_t *opts,
                         tdist_work_t **work);

/* all_to_all: block j (count elements) of rank i's sendbuf lands in block i
 * of rank j's recvbuf. Buffers hold size * count elements; no in-place form:
 * they must not overlap. */
int tdist_all_to_all(tdist_group_t *group, const void *sendbuf, void *recvbuf, size_t count,
                     tdist_dtype_t dtype, const tdist_op_opts_t *opts, tdist_work_t **work);

/* barrier: completes once every rank of the group entered it. */
int tdist_barrier(tdist_group_t *group, const tdist_op_opts_t *opts, tdist_work_t **work);

/* isend / irecv: point-to-point with a tag (opts->tag, default 0). Messages
 * between two ranks with the same tag are matched in order. The count and
 * dtype of a send and its receive must agree (else TDIST_ERR_MISMATCH).
 * irecv/recv also take wildcards (TDIST_ANY_SOURCE, TDIST_ANY_TAG: below). */
int tdist_isend(tdist_group_t *group, const void *buf, size_t count, tdist_dtype_t dtype, int peer,
                const tdist_op_opts_t *opts, tdist_work_t **work);
int tdist_irecv(tdist_group_t *group, void *buf, size_t count, tdist_dtype_t dtype, int peer,
                const tdist_op_opts_t *opts, tdist_work_t **work);
/* send / recv: the blocking forms (isend/irecv followed by a wait). */
int tdist_send(tdist_group_t *group, const void *buf, size_t count, tdist_dtype_t dtype, int peer,
               const tdist_op_opts_t *opts);
int tdist_recv(tdist_group_t *group, void *buf, size_t count, tdist_dtype_t dtype, int peer,
               const tdist_op_opts_t *opts);

/* One point-to-point op of a batch. */
typedef enum tdist_p2p_kind { TDIST_P2P_SEND = 0, TDIST_P2P_RECV = 1 } tdist_p2p_kind_t;
typedef struct tdist_p2p_op {
  tdist_p2p_kind_t kind;
  void *buf; /* read for SEND, written for RECV */
  size_t count;
  tdist_dtype_t dtype;
  int peer;
  int tag;
} tdist_p2p_op_t;

/*
 * batch_isend_irecv: post n point-to-point ops as one work (like torch's
 * batch_isend_irecv; on NCCL one ncclGroupStart/End). The array is copied;
 * the buffers must stay valid until completion. Sends and receives in one
 * batch never deadlock against each other.
 */
int tdist_batch_isend_irecv(tdist_group_t *group, const tdist_p2p_op_t *ops, int n,
                            const tdist_op_opts_t *opts, tdist_work_t **work);

/* ---- wildcard receives ------------------------------------------------------------
 *
 * tdist_irecv / tdist_recv take peer = TDIST_ANY_SOURCE and opts->tag =
 * TDIST_ANY_TAG (MPI_ANY_SOURCE / MPI_ANY_TAG) on backends that can match
 * them (CPU; NCCL refuses them with TDIST_ERR_NOT_SUPPORTED). A receive
 * matches the earliest-arrived message that fits its pattern; receives are
 * matched in the order they were posted; messages from one sender are
 * matched in the order it sent them (MPI's non-overtaking rule), whatever
 * the mix of named and wildcard receives. A wildcard receive (either
 * wildcard) takes a message of up to `count` elements of the same dtype:
 * fewer is fine and tdist_work_status_info (tdist/work.h) says how many came,
 * from whom, with which tag; more, or another dtype, is TDIST_ERR_MISMATCH.
 * A receive naming both peer and tag keeps the exact rule above. Wildcards
 * are for irecv/recv only (not in batch_isend_irecv, not for sends).
 */
#define TDIST_ANY_SOURCE (-1)
#define TDIST_ANY_TAG (-1)

/* ---- variable-size collectives ("v" ops, as MPI's *v calls) ------------------------
 *
 * Counts and displacements are arrays of group size, in elements (not
 * bytes) of `dtype`; a NULL displacement array means packed: block j starts
 * at the sum of counts 0..j-1. Blocks may be empty (count 0) and any size
 * on any rank. Like the buffers, the arrays belong to tdist until the op
 * completes (MPI's rule for its nonblocking *v calls): keep them alive and
 * unchanged until the work is complete. Validation is the fixed ops' (one
 * checker, the same codes and messages): a NULL buffer with a non-empty
 * extent, device memory on a CPU group, overlapping buffers (the rule
 * above), a dtype or reduction the backend lacks; and for the arrays: NULL
 * where read, a displacement + count overflowing, this rank's own count
 * disagreeing with its block.
 *
 * Every rank must agree on the sizes: what rank i sends rank j is what rank
 * j expects from rank i. On the CPU backend a disagreement fails the op with
 * TDIST_ERR_MISMATCH on every rank, naming both ranks and both numbers
 * ("rank 1 sent 5 int32 to rank 2 (its send_counts[2]) but rank 2 expects
 * 7 from rank 1 (its recv_counts[1])"). NCCL, like NCCL itself, cannot
 * check: a disagreement there hangs until the op's timeout.
 */

/* all_to_all_v (MPI_Alltoallv, torch all_to_all_single with split sizes):
 * send_counts[j] elements at sendbuf + send_displs[j] go to rank j, which
 * receives them at recvbuf + recv_displs[i] (recv_counts[i] elements, which
 * must equal rank i's send_counts[j]). No in-place form: the extents
 * [sendbuf, + largest send_displs[j] + send_counts[j]) and the same of
 * recvbuf must not overlap (as all_to_all). */
int tdist_all_to_all_v(tdist_group_t *group, const void *sendbuf, const size_t *send_counts,
                       const size_t *send_displs, void *recvbuf, const size_t *recv_counts,
                       const size_t *recv_displs, tdist_dtype_t dtype, const tdist_op_opts_t *opts,
                       tdist_work_t **work);

/* all_gather_v (MPI_Allgatherv): every rank contributes send_count elements;
 * rank j's land at recvbuf + recv_displs[j] on every rank (recv_counts[j]
 * elements; recv_counts[rank] must equal send_count). In place when sendbuf
 * == recvbuf + recv_displs[rank] elements. */
int tdist_all_gather_v(tdist_group_t *group, const void *sendbuf, size_t send_count, void *recvbuf,
                       const size_t *recv_counts, const size_t *recv_displs, tdist_dtype_t dtype,
                       const tdist_op_opts_t *opts, tdist_work_t **work);

/* reduce_scatter_v (MPI_Reduce_scatter): sendbuf holds size blocks, packed,
 * block j of recv_counts[j] elements; rank r's recvbuf (recv_counts[r]
 * elements) = op over ranks of block r. recv_counts is the same on every
 * rank. In place when recvbuf == sendbuf + (recv_counts[0] + ... +
 * recv_counts[rank-1]) elements. NCCL: one ncclReduce per block, rooted at
 * its owner, in one NCCL group. */
int tdist_reduce_scatter_v(tdist_group_t *group, const void *sendbuf, void *recvbuf,
                           const size_t *recv_counts, tdist_dtype_t dtype, tdist_redop_t op,
                           const tdist_op_opts_t *opts, tdist_work_t **work);

/* gather_v (MPI_Gatherv): rank j's send_count elements land at root's
 * recvbuf + recv_displs[j] (recv_counts[j] elements). recvbuf, recv_counts
 * and recv_displs are only read on root (may be NULL elsewhere). In place on
 * root when sendbuf == recvbuf + recv_displs[root] elements. */
int tdist_gather_v(tdist_group_t *group, const void *sendbuf, size_t send_count, void *recvbuf,
                   const size_t *recv_counts, const size_t *recv_displs, tdist_dtype_t dtype,
                   int root, const tdist_op_opts_t *opts, tdist_work_t **work);

/* scatter_v (MPI_Scatterv): rank j's recvbuf (recv_count elements) receives
 * send_counts[j] elements at root's sendbuf + send_displs[j]. sendbuf,
 * send_counts and send_displs are only read on root (may be NULL
 * elsewhere). In place on root when recvbuf == sendbuf + send_displs[root]
 * elements. */
int tdist_scatter_v(tdist_group_t *group, const void *sendbuf, const size_t *send_counts,
                    const size_t *send_displs, void *recvbuf, size_t recv_count,
                    tdist_dtype_t dtype, int root, const tdist_op_opts_t *opts,
                    tdist_work_t **work);

#ifdef __cplusplus
}
#endif
#endif /* TDIST_OPS_H */
