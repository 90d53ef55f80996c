/*
 * mpi_alltoallv.c - Open MPI's MPI_Alltoallv with the skewed split of
 * ../zipf_split.h, the peer of tdist's alltoallv_bench.c (same sizes,
 * iteration policy and line format). Built and run by mpi-alltoallv.sh with
 * mpicc (not by CMake: the library does not depend on MPI).
 *
 *   mpirun -np N mpi_alltoallv [-t TAG] [-T SECONDS] [-b MAXBYTES]
 *
 * Rank 0 prints `peer=TAG op=alltoallv_zipf n=N bytes=B us= algbw= busbw=
 * p50_us= iters=` per size (bytes: what each rank sends per call).
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "zipf_split.h"

static const size_t kSizes[] = {1024, 65536, 1048576, 16777216, 67108864};

static void warm_for(size_t bytes, int *warm, int *lo, int *hi) {
  if (bytes <= 1024) {
    *warm = 50;
    *lo = 20;
    *hi = 2000;
  } else if (bytes <= (64 << 10)) {
    *warm = 20;
    *lo = 20;
    *hi = 1000;
  } else if (bytes <= (1 << 20)) {
    *warm = 5;
    *lo = 10;
    *hi = 200;
  } else {
    *warm = 1;
    *lo = 3;
    *hi = 20;
  }
}

static int cmpd(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, n, c;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  const char *tag = "mpi";
  double budget = 0.3;
  size_t maxb = 67108864;
  while ((c = getopt(argc, argv, "t:T:b:")) != -1) {
    if (c == 't')
      tag = optarg;
    else if (c == 'T')
      budget = atof(optarg);
    else if (c == 'b')
      maxb = (size_t)atoll(optarg);
  }
  if (n > 256) MPI_Abort(MPI_COMM_WORLD, 1);
  size_t cnt[256];
  int sc[256], sd[256], rc[256], rd[256];
  double *lat = malloc(sizeof(double) * 4000);
  int bad = 0;
  for (size_t si = 0; si < sizeof(kSizes) / sizeof(kSizes[0]); si++) {
    size_t bytes = kSizes[si], total = bytes / 4;
    if (bytes > maxb) continue;
    zipf_split(total, n, cnt);
    int so = 0, ro = 0;
    for (int j = 0; j < n; j++) {
      sc[j] = (int)cnt[j], sd[j] = so, so += sc[j];
      rc[j] = (int)cnt[rank], rd[j] = ro, ro += rc[j];
    }
    float *sb = malloc((size_t)so * 4 + 4), *rb = malloc((size_t)ro * 4 + 4);
    for (int j = 0; j < n; j++)
      for (int e = 0; e < sc[j]; e++)
        sb[sd[j] + e] = (float)(rank * 1000 + j);
    MPI_Alltoallv(sb, sc, sd, MPI_FLOAT, rb, rc, rd, MPI_FLOAT, MPI_COMM_WORLD);
    for (int i = 0; i < n; i++)
      for (int e = 0; e < rc[i]; e++)
        if (rb[rd[i] + e] != (float)(i * 1000 + rank)) bad++;
    int warm, lo, hi;
    warm_for(bytes, &warm, &lo, &hi);
    double w = MPI_Wtime();
    for (int i = 0; i < warm; i++)
      MPI_Alltoallv(sb, sc, sd, MPI_FLOAT, rb, rc, rd, MPI_FLOAT, MPI_COMM_WORLD);
    int iters = (int)(budget / ((MPI_Wtime() - w) / warm + 1e-12));
    iters = iters < lo ? lo : iters > hi ? hi : iters;
    MPI_Bcast(&iters, 1, MPI_INT, 0, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    double s = MPI_Wtime();
    for (int i = 0; i < iters; i++) {
      double a = MPI_Wtime();
      MPI_Alltoallv(sb, sc, sd, MPI_FLOAT, rb, rc, rd, MPI_FLOAT, MPI_COMM_WORLD);
      lat[i] = (MPI_Wtime() - a) * 1e6;
    }
    double us = (MPI_Wtime() - s) * 1e6 / iters;
    qsort(lat, (size_t)iters, sizeof(double), cmpd);
    if (rank == 0) {
      double algbw = (double)bytes / (us * 1e-6) / 1e9;
      printf("peer=%s op=alltoallv_zipf n=%d bytes=%zu us=%.2f algbw=%.3f busbw=%.3f p50_us=%.2f "
             "iters=%d\n",
             tag, n, bytes, us, algbw, algbw * (n - 1) / n, lat[iters / 2], iters);
      fflush(stdout);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    free(sb);
    free(rb);
  }
  if (bad) fprintf(stderr, "mpi rank %d: WRONG RESULT\n", rank);
  free(lat);
  MPI_Finalize();
  return bad ? 1 : 0;
}
