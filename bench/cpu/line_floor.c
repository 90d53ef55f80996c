/*
 * line_floor.c - what a cache line's crossing between two processes costs on
 * this host, the floor under the shared segment's small ops
 * (bench/cpu/RESULTS.md): two processes (fork), a shared ring of 1024 lines
 * per process, 200 000 ops, each process prints its ns per op.
 *
 *   tdist_bench_line_floor MODE
 *
 * MODE  give        process 0 stores op i in line i % 1024, process 1 waits
 *                   for it there (a broadcast root and its receiver; the
 *                   reader reports how far it got every 64 ops, and the
 *                   writer stays within 512 lines of that);
 *       give_fence  the same with a fence after each store, and a load of
 *                   another line after it (a doorbell check, as the
 *                   segment's writer makes after its step);
 *       give_locked the same with a locked add to a line of its own
 *                   instead (an engine lock's release, a counter);
 *       swap        both store op i in their own line and wait for the
 *                   other's (an 8-byte all_gather at n = 2);
 *       swap_fence  the same with a fence after the store.
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define L 1024
#define OPS 200000

typedef struct {
  _Alignas(64) _Atomic uint64_t v;
  char pad[56];
} line_t;

static double now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static void relax(void) { __builtin_ia32_pause(); }

int main(int argc, char **argv) {
  static const char *const kModes[] = {"give", "give_fence", "give_locked", "swap", "swap_fence"};
  int mode = -1;
  for (int i = 0; argc > 1 && i < 5; i++)
    if (!strcmp(argv[1], kModes[i])) mode = i;
  if (mode < 0) {
    fprintf(stderr, "usage: %s give|give_fence|give_locked|swap|swap_fence\n", argv[0]);
    return 2;
  }
  /* [0, L): process 0's lines, [L, 2L): process 1's, then the reader's
   * progress, the doorbell word, the start gate, a private counter. */
  line_t *m = mmap(NULL, sizeof(line_t) * (2 * L + 4), PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return 1;
  line_t *seen = &m[2 * L], *bell = &m[2 * L + 1], *gate = &m[2 * L + 2], *mine = &m[2 * L + 3];
  pid_t pid = fork();
  if (pid < 0) return 1;
  int me = pid == 0;
  atomic_fetch_add(&gate->v, 1);
  while (atomic_load(&gate->v) < 2)
    relax();
  uint64_t acked = 0;
  double s = now_ns();
  for (uint64_t i = 1; i <= OPS; i++) {
    line_t *own = &m[me * L + i % L], *other = &m[(1 - me) * L + i % L];
    if (mode <= 2) {
      if (me == 0) {
        while (i > acked + L / 2) { /* the reader's report, seldom read */
          acked = atomic_load_explicit(&seen->v, memory_order_acquire);
          if (i > acked + L / 2) relax();
        }
        atomic_store_explicit(&own->v, i, memory_order_release);
        if (mode == 1) {
          atomic_thread_fence(memory_order_seq_cst);
          (void)atomic_load_explicit(&bell->v, memory_order_relaxed);
        } else if (mode == 2) {
          atomic_fetch_add(&mine->v, 1);
        }
      } else {
        while (atomic_load_explicit(&other->v, memory_order_acquire) != i)
          relax();
        if (i % 64 == 0) atomic_store_explicit(&seen->v, i, memory_order_release);
      }
    } else {
      atomic_store_explicit(&own->v, i, memory_order_release);
      if (mode == 4) atomic_thread_fence(memory_order_seq_cst);
      while (atomic_load_explicit(&other->v, memory_order_acquire) != i)
        relax();
    }
  }
  double e = now_ns();
  printf("line_floor mode=%s process=%d ns_per_op=%.1f\n", kModes[mode], me, (e - s) / OPS);
  fflush(stdout);
  if (pid) waitpid(pid, NULL, 0);
  return 0;
}
