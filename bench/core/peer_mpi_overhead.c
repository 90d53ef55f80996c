/*
 * peer_mpi_overhead.c - the peer for tdist_bench_overhead: what Open MPI
 * charges per asynchronous collective when no data moves. MPI_Iallreduce of
 * one float on MPI_COMM_SELF (one rank: the library's request machinery
 * only), in the same patterns as overhead.c:
 *   pipelined  post 64, MPI_Waitall, repeat (ns/op = wall / ops);
 *   roundtrip  post one, MPI_Wait, repeat.
 * Built and run by run_overhead.sh when mpicc is installed (not by CMake:
 * MPI is not a dependency of tdist). Prints the same line format.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define WINDOW 64

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static double run(long ops, int window) {
  MPI_Request req[WINDOW];
  float in = 1.0f, out[WINDOW];
  double t0 = now_ns();
  for (long done = 0; done < ops; done += window) {
    for (int i = 0; i < window; i++)
      MPI_Iallreduce(&in, &out[i], 1, MPI_FLOAT, MPI_SUM, MPI_COMM_SELF, &req[i]);
    MPI_Waitall(window, req, MPI_STATUSES_IGNORE);
  }
  return (now_ns() - t0) / (double)ops;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  long ops = argc > 1 ? atol(argv[1]) : 200000;
  int reps = argc > 2 ? atoi(argv[2]) : 3;
  ops = (ops + WINDOW - 1) / WINDOW * WINDOW;
  run(ops / 4, WINDOW); /* warm-up */
  double best_p = 1e30, best_r = 1e30;
  for (int r = 0; r < reps; r++) {
    double p = run(ops, WINDOW), q = run(ops / 4, 1);
    if (p < best_p) best_p = p;
    if (q < best_r) best_r = q;
  }
  printf("peer=openmpi op=overhead_pipelined threads=1 window=%d ns_op=%.1f\n", WINDOW, best_p);
  printf("peer=openmpi op=overhead_roundtrip threads=1 window=1 ns_op=%.1f\n", best_r);
  MPI_Finalize();
  return 0;
}
