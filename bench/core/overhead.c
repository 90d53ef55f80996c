/*
 * overhead.c - what the runtime itself costs per op.
 *
 * A backend that completes every op at once (tests/plugins/test_backend.c, compiled in and
 * registered) leaves only tdist's part: validate, take a handle from the pool, hand it to the
 * progress thread, post, finish, wake or let the caller observe it, release. Rows: pipelined  each
 * thread keeps a window of 64 ops in flight (submit 64, wait for all, release all); ns/op = wall
 * time / ops, i.e. the throughput cost, at 1 and 4 submitting threads; roundtrip  one op at a time
 * (submit, wait, release): latency; polled     pipelined, but completion comes from the backend
 * poll path (as NCCL's event queries do). allocs/op counts the runtime's heap allocations (its
 * allocator counts them) after a warm-up round; it must be 0 in steady state.
 *
 * Usage: tdist_bench_overhead [-o ops_per_thread] [-r reps]
 * Prints a table and one machine-readable line per row:
 *   peer=tdist op=overhead_<row> threads=T ns_op=... allocs_op=...
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/alloc.h"
#include "util/clock.h"
#include "tb_world.h"
#include "test_backend.h"
#include "tdist/tdist.h"

#define WINDOW 64

static tdist_group_t *group;
static long ops_per_thread = 200000;
static int window = WINDOW;
static pthread_barrier_t start_line;

static void *worker(void *arg) {
  (void)arg;
  tdist_work_t *w[WINDOW];
  float x = 1.0f;
  pthread_barrier_wait(&start_line);
  for (long done = 0; done < ops_per_thread; done += window) {
    for (int i = 0; i < window; i++)
      if (tdist_all_reduce(group, &x, &x, 1, TDIST_FLOAT32, TDIST_SUM, NULL, &w[i]) != 0) {
        fprintf(stderr, "submit failed: %s\n", tdist_last_error());
        exit(1);
      }
    if (tdist_wait_all(w, (size_t)window, 10000) != 0) {
      fprintf(stderr, "wait failed\n");
      exit(1);
    }
    for (int i = 0; i < window; i++)
      tdist_work_release(w[i]);
  }
  return NULL;
}

/* Runs `threads` workers once; returns ns per op, sets *allocs_per_op. */
static double run(int threads, double *allocs_per_op) {
  pthread_t t[64];
  pthread_barrier_init(&start_line, NULL, (unsigned)threads + 1);
  for (int i = 0; i < threads; i++)
    pthread_create(&t[i], NULL, worker, NULL);
  uint64_t a0 = tdist__alloc_count();
  int64_t t0 = tdist__now_ns();
  pthread_barrier_wait(&start_line);
  for (int i = 0; i < threads; i++)
    pthread_join(t[i], NULL);
  int64_t t1 = tdist__now_ns();
  double ops = (double)ops_per_thread * threads;
  *allocs_per_op = (double)(tdist__alloc_count() - a0) / ops;
  pthread_barrier_destroy(&start_line);
  return (double)(t1 - t0) / ops;
}

static void row(const char *name, tb_mode_t mode, int threads, int win, int reps) {
  tb_set_mode(mode);
  window = win;
  double allocs = 0, best = 1e30;
  run(threads, &allocs); /* warm-up: grows the work pool */
  for (int r = 0; r < reps; r++) {
    double a, ns = run(threads, &a);
    if (ns < best) best = ns;
    if (r == 0 || a > allocs) allocs = a;
  }
  printf("| %-10s | %7d | %6d | %10.1f | %9.4f |\n", name, threads, win, best, allocs);
  printf("peer=tdist op=overhead_%s threads=%d window=%d ns_op=%.1f allocs_op=%.4f\n", name,
         threads, win, best, allocs);
}

int main(int argc, char **argv) {
  int reps = 3, opt;
  while ((opt = getopt(argc, argv, "o:r:")) != -1) {
    if (opt == 'o')
      ops_per_thread = atol(optarg);
    else if (opt == 'r')
      reps = atoi(optarg);
    else {
      fprintf(stderr, "usage: %s [-o ops_per_thread] [-r reps]\n", argv[0]);
      return 2;
    }
  }
  ops_per_thread = (ops_per_thread + WINDOW - 1) / WINDOW * WINDOW;
  if (tb_group_create(0, 2, 60000, &group) != 0) {
    fprintf(stderr, "group: %s\n", tdist_last_error());
    return 1;
  }
  printf("tdist %s runtime overhead, %ld ops per thread, best of %d, allocator %s\n\n",
         tdist_version_string(), ops_per_thread, reps, tdist__alloc_backend());
  printf("| row        | threads | window |  ns per op | allocs/op |\n");
  printf("|------------|---------|--------|------------|-----------|\n");
  row("pipelined", TB_COMPLETE, 1, WINDOW, reps);
  row("pipelined", TB_COMPLETE, 4, WINDOW, reps);
  row("polled", TB_POLL, 1, WINDOW, reps);
  row("polled", TB_POLL, 4, WINDOW, reps);
  long saved = ops_per_thread;
  ops_per_thread = saved / 4 / WINDOW * WINDOW;
  row("roundtrip", TB_COMPLETE, 1, 1, reps);
  ops_per_thread = saved;
  tdist_group_destroy(group);
  return 0;
}
