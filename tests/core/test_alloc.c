/*
 * test_alloc.c - the runtime's allocator, and the promise that submitting
 * and completing ops allocates nothing once the work pool has grown.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "util/alloc.h"
#include "core/work/work.h"
#include "tb_world.h"
#include "test_backend.h"
#include "tdist/tdist.h"

static void alloc_roundtrip(void **state) {
  (void)state;
  uint64_t n0 = tdist__alloc_count();
  char *p = tdist__malloc(100);
  assert_non_null(p);
  memset(p, 7, 100);
  p = tdist__realloc(p, 100000);
  assert_non_null(p);
  assert_int_equal(p[99], 7);
  tdist__free(p);
  int *z = tdist__calloc(1000, sizeof(int));
  for (int i = 0; i < 1000; i++)
    assert_int_equal(z[i], 0);
  tdist__free(z);
  assert_null(tdist__calloc(SIZE_MAX / 2, 4));
  char *s = tdist__strdup("tdist");
  assert_string_equal(s, "tdist");
  tdist__free(s);
  tdist__free(NULL);
  assert_true(tdist__alloc_count() - n0 >= 4);
#ifdef TDIST_HAVE_JEMALLOC
  assert_non_null(strstr(tdist__alloc_backend(), "jemalloc arena"));
#else
  assert_string_equal(tdist__alloc_backend(), "malloc");
#endif
}

static void steady_state_allocates_nothing(void **state) {
  (void)state;
  tdist_group_t *g;
  float buf[4];
  assert_int_equal(tb_group_create(0, 2, 10000, &g), 0);
  for (tb_mode_t mode = TB_COMPLETE; mode <= TB_POLL; mode++) {
    tb_set_mode(mode);
    tdist_work_t *w[32];
    for (int round = 0; round < 3; round++) { /* the first round grows the pool */
      uint64_t a0 = tdist__alloc_count(), p0 = tdist__work_pool_size();
      for (int i = 0; i < 32; i++)
        assert_int_equal(tdist_all_reduce(g, buf, buf, 4, TDIST_FLOAT32, TDIST_SUM, NULL, &w[i]),
                         0);
      assert_int_equal(tdist_wait_all(w, 32, 10000), 0);
      for (int i = 0; i < 32; i++)
        tdist_work_release(w[i]);
      assert_int_equal(tdist_barrier(g, NULL, NULL), 0); /* runtime refs dropped */
      if (round > 0) {
        assert_int_equal(tdist__alloc_count(), a0);
        assert_int_equal(tdist__work_pool_size(), p0);
      }
    }
  }
  tb_set_mode(TB_COMPLETE);
  tdist_group_destroy(g);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(alloc_roundtrip),
      cmocka_unit_test(steady_state_allocates_nothing),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
