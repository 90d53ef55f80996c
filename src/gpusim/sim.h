/*
 * sim.h - internals of the simulated device (libtdist_gpusim.so), shared by
 * its files. Nothing here is exported: the library is built with hidden
 * visibility and GS_API marks the CUDA, NCCL and tdist_gpusim_ names.
 *
 * Files and what they model (each behaviour's comment names the CUDA page or
 * the NCCL source file it follows):
 *   device.c   settings, devices, CUDA_VISIBLE_DEVICES, per-thread current
 *              device, primary contexts (counted), errors (last and sticky),
 *              logging (NCCL_DEBUG)
 *   memory.c   cudaMalloc/Free(+Async)/MallocHost, memory tagged with its
 *              device and not mapped for the host (a host view for kernels),
 *              freed blocks poisoned, cudaPointerGetAttributes, memcpy/memset
 *   stream.c   streams as worker threads running their queue in order,
 *              host functions, the legacy default stream (stream.h)
 *   event.c    events
 *   capture.c  stream capture (global/thread-local/relaxed modes), graphs,
 *              graph launch
 *   reduce.c   NCCL's data types and device reductions (fp8 included)
 *   shm.c      shared segments between processes, futex waits, liveness
 *   comm.c     communicators: init, revoke, finalize, destroy, abort, async
 *              errors, jobs (non-blocking mode)
 *   split.c    ncclCommSplit, ncclCommShrink
 *   enqueue.c  groups, argument checks, PreMulSum, launching the kernels
 *   kernel.c   the simulated NCCL kernels: collectives and send/recv
 *
 * Threads: caller threads call the API; each stream has a worker thread
 * that runs its work; each non-blocking NCCL operation runs on a job thread
 * (as NCCL's ncclAsyncJob threads).
 */
#ifndef TDIST_GPUSIM_SIM_H
#define TDIST_GPUSIM_SIM_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "gpusim/api.h"
#include "tdist/gpusim.h"

#define GS_API __attribute__((visibility("default")))

/* The NCCL release the simulation follows (ncclGetVersion: 2.28.9). */
#define GS_NCCL_VERSION 22809
#define GS_CUDA_VERSION 12080 /* cudaRuntimeGetVersion/cudaDriverGetVersion */
#define GS_MAX_DEVICES 16

/* ---- device.c ------------------------------------------------------------------------ */

/* Logging as NCCL_DEBUG does ("host:pid:tid [dev] NCCL WARN ..." on stderr).
 * gs_warn prints at WARN and INFO, gs_info at INFO only. Any thread. */
void gs_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void gs_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Visible devices (after CUDA_VISIBLE_DEVICES), and one's compute
 * capability as major * 10 + minor (90 for 9.0). Any thread. */
int gs_device_count(void);
int gs_device_cc(int dev);

/* The calling thread's current device (0 until cudaSetDevice), without
 * creating a context. */
int gs_current_device(void);
/* Set the calling thread's current device without the API's checks or
 * context creation (NCCL's internal cudaSetDevice/restore pairs). */
void gs_set_current_device(int dev);

/* The primary context of `dev` is in use: created (and counted) on first
 * use. Returns the device's sticky error, or cudaSuccess. Any thread. */
cudaError_t gs_context_use(int dev);
/* Stops the process (abort, with a message naming `what`) when called after
 * the runtime's exit handler ran (device.c). Any thread. */
void gs_check_exit(const char *what);
/* The current device's context, for API calls that need one (CUDA creates
 * it lazily on the thread's current device, 0 if never set). */
static inline cudaError_t gs_context_current(void) { return gs_context_use(gs_current_device()); }

/* Sticky errors (a fault in a kernel): once set, every call that uses the
 * device's context returns it, as CUDA's do until the process exits. */
void gs_set_sticky(int dev, cudaError_t e);
cudaError_t gs_sticky(int dev);

/* cudaErrorNotPermitted (driver_types.h, 800): what a CUDA call made from
 * a host function or a user object's destructor returns. */
#define GS_ERR_NOT_PERMITTED cudaErrorNotPermitted
/* 1 on the process's host-function thread while a host function runs
 * (stream.c). */
int gs_in_host_fn(void);

/* Record `e` as the calling thread's last error (cudaGetLastError) when it
 * is not cudaSuccess; returns e. Every API call returns through it. */
cudaError_t gs_err(cudaError_t e);

/* ---- memory.c ------------------------------------------------------------------------ */

/* The host view of device memory [p, p + len) that a kernel running on
 * device `dev` reads or writes, or NULL when the range is not inside one
 * live allocation of `dev` (a GPU would fault: cudaErrorIllegalAddress).
 * len 0 with any p gives a non-NULL pointer that must not be dereferenced. */
void *gs_dev_access(int dev, const void *p, size_t len);
/* The device of the live allocation containing p, or -1 (host memory). */
int gs_ptr_device(const void *p);
/* stream.c: the priority of stream s (cudaStreamCreateWithPriority's; 0
 * for the special handles and unknown ones). Any thread, gs_lock not held. */
int gs_stream_priority(cudaStream_t s);
/* The device allocation holding p (cuMemGetAddressRange): its base, size,
 * device and whether ncclMemAlloc made it (cuMem); 0, or -1 when p is no
 * device memory. Any thread. */
int gs_dev_alloc_range(const void *p, uintptr_t *base, size_t *size, int *dev, int *cumem);

/* ---- stream.c / capture.c ------------------------------------------------------------- */

/* A kernel: work a stream runs in its turn (the NCCL kernels of kernel.c).
 * Reference counted by its owner; the stream calls:
 *   instance(proto)  at launch time on the launching thread (eager launch,
 *                    or each cudaGraphLaunch of a graph holding proto):
 *                    returns a reference to the kernel to run (proto itself
 *                    with its count raised, or a fresh copy), NULL when it
 *                    cannot (the launch then fails with
 *                    cudaErrorLaunchFailure);
 *   run(k)           on the stream's worker thread, when every earlier item
 *                    of the stream is done. May block (a collective waits
 *                    for its peers). Returns cudaSuccess, or a sticky error
 *                    (cudaErrorIllegalAddress) that the stream records on
 *                    the device;
 *   release(k)       after run, or when a graph holding it is destroyed. */
typedef struct gs_kernel gs_kernel_t;
struct gs_kernel {
  gs_kernel_t *(*instance)(gs_kernel_t *proto);
  cudaError_t (*run)(gs_kernel_t *k);
  void (*release)(gs_kernel_t *k);
  int device;       /* the device whose streams may run it */
  const char *name; /* for logs: "ncclAllReduce" ... */
};

/* Caller thread: launch kernel `k` on user stream `s` (NULL, cudaStreamLegacy
 * and cudaStreamPerThread resolved as CUDA does). Takes over one reference
 * to k in every case. When s is capturing, k is added to the capture's
 * graph and *captured is set to 1; otherwise k->instance(k) is queued and
 * *captured is 0. Errors: cudaErrorInvalidResourceHandle (bad stream, or a
 * stream of another device than k->device), the device's sticky error, or
 * the capture errors of capture.c. */
cudaError_t gs_launch(cudaStream_t s, gs_kernel_t *k, int *captured);

/* Make stream `waiter` wait for everything enqueued on `signaler` so far
 * (an internal event; NCCL's strong-stream joins). Either may be capturing,
 * with CUDA's rules for a wait across a capture. */
cudaError_t gs_stream_join(cudaStream_t waiter, cudaStream_t signaler);

/* ---- reduce.c ------------------------------------------------------------------------- */

/* Bytes per element of an NCCL type; 0 for a value that is no NCCL type. */
size_t gs_dtype_size(ncclDataType_t dt);

/* The device-side reduction NCCL derives from a reduction and type
 * (enqueue.cc hostToDevRedOp, device/reduce_kernel.h). */
typedef enum {
  GS_RED_SUM,
  GS_RED_PROD,
  GS_RED_MIN,
  GS_RED_MAX,
  GS_RED_PREMULSUM, /* each input times `scalar`, then summed (PreMulSum, float ncclAvg) */
  GS_RED_SUMPOSTDIV /* summed, then divided by `scalar` (integer ncclAvg) */
} gs_redkind_t;

typedef struct gs_redop {
  gs_redkind_t kind;
  ncclDataType_t dt;
  uint64_t scalar; /* PREMULSUM: the factor, in dt's own bits; SUMPOSTDIV: the divisor */
} gs_redop_t;

/* A built-in reduction (ncclSum .. ncclAvg) on `dt` among `nranks` ranks:
 * ncclSuccess, or ncclInvalidArgument for what NCCL refuses. */
ncclResult_t gs_redop_builtin(gs_redop_t *out, ncclRedOp_t op, ncclDataType_t dt, int nranks);
/* PreMulSum by the value at `scalar` (of type dt, host memory). */
void gs_redop_premul(gs_redop_t *out, ncclDataType_t dt, const void *scalar);

/* Elementwise, `count` elements of op->dt, in place in acc:
 *   gs_reduce_first(op, acc, in)  acc = in'       (in' = in times the factor
 *                                                  for PREMULSUM, else in)
 *   gs_reduce_next(op, acc, in)   acc = acc (op) in'
 *   gs_reduce_last(op, acc)       SUMPOSTDIV: acc /= divisor; else nothing
 * acc and in may not overlap unless equal in gs_reduce_first. Rounding is
 * NCCL's: every step rounds to dt, as a ring's hop does. */
void gs_reduce_first(const gs_redop_t *op, void *acc, const void *in, size_t count);
void gs_reduce_next(const gs_redop_t *op, void *acc, const void *in, size_t count);
void gs_reduce_last(const gs_redop_t *op, void *acc, size_t count);

/* ---- comm.c / enqueue.c / kernel.c (NCCL) -------------------------------------------- */

/* Counters behind tdist/gpusim.h. */
extern atomic_long gs_comm_violations;
extern atomic_long gs_mismatches;

#endif
