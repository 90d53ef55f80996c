/*
 * alltoallv_bench.c - all_to_all_v of the CPU backend with a skewed split
 * (zipf_split.h: the token dispatch of an expert-parallel MoE layer, one
 * expert per rank, a few experts hot), launched like the peers in
 * ../shared/peers: this program forks N ranks on 127.0.0.1 (rank 0 hosts
 * the store) and rank 0 reports.
 *
 *   tdist_bench_alltoallv -n N [-T budget_s] [-P] [-t tag] [-m min_bytes] [-b max_bytes]
 *
 * bytes = what each rank sends per call (float32), split over the ranks by
 * zipf_split; every rank sends the same split, so rank 0 (the hottest
 * expert) receives the most. Sizes 1 KiB .. 64 MiB. Iteration policy as the
 * other benches (warmup per size, rank 0 picks iters = clamp(budget /
 * warmup_avg, lo, hi) and broadcasts it, a barrier before the timed loop,
 * one correctness check per size). Output: with -P one `peer=tdist
 * op=alltoallv_zipf n= bytes= us= algbw= busbw= p50_us= iters=` line per
 * size (algbw = bytes/t, busbw = algbw (n-1)/n as nccl-tests' alltoall);
 * otherwise a table. The Open MPI peer (peers.d/mpi_alltoallv.c) measures
 * MPI_Alltoallv with the same split and prints the same line.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mp.h"
#include "tdist/tdist.h"
#include "zipf_split.h"

static const size_t kSizes[] = {1024, 65536, 1048576, 16777216, 67108864};
static double g_budget = 0.3;
static int g_peers = 0;
static char g_tag[32] = "tdist";
static size_t g_max = 67108864;
static size_t g_min = 0;

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static void warm_for(size_t bytes, int *warm, int *lo, int *hi) {
  if (bytes <= 1024)
    *warm = 50, *lo = 20, *hi = 2000;
  else if (bytes <= (64 << 10))
    *warm = 20, *lo = 20, *hi = 1000;
  else if (bytes <= (1 << 20))
    *warm = 5, *lo = 10, *hi = 200;
  else
    *warm = 1, *lo = 3, *hi = 20;
}

static int cmpd(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static int rank_main(int rank, int n, void *arg) {
  char method[64];
  tdist_init_opts_t o = {0};
  o.mask = TDIST_INIT_FIELD_BACKEND;
  o.backend = "cpu";
  if (arg) {
    snprintf(method, sizeof(method), "tcp://127.0.0.1:%d", *(int *)arg);
    o.mask |= TDIST_INIT_FIELD_INIT_METHOD | TDIST_INIT_FIELD_RANK | TDIST_INIT_FIELD_WORLD_SIZE |
              TDIST_INIT_FIELD_HOST_STORE;
    o.init_method = method;
    o.rank = rank;
    o.world_size = n;
    o.host_store = 1;
  }
  tdist_group_t *g = NULL;
  MP_CHECK_RC(tdist_init_process_group(&o, &g));
  rank = tdist_group_rank(g);
  n = tdist_group_size(g);
  if (n > 256) return 1;
  if (rank == 0 && !g_peers)
    printf("# tdist cpu backend, all_to_all_v with a Zipf-like split, n=%d, budget %.2fs\n"
           "%12s %12s %12s %11s %7s %7s %11s %6s\n",
           n, g_budget, "bytes/rank", "max recv(B)", "min recv(B)", "time(us)", "algbw", "busbw",
           "p50(us)", "iters");
  /* Written now, not by the timed loop (a page fault every 512 ops).
   * Not calloc: the compiler drops a zero memset of calloc'd memory, and
   * calloc need not write fresh pages. */
  double *lat = malloc(sizeof(double) * 4000);
  for (int i = 0; lat && i < 4000; i++)
    lat[i] = -1;
  size_t sc[256], rc[256];
  int failures = 0;
  for (size_t si = 0; si < sizeof(kSizes) / sizeof(kSizes[0]); si++) {
    size_t bytes = kSizes[si], total = bytes / 4, rtotal = 0;
    if (bytes > g_max || bytes < g_min) continue;
    zipf_split(total, n, sc);
    for (int i = 0; i < n; i++)
      rtotal += rc[i] = sc[rank];
    float *sb = malloc(total * 4 + 4), *rb = malloc(rtotal * 4 + 4);
    size_t off = 0;
    for (int j = 0; j < n; j++)
      for (size_t e = 0; e < sc[j]; e++)
        sb[off++] = (float)(rank * 1000 + j);
    MP_CHECK_RC(tdist_all_to_all_v(g, sb, sc, NULL, rb, rc, NULL, TDIST_FLOAT32, NULL, NULL));
    off = 0;
    for (int i = 0; i < n; i++)
      for (size_t e = 0; e < rc[i]; e++)
        if (rb[off++] != (float)(i * 1000 + rank)) failures++;
    if (failures) fprintf(stderr, "tdist rank %d: WRONG RESULT bytes=%zu\n", rank, bytes);
    int warm, lo, hi;
    warm_for(bytes, &warm, &lo, &hi);
    double w = now_us();
    for (int i = 0; i < warm; i++)
      MP_CHECK_RC(tdist_all_to_all_v(g, sb, sc, NULL, rb, rc, NULL, TDIST_FLOAT32, NULL, NULL));
    int32_t iters = (int32_t)(g_budget * 1e6 / ((now_us() - w) / warm + 1e-9));
    iters = iters < lo ? lo : iters > hi ? hi : iters;
    MP_CHECK_RC(tdist_broadcast(g, &iters, 1, TDIST_INT32, 0, NULL, NULL));
    MP_CHECK_RC(tdist_barrier(g, NULL, NULL));
    double s = now_us();
    for (int i = 0; i < iters; i++) {
      double a = now_us();
      MP_CHECK_RC(tdist_all_to_all_v(g, sb, sc, NULL, rb, rc, NULL, TDIST_FLOAT32, NULL, NULL));
      lat[i] = now_us() - a;
    }
    double us = (now_us() - s) / iters;
    qsort(lat, (size_t)iters, sizeof(double), cmpd);
    if (rank == 0) {
      double algbw = (double)bytes / (us * 1e-6) / 1e9, busbw = algbw * (n - 1) / n;
      if (g_peers)
        printf("peer=%s op=alltoallv_zipf n=%d bytes=%zu us=%.2f algbw=%.3f busbw=%.3f "
               "p50_us=%.2f iters=%d\n",
               g_tag, n, bytes, us, algbw, busbw, lat[iters / 2], iters);
      else
        printf("%12zu %12zu %12zu %11.2f %7.3f %7.3f %11.2f %6d\n", bytes, sc[0] * 4 * n,
               sc[n - 1] * 4 * n, us, algbw, busbw, lat[iters / 2], iters);
      fflush(stdout);
    }
    MP_CHECK_RC(tdist_barrier(g, NULL, NULL));
    free(sb);
    free(rb);
  }
  free(lat);
  tdist_group_destroy(g);
  return failures ? 1 : 0;
}

int main(int argc, char **argv) {
  int n = 2, c;
  while ((c = getopt(argc, argv, "n:T:Pb:m:t:")) != -1) {
    if (c == 'n')
      n = atoi(optarg);
    else if (c == 'T')
      g_budget = atof(optarg);
    else if (c == 'P')
      g_peers = 1;
    else if (c == 'b')
      g_max = (size_t)atoll(optarg);
    else if (c == 'm')
      g_min = (size_t)atoll(optarg);
    else if (c == 't')
      snprintf(g_tag, sizeof(g_tag), "%s", optarg);
    else {
      fprintf(stderr, "usage: %s -n N [-T budget_s] [-P] [-t tag] [-m min_bytes] [-b max_bytes]\n",
              argv[0]);
      return 2;
    }
  }
  if (getenv("RANK") && getenv("WORLD_SIZE")) return rank_main(0, 0, NULL);
  int port = tdist_mp_free_port();
  char lws[16];
  snprintf(lws, sizeof(lws), "%d", n);
  setenv("LOCAL_WORLD_SIZE", lws, 0);
  return tdist_mp_run(n, rank_main, &port, 3600) ? 1 : 0;
}
