/*
 * test_nccl_errors.c - the NCCL backend's control paths, with NCCL and CUDA
 * scripted by fake_nccl.c (loaded as libfake_nccl.so):
 *   - an asynchronous error appearing mid-flight fails exactly the pending
 *     works, with NCCL's error text, and aborts the communicator once;
 *   - an end event that never completes times out: TIMEOUT for that op,
 *     ABORTED for the others, ncclCommAbort exactly once;
 *   - tdist_group_abort aborts the communicator once; later ops are refused;
 *   - an abort while a caller waits out an enqueue in progress (holding the
 *     group's mutex) ends that wait at once, without stalling the progress
 *     thread until the op's timeout;
 *   In all of these ncclCommAbort runs on the library's worker thread (the
 *   fake counts a violation if it runs on the progress thread), so the
 *   tests wait for the call (nt_wait_count) rather than expect it at once;
 *   - ncclInProgress during init and split is polled to success, or to the
 *     timeout (then the new communicator is aborted);
 *   - split passes color/key for members and NCCL_SPLIT_NOCOLOR for the
 *     others (4 forked ranks, new_group and a 2x2 mesh), after the unique id
 *     went through the store;
 *   - destroy finalizes, then destroys; a finalize that never ends aborts.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <unistd.h>

#include <cmocka.h>

#include "nccl_test_util.h"

static char buf[1024];

static tdist_group_t *world1(int64_t timeout_ms) {
  fake_reset();
  tdist_group_t *g = NULL;
  int rc = nt_world(0, 1, tdist_mp_free_port(), timeout_ms, &g);
  if (rc) fprintf(stderr, "init: %s\n", tdist_last_error());
  assert_int_equal(rc, 0);
  return g;
}

static void test_async_error_mid_flight(void **state) {
  tdist_group_t *g = world1(10000);
  fake_script_t sc = {.ev_mode = FAKE_EV_MANUAL};
  fake_set_script(&sc);
  tdist_work_t *w[3];
  for (int i = 0; i < 3; i++)
    assert_int_equal(tdist_all_reduce(g, buf, buf, 8, TDIST_FLOAT32, TDIST_SUM, NULL, &w[i]), 0);
  fake_complete_events(1); /* the first op's end event */
  assert_int_equal(tdist_work_wait(w[0], 5000), 0);
  assert_int_equal(tdist_work_is_completed(w[1]), 0);
  fake_set_async_error(ncclRemoteError, "fake: rank 3 closed its connection");
  for (int i = 1; i < 3; i++) {
    assert_int_equal(tdist_work_wait(w[i], 5000), TDIST_ERR_NCCL_ERROR);
    assert_int_equal(tdist_work_state(w[i]), TDIST_WORK_FAILED);
    const char *m = tdist_work_error_message(w[i]);
    assert_non_null(strstr(m, "fake: rank 3 closed its connection"));
    assert_non_null(strstr(m, "remote process exited"));
    assert_non_null(strstr(m, "all_reduce seq"));
  }
  assert_int_equal(tdist_work_status(w[0]), 0);
  assert_int_equal(nt_wait_count("ncclCommAbort", 1, 5000), 1);
  assert_true(tdist_group_is_aborted(g));
  for (int i = 0; i < 3; i++)
    tdist_work_release(w[i]);
  /* Refused at submit once aborted, with the code of the cause. */
  assert_int_equal(tdist_all_reduce(g, buf, buf, 8, TDIST_FLOAT32, TDIST_SUM, NULL, NULL),
                   TDIST_ERR_NCCL_ERROR);
  tdist_group_destroy(g);
  /* The aborted communicator is neither finalized nor destroyed again. */
  assert_int_equal(fake_count("ncclCommFinalize"), 0);
  assert_int_equal(fake_count("ncclCommDestroy"), 0);
  assert_int_equal(fake_count("ncclCommAbort"), 1);
  assert_int_equal(fake_violations(), 0);
}

static void test_event_never_completes(void **state) {
  tdist_group_t *g = world1(10000);
  fake_script_t sc = {.ev_mode = FAKE_EV_MANUAL};
  fake_set_script(&sc);
  tdist_op_opts_t o = {.mask = TDIST_OP_FIELD_TIMEOUT, .timeout_ms = 200};
  tdist_work_t *a = NULL, *b = NULL;
  assert_int_equal(tdist_all_reduce(g, buf, buf, 8, TDIST_FLOAT32, TDIST_SUM, &o, &a), 0);
  assert_int_equal(tdist_broadcast(g, buf, 8, TDIST_FLOAT32, 0, NULL, &b), 0);
  assert_int_equal(tdist_work_wait(a, 5000), TDIST_ERR_TIMEOUT);
  assert_int_equal(tdist_work_state(a), TDIST_WORK_TIMED_OUT);
  assert_int_equal(tdist_work_wait(b, 5000), TDIST_ERR_ABORTED);
  assert_non_null(strstr(tdist_work_error_message(b), "timed out"));
  assert_int_equal(nt_wait_count("ncclCommAbort", 1, 5000), 1);
  usleep(200 * 1000); /* more watchdog ticks: still one abort */
  assert_int_equal(fake_count("ncclCommAbort"), 1);
  /* The stream cannot be waited on any more: the work reports its failure. */
  assert_int_equal(tdist_work_wait_stream(a, NULL), TDIST_ERR_TIMEOUT);
  tdist_work_release(a);
  tdist_work_release(b);
  assert_int_equal(tdist_group_destroy(g), 0);
  assert_int_equal(fake_count("ncclCommAbort"), 1);
  assert_int_equal(fake_count("ncclCommDestroy"), 0);
  assert_int_equal(fake_violations(), 0);
}

static void test_group_abort(void **state) {
  tdist_group_t *g = world1(10000);
  fake_script_t sc = {.ev_mode = FAKE_EV_MANUAL};
  fake_set_script(&sc);
  tdist_work_t *w = NULL;
  assert_int_equal(tdist_all_to_all(g, buf, buf + 512, 4, TDIST_INT32, NULL, &w), 0);
  assert_int_equal(tdist_group_abort(g, "test says stop"), 0);
  assert_int_equal(tdist_work_wait(w, 5000), TDIST_ERR_ABORTED);
  assert_non_null(strstr(tdist_work_error_message(w), "test says stop"));
  assert_int_equal(nt_wait_count("ncclCommAbort", 1, 5000), 1);
  assert_int_equal(tdist_group_abort(g, "again"), 0);
  usleep(50 * 1000); /* time for a second job, were there one */
  assert_int_equal(fake_count("ncclCommAbort"), 1);
  tdist_work_release(w);
  tdist_group_destroy(g);
  assert_int_equal(fake_violations(), 0);
}

/* A caller thread stuck in submit: the enqueue answered ncclInProgress and
 * the communicator never leaves it, so the caller polls it holding the
 * group's mutex until the op's timeout (20 s here). */
static tdist_group_t *stuck_group;
static void *stuck_submit(void *arg) {
  long rc = tdist_all_reduce(stuck_group, buf, buf, 8, TDIST_FLOAT32, TDIST_SUM, NULL, NULL);
  return (void *)rc;
}

static void test_abort_during_enqueue(void **state) {
  tdist_group_t *g = world1(20000);
  fake_script_t sc = {.enqueue_returns_inprogress = 1, .enqueue_busy = -1};
  fake_set_script(&sc);
  stuck_group = g;
  pthread_t th;
  pthread_create(&th, NULL, stuck_submit, NULL);
  for (int i = 0; i < 5000 && fake_count("ncclAllReduce") == 0; i++)
    usleep(1000);
  assert_int_equal(fake_count("ncclAllReduce"), 1);
  usleep(20 * 1000); /* the caller is in its polling loop */
  long long t0 = nt_now_ms();
  /* The progress thread's abort waits for the mutex the caller holds: the
   * caller sees the group aborted on its next turn and lets go. */
  assert_int_equal(tdist_group_abort(g, "stop the stuck enqueue"), 0);
  void *r;
  pthread_join(th, &r);
  assert_true((long)r != 0);
  assert_int_equal(nt_wait_count("ncclCommAbort", 1, 5000), 1);
  assert_true(nt_now_ms() - t0 < 5000);
  /* Not launched: no end event recorded after the enqueue. */
  assert_int_equal(fake_find("cudaEventRecord", fake_find("ncclAllReduce", 0)), -1);
  fake_script_t none = {0};
  fake_set_script(&none);
  tdist_group_destroy(g);
  assert_int_equal(fake_count("ncclCommAbort"), 1);
  assert_int_equal(fake_violations(), 0);
}

static void test_init_in_progress(void **state) {
  fake_reset();
  fake_script_t sc = {.init_busy = 6};
  fake_set_script(&sc);
  tdist_group_t *g = NULL;
  assert_int_equal(nt_world(0, 1, tdist_mp_free_port(), 10000, &g), 0);
  int init = fake_find("ncclCommInitRankConfig", 0);
  int stream = fake_find("cudaStreamCreateWithFlags", 0);
  assert_true(init >= 0 && init < stream);
  int polls = 0;
  for (int i = init; i < stream; i++)
    polls += strcmp(fake_log_get(i).name, "ncclCommGetAsyncError") == 0;
  assert_int_equal(polls, 7); /* six InProgress, then success */
  assert_true(fake_last_init_id_ok());
  assert_int_equal(fake_count("ncclCommAbort"), 0);
  assert_int_equal(tdist_group_destroy(g), 0);
}

static void test_init_timeout(void **state) {
  fake_reset();
  fake_script_t sc = {.init_busy = -1};
  fake_set_script(&sc);
  tdist_group_t *g = NULL;
  assert_int_equal(nt_world(0, 1, tdist_mp_free_port(), 300, &g), TDIST_ERR_TIMEOUT);
  assert_null(g);
  assert_non_null(strstr(tdist_last_error(), "ncclCommInitRankConfig"));
  assert_non_null(strstr(tdist_last_error(), "'world'"));
  assert_int_equal(fake_count("ncclCommAbort"), 1);
  assert_int_equal(fake_violations(), 0);
}

static void test_split_in_progress_and_timeout(void **state) {
  tdist_group_t *g = world1(10000);
  fake_script_t sc = {.split_busy = 5};
  fake_set_script(&sc);
  int from = fake_log_size();
  int me = 0;
  tdist_group_t *sub = NULL;
  assert_int_equal(tdist_new_group(g, &me, 1, NULL, &sub), 0);
  assert_non_null(sub);
  int s = fake_find("ncclCommSplit", from);
  fake_call_t c = fake_log_get(s);
  assert_int_equal(c.a, 0); /* colour */
  assert_int_equal(c.b, 0); /* key = child rank */
  /* The child's ops go to the child's communicator. */
  from = fake_log_size();
  assert_int_equal(tdist_all_reduce(sub, buf, buf, 2, TDIST_FLOAT32, TDIST_SUM, NULL, NULL), 0);
  assert_ptr_equal(fake_log_get(fake_find("ncclAllReduce", from)).comm, c.event /* newcomm */);
  assert_int_equal(tdist_group_destroy(sub), 0);

  sc.split_busy = -1;
  fake_set_script(&sc);
  tdist_group_opts_t go = {.mask = TDIST_GROUP_FIELD_TIMEOUT, .timeout_ms = 300};
  int aborts = fake_count("ncclCommAbort");
  assert_int_equal(tdist_new_group(g, &me, 1, &go, &sub), TDIST_ERR_TIMEOUT);
  assert_null(sub);
  assert_non_null(strstr(tdist_last_error(), "ncclCommSplit"));
  assert_int_equal(fake_count("ncclCommAbort"), aborts + 1);
  assert_int_equal(tdist_group_destroy(g), 0);
  assert_int_equal(fake_violations(), 0);
}

static void test_destroy_finalize_then_destroy(void **state) {
  tdist_group_t *g = world1(10000);
  fake_script_t sc = {.finalize_busy = 3};
  fake_set_script(&sc);
  assert_int_equal(tdist_all_reduce(g, buf, buf, 2, TDIST_FLOAT32, TDIST_SUM, NULL, NULL), 0);
  int from = fake_log_size();
  assert_int_equal(tdist_group_destroy(g), 0);
  int f = fake_find("ncclCommFinalize", from), d = fake_find("ncclCommDestroy", from);
  assert_true(f >= 0 && f < d);
  int polls = 0;
  for (int i = f; i < d; i++)
    polls += strcmp(fake_log_get(i).name, "ncclCommGetAsyncError") == 0;
  assert_int_equal(polls, 4);
  assert_int_equal(fake_count("ncclCommAbort"), 0);
  /* Every event and the stream are released after the communicator. */
  assert_int_equal(fake_count("cudaEventDestroy"), fake_count("cudaEventCreateWithFlags"));
  assert_true(fake_find("cudaStreamDestroy", d) > d);
  assert_int_equal(fake_violations(), 0);

  /* A finalize that never completes: bounded by the timeout, then abort. */
  g = world1(300);
  sc.finalize_busy = -1;
  fake_set_script(&sc);
  assert_int_equal(tdist_group_destroy(g), TDIST_ERR_TIMEOUT);
  assert_int_equal(fake_count("ncclCommFinalize"), 1);
  assert_int_equal(fake_count("ncclCommAbort"), 1);
  assert_int_equal(fake_count("ncclCommDestroy"), 0);
  assert_int_equal(fake_violations(), 0);
}

/* ---- 4 ranks: split colours and keys ---------------------------------------------- */

static int port4;

static int split_rank(int rank, int n, void *arg) {
  fake_reset();
  fake_script_t sc = {.split_busy = 2, .init_busy = 1};
  fake_set_script(&sc);
  tdist_group_t *g = NULL, *sub = NULL;
  MP_CHECK_RC(nt_world(rank, n, port4, 20000, &g));
  MP_CHECK(fake_last_init_id_ok());
  MP_CHECK((fake_find("ncclGetUniqueId", 0) >= 0) == (rank == 0));
  /* new_group({3, 1}): rank 3 is child rank 0, rank 1 child rank 1. */
  int ranks[2] = {3, 1};
  int from = fake_log_size();
  MP_CHECK_RC(tdist_new_group(g, ranks, 2, NULL, &sub));
  fake_call_t c = fake_log_get(fake_find("ncclCommSplit", from));
  if (rank == 3 || rank == 1) {
    MP_CHECK(sub != NULL);
    MP_CHECK(c.a >= 0 && c.a != NCCL_SPLIT_NOCOLOR);
    MP_CHECK(c.b == (rank == 3 ? 0 : 1));
    MP_CHECK(tdist_group_rank(sub) == c.b);
  } else {
    MP_CHECK(sub == NULL);
    MP_CHECK(c.a == NCCL_SPLIT_NOCOLOR);
    MP_CHECK(c.b == rank);
  }
  MP_CHECK_RC(tdist_group_destroy(sub));
  /* 2x2 mesh: dimension 0 groups {r, r^2}, dimension 1 groups {r, r^1}; each
   * split gives this rank a colour (the line) and its key in that line. */
  int dims[2] = {2, 2}, coords[2];
  tdist_group_t *mesh[2] = {NULL, NULL};
  from = fake_log_size();
  MP_CHECK_RC(tdist_mesh_create(g, dims, 2, NULL, mesh, coords));
  int s0 = fake_find("ncclCommSplit", from), s1 = fake_find("ncclCommSplit", s0 + 1);
  MP_CHECK(s0 >= 0 && s1 > s0);
  fake_call_t c0 = fake_log_get(s0), c1 = fake_log_get(s1);
  MP_CHECK(c0.a >= 0 && c1.a >= 0);
  MP_CHECK(c0.b == coords[0] && c1.b == coords[1]);
  MP_CHECK(coords[0] == rank / 2 && coords[1] == rank % 2);
  for (int d = 0; d < 2; d++) {
    MP_CHECK(mesh[d] && tdist_group_size(mesh[d]) == 2);
    MP_CHECK_RC(tdist_group_destroy(mesh[d]));
  }
  MP_CHECK_RC(tdist_group_destroy(g));
  MP_CHECK(fake_violations() == 0);
  MP_CHECK(fake_count("ncclCommAbort") == 0);
  return 0;
}

static void test_split_four_ranks(void **state) {
  port4 = tdist_mp_free_port();
  assert_int_equal(tdist_mp_run(4, split_rank, NULL, 60), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      /* First: forks before this process starts any thread. */
      cmocka_unit_test(test_split_four_ranks),
      cmocka_unit_test(test_async_error_mid_flight),
      cmocka_unit_test(test_event_never_completes),
      cmocka_unit_test(test_group_abort),
      cmocka_unit_test(test_abort_during_enqueue),
      cmocka_unit_test(test_init_in_progress),
      cmocka_unit_test(test_init_timeout),
      cmocka_unit_test(test_split_in_progress_and_timeout),
      cmocka_unit_test(test_destroy_finalize_then_destroy),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
