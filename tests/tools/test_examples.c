/*
 * test_examples - the examples run end to end under tdistrun on the CPU
 * backend, with 2 to 4 ranks. Each example checks its results element by
 * element against a local reference and prints "OK" per rank; here we check
 * the exit codes and that every rank reported OK, and that a bad mesh shape
 * fails on every rank with a message instead of hanging.
 *
 * Skipped when the library has no CPU backend.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/init/registry.h"
#include "run_util.h"

#define RUN_TIMEOUT 120

static int have_cpu(void) { return tdist__backend_find("cpu") != NULL; }

/* Run `tdistrun -n N --backend cpu <args>` and check that every rank said OK
 * and rank 0 printed `summary`. */
static void run_ok(int n, char **args, char **env, const char *summary) {
  char nbuf[8];
  snprintf(nbuf, sizeof(nbuf), "%d", n);
  char *argv[32] = {TDISTRUN, "-n", nbuf, "--backend", "cpu"};
  int k = 5;
  for (int i = 0; args[i] && k < 31; i++)
    argv[k++] = args[i];
  argv[k] = NULL;
  ru_proc_t p;
  ru_run(&p, argv, env, RUN_TIMEOUT);
  int ok = p.code == 0;
  for (int r = 0; r < n; r++) {
    char prefix[32], want[32];
    snprintf(prefix, sizeof(prefix), "[rank %d] ", r);
    snprintf(want, sizeof(want), "rank %d: ", r);
    ok = ok && ru_count_lines(p.out, prefix, want) == 1 &&
         ru_count_lines(p.out, prefix, ": OK: ") == 1;
  }
  ok = ok && ru_count_lines(p.out, "[rank 0] ", summary) == 1;
  if (!ok)
    fprintf(stderr, "--- %s -n %d: exit %d\n--- stdout:\n%s--- stderr:\n%s---\n", args[0], n,
            p.code, p.out, p.err);
  ru_free(&p);
  assert_true(ok);
}

static void test_overlap(void **state) {
  if (!have_cpu()) skip();
  char *args[] = {EX_OVERLAP, "--buckets", "4",      "--elems", "20000",
                  "--steps",  "2",         "--work", "4",       NULL};
  run_ok(2, args, NULL, "overlap: results checked: OK");
  run_ok(4, args, NULL, "overlap: results checked: OK");
}

static void test_mesh(void **state) {
  if (!have_cpu()) skip();
  char *def[] = {EX_MESH, NULL}; /* TP=2 x DP=2 x CP=1 */
  run_ok(4, def, NULL, "mesh: TP=2 x DP=2 x CP=1 over 4 ranks: results checked: OK");
  char *arg[] = {EX_MESH, "1", "2", "2", NULL};
  run_ok(4, arg, NULL, "mesh: TP=1 x DP=2 x CP=2 over 4 ranks: results checked: OK");
  char *env[] = {"TP_SIZE=1", "DP_SIZE=1", "CP_SIZE=3", NULL};
  run_ok(3, def, env, "mesh: TP=1 x DP=1 x CP=3 over 3 ranks: results checked: OK");
}

/* A mesh whose product is not the world size: every rank reports the error
 * and exits 1; tdistrun names a failed rank and exits non-zero. */
static void test_mesh_bad_shape(void **state) {
  if (!have_cpu()) skip();
  char *argv[] = {TDISTRUN, "-n", "2", "--backend", "cpu", EX_MESH, "3", "1", "1", NULL};
  ru_proc_t p;
  ru_run(&p, argv, NULL, RUN_TIMEOUT);
  if (p.code != 1) fprintf(stderr, "stdout:\n%s\nstderr:\n%s\n", p.out, p.err);
  assert_int_equal(p.code, 1);
  assert_true(ru_count_lines(p.err, "[rank ", "error: tdist_mesh_create") >= 1);
  assert_non_null(strstr(p.err, "exited with code 1"));
  ru_free(&p);
}

static void test_pipeline(void **state) {
  if (!have_cpu()) skip();
  char *args[] = {EX_PIPELINE, "--micro", "6", "--elems", "10000", NULL};
  run_ok(2, args, NULL, "results checked: OK");
  run_ok(4, args, NULL, "results checked: OK");
}

/* Expert-parallel dispatch/combine with all_to_all_v and a skewed router. */
static void test_moe(void **state) {
  if (!have_cpu()) skip();
  char *def[] = {EX_MOE, NULL};
  char *small[] = {EX_MOE, "--tokens", "3", "--hidden", "5", "--experts-per-rank", "3", NULL};
  run_ok(2, def, NULL, "moe: 4 experts over 2 ranks");
  run_ok(3, small, NULL, "results checked: OK");
  run_ok(4, def, NULL, "results checked: OK");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_overlap),
      cmocka_unit_test(test_mesh),
      cmocka_unit_test(test_mesh_bad_shape),
      cmocka_unit_test(test_pipeline),
      cmocka_unit_test(test_moe),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
