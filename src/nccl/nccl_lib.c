/*
 * nccl_lib.c - opening NCCL and the CUDA runtime at run time (caller thread).
 *
 * libtdist is linked against neither: a CPU-only user needs nothing of CUDA,
 * and the same library runs on GPU machines. The first init of a group on
 * backend "nccl" calls tdist__nccl_load, which
 *   1. dlopens the CUDA runtime: TDIST_CUDART_LIBRARY, else by soname
 *      libcudart.so.13, libcudart.so.12, then libcudart.so;
 *   2. dlopens NCCL: TDIST_NCCL_LIBRARY, else libnccl.so.2;
 *   3. reads ncclGetVersion and refuses a release older than
 *      TDIST__NCCL_MIN_VERSION (nccl_backend.h says why 2.18);
 *   4. looks up every required call (a missing one fails the load) and each
 *      newer call on its own (TDIST__NCCL_OPTIONAL: a missing one stays NULL
 *      and fails only the call that needs it, tdist__nccl_missing).
 * The outcome (success, or the failure's code and message) is kept for the
 * life of the process; the libraries are never closed. Settings are read
 * through util/param.h.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "nccl/nccl_backend.h"
#include "util/memkind.h"
#include "util/param.h"

tdist__nccl_api_t tdist__nccl_fn;

static pthread_mutex_t load_mu = PTHREAD_MUTEX_INITIALIZER;
static int load_state; /* (load_mu) 0 not tried, 1 loaded, -1 failed */
static int load_rc;
static char load_msg[512];

#define FAIL(...)                                      \
  do {                                                 \
    snprintf(load_msg, sizeof(load_msg), __VA_ARGS__); \
    return TDIST_ERR_NOT_SUPPORTED;                    \
  } while (0)

/* dlopen's reason, shortened to what follows the file name when it repeats
 * it ("libx.so: cannot open shared object file: ..."). */
static const char *dl_reason(void) {
  const char *e = dlerror();
  return e ? e : "unknown reason";
}

static int open_cudart(void **h, const char **used) {
  static const char *const names[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so"};
  const char *env = tdist__param_str("TDIST_CUDART_LIBRARY", NULL);
  if (env) {
    *h = dlopen(env, RTLD_NOW | RTLD_LOCAL);
    if (!*h)
      FAIL("backend 'nccl': the CUDA runtime %s (TDIST_CUDART_LIBRARY) cannot be loaded: %s; "
           "fix TDIST_CUDART_LIBRARY or use --backend cpu",
           env, dl_reason());
    *used = env;
    return 0;
  }
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
    *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (*h) {
      *used = names[i];
      return 0;
    }
  }
  FAIL("backend 'nccl': the CUDA runtime (libcudart.so.13 or .12) not found; set "
       "TDIST_CUDART_LIBRARY or use --backend cpu");
}

static int open_nccl(void **h, const char **used) {
  const char *env = tdist__param_str("TDIST_NCCL_LIBRARY", NULL);
  const char *name = env ? env : "libnccl.so.2";
  *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (!*h) {
    const char *why = dl_reason();
    if (env)
      FAIL("backend 'nccl': %s (TDIST_NCCL_LIBRARY) not found or not loadable (%s); fix "
           "TDIST_NCCL_LIBRARY or use --backend cpu",
           env, why);
    FAIL("backend 'nccl': libnccl.so.2 not found; set TDIST_NCCL_LIBRARY or use --backend cpu");
  }
  *used = name;
  return 0;
}

/* The driver's cuDevicePrimaryCtxGetState: from the runtime's own handle
 * (a simulated device exports it there), else libcuda.so.1 (or
 * TDIST_CUDA_DRIVER_LIBRARY). NULL when neither has it. */
static tdist__cuDevicePrimaryCtxGetState_fn open_driver_call(void *cu) {
  tdist__cuDevicePrimaryCtxGetState_fn f = NULL;
  *(void **)(&f) = dlsym(cu, "cuDevicePrimaryCtxGetState");
  if (f) return f;
  void *h =
      dlopen(tdist__param_str("TDIST_CUDA_DRIVER_LIBRARY", "libcuda.so.1"), RTLD_NOW | RTLD_LOCAL);
  if (h) *(void **)(&f) = dlsym(h, "cuDevicePrimaryCtxGetState");
  if (!f) dlerror(); /* clear it: not an error */
  return f;
}

static void version_str(int code, char *out, size_t n) {
  /* 2.9 and later: major*10000 + minor*100 + patch; before: major*1000 + ... */
  if (code >= 10000)
    snprintf(out, n, "%d.%d.%d", code / 10000, code / 100 % 100, code % 100);
  else
    snprintf(out, n, "%d.%d.%d", code / 1000, code / 100 % 10, code % 100);
}

static int load_locked(void) {
  void *cu = NULL, *nc = NULL;
  const char *cu_name = NULL, *nc_name = NULL;
  tdist__nccl_api_t a;
  memset(&a, 0, sizeof(a));
  int rc = open_cudart(&cu, &cu_name);
  if (rc) return rc;
  rc = open_nccl(&nc, &nc_name);
  if (rc) return rc;

    /* Function pointers from dlsym: POSIX guarantees the conversion. */
#define LOOKUP_(h, lib, name)                                                          \
  do {                                                                                 \
    *(void **)(&a.name) = dlsym(h, #name);                                             \
    if (!a.name)                                                                       \
      FAIL("backend 'nccl': %s (%s) has no %s; use a newer one or --backend cpu", lib, \
           h == nc ? a.version_str : "CUDA runtime", #name);                           \
  } while (0);
  tdist__ncclGetVersion_fn get_version;
  *(void **)(&get_version) = dlsym(nc, "ncclGetVersion");
  if (!get_version)
    FAIL("backend 'nccl': %s is not an NCCL library (no ncclGetVersion); fix "
         "TDIST_NCCL_LIBRARY or use --backend cpu",
         nc_name);
  int v = 0;
  if (get_version(&v) != ncclSuccess || v <= 0)
    FAIL("backend 'nccl': ncclGetVersion of %s failed", nc_name);
  a.version = v;
  version_str(v, a.version_str, sizeof(a.version_str));
  if (v < TDIST__NCCL_MIN_VERSION)
    FAIL("backend 'nccl': %s is NCCL %s; tdist needs NCCL 2.18.0 or newer (set "
         "TDIST_NCCL_LIBRARY or use --backend cpu)",
         nc_name, a.version_str);
#define REQ_NCCL_(name) LOOKUP_(nc, nc_name, name)
#define REQ_CUDA_(name) LOOKUP_(cu, cu_name, name)
#define OPT_NCCL_(name, maj, min) *(void **)(&a.name) = dlsym(nc, #name);
#define OPT_CUDA_(name) *(void **)(&a.name) = dlsym(cu, #name);
  TDIST__NCCL_REQUIRED(REQ_NCCL_)
  TDIST__CUDART_REQUIRED(REQ_CUDA_)
  TDIST__NCCL_OPTIONAL(OPT_NCCL_)
  TDIST__CUDART_OPTIONAL(OPT_CUDA_)
  /* One capture query by its signature (nccl_api.h): _v3 where the runtime
   * has it (12.3 to 12.x), the plain name from CUDA 13 (whose libcudart.so.13
   * exports neither _v2 nor _v3, and whose plain name has _v3's seven
   * arguments: called with 12's six, it wrote through a stack word and the
   * H200's graph step died of SIGSEGV), else 12's. The runtime's version
   * says which the plain name is. */
  int cuv = 0;
  tdist__cudaRuntimeGetVersion_fn cu_version;
  *(void **)(&cu_version) = dlsym(cu, "cudaRuntimeGetVersion");
  if (cu_version && cu_version(&cuv) != cudaSuccess) cuv = 0;
  *(void **)(&a.cudaStreamGetCaptureInfo_v3) = dlsym(cu, "cudaStreamGetCaptureInfo_v3");
  if (!a.cudaStreamGetCaptureInfo_v3 && cuv >= 13000)
    *(void **)(&a.cudaStreamGetCaptureInfo_v3) = dlsym(cu, "cudaStreamGetCaptureInfo");
  if (!a.cudaStreamGetCaptureInfo_v3) {
    *(void **)(&a.cudaStreamGetCaptureInfo) = dlsym(cu, "cudaStreamGetCaptureInfo_v2");
    if (!a.cudaStreamGetCaptureInfo && cuv > 0 && cuv < 13000)
      *(void **)(&a.cudaStreamGetCaptureInfo) = dlsym(cu, "cudaStreamGetCaptureInfo");
  }
  dlerror(); /* a missing optional call is no error */
  a.cuDevicePrimaryCtxGetState = open_driver_call(cu);
#undef REQ_NCCL_
#undef REQ_CUDA_
#undef OPT_NCCL_
#undef OPT_CUDA_
#undef LOOKUP_
  tdist__nccl_fn = a;
  TDIST_INFO(NCCL, "loaded NCCL %s from %s and the CUDA runtime from %s", a.version_str, nc_name,
             cu_name);
  return 0;
}

int tdist__nccl_load(void) {
  pthread_mutex_lock(&load_mu);
  if (load_state == 0) {
    load_rc = load_locked();
    load_state = load_rc == 0 ? 1 : -1;
    /* From now on opcheck.c can tell device pointers given to CPU groups. */
    if (load_rc == 0) tdist__memkind_set(tdist__nccl_memkind);
    if (load_rc) TDIST_WARN(NCCL, "%s", load_msg);
  }
  int rc = load_rc;
  pthread_mutex_unlock(&load_mu);
  if (rc) return tdist__error(rc, "%s", load_msg);
  return 0;
}

int tdist__nccl_missing(const char *what, const char *fn, int maj, int min) {
  return tdist__error(TDIST_ERR_NOT_SUPPORTED,
                      "backend 'nccl': %s needs %s, which NCCL %d.%d.0 added; the loaded NCCL is "
                      "%s",
                      what, fn, maj, min, tdist__nccl_fn.version_str);
}
