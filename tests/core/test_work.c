/*
 * test_work.c - work handle semantics against the test backend: waiting,
 * completion state, errors and messages, callbacks (once, on the right
 * thread), early release, wait_all/wait_any, synchronous calls; and the
 * caller-driven path (work.c, backend.h submit and test) on "testcaller":
 * which ops are finished on their thread and never handed over, which are,
 * and test's run protocol.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "util/clock.h"
#include "core/group/group.h"
#include "core/init/registry.h"
#include "tb_world.h"
#include "test_backend.h"
#include "tdist/tdist.h"

static tdist_group_t *g;
static float buf[16];

static int setup(void **state) {
  (void)state;
  tb_set_mode(TB_COMPLETE);
  return tb_group_create(0, 4, 10000, &g);
}

/* Each case starts from the default mode. */
static int reset_mode(void **state) {
  (void)state;
  tb_set_mode(TB_COMPLETE);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  tb_set_mode(TB_COMPLETE);
  return tdist_group_destroy(g);
}

static void complete_now(void **state) {
  (void)state;
  tdist_work_t *w = NULL;
  assert_int_equal(tdist_all_reduce(g, buf, buf, 16, TDIST_FLOAT32, TDIST_SUM, NULL, &w), 0);
  assert_non_null(w);
  assert_int_equal(tdist_work_wait(w, 5000), 0);
  assert_int_equal(tdist_work_is_completed(w), 1);
  assert_int_equal(tdist_work_status(w), 0);
  assert_int_equal(tdist_work_state(w), TDIST_WORK_COMPLETED);
  assert_string_equal(tdist_work_error_message(w), "");
  assert_int_equal(tdist_work_optype(w), TDIST_OP_ALL_REDUCE);
  tdist_work_release(w);
}

static void held_is_incomplete_until_released(void **state) {
  (void)state;
  tb_set_mode(TB_HELD);
  tdist_work_t *w = NULL;
  assert_int_equal(tdist_broadcast(g, buf, 16, TDIST_FLOAT32, 1, NULL, &w), 0);
  assert_int_equal(tdist_work_is_completed(w), 0);
  assert_int_equal(tdist_work_status(w), TDIST_ERR_IN_PROGRESS);
  assert_string_equal(tdist_work_error_message(w), "");
  int64_t t0 = tdist__now_ms();
  assert_int_equal(tdist_work_wait(w, 50), TDIST_ERR_IN_PROGRESS);
  assert_true(tdist__now_ms() - t0 >= 45);
  assert_int_equal(tdist_work_state(w), TDIST_WORK_RUNNING);
  tb_release_held(g);
  assert_int_equal(tdist_work_wait(w, 5000), 0);
  assert_int_equal(tdist_work_is_completed(w), 1);
  tdist_work_release(w);
}

static void sequence_numbers_increase(void **state) {
  (void)state;
  tdist_work_t *a, *b;
  assert_int_equal(tdist_barrier(g, NULL, &a), 0);
  assert_int_equal(tdist_barrier(g, NULL, &b), 0);
  assert_int_equal(tdist_work_seq(b), tdist_work_seq(a) + 1);
  tdist_work_release(a);
  tdist_work_release(b);
}

static void failure_carries_status_and_message(void **state) {
  (void)state;
  tb_set_mode(TB_FAIL);
  tb_set_fail_code(TDIST_ERR_MISMATCH);
  tdist_work_t *w;
  assert_int_equal(tdist_all_gather(g, buf, buf, 4, TDIST_INT32, NULL, &w), 0);
  assert_int_equal(tdist_work_wait(w, 5000), TDIST_ERR_MISMATCH);
  assert_int_equal(tdist_work_state(w), TDIST_WORK_FAILED);
  const char *msg = tdist_work_error_message(w);
  assert_non_null(strstr(msg, "all_gather seq "));
  assert_non_null(strstr(msg, "group 'world' (rank 0/4)"));
  assert_non_null(strstr(msg, "TDIST_ERR_MISMATCH"));
  tdist_work_release(w);
}

static void synchronous_form_returns_status(void **state) {
  (void)state;
  assert_int_equal(tdist_barrier(g, NULL, NULL), 0);
  tb_set_mode(TB_FAIL);
  tb_set_fail_code(TDIST_ERR_IO);
  assert_int_equal(tdist_send(g, buf, 4, TDIST_FLOAT32, 2, NULL), TDIST_ERR_IO);
  assert_non_null(strstr(tdist_last_error(), "send seq"));
}

/* ---- callbacks ---------------------------------------------------------- */

struct cb_rec {
  _Atomic int calls;
  pthread_t thread;
  int status_seen;
};

static void record_cb(tdist_work_t *w, void *arg) {
  struct cb_rec *r = arg;
  r->thread = pthread_self();
  r->status_seen = tdist_work_status(w);
  atomic_fetch_add(&r->calls, 1); /* publishes the fields above */
}

static void callback_runs_once_on_progress_thread(void **state) {
  (void)state;
  tb_set_mode(TB_HELD);
  struct cb_rec r = {0};
  tdist_work_t *w;
  assert_int_equal(tdist_reduce(g, buf, buf, 4, TDIST_FLOAT32, TDIST_MAX, 0, NULL, &w), 0);
  assert_int_equal(tdist_work_on_complete(w, record_cb, &r), 0);
  assert_int_equal(tdist_work_on_complete(w, record_cb, &r), TDIST_ERR_INVALID_STATE);
  assert_int_equal(r.calls, 0);
  tb_release_held(g);
  assert_int_equal(tdist_work_wait(w, 5000), 0);
  /* wait returns when the state is published; the callback runs right after */
  for (int i = 0; i < 1000 && r.calls == 0; i++)
    usleep(1000);
  assert_int_equal(r.calls, 1);
  assert_int_equal(r.status_seen, 0);
  assert_false(pthread_equal(r.thread, pthread_self()));
  tdist_work_release(w);
}

static void callback_after_completion_runs_on_caller(void **state) {
  (void)state;
  struct cb_rec r = {0};
  tdist_work_t *w;
  assert_int_equal(tdist_barrier(g, NULL, &w), 0);
  assert_int_equal(tdist_work_wait(w, 5000), 0);
  assert_int_equal(tdist_work_on_complete(w, record_cb, &r), 0);
  assert_int_equal(r.calls, 1);
  assert_true(pthread_equal(r.thread, pthread_self()));
  tdist_work_release(w);
}

static void release_in_callback(tdist_work_t *w, void *arg) {
  int *n = arg;
  (*n)++;
  tdist_work_release(w);
}

static void release_before_completion(void **state) {
  (void)state;
  tb_set_mode(TB_HELD);
  int n = 0;
  tdist_work_t *w, *w2;
  assert_int_equal(tdist_all_reduce(g, buf, buf, 8, TDIST_FLOAT64, TDIST_SUM, NULL, &w), 0);
  tdist_work_release(w); /* the runtime still holds it */
  assert_int_equal(tdist_all_reduce(g, buf, buf, 8, TDIST_FLOAT64, TDIST_SUM, NULL, &w2), 0);
  assert_int_equal(tdist_work_on_complete(w2, release_in_callback, &n), 0);
  tb_release_held(g);
  tb_set_mode(TB_COMPLETE);
  assert_int_equal(tdist_barrier(g, NULL, NULL), 0); /* ordered after the release */
  assert_int_equal(n, 1);
}

static void wait_all_and_any(void **state) {
  (void)state;
  tdist_work_t *w[3];
  tb_set_mode(TB_HELD);
  assert_int_equal(tdist_barrier(g, NULL, &w[0]), 0);
  tb_set_mode(TB_POLL);
  assert_int_equal(tdist_barrier(g, NULL, &w[1]), 0);
  tb_set_mode(TB_HELD);
  assert_int_equal(tdist_barrier(g, NULL, &w[2]), 0);
  size_t idx = 99;
  assert_int_equal(tdist_wait_any(w, 3, 5000, &idx), 0);
  assert_int_equal(idx, 1);
  assert_int_equal(tdist_wait_all(w, 3, 50), TDIST_ERR_IN_PROGRESS);
  tb_release_held(g);
  assert_int_equal(tdist_wait_all(w, 3, 5000), 0);
  tdist_work_t *none[2] = {NULL, NULL};
  assert_int_equal(tdist_wait_any(none, 2, 10, &idx), TDIST_ERR_INVALID_ARGUMENT);
  assert_int_equal(tdist_wait_all(none, 2, 10), 0);
  for (int i = 0; i < 3; i++)
    tdist_work_release(w[i]);
}

static void bad_arguments_are_refused(void **state) {
  (void)state;
  tdist_work_t *w = NULL;
  assert_int_equal(tdist_all_reduce(g, NULL, buf, 4, TDIST_FLOAT32, TDIST_SUM, NULL, &w),
                   TDIST_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(tdist_last_error(), "sendbuf is NULL"));
  assert_int_equal(tdist_all_reduce(g, buf, buf, 4, (tdist_dtype_t)42, TDIST_SUM, NULL, &w),
                   TDIST_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(tdist_last_error(), "unknown dtype 42"));
  assert_int_equal(tdist_all_reduce(g, buf, buf, 4, TDIST_FLOAT32, (tdist_redop_t)9, NULL, &w),
                   TDIST_ERR_INVALID_ARGUMENT);
  assert_int_equal(tdist_broadcast(g, buf, 4, TDIST_FLOAT32, 4, NULL, &w),
                   TDIST_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(tdist_last_error(), "root 4 is not in [0, 4)"));
  assert_int_equal(tdist_isend(g, buf, 4, TDIST_FLOAT32, -1, NULL, &w), TDIST_ERR_INVALID_ARGUMENT);
  tdist_op_opts_t o = {.mask = TDIST_OP_FIELD_TAG, .tag = -3};
  assert_int_equal(tdist_irecv(g, buf, 4, TDIST_FLOAT32, 1, &o, &w), TDIST_ERR_INVALID_ARGUMENT);
  assert_int_equal(tdist_all_to_all(g, buf, buf, 2, TDIST_FLOAT32, NULL, &w),
                   TDIST_ERR_INVALID_ARGUMENT);
  assert_int_equal(tdist_all_reduce(g, buf, buf, SIZE_MAX / 2, TDIST_FLOAT32, TDIST_SUM, NULL, &w),
                   TDIST_ERR_INVALID_ARGUMENT);
  tdist_p2p_op_t p = {
      .kind = (tdist_p2p_kind_t)7, .buf = buf, .count = 1, .dtype = TDIST_FLOAT32, .peer = 1};
  assert_int_equal(tdist_batch_isend_irecv(g, &p, 1, NULL, &w), TDIST_ERR_INVALID_ARGUMENT);
  assert_int_equal(tdist_batch_isend_irecv(g, &p, 0, NULL, &w), TDIST_ERR_INVALID_ARGUMENT);
  assert_null(w);
  assert_int_equal(tdist_work_wait(NULL, 1), TDIST_ERR_INVALID_ARGUMENT);
  assert_int_equal(tdist_work_on_complete(NULL, record_cb, NULL), TDIST_ERR_INVALID_ARGUMENT);
  /* count 0 with NULL buffers is fine */
  assert_int_equal(tdist_all_reduce(g, NULL, NULL, 0, TDIST_FLOAT32, TDIST_SUM, NULL, NULL), 0);
}

static void batch_of_many_p2p_ops(void **state) {
  (void)state;
  tb_set_mode(TB_COMPLETE);
  tdist_p2p_op_t ops[9];
  for (int i = 0; i < 9; i++) {
    ops[i] = (tdist_p2p_op_t){.kind = i % 2 ? TDIST_P2P_RECV : TDIST_P2P_SEND,
                              .buf = buf,
                              .count = 2,
                              .dtype = TDIST_FLOAT32,
                              .peer = i % 4,
                              .tag = i};
  }
  tdist_work_t *w;
  assert_int_equal(tdist_batch_isend_irecv(g, ops, 9, NULL, &w), 0);
  assert_int_equal(tdist_work_wait(w, 5000), 0);
  assert_int_equal(tdist_work_optype(w), TDIST_OP_BATCH_P2P);
  tdist_work_release(w);
}

/* A completion callback runs on the progress thread: a blocking call there
 * would wait for itself. Each one fails at once with INVALID_STATE, leaves
 * nothing behind, and the group is destroyed promptly afterwards. */
struct cb_probe {
  tdist_group_t *g;
  tdist_work_t *other;
  int wait_rc, sync_rc, destroy_rc, waitall_rc;
  atomic_int ran;
};

static void blocking_cb(tdist_work_t *w, void *arg) {
  struct cb_probe *p = arg;
  float x[2] = {0};
  p->wait_rc = tdist_work_wait(p->other, 0);
  p->waitall_rc = tdist_wait_all(&p->other, 1, 0);
  p->sync_rc = tdist_all_reduce(p->g, x, x, 2, TDIST_FLOAT32, TDIST_SUM, NULL, NULL);
  p->destroy_rc = tdist_group_destroy(p->g);
  atomic_store(&p->ran, 1);
}

static void blocking_calls_from_callback_fail_at_once(void **state) {
  tdist_group_t *grp;
  assert_int_equal(tb_group_create(0, 1, 60000, &grp), 0);
  tb_set_mode(TB_HELD);
  struct cb_probe p = {.g = grp};
  tdist_work_t *w;
  assert_int_equal(tdist_barrier(grp, NULL, &w), 0);
  assert_int_equal(tdist_barrier(grp, NULL, &p.other), 0);
  assert_int_equal(tdist_work_on_complete(w, blocking_cb, &p), 0);
  int64_t t0 = tdist__now_ms();
  tb_release_held(grp);
  while (!atomic_load(&p.ran) && tdist__now_ms() - t0 < 5000)
    usleep(1000);
  assert_true(atomic_load(&p.ran));
  assert_int_equal(p.wait_rc, TDIST_ERR_INVALID_STATE);
  assert_int_equal(p.waitall_rc, TDIST_ERR_INVALID_STATE);
  assert_int_equal(p.sync_rc, TDIST_ERR_INVALID_STATE);
  assert_int_equal(p.destroy_rc, TDIST_ERR_INVALID_STATE);
  assert_int_equal(tdist_work_wait(p.other, 5000), 0); /* released with the first */
  tdist_work_release(w);
  tdist_work_release(p.other);
  assert_int_equal(tdist_group_destroy(grp), 0);
  assert_true(tdist__now_ms() - t0 < 5000); /* no op was left to time out */
}

/* ---- the caller-driven path ("testcaller") ---------------------------------------- */

static tdist_group_t *caller_group(void) {
  tdist_group_t *grp = NULL;
  tb_register();
  const tdist_backend_t *bk = tdist__backend_find("testcaller");
  assert_non_null(bk);
  assert_int_equal(tdist__group_create(bk, 0, 1, "caller", NULL, 60000, NULL, &grp), 0);
  tb_set_mode(TB_CALLER);
  return grp;
}

/* Posts made so far, once every earlier hand-over reached post: an op of
 * another mode, handed over after them (the queue keeps their order) and
 * waited for, is the last. */
static int posts_after_flush(tdist_group_t *grp) {
  tb_set_mode(TB_COMPLETE);
  tdist_work_t *w = NULL;
  assert_int_equal(tdist_all_reduce(grp, buf, buf, 16, TDIST_FLOAT32, TDIST_SUM, NULL, &w), 0);
  assert_int_equal(tdist_work_wait(w, 10000), 0);
  tdist_work_release(w);
  tb_set_mode(TB_CALLER);
  return tb_post_count() - 1;
}

static void caller_done(tdist_group_t *grp) {
  assert_int_equal(tb_runs_open(), 0); /* every SPIN run ended (backend.h) */
  assert_int_equal(tb_test_breaches(), 0);
  tb_set_mode(TB_COMPLETE);
  tb_set_caller_tests(1);
  assert_int_equal(tdist_group_destroy(grp), 0);
}

/* An async op its first look finds done is finished on the submitting
 * thread: COMPLETED when the call returns, never posted. */
static void caller_async_done_at_first_look(void **state) {
  (void)state;
  tdist_group_t *grp = caller_group();
  tb_set_caller_tests(1);
  int posts = tb_post_count(), tests = tb_test_count();
  tdist_work_t *w = NULL;
  assert_int_equal(tdist_all_reduce(grp, buf, buf, 16, TDIST_FLOAT32, TDIST_SUM, NULL, &w), 0);
  assert_int_equal(tdist_work_state(w), TDIST_WORK_COMPLETED);
  assert_int_equal(tb_test_count() - tests, 1); /* one look, no spin */
  struct cb_rec r = {0};
  assert_int_equal(tdist_work_on_complete(w, record_cb, &r), 0); /* runs here, at once */
  assert_int_equal(atomic_load(&r.calls), 1);
  assert_int_equal(tdist_work_wait(w, 5000), 0);
  tdist_work_release(w);
  assert_int_equal(posts_after_flush(grp), posts); /* never handed over */
  caller_done(grp);
}

/* A synchronous op that succeeds within its thread's spin: never posted. */
static void caller_sync_done_within_spin(void **state) {
  (void)state;
  tdist_group_t *grp = caller_group();
  tb_set_caller_tests(10);
  int posts = tb_post_count(), tests = tb_test_count();
  for (int i = 0; i < 3; i++)
    assert_int_equal(tdist_all_reduce(grp, buf, buf, 16, TDIST_FLOAT32, TDIST_SUM, NULL, NULL), 0);
  assert_true(tb_test_count() - tests >= 30);
  assert_int_equal(posts_after_flush(grp), posts);
  caller_done(grp);
}

/* An async op not done at the first look is handed over; its waiter's
 * tests see it done and claim it; the progress thread finishes it. */
static void caller_async_handed_over_then_claimed(void **state) {
  (void)state;
  tdist_group_t *grp = caller_group();
  tb_set_caller_tests(50);
  int posts = tb_post_count(), tests = tb_test_count();
  tdist_work_t *w = NULL;
  assert_int_equal(tdist_all_reduce(grp, buf, buf, 16, TDIST_FLOAT32, TDIST_SUM, NULL, &w), 0);
  assert_int_equal(tb_test_count() - tests, 1);
  assert_int_not_equal(tdist_work_state(w), TDIST_WORK_COMPLETED);
  assert_int_equal(tdist_work_wait(w, 10000), 0);
  assert_int_equal(tdist_work_status(w), 0);
  assert_true(tb_test_count() - tests >= 50);
  tdist_work_release(w);
  assert_int_equal(posts_after_flush(grp), posts + 1);
  caller_done(grp);
}

static void *release_when_posted(void *arg) {
  int posts = *(int *)arg;
  int64_t t0 = tdist__now_ms();
  while (tb_post_count() == posts && tdist__now_ms() - t0 < 20000)
    usleep(1000);
  tb_caller_release();
  return NULL;
}

/* A synchronous op that outlasts its thread's spin is handed over (its
 * run ended with a LAST test), and completes once done. */
static void caller_sync_outlasting_spin(void **state) {
  (void)state;
  tdist_group_t *grp = caller_group();
  tb_set_caller_tests(1 << 30);
  int posts = tb_post_count();
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, release_when_posted, &posts), 0);
  assert_int_equal(tdist_all_reduce(grp, buf, buf, 16, TDIST_FLOAT32, TDIST_SUM, NULL, NULL), 0);
  pthread_join(th, NULL);
  assert_int_equal(posts_after_flush(grp), posts + 1);
  caller_done(grp);
}

int main(void) {
  /* A generous spin for the caller-driven cases: on a loaded machine a
   * spinning thread yields at every test (its busy window closes), and a
   * yield behind CPU hogs may take a whole time slice, so even 200 ms ended
   * before 50 tests once under stress-ng (the op was handed over where the
   * case says it is not). 2 s, and 10 tests an op. Read once, on first
   * use, so set before anything. */
  setenv("TDIST_DRIVE_SPIN_US", "2000000", 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(complete_now, reset_mode),
      cmocka_unit_test_setup(held_is_incomplete_until_released, reset_mode),
      cmocka_unit_test_setup(sequence_numbers_increase, reset_mode),
      cmocka_unit_test_setup(failure_carries_status_and_message, reset_mode),
      cmocka_unit_test_setup(synchronous_form_returns_status, reset_mode),
      cmocka_unit_test_setup(callback_runs_once_on_progress_thread, reset_mode),
      cmocka_unit_test_setup(callback_after_completion_runs_on_caller, reset_mode),
      cmocka_unit_test_setup(release_before_completion, reset_mode),
      cmocka_unit_test_setup(wait_all_and_any, reset_mode),
      cmocka_unit_test_setup(bad_arguments_are_refused, reset_mode),
      cmocka_unit_test_setup(batch_of_many_p2p_ops, reset_mode),
      cmocka_unit_test_setup(blocking_calls_from_callback_fail_at_once, reset_mode),
      cmocka_unit_test_setup(caller_async_done_at_first_look, reset_mode),
      cmocka_unit_test_setup(caller_sync_done_within_spin, reset_mode),
      cmocka_unit_test_setup(caller_async_handed_over_then_claimed, reset_mode),
      cmocka_unit_test_setup(caller_sync_outlasting_spin, reset_mode),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
