/*
 * test_launcher - tdistrun end to end: real processes, real sockets.
 *
 * Each test runs the built tdistrun on launcher_probe (TDISTRUN and PROBE are
 * paths given by CMake) and checks the ranks' environment, the store the
 * launcher hosts, the "[rank r] " prefixing, fail-fast on an exit code, on
 * SIGKILL and with a rank that ignores SIGTERM, the dump grace that lets the
 * other ranks finish writing before they are stopped, signal forwarding, and
 * a two-node job made of two launchers on this machine.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "mp.h"
#include "run_util.h"

#define RUN_TIMEOUT 60 /* hang guard per tdistrun run (seconds) */

static void dump(const ru_proc_t *p) {
  fprintf(stderr, "--- exit %d after %.2f s\n--- stdout:\n%s--- stderr:\n%s---\n", p->code,
          p->seconds, p->out, p->err);
}

/* The ranks see the torchrun variables, one store address, and the flags. */
static void test_env(void **state) {
  ru_proc_t p;
  char *argv[] = {TDISTRUN, "-n", "3", "--backend", "cpu", PROBE, "env", NULL};
  char *env[] = {"RANK=77", "MASTER_PORT=1", NULL}; /* inherited values are replaced */
  ru_run(&p, argv, env, RUN_TIMEOUT);
  if (p.code) dump(&p);
  assert_int_equal(p.code, 0);
  /* The store is TDIST_STORE_URL; MASTER_PORT is another port, the same on
   * every rank, that nobody listens on (torch's env:// binds it on rank 0). */
  char port[32] = "", store[96] = "";
  for (int r = 0; r < 3; r++) {
    char prefix[32], want[128];
    snprintf(prefix, sizeof(prefix), "[rank %d] ", r);
    snprintf(want, sizeof(want),
             "ENV rank=%d world=3 local=%d lws=3 group=0 addr=127.0.0.1 port=", r, r);
    assert_int_equal(ru_count_lines(p.out, prefix, want), 1);
    const char *l = strstr(p.out, want);
    char pr[32], st[96];
    assert_int_equal(sscanf(l + strlen(want), "%31s store=%95s", pr, st), 2);
    if (r == 0) snprintf(port, sizeof(port), "%s", pr);
    if (r == 0) snprintf(store, sizeof(store), "%s", st);
    assert_string_equal(pr, port);
    assert_string_equal(st, store);
    assert_true(atoi(pr) > 1);
    assert_int_equal(strncmp(st, "tcp://127.0.0.1:", 16), 0);
    assert_true(atoi(st + 16) > 1);
    assert_int_not_equal(atoi(st + 16), atoi(pr));
  }
  assert_int_equal(ru_count_lines(p.out, "[rank ", "hosted=1 backend=cpu"), 3);
  ru_free(&p);

  /* An inherited TDIST_BACKEND reaches the ranks; --backend overrides it. */
  char *argv2[] = {TDISTRUN, "-n", "2", PROBE, "env", NULL};
  char *env2[] = {"TDIST_BACKEND=nccl", NULL};
  ru_run(&p, argv2, env2, RUN_TIMEOUT);
  if (p.code) dump(&p);
  assert_int_equal(p.code, 0);
  assert_int_equal(ru_count_lines(p.out, "[rank ", "hosted=1 backend=nccl"), 2);
  ru_free(&p);
  char *argv3[] = {TDISTRUN, "-n", "2", "--backend", "cpu", PROBE, "env", NULL};
  ru_run(&p, argv3, env2, RUN_TIMEOUT);
  assert_int_equal(p.code, 0);
  assert_int_equal(ru_count_lines(p.out, "[rank ", "hosted=1 backend=cpu"), 2);
  ru_free(&p);
}

/* The launcher's store is up for the whole job, shared by all ranks, and the
 * library's rendezvous uses it instead of hosting its own (TDIST_STORE_HOSTED). */
static void test_store(void **state) {
  ru_proc_t p;
  char *argv[] = {TDISTRUN, "-n", "4", PROBE, "store", NULL};
  ru_run(&p, argv, NULL, RUN_TIMEOUT);
  if (p.code) dump(&p);
  assert_int_equal(p.code, 0);
  assert_int_equal(ru_count_lines(p.out, "[rank ", "STORE OK 10"), 4); /* 1+2+3+4 */
  ru_free(&p);

  char *argv2[] = {TDISTRUN, "-n", "4", PROBE, "rdzv", NULL};
  ru_run(&p, argv2, NULL, RUN_TIMEOUT);
  if (p.code) dump(&p);
  assert_int_equal(p.code, 0);
  for (int r = 0; r < 4; r++) {
    char prefix[32], want[64];
    snprintf(prefix, sizeof(prefix), "[rank %d] ", r);
    snprintf(want, sizeof(want), "RDZV rank %d size 4", r);
    assert_int_equal(ru_count_lines(p.out, prefix, want), 1);
  }
  ru_free(&p);
}

/* Every line, written in pieces by 4 ranks at once, comes out whole with its
 * rank's prefix, on the stream it was written to. */
static void test_prefix(void **state) {
  ru_proc_t p;
  const int k = 150;
  char *argv[] = {TDISTRUN, "-n", "4", PROBE, "lines", "150", NULL};
  ru_run(&p, argv, NULL, RUN_TIMEOUT);
  if (p.code) dump(&p);
  assert_int_equal(p.code, 0);
  int seen[2][4] = {{0}};
  const char *streams[2] = {p.out, p.err};
  for (int s = 0; s < 2; s++) {
    char *copy = strdup(streams[s]), *save = NULL;
    for (char *l = strtok_r(copy, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
      int r, rr, i;
      char tag, digits[128];
      assert_int_equal(sscanf(l, "[rank %d] ", &r), 1);
      const char *body = strchr(l, ']') + 2;
      if (body[0] == 'a' + r) continue; /* a piece of the long line, checked below */
      assert_int_equal(sscanf(body, "%c %d %d %127s", &tag, &rr, &i, digits), 4);
      assert_int_equal(rr, r);
      assert_int_equal(tag, s == 0 ? 'L' : 'E');
      assert_int_equal(i, seen[s][r]); /* in order, none lost */
      assert_int_equal(strlen(digits), s == 0 ? 100 : 80);
      seen[s][r]++;
    }
    free(copy);
  }
  for (int r = 0; r < 4; r++) {
    assert_int_equal(seen[0][r], k);
    assert_int_equal(seen[1][r], k);
    /* The 100000-byte line is split once at 65536 bytes, each piece prefixed. */
    char prefix[32], body[8];
    snprintf(prefix, sizeof(prefix), "[rank %d] ", r);
    snprintf(body, sizeof(body), "%c%c%c", 'a' + r, 'a' + r, 'a' + r);
    assert_int_equal(ru_count_lines(p.out, prefix, body), 2);
  }
  ru_free(&p);
}

/* A rank exiting with 3 stops the others (SIGTERM) and the launcher exits 3
 * naming the rank. */
static void test_fail_exit_code(void **state) {
  ru_proc_t p;
  char *argv[] = {TDISTRUN, "-n", "3", "--grace", "5", PROBE, "fail", "2", "3", NULL};
  ru_run(&p, argv, NULL, RUN_TIMEOUT);
  if (p.code != 3) dump(&p);
  assert_int_equal(p.code, 3);
  assert_non_null(strstr(p.err, "tdistrun: rank 2 exited with code 3\n"));
  /* They do not exit by themselves: SIGTERM once the dump grace is over. */
  assert_non_null(strstr(p.err, "2 ranks still running after the 1 s dump grace: sending SIGTERM"));
  assert_int_equal(ru_count_lines(p.out, "[rank 0] ", "TERM"), 1);
  assert_int_equal(ru_count_lines(p.out, "[rank 1] ", "TERM"), 1);
  ru_free(&p);
}

/* Run "late-exit": rank 0 exits 3 once ranks 1 and 2 wait; they then take
 * 300 ms (as a rank writing its flight-recorder dump) before they create
 * their done file and exit 1. Returns how many done files were written. */
static int run_late_exit(const char *opt, const char *val, char *const *env) {
  char dir[] = "/tmp/tdist_launcher_XXXXXX", cmd[96], path[96];
  assert_non_null(mkdtemp(dir));
  char *argv[16];
  int k = 0;
  argv[k++] = TDISTRUN;
  argv[k++] = "-n";
  argv[k++] = "3";
  if (opt) argv[k++] = (char *)opt;
  if (val) argv[k++] = (char *)val;
  argv[k++] = PROBE;
  argv[k++] = "late-exit";
  argv[k++] = "0";
  argv[k++] = "300";
  argv[k++] = dir;
  argv[k] = NULL;
  ru_proc_t p;
  ru_run(&p, argv, env, RUN_TIMEOUT);
  int done = 0;
  for (int r = 1; r < 3; r++) {
    struct stat st;
    snprintf(path, sizeof(path), "%s/done.%d", dir, r);
    done += stat(path, &st) == 0 && st.st_size == 5;
  }
  /* Either way the first failure decides and is the last line; the ranks
   * that exit 1 in the dump grace are not reported as failures. */
  const char *want = "tdistrun: rank 0 exited with code 3\n", *last = strstr(p.err, want);
  if (p.code != 3 || !last || last[strlen(want)] != '\0' ||
      ru_count_lines(p.err, "tdistrun: rank 0 ", "stopping the other ranks") != 1 ||
      ru_count_lines(p.err, "tdistrun: rank ", "exited with code 1") != 0)
    dump(&p), done = -1;
  printf("late-exit %s %s %s: %d done files after %.2f s\n", opt ? opt : "", val ? val : "",
         env ? env[0] : "", done, p.seconds);
  ru_free(&p);
  snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
  assert_int_equal(system(cmd), 0);
  return done;
}

/* After a failure the other ranks first get the dump grace (1000 ms by
 * default) to exit by themselves, so their 300 ms of writing completes; with
 * no dump grace they are stopped before. Only completion is checked, never
 * durations (a loaded machine is slow). */
static void test_dump_grace(void **state) {
  assert_int_equal(run_late_exit(NULL, NULL, NULL), 2);
  assert_int_equal(run_late_exit("--dump-grace", "0", NULL), 0);
  char *env0[] = {"TDIST_DUMP_GRACE_MS=0", NULL};
  assert_int_equal(run_late_exit(NULL, NULL, env0), 0);
  assert_int_equal(run_late_exit("--dump-grace", "5000", env0), 2); /* the option wins */
}

/* kill -9 of a rank: the same, with the signal named. */
static void test_fail_kill9(void **state) {
  ru_proc_t p;
  char *argv[] = {TDISTRUN, "-n", "3", PROBE, "kill9", "1", NULL};
  ru_run(&p, argv, NULL, RUN_TIMEOUT);
  if (p.code != 137) dump(&p);
  assert_int_equal(p.code, 128 + SIGKILL);
  assert_non_null(strstr(p.err, "tdistrun: rank 1 was killed by signal 9 (SIGKILL)\n"));
  assert_int_equal(ru_count_lines(p.out, "[rank 0] ", "TERM"), 1);
  assert_int_equal(ru_count_lines(p.out, "[rank 2] ", "TERM"), 1);
  ru_free(&p);
}

/* A rank that ignores SIGTERM is killed after the grace period. */
static void test_fail_grace_kill(void **state) {
  ru_proc_t p;
  char *argv[] = {TDISTRUN, "-n", "2", "--grace", "0.5", PROBE, "ignore-term", "0", NULL};
  ru_run(&p, argv, NULL, RUN_TIMEOUT);
  if (p.code != 1) dump(&p);
  assert_int_equal(p.code, 1);
  assert_non_null(strstr(p.err, "sending SIGKILL"));
  assert_non_null(strstr(p.err, "tdistrun: rank 0 exited with code 1\n"));
  ru_free(&p);
}

/* Wait until the running launcher's stdout has `n` lines containing s. */
static int wait_output(const ru_proc_t *p, const char *s, int n) {
  for (int i = 0; i < 2000; i++) {
    char *out = ru_peek_out(p);
    int c = ru_count_lines(out, "[rank ", s);
    free(out);
    if (c >= n) return 1;
    usleep(10000);
  }
  return 0;
}

/* SIGUSR1 is forwarded and the job goes on; SIGTERM is forwarded and ends it. */
static void test_signal_forwarding(void **state) {
  ru_proc_t p;
  char *argv[] = {TDISTRUN, "-n", "2", PROBE, "wait-signal", NULL};
  assert_int_equal(ru_start(&p, argv, NULL), 0);
  assert_true(wait_output(&p, "ready", 2));
  usleep(100000); /* the launcher blocks signals before starting ranks */
  kill(p.pid, SIGUSR1);
  assert_true(wait_output(&p, "got SIGUSR1", 2));
  kill(p.pid, SIGTERM);
  ru_wait(&p, RUN_TIMEOUT);
  if (p.code != 128 + SIGTERM) dump(&p);
  assert_int_equal(p.code, 128 + SIGTERM);
  assert_int_equal(ru_count_lines(p.out, "[rank ", "got SIGTERM"), 2);
  assert_non_null(strstr(p.err, "tdistrun: stopped by SIGTERM"));
  ru_free(&p);
}

/* Two launchers form one 4-rank job; a failure on node 1 stops node 0. */
static void test_two_nodes(void **state) {
  char port[16];
  snprintf(port, sizeof(port), "%d", tdist_mp_free_port());
  ru_proc_t n0, n1;
  char *a0[] = {TDISTRUN,    "-n",
                "2",         "--nnodes",
                "2",         "--node-rank",
                "0",         "--master-addr",
                "127.0.0.1", "--master-port",
                port,        PROBE,
                "store",     NULL};
  char *a1[] = {TDISTRUN,    "-n",
                "2",         "--nnodes",
                "2",         "--node-rank",
                "1",         "--master-addr",
                "127.0.0.1", "--master-port",
                port,        PROBE,
                "store",     NULL};
  assert_int_equal(ru_start(&n1, a1, NULL), 0); /* before its server: it retries */
  assert_int_equal(ru_start(&n0, a0, NULL), 0);
  ru_wait(&n0, RUN_TIMEOUT);
  ru_wait(&n1, RUN_TIMEOUT);
  if (n0.code || n1.code) dump(&n0), dump(&n1);
  assert_int_equal(n0.code, 0);
  assert_int_equal(n1.code, 0);
  assert_int_equal(ru_count_lines(n0.out, "[rank 0] ", "STORE OK 10"), 1);
  assert_int_equal(ru_count_lines(n0.out, "[rank 1] ", "STORE OK 10"), 1);
  assert_int_equal(ru_count_lines(n1.out, "[rank 2] ", "STORE OK 10"), 1);
  assert_int_equal(ru_count_lines(n1.out, "[rank 3] ", "STORE OK 10"), 1);
  ru_free(&n0);
  ru_free(&n1);

  snprintf(port, sizeof(port), "%d", tdist_mp_free_port());
  char *f0[] = {TDISTRUN,    "-n",
                "2",         "--nnodes",
                "2",         "--node-rank",
                "0",         "--master-addr",
                "127.0.0.1", "--master-port",
                port,        PROBE,
                "fail",      "3",
                "4",         NULL};
  char *f1[] = {TDISTRUN,    "-n",
                "2",         "--nnodes",
                "2",         "--node-rank",
                "1",         "--master-addr",
                "127.0.0.1", "--master-port",
                port,        PROBE,
                "fail",      "3",
                "4",         NULL};
  assert_int_equal(ru_start(&n0, f0, NULL), 0);
  assert_int_equal(ru_start(&n1, f1, NULL), 0);
  ru_wait(&n1, RUN_TIMEOUT);
  ru_wait(&n0, RUN_TIMEOUT);
  if (n0.code != 1 || n1.code != 4) dump(&n0), dump(&n1);
  assert_int_equal(n1.code, 4);
  assert_non_null(strstr(n1.err, "tdistrun: rank 3 exited with code 4"));
  assert_int_equal(n0.code, 1);
  assert_non_null(strstr(n0.err, "node 1: rank 3 exited with code 4"));
  assert_int_equal(ru_count_lines(n0.out, "[rank ", "TERM"), 2);
  ru_free(&n0);
  ru_free(&n1);
}

/* Usage errors exit 2 with a message; a missing program exits 1. */
static void test_usage(void **state) {
  ru_proc_t p;
  char *a1[] = {TDISTRUN, PROBE, "env", NULL};
  assert_int_equal(ru_run(&p, a1, NULL, RUN_TIMEOUT), 2);
  assert_non_null(strstr(p.err, "-n N is required"));
  ru_free(&p);
  char *a2[] = {TDISTRUN, "-n", "2", "--nnodes", "2", PROBE, "env", NULL};
  assert_int_equal(ru_run(&p, a2, NULL, RUN_TIMEOUT), 2);
  assert_non_null(strstr(p.err, "--master-addr and --master-port"));
  ru_free(&p);
  char *a4[] = {TDISTRUN, "-n", "2", "--dump-grace", "-1", PROBE, "env", NULL};
  assert_int_equal(ru_run(&p, a4, NULL, RUN_TIMEOUT), 2);
  assert_non_null(strstr(p.err, "--dump-grace '-1'"));
  ru_free(&p);
  char *a5[] = {TDISTRUN, "-n", "1", PROBE, "env", NULL};
  char *e5[] = {"TDIST_DUMP_GRACE_MS=soon", NULL};
  assert_int_equal(ru_run(&p, a5, e5, RUN_TIMEOUT), 2);
  assert_non_null(strstr(p.err, "TDIST_DUMP_GRACE_MS 'soon'"));
  ru_free(&p);
  char *a3[] = {TDISTRUN, "-n", "1", "/nonexistent/prog", NULL};
  assert_int_equal(ru_run(&p, a3, NULL, RUN_TIMEOUT), 1);
  assert_non_null(strstr(p.err, "/nonexistent/prog"));
  ru_free(&p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_env),        cmocka_unit_test(test_store),
      cmocka_unit_test(test_prefix),     cmocka_unit_test(test_fail_exit_code),
      cmocka_unit_test(test_fail_kill9), cmocka_unit_test(test_fail_grace_kill),
      cmocka_unit_test(test_dump_grace), cmocka_unit_test(test_signal_forwarding),
      cmocka_unit_test(test_two_nodes),  cmocka_unit_test(test_usage),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
