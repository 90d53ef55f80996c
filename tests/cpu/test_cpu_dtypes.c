/*
 * test_cpu_dtypes.c - the element types and reductions added after the first
 * matrix (uint32, uint64, float8 e4m3/e5m2, bool, int16, uint16; band, bor,
 * bxor on every integer type and bool) over real sockets between forked
 * ranks, at one world size (argv[1], default 2; ctest runs 1..5).
 *
 * Inputs are random (a hash of rank, element and case), and every rank
 * computes the expected result of all ranks' inputs itself. Integer results
 * are exact whatever the reduction order (wrapping sums and products are);
 * float8 inputs are drawn so that every partial sum or product is exact in
 * the type, so the reference does not depend on the order either. Checked
 * bit for bit: all_reduce (in and out of place), reduce to a rotating root,
 * reduce_scatter, small (recursive doubling) and large (ring) counts; every
 * rank's all_reduce result is all-gathered and must be identical on all
 * ranks. Also: +0/-0/NaN/inf under MIN/MAX/SUM/PROD give the same bits on
 * every rank (small messages, the path whose operand order depended on the
 * rank); data movement of the new types; and what the core refuses (a
 * bitwise op on a float, AVG of bool, overlapping all_to_all / scatter /
 * all_reduce buffers).
 */
#include "cpu_test_util.h"

#define FAILF(...)                       \
  do {                                   \
    fprintf(stderr, "[rank %d] ", rank); \
    fprintf(stderr, __VA_ARGS__);        \
    fprintf(stderr, "\n");               \
    return 1;                            \
  } while (0)

static uint64_t mix(uint64_t x) { /* splitmix64 */
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static int is_fp8(tdist_dtype_t dt) { return dt == TDIST_FLOAT8_E4M3 || dt == TDIST_FLOAT8_E5M2; }
static int is_signed(tdist_dtype_t dt) {
  return dt == TDIST_INT8 || dt == TDIST_INT16 || dt == TDIST_INT32 || dt == TDIST_INT64;
}
static float f8_get(tdist_dtype_t dt, uint8_t b) {
  return dt == TDIST_FLOAT8_E4M3 ? tdist__cpu_e4m3_to_float(b) : tdist__cpu_e5m2_to_float(b);
}
static uint8_t f8_put(tdist_dtype_t dt, float f) {
  return dt == TDIST_FLOAT8_E4M3 ? tdist__cpu_float_to_e4m3(f) : tdist__cpu_float_to_e5m2(f);
}

/* Raw bits (zero-extended) of element i of `rank`'s input for case `salt`. */
static uint64_t gen_bits(tdist_dtype_t dt, tdist_redop_t op, int rank, size_t i, int salt) {
  uint64_t h = mix(((uint64_t)salt << 40) ^ ((uint64_t)rank << 32) ^ i);
  size_t es = tdist_dtype_size(dt);
  if (dt == TDIST_BOOL) {
    static const uint8_t b[] = {0, 1, 2, 255, 0, 1}; /* trues that are not 1 too */
    return b[h % 6];
  }
  if (!is_fp8(dt)) return es == 8 ? h : h & ((UINT64_C(1) << (es * 8)) - 1);
  /* float8: exact partial results whatever the order (see the top). */
  int e4 = dt == TDIST_FLOAT8_E4M3;
  float v;
  if (op == TDIST_PROD) {
    static const float p[] = {-2, -1, -0.5f, 0.5f, 1, 2};
    v = p[h % 6];
  } else if (op == TDIST_MIN || op == TDIST_MAX) {
    uint8_t b = (uint8_t)h;
    if (isnan(f8_get(dt, b)) || isinf(f8_get(dt, b))) b &= 0x83; /* a small finite */
    return b;
  } else {
    v = e4 ? (float)((int)(h % 7) - 3) * 0.5f : (float)((int)(h % 3) - 1);
  }
  return f8_put(dt, v);
}

/* Signed value of raw bits of an integer type (sign-extended). */
static int64_t sext(uint64_t b, size_t es) {
  if (es == 8) return (int64_t)b;
  uint64_t m = UINT64_C(1) << (es * 8 - 1);
  return (int64_t)((b ^ m) - m);
}

/* PREMUL_SUM input scaling of an integer, as the backend does it (double,
 * truncate, saturate); uint64 bounds compared in double. */
static uint64_t scale_int(uint64_t b, tdist_dtype_t dt, double s) {
  size_t es = tdist_dtype_size(dt);
  int sg = is_signed(dt);
  double x = sg ? (double)sext(b, es) : (double)b, v = x * s;
  double lo = sg ? -ldexp(1, (int)es * 8 - 1) : 0;
  double hi = sg ? ldexp(1, (int)es * 8 - 1) - 1 : ldexp(1, (int)es * 8) - 1;
  if (v != v) return 0;
  if (v <= lo) return sg ? (uint64_t)(int64_t)lo : 0;
  if (v >= hi)
    return sg ? (uint64_t)(es == 8 ? INT64_MAX : (int64_t)hi)
              : (es == 8 ? UINT64_MAX : (uint64_t)hi);
  return sg ? (uint64_t)(int64_t)v : (uint64_t)v;
}

static float fmin_ieee(float a, float b) { return a < b ? a : b < a ? b : signbit(a) ? a : b; }
static float fmax_ieee(float a, float b) { return a > b ? a : b > a ? b : signbit(a) ? b : a; }

/* Expected raw bits of element i reduced over n ranks. */
static uint64_t ref_bits(tdist_dtype_t dt, tdist_redop_t op, size_t i, int n, int salt, double s) {
  size_t es = tdist_dtype_size(dt);
  uint64_t mask = es == 8 ? UINT64_MAX : (UINT64_C(1) << (es * 8)) - 1;
  if (dt == TDIST_BOOL) {
    int acc = gen_bits(dt, op, 0, i, salt) != 0;
    for (int r = 1; r < n; r++) {
      int v = gen_bits(dt, op, r, i, salt) != 0;
      acc = op == TDIST_PROD || op == TDIST_MIN || op == TDIST_BAND ? acc & v
            : op == TDIST_BXOR                                      ? acc ^ v
                                                                    : acc | v;
    }
    return (uint64_t)acc;
  }
  if (is_fp8(dt)) {
    float acc = 0;
    for (int r = 0; r < n; r++) {
      float v = f8_get(dt, (uint8_t)gen_bits(dt, op, r, i, salt));
      if (op == TDIST_PREMUL_SUM) v = f8_get(dt, f8_put(dt, v * (float)s));
      acc = r == 0             ? v
            : op == TDIST_PROD ? acc * v
            : op == TDIST_MIN  ? fmin_ieee(acc, v)
            : op == TDIST_MAX  ? fmax_ieee(acc, v)
                               : acc + v;
    }
    if (op == TDIST_AVG) acc = f8_get(dt, f8_put(dt, acc)) / (float)n;
    return f8_put(dt, acc);
  }
  int sg = is_signed(dt);
  uint64_t acc = 0;
  for (int r = 0; r < n; r++) {
    uint64_t v = gen_bits(dt, op, r, i, salt);
    if (op == TDIST_PREMUL_SUM) v = scale_int(v, dt, s);
    if (r == 0) {
      acc = v;
      continue;
    }
    switch (op) {
    case TDIST_PROD: acc *= v; break;
    case TDIST_MIN:
      acc = sg ? (sext(v, es) < sext(acc, es) ? v : acc) : ((v & mask) < (acc & mask) ? v : acc);
      break;
    case TDIST_MAX:
      acc = sg ? (sext(v, es) > sext(acc, es) ? v : acc) : ((v & mask) > (acc & mask) ? v : acc);
      break;
    case TDIST_BAND: acc &= v; break;
    case TDIST_BOR: acc |= v; break;
    case TDIST_BXOR: acc ^= v; break;
    default: acc += v; break;
    }
    acc &= mask;
  }
  acc &= mask;
  if (op == TDIST_AVG)
    acc = sg ? (uint64_t)(sext(acc, es) / n) : acc / (uint64_t)n; /* the wrapped sum / n */
  return acc & mask;
}

static uint64_t get_bits(const uint8_t *p, size_t es, size_t i) {
  uint64_t v = 0;
  memcpy(&v, p + i * es, es);
  return v;
}

static void fill_bits(uint8_t *p, tdist_dtype_t dt, tdist_redop_t op, int rank, size_t off,
                      size_t count, int salt) {
  size_t es = tdist_dtype_size(dt);
  for (size_t i = 0; i < count; i++) {
    uint64_t v = gen_bits(dt, op, rank, off + i, salt);
    memcpy(p + i * es, &v, es);
  }
}

static int check_out(int rank, const char *what, const uint8_t *out, size_t count, size_t first,
                     int n, int salt, tdist_dtype_t dt, tdist_redop_t op, double s) {
  size_t es = tdist_dtype_size(dt);
  for (size_t i = 0; i < count; i++) {
    uint64_t got = get_bits(out, es, i), want = ref_bits(dt, op, first + i, n, salt, s);
    if (got != want)
      FAILF("%s %s %s count %zu: [%zu] = 0x%llx, want 0x%llx", what, tdist_dtype_name(dt),
            tdist_redop_name(op), count, i, (unsigned long long)got, (unsigned long long)want);
  }
  return 0;
}

/* Every rank's `bytes` at p are the same (all-gathered as uint8). */
static int same_everywhere(tdist_group_t *g, int rank, int n, const uint8_t *p, size_t bytes,
                           const char *what) {
  if (!bytes) return 0;
  uint8_t *all = malloc(bytes * (size_t)n);
  MP_CHECK_RC(tdist_all_gather(g, p, all, bytes, TDIST_UINT8, NULL, NULL));
  for (int r = 0; r < n; r++)
    if (memcmp(all + (size_t)r * bytes, p, bytes))
      FAILF("%s: rank %d's result differs from rank %d's", what, r, rank);
  free(all);
  return 0;
}

static int reductions(tdist_group_t *g, int rank, int n, tdist_dtype_t dt, tdist_redop_t op,
                      size_t count, int salt) {
  size_t es = tdist_dtype_size(dt), bytes = es * count;
  double s = is_fp8(dt) ? 0.5 : -1.75;
  tdist_op_opts_t o = {.mask = TDIST_OP_FIELD_SCALAR, .premul_scalar = s};
  uint8_t *in = malloc(bytes * (size_t)n + 1), *out = malloc(bytes * (size_t)n + 1);
  int in_place = salt & 1, root = salt % n;
  char what[64];
  snprintf(what, sizeof(what), "all_reduce %s %s", tdist_dtype_name(dt), tdist_redop_name(op));

  fill_bits(in, dt, op, rank, 0, count, salt);
  if (in_place) memcpy(out, in, bytes);
  MP_CHECK_RC(tdist_all_reduce(g, in_place ? out : in, out, count, dt, op, &o, NULL));
  if (check_out(rank, "all_reduce", out, count, 0, n, salt, dt, op, s)) return 1;
  if (same_everywhere(g, rank, n, out, bytes, what)) return 1;

  memset(out, 0x5a, bytes);
  MP_CHECK_RC(tdist_reduce(g, in, rank == root ? out : NULL, count, dt, op, root, &o, NULL));
  if (rank == root && check_out(rank, "reduce", out, count, 0, n, salt, dt, op, s)) return 1;

  fill_bits(in, dt, op, rank, 0, count * (size_t)n, salt);
  uint8_t *rs = in_place ? in + (size_t)rank * bytes : out;
  MP_CHECK_RC(tdist_reduce_scatter(g, in, rs, count, dt, op, &o, NULL));
  if (check_out(rank, "reduce_scatter", rs, count, (size_t)rank * count, n, salt, dt, op, s))
    return 1;
  free(in);
  free(out);
  return 0;
}

static const tdist_dtype_t new_types[] = {TDIST_UINT32,      TDIST_UINT64, TDIST_FLOAT8_E4M3,
                                          TDIST_FLOAT8_E5M2, TDIST_BOOL,   TDIST_INT16,
                                          TDIST_UINT16};
static const tdist_dtype_t old_ints[] = {TDIST_INT8, TDIST_UINT8, TDIST_INT32, TDIST_INT64};
#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

static int valid(tdist_dtype_t dt, tdist_redop_t op) {
  if (is_fp8(dt)) return op != TDIST_BAND && op != TDIST_BOR && op != TDIST_BXOR;
  if (dt == TDIST_BOOL) return op != TDIST_AVG && op != TDIST_PREMUL_SUM;
  return 1;
}

/* +0, -0, NaN (both signs), inf, 1, -1 under MIN/MAX/SUM/PROD, small
 * messages: identical bits on every rank; MIN/MAX NaN where any input is. */
static int specials(tdist_group_t *g, int rank, int n, int salt) {
  static const float sp[] = {0.0f, -0.0f, NAN, -NAN, INFINITY, -INFINITY, 1.0f, -1.0f};
  static const tdist_dtype_t fts[] = {TDIST_FLOAT32,  TDIST_FLOAT64,     TDIST_FLOAT16,
                                      TDIST_BFLOAT16, TDIST_FLOAT8_E4M3, TDIST_FLOAT8_E5M2};
  static const tdist_redop_t ops[] = {TDIST_MIN, TDIST_MAX, TDIST_SUM, TDIST_PROD};
  enum { C = 512 };
  for (size_t t = 0; t < NELEM(fts); t++)
    for (size_t o = 0; o < NELEM(ops); o++) {
      tdist_dtype_t dt = fts[t];
      size_t es = tdist_dtype_size(dt);
      uint8_t buf[C * 8];
      int anynan[C] = {0}, anyneg0[C] = {0}, anypos0[C] = {0};
      for (size_t i = 0; i < C; i++) {
        for (int r = 0; r < n; r++) {
          float v = sp[mix((uint64_t)salt * 1000003 + i * 31 + (uint64_t)r) % 8];
          if (is_fp8(dt) && isinf(v) && dt == TDIST_FLOAT8_E4M3) v = 448.0f;
          anynan[i] |= isnan(v) != 0;
          anyneg0[i] |= v == 0 && signbit(v);
          anypos0[i] |= v == 0 && !signbit(v);
          if (r != rank) continue;
          if (is_fp8(dt))
            buf[i] = f8_put(dt, v);
          else
            set_el(buf, dt, i, v);
        }
      }
      MP_CHECK_RC(tdist_all_reduce(g, buf, buf, C, dt, ops[o], NULL, NULL));
      char what[64];
      snprintf(what, sizeof(what), "specials %s %s", tdist_dtype_name(dt),
               tdist_redop_name(ops[o]));
      if (same_everywhere(g, rank, n, buf, C * es, what)) return 1;
      if (ops[o] != TDIST_MIN && ops[o] != TDIST_MAX) continue;
      for (size_t i = 0; i < C; i++) {
        double v = is_fp8(dt) ? f8_get(dt, buf[i]) : get_el(buf, dt, i);
        if ((isnan(v) != 0) != anynan[i])
          FAILF("%s [%zu] = %g: NaN iff an input is NaN", what, i, v);
        if (v == 0 && ops[o] == TDIST_MIN && anyneg0[i] && !signbit(v))
          FAILF("%s [%zu]: min with a -0 input is +0", what, i);
        if (v == 0 && ops[o] == TDIST_MAX && anypos0[i] && signbit(v))
          FAILF("%s [%zu]: max is -0 with a +0 input", what, i);
      }
    }
  return 0;
}

/* Broadcast, all_gather, all_to_all of the new types: bytes moved intact. */
static int movement(tdist_group_t *g, int rank, int n, tdist_dtype_t dt, size_t count, int salt) {
  size_t es = tdist_dtype_size(dt), bytes = es * count;
  uint8_t *a = malloc(bytes * (size_t)n + 1), *b = malloc(bytes * (size_t)n + 1);
  int root = salt % n;
  fill_bits(a, dt, TDIST_SUM, rank == root ? 99 : rank, 0, count, salt);
  MP_CHECK_RC(tdist_broadcast(g, a, count, dt, root, NULL, NULL));
  for (size_t i = 0; i < count; i++)
    if (get_bits(a, es, i) != gen_bits(dt, TDIST_SUM, 99, i, salt))
      FAILF("broadcast %s [%zu] wrong", tdist_dtype_name(dt), i);
  fill_bits(a, dt, TDIST_SUM, rank, 0, count, salt);
  MP_CHECK_RC(tdist_all_gather(g, a, b, count, dt, NULL, NULL));
  for (int r = 0; r < n; r++)
    for (size_t i = 0; i < count; i++)
      if (get_bits(b, es, (size_t)r * count + i) != gen_bits(dt, TDIST_SUM, r, i, salt))
        FAILF("all_gather %s block %d [%zu] wrong", tdist_dtype_name(dt), r, i);
  for (int j = 0; j < n; j++)
    fill_bits(a + (size_t)j * bytes, dt, TDIST_SUM, rank * 16 + j, 0, count, salt);
  MP_CHECK_RC(tdist_all_to_all(g, a, b, count, dt, NULL, NULL));
  for (int r = 0; r < n; r++)
    for (size_t i = 0; i < count; i++)
      if (get_bits(b, es, (size_t)r * count + i) != gen_bits(dt, TDIST_SUM, r * 16 + rank, i, salt))
        FAILF("all_to_all %s block %d [%zu] wrong", tdist_dtype_name(dt), r, i);
  free(a);
  free(b);
  return 0;
}

/* What the core refuses before anything is sent (no sequence number is
 * taken, so the ranks stay in step). */
static int refusals(tdist_group_t *g, int rank, int n) {
  static uint8_t buf[4096];
  MP_CHECK(tdist_all_reduce(g, buf, buf, 4, TDIST_FLOAT32, TDIST_BAND, NULL, NULL) ==
           TDIST_ERR_INVALID_ARGUMENT);
  MP_CHECK(strstr(tdist_last_error(), "bitwise") != NULL);
  MP_CHECK(tdist_reduce_scatter(g, buf, buf + 1024, 4, TDIST_FLOAT8_E4M3, TDIST_BXOR, NULL, NULL) ==
           TDIST_ERR_INVALID_ARGUMENT);
  MP_CHECK(tdist_reduce(g, buf, buf, 4, TDIST_BOOL, TDIST_AVG, 0, NULL, NULL) ==
           TDIST_ERR_INVALID_ARGUMENT);
  MP_CHECK(tdist_all_reduce(g, buf, buf, 4, TDIST_BOOL, TDIST_PREMUL_SUM, NULL, NULL) ==
           TDIST_ERR_INVALID_ARGUMENT);
  /* all_to_all: overlapping by one element, either way round. */
  MP_CHECK(tdist_all_to_all(g, buf, buf + 4, 2, TDIST_INT32, NULL, NULL) ==
           TDIST_ERR_INVALID_ARGUMENT);
  MP_CHECK(strstr(tdist_last_error(), "overlap") != NULL);
  MP_CHECK(tdist_all_to_all(g, buf + 4, buf, 2, TDIST_INT32, NULL, NULL) ==
           TDIST_ERR_INVALID_ARGUMENT);
  /* all_reduce: in place means identical. */
  MP_CHECK(tdist_all_reduce(g, buf, buf + 4, 4, TDIST_INT32, TDIST_SUM, NULL, NULL) ==
           TDIST_ERR_INVALID_ARGUMENT);
  /* scatter on its root: recvbuf over another block of sendbuf. */
  if (n > 1)
    MP_CHECK(tdist_scatter(g, buf, buf + 8 * (size_t)((rank + 1) % n), 2, TDIST_INT32, rank, NULL,
                           NULL) == TDIST_ERR_INVALID_ARGUMENT);
  /* Still in step: a real collective. */
  int32_t x = 1;
  MP_CHECK_RC(tdist_all_reduce(g, &x, &x, 1, TDIST_INT32, TDIST_SUM, NULL, NULL));
  MP_CHECK(x == n);
  return 0;
}

static int child(int rank, int n, void *arg) {
  tdist_group_t *g = NULL;
  MP_CHECK_RC(cpu_test_init(*(int *)arg, rank, n, 60000, &g));
  static const size_t sizes[] = {0, 1, 7, 1000};
  int salt = 0;
  for (size_t t = 0; t < NELEM(new_types); t++)
    for (int op = 0; op < TDIST_REDOP_COUNT; op++)
      for (size_t s = 0; s < NELEM(sizes); s++)
        if (valid(new_types[t], (tdist_redop_t)op) &&
            reductions(g, rank, n, new_types[t], (tdist_redop_t)op, sizes[s], salt++))
          return 1;
  for (size_t t = 0; t < NELEM(old_ints); t++)
    for (int op = TDIST_BAND; op <= TDIST_BXOR; op++)
      for (size_t s = 0; s < NELEM(sizes); s++)
        if (reductions(g, rank, n, old_ints[t], (tdist_redop_t)op, sizes[s], salt++)) return 1;
  /* Large: the ring (all_reduce) and segmented reduce_scatter paths. */
  static const struct {
    tdist_dtype_t dt;
    tdist_redop_t op;
  } big[] = {{TDIST_UINT64, TDIST_SUM},      {TDIST_FLOAT8_E4M3, TDIST_SUM},
             {TDIST_FLOAT8_E5M2, TDIST_MAX}, {TDIST_BOOL, TDIST_BXOR},
             {TDIST_INT16, TDIST_AVG},       {TDIST_UINT32, TDIST_BAND}};
  for (size_t i = 0; i < NELEM(big); i++)
    if (reductions(g, rank, n, big[i].dt, big[i].op, 300007 / (size_t)(n > 2 ? n : 1), salt++))
      return 1;
  if (specials(g, rank, n, salt++)) return 1;
  for (size_t t = 0; t < NELEM(new_types); t++)
    if (movement(g, rank, n, new_types[t], 33, salt++)) return 1;
  if (refusals(g, rank, n)) return 1;
  MP_CHECK_RC(tdist_barrier(g, NULL, NULL));
  MP_CHECK_RC(tdist_group_destroy(g));
  return 0;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 2;
  int port = tdist_mp_free_port();
  int rc = tdist_mp_run(n, child, &port, 170);
  printf("cpu_dtypes n=%d: %s\n", n, rc ? "FAILED" : "ok");
  return rc ? 1 : 0;
}
