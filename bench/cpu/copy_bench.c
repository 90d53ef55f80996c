/*
 * copy_bench.c - the CPU backend's payload copies (src/cpu/base/copy.c)
 * against glibc's memcpy in the same run: the string move
 * (tdist__cpu_copy_string), the vector loop (tdist__cpu_copy_loop), the
 * copy that picks one of them by measure (tdist__cpu_copy) and the
 * streaming one (tdist__cpu_copy_stream), which the shared segment uses
 * for outputs of TDIST_CPU_SC_STREAM_BYTES and up. Private buffers only:
 * where the two ways differ most, the source's lines come from the other
 * CPU's cache (a slot), which tdist_bench_cpu measures.
 *
 *   tdist_bench_copy MIB [PROCS [ROUNDS]]
 *
 * PROCS processes (default 1; 2: a second one copying beside the first,
 * as two ranks do) each copy MIB MiB between two private buffers ROUNDS
 * times (default 10) with each of the five, in turns, so that the host's
 * state changes hit all alike. Each process prints one line per
 * copy: the fastest and the median round in ms.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cpu/base/copy.h"

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

static int cmpd(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static void glibc(void *d, const void *s, size_t n) { memcpy(d, s, n); }

static int run(int proc, size_t n, int rounds) {
  static const struct {
    const char *name;
    void (*fn)(void *, const void *, size_t);
  } copies[] = {{"memcpy (glibc)", glibc},
                {"tdist__cpu_copy_string", tdist__cpu_copy_string},
                {"tdist__cpu_copy_loop", tdist__cpu_copy_loop},
                {"tdist__cpu_copy", tdist__cpu_copy_big},
                {"tdist__cpu_copy_stream", tdist__cpu_copy_stream}};
  enum { NC = sizeof(copies) / sizeof(copies[0]) };
  char *a = malloc(n), *b = malloc(n);
  double *t = malloc(sizeof(double) * (size_t)rounds * NC);
  if (!a || !b || !t) return 1;
  memset(a, 1, n);
  memset(b, 2, n);
  for (int r = 0; r < rounds; r++)
    for (int c = 0; c < NC; c++) {
      double t0 = now_ms();
      copies[c].fn(b, a, n);
      __asm__ volatile("" : : "r"(b) : "memory");
      t[c * rounds + r] = now_ms() - t0;
    }
  for (int c = 0; c < NC; c++) {
    qsort(t + c * rounds, (size_t)rounds, sizeof(double), cmpd);
    printf("proc %d %-24s %zu MiB: min %.2f ms, median %.2f ms\n", proc, copies[c].name, n >> 20,
           t[c * rounds], t[c * rounds + rounds / 2]);
  }
  fflush(stdout);
  free(a);
  free(b);
  free(t);
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s MIB [PROCS [ROUNDS]]\n", argv[0]);
    return 2;
  }
  size_t n = (size_t)strtoull(argv[1], NULL, 0) << 20;
  int procs = argc > 2 ? atoi(argv[2]) : 1, rounds = argc > 3 ? atoi(argv[3]) : 10;
  if (n == 0 || procs < 1 || rounds < 1) return 2;
  for (int p = 1; p < procs; p++)
    if (fork() == 0) _exit(run(p, n, rounds));
  int rc = run(0, n, rounds);
  for (int p = 1; p < procs; p++) {
    int st = 0;
    if (wait(&st) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) rc = 1;
  }
  return rc;
}
