/*
 * nccl_rank_util.h - what the NCCL backend's tdistrun rank programs share:
 * nccl_sim_rank.c, nccl_graph_rank.c, nccl_sim_p2p_rank.c and
 * nccl_cfg_rank.c, which ctest runs on the simulated GPU and
 * tests/gpu/CMakeLists.txt links with the real CUDA runtime for the GPU
 * check (tdist_gpu_rank, _graph, _p2p, _cfg). So only the CUDA runtime by
 * name (gpusim/api.h declares it) and tdist: no simulation-only call.
 *
 * One header per program (static state): include it once, from main's file.
 */
#ifndef TDIST_NCCL_RANK_UTIL_H
#define TDIST_NCCL_RANK_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpusim/api.h"
#include "tdist/tdist.h"

/* This process's rank and the world's size, once rank_start returned 0. */
static int rank = -1, size;

/* A failed check: say where and why (tdist's last error), fail the step. */
#define CHECK(c)                                                                               \
  do {                                                                                         \
    if (!(c)) {                                                                                \
      fprintf(stderr, "rank %d: %s:%d: check failed: %s (%s)\n", rank, __FILE__, __LINE__, #c, \
              tdist_last_error());                                                             \
      return 1;                                                                                \
    }                                                                                          \
  } while (0)

/* As a torch program calls torch.cuda.set_device(local_rank): this thread's
 * buffers on the device the backend picks for the group (LOCAL_RANK modulo
 * the visible devices); then the world from the launcher's environment.
 * 0, or 1 after printing why ("no device", "init: ..."). */
static int rank_start(tdist_group_t **w) {
  int ndev = 0;
  const char *lr = getenv("LOCAL_RANK");
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1 ||
      cudaSetDevice(lr ? atoi(lr) % ndev : 0) != cudaSuccess) {
    fprintf(stderr, "no device\n");
    return 1;
  }
  if (tdist_init_process_group(NULL, w) != 0) {
    fprintf(stderr, "init: %s\n", tdist_last_error());
    return 1;
  }
  rank = tdist_group_rank(*w);
  size = tdist_group_size(*w);
  return 0;
}

#endif
