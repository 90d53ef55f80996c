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
 *          backend) instead of hanging or corrupting memory.
 *   count  number of elements (not bytes); 0 is allowed and completes at once
 *          after the ranks agree.
 *   opts   NULL or per-op options (timeout, PREMUL_SUM scalar, CUDA stream).
 *   work   out: the handle; NULL for a synchronous call.
 * Buffers are host memory on the "cpu" backend and device memory on "nccl",
 * and belong to tdist until the work is complete. "In place" means the same
 * pointer is passed as send and receive buffer.
 *
 * Returns (immediately): 0 when the op was submitted (for the synchronous
 * form: when it completed successfully); TDIST_ERR_INVALID_ARGUMENT for a bad
 * argument (NULL buffer with count > 0, root/peer out of range, unknown dtype
 * or op, negative tag), with tdist_last_error() naming it; if the group was
 * aborted, the code of what aborted it (TDIST_ERR_ABORTED after a timeout or
 * an abort on demand, TDIST_ERR_REMOTE_FAILED, TDIST_ERR_MISMATCH,
 * TDIST_ERR_NCCL_ERROR...); TDIST_ERR_NOT_SUPPORTED if the backend lacks the
 * op or dtype. Failures after submission are reported by the work handle.
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
 * in rank order; recvbuf only used on root. */
int tdist_gather(tdist_group_t *group, const void *sendbuf, void *recvbuf, size_t count,
                 tdist_dtype_t dtype, int root, const tdist_op_opts_t *opts, tdist_work_t **work);

/* scatter: rank r's recvbuf (count elements) receives block r of root's
 * sendbuf (size * count elements); sendbuf only used on root. */
int tdist_scatter(tdist_group_t *group, const void *sendbuf, void *recvbuf, size_t count,
                  tdist_dtype_t dtype, int root, const tdist_op_opts_t *opts, tdist_work_t **work);

/* reduce_scatter: rank r's recvbuf (count elements) = op over ranks of block
 * r of sendbuf (size * count elements). In place when recvbuf == sendbuf +
 * rank * count elements. */
int tdist_reduce_scatter(tdist_group_t *group, const void *sendbuf, void *recvbuf, size_t count,
                         tdist_dtype_t dtype, tdist_redop_t op, const tdist_op_opts_t *opts,
                         tdist_work_t **work);

/* all_to_all: block j (count elements) of rank i's sendbuf lands in block i
 * of rank j's recvbuf. Buffers hold size * count elements; not in place. */
int tdist_all_to_all(tdist_group_t *group, const void *sendbuf, void *recvbuf, size_t count,
                     tdist_dtype_t dtype, const tdist_op_opts_t *opts, tdist_work_t **work);

/* barrier: completes once every rank of the group entered it. */
int tdist_barrier(tdist_group_t *group, const tdist_op_opts_t *opts, tdist_work_t **work);

/* isend / irecv: point-to-point with a tag (opts->tag, default 0). Messages
 * between two ranks with the same tag are matched in order. The count and
 * dtype of a send and its receive must agree (else TDIST_ERR_MISMATCH). */
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

#ifdef __cplusplus
}
#endif
#endif /* TDIST_OPS_H */
