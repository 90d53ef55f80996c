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

#include "core/clock.h"
#include "core/group.h"
#include "mp.h"
#include "test_backend.h"
#include "tdist/tdist.h"

#define N 3
static int port;

/* Rank 0 hosts the server; everyone connects and makes a world group. */
static int join(int rank, int64_t timeout_ms, tdist_store_server_t **srv, tdist_store_t **st,
                tdist_group_t **g) {
  *srv = NULL;
  if (rank == 0) {
    tdist_store_server_opts_t so = {.mask = TDIST_STORE_SERVER_FIELD_HOST |
                                            TDIST_STORE_SERVER_FIELD_PORT,
                                    .host = "127.0.0.1", .port = port};
    MP_CHECK_RC(tdist_store_server_start(&so, srv));
  }
  tdist_store_opts_t o = {.mask = TDIST_STORE_FIELD_TIMEOUT, .timeout_ms = 20000};
  MP_CHECK_RC(tdist_store_connect("127.0.0.1", port, &o, st));
  MP_CHECK_RC(tdist__group_create(&tb_backend, rank, N, "world", *st, timeout_ms, NULL, g));
  return 0;
}

/* Everyone reaches here before rank 0 stops the server. */
static int leave(tdist_store_server_t *srv, tdist_store_t *st, tdist_group_t *g) {
  MP_CHECK_RC(tdist_store_add(st, "left", 1, NULL));
  tdist_group_destroy(g);
  if (srv) {
    int64_t n = 0;
    for (int i = 0; i < 2000 && n < N; i++) {
      tdist_store_add(st, "left", 0, &n);
      usleep(5000);
    }
  }
  tdist_store_release(st);
  tdist_store_server_stop(srv);
  return 0;
}

static int timeout_child(int rank, int n, void *arg) {
  (void)n;
  (void)arg;
  tdist_store_server_t *srv;
  tdist_store_t *st;
  tdist_group_t *g;
  MP_CHECK(join(rank, rank == 1 ? 300 : 60000, &srv, &st, &g) == 0);
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
    MP_CHECK(strstr(msg, "rank 1 aborted the group") != NULL);
    MP_CHECK(strstr(msg, "all_reduce seq 0 timed out") != NULL);
    MP_CHECK(took < 5000); /* not our own 60 s timeout */
  }
  tdist_work_release(w);
  tb_set_mode(TB_COMPLETE);
  return leave(srv, st, g);
}

static int on_demand_child(int rank, int n, void *arg) {
  (void)n;
  (void)arg;
  tdist_store_server_t *srv;
  tdist_store_t *st;
  tdist_group_t *g;
  MP_CHECK(join(rank, 60000, &srv, &st, &g) == 0);
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
  if (rank != 2) MP_CHECK(strstr(tdist_work_error_message(w), "rank 2 aborted") != NULL);
  MP_CHECK(tdist_group_is_aborted(g));
  tdist_work_release(w);
  tb_set_mode(TB_COMPLETE);
  return leave(srv, st, g);
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
