/*
 * test_unwind.c - one unwind path: a failure injected at each step of
 * init, split, mesh and shrink (util/inject.h) returns the injected cause to
 * the caller, destroys every backend state that was made (the test
 * backend counts inits and destroys; the CPU backend is checked by ASan's
 * leak report, which the test command turns on), and leaves the parent
 * usable. Single process: the test backend moves no data, and a 1-rank
 * world has a real TCP store with a token for the CPU backend and shrink.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "mp.h"
#include "tb_world.h"
#include "tdist/tdist.h"
#include "test_backend.h"
#include "util/inject.h"

#define INJECTED TDIST_ERR_IO /* a code no step returns by itself here */

/* Backend states made and not destroyed. */
static int live_states(void) { return tb_init_count() - tb_destroy_count(); }

static void expect_injected(int rc, const char *site) {
  assert_int_equal(rc, INJECTED);
  assert_non_null(strstr(tdist_last_error(), site));
}

static void all_reduce_ok(tdist_group_t *g) {
  float x[4] = {1, 2, 3, 4};
  assert_int_equal(tdist_all_reduce(g, x, x, 4, TDIST_FLOAT32, TDIST_SUM, NULL, NULL), 0);
}

/* World creation: before the backend's init, after it, after registration. */
static void test_init_steps(void **state) {
  static const char *sites[] = {"group.init", "group.register", "group.registered"};
  tb_register();
  for (size_t i = 0; i < sizeof(sites) / sizeof(sites[0]); i++) {
    int before = live_states();
    tdist_group_t *g = NULL;
    tdist__inject_arm(sites[i], INJECTED);
    expect_injected(tb_group_create(0, 4, 10000, &g), sites[i]);
    assert_null(g);
    assert_int_equal(live_states(), before);
  }
  tdist__inject_arm(NULL, 0);
}

/* Split (new_group) and mesh: the child's steps, and a mesh failing at its
 * second dimension destroys the first dimension's group. */
static void test_split_and_mesh(void **state) {
  tdist_group_t *world = NULL, *child = NULL, *mesh[2] = {NULL, NULL};
  assert_int_equal(tb_group_create(0, 4, 10000, &world), 0);
  int base = live_states();
  int ranks[2] = {0, 1};
  static const char *sites[] = {"split.backend", "group.register", "group.registered"};
  for (size_t i = 0; i < sizeof(sites) / sizeof(sites[0]); i++) {
    tdist__inject_arm(sites[i], INJECTED);
    expect_injected(tdist_new_group(world, ranks, 2, NULL, &child), sites[i]);
    assert_null(child);
    assert_int_equal(live_states(), base);
  }
  /* The first dimension's split succeeds, the second one's is refused. */
  int dims[2] = {2, 2};
  tdist__inject_arm("mesh.dim", INJECTED);
  expect_injected(tdist_mesh_create(world, dims, 2, NULL, mesh, NULL), "mesh.dim");
  assert_int_equal(live_states(), base);
  /* The parent still works, and so do children made afterwards. */
  all_reduce_ok(world);
  assert_int_equal(tdist_mesh_create(world, dims, 2, NULL, mesh, NULL), 0);
  all_reduce_ok(mesh[0]);
  assert_int_equal(tdist_group_destroy(mesh[0]), 0);
  assert_int_equal(tdist_group_destroy(mesh[1]), 0);
  assert_int_equal(tdist_group_destroy(world), 0);
  assert_int_equal(live_states(), 0);
}

/* Shrink needs a store (the dead set): a 1-rank world over a real server. */
static int shrink_child(int rank, int n, void *arg) {
  tb_world_t w;
  int port = *(int *)arg;
  MP_CHECK(tb_world_join(0, 1, port, 10000, &w) == 0);
  int base = live_states();
  static const char *sites[] = {"shrink.gather", "shrink.backend", "group.register",
                                "group.registered"};
  for (size_t i = 0; i < sizeof(sites) / sizeof(sites[0]); i++) {
    tdist_group_t *s = NULL;
    tdist__inject_arm(sites[i], INJECTED);
    MP_CHECK(tdist_group_shrink(w.g, NULL, &s) == INJECTED);
    MP_CHECK(strstr(tdist_last_error(), sites[i]) != NULL);
    MP_CHECK(s == NULL);
    MP_CHECK(live_states() == base);
  }
  tdist_group_t *s = NULL;
  MP_CHECK_RC(tdist_group_shrink(w.g, NULL, &s));
  MP_CHECK(tdist_group_destroy(s) == 0);
  MP_CHECK(tb_world_leave(&w, 1) == 0);
  MP_CHECK(live_states() == 0);
  return 0;
}

static void test_shrink_steps(void **state) {
  int port = tdist_mp_free_port();
  assert_int_equal(tdist_mp_run(1, shrink_child, &port, 60), 0);
}

/* The CPU backend through tdist_init_process_group, with a store that needs
 * a token: a failure after the backend's init must destroy its state (ASan
 * reports a leak otherwise), and the store connection must be released. */
static int cpu_child(int rank, int n, void *arg) {
  int port = *(int *)arg;
  tdist_store_server_t *srv = NULL;
  tdist_store_server_opts_t so = {.mask = TDIST_STORE_SERVER_FIELD_HOST |
                                          TDIST_STORE_SERVER_FIELD_PORT |
                                          TDIST_STORE_SERVER_FIELD_TOKEN,
                                  .host = "127.0.0.1",
                                  .port = port,
                                  .token = "s3cret"};
  MP_CHECK_RC(tdist_store_server_start(&so, &srv));
  tdist_store_t *st = NULL;
  tdist_store_opts_t o = {.mask = TDIST_STORE_FIELD_TIMEOUT | TDIST_STORE_FIELD_TOKEN,
                          .timeout_ms = 10000,
                          .token = "s3cret"};
  MP_CHECK_RC(tdist_store_connect("127.0.0.1", port, &o, &st));
  tdist_init_opts_t io = {.mask = TDIST_INIT_FIELD_STORE | TDIST_INIT_FIELD_RANK |
                                  TDIST_INIT_FIELD_WORLD_SIZE | TDIST_INIT_FIELD_BACKEND |
                                  TDIST_INIT_FIELD_TIMEOUT,
                          .store = st,
                          .rank = 0,
                          .world_size = 1,
                          .backend = "cpu",
                          .timeout_ms = 10000};
  static const char *sites[] = {"group.init", "group.register", "group.registered"};
  for (size_t i = 0; i < sizeof(sites) / sizeof(sites[0]); i++) {
    tdist_group_t *g = NULL;
    tdist__inject_arm(sites[i], INJECTED);
    MP_CHECK(tdist_init_process_group(&io, &g) == INJECTED);
    MP_CHECK(strstr(tdist_last_error(), sites[i]) != NULL);
    MP_CHECK(g == NULL);
  }
  /* And a world made afterwards works (the rendezvous was ended each time). */
  tdist_group_t *g = NULL;
  MP_CHECK_RC(tdist_init_process_group(&io, &g));
  float x[2] = {1, 2};
  MP_CHECK_RC(tdist_all_reduce(g, x, x, 2, TDIST_FLOAT32, TDIST_SUM, NULL, NULL));
  MP_CHECK_RC(tdist_group_destroy(g));
  tdist_store_release(st);
  tdist_store_server_stop(srv);
  return 0;
}

static void test_cpu_init_steps(void **state) {
  int port = tdist_mp_free_port();
  assert_int_equal(tdist_mp_run(1, cpu_child, &port, 60), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_shrink_steps),
      cmocka_unit_test(test_cpu_init_steps),
      cmocka_unit_test(test_init_steps),
      cmocka_unit_test(test_split_and_mesh),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
