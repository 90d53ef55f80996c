/*
 * test_trace.c - the flight recorder: the ring keeps the last N ops
 * (TDIST_TRACE_BUFFER_SIZE=8 here) with their states, dropped records are
 * counted, tdist_dump_trace writes on demand, a group this rank aborts on
 * demand writes no dump of its own (the program asked for it), a group that
 * times out does: JSON Lines (each line parsed here with json-c), a meta line
 * then one line per record, oldest first.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <json.h>

#include "tb_world.h"
#include "test_backend.h"
#include "tdist/tdist.h"

static char prefix[128], path[256], auto_path[256];

/* A dump, JSON Lines: every line one JSON object (json-c parses each), the
 * meta line first, then one line per record. */
enum { MAX_LINES = 64 };
static json_object *lines[MAX_LINES];
static int nlines;

static void unload(void) {
  for (int i = 0; i < nlines; i++)
    json_object_put(lines[i]);
  nlines = 0;
}

/* 0, or -1 when the file is missing. */
static int load(const char *file) {
  unload();
  FILE *f = fopen(file, "r");
  if (!f) return -1;
  char *buf = NULL;
  size_t cap = 0;
  ssize_t len;
  while ((len = getline(&buf, &cap, f)) >= 0) {
    assert_true(len > 0 && buf[len - 1] == '\n'); /* whole lines only */
    assert_true(nlines < MAX_LINES);
    json_object *o = json_tokener_parse(buf);
    assert_non_null(o);
    assert_true(json_object_is_type(o, json_type_object));
    lines[nlines++] = o;
  }
  free(buf);
  fclose(f);
  assert_true(nlines >= 1);
  return 0;
}

static json_object *get(json_object *o, const char *key) {
  json_object *v = NULL;
  assert_non_null(o);
  assert_true(json_object_object_get_ex(o, key, &v));
  return v;
}
static int64_t num(json_object *o, const char *key) { return json_object_get_int64(get(o, key)); }
static const char *str(json_object *o, const char *key) {
  json_object *v = get(o, key);
  assert_true(json_object_is_type(v, json_type_string));
  return json_object_get_string(v);
}

/* The entry line of sequence number `seq`, or NULL. */
static json_object *entry(int seq) {
  for (int i = 1; i < nlines; i++)
    if (num(lines[i], "seq") == seq) return lines[i];
  return NULL;
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
  assert_int_equal(load(path), 0);
  json_object *m = lines[0];
  assert_int_equal(num(m, "version"), 2);
  assert_string_equal(str(m, "job"), "-"); /* a group without a store */
  assert_int_equal(num(m, "next_seq"), 12);
  assert_int_equal(num(m, "recorded"), 12);
  assert_int_equal(num(m, "dropped"), 4);
  assert_false(json_object_get_boolean(get(m, "aborted")));
  assert_string_equal(str(m, "abort_reason"), "");
  assert_int_equal(num(m, "nentries"), 8);
  assert_true(num(m, "dumped_us") > 0);
  json_object *grp = get(m, "group");
  assert_string_equal(str(grp, "name"), "world");
  assert_int_equal(strlen(str(grp, "uid")), 16);
  assert_int_equal(num(grp, "size"), 2);
  assert_int_equal(json_object_array_length(get(grp, "ranks")), 2);
  assert_int_equal(nlines, 1 + 8); /* the ring keeps seq 4..11 */
  for (int i = 1; i < nlines; i++)
    assert_int_equal(num(lines[i], "seq"), 3 + i); /* oldest first */
  assert_null(entry(3));
  assert_string_equal(str(entry(4), "op"), "all_reduce");
  assert_string_equal(str(entry(4), "state"), "completed");
  assert_string_equal(str(entry(4), "status"), "TDIST_SUCCESS");
  assert_true(num(entry(4), "t_end_us") >= num(entry(4), "t_start_us"));
  assert_true(num(entry(4), "t_start_us") >= num(entry(4), "t_enqueue_us"));
  assert_string_equal(str(entry(10), "op"), "broadcast");
  assert_string_equal(str(entry(10), "dtype"), "int32");
  assert_string_equal(str(entry(10), "redop"), "sum");
  assert_int_equal(num(entry(10), "count"), 3);
  assert_int_equal(num(entry(10), "root"), 1);
  assert_string_equal(str(entry(10), "state"), "failed");
  assert_string_equal(str(entry(10), "status"), "TDIST_ERR_MISMATCH");
  assert_string_equal(str(entry(11), "op"), "scatter");
  assert_string_equal(str(entry(11), "state"), "running");
  assert_string_equal(str(entry(11), "status"), "");
  assert_int_equal(num(entry(11), "t_end_us"), 0); /* not ended */
  /* Stamped at submission (tdist__work_stamp), whether the op ended there
   * or was handed over; started then too, the backend having a submit. */
  assert_true(num(entry(4), "t_enqueue_us") > 0);
  assert_true(num(entry(11), "t_enqueue_us") > 0);
  assert_int_equal(num(entry(11), "t_start_us"), num(entry(11), "t_enqueue_us"));
  assert_int_equal(num(entry(4), "root"), -1);

  /* This rank's own abort writes no dump: the program asked for it. The
   * worker would write one within milliseconds of the abort; half a second
   * later there is none. */
  unlink(auto_path);
  assert_int_equal(tdist_group_abort(g, "test says stop"), 0);
  assert_int_equal(tdist_work_wait(w, 5000), TDIST_ERR_ABORTED);
  usleep(500000);
  assert_int_not_equal(access(auto_path, F_OK), 0);
  tdist_work_release(w);

  /* NULL group: every group, to its default file; it shows the abort. */
  assert_int_equal(tdist_dump_trace(NULL, path), TDIST_ERR_INVALID_ARGUMENT);
  unlink(auto_path);
  assert_int_equal(tdist_dump_trace(NULL, NULL), 0);
  assert_int_equal(load(auto_path), 0);
  assert_true(json_object_get_boolean(get(lines[0], "aborted")));
  assert_string_equal(str(lines[0], "abort_reason"), "aborted on demand: test says stop");
  assert_string_equal(str(entry(11), "state"), "aborted");
  assert_string_equal(str(entry(11), "status"), "TDIST_ERR_ABORTED");
  assert_int_equal(tdist_dump_trace(g, "/nonexistent-dir/x.json"), TDIST_ERR_IO);
  assert_non_null(strstr(tdist_last_error(), "/nonexistent-dir/x.json"));
  tdist_group_destroy(g);

  /* A failure the program did not ask for (a timeout) writes the dump by
   * itself, from the worker thread: it appears shortly after. */
  unlink(auto_path);
  assert_int_equal(tb_group_create(0, 2, 300, &g), 0);
  tb_set_mode(TB_HELD);
  assert_int_equal(tdist_all_reduce(g, x, x, 4, TDIST_FLOAT32, TDIST_SUM, NULL, &w), 0);
  assert_int_equal(tdist_work_wait(w, 30000), TDIST_ERR_TIMEOUT);
  tdist_work_release(w);
  for (int i = 0; i < 1000 && access(auto_path, F_OK) != 0; i++)
    usleep(10000);
  assert_int_equal(load(auto_path), 0);
  assert_true(json_object_get_boolean(get(lines[0], "aborted")));
  tb_set_mode(TB_COMPLETE);
  tdist_group_destroy(g);
  unload();
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
