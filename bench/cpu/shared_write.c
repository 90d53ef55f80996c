/*
 * shared_write.c - what writing a block into memory another process read
 * last costs on this host, against a private copy: the reason all_gather
 * blocks are lent (read in place) rather than passed through the shared
 * segment's slots (docs/cpu-backend.md, "all_gather blocks are lent").
 *
 *   tdist_bench_shared_write BYTES [ROUNDS]
 *
 * Prints three lines: a memcpy between two private buffers; then a
 * ping-pong of two processes (fork, one pinned to CPU 0, the other to
 * CPU 1 where there is one) over one shared region, in which process 0
 * copies BYTES into the region and process 1 copies them out, in turns:
 * the writer's time per round (its lines were last read by the other) and
 * the whole round.
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void pin(int cpu) {
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(cpu, &s);
  (void)sched_setaffinity(0, sizeof(s), &s); /* best effort: one CPU only is fine */
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s BYTES [ROUNDS]\n", argv[0]);
    return 2;
  }
  size_t n = strtoull(argv[1], NULL, 0);
  int rounds = argc > 2 ? atoi(argv[2]) : 1000;
  if (n == 0 || rounds <= 0) return 2;
  char *a = aligned_alloc(4096, (n + 4095) / 4096 * 4096);
  char *b = aligned_alloc(4096, (n + 4095) / 4096 * 4096);
  char *sh = mmap(NULL, n + 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (!a || !b || sh == MAP_FAILED) return 1;
  memset(a, 1, n);
  memset(b, 2, n);
  memset(sh, 0, n + 4096);
  _Atomic int *turn = (_Atomic int *)(void *)(sh + n);
  double t = now();
  for (int i = 0; i < rounds; i++) {
    memcpy(b, a, n);
    __asm__ volatile("" : : "r"(b) : "memory");
  }
  t = now() - t;
  printf("private memcpy   %zu B: %.2f us (%.2f GB/s)\n", n, t / rounds * 1e6,
         (double)n * rounds / t / 1e9);
  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) return 1;
  if (pid == 0) {
    pin(1);
    for (int i = 0; i < rounds; i++) {
      while (atomic_load(turn) != 2 * i + 1)
        ;
      memcpy(b, sh, n);
      atomic_store(turn, 2 * i + 2);
    }
    _exit(0);
  }
  pin(0);
  double tw = 0;
  t = now();
  for (int i = 0; i < rounds; i++) {
    double t0 = now();
    memcpy(sh, a, n);
    tw += now() - t0;
    atomic_store(turn, 2 * i + 1);
    while (atomic_load(turn) != 2 * i + 2)
      ;
  }
  t = now() - t;
  waitpid(pid, NULL, 0);
  printf("shared write     %zu B: %.2f us (lines the other process read last)\n", n,
         tw / rounds * 1e6);
  printf("shared round     %zu B: %.2f us (write, then the other's copy out)\n", n,
         t / rounds * 1e6);
  return 0;
}
