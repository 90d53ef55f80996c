/*
 * device.c - the simulated machine's devices: settings, CUDA_VISIBLE_DEVICES,
 * the calling thread's current device, primary contexts (counted), errors
 * (per-thread last error, per-device sticky errors), NCCL_DEBUG logging, and
 * the device calls of the CUDA runtime.
 *
 * Settings are read once, at the first call into the library (pthread_once);
 * afterwards everything here is atomics or thread-locals, so any thread may
 * call any function without a lock.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "gpusim/sim.h"
#include "gpusim/stream.h"

enum { LOG_NONE, LOG_WARN, LOG_INFO };

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static pthread_once_t g_log_once = PTHREAD_ONCE_INIT; /* apart: init_once logs */
static int g_ndev;                                    /* visible devices */
static int g_cc[GS_MAX_DEVICES];                      /* per visible device: major * 10 + minor */
static int g_log = LOG_NONE;
static char g_host[64];
static atomic_int g_ctx[GS_MAX_DEVICES];    /* primary context made: 0/1 */
static atomic_int g_sticky[GS_MAX_DEVICES]; /* cudaError_t, 0 = none */

static _Thread_local int tl_dev;                        /* current device, 0 until set */
static _Thread_local cudaError_t tl_last = cudaSuccess; /* cudaGetLastError */

/* "9.0" -> 90; -1 when malformed. */
static int parse_cc(const char *s, const char **end) {
  char *e;
  long major = strtol(s, &e, 10);
  if (e == s || *e != '.' || major < 1 || major > 99) return -1;
  const char *m = e + 1;
  long minor = strtol(m, &e, 10);
  if (e == m || minor < 0 || minor > 9) return -1;
  *end = e;
  return (int)(major * 10 + minor);
}

static void log_once(void) {
  const char *dbg = getenv("NCCL_DEBUG");
  if (dbg && strcasecmp(dbg, "INFO") == 0)
    g_log = LOG_INFO;
  else if (dbg && strcasecmp(dbg, "WARN") == 0)
    g_log = LOG_WARN;
  /* NCCL prints the host name up to its first dot (utils.cc getHostName). */
  if (gethostname(g_host, sizeof(g_host) - 1) != 0) snprintf(g_host, sizeof(g_host), "localhost");
  g_host[sizeof(g_host) - 1] = '\0';
  char *dot = strchr(g_host, '.');
  if (dot) *dot = '\0';
}

/* The runtime's teardown at exit. A real CUDA runtime (and the static one
 * inside libnccl) frees its state in an exit handler registered when it
 * first initialises; a call made after that, from a thread still running,
 * uses freed state: on the H200 an NCCL job thread's cudaSetDevice
 * (commDestroySync) died of SIGSEGV while the process exited. The
 * simulation registers its handler at its first call, as the runtime does,
 * and stops the process, loudly, at any call that needs a context after it
 * ran. An exit handler registered later (after the runtime was in use) runs
 * before it: that is where a library must finish its CUDA work. */
static atomic_int g_exited;

static void at_exit(void) { atomic_store(&g_exited, 1); }

void gs_check_exit(const char *what) {
  if (!atomic_load(&g_exited)) return;
  fprintf(stderr,
          "gpusim: %s after the CUDA runtime's teardown at exit (a real runtime reads freed "
          "state here: SIGSEGV); stopping the process\n",
          what);
  abort();
}

static void init_once(void) {
  atexit(at_exit);
  int nphys = 8;
  const char *nd = getenv("TDIST_GPUSIM_DEVICES");
  if (nd && *nd) {
    char *e;
    long v = strtol(nd, &e, 10);
    if (*e == '\0' && v >= 0 && v <= GS_MAX_DEVICES)
      nphys = (int)v;
    else
      gs_warn("TDIST_GPUSIM_DEVICES=%s is not 0..%d; using 8", nd, GS_MAX_DEVICES);
  }
  /* Compute capability per physical device; the last entry of the list
   * applies to the devices after it. */
  int cc[GS_MAX_DEVICES];
  for (int i = 0; i < GS_MAX_DEVICES; i++)
    cc[i] = 90;
  const char *ccs = getenv("TDIST_GPUSIM_CC");
  if (ccs && *ccs) {
    const char *p = ccs;
    int i = 0, last = 90;
    while (*p && i < GS_MAX_DEVICES) {
      const char *e;
      int v = parse_cc(p, &e);
      if (v < 0 || (*e != ',' && *e != '\0')) {
        gs_warn("TDIST_GPUSIM_CC=%s: '%s' is no compute capability; using 9.0", ccs, p);
        last = 90;
        i = 0;
        break;
      }
      cc[i++] = last = v;
      p = *e == ',' ? e + 1 : e;
    }
    for (; i < GS_MAX_DEVICES; i++)
      cc[i] = last;
  }
  /* CUDA_VISIBLE_DEVICES as CUDA reads it (CUDA C Programming Guide, CUDA
   * Environment Variables): a comma list of indices; the devices listed
   * before the first invalid entry (not an index, out of range, repeated)
   * are visible, renumbered 0..k-1 in list order; set but empty: none. */
  const char *vis = getenv("CUDA_VISIBLE_DEVICES");
  if (!vis) {
    g_ndev = nphys;
    for (int i = 0; i < nphys; i++)
      g_cc[i] = cc[i];
    return;
  }
  int seen[GS_MAX_DEVICES] = {0};
  const char *p = vis;
  g_ndev = 0;
  while (*p && g_ndev < GS_MAX_DEVICES) {
    while (*p == ' ')
      p++;
    char *e;
    errno = 0;
    long v = strtol(p, &e, 10);
    if (e == p || errno || v < 0 || v >= nphys || seen[v]) break;
    while (*e == ' ')
      e++;
    if (*e != ',' && *e != '\0') break;
    seen[v] = 1;
    g_cc[g_ndev++] = cc[v];
    p = *e == ',' ? e + 1 : e;
  }
}

static void init(void) { pthread_once(&g_once, init_once); }

/* NCCL's debug line: "host:pid:tid [cudaDev] NCCL WARN msg" (debug.cc). */
static void vlog(int level, const char *tag, const char *fmt, va_list ap) {
  pthread_once(&g_log_once, log_once);
  if (g_log < level) return;
  char msg[1024];
  vsnprintf(msg, sizeof(msg), fmt, ap);
  fprintf(stderr, "%s:%d:%d [%d] NCCL %s %s\n", g_host, (int)getpid(), (int)syscall(SYS_gettid),
          tl_dev, tag, msg);
}

void gs_warn(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vlog(LOG_WARN, "WARN", fmt, ap);
  va_end(ap);
}

void gs_info(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vlog(LOG_INFO, "INFO", fmt, ap);
  va_end(ap);
}

int gs_device_count(void) {
  init();
  return g_ndev;
}

int gs_device_cc(int dev) {
  init();
  return dev >= 0 && dev < g_ndev ? g_cc[dev] : -1;
}

int gs_current_device(void) { return tl_dev; }
void gs_set_current_device(int dev) { tl_dev = dev; }

/* The primary context is made on first use and lives until the process
 * exits (CUDA Runtime API, Primary Contexts / cudaSetDevice in CUDA 12). */
cudaError_t gs_context_use(int dev) {
  init();
  /* CUDA Runtime API, cudaLaunchHostFunc: "The host function must not make
   * any CUDA API calls. Attempting to use a CUDA API may result in
   * cudaErrorNotPermitted". Every call that needs a context comes here. */
  if (gs_in_host_fn()) return GS_ERR_NOT_PERMITTED;
  gs_check_exit("a CUDA call");
  if (g_ndev == 0) return cudaErrorNoDevice;
  if (dev < 0 || dev >= g_ndev) return cudaErrorInvalidDevice;
  if (atomic_exchange(&g_ctx[dev], 1) == 0) gs_info("primary context created on device %d", dev);
  return (cudaError_t)atomic_load(&g_sticky[dev]);
}

GS_API int tdist_gpusim_context_count(int device) {
  init();
  if (device < 0 || device >= g_ndev) return -1;
  return atomic_load(&g_ctx[device]);
}

/* CUDA Driver API, cuDevicePrimaryCtxGetState: whether the primary context
 * of a device is active, without creating it (CUresult 0 = CUDA_SUCCESS,
 * 101 = CUDA_ERROR_INVALID_DEVICE). The one driver call the simulation
 * exports: libraries ask it before making a device current (PyTorch's
 * c10::cuda::hasPrimaryContext). CUdevice is taken as the ordinal. */
GS_API int cuDevicePrimaryCtxGetState(int dev, unsigned int *flags, int *active) {
  init();
  if (dev < 0 || dev >= g_ndev) return 101;
  if (flags) *flags = 0;
  if (active) *active = atomic_load(&g_ctx[dev]) > 0;
  return 0;
}

/* CUDA Runtime API, Error Handling: a fault in a kernel leaves the context
 * unusable; the first such error sticks. */
void gs_set_sticky(int dev, cudaError_t e) {
  if (dev < 0 || dev >= GS_MAX_DEVICES || e == cudaSuccess) return;
  int none = 0;
  if (atomic_compare_exchange_strong(&g_sticky[dev], &none, (int)e))
    gs_warn("device %d: %s (sticky: every later call on this device returns it)", dev,
            cudaGetErrorString(e));
}

cudaError_t gs_sticky(int dev) {
  if (dev < 0 || dev >= GS_MAX_DEVICES) return cudaSuccess;
  return (cudaError_t)atomic_load(&g_sticky[dev]);
}

cudaError_t gs_err(cudaError_t e) {
  if (e != cudaSuccess) tl_last = e;
  return e;
}

/* The strings and names of driver_types.h / cudaGetErrorString (CUDA 12). */
static const struct {
  cudaError_t e;
  const char *name, *str;
} g_errs[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorInvalidDevicePointer, "cudaErrorInvalidDevicePointer", "invalid device pointer"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection",
     "invalid copy direction for memcpy"},
    {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver",
     "CUDA driver version is insufficient for CUDA runtime version"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorIllegalState, "cudaErrorIllegalState",
     "the operation cannot be performed in the present state"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress",
     "an illegal memory access was encountered"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
    {cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported",
     "operation not permitted when stream is capturing"},
    {cudaErrorStreamCaptureInvalidated, "cudaErrorStreamCaptureInvalidated",
     "operation failed due to a previous error during capture"},
    {cudaErrorStreamCaptureMerge, "cudaErrorStreamCaptureMerge",
     "operation would result in a merge of separate capture sequences"},
    {cudaErrorStreamCaptureUnmatched, "cudaErrorStreamCaptureUnmatched",
     "capture was not ended in the same stream as it began"},
    {cudaErrorStreamCaptureUnjoined, "cudaErrorStreamCaptureUnjoined",
     "capturing stream has unjoined work"},
    {cudaErrorStreamCaptureIsolation, "cudaErrorStreamCaptureIsolation",
     "dependency created on uncaptured work in another stream"},
    {cudaErrorStreamCaptureImplicit, "cudaErrorStreamCaptureImplicit",
     "operation would make the legacy stream depend on a capturing blocking stream"},
    {cudaErrorCapturedEvent, "cudaErrorCapturedEvent",
     "operation not permitted on an event last recorded in a capturing stream"},
    {cudaErrorStreamCaptureWrongThread, "cudaErrorStreamCaptureWrongThread",
     "attempt to terminate a thread-local capture sequence from another thread"},
    {GS_ERR_NOT_PERMITTED, "cudaErrorNotPermitted", "operation not permitted"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};

/* CUDA Runtime API, cudaGetErrorString / cudaGetErrorName: a value that is
 * no error code gives "unrecognized error code". */
GS_API const char *cudaGetErrorString(cudaError_t e) {
  for (size_t i = 0; i < sizeof(g_errs) / sizeof(g_errs[0]); i++)
    if (g_errs[i].e == e) return g_errs[i].str;
  return "unrecognized error code";
}

GS_API const char *cudaGetErrorName(cudaError_t e) {
  for (size_t i = 0; i < sizeof(g_errs) / sizeof(g_errs[0]); i++)
    if (g_errs[i].e == e) return g_errs[i].name;
  return "unrecognized error code";
}

/* CUDA Runtime API, cudaGetLastError: returns the last error and resets it
 * to cudaSuccess; a sticky error of the current device is returned again
 * and cannot be reset (Error Handling). */
GS_API cudaError_t cudaGetLastError(void) {
  cudaError_t e = tl_last;
  tl_last = cudaSuccess;
  cudaError_t st = gs_sticky(tl_dev);
  return st != cudaSuccess ? st : e;
}

/* CUDA Runtime API, cudaPeekAtLastError: as cudaGetLastError, no reset. */
GS_API cudaError_t cudaPeekAtLastError(void) {
  cudaError_t st = gs_sticky(tl_dev);
  return st != cudaSuccess ? st : tl_last;
}

/* CUDA Runtime API, cudaGetDeviceCount: no context is made; with no device
 * *count is 0 and cudaErrorNoDevice is returned. */
GS_API cudaError_t cudaGetDeviceCount(int *count) {
  if (!count) return gs_err(cudaErrorInvalidValue);
  *count = gs_device_count();
  return gs_err(*count == 0 ? cudaErrorNoDevice : cudaSuccess);
}

/* CUDA Runtime API, cudaSetDevice: since CUDA 12.0 it initialises the
 * device's primary context at once. */
GS_API cudaError_t cudaSetDevice(int device) {
  int n = gs_device_count();
  if (n == 0) return gs_err(cudaErrorNoDevice);
  if (device < 0 || device >= n) return gs_err(cudaErrorInvalidDevice);
  tl_dev = device;
  return gs_err(gs_context_use(device));
}

/* CUDA Runtime API, cudaGetDevice: no context is made. */
GS_API cudaError_t cudaGetDevice(int *device) {
  if (!device) return gs_err(cudaErrorInvalidValue);
  if (gs_device_count() == 0) return gs_err(cudaErrorNoDevice);
  *device = tl_dev;
  return cudaSuccess;
}

/* CUDA Runtime API, cudaDeviceGetAttribute (answered from the device
 * properties, no context). An H100 SXM has 132 SMs. */
GS_API cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device) {
  int n = gs_device_count();
  if (!value) return gs_err(cudaErrorInvalidValue);
  if (n == 0) return gs_err(cudaErrorNoDevice);
  if (device < 0 || device >= n) return gs_err(cudaErrorInvalidDevice);
  switch (attr) {
  case cudaDevAttrComputeCapabilityMajor: *value = g_cc[device] / 10; break;
  case cudaDevAttrComputeCapabilityMinor: *value = g_cc[device] % 10; break;
  case cudaDevAttrMultiProcessorCount: *value = 132; break;
  default: return gs_err(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}

/* CUDA Runtime API, cudaDeviceSynchronize: waits for every stream of the
 * current device; a potentially unsafe call during capture
 * (cudaThreadExchangeStreamCaptureMode). */
GS_API cudaError_t cudaDeviceSynchronize(void) {
  cudaError_t e = gs_context_current();
  if (e != cudaSuccess) return gs_err(e);
  if ((e = gs_capture_unsafe()) != cudaSuccess) return gs_err(e);
  int dev = tl_dev;
  gs_device_drain(dev);
  return gs_err(gs_sticky(dev));
}

/* CUDA Runtime API, cudaDriverGetVersion / cudaRuntimeGetVersion. */
GS_API cudaError_t cudaDriverGetVersion(int *version) {
  if (!version) return gs_err(cudaErrorInvalidValue);
  *version = GS_CUDA_VERSION;
  return cudaSuccess;
}

GS_API cudaError_t cudaRuntimeGetVersion(int *version) {
  if (!version) return gs_err(cudaErrorInvalidValue);
  *version = GS_CUDA_VERSION;
  return cudaSuccess;
}
