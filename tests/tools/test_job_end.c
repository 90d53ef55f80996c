/*
 * test_job_end - a job ends, and nothing of it stays behind: real processes,
 * real signals.
 *
 *   - A rank stopped by SIGSTOP is declared dead by the store (heartbeat
 *     timeout 1.5 s): tdistrun kills it and ends, with --no-fail-fast and
 *     without, exiting 137 and naming the rank; no rank process is left.
 *   - The tdist-store that rank 0 starts when no launcher hosts the store
 *     (ranks forked by this test, as srun or mpirun would) is gone, neither
 *     alive nor a zombie, once the job ended: at once when rank 0 ended
 *     normally (it stops and reaps its store); when rank 0 vanished first
 *     (it _exit()s), the store ends by itself when the others left and is
 *     reaped by whoever adopted it: this test, a child subreaper (bounded
 *     wait).
 *   - Under tdistrun, a rank 0 that hosts its own store is killed: tdistrun
 *     (a child subreaper) adopts the store, which ends with the job, and
 *     reaps it before it returns.
 *   - Backend names are case-insensitive; an unknown one is named as such,
 *     with the known ones.
 *
 * TDISTRUN, PROBE and STORE_BIN are paths given by CMake. Bounded waits only,
 * no timed assertions.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/init/registry.h"
#include "mp.h"
#include "run_util.h"
#include "tdist/tdist.h"

#define RUN_TIMEOUT 90 /* hang guard per run (seconds); the ctest TIMEOUT bounds the whole */

static void dump(const char *what, const ru_proc_t *p) {
  fprintf(stderr, "--- %s: exit %d after %.2f s\n--- stdout:\n%s--- stderr:\n%s---\n", what,
          p->code, p->seconds, p->out, p->err);
}

/* 1 if the process `pid` with command name `comm` (and start time `start`,
 * unless 0) still exists, alive or as a zombie; its state in *state. */
static int still_there(pid_t pid, const char *comm, unsigned long long start, char *state) {
  char c[32];
  pid_t ppid;
  unsigned long long t;
  if (ru_proc_stat(pid, c, sizeof(c), state, &ppid, &t) != 0) return 0;
  return !strcmp(c, comm) && (!start || t == start);
}

/* Every "PID <n>" line the ranks printed names a process that is gone. */
static void assert_ranks_gone(const char *out) {
  int found = 0;
  for (const char *l = strstr(out, "] PID "); l; l = strstr(l + 1, "] PID ")) {
    pid_t pid = (pid_t)atoi(l + 6);
    char state = 0;
    found++;
    if (still_there(pid, "launcher_probe", 0, &state))
      fail_msg("rank process %d is still there (state %c)", (int)pid, state);
  }
  assert_int_equal(found, 3);
}

/* tdistrun -n 3 [--no-fail-fast] on "stop-self 1": ranks 0 and 2 finish,
 * rank 1 stays stopped until the store declares it dead, then tdistrun kills
 * it and ends naming it. */
static void run_stopped_rank(int keep_going) {
  char *argv[12];
  int k = 0;
  argv[k++] = TDISTRUN;
  argv[k++] = "-n";
  argv[k++] = "3";
  if (keep_going) argv[k++] = "--no-fail-fast";
  argv[k++] = PROBE;
  argv[k++] = "stop-self";
  argv[k++] = "1";
  argv[k] = NULL;
  char *env[] = {"TDIST_HEARTBEAT_TIMEOUT_MS=1500", "TDIST_HEARTBEAT_INTERVAL_MS=250", NULL};
  ru_proc_t p;
  ru_run(&p, argv, env, RUN_TIMEOUT);
  /* The last line names the dead rank. */
  const char *want = "tdistrun: rank 1 was declared dead by the store (";
  size_t len = strlen(p.err);
  const char *last = p.err + len;
  if (len > 0) last--; /* the final newline */
  while (last > p.err && last[-1] != '\n')
    last--;
  int named = !strncmp(last, want, strlen(want));
  if (p.code != 128 + SIGKILL || !named) dump("stop-self", &p);
  assert_int_not_equal(p.code, -1); /* it ended by itself */
  assert_int_equal(p.code, 128 + SIGKILL);
  assert_true(named);
  assert_int_equal(ru_count_lines(p.out, "[rank 1] ", "stopping"), 1);
  assert_int_equal(ru_count_lines(p.out, "[rank 0] ", "done"), 1);
  assert_int_equal(ru_count_lines(p.out, "[rank 2] ", "done"), 1);
  if (keep_going)
    assert_int_equal(ru_count_lines(p.err, "tdistrun: rank 1 was declared dead", "go on"), 1);
  assert_ranks_gone(p.out);
  ru_free(&p);
}

static void test_stopped_rank_no_fail_fast(void **state) { run_stopped_rank(1); }
static void test_stopped_rank_fail_fast(void **state) { run_stopped_rank(0); }

/* Run 3 ranks of "init [exiter]" forked here, rank 0 hosting the store as a
 * tdist-store process on a port of its own; returns the store's pid and
 * start time (from rank 0's "STORE" line) once every rank ended. */
static pid_t run_store_job(const char *exiter, unsigned long long *start) {
  char port[32], size[] = "WORLD_SIZE=3", addr[] = "MASTER_ADDR=127.0.0.1";
  char bin[4200], ranks[3][16];
  snprintf(port, sizeof(port), "MASTER_PORT=%d", tdist_mp_free_port());
  snprintf(bin, sizeof(bin), "TDIST_STORE_BIN=%s", STORE_BIN);
  ru_proc_t p[3];
  for (int r = 0; r < 3; r++) {
    snprintf(ranks[r], sizeof(ranks[r]), "RANK=%d", r);
    char *env[] = {ranks[r], size, addr, port, bin, "TDIST_STORE_HOSTED=0", NULL};
    char *argv[] = {PROBE, "init", (char *)exiter, NULL};
    assert_int_equal(ru_start(&p[r], argv, env), 0);
  }
  int ok = 1;
  for (int r = 0; r < 3; r++) {
    ru_wait(&p[r], RUN_TIMEOUT);
    if (p[r].code != 0) ok = 0;
  }
  if (!ok)
    for (int r = 0; r < 3; r++)
      dump("store job rank", &p[r]);
  assert_true(ok);
  int pid = 0;
  const char *l = strstr(p[0].out, "STORE ");
  if (!l || sscanf(l, "STORE %d %llu", &pid, start) != 2) dump("rank 0", &p[0]);
  assert_non_null(l);
  assert_true(pid > 0);
  for (int r = 0; r < 3; r++)
    ru_free(&p[r]);
  return (pid_t)pid;
}

/* Every rank destroyed its group and exited: rank 0 stopped and reaped its
 * store before it exited, so it is gone now, not even a zombie. */
static void test_store_reaped_with_job(void **state) {
  unsigned long long start = 0;
  pid_t st = run_store_job(NULL, &start);
  char s = 0;
  if (still_there(st, "tdist-store", start, &s))
    fail_msg("tdist-store %d is still there after its job (state %c)", (int)st, s);
}

/* Rank 0 _exit()s without a word: its store outlives it (the others may
 * still need it) and ends by itself, exit code 0, once they left or died.
 * This test is a child subreaper (main), as a launcher that must leave
 * nothing behind would be, so the orphaned store became its child: it reaps
 * it (bounded wait), and nothing is left for PID 1. */
static void test_store_gone_after_rank0_vanished(void **state) {
  unsigned long long start = 0;
  pid_t st = run_store_job("0", &start);
  char s = 0, comm[32];
  pid_t ppid = 0;
  unsigned long long t = 0;
  if (ru_proc_stat(st, comm, sizeof(comm), &s, &ppid, &t) == 0 && t == start)
    assert_int_equal(ppid, getpid()); /* adopted by this subreaper */
  int status = 0, i = 0;
  pid_t r = 0;
  for (; i < 3000 && (r = waitpid(st, &status, WNOHANG)) == 0; i++)
    usleep(10000);
  if (r == 0) {
    kill(st, SIGKILL);
    waitpid(st, &status, 0);
    fail_msg("tdist-store %d still running 30 s after its job", (int)st);
  }
  assert_int_equal(r, st);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
}

/* Under tdistrun, rank 0 hosts its own store (the program's rendezvous on
 * MASTER_PORT, as torch's would be: env -u TDIST_STORE_URL,
 * TDIST_STORE_HOSTED=0) and is killed (SIGKILL) after the barrier. Its
 * tdist-store outlives it, ends once the job is over, and is reaped by
 * tdistrun, which adopted it (a child subreaper): when tdistrun returns,
 * /proc has no trace of it, not even a zombie. (Before, the orphan went to
 * the next subreaper up - this test - or to PID 1, and stayed a zombie.) */
static void test_store_reaped_by_launcher_after_rank0_killed(void **state) {
  char bin[4200];
  snprintf(bin, sizeof(bin), "TDIST_STORE_BIN=%s", STORE_BIN);
  char *env[] = {bin, "TDIST_HEARTBEAT_TIMEOUT_MS=1500", "TDIST_HEARTBEAT_INTERVAL_MS=250", NULL};
  char *argv[] = {TDISTRUN,
                  "-n",
                  "3",
                  "env",
                  "-u",
                  "TDIST_STORE_URL",
                  "-u",
                  "TDIST_HOST_AGENT",
                  "TDIST_STORE_HOSTED=0",
                  PROBE,
                  "init",
                  "0",
                  "kill",
                  NULL};
  ru_proc_t p;
  ru_run(&p, argv, env, RUN_TIMEOUT);
  int pid = 0;
  unsigned long long start = 0;
  const char *l = strstr(p.out, "STORE ");
  if (!l || sscanf(l, "STORE %d %llu", &pid, &start) != 2 || p.code != 128 + SIGKILL)
    dump("rank 0 killed", &p);
  assert_non_null(l);
  assert_true(pid > 0);
  assert_int_equal(p.code, 128 + SIGKILL);
  ru_free(&p);
  char s = 0;
  if (still_there((pid_t)pid, "tdist-store", start, &s)) {
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    fail_msg("tdist-store %d is still there after tdistrun returned (state %c)", pid, s);
  }
}

/* "CPU", "NCCL", "Gloo" name the built-in backends; "foo" is unknown, and
 * the error says which names are known. */
static void test_backend_names(void **state) {
  assert_non_null(tdist__backend_find("cpu"));
  assert_ptr_equal(tdist__backend_find("CPU"), tdist__backend_find("cpu"));
  assert_ptr_equal(tdist__backend_find("Gloo"), tdist__backend_find("cpu"));
  assert_ptr_equal(tdist__backend_find("NCCL"), tdist__backend_find("nccl"));
  assert_null(tdist__backend_find("foo"));

  tdist_init_opts_t o = {.mask = TDIST_INIT_FIELD_BACKEND, .backend = "foo"};
  tdist_group_t *g = NULL;
  assert_int_equal(tdist_init_process_group(&o, &g), TDIST_ERR_NOT_SUPPORTED);
  assert_null(g);
  assert_non_null(strstr(tdist_last_error(), "unknown backend 'foo'; known: cpu, nccl"));
  assert_non_null(strstr(tdist_last_error(), "(gloo = cpu)"));

  /* Through tdistrun: --backend CPU and Gloo run on cpu; foo fails in
   * every rank with that message. */
  const char *names[] = {"CPU", "Gloo"};
  for (int i = 0; i < 2; i++) {
    ru_proc_t p;
    char *argv[] = {TDISTRUN, "-n", "2", "--backend", (char *)names[i], PROBE, "init", NULL};
    ru_run(&p, argv, NULL, RUN_TIMEOUT);
    if (p.code) dump(names[i], &p);
    assert_int_equal(p.code, 0);
    assert_int_equal(ru_count_lines(p.out, "[rank ", "INIT cpu"), 2);
    ru_free(&p);
  }
  ru_proc_t p;
  char *argv[] = {TDISTRUN, "-n", "2", "--backend", "foo", PROBE, "init", NULL};
  ru_run(&p, argv, NULL, RUN_TIMEOUT);
  if (p.code != 1) dump("foo", &p);
  assert_int_equal(p.code, 1);
  assert_true(ru_count_lines(p.err, "[rank ", "unknown backend 'foo'; known: cpu, nccl") >= 1);
  ru_free(&p);
}

int main(void) {
  /* Orphans of the jobs run here (rank 0's store once rank 0 is gone) come
   * to this process rather than to PID 1, so that the tests can see them
   * end and reap them. */
  if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) perror("PR_SET_CHILD_SUBREAPER");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_stopped_rank_no_fail_fast),
      cmocka_unit_test(test_stopped_rank_fail_fast),
      cmocka_unit_test(test_store_reaped_with_job),
      cmocka_unit_test(test_store_gone_after_rank0_vanished),
      cmocka_unit_test(test_store_reaped_by_launcher_after_rank0_killed),
      cmocka_unit_test(test_backend_names),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
