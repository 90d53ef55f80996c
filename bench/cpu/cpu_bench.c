/*
 * cpu_bench.c - collective benchmark of the CPU backend, launched like the
 * peers in ../shared/peers (Gloo, Open MPI): this program forks N ranks on
 * 127.0.0.1 (rank 0 hosts the store), and rank 0 reports.
 *
 *   tdist_bench_cpu -n N [-T budget_s] [-o op,op,...|all] [-P] [-t tag] [-m min_bytes]
 *                   [-b max_bytes] [-I]
 *
 * -I: one line: the world's creation time and the first two 8-byte all_reduces
 * after it (max over ranks), to compare TDIST_CPU_CONNECT=eager and lazy.
 *
 * Under a launcher (RANK and WORLD_SIZE set, e.g. `tdistrun -n 4
 * tdist_bench_cpu`), -n is ignored and this process is one rank (env://).
 *
 * Ops: allreduce (in-place float32 sum), broadcast, allgather, barrier,
 * reduce, reduce_scatter, alltoall, gather, scatter. Sizes: 8 B, 1 KiB,
 * 64 KiB, 1 MiB, 16 MiB, 64 MiB of float32 (per-rank input for allgather,
 * like the peers). Iteration policy as gloo_bench/mpi_bench: a fixed warmup
 * per size, then rank 0 sets iters = clamp(budget / warmup_avg, lo, hi) and
 * broadcasts it; a barrier before the timed loop; each (op, size) is checked
 * once for correctness.
 *
 * Output: with -P one `peer=tdist op=.. n= bytes= us= algbw= busbw= p50_us=
 * iters=` line per point (the peers harness format); otherwise an
 * nccl-tests style table: size count type redop time(us) algbw busbw p50.
 * busbw: x 2(n-1)/n for allreduce, (n-1)/n for allgather, reduce_scatter and
 * alltoall, 1 otherwise (nccl-tests). TDIST_BENCH_TAIL=1 adds, per rank on
 * stderr, the percentiles above p50 and the share of the time spent in the
 * slowest 1% (where a mean far above its p50 comes from);
 * TDIST_BENCH_SLOW_US=X prints, per rank on stderr, each timed op slower
 * than X us with its index (a period in the indexes names its cause: every
 * 64th op was a fresh page of the shared segment's lines, sc_chan.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "mp.h"
#include "tdist/tdist.h"

static const size_t kSizes[] = {8, 1024, 65536, 1048576, 16777216, 67108864};
static double g_budget = 0.3;
static int g_peers = 0;
static int g_init = 0; /* -I: time the world's creation and first all_reduce (init_report) */
static char g_tag[32] = "tdist";
static size_t g_max = 67108864;
static size_t g_min = 0;
static char g_ops[256] = "allreduce,broadcast,allgather,barrier";

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

struct bufs {
  float *a, *b;
  size_t count;
};

static int run_once(tdist_group_t *g, const char *op, struct bufs *B) {
  size_t c = B->count;
  if (!strcmp(op, "allreduce"))
    return tdist_all_reduce(g, B->a, B->a, c, TDIST_FLOAT32, TDIST_SUM, NULL, NULL);
  if (!strcmp(op, "broadcast")) return tdist_broadcast(g, B->a, c, TDIST_FLOAT32, 0, NULL, NULL);
  if (!strcmp(op, "allgather"))
    return tdist_all_gather(g, B->a, B->b, c, TDIST_FLOAT32, NULL, NULL);
  if (!strcmp(op, "reduce"))
    return tdist_reduce(g, B->a, B->b, c, TDIST_FLOAT32, TDIST_SUM, 0, NULL, NULL);
  if (!strcmp(op, "reduce_scatter"))
    return tdist_reduce_scatter(g, B->a, B->b, c / (size_t)tdist_group_size(g), TDIST_FLOAT32,
                                TDIST_SUM, NULL, NULL);
  if (!strcmp(op, "alltoall"))
    return tdist_all_to_all(g, B->a, B->b, c / (size_t)tdist_group_size(g), TDIST_FLOAT32, NULL,
                            NULL);
  if (!strcmp(op, "gather")) return tdist_gather(g, B->a, B->b, c, TDIST_FLOAT32, 0, NULL, NULL);
  if (!strcmp(op, "scatter")) return tdist_scatter(g, B->b, B->a, c, TDIST_FLOAT32, 0, NULL, NULL);
  if (!strcmp(op, "barrier")) return tdist_barrier(g, NULL, NULL);
  return TDIST_ERR_INVALID_ARGUMENT;
}

/* Only the ops whose result is easy to state are checked (the tests cover
 * the others element by element). */
static int check(const char *op, struct bufs *B, int rank, int n) {
  size_t c = B->count;
  if (!strcmp(op, "allreduce")) {
    for (size_t i = 0; i < c; i++)
      if (B->a[i] != (float)(n * (n + 1) / 2)) return 1;
  } else if (!strcmp(op, "broadcast")) {
    for (size_t i = 0; i < c; i++)
      if (B->a[i] != 1.0f) return 1;
  } else if (!strcmp(op, "allgather")) {
    for (size_t i = 0; i < c * (size_t)n; i++)
      if (B->b[i] != (float)(i / c + 1)) return 1;
  } else if (!strcmp(op, "reduce") && rank == 0) {
    for (size_t i = 0; i < c; i++)
      if (B->b[i] != (float)(n * (n + 1) / 2)) return 1;
  }
  return 0;
}

static void report(const char *op, int n, size_t bytes, size_t count, double us, double p50,
                   int iters) {
  double S = (double)bytes, factor = 1.0;
  if (!strcmp(op, "allreduce"))
    factor = 2.0 * (n - 1) / n;
  else if (!strcmp(op, "allgather"))
    S = (double)bytes * n, factor = (double)(n - 1) / n;
  else if (!strcmp(op, "reduce_scatter") || !strcmp(op, "alltoall"))
    factor = (double)(n - 1) / n;
  double algbw = bytes ? S / (us * 1e-6) / 1e9 : 0.0;
  if (g_peers)
    printf("peer=%s op=%s n=%d bytes=%zu us=%.2f algbw=%.3f busbw=%.3f p50_us=%.2f iters=%d\n",
           g_tag, op, n, bytes, us, algbw, algbw * factor, p50, iters);
  else
    printf("%14s %12zu %12zu %8s %6s %11.2f %7.3f %7.3f %11.2f %6d\n", op, bytes, count, "float",
           !strcmp(op, "allreduce") || !strcmp(op, "reduce") || !strcmp(op, "reduce_scatter")
               ? "sum"
               : "none",
           us, algbw, algbw * factor, p50, iters);
  fflush(stdout);
}

/* TDIST_BENCH_TAIL=1: where the mean goes (the share of the total spent in
 * the slowest 1% of iterations), per rank, on stderr. */
static void tail_report(int rank, const double *lat, int iters, double mean,
                        const struct rusage *r0, const struct rusage *r1) {
  double top = 0, all = 0;
  for (int i = 0; i < iters; i++)
    all += lat[i];
  for (int i = iters - iters / 100; i < iters; i++)
    top += lat[i];
  fprintf(stderr,
          "  rank %d: mean %.2f p60 %.2f p70 %.2f p80 %.2f p90 %.2f p99 %.2f max %.1f; "
          "slowest 1%% = %.0f%% of time; in the loop, this thread's page faults %ld, "
          "switches %ld (preempted %ld)\n",
          rank, mean, lat[iters * 6 / 10], lat[iters * 7 / 10], lat[iters * 8 / 10],
          lat[iters * 9 / 10], lat[iters * 99 / 100], lat[iters - 1],
          all > 0 ? 100.0 * top / all : 0.0, r1->ru_minflt - r0->ru_minflt,
          r1->ru_nvcsw - r0->ru_nvcsw + r1->ru_nivcsw - r0->ru_nivcsw,
          r1->ru_nivcsw - r0->ru_nivcsw);
}

static int agree_iters(tdist_group_t *g, double warm_us, int lo, int hi) {
  int32_t iters = (int32_t)(g_budget * 1e6 / (warm_us > 0 ? warm_us : 1));
  if (iters < lo) iters = lo;
  if (iters > hi) iters = hi;
  tdist_broadcast(g, &iters, 1, TDIST_INT32, 0, NULL, NULL);
  return iters;
}

/* -I: the world's creation (max over ranks) and the first two 8-byte
 * all_reduces after it (the first pays lazy connections, docs/cpu-backend.md
 * "Connections"), one line from rank 0. */
static int init_report(tdist_group_t *g, double t_init) {
  float v = 1.f;
  double t[3];
  for (int i = 0; i < 2; i++) {
    double a = now_us();
    MP_CHECK_RC(tdist_all_reduce(g, &v, &v, 1, TDIST_FLOAT32, TDIST_SUM, NULL, NULL));
    t[i + 1] = now_us() - a;
  }
  t[0] = t_init;
  double mx[3];
  MP_CHECK_RC(tdist_all_reduce(g, t, mx, 3, TDIST_FLOAT64, TDIST_MAX, NULL, NULL));
  const char *mode = getenv("TDIST_CPU_CONNECT");
  if (tdist_group_rank(g) == 0)
    printf("init n=%d connect=%s create_ms=%.2f first_allreduce_us=%.1f second_allreduce_us=%.1f\n",
           tdist_group_size(g), mode ? mode : "auto", mx[0] / 1000, mx[1], mx[2]);
  tdist_group_destroy(g);
  return 0;
}

/* arg: the store port of forked ranks, or NULL under a launcher (env://). */
static int rank_main(int rank, int n, void *arg) {
  char method[64], ops[256];
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
  double t0 = now_us();
  MP_CHECK_RC(tdist_init_process_group(&o, &g));
  double t_init = now_us() - t0;
  rank = tdist_group_rank(g);
  n = tdist_group_size(g);
  if (g_init) return init_report(g, t_init);
  if (rank == 0 && !g_peers)
    printf("# tdist cpu backend, n=%d, budget %.2fs\n%14s %12s %12s %8s %6s %11s %7s %7s %11s %6s\n"
           "%14s %12s %12s %8s %6s %11s %7s %7s %11s %6s\n",
           n, g_budget, "op", "size", "count", "type", "redop", "time", "algbw", "busbw", "p50",
           "iters", "", "(B)", "(elements)", "", "", "(us)", "(GB/s)", "(GB/s)", "(us)", "");
  /* Written now: the loop's first writes to each page were a page fault
   * every 512 ops inside the timed loop (12-15 us each, both ranks).
   * Not calloc: the compiler drops a zero memset of calloc'd memory, and
   * calloc need not write fresh pages. */
  double *lat = malloc(sizeof(double) * 4000);
  for (int i = 0; lat && i < 4000; i++)
    lat[i] = -1;
  const char *slow_env = getenv("TDIST_BENCH_SLOW_US");
  double slow_us = slow_env ? atof(slow_env) : 0;
  int failures = 0;
  snprintf(ops, sizeof(ops), "%s", g_ops);
  char *save = NULL;
  for (char *op = strtok_r(ops, ",", &save); op; op = strtok_r(NULL, ",", &save)) {
    int barrier = !strcmp(op, "barrier");
    for (size_t si = 0; si < (barrier ? 1 : sizeof(kSizes) / sizeof(kSizes[0])); si++) {
      size_t bytes = barrier ? 0 : kSizes[si];
      if (bytes > g_max || (!barrier && bytes < g_min)) continue;
      struct bufs B = {calloc(bytes / 4 + 1, 4), calloc((bytes / 4 + 1) * (size_t)n, 4), bytes / 4};
      for (size_t i = 0; i < B.count; i++)
        B.a[i] = (float)(rank + 1);
      if (!strcmp(op, "scatter"))
        for (size_t i = 0; i < B.count * (size_t)n; i++)
          B.b[i] = 1.0f;
      MP_CHECK_RC(run_once(g, op, &B));
      if (check(op, &B, rank, n)) {
        fprintf(stderr, "tdist rank %d: WRONG RESULT op=%s bytes=%zu\n", rank, op, bytes);
        failures++;
      }
      memset(B.a, 0, bytes);
      int warm, lo, hi;
      warm_for(bytes, &warm, &lo, &hi);
      if (barrier) warm = 50, lo = 20, hi = 2000;
      double w = now_us();
      for (int i = 0; i < warm; i++)
        MP_CHECK_RC(run_once(g, op, &B));
      int iters = agree_iters(g, (now_us() - w) / warm, lo, hi);
      MP_CHECK_RC(tdist_barrier(g, NULL, NULL));
      struct rusage r0, r1;
      getrusage(RUSAGE_THREAD, &r0);
      double s = now_us();
      for (int i = 0; i < iters; i++) {
        double a = now_us();
        MP_CHECK_RC(run_once(g, op, &B));
        lat[i] = now_us() - a;
      }
      double us = (now_us() - s) / iters;
      getrusage(RUSAGE_THREAD, &r1);
      /* Told after the loop: a line written inside it stalled the op after
       * it, and that one's peers with it. */
      for (int i = 0; slow_us > 0 && i < iters; i++)
        if (lat[i] > slow_us)
          fprintf(stderr, "  rank %d: %s %zu B op %d of %d took %.1f us\n", rank, op, bytes, i,
                  iters, lat[i]);
      qsort(lat, (size_t)iters, sizeof(double), cmpd);
      if (rank == 0) report(op, n, bytes, B.count, us, lat[iters / 2], iters);
      if (getenv("TDIST_BENCH_TAIL")) tail_report(rank, lat, iters, us, &r0, &r1);
      MP_CHECK_RC(tdist_barrier(g, NULL, NULL));
      free(B.a);
      free(B.b);
    }
  }
  free(lat);
  tdist_group_destroy(g);
  return failures ? 1 : 0;
}

int main(int argc, char **argv) {
  int n = 2, c;
  while ((c = getopt(argc, argv, "n:T:o:Pb:m:t:I")) != -1) {
    if (c == 'I')
      g_init = 1;
    else if (c == 'n')
      n = atoi(optarg);
    else if (c == 'T')
      g_budget = atof(optarg);
    else if (c == 'o')
      snprintf(g_ops, sizeof(g_ops), "%s", optarg);
    else if (c == 'P')
      g_peers = 1;
    else if (c == 'b')
      g_max = (size_t)atoll(optarg);
    else if (c == 'm')
      g_min = (size_t)atoll(optarg);
    else if (c == 't')
      snprintf(g_tag, sizeof(g_tag), "%s", optarg);
    else {
      fprintf(stderr,
              "usage: %s -n N [-T budget_s] [-o ops] [-P] [-m min_bytes] [-b max_bytes] [-I]\n",
              argv[0]);
      return 2;
    }
  }
  if (!strcmp(g_ops, "all"))
    snprintf(g_ops, sizeof(g_ops),
             "allreduce,broadcast,allgather,reduce,reduce_scatter,alltoall,gather,scatter,barrier");
  /* Under tdistrun (or torchrun, srun...): this process is one rank. */
  if (getenv("RANK") && getenv("WORLD_SIZE")) return rank_main(0, 0, NULL);
  int port = tdist_mp_free_port();
  /* The ranks share this host as under tdistrun or torchrun, which tell
   * each rank how many there are (the runtime's spin defaults use it). */
  char lws[16];
  snprintf(lws, sizeof(lws), "%d", n);
  setenv("LOCAL_WORLD_SIZE", lws, 0);
  return tdist_mp_run(n, rank_main, &port, 3600) ? 1 : 0;
}
