/*
 * test_clock.c - tdist__now_ns (util/clock.h) against CLOCK_MONOTONIC: on
 * a host whose kernel keeps time with the TSC (its clocksource, or
 * kvm-clock on an invariant TSC), the counter's line is used once
 * calibrated, every value lies within a few microseconds of a
 * clock_gettime bracket taken around it, and no thread sees time go back,
 * across the calibration, the line's first anchoring and its re-anchorings
 * (the period doubles from 1 ms: 1.2 s of reads sees about eleven); and
 * the same in children forked while threads read. The line is re-anchored
 * only when due: a bug that re-anchored on every slow read (two threads
 * re-anchored each other every few ms) moved the line SLEW_AHEAD further
 * ahead each time, 20 us after a few hundred ms under load, so both tests
 * count the lines published.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "util/clock.h"

#ifdef TDIST__CLOCK_TSC
#include <cpuid.h>
#endif

#define THREADS 3
#define RUN_NS 1200000000LL
/* The line's error bound checked here: its anchors are pairs under 0.8 us
 * wide, its rate comes from the process's whole age, and it is slewed to
 * CLOCK_MONOTONIC every period (3 threads for 3 s saw 0.7 us at most). */
#define BOUND_NS 20000
/* The bound for a forked child, which reads a line over a second old (its
 * rate off by well under a ppm): a pair's width, the slew's margin, and
 * what is left of the first line's lead. The re-anchoring bug above broke
 * it after some 15 children on an idle machine. */
#define CHILD_BOUND_NS 5000

/* The most lines the anchoring schedule publishes in a process age_ns old:
 * the first at 1 ms, then each when the origin's age has doubled, and
 * once a second after the first second; late anchorings only mean fewer.
 * Plus one for rounding at the ends. */
static long lines_allowed(int64_t age_ns) {
  long n = 1;
  for (int64_t a = 1000000; a <= age_ns; a = a < 1000000000 ? 2 * a : a + 1000000000)
    n++;
  return n;
}

#ifdef TDIST__CLOCK_TSC
static long lines_published(void) { return (long)(atomic_load(&tdist__clock.seq) / 2); }
#endif

static int64_t sys_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

struct result {
  long reads, back;
  int64_t worst; /* the largest distance outside the bracket */
};

static void *reader(void *arg) {
  struct result *r = arg;
  int64_t prev = 0, end = sys_ns() + RUN_NS;
  for (;;) {
    int64_t s0 = sys_ns(), v = tdist__now_ns(), s1 = sys_ns();
    if (v < prev) r->back++;
    prev = v;
    int64_t d = v < s0 ? s0 - v : v > s1 ? v - s1 : 0;
    if (d > r->worst) r->worst = d;
    r->reads++;
    if (s1 > end) break;
  }
  return NULL;
}

/* The kernel keeps time with the counter: its clocksource is "tsc", or a
 * KVM guest's "kvm-clock" on a CPU whose counter is invariant (CPUID
 * 0x80000007 EDX bit 8, /proc/cpuinfo's nonstop_tsc). */
static const char *counter_clock(void) {
  static char cs[32];
  FILE *f = fopen("/sys/devices/system/clocksource/clocksource0/current_clocksource", "r");
  if (!f) return NULL;
  if (!fgets(cs, sizeof(cs), f)) cs[0] = '\0';
  fclose(f);
  if (strcmp(cs, "tsc\n") == 0) return "tsc";
#ifdef TDIST__CLOCK_TSC
  unsigned a, b, c, d;
  if (strcmp(cs, "kvm-clock\n") == 0 && __get_cpuid(0x80000007, &a, &b, &c, &d) && (d & (1u << 8)))
    return "kvm-clock on an invariant counter";
#endif
  return NULL;
}

static int64_t t_start; /* before the process's first clock read */

static void clock_follows_monotonic(void **state) {
  (void)state;
  pthread_t t[THREADS];
  struct result res[THREADS];
  memset(res, 0, sizeof(res));
  for (int i = 0; i < THREADS; i++)
    assert_int_equal(pthread_create(&t[i], NULL, reader, &res[i]), 0);
  for (int i = 0; i < THREADS; i++)
    assert_int_equal(pthread_join(t[i], NULL), 0);
#ifdef TDIST__CLOCK_TSC
  long lines = lines_published(), allowed = lines_allowed(sys_ns() - t_start);
  printf("lines published: %ld (the schedule allows %ld)\n", lines, allowed);
  assert_true(lines <= allowed);
#endif
  for (int i = 0; i < THREADS; i++) {
    printf("thread %d: %ld reads, %ld back, worst %lld ns outside clock_gettime's bracket\n", i,
           res[i].reads, res[i].back, (long long)res[i].worst);
    assert_true(res[i].reads > 1000);
    assert_int_equal(res[i].back, 0);
    assert_true(res[i].worst <= BOUND_NS);
  }
#ifdef TDIST__CLOCK_TSC
  int on = atomic_load(&tdist__clock.on);
  const char *cc = counter_clock();
  printf("counter line: %s (kernel clocksource %s)\n", on ? "on" : "off",
         cc ? cc : "not the counter");
  const char *env = getenv("TDIST_CLOCK_TSC"); /* 0: clock_gettime on every read */
  assert_int_equal(on, cc && !(env && !strcmp(env, "0")));
#endif
}

/* Children forked while threads read (one may be anchoring, holding the
 * lock or with the line half written: at_fork) read a monotonic clock
 * within the bound. */
static void *spin_reads(void *arg) {
  atomic_int *stop = arg;
  while (!atomic_load(stop))
    (void)tdist__now_ns();
  return NULL;
}

static void clock_after_fork(void **state) {
  (void)state;
  atomic_int stop = 0;
  pthread_t t[2];
#ifdef TDIST__CLOCK_TSC
  long lines0 = lines_published();
#endif
  int64_t began = sys_ns();
  for (int i = 0; i < 2; i++)
    assert_int_equal(pthread_create(&t[i], NULL, spin_reads, &stop), 0);
  for (int k = 0; k < 20; k++) {
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
      struct result r = {0};
      int64_t prev = 0;
      for (int i = 0; i < 200000; i++) {
        int64_t s0 = sys_ns(), v = tdist__now_ns(), s1 = sys_ns();
        if (v < prev) r.back++;
        prev = v;
        int64_t d = v < s0 ? s0 - v : v > s1 ? v - s1 : 0;
        if (d > r.worst) r.worst = d;
      }
      if (r.back || r.worst > CHILD_BOUND_NS)
        fprintf(stderr, "child %d: %ld back, worst %lld ns outside the bracket\n", k, r.back,
                (long long)r.worst);
      _exit(r.back == 0 && r.worst <= CHILD_BOUND_NS ? 0 : 1);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
  }
  atomic_store(&stop, 1);
  for (int i = 0; i < 2; i++)
    assert_int_equal(pthread_join(t[i], NULL), 0);
#ifdef TDIST__CLOCK_TSC
  /* The line is over a second old: one anchoring a second, plus one. */
  long lines = lines_published() - lines0;
  long allowed = (long)((sys_ns() - began) / 1000000000) + 2;
  printf("lines published while forking: %ld (the schedule allows %ld)\n", lines, allowed);
  assert_true(lines <= allowed);
#endif
}

int main(void) {
  t_start = sys_ns();
  const struct CMUnitTest tests[] = {cmocka_unit_test(clock_follows_monotonic),
                                     cmocka_unit_test(clock_after_fork)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
