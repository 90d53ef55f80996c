/*
 * test_monitor.c - abort records across processes: when one rank's op times
 * out, or one rank aborts on demand, the other ranks' copies of the group
 * abort at once (long before their own timeout) with a message naming the
 * rank and the cause. Real processes, a real TCP store, the test backend.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "util/clock.h"
#include "core/group/group.h"
#include "mp.h"
#include "tb_world.h"
#include "test_backend.h"
#include "tdist/tdist.h"

#define N 3
static int port;

static int timeout_child(int rank, int n, void *arg) {
  (void)n;
  (void)arg;
  tb_world_t tw;
  MP_CHECK(tb_world_join(rank, N, port, rank == 1 ? 300 : 60000, &tw) == 0);
  tdist_group_t *g = tw.g;
  tb_set_mode(TB_STALL);
  tdist_work_t *w;
  MP_CHECK_RC(tdist_all_reduce(g, NULL, NULL, 0, TDIST_FLOAT32, TDIST_SUM, NULL, &w));
  int64_t t0 = tdist__now_ms();
  int rc = tdist_work_wait(w, 15000);
  int64_t took = tdist__now_ms() - t0;
  if (rank == 1) {
    MP_CHECK(rc == TDIST_ERR_TIMEOUT);
  } else {
    if (rc != TDIST_ERR_ABORTED) fprintf(stderr, "rank %d: %s\n", rank, tdist_err_name(rc));
    MP_CHECK(rc == TDIST_ERR_ABORTED);
    const char *msg = tdist_work_error_message(w);
    MP_CHECK(strstr(msg, "rank 1 (world rank 1) aborted the group") != NULL);
    MP_CHECK(strstr(msg, "all_reduce seq 0 timed out") != NULL);
    MP_CHECK(took < 5000); /* not our own 60 s timeout */
  }
  tdist_work_release(w);
  tb_set_mode(TB_COMPLETE);
  return tb_world_leave(&tw, N);
}

static int on_demand_child(int rank, int n, void *arg) {
  (void)n;
  (void)arg;
  tb_world_t tw;
  MP_CHECK(tb_world_join(rank, N, port, 60000, &tw) == 0);
  tdist_group_t *g = tw.g;
  tb_set_mode(TB_HELD);
  tdist_work_t *w;
  MP_CHECK_RC(tdist_barrier(g, NULL, &w));
  if (rank == 2) {
    usleep(100000);
    MP_CHECK_RC(tdist_group_abort(g, "operator pulled the plug"));
  }
  int rc = tdist_work_wait(w, 15000);
  MP_CHECK(rc == TDIST_ERR_ABORTED);
  MP_CHECK(strstr(tdist_work_error_message(w), "operator pulled the plug") != NULL);
  if (rank != 2)
    MP_CHECK(strstr(tdist_work_error_message(w), "rank 2 (world rank 2) aborted") != NULL);
  MP_CHECK(tdist_group_is_aborted(g));
  tdist_work_release(w);
  tb_set_mode(TB_COMPLETE);
  return tb_world_leave(&tw, N);
}

static void timeout_on_one_rank_aborts_all(void **state) {
  (void)state;
  port = tdist_mp_free_port();
  assert_int_equal(tdist_mp_run(N, timeout_child, NULL, 60), 0);
}

static void abort_on_demand_reaches_all(void **state) {
  (void)state;
  port = tdist_mp_free_port();
  assert_int_equal(tdist_mp_run(N, on_demand_child, NULL, 60), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(timeout_on_one_rank_aborts_all),
      cmocka_unit_test(abort_on_demand_reaches_all),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
