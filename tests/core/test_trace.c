/*
 * test_trace.c - the flight recorder: the ring keeps the last N ops
 * (TDIST_TRACE_BUFFER_SIZE=8 here) with their states, dropped records are
 * counted, tdist_dump_trace writes on demand, and an aborting group writes
 * its own dump.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tb_world.h"
#include "test_backend.h"
#include "tdist/tdist.h"

static char prefix[128], path[256], auto_path[256];

static const char *slurp(const char *file) {
  static char buf[1 << 16];
  FILE *f = fopen(file, "r");
  if (!f) return NULL;
  size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  buf[n] = '\0';
  fclose(f);
  return buf;
}

static int count(const char *text, const char *needle) {
  int n = 0;
  for (const char *p = text; (p = strstr(p, needle)); p += strlen(needle))
    n++;
  return n;
}

/* The entry line of sequence number `seq`, or NULL. */
static const char *entry(const char *text, int seq) {
  char key[48];
  snprintf(key, sizeof(key), "{\"seq\": %d,", seq);
  return strstr(text, key);
}

static int line_has(const char *line, const char *needle) {
  const char *end = strchr(line, '\n');
  const char *hit = strstr(line, needle);
  return hit && (!end || hit < end);
}

static void recorder(void **state) {
  (void)state;
  tdist_group_t *g;
  float x[8] = {0};
  assert_int_equal(tb_group_create(0, 2, 60000, &g), 0);
  tb_set_mode(TB_COMPLETE);
  for (int i = 0; i < 10; i++) /* seq 0..9 */
    assert_int_equal(tdist_all_reduce(g, x, x, 4, TDIST_FLOAT32, TDIST_SUM, NULL, NULL), 0);
  tb_set_mode(TB_FAIL);
  tb_set_fail_code(TDIST_ERR_MISMATCH);
  assert_int_equal(tdist_broadcast(g, x, 3, TDIST_INT32, 1, NULL, NULL), TDIST_ERR_MISMATCH);
  tb_set_mode(TB_HELD);
  tdist_work_t *w;
  assert_int_equal(tdist_scatter(g, x, x, 2, TDIST_FLOAT64, 1, NULL, &w), 0); /* seq 11 */

  assert_int_equal(tdist_dump_trace(g, path), 0);
  const char *t = slurp(path);
  assert_non_null(t);
  assert_non_null(strstr(t, "\"recorded\": 12, \"dropped\": 4, \"aborted\": false"));
  assert_non_null(strstr(t, "\"name\": \"world\""));
  assert_non_null(strstr(t, "\"ranks\": [0, 1]"));
  assert_int_equal(count(t, "{\"seq\": "), 8); /* the ring keeps seq 4..11 */
  assert_null(entry(t, 3));
  assert_true(line_has(entry(t, 4), "\"op\": \"all_reduce\""));
  assert_true(line_has(entry(t, 4), "\"state\": \"completed\""));
  assert_true(line_has(entry(t, 10), "\"op\": \"broadcast\""));
  assert_true(line_has(entry(t, 10),
                       "\"dtype\": \"int32\", \"redop\": \"sum\", \"count\": 3, \"root\": 1"));
  assert_true(line_has(entry(t, 10), "\"state\": \"failed\", \"status\": \"TDIST_ERR_MISMATCH\""));
  assert_true(line_has(entry(t, 11), "\"op\": \"scatter\""));
  assert_true(line_has(entry(t, 11), "\"state\": \"running\""));
  assert_false(line_has(entry(t, 11), "\"t_end_us\": 1")); /* not ended */

  /* An abort writes the dump by itself. */
  unlink(auto_path);
  assert_int_equal(tdist_group_abort(g, "test says stop"), 0);
  assert_int_equal(tdist_work_wait(w, 5000), TDIST_ERR_ABORTED);
  /* Written by the worker thread (the progress thread writes no file): it
   * appears shortly after the failure. */
  for (int i = 0; i < 500 && access(auto_path, F_OK) != 0; i++)
    usleep(10000);
  t = slurp(auto_path);
  assert_non_null(t);
  assert_non_null(
      strstr(t, "\"aborted\": true, \"abort_reason\": \"aborted on demand: test says stop\""));
  assert_true(line_has(entry(t, 11), "\"state\": \"aborted\", \"status\": \"TDIST_ERR_ABORTED\""));
  tdist_work_release(w);

  /* NULL group: every group, to its default file. */
  assert_int_equal(tdist_dump_trace(NULL, path), TDIST_ERR_INVALID_ARGUMENT);
  unlink(auto_path);
  assert_int_equal(tdist_dump_trace(NULL, NULL), 0);
  assert_non_null(slurp(auto_path));
  assert_int_equal(tdist_dump_trace(g, "/nonexistent-dir/x.json"), TDIST_ERR_IO);
  assert_non_null(strstr(tdist_last_error(), "/nonexistent-dir/x.json"));
  tdist_group_destroy(g);
  unlink(path);
  unlink(auto_path);
}

int main(void) {
  snprintf(prefix, sizeof(prefix), "/tmp/tdist_trace_test_%d_", (int)getpid());
  snprintf(path, sizeof(path), "%sexplicit.json", prefix);
  snprintf(auto_path, sizeof(auto_path), "%sworld.rank0.json", prefix);
  setenv("TDIST_TRACE_PREFIX", prefix, 1);
  setenv("TDIST_TRACE_BUFFER_SIZE", "8", 1);
  const struct CMUnitTest tests[] = {cmocka_unit_test(recorder)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
