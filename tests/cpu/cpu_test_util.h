/*
 * cpu_test_util.h - helpers shared by the CPU backend tests: world setup in a
 * forked child, deterministic inputs (small integers, so float sums are exact
 * whatever the reduction order), element access for every dtype, and a
 * reference reduction computed locally.
 */
#ifndef TDIST_TEST_CPU_UTIL_H
#define TDIST_TEST_CPU_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu/base/base.h"
#include "cpu/transport/transport.h"
#include "cpu/engine/engine.h"
#include "cpu/segment/sc.h"
#include "cpu/conn/conn.h"
#include "mp.h"
#include "tdist/tdist.h"

static inline int cpu_test_init(int port, int rank, int n, int64_t timeout_ms, tdist_group_t **g) {
  char method[64];
  snprintf(method, sizeof(method), "tcp://127.0.0.1:%d", port);
  tdist_init_opts_t o = {0};
  o.mask = TDIST_INIT_FIELD_BACKEND | TDIST_INIT_FIELD_INIT_METHOD | TDIST_INIT_FIELD_RANK |
           TDIST_INIT_FIELD_WORLD_SIZE | TDIST_INIT_FIELD_HOST_STORE | TDIST_INIT_FIELD_TIMEOUT;
  o.backend = "cpu";
  o.init_method = method;
  o.rank = rank;
  o.world_size = n;
  o.host_store = 1;
  o.timeout_ms = timeout_ms;
  return tdist_init_process_group(&o, g);
}

static inline int is_float(tdist_dtype_t dt) {
  return dt == TDIST_FLOAT16 || dt == TDIST_BFLOAT16 || dt == TDIST_FLOAT32 || dt == TDIST_FLOAT64;
}

static inline double get_el(const void *buf, tdist_dtype_t dt, size_t i) {
  switch (dt) {
  case TDIST_INT8: return ((const int8_t *)buf)[i];
  case TDIST_UINT8: return ((const uint8_t *)buf)[i];
  case TDIST_INT32: return ((const int32_t *)buf)[i];
  case TDIST_INT64: return (double)((const int64_t *)buf)[i];
  case TDIST_FLOAT16: return tdist__cpu_half_to_float(((const uint16_t *)buf)[i]);
  case TDIST_BFLOAT16: return tdist__cpu_bf16_to_float(((const uint16_t *)buf)[i]);
  case TDIST_FLOAT32: return ((const float *)buf)[i];
  case TDIST_FLOAT64: return ((const double *)buf)[i];
  default: return 0;
  }
}

static inline void set_el(void *buf, tdist_dtype_t dt, size_t i, double v) {
  switch (dt) {
  case TDIST_INT8: ((int8_t *)buf)[i] = (int8_t)v; break;
  case TDIST_UINT8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
  case TDIST_INT32: ((int32_t *)buf)[i] = (int32_t)v; break;
  case TDIST_INT64: ((int64_t *)buf)[i] = (int64_t)v; break;
  case TDIST_FLOAT16: ((uint16_t *)buf)[i] = tdist__cpu_float_to_half((float)v); break;
  case TDIST_BFLOAT16: ((uint16_t *)buf)[i] = tdist__cpu_float_to_bf16((float)v); break;
  case TDIST_FLOAT32: ((float *)buf)[i] = (float)v; break;
  case TDIST_FLOAT64: ((double *)buf)[i] = v; break;
  default: break;
  }
}

/* Input element i of `rank`: small integers; for PROD only 1 and 2 (and -1
 * for signed types) so products of 5 ranks stay small. */
static inline double gen(int rank, size_t i, int salt, tdist_redop_t op, tdist_dtype_t dt) {
  unsigned h = (unsigned)(rank * 7 + (int)(i % 1000003) * 13 + salt * 5);
  int uns = dt == TDIST_UINT8;
  if (op == TDIST_PROD) {
    int v = (int)(h % 3);
    return v == 0 ? (uns ? 1 : -1) : v;
  }
  return uns ? (double)(h % 5) : (double)((int)(h % 5) - 2);
}

static inline void fill(void *buf, tdist_dtype_t dt, size_t n, int rank, int salt,
                        tdist_redop_t op) {
  for (size_t i = 0; i < n; i++)
    set_el(buf, dt, i, gen(rank, i, salt, op, dt));
}

/* The expected result of reducing element i over `n` ranks. */
static inline double ref_reduce(size_t i, int n, int salt, tdist_redop_t op, tdist_dtype_t dt,
                                double scalar) {
  double acc = 0;
  for (int r = 0; r < n; r++) {
    double v = gen(r, i, salt, op, dt);
    if (op == TDIST_PREMUL_SUM) v = is_float(dt) ? v * scalar : trunc(v * scalar);
    if (r == 0)
      acc = v;
    else if (op == TDIST_PROD)
      acc *= v;
    else if (op == TDIST_MIN)
      acc = v < acc ? v : acc;
    else if (op == TDIST_MAX)
      acc = v > acc ? v : acc;
    else
      acc += v;
  }
  if (op == TDIST_AVG) acc = is_float(dt) ? acc / n : trunc(acc / n);
  return acc;
}

static inline int close_enough(double got, double want, tdist_dtype_t dt) {
  double tol = dt == TDIST_FLOAT16 || dt == TDIST_BFLOAT16 ? 1e-2
               : dt == TDIST_FLOAT32                       ? 1e-6
               : dt == TDIST_FLOAT64                       ? 1e-12
                                                           : 0;
  return fabs(got - want) <= tol * (fabs(want) > 1 ? fabs(want) : 1);
}

/* 1 in a ThreadSanitizer build, where every access is checked: tests that
 * move hundreds of MB or run many random trials use smaller defaults there,
 * to keep the TSan pass of the test command near its budget (the plain and
 * ASan passes run the full size). */
#if defined(__SANITIZE_THREAD__)
#define TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TEST_TSAN 1
#endif
#endif
#ifndef TEST_TSAN
#define TEST_TSAN 0
#endif

#endif
