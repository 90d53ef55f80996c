/*
 * reduce.c - reduction kernels, input scaling (PREMUL_SUM), averaging, and
 * the float16 / bfloat16 / float8 conversions (round to nearest even).
 *
 * Kernels are plain loops over restrict pointers so the compiler vectorises
 * them (-O2 and up). Semantics (include/tdist/types.h has the user's view):
 *   - integer SUM and PROD wrap around (computed in the unsigned twin, so
 *     overflow is defined); BAND/BOR/BXOR are bitwise;
 *   - BOOL: any non-zero byte is true, results are 0 or 1; SUM/MAX/BOR are
 *     or, PROD/MIN/BAND and, BXOR xor;
 *   - float MIN/MAX return NaN if either input is NaN and order -0 below +0,
 *     so a op b and b op a give the same bits (only SUM/PROD of two NaNs pick
 *     one NaN's payload by operand order; algos.c keeps that order the same
 *     on every rank);
 *   - float16, bfloat16 and float8 are widened to float32 a block at a time,
 *     combined, and rounded back once per combination.
 * The core refuses what has no meaning (a bitwise op on a float type, AVG or
 * PREMUL_SUM of BOOL: core/opcheck.c) before anything reaches a kernel; such a
 * pair leaves dst unchanged here. Any thread; no state.
 */
#include <math.h>
#include <string.h>

#include "cpu/base/base.h"

/* ---- float16 / bfloat16 ------------------------------------------------------ */

static inline uint32_t f2u(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
static inline float u2f(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

float tdist__cpu_half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  if (exp == 0x1f) return u2f(sign | 0x7f800000u | (man << 13)); /* inf, nan */
  if (exp == 0) {
    if (!man) return u2f(sign);
    /* subnormal: man * 2^-24 */
    float f = (float)man * 5.9604644775390625e-8f;
    return sign ? -f : f;
  }
  return u2f(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t tdist__cpu_float_to_half(float f) {
  uint32_t u = f2u(f), sign = (u >> 16) & 0x8000;
  uint32_t au = u & 0x7fffffffu;
  if (au >= 0x7f800000u) /* inf or nan (keep nan quiet and non-zero) */
    return (uint16_t)(sign | 0x7c00 | (au > 0x7f800000u ? 0x200 | ((au >> 13) & 0x3ff) : 0));
  if (au >= 0x477ff000u) return (uint16_t)(sign | 0x7c00); /* rounds past 65504 */
  if (au < 0x38800000u) {                                  /* below the normal range */
    if (au < 0x33000000u) return (uint16_t)sign;           /* < 2^-25: zero */
    uint32_t exp = au >> 23, man = (au & 0x7fffff) | 0x800000;
    uint32_t shift = 126 - exp; /* 14..24 */
    uint32_t half = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) half++;
    return (uint16_t)(sign | half);
  }
  uint32_t r = au + 0xfff + ((au >> 13) & 1); /* round to nearest even */
  return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}

float tdist__cpu_bf16_to_float(uint16_t h) { return u2f((uint32_t)h << 16); }

uint16_t tdist__cpu_float_to_bf16(float f) {
  uint32_t u = f2u(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet nan */
  u += 0x7fff + ((u >> 16) & 1);
  return (uint16_t)(u >> 16);
}

/* ---- float8 (OCP E4M3 / E5M2) ------------------------------------------------- */

/*
 *   E4M3  sign, 4 exponent bits (bias 7), 3 mantissa bits. No infinities:
 *         exponent 15 is a normal binade except S.1111.111, the only NaN
 *         (0x7f, 0xff). Largest finite 448 (0x7e), smallest subnormal 2^-9.
 *   E5M2  sign, 5 exponent bits (bias 15), 2 mantissa bits, IEEE-like:
 *         exponent 31 is infinity (mantissa 0) or NaN. Largest finite 57344
 *         (0x7b), smallest subnormal 2^-16.
 *
 * float -> fp8 rounds to nearest, ties to even, like float16 above. Out of
 * range: E4M3 saturates to +-448 (the OCP "saturating" mode, which is also
 * what CUDA's __nv_fp8_e4m3(float) does: with no infinity, a NaN for an
 * overflowing sum would poison every later step); infinities become +-448
 * too. E5M2 overflows to +-infinity like an IEEE format. NaN stays NaN with
 * its sign; E5M2 keeps the two top payload bits, so every one of the 256
 * encodings of either format survives fp8 -> float -> fp8 unchanged
 * (tests/cpu/test_cpu_reduce.c checks all of them).
 */

/* A small float with `mbits` mantissa bits and exponent bias `bias`: the
 * encoding (without sign) of the float32 magnitude au, rounded to nearest
 * even, which may exceed the format's largest finite (the caller decides
 * what overflow means). au is finite. */
static uint32_t round_small(uint32_t au, int mbits, int bias) {
  int e = (int)(au >> 23) - 127; /* unbiased float32 exponent */
  if ((au >> 23) == 0) return 0; /* float32 subnormal: far below either format */
  if (e >= 1 - bias) {
    /* Normal in the small format: drop 23 - mbits mantissa bits, round to
     * nearest even (the carry may ripple into the exponent, which is right),
     * then rebias the exponent from 127 to `bias`. */
    int shift = 23 - mbits;
    uint32_t r = au + ((1u << (shift - 1)) - 1) + ((au >> shift) & 1);
    return (r >> shift) - ((uint32_t)(127 - bias) << mbits);
  }
  /* Subnormal in the small format: value = m * 2^(1 - bias - mbits). The
   * float32 significand (24 bits, value mf * 2^(e - 23)) is shifted right by
   * d = (1 - bias - mbits) - (e - 23) bits; rounding up may give 1 << mbits,
   * the smallest normal, whose encoding is exactly that. */
  uint32_t mf = (au & 0x7fffffu) | 0x800000u;
  int d = 24 - bias - mbits - e;
  if (d > 25) return 0; /* below half the smallest subnormal */
  uint32_t m = mf >> d, rem = mf & ((1u << d) - 1), half = 1u << (d - 1);
  if (rem > half || (rem == half && (m & 1))) m++;
  return m;
}

float tdist__cpu_e4m3_to_float(uint8_t b) {
  uint32_t sign = (uint32_t)(b & 0x80) << 24, exp = (b >> 3) & 0xf, man = b & 7;
  if (exp == 0xf && man == 7) return u2f(sign | 0x7fc00000u); /* the NaN */
  if (exp == 0) {
    float f = (float)man * 0.001953125f; /* man * 2^-9 */
    return sign ? -f : f;
  }
  return u2f(sign | ((exp + 127 - 7) << 23) | (man << 20));
}

uint8_t tdist__cpu_float_to_e4m3(float f) {
  uint32_t u = f2u(f), sign = (u >> 24) & 0x80, au = u & 0x7fffffffu;
  if (au > 0x7f800000u) return (uint8_t)(sign | 0x7f);  /* NaN */
  if (au == 0x7f800000u) return (uint8_t)(sign | 0x7e); /* no infinity: saturate */
  uint32_t r = round_small(au, 3, 7);
  return (uint8_t)(sign | (r > 0x7e ? 0x7e : r)); /* 0x7f is NaN: saturate at 448 */
}

float tdist__cpu_e5m2_to_float(uint8_t b) {
  uint32_t sign = (uint32_t)(b & 0x80) << 24, exp = (b >> 2) & 0x1f, man = b & 3;
  if (exp == 0x1f) return u2f(sign | 0x7f800000u | (man << 21)); /* inf, NaN */
  if (exp == 0) {
    float f = (float)man * 1.52587890625e-5f; /* man * 2^-16 */
    return sign ? -f : f;
  }
  return u2f(sign | ((exp + 127 - 15) << 23) | (man << 21));
}

uint8_t tdist__cpu_float_to_e5m2(float f) {
  uint32_t u = f2u(f), sign = (u >> 24) & 0x80, au = u & 0x7fffffffu;
  if (au > 0x7f800000u) {
    /* NaN: the top two payload bits, so E5M2's own NaNs come back as they
     * were; a float NaN with neither set becomes the quiet 0x7e. */
    uint32_t pay = (au >> 21) & 3;
    return (uint8_t)(sign | 0x7c | (pay ? pay : 2));
  }
  if (au == 0x7f800000u) return (uint8_t)(sign | 0x7c); /* infinity */
  uint32_t r = round_small(au, 2, 15);
  return (uint8_t)(sign | (r >= 0x7c ? 0x7c : r)); /* past 57344: infinity */
}

/* ---- the narrow floats, widened through float32 -------------------------------- */

static inline int is_narrow(tdist_dtype_t dt) {
  return dt == TDIST_FLOAT16 || dt == TDIST_BFLOAT16 || dt == TDIST_FLOAT8_E4M3 ||
         dt == TDIST_FLOAT8_E5M2;
}

/* Element i of a float16/bfloat16/float8 buffer as float32, and back. */
static inline float narrow_get(const void *p, size_t i, tdist_dtype_t dt) {
  switch (dt) {
  case TDIST_FLOAT16: return tdist__cpu_half_to_float(((const uint16_t *)p)[i]);
  case TDIST_BFLOAT16: return tdist__cpu_bf16_to_float(((const uint16_t *)p)[i]);
  case TDIST_FLOAT8_E4M3: return tdist__cpu_e4m3_to_float(((const uint8_t *)p)[i]);
  default: return tdist__cpu_e5m2_to_float(((const uint8_t *)p)[i]);
  }
}

static inline void narrow_set(void *p, size_t i, tdist_dtype_t dt, float v) {
  switch (dt) {
  case TDIST_FLOAT16: ((uint16_t *)p)[i] = tdist__cpu_float_to_half(v); break;
  case TDIST_BFLOAT16: ((uint16_t *)p)[i] = tdist__cpu_float_to_bf16(v); break;
  case TDIST_FLOAT8_E4M3: ((uint8_t *)p)[i] = tdist__cpu_float_to_e4m3(v); break;
  default: ((uint8_t *)p)[i] = tdist__cpu_float_to_e5m2(v); break;
  }
}

/* ---- kernels ------------------------------------------------------------------ */

#define LOOP(T, EXPR)              \
  do {                             \
    T *restrict d = dst;           \
    const T *restrict s = src;     \
    for (size_t i = 0; i < n; i++) \
      d[i] = (EXPR);               \
  } while (0)

#define MIN_(a, b) ((b) < (a) ? (b) : (a))
#define MAX_(a, b) ((b) > (a) ? (b) : (a))

/* Float MIN/MAX that do not depend on the operands' order: NaN wins (the
 * first operand's if both are NaN: the only order-dependent case, and the
 * order is the same on every rank), and -0 < +0 (IEEE 754-2019 minimum /
 * maximum). Equal non-zero values have equal bits, so only zeros need the
 * sign test. */
#define FMIN_(a, b)                        \
  ((a) < (b)    ? (a)                      \
   : (b) < (a)  ? (b)                      \
   : (a) == (b) ? (signbit(a) ? (a) : (b)) \
   : (a) != (a) ? (a)                      \
                : (b))
#define FMAX_(a, b)                        \
  ((a) > (b)    ? (a)                      \
   : (b) > (a)  ? (b)                      \
   : (a) == (b) ? (signbit(a) ? (b) : (a)) \
   : (a) != (a) ? (a)                      \
                : (b))

/* Integer type T; U: an unsigned type at least as wide as T and as int,
 * where SUM and PROD wrap without undefined overflow. */
#define INT_KERNEL(T, U)                                   \
  switch (op) {                                            \
  case TDIST_PROD: LOOP(T, (T)((U)d[i] * (U)s[i])); break; \
  case TDIST_MIN: LOOP(T, MIN_(d[i], s[i])); break;        \
  case TDIST_MAX: LOOP(T, MAX_(d[i], s[i])); break;        \
  case TDIST_BAND: LOOP(T, (T)(d[i] & s[i])); break;       \
  case TDIST_BOR: LOOP(T, (T)(d[i] | s[i])); break;        \
  case TDIST_BXOR: LOOP(T, (T)(d[i] ^ s[i])); break;       \
  default: LOOP(T, (T)((U)d[i] + (U)s[i])); break;         \
  }

#define FLOAT_KERNEL(T)                              \
  switch (op) {                                      \
  case TDIST_PROD: LOOP(T, d[i] * s[i]); break;      \
  case TDIST_MIN: LOOP(T, FMIN_(d[i], s[i])); break; \
  case TDIST_MAX: LOOP(T, FMAX_(d[i], s[i])); break; \
  case TDIST_BAND:                                   \
  case TDIST_BOR:                                    \
  case TDIST_BXOR: break; /* refused by the core */  \
  default: LOOP(T, d[i] + s[i]); break;              \
  }

static void bool_reduce(uint8_t *restrict d, const uint8_t *restrict s, size_t n,
                        tdist_redop_t op) {
  switch (op) {
  case TDIST_PROD:
  case TDIST_MIN:
  case TDIST_BAND:
    for (size_t i = 0; i < n; i++)
      d[i] = (uint8_t)((d[i] != 0) & (s[i] != 0));
    break;
  case TDIST_BXOR:
    for (size_t i = 0; i < n; i++)
      d[i] = (uint8_t)((d[i] != 0) ^ (s[i] != 0));
    break;
  case TDIST_AVG:
  case TDIST_PREMUL_SUM: break; /* refused by the core */
  default:                      /* SUM, MAX, BOR */
    for (size_t i = 0; i < n; i++)
      d[i] = (uint8_t)((d[i] != 0) | (s[i] != 0));
    break;
  }
}

static inline float combine(float a, float b, tdist_redop_t op) {
  switch (op) {
  case TDIST_PROD: return a * b;
  case TDIST_MIN: return FMIN_(a, b);
  case TDIST_MAX: return FMAX_(a, b);
  default: return a + b;
  }
}

/* float16, bfloat16, float8: widen a block to float32, combine, narrow (the
 * block keeps the conversions in registers/L1 and lets the float loop
 * vectorise). One function per type, so its conversions are inlined. */
#define NARROW_REDUCE(NAME, T, TO_F, FROM_F)                                         \
  static void NAME(T *restrict d, const T *restrict s, size_t n, tdist_redop_t op) { \
    float a[256], b[256];                                                            \
    for (size_t o = 0; o < n; o += 256) {                                            \
      size_t m = n - o < 256 ? n - o : 256;                                          \
      for (size_t i = 0; i < m; i++) {                                               \
        a[i] = TO_F(d[o + i]);                                                       \
        b[i] = TO_F(s[o + i]);                                                       \
      }                                                                              \
      for (size_t i = 0; i < m; i++)                                                 \
        a[i] = combine(a[i], b[i], op);                                              \
      for (size_t i = 0; i < m; i++)                                                 \
        d[o + i] = FROM_F(a[i]);                                                     \
    }                                                                                \
  }
NARROW_REDUCE(half_reduce, uint16_t, tdist__cpu_half_to_float, tdist__cpu_float_to_half)
NARROW_REDUCE(bf16_reduce, uint16_t, tdist__cpu_bf16_to_float, tdist__cpu_float_to_bf16)
NARROW_REDUCE(e4m3_reduce, uint8_t, tdist__cpu_e4m3_to_float, tdist__cpu_float_to_e4m3)
NARROW_REDUCE(e5m2_reduce, uint8_t, tdist__cpu_e5m2_to_float, tdist__cpu_float_to_e5m2)

static void narrow_reduce(void *d, const void *s, size_t n, tdist_dtype_t dt, tdist_redop_t op) {
  if (op == TDIST_BAND || op == TDIST_BOR || op == TDIST_BXOR) return; /* refused by the core */
  switch (dt) {
  case TDIST_FLOAT16: half_reduce(d, s, n, op); break;
  case TDIST_BFLOAT16: bf16_reduce(d, s, n, op); break;
  case TDIST_FLOAT8_E4M3: e4m3_reduce(d, s, n, op); break;
  default: e5m2_reduce(d, s, n, op); break;
  }
}

/* Built twice on x86-64 with GCC, for AVX2 and for the baseline (SSE2), and
 * picked once at load time (an ifunc): the kernels are element-wise, so
 * both give the same bits, and AVX2 halves a small reduction's
 * instructions (1 KiB of float32: 485 -> 250). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx2", "default")))
#endif
void tdist__cpu_reduce(void *dst, const void *src, size_t n, tdist_dtype_t dt, tdist_redop_t op) {
  switch (dt) {
  case TDIST_INT8: INT_KERNEL(int8_t, uint8_t) break;
  case TDIST_UINT8: INT_KERNEL(uint8_t, uint8_t) break;
  /* 16-bit: uint16_t * uint16_t would be int * int and overflow */
  case TDIST_INT16: INT_KERNEL(int16_t, uint32_t) break;
  case TDIST_UINT16: INT_KERNEL(uint16_t, uint32_t) break;
  case TDIST_INT32: INT_KERNEL(int32_t, uint32_t) break;
  case TDIST_UINT32: INT_KERNEL(uint32_t, uint32_t) break;
  case TDIST_INT64: INT_KERNEL(int64_t, uint64_t) break;
  case TDIST_UINT64: INT_KERNEL(uint64_t, uint64_t) break;
  case TDIST_FLOAT32: FLOAT_KERNEL(float) break;
  case TDIST_FLOAT64: FLOAT_KERNEL(double) break;
  case TDIST_BOOL: bool_reduce(dst, src, n, op); break;
  case TDIST_FLOAT16:
  case TDIST_BFLOAT16:
  case TDIST_FLOAT8_E4M3:
  case TDIST_FLOAT8_E5M2: narrow_reduce(dst, src, n, dt, op); break;
  default: break;
  }
}

/* ---- PREMUL_SUM scaling ---------------------------------------------------------- */

/* Integer scaling: multiply in double, truncate toward zero, saturate at the
 * type's range (a plain cast would be undefined out of range; a NaN scalar
 * gives 0). The bounds are compared in double: HI rounds up to a power of two
 * for 64-bit types, and v >= that saturates. */
#define SCALE_INT(T, LO, HI)                                                                   \
  do {                                                                                         \
    T *b = buf;                                                                                \
    for (size_t i = 0; i < n; i++) {                                                           \
      double v = (double)b[i] * scalar;                                                        \
      b[i] = v != v ? (T)0 : v <= (double)(LO) ? (T)(LO) : v >= (double)(HI) ? (T)(HI) : (T)v; \
    }                                                                                          \
  } while (0)

void tdist__cpu_scale(void *buf, size_t n, tdist_dtype_t dt, double scalar) {
  switch (dt) {
  case TDIST_INT8: SCALE_INT(int8_t, INT8_MIN, INT8_MAX); break;
  case TDIST_UINT8: SCALE_INT(uint8_t, 0, UINT8_MAX); break;
  case TDIST_INT16: SCALE_INT(int16_t, INT16_MIN, INT16_MAX); break;
  case TDIST_UINT16: SCALE_INT(uint16_t, 0, UINT16_MAX); break;
  case TDIST_INT32: SCALE_INT(int32_t, INT32_MIN, INT32_MAX); break;
  case TDIST_UINT32: SCALE_INT(uint32_t, 0, UINT32_MAX); break;
  case TDIST_INT64: SCALE_INT(int64_t, INT64_MIN, INT64_MAX); break;
  case TDIST_UINT64: SCALE_INT(uint64_t, 0, UINT64_MAX); break;
  case TDIST_FLOAT32: {
    float *b = buf, f = (float)scalar;
    for (size_t i = 0; i < n; i++)
      b[i] *= f;
    break;
  }
  case TDIST_FLOAT64: {
    double *b = buf;
    for (size_t i = 0; i < n; i++)
      b[i] *= scalar;
    break;
  }
  case TDIST_BOOL: { /* no PREMUL_SUM (the core refuses it): true becomes 1 */
    uint8_t *b = buf;
    for (size_t i = 0; i < n; i++)
      b[i] = b[i] != 0;
    break;
  }
  default:
    if (is_narrow(dt)) {
      float f = (float)scalar;
      for (size_t i = 0; i < n; i++)
        narrow_set(buf, i, dt, narrow_get(buf, i, dt) * f);
    }
    break;
  }
}

/* ---- AVG ------------------------------------------------------------------------- */

/* Integers divide in 64 bits (W: int64_t or uint64_t) and truncate toward
 * zero. Dividing in T itself was wrong: (int8_t)128 is -128 and
 * (int8_t)256 is 0, a SIGFPE at 256 ranks. The quotient's magnitude is at
 * most the sum's, so it fits T. */
#define DIV_INT(T, W)              \
  do {                             \
    T *b = buf;                    \
    W w = (W)divisor;              \
    for (size_t i = 0; i < n; i++) \
      b[i] = (T)((W)b[i] / w);     \
  } while (0)

void tdist__cpu_divide(void *buf, size_t n, tdist_dtype_t dt, int divisor) {
  if (divisor < 1) return; /* a group has at least one rank */
  switch (dt) {
  case TDIST_INT8: DIV_INT(int8_t, int64_t); break;
  case TDIST_UINT8: DIV_INT(uint8_t, uint64_t); break;
  case TDIST_INT16: DIV_INT(int16_t, int64_t); break;
  case TDIST_UINT16: DIV_INT(uint16_t, uint64_t); break;
  case TDIST_INT32: DIV_INT(int32_t, int64_t); break;
  case TDIST_UINT32: DIV_INT(uint32_t, uint64_t); break;
  case TDIST_INT64: DIV_INT(int64_t, int64_t); break;
  case TDIST_UINT64: DIV_INT(uint64_t, uint64_t); break;
  case TDIST_FLOAT32: {
    float *b = buf;
    for (size_t i = 0; i < n; i++)
      b[i] /= (float)divisor;
    break;
  }
  case TDIST_FLOAT64: {
    double *b = buf;
    for (size_t i = 0; i < n; i++)
      b[i] /= (double)divisor;
    break;
  }
  default:
    if (is_narrow(dt))
      for (size_t i = 0; i < n; i++)
        narrow_set(buf, i, dt, narrow_get(buf, i, dt) / (float)divisor);
    break; /* BOOL: refused by the core */
  }
}
