/*
 * test_liveness.c - failures found through the store (issue 7), with real
 * processes, a real TCP store hosted by rank 0, and the test backend:
 *   - a rank stopped with SIGSTOP stops heartbeating and is declared dead:
 *     the others' pending ops fail with REMOTE_FAILED naming it within the
 *     heartbeat timeout (1.5 s here) plus one second;
 *   - a rank killed with SIGKILL is declared dead as soon as its store
 *     connection closes;
 *   - a rank that skips a collective: the op times out on a rank that ran
 *     it, and the error on every rank names the rank that never reached it.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
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

/* Join, publish our pid (rank 0 kills a stopped rank with it), and wait
 * until every rank has joined before anyone fails. */
static int join(int rank, int n, int64_t timeout_ms, tb_world_t *w) {
  MP_CHECK(tb_world_join(rank, n, port, timeout_ms, w) == 0);
  char key[32], pid[32];
  snprintf(key, sizeof(key), "pid/%d", rank);
  snprintf(pid, sizeof(pid), "%d", (int)getpid());
  MP_CHECK_RC(tdist_store_set(w->st, key, pid, strlen(pid)));
  return tb_store_barrier(w->st, "joined", n);
}

/* Survivors: the pending op fails with REMOTE_FAILED naming rank 2 in time. */
static int expect_rank2_dead(tdist_work_t *w, int64_t t0, int64_t bound_ms, const char *why) {
  int rc = tdist_work_wait(w, 20000);
  int64_t took = tdist__now_ms() - t0;
  const char *msg = tdist_work_error_message(w);
  if (rc != TDIST_ERR_REMOTE_FAILED || took > bound_ms)
    fprintf(stderr, "got %s after %lld ms: %s\n", tdist_err_name(rc), (long long)took, msg);
  MP_CHECK(rc == TDIST_ERR_REMOTE_FAILED);
  MP_CHECK(strstr(msg, "rank 2 (world rank 2) failed") != NULL);
  MP_CHECK(strstr(msg, why) != NULL);
  MP_CHECK(took <= bound_ms);
  return 0;
}

static int stopped_child(int rank, int n, void *arg) {
  tb_world_t tw;
  MP_CHECK(join(rank, N, 60000, &tw) == 0);
  tdist_group_t *g = tw.g;
  tb_set_mode(TB_HELD);
  tdist_work_t *w;
  MP_CHECK_RC(tdist_all_reduce(g, NULL, NULL, 0, TDIST_FLOAT32, TDIST_SUM, NULL, &w));
  MP_CHECK(tb_store_barrier(tw.st, "submitted", N) == 0);
  int64_t t0 = tdist__now_ms();
  if (rank == 2) raise(SIGSTOP); /* rank 0 kills us once done */
  MP_CHECK(expect_rank2_dead(w, t0, 1500 + 1000 + 500, "no heartbeat") == 0);
  tdist_work_release(w);
  if (rank == 0) {
    void *pid;
    size_t len;
    MP_CHECK_RC(tdist_store_get(tw.st, "pid/2", &pid, &len, 1000));
    char text[32] = "";
    memcpy(text, pid, len < sizeof(text) - 1 ? len : sizeof(text) - 1);
    tdist_store_free(pid);
    kill(atoi(text), SIGKILL);
  }
  tb_set_mode(TB_COMPLETE);
  return tb_world_leave(&tw, N - 1);
}

static int killed_child(int rank, int n, void *arg) {
  tb_world_t tw;
  MP_CHECK(join(rank, N, 60000, &tw) == 0);
  tdist_group_t *g = tw.g;
  tb_set_mode(TB_HELD);
  tdist_work_t *w;
  MP_CHECK_RC(tdist_barrier(g, NULL, &w));
  MP_CHECK(tb_store_barrier(tw.st, "submitted", N) == 0);
  int64_t t0 = tdist__now_ms();
  if (rank == 2) raise(SIGKILL);
  MP_CHECK(expect_rank2_dead(w, t0, 1000, "connection closed") == 0);
  tdist_work_release(w);
  tb_set_mode(TB_COMPLETE);
  return tb_world_leave(&tw, N - 1);
}

static int desync_child(int rank, int n, void *arg) {
  tb_world_t tw;
  MP_CHECK(join(rank, N, rank == 1 ? 1000 : 60000, &tw) == 0);
  tdist_group_t *g = tw.g;
  tb_set_mode(TB_COMPLETE);
  MP_CHECK_RC(tdist_barrier(g, NULL, NULL)); /* seq 0 everywhere */
  if (rank == 2) { /* skips seq 1; its copy is aborted by the others' record */
    for (int i = 0; i < 1000 && !tdist_group_is_aborted(g); i++)
      usleep(10000);
    MP_CHECK(tdist_group_is_aborted(g));
  } else {
    tb_set_mode(TB_STALL);
    tdist_work_t *w;
    MP_CHECK_RC(tdist_all_reduce(g, NULL, NULL, 0, TDIST_FLOAT32, TDIST_SUM, NULL, &w));
    int rc = tdist_work_wait(w, 20000);
    const char *msg = tdist_work_error_message(w);
    if (!strstr(msg, "rank 2 of group 'world' had not reached seq 1")) fprintf(stderr, "%s\n", msg);
    MP_CHECK(rc == (rank == 1 ? TDIST_ERR_TIMEOUT : TDIST_ERR_ABORTED));
    MP_CHECK(strstr(msg, "rank 2 of group 'world' had not reached seq 1") != NULL);
    tdist_work_release(w);
  }
  tb_set_mode(TB_COMPLETE);
  return tb_world_leave(&tw, N);
}

/* 4 ranks; rank 1 is killed; the survivors shrink and go on with 3. */
static int shrink_child(int rank, int n, void *arg) {
  tb_world_t tw;
  MP_CHECK(tb_world_join(rank, n, port, 20000, &tw) == 0);
  tdist_group_t *g = tw.g, *s = NULL;
  tb_set_mode(TB_HELD);
  tdist_work_t *w;
  MP_CHECK_RC(tdist_barrier(g, NULL, &w));
  MP_CHECK(tb_store_barrier(tw.st, "submitted", n) == 0);
  if (rank == 1) raise(SIGKILL);
  MP_CHECK(tdist_work_wait(w, 20000) == TDIST_ERR_REMOTE_FAILED);
  tdist_work_release(w);

  MP_CHECK_RC(tdist_group_shrink(g, NULL, &s));
  MP_CHECK(tdist_group_size(s) == 3);
  int expect_rank = rank == 0 ? 0 : rank - 1;
  MP_CHECK(tdist_group_rank(s) == expect_rank);
  MP_CHECK(tdist_group_global_rank(s, 0) == 0);
  MP_CHECK(tdist_group_global_rank(s, 1) == 2);
  MP_CHECK(tdist_group_global_rank(s, 2) == 3);
  MP_CHECK(!tdist_group_is_aborted(s));
  tb_set_mode(TB_COMPLETE);
  MP_CHECK_RC(tdist_barrier(s, NULL, NULL));
  MP_CHECK(tdist_barrier(g, NULL, NULL) == TDIST_ERR_REMOTE_FAILED); /* old group stays dead */
  tdist_group_destroy(g); /* the store stays up: the shrunk group still uses it */
  MP_CHECK_RC(tdist_barrier(s, NULL, NULL));
  tw.g = s;
  return tb_world_leave(&tw, n - 1);
}

static void survivors_shrink_and_go_on(void **state) {
  (void)state;
  port = tdist_mp_free_port();
  int codes[4];
  tdist_mp_run_codes(4, shrink_child, NULL, 60, codes);
  assert_int_equal(codes[0], 0);
  assert_int_equal(codes[1], 128 + SIGKILL);
  assert_int_equal(codes[2], 0);
  assert_int_equal(codes[3], 0);
}

static void stopped_rank_is_declared_dead(void **state) {
  (void)state;
  port = tdist_mp_free_port();
  int codes[N];
  tdist_mp_run_codes(N, stopped_child, NULL, 60, codes);
  assert_int_equal(codes[0], 0);
  assert_int_equal(codes[1], 0);
  assert_int_equal(codes[2], 128 + SIGKILL);
}

static void killed_rank_is_declared_dead_at_once(void **state) {
  (void)state;
  port = tdist_mp_free_port();
  int codes[N];
  tdist_mp_run_codes(N, killed_child, NULL, 60, codes);
  assert_int_equal(codes[0], 0);
  assert_int_equal(codes[1], 0);
  assert_int_equal(codes[2], 128 + SIGKILL);
}

static void skipped_collective_names_the_rank(void **state) {
  (void)state;
  port = tdist_mp_free_port();
  assert_int_equal(tdist_mp_run(N, desync_child, NULL, 60), 0);
}

int main(void) {
  setenv("TDIST_HEARTBEAT_TIMEOUT_MS", "1500", 1);
  setenv("TDIST_HEARTBEAT_INTERVAL_MS", "100", 1);
  setenv("TDIST_TRACE_ON_FAILURE", "0", 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(stopped_rank_is_declared_dead),
      cmocka_unit_test(killed_rank_is_declared_dead_at_once),
      cmocka_unit_test(skipped_collective_names_the_rank),
      cmocka_unit_test(survivors_shrink_and_go_on),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
