/*
 * test_gpusim_cuda.c - conformance: the CUDA-runtime half of the simulated
 * device (src/gpusim/device.c, memory.c, stream.c, event.c, capture.c)
 * behaves as the CUDA 12 runtime does. Each check names the page of the
 * CUDA Runtime API reference or of the CUDA Programming Guide it follows.
 *
 * Checks that need fresh process state (settings read once, context
 * counts, sticky errors that poison the process) run in a child: the test
 * re-executes itself (`--child NAME`) with the environment it needs.
 * Internal calls of sim.h (gs_dev_access, gs_launch) are hidden in the
 * library; they are looked up with dlsym and their checks skipped when the
 * library hides them.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "gpusim/api.h"
#include "gpusim/sim.h"
#include "tdist/gpusim.h"

extern char **environ;

/* In a child: print the failed check and exit non-zero. */
#define CK(cond)                                                                     \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      fprintf(stderr, "child %s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      return 1;                                                                      \
    }                                                                                \
  } while (0)

/* ---- helpers ------------------------------------------------------------------------ */

/* A user kernel (tdist_gpusim_launch_kernel) that holds its stream until the
 * test opens it (a host function would hold every stream's host functions:
 * they share one thread). stream_order also runs it as a host function. */
typedef struct {
  pthread_mutex_t m;
  pthread_cond_t c;
  int open, entered;
} gate_t;

static void gate_init(gate_t *g) {
  pthread_mutex_init(&g->m, NULL);
  pthread_cond_init(&g->c, NULL);
  g->open = g->entered = 0;
}

static void gate_fn(void *p) {
  gate_t *g = p;
  pthread_mutex_lock(&g->m);
  g->entered = 1;
  pthread_cond_broadcast(&g->c);
  while (!g->open)
    pthread_cond_wait(&g->c, &g->m);
  pthread_mutex_unlock(&g->m);
}

static void gate_wait_entered(gate_t *g) {
  pthread_mutex_lock(&g->m);
  while (!g->entered)
    pthread_cond_wait(&g->c, &g->m);
  pthread_mutex_unlock(&g->m);
}

static void gate_open(gate_t *g) {
  pthread_mutex_lock(&g->m);
  g->open = 1;
  pthread_cond_broadcast(&g->c);
  pthread_mutex_unlock(&g->m);
}

/* Host functions that log their id in run order. */
static atomic_int g_log[64];
static atomic_int g_nlog;
static void log_fn(void *p) {
  int i = atomic_fetch_add(&g_nlog, 1);
  if (i < 64) atomic_store(&g_log[i], (int)(intptr_t)p);
}
static void sleep_log_fn(void *p) {
  usleep(3000);
  log_fn(p);
}
static void log_reset(void) { atomic_store(&g_nlog, 0); }

static void flag_fn(void *p) { atomic_store((atomic_int *)p, 1); }

/* Re-run this program as `--child name` with `env` added to a copy of the
 * environment without the simulation's settings; the child's exit code. */
static int run_child(const char *name, const char *const *env) {
  const char *drop[] = {"TDIST_GPUSIM_DEVICES=", "TDIST_GPUSIM_CC=", "CUDA_VISIBLE_DEVICES="};
  size_t n = 0;
  while (environ[n])
    n++;
  const char **envp = calloc(n + 8, sizeof(*envp));
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    int keep = 1;
    for (size_t d = 0; d < 3; d++)
      keep &= strncmp(environ[i], drop[d], strlen(drop[d])) != 0;
    if (keep) envp[k++] = environ[i];
  }
  for (size_t i = 0; env && env[i] && i < 6; i++)
    envp[k++] = env[i];
  char *argv[] = {(char *)"test_gpusim_cuda", (char *)"--child", (char *)name, NULL};
  pid_t pid = fork();
  if (pid == 0) {
    execve("/proc/self/exe", argv, (char **)envp);
    _exit(127);
  }
  free(envp);
  int st = 0;
  if (pid < 0 || waitpid(pid, &st, 0) != pid) return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Internal calls (sim.h), when the library exports them. */
typedef void *(*dev_access_fn)(int, const void *, size_t);
typedef cudaError_t (*launch_fn)(cudaStream_t, gs_kernel_t *, int *);

/* A kernel whose run returns `rc`, counting instances and references. */
typedef struct {
  gs_kernel_t k;
  atomic_int refs, instances, runs;
  cudaError_t rc;
} tkernel_t;
static gs_kernel_t *tk_instance(gs_kernel_t *k) {
  tkernel_t *t = (tkernel_t *)k;
  atomic_fetch_add(&t->refs, 1);
  atomic_fetch_add(&t->instances, 1);
  return k;
}
static cudaError_t tk_run(gs_kernel_t *k) {
  tkernel_t *t = (tkernel_t *)k;
  atomic_fetch_add(&t->runs, 1);
  return t->rc;
}
static void tk_release(gs_kernel_t *k) { atomic_fetch_sub(&((tkernel_t *)k)->refs, 1); }
/* The worker releases a kernel just after counting it done: wait (up to
 * 5 s) for the references to drop to 0. */
static int tk_released(tkernel_t *t) {
  for (int i = 0; i < 5000 && atomic_load(&t->refs) != 0; i++)
    usleep(1000);
  return atomic_load(&t->refs) == 0;
}
static void tk_init(tkernel_t *t, int dev, cudaError_t rc) {
  memset(t, 0, sizeof(*t));
  t->k.instance = tk_instance;
  t->k.run = tk_run;
  t->k.release = tk_release;
  t->k.device = dev;
  t->k.name = "testKernel";
  t->rc = rc;
  atomic_store(&t->refs, 1); /* the reference gs_launch takes over */
}

/* ---- children ----------------------------------------------------------------------- */

/* Defaults: 8 devices of compute capability 9.0, 132 SMs (CUDA Runtime
 * API, cudaGetDeviceCount / cudaDeviceGetAttribute); no context yet. */
static int child_defaults(void) {
  int n = -1, v = -1;
  CK(cudaGetDeviceCount(&n) == cudaSuccess && n == 8);
  CK(cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMajor, 7) == cudaSuccess && v == 9);
  CK(cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMinor, 7) == cudaSuccess && v == 0);
  CK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, 0) == cudaSuccess && v == 132);
  CK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, 8) == cudaErrorInvalidDevice);
  CK(cudaRuntimeGetVersion(&v) == cudaSuccess && v == GS_CUDA_VERSION);
  CK(cudaDriverGetVersion(&v) == cudaSuccess && v == GS_CUDA_VERSION);
  for (int d = 0; d < 8; d++)
    CK(tdist_gpusim_context_count(d) == 0);
  CK(tdist_gpusim_context_count(8) == -1);
  return 0;
}

/* CUDA Programming Guide, CUDA Environment Variables: CUDA_VISIBLE_DEVICES
 * lists indices; the first invalid one ends the list; renumbered in list
 * order. Run with 4 devices, TDIST_GPUSIM_CC=8.0,8.6,9.0 (the last repeats)
 * and CUDA_VISIBLE_DEVICES=3,1,7,0: devices 3 and 1 are visible. */
static int child_visible(void) {
  int n = -1, v = -1;
  CK(cudaGetDeviceCount(&n) == cudaSuccess && n == 2);
  CK(cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMajor, 0) == cudaSuccess && v == 9);
  CK(cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMajor, 1) == cudaSuccess && v == 8);
  CK(cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMinor, 1) == cudaSuccess && v == 6);
  /* CUDA Runtime API, cudaSetDevice: cudaErrorInvalidDevice past the count. */
  CK(cudaSetDevice(2) == cudaErrorInvalidDevice);
  CK(cudaSetDevice(1) == cudaSuccess);
  CK(cudaGetDevice(&v) == cudaSuccess && v == 1);
  return 0;
}

/* CUDA_VISIBLE_DEVICES="" hides every device: cudaGetDeviceCount gives 0
 * and cudaErrorNoDevice (CUDA Runtime API, cudaGetDeviceCount). */
static int child_novis(void) {
  int n = -1;
  void *p;
  CK(cudaGetDeviceCount(&n) == cudaErrorNoDevice && n == 0);
  CK(cudaMalloc(&p, 16) == cudaErrorNoDevice);
  CK(tdist_gpusim_context_count(0) == -1);
  return 0;
}

static cudaEvent_t g_ev1;
static void *stray_query(void *p) {
  (void)p;
  return (void *)(intptr_t)cudaEventQuery(g_ev1);
}

/* CUDA Runtime API, Primary Contexts (cudaSetDevice, "Initialization"):
 * calls that need no context make none; the first one that does makes the
 * primary context of the thread's current device, 0 if never set. */
static int child_contexts(void) {
  int n, v;
  CK(cudaGetDeviceCount(&n) == cudaSuccess);
  CK(cudaGetDevice(&v) == cudaSuccess && v == 0);
  CK(cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMajor, 3) == cudaSuccess);
  CK(cudaGetLastError() == cudaSuccess && cudaPeekAtLastError() == cudaSuccess);
  CK(strcmp(cudaGetErrorString(cudaSuccess), "no error") == 0);
  enum cudaStreamCaptureMode m = cudaStreamCaptureModeGlobal;
  CK(cudaThreadExchangeStreamCaptureMode(&m) == cudaSuccess);
  for (int d = 0; d < 8; d++)
    CK(tdist_gpusim_context_count(d) == 0);
  /* cudaPointerGetAttributes needs a context: device 0's. */
  struct cudaPointerAttributes a;
  CK(cudaPointerGetAttributes(&a, &v) == cudaSuccess);
  CK(tdist_gpusim_context_count(0) == 1);
  for (int d = 1; d < 8; d++)
    CK(tdist_gpusim_context_count(d) == 0);
  return 0;
}

/* cudaSetDevice(1) first: work on device 1 (its workers included) makes no
 * context on device 0; a thread that never set a device and queries a
 * device-1 event makes device 0's (the runtime initialises the current
 * device's primary context: CUDA Runtime API, cudaEventQuery, note_init_rt). */
static int child_contexts1(void) {
  atomic_int flag = 0;
  cudaStream_t s;
  CK(cudaSetDevice(1) == cudaSuccess);
  CK(cudaStreamCreate(&s) == cudaSuccess);
  CK(cudaEventCreate(&g_ev1) == cudaSuccess);
  CK(cudaLaunchHostFunc(s, flag_fn, &flag) == cudaSuccess);
  CK(cudaEventRecord(g_ev1, s) == cudaSuccess);
  CK(cudaStreamSynchronize(s) == cudaSuccess && atomic_load(&flag) == 1);
  CK(cudaEventQuery(g_ev1) == cudaSuccess);
  CK(tdist_gpusim_context_count(1) == 1);
  for (int d = 0; d < 8; d++)
    if (d != 1) CK(tdist_gpusim_context_count(d) == 0);
  pthread_t t;
  void *rc;
  CK(pthread_create(&t, NULL, stray_query, NULL) == 0 && pthread_join(t, &rc) == 0);
  CK((cudaError_t)(intptr_t)rc == cudaSuccess);
  CK(tdist_gpusim_context_count(0) == 1);
  return 0;
}

/* CUDA Runtime API, Error Handling: a kernel fault (cudaErrorIllegalAddress)
 * is sticky: every later call on the device's context returns it, and
 * cudaGetLastError cannot reset it. Another device is unaffected. */
static int check_sticky_after(cudaStream_t s) {
  void *p;
  cudaEvent_t ev;
  CK(cudaStreamSynchronize(s) == cudaErrorIllegalAddress);
  CK(cudaMalloc(&p, 16) == cudaErrorIllegalAddress);
  CK(cudaEventCreate(&ev) == cudaErrorIllegalAddress);
  CK(cudaDeviceSynchronize() == cudaErrorIllegalAddress);
  CK(cudaGetLastError() == cudaErrorIllegalAddress);
  CK(cudaGetLastError() == cudaErrorIllegalAddress);
  CK(cudaPeekAtLastError() == cudaErrorIllegalAddress);
  CK(cudaSetDevice(1) == cudaSuccess);
  CK(cudaMalloc(&p, 16) == cudaSuccess && cudaFree(p) == cudaSuccess);
  CK(cudaGetLastError() == cudaSuccess);
  return 0;
}

/* gs_launch of a kernel whose run faults (sim.h: the stream records the
 * error as the device's sticky error). */
static int child_sticky_kernel(void) {
  launch_fn launch = (launch_fn)dlsym(RTLD_DEFAULT, "gs_launch");
  if (!launch) return 77; /* hidden: skipped */
  cudaStream_t s;
  tkernel_t k;
  int captured = -1;
  tk_init(&k, 0, cudaErrorIllegalAddress);
  CK(cudaStreamCreate(&s) == cudaSuccess);
  CK(launch(s, &k.k, &captured) == cudaSuccess && captured == 0);
  if (check_sticky_after(s)) return 1;
  CK(atomic_load(&k.runs) == 1 && tk_released(&k));
  return 0;
}

/* The same through exported calls only: a copy queued while its device
 * memory was live, run after cudaFreeAsync on another stream unmapped it,
 * faults as a DMA to an unmapped page would. */
static int child_sticky_copy(void) {
  cudaStream_t s, s2;
  gate_t g;
  void *d;
  static char host[64];
  gate_init(&g);
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking) == cudaSuccess);
  CK(cudaMalloc(&d, sizeof(host)) == cudaSuccess);
  CK((cudaError_t)tdist_gpusim_launch_kernel(s, gate_fn, &g) == cudaSuccess);
  CK(cudaMemcpyAsync(d, host, sizeof(host), cudaMemcpyHostToDevice, s) == cudaSuccess);
  CK(cudaFreeAsync(d, s2) == cudaSuccess && cudaStreamSynchronize(s2) == cudaSuccess);
  CK(tdist_gpusim_host_view(d) == NULL);
  gate_open(&g);
  return check_sticky_after(s);
}

/* A host read of device memory faults, as on a GPU (memory.c): the child
 * exits 42 from its SIGSEGV handler. */
static void on_segv(int sig) {
  (void)sig;
  _exit(42);
}
static int child_host_fault(void) {
  void *d;
  CK(cudaMalloc(&d, 64) == cudaSuccess);
  signal(SIGSEGV, on_segv);
  volatile char c = *(volatile char *)d; /* must not return */
  (void)c;
  return 0;
}

static int child_main(const char *name) {
  static const struct {
    const char *name;
    int (*fn)(void);
  } t[] = {{"defaults", child_defaults},
           {"visible", child_visible},
           {"novis", child_novis},
           {"contexts", child_contexts},
           {"contexts1", child_contexts1},
           {"sticky_kernel", child_sticky_kernel},
           {"sticky_copy", child_sticky_copy},
           {"host_fault", child_host_fault}};
  for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++)
    if (strcmp(name, t[i].name) == 0) return t[i].fn();
  return 2;
}

/* ---- tests in the parent ---------------------------------------------------------------- */

static void devices(void **state) {
  (void)state;
  assert_int_equal(run_child("defaults", NULL), 0);
  const char *vis[] = {"TDIST_GPUSIM_DEVICES=4", "TDIST_GPUSIM_CC=8.0,8.6,9.0",
                       "CUDA_VISIBLE_DEVICES=3,1,7,0", NULL};
  assert_int_equal(run_child("visible", vis), 0);
  const char *none[] = {"CUDA_VISIBLE_DEVICES=", NULL};
  assert_int_equal(run_child("novis", none), 0);
}

static void contexts(void **state) {
  (void)state;
  assert_int_equal(run_child("contexts", NULL), 0);
  assert_int_equal(run_child("contexts1", NULL), 0);
}

static void sticky_errors(void **state) {
  (void)state;
  int rc = run_child("sticky_kernel", NULL);
  if (rc != 77) assert_int_equal(rc, 0);
  assert_int_equal(run_child("sticky_copy", NULL), 0);
}

/* CUDA Runtime API, cudaGetErrorString / cudaGetErrorName. */
static void error_strings(void **state) {
  (void)state;
  assert_string_equal(cudaGetErrorName(cudaErrorCapturedEvent), "cudaErrorCapturedEvent");
  assert_string_equal(cudaGetErrorString(cudaErrorCapturedEvent),
                      "operation not permitted on an event last recorded in a capturing stream");
  assert_string_equal(cudaGetErrorString(cudaErrorIllegalAddress),
                      "an illegal memory access was encountered");
  assert_string_equal(cudaGetErrorName(cudaErrorNotReady), "cudaErrorNotReady");
  assert_string_equal(cudaGetErrorString((cudaError_t)12345), "unrecognized error code");
}

/* CUDA Runtime API, cudaGetLastError (returns and resets) and
 * cudaPeekAtLastError (does not reset); cudaErrorNotReady is no error. */
static void last_error(void **state) {
  (void)state;
  assert_int_equal(cudaGetLastError(), cudaSuccess);
  assert_int_equal(cudaSetDevice(99), cudaErrorInvalidDevice);
  assert_int_equal(cudaPeekAtLastError(), cudaErrorInvalidDevice);
  assert_int_equal(cudaPeekAtLastError(), cudaErrorInvalidDevice);
  assert_int_equal(cudaGetLastError(), cudaErrorInvalidDevice);
  assert_int_equal(cudaGetLastError(), cudaSuccess);
  gate_t g;
  gate_init(&g);
  cudaStream_t s;
  assert_int_equal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  assert_int_equal((cudaError_t)tdist_gpusim_launch_kernel(s, gate_fn, &g), cudaSuccess);
  assert_int_equal(cudaStreamQuery(s), cudaErrorNotReady);
  assert_int_equal(cudaGetLastError(), cudaSuccess);
  gate_open(&g);
  assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
  assert_int_equal(cudaStreamDestroy(s), cudaSuccess);
}

/* CUDA Runtime API, cudaMalloc / cudaPointerGetAttributes (CUDA 11+:
 * unregistered host memory is cudaMemoryTypeUnregistered, device -2) /
 * cudaMemcpy / cudaMemset / cudaFree. */
static void memory(void **state) {
  (void)state;
  char host[256], back[256];
  void *d, *h;
  struct cudaPointerAttributes a;
  for (int i = 0; i < 256; i++)
    host[i] = (char)i;
  assert_int_equal(cudaSetDevice(2), cudaSuccess);
  assert_int_equal(cudaMalloc(&d, 256), cudaSuccess);
  assert_int_equal(cudaMallocHost(&h, 64), cudaSuccess);
  assert_int_equal(cudaPointerGetAttributes(&a, (char *)d + 10), cudaSuccess);
  assert_int_equal(a.type, cudaMemoryTypeDevice);
  assert_int_equal(a.device, 2);
  assert_ptr_equal(a.devicePointer, (char *)d + 10);
  assert_int_equal(cudaPointerGetAttributes(&a, h), cudaSuccess);
  assert_int_equal(a.type, cudaMemoryTypeHost);
  assert_int_equal(a.device, 2);
  assert_int_equal(cudaPointerGetAttributes(&a, host), cudaSuccess);
  assert_int_equal(a.type, cudaMemoryTypeUnregistered);
  assert_int_equal(a.device, -2);
  /* The host view holds what cudaMemcpy wrote; copies back round-trip. */
  assert_int_equal(cudaMemcpy(d, host, 256, cudaMemcpyHostToDevice), cudaSuccess);
  char *view = tdist_gpusim_host_view(d);
  assert_non_null(view);
  assert_memory_equal(view, host, 256);
  assert_ptr_equal(tdist_gpusim_host_view((char *)d + 17), view + 17);
  assert_int_equal(cudaMemset((char *)d + 8, 0x7f, 8), cudaSuccess);
  assert_int_equal(cudaMemcpy(back, d, 256, cudaMemcpyDefault), cudaSuccess);
  assert_int_equal(back[8], 0x7f);
  assert_int_equal(back[16], 16);
  /* A device range that is not live device memory: cudaErrorInvalidValue
   * at the call (cudaMemcpy), never a crash. */
  assert_int_equal(cudaMemcpy(d, host, 257, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
  assert_int_equal(cudaMemcpy(host, back, 4, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
  assert_int_equal(cudaGetLastError(), cudaErrorInvalidValue);
  dev_access_fn access = (dev_access_fn)dlsym(RTLD_DEFAULT, "gs_dev_access");
  if (access) { /* sim.h: only device 2's kernels see it (no peer access) */
    assert_ptr_equal(access(2, (char *)d + 8, 16), view + 8);
    assert_null(access(0, d, 16));
    assert_null(access(2, d, 257));
  }
  assert_int_equal(cudaFree(d), cudaSuccess);
  assert_null(tdist_gpusim_host_view(d));
  if (access) assert_null(access(2, d, 16));
  assert_int_equal(cudaMemcpy(d, host, 16, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
  assert_int_equal(cudaMemset(d, 0, 16), cudaErrorInvalidValue);
  assert_int_equal(cudaFree(d), cudaErrorInvalidValue);
  assert_int_equal(cudaFreeHost(h), cudaSuccess);
  assert_int_equal(cudaGetLastError(), cudaErrorInvalidValue);
  /* A host read of device memory faults (in a child). */
  assert_int_equal(run_child("host_fault", NULL), 42);
  assert_int_equal(cudaSetDevice(0), cudaSuccess);
}

/* CUDA Programming Guide, Streams: work on a stream runs in issue order;
 * CUDA Runtime API, cudaEventQuery: an event's record completes after the
 * work before it, cudaErrorNotReady until then, cudaSuccess if never
 * recorded. */
static void stream_order(void **state) {
  (void)state;
  cudaStream_t s;
  cudaEvent_t ev[3], never;
  gate_t g;
  gate_init(&g);
  log_reset();
  assert_int_equal(cudaStreamCreate(&s), cudaSuccess);
  for (int i = 0; i < 3; i++)
    assert_int_equal(cudaEventCreate(&ev[i]), cudaSuccess);
  assert_int_equal(cudaEventCreate(&never), cudaSuccess);
  assert_int_equal(cudaEventQuery(never), cudaSuccess);
  assert_int_equal(cudaLaunchHostFunc(s, sleep_log_fn, (void *)1), cudaSuccess);
  assert_int_equal(cudaLaunchHostFunc(s, log_fn, (void *)2), cudaSuccess);
  assert_int_equal(cudaEventRecord(ev[0], s), cudaSuccess);
  assert_int_equal(cudaLaunchHostFunc(s, gate_fn, &g), cudaSuccess);
  assert_int_equal(cudaEventRecord(ev[1], s), cudaSuccess);
  assert_int_equal(cudaLaunchHostFunc(s, sleep_log_fn, (void *)3), cudaSuccess);
  assert_int_equal(cudaEventRecord(ev[2], s), cudaSuccess);
  gate_wait_entered(&g);
  assert_int_equal(cudaEventQuery(ev[0]), cudaSuccess);
  assert_int_equal(cudaEventQuery(ev[1]), cudaErrorNotReady);
  assert_int_equal(cudaEventQuery(ev[2]), cudaErrorNotReady);
  assert_int_equal(cudaStreamQuery(s), cudaErrorNotReady);
  gate_open(&g);
  assert_int_equal(cudaEventSynchronize(ev[2]), cudaSuccess);
  assert_int_equal(cudaEventQuery(ev[1]), cudaSuccess);
  assert_int_equal(cudaStreamQuery(s), cudaSuccess);
  assert_int_equal(atomic_load(&g_nlog), 3);
  for (int i = 0; i < 3; i++)
    assert_int_equal(atomic_load(&g_log[i]), i + 1);
  /* cudaEventElapsedTime: ms between two timing events; refused for
   * cudaEventDisableTiming events (cudaErrorInvalidResourceHandle). */
  float ms = -1;
  assert_int_equal(cudaEventElapsedTime(&ms, ev[0], ev[2]), cudaSuccess);
  assert_true(ms >= 2.0f);
  cudaEvent_t nt;
  assert_int_equal(cudaEventCreateWithFlags(&nt, cudaEventDisableTiming), cudaSuccess);
  assert_int_equal(cudaEventRecord(nt, s), cudaSuccess);
  assert_int_equal(cudaEventSynchronize(nt), cudaSuccess);
  assert_int_equal(cudaEventElapsedTime(&ms, ev[0], nt), cudaErrorInvalidResourceHandle);
  /* Handles: destroyed or garbage streams/events are invalid, no crash. */
  assert_int_equal(cudaEventDestroy(nt), cudaSuccess);
  assert_int_equal(cudaEventQuery(nt), cudaErrorInvalidResourceHandle);
  assert_int_equal(cudaEventRecord((cudaEvent_t)(uintptr_t)0x1234, s),
                   cudaErrorInvalidResourceHandle);
  for (int i = 0; i < 3; i++)
    assert_int_equal(cudaEventDestroy(ev[i]), cudaSuccess);
  assert_int_equal(cudaEventDestroy(never), cudaSuccess);
  assert_int_equal(cudaStreamDestroy(s), cudaSuccess);
  assert_int_equal(cudaStreamQuery(s), cudaErrorInvalidResourceHandle);
  assert_int_equal(cudaLaunchHostFunc(s, log_fn, NULL), cudaErrorInvalidResourceHandle);
  assert_int_equal(cudaStreamSynchronize((cudaStream_t)(uintptr_t)0x5678),
                   cudaErrorInvalidResourceHandle);
  cudaGetLastError();
}

/* CUDA Runtime API, cudaStreamWaitEvent: the stream's later work waits for
 * the event's last record as of the call (a later re-record does not
 * change it); an event never recorded means no wait. cudaEventRecord: the
 * event and the stream must be on the same device. */
static void wait_event(void **state) {
  (void)state;
  cudaStream_t s1, s2, s3;
  cudaEvent_t ev, never, ev3;
  atomic_int b = 0, c = 0;
  gate_t g;
  gate_init(&g);
  assert_int_equal(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking), cudaSuccess);
  assert_int_equal(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking), cudaSuccess);
  assert_int_equal(cudaStreamCreateWithFlags(&s3, cudaStreamNonBlocking), cudaSuccess);
  assert_int_equal(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), cudaSuccess);
  assert_int_equal(cudaEventCreate(&never), cudaSuccess);
  assert_int_equal((cudaError_t)tdist_gpusim_launch_kernel(s1, gate_fn, &g), cudaSuccess);
  assert_int_equal(cudaEventRecord(ev, s1), cudaSuccess);
  assert_int_equal(cudaStreamWaitEvent(s2, ev, 0), cudaSuccess);
  assert_int_equal(cudaEventRecord(ev, s3), cudaSuccess); /* later: not waited for */
  assert_int_equal(cudaLaunchHostFunc(s2, flag_fn, &b), cudaSuccess);
  assert_int_equal(cudaStreamWaitEvent(s3, never, 0), cudaSuccess);
  assert_int_equal(cudaLaunchHostFunc(s3, flag_fn, &c), cudaSuccess);
  assert_int_equal(cudaStreamSynchronize(s3), cudaSuccess);
  assert_int_equal(atomic_load(&c), 1);
  gate_wait_entered(&g);
  usleep(30000);
  assert_int_equal(atomic_load(&b), 0);
  assert_int_equal(cudaStreamQuery(s2), cudaErrorNotReady);
  gate_open(&g);
  assert_int_equal(cudaStreamSynchronize(s2), cudaSuccess);
  assert_int_equal(atomic_load(&b), 1);
  /* An event of device 1 cannot be recorded on a device-0 stream. */
  assert_int_equal(cudaSetDevice(1), cudaSuccess);
  assert_int_equal(cudaEventCreate(&ev3), cudaSuccess);
  assert_int_equal(cudaSetDevice(0), cudaSuccess);
  assert_int_equal(cudaEventRecord(ev3, s1), cudaErrorInvalidResourceHandle);
  cudaGetLastError();
  cudaEventDestroy(ev3);
  cudaEventDestroy(ev);
  cudaEventDestroy(never);
  cudaStreamDestroy(s1);
  cudaStreamDestroy(s2);
  cudaStreamDestroy(s3);
}

/* CUDA Runtime API, cudaLaunchHostFunc (observed on an H200, issue 39):
 * the host functions of all streams run on one thread per process, one at
 * a time in order of readiness, so a blocking host function delays every
 * other stream's host functions; a host function may not call CUDA
 * (cudaErrorNotPermitted, 800). A user kernel holds only its own stream. */
typedef struct {
  pthread_t self;
  int err;
} hf_probe_t;
static void probe_fn(void *p) {
  hf_probe_t *q = p;
  q->self = pthread_self();
  void *d = NULL;
  q->err = (int)cudaMalloc(&d, 16); /* not permitted */
}
static void host_functions_one_thread(void **state) {
  (void)state;
  cudaStream_t s1, s2;
  atomic_int f = 0;
  gate_t g;
  gate_init(&g);
  assert_int_equal(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking), cudaSuccess);
  assert_int_equal(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking), cudaSuccess);
  /* A blocking host function on s1 delays s2's host function. */
  assert_int_equal(cudaLaunchHostFunc(s1, gate_fn, &g), cudaSuccess);
  gate_wait_entered(&g);
  assert_int_equal(cudaLaunchHostFunc(s2, flag_fn, &f), cudaSuccess);
  usleep(50000);
  assert_int_equal(atomic_load(&f), 0);
  assert_int_equal(cudaStreamQuery(s2), cudaErrorNotReady);
  gate_open(&g);
  assert_int_equal(cudaStreamSynchronize(s2), cudaSuccess);
  assert_int_equal(atomic_load(&f), 1);
  assert_int_equal(cudaStreamSynchronize(s1), cudaSuccess);
  /* A user kernel holding s1 does not. */
  gate_t g2;
  gate_init(&g2);
  atomic_store(&f, 0);
  assert_int_equal(tdist_gpusim_launch_kernel(s1, gate_fn, &g2), 0);
  gate_wait_entered(&g2);
  assert_int_equal(cudaLaunchHostFunc(s2, flag_fn, &f), cudaSuccess);
  assert_int_equal(cudaStreamSynchronize(s2), cudaSuccess);
  assert_int_equal(atomic_load(&f), 1);
  assert_int_equal(cudaStreamQuery(s1), cudaErrorNotReady);
  gate_open(&g2);
  assert_int_equal(cudaStreamSynchronize(s1), cudaSuccess);
  /* One thread for both streams; CUDA calls from it are not permitted. */
  hf_probe_t p1 = {0}, p2 = {0};
  assert_int_equal(cudaLaunchHostFunc(s1, probe_fn, &p1), cudaSuccess);
  assert_int_equal(cudaLaunchHostFunc(s2, probe_fn, &p2), cudaSuccess);
  assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
  assert_true(pthread_equal(p1.self, p2.self));
  assert_false(pthread_equal(p1.self, pthread_self()));
  assert_int_equal(p1.err, 800);
  assert_int_equal(p2.err, 800);
  assert_string_equal(cudaGetErrorName((cudaError_t)800), "cudaErrorNotPermitted");
  /* A bad stream handle is refused as a kernel launch would be. */
  assert_int_equal(tdist_gpusim_launch_kernel((void *)(uintptr_t)0x5678, flag_fn, &f),
                   cudaErrorInvalidResourceHandle);
  cudaGetLastError();
  cudaStreamDestroy(s1);
  cudaStreamDestroy(s2);
}

/* CUDA Runtime API, Stream synchronization behavior / CUDA Programming
 * Guide, Implicit Synchronization: work on the legacy default stream waits
 * for earlier work of blocking streams and blocking streams wait for
 * earlier legacy work; cudaStreamNonBlocking streams do neither. The
 * per-thread default stream "is not a non-blocking stream and will
 * synchronize with the legacy default stream". */
static void legacy_sync(void **state) {
  (void)state;
  cudaStream_t blk, nb;
  atomic_int f1 = 0, f2 = 0, f3 = 0, f4 = 0;
  gate_t g1, g2;
  gate_init(&g1);
  gate_init(&g2);
  assert_int_equal(cudaStreamCreate(&blk), cudaSuccess);
  assert_int_equal(cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking), cudaSuccess);
  /* Blocking stream held: legacy work waits, non-blocking work does not. */
  assert_int_equal((cudaError_t)tdist_gpusim_launch_kernel(blk, gate_fn, &g1), cudaSuccess);
  assert_int_equal(cudaLaunchHostFunc(NULL, flag_fn, &f1), cudaSuccess);
  assert_int_equal(cudaLaunchHostFunc(nb, flag_fn, &f2), cudaSuccess);
  assert_int_equal(cudaStreamSynchronize(nb), cudaSuccess);
  gate_wait_entered(&g1);
  usleep(30000);
  assert_int_equal(atomic_load(&f2), 1);
  assert_int_equal(atomic_load(&f1), 0);
  gate_open(&g1);
  assert_int_equal(cudaStreamSynchronize(cudaStreamLegacy), cudaSuccess);
  assert_int_equal(atomic_load(&f1), 1);
  /* Legacy stream held: blocking and per-thread work waits. */
  assert_int_equal((cudaError_t)tdist_gpusim_launch_kernel(cudaStreamLegacy, gate_fn, &g2),
                   cudaSuccess);
  assert_int_equal(cudaLaunchHostFunc(blk, flag_fn, &f3), cudaSuccess);
  assert_int_equal(cudaLaunchHostFunc(cudaStreamPerThread, flag_fn, &f4), cudaSuccess);
  gate_wait_entered(&g2);
  usleep(30000);
  assert_int_equal(atomic_load(&f3), 0);
  assert_int_equal(atomic_load(&f4), 0);
  gate_open(&g2);
  assert_int_equal(cudaStreamSynchronize(blk), cudaSuccess);
  assert_int_equal(cudaStreamSynchronize(cudaStreamPerThread), cudaSuccess);
  assert_int_equal(atomic_load(&f3), 1);
  assert_int_equal(atomic_load(&f4), 1);
  /* cudaDeviceSynchronize waits for every stream of the device. */
  log_reset();
  assert_int_equal(cudaLaunchHostFunc(nb, sleep_log_fn, (void *)9), cudaSuccess);
  assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
  assert_int_equal(atomic_load(&g_nlog), 1);
  cudaStreamDestroy(blk);
  cudaStreamDestroy(nb);
}

/* CUDA Programming Guide, Stream Capture: captured work is recorded, not
 * run; cudaStreamEndCapture returns the graph; cudaGraphLaunch replays it
 * in order (here each launch after the earlier ones). Kernel nodes are
 * instantiated per launch (sim.h). */
static void capture_replay(void **state) {
  (void)state;
  cudaStream_t s;
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  enum cudaStreamCaptureStatus st;
  log_reset();
  assert_int_equal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  /* CUDA Runtime API, cudaStreamBeginCapture: not on the legacy stream. */
  assert_int_equal(cudaStreamBeginCapture(NULL, cudaStreamCaptureModeGlobal),
                   cudaErrorStreamCaptureUnsupported);
  assert_int_equal(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  assert_int_equal(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaErrorIllegalState);
  assert_int_equal(cudaStreamIsCapturing(s, &st), cudaSuccess);
  assert_int_equal(st, cudaStreamCaptureStatusActive);
  for (intptr_t i = 1; i <= 3; i++)
    assert_int_equal(cudaLaunchHostFunc(s, i == 2 ? sleep_log_fn : log_fn, (void *)i), cudaSuccess);
  tkernel_t k;
  tk_init(&k, 0, cudaSuccess);
  launch_fn launch = (launch_fn)dlsym(RTLD_DEFAULT, "gs_launch");
  int captured = 0;
  if (launch) assert_int_equal(launch(s, &k.k, &captured), cudaSuccess);
  if (launch) assert_int_equal(captured, 1);
  usleep(10000);
  assert_int_equal(atomic_load(&g_nlog), 0);
  assert_int_equal(cudaStreamEndCapture(s, &graph), cudaSuccess);
  assert_non_null(graph);
  assert_int_equal(cudaStreamIsCapturing(s, &st), cudaSuccess);
  assert_int_equal(st, cudaStreamCaptureStatusNone);
  assert_int_equal(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  assert_int_equal(cudaGraphDestroy(graph), cudaSuccess); /* exec keeps the nodes */
  assert_int_equal(cudaGraphLaunch(exec, s), cudaSuccess);
  assert_int_equal(cudaGraphLaunch(exec, s), cudaSuccess);
  assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
  assert_int_equal(atomic_load(&g_nlog), 6);
  for (int i = 0; i < 6; i++)
    assert_int_equal(atomic_load(&g_log[i]), i % 3 + 1);
  if (launch) {
    assert_int_equal(atomic_load(&k.instances), 2);
    assert_int_equal(atomic_load(&k.runs), 2);
  }
  assert_int_equal(cudaGraphExecDestroy(exec), cudaSuccess);
  if (launch) assert_true(tk_released(&k)); /* instances and the proto released */
  assert_int_equal(cudaGraphExecDestroy(exec), cudaErrorInvalidResourceHandle);
  cudaGetLastError();
  cudaStreamDestroy(s);
}

/* CUDA Programming Guide, Stream Capture / Prohibited and Unhandled
 * Operations: querying an event last recorded in a capture is invalid
 * (cudaErrorCapturedEvent) and invalidates the capture; so does querying
 * or synchronising a capturing stream; CUDA Runtime API,
 * cudaStreamIsCapturing: the legacy stream gives
 * cudaErrorStreamCaptureImplicit while a blocking stream captures. */
static void capture_invalid_ops(void **state) {
  (void)state;
  cudaStream_t s, blk;
  cudaEvent_t ev;
  cudaGraph_t graph = (cudaGraph_t)(uintptr_t)1;
  enum cudaStreamCaptureStatus st;
  atomic_int f = 0;
  assert_int_equal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  assert_int_equal(cudaStreamCreate(&blk), cudaSuccess);
  assert_int_equal(cudaEventCreate(&ev), cudaSuccess);
  assert_int_equal(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed), cudaSuccess);
  assert_int_equal(cudaEventRecord(ev, s), cudaSuccess);
  assert_int_equal(cudaEventQuery(ev), cudaErrorCapturedEvent);
  assert_int_equal(cudaEventSynchronize(ev), cudaErrorCapturedEvent);
  assert_int_equal(cudaStreamIsCapturing(s, &st), cudaSuccess);
  assert_int_equal(st, cudaStreamCaptureStatusInvalidated);
  assert_int_equal(cudaLaunchHostFunc(s, flag_fn, &f), cudaErrorStreamCaptureInvalidated);
  assert_int_equal(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated);
  assert_null(graph);
  assert_int_equal(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed), cudaSuccess);
  assert_int_equal(cudaStreamSynchronize(s), cudaErrorStreamCaptureUnsupported);
  assert_int_equal(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated);
  /* A blocking stream captures: the legacy stream may not depend on it. */
  assert_int_equal(cudaStreamBeginCapture(blk, cudaStreamCaptureModeRelaxed), cudaSuccess);
  assert_int_equal(cudaStreamIsCapturing(NULL, &st), cudaErrorStreamCaptureImplicit);
  assert_int_equal(cudaLaunchHostFunc(NULL, flag_fn, &f), cudaErrorStreamCaptureImplicit);
  assert_int_equal(cudaStreamEndCapture(blk, &graph), cudaErrorStreamCaptureInvalidated);
  assert_int_equal(cudaStreamEndCapture(blk, &graph), cudaErrorIllegalState);
  assert_int_equal(atomic_load(&f), 0);
  cudaGetLastError();
  cudaEventDestroy(ev);
  cudaStreamDestroy(s);
  cudaStreamDestroy(blk);
}

typedef struct {
  cudaEvent_t ev;
  int relaxed;
  cudaError_t rc;
} other_t;
static void *other_thread(void *p) {
  other_t *o = p;
  if (o->relaxed) {
    enum cudaStreamCaptureMode m = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&m);
  }
  o->rc = cudaEventQuery(o->ev);
  return NULL;
}
static cudaError_t query_from_thread(cudaEvent_t ev, int relaxed) {
  other_t o = {ev, relaxed, cudaErrorUnknown};
  pthread_t t;
  if (pthread_create(&t, NULL, other_thread, &o) != 0) return cudaErrorUnknown;
  pthread_join(t, NULL);
  return o.rc;
}

/* CUDA Runtime API, cudaThreadExchangeStreamCaptureMode: while a Global
 * capture is active, another thread in Global mode gets
 * cudaErrorStreamCaptureUnsupported from potentially unsafe calls (such as
 * cudaEventQuery) and the capture is invalidated; a Relaxed thread is not
 * prohibited; a ThreadLocal capture does not affect other threads. */
static void capture_modes(void **state) {
  (void)state;
  cudaStream_t s;
  cudaEvent_t plain;
  cudaGraph_t graph;
  assert_int_equal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  assert_int_equal(cudaEventCreate(&plain), cudaSuccess);
  assert_int_equal(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  assert_int_equal(query_from_thread(plain, 1), cudaSuccess);
  assert_int_equal(query_from_thread(plain, 0), cudaErrorStreamCaptureUnsupported);
  assert_int_equal(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated);
  assert_int_equal(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  assert_int_equal(query_from_thread(plain, 0), cudaSuccess);
  /* The capturing thread itself (Global mode) is prohibited. */
  void *p;
  assert_int_equal(cudaMalloc(&p, 16), cudaErrorStreamCaptureUnsupported);
  assert_int_equal(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated);
  /* Afterwards nothing is prohibited. */
  assert_int_equal(query_from_thread(plain, 0), cudaSuccess);
  assert_int_equal(cudaEventQuery(plain), cudaSuccess);
  cudaGetLastError();
  cudaEventDestroy(plain);
  cudaStreamDestroy(s);
}

/* CUDA Programming Guide, Stream Capture / Cross-stream Dependencies and
 * Events: a stream that waits on an event recorded in a capture joins it;
 * it must be joined back into the origin before cudaStreamEndCapture, else
 * cudaErrorStreamCaptureUnjoined. */
static void capture_fork_join(void **state) {
  (void)state;
  cudaStream_t s1, s2;
  cudaEvent_t fork_ev, join_ev;
  cudaGraph_t graph = NULL;
  cudaGraphExec_t exec;
  enum cudaStreamCaptureStatus st;
  log_reset();
  assert_int_equal(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking), cudaSuccess);
  assert_int_equal(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking), cudaSuccess);
  assert_int_equal(cudaEventCreateWithFlags(&fork_ev, cudaEventDisableTiming), cudaSuccess);
  assert_int_equal(cudaEventCreateWithFlags(&join_ev, cudaEventDisableTiming), cudaSuccess);
  /* Unjoined. */
  assert_int_equal(cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal), cudaSuccess);
  assert_int_equal(cudaEventRecord(fork_ev, s1), cudaSuccess);
  assert_int_equal(cudaStreamWaitEvent(s2, fork_ev, 0), cudaSuccess);
  assert_int_equal(cudaStreamIsCapturing(s2, &st), cudaSuccess);
  assert_int_equal(st, cudaStreamCaptureStatusActive);
  assert_int_equal(cudaLaunchHostFunc(s2, log_fn, (void *)7), cudaSuccess);
  assert_int_equal(cudaStreamEndCapture(s2, &graph), cudaErrorStreamCaptureUnmatched);
  assert_int_equal(cudaStreamEndCapture(s1, &graph), cudaErrorStreamCaptureInvalidated);
  assert_int_equal(cudaStreamIsCapturing(s2, &st), cudaSuccess);
  assert_int_equal(st, cudaStreamCaptureStatusNone);
  assert_int_equal(cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal), cudaSuccess);
  assert_int_equal(cudaEventRecord(fork_ev, s1), cudaSuccess);
  assert_int_equal(cudaStreamWaitEvent(s2, fork_ev, 0), cudaSuccess);
  assert_int_equal(cudaLaunchHostFunc(s2, log_fn, (void *)7), cudaSuccess);
  assert_int_equal(cudaStreamEndCapture(s1, &graph), cudaErrorStreamCaptureUnjoined);
  assert_null(graph);
  assert_int_equal(cudaStreamIsCapturing(s2, &st), cudaSuccess);
  assert_int_equal(st, cudaStreamCaptureStatusNone);
  /* Joined back: the graph holds both streams' work. */
  assert_int_equal(cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal), cudaSuccess);
  assert_int_equal(cudaLaunchHostFunc(s1, log_fn, (void *)1), cudaSuccess);
  assert_int_equal(cudaEventRecord(fork_ev, s1), cudaSuccess);
  assert_int_equal(cudaStreamWaitEvent(s2, fork_ev, 0), cudaSuccess);
  assert_int_equal(cudaLaunchHostFunc(s2, log_fn, (void *)2), cudaSuccess);
  assert_int_equal(cudaEventRecord(join_ev, s2), cudaSuccess);
  assert_int_equal(cudaStreamWaitEvent(s1, join_ev, 0), cudaSuccess);
  assert_int_equal(cudaLaunchHostFunc(s1, log_fn, (void *)3), cudaSuccess);
  assert_int_equal(cudaStreamEndCapture(s1, &graph), cudaSuccess);
  assert_int_equal(atomic_load(&g_nlog), 0);
  assert_int_equal(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  assert_int_equal(cudaGraphLaunch(exec, s1), cudaSuccess);
  assert_int_equal(cudaStreamSynchronize(s1), cudaSuccess);
  assert_int_equal(atomic_load(&g_nlog), 3);
  for (int i = 0; i < 3; i++)
    assert_int_equal(atomic_load(&g_log[i]), i + 1);
  /* An event recorded by the replay is an ordinary event again. */
  assert_int_equal(cudaEventQuery(join_ev), cudaSuccess);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaGetLastError();
  cudaEventDestroy(fork_ev);
  cudaEventDestroy(join_ev);
  cudaStreamDestroy(s1);
  cudaStreamDestroy(s2);
}

/* ---- user objects and the capture query ------------------------------------------ */

/* A user object's destructor: records that it ran, on which thread, and
 * what a CUDA call made there answered. */
typedef struct {
  atomic_int ran;
  atomic_int cuda_rc;
  pthread_t thread;
} dtor_t;
static void dtor_fn(void *p) {
  dtor_t *d = p;
  d->thread = pthread_self();
  void *m = NULL;
  atomic_store(&d->cuda_rc, (int)cudaMalloc(&m, 16));
  atomic_store(&d->ran, 1);
}
/* Bounded wait for a destructor (it runs on a thread of its own). */
static int dtor_wait(dtor_t *d) {
  for (int i = 0; i < 20000 && !atomic_load(&d->ran); i++)
    usleep(500);
  return atomic_load(&d->ran);
}

/* CUDA Runtime API, cudaUserObjectCreate / cudaUserObjectRetain /
 * cudaUserObjectRelease / cudaGraphRetainUserObject, cudaStreamGetCaptureInfo;
 * CUDA Programming Guide, User Objects: the destructor runs when the last
 * reference goes, not on the releasing thread, and may not call CUDA; a
 * graph owns the references it was given until it is freed (graph handle
 * and executable graphs), and those a pending launch needs are held until it
 * finished executing; a capture that ends invalidated drops its graph's. */
static void user_objects(void **state) {
  (void)state;
  cudaUserObject_t o = NULL;
  dtor_t d1 = {0}, d2 = {0}, d3 = {0};
  assert_int_equal(cudaSetDevice(0), cudaSuccess);
  /* flags must be cudaUserObjectNoDestructorSync; refs nonzero; a destructor */
  assert_int_equal(cudaUserObjectCreate(&o, &d1, dtor_fn, 1, 0), cudaErrorInvalidValue);
  assert_int_equal(cudaUserObjectCreate(&o, &d1, dtor_fn, 0, cudaUserObjectNoDestructorSync),
                   cudaErrorInvalidValue);
  assert_int_equal(cudaUserObjectCreate(&o, &d1, NULL, 1, cudaUserObjectNoDestructorSync),
                   cudaErrorInvalidValue);
  cudaGetLastError();
  /* references: the last release runs the destructor, elsewhere, without CUDA */
  assert_int_equal(cudaUserObjectCreate(&o, &d1, dtor_fn, 1, cudaUserObjectNoDestructorSync),
                   cudaSuccess);
  assert_int_equal(cudaUserObjectRetain(o, 2), cudaSuccess);
  assert_int_equal(cudaUserObjectRelease(o, 2), cudaSuccess);
  usleep(10000);
  assert_int_equal(atomic_load(&d1.ran), 0);
  assert_int_equal(cudaUserObjectRelease(o, 1), cudaSuccess);
  assert_true(dtor_wait(&d1));
  assert_false(pthread_equal(d1.thread, pthread_self()));
  assert_int_equal(atomic_load(&d1.cuda_rc), cudaErrorNotPermitted);

  /* the capture query */
  cudaStream_t s, s2;
  enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusActive;
  unsigned long long id = 0, id2 = 0;
  cudaGraph_t g = NULL, g2 = NULL, ended = NULL;
  const cudaGraphNode_t *deps = NULL;
  assert_int_equal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  assert_int_equal(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking), cudaSuccess);
  assert_int_equal(cudaStreamGetCaptureInfo(s, &st, NULL, NULL, NULL, NULL), cudaSuccess);
  assert_int_equal(st, cudaStreamCaptureStatusNone);
  assert_int_equal(cudaStreamGetCaptureInfo(s, NULL, NULL, NULL, NULL, NULL),
                   cudaErrorInvalidValue);
  cudaGetLastError();
  assert_int_equal(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  /* Relaxed: the synchronisation below must not touch it */
  assert_int_equal(cudaStreamBeginCapture(s2, cudaStreamCaptureModeRelaxed), cudaSuccess);
  assert_int_equal(cudaStreamGetCaptureInfo(s, &st, &id, &g, NULL, NULL), cudaSuccess);
  assert_int_equal(st, cudaStreamCaptureStatusActive);
  assert_non_null(g);
  assert_int_equal(cudaStreamGetCaptureInfo(s2, &st, &id2, &g2, NULL, NULL), cudaSuccess);
  assert_true(id != id2); /* unique over the process */
  assert_true(g != g2);
  /* the simulation does not model the dependency set: refused, not faked */
  assert_int_equal(cudaStreamGetCaptureInfo(s, &st, NULL, NULL, &deps, NULL),
                   cudaErrorInvalidValue);
  cudaGetLastError();

  /* a graph owns moved references until it and its executable graph go,
   * and a pending launch holds them until it ran */
  assert_int_equal(cudaUserObjectCreate(&o, &d2, dtor_fn, 1, cudaUserObjectNoDestructorSync),
                   cudaSuccess);
  assert_int_equal(cudaGraphRetainUserObject(g, o, 0, cudaGraphUserObjectMove),
                   cudaErrorInvalidValue);
  assert_int_equal(cudaGraphRetainUserObject(g, o, 1, 2), cudaErrorInvalidValue);
  cudaGetLastError();
  assert_int_equal(cudaGraphRetainUserObject(g, o, 1, cudaGraphUserObjectMove), cudaSuccess);
  gate_t gate;
  gate_init(&gate);
  assert_int_equal(tdist_gpusim_launch_kernel(s, gate_fn, &gate), cudaSuccess);
  assert_int_equal(cudaStreamEndCapture(s, &ended), cudaSuccess);
  assert_ptr_equal(ended, g); /* the graph the query named */
  cudaGraphExec_t ex;
  assert_int_equal(cudaGraphInstantiate(&ex, g, 0), cudaSuccess);
  assert_int_equal(cudaGraphDestroy(g), cudaSuccess);
  assert_int_equal(cudaGraphLaunch(ex, s), cudaSuccess);
  gate_wait_entered(&gate);
  assert_int_equal(cudaGraphExecDestroy(ex), cudaSuccess); /* the launch still runs */
  usleep(10000);
  assert_int_equal(atomic_load(&d2.ran), 0);
  gate_open(&gate);
  assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
  assert_true(dtor_wait(&d2));

  /* an invalidated capture's graph is dropped with its references (new
   * ones here: the caller keeps its own) */
  assert_int_equal(cudaUserObjectCreate(&o, &d3, dtor_fn, 1, cudaUserObjectNoDestructorSync),
                   cudaSuccess);
  assert_int_equal(cudaGraphRetainUserObject(g2, o, 2, 0), cudaSuccess);
  assert_int_equal(cudaStreamQuery(s2), cudaErrorStreamCaptureUnsupported); /* invalidates */
  assert_int_equal(cudaStreamGetCaptureInfo(s2, &st, &id, &g, NULL, NULL), cudaSuccess);
  assert_int_equal(st, cudaStreamCaptureStatusInvalidated);
  assert_null(g);
  assert_int_equal(cudaStreamEndCapture(s2, &ended), cudaErrorStreamCaptureInvalidated);
  cudaGetLastError();
  assert_int_equal(cudaGraphRetainUserObject(g2, o, 1, 0), cudaErrorInvalidResourceHandle);
  cudaGetLastError();
  usleep(10000);
  assert_int_equal(atomic_load(&d3.ran), 0); /* the caller's reference is left */
  assert_int_equal(cudaUserObjectRelease(o, 1), cudaSuccess);
  assert_true(dtor_wait(&d3));
  cudaStreamDestroy(s);
  cudaStreamDestroy(s2);
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--child") == 0) return child_main(argv[2]);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(devices),        cmocka_unit_test(contexts),
      cmocka_unit_test(sticky_errors),  cmocka_unit_test(error_strings),
      cmocka_unit_test(last_error),     cmocka_unit_test(memory),
      cmocka_unit_test(stream_order),   cmocka_unit_test(wait_event),
      cmocka_unit_test(legacy_sync),    cmocka_unit_test(host_functions_one_thread),
      cmocka_unit_test(capture_replay), cmocka_unit_test(capture_invalid_ops),
      cmocka_unit_test(capture_modes),  cmocka_unit_test(capture_fork_join),
      cmocka_unit_test(user_objects),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
