/*
 * nccl_sim_util.h - helpers of the NCCL backend tests that run on the
 * simulated GPU (libtdist_gpusim.so, docs/gpusim.md) instead of the call
 * recorder: a world group on backend "nccl" over a real TCP store with one
 * simulated device per rank, device buffers filled and read through
 * cudaMemcpy, and host encodings of every NCCL element type so results can
 * be checked against a reference computed in double.
 *
 * TDIST_NCCL_LIBRARY and TDIST_CUDART_LIBRARY name libtdist_gpusim.so in the
 * test's environment (CMakeLists.txt); the program links the same library to
 * call cudaMalloc, cudaMemcpy... by name, and dlopen of it returns that
 * instance. Ranks are forked by tests/support/mp.c before the parent makes
 * any CUDA call (the simulated streams are threads, which fork does not
 * copy).
 */
#ifndef TDIST_TEST_NCCL_SIM_UTIL_H
#define TDIST_TEST_NCCL_SIM_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/init/registry.h"
#include "gpusim/api.h"
#include "mp.h"
#include "tdist/gpusim.h"
#include "tdist/tdist.h"

/* The backend (src/nccl/nccl_comm.c): a reference from the test pulls its
 * objects out of the static library whatever the core's table does. */
extern const tdist_backend_t tdist__nccl_backend;
__attribute__((used)) static const tdist_backend_t *const ns_nccl_backend_ref =
    &tdist__nccl_backend;

/* In a child: `call` must return `want` (a tdist code); prints both and the
 * last error otherwise. */
#define NS_EXPECT(call, want)                                                                    \
  do {                                                                                           \
    int rc__ = (call);                                                                           \
    if (rc__ != (want)) {                                                                        \
      fprintf(stderr, "[pid %d] %s:%d: %s returned %s, want %s (%s)\n", (int)getpid(), __FILE__, \
              __LINE__, #call, tdist_err_name(rc__), tdist_err_name(want), tdist_last_error());  \
      return 1;                                                                                  \
    }                                                                                            \
  } while (0)

/* In a child: the CUDA call must succeed. */
#define NS_CUDA(call)                                                                        \
  do {                                                                                       \
    cudaError_t e__ = (call);                                                                \
    if (e__ != cudaSuccess) {                                                                \
      fprintf(stderr, "[pid %d] %s:%d: %s = %s\n", (int)getpid(), __FILE__, __LINE__, #call, \
              cudaGetErrorName(e__));                                                        \
      return 1;                                                                              \
    }                                                                                        \
  } while (0)

/* In a child: string `s` must contain `sub`. */
#define NS_HAS(s, sub)                                                                            \
  do {                                                                                            \
    const char *s__ = (s);                                                                        \
    if (!s__ || !strstr(s__, (sub))) {                                                            \
      fprintf(stderr, "[pid %d] %s:%d: \"%s\" lacks \"%s\"\n", (int)getpid(), __FILE__, __LINE__, \
              s__ ? s__ : "(null)", (sub));                                                       \
      return 1;                                                                                   \
    }                                                                                             \
  } while (0)

/* Caller thread: world group of `size` ranks on backend "nccl", this one
 * `rank` on simulated device `device`, rank 0 hosting the store on
 * 127.0.0.1:port. */
static inline int ns_world_on(const char *backend, int rank, int size, int port, int64_t timeout_ms,
                              int device, tdist_group_t **g) {
  char url[64];
  snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", port);
  tdist_init_opts_t o = {0};
  o.mask = TDIST_INIT_FIELD_BACKEND | TDIST_INIT_FIELD_INIT_METHOD | TDIST_INIT_FIELD_RANK |
           TDIST_INIT_FIELD_WORLD_SIZE | TDIST_INIT_FIELD_TIMEOUT | TDIST_INIT_FIELD_HOST_STORE |
           TDIST_INIT_FIELD_DEVICE;
  o.backend = backend;
  o.init_method = url;
  o.rank = rank;
  o.world_size = size;
  o.timeout_ms = timeout_ms;
  o.host_store = 1;
  o.device = device;
  return tdist_init_process_group(&o, g);
}
static inline int ns_world(int rank, int size, int port, int64_t timeout_ms, tdist_group_t **g) {
  return ns_world_on("nccl", rank, size, port, timeout_ms, rank, g);
}

/* Every rank of g reached point `key` (a counter in the group's store). */
static inline int ns_sync(tdist_group_t *g, const char *key, int64_t timeout_ms) {
  tdist_store_t *st = tdist_group_store(g);
  if (!st) return -1;
  int64_t v = 0;
  if (tdist_store_add(st, key, 1, &v) != 0) return -1;
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  while (v < tdist_group_size(g)) {
    usleep(2000);
    if (tdist_store_add(st, key, 0, &v) != 0) return -1;
    clock_gettime(CLOCK_MONOTONIC, &t);
    if ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 > timeout_ms) return -1;
  }
  return 0;
}

/* Device memory of n bytes holding host[0, n) (NULL host: zeroed). */
static inline void *ns_dev(const void *host, size_t n) {
  void *d = NULL;
  if (cudaMalloc(&d, n ? n : 1) != cudaSuccess) return NULL;
  cudaError_t e = host ? cudaMemcpy(d, host, n, cudaMemcpyHostToDevice) : cudaMemset(d, 0, n);
  if (e != cudaSuccess) {
    cudaFree(d);
    return NULL;
  }
  return d;
}
static inline int ns_put(void *dev, const void *host, size_t n) {
  return cudaMemcpy(dev, host, n, cudaMemcpyHostToDevice) == cudaSuccess ? 0 : -1;
}
static inline int ns_get(void *host, const void *dev, size_t n) {
  return cudaMemcpy(host, dev, n, cudaMemcpyDeviceToHost) == cudaSuccess ? 0 : -1;
}

static inline long long ns_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Poll `cond` (an expression) every ms for up to timeout_ms. */
#define NS_WAIT_FOR(cond, timeout_ms)                                               \
  do {                                                                              \
    for (long long t__ = ns_now_ms(); !(cond) && ns_now_ms() - t__ < (timeout_ms);) \
      usleep(1000);                                                                 \
  } while (0)

/* ---- element types on the host ---------------------------------------------------------- */

static inline int ns_is_float(tdist_dtype_t dt) {
  return dt == TDIST_FLOAT16 || dt == TDIST_BFLOAT16 || dt == TDIST_FLOAT32 ||
         dt == TDIST_FLOAT64 || dt == TDIST_FLOAT8_E4M3 || dt == TDIST_FLOAT8_E5M2;
}
static inline int ns_is_signed(tdist_dtype_t dt) {
  return ns_is_float(dt) || dt == TDIST_INT8 || dt == TDIST_INT32 || dt == TDIST_INT64;
}

/* A float of `eb` exponent bits and `mb` mantissa bits (bias 2^(eb-1)-1)
 * from its bits; e4m3 has no infinity (its all-ones pattern is NaN). */
static inline double ns_small_float(uint32_t bits, int eb, int mb, int e4m3) {
  uint32_t sign = bits >> (eb + mb), e = (bits >> mb) & ((1u << eb) - 1),
           m = bits & ((1u << mb) - 1);
  int bias = (1 << (eb - 1)) - 1;
  double v;
  if (e == 0)
    v = ldexp((double)m, 1 - bias - mb);
  else if (!e4m3 && e == (1u << eb) - 1)
    v = m ? NAN : INFINITY;
  else if (e4m3 && e == 15 && m == 7)
    v = NAN;
  else
    v = ldexp((double)(m | (1u << mb)), (int)e - bias - mb);
  return sign ? -v : v;
}

/* Bits of the value of that format nearest to d (ties to even), saturating
 * at the largest finite value (exact values only are encoded by the tests;
 * the search keeps this independent of the code under test). */
static inline uint32_t ns_small_encode(double d, int eb, int mb, int e4m3) {
  uint32_t best = 0, n = 1u << (eb + mb + 1);
  double bd = INFINITY;
  for (uint32_t b = 0; b < n; b++) {
    double v = ns_small_float(b, eb, mb, e4m3);
    if (isnan(v) || isinf(v)) continue;
    double diff = fabs(v - d);
    if (diff < bd || (diff == bd && !(b & 1))) bd = diff, best = b;
  }
  return best;
}

/* value -> element of type dt at p. Integers: d must be integral. */
static inline void ns_encode(tdist_dtype_t dt, double d, void *p) {
  switch (dt) {
  case TDIST_INT8: *(int8_t *)p = (int8_t)d; break;
  case TDIST_UINT8: *(uint8_t *)p = (uint8_t)d; break;
  case TDIST_INT32: *(int32_t *)p = (int32_t)d; break;
  case TDIST_UINT32: *(uint32_t *)p = (uint32_t)d; break;
  case TDIST_INT64: *(int64_t *)p = (int64_t)d; break;
  case TDIST_UINT64: *(uint64_t *)p = (uint64_t)d; break;
  case TDIST_FLOAT32: *(float *)p = (float)d; break;
  case TDIST_FLOAT64: *(double *)p = d; break;
  case TDIST_FLOAT16: *(uint16_t *)p = (uint16_t)ns_small_encode(d, 5, 10, 0); break;
  case TDIST_BFLOAT16: {
    float f = (float)d; /* the tests encode values exact in bfloat16 */
    uint32_t x;
    memcpy(&x, &f, 4);
    *(uint16_t *)p = (uint16_t)(x >> 16);
    break;
  }
  case TDIST_FLOAT8_E4M3: *(uint8_t *)p = (uint8_t)ns_small_encode(d, 4, 3, 1); break;
  case TDIST_FLOAT8_E5M2: *(uint8_t *)p = (uint8_t)ns_small_encode(d, 5, 2, 0); break;
  default: break;
  }
}

static inline double ns_decode(tdist_dtype_t dt, const void *p) {
  switch (dt) {
  case TDIST_INT8: return *(const int8_t *)p;
  case TDIST_UINT8: return *(const uint8_t *)p;
  case TDIST_INT32: return *(const int32_t *)p;
  case TDIST_UINT32: return *(const uint32_t *)p;
  case TDIST_INT64: return (double)*(const int64_t *)p;
  case TDIST_UINT64: return (double)*(const uint64_t *)p;
  case TDIST_FLOAT32: return *(const float *)p;
  case TDIST_FLOAT64: return *(const double *)p;
  case TDIST_FLOAT16: return ns_small_float(*(const uint16_t *)p, 5, 10, 0);
  case TDIST_BFLOAT16: {
    uint32_t x = (uint32_t) * (const uint16_t *)p << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
  }
  case TDIST_FLOAT8_E4M3: return ns_small_float(*(const uint8_t *)p, 4, 3, 1);
  case TDIST_FLOAT8_E5M2: return ns_small_float(*(const uint8_t *)p, 5, 2, 0);
  default: return NAN;
  }
}

/* Relative tolerance of a result computed with a rounding per step in dt
 * (NCCL rounds every hop to the element type): a few units in the last
 * place. Integers: exact. */
static inline double ns_tol(tdist_dtype_t dt) {
  switch (dt) {
  case TDIST_FLOAT64: return 1e-12;
  case TDIST_FLOAT32: return 1e-5;
  case TDIST_FLOAT16: return 4e-3;
  case TDIST_BFLOAT16: return 3e-2;
  case TDIST_FLOAT8_E4M3: return 0.2;
  case TDIST_FLOAT8_E5M2: return 0.4;
  default: return 0;
  }
}

/* got within the tolerance of want (relative to max(|want|, 1)). */
static inline int ns_close(tdist_dtype_t dt, double got, double want) {
  double tol = ns_tol(dt);
  if (tol == 0) return got == want;
  double scale = fabs(want) > 1 ? fabs(want) : 1;
  return fabs(got - want) <= tol * scale;
}

#endif
