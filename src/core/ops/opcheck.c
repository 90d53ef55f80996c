/*
 * opcheck.c - the one argument checker of the public ops (layer 6; the rules
 * and their order are in opcheck.h). ops.c and ops_v.c fill a descriptor
 * and call tdist__op_check; nothing here allocates.
 *
 * What is checked is what one rank can check alone. Agreement between ranks
 * (the same op, count, dtype, reduction and root; rank i's send_counts[j] ==
 * rank j's recv_counts[i]) needs the other ranks' view: the CPU backend
 * compares them in its message headers (cpu/sigcheck.c, cpu/algos_v.c) and
 * fails TDIST_ERR_MISMATCH.
 */
#include <stdint.h>
#include <stdio.h>

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

int tdist__op_check(tdist_group_t *g, tdist_backend_args_t *a, const char *fn) {
  const tdist_optype_t t = a->type;
  const unsigned props = tdist_backend_op_props(t);
  TDIST_CHECK(check_group(g, t, fn));
  if (t == TDIST_OP_BARRIER) return 0; /* no buffers */
  if (t == TDIST_OP_BATCH_P2P) return check_batch(g, a, fn);

  /* 2-4: dtype, reduction, root or peer */
  TDIST_CHECK(check_dtype(g, a->dtype, fn));
  if (props & TDIST_BACKEND_OP_REDUCING) TDIST_CHECK(check_redop(g, a->redop, a->dtype, fn));
  if (props & TDIST_BACKEND_OP_ROOTED) TDIST_CHECK(check_rank(g, a->root, "root", fn));
  if (props & TDIST_BACKEND_OP_PEER) {
    int recv = t == TDIST_OP_RECV;
    if (recv && a->root == TDIST_ANY_SOURCE)
      TDIST_CHECK(check_any(g, "TDIST_ANY_SOURCE", fn));
    else
      TDIST_CHECK(check_rank(g, a->root, "peer", fn));
    if (recv && a->tag == TDIST_ANY_TAG)
      TDIST_CHECK(check_any(g, "TDIST_ANY_TAG", fn));
    else if (a->tag < 0)
      return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "%s: tag %d < 0", fn, a->tag);
  }

  /* 5: sizes. sn / rn: the elements this rank reads from sendbuf / writes
   * to recvbuf (0 where it does not use the buffer); ip, off, form: the
   * op's in-place form. */
  const size_t es = tdist_dtype_size(a->dtype), n = (size_t)g->size;
  const int rank = g->rank, is_root = !(props & TDIST_BACKEND_OP_ROOTED) || rank == a->root;
  size_t sn = 0, rn = 0, off = 0, elems;
  int ip = IP_NONE;
  const char *sname = "sendbuf", *rname = "recvbuf", *form = NULL;
  switch (t) {
  case TDIST_OP_BROADCAST:
  case TDIST_OP_SEND:
  case TDIST_OP_RECV: /* one buffer */
    TDIST_CHECK(check_count(a->count, 1, es, &elems, fn));
    return check_buf(g, t == TDIST_OP_SEND ? a->sendbuf : a->recvbuf, a->count, "buf", fn);
  case TDIST_OP_ALL_REDUCE:
  case TDIST_OP_REDUCE:
    TDIST_CHECK(check_count(a->count, 1, es, &elems, fn));
    sn = a->count;
    rn = is_root ? a->count : 0;
    if (t == TDIST_OP_REDUCE) rname = "recvbuf (on root)";
    ip = IP_SAME;
    form = "sendbuf == recvbuf";
    break;
  case TDIST_OP_ALL_GATHER:
  case TDIST_OP_GATHER:
    TDIST_CHECK(check_count(a->count, n, es, &elems, fn));
    sn = a->count;
    rn = is_root ? elems : 0;
    ip = IP_SEND_IN_RECV;
    if (t == TDIST_OP_ALL_GATHER) {
      off = (size_t)rank * a->count;
      form = "sendbuf == recvbuf + rank * count elements";
    } else {
      off = (size_t)a->root * a->count;
      rname = "recvbuf (on root)";
      form = "sendbuf == recvbuf + root * count elements, on root";
    }
    break;
  case TDIST_OP_SCATTER:
    TDIST_CHECK(check_count(a->count, n, es, &elems, fn));
    sn = is_root ? elems : 0;
    rn = a->count;
    sname = "sendbuf (on root)";
    ip = IP_RECV_IN_SEND;
    off = (size_t)a->root * a->count;
    form = "recvbuf == sendbuf + root * count elements, on root";
    break;
  case TDIST_OP_REDUCE_SCATTER:
    TDIST_CHECK(check_count(a->count, n, es, &elems, fn));
    sn = elems;
    rn = a->count;
    ip = IP_RECV_IN_SEND;
    off = (size_t)rank * a->count;
    form = "recvbuf == sendbuf + rank * count elements";
    break;
  case TDIST_OP_ALL_TO_ALL:
    TDIST_CHECK(check_count(a->count, n, es, &elems, fn));
    sn = rn = elems;
    break;
  case TDIST_OP_ALL_TO_ALL_V:
    TDIST_CHECK(extent(g, a->scounts, a->sdispls, es, "send_counts", fn, &sn, &a->count));
    TDIST_CHECK(extent(g, a->rcounts, a->rdispls, es, "recv_counts", fn, &rn, NULL));
    break;
  case TDIST_OP_ALL_GATHER_V:
  case TDIST_OP_GATHER_V:
    TDIST_CHECK(check_count(a->count, 1, es, &elems, fn));
    sn = a->count;
    if (!is_root) { /* gather_v off root: the receive side is not read */
      a->rcounts = a->rdispls = NULL;
      break;
    }
    TDIST_CHECK(extent(g, a->rcounts, a->rdispls, es, "recv_counts", fn, &rn, NULL));
    if (a->rcounts[rank] != a->count)
      return tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                          "%s: recv_counts[%d] = %zu but this rank's send_count is %zu", fn, rank,
                          a->rcounts[rank], a->count);
    ip = IP_SEND_IN_RECV;
    off = block_at(a->rdispls, a->rcounts, t == TDIST_OP_GATHER_V ? a->root : rank);
    if (t == TDIST_OP_GATHER_V) {
      rname = "recvbuf (on root)";
      form = "sendbuf == recvbuf + recv_displs[root] elements, on root";
    } else {
      form = "sendbuf == recvbuf + recv_displs[rank] elements";
    }
    break;
  case TDIST_OP_SCATTER_V:
    TDIST_CHECK(check_count(a->count, 1, es, &elems, fn));
    rn = a->count;
    if (!is_root) { /* off root: the send side is not read */
      a->scounts = a->sdispls = NULL;
      break;
    }
    TDIST_CHECK(extent(g, a->scounts, a->sdispls, es, "send_counts", fn, &sn, NULL));
    if (a->scounts[rank] != a->count)
      return tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                          "%s: send_counts[%d] = %zu but root's recv_count is %zu", fn, rank,
                          a->scounts[rank], a->count);
    sname = "sendbuf (on root)";
    ip = IP_RECV_IN_SEND;
    off = block_at(a->sdispls, a->scounts, rank);
    form = "recvbuf == sendbuf + send_displs[root] elements, on root";
    break;
  case TDIST_OP_REDUCE_SCATTER_V:
    TDIST_CHECK(extent(g, a->rcounts, NULL, es, "recv_counts", fn, &sn, NULL));
    rn = a->count = a->rcounts[rank];
    ip = IP_RECV_IN_SEND;
    off = block_at(NULL, a->rcounts, rank);
    form = "recvbuf == sendbuf + (recv_counts[0] + ... + recv_counts[rank-1]) elements";
    break;
  default: return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "%s: unknown op %d", fn, (int)t);
  }

  /* 6, 7: buffers, overlap */
  TDIST_CHECK(check_buf(g, a->sendbuf, sn, sname, fn));
  TDIST_CHECK(check_buf(g, a->recvbuf, rn, rname, fn));
  return check_overlap(a->sendbuf, sn * es, a->recvbuf, rn * es, ip, off * es, form, fn);
}
