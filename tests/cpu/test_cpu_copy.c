/*
 * test_cpu_copy.c - the CPU backend's payload copies (src/cpu/base/copy.c).
 *
 *   exact         tdist__cpu_copy and tdist__cpu_move of sizes around the
 *                 vector turn, the measured sizes' first class and the
 *                 string move's head (256 B - 1 MiB + 5), at source and
 *                 destination offsets off their lines, eight times each (a
 *                 class's first eight copies are its look: both ways
 *                 alternate): every byte equals the source's and the
 *                 guard bytes on both sides of the destination are
 *                 untouched. ctest runs it measured (TDIST_CPU_COPY_LOOP
 *                 unset) and with each way forced (cpu_copy_loop,
 *                 cpu_copy_string).
 *   stream        tdist__cpu_copy_stream the same way.
 *   tune          the look's arithmetic with made-up times: the loop is
 *                 taken after a look where it was more than twice as fast
 *                 per byte (also when the two looked at different sizes
 *                 of the class), the string move otherwise (faster, or
 *                 the loop only 1.33x as fast); one slow copy of the faster
 *                 way (preempted) does not flip it, since the look keeps
 *                 each way's best; the look comes back every
 *                 TDIST_CPU_COPY_EVERY copies and starts over.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/base/copy.h"

#define GUARD 64

static void fill(uint8_t *p, size_t n, uint32_t seed) {
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; i++) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    p[i] = (uint8_t)x;
  }
}

/* Copies n bytes from src + so to dst + do with f, eight times, and checks
 * the bytes and the guards around them. */
static void check_copies(void (*f)(void *, const void *, size_t), size_t n, size_t so, size_t dof) {
  uint8_t *src = malloc(n + so + 64), *dst = malloc(n + dof + 2 * GUARD + 64);
  assert_non_null(src);
  assert_non_null(dst);
  uint8_t *s = (uint8_t *)(((uintptr_t)src + 63) & ~(uintptr_t)63) + so;
  uint8_t *d0 = (uint8_t *)(((uintptr_t)dst + 63) & ~(uintptr_t)63);
  uint8_t *d = d0 + GUARD + dof;
  for (int rep = 0; rep < 8; rep++) {
    fill(s, n, (uint32_t)(n + so * 7 + dof * 131 + (size_t)rep));
    memset(d0, 0xa5, GUARD + dof + n + GUARD);
    f(d, s, n);
    if (memcmp(d, s, n) != 0) {
      size_t i = 0;
      while (d[i] == s[i])
        i++;
      fail_msg("copy of %zu bytes (source +%zu, destination +%zu, copy %d): byte %zu differs", n,
               so, dof, rep, i);
    }
    for (size_t i = 0; i < GUARD + dof; i++)
      if (d0[i] != 0xa5)
        fail_msg("copy of %zu bytes wrote %zu bytes before its destination", n, GUARD + dof - i);
    for (size_t i = 0; i < GUARD; i++)
      if (d[n + i] != 0xa5)
        fail_msg("copy of %zu bytes wrote byte %zu after its destination", n, i);
  }
  free(src);
  free(dst);
}

static const size_t sizes[] = {256,  300,  4095, 4096,       8191,
                               8192, 8193, 9000, 65536 + 17, (1u << 20) + 5};
static const size_t offs[][2] = {{0, 0}, {0, 1}, {3, 17}, {32, 63}, {5, 0}};

static void copy(void *d, const void *s, size_t n) { tdist__cpu_copy(d, s, n); }
static void move(void *d, const void *s, size_t n) { tdist__cpu_move(d, s, n); }

static void test_exact(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
    for (size_t o = 0; o < sizeof(offs) / sizeof(offs[0]); o++) {
      check_copies(copy, sizes[i], offs[o][0], offs[o][1]);
      check_copies(move, sizes[i], offs[o][0], offs[o][1]);
    }
}

static void test_stream(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
    for (size_t o = 0; o < sizeof(offs) / sizeof(offs[0]); o++)
      check_copies(tdist__cpu_copy_stream, sizes[i], offs[o][0], offs[o][1]);
}

/* One look of a zeroed or finished class: per copy, its size and what each
 * way takes (ns); returns the way taken after it. */
static int look(tdist__cpu_copy_tune_t *t, const size_t *n, const int64_t *ns_string,
                const int64_t *ns_loop) {
  for (unsigned k = 0; k < TDIST_CPU_COPY_LOOK; k++) {
    int timed;
    int loop = tdist__cpu_copy_tune_way(t, &timed);
    assert_true(timed);
    assert_int_equal(loop, (int)(k & 1)); /* alternated, the string move first */
    tdist__cpu_copy_tune_took(t, loop, n[k], loop ? ns_loop[k] : ns_string[k]);
  }
  int timed, way = tdist__cpu_copy_tune_way(t, &timed);
  assert_false(timed);
  return way;
}

static void test_tune(void **state) {
  (void)state;
  size_t same[TDIST_CPU_COPY_LOOK], mixed[TDIST_CPU_COPY_LOOK];
  int64_t slow[TDIST_CPU_COPY_LOOK], fast[TDIST_CPU_COPY_LOOK];
  for (unsigned k = 0; k < TDIST_CPU_COPY_LOOK; k++) {
    same[k] = 65536;
    mixed[k] = k & 1 ? 131072 : 65536; /* the loop copies twice the bytes */
    slow[k] = 12000;
    fast[k] = 4000;
  }
  tdist__cpu_copy_tune_t t = {0};
  assert_int_equal(look(&t, same, slow, fast), 1); /* the loop three times as fast */
  /* ... and it stays so until the next look. */
  for (unsigned k = TDIST_CPU_COPY_LOOK + 1; k < TDIST_CPU_COPY_EVERY; k++) {
    int timed;
    assert_int_equal(tdist__cpu_copy_tune_way(&t, &timed), 1);
    assert_false(timed);
  }
  /* The next look starts over: now the string move is faster. */
  assert_int_equal(look(&t, same, fast, slow), 0);

  /* Per byte: the loop took 3000 ns for 128 KiB, the string move 4000 for
   * 64 KiB: the loop is 2.7x as fast. At 6000 ns (1.33x) the string move
   * stays. */
  tdist__cpu_copy_tune_t u = {0};
  int64_t loop3[TDIST_CPU_COPY_LOOK], loop6[TDIST_CPU_COPY_LOOK];
  for (unsigned k = 0; k < TDIST_CPU_COPY_LOOK; k++)
    loop3[k] = 3000, loop6[k] = 6000;
  assert_int_equal(look(&u, mixed, fast, loop3), 1);
  for (unsigned k = TDIST_CPU_COPY_LOOK + 1; k < TDIST_CPU_COPY_EVERY; k++) {
    int timed;
    (void)tdist__cpu_copy_tune_way(&u, &timed);
  }
  assert_int_equal(look(&u, mixed, fast, loop6), 0);

  /* One preempted string move (100x) in a look where it is faster: its
   * best still wins. */
  tdist__cpu_copy_tune_t v = {0};
  int64_t hiccup[TDIST_CPU_COPY_LOOK];
  memcpy(hiccup, fast, sizeof(hiccup));
  hiccup[0] = 400000;
  assert_int_equal(look(&v, same, hiccup, slow), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_exact),
      cmocka_unit_test(test_stream),
      cmocka_unit_test(test_tune),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
