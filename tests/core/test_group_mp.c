/*
 * test_group_mp.c - group creation and abort order with real processes, a
 * real TCP store hosted by rank 0, and the test backend:
 *   - a rank that never calls tdist_new_group (or tdist_mesh_create): the
 *     others fail with TIMEOUT within the new group's timeout, naming that
 *     rank (parent and world rank) and the group in words, no store key;
 *   - a rank that died before the call: REMOTE_FAILED naming it, long
 *     before the timeout;
 *   - the abort callback runs before any op of the group is seen failed
 *     (wait, is_completed, completion callback), over many aborts of both
 *     kinds (on demand here or on the peer, op timeout);
 *   - no abort callback runs after tdist_group_destroy returned (a peer's
 *     abort racing the destroy), and after a death and a shrink the old
 *     group's callback never runs late.
 */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "mp.h"
#include "tb_world.h"
#include "test_backend.h"
#include "tdist/tdist.h"
#include "util/clock.h"

static int port;

/* The error names the rank and the group in words, and no store key. */
static int expect_words(const char *msg, const char *call, const char *who, const char *what) {
  if (!strstr(msg, call) || !strstr(msg, who) || !strstr(msg, what) || strstr(msg, "tdist/") ||
      strstr(msg, "split") || strstr(msg, "members/"))
    fprintf(stderr, "[pid %d] unexpected message: %s\n", (int)getpid(), msg);
  MP_CHECK(strstr(msg, call) != NULL);
  MP_CHECK(strstr(msg, who) != NULL);
  MP_CHECK(strstr(msg, what) != NULL);
  MP_CHECK(strstr(msg, "tdist/") == NULL && strstr(msg, "split") == NULL);
  MP_CHECK(strstr(msg, "members/") == NULL);
  return 0;
}

/* ---- a rank that never arrives ------------------------------------------------ */

/* 4 ranks; the new group is ranks 0,1,3 of the world, so rank 2 calls it as
 * a non-member; rank 3 never calls it. The world's timeout is 30 s, the new
 * group's 1 s: the wait is bounded by the latter. */
static int skip_new_group_child(int rank, int n, void *arg) {
  (void)arg;
  tb_world_t tw;
  MP_CHECK(tb_world_join(rank, n, port, 30000, &tw) == 0);
  if (rank != 3) {
    int ranks[] = {0, 1, 3};
    tdist_group_opts_t o = {.mask = TDIST_GROUP_FIELD_TIMEOUT | TDIST_GROUP_FIELD_NAME,
                            .timeout_ms = 1000,
                            .name = "tp0"};
    tdist_group_t *sub = (tdist_group_t *)&tw; /* must be reset */
    int64_t t0 = tdist__now_ms();
    int rc = tdist_new_group(tw.g, ranks, 3, &o, &sub);
    int64_t took = tdist__now_ms() - t0;
    MP_CHECK(rc == TDIST_ERR_TIMEOUT);
    MP_CHECK(sub == NULL);
    MP_CHECK(expect_words(tdist_last_error(), "tdist_new_group 'tp0' (ranks 0,1,3 of 'world')",
                          "rank 3 of 'world' (world rank 3)", "never joined within 1000 ms") == 0);
    MP_CHECK(took >= 1000);
    MP_CHECK(took < 15000); /* the new group's timeout, not the world's 30 s */
  }
  MP_CHECK(tb_store_barrier(tw.st, "skip/done", n) == 0);
  return tb_world_leave(&tw, n);
}

static void new_group_names_a_rank_that_never_came(void **state) {
  (void)state;
  port = tdist_mp_free_port();
  assert_int_equal(tdist_mp_run(4, skip_new_group_child, NULL, 60), 0);
}

/* A 2x2 mesh over a parent whose ranks are the world's reversed (parent
 * rank p is world rank 3 - p); world rank 0 (parent rank 3) never calls it. */
static int skip_mesh_child(int rank, int n, void *arg) {
  (void)arg;
  tb_world_t tw;
  MP_CHECK(tb_world_join(rank, n, port, 30000, &tw) == 0);
  int rev[] = {3, 2, 1, 0};
  tdist_group_opts_t o = {.mask = TDIST_GROUP_FIELD_NAME, .name = "rev"};
  tdist_group_t *parent = NULL;
  MP_CHECK_RC(tdist_new_group(tw.g, rev, 4, &o, &parent));
  MP_CHECK(tdist_group_rank(parent) == 3 - rank);
  if (rank != 0) {
    int dims[] = {2, 2};
    tdist_group_t *g[2] = {NULL, NULL};
    tdist_group_opts_t mo = {.mask = TDIST_GROUP_FIELD_TIMEOUT, .timeout_ms = 1000};
    int64_t t0 = tdist__now_ms();
    int rc = tdist_mesh_create(parent, dims, 2, &mo, g, NULL);
    int64_t took = tdist__now_ms() - t0;
    MP_CHECK(rc == TDIST_ERR_TIMEOUT);
    MP_CHECK(g[0] == NULL && g[1] == NULL);
    MP_CHECK(expect_words(tdist_last_error(),
                          "tdist_mesh_create 2x2 (dimension 0) 'rev/mesh2x2.d0.",
                          "rank 3 of 'rev' (world rank 0)", "never joined within 1000 ms") == 0);
    MP_CHECK(took >= 1000 && took < 15000);
  }
  MP_CHECK(tb_store_barrier(tw.st, "mesh/done", n) == 0);
  MP_CHECK_RC(tdist_group_destroy(parent));
  return tb_world_leave(&tw, n);
}

static void mesh_names_a_rank_that_never_came(void **state) {
  (void)state;
  port = tdist_mp_free_port();
  assert_int_equal(tdist_mp_run(4, skip_mesh_child, NULL, 60), 0);
}

/* Rank 2 is killed before the call (arg NULL), or leaves the job in order
 * (arg non-NULL: destroys its world, its monitor says goodbye, exits): the
 * others fail with REMOTE_FAILED naming it, long before the new group's
 * 30 s. */
static int dead_member_child(int rank, int n, void *arg) {
  tb_world_t tw;
  MP_CHECK(tb_world_join(rank, n, port, 30000, &tw) == 0);
  MP_CHECK(tb_store_barrier(tw.st, "dead/joined", n) == 0);
  if (rank == 2 && !arg) raise(SIGKILL);
  if (rank == 2) {
    tdist_group_destroy(tw.g);
    _exit(0);
  }
  int all[] = {0, 1, 2};
  tdist_group_t *sub = NULL;
  int64_t t0 = tdist__now_ms();
  int rc = tdist_new_group(tw.g, all, 3, NULL, &sub);
  int64_t took = tdist__now_ms() - t0;
  const char *msg = tdist_last_error();
  if (rc != TDIST_ERR_REMOTE_FAILED || !strstr(msg, "world rank 2"))
    fprintf(stderr, "[pid %d] got %s after %lld ms: %s\n", (int)getpid(), tdist_err_name(rc),
            (long long)took, msg);
  MP_CHECK(rc == TDIST_ERR_REMOTE_FAILED);
  MP_CHECK(sub == NULL);
  MP_CHECK(strstr(msg, "world rank 2") != NULL);
  MP_CHECK(took < 15000); /* the store's death record, not the 30 s timeout */
  MP_CHECK(tb_store_barrier(tw.st, "dead/done", n - 1) == 0);
  return tb_world_leave(&tw, n - 1);
}

static void new_group_fails_at_once_for_a_dead_rank(void **state) {
  (void)state;
  port = tdist_mp_free_port();
  int codes[3];
  tdist_mp_run_codes(3, dead_member_child, NULL, 60, codes);
  assert_int_equal(codes[0], 0);
  assert_int_equal(codes[1], 0);
  assert_int_equal(codes[2], 128 + SIGKILL);
}

static void new_group_fails_at_once_for_a_rank_that_left(void **state) {
  (void)state;
  port = tdist_mp_free_port();
  int codes[3];
  tdist_mp_run_codes(3, dead_member_child, (void *)1, 60, codes);
  assert_int_equal(codes[0], 0);
  assert_int_equal(codes[1], 0);
  assert_int_equal(codes[2], 0);
}

/* ---- the abort callback comes first ---------------------------------------------- */

#define REPS 50

static atomic_int cb_done;     /* set by the abort callback, as it returns */
static atomic_int early;       /* an op was seen failed before that */
static atomic_int after_close; /* a callback ran after destroy returned */
static atomic_int closed;      /* destroy returned */

static void on_abort(tdist_group_t *g, int status, const char *reason, void *arg) {
  (void)g, (void)status, (void)reason, (void)arg;
  usleep(2000); /* widen the window a waiter would slip through */
  if (atomic_load(&closed)) atomic_fetch_add(&after_close, 1);
  atomic_store(&cb_done, 1);
}

static void on_complete(tdist_work_t *w, void *arg) {
  (void)arg;
  if (tdist_work_status(w) != 0 && !atomic_load(&cb_done)) atomic_fetch_add(&early, 1);
}

static void *poll_completed(void *arg) {
  tdist_work_t *w = arg;
  while (!tdist_work_is_completed(w))
    sched_yield();
  if (!atomic_load(&cb_done)) atomic_fetch_add(&early, 1);
  return NULL;
}

static void *abort_from_thread(void *arg) {
  tdist_group_abort(arg, "the test aborts it");
  return NULL;
}

/* REPS groups of both ranks, each aborted once: on demand by rank i % 2
 * (the other learns it from the store), or, every fifth, by a timeout of
 * its op on both. Each time a waiter, a poller of is_completed and a
 * completion callback check that the abort callback had already run. */
static int order_child(int rank, int n, void *arg) {
  (void)arg;
  tb_world_t tw;
  MP_CHECK(tb_world_join(rank, n, port, 30000, &tw) == 0);
  int all[] = {0, 1}, checked = 0;
  for (int i = 0; i < REPS; i++) {
    tdist_group_t *g = NULL;
    MP_CHECK_RC(tdist_new_group(tw.g, all, 2, NULL, &g));
    atomic_store(&cb_done, 0);
    MP_CHECK_RC(tdist_group_on_abort(g, on_abort, NULL));
    int by_timeout = i % 5 == 4;
    tdist_op_opts_t oo = {.mask = TDIST_OP_FIELD_TIMEOUT, .timeout_ms = 100};
    tdist_work_t *w = NULL;
    tb_set_mode(TB_STALL);
    MP_CHECK_RC(tdist_barrier(g, by_timeout ? &oo : NULL, &w));
    tb_set_mode(TB_COMPLETE);
    MP_CHECK_RC(tdist_work_on_complete(w, on_complete, NULL));
    pthread_t poller, aborter;
    MP_CHECK(pthread_create(&poller, NULL, poll_completed, w) == 0);
    char key[32];
    snprintf(key, sizeof(key), "order/%d", i);
    MP_CHECK(tb_store_barrier(tw.st, key, n) == 0);
    int aborts = !by_timeout && rank == i % 2;
    if (aborts) MP_CHECK(pthread_create(&aborter, NULL, abort_from_thread, g) == 0);
    int rc = tdist_work_wait(w, 0);
    if (!atomic_load(&cb_done)) atomic_fetch_add(&early, 1);
    /* A timeout: this rank's own watchdog, or the peer's abort record first. */
    MP_CHECK(rc == TDIST_ERR_ABORTED || (by_timeout && rc == TDIST_ERR_TIMEOUT));
    pthread_join(poller, NULL);
    if (aborts) pthread_join(aborter, NULL);
    MP_CHECK(atomic_load(&early) == 0);
    tdist_work_release(w);
    MP_CHECK_RC(tdist_group_destroy(g));
    checked++;
  }
  MP_CHECK(checked == REPS);
  return tb_world_leave(&tw, n);
}

static void abort_callback_runs_before_ops_fail(void **state) {
  (void)state;
  port = tdist_mp_free_port();
  assert_int_equal(tdist_mp_run(2, order_child, NULL, 120), 0);
}

/* A peer's abort races the destroy here: the callback runs before destroy
 * returns or never, and never after. Then a death and a shrink: the
 * survivors see the op fail only after the callback ran, reset the flag,
 * shrink, destroy the old group: the flag stays reset. */
static int destroy_child(int rank, int n, void *arg) {
  (void)arg;
  tb_world_t tw;
  MP_CHECK(tb_world_join(rank, n, port, 30000, &tw) == 0);
  int pair[] = {0, 1};
  for (int i = 0; i < REPS; i++) {
    tdist_group_t *g = NULL;
    MP_CHECK_RC(tdist_new_group(tw.g, pair, 2, NULL, &g));
    if (g) {
      atomic_store(&closed, 0);
      MP_CHECK_RC(tdist_group_on_abort(g, on_abort, NULL));
      char key[32];
      snprintf(key, sizeof(key), "destroy/%d", i);
      MP_CHECK(tb_store_barrier(tw.st, key, 2) == 0);
      if (rank == 0)
        tdist_group_abort(g, "the peer destroys it meanwhile");
      else if (i % 3)
        usleep((useconds_t)(i % 7) * 300); /* land the destroy around the record */
      tdist_group_destroy(g);
      atomic_store(&closed, 1);
    }
  }
  usleep(300 * 1000); /* records that came too late find no group */
  MP_CHECK(atomic_load(&after_close) == 0);

  /* world: rank 2 dies while an op is pending */
  atomic_store(&cb_done, 0);
  atomic_store(&closed, 0);
  MP_CHECK_RC(tdist_group_on_abort(tw.g, on_abort, NULL));
  tb_set_mode(TB_HELD);
  tdist_work_t *w = NULL;
  MP_CHECK_RC(tdist_barrier(tw.g, NULL, &w));
  MP_CHECK(tb_store_barrier(tw.st, "destroy/submitted", n) == 0);
  if (rank == 2) raise(SIGKILL);
  MP_CHECK(tdist_work_wait(w, 20000) == TDIST_ERR_REMOTE_FAILED);
  MP_CHECK(atomic_load(&cb_done) == 1); /* ran before the wait returned */
  atomic_store(&cb_done, 0);            /* the program resets its flag */
  tdist_work_release(w);
  tdist_group_t *s = NULL;
  MP_CHECK_RC(tdist_group_shrink(tw.g, NULL, &s));
  tb_set_mode(TB_COMPLETE);
  MP_CHECK_RC(tdist_group_destroy(tw.g));
  MP_CHECK_RC(tdist_barrier(s, NULL, NULL));
  MP_CHECK(atomic_load(&cb_done) == 0);
  tw.g = s;
  return tb_world_leave(&tw, n - 1);
}

static void no_abort_callback_after_destroy(void **state) {
  (void)state;
  port = tdist_mp_free_port();
  int codes[3];
  tdist_mp_run_codes(3, destroy_child, NULL, 120, codes);
  assert_int_equal(codes[0], 0);
  assert_int_equal(codes[1], 0);
  assert_int_equal(codes[2], 128 + SIGKILL);
}

int main(void) {
  tb_register();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(new_group_names_a_rank_that_never_came),
      cmocka_unit_test(mesh_names_a_rank_that_never_came),
      cmocka_unit_test(new_group_fails_at_once_for_a_dead_rank),
      cmocka_unit_test(new_group_fails_at_once_for_a_rank_that_left),
      cmocka_unit_test(abort_callback_runs_before_ops_fail),
      cmocka_unit_test(no_abort_callback_after_destroy),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
