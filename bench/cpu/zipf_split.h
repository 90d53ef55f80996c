/*
 * zipf_split.h - the skewed all_to_all_v split shared by the tdist bench
 * (alltoallv_bench.c) and its Open MPI peer (peers.d/mpi_alltoallv.c), so
 * both move exactly the same blocks.
 *
 * Expert-parallel MoE routing sends each token to the experts its router
 * picks, and a few experts get most tokens (the load follows a Zipf-like
 * law). With one expert per rank, every rank sends `total` elements split
 * over the destinations with weight 1 / (1 + popularity)^1.2, where the
 * popularity order is the same on every rank (the same experts are hot for
 * everyone): popularity(j) = j, so rank 0 is the hottest expert and
 * receives the most. Remainders go to the hottest destination, so every rank
 * sends exactly `total` elements.
 */
#ifndef TDIST_BENCH_ZIPF_SPLIT_H
#define TDIST_BENCH_ZIPF_SPLIT_H

#include <math.h>
#include <stddef.h>

/* counts[j]: elements any rank sends rank j, for `total` per rank over n. */
static inline void zipf_split(size_t total, int n, size_t *counts) {
  double w[256], sum = 0;
  size_t used = 0;
  int hottest = 0;
  for (int j = 0; j < n; j++) {
    int pop = j;
    w[j] = 1.0 / pow(1.0 + pop, 1.2);
    sum += w[j];
    if (pop == 0) hottest = j;
  }
  for (int j = 0; j < n; j++) {
    counts[j] = (size_t)((double)total * w[j] / sum);
    used += counts[j];
  }
  counts[hottest] += total - used;
}

#endif
