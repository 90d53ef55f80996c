/*
 * opcheck.h - the one argument checker of the public ops (ops;
 * internal). Every public op (ops.c, ops_v.c) fills a descriptor -- the
 * op's arguments as the backend will see them, tdist_backend_args_t
 * (tdist/backend.h): kind, buffers, count, count and displacement arrays,
 * dtype, reduction, root or peer, tag, batch -- and hands it to
 * tdist__op_check, which validates it against the group and its backend's
 * capabilities. A fixed op and its v sibling go through the same checks in
 * the same order, so the same bad argument fails both with the same code
 * and the same words. Caller thread.
 *
 * Order of the checks (the first failure is reported):
 *   1. the group: not NULL, not aborted (the cause's code), the backend runs
 *      the op (TDIST_ERR_NOT_SUPPORTED);
 *   2. the dtype: known, then the backend has it (NOT_SUPPORTED);
 *   3. reducing ops (tdist/backend.h: tdist_backend_op_props): the reduction means something for
 * the dtype (a bitwise op of a float, AVG/PREMUL_SUM of bool: INVALID_ARGUMENT, on every backend),
 * then the backend has it;
 *   4. root (rooted ops) or peer and tag (send/recv; wildcards only where
 *      the backend matches them, caps.any_source);
 *   5. sizes: count x blocks x element size fits a size_t; v-ops: the
 *      arrays are there where they are read, displacement + count does not
 *      overflow, this rank's own block agrees with its own count;
 *   6. buffers: not NULL while they hold elements, not CUDA device memory
 *      on a host-memory backend;
 *   7. overlap (MPI's rule): the bytes an op reads from sendbuf and the
 *      bytes it writes to recvbuf must be disjoint, except in the op's one
 *      in-place form, where the pointers are exactly:
 *        all_reduce, reduce (root)    sendbuf == recvbuf
 *        all_gather(_v)               sendbuf == recvbuf + own block's offset
 *        gather(_v) (root)            sendbuf == recvbuf + root's block offset
 *        scatter(_v) (root)           recvbuf == sendbuf + root's block offset
 *        reduce_scatter(_v)           recvbuf == sendbuf + own block's offset
 *        all_to_all(_v)               none: any overlap is refused
 *      (fixed ops: block offset = rank x count; v-ops: its displacement, or
 *      the sum of the counts before it when packed).
 * All argument errors are TDIST_ERR_INVALID_ARGUMENT unless said otherwise.
 */
#ifndef TDIST_CORE_OPCHECK_H
#define TDIST_CORE_OPCHECK_H

#include <string.h>

#include "core/group/group.h"

/* A zeroed descriptor of `type` with the options' scalar, stream and tag. */
static inline void tdist__op_desc_init(tdist_backend_args_t *a, tdist_optype_t type,
                                       const tdist_op_opts_t *opts) {
  memset(a, 0, sizeof(*a));
  a->type = type;
  a->scalar = (opts && (opts->mask & TDIST_OP_FIELD_SCALAR)) ? opts->premul_scalar : 1.0;
  a->stream = (opts && (opts->mask & TDIST_OP_FIELD_STREAM)) ? opts->stream : NULL;
  a->tag = (opts && (opts->mask & TDIST_OP_FIELD_TAG)) ? opts->tag : 0;
}

/* Validate the descriptor for group g (fn: the public call's name, for the
 * message). 0, or the recorded error (tdist_last_error). On success the
 * fields the backend reads are completed: a v-op's count is this rank's own
 * block (all_to_all_v: the sum of send_counts; reduce_scatter_v:
 * recv_counts[rank]) and the arrays a rank does not read are NULL (gather_v's
 * recv arrays and scatter_v's send arrays off root). */
int tdist__op_check(tdist_group_t *g, tdist_backend_args_t *a, const char *fn);

#endif
