/*
 * sc_op.c - shared-memory collectives: posting an op, its steps, the
 * signature checks and completion (sc.h has the protocol; sc_data.c what
 * each op's streams are).
 *
 * An op is posted in order behind the others of its group (ch->ops) and
 * signed at once (its sig entry). Only the head op moves: when it gets
 * there it takes its first step from the group's clock, and then, in each
 * pass, this member writes the steps of its stream that have room, checks
 * the signatures its role needs, and consumes the steps whose pieces are
 * all in. It completes when its stream is written and every step consumed
 * (a giver: once written; its signatures are checked later, see sc.h). So
 * per member and per step the order is always: write, then consume, then
 * done = step + 1; and a step is written only once every member's done
 * shows the slot free.
 *
 * A signature entry is rewritten (by op cseq + SC_H) only once every
 * member's vseq is past cseq: no member reads it any more (sign_ready). So
 * a program may post any number of ops at once (async broadcasts of a
 * root far ahead of a slow reader): those beyond the window are signed
 * when the slowest member moves on. A signature is still read like a
 * seqlock (seq, the fields, seq again), which makes a violation of that a
 * wait, not a wrong answer.
 *
 * Threads: engine lock (base/lock.c; the progress thread or a driving caller: drive.c).
 * Completion and failures go through the engine's deferred services
 * (tdist__cpu_op_complete, tdist__cpu_mismatch).
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "util/error.h"
#include "util/spin.h"
#include "cpu/base/base.h"
#include "cpu/transport/transport.h"
#include "cpu/engine/engine.h"
#include "cpu/segment/sc.h"

_Atomic uint64_t tdist__cpu_sc_ops;

static uint64_t min64(uint64_t a, uint64_t b) { return a < b ? a : b; }
static uint64_t max64(uint64_t a, uint64_t b) { return a > b ? a : b; }

/* ---- signatures ---------------------------------------------------------------- */

/* May this member write its signature entry of collective cseq (entry
 * cseq - SC_H is read by no member any more: every member's vseq is past
 * it)? The lowest vseq seen is cached. */
static int sign_ready(cpu_sc_t *ch, uint64_t cseq) {
  if (cseq < SC_H || cseq - SC_H < ch->vmin) return 1;
  uint64_t mn = UINT64_MAX;
  for (int m = 0; m < ch->n; m++)
    if (m != ch->me)
      mn = min64(mn, atomic_load_explicit(&ch->rg[m].ctl->vseq, memory_order_acquire));
  ch->vmin = mn;
  return cseq - SC_H < mn;
}

static void sign(cpu_sc_t *ch, const cpu_op_t *op) {
  sc_sig_t *g = &ch->rg[ch->me].sig[op->cseq % SC_H];
  atomic_store_explicit(&g->seq, 0, memory_order_relaxed);
  atomic_thread_fence(memory_order_release);
  atomic_store_explicit(&g->ovf, 0, memory_order_relaxed);
  g->count = op->count;
  g->total = op->sc.total;
  g->root = op->root;
  g->optype = (uint8_t)op->type;
  g->dtype = (uint8_t)op->dtype;
  g->redop = (uint8_t)op->redop;
  atomic_store_explicit(&g->seq, op->cseq + 1, memory_order_release);
  ch->wrote = 1;
  /* The next op's entry was last written SC_H ops ago (a 512 KiB ring per
   * member, past what L2 keeps with the step lines): asked for now, as
   * the next step line is (step_out), its store does not hold up the
   * engine lock's release. */
  sc_prefetch_w(&ch->rg[ch->me].sig[(op->cseq + 1) % SC_H]);
}

/* Sign the ops posted while their entries were still read, in order, as
 * far as the members' vseq allow. */
static void sign_pending(cpu_sc_t *ch) {
  while (ch->unsigned_op && sign_ready(ch, ch->unsigned_op->cseq)) {
    cpu_op_t *op = ch->unsigned_op;
    sign(ch, op);
    tdist__list_t *nx = op->sc.link.next;
    ch->unsigned_op = nx == &ch->ops ? NULL : tdist__list_entry(nx, cpu_op_t, sc.link);
  }
}

/* Publish the lowest collective whose signatures this member may still
 * read: its oldest unchecked op, else its oldest op in the channel, else
 * the next one it posts. Only every SC_VSEQ_STEP ops, with a bell: a
 * member waiting to sign needs it only SC_H ops on, and a bell a pass
 * (a blocked root verifying its readers' signatures one by one) woke the
 * readers' progress threads for nothing. What this costs: a member's
 * published vseq is at most SC_VSEQ_STEP - 1 behind, and every member's
 * head op is at most SC_LAG + 1 ahead of the slowest member's, far inside
 * SC_H: a head op is always signable. */
#define SC_VSEQ_STEP 256u
/* Unchecked ops a giver leaves for later (verify_mode): it looks at the
 * others' vseq from SC_VERIFY_BATCH on, reads their signatures from
 * SC_VERIFY_DEEP on. */
#define SC_VERIFY_BATCH 16
#define SC_VERIFY_DEEP (2 * SC_VSEQ_STEP)
_Static_assert(SC_VERIFY_DEEP < SC_LAG, "a giver reads signatures before it stops");
static void publish_vseq(cpu_group_t *cg, cpu_sc_t *ch) {
  uint64_t v = cg->next_cseq;
  tdist__list_t *n = tdist__list_first(&ch->ops);
  if (n) v = min64(v, tdist__list_entry(n, cpu_op_t, sc.link)->cseq);
  if (ch->nunverified) v = min64(v, ch->unverified[ch->uv_head].cseq);
  if (v < ch->vseq + SC_VSEQ_STEP) return;
  ch->vseq = v;
  atomic_store_explicit(&ch->rg[ch->me].ctl->vseq, v, memory_order_release);
  ch->wrote = 1; /* a member waiting to sign may sleep: ring it */
}

/* Member m's signature of collective cseq: 1 and *out, or 0 (not yet). */
static int sig_read(const cpu_sc_t *ch, int m, uint64_t cseq, sc_sig_t *out) {
  const sc_sig_t *g = &ch->rg[m].sig[cseq % SC_H];
  if (atomic_load_explicit(&g->seq, memory_order_acquire) != cseq + 1) return 0;
  out->count = g->count;
  out->total = g->total;
  out->root = g->root;
  out->optype = g->optype;
  out->dtype = g->dtype;
  out->redop = g->redop;
  atomic_thread_fence(memory_order_acquire);
  return atomic_load_explicit(&g->seq, memory_order_relaxed) == cseq + 1;
}

/* Does member m's signature g agree with (type, dtype, count, root, redop)?
 * 0, or -1 with the group's MISMATCH reported, naming both. v-ops compare
 * no count here (their counts are checked where the data flows). */
static int agree(cpu_group_t *cg, uint64_t cseq, int m, const sc_sig_t *g, tdist_optype_t type,
                 tdist_dtype_t dtype, size_t count, int root, tdist_redop_t redop) {
  int rooted = tdist_backend_op_is_rooted(type), reducing = tdist_backend_op_is_reducing(type);
  int v = tdist_backend_op_is_v(type);
  if (g->optype == type && g->dtype == dtype && (v || g->count == count) &&
      (!rooted || g->root == root) && (!reducing || g->redop == redop))
    return 0;
  char ea[48] = "", eb[48] = "";
  if (rooted || (tdist_backend_op_is_rooted((tdist_optype_t)g->optype))) {
    snprintf(ea, sizeof(ea), " root %d", (int)g->root);
    snprintf(eb, sizeof(eb), " root %d", root);
  }
  if (reducing) {
    size_t la = strlen(ea), lb = strlen(eb);
    snprintf(ea + la, sizeof(ea) - la, " %s", tdist_redop_name((tdist_redop_t)g->redop));
    snprintf(eb + lb, sizeof(eb) - lb, " %s", tdist_redop_name(redop));
  }
  tdist__cpu_mismatch(cg, cseq,
                      "mismatch at collective #%" PRIu64 ": rank %d (world rank %d) posted %s "
                      "count %" PRIu64 " %s%s but rank %d (world rank %d) posted %s count %zu %s%s",
                      cseq, m, tdist__cpu_wrank_of(cg, m), tdist_op_name((tdist_optype_t)g->optype),
                      g->count, tdist_dtype_name((tdist_dtype_t)g->dtype), ea, cg->rank,
                      tdist__cpu_wrank_of(cg, cg->rank), tdist_op_name(type), count,
                      tdist_dtype_name(dtype), eb);
  return -1;
}

/* The signature again in the line of an op's first step, beside data that
 * leaves room (sc.h, sc_step_t.sig): a reader of a small op then needs one
 * line of each member. The ring entry stays the record (late checks, a
 * member with an empty stream, tdist__cpu_sc_needs). Written by
 * write_step before it publishes the step. */
static void step_sign(sc_step_t *h, const cpu_op_t *op, uint64_t j, size_t len) {
  h->sig = 0;
  if (j != 0) return;
  if (len > SC_INLINE) {
    /* The data is in the slot and the line's bytes are free: the stream's
     * length goes first (a v-op's, or one longer than a step). A reader
     * that took the signature from the ring read one more line of this
     * member per op, which is what a 1 KiB op crosses most after its data
     * (check_sigs was an eighth of an all_to_all_v's time at n = 2). */
    uint64_t total = op->sc.total;
    memcpy(h->inl, &total, 8);
  } else if (len > SC_SIG_INLINE || tdist_backend_op_is_v(op->type)) {
    return;
  }
  uint64_t count = op->count;
  int32_t root = op->root;
  memcpy(h->inl + SC_SIG_INLINE, &count, 8);
  memcpy(h->inl + SC_SIG_INLINE + 8, &root, 4);
  h->sig = SC_STEP_SIG | (uint32_t)(uint8_t)op->type << 8 | (uint32_t)(uint8_t)op->dtype << 16 |
           (uint32_t)(uint8_t)op->redop << 24;
}

/* Member m's signature of op from the line of the op's first step
 * (step_sign): 1 and *out, or 0 (not there: the signature ring has it).
 * Only before this member consumed that step: until then no member can
 * rewrite the line (room), so what the release of `step` published stays. */
static int step_sig(const cpu_sc_t *ch, const cpu_op_t *op, int m, sc_sig_t *out) {
  uint64_t s0 = op->sc.s0;
  if (ch->done > s0) return 0;
  const sc_step_t *h = sc_line(ch, m, s0);
  if (atomic_load_explicit(&h->step, memory_order_acquire) != s0 + 1 || h->cseq != op->cseq ||
      !(h->sig & SC_STEP_SIG))
    return 0;
  int32_t root;
  memcpy(&out->count, h->inl + SC_SIG_INLINE, 8);
  memcpy(&root, h->inl + SC_SIG_INLINE + 8, 4);
  out->root = root;
  if (h->len > SC_INLINE)
    memcpy(&out->total, h->inl, 8);
  else
    out->total = h->len; /* one step: the stream is that long */
  out->optype = (uint8_t)(h->sig >> 8);
  out->dtype = (uint8_t)(h->sig >> 16);
  out->redop = (uint8_t)(h->sig >> 24);
  return 1;
}

/* The signatures op's role needs (ALL: every member's; ROOT: the root's):
 * 1 all in and agreeing, 0 not yet, -1 a mismatch (reported). v-ops take
 * the members' stream lengths from them. */
static int check_sigs(cpu_group_t *cg, cpu_sc_t *ch, cpu_op_t *op) {
  struct cpu_sc_opst *s = &op->sc;
  int missing = 0;
  for (int m = 0; m < op->size; m++) {
    if (m == op->rank || (s->seen >> m) & 1) continue;
    if (s->role == SC_ROLE_ROOT && m != op->root) continue;
    sc_sig_t g;
    if (!step_sig(ch, op, m, &g) && !sig_read(ch, m, op->cseq, &g)) {
      missing = 1;
      continue;
    }
    if (agree(cg, op->cseq, m, &g, op->type, op->dtype, op->count, op->root, op->redop)) return -1;
    ch->totals[m] = g.total;
    s->seen |= 1ull << m;
  }
  return !missing;
}

/* ---- the clock and the slots ------------------------------------------------------ */

/* May this member write step st of len bytes (its line st % L free, and
 * its slot st % D unless the data fits the line: every member's done is at
 * least st - L + 1, or st - D + 1)? The lowest done seen is cached. */
static int room(cpu_sc_t *ch, uint64_t st, size_t len) {
  uint64_t depth = len <= SC_INLINE ? ch->L : ch->D;
  if (st < depth) return 1;
  uint64_t need = st - depth + 1;
  if (ch->room_min >= need) return 1;
  uint64_t mn = ch->done;
  for (int m = 0; m < ch->n; m++)
    if (m != ch->me)
      mn = min64(mn, atomic_load_explicit(&ch->rg[m].ctl->done, memory_order_acquire));
  ch->room_min = mn;
  return mn >= need;
}

/* Bytes [*a, *b) of a step of len bytes that member m reduces: its share of
 * the step's elements. */
static void share(const cpu_op_t *op, size_t len, int m, size_t *a, size_t *b) {
  size_t cnt = len / op->es;
  *a = (size_t)((unsigned __int128)cnt * (unsigned)m / (unsigned)op->size) * op->es;
  *b = (size_t)((unsigned __int128)cnt * (unsigned)(m + 1) / (unsigned)op->size) * op->es;
}

/* Bytes of step j of this member's stream. */
static size_t step_len(const cpu_sc_t *ch, const cpu_op_t *op, uint64_t j) {
  return (size_t)min64(ch->F, op->sc.total - j * ch->F);
}

/* Step st's line h, written but for its number, goes out: its cseq, then
 * its step (the release its readers wait for). The next step's line is
 * asked for ahead: its readers last read it L steps before, and written
 * cold the store waited for it in the store buffer, and the engine lock's
 * release waited with it. */
static inline void step_out(cpu_sc_t *ch, cpu_ctx_t *ctx, sc_step_t *h, uint64_t st,
                            uint64_t cseq) {
  h->cseq = cseq;
  atomic_store_explicit(&h->step, st + 1, memory_order_release);
  sc_prefetch_w(sc_line(ch, ch->me, st + 1));
  ch->wrote = 1;
  ctx->moves++;
}

static void write_step(cpu_sc_t *ch, const cpu_op_t *op, uint64_t j, uint64_t st) {
  uint64_t off = j * ch->F;
  size_t len = step_len(ch, op, j);
  unsigned slot = sc_slot(ch, st);
  sc_step_t *h = sc_line(ch, ch->me, st);
  if (op->sc.lent) {
    /* Lent (sc_data.c): the line says where the step's bytes lie; an
     * all_gather's own block is copied from the input directly. */
    sc_lent_t l;
    tdist__cpu_sc_lent_at(op, off, &l);
    memcpy(h->inl, &l, sizeof(l));
    tdist__cpu_sc_own_step(ch, op, j, (const uint8_t *)op->args->sendbuf + off);
    h->sig = 0;
    h->len = SC_LEN_LENT | (uint32_t)len;
    goto written;
  }
  uint8_t *dst = len <= SC_INLINE ? h->inl : sc_slot_data(ch, ch->me, slot, len);
  if (op->sc.direct) {
    /* A two-phase all_reduce: this member's share of the step stays where
     * it is (consume_two reads it there): only the others' shares go in. */
    size_t a, b;
    share(op, len, ch->me, &a, &b);
    tdist__cpu_sc_produce(op, off, dst, a);
    tdist__cpu_sc_produce(op, off + b, dst + b, len - b);
  } else {
    tdist__cpu_sc_produce(op, off, dst, len);
    tdist__cpu_sc_own_step(ch, op, j, dst); /* an all_gather's own block, from the hot copy */
  }
  step_sign(h, op, j, len);
  h->len = (uint32_t)len;
written:
  step_out(ch, op->cg->ctx, h, st, op->cseq);
}

/* ---- a large all_reduce in two phases ---------------------------------------------- */

/* Step j of a two-phase all_reduce. Flat, every member would reduce the
 * whole step from every member's piece (n times the work in all); here
 * member m reduces its share of the step into its output and into its own
 * slot (no one else reads that share of it), publishes red, and then
 * copies the other shares from their owners' slots once their red says
 * they are in. The shares' results are the same bits on every member: one
 * member computes each. 1 consumed, 0 not yet (it may have reduced). */
static int consume_two(cpu_sc_t *ch, cpu_op_t *op, uint64_t j) {
  struct cpu_sc_opst *s = &op->sc;
  uint64_t st = s->s0 + j;
  unsigned slot = sc_slot(ch, st);
  uint8_t *out = (uint8_t *)op->args->recvbuf + j * ch->F;
  const uint8_t *pcs[SC_MAX_RANKS];
  size_t len = 0, a, b;
  uint64_t lent = 0;
  for (int m = 0; m < op->size; m++) {
    sc_step_t *h = sc_line(ch, m, st);
    if (atomic_load_explicit(&h->step, memory_order_acquire) != st + 1) return 0;
    len = h->len & ~SC_LEN_LENT;
    if (h->len & SC_LEN_LENT) lent |= 1ull << m; /* its line says where (sc_data.c, lend) */
    pcs[m] = len <= SC_INLINE || (lent >> m & 1) ? h->inl : sc_slot_data(ch, m, slot, len);
  }
  if (!s->phase) {
    share(op, len, op->rank, &a, &b);
    if (b > a) {
      /* The pieces of this member's share, each member's at pc[m]: in its
       * slot, or read from its input into ltmp where it lent it. */
      const uint8_t *pc[SC_MAX_RANKS];
      /* Each piece at a multiple of 64 bytes: elements stay aligned. */
      size_t k = 0, most = (ch->F / (size_t)op->size + op->es + 63) / 64 * 64;
      for (int m = 0; m < op->size; m++) {
        if (m == op->rank || !(lent >> m & 1)) {
          pc[m] = pcs[m] + a;
          continue;
        }
        if (!s->ltmp &&
            !(s->ltmp = tdist__cpu_buf_get(op->cg->ctx, most * (size_t)(op->size - 1)))) {
          tdist__cpu_fail(op->cg, 0, TDIST_ERR_NO_MEMORY,
                          "cpu: no memory for all_reduce #%llu's pieces read in place",
                          (unsigned long long)op->cseq);
          return -1;
        }
        sc_lent_t l;
        memcpy(&l, pcs[m], sizeof(l));
        uint8_t *to = s->ltmp + most * k++;
        if (tdist__cpu_sc_lent_read(ch, op, m, &l, l.addr + a, to, b - a) != 0) return -1;
        pc[m] = to;
      }
      if (s->direct) {
        /* This member's share of its own input is read where it is (a slot
         * holds only the others' shares: write_step). */
        const uint8_t *in = (s->tmp ? s->tmp : (const uint8_t *)op->args->sendbuf) + j * ch->F;
        tdist__cpu_sc_reduce_share(op, out + a, in + a, pc, 0, b - a);
      } else {
        tdist__cpu_sc_reduce(op, out + a, pc, 0, b - a);
      }
      /* Lent: the others read this share from the output (line's out). */
      if (!s->lent) tdist__cpu_copy((uint8_t *)pcs[op->rank] + a, out + a, b - a);
    }
    atomic_store_explicit(&ch->rg[ch->me].ctl->red, st + 1, memory_order_release);
    s->phase = 1;
    ch->wrote = 1;
    op->cg->ctx->moves++;
  }
  for (int m = 0; m < op->size; m++)
    if (m != op->rank && atomic_load_explicit(&ch->rg[m].ctl->red, memory_order_acquire) < st + 1)
      return 0;
  for (int m = 0; m < op->size; m++) {
    if (m == op->rank) continue;
    share(op, len, m, &a, &b);
    if (b <= a) continue;
    if (lent >> m & 1) {
      sc_lent_t l;
      memcpy(&l, pcs[m], sizeof(l));
      if (tdist__cpu_sc_lent_read(ch, op, m, &l, l.out + a, out + a, b - a) != 0) return -1;
    } else {
      sc_out_copy(op, out + a, pcs[m] + a, b - a);
    }
  }
  s->phase = 0;
  return 1;
}

/* Does this member read member m's stream at step j? */
static int reads(const cpu_sc_t *ch, const cpu_op_t *op, int m, uint64_t j) {
  if (j == 0 && tdist__cpu_sc_has_prefix(op) && !op->sc.prefixed)
    return op->type == TDIST_OP_REDUCE_SCATTER_V || m != op->rank;
  if (op->type == TDIST_OP_ALL_TO_ALL_V) /* a piece of m's block in every step */
    return m != op->rank && j * tdist__cpu_sc_a2av_piece(ch, op, m) < ch->hi[m];
  uint64_t lo = max64(ch->lo[m], j * ch->F), hi = min64(ch->hi[m], (j + 1) * ch->F);
  return lo < hi;
}

/* This member is done with step st: its slot and line may be rewritten as
 * far as it is concerned (room). */
static inline void step_done(cpu_sc_t *ch, cpu_ctx_t *ctx, uint64_t st) {
  ch->done = st + 1;
  atomic_store_explicit(&ch->rg[ch->me].ctl->done, st + 1, memory_order_release);
  ch->wrote = 1;
  ctx->moves++;
}

/* Consume step j if every piece it reads is in: 1, 0 (not yet), -1 (a
 * mismatch in the v-op counts, reported). */
static int consume_step(cpu_sc_t *ch, cpu_op_t *op, uint64_t j) {
  uint64_t st = op->sc.s0 + j;
  unsigned slot = sc_slot(ch, st);
  const uint8_t *pcs[SC_MAX_RANKS];
  uint64_t lent = 0;
  if (op->sc.two) {
    int r = consume_two(ch, op, j);
    if (r <= 0) return r;
    goto consumed;
  }
  if (op->sc.role == SC_ROLE_GIVE) goto consumed; /* it reads nothing: the step is only counted */
  for (int m = 0; m < op->size; m++) {
    pcs[m] = NULL;
    if (!reads(ch, op, m, j)) continue;
    sc_step_t *h = sc_line(ch, m, st);
    if (atomic_load_explicit(&h->step, memory_order_acquire) != st + 1) {
      /* Not in its slot: a giver that overflowed has it in a memfd. */
      if (!(pcs[m] = tdist__cpu_sc_ovf_piece(ch, op, m, j))) return 0;
      continue;
    }
    if (h->len & SC_LEN_LENT) lent |= 1ull << m; /* the line says where (sc_data.c) */
    pcs[m] =
        h->len <= SC_INLINE || (h->len & SC_LEN_LENT) ? h->inl : sc_slot_data(ch, m, slot, h->len);
  }
  if (j == 0 && tdist__cpu_sc_has_prefix(op) && !op->sc.prefixed) {
    if (tdist__cpu_sc_prefixes(ch, op, pcs) != 0) return -1;
    op->sc.prefixed = 1;
  }
  if (tdist__cpu_sc_consume(ch, op, j, pcs, lent) != 0) return -1;
consumed:
  step_done(ch, op->cg->ctx, st);
  return 1;
}

/* The head op's first step and, for fixed-size ops, its length and plan. */
static void start(cpu_sc_t *ch, cpu_op_t *op) {
  struct cpu_sc_opst *s = &op->sc;
  s->started = 1;
  s->s0 = ch->next_step;
  ch->totals[ch->me] = s->total;
  if (tdist_backend_op_is_v(op->type)) {
    /* The ranges come with the signatures (and the counts' prefixes);
     * nothing is read before. A fixed op's are all set below. */
    memset(ch->lo, 0, sizeof(uint64_t) * (size_t)ch->n);
    memset(ch->hi, 0, sizeof(uint64_t) * (size_t)ch->n);
    return;
  }
  s->nsteps = sc_steps_of(ch, tdist__cpu_sc_ranges(ch, op)); /* the totals too */
  ch->next_step = s->s0 + s->nsteps;
  /* Large all_reduce: two phases (consume_two). The size decides, so every
   * member that agrees on the op decides alike. */
  s->two = op->type == TDIST_OP_ALL_REDUCE && op->count >= (size_t)op->size &&
           (uint64_t)op->count * op->es >= (uint64_t)tdist__param_CpuScTwoBytes();
  s->direct = s->two && !tdist__cpu_sc_scales(op);
  s->lent = tdist__cpu_sc_lends(op);
}

/* Move the head op as far as it goes: 1 moved, 0 not, -1 a failure was
 * reported (it waits for the abort). */
static int advance(cpu_group_t *cg, cpu_sc_t *ch, cpu_op_t *op) {
  struct cpu_sc_opst *s = &op->sc;
  int moved = 0, pass;
  if (!s->started) start(ch, op);
  uint64_t mine = sc_steps_of(ch, s->total);
  /* A member that reduces writes at most `lead` steps ahead of what it
   * has consumed: its copy of step j + 1 then overlaps the wait for the
   * others' step j, and the pieces it reads are still in cache (1 MiB
   * all_reduce at n = 2: writing all 8 steps first, then reducing, cost a
   * third more). A giver reads nothing, and what any other member reads
   * (all_gather, all_to_all_v, ...) is copied out as it is: they write as
   * far as the slots go. Held to 2 steps, the senders of a 64 MiB Zipf
   * all_to_all_v at n = 4 on 2 cores waited on the hot receiver's pace at
   * every step, each a turn on a shared CPU (27-34 ms against 19-25 for
   * the slots' reach, Open MPI 27-31 in the same launches). */
  uint64_t lead = s->role == SC_ROLE_GIVE || s->lent || !tdist_backend_op_is_reducing(op->type)
                      ? UINT64_MAX
                      : (uint64_t)tdist__param_CpuScLead();
  do {
    pass = 0;
    while (s->wstep < mine && (s->wstep < s->cstep || s->wstep - s->cstep < lead)) {
      if (!room(ch, s->s0 + s->wstep, s->lent ? 0 : step_len(ch, op, s->wstep))) {
        /* A giver does not wait for its readers for long (sc_ovf.c). */
        if (s->role == SC_ROLE_GIVE && tdist__cpu_sc_overflow(ch, op)) pass = 1;
        break;
      }
      s->blocked_at = 0;
      write_step(ch, op, s->wstep, s->s0 + s->wstep);
      s->wstep++;
      pass = 1;
    }
    if (!s->checked && s->role != SC_ROLE_GIVE) {
      int r = check_sigs(cg, ch, op);
      if (r <= 0) return r < 0 ? -1 : moved | pass;
      s->checked = 1;
      if (tdist_backend_op_is_v(op->type)) {
        s->nsteps = sc_steps_of(ch, tdist__cpu_sc_ranges(ch, op));
        ch->next_step = s->s0 + s->nsteps;
      }
    }
    if (s->nsteps == UINT64_MAX) return moved | pass; /* a v-op's length: with every signature */
    while (s->cstep < s->nsteps) {
      /* This member's own piece of a step is written before the step is
       * consumed: an in-place output never overwrites input not yet given. */
      if (s->cstep >= s->wstep && s->cstep < mine) break;
      int r = consume_step(ch, op, s->cstep);
      if (r < 0) return -1;
      if (r == 0) {
        /* Waiting for the others: the local part meanwhile. */
        if (tdist__cpu_sc_local_step(op, 0)) pass = 1;
        break;
      }
      s->cstep++;
      pass = 1;
      if (s->wstep < mine && s->wstep - s->cstep < lead) break; /* write the next one first */
    }
    moved |= pass;
    /* Written and consumed to the end (checked, or a giver): another
     * round would find nothing (a small op's every pass took one more). */
    if (s->cstep >= s->nsteps && s->wstep >= mine) break;
  } while (pass);
  return moved;
}

/* ---- checking later, completing ---------------------------------------------------- */

/* op completed before every signature it needs was checked: queued to be
 * checked later (verify); engine ops that receive wait for that. */
static void leave_unchecked(cpu_group_t *cg, cpu_sc_t *ch, const cpu_op_t *op) {
  ch->unverified[(ch->uv_head + ch->nunverified++) % SC_LAG] =
      (struct sc_unverified){.cseq = op->cseq,
                             .count = op->count,
                             .root = op->root,
                             .optype = (uint8_t)op->type,
                             .dtype = (uint8_t)op->dtype,
                             .redop = (uint8_t)op->redop};
  cg->sc_lag = 1;
}

/* An op leaves the channel done: what givers overflowed in it is read, and
 * it is counted (no locked add on a small op's path: transport.h says what
 * that costs). */
static void op_out(cpu_sc_t *ch) {
  if (ch->novf) tdist__cpu_sc_ovf_done(ch);
  atomic_store_explicit(&tdist__cpu_sc_ops,
                        atomic_load_explicit(&tdist__cpu_sc_ops, memory_order_relaxed) + 1,
                        memory_order_relaxed);
}

/* Ops that completed unchecked: check the oldest ones whose signatures are
 * all in. 0, or -1 on a mismatch (reported). Engine ops that waited on
 * them (sigcheck.c, tdist__cpu_lag_blocks) are readied when none is left.
 *
 * An op below every other member's published vseq needs no signature
 * read: each of them checked it against every member's signature, this
 * one's included, before its vseq passed it (it completed it checked, or
 * verified it so itself), and found them agreeing, or the group failed.
 * A broadcast root running ahead so drops its readers' agreement a vseq
 * step at a time, one line a member, where reading each op's signature
 * line (written by its reader moments before) was a third of the root's
 * time at n = 2. shallow: that only (ops not covered stay); else the
 * others' signatures are read for the rest. */
static int verify_scan(cpu_group_t *cg, cpu_sc_t *ch, int shallow) {
  /* The members' vseq lines are also their done lines, which a reader
   * rewrites every op: looked at again only every SC_VERIFY_BATCH ops
   * when shallow. */
  if (ch->nunverified && ch->unverified[ch->uv_head].cseq >= ch->vmin &&
      (!shallow || ch->nunverified % SC_VERIFY_BATCH == 0)) {
    uint64_t mn = UINT64_MAX;
    for (int m = 0; m < ch->n; m++)
      if (m != ch->me)
        mn = min64(mn, atomic_load_explicit(&ch->rg[m].ctl->vseq, memory_order_acquire));
    ch->vmin = mn;
  }
  while (ch->nunverified) {
    const struct sc_unverified *u = &ch->unverified[ch->uv_head];
    if (u->cseq < ch->vmin) {
      ch->uv_head = (ch->uv_head + 1) % SC_LAG;
      ch->nunverified--;
      continue;
    }
    if (shallow) return 0;
    for (int m = 0; m < ch->n; m++) {
      sc_sig_t g;
      if (m == ch->me) continue;
      if (!sig_read(ch, m, u->cseq, &g)) return 0;
      if (agree(cg, u->cseq, m, &g, (tdist_optype_t)u->optype, (tdist_dtype_t)u->dtype, u->count,
                u->root, (tdist_redop_t)u->redop))
        return -1;
    }
    ch->uv_head = (ch->uv_head + 1) % SC_LAG;
    ch->nunverified--;
  }
  if (cg->sc_lag) {
    cg->sc_lag = cg->sc_waited = 0;
    tdist__list_t *n;
    tdist__list_foreach(n, &cg->ops) {
      cpu_op_t *o = tdist__list_entry(n, cpu_op_t, link);
      if (!o->sc.on && (o->p2p ? o->pending == 0 : o->rounds_done)) tdist__cpu_ready(o);
    }
  }
  return 0;
}

/* verify_scan, which a shallow check leaves at once while the members'
 * vseq is not due for another look and the oldest unchecked op is not
 * below the lowest vseq seen: asked here, inline, the now lane of a
 * broadcast root (which checks every op) no longer paid a twenty-fifth of
 * its instructions for the call. */
static inline int verify_ops(cpu_group_t *cg, cpu_sc_t *ch, int shallow) {
  if (shallow && ch->nunverified % SC_VERIFY_BATCH != 0 &&
      ch->unverified[ch->uv_head].cseq >= ch->vmin)
    return 0;
  return verify_scan(cg, ch, shallow);
}

static int verify(cpu_group_t *cg, cpu_sc_t *ch) { return verify_ops(cg, ch, 0); }

/* Complete the head op if what it must know is known: 1 done, 0 not yet. */
static int finish(cpu_group_t *cg, cpu_sc_t *ch, cpu_op_t *op) {
  struct cpu_sc_opst *s = &op->sc;
  if (s->nsteps == UINT64_MAX || s->cstep < s->nsteps || s->wstep < sc_steps_of(ch, s->total))
    return 0;
  if (s->role != SC_ROLE_GIVE && !s->checked) return 0; /* a barrier: nothing but signatures */
  /* An all_gather or all_to_all_v that lent its input to be read in place:
   * its buffer goes back to the caller only once every member consumed
   * every step, i.e. read all of it (test_cpu_sc allgather_lent, a2av_big). */
  if (s->lent || (op->type == TDIST_OP_ALL_TO_ALL_V && ch->cma && tdist__cpu_sc_a2av_lends(op))) {
    for (int m = 0; m < ch->n; m++)
      if (m != ch->me &&
          atomic_load_explicit(&ch->rg[m].ctl->done, memory_order_acquire) < s->s0 + s->nsteps)
        return 0;
  }
  tdist__cpu_sc_local_step(op, 1); /* what is left of the local part */
  /* An op in which this member receives completes only once every op it
   * completed unchecked is checked (sc.h, Agreement): its own, and the
   * engine's lagging ones (sigcheck.c) of a group that runs both. */
  if (s->role != SC_ROLE_GIVE && (verify(cg, ch) != 0 || ch->nunverified || cg->lagging)) return 0;
  if (s->role != SC_ROLE_ALL) {
    /* A broadcast receiver (it checked the root only): checked against
     * everyone now if every signature is in, else later. Not while older
     * ops wait unchecked: members sign in order, so a signature those lack
     * is missing here too. A giver always later (verify_mode): it runs
     * ahead of its readers, whose signatures are seldom in yet, and reading
     * them now would cost n - 1 cold lines per op for nothing. */
    int role = s->role;
    s->role = SC_ROLE_ALL;
    int r = ch->nunverified || role == SC_ROLE_GIVE ? 0 : check_sigs(cg, ch, op);
    s->role = role;
    if (r < 0) return 0;
    if (r == 0) {
      if (ch->nunverified >= SC_LAG && (verify(cg, ch) != 0 || ch->nunverified >= SC_LAG)) return 0;
      leave_unchecked(cg, ch, op);
    }
  }
  tdist__list_remove(&s->link);
  op_out(ch);
  if (s->tune) tdist__cpu_sc_tune_took(op, tdist__now_ns() - s->t0);
  tdist__cpu_op_complete(op, 0);
  return 1;
}

/* How a pass checks the unchecked ops: 2 not now, 1 by the others' vseq
 * only (verify_ops, shallow), 0 to the end. While a giver heads the queue
 * (a broadcast root running ahead) and nothing else needs them checked (an
 * engine op they hold, cg->sc_waited; a receiving op checks them itself,
 * in finish): not before SC_VERIFY_BATCH wait, then by vseq until
 * SC_VERIFY_DEEP wait. A check that comes too early reads a reader's
 * signature line before the reader writes it, and pulls it back once the
 * reader has: the line crosses between the cores twice more per op, on
 * both sides' paths; by vseq, a member's agreement to 256 ops crosses in
 * one line. Past SC_VERIFY_DEEP the readers are that far behind (a vseq
 * lags its member by less than SC_VSEQ_STEP), or one never checks (a
 * member that gives too, in a mismatch): the signatures are read. */
static int verify_mode(const cpu_group_t *cg, const cpu_sc_t *ch) {
  if (cg->sc_waited) return 0;
  tdist__list_t *n = tdist__list_first(&ch->ops);
  if (!n || tdist__list_entry(n, cpu_op_t, sc.link)->sc.role != SC_ROLE_GIVE) return 0;
  if (ch->nunverified < SC_VERIFY_BATCH) return 2;
  return ch->nunverified < (int)SC_VERIFY_DEEP;
}

static int chan_pass(cpu_group_t *cg, cpu_sc_t *ch) {
  int moved = 0, mode = ch->nunverified ? verify_mode(cg, ch) : 2;
  if (mode != 2 && verify_ops(cg, ch, mode) == 0 && !ch->nunverified) moved = 1;
  if (ch->unsigned_op) sign_pending(ch);
  tdist__list_t *n;
  while (!ch->broken && (n = tdist__list_first(&ch->ops))) {
    cpu_op_t *op = tdist__list_entry(n, cpu_op_t, sc.link);
    if (op == ch->unsigned_op) break;  /* its signature entry is still read */
    if (tdist__cpu_blocked(op)) break; /* a mismatch: it waits for the abort */
    int r = advance(cg, ch, op);
    if (r < 0) break;
    moved |= r;
    if (!finish(cg, ch, op)) break;
    moved = 1;
    if (ch->unsigned_op) sign_pending(ch);
  }
  if (!ch->broken) publish_vseq(cg, ch);
  return moved;
}

/* ---- entries ----------------------------------------------------------------------- */

int tdist__cpu_sc_post(cpu_op_t *op) {
  cpu_sc_t *ch = op->cg->sc;
  struct cpu_sc_opst *s = &op->sc;
  memset(s, 0, sizeof(*s));
  tdist__list_init(&s->link);
  s->nsteps = UINT64_MAX;
  s->on = 1;
  TDIST_CHECK(tdist__cpu_sc_plan_post(op));
  tdist__list_push_back(&ch->ops, &s->link);
  if (!ch->unsigned_op && sign_ready(ch, op->cseq))
    sign(ch, op);
  else if (!ch->unsigned_op)
    ch->unsigned_op = op; /* signed by a later pass (sign_pending) */
  return 0;
}

/* The now lane's look (tdist__cpu_sc_now, _now_test): every other
 * member's signature of op is in and agrees, and each step line this
 * member reads holds op's step: 1, else 0, or -1 where a signature
 * disagrees (left to the slow lane's pass, which reports it) or tells an
 * all_to_all_v stream longer than one step (a pass runs the op). */
static int all_in(cpu_sc_t *ch, const cpu_op_t *op) {
  int v = op->type == TDIST_OP_ALL_TO_ALL_V;
  for (int m = 0; m < op->size; m++) {
    if (m == op->rank) continue;
    sc_sig_t g;
    if (!step_sig(ch, op, m, &g) && !sig_read(ch, m, op->cseq, &g)) return 0;
    if (g.optype != op->type || g.dtype != op->dtype || (!v && g.count != op->count) ||
        (tdist_backend_op_is_rooted(op->type) && g.root != op->root) ||
        (tdist_backend_op_is_reducing(op->type) && g.redop != op->redop))
      return -1;
    /* An all_to_all_v's length is in the signature: a stream longer than
     * the one step the lane takes is left to a pass (its counts decide how
     * many steps the op has, on every member alike). */
    if (v && g.total > ch->F) return -1;
    if (op->sc.nsteps && reads(ch, op, m, 0)) {
      const sc_step_t *h = sc_line(ch, m, op->sc.s0);
      if (atomic_load_explicit(&h->step, memory_order_acquire) != op->sc.s0 + 1 ||
          h->cseq != op->cseq)
        return 0;
    }
  }
  return 1;
}

/* Has every other member posted collective cseq (its step st in its line,
 * or its signature in the ring)? The now lane's first look for a member
 * that only reads, a few loads. */
static int posted_all(const cpu_sc_t *ch, uint64_t cseq, uint64_t st) {
  for (int m = 0; m < ch->n; m++) {
    if (m == ch->me) continue;
    const sc_step_t *h = sc_line(ch, m, st);
    if (atomic_load_explicit(&h->step, memory_order_acquire) == st + 1 && h->cseq == cseq) continue;
    if (atomic_load_explicit(&ch->rg[m].sig[cseq % SC_H].seq, memory_order_acquire) != cseq + 1)
      return 0;
  }
  return 1;
}

/* The now lane's one step, every piece of which all_in saw in: consumed
 * (1). Anything else would break all_in's word: the group fails rather
 * than complete the op without its data (0). */
static int consume_one(cpu_group_t *cg, cpu_sc_t *ch, cpu_op_t *op) {
  if (!op->sc.nsteps) return 1;
  int r = consume_step(ch, op, 0);
  if (r == 1) return 1;
  if (r < 0) return 0; /* reported: all_to_all_v counts that disagree, a failed read in place */
  tdist__cpu_fail(cg, 0, TDIST_ERR_INTERNAL,
                  "cpu: collective #%llu: a step the now lane saw in could not be read",
                  (unsigned long long)op->cseq);
  return 0;
}

/* The end of a now-lane op whose step is consumed and whose local part
 * and unchecked record are seen to: as the slow lane's completion, with no
 * engine op to complete, then what the lane publishes. 1 (done). */
static inline int line_done(cpu_group_t *cg, cpu_sc_t *ch, cpu_op_t *op) {
  op_out(ch);
  tdist__cpu_done_note(op);
  publish_vseq(cg, ch);
  tdist__cpu_sc_bells(ch, cg->ctx);
  return 1;
}

/* The rest of a now-lane op of the general path once its step is
 * consumed: as the slow lane's finish, then line_done. */
static int now_done(cpu_group_t *cg, cpu_sc_t *ch, cpu_op_t *op) {
  tdist__cpu_sc_local_step(op, 1);
  if (op->sc.role == SC_ROLE_GIVE) leave_unchecked(cg, ch, op);
  return line_done(cg, ch, op);
}

/* May a giver of the now lane complete one more op unchecked? Its batch
 * is checked first (verify_mode's rule); a mismatch found there is
 * reported, and the op takes the slow lane, where it waits for the abort. */
static inline int give_unchecked(cpu_group_t *cg, cpu_sc_t *ch) {
  if (ch->nunverified >= SC_VERIFY_BATCH &&
      verify_ops(cg, ch, ch->nunverified < (int)SC_VERIFY_DEEP) != 0)
    return 0;
  return ch->nunverified < SC_LAG;
}

/* Does op's stream, count elements, fit its step line beside the
 * signature (SC_SIG_INLINE)? No division: the lane asks for every op. */
static inline int fits_line(const cpu_op_t *op) {
  return op->count && op->count <= SC_SIG_INLINE && op->count * op->es <= SC_SIG_INLINE;
}

/* The plainest giver's stream (now_give): one buffer, copied as it is, that
 * fits the op's step line (fits_line). NULL for any other op. */
static const void *plain_give(const cpu_op_t *op) {
  const tdist_backend_args_t *a = op->args;
  int root = op->rank == op->root;
  const void *given;
  switch (op->type) {
  case TDIST_OP_BROADCAST: given = root ? a->recvbuf : NULL; break;
  case TDIST_OP_GATHER: given = root ? NULL : a->sendbuf; break;
  case TDIST_OP_REDUCE: given = root || tdist__cpu_sc_scales(op) ? NULL : a->sendbuf; break;
  default: return NULL;
  }
  return given && fits_line(op) ? given : NULL;
}

/* An op that is its members' lines of one step, each holding a member's
 * whole input (fits_line), read by every member (now_lines): an
 * all_gather, or an all_reduce reduced as it is, its output the input or
 * apart from it. */
static int plain_lines(const cpu_op_t *op) {
  if (!fits_line(op)) return 0;
  if (op->type == TDIST_OP_ALL_GATHER) return 1;
  return op->type == TDIST_OP_ALL_REDUCE && !tdist__cpu_sc_scales(op) &&
         !tdist__cpu_sc_tmp_bytes(op);
}

/* Step st of this member, which holds its whole stream (len bytes of
 * given, at most SC_SIG_INLINE) and the op's signature, goes out, and the
 * op is numbered and signed: what the lane's plan, write_step and sign do
 * for such a stream, without their choices, in the same order (the line
 * the others wait for first, then the ring's entry, the record). */
static inline void line_out(cpu_group_t *cg, cpu_sc_t *ch, cpu_op_t *op, const void *given,
                            size_t len, uint64_t st) {
  op->sc.total = len; /* the field of op->sc the signatures read */
  cg->next_cseq++;
  ch->next_step = st + 1;
  ch->totals[ch->me] = len;
  sc_step_t *h = sc_line(ch, ch->me, st);
  memcpy(h->inl, given, len);
  step_sign(h, op, 0, len);
  h->len = (uint32_t)len;
  step_out(ch, cg->ctx, h, st, op->cseq);
  sign(ch, op);
}

/* The now lane's plainest giver (plain_give: a small broadcast's root, a
 * gather's or reduce's sender): its line (line_out), its step counted,
 * the op left unchecked. The lane's general path was 720 of an 8-byte
 * broadcast root's 1200 instructions at n = 2. 1 done; 0 not taken,
 * nothing changed. */
static int now_give(cpu_group_t *cg, cpu_sc_t *ch, cpu_op_t *op, const void *given) {
  size_t len = op->count * op->es;
  uint64_t st = ch->next_step;
  if (!room(ch, st, len) || !give_unchecked(cg, ch)) return 0;
  line_out(cg, ch, op, given, len, st);
  step_done(ch, cg->ctx, st);
  leave_unchecked(cg, ch, op);
  return line_done(cg, ch, op);
}

/* now_lines's look at the others' lines of step st: 1
 * each holds op's step with its signature and it agrees, 0 one is not in
 * yet, -1 one has no signature there or it disagrees (a pass reads the
 * ring and reports). */
static inline int lines_in(const cpu_sc_t *ch, const cpu_op_t *op, uint64_t st) {
  int reducing = op->type == TDIST_OP_ALL_REDUCE;
  for (int m = 0; m < op->size; m++) {
    if (m == op->rank) continue;
    const sc_step_t *h = sc_line(ch, m, st);
    if (atomic_load_explicit(&h->step, memory_order_acquire) != st + 1 || h->cseq != op->cseq)
      return 0;
    sc_sig_t g;
    if (!step_sig(ch, op, m, &g) || g.optype != op->type || g.dtype != op->dtype ||
        g.count != op->count || (reducing && g.redop != op->redop))
      return -1;
  }
  return 1;
}

/* A lane op whose step is out and whose look found the others not in (0),
 * or something a pass must decide (-1), goes on in the slow lane as an
 * engine op whose post and first pass are done: 2. TDIST_ERR_NO_MEMORY
 * (reported for the group too). */
static int now_handover(cpu_group_t *cg, cpu_sc_t *ch, tdist_backend_op_t *bop, cpu_op_t *op,
                        int in) {
  int v = op->type == TDIST_OP_ALL_TO_ALL_V;
  cpu_op_t *eop = tdist__cpu_op_new(cg, bop);
  if (!eop) {
    tdist__cpu_fail(cg, 0, TDIST_ERR_NO_MEMORY,
                    "cpu: no memory for collective #%llu, which this rank signed",
                    (unsigned long long)op->cseq);
    return TDIST_ERR_NO_MEMORY;
  }
  eop->cseq = op->cseq;
  eop->posted_at = 0; /* as post_sc (backend.c) */
  eop->probe_at = UINT64_MAX;
  eop->sc = op->sc;
  eop->sc.on = 1;
  /* An all_to_all_v goes on as the slow lane's own would after its first
   * write: unchecked, its length unknown (nsteps UINT64_MAX, the clock at
   * its first step: a pass learns both from the signatures), its ranges
   * empty until the counts are read (start's; ranges cleared them). */
  eop->sc.now = !v && in != 1;
  tdist__list_init(&eop->sc.link);
  tdist__list_push_back(&ch->ops, &eop->sc.link);
  publish_vseq(cg, ch);
  tdist__cpu_sc_bells(ch, cg->ctx);
  return 2;
}

/* A plainest op whose look found the others not in (0) or something a
 * pass must decide (-1), its steps (one, written: line_out; none: a
 * barrier) out: the op is given the state the lane's general path gives it
 * at that point and handed over alike. */
static int plain_handover(cpu_group_t *cg, cpu_sc_t *ch, tdist_backend_op_t *bop, cpu_op_t *op,
                          uint64_t st, uint64_t steps, int in) {
  struct cpu_sc_opst *s = &op->sc;
  memset(s, 0, sizeof(*s));
  tdist__cpu_sc_plan(op);
  s->s0 = st;
  s->nsteps = s->wstep = steps;
  s->started = 1;
  tdist__cpu_sc_ranges(ch, op);
  return now_handover(cg, ch, bop, op, in);
}

/* The lane's look once this member's part is out (its step, a barrier's
 * signature): all_in, again up to TDIST_CPU_SC_NOW_LOOKS times. The
 * others write theirs about now, where each has a CPU: a member that wrote
 * first sees their steps within a line's crossing or two. Looking again
 * here a few times completes the op in the lane; the slow lane instead
 * made it an engine op, went back to the core, and took the engine lock
 * once more per test (at n = 2 the member that wrote first, nearly every
 * op of an 8-byte all_gather loop, went there). */
static inline int all_look(cpu_sc_t *ch, const cpu_op_t *op) {
  int in = all_in(ch, op);
  for (int k = (int)tdist__param_CpuScNowLooks(); in == 0 && k > 0; k--) {
    tdist__cpu_pause();
    in = all_in(ch, op);
  }
  return in;
}

/* A plainest op's line is out (line_out): the others' lines of step st
 * looked at (lines_in) as the lane's writer does, up to
 * TDIST_CPU_SC_NOW_LOOKS times more. */
static inline int lines_look(const cpu_sc_t *ch, const cpu_op_t *op, uint64_t st) {
  int in = lines_in(ch, op, st);
  for (int k = (int)tdist__param_CpuScNowLooks(); in == 0 && k > 0; k--) {
    tdist__cpu_pause();
    in = lines_in(ch, op, st);
  }
  return in;
}

/* The now lane's plainest writers that read every member's line
 * (plain_lines): an all_gather's own block first (plan_local, as the
 * general path), its line out (line_out), then the others' looked at
 * (lines_look); all in, an all_reduce reduces from the lines in member
 * order as consume_step would (the same bits on every member), an
 * all_gather copies each to its block. Not all in: handed over
 * (plain_handover). The general path's plan, ranges, look and consume
 * were half of an 8-byte all_reduce's 1840 instructions at n = 2, and a
 * third of an all_gather's 1830. */
static int now_lines(cpu_group_t *cg, cpu_sc_t *ch, tdist_backend_op_t *bop, cpu_op_t *op) {
  size_t len = op->count * op->es;
  uint64_t st = ch->next_step;
  int gather = op->type == TDIST_OP_ALL_GATHER;
  if (!room(ch, st, len) || ch->nunverified || cg->lagging) return 0;
  op->sc.s0 = st; /* step_sig's */
  if (gather) tdist__cpu_sc_plan_local(op);
  line_out(cg, ch, op, op->args->sendbuf, len, st);
  int in = lines_look(ch, op, st);
  if (in != 1) return plain_handover(cg, ch, bop, op, st, 1, in);
  uint8_t *out = op->args->recvbuf;
  if (gather) {
    for (int m = 0; m < op->size; m++)
      if (m != op->rank) memcpy(out + (size_t)m * len, sc_line(ch, m, st)->inl, len);
  } else {
    const uint8_t *pcs[SC_MAX_RANKS];
    for (int m = 0; m < op->size; m++)
      pcs[m] = sc_line(ch, m, st)->inl;
    tdist__cpu_sc_reduce(op, out, pcs, 0, len);
  }
  step_done(ch, cg->ctx, st);
  return line_done(cg, ch, op);
}

/* The now lane's plainest taker: a broadcast's receiver whose stream fits
 * the root's step line (fits_line). As the lane's general path for a
 * member that only reads, it looks first and takes the slow lane unchanged
 * when the root's step is not in or a signature is not in or disagrees
 * (all_in's word, which a pass reports); all in: it signs, copies the
 * step from the root's line, counts it and is done, checked. The general
 * path's plan, ranges, look and consume were half of an 8-byte broadcast
 * receiver's 1650 instructions at n = 2, and the receiver is what a root
 * running ahead waits for (room). 1 done; 0 not taken, nothing changed. */
static int now_take(cpu_group_t *cg, cpu_sc_t *ch, cpu_op_t *op) {
  uint64_t st = ch->next_step;
  if (ch->nunverified || cg->lagging) return 0;
  const sc_step_t *h = sc_line(ch, op->root, st);
  if (atomic_load_explicit(&h->step, memory_order_acquire) != st + 1 || h->cseq != op->cseq)
    return 0;
  op->sc.s0 = st;    /* step_sig's */
  op->sc.nsteps = 0; /* all_in: the root's step is seen above */
  if (all_in(ch, op) != 1) return 0;
  op->sc.total = 0; /* its signature's: a receiver gives nothing */
  cg->next_cseq++;
  ch->next_step = st + 1;
  sign(ch, op);
  /* The root cannot rewrite its line before this member's done passes st
   * (room): the bytes stay until step_done. */
  memcpy(op->args->recvbuf, h->inl, op->count * op->es);
  step_done(ch, cg->ctx, st);
  return line_done(cg, ch, op);
}

/* The now lane's barrier: its signature out, then the others' looked at
 * (all_in) as the lane's general path does for a member others wait for;
 * all in, it is done, checked. Not all in: it is handed over with the
 * state the general path gives it at that point. The general path's
 * plan, ranges and their zeroing were a fifth of its 1340 instructions at
 * n = 2. */
static int now_bar(cpu_group_t *cg, cpu_sc_t *ch, tdist_backend_op_t *bop, cpu_op_t *op) {
  uint64_t st = ch->next_step;
  if (ch->nunverified || cg->lagging) return 0;
  struct cpu_sc_opst *s = &op->sc;
  s->s0 = st;
  s->nsteps = 0; /* no step: all_in reads signatures only */
  s->total = 0;
  cg->next_cseq++;
  sign(ch, op);
  int in = all_look(ch, op);
  if (in == 1) return line_done(cg, ch, op);
  return plain_handover(cg, ch, bop, op, st, 0, in);
}

/* The now lane's all_to_all_v: one whose stream is one slot (every block
 * for another member within its chunk, none lent, at most SC_NOW_BYTES
 * given: tdist__cpu_sc_a2av_plain). Its own block first (plan_local), its
 * step out with its count prefix (write_step), then the others' steps
 * looked at (all_look: their signatures, from their lines, tell whether
 * each stream is one step too); all in, the step is consumed as a pass
 * would (each member's counts for this member checked against its
 * recv_counts, its chunk copied). Not all in: handed over with the state
 * the slow lane's start and first write give it (its length unknown, the
 * clock at its step). Any other all_to_all_v takes the slow lane. 1 done;
 * 0 not taken, nothing changed; 2 handed over. */
static int now_a2av(cpu_group_t *cg, cpu_sc_t *ch, tdist_backend_op_t *bop, cpu_op_t *op) {
  struct cpu_sc_opst *s = &op->sc;
  uint64_t st = ch->next_step;
  /* count: the send_counts' sum (opcheck.h) */
  if ((uint64_t)op->count * op->es > min64(SC_NOW_BYTES, ch->F) || !room(ch, st, ch->F) ||
      ch->nunverified || cg->lagging)
    return 0;
  memset(s, 0, sizeof(*s));
  if (!tdist__cpu_sc_a2av_plain(op)) return 0;
  tdist__cpu_sc_plan_local(op);
  cg->next_cseq++;
  sign(ch, op);
  s->s0 = st;
  s->nsteps = UINT64_MAX; /* all_in: read at step 0; the clock stays at st until consumed */
  s->started = 1;
  ch->totals[ch->me] = s->total;
  write_step(ch, op, 0, st);
  s->wstep = 1;
  int in = all_look(ch, op);
  if (in == 1 && tdist__cpu_sc_a2av_take(ch, op, st) == 0) {
    step_done(ch, cg->ctx, st);
    ch->next_step = st + 1;
    return now_done(cg, ch, op);
  }
  /* Not all in, or something a pass must decide; or the group failed
   * (counts that disagree, reported): the op is numbered and signed, and
   * goes on as an engine op, which the failure fails with its cause. Its
   * state is already the slow lane's after its first write (planned, its
   * length unknown); only the ranges are cleared, as start's are. */
  tdist__cpu_sc_ranges(ch, op);
  return now_handover(cg, ch, bop, op, in);
}

int tdist__cpu_sc_now(cpu_group_t *cg, tdist_backend_op_t *bop) {
  const tdist_backend_args_t *a = bop->args;
  cpu_sc_t *ch = cg->sc;
  /* Alone in its group: nothing queued before it on the channel or in the
   * engine (which numbers collectives with it), no engine message parked
   * for a number, its signature entry and its line free. */
  if (!ch || ch->broken || cg->aborted || tdist_backend_op_is_p2p(a->type) ||
      (tdist_backend_op_is_v(a->type) && a->type != TDIST_OP_ALL_TO_ALL_V) ||
      !tdist__list_empty(&ch->ops) || !tdist__list_empty(&cg->ops) || !tdist__list_empty(&cg->ux) ||
      !sign_ready(ch, cg->next_cseq))
    return 0;
  /* The fields the segment's steps read, and its part zeroed once the op
   * is not one of the plainest (zeroing all 416 bytes was a seventh of the
   * lane; those set the one field they use): the engine's part is not used. */
  cpu_op_t op;
  struct cpu_sc_opst *s = &op.sc;
  op.cg = cg;
  op.args = a;
  op.type = a->type;
  op.dtype = a->dtype;
  op.redop = a->redop;
  op.count = a->count;
  op.es = tdist_dtype_size(a->dtype);
  op.root = a->root;
  op.rank = cg->rank;
  op.size = cg->size;
  op.cseq = cg->next_cseq;
  op.p2p = 0;
  /* The channel's own choice (TDIST_CPU_SC_MAX_BYTES): one the engine runs
   * takes the slow lane, which posts it there. */
  if (!tdist__cpu_sc_takes(cg, &op)) return 0;
  const void *plain = plain_give(&op);
  if (plain) return now_give(cg, ch, &op, plain);
  if (plain_lines(&op)) return now_lines(cg, ch, bop, &op);
  if (op.type == TDIST_OP_BROADCAST && op.rank != op.root && fits_line(&op))
    return now_take(cg, ch, &op);
  if (op.type == TDIST_OP_BARRIER) return now_bar(cg, ch, bop, &op);
  if (op.type == TDIST_OP_ALL_TO_ALL_V) return now_a2av(cg, ch, bop, &op);
  memset(s, 0, sizeof(*s));
  /* Planned, nothing copied yet (plan_local, once it is taken); an input
   * to copy aside takes the slow lane. */
  tdist__cpu_sc_plan(&op);
  if (tdist__cpu_sc_tmp_bytes(&op)) return 0;
  /* One step (SC_NOW_BYTES is below the two-phase size; a slot is at
   * least as large unless set smaller), and room for it: its line, and its
   * slot where the line cannot hold it. */
  uint64_t most = min64(SC_NOW_BYTES, ch->F);
  s->s0 = ch->next_step;
  if (s->total > most || !room(ch, s->s0, s->total)) return 0;
  /* A giver checks later (its batch first, verify_mode's rule: a mismatch
   * found there is reported, and this op takes the slow lane, where it
   * waits for the abort); a member that receives completes only with
   * nothing left unchecked before it. */
  if (s->role == SC_ROLE_GIVE) {
    if (!s->total || !give_unchecked(cg, ch)) return 0;
  } else if (ch->nunverified || cg->lagging) {
    return 0;
  }
  /* A member others wait for (its step, a barrier's signature) writes
   * first and looks after (commit); one that only reads (a broadcast
   * receiver) looks first, and takes the slow lane unchanged when what it
   * reads is not in yet: a writer that looked first would read the others'
   * lines before it wrote its own, and everyone would wait one line's
   * crossing longer (an all_reduce at n = 2: 0.29 us against 0.27). */
  int commit = s->role != SC_ROLE_GIVE && (s->total || op.type == TDIST_OP_BARRIER);
  if (s->role == SC_ROLE_GIVE || commit) {
    /* One step, as every member counts it (start: the longest stream),
     * known without the ranges: a giver's stream is the longest of its
     * op (the root's of a broadcast or scatter, one like every member's
     * of a reduce or gather), and a writer's one like every member's (an
     * all_reduce's, all_gather's, all_to_all's: total_of); a barrier has
     * none. A writer's ranges (what it reads) come after its write. */
    s->nsteps = s->total ? 1 : 0;
  } else {
    if (!posted_all(ch, op.cseq, s->s0)) return 0; /* a few loads first */
    uint64_t mx = tdist__cpu_sc_ranges(ch, &op);   /* the members' totals, what is read */
    if (mx > most) return 0;
    s->nsteps = sc_steps_of(ch, mx);
    if (all_in(ch, &op) != 1) return 0;
  }
  /* post, start, its one step: as the slow lane's post and first pass. A
   * step line that carries the signature (step_sign) is written before
   * the ring's entry: that line is what the others wait for. The local
   * part first, as the slow lane's post copies it. */
  tdist__cpu_sc_plan_local(&op);
  cg->next_cseq++;
  int sig_in_line = s->total && s->total <= SC_SIG_INLINE;
  if (!sig_in_line) sign(ch, &op);
  s->started = 1;
  ch->next_step = s->s0 + s->nsteps;
  ch->totals[ch->me] = s->total;
  if (s->total) {
    write_step(ch, &op, 0, s->s0);
    s->wstep = 1;
  }
  if (sig_in_line) sign(ch, &op);
  /* A writer now looks (a reader looked before: all in); what it reads
   * (lo, hi) first. Written, the others not in: the op goes on in the slow
   * lane, as an engine op whose post and first pass are done. Made only
   * now: the member that comes first waits for the others anyway, and one
   * made before the write delayed the step everyone waits for (0.278
   * against 0.262 us an all_reduce at n = 2). */
  int in = 1;
  if (commit) {
    tdist__cpu_sc_ranges(ch, &op);
    in = all_look(ch, &op);
  }
  if (in == 1) {
    /* Every piece it reads is in (all_in): the step is consumed and the
     * op is checked. */
    if (consume_one(cg, ch, &op)) return now_done(cg, ch, &op);
    /* The group failed (reported: a step that could not be read). The
     * op is numbered and signed: it goes on as an engine op, which the
     * group's failure fails with its cause (a bare error from the submit
     * would name nothing). */
  }
  return now_handover(cg, ch, bop, &op, in);
}

int tdist__cpu_sc_now_test(cpu_group_t *cg, tdist_backend_op_t *bop) {
  cpu_sc_t *ch = cg->sc;
  cpu_op_t *op = bop->priv;
  if (!op || !op->sc.on || !op->sc.now || !ch || ch->broken || cg->aborted || ch->nunverified ||
      cg->lagging || tdist__list_first(&ch->ops) != &op->sc.link || tdist__cpu_blocked(op))
    return -1;
  struct cpu_sc_opst *s = &op->sc;
  int in = all_in(ch, op);
  if (in != 1) return in; /* a disagreement: a pass reports it */
  /* As advance and finish would: its step consumed, checked, completed. */
  if (!consume_one(cg, ch, op)) return -1; /* the group failed: a pass hands it over */
  s->cstep = s->nsteps;
  s->checked = 1;
  tdist__cpu_sc_local_step(op, 1);
  tdist__list_remove(&s->link);
  op_out(ch);
  tdist__cpu_op_complete(op, 0);
  publish_vseq(cg, ch);
  tdist__cpu_sc_bells(ch, cg->ctx);
  return 1;
}

int tdist__cpu_sc_progress(cpu_ctx_t *ctx) {
  int moved = 0;
  tdist__list_t *n;
  tdist__list_foreach(n, &ctx->groups) {
    cpu_group_t *cg = tdist__list_entry(n, cpu_group_t, link);
    cpu_sc_t *ch = cg->sc;
    if (!ch || ch->broken || cg->aborted) continue;
    if (!tdist__list_empty(&ch->ops) || ch->nunverified) moved |= chan_pass(cg, ch);
    tdist__cpu_sc_bells(ch, ctx);
  }
  return moved;
}

void tdist__cpu_sc_abort(cpu_group_t *cg) {
  cpu_sc_t *ch = cg->sc;
  if (!ch) return;
  tdist__cpu_sc_ovf_done(ch);
  tdist__cpu_sc_ovf_forget(cg->ctx, ch->uid);
  ch->broken = 1;
  ch->nunverified = 0;
  ch->unsigned_op = NULL;
  cg->sc_lag = cg->sc_waited = 0;
}

void tdist__cpu_sc_forget(cpu_op_t *op) {
  struct cpu_sc_opst *s = &op->sc;
  if (!s->on) return;
  cpu_sc_t *ch = op->cg->sc;
  if (ch && ch->unsigned_op == op) {
    tdist__list_t *nx = s->link.next;
    ch->unsigned_op = nx == &ch->ops ? NULL : tdist__list_entry(nx, cpu_op_t, sc.link);
  }
  if (tdist__list_linked(&s->link)) tdist__list_remove(&s->link);
  if (s->tmp) tdist__cpu_buf_put(op->cg->ctx, s->tmp);
  if (s->ltmp) tdist__cpu_buf_put(op->cg->ctx, s->ltmp);
  s->tmp = s->ltmp = NULL;
  s->on = 0;
}

void tdist__cpu_sc_engine_msg(cpu_group_t *cg, cpu_op_t *op, const cpu_hdr_t *h, int src) {
  if (tdist__cpu_check_coll(cg, op, h, src)) return; /* reported, naming both */
  tdist__cpu_mismatch(cg, op->cseq,
                      "mismatch at collective #%" PRIu64 ": rank %d (world rank %d) ran %s over "
                      "messages where rank %d (world rank %d) runs it over shared memory",
                      op->cseq, src, tdist__cpu_wrank_of(cg, src), tdist_op_name(op->type),
                      cg->rank, tdist__cpu_wrank_of(cg, cg->rank));
}

int tdist__cpu_sc_needs(const cpu_group_t *cg, int r) {
  const cpu_sc_t *ch = cg->sc;
  if (!ch || ch->broken || r == ch->me) return 0;
  sc_sig_t g;
  for (int i = 0; i < ch->nunverified; i++)
    if (!sig_read(ch, r, ch->unverified[(ch->uv_head + i) % SC_LAG].cseq, &g)) return 1;
  const tdist__list_t *n;
  tdist__list_foreach(n, &ch->ops) {
    const cpu_op_t *op = tdist__list_entry(n, cpu_op_t, sc.link);
    if (!sig_read(ch, r, op->cseq, &g)) return 1;
    /* Not started here yet: r posted it; what it gives is checked when
     * it starts (a member that left in order finished its part of it). */
    if (!op->sc.started || op->sc.nsteps == UINT64_MAX) continue;
    /* Its stream written to the end (in its slots, or in an overflow
     * memfd: sc_ovf.c), and past every step this member still has to
     * write (its done frees our slots). */
    uint64_t last = op->sc.s0 + sc_steps_of(ch, g.total);
    const sc_step_t *h = sc_line(ch, r, last + ch->L - 1);
    int ovf = atomic_load_explicit(&ch->rg[r].sig[op->cseq % SC_H].ovf, memory_order_acquire) != 0;
    if (last > op->sc.s0 && !ovf && atomic_load_explicit(&h->step, memory_order_acquire) < last)
      return 1;
    if (atomic_load_explicit(&ch->rg[r].ctl->done, memory_order_acquire) <
        op->sc.s0 + op->sc.nsteps)
      return 1;
  }
  return 0;
}
