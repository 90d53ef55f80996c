/*
 * sc_data.c - what each shared-memory collective moves (sc.h): every
 * member's stream, the part of it each member reads, and how a step's
 * pieces become the result.
 *
 * Streams (L = count * element size, n members):
 *   all_reduce, reduce    each member's input, L bytes (a PREMUL_SUM input
 *                         is scaled and a bool input made 0/1 as it is
 *                         written, as algos.c does to its copy)
 *   broadcast             the root's buffer; the others give nothing
 *   all_gather, gather    each member's block (gather: the root gives
 *                         nothing, it copies its own block locally)
 *   scatter               the root's n blocks
 *   reduce_scatter        each member's n blocks (n * L)
 *   all_to_all            each member's n blocks
 *   barrier               nothing
 *   all_to_all_v          the member's send counts (n u64), where each
 *                         block lies in it if it is read in place (n u64,
 *                         0: not) and its group's live word and token, at
 *                         the start of its first slot (a2av_pre), and in
 *                         every slot one chunk per other member
 *                         (a2av_chunk): every reader reads its part of
 *                         every step, none waits through the others'
 *                         blocks, and the block to itself never enters the
 *                         segment (its stream's length is its steps times
 *                         the slot size). A block of TDIST_CPU_SC_CMA_BYTES
 *                         and up (ch->cma) is not in the slots: its reader
 *                         reads a piece of it a step straight from
 *                         the giver's buffer (process_vm_readv, cma.c),
 *                         and checks the giver's live word after each
 *                         piece; the giver completes only once every
 *                         member consumed every step (it read all). Only
 *                         where the members are more than twice the CPUs
 *                         by default (sc.h, lend: why).
 *   all_gather_v          the member's block
 *   reduce_scatter_v      the member's recv counts (n u64), then its input
 * Reductions read every member's piece of a step, in rank order (lower
 * ranks first, as the engine's trees combine them), into the output a few
 * KiB at a time, so the partial result stays in the first-level cache:
 * every member computes the same bits. A member's own block (all_gather,
 * gather's root, scatter's root, all_to_all, the v-ops) is copied locally
 * at post and never goes through the segment.
 *
 * Threads: engine lock (sc_op.c calls in).
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "util/alloc.h"
#include "util/error.h"
#include "cpu/base/base.h"
#include "cpu/transport/transport.h"
#include "cpu/engine/engine.h"
#include "cpu/segment/sc.h"

/* base + el elements, without arithmetic on a NULL buffer (an empty one). */
static uint8_t *elem(const void *base, size_t el, size_t es) {
  return base && el ? (uint8_t *)base + el * es : (uint8_t *)base;
}
static size_t displ(const size_t *displs, int j, size_t packed) {
  return displs ? displs[j] : packed;
}
static uint64_t min64(uint64_t a, uint64_t b) { return a < b ? a : b; }
static uint64_t max64(uint64_t a, uint64_t b) { return a > b ? a : b; }

/* Member m's stream length by the op's arguments (fixed-size ops; a v-op's
 * come with the signatures). */
static inline uint64_t total_of(const cpu_op_t *op, int m) {
  uint64_t L = (uint64_t)op->count * op->es, n = (uint64_t)op->size;
  switch (op->type) {
  case TDIST_OP_ALL_REDUCE:
  case TDIST_OP_REDUCE:
  case TDIST_OP_ALL_GATHER: return L;
  case TDIST_OP_BROADCAST: return m == op->root ? L : 0;
  case TDIST_OP_GATHER: return m == op->root ? 0 : L;
  case TDIST_OP_SCATTER: return m == op->root ? n * L : 0;
  case TDIST_OP_REDUCE_SCATTER:
  case TDIST_OP_ALL_TO_ALL: return n * L;
  default: return 0; /* barrier; v-ops: from the signatures */
  }
}

/* all_to_all_v's prefix: counts, block addresses, live word and token. */
static size_t a2av_pre(size_t n) { return 16 * n + 16; }

size_t tdist__cpu_sc_a2av_chunk(const cpu_op_t *op) {
  size_t F = op->cg->sc->F, n = (size_t)op->size;
  return (F - a2av_pre(n)) / (n - 1) / op->es * op->es; /* F >= 4096, n <= 64: at least 48 */
}

/* ---- lending: a block read in place -------------------------------------------------
 *
 * An all_gather member whose block is TDIST_CPU_SC_LEND_BYTES or more may
 * lend it (lend_now, below, decides): each step's line says where that
 * step's bytes lie in the member's
 * buffer (sc_lent_t, len with SC_LEN_LENT) and its readers copy them from
 * there with process_vm_readv, checking its live word after each piece,
 * as the engine's single copy does (cma.c). Why: a slot's lines are
 * written by one process and read by another every op, so every write
 * first takes each line back from the other's cache; on the 2-core CI VM
 * (2026-12-01) writing 64 KiB into lines the other had read took 5-33 us
 * against 1.7 for a private copy (bench/cpu/shared_write.c), where Open
 * MPI's reader copies once, from the giver's buffer, and nobody writes a
 * shared line. A lent block never enters the segment: only its lines
 * are written. The lender completes once every member consumed every step
 * (sc_op.c, finish): its buffer goes back to the caller only after all of
 * it was read. A large all_reduce (two phases, TDIST_CPU_SC_LEND_REDUCE_BYTES)
 * lends too: its line also says where the step lies in the member's
 * output, and each member reads its share of the others' inputs into a
 * private buffer, reduces, publishes red, then reads the others' shares of
 * the result from their outputs (sc_op.c, consume_two). Only these two:
 * every member of them waits for the others anyway, where a broadcast root
 * would now wait for its readers (sc.h: a giver never waits for its
 * readers for long). */

/* Lend now? Measured per kind and size class (sc.h, TDIST_CPU_SC_LEND):
 * neither lane wins on every host, nor on one host in every state. On the
 * 2026-12-01 machine some runs of the same binary had the slots at 100 us
 * for a 1 MiB all_reduce at n = 2 and lending at 250 (Open MPI 175), other
 * runs 400-480 against 250; a 1 MiB all_gather 121 against 190, or 490
 * against 190. SC_TUNE_LOOK ops of every SC_TUNE_EVERY of a class look
 * (the first half through the slots, the second lent); each member
 * counts the same ops, so the members look at the same lane at once. The
 * lane is the giver's choice alone (its lines tell its readers), so
 * members that decide apart still agree on the data. */
/* op's kind and size class: its tuner entry (c: the class). */
static struct sc_tune *tune_of(const cpu_op_t *op, unsigned *c) {
  size_t bytes = op->count * op->es;
  *c = 0;
  while (*c + 1 < SC_TUNE_CLASSES && ((size_t)32768 << (*c + 1)) <= bytes)
    (*c)++;
  return &op->cg->sc->tune[op->type == TDIST_OP_ALL_REDUCE][*c];
}

static int lend_now(cpu_op_t *op) {
  int64_t mode = tdist__param_CpuScLend();
  if (mode >= 0) return mode > 0;
  /* Members that outnumber the CPUs take turns on them: a lender waits
   * for every reader's system calls, each under its engine lock, and the
   * lent lane lost at every size measured (four ranks on two cores,
   * 2026-12-01: all_gather 64 KiB-16 MiB 1.5-8x the slots' time, all_reduce
   * 1-16 MiB 1.6-2.8x), so the look's lent ops (and the rare wrong pick
   * its noise made) were only a cost: the 1 MiB all_gather's mean was
   * 15-25 % above 7bb5725's, which had no lending. An all_to_all_v lends
   * by its own rule (sc.h, lend: from more than two members a CPU). */
  if (sc_crowded(op->cg->sc)) return 0;
  unsigned c;
  struct sc_tune *t = tune_of(op, &c);
  /* The first ops of a class go through the slots: they warm its pages
   * and buffers, and a class of few ops (the largest, often) is not worth
   * a look (at 16 and 64 MiB the slots were within 10 % of lending or
   * ahead of it in every state measured). The look starts after
   * TDIST_CPU_SC_TUNE_SKIP of them (sc.h). */
  uint32_t skip = (uint32_t)tdist__param_CpuScTuneSkip() % (SC_TUNE_EVERY - SC_TUNE_LOOK);
  uint32_t k = t->seen++ % SC_TUNE_EVERY;
  if (k < skip || k >= skip + SC_TUNE_LOOK) return t->lend;
  /* Half the look through the slots, then half lent, each half's first op
   * untimed: a lane's ops in a row, as it would run them (a slot op right
   * after a lent one meets lines the others have not just read). */
  k -= skip;
  int lent = k >= SC_TUNE_LOOK / 2;
  if (k == 0) {
    t->best[0] = t->best[1] = INT64_MAX;
    t->cut = 0;
  }
  if (lent && t->cut) return t->lend; /* the lent half was cut: not timed */
  if (k % (SC_TUNE_LOOK / 2)) {
    op->sc.tune = 1 + lent;
    op->sc.t0 = tdist__now_ns();
  }
  return lent;
}

void tdist__cpu_sc_tune_took(cpu_op_t *op, int64_t ns) {
  unsigned c;
  struct sc_tune *t = tune_of(op, &c);
  int lent = op->sc.tune - 1;
  if (ns < t->best[lent]) t->best[lent] = ns;
  if (lent && t->best[0] != INT64_MAX && ns / SC_TUNE_CUT > t->best[0]) t->cut = 1;
  int lend = t->best[1] < t->best[0];
  if (lend != t->lend && t->best[0] != INT64_MAX && t->best[1] != INT64_MAX) {
    TDIST_INFO(CPU, "sc: %s of %d..%d KiB now %s (fastest %lld ns lent, %lld through the slots)",
               tdist_op_name(op->type), 32 << c, 64 << c, lend ? "lent" : "through the slots",
               (long long)t->best[1], (long long)t->best[0]);
    t->lend = lend;
  }
}

int tdist__cpu_sc_lends(cpu_op_t *op) {
  cpu_sc_t *ch = op->cg->sc;
  int reduce = op->type == TDIST_OP_ALL_REDUCE;
  int64_t min = reduce ? tdist__param_CpuScLendReduceBytes() : tdist__param_CpuScLendBytes();
  if (!ch || !ch->cma || !op->cg->live || min <= 0 || (uint64_t)op->count * op->es < (uint64_t)min)
    return 0;
  /* all_reduce: in two phases, its input given unscaled (read as it is). */
  return (op->type == TDIST_OP_ALL_GATHER || (reduce && op->sc.direct)) && lend_now(op);
}

void tdist__cpu_sc_lent_at(const cpu_op_t *op, uint64_t off, sc_lent_t *out) {
  const uint8_t *in = op->sc.tmp ? op->sc.tmp : (const uint8_t *)op->args->sendbuf;
  out->addr = (uint64_t)(uintptr_t)in + off;
  out->out = op->type == TDIST_OP_ALL_REDUCE ? (uint64_t)(uintptr_t)op->args->recvbuf + off : 0;
  out->word = (uint64_t)(uintptr_t)op->cg->live;
  out->token = op->cg->live_token;
}

/* Bytes [off, off + len) of what member m lends (where: d) into dst + off,
 * read in place (single copy), its live word checked after: 0, or -1 with
 * the group's failure reported. */
static int read_in_place(cpu_sc_t *ch, cpu_op_t *op, int m, const cpu_rma_desc_t *d, uint64_t off,
                         uint8_t *dst, size_t len) {
  char why[160];
  int aborted = 0;
  if (tdist__cpu_cma_read_range(ch->pid[m], dst, d, (size_t)off, len, why, sizeof(why), &aborted) ==
          0 &&
      tdist__cpu_cma_read_end(ch->pid[m], d, why, sizeof(why), &aborted) == 0)
    return 0;
  tdist__cpu_cma_failed(op->cg, tdist__cpu_wrank_of(op->cg, m), aborted, why);
  return -1;
}

int tdist__cpu_sc_lent_read(cpu_sc_t *ch, cpu_op_t *op, int m, const sc_lent_t *l, uint64_t addr,
                            uint8_t *dst, size_t len) {
  cpu_rma_desc_t d = {.addr = addr, .len = len, .word = l->word, .token = l->token};
  return read_in_place(ch, op, m, &d, 0, dst, len);
}

/* Where writer m's chunk for destination q sits in its slot: after the
 * prefix's room, one chunk per other member, in rank order. */
static size_t a2av_at(const cpu_op_t *op, int m, int q) {
  return a2av_pre((size_t)op->size) + (size_t)(q < m ? q : q - 1) * tdist__cpu_sc_a2av_chunk(op);
}

/* Bytes of a block read in place per step (sc.h, SC_CMA_STEP): the same on
 * every member (it depends on the group's size only), a multiple of 4 KiB
 * and of every element size. */
static size_t cma_piece(const cpu_op_t *op) {
  size_t p = SC_CMA_STEP / (size_t)(op->size - 1);
  p = p < (256u << 10) ? (256u << 10) : p > (4u << 20) ? (4u << 20) : p;
  return p / 4096 * 4096;
}

/* May this member lend any all_to_all_v block (single copy works, it
 * lends, and its group has a live word)? Asked once per op; a2av_lent
 * takes the answer. */
static int a2av_lending(const cpu_op_t *op) {
  return op->cg->sc->cma && op->cg->sc->lend && op->cg->live;
}

/* Is this member's block of `bytes` for member q read in place? lending:
 * a2av_lending(op). */
static int a2av_lent(const cpu_op_t *op, int lending, int q, uint64_t bytes) {
  return lending && q != op->rank && bytes > 0 && bytes >= (uint64_t)tdist__param_CpuScCmaBytes();
}

int tdist__cpu_sc_a2av_lends(const cpu_op_t *op) {
  int lending = a2av_lending(op);
  for (int q = 0; lending && q < op->size; q++)
    if (a2av_lent(op, lending, q, op->args->scounts[q] * op->es)) return 1;
  return 0;
}

size_t tdist__cpu_sc_a2av_piece(const cpu_sc_t *ch, const cpu_op_t *op, int m) {
  return ch->desc[m].addr ? cma_piece(op) : tdist__cpu_sc_a2av_chunk(op);
}

/* This member's v-op stream length. */
static uint64_t my_v_total(const cpu_op_t *op) {
  const tdist_backend_args_t *a = op->args;
  uint64_t n = (uint64_t)op->size, sum = 0;
  switch (op->type) {
  case TDIST_OP_ALL_TO_ALL_V: {
    uint64_t c = tdist__cpu_sc_a2av_chunk(op), steps = 1;
    int lending = a2av_lending(op);
    for (int q = 0; q < op->size; q++) {
      uint64_t bl = a->scounts[q] * op->es, p = a2av_lent(op, lending, q, bl) ? cma_piece(op) : c;
      uint64_t st = (bl + p - 1) / p;
      if (q != op->rank && st > steps) steps = st;
    }
    return steps * op->cg->sc->F;
  }
  case TDIST_OP_REDUCE_SCATTER_V:
    for (int j = 0; j < op->size; j++)
      sum += a->rcounts[j];
    return 8 * n + sum * op->es;
  default: return (uint64_t)op->count * op->es; /* all_gather_v */
  }
}

/* Bytes this member's op writes into its receive buffer (for
 * TDIST_CPU_SC_STREAM_BYTES). */
static uint64_t out_bytes(const cpu_op_t *op) {
  const tdist_backend_args_t *a = op->args;
  uint64_t L = (uint64_t)op->count * op->es, n = (uint64_t)op->size, sum = 0;
  switch (op->type) {
  case TDIST_OP_ALL_GATHER:
  case TDIST_OP_ALL_TO_ALL: return L * n;
  case TDIST_OP_GATHER: return op->rank == op->root ? L * n : 0;
  case TDIST_OP_REDUCE: return op->rank == op->root ? L : 0;
  case TDIST_OP_ALL_TO_ALL_V:
  case TDIST_OP_ALL_GATHER_V:
    for (int m = 0; m < op->size; m++)
      sum += a->rcounts[m];
    return sum * op->es;
  case TDIST_OP_BARRIER: return 0;
  default: return L; /* broadcast, scatter, all_reduce, reduce_scatter */
  }
}

/* The local part: copied at post (what algos.c / algos_v.c copy at setup),
 * or, for the own block of an all_to_all or all_to_all_v larger than a
 * slot (disjoint buffers: the core refuses others), a slot's worth at a
 * time while the op waits for the others (tdist__cpu_sc_local_step): the
 * op's first pieces are then consumed as soon as they are in (1 MiB
 * all_to_all_v, Zipf split, n = 2: rank 0's own block is 70 % of it). */
static void local_later(cpu_op_t *op, uint8_t *dst, const uint8_t *src, size_t len) {
  const cpu_sc_t *ch = op->cg->sc;
  if (ch && len > ch->F) {
    op->sc.lc_dst = dst;
    op->sc.lc_src = src;
    op->sc.lc_left = len;
  } else if (len) {
    tdist__cpu_move(dst, src, len);
  }
}

int tdist__cpu_sc_local_step(cpu_op_t *op, int all) {
  struct cpu_sc_opst *s = &op->sc;
  if (!s->lc_left) return 0;
  size_t l = all ? s->lc_left : min64(op->cg->sc->F, s->lc_left);
  sc_out_copy(op, s->lc_dst, s->lc_src, l);
  s->lc_dst += l;
  s->lc_src += l;
  s->lc_left -= l;
  return 1;
}

void tdist__cpu_sc_plan_local(cpu_op_t *op) {
  const tdist_backend_args_t *a = op->args;
  size_t es = op->es, L = op->count * es, r = (size_t)op->rank, own = 0, so = 0;
  uint8_t *rb = a->recvbuf;
  const uint8_t *sb = a->sendbuf;
  switch (op->type) {
  case TDIST_OP_ALL_GATHER:
    /* Out of place: a slot at a time as it is given (tdist__cpu_sc_consume),
     * while that part of the input is still in cache. */
    if (L && rb + r * L != sb && (!op->cg->sc || L <= op->cg->sc->F))
      tdist__cpu_move(rb + r * L, sb, L);
    break;
  case TDIST_OP_GATHER:
    if (L && op->rank == op->root && rb + r * L != sb) tdist__cpu_move(rb + r * L, sb, L);
    break;
  case TDIST_OP_SCATTER:
    if (L && op->rank == op->root) tdist__cpu_move(rb, sb + r * L, L);
    break;
  case TDIST_OP_ALL_TO_ALL:
    if (L) local_later(op, rb + r * L, sb + r * L, L);
    break;
  case TDIST_OP_ALL_TO_ALL_V:
    for (size_t j = 0; j < r; j++) {
      own += a->rcounts[j];
      so += a->scounts[j];
    }
    if (a->rcounts[r])
      local_later(op, elem(rb, displ(a->rdispls, (int)r, own), es),
                  elem(sb, displ(a->sdispls, (int)r, so), es), a->rcounts[r] * es);
    break;
  case TDIST_OP_ALL_GATHER_V:
    for (size_t j = 0; j < r; j++)
      own += a->rcounts[j];
    if (op->count)
      tdist__cpu_move(elem(rb, displ(a->rdispls, (int)r, own), es), sb, op->count * es);
    break;
  default: break;
  }
}

/* Input ranges that an output written step by step could overwrite before
 * they are read: copied aside first (the engine copies every input at
 * setup). In-place all_reduce, reduce and reduce_scatter (the output where
 * the input's own part is) are safe: a step's input is written to the
 * segment before that step's output is written. */
static int overlaps(const void *a, size_t al, const void *b, size_t bl) {
  return al && bl && (const uint8_t *)a < (const uint8_t *)b + bl &&
         (const uint8_t *)b < (const uint8_t *)a + al;
}

void tdist__cpu_sc_plan(cpu_op_t *op) {
  struct cpu_sc_opst *s = &op->sc;
  int root = op->rank == op->root;
  switch (op->type) {
  case TDIST_OP_BROADCAST: s->role = root ? SC_ROLE_GIVE : SC_ROLE_ROOT; break;
  case TDIST_OP_REDUCE:
  case TDIST_OP_GATHER: s->role = root ? SC_ROLE_ALL : SC_ROLE_GIVE; break;
  case TDIST_OP_SCATTER: s->role = root ? SC_ROLE_GIVE : SC_ROLE_ALL; break;
  default: s->role = SC_ROLE_ALL; break;
  }
  s->total = tdist_backend_op_is_v(op->type) ? my_v_total(op) : total_of(op, op->rank);
  /* Not an all_reduce's: its member writes its own share of every step
   * with plain stores as it reduces, and streaming the others' shares made
   * a 16 MiB one at n = 2 slower, not faster (sc.h, STREAM_BYTES). */
  int64_t stream = tdist__param_CpuScStreamBytes();
  s->stream = stream > 0 && op->type != TDIST_OP_ALL_REDUCE && out_bytes(op) >= (uint64_t)stream;
}

int tdist__cpu_sc_a2av_plain(cpu_op_t *op) {
  const tdist_backend_args_t *a = op->args;
  const cpu_sc_t *ch = op->cg->sc;
  size_t es = op->es, c = tdist__cpu_sc_a2av_chunk(op);
  int lending = a2av_lending(op);
  if (a->rcounts[op->rank] * es > ch->F) return 0;
  for (int q = 0; q < op->size; q++) {
    uint64_t bl = a->scounts[q] * es;
    if (q != op->rank && (bl > c || a2av_lent(op, lending, q, bl))) return 0;
  }
  struct cpu_sc_opst *s = &op->sc;
  int64_t stream = tdist__param_CpuScStreamBytes();
  s->role = SC_ROLE_ALL;
  s->total = ch->F; /* one step: my_v_total's */
  /* Its output is its own block and one chunk from each other member,
   * under two slots: summed only where that could reach the size. */
  s->stream = stream > 0 && 2 * ch->F >= (uint64_t)stream && out_bytes(op) >= (uint64_t)stream;
  return 1;
}

size_t tdist__cpu_sc_tmp_bytes(const cpu_op_t *op) {
  const tdist_backend_args_t *a = op->args;
  size_t L = op->count * op->es, in = 0;
  const uint8_t *out = a->recvbuf, *sb = a->sendbuf;
  int in_place = out == sb;
  switch (op->type) {
  case TDIST_OP_ALL_REDUCE: in = L; break;
  case TDIST_OP_REDUCE: in = op->rank == op->root ? L : 0; break;
  case TDIST_OP_REDUCE_SCATTER:
    in = (size_t)op->size * L;
    in_place = sb && out == sb + (size_t)op->rank * L;
    break;
  default: break;
  }
  return in && !in_place && overlaps(sb, in, out, L) ? in : 0;
}

int tdist__cpu_sc_plan_post(cpu_op_t *op) {
  struct cpu_sc_opst *s = &op->sc;
  tdist__cpu_sc_plan(op);
  /* The input an output written step by step could overwrite first. */
  size_t in = tdist__cpu_sc_tmp_bytes(op);
  if (in) {
    s->tmp = tdist__cpu_buf_get(op->cg->ctx, in);
    if (!s->tmp) return TDIST_ERR_NO_MEMORY;
    tdist__cpu_copy(s->tmp, op->args->sendbuf, in);
  }
  tdist__cpu_sc_plan_local(op);
  return 0;
}

uint64_t tdist__cpu_sc_ranges(cpu_sc_t *ch, const cpu_op_t *op) {
  int n = op->size, me = op->rank, fixed = !tdist_backend_op_is_v(op->type);
  uint64_t L = (uint64_t)op->count * op->es, mx = 0;
  for (int m = 0; m < n; m++) {
    uint64_t lo = 0, hi = 0;
    if (fixed) ch->totals[m] = total_of(op, m);
    mx = max64(mx, ch->totals[m]);
    switch (op->type) {
    case TDIST_OP_ALL_REDUCE:
    case TDIST_OP_REDUCE: hi = op->sc.role == SC_ROLE_ALL ? L : 0; break;
    case TDIST_OP_BROADCAST: hi = m == op->root && me != op->root ? L : 0; break;
    case TDIST_OP_ALL_GATHER:
    case TDIST_OP_GATHER: hi = m != me && op->sc.role == SC_ROLE_ALL ? L : 0; break;
    case TDIST_OP_SCATTER:
      if (m == op->root && me != op->root) lo = (uint64_t)me * L, hi = lo + L;
      break;
    case TDIST_OP_REDUCE_SCATTER: lo = (uint64_t)me * L, hi = lo + L; break;
    case TDIST_OP_ALL_TO_ALL:
      if (m != me) lo = (uint64_t)me * L, hi = lo + L;
      break;
    case TDIST_OP_ALL_GATHER_V: hi = m != me ? ch->totals[m] : 0; break;
    default: break; /* barrier; a2av and rsv: tdist__cpu_sc_prefixes */
    }
    ch->lo[m] = lo;
    ch->hi[m] = hi;
  }
  return mx;
}

/* all_to_all_v's step j: the count array (step 0), then the chunk of each
 * destination's block, each at its place in the slot. */
static void a2av_produce(const cpu_op_t *op, uint64_t j, uint8_t *dst) {
  const tdist_backend_args_t *a = op->args;
  size_t es = op->es, n = (size_t)op->size, c = tdist__cpu_sc_a2av_chunk(op), so = 0;
  int lending = a2av_lending(op);
  if (j == 0) {
    for (size_t q = 0; q < n; q++) {
      uint64_t v = a->scounts[q], bl = v * es, at = 0;
      if (a2av_lent(op, lending, (int)q, bl))
        at = (uint64_t)(uintptr_t)a->sendbuf + displ(a->sdispls, (int)q, so) * es;
      so += a->scounts[q];
      memcpy(dst + 8 * q, &v, 8);
      memcpy(dst + 8 * (n + q), &at, 8);
    }
    uint64_t live[2] = {(uint64_t)(uintptr_t)op->cg->live, op->cg->live_token};
    memcpy(dst + 16 * n, live, 16);
    so = 0;
  }
  for (size_t q = 0; q < n; q++) {
    uint64_t bl = a->scounts[q] * es, lo = j * c;
    size_t bo = displ(a->sdispls, (int)q, so) * es;
    so += a->scounts[q];
    if (q == (size_t)op->rank || lo >= bl || a2av_lent(op, lending, (int)q, bl)) continue;
    tdist__cpu_copy(dst + a2av_at(op, op->rank, (int)q), (const uint8_t *)a->sendbuf + bo + lo,
                    min64(c, bl - lo));
  }
}

void tdist__cpu_sc_produce(const cpu_op_t *op, uint64_t off, uint8_t *dst, size_t len) {
  const tdist_backend_args_t *a = op->args;
  size_t es = op->es, n = (size_t)op->size;
  const uint8_t *base = op->sc.tmp ? op->sc.tmp : a->sendbuf;
  if (op->type == TDIST_OP_ALL_TO_ALL_V) {
    a2av_produce(op, off / op->cg->sc->F, dst);
    return;
  }
  if (op->type == TDIST_OP_BROADCAST) base = a->recvbuf;
  if (!tdist__cpu_sc_has_prefix(op)) {
    if (len) tdist__cpu_copy(dst, base + off, len);
    if (tdist__cpu_sc_scales(op)) tdist__cpu_scale(dst, len / es, op->dtype, a->scalar);
    return;
  }
  /* reduce_scatter_v: the count array first, then the data. */
  const size_t *counts = a->rcounts;
  size_t pre = 8 * n, done = 0;
  while (done < len && off + done < pre) {
    uint64_t v = counts[(off + done) / 8];
    size_t at = (off + done) % 8, l = min64(8 - at, len - done);
    memcpy(dst + done, (const uint8_t *)&v + at, l);
    done += l;
  }
  if (done == len) return;
  uint64_t d = off + done - pre; /* offset in the data part */
  tdist__cpu_copy(dst + done, base + d, len - done);
  if (tdist__cpu_sc_scales(op))
    tdist__cpu_scale(dst + done, (len - done) / es, op->dtype, a->scalar);
}

/* ---- v-op counts ---------------------------------------------------------------- */

static int count_mismatch(cpu_group_t *cg, const cpu_op_t *op, int src, uint64_t sent, size_t want,
                          const char *theirs, const char *mine) {
  tdist__cpu_mismatch(cg, op->cseq,
                      "mismatch at collective #%" PRIu64 ": rank %d (world rank %d) sent %" PRIu64
                      " %s to rank %d (world rank %d) in %s (its %s) but rank %d expects %zu "
                      "from rank %d (its %s)",
                      op->cseq, src, tdist__cpu_wrank_of(cg, src), sent,
                      tdist_dtype_name(op->dtype), cg->rank, tdist__cpu_wrank_of(cg, cg->rank),
                      tdist_op_name(op->type), theirs, cg->rank, want, src, mine);
  return -1;
}

/* all_to_all_v: member m sent this member `sent` elements where its
 * recv_counts[m] says otherwise. -1. */
static int a2av_mismatch(const cpu_op_t *op, int m, uint64_t sent) {
  char t[40], r[40];
  snprintf(t, sizeof(t), "send_counts[%d]", op->rank);
  snprintf(r, sizeof(r), "recv_counts[%d]", m);
  return count_mismatch(op->cg, op, m, sent, op->args->rcounts[m], t, r);
}

/* Member m's all_to_all_v count prefix at pc (the start of its step 0):
 * its count for this member, checked against recv_counts[m], and where its
 * block for this member lies (*d: addr 0, in m's slot at its chunk; else
 * in m's buffer, read in place with m's live word; len its bytes). 0, or
 * -1 (a mismatch, reported). */
static int a2av_prefix(const cpu_op_t *op, int m, const uint8_t *pc, cpu_rma_desc_t *d) {
  size_t pre = 8 * (size_t)op->size, me = (size_t)op->rank;
  uint64_t c, live[2];
  memcpy(&c, pc + 8 * me, 8);
  if (c != op->args->rcounts[m]) return a2av_mismatch(op, m, c);
  memset(d, 0, sizeof(*d));
  memcpy(&d->addr, pc + pre + 8 * me, 8); /* != 0 only where ch->cma, agreed at setup */
  memcpy(live, pc + 2 * pre, 16);
  d->word = live[0];
  d->token = live[1];
  d->len = c * op->es;
  return 0;
}

int tdist__cpu_sc_prefixes(cpu_sc_t *ch, cpu_op_t *op, const uint8_t *const *pcs) {
  const tdist_backend_args_t *a = op->args;
  int n = op->size, me = op->rank;
  size_t es = op->es;
  char t[40];
  uint64_t pre = 8 * (uint64_t)n;
  if (op->type == TDIST_OP_ALL_TO_ALL_V) {
    /* [lo, hi) is then the part of member m's block for this member, and
     * desc[m] where it lies when it is read in place. */
    for (int m = 0; m < n; m++) {
      ch->lo[m] = ch->hi[m] = 0;
      memset(&ch->desc[m], 0, sizeof(ch->desc[m]));
      if (m == me) continue;
      if (a2av_prefix(op, m, pcs[m], &ch->desc[m]) != 0) return -1;
      ch->hi[m] = ch->desc[m].len;
    }
    return 0;
  }
  /* reduce_scatter_v: every member's recv counts must be this member's. */
  uint64_t before = 0;
  for (int j = 0; j < me; j++)
    before += a->rcounts[j];
  for (int m = 0; m < n; m++) {
    uint64_t c[SC_MAX_RANKS];
    memcpy(c, pcs[m], pre);
    for (int j = 0; j < n; j++) {
      if (c[j] == a->rcounts[j]) continue;
      if (j == me) {
        snprintf(t, sizeof(t), "recv_counts[%d]", me);
        return count_mismatch(op->cg, op, m, c[j], a->rcounts[j], t, t);
      }
      tdist__cpu_mismatch(op->cg, op->cseq,
                          "mismatch at collective #%" PRIu64
                          ": rank %d (world rank %d)'s recv_counts[%d] is %" PRIu64
                          " but rank %d (world rank %d)'s is %zu in %s",
                          op->cseq, m, tdist__cpu_wrank_of(op->cg, m), j, c[j], me,
                          tdist__cpu_wrank_of(op->cg, me), a->rcounts[j], tdist_op_name(op->type));
      return -1;
    }
    ch->lo[m] = pre + before * es;
    ch->hi[m] = ch->lo[m] + (uint64_t)op->count * es;
  }
  return 0;
}

/* ---- consuming a step ------------------------------------------------------------ */

/* out[0, len) = pcs[0] op pcs[1] op ... (every member's piece at offset
 * `at`), a block at a time so the partial result stays in cache. */
void tdist__cpu_sc_reduce(const cpu_op_t *op, uint8_t *out, const uint8_t *const *pcs, size_t at,
                          size_t len) {
  size_t blk = 4096;
  unsigned sh =
      (unsigned)__builtin_ctzll(op->es); /* element sizes are powers of two: no division */
  for (size_t o = 0; o < len; o += blk) {
    size_t l = min64(blk, len - o);
    /* memmove: GCC expands a memcpy of at most 4 KiB inline, 8 bytes a
     * turn (128 turns for 1 KiB); the C library's moves 32 at a time. */
    tdist__cpu_move(out + o, pcs[0] + at + o, l);
    for (int m = 1; m < op->size; m++)
      tdist__cpu_reduce(out + o, pcs[m] + at + o, l >> sh, op->dtype, op->redop);
  }
  if (op->redop == TDIST_AVG) tdist__cpu_divide(out, len >> sh, op->dtype, op->size);
}

void tdist__cpu_sc_reduce_share(const cpu_op_t *op, uint8_t *out, const uint8_t *mine,
                                const uint8_t *const *pcs, size_t at, size_t len) {
  size_t es = op->es, blk = 4096;
  for (size_t o = 0; o < len; o += blk) {
    size_t l = min64(blk, len - o);
    if (out != mine) tdist__cpu_copy(out + o, mine + o, l);
    for (int m = 0; m < op->size; m++)
      if (m != op->rank) tdist__cpu_reduce(out + o, pcs[m] + at + o, l / es, op->dtype, op->redop);
  }
  if (op->redop == TDIST_AVG) tdist__cpu_divide(out, len / es, op->dtype, op->size);
}

/* Where member m's bytes of this member's range land. */
static uint8_t *dest_of(const cpu_op_t *op, int m) {
  const tdist_backend_args_t *a = op->args;
  size_t es = op->es, L = op->count * es, ro = 0;
  switch (op->type) {
  case TDIST_OP_ALL_GATHER:
  case TDIST_OP_GATHER:
  case TDIST_OP_ALL_TO_ALL: return elem(a->recvbuf, (size_t)m * L, 1);
  case TDIST_OP_ALL_TO_ALL_V:
  case TDIST_OP_ALL_GATHER_V:
    for (int j = 0; j < m; j++)
      ro += a->rcounts[j];
    return elem(a->recvbuf, displ(a->rdispls, m, ro), es);
  default: return a->recvbuf; /* broadcast, scatter, the reductions */
  }
}

int tdist__cpu_sc_consume(cpu_sc_t *ch, cpu_op_t *op, uint64_t j, const uint8_t *const *pcs,
                          uint64_t lent) {
  uint64_t F = ch->F, s_lo = j * F, s_hi = s_lo + F;
  int reducing = tdist_backend_op_is_reducing(op->type);
  if (op->type == TDIST_OP_ALL_TO_ALL_V) { /* this member's piece of each block */
    for (int m = 0; m < op->size; m++) {
      size_t c = tdist__cpu_sc_a2av_piece(ch, op, m);
      if (!pcs[m] || j * c >= ch->hi[m]) continue;
      size_t len = (size_t)min64(c, ch->hi[m] - j * c);
      if (ch->desc[m].addr) {
        if (read_in_place(ch, op, m, &ch->desc[m], j * c, dest_of(op, m), len) != 0) return -1;
      } else {
        sc_out_copy(op, dest_of(op, m) + j * c, pcs[m] + a2av_at(op, m, op->rank), len);
      }
    }
    return 0;
  }
  for (int m = 0; m < op->size; m++) {
    if (!pcs[m]) continue;
    uint64_t lo = max64(ch->lo[m], s_lo), hi = min64(ch->hi[m], s_hi);
    if (lo >= hi) continue;
    if (reducing) {
      /* Every member's piece covers the same range (equal layouts). */
      tdist__cpu_sc_reduce(op, elem(op->args->recvbuf, lo - ch->lo[m], 1), pcs, lo - s_lo, hi - lo);
      return 0;
    }
    if (lent >> m & 1) {
      /* An all_gather block read in place (lend; a lent all_reduce is
       * consume_two's), SC_LEND_PIECE at a time: the first step of each
       * piece reads it, the others nothing (a system call per step cost a
       * fifth of a 1 MiB all_gather at n = 2). */
      sc_lent_t l;
      uint64_t per = F * max64(1, SC_LEND_PIECE / F);
      if ((lo - ch->lo[m]) % per) continue; /* read with an earlier step */
      hi = min64(ch->hi[m], lo + per);
      memcpy(&l, pcs[m], sizeof(l));
      if (tdist__cpu_sc_lent_read(ch, op, m, &l, l.addr + (lo - s_lo),
                                  dest_of(op, m) + (lo - ch->lo[m]), hi - lo) != 0)
        return -1;
      continue;
    }
    sc_out_copy(op, dest_of(op, m) + (lo - ch->lo[m]), pcs[m] + (lo - s_lo), hi - lo);
  }
  return 0;
}

int tdist__cpu_sc_a2av_take(cpu_sc_t *ch, cpu_op_t *op, uint64_t st) {
  const tdist_backend_args_t *a = op->args;
  int n = op->size, me = op->rank;
  size_t es = op->es, ro = 0;
  unsigned slot = sc_slot(ch, st);
  for (int m = 0; m < n; m++) {
    size_t at = displ(a->rdispls, m, ro);
    ro += a->rcounts[m];
    if (m == me) continue;
    const uint8_t *pc = sc_slot_data(ch, m, slot, sc_line(ch, m, st)->len);
    cpu_rma_desc_t d;
    if (a2av_prefix(op, m, pc, &d) != 0) return -1;
    if (!d.len) continue;
    uint8_t *dst = elem(a->recvbuf, at, es);
    /* In m's slot at its chunk for this member, or lent (a large block:
     * m's stream is one step all the same) and read in place. */
    if (!d.addr)
      sc_out_copy(op, dst, pc + a2av_at(op, m, me), d.len);
    else if (read_in_place(ch, op, m, &d, 0, dst, d.len) != 0)
      return -1;
  }
  return 0;
}

void tdist__cpu_sc_own_step(cpu_sc_t *ch, const cpu_op_t *op, uint64_t j, const uint8_t *given) {
  const tdist_backend_args_t *a = op->args;
  uint64_t L = (uint64_t)op->count * op->es, lo = j * ch->F;
  if (op->type != TDIST_OP_ALL_GATHER || L <= ch->F || lo >= L) return;
  uint8_t *own = (uint8_t *)a->recvbuf + (size_t)op->rank * L;
  if (own != a->sendbuf) sc_out_copy(op, own + lo, given, min64(ch->F, L - lo));
}
