/*
 * memory.c - device memory that the host cannot touch, pinned host memory,
 * pointer attributes, and memcpy/memset.
 *
 * Each device allocation is a memfd mapped twice: PROT_NONE at the address
 * the user gets (a host dereference faults, as on a GPU), and read-write at
 * a private "host view" through which kernels, host functions (via
 * tdist_gpusim_host_view) and copies reach it. The live allocations sit in
 * an array sorted by address under g_mlock, so interior pointers are found
 * by binary search. A freed block is poisoned and both mappings unmapped;
 * a copy running on a worker pins the blocks it uses, so a concurrent
 * cudaFreeAsync on another stream unmaps them only when the copy is done.
 *
 * g_mlock is never held while gs_lock (stream.h) is taken.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "gpusim/sim.h"
#include "gpusim/stream.h"

/* The memory of one simulated device (an H100 has 80 GB). */
#define GS_DEVICE_BYTES (80ull << 30)

typedef struct {
  uintptr_t base; /* the user's address (PROT_NONE) */
  size_t size, maplen;
  char *view;   /* the host view */
  int dev;      /* the device current at allocation (stream's for Async) */
  int pins;     /* workers copying through the view right now */
  bool dead;    /* freed: out of the array, unmapped when pins is 0 */
  bool freeing; /* a cudaFreeAsync is queued */
  bool cumem;   /* made by ncclMemAlloc (cuMemCreate + cuMemMap) */
} alloc_t;

typedef struct {
  alloc_t **v;
  size_t n, cap;
} aset_t;

static pthread_mutex_t g_mlock = PTHREAD_MUTEX_INITIALIZER;
static aset_t g_dev, g_host;          /* sorted by base */
static size_t g_used[GS_MAX_DEVICES]; /* bytes mapped per device */

/* Index of the block containing p, or -1. g_mlock held. */
static ssize_t aset_find(const aset_t *s, const void *p) {
  uintptr_t a = (uintptr_t)p;
  size_t lo = 0, hi = s->n;
  while (lo < hi) { /* first base > a */
    size_t mid = (lo + hi) / 2;
    if (s->v[mid]->base <= a)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo == 0) return -1;
  alloc_t *b = s->v[lo - 1];
  return a < b->base + b->size ? (ssize_t)(lo - 1) : -1;
}

static int aset_add(aset_t *s, alloc_t *b) {
  if (s->n == s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 64;
    alloc_t **v = realloc(s->v, cap * sizeof(*v));
    if (!v) return -1;
    s->v = v;
    s->cap = cap;
  }
  size_t i = s->n;
  while (i > 0 && s->v[i - 1]->base > b->base) {
    s->v[i] = s->v[i - 1];
    i--;
  }
  s->v[i] = b;
  s->n++;
  return 0;
}

static void aset_del(aset_t *s, size_t i) {
  memmove(&s->v[i], &s->v[i + 1], (s->n - i - 1) * sizeof(*s->v));
  s->n--;
}

/* The block containing [p, p + n) whole, or NULL. g_mlock held. */
static alloc_t *dev_range(const void *p, size_t n) {
  ssize_t i = aset_find(&g_dev, p);
  if (i < 0) return NULL;
  alloc_t *b = g_dev.v[i];
  return n <= b->base + b->size - (uintptr_t)p ? b : NULL;
}

/* Poison and unmap a block out of the array (any thread, no lock needed:
 * nobody else can reach it any more). */
static void destroy(alloc_t *b) {
  memset(b->view, 0xA5, b->size);
  munmap(b->view, b->maplen);
  munmap((void *)b->base, b->maplen);
  free(b);
}

static cudaError_t dev_alloc(void **p, size_t n, int dev) {
  long page = sysconf(_SC_PAGESIZE);
  size_t maplen = (n + (size_t)page - 1) / (size_t)page * (size_t)page;
  alloc_t *b = calloc(1, sizeof(*b));
  int fd = -1;
  void *user = MAP_FAILED, *view = MAP_FAILED;
  if (!b) goto fail_nocount;
  pthread_mutex_lock(&g_mlock);
  bool room = g_used[dev] + maplen <= GS_DEVICE_BYTES;
  if (room) g_used[dev] += maplen;
  pthread_mutex_unlock(&g_mlock);
  if (!room) goto fail_nocount;
  fd = memfd_create("tdist-gpusim", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, (off_t)maplen) != 0) goto fail;
  user = mmap(NULL, maplen, PROT_NONE, MAP_SHARED, fd, 0);
  view = mmap(NULL, maplen, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (user == MAP_FAILED || view == MAP_FAILED) goto fail;
  close(fd); /* the mappings keep the memory */
  b->base = (uintptr_t)user;
  b->size = n;
  b->maplen = maplen;
  b->view = view;
  b->dev = dev;
  pthread_mutex_lock(&g_mlock);
  int rc = aset_add(&g_dev, b);
  pthread_mutex_unlock(&g_mlock);
  if (rc != 0) {
    fd = -1;
    goto fail;
  }
  *p = user;
  gs_info("cudaMalloc %zu bytes at %p on device %d", n, user, dev);
  return cudaSuccess;
fail:
  pthread_mutex_lock(&g_mlock);
  g_used[dev] -= maplen;
  pthread_mutex_unlock(&g_mlock);
fail_nocount:
  if (view != MAP_FAILED) munmap(view, maplen);
  if (user != MAP_FAILED) munmap(user, maplen);
  if (fd >= 0) close(fd);
  free(b);
  return cudaErrorMemoryAllocation;
}

/* Take block base `p` out of the lookup (it is dead from now on) and
 * unmap it unless a copy holds it. `async`: the cudaFreeAsync item. */
static cudaError_t dev_free(void *p, bool async) {
  pthread_mutex_lock(&g_mlock);
  ssize_t i = aset_find(&g_dev, p);
  alloc_t *b = i >= 0 ? g_dev.v[i] : NULL;
  if (!b || b->base != (uintptr_t)p || (b->freeing && !async)) {
    pthread_mutex_unlock(&g_mlock);
    return cudaErrorInvalidValue;
  }
  aset_del(&g_dev, (size_t)i);
  g_used[b->dev] -= b->maplen;
  b->dead = true;
  bool now = b->pins == 0;
  pthread_mutex_unlock(&g_mlock);
  if (now) destroy(b);
  return cudaSuccess;
}

void *gs_dev_access(int dev, const void *p, size_t len) {
  static char empty[1];
  pthread_mutex_lock(&g_mlock);
  alloc_t *b = dev_range(p, len);
  void *v = b && b->dev == dev ? b->view + ((uintptr_t)p - b->base) : NULL;
  if (!b && len > 0) {
    /* Page-locked host memory is mapped for every device (CUDA Programming
     * Guide, Unified Virtual Address Space: cudaMallocHost memory is
     * portable and device-accessible), so a kernel may read it. */
    ssize_t h = aset_find(&g_host, p);
    alloc_t *hb = h >= 0 ? g_host.v[h] : NULL;
    if (hb && (uintptr_t)p + len <= hb->base + hb->size) v = (void *)(uintptr_t)p;
  }
  pthread_mutex_unlock(&g_mlock);
  return v || len > 0 ? v : empty;
}

int gs_ptr_device(const void *p) {
  pthread_mutex_lock(&g_mlock);
  ssize_t i = aset_find(&g_dev, p);
  int dev = i >= 0 ? g_dev.v[i]->dev : -1;
  pthread_mutex_unlock(&g_mlock);
  return dev;
}

int gs_dev_alloc_range(const void *p, uintptr_t *base, size_t *size, int *dev, int *cumem) {
  pthread_mutex_lock(&g_mlock);
  ssize_t i = aset_find(&g_dev, p);
  if (i >= 0) {
    *base = g_dev.v[i]->base;
    *size = g_dev.v[i]->size;
    *dev = g_dev.v[i]->dev;
    *cumem = g_dev.v[i]->cumem;
  }
  pthread_mutex_unlock(&g_mlock);
  return i >= 0 ? 0 : -1;
}

GS_API void *tdist_gpusim_host_view(const void *dev_ptr) {
  pthread_mutex_lock(&g_mlock);
  ssize_t i = aset_find(&g_dev, dev_ptr);
  void *v = i >= 0 ? g_dev.v[i]->view + ((uintptr_t)dev_ptr - g_dev.v[i]->base) : NULL;
  pthread_mutex_unlock(&g_mlock);
  return v;
}

/* NCCL's ncclMemAlloc (allocator.cc, 2.19): with cuMem enabled, physical
 * memory from cuMemCreate mapped at a reserved range, the size rounded up
 * to the allocation granularity (2 MiB, an H100's recommended); NULL ptr or
 * 0 bytes fall back to cudaMalloc, whose error comes back as
 * ncclUnhandledCudaError. The block is marked cuMem: ncclCommWindowRegister
 * (register.c) needs that. */
GS_API ncclResult_t ncclMemAlloc(void **ptr, size_t size) {
  if (ptr == NULL || size == 0)
    return cudaMalloc(ptr, size) == cudaSuccess ? ncclSuccess : ncclUnhandledCudaError;
  cudaError_t e = gs_context_current();
  if (e != cudaSuccess) return ncclUnhandledCudaError;
  const size_t gran = 2u << 20;
  size_t n = (size + gran - 1) / gran * gran;
  e = dev_alloc(ptr, n, gs_current_device());
  if (e != cudaSuccess) return ncclUnhandledCudaError;
  pthread_mutex_lock(&g_mlock);
  ssize_t i = aset_find(&g_dev, *ptr);
  if (i >= 0) g_dev.v[i]->cumem = true;
  pthread_mutex_unlock(&g_mlock);
  return ncclSuccess;
}

/* ncclMemFree: unmap and release (cuMem), or cudaFree. */
GS_API ncclResult_t ncclMemFree(void *ptr) {
  if (ptr == NULL) return ncclSuccess;
  return dev_free(ptr, false) == cudaSuccess ? ncclSuccess : ncclUnhandledCudaError;
}

/* CUDA Runtime API, cudaMalloc: n == 0 gives NULL and cudaSuccess; a
 * potentially unsafe call during capture. */
GS_API cudaError_t cudaMalloc(void **p, size_t n) {
  cudaError_t e = gs_context_current();
  if (e == cudaSuccess) e = gs_capture_unsafe();
  if (e != cudaSuccess) return gs_err(e);
  if (!p) return gs_err(cudaErrorInvalidValue);
  *p = NULL;
  if (n == 0) return cudaSuccess;
  return gs_err(dev_alloc(p, n, gs_current_device()));
}

/* CUDA Runtime API, cudaFree: NULL is a no-op; anything but the start of a
 * live allocation is cudaErrorInvalidValue. cudaFree synchronises the
 * device first (CUDA Programming Guide, Implicit Synchronization). */
GS_API cudaError_t cudaFree(void *p) {
  cudaError_t e = gs_context_current();
  if (e == cudaSuccess) e = gs_capture_unsafe();
  if (e != cudaSuccess) return gs_err(e);
  if (!p) return cudaSuccess;
  int dev = gs_ptr_device(p);
  if (dev < 0) return gs_err(cudaErrorInvalidValue);
  gs_device_drain(dev);
  return gs_err(dev_free(p, false));
}

/* CUDA Runtime API, cudaMallocAsync: the memory comes from the stream's
 * device pool; the simulation hands it out at once. Memory nodes in a
 * captured graph are not modelled: refused during capture. */
GS_API cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t s) {
  cudaError_t e = gs_context_current();
  if (e != cudaSuccess) return gs_err(e);
  if (!p) return gs_err(cudaErrorInvalidValue);
  *p = NULL;
  pthread_mutex_lock(&gs_lock);
  struct CUstream_st *st = gs_stream_get_locked(s);
  int dev = st ? st->dev : -1;
  bool cap = st && st->cap;
  pthread_mutex_unlock(&gs_lock);
  if (dev < 0) return gs_err(cudaErrorInvalidResourceHandle);
  if ((e = gs_sticky(dev)) != cudaSuccess) return gs_err(e);
  if (cap) {
    gs_warn("cudaMallocAsync during stream capture is not simulated");
    return gs_err(cudaErrorStreamCaptureUnsupported);
  }
  if (n == 0) return cudaSuccess;
  return gs_err(dev_alloc(p, n, dev));
}

/* CUDA Runtime API, cudaFreeAsync: the block is freed when the stream
 * reaches the call. */
GS_API cudaError_t cudaFreeAsync(void *p, cudaStream_t s) {
  cudaError_t e = gs_context_current();
  if (e != cudaSuccess) return gs_err(e);
  pthread_mutex_lock(&g_mlock);
  ssize_t i = aset_find(&g_dev, p);
  alloc_t *b = i >= 0 ? g_dev.v[i] : NULL;
  bool ok = b && b->base == (uintptr_t)p && !b->freeing;
  if (ok) b->freeing = true;
  pthread_mutex_unlock(&g_mlock);
  if (!ok) return gs_err(cudaErrorInvalidValue);
  gs_item_t *it = gs_item_new(GS_IT_FREE);
  if (!it) {
    e = cudaErrorMemoryAllocation;
    goto fail;
  }
  it->dst = p;
  int captured = 0;
  pthread_mutex_lock(&gs_lock);
  struct CUstream_st *st = gs_stream_get_locked(s);
  if (!st)
    e = cudaErrorInvalidResourceHandle;
  else if (st->cap)
    e = cudaErrorStreamCaptureUnsupported; /* as cudaMallocAsync */
  else
    e = gs_submit_locked(st, it, &captured);
  if (e != cudaSuccess && (!st || st->cap)) free(it);
  pthread_mutex_unlock(&gs_lock);
  if (e == cudaSuccess) return cudaSuccess;
fail:
  pthread_mutex_lock(&g_mlock);
  if ((i = aset_find(&g_dev, p)) >= 0) g_dev.v[i]->freeing = false;
  pthread_mutex_unlock(&g_mlock);
  return gs_err(e);
}

/* CUDA Runtime API, cudaMallocHost: page-locked host memory (plain memory
 * here), tagged with the current device. */
GS_API cudaError_t cudaMallocHost(void **p, size_t n) {
  cudaError_t e = gs_context_current();
  if (e == cudaSuccess) e = gs_capture_unsafe();
  if (e != cudaSuccess) return gs_err(e);
  if (!p) return gs_err(cudaErrorInvalidValue);
  *p = NULL;
  if (n == 0) return cudaSuccess;
  alloc_t *b = calloc(1, sizeof(*b));
  void *m = malloc(n);
  if (!b || !m) goto fail;
  b->base = (uintptr_t)m;
  b->size = n;
  b->dev = gs_current_device();
  pthread_mutex_lock(&g_mlock);
  int rc = aset_add(&g_host, b);
  pthread_mutex_unlock(&g_mlock);
  if (rc != 0) goto fail;
  *p = m;
  return cudaSuccess;
fail:
  free(m);
  free(b);
  return gs_err(cudaErrorMemoryAllocation);
}

/* CUDA Runtime API, cudaFreeHost: only what cudaMallocHost returned. */
GS_API cudaError_t cudaFreeHost(void *p) {
  cudaError_t e = gs_context_current();
  if (e == cudaSuccess) e = gs_capture_unsafe();
  if (e != cudaSuccess) return gs_err(e);
  if (!p) return cudaSuccess;
  pthread_mutex_lock(&g_mlock);
  ssize_t i = aset_find(&g_host, p);
  alloc_t *b = i >= 0 && g_host.v[i]->base == (uintptr_t)p ? g_host.v[i] : NULL;
  if (b) aset_del(&g_host, (size_t)i);
  pthread_mutex_unlock(&g_mlock);
  if (!b) return gs_err(cudaErrorInvalidValue);
  free(p);
  free(b);
  return cudaSuccess;
}

/* CUDA Runtime API, cudaPointerGetAttributes (CUDA 11 and later): memory
 * CUDA does not know is cudaMemoryTypeUnregistered with cudaSuccess,
 * device -2, hostPointer the pointer itself. Makes a context. */
GS_API cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attr, const void *ptr) {
  cudaError_t e = gs_context_current();
  if (e != cudaSuccess) return gs_err(e);
  if (!attr) return gs_err(cudaErrorInvalidValue);
  memset(attr, 0, sizeof(*attr));
  pthread_mutex_lock(&g_mlock);
  ssize_t i = aset_find(&g_dev, ptr);
  ssize_t h = i < 0 ? aset_find(&g_host, ptr) : -1;
  if (i >= 0) {
    attr->type = cudaMemoryTypeDevice;
    attr->device = g_dev.v[i]->dev;
    attr->devicePointer = (void *)ptr;
  } else if (h >= 0) {
    attr->type = cudaMemoryTypeHost;
    attr->device = g_host.v[h]->dev;
    attr->devicePointer = (void *)ptr;
    attr->hostPointer = (void *)ptr;
  } else {
    attr->type = cudaMemoryTypeUnregistered;
    attr->device = -2;
    attr->hostPointer = (void *)ptr;
  }
  pthread_mutex_unlock(&g_mlock);
  return cudaSuccess;
}

/* Bits in a COPY item's val: which side was device memory at enqueue. */
enum { SIDE_DST = 1, SIDE_SRC = 2 };

/* 1: [p, p + n) is inside one live device block; 0: p is no device
 * memory; -1: p is device memory but the range overruns its block. */
static int classify(const void *p, size_t n) {
  pthread_mutex_lock(&g_mlock);
  int r = aset_find(&g_dev, p) < 0 ? 0 : dev_range(p, n) ? 1 : -1;
  pthread_mutex_unlock(&g_mlock);
  return r;
}

/* Checks of cudaMemcpy*: the kind must match the pointers (the runtime
 * checks device pointers at enqueue; a mismatch is refused here rather than
 * faulting on the host). cudaMemcpyDefault infers the direction (CUDA
 * Runtime API, cudaMemcpy: "requires unified virtual addressing"). */
static cudaError_t copy_item(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
                             gs_item_t **out) {
  *out = NULL;
  if ((unsigned)kind > cudaMemcpyDefault) return cudaErrorInvalidMemcpyDirection;
  if (n == 0) return cudaSuccess;
  if (!dst || !src) return cudaErrorInvalidValue;
  int d = classify(dst, n), s = classify(src, n);
  if (d < 0 || s < 0) return cudaErrorInvalidValue;
  static const int want_d[] = {0, 1, 0, 1}, want_s[] = {0, 0, 1, 1};
  if (kind != cudaMemcpyDefault && (d != want_d[kind] || s != want_s[kind]))
    return cudaErrorInvalidValue;
  gs_item_t *it = gs_item_new(GS_IT_COPY);
  if (!it) return cudaErrorMemoryAllocation;
  it->dst = dst;
  it->src = src;
  it->n = n;
  it->val = (d ? SIDE_DST : 0) | (s ? SIDE_SRC : 0);
  *out = it;
  return cudaSuccess;
}

static cudaError_t set_item(void *p, int v, size_t n, gs_item_t **out) {
  *out = NULL;
  if (n == 0) return cudaSuccess;
  if (classify(p, n) != 1) return cudaErrorInvalidValue;
  gs_item_t *it = gs_item_new(GS_IT_SET);
  if (!it) return cudaErrorMemoryAllocation;
  it->dst = p;
  it->n = n;
  it->val = v;
  *out = it;
  return cudaSuccess;
}

/* Queue `it` (may be NULL: nothing to do) on s; `sync`: then wait for it,
 * as cudaMemcpy/cudaMemset on the legacy stream. */
static cudaError_t submit(cudaStream_t s, gs_item_t *it, bool sync) {
  if (!it) return cudaSuccess;
  int captured = 0;
  pthread_mutex_lock(&gs_lock);
  struct CUstream_st *st = gs_stream_get_locked(s);
  cudaError_t e = st ? gs_submit_locked(st, it, &captured) : cudaErrorInvalidResourceHandle;
  if (!st) free(it);
  if (e == cudaSuccess && sync) st->refs++;
  pthread_mutex_unlock(&gs_lock);
  if (e != cudaSuccess || !sync) return e;
  gs_stream_drain(st);
  pthread_mutex_lock(&gs_lock);
  int dev = st->dev;
  gs_stream_unref_locked(st);
  pthread_mutex_unlock(&gs_lock);
  return gs_sticky(dev);
}

/* CUDA Runtime API, cudaMemcpyAsync. */
GS_API cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
                                   cudaStream_t s) {
  cudaError_t e = gs_context_current();
  gs_item_t *it = NULL;
  if (e == cudaSuccess) e = copy_item(dst, src, n, kind, &it);
  if (e == cudaSuccess) e = submit(s, it, false);
  return gs_err(e);
}

/* CUDA Runtime API, cudaMemcpy: synchronous, on the legacy default stream
 * (API synchronization behavior); potentially unsafe during capture. */
GS_API cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind) {
  cudaError_t e = gs_context_current();
  gs_item_t *it = NULL;
  if (e == cudaSuccess) e = gs_capture_unsafe();
  if (e == cudaSuccess) e = copy_item(dst, src, n, kind, &it);
  if (e == cudaSuccess) e = submit(cudaStreamLegacy, it, true);
  return gs_err(e);
}

/* CUDA Runtime API, cudaMemsetAsync. */
GS_API cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s) {
  cudaError_t e = gs_context_current();
  gs_item_t *it = NULL;
  if (e == cudaSuccess) e = set_item(p, v, n, &it);
  if (e == cudaSuccess) e = submit(s, it, false);
  return gs_err(e);
}

/* CUDA Runtime API, cudaMemset: synchronous on the legacy stream. */
GS_API cudaError_t cudaMemset(void *p, int v, size_t n) {
  cudaError_t e = gs_context_current();
  gs_item_t *it = NULL;
  if (e == cudaSuccess) e = gs_capture_unsafe();
  if (e == cudaSuccess) e = set_item(p, v, n, &it);
  if (e == cudaSuccess) e = submit(cudaStreamLegacy, it, true);
  return gs_err(e);
}

/* Pin the block holding [p, p + n) for a copy; NULL when it is gone. */
static alloc_t *pin(const void *p, size_t n) {
  pthread_mutex_lock(&g_mlock);
  alloc_t *b = dev_range(p, n);
  if (b) b->pins++;
  pthread_mutex_unlock(&g_mlock);
  return b;
}

static void unpin(alloc_t *b) {
  if (!b) return;
  pthread_mutex_lock(&g_mlock);
  bool gone = --b->pins == 0 && b->dead;
  pthread_mutex_unlock(&g_mlock);
  if (gone) destroy(b);
}

/* Worker thread: a COPY, SET or FREE item in its stream's turn. Device
 * memory freed since the enqueue is a fault, as a DMA to an unmapped page
 * (cudaErrorIllegalAddress). */
cudaError_t gs_mem_run(const gs_item_t *it) {
  if (it->kind == GS_IT_FREE) {
    if (dev_free(it->dst, true) != cudaSuccess) gs_warn("cudaFreeAsync(%p): not live", it->dst);
    return cudaSuccess;
  }
  bool dst_dev = it->kind == GS_IT_SET || (it->val & SIDE_DST);
  alloc_t *bd = dst_dev ? pin(it->dst, it->n) : NULL;
  alloc_t *bs = it->kind == GS_IT_COPY && (it->val & SIDE_SRC) ? pin(it->src, it->n) : NULL;
  cudaError_t e = cudaSuccess;
  if ((dst_dev && !bd) || (it->kind == GS_IT_COPY && (it->val & SIDE_SRC) && !bs)) {
    e = cudaErrorIllegalAddress;
    goto out;
  }
  char *d = dst_dev ? bd->view + ((uintptr_t)it->dst - bd->base) : it->dst;
  if (it->kind == GS_IT_SET) {
    memset(d, it->val, it->n);
  } else {
    const char *s = bs ? bs->view + ((uintptr_t)it->src - bs->base) : it->src;
    memmove(d, s, it->n);
  }
out:
  unpin(bd);
  unpin(bs);
  return e;
}
