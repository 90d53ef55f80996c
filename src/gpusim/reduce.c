/*
 * reduce.c - NCCL's data types and the element-wise reductions its kernels
 * apply, bit for bit, on the CPU.
 *
 * What is followed (NCCL v2.28.9-1):
 *   src/include/collectives.h  ncclTypeSize                 gs_dtype_size
 *   src/enqueue.cc             hostToDevRedOp               gs_redop_builtin
 *   src/enqueue.cc             ncclRedOpCreatePreMulSum     gs_redop_premul
 *   src/device/reduce_kernel.h FuncSum, FuncProd, FuncMinMax,
 *                              FuncPreMulSum, FuncSumPostDiv gs_reduce_*
 * as compiled for sm_90 (the fp8 kernels need __CUDA_ARCH__ >= 900, and the
 * half/bf16 paths are then the native __hadd/__hmul/__hmin/__hmax ones), with
 * the number formats of CUDA 12 (cuda_fp16.hpp, cuda_bf16.hpp, cuda_fp8.hpp)
 * and the PTX ISA (min/max, cvt.rn.satfinite).
 *
 * The conversions below are exported to the rest of the library (hidden
 * visibility) and to the unit test; sim.h does not declare them, so they are
 * declared here first.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "gpusim/sim.h"

/* A GPU rounds a*b and then +c separately unless the compiler contracts
 * them; the simulation's steps are defined as separately rounded (sim.h),
 * so no contraction here either (GCC's ISO mode already has it off). */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

uint16_t gs_float_to_half(float f);
float gs_half_to_float(uint16_t h);
uint16_t gs_float_to_bf16(float f);
float gs_bf16_to_float(uint16_t b);
uint8_t gs_float_to_fp8(float f, int e5m2);
float gs_fp8_to_float(uint8_t v, int e5m2);

/* ---- bits ---------------------------------------------------------------------------- */

static inline uint32_t f2u(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}
static inline float u2f(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
static inline uint64_t d2u(double d) {
  uint64_t u;
  memcpy(&u, &d, sizeof u);
  return u;
}
static inline double u2d(uint64_t u) {
  double d;
  memcpy(&d, &u, sizeof d);
  return d;
}

/* The one quiet NaN each GPU format produces (PTX: arithmetic and cvt give
 * the canonical NaN; cuda_fp16.hpp/cuda_bf16.hpp __float2half_rn and
 * __float2bfloat16_rn give 0x7fff; cuda_fp8.hpp gives 0x7f). */
#define F32_CANON_NAN 0x7fffffffu
#define F64_CANON_NAN 0x7fffffffffffffffull
#define F16_CANON_NAN 0x7fffu
#define FP8_CANON_NAN 0x7fu

/* ---- fp16 (cuda_fp16.hpp __float2half_rn / __half2float) ------------------------------- */

/* float -> half, round to nearest even, overflow to infinity, subnormals
 * kept, NaN -> 0x7fff with the sign dropped (cuda_fp16.hpp
 * __internal_float2half, as cvt.rn.f16.f32 does on the device). The
 * rounding is branch-free: the inner loops meet random rounding bits. */
uint16_t gs_float_to_half(float f) {
  uint32_t x = f2u(f);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return F16_CANON_NAN;
  if (ax >= 0x477ff000u)
    return (uint16_t)(sign | 0x7c00u); /* >= 65520: 65504 + half ulp, tie to even = inf */
  if (ax >= 0x38800000u) {             /* normal: >= 2^-14 */
    /* round at bit 13, ties to even; a carry moves into the exponent */
    uint32_t r = ax + 0xfffu + ((ax >> 13) & 1u);
    return (uint16_t)(sign | ((r >> 13) - (112u << 10)));
  }
  /* subnormal or zero: adding 0.5 (whose ulp is 2^-24, the least half
   * subnormal) rounds |f| to a multiple of 2^-24 by the FPU's own
   * round-to-nearest-even; the low bits are then the half's code, up to
   * 0x400 (the least normal) when it rounds up. */
  uint32_t r = f2u(u2f(ax) + 0.5f) - 0x3f000000u;
  return (uint16_t)(sign | r);
}

/* half -> float, exact; NaN -> the canonical float NaN (cuda_fp16.hpp
 * __internal_half2float discards a NaN's sign and payload). The half's
 * exponent and mantissa, placed as a float's, are the value times 2^-112,
 * subnormals included; infinities and NaNs get the float's all-ones
 * exponent. */
float gs_half_to_float(uint16_t h) {
  uint32_t em = h & 0x7fffu;
  uint32_t o = f2u(u2f(em << 13) * 0x1p112f);
  o = em >= 0x7c00u ? (em > 0x7c00u ? F32_CANON_NAN : 0x7f800000u | (uint32_t)(h & 0x8000u) << 16)
                    : o | (uint32_t)(h & 0x8000u) << 16;
  return u2f(o);
}

/* ---- bf16 (cuda_bf16.hpp __float2bfloat16_rn / __bfloat162float) ----------------------- */

/* float -> bf16, round to nearest even (overflow to inf falls out of the
 * carry), NaN -> 0x7fff (cuda_bf16.hpp __internal_float2bfloat16). */
uint16_t gs_float_to_bf16(float f) {
  uint32_t x = f2u(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return F16_CANON_NAN;
  x += 0x7fffu + ((x >> 16) & 1u);
  return (uint16_t)(x >> 16);
}

float gs_bf16_to_float(uint16_t b) { return u2f((uint32_t)b << 16); }

/* double -> float rounded to odd (cuda_fp8.hpp
 * __internal_double_to_float_with_sticky): a later round-to-nearest-even to
 * a format at least 2 bits narrower than float is then the correctly rounded
 * result of the double, with no double-rounding error. Used for bf16
 * products, whose exact value can sit far below float's subnormals. */
static inline float d2f_odd(double d) {
  float f = (float)d;
  if ((double)f != d && d == d) {
    uint32_t u = f2u(f);
    if (fabs((double)f) > fabs(d)) u--; /* step back toward zero: truncation */
    f = u2f(u | 1u);
  }
  return f;
}

/* ---- fp8 (cuda_fp8.hpp __nv_cvt_float_to_fp8 / __nv_cvt_fp8_to_halfraw) ----------------- */

/* float -> e4m3 or e5m2 with __NV_SATFINITE, the mode of every conversion
 * NCCL makes (hostToDevRedOp and the __nv_fp8_e4m3(__half) constructors of
 * reduce_kernel.h): round to nearest even; anything beyond the largest
 * finite value, infinities included, becomes +-max (448, 57344); NaN becomes
 * 0x7f (the input is first canonicalised to 0x7fffffff, so its sign is
 * lost); an underflow to zero keeps its sign. */
uint8_t gs_float_to_fp8(float f, int e5m2) {
  const uint32_t M = e5m2 ? 2u : 3u;     /* mantissa bits */
  const uint32_t bias = e5m2 ? 15u : 7u; /* exponent bias */
  const uint32_t maxnorm = e5m2 ? 0x7bu : 0x7eu;
  uint32_t x = f2u(f);
  uint8_t sign = (uint8_t)((x >> 24) & 0x80u);
  uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return FP8_CANON_NAN;
  const uint32_t emax = e5m2 ? 15u : 8u; /* 57344 = 1.75*2^15, 448 = 1.75*2^8 */
  if (ax >= ((127u + emax + 1u) << 23))
    return (uint8_t)(sign | maxnorm); /* >= 2^(emax+1), inf too */
  uint32_t code;
  if (ax >= ((128u - bias) << 23)) { /* normal: >= 2^(1-bias) */
    uint32_t drop = 23u - M;
    code = ((ax >> 23) - 127u + bias) << M | ((ax >> drop) & ((1u << M) - 1u));
    uint32_t rem = ax & ((1u << drop) - 1u), halfway = 1u << (drop - 1u);
    if (rem > halfway || (rem == halfway && (code & 1u))) code++;
  } else {
    /* subnormal result in units of 2^(1-bias-M): value = m * 2^(e-150) */
    uint32_t e = ax >> 23;
    uint32_t shift = 151u - bias - M - e;   /* >= 24 - M */
    if (e == 0 || shift > 25u) return sign; /* below a quarter of the least subnormal */
    uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    code = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u), halfway = 1u << (shift - 1u);
    if (rem > halfway || (rem == halfway && (code & 1u))) code++;
  }
  /* rounding past the top lands on e4m3's NaN code 0x7f or e5m2's infinity
   * 0x7c: saturate (the overflow threshold of __nv_cvt_double_to_fp8) */
  if (code > maxnorm) code = maxnorm;
  return (uint8_t)(sign | code);
}

/* e4m3/e5m2 -> float, exact (cvt.rn.f16x2.e4m3x2 then half -> float).
 * e4m3 has no infinity; its NaN is S.1111.111. e5m2 is IEEE-like. NaN ->
 * canonical NaN (cuda_fp8.hpp gives the canonical half NaN 0x7fff). */
float gs_fp8_to_float(uint8_t v, int e5m2) {
  uint32_t M = e5m2 ? 2u : 3u, bias = e5m2 ? 15u : 7u;
  uint32_t exp = (v & 0x7fu) >> M, man = v & ((1u << M) - 1u);
  float r;
  if (!e5m2 && (v & 0x7fu) == 0x7fu) return u2f(F32_CANON_NAN);
  if (e5m2 && exp == 0x1fu) {
    if (man) return u2f(F32_CANON_NAN);
    r = INFINITY;
  } else if (exp == 0) {
    r = ldexpf((float)man, (int)(1u - bias - M));
  } else {
    r = ldexpf((float)((1u << M) | man), (int)exp - (int)bias - (int)M);
  }
  return (v & 0x80u) ? -r : r;
}

/* ---- one element of each floating reduction -------------------------------------------- */

/* PTX min/max (fminf/fmaxf for float and double, __hmin/__hmax for half and
 * bf16 on sm_80+): a NaN operand yields the other operand, two NaNs the
 * canonical NaN, and -0.0 < +0.0. `key` orders the non-NaN bit patterns of
 * a sign-magnitude format as two's complement integers, -0 below +0. */
static inline int32_t key32(uint32_t b) {
  return (int32_t)(b ^ ((uint32_t)((int32_t)b >> 31) & 0x7fffffffu));
}
static inline int64_t key64(uint64_t b) {
  return (int64_t)(b ^ ((uint64_t)((int64_t)b >> 63) & 0x7fffffffffffffffull));
}
static inline int32_t key16(uint16_t b) {
  return (b & 0x8000u) ? -(int32_t)(b & 0x7fffu) - 1 : (int32_t)b;
}

/* The selections are done with masks: which operand wins is random in real
 * data, and a branch on it would be mispredicted half of the time. */
#define SEL(T, c, a, b) (T)(((a) & (T)(0 - (T)(c))) | ((b) & (T) ~(0 - (T)(c))))

static inline uint32_t f32_minmax(uint32_t a, uint32_t b, int max) {
  uint32_t an = (a & 0x7fffffffu) > 0x7f800000u, bn = (b & 0x7fffffffu) > 0x7f800000u;
  uint32_t r = SEL(uint32_t, (uint32_t)((key32(a) < key32(b)) ^ max), a, b);
  r = SEL(uint32_t, an, b, r);
  r = SEL(uint32_t, bn, a, r);
  return SEL(uint32_t, an & bn, F32_CANON_NAN, r);
}
static inline uint64_t f64_minmax(uint64_t a, uint64_t b, int max) {
  /* both NaN: PTX says "NaN"; the canonical pattern is assumed, as for f32 */
  uint64_t an = (a & 0x7fffffffffffffffull) > 0x7ff0000000000000ull;
  uint64_t bn = (b & 0x7fffffffffffffffull) > 0x7ff0000000000000ull;
  uint64_t r = SEL(uint64_t, (uint64_t)((key64(a) < key64(b)) ^ max), a, b);
  r = SEL(uint64_t, an, b, r);
  r = SEL(uint64_t, bn, a, r);
  return SEL(uint64_t, an & bn, F64_CANON_NAN, r);
}
/* half (inf 0x7c00) and bf16 (inf 0x7f80): `inf` is the format's infinity */
static inline uint16_t f16_minmax(uint16_t a, uint16_t b, int max, uint32_t inf) {
  uint32_t an = (a & 0x7fffu) > inf, bn = (b & 0x7fffu) > inf;
  uint32_t r = SEL(uint32_t, (uint32_t)((key16(a) < key16(b)) ^ max), (uint32_t)a, (uint32_t)b);
  r = SEL(uint32_t, an, (uint32_t)b, r);
  r = SEL(uint32_t, bn, (uint32_t)a, r);
  return (uint16_t)SEL(uint32_t, an & bn, F16_CANON_NAN, r);
}

/* float arithmetic as the GPU does it: IEEE round to nearest even, with the
 * single canonical NaN 0x7fffffff of single precision (no payloads). */
static inline uint32_t f32_canon(float r) { return r != r ? F32_CANON_NAN : f2u(r); }

/* half arithmetic (reduce_kernel.h, __CUDA_ARCH__ >= 530: __hadd/__hmul,
 * i.e. add.f16/mul.f16, correctly rounded). In float: a product of two
 * halves is exact in float, and a sum is rounded twice harmlessly (24 >=
 * 2*11+2 bits); the one rounding to half is gs_float_to_half's. */
static float h2f_tab[65536]; /* every half's float value, for the loops */
static pthread_once_t h2f_once = PTHREAD_ONCE_INIT;
static void h2f_init(void) {
  for (unsigned i = 0; i < 65536u; i++)
    h2f_tab[i] = gs_half_to_float((uint16_t)i);
}
static inline uint16_t h_add(uint16_t a, uint16_t b) {
  return gs_float_to_half(h2f_tab[a] + h2f_tab[b]);
}
static inline uint16_t h_mul(uint16_t a, uint16_t b) {
  return gs_float_to_half(h2f_tab[a] * h2f_tab[b]);
}
/* bf16 (reduce_kernel.h, __CUDA_ARCH__ >= 800: __hadd/__hmul on
 * __nv_bfloat16, correctly rounded). Sum in float (24 >= 2*8+2); a product
 * is exact in double and rounded once through d2f_odd. */
static inline uint16_t bf_add(uint16_t a, uint16_t b) {
  return gs_float_to_bf16(gs_bf16_to_float(a) + gs_bf16_to_float(b));
}
static inline uint16_t bf_mul(uint16_t a, uint16_t b) {
  return gs_float_to_bf16(d2f_odd((double)gs_bf16_to_float(a) * (double)gs_bf16_to_float(b)));
}

/* fp8 (reduce_kernel.h, __CUDA_ARCH__ >= 900): every operation converts
 * both operands to half, applies the half operation (__hadd, __hmul, __hmin,
 * __hmax) and converts back with __NV_SATFINITE. So an e5m2 infinity comes
 * back as 57344 even from max(inf, x), a sum that overflows half comes back
 * as +-max, and every NaN as 0x7f. */
enum { FP8_SUM, FP8_PROD, FP8_MIN, FP8_MAX, FP8_NOPS };

static inline uint16_t fp8_to_half(uint8_t v, int e5m2) {
  return gs_float_to_half(gs_fp8_to_float(v, e5m2));
}
static inline uint8_t half_to_fp8(uint16_t h, int e5m2) {
  return gs_float_to_fp8(gs_half_to_float(h), e5m2);
}

static uint8_t fp8_op1(int op, uint8_t a, uint8_t b, int e5m2) {
  uint16_t ha = fp8_to_half(a, e5m2), hb = fp8_to_half(b, e5m2), r;
  switch (op) {
  case FP8_SUM: r = h_add(ha, hb); break;
  case FP8_PROD: r = h_mul(ha, hb); break;
  case FP8_MIN: r = f16_minmax(ha, hb, 0, 0x7c00u); break;
  default: r = f16_minmax(ha, hb, 1, 0x7c00u); break;
  }
  return half_to_fp8(r, e5m2);
}

/* An fp8 operation has only 65536 operand pairs: each is tabulated on first
 * use (64 KiB per format and operation) and the inner loops are lookups. */
static uint8_t fp8_tab[2][FP8_NOPS][65536];
static atomic_int fp8_tab_ready[2][FP8_NOPS];
static pthread_mutex_t fp8_tab_lock = PTHREAD_MUTEX_INITIALIZER;

static const uint8_t *fp8_table(int e5m2, int op) {
  if (atomic_load_explicit(&fp8_tab_ready[e5m2][op], memory_order_acquire))
    return fp8_tab[e5m2][op];
  pthread_mutex_lock(&fp8_tab_lock);
  if (!atomic_load_explicit(&fp8_tab_ready[e5m2][op], memory_order_relaxed)) {
    for (unsigned i = 0; i < 65536u; i++)
      fp8_tab[e5m2][op][i] = fp8_op1(op, (uint8_t)(i >> 8), (uint8_t)i, e5m2);
    atomic_store_explicit(&fp8_tab_ready[e5m2][op], 1, memory_order_release);
  }
  pthread_mutex_unlock(&fp8_tab_lock);
  return fp8_tab[e5m2][op];
}

/* ---- types and reductions (enqueue.cc hostToDevRedOp) ---------------------------------- */

/* NCCL src/include/collectives.h ncclTypeSize. */
size_t gs_dtype_size(ncclDataType_t dt) {
  switch ((int)dt) {
  case ncclInt8:
  case ncclUint8:
  case ncclFloat8e4m3:
  case ncclFloat8e5m2: return 1;
  case ncclFloat16:
  case ncclBfloat16: return 2;
  case ncclInt32:
  case ncclUint32:
  case ncclFloat32: return 4;
  case ncclInt64:
  case ncclUint64:
  case ncclFloat64: return 8;
  default: return 0;
  }
}

static int dt_is_int(ncclDataType_t dt) { return (int)dt >= ncclInt8 && (int)dt <= ncclUint64; }
static int dt_is_signed(ncclDataType_t dt) {
  return dt == ncclInt8 || dt == ncclInt32 || dt == ncclInt64;
}

/* enqueue.cc hostToDevRedOp: ncclSum -> ncclDevSum, ncclProd -> ncclDevProd,
 * ncclMin/ncclMax -> ncclDevMinMax (an xormask for integers, fminf/fmaxf and
 * kin for floats), ncclAvg -> ncclDevSumPostDiv by nRanks for the six
 * integer types (the flag `signed` is derived from dt here) and
 * ncclDevPreMulSum by 1/nRanks for the floating ones, that factor being
 * float(1.0/nRanks) converted to the type: __float2half, __float2bfloat16,
 * __nv_cvt_float_to_fp8(.., __NV_SATFINITE, ..) (so an e4m3 Avg over 1024 or
 * more ranks multiplies by 0), f64 keeps 1.0/nRanks. ArgsCheck
 * (misc/argcheck.cc) refuses a type outside 0..ncclNumTypes-1 and an
 * operation that is negative; every built-in operation is accepted on every
 * type. (A value >= ncclNumOps is a user operation: not this function's.)
 * FP8 reductions before sm_90 are refused in taskAppend, by enqueue.c. */
ncclResult_t gs_redop_builtin(gs_redop_t *out, ncclRedOp_t op, ncclDataType_t dt, int nranks) {
  if (gs_dtype_size(dt) == 0 || (int)op < 0 || (int)op > ncclAvg || nranks < 1)
    return ncclInvalidArgument;
  out->dt = dt;
  out->scalar = 0;
  switch ((int)op) {
  case ncclSum: out->kind = GS_RED_SUM; break;
  case ncclProd: out->kind = GS_RED_PROD; break;
  case ncclMin: out->kind = GS_RED_MIN; break;
  case ncclMax: out->kind = GS_RED_MAX; break;
  default: /* ncclAvg */
    if (dt_is_int(dt)) {
      out->kind = GS_RED_SUMPOSTDIV;
      out->scalar = (uint64_t)nranks;
      break;
    }
    out->kind = GS_RED_PREMULSUM;
    float inv = (float)(1.0 / nranks);
    switch ((int)dt) {
    case ncclFloat16: out->scalar = gs_float_to_half(inv); break;
    case ncclBfloat16: out->scalar = gs_float_to_bf16(inv); break;
    case ncclFloat8e4m3: out->scalar = gs_float_to_fp8(inv, 0); break;
    case ncclFloat8e5m2: out->scalar = gs_float_to_fp8(inv, 1); break;
    case ncclFloat32: out->scalar = f2u(inv); break;
    default: out->scalar = d2u(1.0 / nranks); break;
    }
    break;
  }
  return ncclSuccess;
}

/* ncclRedOpCreatePreMulSum with ncclScalarHostImmediate: the scalar's bytes
 * go into the low bytes of the 64-bit argument (a union in
 * ncclRedOpCreatePreMulSum and FuncPreMulSum's constructor). */
void gs_redop_premul(gs_redop_t *out, ncclDataType_t dt, const void *scalar) {
  out->kind = GS_RED_PREMULSUM;
  out->dt = dt;
  out->scalar = 0;
  size_t n = gs_dtype_size(dt);
  if (n) memcpy(&out->scalar, scalar, n); /* little-endian: the low bytes */
}

/* ---- the loops ---------------------------------------------------------------------------
 * One function per (operation, type), the type switched on outside the loop.
 * Signed integers use the unsigned loops for everything but min/max, as
 * NCCL's generate.py equivalent_primary does: wrap-around, no UB. */

#define DEF_BIN(name, T, EXPR)                                             \
  static void name(void *restrict av, const void *restrict bv, size_t n) { \
    T *restrict a = av;                                                    \
    const T *restrict b = bv;                                              \
    for (size_t i = 0; i < n; i++) {                                       \
      T x = a[i], y = b[i];                                                \
      a[i] = (T)(EXPR);                                                    \
    }                                                                      \
  }

/* clang-format off */
DEF_BIN(sum_u8, uint8_t, x + y)
DEF_BIN(sum_u32, uint32_t, x + y)
DEF_BIN(sum_u64, uint64_t, x + y)
DEF_BIN(prod_u8, uint8_t, (unsigned)x * y)
DEF_BIN(prod_u32, uint32_t, x * y)
DEF_BIN(prod_u64, uint64_t, x * y)
DEF_BIN(min_u8, uint8_t, x < y ? x : y)
DEF_BIN(max_u8, uint8_t, x > y ? x : y)
DEF_BIN(min_i8, int8_t, x < y ? x : y)
DEF_BIN(max_i8, int8_t, x > y ? x : y)
DEF_BIN(min_u32, uint32_t, x < y ? x : y)
DEF_BIN(max_u32, uint32_t, x > y ? x : y)
DEF_BIN(min_i32, int32_t, x < y ? x : y)
DEF_BIN(max_i32, int32_t, x > y ? x : y)
DEF_BIN(min_u64, uint64_t, x < y ? x : y)
DEF_BIN(max_u64, uint64_t, x > y ? x : y)
DEF_BIN(min_i64, int64_t, x < y ? x : y)
DEF_BIN(max_i64, int64_t, x > y ? x : y)
DEF_BIN(sum_f32, uint32_t, f32_canon(u2f(x) + u2f(y)))
DEF_BIN(prod_f32, uint32_t, f32_canon(u2f(x) * u2f(y)))
DEF_BIN(min_f32, uint32_t, f32_minmax(x, y, 0))
DEF_BIN(max_f32, uint32_t, f32_minmax(x, y, 1))
/* double: IEEE host arithmetic. Whether the GPU keeps f64 NaN payloads is
 * not modelled: a NaN stays a NaN. */
DEF_BIN(sum_f64, uint64_t, d2u(u2d(x) + u2d(y)))
DEF_BIN(prod_f64, uint64_t, d2u(u2d(x) * u2d(y)))
DEF_BIN(min_f64, uint64_t, f64_minmax(x, y, 0))
DEF_BIN(max_f64, uint64_t, f64_minmax(x, y, 1))
DEF_BIN(sum_f16, uint16_t, h_add(x, y))
DEF_BIN(prod_f16, uint16_t, h_mul(x, y))
DEF_BIN(min_f16, uint16_t, f16_minmax(x, y, 0, 0x7c00u))
DEF_BIN(max_f16, uint16_t, f16_minmax(x, y, 1, 0x7c00u))
DEF_BIN(sum_bf16, uint16_t, bf_add(x, y))
DEF_BIN(prod_bf16, uint16_t, bf_mul(x, y))
DEF_BIN(min_bf16, uint16_t, f16_minmax(x, y, 0, 0x7f80u))
DEF_BIN(max_bf16, uint16_t, f16_minmax(x, y, 1, 0x7f80u))
/* clang-format on */

static void tab_fp8(uint8_t *restrict a, const uint8_t *restrict b, size_t n, const uint8_t *tab) {
  for (size_t i = 0; i < n; i++)
    a[i] = tab[(unsigned)a[i] << 8 | b[i]];
}

/* PreMulSum's pre-operation (reduce_kernel.h Apply_PreOp<FuncPreMulSum>):
 * x * scalar in the type itself (integers wrap; half/bf16 via __hmul; fp8
 * via __hmul on halves, then back with __NV_SATFINITE). `src` may be `dst`
 * (gs_reduce_first in place), and `add` adds the product, already rounded to
 * the type, into dst (FuncPreMulSum's reduce is FuncSum's). */
#define DEF_PRE(name, T, S, MUL, ADD)                              \
  static void name(T *dst, const T *src, size_t n, S s, int add) { \
    if (add) {                                                     \
      for (size_t i = 0; i < n; i++) {                             \
        T x = src[i], p = (T)(MUL), y = dst[i];                    \
        dst[i] = (T)(ADD);                                         \
      }                                                            \
    } else {                                                       \
      for (size_t i = 0; i < n; i++) {                             \
        T x = src[i];                                              \
        dst[i] = (T)(MUL);                                         \
      }                                                            \
    }                                                              \
  }

DEF_PRE(pre_u8, uint8_t, uint8_t, (unsigned)x *s, p + y)
DEF_PRE(pre_u32, uint32_t, uint32_t, x *s, p + y)
DEF_PRE(pre_u64, uint64_t, uint64_t, x *s, p + y)
DEF_PRE(pre_f32, uint32_t, float, f32_canon(u2f(x) * s), f32_canon(u2f(p) + u2f(y)))
DEF_PRE(pre_f64, uint64_t, double, d2u(u2d(x) * s), d2u(u2d(p) + u2d(y)))
DEF_PRE(pre_f16, uint16_t, uint16_t, h_mul(x, s), h_add(y, p))
DEF_PRE(pre_bf16, uint16_t, uint16_t, bf_mul(x, s), bf_add(y, p))

/* fp8 pre-operation: a 256-entry table of x * scalar for this call. */
static void pre_fp8(uint8_t *dst, const uint8_t *src, size_t n, uint8_t s, int e5m2, int add) {
  uint8_t mul[256];
  uint16_t hs = fp8_to_half(s, e5m2);
  for (unsigned v = 0; v < 256u; v++)
    mul[v] = half_to_fp8(h_mul(fp8_to_half((uint8_t)v, e5m2), hs), e5m2);
  if (add) {
    const uint8_t *sum = fp8_table(e5m2, FP8_SUM);
    for (size_t i = 0; i < n; i++)
      dst[i] = sum[(unsigned)dst[i] << 8 | mul[src[i]]];
  } else {
    for (size_t i = 0; i < n; i++)
      dst[i] = mul[src[i]];
  }
}

static void premul(const gs_redop_t *op, void *dst, const void *src, size_t n, int add) {
  uint64_t s = op->scalar;
  switch ((int)op->dt) {
  case ncclInt8:
  case ncclUint8: pre_u8(dst, src, n, (uint8_t)s, add); break;
  case ncclInt32:
  case ncclUint32: pre_u32(dst, src, n, (uint32_t)s, add); break;
  case ncclInt64:
  case ncclUint64: pre_u64(dst, src, n, s, add); break;
  case ncclFloat16: pre_f16(dst, src, n, (uint16_t)s, add); break;
  case ncclBfloat16: pre_bf16(dst, src, n, (uint16_t)s, add); break;
  case ncclFloat32: pre_f32(dst, src, n, u2f((uint32_t)s), add); break;
  case ncclFloat64: pre_f64(dst, src, n, u2d(s), add); break;
  case ncclFloat8e4m3: pre_fp8(dst, src, n, (uint8_t)s, 0, add); break;
  case ncclFloat8e5m2: pre_fp8(dst, src, n, (uint8_t)s, 1, add); break;
  default: break;
  }
}

typedef void (*bin_fn)(void *restrict, const void *restrict, size_t);

/* The loop of each (type, sum/prod/min/max) for gs_reduce_next, by
 * ncclDataType_t; fp8 goes through its tables instead. */
static const bin_fn binary[ncclFloat8e4m3][4] = {
    [ncclInt8] = {sum_u8, prod_u8, min_i8, max_i8},
    [ncclUint8] = {sum_u8, prod_u8, min_u8, max_u8},
    [ncclInt32] = {sum_u32, prod_u32, min_i32, max_i32},
    [ncclUint32] = {sum_u32, prod_u32, min_u32, max_u32},
    [ncclInt64] = {sum_u64, prod_u64, min_i64, max_i64},
    [ncclUint64] = {sum_u64, prod_u64, min_u64, max_u64},
    [ncclFloat16] = {sum_f16, prod_f16, min_f16, max_f16},
    [ncclFloat32] = {sum_f32, prod_f32, min_f32, max_f32},
    [ncclFloat64] = {sum_f64, prod_f64, min_f64, max_f64},
    [ncclBfloat16] = {sum_bf16, prod_bf16, min_bf16, max_bf16},
};

/* reduce_kernel.h: FuncPreMulSum applies its pre-operation to every input
 * (common_kernel.h reduceCopyPacks, PreOpSrcs), the others none. */
void gs_reduce_first(const gs_redop_t *op, void *acc, const void *in, size_t count) {
  pthread_once(&h2f_once, h2f_init);
  if (op->kind == GS_RED_PREMULSUM) {
    premul(op, acc, in, count, 0);
  } else if (acc != in) {
    memcpy(acc, in, count * gs_dtype_size(op->dt));
  }
}

void gs_reduce_next(const gs_redop_t *op, void *acc, const void *in, size_t count) {
  pthread_once(&h2f_once, h2f_init);
  if (op->kind == GS_RED_PREMULSUM) {
    premul(op, acc, in, count, 1);
    return;
  }
  /* SUMPOSTDIV reduces as FuncSum (reduce_kernel.h); GS_RED_SUM..MAX are 0..3 */
  int k = op->kind == GS_RED_SUMPOSTDIV ? GS_RED_SUM : (int)op->kind;
  if (k < GS_RED_SUM || k > GS_RED_MAX) return;
  if (op->dt == ncclFloat8e4m3 || op->dt == ncclFloat8e5m2) {
    static const int fp8_op[4] = {FP8_SUM, FP8_PROD, FP8_MIN, FP8_MAX};
    tab_fp8(acc, in, count, fp8_table(op->dt == ncclFloat8e5m2, fp8_op[k]));
  } else if ((int)op->dt >= 0 && (int)op->dt < ncclFloat8e4m3) {
    binary[op->dt][k](acc, in, count);
  }
}

/* reduce_kernel.h FuncSumPostDiv::divide, for T the unsigned type of the
 * data (signed types map to it) and the signedness flag of the argument:
 * |x| is divided by multiplying with recip = UINT_MAX/divisor (32-bit
 * arithmetic for 1- and 4-byte types, __umulhi; 64-bit for 8-byte,
 * __umul64hi) and one fix-up, and the sign put back: a truncating division
 * (toward zero), computed exactly as the GPU does. */
#define DEF_DIV(name, T, U, HI)                           \
  static void name(T *a, size_t n, uint32_t d, int sgn) { \
    const T top = (T) ~((T)-1 >> 1);                      \
    U recip = (U)-1 / d;                                  \
    for (size_t i = 0; i < n; i++) {                      \
      T x = a[i];                                         \
      int neg = sgn && (x & top);                         \
      U xabs = neg ? (U)(T)(0u - x) : (U)x;               \
      U q = HI(xabs, recip);                              \
      if (xabs - q * d >= d) q += 1;                      \
      a[i] = neg ? (T)(0u - (T)q) : (T)q;                 \
    }                                                     \
  }
#define HI32(a, b) ((uint32_t)(((uint64_t)(a) * (b)) >> 32))
#define HI64(a, b) ((uint64_t)(((unsigned __int128)(a) * (b)) >> 64))
DEF_DIV(div_u8, uint8_t, uint32_t, HI32)
DEF_DIV(div_u32, uint32_t, uint32_t, HI32)
DEF_DIV(div_u64, uint64_t, uint64_t, HI64)

void gs_reduce_last(const gs_redop_t *op, void *acc, size_t count) {
  if (op->kind != GS_RED_SUMPOSTDIV) return;
  /* FuncSumPostDiv keeps the divisor in 31 bits (nRanks<<1 | signed) */
  uint32_t d = (uint32_t)(op->scalar & 0x7fffffffu);
  if (d == 0) return;
  int sgn = dt_is_signed(op->dt);
  switch (gs_dtype_size(op->dt)) {
  case 1: div_u8(acc, count, d, sgn); break;
  case 4: div_u32(acc, count, d, sgn); break;
  case 8: div_u64(acc, count, d, sgn); break;
  default: break;
  }
}
