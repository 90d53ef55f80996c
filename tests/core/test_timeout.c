/*
 * test_timeout.c - per-op timeouts: a stalled op fails with TIMEOUT, its
 * group is aborted exactly once, every other pending op fails with ABORTED
 * naming the op that timed out, later submissions fail at once; per-op
 * overrides; abort on demand; destroy with work pending.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "util/clock.h"
#include "core/group/group.h"
#include "tb_world.h"
#include "test_backend.h"
#include "tdist/tdist.h"

static float buf[4];

static void stalled_op_times_out_and_aborts_group(void **state) {
  (void)state;
  tdist_group_t *g;
  assert_int_equal(tb_group_create(1, 3, 200, &g), 0);
  int aborts0 = tb_abort_count();
  tb_set_mode(TB_STALL);
  tdist_work_t *a, *b;
  int64_t t0 = tdist__now_ms();
  assert_int_equal(tdist_all_reduce(g, buf, buf, 4, TDIST_FLOAT32, TDIST_SUM, NULL, &a), 0);
  tdist_op_opts_t long_timeout = {.mask = TDIST_OP_FIELD_TIMEOUT, .timeout_ms = 60000};
  assert_int_equal(tdist_broadcast(g, buf, 4, TDIST_FLOAT32, 0, &long_timeout, &b), 0);
  /* wait(0): bounded by the op's own deadline */
  assert_int_equal(tdist_work_wait(a, 0), TDIST_ERR_TIMEOUT);
  int64_t took = tdist__now_ms() - t0;
  assert_true(took >= 190 && took < 3000);
  assert_int_equal(tdist_work_state(a), TDIST_WORK_TIMED_OUT);
  assert_non_null(
      strstr(tdist_work_error_message(a), "all_reduce seq 0 of group 'world' (rank 1/3)"));
  assert_non_null(strstr(tdist_work_error_message(a), "timed out after"));

  assert_int_equal(tdist_work_wait(b, 5000), TDIST_ERR_ABORTED);
  assert_int_equal(tdist_work_state(b), TDIST_WORK_ABORTED);
  assert_non_null(strstr(tdist_work_error_message(b), "broadcast seq 1"));
  assert_non_null(strstr(tdist_work_error_message(b), "all_reduce seq 0 timed out"));
  assert_int_equal(tb_abort_count(), aborts0 + 1);
  assert_int_equal(tdist_group_is_aborted(g), 1);

  tb_set_mode(TB_COMPLETE);
  tdist_work_t *c = NULL;
  assert_int_equal(tdist_barrier(g, NULL, &c), TDIST_ERR_ABORTED);
  assert_null(c);
  assert_non_null(strstr(tdist_last_error(), "all_reduce seq 0 timed out"));
  tdist_work_release(a);
  tdist_work_release(b);
  assert_int_equal(tdist_group_destroy(g), 0);
}

static void per_op_timeout_overrides_group(void **state) {
  (void)state;
  tdist_group_t *g;
  assert_int_equal(tb_group_create(0, 2, 60000, &g), 0);
  tb_set_mode(TB_STALL);
  tdist_op_opts_t o = {.mask = TDIST_OP_FIELD_TIMEOUT, .timeout_ms = 100};
  tdist_work_t *w;
  int64_t t0 = tdist__now_ms();
  assert_int_equal(tdist_barrier(g, &o, &w), 0);
  assert_int_equal(tdist_work_wait(w, 10000), TDIST_ERR_TIMEOUT);
  assert_true(tdist__now_ms() - t0 < 5000);
  tdist_work_release(w);
  tb_set_mode(TB_COMPLETE);
  tdist_group_destroy(g);
}

static void abort_on_demand(void **state) {
  (void)state;
  tdist_group_t *g;
  assert_int_equal(tb_group_create(0, 2, 60000, &g), 0);
  tb_set_mode(TB_STALL);
  tdist_work_t *w;
  assert_int_equal(tdist_gather(g, buf, buf, 2, TDIST_FLOAT32, 0, NULL, &w), 0);
  int aborts0 = tb_abort_count();
  assert_int_equal(tdist_group_abort(g, "operator asked"), 0);
  assert_int_equal(tdist_group_abort(g, "twice"), 0); /* idempotent */
  assert_int_equal(tb_abort_count(), aborts0 + 1);
  assert_int_equal(tdist_work_wait(w, 5000), TDIST_ERR_ABORTED);
  assert_non_null(strstr(tdist_work_error_message(w), "operator asked"));
  tdist_work_release(w);
  tb_set_mode(TB_COMPLETE);
  assert_int_equal(tdist_group_destroy(g), 0);
}

static void destroy_with_pending_work_aborts_it(void **state) {
  (void)state;
  tdist_group_t *g;
  assert_int_equal(tb_group_create(0, 2, 150, &g), 0);
  tb_set_mode(TB_HELD);
  tdist_work_t *w;
  tdist_op_opts_t o = {.mask = TDIST_OP_FIELD_TIMEOUT, .timeout_ms = 60000};
  assert_int_equal(tdist_scatter(g, buf, buf, 2, TDIST_FLOAT32, 0, &o, &w), 0);
  int64_t t0 = tdist__now_ms();
  assert_int_equal(tdist_group_destroy(g), TDIST_ERR_TIMEOUT);
  assert_true(tdist__now_ms() - t0 < 5000);
  /* the handle outlives its group and tells what happened */
  assert_int_equal(tdist_work_is_completed(w), 1);
  assert_int_equal(tdist_work_status(w), TDIST_ERR_ABORTED);
  assert_non_null(strstr(tdist_work_error_message(w), "destroyed"));
  tdist_work_release(w);
  tb_set_mode(TB_COMPLETE);
}

static void other_groups_are_unaffected(void **state) {
  (void)state;
  tdist_group_t *a, *b;
  assert_int_equal(tb_group_create(0, 2, 100, &a), 0);
  assert_int_equal(tb_group_create(0, 2, 60000, &b), 0);
  tb_set_mode(TB_STALL);
  tdist_work_t *wa;
  assert_int_equal(tdist_barrier(a, NULL, &wa), 0);
  assert_int_equal(tdist_work_wait(wa, 0), TDIST_ERR_TIMEOUT);
  tb_set_mode(TB_POLL);
  assert_int_equal(tdist_barrier(b, NULL, NULL), 0);
  assert_int_equal(tdist_group_is_aborted(b), 0);
  tdist_work_release(wa);
  tb_set_mode(TB_COMPLETE);
  tdist_group_destroy(a);
  tdist_group_destroy(b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(stalled_op_times_out_and_aborts_group),
      cmocka_unit_test(per_op_timeout_overrides_group),
      cmocka_unit_test(abort_on_demand),
      cmocka_unit_test(destroy_with_pending_work_aborts_it),
      cmocka_unit_test(other_groups_are_unaffected),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
