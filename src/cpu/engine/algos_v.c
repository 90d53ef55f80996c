/*
 * algos_v.c - the CPU backend's variable-size collectives (all_to_all_v,
 * all_gather_v, reduce_scatter_v, gather_v, scatter_v) and their mismatch
 * check.
 *
 * Algorithms: every v-op is direct, one round (k = 0): each pair that has
 * anything to say exchanges exactly one message, sent straight from the
 * caller's buffer and received in place. Block sizes differ per rank and
 * may be 0, so rings and trees (which forward other ranks' blocks) would
 * need every rank to know every count; MPI libraries and Gloo use direct
 * exchanges for their *v calls for the same reason. reduce_scatter_v: every
 * rank sends block j to rank j, which folds the n-1 incoming blocks into
 * its recvbuf at the end of the round (reducing receives are staged, engine.c).
 *
 * Agreement: a message is sent to every peer the op pairs this rank with,
 * even an empty one, and its header's count is the element count of that
 * message (not the op's count, as for the fixed ops: engine.c send_one).
 * The receiver compares it with the count it expects from that sender
 * (tdist__cpu_check_v, called by tdist__cpu_check_coll for every header of
 * a v-op), so "rank i's send_counts[j] != rank j's recv_counts[i]" fails the
 * group with MISMATCH on rank j, naming both numbers, and rank j's abort
 * tells everyone. Stall probes (probe.c) and signatures (sigcheck.c: the
 * rooted gather_v and scatter_v hear every member before completing) carry
 * the sender's own count, not a per-peer one: for them only the op, dtype,
 * root and reduction are compared.
 *
 * The count arrays are the caller's (tdist/backend.h: valid until the op
 * completes); they are read here at setup and in the checks, both while the
 * op runs. Progress thread only: setup runs in post, rounds in the engine,
 * checks in the transport (they only report failures, deferred).
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "util/error.h"
#include "cpu/base/base.h"
#include "cpu/transport/transport.h"
#include "cpu/engine/engine.h"

/* base + el elements, without arithmetic on a NULL buffer (an empty one). */
static uint8_t *elem(const void *base, size_t el, size_t es) {
  return base && el ? (uint8_t *)base + el * es : (uint8_t *)base;
}

/* Displacement of block j: displs[j], or the running sum *packed of the
 * counts before it (the caller adds counts[j] after). */
static size_t displ(const size_t *displs, int j, size_t packed) {
  return displs ? displs[j] : packed;
}

/* A send or receive of `count` elements; the count goes in the header. */
static void vsend(cpu_op_t *op, int peer, const void *ptr, size_t count) {
  tdist__cpu_op_send(op, peer, ptr, count * op->es);
  op->sends[op->nsend - 1].count = count;
}

static void vrecv(cpu_op_t *op, int peer, void *ptr, size_t count, int reduce) {
  tdist__cpu_op_recv(op, peer, ptr, count * op->es, reduce && count > 0);
  op->recvs[op->nrecv - 1].count = count;
}

static int a2av_round(cpu_op_t *op, int k) {
  if (k > 0) return 1;
  const tdist_backend_args_t *a = op->args;
  size_t so = 0, ro = 0;
  for (int j = 0; j < op->size; j++) {
    size_t sd = displ(a->sdispls, j, so), rd = displ(a->rdispls, j, ro);
    so += a->scounts[j];
    ro += a->rcounts[j];
    if (j == op->rank) continue;
    vsend(op, j, elem(a->sendbuf, sd, op->es), a->scounts[j]);
    vrecv(op, j, elem(a->recvbuf, rd, op->es), a->rcounts[j], 0);
  }
  return 0;
}

static int agv_round(cpu_op_t *op, int k) {
  if (k > 0) return 1;
  const tdist_backend_args_t *a = op->args;
  size_t ro = 0;
  for (int j = 0; j < op->size; j++) {
    size_t rd = displ(a->rdispls, j, ro);
    ro += a->rcounts[j];
    if (j == op->rank) continue;
    vsend(op, j, a->sendbuf, op->count);
    vrecv(op, j, elem(a->recvbuf, rd, op->es), a->rcounts[j], 0);
  }
  return 0;
}

static int gatherv_round(cpu_op_t *op, int k) {
  if (k > 0) return 1;
  const tdist_backend_args_t *a = op->args;
  if (op->rank != op->root) {
    vsend(op, op->root, a->sendbuf, op->count);
    return 0;
  }
  size_t ro = 0;
  for (int j = 0; j < op->size; j++) {
    size_t rd = displ(a->rdispls, j, ro);
    ro += a->rcounts[j];
    if (j != op->rank) vrecv(op, j, elem(a->recvbuf, rd, op->es), a->rcounts[j], 0);
  }
  return 0;
}

static int scatterv_round(cpu_op_t *op, int k) {
  if (k > 0) return 1;
  const tdist_backend_args_t *a = op->args;
  if (op->rank != op->root) {
    vrecv(op, op->root, a->recvbuf, op->count, 0);
    return 0;
  }
  size_t so = 0;
  for (int j = 0; j < op->size; j++) {
    size_t sd = displ(a->sdispls, j, so);
    so += a->scounts[j];
    if (j != op->rank) vsend(op, j, elem(a->sendbuf, sd, op->es), a->scounts[j]);
  }
  return 0;
}

/* Block j of the input (op->tmp: the PREMUL_SUM-scaled copy, else sendbuf)
 * goes to rank j; this rank's block arrives from everyone, folded into
 * recvbuf (which already holds this rank's own contribution). */
static int rsv_round(cpu_op_t *op, int k) {
  if (k > 0) return 1;
  const tdist_backend_args_t *a = op->args;
  const uint8_t *in = op->tmp ? op->tmp : a->sendbuf;
  size_t off = 0;
  for (int j = 0; j < op->size; j++) {
    size_t c = a->rcounts[j];
    if (j != op->rank) {
      vsend(op, j, elem(in, off, op->es), c);
      vrecv(op, j, a->recvbuf, op->count, 1);
    }
    off += c;
  }
  return 0;
}

static void rsv_finish(cpu_op_t *op) {
  if (op->redop == TDIST_AVG) tdist__cpu_divide(op->buf, op->count, op->dtype, op->size);
}

static int no_round(cpu_op_t *op, int k) {
  (void)op;
  (void)k;
  return 1;
}

static void copy_in(void *dst, const void *src, size_t bytes) {
  if (bytes && dst != src) tdist__cpu_copy(dst, src, bytes);
}

int tdist__cpu_algo_setup_v(cpu_op_t *op) {
  const tdist_backend_args_t *a = op->args;
  int n = op->size, r = op->rank;
  op->buf = a->recvbuf;
  op->tmp = NULL;
  op->round_fn = n > 1 ? NULL : no_round;
  op->finish_fn = NULL;
  TDIST_CHECK(tdist__cpu_op_reserve(op, n + 1));
  size_t es = op->es, own = 0; /* this rank's block: displacement in its buffer */
  switch (op->type) {
  case TDIST_OP_ALL_TO_ALL_V:
    for (int j = 0; j < r; j++)
      own += a->rcounts[j];
    own = displ(a->rdispls, r, own);
    {
      size_t so = 0;
      for (int j = 0; j < r; j++)
        so += a->scounts[j];
      copy_in(elem(a->recvbuf, own, es), elem(a->sendbuf, displ(a->sdispls, r, so), es),
              a->rcounts[r] * es);
    }
    if (n > 1) op->round_fn = a2av_round;
    break;
  case TDIST_OP_ALL_GATHER_V:
  case TDIST_OP_GATHER_V:
    if (op->type == TDIST_OP_ALL_GATHER_V || r == op->root) {
      for (int j = 0; j < r; j++)
        own += a->rcounts[j];
      copy_in(elem(a->recvbuf, displ(a->rdispls, r, own), es), a->sendbuf, op->count * es);
    }
    if (n > 1) op->round_fn = op->type == TDIST_OP_ALL_GATHER_V ? agv_round : gatherv_round;
    break;
  case TDIST_OP_SCATTER_V:
    if (r == op->root) {
      for (int j = 0; j < r; j++)
        own += a->scounts[j];
      copy_in(a->recvbuf, elem(a->sendbuf, displ(a->sdispls, r, own), es), op->count * es);
    }
    if (n > 1) op->round_fn = scatterv_round;
    break;
  case TDIST_OP_REDUCE_SCATTER_V: {
    size_t total = 0;
    for (int j = 0; j < n; j++) {
      if (j < r) own += a->rcounts[j];
      total += a->rcounts[j];
    }
    const uint8_t *in = a->sendbuf;
    if (op->redop == TDIST_PREMUL_SUM && total) {
      op->tmp = tdist__cpu_buf_get(op->cg->ctx, total * es);
      if (!op->tmp) return TDIST_ERR_NO_MEMORY;
      op->tmp_cap = total * es;
      tdist__cpu_copy(op->tmp, a->sendbuf, total * es);
      tdist__cpu_scale(op->tmp, total, op->dtype, a->scalar);
      in = op->tmp;
    }
    copy_in(op->buf, elem(in, own, es), op->count * es);
    op->finish_fn = rsv_finish;
    if (n > 1) op->round_fn = rsv_round;
    break;
  }
  default:
    return tdist__error(TDIST_ERR_NOT_SUPPORTED, "cpu: op %s is not supported",
                        tdist_op_name(op->type));
  }
  return 0;
}

/* ---- agreement ------------------------------------------------------------------ */

/* What rank `src` must send this rank in op: 1 and *count, or 0 when src
 * sends this rank nothing in op. Runs for every header of a v-op, so it
 * only reads the arrays (the names for a message are count_names'). */
static int expected(const cpu_op_t *op, int src, size_t *count) {
  const tdist_backend_args_t *a = op->args;
  switch (op->type) {
  case TDIST_OP_ALL_TO_ALL_V:
  case TDIST_OP_ALL_GATHER_V: *count = a->rcounts[src]; return 1;
  case TDIST_OP_GATHER_V:
    if (op->rank != op->root) return 0;
    *count = a->rcounts[src];
    return 1;
  case TDIST_OP_SCATTER_V:
    if (op->rank == op->root || src != op->root) return 0;
    *count = op->count;
    return 1;
  case TDIST_OP_REDUCE_SCATTER_V: *count = op->count; return 1;
  default: return 0;
  }
}

/* The names of both sides' numbers in op (for a mismatch's message). */
static void count_names(const cpu_op_t *op, int src, char *mine, size_t ml, char *theirs,
                        size_t tl) {
  switch (op->type) {
  case TDIST_OP_ALL_TO_ALL_V:
    snprintf(theirs, tl, "send_counts[%d]", op->rank);
    snprintf(mine, ml, "recv_counts[%d]", src);
    break;
  case TDIST_OP_ALL_GATHER_V:
  case TDIST_OP_GATHER_V:
    snprintf(theirs, tl, "send_count");
    snprintf(mine, ml, "recv_counts[%d]", src);
    break;
  case TDIST_OP_SCATTER_V:
    snprintf(theirs, tl, "send_counts[%d]", op->rank);
    snprintf(mine, ml, "recv_count");
    break;
  default:
    snprintf(theirs, tl, "recv_counts[%d]", op->rank);
    snprintf(mine, ml, "recv_counts[%d]", op->rank);
    break;
  }
}

int tdist__cpu_check_v(cpu_group_t *cg, cpu_op_t *op, const cpu_hdr_t *h, int src) {
  int rooted = tdist_backend_op_is_rooted(op->type),
      reducing = tdist_backend_op_is_reducing(op->type);
  char text[400];
  if (h->optype != op->type || h->dtype != op->dtype || (rooted && h->root != op->root) ||
      (reducing && h->redop != op->redop)) {
    char ea[48] = "", eb[48] = "";
    if (rooted) {
      snprintf(ea, sizeof(ea), " root %d", (int)h->root);
      snprintf(eb, sizeof(eb), " root %d", op->root);
    } else if (reducing) {
      snprintf(ea, sizeof(ea), " %s", tdist_redop_name((tdist_redop_t)h->redop));
      snprintf(eb, sizeof(eb), " %s", tdist_redop_name(op->redop));
    }
    snprintf(text, sizeof(text),
             "mismatch at collective #%" PRIu64 ": rank %d (world rank %d) sent %s %s%s but rank "
             "%d (world rank %d) posted %s %s%s",
             h->seq, src, tdist__cpu_wrank_of(cg, src), tdist_op_name((tdist_optype_t)h->optype),
             tdist_dtype_name((tdist_dtype_t)h->dtype), ea, cg->rank,
             tdist__cpu_wrank_of(cg, cg->rank), tdist_op_name(op->type),
             tdist_dtype_name(op->dtype), eb);
    tdist__cpu_mismatch(cg, h->seq, "%s", text);
    return 1;
  }
  /* Counts: data messages of a running op only (a probe carries the
   * sender's own count; a completed op's arrays may be gone). */
  if (h->kind == CPU_MSG_PROBE || h->kind == CPU_MSG_SIG || !op->args) return 0;
  size_t want = 0;
  char mine[40], theirs[40];
  if (!expected(op, src, &want)) {
    snprintf(text, sizeof(text),
             "mismatch at collective #%" PRIu64 ": rank %d (world rank %d) sent %" PRIu64
             " %s to rank %d (world rank %d) in %s, which expects nothing from it",
             h->seq, src, tdist__cpu_wrank_of(cg, src), h->count, tdist_dtype_name(op->dtype),
             cg->rank, tdist__cpu_wrank_of(cg, cg->rank), tdist_op_name(op->type));
    tdist__cpu_mismatch(cg, h->seq, "%s", text);
    return 1;
  }
  if (h->count == want) return 0;
  count_names(op, src, mine, sizeof(mine), theirs, sizeof(theirs));
  snprintf(text, sizeof(text),
           "mismatch at collective #%" PRIu64 ": rank %d (world rank %d) sent %" PRIu64
           " %s to rank %d (world rank %d) in %s (its %s) but rank %d expects %zu from rank %d "
           "(its %s)",
           h->seq, src, tdist__cpu_wrank_of(cg, src), h->count, tdist_dtype_name(op->dtype),
           cg->rank, tdist__cpu_wrank_of(cg, cg->rank), tdist_op_name(op->type), theirs, cg->rank,
           want, src, mine);
  tdist__cpu_mismatch(cg, h->seq, "%s", text);
  return 1;
}
