/*
 * test_cpu_ops.c - every op x dtype x reduction of the CPU backend at one
 * world size (argv[1], default 2), over real sockets between forked ranks,
 * checked element by element against a reference computed locally.
 *
 * Sizes: 0, 1, 7 (odd) and 1000 elements for the whole matrix, plus ~1 MiB
 * (odd counts, above every size threshold, so the ring, chain and segmented
 * paths run) for a few dtypes. In-place and out-of-place alternate. Point-to-
 * point: a ring of send/recv with two tags, batches that both send first, and
 * sends to self. One init per world size keeps the runtime low.
 *
 * The matrix covers the first eight types and six reductions, the ones
 * cpu_test_util.h models; the later ones (uint32/64, float8, bool, int16/
 * uint16, band/bor/bxor) are in test_cpu_dtypes.c.
 */
#include "cpu_test_util.h"

#define FAIL_AT(what, ...)                                      \
  do {                                                          \
    fprintf(stderr, "[rank %d] " what "\n", rank, __VA_ARGS__); \
    return 1;                                                   \
  } while (0)

static const size_t small_sizes[] = {0, 1, 7, 1000};
/* The types and reductions cpu_test_util.h's generators and reference know. */
enum { NTYPES = TDIST_FLOAT64 + 1, NREDOPS = TDIST_PREMUL_SUM + 1 };
static const size_t big = 300007; /* ~1.2 MiB of float32; odd */

static int check_reduced(int rank, const char *op, const void *out, size_t count, size_t first,
                         int n, int salt, tdist_redop_t rop, tdist_dtype_t dt, double scalar) {
  for (size_t i = 0; i < count; i++) {
    double want = ref_reduce(first + i, n, salt, rop, dt, scalar), got = get_el(out, dt, i);
    if (!close_enough(got, want, dt))
      FAIL_AT("%s %s %s count %zu: [%zu] = %g, want %g", op, tdist_dtype_name(dt),
              tdist_redop_name(rop), count, i, got, want);
  }
  return 0;
}

/* all_reduce, reduce, reduce_scatter for one (dtype, redop, count). */
static int reductions(tdist_group_t *g, int rank, int n, tdist_dtype_t dt, tdist_redop_t rop,
                      size_t count, int salt) {
  size_t es = tdist_dtype_size(dt);
  double scalar = 0.5;
  tdist_op_opts_t o = {.mask = TDIST_OP_FIELD_SCALAR, .premul_scalar = scalar};
  uint8_t *in = malloc(es * count * (size_t)n + 1), *out = malloc(es * count * (size_t)n + 1);
  int in_place = salt & 1, root = salt % n;

  /* all_reduce */
  fill(in, dt, count, rank, salt, rop);
  if (in_place) memcpy(out, in, es * count);
  MP_CHECK_RC(tdist_all_reduce(g, in_place ? out : in, out, count, dt, rop, &o, NULL));
  if (check_reduced(rank, "all_reduce", out, count, 0, n, salt, rop, dt, scalar)) return 1;

  /* reduce to a rotating root */
  memset(out, 0x5a, es * count);
  if (in_place && rank == root) memcpy(out, in, es * count);
  MP_CHECK_RC(tdist_reduce(g, in_place && rank == root ? out : in, rank == root ? out : NULL, count,
                           dt, rop, root, &o, NULL));
  if (rank == root && check_reduced(rank, "reduce", out, count, 0, n, salt, rop, dt, scalar))
    return 1;
  /* the input must be untouched */
  for (size_t i = 0; i < count && !(in_place && rank == root); i++)
    if (get_el(in, dt, i) != gen(rank, i, salt, rop, dt))
      FAIL_AT("reduce clobbered sendbuf[%zu]", i);

  /* reduce_scatter: block b of every rank's input is element range b*count.. */
  fill(in, dt, count * (size_t)n, rank, salt, rop);
  void *rs_out = in_place ? in + (size_t)rank * count * es : out;
  MP_CHECK_RC(tdist_reduce_scatter(g, in, rs_out, count, dt, rop, &o, NULL));
  if (check_reduced(rank, "reduce_scatter", rs_out, count, (size_t)rank * count, n, salt, rop, dt,
                    scalar))
    return 1;
  free(in);
  free(out);
  return 0;
}

/* Data movement: broadcast, all_gather, gather, scatter, all_to_all. */
static int movement(tdist_group_t *g, int rank, int n, tdist_dtype_t dt, size_t count, int salt) {
  size_t es = tdist_dtype_size(dt), whole = count * (size_t)n;
  uint8_t *a = malloc(es * whole + 1), *b = malloc(es * whole + 1);
  int root = (salt / 2) % n, in_place = salt & 1;

  fill(a, dt, count, rank == root ? 1000 : rank, salt, TDIST_SUM);
  MP_CHECK_RC(tdist_broadcast(g, a, count, dt, root, NULL, NULL));
  for (size_t i = 0; i < count; i++)
    if (get_el(a, dt, i) != gen(1000, i, salt, TDIST_SUM, dt))
      FAIL_AT("broadcast %s count %zu root %d: [%zu] wrong", tdist_dtype_name(dt), count, root, i);

  /* all_gather: rank r contributes gen(r, i) */
  memset(b, 0x33, es * whole);
  fill(in_place ? b + (size_t)rank * count * es : a, dt, count, rank, salt, TDIST_SUM);
  MP_CHECK_RC(
      tdist_all_gather(g, in_place ? b + (size_t)rank * count * es : a, b, count, dt, NULL, NULL));
  for (int r = 0; r < n; r++)
    for (size_t i = 0; i < count; i++)
      if (get_el(b, dt, (size_t)r * count + i) != gen(r, i, salt, TDIST_SUM, dt))
        FAIL_AT("all_gather %s count %zu: block %d [%zu] wrong", tdist_dtype_name(dt), count, r, i);

  /* gather */
  fill(a, dt, count, rank, salt + 1, TDIST_SUM);
  memset(b, 0x33, es * whole);
  MP_CHECK_RC(tdist_gather(g, a, rank == root ? b : NULL, count, dt, root, NULL, NULL));
  for (int r = 0; rank == root && r < n; r++)
    for (size_t i = 0; i < count; i++)
      if (get_el(b, dt, (size_t)r * count + i) != gen(r, i, salt + 1, TDIST_SUM, dt))
        FAIL_AT("gather %s count %zu: block %d [%zu] wrong", tdist_dtype_name(dt), count, r, i);

  /* scatter: root's block r holds gen(r + 50, i) */
  if (rank == root)
    for (int r = 0; r < n; r++)
      fill(a + (size_t)r * count * es, dt, count, r + 50, salt, TDIST_SUM);
  memset(b, 0x33, es * count);
  MP_CHECK_RC(tdist_scatter(g, rank == root ? a : NULL, b, count, dt, root, NULL, NULL));
  for (size_t i = 0; i < count; i++)
    if (get_el(b, dt, i) != gen(rank + 50, i, salt, TDIST_SUM, dt))
      FAIL_AT("scatter %s count %zu: [%zu] wrong", tdist_dtype_name(dt), count, i);

  /* all_to_all: block j of rank i is gen(i * 16 + j) */
  for (int j = 0; j < n; j++)
    fill(a + (size_t)j * count * es, dt, count, rank * 16 + j, salt, TDIST_SUM);
  memset(b, 0x33, es * whole);
  MP_CHECK_RC(tdist_all_to_all(g, a, b, count, dt, NULL, NULL));
  for (int i = 0; i < n; i++)
    for (size_t e = 0; e < count; e++)
      if (get_el(b, dt, (size_t)i * count + e) != gen(i * 16 + rank, e, salt, TDIST_SUM, dt))
        FAIL_AT("all_to_all %s count %zu: block %d [%zu] wrong", tdist_dtype_name(dt), count, i, e);
  free(a);
  free(b);
  return 0;
}

static int p2p(tdist_group_t *g, int rank, int n) {
  enum { C = 777 };
  int32_t *s0 = malloc(C * 4), *s1 = malloc(C * 4), *r0 = malloc(C * 4), *r1 = malloc(C * 4);
  int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  for (int i = 0; i < C; i++) {
    s0[i] = rank * 100000 + i;
    s1[i] = -rank * 100000 - i;
  }
  /* Two tags, received in the opposite order from the sends. */
  tdist_op_opts_t t0 = {.mask = TDIST_OP_FIELD_TAG, .tag = 0};
  tdist_op_opts_t t1 = {.mask = TDIST_OP_FIELD_TAG, .tag = 1};
  tdist_work_t *w[4];
  MP_CHECK_RC(tdist_isend(g, s0, C, TDIST_INT32, next, &t0, &w[0]));
  MP_CHECK_RC(tdist_isend(g, s1, C, TDIST_INT32, next, &t1, &w[1]));
  MP_CHECK_RC(tdist_irecv(g, r1, C, TDIST_INT32, prev, &t1, &w[2]));
  MP_CHECK_RC(tdist_irecv(g, r0, C, TDIST_INT32, prev, &t0, &w[3]));
  MP_CHECK_RC(tdist_wait_all(w, 4, 0));
  for (int i = 0; i < 4; i++)
    tdist_work_release(w[i]);
  for (int i = 0; i < C; i++)
    if (r0[i] != prev * 100000 + i || r1[i] != -prev * 100000 - i)
      FAIL_AT("p2p tagged recv [%d] wrong", i);

  /* A batch where everybody sends first (no deadlock), plus a self send. */
  memset(r0, 0, C * 4);
  memset(r1, 0, C * 4);
  tdist_p2p_op_t b[4] = {
      {TDIST_P2P_SEND, s0, C, TDIST_INT32, next, 3},
      {TDIST_P2P_SEND, s1, C, TDIST_INT32, rank, 4},
      {TDIST_P2P_RECV, r0, C, TDIST_INT32, prev, 3},
      {TDIST_P2P_RECV, r1, C, TDIST_INT32, rank, 4},
  };
  MP_CHECK_RC(tdist_batch_isend_irecv(g, b, 4, NULL, &w[0]));
  MP_CHECK_RC(tdist_work_wait(w[0], 0));
  tdist_work_release(w[0]);
  for (int i = 0; i < C; i++)
    if (r0[i] != prev * 100000 + i || r1[i] != s1[i]) FAIL_AT("batch recv [%d] wrong", i);

  /* Blocking forms, 1 MiB, between rank pairs (0<->1, 2<->3, ...). */
  size_t bigc = 1 << 18;
  int32_t *x = malloc(bigc * 4);
  int peer = rank ^ 1;
  if (peer < n) {
    for (size_t i = 0; i < bigc; i++)
      x[i] = (int32_t)(i * 3 + (size_t)rank);
    if (rank % 2 == 0) {
      MP_CHECK_RC(tdist_send(g, x, bigc, TDIST_INT32, peer, NULL));
      MP_CHECK_RC(tdist_recv(g, x, bigc, TDIST_INT32, peer, NULL));
    } else {
      int32_t *y = malloc(bigc * 4);
      MP_CHECK_RC(tdist_recv(g, y, bigc, TDIST_INT32, peer, NULL));
      MP_CHECK_RC(tdist_send(g, x, bigc, TDIST_INT32, peer, NULL));
      memcpy(x, y, bigc * 4);
      free(y);
    }
    for (size_t i = 0; i < bigc; i++)
      if (x[i] != (int32_t)(i * 3 + (size_t)peer)) FAIL_AT("send/recv [%zu] wrong", i);
  }
  free(x);
  free(s0);
  free(s1);
  free(r0);
  free(r1);
  return 0;
}

static int child(int rank, int n, void *arg) {
  tdist_group_t *g = NULL;
  MP_CHECK_RC(cpu_test_init(*(int *)arg, rank, n, 60000, &g));
  int salt = 0;
  for (int dt = 0; dt < NTYPES; dt++)
    for (int op = 0; op < NREDOPS; op++)
      for (size_t s = 0; s < sizeof(small_sizes) / sizeof(small_sizes[0]); s++)
        if (reductions(g, rank, n, (tdist_dtype_t)dt, (tdist_redop_t)op, small_sizes[s], salt++))
          return 1;
  /* Large: ring / segmented paths. */
  static const struct {
    tdist_dtype_t dt;
    tdist_redop_t op;
  } bigcases[] = {{TDIST_FLOAT32, TDIST_SUM},
                  {TDIST_BFLOAT16, TDIST_AVG},
                  {TDIST_INT32, TDIST_MAX},
                  {TDIST_FLOAT64, TDIST_PREMUL_SUM},
                  {TDIST_FLOAT16, TDIST_PROD}};
  for (size_t i = 0; i < sizeof(bigcases) / sizeof(bigcases[0]); i++)
    if (reductions(g, rank, n, bigcases[i].dt, bigcases[i].op, big / (size_t)(n > 2 ? n : 1),
                   salt++))
      return 1;
  for (int dt = 0; dt < NTYPES; dt++)
    for (size_t s = 0; s < sizeof(small_sizes) / sizeof(small_sizes[0]); s++)
      if (movement(g, rank, n, (tdist_dtype_t)dt, small_sizes[s], salt++)) return 1;
  if (movement(g, rank, n, TDIST_FLOAT32, big, salt++)) return 1;
  if (movement(g, rank, n, TDIST_UINT8, big * 4 + 1, salt++)) return 1;
  MP_CHECK_RC(tdist_barrier(g, NULL, NULL));
  if (p2p(g, rank, n)) return 1;
  MP_CHECK_RC(tdist_barrier(g, NULL, NULL));
  MP_CHECK_RC(tdist_group_destroy(g));
  return 0;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 2;
  int port = tdist_mp_free_port();
  int rc = tdist_mp_run(n, child, &port, 170);
  printf("cpu_ops n=%d: %s\n", n, rc ? "FAILED" : "ok");
  return rc ? 1 : 0;
}
