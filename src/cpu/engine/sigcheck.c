/*
 * sigcheck.c - agreement before completion: a collective completes on a
 * rank only once that rank knows every member ran the same op (op, dtype,
 * count, root, reduction), so ranks that disagree never go on with
 * different data (docs/cpu-backend.md "Mismatch").
 *
 * Why: every header is compared with the local op when it arrives
 * (engine.c: tdist__cpu_check_coll), but a rank that receives nothing from
 * a disagreeing member used to complete anyway (a broadcast root, a
 * non-root of a tree, n = 3 broadcast with two views of the root), and a
 * mismatch found in the transport left the engine free to run the group's
 * next op until the core's abort arrived.
 *
 * How:
 *   - Ops whose every rank depends on every member's data (all_reduce,
 *     all_gather, all_to_all, reduce_scatter with count > 0, barrier and
 *     the all-to-all v-ops) need nothing new: a rank sends round k only
 *     after round k-1's headers all arrived and matched its own op, so a
 *     header received from p vouches (by induction over the rounds, and
 *     because equal signatures mean the same algorithm) for everyone p
 *     heard from before it; a rank that completed has, through such
 *     chains, heard from every member, and all of them agreed with it.
 *   - The other ops (broadcast, reduce, gather, scatter and their v forms,
 *     and a reduce_scatter of count 0, which moves no message) set
 *     need_sigs: at round 0 the rank sends a header-only SIG to every
 *     member that round sends no data to, and it completes only once it
 *     has a matching header (data, SIG or PROBE) from every member. A SIG
 *     that arrives before its op is posted waits on the unexpected list
 *     (or the orphan list) and is taken at round 0.
 *   - Lag one: a rank that received nothing in the op (a broadcast or
 *     scatter root, a reduce leaf, a gather non-root), or a broadcast
 *     receiver, whose data came down a path of ranks that agreed with it
 *     (may_lag), may complete it at once, when it is the group's oldest
 *     collective and no op lags; the op then lags (engine.c keeps it,
 *     without the core's op or buffers; cpu_group_t.lagging is the oldest)
 *     until every member was heard, and no later op of the group that
 *     receives anything, nor any p2p op, completes before that
 *     (tdist__cpu_lag_blocks). Programs may rely on a root finishing before
 *     its receivers post (tests/cpu/test_cpu_deferred.c), so it cannot wait
 *     for them.
 *   - Up to CPU_LAG_MAX behind it: a later collective in which this rank
 *     receives nothing may complete behind a lagging one, lagging too, up
 *     to CPU_LAG_MAX lagging ops, so a broadcast root in a loop runs ahead
 *     of its receivers as MPI's does (lag one made each of its ops a round
 *     trip to the slowest receiver). It has no data to be wrong about, and
 *     the first op in which it receives waits for the oldest lagging op.
 *   - A reported mismatch in collective #s blocks the group's ops from #s
 *     on (and p2p ops posted after it): the engine advances none of them
 *     again (engine.c: advance, tdist__cpu_blocked), so no rank completes
 *     another op before the core aborts the group, while ops before #s,
 *     which everyone agreed on, still finish.
 * Together: whatever the disagreement, every rank that receives anything
 * in the op fails it (MISMATCH, or the abort that the detecting rank's ERR
 * and record cause), except a broadcast receiver whose data is the root's;
 * that one, and a rank that only sends, fails it or a later op: at the
 * latest the first one in which it receives, its first p2p op, or the one
 * after CPU_LAG_MAX completed collectives. None completes an op with data
 * from a disagreeing rank, nor an op in which it receives while an earlier
 * one it completed still lacks a member's signature. A header for an op
 * that completed here (or lags) is compared with the done ring and always
 * fails the group: a
 * correct run never sends a rank anything its op did not take.
 *
 * Threads: progress thread only. tdist__cpu_on_sig and tdist__cpu_sig_heard
 * are part of the transport (they record and report, deferred); round 0 runs
 * in the engine.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "cpu/base/base.h"
#include "cpu/transport/transport.h"
#include "cpu/engine/engine.h"

void tdist__cpu_mismatch(cpu_group_t *cg, uint64_t seq, const char *fmt, ...) {
  char text[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof(text), fmt, ap);
  va_end(ap);
  if (seq != UINT64_MAX && (!cg->broken_at || seq + 1 < cg->broken_at)) cg->broken_at = seq + 1;
  tdist__cpu_fail(cg, 0, TDIST_ERR_MISMATCH, "%s", text);
}

/* Ops where some rank may complete without a message chain from every
 * member (see above): the rooted ones (tdist_backend_op_props), and a reduce_scatter
 * of nothing (the ring sends nothing). */
static int needs_sigs(const cpu_op_t *op) {
  return tdist_backend_op_is_rooted(op->type) ||
         (op->type == TDIST_OP_REDUCE_SCATTER && op->count == 0);
}

void tdist__cpu_sig_posted(cpu_op_t *op) {
  op->nheard = 0;
  op->rounds_done = 0;
  op->received = 0;
  op->need_sigs = 0;
  if (op->size < 2 || tdist__cpu_op_reserve(op, op->size + 1) != 0) return;
  memset(op->heard, 0, ((size_t)op->size + 63) / 64 * sizeof(uint64_t));
  op->need_sigs = needs_sigs(op);
}

void tdist__cpu_sig_heard(cpu_op_t *op, int src) {
  if (!op->need_sigs || src < 0 || src >= op->size || src == op->rank) return;
  uint64_t bit = 1ull << (src % 64);
  if (op->heard[src / 64] & bit) return;
  op->heard[src / 64] |= bit;
  if (++op->nheard >= op->size - 1 && op->rounds_done) tdist__cpu_ready(op);
}

static int heard(const cpu_op_t *op, int r) { return (int)((op->heard[r / 64] >> (r % 64)) & 1); }

cpu_hdr_t tdist__cpu_sig_hdr(const cpu_group_t *cg, const cpu_op_t *op, int kind) {
  return (cpu_hdr_t){.magic = CPU_MAGIC,
                     .kind = (uint8_t)kind,
                     .optype = (uint8_t)op->type,
                     .dtype = (uint8_t)op->dtype,
                     .redop = (uint8_t)op->redop,
                     .uid = cg->uid,
                     .seq = op->cseq,
                     .count = op->count,
                     .root = op->root};
}

static void send_sig(cpu_group_t *cg, const cpu_op_t *op, cpu_conn_t *c) {
  cpu_msg_t *m = tdist__cpu_msg_new();
  if (!m) {
    tdist__cpu_fail(cg, 0, TDIST_ERR_NO_MEMORY, "cpu: out of memory");
    return;
  }
  m->hdr = tdist__cpu_sig_hdr(cg, op, CPU_MSG_SIG);
  tdist__cpu_send(c, m);
}

/* Engine (advance, round 0 listed, nothing sent yet). 1: a mismatch or a
 * lost member was reported, and the op must not go on. */
int tdist__cpu_sig_round0(cpu_op_t *op) {
  cpu_group_t *cg = op->cg;
  /* SIGs that came before the post; a SIG for an op that needs none is a
   * disagreement, found by the comparison. */
  tdist__list_t *n, *next;
  tdist__list_foreach_safe(n, next, &cg->ux) {
    cpu_ux_t *u = tdist__list_entry(n, cpu_ux_t, link);
    if (u->hdr.kind != CPU_MSG_SIG || u->hdr.seq != op->cseq) continue;
    int src = tdist__cpu_grank_of(cg, u->src);
    cpu_hdr_t h = u->hdr;
    tdist__cpu_ux_free(cg->ctx, u);
    if (tdist__cpu_check_coll(cg, op, &h, src)) return 1;
  }
  if (!op->need_sigs) return 0;
  for (int r = 0; r < op->size; r++) {
    cpu_conn_t *c = cg->conns[r];
    if (r == op->rank || !c) continue;
    if (c->dead) {
      /* A member sends its header at its own round 0, before anything
       * that could close its connection: one gone unheard never ran this
       * op, and its signature will not come. */
      if (!heard(op, r)) {
        tdist__cpu_fail(cg, 0, TDIST_ERR_REMOTE_FAILED, "rank %d (world rank %d, %s) is gone", r,
                        c->peer, c->addr);
        return 1;
      }
      continue;
    }
    int data = 0;
    for (int i = 0; i < op->nsend && !data; i++)
      data = op->sends[i].peer == r;
    if (!data) send_sig(cg, op, c);
  }
  return 0;
}

void tdist__cpu_on_sig(cpu_conn_t *c) {
  cpu_ctx_t *ctx = c->ctx;
  const cpu_hdr_t *h = &c->rh;
  if (h->len != 0) {
    tdist__cpu_on_conn_lost(c, "sent a malformed message (signature with a payload)");
    return;
  }
  cpu_group_t *cg = tdist__cpu_group_find(ctx, h->uid);
  cpu_ux_t *u;
  if (!cg) {
    /* The group is not created here yet: claimed at registration. */
    if (!(u = tdist__cpu_ux_new(ctx, h, c->peer, 1))) return;
    u->complete = 1;
    tdist__list_push_back(&ctx->orphans, &u->link);
    return;
  }
  int src = tdist__cpu_grank_of(cg, c->peer);
  if (cg->aborted || src < 0) return;
  cpu_op_t *op = tdist__cpu_op_find(cg, h->seq);
  if (op && op->sc.on) {
    cg->ctx->hooks->sc_engine_msg(cg, op, h, src); /* segment/sc_op.c */
    return;
  }
  if (op) {
    (void)tdist__cpu_check_coll(cg, op, h, src); /* marks src heard when it agrees */
    return;
  }
  /* Completed here (compared with the done ring: always a disagreement),
   * else not posted yet: kept for its round 0. */
  if (tdist__cpu_check_done(cg, h, src)) return;
  if (!(u = tdist__cpu_ux_new(ctx, h, c->peer, 1))) {
    tdist__cpu_fail(cg, 0, TDIST_ERR_NO_MEMORY, "cpu: out of memory for a message");
    return;
  }
  u->complete = 1;
  tdist__list_push_back(&cg->ux, &u->link);
}

/* Is op the oldest collective still running in its group (lagging ones
 * completed already)? */
static int oldest(const cpu_op_t *op) {
  tdist__list_t *n;
  tdist__list_foreach(n, &op->cg->ops) {
    const cpu_op_t *o = tdist__list_entry(n, cpu_op_t, link);
    if (!o->p2p && !o->lagging) return o == op;
  }
  return 0;
}

/* May op complete before every member was heard? A rank that received
 * nothing in it (a broadcast or scatter root, a reduce leaf, a gather
 * non-root) may; so may a broadcast receiver: what it received is the
 * root's data, since every rank on its path from the root sent only after
 * its own receive matched (the same induction as for all_reduce), so each
 * agreed with it. The other receivers (a reduce or gather root, an inner
 * reduce rank, a scatter receiver) still wait for every signature: lagging
 * buys latency only where a rank runs ahead, which for them is rarely the
 * case (docs/cpu-backend.md "Mismatch"). */
static int may_lag(const cpu_op_t *op) { return !op->received || op->type == TDIST_OP_BROADCAST; }

/* It completes once it has heard every member it must, or at once,
 * lagging, when it may (may_lag), is the oldest collective and none lags:
 * lag one. */
int tdist__cpu_sig_finish(const cpu_op_t *op) {
  const cpu_group_t *cg = op->cg;
  if (!tdist__cpu_lag_blocks(op)) {
    if (tdist__cpu_sigs_complete(op)) return 1;
    return may_lag(op) && !cg->lagging && oldest(op) ? 2 : 0;
  }
  /* Behind a lagging op: one in which this rank received nothing may
   * complete too (lagging while it lacks signatures), up to CPU_LAG_MAX
   * lagging ops: a broadcast root runs ahead as MPI's does, and it has no
   * data to be wrong about; the first op in which it receives waits. */
  if (op->received || cg->nlagging >= CPU_LAG_MAX || !oldest(op)) return 0;
  return tdist__cpu_sigs_complete(op) ? 1 : 2;
}

void tdist__cpu_lag_clear(cpu_op_t *op) {
  cpu_group_t *cg = op->cg;
  tdist__cpu_op_put(op);
  tdist__list_t *n;
  tdist__list_foreach(n, &cg->ops) {
    cpu_op_t *o = tdist__list_entry(n, cpu_op_t, link);
    if (o->p2p ? o->pending == 0 : o->rounds_done) tdist__cpu_ready(o);
  }
}

/* ---- mismatch checks (moved from engine.c: the same rule for data, SIG and
 * PROBE headers and for the done ring) ------------------------------------- */

/* Compare a peer's header with a fixed-size op; 1 (and the group's
 * failure reported) if they disagree. The text names both sides. */
static int check_fixed(cpu_group_t *cg, cpu_op_t *op, const cpu_hdr_t *h, int src) {
  int rooted = tdist_backend_op_is_rooted(op->type),
      reducing = tdist_backend_op_is_reducing(op->type);
  if (h->optype == op->type && h->dtype == op->dtype && h->count == op->count &&
      (!rooted || h->root == op->root) && (!reducing || h->redop == op->redop))
    return 0;
  char text[400], extra_a[48] = "", extra_b[48] = "";
  if (rooted) {
    snprintf(extra_a, sizeof(extra_a), " root %d", (int)h->root);
    snprintf(extra_b, sizeof(extra_b), " root %d", op->root);
  }
  if (reducing) {
    size_t la = strlen(extra_a), lb = strlen(extra_b);
    snprintf(extra_a + la, sizeof(extra_a) - la, " %s", tdist_redop_name(h->redop));
    snprintf(extra_b + lb, sizeof(extra_b) - lb, " %s", tdist_redop_name(op->redop));
  }
  snprintf(text, sizeof(text),
           "mismatch at collective #%" PRIu64 ": rank %d (world rank %d) sent %s count %" PRIu64
           " %s%s but rank %d (world rank %d) posted %s count %zu %s%s",
           h->seq, src, tdist__cpu_wrank_of(cg, src), tdist_op_name((tdist_optype_t)h->optype),
           h->count, tdist_dtype_name((tdist_dtype_t)h->dtype), extra_a, cg->rank,
           tdist__cpu_wrank_of(cg, cg->rank), tdist_op_name(op->type), op->count,
           tdist_dtype_name(op->dtype), extra_b);
  tdist__cpu_mismatch(cg, h->seq, "%s", text);
  return 1;
}

/* Compare a peer's header (data, SIG or PROBE) with the local op: 1 (and
 * the group's failure reported) if they disagree, else src is heard for a
 * live op (sigcheck.c). */
int tdist__cpu_check_coll(cpu_group_t *cg, cpu_op_t *op, const cpu_hdr_t *h, int src) {
  /* v-ops: per-message counts (algos_v.c) */
  int bad = tdist_backend_op_is_v(op->type) ? tdist__cpu_check_v(cg, op, h, src)
                                            : check_fixed(cg, op, h, src);
  if (!bad && op->cg) tdist__cpu_sig_heard(op, src); /* not a done-ring copy */
  return bad;
}

int tdist__cpu_check_p2p(cpu_group_t *cg, cpu_xfer_t *x, const cpu_hdr_t *h, int src) {
  if (h->count == x->count && h->dtype == x->dtype) return 0;
  char text[400];
  if (x->peer < 0 || x->tag < 0) {
    /* A wildcard receive takes up to its count (tdist/ops.h). */
    if (h->count <= x->count && h->dtype == x->dtype) return 0;
    snprintf(text, sizeof(text),
             "mismatch: rank %d (world rank %d) sent count %" PRIu64
             " %s with tag %d but the matching wildcard receive of rank %d (world rank %d) takes "
             "at most count %zu %s",
             src, tdist__cpu_wrank_of(cg, src), h->count, tdist_dtype_name((tdist_dtype_t)h->dtype),
             (int)h->root, cg->rank, tdist__cpu_wrank_of(cg, cg->rank), x->count,
             tdist_dtype_name(x->dtype));
    tdist__cpu_mismatch(cg, UINT64_MAX, "%s", text);
    return 1;
  }
  snprintf(text, sizeof(text),
           "mismatch: rank %d (world rank %d) sent count %" PRIu64
           " %s with tag %d but rank %d (world rank %d) posted a receive of count %zu %s",
           src, tdist__cpu_wrank_of(cg, src), h->count, tdist_dtype_name((tdist_dtype_t)h->dtype),
           (int)h->root, cg->rank, tdist__cpu_wrank_of(cg, cg->rank), x->count,
           tdist_dtype_name(x->dtype));
  tdist__cpu_mismatch(cg, UINT64_MAX, "%s", text);
  return 1;
}

/* A header for a collective this rank completed (or that lags): compared
 * with the done ring; always a failure of the group. */
int tdist__cpu_check_done(cpu_group_t *cg, const cpu_hdr_t *h, int src) {
  if (h->seq >= cg->next_cseq) return 0; /* not posted here yet */
  const struct cpu_done *d = tdist__cpu_done_of(cg, h->seq);
  if (d) {
    cpu_op_t ran = {.type = (tdist_optype_t)d->type,
                    .dtype = (tdist_dtype_t)d->dtype,
                    .redop = (tdist_redop_t)d->redop,
                    .count = d->count,
                    .root = d->root};
    if (tdist__cpu_check_coll(cg, &ran, h, src)) return 1;
  }
  tdist__cpu_mismatch(cg, h->seq,
                      "mismatch at collective #%" PRIu64 ": rank %d (world rank %d) sent %s count "
                      "%" PRIu64 " root %d for it, which had completed on rank %d (world rank %d) "
                      "without that message",
                      h->seq, src, tdist__cpu_wrank_of(cg, src),
                      tdist_op_name((tdist_optype_t)h->optype), h->count, (int)h->root, cg->rank,
                      tdist__cpu_wrank_of(cg, cg->rank));
  return 1;
}
