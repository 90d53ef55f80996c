/*
 * nccl_device.c - which CUDA device a thread's calls go to (nccl_backend.h,
 * "the current device").
 *
 * The CUDA runtime keeps a current device per thread, and the first call
 * that needs a context creates the primary context of that device -- device
 * 0 on a thread that never chose one. Two mistakes follow from ignoring it:
 *   - a thread of tdist's own (the progress thread querying end events)
 *     creates a context on GPU 0 in every process, about 0.5 GiB each on an
 *     H100 (torchcomms and PyTorch's watchdog fixed the same bug by setting
 *     the device first);
 *   - a caller's thread left on the group's device allocates and launches
 *     on the wrong GPU afterwards, in a process that drives two.
 * So tdist's threads set the device of the group they serve, and caller
 * threads get theirs back after every span of CUDA calls, as NCCL's own
 * entry points do.
 */
#include "nccl/nccl_backend.h"

/* (caller) 1 when `dev` has a primary context, so making it current costs
 * nothing; without the driver's answer, assume it has. */
static int has_context(int dev) {
  if (!NC.cuDevicePrimaryCtxGetState) return 1;
  unsigned int flags = 0;
  int active = 0;
  if (NC.cuDevicePrimaryCtxGetState(dev, &flags, &active) != 0) return 1;
  return active != 0;
}

int tdist__nccl_dev_enter(int dev, tdist__nccl_dev_t *g) {
  g->saved = dev;
  g->switched = 0;
  cudaError_t e = cudaGetDevice(&g->saved); /* creates no context */
  if (e != cudaSuccess) return tdist__cuda_err(e, "cudaGetDevice");
  if (g->saved == dev) return 0;
  e = cudaSetDevice(dev);
  if (e != cudaSuccess) return tdist__cuda_err(e, "cudaSetDevice");
  g->switched = 1;
  return 0;
}

void tdist__nccl_dev_leave(const tdist__nccl_dev_t *g) {
  if (!g->switched) return;
  /* A device with no context stays unset: setting it back would create the
   * very context this file exists to avoid. The thread then keeps the
   * group's device (PyTorch's MaybeSetDevice does the same). */
  if (has_context(g->saved)) cudaSetDevice(g->saved);
}

/* (thread-local) the device this tdist-owned thread last made current, +1
 * (0: none yet), and whether its capture mode is relaxed. */
static __thread int own_dev;
static __thread int own_relaxed;

int tdist__nccl_dev_own(int dev) {
  if (!own_relaxed) {
    /* The runtime forbids "unsafe" calls such as cudaEventQuery on any
     * thread while another thread captures in global mode, unless this
     * thread's mode is relaxed (CUDA Runtime API,
     * cudaThreadExchangeStreamCaptureMode). */
    enum cudaStreamCaptureMode m = cudaStreamCaptureModeRelaxed;
    cudaError_t e = cudaThreadExchangeStreamCaptureMode(&m);
    if (e != cudaSuccess) return tdist__cuda_err(e, "cudaThreadExchangeStreamCaptureMode");
    own_relaxed = 1;
  }
  if (own_dev == dev + 1) return 0;
  cudaError_t e = cudaSetDevice(dev);
  if (e != cudaSuccess) return tdist__cuda_err(e, "cudaSetDevice");
  own_dev = dev + 1;
  return 0;
}
