/*
 * reduce.c - reduction kernels, input scaling (PREMUL_SUM), averaging, and
 * the float16 / bfloat16 conversions (round to nearest even).
 *
 * Kernels are plain loops over restrict pointers so the compiler vectorises
 * them (-O2 and up). Integer SUM and PROD wrap around (computed in the
 * unsigned type, so overflow is defined); float16 and bfloat16 are widened to
 * float32, combined, and rounded back. Any thread; no state.
 */
#include <math.h>
#include <string.h>

#include "cpu/cpu.h"

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

/* Integer type T with unsigned twin U. */
#define INT_KERNEL(T, U)                                   \
  switch (op) {                                            \
  case TDIST_PROD: LOOP(T, (T)((U)d[i] * (U)s[i])); break; \
  case TDIST_MIN: LOOP(T, MIN_(d[i], s[i])); break;        \
  case TDIST_MAX: LOOP(T, MAX_(d[i], s[i])); break;        \
  default: LOOP(T, (T)((U)d[i] + (U)s[i])); break;         \
  }

#define FLOAT_KERNEL(T)                             \
  switch (op) {                                     \
  case TDIST_PROD: LOOP(T, d[i] * s[i]); break;     \
  case TDIST_MIN: LOOP(T, MIN_(d[i], s[i])); break; \
  case TDIST_MAX: LOOP(T, MAX_(d[i], s[i])); break; \
  default: LOOP(T, d[i] + s[i]); break;             \
  }

static inline float combine(float a, float b, tdist_redop_t op) {
  switch (op) {
  case TDIST_PROD: return a * b;
  case TDIST_MIN: return MIN_(a, b);
  case TDIST_MAX: return MAX_(a, b);
  default: return a + b;
  }
}

/* 16-bit floats: widen a block to float32, combine, narrow (the block keeps
 * the conversions in registers/L1 and lets the float loop vectorise). */
static void half_reduce(uint16_t *restrict d, const uint16_t *restrict s, size_t n, int bf,
                        tdist_redop_t op) {
  float a[256], b[256];
  for (size_t o = 0; o < n; o += 256) {
    size_t m = n - o < 256 ? n - o : 256;
    for (size_t i = 0; i < m; i++) {
      a[i] = bf ? tdist__cpu_bf16_to_float(d[o + i]) : tdist__cpu_half_to_float(d[o + i]);
      b[i] = bf ? tdist__cpu_bf16_to_float(s[o + i]) : tdist__cpu_half_to_float(s[o + i]);
    }
    for (size_t i = 0; i < m; i++)
      a[i] = combine(a[i], b[i], op);
    for (size_t i = 0; i < m; i++)
      d[o + i] = bf ? tdist__cpu_float_to_bf16(a[i]) : tdist__cpu_float_to_half(a[i]);
  }
}

void tdist__cpu_reduce(void *dst, const void *src, size_t n, tdist_dtype_t dt, tdist_redop_t op) {
  switch (dt) {
  case TDIST_INT8: INT_KERNEL(int8_t, uint8_t) break;
  case TDIST_UINT8: INT_KERNEL(uint8_t, uint8_t) break;
  case TDIST_INT32: INT_KERNEL(int32_t, uint32_t) break;
  case TDIST_INT64: INT_KERNEL(int64_t, uint64_t) break;
  case TDIST_FLOAT32: FLOAT_KERNEL(float) break;
  case TDIST_FLOAT64: FLOAT_KERNEL(double) break;
  case TDIST_FLOAT16: half_reduce(dst, src, n, 0, op); break;
  case TDIST_BFLOAT16: half_reduce(dst, src, n, 1, op); break;
  default: break;
  }
}

/* Integer scaling: multiply in double, truncate toward zero, saturate at the
 * type's range (a plain cast would be undefined out of range). */
#define SCALE_INT(T, LO, HI)                                                   \
  do {                                                                         \
    T *b = buf;                                                                \
    for (size_t i = 0; i < n; i++) {                                           \
      double v = (double)b[i] * scalar;                                        \
      b[i] = v <= (double)(LO) ? (T)(LO) : v >= (double)(HI) ? (T)(HI) : (T)v; \
    }                                                                          \
  } while (0)

void tdist__cpu_scale(void *buf, size_t n, tdist_dtype_t dt, double scalar) {
  switch (dt) {
  case TDIST_INT8: SCALE_INT(int8_t, INT8_MIN, INT8_MAX); break;
  case TDIST_UINT8: SCALE_INT(uint8_t, 0, UINT8_MAX); break;
  case TDIST_INT32: SCALE_INT(int32_t, INT32_MIN, INT32_MAX); break;
  case TDIST_INT64: SCALE_INT(int64_t, INT64_MIN, INT64_MAX); break;
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
  case TDIST_FLOAT16:
  case TDIST_BFLOAT16: {
    uint16_t *b = buf;
    int bf = dt == TDIST_BFLOAT16;
    float f = (float)scalar;
    for (size_t i = 0; i < n; i++) {
      float v = (bf ? tdist__cpu_bf16_to_float(b[i]) : tdist__cpu_half_to_float(b[i])) * f;
      b[i] = bf ? tdist__cpu_float_to_bf16(v) : tdist__cpu_float_to_half(v);
    }
    break;
  }
  default: break;
  }
}

#define DIV_INT(T)                   \
  do {                               \
    T *b = buf;                      \
    for (size_t i = 0; i < n; i++)   \
      b[i] = (T)(b[i] / (T)divisor); \
  } while (0)

void tdist__cpu_divide(void *buf, size_t n, tdist_dtype_t dt, int divisor) {
  switch (dt) {
  case TDIST_INT8: DIV_INT(int8_t); break;
  case TDIST_UINT8: DIV_INT(uint8_t); break;
  case TDIST_INT32: DIV_INT(int32_t); break;
  case TDIST_INT64: DIV_INT(int64_t); break;
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
  case TDIST_FLOAT16:
  case TDIST_BFLOAT16: {
    uint16_t *b = buf;
    int bf = dt == TDIST_BFLOAT16;
    for (size_t i = 0; i < n; i++) {
      float v =
          (bf ? tdist__cpu_bf16_to_float(b[i]) : tdist__cpu_half_to_float(b[i])) / (float)divisor;
      b[i] = bf ? tdist__cpu_float_to_bf16(v) : tdist__cpu_float_to_half(v);
    }
    break;
  }
  default: break;
  }
}
