/* test_gpusim_reduce.c - the simulated device's data types and reductions
 * (src/gpusim/reduce.c) against references written here independently:
 * number formats decoded from their definitions (ldexp of the fields) and
 * rounded by searching the sorted table of a format's values, integer
 * reductions in 64-bit arithmetic, floating ones exactly in double and then
 * rounded once. Where NCCL's behaviour is particular, the check names the
 * NCCL (v2.28.9) or CUDA source it follows. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include <cmocka.h>

#include "gpusim/sim.h"

/* Exported by reduce.c (hidden visibility) for the library and this test. */
uint16_t gs_float_to_half(float f);
float gs_half_to_float(uint16_t h);
uint16_t gs_float_to_bf16(float f);
float gs_bf16_to_float(uint16_t b);
uint8_t gs_float_to_fp8(float f, int e5m2);
float gs_fp8_to_float(uint8_t v, int e5m2);

/* ---- helpers ----------------------------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) { /* xorshift64* */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return rng_state * 0x2545f4914f6cdd1dull;
}

static uint32_t fbits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
static float bitsf(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static uint64_t dbits(double d) {
  uint64_t u;
  memcpy(&u, &d, 8);
  return u;
}
static double bitsd(uint64_t u) {
  double d;
  memcpy(&d, &u, 8);
  return d;
}

/* ---- reference small formats -------------------------------------------------------------
 * A format: sign bit, E exponent bits, M mantissa bits, bias 2^(E-1)-1.
 * `maxcode` is the largest finite positive code, `top` the value the next
 * code up would have (rounding to it is an overflow), `sat` whether an
 * overflow saturates (fp8 with __NV_SATFINITE) or gives infinity. */
enum { F16, BF16, E4M3, E5M2, NFMT };
typedef struct {
  int E, M, bits;
  unsigned maxcode, infcode, nancode;
  int sat, has_inf;
  double top;
  double *val; /* val[code] for codes 0..maxcode, increasing */
} fmt_t;
static fmt_t fmts[NFMT] = {
    [F16] = {5, 10, 16, 0x7bff, 0x7c00, 0x7fff, 0, 1, 65536.0, NULL},
    [BF16] = {8, 7, 16, 0x7f7f, 0x7f80, 0x7fff, 0, 1, 0x1p128, NULL},
    [E4M3] = {4, 3, 8, 0x7e, 0, 0x7f, 1, 0, 480.0, NULL},
    [E5M2] = {5, 2, 8, 0x7b, 0x7c, 0x7f, 1, 1, 65536.0, NULL},
};

/* The value of a code from its fields; NaN for NaN codes. */
static double ref_decode(int f, unsigned code) {
  const fmt_t *F = &fmts[f];
  unsigned sign = code >> (F->bits - 1) & 1u, mag = code & ((1u << (F->bits - 1)) - 1u);
  unsigned e = mag >> F->M, m = mag & ((1u << F->M) - 1u);
  int bias = (1 << (F->E - 1)) - 1;
  double v;
  if (f == E4M3 && mag == 0x7fu) return NAN; /* e4m3: S.1111.111 is NaN, no infinity */
  if (F->has_inf && e == (1u << F->E) - 1u) {
    if (m) return NAN;
    v = INFINITY;
  } else if (e == 0) {
    v = ldexp((double)m, 1 - bias - F->M);
  } else {
    v = ldexp((double)((1u << F->M) + m), (int)e - bias - F->M);
  }
  return sign ? -v : v;
}

/* Round x (a double, exact or at least 2 bits wider than needed) to the
 * nearest code, ties to the even code, overflow per the format. */
static unsigned ref_encode(int f, double x) {
  const fmt_t *F = &fmts[f];
  if (isnan(x)) return F->nancode;
  unsigned sign = signbit(x) ? 1u << (F->bits - 1) : 0u;
  double a = fabs(x);
  unsigned code;
  if (isinf(a)) {
    code = F->maxcode + 1;
  } else {
    unsigned lo = 0, hi = F->maxcode; /* largest c with val[c] <= a */
    while (lo < hi) {
      unsigned mid = (lo + hi + 1) / 2;
      if (F->val[mid] <= a)
        lo = mid;
      else
        hi = mid - 1;
    }
    double next = lo == F->maxcode ? F->top : F->val[lo + 1];
    double dlo = a - F->val[lo], dhi = next - a;
    code = dlo < dhi ? lo : dhi < dlo ? lo + 1 : (lo & 1u) ? lo + 1 : lo;
  }
  if (code > F->maxcode) code = F->sat ? F->maxcode : F->infcode;
  return sign | code;
}

static int setup(void **state) {
  (void)state;
  for (int f = 0; f < NFMT; f++) {
    fmts[f].val = malloc(sizeof(double) * (fmts[f].maxcode + 1));
    if (!fmts[f].val) return -1;
    for (unsigned c = 0; c <= fmts[f].maxcode; c++)
      fmts[f].val[c] = ref_decode(f, c);
  }
  return 0;
}
static int teardown(void **state) {
  (void)state;
  for (int f = 0; f < NFMT; f++)
    free(fmts[f].val);
  return 0;
}

/* The library's conversions, by format. */
static float lib_decode(int f, unsigned c) {
  switch (f) {
  case F16: return gs_half_to_float((uint16_t)c);
  case BF16: return gs_bf16_to_float((uint16_t)c);
  case E4M3: return gs_fp8_to_float((uint8_t)c, 0);
  default: return gs_fp8_to_float((uint8_t)c, 1);
  }
}
static unsigned lib_encode(int f, float x) {
  switch (f) {
  case F16: return gs_float_to_half(x);
  case BF16: return gs_float_to_bf16(x);
  case E4M3: return gs_float_to_fp8(x, 0);
  default: return gs_float_to_fp8(x, 1);
  }
}

/* ---- conversions --------------------------------------------------------------------------- */

/* Every code decodes to its value and encodes back to itself, except NaN
 * (one canonical NaN per format) and e5m2's infinities, which
 * __NV_SATFINITE turns into +-57344 (cuda_fp8.hpp). */
static void every_code_round_trips(void **state) {
  (void)state;
  for (int f = 0; f < NFMT; f++) {
    unsigned n = 1u << fmts[f].bits;
    for (unsigned c = 0; c < n; c++) {
      double want = ref_decode(f, c);
      float got = lib_decode(f, c);
      if (isnan(want)) {
        assert_true(isnan(got));
        assert_int_equal(lib_encode(f, got), fmts[f].nancode);
        continue;
      }
      assert_true((double)got == want && !signbit(got) == !signbit(want));
      unsigned back = lib_encode(f, got);
      if (f == E5M2 && isinf(want))
        assert_int_equal(back, (c & 0x80u) | 0x7bu);
      else
        assert_int_equal(back, c);
    }
  }
}

/* Rounding of floats to each format against the search reference: every
 * midpoint between neighbouring codes, one float below and above it, and
 * a few million random floats across the whole range. */
static void float_to_small_formats_round_to_nearest_even(void **state) {
  (void)state;
  for (int f = 0; f < NFMT; f++) {
    const fmt_t *F = &fmts[f];
    for (unsigned c = 0; c <= F->maxcode; c++) {
      double next = c == F->maxcode ? F->top : F->val[c + 1];
      float mid = (float)((F->val[c] + next) / 2); /* exact: 2 more bits than any format here */
      assert_true((double)mid == (F->val[c] + next) / 2);
      float probes[3] = {mid, nextafterf(mid, 0.0f), nextafterf(mid, INFINITY)};
      for (int k = 0; k < 3; k++)
        for (int s = 0; s < 2; s++) {
          float x = s ? -probes[k] : probes[k];
          assert_int_equal(lib_encode(f, x), ref_encode(f, (double)x));
        }
    }
    for (int i = 0; i < 2000000; i++) {
      float x = bitsf((uint32_t)rnd());
      if (i & 1)
        x = ldexpf((float)(rnd() >> 40) / 0x1p24f, (int)(rnd() % 80) - 50); /* near each range */
      if (isnan(x))
        assert_int_equal(lib_encode(f, x), F->nancode);
      else
        assert_int_equal(lib_encode(f, x), ref_encode(f, (double)x));
    }
  }
}

static void known_values(void **state) {
  (void)state;
  /* fp16: max 65504, 65519.99 still rounds to it, 65520 is the tie -> inf */
  assert_int_equal(gs_float_to_half(65504.0f), 0x7bff);
  assert_int_equal(gs_float_to_half(65519.0f), 0x7bff);
  assert_int_equal(gs_float_to_half(65520.0f), 0x7c00);
  assert_int_equal(gs_float_to_half(-INFINITY), 0xfc00);
  assert_int_equal(gs_float_to_half(-NAN), 0x7fff);            /* sign dropped (cuda_fp16.hpp) */
  assert_int_equal(gs_float_to_half(1.0f + 0x1p-11f), 0x3c00); /* tie, to even */
  assert_int_equal(gs_float_to_half(1.0f + 3 * 0x1p-11f), 0x3c02); /* tie, to even */
  assert_int_equal(gs_float_to_half(0x1p-24f), 0x0001);
  assert_int_equal(gs_float_to_half(0x1p-25f), 0x0000);
  assert_int_equal(gs_float_to_half(0x1.000002p-25f), 0x0001);
  assert_int_equal(gs_float_to_half(-0x1p-26f), 0x8000);
  assert_true(gs_half_to_float(0x0001) == 0x1p-24f);
  /* bf16 */
  assert_int_equal(gs_float_to_bf16(1.0f + 0x1p-8f), 0x3f80);
  assert_int_equal(gs_float_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
  assert_int_equal(gs_float_to_bf16(3.4028235e38f), 0x7f80); /* FLT_MAX rounds up past 0x7f7f */
  assert_int_equal(gs_float_to_bf16(NAN), 0x7fff);
  /* e4m3 (no infinity): max 448; 464 is the tie -> 448 (even); beyond saturates */
  assert_int_equal(gs_float_to_fp8(448.0f, 0), 0x7e);
  assert_int_equal(gs_float_to_fp8(464.0f, 0), 0x7e);
  assert_int_equal(gs_float_to_fp8(1e9f, 0), 0x7e);
  assert_int_equal(gs_float_to_fp8(INFINITY, 0), 0x7e);
  assert_int_equal(gs_float_to_fp8(-INFINITY, 0), 0xfe);
  assert_int_equal(gs_float_to_fp8(-NAN, 0), 0x7f);
  assert_int_equal(gs_float_to_fp8(0x1p-9f, 0), 0x01);
  assert_int_equal(gs_float_to_fp8(0x1p-10f, 0), 0x00);
  assert_int_equal(gs_float_to_fp8(-0x1p-10f, 0), 0x80);
  assert_int_equal(gs_float_to_fp8(0x1.8p-9f, 0), 0x02); /* 1.5 units: tie to even = 2 */
  assert_true(gs_fp8_to_float(0x7e, 0) == 448.0f);
  assert_true(isnan(gs_fp8_to_float(0xff, 0)));
  /* e5m2: max 57344; 61440 is the tie (-> 65536, an overflow) -> saturated */
  assert_int_equal(gs_float_to_fp8(57344.0f, 1), 0x7b);
  assert_int_equal(gs_float_to_fp8(61439.0f, 1), 0x7b);
  assert_int_equal(gs_float_to_fp8(61440.0f, 1), 0x7b);
  assert_int_equal(gs_float_to_fp8(-INFINITY, 1), 0xfb);
  assert_int_equal(gs_float_to_fp8(NAN, 1), 0x7f);
  assert_int_equal(gs_float_to_fp8(0x1p-16f, 1), 0x01);
  assert_int_equal(gs_float_to_fp8(0x1p-17f, 1), 0x00);
  assert_true(gs_fp8_to_float(0x7b, 1) == 57344.0f);
  assert_true(isinf(gs_fp8_to_float(0x7c, 1)));
  assert_true(isnan(gs_fp8_to_float(0x7d, 1)));
}

/* ---- reductions ---------------------------------------------------------------------------- */

static const ncclDataType_t all_types[] = {
    ncclInt8,    ncclUint8,   ncclInt32,   ncclUint32,   ncclInt64,      ncclUint64,
    ncclFloat16, ncclFloat32, ncclFloat64, ncclBfloat16, ncclFloat8e4m3, ncclFloat8e5m2};
#define NTYPES (sizeof(all_types) / sizeof(all_types[0]))

static int small_fmt(ncclDataType_t dt) {
  switch ((int)dt) {
  case ncclFloat16: return F16;
  case ncclBfloat16: return BF16;
  case ncclFloat8e4m3: return E4M3;
  case ncclFloat8e5m2: return E5M2;
  default: return -1;
  }
}
static int is_int(ncclDataType_t dt) { return (int)dt <= ncclUint64; }
static int is_signed(ncclDataType_t dt) {
  return dt == ncclInt8 || dt == ncclInt32 || dt == ncclInt64;
}

static uint64_t get_elt(const void *p, size_t i, size_t sz) {
  uint64_t v = 0;
  memcpy(&v, (const char *)p + i * sz, sz);
  return v;
}
static void put_elt(void *p, size_t i, size_t sz, uint64_t v) {
  memcpy((char *)p + i * sz, &v, sz);
}

/* Min/max as PTX defines them (min/max.f32, min/max.f16): a NaN gives the
 * other operand, -0 < +0; returns NAN for two NaNs. */
static double ref_minmax(double a, double b, int max) {
  if (isnan(a)) return b;
  if (isnan(b)) return a;
  if (a == b) return (!signbit(a) != !signbit(b)) ? (max ? 0.0 : -0.0) : a;
  return max ? (a > b ? a : b) : (a < b ? a : b);
}

/* The reference of one step, on the values' bits. kind: the arithmetic
 * (GS_RED_SUM/PROD/MIN/MAX; PREMULSUM's multiply is asked as PROD). */
static uint64_t ref_step(ncclDataType_t dt, int kind, uint64_t a, uint64_t b) {
  size_t sz = gs_dtype_size(dt);
  if (is_int(dt)) {
    uint64_t mask = sz == 8 ? ~0ull : (1ull << (8 * sz)) - 1;
    if (kind == GS_RED_SUM) return (a + b) & mask;
    if (kind == GS_RED_PROD) return (a * b) & mask;
    int lt;
    if (is_signed(dt)) {
      int shift = 64 - 8 * (int)sz;
      int64_t sa = (int64_t)(a << shift) >> shift, sb = (int64_t)(b << shift) >> shift;
      lt = sa < sb;
    } else {
      lt = a < b;
    }
    return (kind == GS_RED_MIN) == lt ? a : b;
  }
  int f = small_fmt(dt);
  double x, y, r;
  if (f >= 0) {
    x = ref_decode(f, (unsigned)a);
    y = ref_decode(f, (unsigned)b);
  } else if (dt == ncclFloat32) {
    x = bitsf((uint32_t)a);
    y = bitsf((uint32_t)b);
  } else {
    x = bitsd(a);
    y = bitsd(b);
  }
  switch (kind) {
  case GS_RED_SUM: r = x + y; break;
  case GS_RED_PROD: r = x * y; break;
  default: r = ref_minmax(x, y, kind == GS_RED_MAX); break;
  }
  if (f >= 0) return ref_encode(f, r);
  if (dt == ncclFloat32) return isnan(r) ? 0x7fffffffu : fbits((float)r); /* one f32 NaN on a GPU */
  return dbits(r);
}

static int same(ncclDataType_t dt, uint64_t got, uint64_t want) {
  /* f64 NaN payloads are not modelled: any NaN matches a NaN */
  if (dt == ncclFloat64 && isnan(bitsd(got)) && isnan(bitsd(want))) return 1;
  return got == want;
}

/* A random element: any bit pattern for the small formats (NaN, inf,
 * subnormals included); for f32/f64 a mix of patterns and moderate values
 * with some specials. */
static uint64_t rand_elt(ncclDataType_t dt) {
  uint64_t r = rnd();
  if (dt == ncclFloat32 && (r & 3) != 0) {
    static const float sp[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-45f, 3.4e38f, 1.0f};
    if ((r & 0xf0) == 0) return fbits(sp[(r >> 8) % 8]);
    return fbits(ldexpf((float)(int32_t)(r >> 32) / 0x1p31f, (int)((r >> 8) % 60) - 30));
  }
  if (dt == ncclFloat64 && (r & 3) != 0) {
    static const double sp[] = {0.0, -0.0, INFINITY, -INFINITY, NAN, 5e-324, 1.7e308, 1.0};
    if ((r & 0xf0) == 0) return dbits(sp[(r >> 8) % 8]);
    return dbits(ldexp((double)(int32_t)(r >> 32) / 0x1p31, (int)((r >> 8) % 60) - 30));
  }
  return r;
}

/* Every built-in op on every type, 1 to 5 ranks, against a step-by-step
 * reference (acc = in_0; acc = acc op in_r; ...), each step rounded. */
static void every_op_and_type_matches_reference(void **state) {
  (void)state;
  const size_t n = 4096;
  const ncclRedOp_t ops[] = {ncclSum, ncclProd, ncclMin, ncclMax};
  const int kinds[] = {GS_RED_SUM, GS_RED_PROD, GS_RED_MIN, GS_RED_MAX};
  for (size_t t = 0; t < NTYPES; t++) {
    ncclDataType_t dt = all_types[t];
    size_t sz = gs_dtype_size(dt);
    char *in = malloc(n * sz), *acc = malloc(n * sz), *ref = malloc(n * sz);
    assert_non_null(in);
    assert_non_null(acc);
    assert_non_null(ref);
    for (int o = 0; o < 4; o++)
      for (int nranks = 1; nranks <= 5; nranks++) {
        gs_redop_t op;
        assert_int_equal(gs_redop_builtin(&op, ops[o], dt, nranks), ncclSuccess);
        assert_int_equal(op.kind, kinds[o]);
        assert_int_equal(op.dt, dt);
        for (int r = 0; r < nranks; r++) {
          for (size_t i = 0; i < n; i++)
            put_elt(in, i, sz, rand_elt(dt));
          if (r == 0) {
            gs_reduce_first(&op, acc, in, n);
            memcpy(ref, in, n * sz);
          } else {
            gs_reduce_next(&op, acc, in, n);
            for (size_t i = 0; i < n; i++)
              put_elt(ref, i, sz, ref_step(dt, kinds[o], get_elt(ref, i, sz), get_elt(in, i, sz)));
          }
        }
        gs_reduce_last(&op, acc, n);
        for (size_t i = 0; i < n; i++) {
          uint64_t g = get_elt(acc, i, sz), w = get_elt(ref, i, sz);
          if (!same(dt, g, w))
            fail_msg("type %d op %d ranks %d elt %zu: got %#llx want %#llx", (int)dt, o, nranks, i,
                     (unsigned long long)g, (unsigned long long)w);
        }
      }
    free(in);
    free(acc);
    free(ref);
  }
}

/* fp8 has only 65536 operand pairs: all of them, every op, both formats. */
static void fp8_all_pairs(void **state) {
  (void)state;
  const int kinds[] = {GS_RED_SUM, GS_RED_PROD, GS_RED_MIN, GS_RED_MAX};
  const ncclRedOp_t ops[] = {ncclSum, ncclProd, ncclMin, ncclMax};
  uint8_t *a = malloc(65536), *b = malloc(65536);
  assert_non_null(a);
  assert_non_null(b);
  for (int e5 = 0; e5 < 2; e5++) {
    ncclDataType_t dt = e5 ? ncclFloat8e5m2 : ncclFloat8e4m3;
    for (int o = 0; o < 4; o++) {
      gs_redop_t op;
      assert_int_equal(gs_redop_builtin(&op, ops[o], dt, 2), ncclSuccess);
      for (unsigned i = 0; i < 65536u; i++) {
        a[i] = (uint8_t)(i >> 8);
        b[i] = (uint8_t)i;
      }
      gs_reduce_next(&op, a, b, 65536);
      for (unsigned i = 0; i < 65536u; i++) {
        uint64_t w = ref_step(dt, kinds[o], i >> 8, i & 0xffu);
        if (a[i] != w)
          fail_msg("fp8 %d op %d: %#x, %#x -> %#x, want %#llx", e5, o, i >> 8, i & 0xffu, a[i],
                   (unsigned long long)w);
      }
    }
  }
  free(a);
  free(b);
}

/* The particular results NCCL's kernels give (reduce_kernel.h, sm_90). */
static void nccl_particulars(void **state) {
  (void)state;
  gs_redop_t op;
  /* e5m2 goes through half and back with __NV_SATFINITE: max(inf, 1) and
   * 57344 + 57344 are 57344, not inf */
  uint8_t a[2] = {0x7c, 0x7b}, b[2] = {0x3c, 0x7b};
  assert_int_equal(gs_redop_builtin(&op, ncclMax, ncclFloat8e5m2, 2), ncclSuccess);
  gs_reduce_next(&op, a, b, 1);
  assert_int_equal(a[0], 0x7b);
  assert_int_equal(gs_redop_builtin(&op, ncclSum, ncclFloat8e5m2, 2), ncclSuccess);
  gs_reduce_next(&op, a + 1, b + 1, 1);
  assert_int_equal(a[1], 0x7b);
  /* float min/max: fminf/fmaxf (PTX): a NaN loses, -0 < +0, two NaNs give
   * the canonical NaN; sums give the canonical NaN too */
  float fa[4] = {NAN, -0.0f, 0.0f, -NAN}, fb[4] = {-3.0f, 0.0f, -0.0f, NAN};
  assert_int_equal(gs_redop_builtin(&op, ncclMin, ncclFloat32, 2), ncclSuccess);
  gs_reduce_next(&op, fa, fb, 4);
  assert_true(fa[0] == -3.0f);
  assert_true(fa[1] == 0.0f && signbit(fa[1]));
  assert_true(fa[2] == 0.0f && signbit(fa[2]));
  assert_int_equal(fbits(fa[3]), 0x7fffffffu);
  float s1 = -NAN, s2 = 1.0f;
  assert_int_equal(gs_redop_builtin(&op, ncclSum, ncclFloat32, 2), ncclSuccess);
  gs_reduce_next(&op, &s1, &s2, 1);
  assert_int_equal(fbits(s1), 0x7fffffffu);
  /* half: overflow to inf, inf - inf = canonical NaN */
  uint16_t h[2] = {0x7bff, 0x7c00}, g[2] = {0x7bff, 0xfc00};
  gs_redop_builtin(&op, ncclSum, ncclFloat16, 2);
  gs_reduce_next(&op, h, g, 2);
  assert_int_equal(h[0], 0x7c00);
  assert_int_equal(h[1], 0x7fff);
  /* integers wrap */
  int32_t i32a = INT32_MAX, i32b = 1;
  gs_redop_builtin(&op, ncclSum, ncclInt32, 2);
  gs_reduce_next(&op, &i32a, &i32b, 1);
  assert_int_equal(i32a, INT32_MIN);
  int8_t i8a = -128, i8b = -1;
  gs_redop_builtin(&op, ncclProd, ncclInt8, 2);
  gs_reduce_next(&op, &i8a, &i8b, 1);
  assert_int_equal(i8a, -128);
  gs_redop_builtin(&op, ncclMin, ncclInt8, 2);
  i8a = -128;
  i8b = 127;
  gs_reduce_next(&op, &i8a, &i8b, 1);
  assert_int_equal(i8a, -128);
  uint8_t u8a = 0x80, u8b = 0x7f;
  gs_redop_builtin(&op, ncclMin, ncclUint8, 2);
  gs_reduce_next(&op, &u8a, &u8b, 1);
  assert_int_equal(u8a, 0x7f);
}

/* ncclAvg on integers: FuncSumPostDiv, the wrapped sum divided by nranks,
 * truncating toward zero (enqueue.cc hostToDevRedOp, reduce_kernel.h). */
static void avg_integers_postdiv(void **state) {
  (void)state;
  const size_t n = 2048;
  for (size_t t = 0; t < 6; t++) {
    ncclDataType_t dt = all_types[t];
    size_t sz = gs_dtype_size(dt);
    int shift = 64 - 8 * (int)sz;
    for (int nranks = 1; nranks <= 9; nranks++) {
      gs_redop_t op;
      assert_int_equal(gs_redop_builtin(&op, ncclAvg, dt, nranks), ncclSuccess);
      assert_int_equal(op.kind, GS_RED_SUMPOSTDIV);
      assert_int_equal(op.scalar, (uint64_t)nranks);
      uint64_t *sum = calloc(n, 8);
      char *in = malloc(n * sz), *acc = malloc(n * sz);
      assert_non_null(sum);
      assert_non_null(in);
      assert_non_null(acc);
      for (int r = 0; r < nranks; r++) {
        for (size_t i = 0; i < n; i++) {
          uint64_t v = rnd();
          if (i < 8) v = (i & 1) ? ~0ull : 1ull << 63 >> (i * 8 % 64); /* extremes */
          put_elt(in, i, sz, v);
          sum[i] += get_elt(in, i, sz);
        }
        if (r == 0)
          gs_reduce_first(&op, acc, in, n);
        else
          gs_reduce_next(&op, acc, in, n);
      }
      gs_reduce_last(&op, acc, n);
      for (size_t i = 0; i < n; i++) {
        uint64_t w;
        if (is_signed(dt)) {
          int64_t s = (int64_t)(sum[i] << shift) >> shift; /* the wrapped sum, signed */
          w = (uint64_t)(s / nranks);
        } else {
          uint64_t s = shift ? sum[i] & ((1ull << (64 - shift)) - 1) : sum[i];
          w = s / (uint64_t)nranks;
        }
        if (shift) w &= (1ull << (64 - shift)) - 1;
        assert_int_equal(get_elt(acc, i, sz), w);
      }
      free(sum);
      free(in);
      free(acc);
    }
  }
  /* the reciprocal division is exact at the extremes of every width */
  const uint32_t divs[] = {1, 2, 3, 7, 10, 255, 256, 1000, 65535, 1u << 20, 123456789, 0x7fffffffu};
  for (size_t d = 0; d < sizeof divs / sizeof divs[0]; d++) {
    gs_redop_t op = {GS_RED_SUMPOSTDIV, ncclUint32, divs[d]};
    uint32_t v[6] = {0xffffffffu, 0xfffffffeu, 0x80000000u, divs[d] * 3u, divs[d] * 3u - 1, 12345};
    uint32_t w[6];
    for (int i = 0; i < 6; i++)
      w[i] = v[i] / divs[d];
    gs_reduce_last(&op, v, 6);
    assert_memory_equal(v, w, sizeof v);
    gs_redop_t op64 = {GS_RED_SUMPOSTDIV, ncclInt64, divs[d]};
    int64_t x[4] = {INT64_MIN, INT64_MAX, -(int64_t)divs[d] * 5 - 1, -1};
    int64_t y[4];
    for (int i = 0; i < 4; i++)
      y[i] = x[i] / (int64_t)divs[d];
    gs_reduce_last(&op64, x, 4);
    assert_memory_equal(x, y, sizeof x);
    for (int i = 0; i < 100000; i++) {
      uint64_t u = rnd(), q = u;
      gs_redop_t opu = {GS_RED_SUMPOSTDIV, ncclUint64, divs[d]};
      gs_reduce_last(&opu, &q, 1);
      assert_int_equal(q, u / divs[d]);
      uint32_t u32 = (uint32_t)u, q32 = u32;
      gs_reduce_last(&op, &q32, 1);
      assert_int_equal(q32, u32 / divs[d]);
    }
  }
}

/* ncclAvg on floating types: PreMulSum by float(1.0/nranks) in the type
 * (__float2half, __float2bfloat16, __nv_cvt_float_to_fp8 SATFINITE; f64
 * 1.0/nranks), each input multiplied and rounded, then summed. */
static void avg_floats_premul(void **state) {
  (void)state;
  gs_redop_t op;
  assert_int_equal(gs_redop_builtin(&op, ncclAvg, ncclFloat16, 3), ncclSuccess);
  assert_int_equal(op.kind, GS_RED_PREMULSUM);
  assert_int_equal(op.scalar, 0x3555);
  gs_redop_builtin(&op, ncclAvg, ncclBfloat16, 3);
  assert_int_equal(op.scalar, 0x3eab);
  gs_redop_builtin(&op, ncclAvg, ncclFloat8e4m3, 3);
  assert_int_equal(op.scalar, 0x2b); /* 0.34375 */
  gs_redop_builtin(&op, ncclAvg, ncclFloat8e5m2, 3);
  assert_int_equal(op.scalar, 0x35); /* 0.3125 */
  gs_redop_builtin(&op, ncclAvg, ncclFloat8e4m3, 1024);
  assert_int_equal(op.scalar, 0x00); /* 2^-10 rounds to 0: NCCL averages to zero */
  gs_redop_builtin(&op, ncclAvg, ncclFloat8e4m3, 512);
  assert_int_equal(op.scalar, 0x01);
  gs_redop_builtin(&op, ncclAvg, ncclFloat32, 3);
  assert_int_equal(op.scalar, fbits((float)(1.0 / 3)));
  gs_redop_builtin(&op, ncclAvg, ncclFloat64, 3);
  assert_int_equal(op.scalar, dbits(1.0 / 3));

  const size_t n = 4096;
  for (size_t t = 6; t < NTYPES; t++) {
    ncclDataType_t dt = all_types[t];
    size_t sz = gs_dtype_size(dt);
    char *in = malloc(n * sz), *acc = malloc(n * sz), *ref = malloc(n * sz);
    assert_non_null(in);
    assert_non_null(acc);
    assert_non_null(ref);
    for (int nranks = 1; nranks <= 6; nranks++) {
      assert_int_equal(gs_redop_builtin(&op, ncclAvg, dt, nranks), ncclSuccess);
      for (int r = 0; r < nranks; r++) {
        for (size_t i = 0; i < n; i++)
          put_elt(in, i, sz, rand_elt(dt));
        for (size_t i = 0; i < n; i++) {
          uint64_t p = ref_step(dt, GS_RED_PROD, get_elt(in, i, sz), op.scalar);
          put_elt(ref, i, sz, r ? ref_step(dt, GS_RED_SUM, get_elt(ref, i, sz), p) : p);
        }
        if (r == 0) {
          memcpy(acc, in, n * sz);
          gs_reduce_first(&op, acc, acc, n); /* in place */
        } else {
          gs_reduce_next(&op, acc, in, n);
        }
      }
      gs_reduce_last(&op, acc, n);
      for (size_t i = 0; i < n; i++) {
        uint64_t g = get_elt(acc, i, sz), w = get_elt(ref, i, sz);
        if (!same(dt, g, w))
          fail_msg("avg type %d ranks %d elt %zu: got %#llx want %#llx", (int)dt, nranks, i,
                   (unsigned long long)g, (unsigned long long)w);
      }
    }
    free(in);
    free(acc);
    free(ref);
  }
}

/* ncclRedOpCreatePreMulSum: any type, the scalar's own bits; integers
 * multiply with wrap-around. */
static void premulsum_user_scalar(void **state) {
  (void)state;
  gs_redop_t op;
  float fs = 2.5f;
  gs_redop_premul(&op, ncclFloat32, &fs);
  assert_int_equal(op.kind, GS_RED_PREMULSUM);
  assert_int_equal(op.scalar, fbits(2.5f));
  float a[3] = {1.0f, 2.0f, 3.0f}, b[3] = {4.0f, 0.1f, -3.0f}, acc[3];
  gs_reduce_first(&op, acc, a, 3);
  gs_reduce_next(&op, acc, b, 3);
  gs_reduce_last(&op, acc, 3);
  for (int i = 0; i < 3; i++)
    assert_true(acc[i] == (float)(a[i] * 2.5f) + (float)(b[i] * 2.5f));

  int8_t s8 = 3;
  gs_redop_premul(&op, ncclInt8, &s8);
  int8_t x[2] = {100, -100}, y[2] = {1, 2};
  gs_reduce_first(&op, x, x, 2); /* 300 -> 44, -300 -> -44 */
  gs_reduce_next(&op, x, y, 2);
  assert_int_equal(x[0], 47);
  assert_int_equal(x[1], -38);

  uint64_t s64 = 0x100000001ull;
  gs_redop_premul(&op, ncclUint64, &s64);
  uint64_t u = 0xffffffffull;
  gs_reduce_first(&op, &u, &u, 1);
  assert_int_equal(u, 0xffffffffull * 0x100000001ull);

  uint16_t hs = 0x4000; /* half 2.0 */
  gs_redop_premul(&op, ncclFloat16, &hs);
  uint16_t h[1] = {0x7800}, g[1] = {0x3c00}; /* 32768*2 = 65536 -> inf, + 2 */
  gs_reduce_first(&op, h, h, 1);
  gs_reduce_next(&op, h, g, 1);
  assert_int_equal(h[0], 0x7c00);

  uint8_t e4s = 0x48; /* e4m3 2.0 */
  gs_redop_premul(&op, ncclFloat8e4m3, &e4s);
  uint8_t f8[1] = {0x7e}; /* 448 * 2 saturates */
  gs_reduce_first(&op, f8, f8, 1);
  assert_int_equal(f8[0], 0x7e);
}

/* ArgsCheck (misc/argcheck.cc) and hostToDevRedOp: a type outside
 * 0..ncclNumTypes-1 or a negative op is refused; every built-in op is
 * accepted on every type. */
static void refused_and_accepted(void **state) {
  (void)state;
  gs_redop_t op;
  assert_int_equal(gs_redop_builtin(&op, ncclSum, (ncclDataType_t)12, 2), ncclInvalidArgument);
  assert_int_equal(gs_redop_builtin(&op, ncclSum, (ncclDataType_t)-1, 2), ncclInvalidArgument);
  assert_int_equal(gs_redop_builtin(&op, (ncclRedOp_t)5, ncclFloat32, 2), ncclInvalidArgument);
  assert_int_equal(gs_redop_builtin(&op, (ncclRedOp_t)-1, ncclFloat32, 2), ncclInvalidArgument);
  assert_int_equal(gs_redop_builtin(&op, ncclAvg, ncclFloat32, 0), ncclInvalidArgument);
  for (size_t t = 0; t < NTYPES; t++)
    for (int o = ncclSum; o <= ncclAvg; o++)
      assert_int_equal(gs_redop_builtin(&op, (ncclRedOp_t)o, all_types[t], 8), ncclSuccess);
  const size_t sizes[NTYPES] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
  for (size_t t = 0; t < NTYPES; t++)
    assert_int_equal(gs_dtype_size(all_types[t]), sizes[t]);
  assert_int_equal(gs_dtype_size((ncclDataType_t)12), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(every_code_round_trips),
      cmocka_unit_test(float_to_small_formats_round_to_nearest_even),
      cmocka_unit_test(known_values),
      cmocka_unit_test(every_op_and_type_matches_reference),
      cmocka_unit_test(fp8_all_pairs),
      cmocka_unit_test(nccl_particulars),
      cmocka_unit_test(avg_integers_postdiv),
      cmocka_unit_test(avg_floats_premul),
      cmocka_unit_test(premulsum_user_scalar),
      cmocka_unit_test(refused_and_accepted),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
