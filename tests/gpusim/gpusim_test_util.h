/*
 * gpusim_test_util.h - helpers of the simulated device's conformance tests
 * (tests/gpusim): multi-process runs over one unique id, device buffers
 * filled and read through cudaMemcpy, and NCCL calls checked in children.
 *
 * Children are forked by tests/support/mp.c before any CUDA call of the
 * parent that starts threads (CUDA does not survive fork either);
 * ncclGetUniqueId starts none, so the parent makes the id and the children
 * inherit it.
 */
#ifndef TDIST_TEST_GPUSIM_UTIL_H
#define TDIST_TEST_GPUSIM_UTIL_H

#include <stdio.h>
#include <unistd.h>

#include "gpusim/api.h"
#include "mp.h"
#include "tdist/gpusim.h"

/* In a child: the NCCL or CUDA call must succeed (NCCL: ncclSuccess). */
#define GT_NCCL(call)                                                                      \
  do {                                                                                     \
    ncclResult_t r__ = (call);                                                             \
    if (r__ != ncclSuccess) {                                                              \
      fprintf(stderr, "[pid %d] %s:%d: %s = %d (%s; last: %s)\n", (int)getpid(), __FILE__, \
              __LINE__, #call, (int)r__, ncclGetErrorString(r__), ncclGetLastError(NULL)); \
      return 1;                                                                            \
    }                                                                                      \
  } while (0)
#define GT_CUDA(call)                                                                        \
  do {                                                                                       \
    cudaError_t e__ = (call);                                                                \
    if (e__ != cudaSuccess) {                                                                \
      fprintf(stderr, "[pid %d] %s:%d: %s = %s\n", (int)getpid(), __FILE__, __LINE__, #call, \
              cudaGetErrorName(e__));                                                        \
      return 1;                                                                              \
    }                                                                                        \
  } while (0)

/* A config with `blocking` set (NCCL_CONFIG_INITIALIZER otherwise). */
ncclConfig_t gt_config(int blocking);

/* Poll ncclCommGetAsyncError until it leaves ncclInProgress or timeout_ms
 * passes; returns the last state (ncclInProgress at the timeout). */
ncclResult_t gt_wait_ready(ncclComm_t c, int timeout_ms);

/* An enqueue on a non-blocking communicator answers what
 * ncclCommGetAsyncError says right after its group end (enqueue.cc
 * ncclEnqueueCheck): ncclInProgress while the launch job runs, ncclSuccess
 * when it has already ended (seen under TSan). Strict ncclInProgress only
 * where a peer is known to be missing. */
#define GT_LAUNCHED(r) ((r) == ncclInProgress || (r) == ncclSuccess)
/* The same as a check in a child: anything else is reported with its code
 * and ncclGetLastError, and the child returns 1. */
#define GT_CHECK_LAUNCHED(call)                                                                \
  do {                                                                                         \
    ncclResult_t r__ = (call);                                                                 \
    if (!GT_LAUNCHED(r__)) {                                                                   \
      fprintf(stderr, "[pid %d] %s:%d: %s = %d (%s; last: %s), not launched\n", (int)getpid(), \
              __FILE__, __LINE__, #call, (int)r__, ncclGetErrorString(r__),                    \
              ncclGetLastError(NULL));                                                         \
      return 1;                                                                                \
    }                                                                                          \
  } while (0)

/* Device buffer of n bytes holding a copy of host[0, n) (host may be NULL:
 * zeroed). NULL on failure. */
void *gt_dev_from(const void *host, size_t n);
/* Host copy of device memory (synchronous cudaMemcpy). 0 or -1. */
int gt_to_host(void *host, const void *dev, size_t n);

/* Milliseconds on a monotonic clock. */
long long gt_now_ms(void);

#endif
