/*
 * opcheck.c - the one argument checker of the public ops (the rules
 * and their order are in opcheck.h). ops.c and ops_v.c fill a descriptor
 * and call tdist__op_check; nothing here allocates.
 *
 * What is checked is what one rank can check alone. Agreement between ranks
 * (the same op, count, dtype, reduction and root; rank i's send_counts[j] ==
 * rank j's recv_counts[i]) needs the other ranks' view: the CPU backend
 * compares them in its message headers (cpu/engine/sigcheck.c, cpu/engine/algos_v.c) and
 * fails TDIST_ERR_MISMATCH.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/ops/opcheck.h"
#include "util/error.h"
#include "util/memkind.h"

/* The group can run an op of `type`: it exists, is not aborted, and its
 * backend declares the op. */
static int check_group(tdist_group_t *g, tdist_optype_t type, const char *fn) {
  if (!g) return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "%s: NULL group", fn);
  if (atomic_load(&g->aborted)) /* the cause's code: ABORTED, REMOTE_FAILED, MISMATCH... */
    return tdist__error(g->abort_status, "%s: group '%s' was aborted: %s", fn, g->name,
                        g->abort_reason);
  if (!(g->bk->caps.ops & (1u << type)))
    return tdist__error(TDIST_ERR_NOT_SUPPORTED, "%s: backend '%s' does not run %s", fn,
                        g->bk->name, tdist_op_name(type));
  return 0;
}

static int check_dtype(const tdist_group_t *g, tdist_dtype_t dt, const char *fn) {
  if ((unsigned)dt >= TDIST_DTYPE_COUNT)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "%s: unknown dtype %d", fn, (int)dt);
  if (!(g->bk->caps.dtypes & (1u << dt)))
    return tdist__error(TDIST_ERR_NOT_SUPPORTED, "%s: backend '%s' has no %s", fn, g->bk->name,
                        tdist_dtype_name(dt));
  return 0;
}

static int is_float_dtype(tdist_dtype_t dt) {
  return dt == TDIST_FLOAT16 || dt == TDIST_BFLOAT16 || dt == TDIST_FLOAT32 ||
         dt == TDIST_FLOAT64 || dt == TDIST_FLOAT8_E4M3 || dt == TDIST_FLOAT8_E5M2;
}

/* A reduction of a reducing op: first one that means nothing for the
 * element type, on any backend (INVALID_ARGUMENT: a bitwise op on a float
 * type; AVG or PREMUL_SUM of BOOL), then one out of range or that the
 * backend lacks. */
static int check_redop(const tdist_group_t *g, tdist_redop_t op, tdist_dtype_t dt, const char *fn) {
  if ((op == TDIST_BAND || op == TDIST_BOR || op == TDIST_BXOR) && is_float_dtype(dt))
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                        "%s: %s is a bitwise reduction, for integer and bool types; %s is a "
                        "float type",
                        fn, tdist_redop_name(op), tdist_dtype_name(dt));
  if ((op == TDIST_AVG || op == TDIST_PREMUL_SUM) && dt == TDIST_BOOL)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                        "%s: %s of bool is not defined (use sum for or, prod for and)", fn,
                        tdist_redop_name(op));
  if ((unsigned)op >= TDIST_REDOP_COUNT)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "%s: unknown reduction %d", fn, (int)op);
  if (!(g->bk->caps.redops & (1u << op)))
    return tdist__error(TDIST_ERR_NOT_SUPPORTED, "%s: backend '%s' has no %s reduction", fn,
                        g->bk->name, tdist_redop_name(op));
  return 0;
}

static int check_rank(const tdist_group_t *g, int r, const char *what, const char *fn) {
  if (r < 0 || r >= g->size)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "%s: %s %d is not in [0, %d) of group '%s'", fn,
                        what, r, g->size, g->name);
  return 0;
}

/* The group's backend takes wildcard receives (caps.any_source). */
static int check_any(const tdist_group_t *g, const char *what, const char *fn) {
  if (g->bk->caps.any_source) return 0;
  return tdist__error(TDIST_ERR_NOT_SUPPORTED,
                      "%s: backend '%s' of group '%s' cannot match %s (receives must name the "
                      "peer and the tag; NCCL matches point-to-point messages by call order)",
                      fn, g->bk->name, g->name, what);
}

/* `blocks` blocks of `count` elements of es bytes fit the address space;
 * *elems = count x blocks. */
static int check_count(size_t count, size_t blocks, size_t es, size_t *elems, const char *fn) {
  size_t bytes;
  if (__builtin_mul_overflow(count, blocks, elems) || __builtin_mul_overflow(*elems, es, &bytes))
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "%s: count %zu overflows the address space", fn,
                        count);
  return 0;
}

/* The elements a buffer must hold for a v-op's blocks: the largest
 * displacement + count (displs NULL: the packed sum), in bytes within the
 * address space. *sum is the sum of the counts. */
static int extent(const tdist_group_t *g, const size_t *counts, const size_t *displs, size_t es,
                  const char *what, const char *fn, size_t *ext, size_t *sum) {
  size_t e = 0, s = 0, bytes;
  if (!counts) return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, what);
  for (int j = 0; j < g->size; j++) {
    if (counts[j] > SIZE_MAX - s)
      return tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                          "%s: the sum of %s overflows the address space", fn, what);
    size_t lo = displs ? displs[j] : s;
    s += counts[j];
    if (counts[j] > SIZE_MAX - lo)
      return tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                          "%s: %s[%d] = %zu at displacement %zu overflows the address space", fn,
                          what, j, counts[j], lo);
    if (counts[j] && lo + counts[j] > e) e = lo + counts[j];
  }
  if (__builtin_mul_overflow(e, es, &bytes))
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                        "%s: %s need %zu elements, which overflows the address space", fn, what, e);
  *ext = e;
  if (sum) *sum = s;
  return 0;
}

/* Where block j starts (elements): its displacement, or packed. */
static size_t block_at(const size_t *displs, const size_t *counts, int j) {
  if (displs) return displs[j];
  size_t s = 0;
  for (int i = 0; i < j; i++)
    s += counts[i];
  return s;
}

/* A buffer of `count` elements: not NULL, and not CUDA device memory when
 * g's backend takes host memory only (util/memkind.h). */
static int check_buf(const tdist_group_t *g, const void *buf, size_t count, const char *what,
                     const char *fn) {
  if (!count) return 0;
  if (!buf)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "%s: %s is NULL with count %zu", fn, what,
                        count);
  if (!(g->bk->caps.mem & TDIST_BACKEND_MEM_DEVICE) && tdist__memkind(buf) == TDIST__MEMKIND_DEVICE)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                        "%s: %s (%p) is CUDA device memory, but group '%s' runs on backend '%s', "
                        "which takes host memory (use an NCCL group for device buffers)",
                        fn, what, buf, g->name, g->bk->name);
  return 0;
}

/* The in-place forms (opcheck.h): none, sendbuf == recvbuf, sendbuf at a
 * block of recvbuf, recvbuf at a block of sendbuf. */
enum { IP_NONE, IP_SAME, IP_SEND_IN_RECV, IP_RECV_IN_SEND };

/* sendbuf's sl bytes and recvbuf's rl bytes may overlap only in the op's
 * in-place form (`ip`, at element `off`; `form` says it for the message).
 * Anything else would have the backend read what it has already written:
 * success with wrong elements, so it is refused. */
static int check_overlap(const void *sendbuf, size_t sl, const void *recvbuf, size_t rl, int ip,
                         size_t off, const char *form, const char *fn) {
  uintptr_t s = (uintptr_t)sendbuf, r = (uintptr_t)recvbuf;
  if (!sl || !rl || s >= r + rl || r >= s + sl) return 0;
  if ((ip == IP_SAME && s == r) || (ip == IP_SEND_IN_RECV && s == r + off) ||
      (ip == IP_RECV_IN_SEND && r == s + off))
    return 0;
  if (ip == IP_NONE)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                        "%s: sendbuf [%p, +%zu bytes) and recvbuf [%p, +%zu bytes) overlap; the "
                        "op has no in-place form, the buffers must be disjoint",
                        fn, sendbuf, sl, recvbuf, rl);
  return tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                      "%s: sendbuf [%p, +%zu bytes) and recvbuf [%p, +%zu bytes) overlap; they "
                      "must be disjoint, or in place exactly (%s)",
                      fn, sendbuf, sl, recvbuf, rl, form);
}

static int check_batch(tdist_group_t *g, const tdist_backend_args_t *a, const char *fn) {
  const tdist_p2p_op_t *ops = a->p2p;
  if (a->np2p < 1 || !ops) return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "%s: empty batch", fn);
  for (int i = 0; i < a->np2p; i++) {
    char what[48];
    size_t elems;
    if (ops[i].kind != TDIST_P2P_SEND && ops[i].kind != TDIST_P2P_RECV)
      return tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                          "%s: ops[%d].kind %d is neither SEND nor RECV", fn, i, (int)ops[i].kind);
    TDIST_CHECK(check_dtype(g, ops[i].dtype, fn));
    TDIST_CHECK(check_count(ops[i].count, 1, tdist_dtype_size(ops[i].dtype), &elems, fn));
    snprintf(what, sizeof(what), "ops[%d].peer", i);
    TDIST_CHECK(check_rank(g, ops[i].peer, what, fn));
    snprintf(what, sizeof(what), "ops[%d].buf", i);
    TDIST_CHECK(check_buf(g, ops[i].buf, ops[i].count, what, fn));
    if (ops[i].tag < 0)
      return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "%s: ops[%d].tag %d < 0", fn, i, ops[i].tag);
  }
  return 0;
}

/* 2-4: dtype, reduction, root or peer. */
static int check_scalars(tdist_group_t *g, const tdist_backend_args_t *a, unsigned props,
                         const char *fn) {
  TDIST_CHECK(check_dtype(g, a->dtype, fn));
  if (props & TDIST_BACKEND_OP_REDUCING) TDIST_CHECK(check_redop(g, a->redop, a->dtype, fn));
  if (props & TDIST_BACKEND_OP_ROOTED) TDIST_CHECK(check_rank(g, a->root, "root", fn));
  if (!(props & TDIST_BACKEND_OP_PEER)) return 0;
  int recv = a->type == TDIST_OP_RECV;
  if (recv && a->root == TDIST_ANY_SOURCE)
    TDIST_CHECK(check_any(g, "TDIST_ANY_SOURCE", fn));
  else
    TDIST_CHECK(check_rank(g, a->root, "peer", fn));
  if (recv && a->tag == TDIST_ANY_TAG) return check_any(g, "TDIST_ANY_TAG", fn);
  if (a->tag < 0) return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "%s: tag %d < 0", fn, a->tag);
  return 0;
}

/* What step 5 finds: the elements this rank reads from sendbuf (sn) and
 * writes to recvbuf (rn), 0 where it does not use the buffer, the buffers'
 * names for messages, and the op's in-place form (ip, off, form). */
typedef struct span {
  size_t sn, rn, off;
  int ip;
  const char *sname, *rname, *form;
} span_t;

/* 5, the fixed ops with two buffers. */
static int span_fixed(tdist_group_t *g, const tdist_backend_args_t *a, size_t es, int is_root,
                      span_t *sp, const char *fn) {
  const size_t n = (size_t)g->size, c = a->count;
  const int t = a->type, by_rank = t == TDIST_OP_ALL_GATHER || t == TDIST_OP_REDUCE_SCATTER;
  size_t elems;
  int reduce = t == TDIST_OP_ALL_REDUCE || t == TDIST_OP_REDUCE;
  TDIST_CHECK(check_count(c, reduce ? 1 : n, es, &elems, fn));
  /* the block the in-place form puts at this rank's or the root's place */
  sp->off = (size_t)(by_rank ? g->rank : a->root) * c;
  switch (t) {
  case TDIST_OP_ALL_REDUCE:
  case TDIST_OP_REDUCE:
    sp->sn = c, sp->rn = is_root ? c : 0, sp->ip = IP_SAME, sp->off = 0;
    if (t == TDIST_OP_REDUCE) sp->rname = "recvbuf (on root)";
    sp->form = "sendbuf == recvbuf";
    return 0;
  case TDIST_OP_ALL_GATHER:
    sp->sn = c, sp->rn = elems, sp->ip = IP_SEND_IN_RECV;
    sp->form = "sendbuf == recvbuf + rank * count elements";
    return 0;
  case TDIST_OP_GATHER:
    sp->sn = c, sp->rn = is_root ? elems : 0, sp->ip = IP_SEND_IN_RECV;
    sp->rname = "recvbuf (on root)";
    sp->form = "sendbuf == recvbuf + root * count elements, on root";
    return 0;
  case TDIST_OP_SCATTER:
    sp->sn = is_root ? elems : 0, sp->rn = c, sp->ip = IP_RECV_IN_SEND;
    sp->sname = "sendbuf (on root)";
    sp->form = "recvbuf == sendbuf + root * count elements, on root";
    return 0;
  case TDIST_OP_REDUCE_SCATTER:
    sp->sn = elems, sp->rn = c, sp->ip = IP_RECV_IN_SEND;
    sp->form = "recvbuf == sendbuf + rank * count elements";
    return 0;
  default: /* TDIST_OP_ALL_TO_ALL: no in-place form */
    sp->sn = sp->rn = elems, sp->off = 0;
    return 0;
  }
}

/* 5, all_gather_v and gather_v: this rank's block, then (where the receive
 * side is read) the receive arrays, which must agree with it. */
static int span_gather_v(tdist_group_t *g, tdist_backend_args_t *a, size_t es, int is_root,
                         span_t *sp, const char *fn) {
  size_t elems;
  const int rank = g->rank, gather = a->type == TDIST_OP_GATHER_V;
  TDIST_CHECK(check_count(a->count, 1, es, &elems, fn));
  sp->sn = a->count;
  if (!is_root) { /* gather_v off root: the receive side is not read */
    a->rcounts = a->rdispls = NULL;
    return 0;
  }
  TDIST_CHECK(extent(g, a->rcounts, a->rdispls, es, "recv_counts", fn, &sp->rn, NULL));
  if (a->rcounts[rank] != a->count)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                        "%s: recv_counts[%d] = %zu but this rank's send_count is %zu", fn, rank,
                        a->rcounts[rank], a->count);
  sp->ip = IP_SEND_IN_RECV;
  sp->off = block_at(a->rdispls, a->rcounts, gather ? a->root : rank);
  if (gather) sp->rname = "recvbuf (on root)";
  sp->form = gather ? "sendbuf == recvbuf + recv_displs[root] elements, on root"
                    : "sendbuf == recvbuf + recv_displs[rank] elements";
  return 0;
}

/* 5, scatter_v: this rank's block, then (on root) the send arrays. */
static int span_scatter_v(tdist_group_t *g, tdist_backend_args_t *a, size_t es, int is_root,
                          span_t *sp, const char *fn) {
  size_t elems;
  TDIST_CHECK(check_count(a->count, 1, es, &elems, fn));
  sp->rn = a->count;
  if (!is_root) { /* off root: the send side is not read */
    a->scounts = a->sdispls = NULL;
    return 0;
  }
  TDIST_CHECK(extent(g, a->scounts, a->sdispls, es, "send_counts", fn, &sp->sn, NULL));
  if (a->scounts[g->rank] != a->count)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                        "%s: send_counts[%d] = %zu but root's recv_count is %zu", fn, g->rank,
                        a->scounts[g->rank], a->count);
  sp->sname = "sendbuf (on root)";
  sp->ip = IP_RECV_IN_SEND;
  sp->off = block_at(a->sdispls, a->scounts, g->rank);
  sp->form = "recvbuf == sendbuf + send_displs[root] elements, on root";
  return 0;
}

/* 5, the v-ops. */
static int span_v(tdist_group_t *g, tdist_backend_args_t *a, size_t es, int is_root, span_t *sp,
                  const char *fn) {
  switch (a->type) {
  case TDIST_OP_ALL_TO_ALL_V:
    TDIST_CHECK(extent(g, a->scounts, a->sdispls, es, "send_counts", fn, &sp->sn, &a->count));
    return extent(g, a->rcounts, a->rdispls, es, "recv_counts", fn, &sp->rn, NULL);
  case TDIST_OP_ALL_GATHER_V:
  case TDIST_OP_GATHER_V: return span_gather_v(g, a, es, is_root, sp, fn);
  case TDIST_OP_SCATTER_V: return span_scatter_v(g, a, es, is_root, sp, fn);
  default: /* TDIST_OP_REDUCE_SCATTER_V */
    TDIST_CHECK(extent(g, a->rcounts, NULL, es, "recv_counts", fn, &sp->sn, NULL));
    sp->rn = a->count = a->rcounts[g->rank];
    sp->ip = IP_RECV_IN_SEND;
    sp->off = block_at(NULL, a->rcounts, g->rank);
    sp->form = "recvbuf == sendbuf + (recv_counts[0] + ... + recv_counts[rank-1]) elements";
    return 0;
  }
}

/* The last fixed-size op this thread found valid, and the group it was
 * for: a program that repeats an op (a training step's all_reduce, a
 * benchmark) has the same arguments checked once, not on every call (the
 * checks were a ninth of a small op's instructions). What the checks read
 * is all in the key: the descriptor's kind, buffers, count, dtype,
 * reduction, root or peer and tag, the group's size, rank and backend; a
 * buffer freed and mapped again as device memory at the same address is
 * not seen again. The group's state (aborted) is checked on every call. */
typedef struct memo {
  const tdist_group_t *g;
  const void *bk;
  int size, rank;
  tdist_backend_args_t a;
} memo_t;
static _Thread_local memo_t tl_memo;

/* The memo's group is g as it is now (its backend, size and rank). */
static int memo_group(const memo_t *m, const tdist_group_t *g) {
  return m->g == g && m->bk == g->bk && m->size == g->size && m->rank == g->rank;
}

static void memo_keep(memo_t *m, const tdist_group_t *g, const tdist_backend_args_t *a) {
  m->g = g;
  m->bk = g->bk;
  m->size = g->size;
  m->rank = g->rank;
  m->a = *a;
}

static int memo_hit(const tdist_group_t *g, const tdist_backend_args_t *a) {
  /* Field by field: what a fixed op's checks read (memcmp of the whole
   * descriptor was a call that cost more than it saved). */
  const tdist_backend_args_t *m = &tl_memo.a;
  return memo_group(&tl_memo, g) && m->type == a->type && m->sendbuf == a->sendbuf &&
         m->recvbuf == a->recvbuf && m->count == a->count && m->dtype == a->dtype &&
         m->redop == a->redop && m->root == a->root && m->tag == a->tag;
}

/* The last all_to_all_v this thread found valid (an expert-parallel
 * layer's dispatch and combine repeat with new counts in the same arrays,
 * or the same counts): as tl_memo, and the arrays' contents, which the
 * caller may change between calls, so they are compared, not trusted
 * (the checks of the two count arrays were a ninth of a 1 KiB
 * all_to_all_v's instructions at n = 2). Groups of up to MEMO_V_RANKS. */
#define MEMO_V_RANKS 16
typedef struct memo_v {
  memo_t m; /* m.a as checked: count is the sum of scounts */
  size_t arr[4][MEMO_V_RANKS];
} memo_v_t;
static _Thread_local memo_v_t tl_memo_v;

static void v_arrays(const tdist_backend_args_t *a, const size_t *out[4]) {
  out[0] = a->scounts;
  out[1] = a->sdispls;
  out[2] = a->rcounts;
  out[3] = a->rdispls;
}

static int memo_v_hit(const tdist_group_t *g, tdist_backend_args_t *a) {
  const tdist_backend_args_t *m = &tl_memo_v.m.a;
  if (!memo_group(&tl_memo_v.m, g) || m->type != a->type || m->sendbuf != a->sendbuf ||
      m->recvbuf != a->recvbuf || m->dtype != a->dtype || m->scounts != a->scounts ||
      m->sdispls != a->sdispls || m->rcounts != a->rcounts || m->rdispls != a->rdispls)
    return 0;
  const size_t *arr[4];
  v_arrays(a, arr);
  for (int k = 0; k < 4; k++)
    if (arr[k] && memcmp(arr[k], tl_memo_v.arr[k], sizeof(size_t) * (size_t)g->size) != 0) return 0;
  a->count = m->count; /* what extent set: the sum of the send counts */
  return 1;
}

static void memo_v_keep(const tdist_group_t *g, const tdist_backend_args_t *a) {
  const size_t *arr[4];
  tl_memo_v.m.g = NULL; /* no entry while it is rewritten */
  if (g->size > MEMO_V_RANKS) return;
  v_arrays(a, arr);
  for (int k = 0; k < 4; k++)
    if (arr[k]) memcpy(tl_memo_v.arr[k], arr[k], sizeof(size_t) * (size_t)g->size);
  memo_keep(&tl_memo_v.m, g, a);
}

static int check_args(tdist_group_t *g, tdist_backend_args_t *a, const char *fn);

int tdist__op_check(tdist_group_t *g, tdist_backend_args_t *a, const char *fn) {
  const tdist_optype_t t = a->type;
  TDIST_CHECK(check_group(g, t, fn));
  if (t == TDIST_OP_BARRIER) return 0; /* no buffers */
  if (t == TDIST_OP_BATCH_P2P) return check_batch(g, a, fn);
  if ((unsigned)t >= TDIST_OPTYPE_COUNT)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "%s: unknown op %d", fn, (int)t);
  /* The other v-ops' checks also change the descriptor (a side not read
   * dropped): checked every time. */
  int fixed = !tdist_backend_op_is_v(t), a2av = t == TDIST_OP_ALL_TO_ALL_V;
  if (fixed ? memo_hit(g, a) : a2av && memo_v_hit(g, a)) return 0;
  TDIST_CHECK(check_args(g, a, fn));
  if (fixed)
    memo_keep(&tl_memo, g, a);
  else if (a2av)
    memo_v_keep(g, a);
  return 0;
}

/* 2-7 of a known op with buffers (opcheck.h). */
static int check_args(tdist_group_t *g, tdist_backend_args_t *a, const char *fn) {
  const tdist_optype_t t = a->type;
  const unsigned props = tdist_backend_op_props(t);
  TDIST_CHECK(check_scalars(g, a, props, fn));
  const size_t es = tdist_dtype_size(a->dtype);
  size_t elems;
  if (t == TDIST_OP_BROADCAST || t == TDIST_OP_SEND || t == TDIST_OP_RECV) { /* one buffer */
    TDIST_CHECK(check_count(a->count, 1, es, &elems, fn));
    return check_buf(g, t == TDIST_OP_SEND ? a->sendbuf : a->recvbuf, a->count, "buf", fn);
  }
  const int is_root = !(props & TDIST_BACKEND_OP_ROOTED) || g->rank == a->root;
  span_t sp = {0, 0, 0, IP_NONE, "sendbuf", "recvbuf", NULL};
  if (props & TDIST_BACKEND_OP_V)
    TDIST_CHECK(span_v(g, a, es, is_root, &sp, fn));
  else
    TDIST_CHECK(span_fixed(g, a, es, is_root, &sp, fn));
  /* 6, 7: buffers, overlap */
  TDIST_CHECK(check_buf(g, a->sendbuf, sp.sn, sp.sname, fn));
  TDIST_CHECK(check_buf(g, a->recvbuf, sp.rn, sp.rname, fn));
  return check_overlap(a->sendbuf, sp.sn * es, a->recvbuf, sp.rn * es, sp.ip, sp.off * es, sp.form,
                       fn);
}
