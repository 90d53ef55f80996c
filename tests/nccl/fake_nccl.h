/*
 * fake_nccl.h - a scripted stand-in for NCCL and the CUDA runtime: the shared
 * library libfake_nccl.so (see CMakeLists.txt), which exports the real
 * NCCL/CUDA names (ncclAllReduce, cudaEventRecord, ...).
 *
 * The tests point TDIST_NCCL_LIBRARY and TDIST_CUDART_LIBRARY at it, so the
 * backend opens it through its real loading code (src/nccl/nccl_lib.c). The
 * test programs are linked against the same library for the scripting API
 * below: dlopen of an already loaded library returns that instance, so the
 * backend's calls and the test's queries see one state. Its calls never touch
 * a GPU. They:
 *   - record every call in a log (name, comm, stream, event, two integers),
 *     so a test can check what was called, with what, and in which order;
 *   - follow a script (fake_script_t) that says how long a communicator stays
 *     ncclInProgress after init, split, finalize or an enqueue, when an
 *     asynchronous error appears, and whether end events ever complete;
 *   - check the backend's rules: no NCCL call on a communicator after it was
 *     aborted or destroyed, never two threads inside calls on the same
 *     communicator at once, and no call that may block (init, split,
 *     shrink, finalize, destroy, abort) on the library's progress thread
 *     (fake_violations() counts breaches).
 * Built with -DFAKE_NCCL_OLD (libfake_nccl_old.so) it is NCCL 2.27.0 without
 * the 2.28 calls (ncclCommRevoke, ncclAlltoAll, ncclGather, ncclScatter).
 *
 * All objects (communicators, streams, events) live in static arrays, so the
 * fake itself allocates nothing. Any thread may call anything here; one mutex
 * guards the state. Per process: forked children each have their own copy.
 */
#ifndef TDIST_TEST_FAKE_NCCL_H
#define TDIST_TEST_FAKE_NCCL_H

#include <stddef.h>
#include <stdint.h>

#include "nccl/nccl_api.h" /* the backend's own declarations of the types */

typedef enum { FAKE_EV_AUTO = 0, FAKE_EV_MANUAL } fake_ev_mode_t;

typedef struct fake_script {
  /* ncclCommGetAsyncError answers ncclInProgress this many times after each
   * of these (-1 = forever). */
  int init_busy, split_busy, finalize_busy, enqueue_busy;
  /* Enqueue calls (collectives, send/recv, ncclGroupEnd) return
   * ncclInProgress instead of ncclSuccess. */
  int enqueue_returns_inprogress;
  /* AUTO: an event completes as soon as it was recorded. MANUAL: only
   * fake_complete_events() completes events. */
  fake_ev_mode_t ev_mode;
  /* Sleep inside every comm call (µs), to widen race windows (threads). */
  int slow_us;
} fake_script_t;

/* Reset log, counters, objects and script (all zero: no InProgress, events
 * complete at once). */
/* A stream handle cudaStreamIsCapturing reports as capturing. The fake has
 * none of the capture calls (cudaStreamGetCaptureInfo, user objects). */
#define FAKE_CAPTURING_STREAM ((cudaStream_t)(uintptr_t)0xca97)

void fake_reset(void);
void fake_set_script(const fake_script_t *s);

/* From now on ncclCommGetAsyncError reports `err` on every live communicator,
 * and ncclGetLastError returns `text`. */
void fake_set_async_error(ncclResult_t err, const char *text);

/* Complete the `n` oldest pending events recorded on a stream the backend
 * created (its end events; n < 0: all of them). Events recorded on callers'
 * streams (start events) are never queried and are left alone. */
void fake_complete_events(int n);

/* cudaGetDeviceCount answers `err` (cudaSuccess: `n` devices; 1 after
 * fake_reset). */
void fake_set_devices(int n, cudaError_t err);

/* cudaPointerGetAttributes calls [p, p + len) plain host memory
 * (cudaMemoryTypeUnregistered); every other pointer is device memory. One
 * range at a time; len 0 clears it. */
void fake_mark_host(const void *p, size_t len);

/* One logged call. */
typedef struct fake_call {
  char name[40];
  void *comm, *stream, *event;
  long a, b; /* call-specific: count/color/datatype/op ... see fake_nccl.c */
  double scalar;
} fake_call_t;

int fake_log_size(void);
/* Copy of entry i (0 = first call). */
fake_call_t fake_log_get(int i);
/* Number of calls named `name`. */
int fake_count(const char *name);
/* Index of the first call named `name` at or after `from`, or -1. */
int fake_find(const char *name, int from);
/* Breaches of the rules above (calls on dead comms, concurrent calls,
 * blocking calls on the progress thread). */
int fake_violations(void);
/* The unique id the fake communicator of this process was initialised with
 * matched the one ncclGetUniqueId produced on rank 0 (1), or not (0). */
int fake_last_init_id_ok(void);

#endif
