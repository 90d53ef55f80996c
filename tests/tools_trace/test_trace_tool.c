/*
 * test_trace_tool.c - tdist-trace on real dumps.
 *
 * Each scenario forks four processes (tests/support/mp.h) that each create a
 * test-backend "world" group of size 4 as their own rank, run ops (the test
 * backend completes, fails or stalls them as told), and write their flight
 * recorder with tdist_dump_trace() - or, in the timeout scenario, let the
 * runtime write it on failure. The parent then runs the tdist-trace
 * executable on the dumps and checks its exit status, the seq and ranks its
 * report names, and the Chrome file (valid JSON, event counts, via python3).
 * Then damaged files: a dump cut in the middle of its last line (only that
 * line lost), a garbage line in the middle (skipped with a warning), a cut
 * or bad meta line, garbage files.
 * Finally dumps of several jobs in one directory (copies of real dumps with
 * their "job" member edited): refused unless --job picks one.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "mp.h"
#include "run_util.h"
#include "tdist/debug.h"
#include "tdist/tdist.h"
#include "tb_world.h"
#include "test_backend.h"

static char dir[64]; /* this run's scratch directory */

enum { OK, STALL, DIVERGE, TIMEOUT, DROPPED };

static float buf[1024 * 4];
static float sbuf[16]; /* all_gather's own block (sendbuf == buf is in place on rank 0 only) */

/* One op by index: all_reduce, broadcast root 0, all_gather, barrier,
 * reduce root 1 max, then all_reduce again. */
static int op(tdist_group_t *g, int i, tdist_work_t **w) {
  switch (i % 5) {
  case 0: return tdist_all_reduce(g, buf, buf, 1024, TDIST_FLOAT32, TDIST_SUM, NULL, w);
  case 1: return tdist_broadcast(g, buf, 256, TDIST_INT32, 0, NULL, w);
  case 2: return tdist_all_gather(g, sbuf, buf, 16, TDIST_FLOAT32, NULL, w);
  case 3: return tdist_barrier(g, NULL, w);
  default: return tdist_reduce(g, buf, buf, 8, TDIST_FLOAT64, TDIST_MAX, 1, NULL, w);
  }
}

static int child(int rank, int n, void *arg) {
  int sc = *(int *)arg;
  char path[160], prefix[128];
  snprintf(prefix, sizeof(prefix), "%s/auto_", dir);
  setenv("TDIST_TRACE_PREFIX", prefix, 1);
  setenv("TDIST_TRACE_ON_FAILURE", sc == TIMEOUT ? "1" : "0", 1);
  if (sc == DROPPED) setenv("TDIST_TRACE_BUFFER_SIZE", rank == 0 ? "4" : "16", 1);
  tdist_group_t *g;
  tdist_work_t *w = NULL;
  MP_CHECK_RC(tb_group_create(rank, n, sc == TIMEOUT ? 300 : 60000, &g));
  tb_set_mode(TB_COMPLETE);
  int nops = sc == DROPPED ? 8 : sc == TIMEOUT ? 3 : 5;
  for (int i = 0; i < nops; i++) {
    if (sc == DIVERGE && i == 3 && rank == 2) /* others run all_reduce at seq 3 */
      MP_CHECK_RC(tdist_broadcast(g, buf, 1024, TDIST_FLOAT32, 0, NULL, NULL));
    else if (sc == DIVERGE && i == 3)
      MP_CHECK_RC(tdist_all_reduce(g, buf, buf, 1024, TDIST_FLOAT32, TDIST_SUM, NULL, NULL));
    else if (sc == DROPPED && i == 2 && rank == 1)
      MP_CHECK_RC(tdist_broadcast(g, buf, 16, TDIST_FLOAT32, 3, NULL, NULL));
    else
      MP_CHECK_RC(op(g, i, NULL));
  }
  if (sc == STALL && rank != 2) { /* seq 5: rank 2 never calls it */
    tb_set_mode(TB_STALL);
    MP_CHECK_RC(op(g, 0, &w));
  }
  if (sc == TIMEOUT) { /* seq 3 times out everywhere; the runtime dumps by itself */
    tb_set_mode(TB_STALL);
    MP_CHECK(op(g, 0, NULL) == TDIST_ERR_TIMEOUT);
  } else {
    snprintf(path, sizeof(path), "%s/world.rank%d.json", dir, rank);
    MP_CHECK_RC(tdist_dump_trace(g, path));
  }
  if (w) {
    tdist_group_abort(g, "test over");
    MP_CHECK(tdist_work_wait(w, 5000) == TDIST_ERR_ABORTED);
    tdist_work_release(w);
  }
  tdist_group_destroy(g);
  return 0;
}

/* Run the tool with args (NULL-terminated, after the program name). */
static int tool(ru_proc_t *p, const char *a0, const char *a1, const char *a2, const char *a3) {
  char *argv[] = {TDIST_TRACE_BIN, (char *)a0, (char *)a1, (char *)a2, (char *)a3, NULL};
  int rc = ru_run(p, argv, NULL, 20);
  printf("---- tdist-trace %s %s %s %s -> %d\n%s%s", a0 ? a0 : "", a1 ? a1 : "", a2 ? a2 : "",
         a3 ? a3 : "", rc, p->out, p->err);
  return rc;
}

static void scenario(int sc) {
  char cmd[256];
  snprintf(cmd, sizeof(cmd), "rm -f %s/*.json", dir);
  assert_int_equal(system(cmd), 0);
  assert_int_equal(tdist_mp_run(4, child, &sc, 30), 0);
}

/* Count events of each phase in a Chrome file; -1 when not valid JSON. */
static void chrome_counts(const char *path, int *x, int *m, int *inst) {
  char cmd[512];
  snprintf(cmd, sizeof(cmd),
           "python3 -c 'import json,sys; ev=json.load(open(sys.argv[1]))[\"traceEvents\"]; "
           "print(*[sum(e[\"ph\"]==p for e in ev) for p in \"XMi\"])' %s",
           path);
  FILE *f = popen(cmd, "r");
  assert_non_null(f);
  *x = *m = *inst = -1;
  int got = fscanf(f, "%d %d %d", x, m, inst);
  pclose(f);
  if (got != 3) *x = *m = *inst = -1;
}

static void ok(void **state) {
  (void)state;
  ru_proc_t p;
  char out[128];
  int x, m, i;
  scenario(OK);
  snprintf(out, sizeof(out), "%s/chrome.json", dir);
  assert_int_equal(tool(&p, "-o", out, "--prefix", dir), 0);
  /* Groups without a store (the test backend's) know no job. */
  assert_non_null(strstr(p.out, "job - (unknown): 4 dumps\n"));
  assert_non_null(strstr(p.out, "no problem found (1 group, 4 dumps)"));
  assert_non_null(strstr(p.out, "rank 3 (group rank 3, "));
  assert_non_null(strstr(p.out, "last completed seq 4, next seq 5"));
  ru_free(&p);
  chrome_counts(out, &x, &m, &i);
  assert_int_equal(x, 20);    /* 4 ranks x 5 ops */
  assert_int_equal(m, 4 * 3); /* process_name, process_sort_index, thread_name */
  assert_int_equal(i, 0);
  /* Explicit files, and a group filter that matches nothing. */
  char f0[96], f1[96];
  snprintf(f0, sizeof(f0), "%s/world.rank0.json", dir);
  snprintf(f1, sizeof(f1), "%s/world.rank1.json", dir);
  assert_int_equal(tool(&p, "--group", "nosuch", f0, f1), 2);
  assert_non_null(strstr(p.err, "no dump of group 'nosuch'"));
  ru_free(&p);
  assert_int_equal(tool(&p, "--group", "world", f0, f1), 1);
  assert_non_null(strstr(p.out, "missing: no dump from ranks [2,3]"));
  assert_non_null(strstr(p.out, "first problem: group 'world': no dump from ranks [2,3]"));
  ru_free(&p);
}

static void stall(void **state) {
  (void)state;
  ru_proc_t p;
  char out[128];
  int x, m, i;
  scenario(STALL);
  snprintf(out, sizeof(out), "%s/chrome.json", dir);
  assert_int_equal(tool(&p, "-o", out, dir, NULL), 1);
  assert_non_null(strstr(p.out, "stall: seq 5 all_reduce: ranks 0,1,3 running (waiting;"));
  assert_non_null(strstr(p.out, "rank 2 never started it: last op seq 4 completed"));
  assert_non_null(strstr(p.out, "first problem: group 'world' seq 5 (all_reduce): "
                                "ranks [2] behind (last seq 4)"));
  ru_free(&p);
  chrome_counts(out, &x, &m, &i);
  assert_int_equal(x, 20 + 3);
  assert_int_equal(m, 12);
}

static void divergence(void **state) {
  (void)state;
  ru_proc_t p;
  scenario(DIVERGE);
  assert_int_equal(tool(&p, "--prefix", dir, NULL, NULL), 1);
  assert_non_null(strstr(p.out, "divergence: seq 3: ranks 0,1,3 ran all_reduce float32 x1024, "
                                "rank 2 ran broadcast float32 x1024 root 0"));
  assert_non_null(strstr(p.out, "first problem: group 'world' seq 3 (all_reduce): ranks [2] "
                                "diverge"));
  ru_free(&p);
}

static void timeout(void **state) {
  (void)state;
  ru_proc_t p;
  char out[128], prefix[96];
  int x, m, i;
  scenario(TIMEOUT);
  snprintf(out, sizeof(out), "%s/chrome.json", dir);
  snprintf(prefix, sizeof(prefix), "%s/auto_", dir); /* written by the runtime */
  /* Job "-": the default name has no job in it. */
  char name[128];
  snprintf(name, sizeof(name), "%sworld.rank3.json", prefix);
  assert_int_equal(access(name, R_OK), 0);
  assert_int_equal(tool(&p, "-o", out, "--prefix", prefix), 1);
  assert_non_null(
      strstr(p.out, "failure: seq 3 all_reduce: ranks 0-3 timed_out (TDIST_ERR_TIMEOUT"));
  assert_non_null(strstr(p.out, "aborted: all_reduce seq 3 timed out after"));
  assert_non_null(strstr(p.out, "first problem: group 'world' seq 3 (all_reduce): timed_out on "
                                "ranks [0-3] (TDIST_ERR_TIMEOUT)"));
  ru_free(&p);
  chrome_counts(out, &x, &m, &i);
  assert_int_equal(x, 16);
  assert_int_equal(i, 4); /* one instant event per failed op */
}

static void dropped(void **state) {
  (void)state;
  ru_proc_t p;
  scenario(DROPPED);
  assert_int_equal(tool(&p, dir, NULL, NULL, NULL), 1);
  assert_non_null(strstr(p.out, "(4 older dropped)"));
  assert_non_null(strstr(p.out, "divergence: seq 2: ranks 2,3 ran all_gather float32 x16, "
                                "rank 1 ran broadcast float32 x16 root 3"));
  assert_non_null(strstr(p.out, "note: rank 0 no longer has seq 2 (its ring starts at seq 4)"));
  ru_free(&p);
}

static char *slurp(const char *path);

/* Write the first `len` bytes of `src` (or the text `text`) to dir/name. */
static void write_file(const char *name, const char *src, long len, const char *text, size_t tl) {
  char path[128], *data = NULL;
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  if (src) {
    FILE *in = fopen(src, "rb");
    assert_non_null(in);
    data = malloc((size_t)len);
    assert_int_equal(fread(data, 1, (size_t)len, in), (size_t)len);
    fclose(in);
    text = data;
    tl = (size_t)len;
  }
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(text, 1, tl, f), tl);
  fclose(f);
  free(data);
}

/* Offset of the n-th newline of the file + 1 (the start of line n+1). */
static long line_start(const char *path, int n) {
  FILE *f = fopen(path, "rb");
  long off = 0;
  int c;
  while (n > 0 && (c = fgetc(f)) != EOF) {
    off++;
    if (c == '\n') n--;
  }
  fclose(f);
  return off;
}

/* Length of line n (1-based) of a file, its '\n' included. */
static long line_len(const char *path, int n) {
  return line_start(path, n) - line_start(path, n - 1);
}

/* A real dump cut in the middle of its last line (a killed copy): only that
 * line is lost, the warning names it, the earlier records all count, and the
 * seq that was cut is unknown for that rank (not "behind"). Cut just before
 * the last '\n', nothing is lost; cut between two lines, the meta line's
 * nentries tells. */
static void cut_last_line(void **state) {
  (void)state;
  ru_proc_t p;
  char good[96], keep[96];
  scenario(OK);
  snprintf(good, sizeof(good), "%s/world.rank3.json", dir);
  snprintf(keep, sizeof(keep), "%s/rank3.saved", dir); /* not a *.rank*.json name */
  assert_int_equal(rename(good, keep), 0);
  /* Meta line, then seq 0..4 on lines 2..6, and nothing after. */
  FILE *f = fopen(keep, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fclose(f);
  assert_int_equal(line_start(keep, 6), size);
  long last = line_start(keep, 5);
  write_file("cut.rank3.json", keep, last + line_len(keep, 6) / 2, NULL, 0);
  assert_int_equal(tool(&p, "--prefix", dir, NULL, NULL), 0);
  assert_non_null(strstr(p.err, "tdist-trace: warning: "));
  assert_non_null(strstr(p.err, "cut.rank3.json:6: incomplete last line skipped (the file is "
                                "truncated); 4 entries kept"));
  assert_non_null(strstr(p.out, "rank 3 (group rank 3, "));
  assert_non_null(strstr(p.out, "seqs 0..3 in its ring, last completed seq 3, next seq 5, "
                                "file truncated"));
  assert_non_null(strstr(p.out, "no problem found (1 group, 4 dumps)"));
  ru_free(&p);
  write_file("cut.rank3.json", keep, size - 1, NULL, 0);
  assert_int_equal(tool(&p, "--prefix", dir, NULL, NULL), 0);
  assert_string_equal(p.err, "");
  assert_non_null(strstr(p.out, "seqs 0..4 in its ring, last completed seq 4, next seq 5\n"));
  ru_free(&p);
  write_file("cut.rank3.json", keep, last, NULL, 0);
  assert_int_equal(tool(&p, "--prefix", dir, NULL, NULL), 0);
  assert_non_null(strstr(p.err, "cut.rank3.json:5: the file ends after 4 of 5 entry lines "
                                "(truncated); 4 entries kept"));
  assert_non_null(strstr(p.out, "seqs 0..3 in its ring, last completed seq 3, next seq 5, "
                                "file truncated"));
  ru_free(&p);
}

/* Rank 2's dump with line `n` replaced by `repl` (NULL: its "count" value
 * made a string), as dir/name. */
static void edit_line(const char *name, int n, const char *repl) {
  char path[128], line[1024];
  char *text = NULL;
  size_t tl = 0;
  FILE *ms = open_memstream(&text, &tl);
  snprintf(path, sizeof(path), "%s/world.rank2.json", dir);
  FILE *in = fopen(path, "r");
  assert_non_null(in);
  for (int ln = 1; fgets(line, sizeof(line), in); ln++) {
    char *c = strstr(line, "\"count\":");
    if (ln == n && repl) {
      fputs(repl, ms);
      continue;
    }
    if (ln == n) {
      assert_non_null(c);
      char *end = strchr(c, ',');
      fprintf(ms, "%.*s\"count\":\"%.*s\"%s", (int)(c - line), line, (int)(end - c - 8), c + 8,
              end);
      continue;
    }
    fputs(line, ms);
  }
  fclose(in);
  fclose(ms);
  write_file(name, NULL, 0, text, tl);
  free(text);
}

/* A garbage line in the middle of a real dump (and a line that is JSON but
 * not a valid entry): skipped with a warning naming the line; the records
 * around it are kept, and the seq it held is unknown for that rank, so the
 * rank is not blamed for it. */
static void garbage_line(void **state) {
  (void)state;
  ru_proc_t p;
  char good[96], keep[96];
  scenario(OK);
  snprintf(good, sizeof(good), "%s/world.rank2.json", dir);
  snprintf(keep, sizeof(keep), "%s/rank2.saved", dir);
  edit_line("bad.rank2.json", 3, "#x@!\x01 not json {\n"); /* seq 1 */
  assert_int_equal(rename(good, keep), 0);
  assert_int_equal(tool(&p, "--prefix", dir, NULL, NULL), 0);
  assert_non_null(strstr(p.err, "tdist-trace: warning: "));
  assert_non_null(strstr(p.err, "bad.rank2.json:3: unreadable line skipped: not JSON"));
  assert_non_null(strstr(p.out, "rank 2 (group rank 2, "));
  assert_non_null(strstr(p.out, "seqs 0..4 in its ring, last completed seq 4, next seq 5, "
                                "1 unreadable line skipped"));
  assert_non_null(strstr(p.out, "no problem found (1 group, 4 dumps)"));
  ru_free(&p);
  /* A line that is JSON but not an entry: skipped too. */
  assert_int_equal(rename(keep, good), 0);
  edit_line("bad.rank2.json", 4, NULL); /* seq 2 */
  assert_int_equal(rename(good, keep), 0);
  assert_int_equal(tool(&p, "--prefix", dir, NULL, NULL), 0);
  assert_non_null(strstr(p.err, "bad.rank2.json:4: unreadable line skipped: \"count\": expected "
                                "an integer"));
  assert_non_null(strstr(p.out, "1 unreadable line skipped"));
  ru_free(&p);
  /* The last line garbage (but whole): nothing readable after it, so the
   * dump counts as truncated after seq 3. */
  assert_int_equal(rename(keep, good), 0);
  edit_line("bad.rank2.json", 6, "garbage\n"); /* seq 4, the last */
  assert_int_equal(rename(good, keep), 0);
  assert_int_equal(tool(&p, "--prefix", dir, NULL, NULL), 0);
  assert_non_null(strstr(p.err, "bad.rank2.json:6: unreadable line skipped"));
  assert_non_null(strstr(p.out, "seqs 0..3 in its ring, last completed seq 3, next seq 5, "
                                "file truncated, 1 unreadable line skipped"));
  ru_free(&p);
}

static void damaged(void **state) {
  (void)state;
  ru_proc_t p;
  char good[96], path[128];
  scenario(OK);
  snprintf(good, sizeof(good), "%s/world.rank3.json", dir);
  /* Cut inside entry line 4 (seq 2): a warning, the earlier entries kept. */
  write_file("cut.rank3.json", good, line_start(good, 3) + 40, NULL, 0);
  snprintf(path, sizeof(path), "%s/cut.rank3.json", dir);
  assert_int_equal(unlink(good), 0);
  assert_int_equal(tool(&p, "--prefix", dir, NULL, NULL), 0);
  assert_non_null(strstr(p.err, "cut.rank3.json:4: incomplete last line skipped"));
  assert_non_null(strstr(p.out, "seqs 0..1 in its ring"));
  assert_non_null(strstr(p.out, "file truncated"));
  ru_free(&p);
  /* Cut in the meta line: rejected, the other files still reported. */
  write_file("cut.rank3.json", path, 100, NULL, 0);
  assert_int_equal(tool(&p, "--prefix", dir, NULL, NULL), 2);
  assert_non_null(strstr(p.err, "cut.rank3.json:1: the line ends inside a JSON value (the file "
                                "ends inside the meta line: truncated?)"));
  assert_non_null(strstr(p.out, "missing: no dump from rank [3]"));
  ru_free(&p);
  /* A bad value in the meta line: the file is rejected, naming the line. */
  snprintf(path, sizeof(path), "%s/world.rank2.json", dir);
  char *text = slurp(path), *out = NULL;
  size_t tl = 0;
  char *c = strstr(text, "\"next_seq\":"), *end = c ? strchr(c, ',') : NULL;
  assert_non_null(end);
  FILE *ms = open_memstream(&out, &tl);
  fprintf(ms, "%.*s\"next_seq\":\"%.*s\"%s", (int)(c - text), text, (int)(end - c - 11), c + 11,
          end);
  fclose(ms);
  write_file("bad.rank2.json", NULL, 0, out, tl);
  free(out);
  free(text);
  snprintf(path, sizeof(path), "%s/bad.rank2.json", dir);
  assert_int_equal(tool(&p, path, NULL, NULL, NULL), 2);
  assert_non_null(strstr(p.err, "bad.rank2.json:1: \"next_seq\": expected an integer"));
  ru_free(&p);
  /* Garbage: text, binary with NUL bytes, empty, a cut meta line. */
  static const char bin[] = "\x7f"
                            "ELF\0\0\x01{\"version\":2,\n\0\xff\xfe]}\n";
  write_file("g1.rank0.json", NULL, 0, "hello world\n", 12);
  write_file("g2.rank0.json", NULL, 0, bin, sizeof(bin));
  write_file("g3.rank0.json", NULL, 0, "", 0);
  static const char cut[] = "{\"version\":2,\"group\":{\"ranks\":[1,";
  write_file("g4.rank0.json", NULL, 0, cut, strlen(cut));
  char g[5][96];
  for (int k = 0; k < 5; k++)
    snprintf(g[k], sizeof(g[k]), "%s/g%d.rank0.json", dir, k + 1);
  assert_int_equal(tool(&p, g[0], g[1], g[2], g[3]), 2);
  assert_non_null(strstr(p.err, "g1.rank0.json:1: not a flight-recorder dump: not JSON"));
  assert_non_null(strstr(p.err, "g2.rank0.json:1: not a flight-recorder dump: NUL byte"));
  assert_non_null(strstr(p.err, "g3.rank0.json: empty file"));
  assert_non_null(strstr(p.err, "g4.rank0.json:1: the line ends inside a JSON value (the file "
                                "ends inside the meta line: truncated?)"));
  assert_non_null(strstr(p.err, "no readable dump"));
  ru_free(&p);
  /* A dump of the format before JSON Lines (version 1): named as such. */
  static const char v1[] = "{\"version\": 1, \"job\": \"-\", \"host\": \"vm\", \"pid\": 1,\n"
                           " \"group\": {\"name\": \"world\"},\n \"entries\": [\n ]}\n";
  write_file("g5.rank0.json", NULL, 0, v1, strlen(v1));
  assert_int_equal(tool(&p, g[4], NULL, NULL, NULL), 2);
  assert_non_null(strstr(p.err, "g5.rank0.json:1: a version 1 dump"));
  ru_free(&p);
  assert_int_equal(tool(&p, "--bogus", NULL, NULL, NULL), 2);
  ru_free(&p);
}

/* The contents of a file (malloc'd, NUL-terminated). */
static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  char *text = NULL;
  size_t len = 0;
  FILE *ms = open_memstream(&text, &len);
  int c;
  while ((c = fgetc(f)) != EOF)
    fputc(c, ms);
  fclose(f);
  fclose(ms);
  return text;
}

/* Write `text` as dir/name with its "job" member set to the string `job`
 * ("#V": the raw JSON value V; NULL: no member), in place of the member it
 * has, else right after "version". */
static void write_with_job(const char *name, const char *text, const char *job) {
  const char *v = strstr(text, "\"version\":2");
  assert_non_null(v);
  const char *head = v + strlen("\"version\":2"), *rest = head;
  if (!strncmp(rest, ",\"job\":\"", 8)) rest = strchr(rest + 8, '"') + 1;
  char *out = NULL;
  size_t len = 0;
  FILE *ms = open_memstream(&out, &len);
  fprintf(ms, "%.*s", (int)(head - text), text);
  if (job && job[0] == '#')
    fprintf(ms, ",\"job\":%s", job + 1);
  else if (job)
    fprintf(ms, ",\"job\":\"%s\"", job);
  fputs(rest, ms);
  fclose(ms);
  write_file(name, NULL, 0, out, len);
  free(out);
}

/* Dumps of three jobs in one directory: "-" (the test backend's), an earlier
 * job that diverged at seq 3 on rank 2, and a later one without a problem.
 * The world group's uid is the same in every job, so mixed they would make
 * one group with two dumps per rank (and blame the wrong one): refused;
 * --job analyses one job. */
static void jobs(void **state) {
  (void)state;
  ru_proc_t p;
  char path[128], *old[4], *cur[4];
  const char *a = "vm-100-1700000000", *b = "vm-200-1700000300";
  scenario(DIVERGE);
  for (int r = 0; r < 4; r++) {
    snprintf(path, sizeof(path), "%s/world.rank%d.json", dir, r);
    old[r] = slurp(path);
  }
  scenario(OK); /* leaves world.rank*.json, job "-" */
  for (int r = 0; r < 4; r++) {
    char name[96];
    snprintf(path, sizeof(path), "%s/world.rank%d.json", dir, r);
    cur[r] = slurp(path);
    snprintf(name, sizeof(name), "tdist_trace_%s.world.rank%d.json", a, r);
    write_with_job(name, old[r], a);
    snprintf(name, sizeof(name), "tdist_trace_%s.world.rank%d.json", b, r);
    write_with_job(name, cur[r], b);
  }
  snprintf(path, sizeof(path), "%s/tdist_trace_%s.world.rank3.json", dir, b);
  char *t = slurp(path); /* the member was replaced (or added), not doubled */
  assert_non_null(strstr(t, "{\"version\":2,\"job\":\"vm-200-1700000300\",\"host\":"));
  free(t);
  /* All of them: refused, naming each job and its file count; no report. */
  assert_int_equal(tool(&p, dir, NULL, NULL, NULL), 2);
  assert_non_null(strstr(p.err, "the dumps are of 3 jobs"));
  assert_non_null(strstr(p.err, "  job -: 4 files, "));
  assert_non_null(strstr(p.err, "  job vm-100-1700000000: 4 files, "));
  assert_non_null(strstr(p.err, "  job vm-200-1700000300: 4 files, "));
  assert_non_null(strstr(p.err, "pick one with --job ID"));
  assert_null(strstr(p.out, "verdict"));
  assert_null(strstr(p.out, "problem"));
  ru_free(&p);
  /* Explicit files of two jobs: refused too. */
  char fa[128], fb[128];
  snprintf(fa, sizeof(fa), "%s/tdist_trace_%s.world.rank0.json", dir, a);
  snprintf(fb, sizeof(fb), "%s/tdist_trace_%s.world.rank1.json", dir, b);
  assert_int_equal(tool(&p, fa, fb, NULL, NULL), 2);
  assert_non_null(strstr(p.err, "the dumps are of 2 jobs"));
  assert_non_null(strstr(p.err, "  job vm-100-1700000000: 1 file, "));
  ru_free(&p);
  /* --job picks one; the others are skipped with a note. */
  assert_int_equal(tool(&p, "--job", b, dir, NULL), 0);
  assert_non_null(strstr(p.out, "job vm-200-1700000300: 4 dumps\n"));
  assert_non_null(strstr(p.out, "no problem found (1 group, 4 dumps)"));
  assert_null(strstr(p.out, "two dumps of group"));
  assert_non_null(strstr(p.err, "note: --job vm-200-1700000300: skipping 8 dumps of other jobs: "));
  assert_non_null(strstr(p.err, "vm-100-1700000000 (4 files)"));
  assert_non_null(strstr(p.err, "- (4 files)"));
  ru_free(&p);
  assert_int_equal(tool(&p, "--job", a, "--prefix", dir), 1);
  assert_non_null(strstr(p.out, "job vm-100-1700000000: 4 dumps\n"));
  assert_non_null(strstr(p.out, "first problem: group 'world' seq 3 (all_reduce): ranks [2] "
                                "diverge"));
  ru_free(&p);
  assert_int_equal(tool(&p, "--job", "-", dir, NULL), 0);
  assert_non_null(strstr(p.out, "job - (unknown): 4 dumps\n"));
  ru_free(&p);
  assert_int_equal(tool(&p, "--job", "nosuch", dir, NULL), 2);
  assert_non_null(strstr(p.err, "no dump of job 'nosuch' (found: "));
  ru_free(&p);
  /* A dump without the member (an older writer) is of job "-". */
  snprintf(path, sizeof(path), "%s/world.rank0.json", dir);
  write_with_job("world.rank0.json", cur[0], NULL);
  t = slurp(path);
  assert_null(strstr(t, "\"job\""));
  free(t);
  assert_int_equal(tool(&p, "--job", "-", dir, NULL), 0);
  assert_non_null(strstr(p.out, "no problem found (1 group, 4 dumps)"));
  ru_free(&p);
  /* A bad job id is rejected like any bad value. */
  write_with_job("world.rank0.json", cur[0], "");
  assert_int_equal(tool(&p, path, NULL, NULL, NULL), 2);
  assert_non_null(strstr(p.err, "world.rank0.json:1: \"job\": empty job id"));
  ru_free(&p);
  write_with_job("world.rank0.json", cur[0], "#42");
  assert_int_equal(tool(&p, path, NULL, NULL, NULL), 2);
  assert_non_null(strstr(p.err, "world.rank0.json:1: \"job\": expected a string"));
  ru_free(&p);
  write_with_job("world.rank0.json", cur[0], "a\\u0007b");
  assert_int_equal(tool(&p, path, NULL, NULL, NULL), 2);
  assert_non_null(strstr(p.err, "world.rank0.json:1: \"job\": character 0x07 in the job id"));
  ru_free(&p);
  write_with_job("world.rank0.json", cur[0],
                 "0123456789012345678901234567890123456789012345678901234567890123");
  assert_int_equal(tool(&p, path, NULL, NULL, NULL), 2);
  assert_non_null(strstr(p.err, "world.rank0.json:1: \"job\" is too long"));
  ru_free(&p);
  for (int r = 0; r < 4; r++)
    free(old[r]), free(cur[r]);
}

/* A killed writer leaves any prefix of its file: cut rank 2's dump every 23
 * bytes; the tool must report (0: entries kept) or reject the file (2), never
 * crash nor call the cut a problem of the job. */
static void cut_anywhere(void **state) {
  (void)state;
  ru_proc_t p;
  char good[96], cut[96], d0[96], d1[96], d3[96];
  scenario(OK);
  snprintf(good, sizeof(good), "%s/world.rank2.json", dir);
  snprintf(cut, sizeof(cut), "%s/cut.rank2.json", dir);
  snprintf(d0, sizeof(d0), "%s/world.rank0.json", dir);
  snprintf(d1, sizeof(d1), "%s/world.rank1.json", dir);
  snprintf(d3, sizeof(d3), "%s/world.rank3.json", dir);
  FILE *f = fopen(good, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fclose(f);
  int kept = 0, rejected = 0;
  for (long len = 0; len < size; len += 23) {
    write_file("cut.rank2.json", good, len, NULL, 0);
    char *argv[] = {TDIST_TRACE_BIN, d0, d1, d3, cut, NULL};
    int rc = ru_run(&p, argv, NULL, 20);
    if (rc != 0 && rc != 2) printf("cut at %ld: exit %d\n%s%s", len, rc, p.out, p.err);
    assert_true(rc == 0 || rc == 2);
    assert_null(strstr(p.err, "runtime error")); /* UBSan */
    kept += rc == 0;
    rejected += rc == 2;
    ru_free(&p);
  }
  assert_true(kept > 0 && rejected > 0);
}

int main(void) {
  snprintf(dir, sizeof(dir), "/tmp/tdist_trace_tool_XXXXXX");
  if (!mkdtemp(dir)) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(ok),           cmocka_unit_test(stall),   cmocka_unit_test(divergence),
      cmocka_unit_test(timeout),      cmocka_unit_test(dropped), cmocka_unit_test(damaged),
      cmocka_unit_test(cut_anywhere), cmocka_unit_test(jobs),    cmocka_unit_test(cut_last_line),
      cmocka_unit_test(garbage_line),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  char cmd[128];
  snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
  if (system(cmd) != 0) rc = rc ? rc : 1;
  return rc;
}
