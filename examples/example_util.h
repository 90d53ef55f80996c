/*
 * example_util.h - the error handling every tdist program needs, shared by
 * the examples (overlap.c, mesh.c, pipeline.c).
 *
 * Two kinds of failure:
 *  - a call fails synchronously (bad argument, rendezvous timeout, aborted
 *    group): it returns a negative code and tdist_last_error() says why;
 *  - an operation fails after submission (a peer died, a timeout, ranks that
 *    disagree): the work handle's status is negative and
 *    tdist_work_error_message() says which op, group and rank, and why.
 * Either way a real program cannot go on with a half-done collective: it
 * aborts the world group (the other ranks' ops then fail fast instead of
 * waiting for their timeout) and exits non-zero, and tdistrun stops the job.
 */
#ifndef TDIST_EXAMPLE_UTIL_H
#define TDIST_EXAMPLE_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "tdist/tdist.h"

/* The world group, so that a failure anywhere can abort it. */
static tdist_group_t *ex_world;

static inline void ex_die(const char *what, int rc, const char *detail) {
  fprintf(stderr, "error: %s: %s (%s)\n", what, tdist_err_name(rc), detail);
  if (ex_world) tdist_group_abort(ex_world, what); /* peers fail fast */
  exit(1);
}

/* EX_CHECK(call): a synchronous call must return 0. */
#define EX_CHECK(call)                                          \
  do {                                                          \
    int ex_rc_ = (call);                                        \
    if (ex_rc_ != 0) ex_die(#call, ex_rc_, tdist_last_error()); \
  } while (0)

/* Wait for a work handle (bounded by the op's own timeout), release it, and
 * die with the op's own error message if it failed. */
static inline void ex_wait(tdist_work_t *w, const char *what) {
  int rc = tdist_work_wait(w, 0);
  if (rc != 0) ex_die(what, rc, tdist_work_error_message(w));
  tdist_work_release(w);
}

/* Join the job started by tdistrun (RANK, WORLD_SIZE, MASTER_ADDR, ... come
 * from the environment; the backend from --backend / TDIST_BACKEND). */
static inline tdist_group_t *ex_init(void) {
  EX_CHECK(tdist_init_process_group(NULL, &ex_world));
  return ex_world;
}

/* ---- buffers a group's backend can move -----------------------------------------
 * A CPU group moves host memory; an NCCL group moves CUDA device memory of
 * its device (the backend's default: LOCAL_RANK modulo the devices seen).
 * The examples stay buildable and runnable without CUDA: the runtime is
 * opened only when the group's backend is "nccl", from TDIST_CUDART_LIBRARY
 * (the simulated GPU in tests) or libcudart.so, as tdist itself does. Only
 * the few calls below are used, declared here by their documented
 * signatures (int for cudaError_t, 1 and 2 for cudaMemcpyHostToDevice and
 * cudaMemcpyDeviceToHost). */
#include <dlfcn.h>
#include <string.h>

static struct {
  int on; /* 1: device memory through the runtime below */
  int (*malloc_)(void **, size_t);
  int (*free_)(void *);
  int (*memcpy_)(void *, const void *, size_t, int);
} ex_mem;

/* Call once after ex_init: device buffers when `g` is an NCCL group. */
static inline void ex_mem_init(tdist_group_t *g) {
  const char *b = tdist_group_backend(g);
  if (!b || strcmp(b, "nccl") != 0) return;
  const char *path = getenv("TDIST_CUDART_LIBRARY");
  void *h = dlopen(path && *path ? path : "libcudart.so", RTLD_NOW | RTLD_GLOBAL);
  if (!h && !(path && *path)) h = dlopen("libcudart.so.12", RTLD_NOW | RTLD_GLOBAL);
  if (!h) ex_die("dlopen(CUDA runtime)", TDIST_ERR_NOT_SUPPORTED, dlerror());
  int (*count)(int *) = (int (*)(int *))dlsym(h, "cudaGetDeviceCount");
  int (*set)(int) = (int (*)(int))dlsym(h, "cudaSetDevice");
  ex_mem.malloc_ = (int (*)(void **, size_t))dlsym(h, "cudaMalloc");
  ex_mem.free_ = (int (*)(void *))dlsym(h, "cudaFree");
  ex_mem.memcpy_ = (int (*)(void *, const void *, size_t, int))dlsym(h, "cudaMemcpy");
  if (!count || !set || !ex_mem.malloc_ || !ex_mem.free_ || !ex_mem.memcpy_)
    ex_die("dlsym(CUDA runtime)", TDIST_ERR_NOT_SUPPORTED, "a runtime call is missing");
  /* The group's device, as the backend picked it (LOCAL_RANK modulo the
   * devices), current for this thread's allocations. */
  int n = 0;
  const char *lr = getenv("LOCAL_RANK");
  if (count(&n) != 0 || n < 1 || set(lr ? atoi(lr) % n : 0) != 0)
    ex_die("cudaSetDevice", TDIST_ERR_CUDA_ERROR, "no CUDA device");
  ex_mem.on = 1;
}

/* n bytes the group can move (dies on failure). */
static inline void *ex_alloc(size_t n) {
  void *p = NULL;
  if (ex_mem.on ? ex_mem.malloc_(&p, n) != 0 : (p = malloc(n)) == NULL)
    ex_die("allocating a buffer", TDIST_ERR_NO_MEMORY, ex_mem.on ? "cudaMalloc" : "malloc");
  return p;
}

static inline void ex_free(void *p) {
  if (ex_mem.on)
    ex_mem.free_(p);
  else
    free(p);
}

/* Copy between host memory and a buffer of ex_alloc (dir 1: to it, 2: from it). */
static inline void ex_copy(void *dst, const void *src, size_t n, int dir) {
  if (!ex_mem.on) {
    if (dst != src) memcpy(dst, src, n);
  } else if (ex_mem.memcpy_(dst, src, n, dir) != 0)
    ex_die("cudaMemcpy", TDIST_ERR_CUDA_ERROR, "copy failed");
}
#define EX_TO_DEV 1
#define EX_TO_HOST 2

static inline double ex_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#endif
