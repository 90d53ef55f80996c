/*
 * tdist/gpusim.h - inspection calls of the simulated device,
 * libtdist_gpusim.so (docs/gpusim.md).
 *
 * libtdist_gpusim.so exports the CUDA runtime and NCCL calls the NCCL
 * backend loads, and behaves as CUDA and NCCL do wherever a caller can
 * observe it: devices, contexts, device memory, streams that run their work
 * in order on worker threads, events, stream capture, and communicators
 * whose collectives move real data between processes through shared memory.
 * Point the backend at it:
 *
 *   TDIST_NCCL_LIBRARY=<libdir>/libtdist_gpusim.so \
 *   TDIST_CUDART_LIBRARY=<libdir>/libtdist_gpusim.so tdistrun -n 4 ./train
 *
 * The calls below exist only in the simulation: they let a test see what a
 * real GPU shows only through nvidia-smi or a profiler. Link the test with
 * libtdist_gpusim.so (dlopen of the same file then returns this instance).
 * Every call is thread-safe and cheap; none creates a CUDA context except
 * tdist_gpusim_launch_kernel, which uses the current device's as a kernel
 * launch does.
 *
 * Settings (read once per process: the first three at the first CUDA call,
 * NCCL_DEBUG at the first log line, NCCL_HOSTID at the first communicator
 * init):
 *   TDIST_GPUSIM_DEVICES   devices in the machine (default 8)
 *   TDIST_GPUSIM_CC        compute capability of each device, "9.0" or a
 *                          comma list per device ("8.0,9.0"; default 9.0)
 *   CUDA_VISIBLE_DEVICES   as CUDA: which of them this process sees, renumbered
 *   NCCL_DEBUG             WARN or INFO: NCCL-style lines on stderr
 *   NCCL_HOSTID            as NCCL's host hash: ranks with different values
 *                          are different hosts (a dead peer is reported
 *                          only across hosts); unset: one host
 */
#ifndef TDIST_GPUSIM_H
#define TDIST_GPUSIM_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Contexts created on visible device `device` in this process: 0 or 1 (the
 * primary context, made by the first CUDA call that needs one on a thread
 * whose current device it is). -1 for a device that does not exist. A test
 * checks with it that a thread which never called cudaSetDevice did not make
 * a stray context on device 0 (about 0.5 GiB of GPU memory on an H100). */
int tdist_gpusim_context_count(int device);

/* Communicators of this process that are initialised (or initialising) and
 * not yet destroyed or aborted (ncclCommDestroy, ncclCommAbort). A test
 * checks with it when a communicator's end came. */
int tdist_gpusim_live_comms(void);

/* Calls that entered a communicator while another thread was inside a call
 * on the same communicator (NCCL forbids it). Counted: the collectives,
 * send/recv, split, shrink, revoke, finalize, destroy, the PreMulSum calls
 * and ncclCommGetAsyncError (it writes the communicator: it completes the
 * linked group job, init.cc). Exempt: ncclCommAbort and ncclGetLastError,
 * and the read-only queries
 * (ncclCommCount, ncclCommCuDevice, ncclCommUserRank). Process-wide. */
long tdist_gpusim_comm_violations(void);

/* Disagreements this process's ranks saw: a collective whose ranks passed
 * different arguments (operation, count, type, reduction, root), or a
 * receive whose size differs from its matching send. NCCL does not check
 * these; the simulation counts them (each rank that sees one) and goes on
 * as NCCL would, with wrong data. */
long tdist_gpusim_mismatches(void);

/* Uses after free NCCL 2.28 would make and the simulation detected instead
 * (each with an NCCL WARN): ncclCommRevoke while a non-blocking enqueue's
 * group job is linked to the communicator frees that job but leaves
 * comm->groupJob pointing at it (group.cc ncclGroupJobAbort); a later
 * ncclCommGetAsyncError (or any call that runs it: the enqueues, shrink,
 * split, finalize, destroy) that reads ncclSuccess then completes the freed
 * job (init.cc). Process-wide. */
long tdist_gpusim_use_after_free(void);

/* Simulation only: launch a "user kernel" on `stream` (a cudaStream_t;
 * NULL, cudaStreamLegacy, cudaStreamPerThread as CUDA resolves them):
 * fn(arg) runs on the stream's own worker when the stream reaches it, after
 * all earlier work, and later work waits for it -- as a kernel occupies its
 * stream. A spinning fn stands for a long or stuck kernel. Unlike a host
 * function (cudaLaunchHostFunc: all streams' host functions run on one
 * thread per process, one at a time), a user kernel delays only its own
 * stream. fn reads and writes device memory through tdist_gpusim_host_view
 * and must not call CUDA. Under stream capture it becomes a kernel node
 * (each graph launch runs fn(arg) again). Returns a cudaError_t: 0
 * (cudaSuccess), or the error cudaLaunchKernel would give (a bad stream
 * handle: 400, cudaErrorInvalidResourceHandle). */
int tdist_gpusim_launch_kernel(void *stream, void (*fn)(void *), void *arg);

/* The host-accessible view of device memory at `dev_ptr` (NULL if it is
 * not live device memory). Device memory itself is not mapped for the host,
 * as on a GPU: a host access to it faults. User kernels
 * (tdist_gpusim_launch_kernel) use this view. */
void *tdist_gpusim_host_view(const void *dev_ptr);

/* The configuration a live communicator of this process named `name` (its
 * ncclConfig_t.commName: tdist passes the group's name) holds after NCCL's
 * parseCommConfig -- defaults filled in (cgaClusterSize 4, minCTAs 1,
 * maxCTAs 64, splitShare 0, trafficClass NCCL_CONFIG_UNDEF_INT, netName
 * "") -- and the priority of the stream its last kernel was launched on
 * (cudaStreamCreateWithPriority's; 0 for a default stream). Any out
 * pointer may be NULL. Returns 0, or -1 when no communicator has that
 * name. Lets a test see that a tdist option reached NCCL. */
int tdist_gpusim_comm_config(const char *name, int *min_ctas, int *max_ctas, int *cga_cluster_size,
                             int *split_share, int *traffic_class, char *net_name,
                             size_t net_name_len, int *stream_priority);

/* The number of unique ids (bootstrap roots) the init of the live
 * communicator named `name` was given: ncclCommInitRankScalable's nId, 1
 * for ncclCommInitRankConfig, 0 for a split or shrink child; -1 when no
 * communicator has that name. */
int tdist_gpusim_comm_roots(const char *name);

/* Live buffer registrations (windows = 0: ncclCommRegister; 1: symmetric
 * windows, ncclCommWindowRegister) of the communicators of this process
 * named `name`, a range registered twice counted twice (NCCL's reference
 * count). -1 when no communicator has that name. */
long tdist_gpusim_registrations(const char *name, int windows);

#ifdef __cplusplus
}
#endif

#endif
