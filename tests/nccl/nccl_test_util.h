/*
 * nccl_test_util.h - helpers shared by the wrapped NCCL backend tests: a world
 * group on backend "nccl" over a real TCP store (NCCL and CUDA themselves are
 * the fake of fake_nccl.c), and log queries.
 */
#ifndef TDIST_TEST_NCCL_UTIL_H
#define TDIST_TEST_NCCL_UTIL_H

#include <string.h>

#include "core/backend.h"
#include "fake_nccl.h"
#include "mp.h"
#include "tdist/tdist.h"

/* core/backend.c refers to the backend weakly, which does not pull its
 * objects out of the static library: this strong reference does. */
__attribute__((used)) static const tdist__backend_ops_t *const nt_nccl_backend_ref =
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

#endif
