/*
 * algos.c - the collective algorithms, each a function of the round number
 * (see cpu.h): round k lists the op's sends and receives; the engine starts
 * round k+1 once every transfer of round k is done, and folds reducing
 * receives into their destination between rounds (so a buffer being sent in
 * round k is never modified during round k).
 *
 * Choice by size (thresholds are TDIST_CPU_* settings, docs/cpu-backend.md):
 *   all_reduce      recursive doubling with the non-power-of-two fold (small);
 *                   ring reduce-scatter + all-gather in segments (large)
 *   broadcast       binomial tree (small, or 2 ranks); pipelined chain (large)
 *   reduce          binomial tree
 *   all_gather      direct (small); ring in segments (large)
 *   gather, scatter, all_to_all   direct, one round
 *   reduce_scatter  ring in segments over a working copy
 *   barrier         dissemination
 * Progress thread: setup runs in post, the rounds in the engine; an op
 * belongs to its group (cpu.h).
 */
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/alloc.h"
#include "util/error.h"
#include "cpu/base/base.h"
#include "cpu/transport/transport.h"
#include "cpu/engine/engine.h"

int tdist__cpu_op_reserve(cpu_op_t *op, int n) {
  if (n <= op->cap) return 0;
  cpu_xfer_t *s = tdist__realloc(op->sends, sizeof(cpu_xfer_t) * (size_t)n);
  if (!s) return TDIST_ERR_NO_MEMORY;
  op->sends = s;
  /* The signature bitmap (cpu_op_t.heard, n bits) lives past the receives:
   * one allocation, freed with them. */
  size_t words = ((size_t)n + 63) / 64;
  cpu_xfer_t *r =
      tdist__realloc(op->recvs, sizeof(cpu_xfer_t) * (size_t)n + words * sizeof(uint64_t));
  if (!r) return TDIST_ERR_NO_MEMORY;
  op->recvs = r;
  op->heard = (uint64_t *)(r + n);
  op->cap = n;
  return 0;
}

int tdist__cpu_op_send(cpu_op_t *op, int peer, const void *ptr, size_t len) {
  cpu_xfer_t *x = &op->sends[op->nsend++];
  *x = (cpu_xfer_t){.op = op, .peer = peer, .ptr = (uint8_t *)ptr, .len = len};
  return 0;
}

int tdist__cpu_op_recv(cpu_op_t *op, int peer, void *ptr, size_t len, int reduce) {
  cpu_xfer_t *x = &op->recvs[op->nrecv++];
  *x = (cpu_xfer_t){.op = op, .peer = peer, .ptr = ptr, .len = len, .reduce = reduce};
  return 0;
}

static inline int mod(int a, int n) { return ((a % n) + n) % n; }

/* Element range of chunk c of n over count elements (balanced). */
static inline size_t chunk_off(size_t count, int n, int c) {
  return (size_t)((unsigned __int128)count * (unsigned)c / (unsigned)n);
}

/* Segment j of chunk c: byte pointer and length (0 when past the chunk). */
static size_t seg_of(const cpu_op_t *op, size_t count, int c, int j, uint8_t *base, uint8_t **ptr) {
  size_t lo = chunk_off(count, op->size, c), hi = chunk_off(count, op->size, c + 1);
  size_t segel = op->seg / op->es;
  size_t s = lo + (size_t)j * segel, e = s + segel < hi ? s + segel : hi;
  *ptr = base + s * op->es;
  return s < hi ? (e - s) * op->es : 0;
}

static int nseg_for(const cpu_op_t *op, size_t count) {
  size_t segel = op->seg / op->es;
  size_t maxc = chunk_off(count, op->size, 1); /* chunk 0 is the smallest... */
  for (int c = 1; c < op->size; c++) {
    size_t len = chunk_off(count, op->size, c + 1) - chunk_off(count, op->size, c);
    if (len > maxc) maxc = len;
  }
  size_t n = (maxc + segel - 1) / segel;
  return n ? (int)n : 1;
}

/* ---- all_reduce ------------------------------------------------------------------ */

/* Recursive doubling; round 0 folds the `extra` ranks above the largest power
 * of two into their neighbours, the last round sends them the result.
 *
 * Every rank must end with the same bits. Float SUM/PROD of two NaNs keep the
 * first operand's payload, so `mine op theirs` on one side of a pair and
 * `theirs op mine` on the other could differ; the engine's reducing receive
 * computes `mine op received`. So the combination order is fixed: the block
 * of the lower ranks always comes first. A rank whose partner is higher uses
 * the reducing receive (mine is the lower block); a rank whose partner is
 * lower receives into op->tmp instead and folds `tmp op mine` itself at the
 * start of the next round (before anything is sent from buf again). Each
 * round then computes, on both sides, lower op higher over the same two
 * blocks, and by induction every rank holds the same bits after every round:
 * the result is one fixed tree over the ranks in order. */

/* The group rank rd_round talks to in round k (1..logp), or -1 (folded). */
static int rd_partner(const cpu_op_t *op, int k) {
  int r = op->rank, extra = op->extra;
  int nr = r < 2 * extra ? (r % 2 ? r / 2 : -1) : r - extra;
  if (nr < 0) return -1;
  int pn = nr ^ (1 << (k - 1));
  return pn < extra ? pn * 2 + 1 : pn + extra;
}

/* Round k's block arrives from a lower rank into op->tmp (see above). */
static int rd_from_lower(const cpu_op_t *op, int k, int logp) {
  if (k == 0) return op->rank < 2 * op->extra && op->rank % 2;
  if (k > logp) return 0;
  int p = rd_partner(op, k);
  return p >= 0 && p < op->rank;
}

static int rd_round(cpu_op_t *op, int k) {
  int r = op->rank, extra = op->extra, logp = 0;
  size_t len = op->count * op->es;
  while ((1 << logp) < op->pof2)
    logp++;
  if (k > 0 && len && rd_from_lower(op, k - 1, logp)) {
    tdist__cpu_reduce(op->tmp, op->buf, op->count, op->dtype, op->redop); /* lower op mine */
    tdist__cpu_copy(op->buf, op->tmp, len);
  }
  if (k == 0) {
    if (r < 2 * extra) {
      if (r % 2 == 0)
        tdist__cpu_op_send(op, r + 1, op->buf, len);
      else
        tdist__cpu_op_recv(op, r - 1, op->tmp, len, 0);
    }
    return 0;
  }
  if (k <= logp) {
    int p = rd_partner(op, k);
    if (p < 0) return 0;
    tdist__cpu_op_send(op, p, op->buf, len);
    if (p < r)
      tdist__cpu_op_recv(op, p, op->tmp, len, 0);
    else
      tdist__cpu_op_recv(op, p, op->buf, len, 1);
    return 0;
  }
  if (k == logp + 1) {
    if (r < 2 * extra) {
      if (r % 2)
        tdist__cpu_op_send(op, r - 1, op->buf, len);
      else
        tdist__cpu_op_recv(op, r + 1, op->buf, len, 0);
    }
    return 0;
  }
  return 1;
}

/* Ring: (n-1) reduce-scatter steps then (n-1) all-gather steps, each in
 * nseg segment rounds; empty segments are skipped by both sides. */
static int ring_round(cpu_op_t *op, int k) {
  int n = op->size, r = op->rank, steps = n - 1;
  int per = op->nseg, phase = k / (steps * per), step = (k / per) % steps, j = k % per;
  if (phase >= 2) return 1;
  uint8_t *sp, *rp;
  int sc = phase == 0 ? mod(r - step - 1, n) : mod(r - step, n);
  int rc = phase == 0 ? mod(r - step - 2, n) : mod(r - step - 1, n);
  size_t sl = seg_of(op, op->count, sc, j, op->buf, &sp);
  size_t rl = seg_of(op, op->count, rc, j, op->buf, &rp);
  if (sl) tdist__cpu_op_send(op, (r + 1) % n, sp, sl);
  if (rl) tdist__cpu_op_recv(op, mod(r - 1, n), rp, rl, phase == 0);
  return 0;
}

static void avg_finish(cpu_op_t *op) {
  if (op->redop == TDIST_AVG) tdist__cpu_divide(op->buf, op->count, op->dtype, op->size);
}

/* ---- reduce_scatter ---------------------------------------------------------------- */

/* Ring reduce-scatter over blocks of tmp (block c = chunk c); rank r ends
 * with block r reduced. */
static int rs_round(cpu_op_t *op, int k) {
  int n = op->size, r = op->rank, per = op->nseg;
  int step = k / per, j = k % per;
  if (step >= n - 1) return 1;
  size_t total = op->count * (size_t)n;
  uint8_t *sp, *rp;
  size_t sl = seg_of(op, total, mod(r - step - 1, n), j, op->tmp, &sp);
  size_t rl = seg_of(op, total, mod(r - step - 2, n), j, op->tmp, &rp);
  if (sl) tdist__cpu_op_send(op, (r + 1) % n, sp, sl);
  if (rl) tdist__cpu_op_recv(op, mod(r - 1, n), rp, rl, 1);
  return 0;
}

static void rs_finish(cpu_op_t *op) {
  size_t bytes = op->count * op->es;
  if (bytes) tdist__cpu_copy(op->buf, op->tmp + (size_t)op->rank * bytes, bytes);
  avg_finish(op);
}

/* ---- broadcast and reduce --------------------------------------------------------- */

static int log2_ceil(int n) {
  int l = 0;
  while ((1 << l) < n)
    l++;
  return l;
}

static int bcast_tree_round(cpu_op_t *op, int k) {
  int n = op->size, vr = mod(op->rank - op->root, n), mask = 1 << k;
  if (k >= log2_ceil(n)) return 1;
  size_t len = op->count * op->es;
  if (vr < mask) {
    if (vr + mask < n) tdist__cpu_op_send(op, (vr + mask + op->root) % n, op->buf, len);
  } else if (vr < 2 * mask) {
    tdist__cpu_op_recv(op, (vr - mask + op->root) % n, op->buf, len, 0);
  }
  return 0;
}

/* Chain root -> root+1 -> ...: position i receives segment k-i+1 and sends
 * segment k-i in round k. */
static int bcast_chain_round(cpu_op_t *op, int k) {
  int n = op->size, i = mod(op->rank - op->root, n);
  if (k >= op->nseg + n - 2) return 1;
  size_t len = op->count * op->es;
  int rs = k - i + 1, ss = k - i;
  if (i > 0 && rs >= 0 && rs < op->nseg) {
    size_t off = (size_t)rs * op->seg, l = len - off < op->seg ? len - off : op->seg;
    tdist__cpu_op_recv(op, (op->rank - 1 + n) % n, op->buf + off, l, 0);
  }
  if (i < n - 1 && ss >= 0 && ss < op->nseg) {
    size_t off = (size_t)ss * op->seg, l = len - off < op->seg ? len - off : op->seg;
    tdist__cpu_op_send(op, (op->rank + 1) % n, op->buf + off, l);
  }
  return 0;
}

static int reduce_tree_round(cpu_op_t *op, int k) {
  int n = op->size, vr = mod(op->rank - op->root, n), mask = 1 << k;
  if (k >= log2_ceil(n)) return 1;
  size_t len = op->count * op->es;
  if (vr % (2 * mask) == 0) {
    if (vr + mask < n) tdist__cpu_op_recv(op, (vr + mask + op->root) % n, op->buf, len, 1);
  } else if (vr % (2 * mask) == mask) {
    tdist__cpu_op_send(op, (vr - mask + op->root) % n, op->buf, len);
  }
  return 0;
}

static void reduce_finish(cpu_op_t *op) {
  if (op->rank == op->root) avg_finish(op);
}

/* ---- gathers, scatter, all_to_all, barrier ----------------------------------------- */

static int allgather_direct_round(cpu_op_t *op, int k) {
  if (k > 0) return 1;
  size_t len = op->count * op->es;
  for (int j = 0; j < op->size; j++) {
    if (j == op->rank) continue;
    tdist__cpu_op_send(op, j, op->buf + (size_t)op->rank * len, len);
    tdist__cpu_op_recv(op, j, op->buf + (size_t)j * len, len, 0);
  }
  return 0;
}

/* Ring all-gather: block (r - step) goes to the next rank, block
 * (r - step - 1) comes from the previous one, in segments. */
static int allgather_ring_round(cpu_op_t *op, int k) {
  int n = op->size, r = op->rank, per = op->nseg;
  int step = k / per, j = k % per;
  if (step >= n - 1) return 1;
  size_t total = op->count * (size_t)n;
  uint8_t *sp, *rp;
  size_t sl = seg_of(op, total, mod(r - step, n), j, op->buf, &sp);
  size_t rl = seg_of(op, total, mod(r - step - 1, n), j, op->buf, &rp);
  if (sl) tdist__cpu_op_send(op, (r + 1) % n, sp, sl);
  if (rl) tdist__cpu_op_recv(op, mod(r - 1, n), rp, rl, 0);
  return 0;
}

static int gather_round(cpu_op_t *op, int k) {
  if (k > 0) return 1;
  size_t len = op->count * op->es;
  const tdist_backend_args_t *a = op->args;
  if (op->rank != op->root) {
    tdist__cpu_op_send(op, op->root, a->sendbuf, len);
    return 0;
  }
  for (int j = 0; j < op->size; j++)
    if (j != op->rank) tdist__cpu_op_recv(op, j, op->buf + (size_t)j * len, len, 0);
  return 0;
}

static int scatter_round(cpu_op_t *op, int k) {
  if (k > 0) return 1;
  size_t len = op->count * op->es;
  const tdist_backend_args_t *a = op->args;
  if (op->rank != op->root) {
    tdist__cpu_op_recv(op, op->root, op->buf, len, 0);
    return 0;
  }
  for (int j = 0; j < op->size; j++)
    if (j != op->rank)
      tdist__cpu_op_send(op, j, (const uint8_t *)a->sendbuf + (size_t)j * len, len);
  return 0;
}

static int alltoall_round(cpu_op_t *op, int k) {
  if (k > 0) return 1;
  size_t len = op->count * op->es;
  const uint8_t *sb = op->args->sendbuf;
  for (int j = 0; j < op->size; j++) {
    if (j == op->rank) continue;
    tdist__cpu_op_send(op, j, sb + (size_t)j * len, len);
    tdist__cpu_op_recv(op, j, op->buf + (size_t)j * len, len, 0);
  }
  return 0;
}

static int barrier_round(cpu_op_t *op, int k) {
  int n = op->size, mask = 1 << k;
  if (mask >= n) return 1;
  tdist__cpu_op_send(op, (op->rank + mask) % n, NULL, 0);
  tdist__cpu_op_recv(op, mod(op->rank - mask, n), NULL, 0, 0);
  return 0;
}

static int no_round(cpu_op_t *op, int k) { return 1; }

/* ---- setup ------------------------------------------------------------------------------ */

/* Small segments let a rank that has a core to itself reduce one segment
 * while the kernel moves the next (n=2 all_reduce of 16 MiB on 2 CPUs:
 * 4.2 ms with 512 KiB, 7.8 ms with 2 MiB). When ranks outnumber CPUs
 * their progress threads take turns anyway, and every round costs
 * wake-ups and switches: 2 MiB is faster there (n=4 on 2 CPUs, 16 MiB
 * all_reduce 31.0 -> 27.3 ms, all_gather 67.7 -> 59.0 ms). */
size_t tdist__cpu_seg_bytes(void) {
  static _Atomic long cached = -1;
  long v = atomic_load_explicit(&cached, memory_order_relaxed);
  if (v >= 0) return (size_t)v;
  v = (long)tdist__param_CpuSegBytes();
  if (v <= 0) {
    const char *lws = tdist__env_raw("LOCAL_WORLD_SIZE");
    long local = lws ? strtol(lws, NULL, 10) : 0;
    cpu_set_t set;
    long cpus = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 0;
    if (cpus <= 0) cpus = sysconf(_SC_NPROCESSORS_ONLN);
    v = local > 0 && cpus > 0 && local > cpus ? 2l << 20 : 512l << 10;
  }
  atomic_store_explicit(&cached, v, memory_order_relaxed);
  return (size_t)v;
}

static int use_tmp(cpu_op_t *op, size_t bytes) {
  op->tmp = tdist__cpu_buf_get(op->cg->ctx, bytes);
  if (!op->tmp) return TDIST_ERR_NO_MEMORY;
  op->tmp_cap = bytes;
  return 0;
}

/* memmove: the core lets sendbuf overlap recvbuf in some ops (all_gather
 * with sendbuf over another block, ops.c); every algorithm copies the input
 * before anything is received. */
static void copy_in(void *dst, const void *src, size_t bytes) {
  if (bytes && dst != src) tdist__cpu_move(dst, src, bytes);
}

/* The input copy needs tdist__cpu_scale: PREMUL_SUM's factor, or BOOL's
 * non-zero bytes made 1 (so even a single rank's result is 0 or 1). */
static int prepare_input(const cpu_op_t *op) {
  return op->redop == TDIST_PREMUL_SUM || op->dtype == TDIST_BOOL;
}

/* all_reduce: recursive doubling below TDIST_CPU_RING_BYTES (or with fewer
 * elements than ranks), else the segmented ring. */
static int setup_all_reduce(cpu_op_t *op, size_t bytes) {
  const tdist_backend_args_t *a = op->args;
  int n = op->size;
  copy_in(op->buf, a->sendbuf, bytes);
  if (prepare_input(op)) tdist__cpu_scale(op->buf, op->count, op->dtype, a->scalar);
  op->finish_fn = avg_finish;
  if (n == 1) return 0;
  if (bytes < (size_t)tdist__param_CpuRingBytes() || op->count < (size_t)n) {
    op->pof2 = 1 << (log2_ceil(n + 1) - 1);
    op->extra = n - op->pof2;
    op->round_fn = rd_round;
    if (bytes) TDIST_CHECK(use_tmp(op, bytes)); /* blocks from lower ranks land here */
  } else {
    op->nseg = nseg_for(op, op->count);
    op->round_fn = ring_round;
  }
  return 0;
}

/* reduce_scatter: the whole input is reduced in tmp, over a ring. */
static int setup_reduce_scatter(cpu_op_t *op, size_t bytes) {
  const tdist_backend_args_t *a = op->args;
  int n = op->size;
  TDIST_CHECK(use_tmp(op, bytes * (size_t)n));
  copy_in(op->tmp, a->sendbuf, bytes * (size_t)n);
  if (prepare_input(op)) tdist__cpu_scale(op->tmp, op->count * (size_t)n, op->dtype, a->scalar);
  op->finish_fn = rs_finish;
  if (n == 1) return 0;
  op->nseg = nseg_for(op, op->count * (size_t)n);
  op->round_fn = rs_round;
  return 0;
}

/* broadcast: a tree, or a segmented chain from TDIST_CPU_BCAST_CHAIN_BYTES. */
static void setup_broadcast(cpu_op_t *op, size_t bytes) {
  int n = op->size;
  if (n == 1) return;
  if (n == 2 || bytes < (size_t)tdist__param_CpuBcastChainBytes()) {
    op->round_fn = bcast_tree_round;
  } else {
    op->nseg = (int)((bytes + op->seg - 1) / op->seg);
    op->round_fn = bcast_chain_round;
  }
}

/* reduce: a tree; ranks other than the root reduce in tmp. */
static int setup_reduce(cpu_op_t *op, size_t bytes) {
  const tdist_backend_args_t *a = op->args;
  if (op->rank != op->root) {
    TDIST_CHECK(use_tmp(op, bytes));
    op->buf = op->tmp;
  }
  copy_in(op->buf, a->sendbuf, bytes);
  if (prepare_input(op)) tdist__cpu_scale(op->buf, op->count, op->dtype, a->scalar);
  op->finish_fn = reduce_finish;
  if (op->size > 1) op->round_fn = reduce_tree_round;
  return 0;
}

/* all_gather: direct sends below TDIST_CPU_ALLGATHER_RING_BYTES, else a ring. */
static void setup_all_gather(cpu_op_t *op, size_t bytes) {
  int n = op->size;
  copy_in(op->buf + (size_t)op->rank * bytes, op->args->sendbuf, bytes);
  if (n == 1) return;
  if (bytes * (size_t)n < (size_t)tdist__param_CpuAllgatherRingBytes()) {
    op->round_fn = allgather_direct_round;
  } else {
    op->nseg = nseg_for(op, op->count * (size_t)n);
    op->round_fn = allgather_ring_round;
  }
}

/* gather, scatter, all_to_all: this rank's own block is copied here, the
 * others are sent directly. */
static void setup_direct(cpu_op_t *op, size_t bytes) {
  const tdist_backend_args_t *a = op->args;
  size_t mine = (size_t)op->rank * bytes;
  int many = op->size > 1;
  switch (op->type) {
  case TDIST_OP_GATHER:
    if (op->rank == op->root) copy_in(op->buf + mine, a->sendbuf, bytes);
    if (many) op->round_fn = gather_round;
    break;
  case TDIST_OP_SCATTER:
    if (op->rank == op->root) copy_in(op->buf, (const uint8_t *)a->sendbuf + mine, bytes);
    if (many) op->round_fn = scatter_round;
    break;
  default: /* TDIST_OP_ALL_TO_ALL */
    copy_in(op->buf + mine, (const uint8_t *)a->sendbuf + mine, bytes);
    if (many) op->round_fn = alltoall_round;
    break;
  }
}

/* (engine lock held: tdist__cpu_post_op, on the progress thread or a
 * submitting caller, drive.c) Pick the algorithm and copy the input in;
 * nothing is sent yet. */
int tdist__cpu_algo_setup(cpu_op_t *op) {
  size_t bytes = op->count * op->es;
  op->seg = tdist__cpu_seg_bytes();
  if (op->seg < 4096) op->seg = 4096;
  op->seg -= op->seg % op->es;
  op->buf = op->args->recvbuf;
  op->round_fn = no_round;
  op->finish_fn = NULL;
  TDIST_CHECK(tdist__cpu_op_reserve(op, op->size + 1));
  switch (op->type) {
  case TDIST_OP_ALL_REDUCE: return setup_all_reduce(op, bytes);
  case TDIST_OP_REDUCE_SCATTER: return setup_reduce_scatter(op, bytes);
  case TDIST_OP_BROADCAST: setup_broadcast(op, bytes); return 0;
  case TDIST_OP_REDUCE: return setup_reduce(op, bytes);
  case TDIST_OP_ALL_GATHER: setup_all_gather(op, bytes); return 0;
  case TDIST_OP_GATHER:
  case TDIST_OP_SCATTER:
  case TDIST_OP_ALL_TO_ALL: setup_direct(op, bytes); return 0;
  case TDIST_OP_BARRIER: op->round_fn = barrier_round; return 0;
  default:
    return tdist__error(TDIST_ERR_NOT_SUPPORTED, "cpu: op %s is not supported",
                        tdist_op_name(op->type));
  }
}
