/*
 * nccl_cfg_rank.c - one rank of the issue-42 items 3-5 job (scalable init,
 * NCCL's configuration and the high-priority stream, buffer registration),
 * launched by tdistrun:
 *
 *   TDIST_NCCL_RANKS_PER_ROOT=1 tdistrun -n N --backend nccl ./nccl_cfg_rank
 *
 * It calls only tdist and the CUDA runtime by name, so the same file runs
 * on the simulated GPU (ctest nccl_sim_cfg_tdistrun, linked with
 * libtdist_gpusim) and on a real one (tests/gpu: tdist_gpu_cfg, linked with
 * libcudart; run.sh's `step cfg`). The simulation's inspection calls are
 * weak references, used only when the program runs on the simulation.
 * Steps, each checked against a host reference, each printing a line:
 *   scalable   the world, with TDIST_NCCL_RANKS_PER_ROOT from the launcher
 *              (1: one root per rank, ncclCommInitRankScalable from N = 2);
 *              an all_reduce; on the simulation, NCCL got the expected ids
 *   knobs      a group with min/max CTAs, cgaClusterSize, netName "Socket"
 *              (built into every NCCL), high priority, a split of it with
 *              splitShare; all_reduce in each; on the simulation, the values
 *              NCCL holds and the kernels' stream priority (the device's
 *              greatest, from cudaDeviceGetStreamPriorityRange)
 *   register   a cudaMalloc buffer registered (ncclCommRegister), an
 *              all_reduce in it, deregistered
 *   window     tdist_mem_alloc (ncclMemAlloc) memory as a symmetric window,
 *              an all_reduce in it, deregistered; NCCL before 2.27 says
 *              NOT_SUPPORTED (printed as skipped)
 * Exit 0 when every step passed; prints "rank R: ok".
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nccl_rank_util.h"

/* The simulation's inspection calls (tdist/gpusim.h), NULL elsewhere. */
extern int tdist_gpusim_comm_roots(const char *name) __attribute__((weak));
extern int tdist_gpusim_comm_config(const char *name, int *min_ctas, int *max_ctas,
                                    int *cga_cluster_size, int *split_share, int *traffic_class,
                                    char *net_name, size_t net_name_len, int *stream_priority)
    __attribute__((weak));

enum { N = 1024 };

/* all_reduce of int32 (r * 3 + i % 7) in d (N elements), checked. */
static int sum_in(tdist_group_t *g, int32_t *d) {
  int n = tdist_group_size(g), r = tdist_group_rank(g);
  int32_t h[N];
  for (int i = 0; i < N; i++)
    h[i] = r * 3 + i % 7;
  CHECK(cudaMemcpy(d, h, sizeof(h), cudaMemcpyHostToDevice) == cudaSuccess);
  CHECK(tdist_all_reduce(g, d, d, N, TDIST_INT32, TDIST_SUM, NULL, NULL) == 0);
  CHECK(cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost) == cudaSuccess);
  for (int i = 0; i < N; i++)
    CHECK(h[i] == 3 * n * (n - 1) / 2 + n * (i % 7));
  return 0;
}

static int sum(tdist_group_t *g) {
  int32_t *d = NULL;
  CHECK(cudaMalloc((void **)&d, N * sizeof(int32_t)) == cudaSuccess);
  int rc = sum_in(g, d);
  cudaFree(d);
  return rc;
}

static int scalable(tdist_group_t *w) {
  CHECK(sum(w) == 0);
  if (tdist_gpusim_comm_roots) {
    const char *e = getenv("TDIST_NCCL_RANKS_PER_ROOT");
    int per = e ? atoi(e) : 128;
    int want = per >= 1 && size > per ? (size + per - 1) / per : 1;
    CHECK(tdist_gpusim_comm_roots("world") == want);
  }
  printf("rank %d: scalable ok (%d ranks, TDIST_NCCL_RANKS_PER_ROOT=%s)\n", rank, size,
         getenv("TDIST_NCCL_RANKS_PER_ROOT") ? getenv("TDIST_NCCL_RANKS_PER_ROOT") : "unset");
  return 0;
}

static int knobs(tdist_group_t *w) {
  tdist_nccl_opts_t k = {0};
  k.mask = TDIST_NCCL_FIELD_MIN_CTAS | TDIST_NCCL_FIELD_MAX_CTAS |
           TDIST_NCCL_FIELD_CGA_CLUSTER_SIZE | TDIST_NCCL_FIELD_NET_NAME |
           TDIST_NCCL_FIELD_HIGH_PRIORITY;
  k.min_ctas = 2;
  k.max_ctas = 8;
  k.cga_cluster_size = 2;
  k.net_name = "Socket";
  k.high_priority = 1;
  int *all = malloc(sizeof(int) * (size_t)size);
  CHECK(all);
  for (int i = 0; i < size; i++)
    all[i] = i;
  tdist_group_opts_t o = {0};
  o.mask = TDIST_GROUP_FIELD_NAME | TDIST_GROUP_FIELD_NCCL;
  o.name = "knobs";
  o.nccl = &k;
  tdist_group_t *g = NULL, *s = NULL;
  CHECK(tdist_new_group(w, all, size, &o, &g) == 0);
  CHECK(sum(g) == 0);
  tdist_nccl_opts_t k2 = {0};
  k2.mask = TDIST_NCCL_FIELD_SPLIT_SHARE;
  k2.split_share = 1;
  o.name = "knobs/share";
  o.nccl = &k2;
  CHECK(tdist_new_group(g, all, size, &o, &s) == 0);
  CHECK(sum(s) == 0);
  if (tdist_gpusim_comm_config) {
    int mi = 0, ma = 0, cga = 0, sh = -1, tc = 0, prio = 1, least = 0, greatest = 0;
    char net[32];
    CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest) == cudaSuccess);
    CHECK(tdist_gpusim_comm_config("knobs", &mi, &ma, &cga, &sh, &tc, net, sizeof(net), &prio) ==
          0);
    CHECK(mi == 2 && ma == 8 && cga == 2 && sh == 0 && !strcmp(net, "Socket") && prio == greatest);
    CHECK(tdist_gpusim_comm_config("knobs/share", &mi, &ma, &cga, &sh, &tc, net, sizeof(net),
                                   &prio) == 0);
    CHECK(mi == 2 && ma == 8 && sh == 1 && prio == greatest);
  }
  CHECK(tdist_group_destroy(s) == 0);
  CHECK(tdist_group_destroy(g) == 0);
  free(all);
  printf("rank %d: knobs ok\n", rank);
  return 0;
}

static int reg(tdist_group_t *w) {
  int32_t *d = NULL;
  CHECK(cudaMalloc((void **)&d, N * sizeof(int32_t)) == cudaSuccess);
  tdist_mem_t *m = NULL;
  int rc = tdist_mem_register(w, d, N * sizeof(int32_t), TDIST_MEM_REGISTER_LOCAL, &m);
  if (rc == TDIST_ERR_NOT_SUPPORTED) {
    printf("rank %d: register skipped: %s\n", rank, tdist_last_error());
    cudaFree(d);
    return 0;
  }
  CHECK(rc == 0);
  CHECK(sum_in(w, d) == 0);
  CHECK(tdist_mem_deregister(w, m) == 0);
  cudaFree(d);
  printf("rank %d: register ok\n", rank);
  return 0;
}

static int window(tdist_group_t *w) {
  int32_t *d = NULL;
  int rc = tdist_mem_alloc(w, N * sizeof(int32_t), (void **)&d);
  if (rc == TDIST_ERR_NOT_SUPPORTED) {
    printf("rank %d: window skipped: %s\n", rank, tdist_last_error());
    return 0;
  }
  CHECK(rc == 0);
  tdist_mem_t *m = NULL;
  rc = tdist_mem_register(w, d, N * sizeof(int32_t), TDIST_MEM_REGISTER_WINDOW, &m);
  if (rc == TDIST_ERR_NOT_SUPPORTED) {
    printf("rank %d: window skipped: %s\n", rank, tdist_last_error());
    tdist_mem_free(w, d);
    return 0;
  }
  CHECK(rc == 0);
  CHECK(sum_in(w, d) == 0);
  CHECK(tdist_mem_deregister(w, m) == 0);
  CHECK(tdist_mem_free(w, d) == 0);
  printf("rank %d: window ok\n", rank);
  return 0;
}

int main(void) {
  tdist_group_t *w = NULL;
  if (rank_start(&w) != 0) return 1;
  int rc = scalable(w);
  if (rc == 0) rc = knobs(w);
  if (rc == 0) rc = reg(w);
  if (rc == 0) rc = window(w);
  if (tdist_group_destroy(w) != 0 && rc == 0) rc = 1;
  if (rc == 0) printf("rank %d: ok\n", rank);
  return rc;
}
