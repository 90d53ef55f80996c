/*
 * gpusim_test_util.c - see gpusim_test_util.h.
 */
#include "gpusim_test_util.h"

#include <time.h>

ncclConfig_t gt_config(int blocking) {
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  c.blocking = blocking;
  return c;
}

long long gt_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

ncclResult_t gt_wait_ready(ncclComm_t c, int timeout_ms) {
  long long end = gt_now_ms() + timeout_ms;
  ncclResult_t st = ncclInProgress;
  for (;;) {
    if (ncclCommGetAsyncError(c, &st) != ncclSuccess) return ncclInvalidArgument;
    if (st != ncclInProgress || gt_now_ms() >= end) return st;
    usleep(1000);
  }
}

void *gt_dev_from(const void *host, size_t n) {
  void *d = NULL;
  if (cudaMalloc(&d, n ? n : 1) != cudaSuccess) return NULL;
  cudaError_t e = host ? cudaMemcpy(d, host, n, cudaMemcpyHostToDevice) : cudaMemset(d, 0, n);
  if (e != cudaSuccess) {
    cudaFree(d);
    return NULL;
  }
  return d;
}

int gt_to_host(void *host, const void *dev, size_t n) {
  return cudaMemcpy(host, dev, n, cudaMemcpyDeviceToHost) == cudaSuccess ? 0 : -1;
}
