/*
 * test_plugin_load.c - backends found by name as plug-ins: the library
 * loads libtdist-backend-NAME.so from TDIST_BACKEND_PATH, runs ops on it
 * through the public API, and refuses, with the error naming what it found,
 * a plug-in of another ABI version, a file that is not a shared object, a
 * plug-in whose name differs from its file's, and names that are not plain.
 * This program does not link the test plug-in: only its name reaches it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tdist/backend.h"
#include "tdist/tdist.h"

static char tmpdir[128];

/* A world of one over a file store (no port to collide on). */
static int open_world(const char *backend, tdist_group_t **g) {
  static int n;
  char method[256];
  snprintf(method, sizeof(method), "file://%s/store-%d", tmpdir, n++);
  tdist_init_opts_t o = {0};
  o.mask = TDIST_INIT_FIELD_BACKEND | TDIST_INIT_FIELD_INIT_METHOD | TDIST_INIT_FIELD_RANK |
           TDIST_INIT_FIELD_WORLD_SIZE;
  o.backend = backend;
  o.init_method = method;
  o.rank = 0;
  o.world_size = 1;
  return tdist_init_process_group(&o, g);
}

/* Loaded by name, then it runs ops like any backend. */
static void test_loads_by_name(void **state) {
  (void)state;
  tdist_group_t *g = NULL;
  assert_int_equal(open_world("test", &g), 0);
  int32_t x[4] = {1, 2, 3, 4};
  assert_int_equal(tdist_all_reduce(g, x, x, 4, TDIST_INT32, TDIST_SUM, NULL, NULL), 0);
  tdist_work_t *w = NULL;
  assert_int_equal(tdist_broadcast(g, x, 4, TDIST_INT32, 0, NULL, &w), 0);
  assert_int_equal(tdist_work_wait(w, 5000), 0);
  tdist_work_release(w);
  assert_non_null(strstr(tdist_version_string(), "test"));
  assert_int_equal(tdist_group_destroy(g), 0);
  /* Found again without loading twice (the table keeps it). */
  assert_int_equal(open_world("TEST", &g), 0);
  assert_int_equal(tdist_group_destroy(g), 0);
}

/* Built with TDIST_BACKEND_ABI_VERSION + 1: refused, both versions named. */
static void test_abi_mismatch(void **state) {
  (void)state;
  tdist_group_t *g = NULL;
  assert_int_equal(open_world("testabi", &g), TDIST_ERR_NOT_SUPPORTED);
  assert_null(g);
  char want[128];
  snprintf(want, sizeof(want), "built for backend ABI version %u; this libtdist has version %u",
           TDIST_BACKEND_ABI_VERSION + 1, TDIST_BACKEND_ABI_VERSION);
  assert_non_null(strstr(tdist_last_error(), want));
  assert_non_null(strstr(tdist_last_error(), "libtdist-backend-testabi.so"));
}

static void test_unknown_name(void **state) {
  (void)state;
  tdist_group_t *g = NULL;
  assert_int_equal(open_world("nosuch", &g), TDIST_ERR_NOT_SUPPORTED);
  assert_non_null(strstr(tdist_last_error(), "unknown backend 'nosuch'"));
  assert_non_null(strstr(tdist_last_error(), "libtdist-backend-nosuch.so"));
  assert_non_null(strstr(tdist_last_error(), "TDIST_BACKEND_PATH"));
  /* Not a plain name: never made into a path. */
  assert_int_equal(open_world("../test", &g), TDIST_ERR_NOT_SUPPORTED);
  assert_non_null(strstr(tdist_last_error(), "unknown backend '../test'"));
}

/* A file that is not a shared object, and a plug-in under another name:
 * the error names the file and what is wrong with it. */
static void test_bad_files(void **state) {
  (void)state;
  char path[512], env[1024];
  snprintf(path, sizeof(path), "%s/libtdist-backend-junk.so", tmpdir);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs("not an ELF object\n", f);
  fclose(f);
  char copy[512];
  snprintf(copy, sizeof(copy), "cp %s/libtdist-backend-test.so %s/libtdist-backend-other.so",
           getenv("TDIST_TEST_PLUGIN_DIR"), tmpdir);
  assert_int_equal(system(copy), 0);
  snprintf(env, sizeof(env), "%s:%s", tmpdir, getenv("TDIST_TEST_PLUGIN_DIR"));
  setenv("TDIST_BACKEND_PATH", env, 1);
  tdist_group_t *g = NULL;
  assert_int_equal(open_world("junk", &g), TDIST_ERR_NOT_SUPPORTED);
  assert_non_null(strstr(tdist_last_error(), path));
  assert_int_equal(open_world("other", &g), TDIST_ERR_NOT_SUPPORTED);
  assert_non_null(strstr(tdist_last_error(), "is named 'test', not 'other'"));
  setenv("TDIST_BACKEND_PATH", getenv("TDIST_TEST_PLUGIN_DIR"), 1);
}

int main(void) {
  if (!getenv("TDIST_TEST_PLUGIN_DIR")) {
    fprintf(stderr, "TDIST_TEST_PLUGIN_DIR unset (ctest sets it)\n");
    return 1;
  }
  setenv("TDIST_BACKEND_PATH", getenv("TDIST_TEST_PLUGIN_DIR"), 1);
  snprintf(tmpdir, sizeof(tmpdir), "/tmp/tdist_plugin_test_%d", (int)getpid());
  char cmd[256];
  snprintf(cmd, sizeof(cmd), "mkdir -p %s", tmpdir);
  if (system(cmd) != 0) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_loads_by_name),
      cmocka_unit_test(test_abi_mismatch),
      cmocka_unit_test(test_unknown_name),
      cmocka_unit_test(test_bad_files),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
  if (system(cmd) != 0) rc = rc ? rc : 1;
  return rc;
}
