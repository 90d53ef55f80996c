/*
 * opprops.h - what each op kind is (internal; part of the backend contract,
 * included by core/backend.h): the one table that says which ops are
 * rooted, reducing, variable-size or point-to-point. The core (validation in
 * opcheck.c, the flight recorder in trace.c) and the backends (cpu/
 * sigcheck.c, algos_v.c, backend.c; nccl/nccl_ops.c) read it instead of
 * listing op types in their own switches, so a new op kind is classified in
 * one place. Any thread; no state.
 *
 *   ROOTED    args->root is a group rank that every member must agree on
 *             (broadcast, reduce, gather, scatter, gather_v, scatter_v)
 *   REDUCING  args->redop is applied (all_reduce, reduce, reduce_scatter,
 *             reduce_scatter_v): checked against the dtype and the backend
 *   V         counts per rank in args->scounts/rcounts (tdist/ops.h "v" ops)
 *   PEER      args->root is the peer of a send or receive
 *   P2P       point-to-point: send, recv, batch_p2p (matched by peer and
 *             tag, not by the collective sequence)
 */
#ifndef TDIST_CORE_OPPROPS_H
#define TDIST_CORE_OPPROPS_H

#include "tdist/types.h"

enum {
  TDIST__OP_ROOTED = 1u << 0,
  TDIST__OP_REDUCING = 1u << 1,
  TDIST__OP_V = 1u << 2,
  TDIST__OP_PEER = 1u << 3,
  TDIST__OP_P2P = 1u << 4,
};

/* The TDIST__OP_* bits of op kind t; 0 for a value out of range. */
static inline unsigned tdist__op_props(tdist_optype_t t) {
  static const unsigned char props[TDIST_OPTYPE_COUNT] = {
      [TDIST_OP_ALL_REDUCE] = TDIST__OP_REDUCING,
      [TDIST_OP_BROADCAST] = TDIST__OP_ROOTED,
      [TDIST_OP_REDUCE] = TDIST__OP_ROOTED | TDIST__OP_REDUCING,
      [TDIST_OP_ALL_GATHER] = 0,
      [TDIST_OP_GATHER] = TDIST__OP_ROOTED,
      [TDIST_OP_SCATTER] = TDIST__OP_ROOTED,
      [TDIST_OP_REDUCE_SCATTER] = TDIST__OP_REDUCING,
      [TDIST_OP_ALL_TO_ALL] = 0,
      [TDIST_OP_BARRIER] = 0,
      [TDIST_OP_SEND] = TDIST__OP_PEER | TDIST__OP_P2P,
      [TDIST_OP_RECV] = TDIST__OP_PEER | TDIST__OP_P2P,
      [TDIST_OP_BATCH_P2P] = TDIST__OP_P2P,
      [TDIST_OP_ALL_TO_ALL_V] = TDIST__OP_V,
      [TDIST_OP_ALL_GATHER_V] = TDIST__OP_V,
      [TDIST_OP_REDUCE_SCATTER_V] = TDIST__OP_V | TDIST__OP_REDUCING,
      [TDIST_OP_GATHER_V] = TDIST__OP_V | TDIST__OP_ROOTED,
      [TDIST_OP_SCATTER_V] = TDIST__OP_V | TDIST__OP_ROOTED,
  };
  return (unsigned)t < TDIST_OPTYPE_COUNT ? props[t] : 0u;
}

static inline int tdist__op_is_rooted(tdist_optype_t t) {
  return (tdist__op_props(t) & TDIST__OP_ROOTED) != 0;
}
static inline int tdist__op_is_reducing(tdist_optype_t t) {
  return (tdist__op_props(t) & TDIST__OP_REDUCING) != 0;
}
/* The variable-size collectives, whose counts are per rank (backend.h). */
static inline int tdist_backend_op_is_v(tdist_optype_t t) {
  return (tdist__op_props(t) & TDIST__OP_V) != 0;
}
static inline int tdist__op_is_p2p(tdist_optype_t t) {
  return (tdist__op_props(t) & TDIST__OP_P2P) != 0;
}

#endif
