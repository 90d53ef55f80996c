/*
 * test_cpu_spread.c - where a crowded group's waiting caller moves
 * (segment/sc_spread.c, tdist__cpu_sc_spread_pick), from made-up boards of
 * the members' CPUs: only the highest rank on a CPU with more members than
 * an even split moves, to the CPU of its mask with the fewest, and only
 * where that leaves the two closer. The move itself and a real 3 + 1 split
 * are cpu_sc's "spread" case at n = 4.
 */
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "cpu/segment/sc.h"

static cpu_set_t cpus_upto(int k) {
  cpu_set_t s;
  CPU_ZERO(&s);
  for (int c = 0; c < k; c++)
    CPU_SET(c, &s);
  return s;
}

/* Four members on two CPUs. */
static void test_two_cpus(void **state) {
  (void)state;
  cpu_set_t both = cpus_upto(2), only0 = cpus_upto(1);
  int three_one[4] = {0, 0, 0, 1};
  assert_int_equal(tdist__cpu_sc_spread_pick(three_one, 4, 2, 2, &both), 1); /* top of CPU 0 */
  assert_int_equal(tdist__cpu_sc_spread_pick(three_one, 4, 0, 2, &both), -1);
  assert_int_equal(tdist__cpu_sc_spread_pick(three_one, 4, 1, 2, &both), -1);
  assert_int_equal(tdist__cpu_sc_spread_pick(three_one, 4, 3, 2, &both), -1);  /* the lone one */
  assert_int_equal(tdist__cpu_sc_spread_pick(three_one, 4, 2, 2, &only0), -1); /* pinned */
  int all_one[4] = {1, 1, 1, 1};
  assert_int_equal(tdist__cpu_sc_spread_pick(all_one, 4, 3, 2, &both), 0);
  assert_int_equal(tdist__cpu_sc_spread_pick(all_one, 4, 2, 2, &both), -1);
  int even[4] = {0, 1, 1, 0};
  for (int me = 0; me < 4; me++)
    assert_int_equal(tdist__cpu_sc_spread_pick(even, 4, me, 2, &both), -1);
  int unknown[4] = {0, 0, 0, -1}; /* member 3 has not waited yet */
  assert_int_equal(tdist__cpu_sc_spread_pick(unknown, 4, 2, 2, &both), -1);
}

/* Three members on two CPUs: 2 + 1 is as even as it gets. */
static void test_odd(void **state) {
  (void)state;
  cpu_set_t both = cpus_upto(2);
  int two_one[3] = {1, 1, 0};
  for (int me = 0; me < 3; me++)
    assert_int_equal(tdist__cpu_sc_spread_pick(two_one, 3, me, 2, &both), -1);
  int three[3] = {1, 1, 1};
  assert_int_equal(tdist__cpu_sc_spread_pick(three, 3, 2, 2, &both), 0);
}

/* Eight members on four CPUs, CPUs 2 and 3 of the mask not the lowest. */
static void test_four_cpus(void **state) {
  (void)state;
  cpu_set_t four;
  CPU_ZERO(&four);
  for (int c = 4; c < 8; c++)
    CPU_SET(c, &four);
  int b[8] = {4, 4, 4, 5, 5, 5, 6, 7};
  assert_int_equal(tdist__cpu_sc_spread_pick(b, 8, 2, 4, &four), 6); /* fewest, lowest first */
  assert_int_equal(tdist__cpu_sc_spread_pick(b, 8, 5, 4, &four), 6);
  assert_int_equal(tdist__cpu_sc_spread_pick(b, 8, 1, 4, &four), -1);
  assert_int_equal(tdist__cpu_sc_spread_pick(b, 8, 7, 4, &four), -1);
  int c[8] = {4, 4, 4, 5, 5, 6, 6, 7}; /* 3 2 2 1: the top of CPU 4 to CPU 7 */
  assert_int_equal(tdist__cpu_sc_spread_pick(c, 8, 2, 4, &four), 7);
  int d[8] = {4, 4, 5, 5, 6, 6, 7, 7};
  for (int me = 0; me < 8; me++)
    assert_int_equal(tdist__cpu_sc_spread_pick(d, 8, me, 4, &four), -1);
  /* Six on four, one CPU idle: no CPU holds more than an even split's
   * two, so nobody moves (the busiest would stay at two). */
  int e[6] = {4, 4, 5, 5, 6, 6};
  for (int me = 0; me < 6; me++)
    assert_int_equal(tdist__cpu_sc_spread_pick(e, 6, me, 4, &four), -1);
}

/* A caller whose mask lacks the emptiest CPU: five members on three CPUs,
 * 3 + 2 + 0, the caller confined to the first two. Moving to the CPU with
 * two would make it three: it stays. With CPU 2 in its mask it goes there. */
static void test_mask(void **state) {
  (void)state;
  cpu_set_t two = cpus_upto(2), three = cpus_upto(3);
  int b[5] = {0, 0, 0, 1, 1};
  assert_int_equal(tdist__cpu_sc_spread_pick(b, 5, 2, 3, &two), -1);
  assert_int_equal(tdist__cpu_sc_spread_pick(b, 5, 2, 3, &three), 2);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_two_cpus),
      cmocka_unit_test(test_odd),
      cmocka_unit_test(test_four_cpus),
      cmocka_unit_test(test_mask),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
