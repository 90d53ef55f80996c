/*
 * test_gpusim_coll.c - conformance: every collective, data type and
 * reduction of the simulated NCCL moves the right data between 1 to 4
 * processes, checked against a reference computed here.
 *
 * Follows: NCCL user guide "Collective Operations" (the layout of every
 * operation's buffers, counts per rank), nccl.h (argument order), and
 * src/enqueue.cc hostToDevRedOp for ncclAvg (integers: sum, then divide;
 * floating point: each input times 1/nranks, then sum) and PreMulSum.
 * Inputs are small integers, exact in every type down to fp8 e5m2, so sums,
 * products, minima and maxima are exact; ncclAvg of floats is checked within
 * the type's rounding. A count of 300000 int32 (1.2 MB) crosses the
 * simulation's staging chunk.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gpusim_test_util.h"

static const ncclDataType_t types[] = {ncclInt8,    ncclUint8,    ncclInt32,     ncclUint32,
                                       ncclInt64,   ncclUint64,   ncclFloat16,   ncclFloat32,
                                       ncclFloat64, ncclBfloat16, ncclFloat8e4m3, ncclFloat8e5m2};
enum { NTYPES = sizeof(types) / sizeof(types[0]) };
enum { F_ALLREDUCE, F_BCAST, F_REDUCE, F_ALLGATHER, F_RS, F_A2A, F_GATHER, F_SCATTER, NFUNCS };
enum { R_SUM, R_PROD, R_MAX, R_MIN, R_AVG, R_PREMUL_HOST, R_PREMUL_DEV, NREDS };

static size_t tsize(ncclDataType_t t) {
  switch (t) {
  case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
  case ncclFloat16: case ncclBfloat16: return 2;
  case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
  default: return 8;
  }
}
static int is_float(ncclDataType_t t) { return t >= ncclFloat16; }
static int is_unsigned(ncclDataType_t t) {
  return t == ncclUint8 || t == ncclUint32 || t == ncclUint64;
}

/* A minifloat with `e` exponent and `m` mantissa bits (IEEE layout). */
static double mf_dec(unsigned v, int e, int m, int fn) {
  int bias = (1 << (e - 1)) - 1, sign = (v >> (e + m)) & 1;
  int ex = (int)((v >> m) & ((1u << e) - 1)), man = (int)(v & ((1u << m) - 1));
  double r;
  if (ex == (1 << e) - 1 && !fn) r = man ? NAN : INFINITY;
  else if (ex == (1 << e) - 1 && fn && man == (1 << m) - 1) r = NAN; /* e4m3fn: S.1111.111 */
  else if (ex == 0) r = ldexp(man, 1 - bias - m);
  else r = ldexp((1 << m) + man, ex - bias - m);
  return sign ? -r : r;
}
/* Exactly representable values only (the inputs). */
static unsigned mf_enc(double v, int e, int m) {
  unsigned sign = v < 0;
  v = fabs(v);
  if (v == 0) return sign << (e + m);
  int bias = (1 << (e - 1)) - 1, ex;
  double fr = frexp(v, &ex); /* v = fr * 2^ex, fr in [0.5, 1) */
  unsigned man = (unsigned)ldexp(fr * 2 - 1, m);
  return (sign << (e + m)) | ((unsigned)(ex - 1 + bias) << m) | man;
}

static void put(ncclDataType_t t, void *p, size_t i, double v) {
  switch (t) {
  case ncclInt8: ((int8_t *)p)[i] = (int8_t)v; break;
  case ncclUint8: ((uint8_t *)p)[i] = (uint8_t)v; break;
  case ncclInt32: ((int32_t *)p)[i] = (int32_t)v; break;
  case ncclUint32: ((uint32_t *)p)[i] = (uint32_t)v; break;
  case ncclInt64: ((int64_t *)p)[i] = (int64_t)v; break;
  case ncclUint64: ((uint64_t *)p)[i] = (uint64_t)v; break;
  case ncclFloat16: ((uint16_t *)p)[i] = (uint16_t)mf_enc(v, 5, 10); break;
  case ncclFloat32: ((float *)p)[i] = (float)v; break;
  case ncclFloat64: ((double *)p)[i] = v; break;
  case ncclBfloat16: ((uint16_t *)p)[i] = (uint16_t)mf_enc(v, 8, 7); break;
  case ncclFloat8e4m3: ((uint8_t *)p)[i] = (uint8_t)mf_enc(v, 4, 3); break;
  case ncclFloat8e5m2: ((uint8_t *)p)[i] = (uint8_t)mf_enc(v, 5, 2); break;
  }
}
static double get(ncclDataType_t t, const void *p, size_t i) {
  switch (t) {
  case ncclInt8: return ((const int8_t *)p)[i];
  case ncclUint8: return ((const uint8_t *)p)[i];
  case ncclInt32: return ((const int32_t *)p)[i];
  case ncclUint32: return ((const uint32_t *)p)[i];
  case ncclInt64: return (double)((const int64_t *)p)[i];
  case ncclUint64: return (double)((const uint64_t *)p)[i];
  case ncclFloat16: return mf_dec(((const uint16_t *)p)[i], 5, 10, 0);
  case ncclFloat32: return ((const float *)p)[i];
  case ncclFloat64: return ((const double *)p)[i];
  case ncclBfloat16: return mf_dec(((const uint16_t *)p)[i], 8, 7, 0);
  case ncclFloat8e4m3: return mf_dec(((const uint8_t *)p)[i], 4, 3, 1);
  default: return mf_dec(((const uint8_t *)p)[i], 5, 2, 0);
  }
}

/* Rank r's element i: small integers; products use {-2,-1,1,2} ({1,2}
 * unsigned) so 4 ranks stay within 16. */
static double val(int r, size_t i, int red, ncclDataType_t t) {
  if (red == R_PROD) return is_unsigned(t) ? 1 + (double)((r + i) % 2) : (double[]){-2, -1, 1, 2}[(r + i) % 4];
  double v = (double)((r * 7 + i * 3) % 5);
  return is_unsigned(t) ? v : v - 2;
}

static double ref_red(int red, int n, size_t i, ncclDataType_t t) {
  double acc = val(0, i, red, t);
  for (int j = 1; j < n; j++) {
    double x = val(j, i, red, t);
    if (red == R_PROD) acc *= x;
    else if (red == R_MAX) acc = x > acc ? x : acc;
    else if (red == R_MIN) acc = x < acc ? x : acc;
    else acc += x;
  }
  if (red == R_PREMUL_HOST) acc *= 2;
  if (red == R_PREMUL_DEV) acc *= is_unsigned(t) ? 3 : -1;
  if (red == R_AVG) acc = is_float(t) ? acc / n : trunc(acc / n);
  return acc;
}

static int reducing(int f) { return f == F_ALLREDUCE || f == F_REDUCE || f == F_RS; }

typedef struct run {
  ncclUniqueId id;
} run_t;

/* One collective; returns the number of wrong elements (-1 on an error). */
static int one(ncclComm_t comm, cudaStream_t s, int rank, int n, int f, ncclDataType_t t, int red,
               size_t count) {
  size_t es = tsize(t), nb = count * es, root = n > 1 ? 1 : 0;
  size_t in_n = (f == F_RS || f == F_A2A || f == F_SCATTER) ? count * (size_t)n : count;
  size_t out_n = (f == F_ALLGATHER || f == F_A2A || f == F_GATHER) ? count * (size_t)n : count;
  unsigned char *hin = malloc(in_n * es), *hout = malloc(out_n * es);
  int bad = -1;
  for (size_t i = 0; i < in_n; i++) put(t, hin, i, val(rank, i, red, t));
  void *din = gt_dev_from(hin, in_n * es), *dout = gt_dev_from(NULL, out_n * es);
  ncclRedOp_t op = (ncclRedOp_t)(red == R_SUM ? ncclSum : red == R_PROD ? ncclProd : red == R_MAX ? ncclMax
                                 : red == R_MIN ? ncclMin : ncclAvg);
  void *dscalar = NULL;
  if (red == R_PREMUL_HOST || red == R_PREMUL_DEV) {
    unsigned char sc[8];
    put(t, sc, 0, red == R_PREMUL_HOST ? 2 : is_unsigned(t) ? 3 : -1);
    if (red == R_PREMUL_DEV) dscalar = gt_dev_from(sc, es);
    if (ncclRedOpCreatePreMulSum(&op, red == R_PREMUL_HOST ? sc : dscalar, t,
                                 red == R_PREMUL_HOST ? ncclScalarHostImmediate : ncclScalarDevice,
                                 comm) != ncclSuccess)
      goto out;
  }
  ncclResult_t r = ncclSuccess;
  switch (f) {
  case F_ALLREDUCE: r = ncclAllReduce(din, dout, count, t, op, comm, s); break;
  case F_BCAST: r = ncclBroadcast(din, dout, count, t, (int)root, comm, s); break;
  case F_REDUCE: r = ncclReduce(din, dout, count, t, op, (int)root, comm, s); break;
  case F_ALLGATHER: r = ncclAllGather(din, dout, count, t, comm, s); break;
  case F_RS: r = ncclReduceScatter(din, dout, count, t, op, comm, s); break;
  case F_A2A: r = ncclAlltoAll(din, dout, count, t, comm, s); break;
  case F_GATHER: r = ncclGather(din, dout, count, t, (int)root, comm, s); break;
  case F_SCATTER: r = ncclScatter(din, dout, count, t, (int)root, comm, s); break;
  }
  if (r != ncclSuccess || cudaStreamSynchronize(s) != cudaSuccess || gt_to_host(hout, dout, out_n * es))
    goto out;
  if (op >= 5) ncclRedOpDestroy(op, comm);
  bad = 0;
  double tol = is_float(t) && red == R_AVG ? (t == ncclFloat8e5m2 ? 0.5 : t == ncclFloat8e4m3 ? 0.25 : 0.02) : 0;
  for (size_t i = 0; i < out_n; i++) {
    double want;
    size_t b = i / count, k = i % count;
    switch (f) {
    case F_ALLREDUCE: want = ref_red(red, n, i, t); break;
    case F_REDUCE: if ((size_t)rank != root) continue; want = ref_red(red, n, i, t); break;
    case F_BCAST: want = val((int)root, i, red, t); break;
    case F_ALLGATHER: want = val((int)b, k, red, t); break;
    case F_GATHER: if ((size_t)rank != root) continue; want = val((int)b, k, red, t); break;
    case F_RS: want = ref_red(red, n, (size_t)rank * count + i, t); break;
    case F_A2A: want = val((int)b, (size_t)rank * count + k, red, t); break;
    default: want = val((int)root, (size_t)rank * count + i, red, t); break;
    }
    double got = get(t, hout, i);
    if (fabs(got - want) > tol * (fabs(want) + 1)) {
      if (bad++ < 3)
        fprintf(stderr, "rank %d func %d type %d red %d count %zu: [%zu] = %g, want %g\n", rank, f,
                (int)t, red, count, i, got, want);
    }
  }
  (void)nb;
out:
  cudaFree(din);
  cudaFree(dout);
  if (dscalar) cudaFree(dscalar);
  free(hin);
  free(hout);
  return bad;
}

static int child(int rank, int n, void *arg) {
  run_t *a = arg;
  GT_CUDA(cudaSetDevice(rank));
  ncclComm_t comm;
  GT_NCCL(ncclCommInitRank(&comm, n, a->id, rank));
  cudaStream_t s;
  GT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int fails = 0;
  for (int ti = 0; ti < NTYPES; ti++)
    for (int f = 0; f < NFUNCS; f++)
      for (int red = 0; red < (reducing(f) ? NREDS : 1); red++) {
        int bad = one(comm, s, rank, n, f, types[ti], red, 37);
        if (bad) fails++;
      }
  /* Large: several staging rounds (the chunk is 1 MiB). */
  for (int f = 0; f < NFUNCS; f++)
    if (one(comm, s, rank, n, f, ncclInt32, R_SUM, 300000)) fails++;
  if (one(comm, s, rank, n, F_ALLREDUCE, ncclFloat16, R_MAX, 700000)) fails++;
  MP_CHECK(fails == 0);
  MP_CHECK(tdist_gpusim_mismatches() == 0);
  GT_NCCL(ncclCommDestroy(comm));
  GT_CUDA(cudaStreamDestroy(s));
  return 0;
}

static void every_op_type_reduction(void **state) {
  (void)state;
  for (int n = 1; n <= 4; n++) {
    run_t a;
    assert_int_equal(ncclGetUniqueId(&a.id), ncclSuccess);
    assert_int_equal(tdist_mp_run(n, child, &a, 240), 0);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(every_op_type_reduction)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
