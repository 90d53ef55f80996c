/*
 * nccl_test_util.h - helpers shared by the NCCL backend tests: a world
 * group on backend "nccl" over a real TCP store (NCCL and CUDA themselves are
 * the fake of fake_nccl.c), and log queries.
 */
#ifndef TDIST_TEST_NCCL_UTIL_H
#define TDIST_TEST_NCCL_UTIL_H

#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/init/registry.h"
#include "fake_nccl.h"
#include "mp.h"
#include "tdist/tdist.h"

/* The backend (src/nccl/nccl_comm.c). A reference from the test itself pulls
 * its objects out of the static library whatever the core's table does. */
extern const tdist_backend_t tdist__nccl_backend;
__attribute__((used)) static const tdist_backend_t *const nt_nccl_backend_ref =
    &tdist__nccl_backend;

/* Caller thread: world group of `size` ranks, this one `rank`, rank 0 hosting
 * the store on 127.0.0.1:port. */
static inline int nt_world(int rank, int size, int port, int64_t timeout_ms, tdist_group_t **g) {
  char url[64];
  snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", port);
  tdist_init_opts_t o = {0};
  o.mask = TDIST_INIT_FIELD_BACKEND | TDIST_INIT_FIELD_INIT_METHOD | TDIST_INIT_FIELD_RANK |
           TDIST_INIT_FIELD_WORLD_SIZE | TDIST_INIT_FIELD_TIMEOUT | TDIST_INIT_FIELD_HOST_STORE |
           TDIST_INIT_FIELD_DEVICE;
  o.backend = "nccl";
  o.init_method = url;
  o.rank = rank;
  o.world_size = size;
  o.timeout_ms = timeout_ms;
  o.host_store = 1;
  o.device = 0;
  return tdist_init_process_group(&o, g);
}

/* The internal stream: the first one the backend created after log index
 * `from`. */
static inline void *nt_internal_stream(int from) {
  int i = fake_find("cudaStreamCreateWithFlags", from);
  return i < 0 ? NULL : fake_log_get(i).stream;
}

/* Index of the last call named `name`, or -1. */
static inline int nt_last(const char *name) {
  int r = -1, i = -1;
  while ((i = fake_find(name, i + 1)) >= 0)
    r = i;
  return r;
}

/* The number of calls named `name` once it reaches `n`, or what it is after
 * timeout_ms: for calls made on another thread (ncclCommAbort runs on the
 * library's worker thread after an abort). */
static inline int nt_wait_count(const char *name, int n, int timeout_ms) {
  for (int waited = 0; fake_count(name) < n && waited < timeout_ms; waited++)
    usleep(1000);
  return fake_count(name);
}

/* Milliseconds on a monotonic clock. */
static inline long long nt_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

#endif
