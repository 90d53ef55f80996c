/*
 * test_monitor.c - abort records across processes: when one rank's op times
 * out, or one rank aborts on demand, the other ranks' copies of the group
 * abort at once (long before their own timeout) with a message naming the
 * rank and the cause. Real processes, a real TCP store, the test backend.
 * Also for a rank still creating the group when the record comes (an
 * injected delay before it registers): an abort record of the group, and
 * a death record of one of its members, are kept and applied as it
 * registers. The test backend sends nothing between ranks, so the records
 * are the only way the cause can reach that rank. And a timeout waiting on
 * a member that destroyed the group names that (its heartbeat lists the
 * destroyed group), not "had not reached"; and ranks named right after
 * p2p ops that only some ranks ran (their seqs no longer line up).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "util/clock.h"
#include "core/group/group.h"
#include "mp.h"
#include "tb_world.h"
#include "test_backend.h"
#include "tdist/tdist.h"
#include "util/inject.h"

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

/* Wait up to 10 s for g to abort. */
static int aborted_soon(tdist_group_t *g) {
  for (int i = 0; i < 1000 && !tdist_group_is_aborted(g); i++)
    usleep(10000);
  return tdist_group_is_aborted(g);
}

/* arg: 0 rank 2 aborts the new group on demand, 1 rank 2 is killed. Rank 1
 * registers its copy of the group 1.5 s late; the record comes meanwhile. */
static int late_member_child(int rank, int n, void *arg) {
  int kill_it = *(int *)arg;
  tb_world_t tw;
  MP_CHECK(tb_world_join(rank, N, port, 60000, &tw) == 0);
  tb_set_mode(TB_HELD);
  int all[N] = {0, 1, 2};
  tdist_group_t *sub = NULL;
  if (rank == 1) tdist__inject_arm("group.register", 1500);
  MP_CHECK_RC(tdist_new_group(tw.g, all, N, NULL, &sub));
  if (rank == 2) {
    if (kill_it) raise(SIGKILL);
    MP_CHECK_RC(tdist_group_abort(sub, "operator pulled the plug early"));
  }
  const char *want = kill_it ? "rank 2 (world rank 2) failed: the store declared it dead"
                     : rank == 2
                         ? "aborted on demand: operator pulled the plug early"
                         : "rank 2 (world rank 2) aborted the group: aborted on demand: operator";
  /* On rank 1 the record came before the group registered: it is applied
   * as it registers, before tdist_new_group returns. */
  if (rank == 1) MP_CHECK(tdist_group_is_aborted(sub));
  MP_CHECK(aborted_soon(sub));
  int rc = tdist_barrier(sub, NULL, NULL);
  const char *msg = tdist_last_error();
  if (rc == 0 || !strstr(msg, want))
    fprintf(stderr, "rank %d: %s: %s\n", rank, tdist_err_name(rc), msg);
  MP_CHECK(rc == (kill_it ? TDIST_ERR_REMOTE_FAILED : TDIST_ERR_ABORTED));
  MP_CHECK(strstr(msg, want) != NULL);
  tdist_group_destroy(sub);
  tb_set_mode(TB_COMPLETE);
  (void)n;
  return tb_world_leave(&tw, kill_it ? N - 1 : N);
}

/* Rank 2 destroys a new group; ranks 0 and 1 then wait in a barrier on it
 * (the test backend holds it: nothing tells them) until its 1.5 s timeout
 * (or the other's abort record): the diagnosis, from rank 2's heartbeat,
 * says rank 2 had destroyed the group, not that it had not reached the op. */
static int destroyed_member_child(int rank, int n, void *arg) {
  (void)arg;
  setenv("TDIST_HEARTBEAT_INTERVAL_MS", "100", 1);
  tb_world_t tw;
  MP_CHECK(tb_world_join(rank, N, port, 60000, &tw) == 0);
  int all[N] = {0, 1, 2};
  tdist_group_opts_t go = {.mask = TDIST_GROUP_FIELD_TIMEOUT, .timeout_ms = 1500};
  tdist_group_t *sub = NULL;
  MP_CHECK_RC(tdist_new_group(tw.g, all, N, &go, &sub));
  if (rank == 2) {
    MP_CHECK_RC(tdist_group_destroy(sub));
    usleep(4000000); /* beats with the destroyed group listed */
  } else {
    usleep(500000); /* rank 2 destroyed it and beat since */
    tb_set_mode(TB_STALL);
    int rc = tdist_barrier(sub, NULL, NULL);
    const char *msg = tdist_last_error();
    const char *want = "rank 2 of group 'world/0' had destroyed the group before seq 0";
    /* Its own timeout, or the other waiter's first (its abort record
     * carries the same diagnosis). */
    if ((rc != TDIST_ERR_TIMEOUT && rc != TDIST_ERR_ABORTED) || !strstr(msg, want))
      fprintf(stderr, "rank %d: %s: %s\n", rank, tdist_err_name(rc), msg);
    MP_CHECK(rc == TDIST_ERR_TIMEOUT || rc == TDIST_ERR_ABORTED);
    /* (the other waiter may be named as not having reached it: under load
     * it can submit later than this rank's diagnosis looks) */
    MP_CHECK(strstr(msg, want) != NULL);
    tb_set_mode(TB_COMPLETE);
    tdist_group_destroy(sub);
  }
  (void)n;
  return tb_world_leave(&tw, N);
}

static void destroyed_member_is_named(void **state) {
  (void)state;
  port = tdist_mp_free_port();
  assert_int_equal(tdist_mp_run(N, destroyed_member_child, NULL, 60), 0);
}

/* Ranks 1 and 2 exchange three p2p ops that rank 0 has no part in (a
 * pipeline's stages do so), so the group's seqs no longer line up: rank 0's
 * next op is its seq 0, rank 2's its seq 3. Then rank 1 hangs.
 *   arg 0: ranks 0 and 2 wait in a barrier (collective 0 everywhere) until
 *          its 1.5 s timeout: both name rank 1 alone (was: rank 0 said
 *          "every rank ... had reached seq 0 (stuck in the backend)", its
 *          seq 0 against rank 1's 3; rank 2's would have named "ranks 0, 1",
 *          and its diagnosis outlasted the grace: no verdict at 4.5 s).
 *   arg 1: rank 0 receives from rank 1, which never sends: its verdict
 *          names rank 1 as the peer without claiming that it posted the
 *          send (was: "every rank ... had reached seq 0 (stuck in the
 *          backend)"); heartbeats do not count the ops of each pair.
 *   arg 2: as 1, but rank 1 destroyed the group: named so (a peer gone
 *          from the group never posts its side).
 * The work's own message (its bounded copy) is checked. */
static int p2p_shift_child(int rank, int n, void *arg) {
  int recv_case = *(int *)arg;
  setenv("TDIST_HEARTBEAT_INTERVAL_MS", "100", 1);
  tb_world_t tw;
  MP_CHECK(tb_world_join(rank, N, port, 60000, &tw) == 0);
  int all[N] = {0, 1, 2};
  tdist_group_opts_t go = {.mask = TDIST_GROUP_FIELD_TIMEOUT, .timeout_ms = 1500};
  tdist_group_t *sub = NULL;
  MP_CHECK_RC(tdist_new_group(tw.g, all, N, &go, &sub));
  float x[4] = {0};
  for (int i = 0; i < 3; i++) {
    if (rank == 1) MP_CHECK_RC(tdist_send(sub, x, 4, TDIST_FLOAT32, 2, NULL));
    if (rank == 2) MP_CHECK_RC(tdist_recv(sub, x, 4, TDIST_FLOAT32, 1, NULL));
  }
  if (rank == 1) {
    if (recv_case == 2) { /* gone from the group, not hung */
      MP_CHECK_RC(tdist_group_destroy(sub));
      sub = NULL;
    }
    usleep(4000000); /* beats with 3 p2p ops and no collective */
  } else if (!recv_case || rank == 0) {
    usleep(500000); /* every rank beat since the exchange */
    tb_set_mode(TB_STALL);
    tdist_work_t *w = NULL;
    MP_CHECK_RC(recv_case ? tdist_irecv(sub, x, 4, TDIST_FLOAT32, 1, NULL, &w)
                          : tdist_barrier(sub, NULL, &w));
    int rc = tdist_work_wait(w, 20000);
    const char *msg = tdist_work_error_message(w);
    fprintf(stderr, "p2p_shift (%s) rank %d: %s: %s\n", recv_case ? "recv" : "barrier", rank,
            tdist_err_name(rc), msg);
    MP_CHECK(rc == TDIST_ERR_TIMEOUT || rc == TDIST_ERR_ABORTED);
    MP_CHECK(strstr(msg, "stuck in the backend") == NULL);
    MP_CHECK(strstr(msg, "ranks ") == NULL);
    if (recv_case == 2)
      MP_CHECK(strstr(msg, "rank 1 of group 'world/0' had destroyed the group before seq 0") !=
               NULL);
    else if (recv_case)
      MP_CHECK(strstr(msg, "its peer, rank 1 of group 'world/0', had submitted every collective "
                           "before seq 0") != NULL);
    else
      MP_CHECK(strstr(msg, "rank 1 of group 'world/0' had not reached seq") != NULL);
    tdist_work_release(w);
    tb_set_mode(TB_COMPLETE);
  } else {
    usleep(3000000);
  }
  if (sub) tdist_group_destroy(sub);
  (void)n;
  return tb_world_leave(&tw, N);
}

static void p2p_shift(int recv_case) {
  port = tdist_mp_free_port();
  assert_int_equal(tdist_mp_run(N, p2p_shift_child, &recv_case, 60), 0);
}
static void p2p_does_not_shift_collectives(void **state) {
  (void)state;
  p2p_shift(0);
}
static void p2p_peer_past_collectives(void **state) {
  (void)state;
  p2p_shift(1);
}
static void p2p_peer_destroyed_group(void **state) {
  (void)state;
  p2p_shift(2);
}

static void record_before_register(int kill_it) {
  port = tdist_mp_free_port();
  int codes[N];
  tdist_mp_run_codes(N, late_member_child, &kill_it, 60, codes);
  assert_int_equal(codes[0], 0);
  assert_int_equal(codes[1], 0);
  assert_int_equal(codes[2], kill_it ? 128 + SIGKILL : 0);
}

static void abort_record_before_register(void **state) {
  (void)state;
  record_before_register(0);
}

static void death_record_before_register(void **state) {
  (void)state;
  record_before_register(1);
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
      cmocka_unit_test(abort_record_before_register),
      cmocka_unit_test(death_record_before_register),
      cmocka_unit_test(destroyed_member_is_named),
      cmocka_unit_test(p2p_does_not_shift_collectives),
      cmocka_unit_test(p2p_peer_past_collectives),
      cmocka_unit_test(p2p_peer_destroyed_group),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
