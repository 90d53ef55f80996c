/*
 * small_loop.c - rounds of one small op, for A/B comparisons of the CPU
 * backend's small-message path on a noisy machine (bench/cpu/RESULTS.md):
 * a single peers run's mean moves by 10-30 % with the host's other jobs,
 * the 10th percentile of many short rounds much less.
 *
 *   tdistrun -n 2 tdist_bench_small OP BYTES [ROUNDS [OPS]]
 *
 * OP: allreduce (in-place float32 sum), broadcast (root 0), allgather,
 * alltoall (BYTES per block), alltoallv (BYTES a rank sends, split over the
 * ranks as alltoallv_bench's Zipf split), barrier (BYTES ignored). Each round: an 8-byte all_reduce
 * (every rank starts together, and a broadcast root cannot run ahead from one round into the next),
 * then OPS ops (default 2000, the peers bench's largest count for small sizes) timed on every rank
 * with two clock reads around the loop, not around each op. Rank 0 prints one line: p10, p50 and
 * mean of the rounds' per-op us (default 200 rounds), and the same for the slowest rank of each
 * round (max over ranks, gathered after the rounds).
 *
 * Set TDIST_* variables per run (e.g. TDIST_CPU_SC_NOW=0) to compare
 * settings, alternating the two runs several times.
 *
 * TDIST_BENCH_START_CPU=C: every rank moves its thread to CPU C before the
 * rounds and gives its affinity back at once, so that the ranks start on
 * one CPU, where a scheduler that packs vCPUs may leave them (work.c,
 * move_off_cpu: TDIST_DRIVE_MOVE=0 against 1).
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tdist/tdist.h"
#include "zipf_split.h"

#define CHECK(x)                                                                  \
  do {                                                                            \
    int rc_ = (x);                                                                \
    if (rc_ != TDIST_SUCCESS) {                                                   \
      fprintf(stderr, "small_loop: %s: %s (%d)\n", #x, tdist_strerror(rc_), rc_); \
      exit(1);                                                                    \
    }                                                                             \
  } while (0)

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static int cmpd(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static void stats(double *v, int n, double *p10, double *p50, double *mean) {
  double s = 0;
  for (int i = 0; i < n; i++)
    s += v[i];
  qsort(v, (size_t)n, sizeof(double), cmpd);
  *p10 = v[n / 10];
  *p50 = v[n / 2];
  *mean = s / n;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr,
            "usage: %s allreduce|broadcast|allgather|alltoall|alltoallv|barrier BYTES "
            "[ROUNDS [OPS]]\n",
            argv[0]);
    return 2;
  }
  const char *op = argv[1];
  size_t bytes = strtoull(argv[2], NULL, 10);
  int rounds = argc > 3 ? atoi(argv[3]) : 200;
  int ops = argc > 4 ? atoi(argv[4]) : 2000;
  if (rounds < 1 || ops < 1) return 2;
  tdist_init_opts_t o = {.mask = 0}; /* everything from the launcher's environment */
  tdist_group_t *g = NULL;
  CHECK(tdist_init_process_group(&o, &g));
  int n = tdist_group_size(g), rank = tdist_group_rank(g);
  const char *start_cpu = getenv("TDIST_BENCH_START_CPU");
  if (start_cpu) {
    cpu_set_t mask, one;
    CPU_ZERO(&one);
    CPU_SET(atoi(start_cpu), &one);
    if (sched_getaffinity(0, sizeof(mask), &mask) != 0 ||
        sched_setaffinity(0, sizeof(one), &one) != 0 ||
        sched_setaffinity(0, sizeof(mask), &mask) != 0)
      perror("small_loop: TDIST_BENCH_START_CPU");
  }
  size_t count = bytes / 4 ? bytes / 4 : 1;
  float *a = calloc(count, 4), *b = calloc(count * (size_t)n, 4), one = 1;
  double *t = calloc((size_t)rounds, sizeof(double)), *all = calloc((size_t)rounds, sizeof(double));
  if (!a || !b || !t || !all) return 1;
  /* alltoallv: the Zipf split of count elements (sc), and what this rank
   * receives from each (rc: every rank sends the same split). */
  size_t sc[256] = {0}, rc[256] = {0}, rtotal = 0;
  if (n > 256) return 2;
  zipf_split(count, n, sc);
  for (int i = 0; i < n; i++)
    rtotal += rc[i] = sc[rank];
  float *va = calloc(count, 4), *vb = calloc(rtotal ? rtotal : 1, 4), *xa = NULL, *xb = NULL;
  if (!strcmp(op, "alltoall")) {
    xa = calloc(count * (size_t)n, 4);
    xb = calloc(count * (size_t)n, 4);
  }
  if (!va || !vb || (!strcmp(op, "alltoall") && (!xa || !xb))) return 1;
  for (int r = 0; r < rounds; r++) {
    CHECK(tdist_all_reduce(g, &one, &one, 1, TDIST_FLOAT32, TDIST_SUM, NULL, NULL));
    double s = now_us();
    for (int i = 0; i < ops; i++) {
      if (!strcmp(op, "allreduce"))
        CHECK(tdist_all_reduce(g, a, a, count, TDIST_FLOAT32, TDIST_SUM, NULL, NULL));
      else if (!strcmp(op, "broadcast"))
        CHECK(tdist_broadcast(g, a, count, TDIST_FLOAT32, 0, NULL, NULL));
      else if (!strcmp(op, "allgather"))
        CHECK(tdist_all_gather(g, a, b, count, TDIST_FLOAT32, NULL, NULL));
      else if (!strcmp(op, "alltoall"))
        CHECK(tdist_all_to_all(g, xa, xb, count, TDIST_FLOAT32, NULL, NULL));
      else if (!strcmp(op, "alltoallv"))
        CHECK(tdist_all_to_all_v(g, va, sc, NULL, vb, rc, NULL, TDIST_FLOAT32, NULL, NULL));
      else if (!strcmp(op, "barrier"))
        CHECK(tdist_barrier(g, NULL, NULL));
      else
        return 2;
    }
    t[r] = (now_us() - s) / ops;
  }
  /* The slowest rank of each round (a broadcast root's own time is not the
   * op's: its receivers finish later). */
  memcpy(all, t, (size_t)rounds * sizeof(double));
  CHECK(tdist_all_reduce(g, all, all, (size_t)rounds, TDIST_FLOAT64, TDIST_MAX, NULL, NULL));
  double p10, p50, mean, q10, q50, qmean;
  stats(t, rounds, &p10, &p50, &mean);
  stats(all, rounds, &q10, &q50, &qmean);
  if (rank == 0)
    printf("small_loop op=%s n=%d bytes=%zu rounds=%d ops=%d rank0_us p10=%.4f p50=%.4f "
           "mean=%.4f slowest_us p10=%.4f p50=%.4f mean=%.4f\n",
           op, n, bytes, rounds, ops, p10, p50, mean, q10, q50, qmean);
  tdist_group_destroy(g);
  free(a);
  free(b);
  free(t);
  free(all);
  free(va);
  free(vb);
  free(xa);
  free(xb);
  return 0;
}
