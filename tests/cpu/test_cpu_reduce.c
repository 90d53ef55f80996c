/*
 * test_cpu_reduce.c - the CPU backend's conversions and reduction kernels,
 * called directly (one process, no sockets; src/cpu/base/reduce.c):
 *
 *   - float8 E4M3 / E5M2: every one of the 256 encodings of each format
 *     decodes to the value the format defines (computed here with ldexp) and
 *     survives fp8 -> float -> fp8 bit for bit, NaNs included;
 *   - float -> float8 rounds to the nearest encoding, ties to the even one:
 *     at every midpoint between neighbours, just above and below it, and for
 *     random floats against a brute-force search of the table; overflow
 *     saturates (E4M3) or goes to infinity (E5M2);
 *   - AVG of every integer type with a fake group size of 128 and 256: the
 *     old divide by (T)size gave the wrong sign at 128 and SIGFPE at 256;
 *   - float MIN/MAX of every pair of special values (+-0, NaN, +-inf) give
 *     the same bits in either operand order, NaN if either is NaN, -0 < +0;
 *   - bool and the bitwise reductions;
 *   - the payload copies (src/cpu/base/copy.c): every length 0..1100 and
 *     some large ones at every source and destination offset 0..63 give
 *     memcpy's bytes and touch nothing around them, plain and streaming;
 *     the move handles both directions of overlap.
 */
#include "cpu_test_util.h"

#define CHECK(cond, ...)                                         \
  do {                                                           \
    if (!(cond)) {                                               \
      fprintf(stderr, "%s:%d: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                              \
      fprintf(stderr, "\n");                                     \
      return 1;                                                  \
    }                                                            \
  } while (0)

typedef struct fmt {
  const char *name;
  int mbits, bias, e4m3;
  float (*to_f)(uint8_t);
  uint8_t (*from_f)(float);
} fmt_t;

static const fmt_t fmts[2] = {
    {"e4m3", 3, 7, 1, tdist__cpu_e4m3_to_float, tdist__cpu_float_to_e4m3},
    {"e5m2", 2, 15, 0, tdist__cpu_e5m2_to_float, tdist__cpu_float_to_e5m2},
};

static uint32_t fbits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

/* The value of encoding b by the format's definition; NaN as NAN. */
static double ref_value(const fmt_t *f, unsigned b) {
  int sign = b >> 7, exp = (int)(b >> f->mbits) & ((1 << (7 - f->mbits)) - 1);
  int man = (int)b & ((1 << f->mbits) - 1), emax = (1 << (7 - f->mbits)) - 1;
  double v;
  if (f->e4m3 && exp == emax && man == 7) return NAN;
  if (!f->e4m3 && exp == emax)
    v = man ? NAN : INFINITY;
  else if (exp == 0)
    v = ldexp(man, 1 - f->bias - f->mbits);
  else
    v = ldexp((1 << f->mbits) + man, exp - f->bias - f->mbits);
  return sign ? -v : v;
}

static int test_fp8_table(const fmt_t *f) {
  for (unsigned b = 0; b < 256; b++) {
    double want = ref_value(f, b);
    float got = f->to_f((uint8_t)b);
    if (isnan(want)) {
      CHECK(isnan(got), "%s 0x%02x: %g, want NaN", f->name, b, got);
      CHECK(!signbit(got) == !(b & 0x80), "%s 0x%02x: NaN sign", f->name, b);
    } else {
      CHECK((double)got == want && !signbit(got) == !signbit(want), "%s 0x%02x: %g, want %g",
            f->name, b, got, want);
    }
    CHECK(f->from_f(got) == b, "%s 0x%02x: round trip gives 0x%02x", f->name, b, f->from_f(got));
  }
  float maxf = f->e4m3 ? 448.0f : 57344.0f;
  CHECK(f->to_f(f->e4m3 ? 0x7e : 0x7b) == maxf, "%s largest finite", f->name);
  return 0;
}

/* The encoding nearest to x (ties to the even encoding) by brute force over
 * the finite encodings, or -1 when x is beyond the largest finite by half an
 * ulp or more (overflow: the caller checks that separately). */
static int nearest(const fmt_t *f, double x) {
  int best = -1;
  double bd = INFINITY;
  for (unsigned b = 0; b < 256; b++) {
    double v = ref_value(f, b);
    if (isnan(v) || isinf(v)) continue;
    if (v == 0 && signbit(v) != signbit(x)) continue; /* zero keeps x's sign */
    double d = fabs(v - x);
    if (d < bd || (d == bd && !(b & 1))) {
      bd = d;
      best = (int)b;
    }
  }
  double maxv = f->e4m3 ? 448 : 57344, ulp = f->e4m3 ? 32 : 8192;
  if (fabs(x) >= maxv + ulp / 2) return -1;
  return best;
}

static int test_fp8_rounding(const fmt_t *f) {
  /* Midpoints between neighbouring positive finite encodings, and just off
   * them (all exact in float32: fp8 has at most 3 mantissa bits). */
  unsigned top = f->e4m3 ? 0x7e : 0x7b;
  for (unsigned b = 0; b < top; b++) {
    for (int s = 0; s < 2; s++) {
      float lo = f->to_f((uint8_t)b), hi = f->to_f((uint8_t)(b + 1));
      float mid = (lo + hi) / 2;
      unsigned sg = s ? 0x80 : 0;
      if (s) {
        lo = -lo;
        hi = -hi;
        mid = -mid;
      }
      unsigned even = (b & 1) ? b + 1 : b;
      CHECK(f->from_f(mid) == (sg | even), "%s tie %g -> 0x%02x, want 0x%02x", f->name, mid,
            f->from_f(mid), sg | even);
      CHECK(f->from_f(nextafterf(mid, lo)) == (sg | b), "%s below tie %g", f->name, mid);
      CHECK(f->from_f(nextafterf(mid, hi)) == (sg | (b + 1)), "%s above tie %g", f->name, mid);
    }
  }
  /* Random floats over the format's range against the brute-force search. */
  uint64_t st = 12345;
  double maxv = f->e4m3 ? 448 : 57344;
  for (int i = 0; i < 20000; i++) {
    st = st * 6364136223846793005ull + 1442695040888963407ull;
    double u = (double)(st >> 11) / 9007199254740992.0; /* [0, 1) */
    int e = (int)((st >> 3) % 40) - (f->e4m3 ? 14 : 20);
    float x = (float)ldexp(1 + u, e);
    if (st & 1) x = -x;
    if (fabs(x) > maxv * 1.2) continue;
    int want = nearest(f, x);
    uint8_t got = f->from_f(x);
    if (want < 0)
      CHECK(got == ((x < 0 ? 0x80 : 0) | (f->e4m3 ? 0x7e : 0x7c)), "%s overflow %g", f->name, x);
    else
      CHECK(got == want, "%s %.9g -> 0x%02x, want 0x%02x", f->name, x, got, want);
  }
  /* Overflow, infinities, NaN, underflow. */
  if (f->e4m3) {
    CHECK(f->from_f(464.0f) == 0x7e && f->from_f(1e30f) == 0x7e && f->from_f(-1e30f) == 0xfe,
          "e4m3 saturates");
    CHECK(f->from_f(INFINITY) == 0x7e && f->from_f(-INFINITY) == 0xfe, "e4m3 inf saturates");
    CHECK(f->from_f(NAN) == 0x7f && f->from_f(-NAN) == 0xff, "e4m3 NaN");
    CHECK(f->from_f(0x1p-10f) == 0 && f->from_f(nextafterf(0x1p-10f, 1)) == 1, "e4m3 tiny");
  } else {
    CHECK(f->from_f(61440.0f) == 0x7c && f->from_f(nextafterf(61440.0f, 0)) == 0x7b,
          "e5m2 overflow tie goes to infinity");
    CHECK(f->from_f(INFINITY) == 0x7c && f->from_f(-INFINITY) == 0xfc, "e5m2 inf");
    CHECK((f->from_f(NAN) & 0x7f) > 0x7c, "e5m2 NaN");
    CHECK(f->from_f(0x1p-17f) == 0 && f->from_f(nextafterf(0x1p-17f, 1)) == 1, "e5m2 tiny");
  }
  CHECK(f->from_f(-0.0f) == 0x80 && f->from_f(0x1p-140f) == 0 && f->from_f(-0x1p-140f) == 0x80,
        "%s signed zero", f->name);
  return 0;
}

/* ---- AVG with a fake group size --------------------------------------------------- */

static int64_t ival(const void *p, tdist_dtype_t dt) {
  switch (dt) {
  case TDIST_INT8: return *(const int8_t *)p;
  case TDIST_UINT8: return *(const uint8_t *)p;
  case TDIST_INT16: return *(const int16_t *)p;
  case TDIST_UINT16: return *(const uint16_t *)p;
  case TDIST_INT32: return *(const int32_t *)p;
  case TDIST_UINT32: return *(const uint32_t *)p;
  case TDIST_INT64: return *(const int64_t *)p;
  default: return (int64_t) * (const uint64_t *)p; /* values used here fit */
  }
}

static int test_avg_wide(void) {
  static const tdist_dtype_t ints[] = {TDIST_INT8,  TDIST_UINT8,  TDIST_INT16, TDIST_UINT16,
                                       TDIST_INT32, TDIST_UINT32, TDIST_INT64, TDIST_UINT64};
  static const int sizes[] = {3, 127, 128, 129, 255, 256, 1000};
  /* Sums (already wrapped in the type) and what sum / size truncates to. */
  static const int64_t sums[] = {0, 1, -1, 100, -100, 127, -128, 128, 200, 255, 255 * 128, -32768};
  for (size_t t = 0; t < sizeof(ints) / sizeof(ints[0]); t++) {
    tdist_dtype_t dt = ints[t];
    size_t es = tdist_dtype_size(dt);
    int uns = dt == TDIST_UINT8 || dt == TDIST_UINT16 || dt == TDIST_UINT32 || dt == TDIST_UINT64;
    int64_t lo = uns ? 0 : es == 8 ? INT64_MIN : -(INT64_C(1) << (es * 8 - 1));
    int64_t hi = es == 8 ? INT64_MAX : uns ? (INT64_C(1) << (es * 8)) - 1 : -lo - 1;
    for (size_t z = 0; z < sizeof(sizes) / sizeof(sizes[0]); z++)
      for (size_t k = 0; k < sizeof(sums) / sizeof(sums[0]); k++) {
        int64_t v = sums[k];
        if (v < lo || v > hi) continue;
        uint8_t buf[8] = {0};
        memcpy(buf, &v, es); /* little endian: the low bytes */
        tdist__cpu_divide(buf, 1, dt, sizes[z]);
        int64_t got = ival(buf, dt), want = v / sizes[z];
        CHECK(got == want, "avg %s: %lld / %d = %lld, want %lld", tdist_dtype_name(dt),
              (long long)v, sizes[z], (long long)got, (long long)want);
      }
  }
  /* The reported case: 128 int8 ranks each holding 1: the wrapped sum is
   * -128, the average -1 (it was +1: -128 / (int8_t)128 = -128 / -128). */
  int8_t x = -128;
  tdist__cpu_divide(&x, 1, TDIST_INT8, 128);
  CHECK(x == -1, "int8 avg at 128 ranks: %d", x);
  return 0;
}

/* ---- MIN / MAX / SUM of special values ------------------------------------------- */

static int same_bits(const void *a, const void *b, size_t es) { return !memcmp(a, b, es); }

static int test_minmax_order(void) {
  static const float sp[] = {0.0f, -0.0f, NAN, -NAN, INFINITY, -INFINITY, 1.0f, -2.0f};
  enum { NS = sizeof(sp) / sizeof(sp[0]) };
  static const tdist_dtype_t fts[] = {TDIST_FLOAT32,  TDIST_FLOAT64,     TDIST_FLOAT16,
                                      TDIST_BFLOAT16, TDIST_FLOAT8_E4M3, TDIST_FLOAT8_E5M2};
  static const tdist_redop_t ops[] = {TDIST_MIN, TDIST_MAX, TDIST_SUM, TDIST_PROD};
  for (size_t t = 0; t < sizeof(fts) / sizeof(fts[0]); t++)
    for (size_t o = 0; o < sizeof(ops) / sizeof(ops[0]); o++)
      for (int i = 0; i < NS; i++)
        for (int j = 0; j < NS; j++) {
          tdist_dtype_t dt = fts[t];
          size_t es = tdist_dtype_size(dt);
          uint8_t a[8], b[8], ab[8], ba[8];
          set_el(a, dt, 0, sp[i]);
          set_el(b, dt, 0, sp[j]);
          if (dt == TDIST_FLOAT8_E4M3 || dt == TDIST_FLOAT8_E5M2) {
            a[0] = dt == TDIST_FLOAT8_E4M3 ? tdist__cpu_float_to_e4m3(sp[i])
                                           : tdist__cpu_float_to_e5m2(sp[i]);
            b[0] = dt == TDIST_FLOAT8_E4M3 ? tdist__cpu_float_to_e4m3(sp[j])
                                           : tdist__cpu_float_to_e5m2(sp[j]);
          }
          memcpy(ab, a, es);
          tdist__cpu_reduce(ab, b, 1, dt, ops[o]);
          memcpy(ba, b, es);
          tdist__cpu_reduce(ba, a, 1, dt, ops[o]);
          double r = dt == TDIST_FLOAT8_E4M3   ? tdist__cpu_e4m3_to_float(ab[0])
                     : dt == TDIST_FLOAT8_E5M2 ? tdist__cpu_e5m2_to_float(ab[0])
                                               : get_el(ab, dt, 0);
          if (ops[o] == TDIST_MIN || ops[o] == TDIST_MAX) {
            /* Order-free unless both are NaN (then the first operand's). */
            if (!(isnan(sp[i]) && isnan(sp[j])))
              CHECK(same_bits(ab, ba, es), "%s %s(%g, %g) depends on the order",
                    tdist_dtype_name(dt), tdist_redop_name(ops[o]), sp[i], sp[j]);
            CHECK((isnan(r) != 0) == (isnan(sp[i]) || isnan(sp[j])), "%s %s(%g, %g) = %g: NaN rule",
                  tdist_dtype_name(dt), tdist_redop_name(ops[o]), sp[i], sp[j], r);
            if (sp[i] == 0 && sp[j] == 0)
              CHECK((signbit(r) != 0) == (ops[o] == TDIST_MIN ? signbit(sp[i]) || signbit(sp[j])
                                                              : signbit(sp[i]) && signbit(sp[j])),
                    "%s %s of zeros: %g", tdist_dtype_name(dt), tdist_redop_name(ops[o]), r);
          } else if (!isnan(sp[i]) && !isnan(sp[j])) {
            CHECK(same_bits(ab, ba, es) || isnan(r), "%s %s(%g, %g) depends on the order",
                  tdist_dtype_name(dt), tdist_redop_name(ops[o]), sp[i], sp[j]);
          }
        }
  return 0;
}

/* ---- bool and bitwise ----------------------------------------------------------- */

static int test_bool_bitwise(void) {
  static const uint8_t in[] = {0, 1, 2, 255};
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 4; j++) {
      int x = in[i] != 0, y = in[j] != 0;
      struct {
        tdist_redop_t op;
        int want;
      } c[] = {{TDIST_SUM, x | y}, {TDIST_MAX, x | y},  {TDIST_BOR, x | y}, {TDIST_PROD, x & y},
               {TDIST_MIN, x & y}, {TDIST_BAND, x & y}, {TDIST_BXOR, x ^ y}};
      for (size_t k = 0; k < sizeof(c) / sizeof(c[0]); k++) {
        uint8_t d = in[i];
        tdist__cpu_reduce(&d, &in[j], 1, TDIST_BOOL, c[k].op);
        CHECK(d == c[k].want, "bool %s(%d, %d) = %d", tdist_redop_name(c[k].op), in[i], in[j], d);
      }
    }
  uint64_t a = 0xf0f0f0f0f0f0f0f0ull, b = 0x0ff00ff00ff00ff0ull, d;
  d = a;
  tdist__cpu_reduce(&d, &b, 1, TDIST_UINT64, TDIST_BAND);
  CHECK(d == (a & b), "uint64 band");
  d = a;
  tdist__cpu_reduce(&d, &b, 1, TDIST_UINT64, TDIST_BOR);
  CHECK(d == (a | b), "uint64 bor");
  int16_t s = -5, t = 12;
  tdist__cpu_reduce(&s, &t, 1, TDIST_INT16, TDIST_BXOR);
  CHECK(s == (int16_t)(-5 ^ 12), "int16 bxor");
  /* A bitwise op on a float is refused by the core; the kernel leaves dst. */
  float f = 1.5f, g = 2.0f;
  tdist__cpu_reduce(&f, &g, 1, TDIST_FLOAT32, TDIST_BAND);
  CHECK(fbits(f) == fbits(1.5f), "float band left dst alone");
  return 0;
}

static int test_copy(void) {
  enum { ROOM = 70000 };
  uint8_t *src = malloc(ROOM + 128), *dst = malloc(ROOM + 128), *ref = malloc(ROOM + 128);
  CHECK(src && dst && ref, "no memory");
  for (size_t i = 0; i < ROOM + 128; i++)
    src[i] = (uint8_t)(i * 131 + 7);
  static const size_t big[] = {4095, 4096, 4097, 65536 + 37, ROOM};
  for (size_t k = 0; k < 1101 + 5; k++) {
    size_t n = k <= 1100 ? k : big[k - 1101];
    for (size_t so = 0; so < 64; so += (k <= 1100 ? 1 : 7))
      for (size_t d = 0; d < 64; d += (k <= 1100 ? 13 : 5)) {
        size_t span = n + 128; /* the copy and the bytes around it */
        memset(dst, 0xee, span);
        memset(ref, 0xee, span);
        tdist__cpu_copy(dst + d, src + so, n);
        memcpy(ref + d, src + so, n);
        CHECK(memcmp(dst, ref, span) == 0, "copy of %zu bytes, offsets %zu -> %zu", n, so, d);
        memset(dst, 0xee, span);
        tdist__cpu_copy_stream(dst + d, src + so, n); /* its aligned head and plain tail too */
        CHECK(memcmp(dst, ref, span) == 0, "streaming copy of %zu bytes, offsets %zu -> %zu", n, so,
              d);
      }
  }
  /* Overlapping moves, both ways, as memmove. */
  for (size_t n = 200; n < 5000; n += 977)
    for (size_t sh = 1; sh < 300; sh += 37) {
      memcpy(dst, src, ROOM);
      memcpy(ref, src, ROOM);
      tdist__cpu_move(dst + sh, dst, n);
      memmove(ref + sh, ref, n);
      CHECK(memcmp(dst, ref, ROOM) == 0, "move up %zu by %zu", n, sh);
      tdist__cpu_move(dst, dst + sh, n);
      memmove(ref, ref + sh, n);
      CHECK(memcmp(dst, ref, ROOM) == 0, "move down %zu by %zu", n, sh);
    }
  free(src);
  free(dst);
  free(ref);
  return 0;
}

int main(void) {
  int rc = 0;
  rc |= test_copy();
  for (int i = 0; i < 2; i++)
    rc |= test_fp8_table(&fmts[i]) | test_fp8_rounding(&fmts[i]);
  rc |= test_avg_wide();
  rc |= test_minmax_order();
  rc |= test_bool_bitwise();
  printf("cpu_reduce: %s\n", rc ? "FAILED" : "ok");
  return rc ? 1 : 0;
}
