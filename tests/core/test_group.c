/*
 * test_group.c - new_group and mesh logic (membership, renumbering,
 * validation) with the test backend. Each case plays several ranks by
 * creating the parent as that rank.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "core/group/group.h"
#include "core/progress/progress.h"
#include "tb_world.h"
#include "test_backend.h"
#include "tdist/tdist.h"

static void new_group_membership_and_order(void **state) {
  (void)state;
  for (int me = 0; me < 4; me++) {
    tdist_group_t *world, *sub = NULL;
    assert_int_equal(tb_group_create(me, 4, 5000, &world), 0);
    int ranks[] = {3, 1};
    assert_int_equal(tdist_new_group(world, ranks, 2, NULL, &sub), 0);
    if (me == 3 || me == 1) {
      assert_non_null(sub);
      assert_int_equal(tdist_group_size(sub), 2);
      assert_int_equal(tdist_group_rank(sub), me == 3 ? 0 : 1);
      assert_int_equal(tdist_group_global_rank(sub, 0), 3);
      assert_int_equal(tdist_group_global_rank(sub, 1), 1);
      assert_int_equal(tdist_group_global_rank(sub, 2), -1);
      assert_string_equal(tdist_group_name(sub), "world/0");
      assert_string_equal(tdist_group_backend(sub), "test");
      assert_int_equal(tdist_group_timeout(sub), 5000);
      assert_int_equal(tdist_barrier(sub, NULL, NULL), 0);
      tdist_group_destroy(sub);
    } else {
      assert_null(sub);
    }
    /* a second split gets the next index, and the same uid on every rank */
    tdist_group_opts_t o = {
        .mask = TDIST_GROUP_FIELD_TIMEOUT | TDIST_GROUP_FIELD_NAME, .timeout_ms = 77, .name = "tp"};
    int all[] = {0, 1, 2, 3};
    assert_int_equal(tdist_new_group(world, all, 4, &o, &sub), 0);
    assert_string_equal(tdist_group_name(sub), "tp");
    assert_int_equal(tdist_group_timeout(sub), 77);
    static uint64_t uid_seen;
    if (me == 0) uid_seen = sub->uid;
    assert_true(sub->uid == uid_seen);
    tdist_group_destroy(sub);
    tdist_group_destroy(world);
  }
}

static void new_group_validation(void **state) {
  (void)state;
  tdist_group_t *world, *sub = (tdist_group_t *)1;
  assert_int_equal(tb_group_create(0, 4, 5000, &world), 0);
  int dup[] = {0, 2, 0};
  assert_int_equal(tdist_new_group(world, dup, 3, NULL, &sub), TDIST_ERR_INVALID_ARGUMENT);
  assert_null(sub);
  assert_non_null(strstr(tdist_last_error(), "rank 0 is listed twice"));
  int out[] = {1, 4};
  assert_int_equal(tdist_new_group(world, out, 2, NULL, &sub), TDIST_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(tdist_last_error(), "ranks[1] = 4 is not in [0, 4)"));
  assert_int_equal(tdist_new_group(world, out, 0, NULL, &sub), TDIST_ERR_INVALID_ARGUMENT);
  assert_int_equal(tdist_new_group(NULL, out, 1, NULL, &sub), TDIST_ERR_INVALID_ARGUMENT);
  assert_int_equal(tdist_group_set_timeout(world, 0), TDIST_ERR_INVALID_ARGUMENT);
  assert_int_equal(tdist_group_set_timeout(world, 1234), 0);
  assert_int_equal(tdist_group_timeout(world), 1234);
  tdist_group_destroy(world);
}

/* Ranks of a 2 x 3 x 2 mesh: rank = tp*6 + dp*2 + cp. */
static void mesh_lines(void **state) {
  (void)state;
  int dims[] = {2, 3, 2};
  for (int me = 0; me < 12; me++) {
    tdist_group_t *world, *g[3];
    int coords[3];
    assert_int_equal(tb_group_create(me, 12, 5000, &world), 0);
    assert_int_equal(tdist_mesh_create(world, dims, 3, NULL, g, coords), 0);
    assert_int_equal(coords[0], me / 6);
    assert_int_equal(coords[1], (me / 2) % 3);
    assert_int_equal(coords[2], me % 2);
    for (int d = 0; d < 3; d++) {
      assert_non_null(g[d]);
      assert_int_equal(tdist_group_size(g[d]), dims[d]);
      assert_int_equal(tdist_group_rank(g[d]), coords[d]);
    }
    int stride[] = {6, 2, 1};
    for (int d = 0; d < 3; d++)
      for (int i = 0; i < dims[d]; i++)
        assert_int_equal(tdist_group_global_rank(g[d], i), me + (i - coords[d]) * stride[d]);
    for (int d = 0; d < 3; d++)
      tdist_group_destroy(g[d]);
    tdist_group_destroy(world);
  }
}

static void mesh_validation(void **state) {
  (void)state;
  tdist_group_t *world, *g[3] = {NULL, NULL, NULL};
  assert_int_equal(tb_group_create(0, 6, 5000, &world), 0);
  int bad[] = {2, 2};
  assert_int_equal(tdist_mesh_create(world, bad, 2, NULL, g, NULL), TDIST_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(tdist_last_error(), "mesh 2x2 has 4 ranks but group 'world' has 6"));
  assert_null(g[0]);
  int zero[] = {6, 0};
  assert_int_equal(tdist_mesh_create(world, zero, 2, NULL, g, NULL), TDIST_ERR_INVALID_ARGUMENT);
  int ok[] = {6};
  assert_int_equal(tdist_mesh_create(world, ok, 1, NULL, g, NULL), 0);
  assert_int_equal(tdist_group_size(g[0]), 6);
  tdist_group_destroy(g[0]);
  tdist_group_destroy(world);
}

static void aborted_parent_cannot_split(void **state) {
  (void)state;
  tdist_group_t *world, *sub;
  assert_int_equal(tb_group_create(0, 2, 5000, &world), 0);
  tdist_group_abort(world, "test");
  int r[] = {0};
  assert_int_equal(tdist_new_group(world, r, 1, NULL, &sub), TDIST_ERR_ABORTED);
  tdist_group_destroy(world);
}

/* A backend that reports a failure from inside its init: the group is
 * created, then aborted with that cause once registered (its backend told
 * to abort, every op refused), never touched half-built (TSan caught the
 * progress thread aborting a group the caller was still filling in). */
static void failure_during_init(void **state) {
  (void)state;
  tdist_group_t *g = NULL;
  int aborts = tb_abort_count();
  tb_set_mode(TB_FAIL_AT_INIT);
  int rc = tb_group_create(0, 2, 5000, &g);
  tb_set_mode(TB_COMPLETE);
  assert_int_equal(rc, 0);
  float v[4] = {0};
  rc = tdist_all_reduce(g, v, v, 4, TDIST_FLOAT32, TDIST_SUM, NULL, NULL);
  if (rc == 0) /* submitted before the delivery: the next one is refused */
    rc = tdist_barrier(g, NULL, NULL);
  for (int i = 0; i < 500 && !tdist_group_is_aborted(g); i++)
    tdist_barrier(g, NULL, NULL);
  assert_true(tdist_group_is_aborted(g));
  rc = tdist_barrier(g, NULL, NULL);
  assert_int_equal(rc, TDIST_ERR_REMOTE_FAILED);
  assert_non_null(strstr(tdist_last_error(), "a peer failed during init"));
  assert_int_equal(tb_abort_count(), aborts + 1); /* the backend was told */
  tdist_group_destroy(g);
}

/* tdist_group_on_abort: called once, on the progress thread, before the
 * pending op is seen failed; at once on the caller's thread for a group
 * already aborted; one callback per group. */
typedef struct {
  int calls, status, on_progress, work_done;
  char reason[256];
  tdist_work_t *w;
} abort_seen_t;

static void on_abort(tdist_group_t *g, int status, const char *reason, void *arg) {
  (void)g;
  abort_seen_t *s = arg;
  s->calls++;
  s->status = status;
  s->on_progress = tdist__progress_on_thread();
  s->work_done = s->w ? tdist_work_is_completed(s->w) : -1;
  snprintf(s->reason, sizeof(s->reason), "%s", reason);
}

static void abort_callback(void **state) {
  (void)state;
  tdist_group_t *g;
  abort_seen_t s = {0}, late = {0};
  assert_int_equal(tb_group_create(0, 2, 5000, &g), 0);
  assert_int_equal(tdist_group_on_abort(NULL, on_abort, &s), TDIST_ERR_INVALID_ARGUMENT);
  assert_int_equal(tdist_group_on_abort(g, NULL, &s), TDIST_ERR_INVALID_ARGUMENT);
  tb_set_mode(TB_STALL);
  float v[4] = {0};
  assert_int_equal(tdist_all_reduce(g, v, v, 4, TDIST_FLOAT32, TDIST_SUM, NULL, &s.w), 0);
  tb_set_mode(TB_COMPLETE);
  assert_int_equal(tdist_group_on_abort(g, on_abort, &s), 0);
  assert_int_equal(tdist_group_on_abort(g, on_abort, &late), TDIST_ERR_INVALID_STATE);
  assert_int_equal(s.calls, 0);
  tdist_group_abort(g, "the test says so"); /* returns once the progress thread aborted */
  assert_int_equal(tdist_work_wait(s.w, 0), TDIST_ERR_ABORTED);
  assert_int_equal(s.calls, 1);
  assert_int_equal(s.status, TDIST_ERR_ABORTED);
  assert_true(s.on_progress);
  assert_int_equal(s.work_done, 0); /* the callback came before the op was seen failed */
  assert_non_null(strstr(s.reason, "the test says so"));
  tdist_group_abort(g, "again");
  assert_int_equal(s.calls, 1);
  tdist_work_release(s.w);
  tdist_group_destroy(g);

  /* Registered after the abort: runs before the call returns, here. */
  assert_int_equal(tb_group_create(0, 2, 5000, &g), 0);
  tdist_group_abort(g, "before registering");
  assert_int_equal(tdist_group_on_abort(g, on_abort, &late), 0);
  assert_int_equal(late.calls, 1);
  assert_false(late.on_progress);
  assert_int_equal(late.status, TDIST_ERR_ABORTED);
  assert_non_null(strstr(late.reason, "before registering"));
  tdist_group_destroy(g);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(new_group_membership_and_order),
      cmocka_unit_test(new_group_validation),
      cmocka_unit_test(mesh_lines),
      cmocka_unit_test(mesh_validation),
      cmocka_unit_test(aborted_parent_cannot_split),
      cmocka_unit_test(failure_during_init),
      cmocka_unit_test(abort_callback),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
