/*
 * test_faults.c - fault injection over real processes (issue 7).
 *
 * Runs fault_rank (see its header for what each rank does and checks) in
 * each scenario - kill, stop, skip, store - at world sizes 3 (victim: the
 * last rank) and 4 (victim: rank 1, a middle one, so the survivors are
 * renumbered by the shrink), and checks from the outside: every survivor
 * exits 0 after printing what it saw and its recovery, the victim dies the
 * expected way, and tdist-trace on the flight-recorder dumps names the
 * victim and the op (seq FAULT_SEQ).
 *
 *   test_faults           the fork/exec harness: the test starts each rank
 *                         itself with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT
 *                         (rank 0 hosts the store; `store` uses a separate
 *                         tdist-store process that a rank kills);
 *   test_faults launcher  the same under tdistrun: with --no-fail-fast
 *                         (survivors recover and exit 0, tdistrun exits
 *                         non-zero naming the victim), and kill with the
 *                         default fail-fast (survivors report before they
 *                         are stopped; tdistrun names the victim, signal 9).
 *
 * Every process runs under a hang guard (RUN_GUARD_S); a scratch directory
 * per run holds the dumps and is removed when the run passed.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "faults.h"
#include "mp.h"
#include "run_util.h"

#define RUN_GUARD_S 90

static int use_launcher; /* argv[1] == "launcher" */
static int verbose;      /* $FAULTS_VERBOSE: show every process's output */
static double total_s;   /* wall time of all runs, printed at the end */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void show(const char *what, const ru_proc_t *p) {
  fprintf(stderr, "---- %s: exit %d after %.2f s\n%s%s", what, p->code, p->seconds,
          p->out ? p->out : "", p->err ? p->err : "");
}

/* Start a tdist-store on a free port; returns its port (the process in *p). */
static int start_store(ru_proc_t *p) {
  char *argv[] = {TDIST_STORE_BIN, "--host", "127.0.0.1", "--port", "0", NULL};
  assert_int_equal(ru_start(p, argv, NULL), 0);
  int port = 0;
  for (int i = 0; i < 1000 && !port; i++) {
    char *out = ru_peek_out(p);
    const char *l = strstr(out, "listening on 127.0.0.1:");
    if (l) port = atoi(l + strlen("listening on 127.0.0.1:"));
    free(out);
    if (!port) usleep(10000);
  }
  assert_true(port > 0);
  return port;
}

/* Output lines of world rank r: "FAULT rank r <what>" (any prefix). */
static int said(const char *out, int r, const char *what) {
  char needle[128];
  snprintf(needle, sizeof(needle), "FAULT rank %d %s", r, what);
  int n = 0;
  for (const char *s = out; (s = strstr(s, needle)); s += strlen(needle))
    n++;
  return n;
}

/* 1 if the line "FAULT rank r <what>..." exists and also contains `also`. */
static int said_with(const char *out, int r, const char *what, const char *also) {
  char needle[128];
  snprintf(needle, sizeof(needle), "FAULT rank %d %s", r, what);
  const char *l = strstr(out, needle);
  if (!l) return 0;
  const char *nl = strchr(l, '\n'), *hit = strstr(l, also);
  return hit && (!nl || hit < nl);
}

/* tdist-trace on the run's dumps of group 'world'. kill/stop: the victim
 * wrote nothing (it was killed or stopped) and the survivors' op seq
 * FAULT_SEQ failed; skip: the victim's dump shows it never submitted it. */
static void check_trace(const char *dir, const char *sc, int victim) {
  if (!strcmp(sc, "store")) return; /* nothing failed, nothing dumped */
  char chrome[128], want[160];
  snprintf(chrome, sizeof(chrome), "%s/chrome.json", dir);
  char *argv[] = {TDIST_TRACE_BIN, "-o", chrome, "--group", "world", (char *)dir, NULL};
  ru_proc_t p;
  ru_run(&p, argv, NULL, 30);
  int ok = p.code == 1;
  snprintf(want, sizeof(want), "first problem: group 'world' seq %d (all_reduce): ", FAULT_SEQ);
  ok = ok && strstr(p.out, want);
  if (!strcmp(sc, "skip")) {
    snprintf(want, sizeof(want), "seq %d (all_reduce): ranks [%d] behind (last seq %d)", FAULT_SEQ,
             victim, FAULT_SEQ - 1);
    ok = ok && strstr(p.out, want);
  } else {
    /* the survivors' op failed because of the death, not something else */
    const char *first = strstr(p.out, "first problem: ");
    ok = ok && first && strstr(first, "aborted on ranks [") &&
         strstr(first, "(TDIST_ERR_REMOTE_FAILED)\n");
    snprintf(want, sizeof(want), "missing: no dump from rank [%d]", victim);
    ok = ok && strstr(p.out, want);
    snprintf(want, sizeof(want), "rank %d (world rank %d", victim, victim);
    ok = ok && strstr(p.out, want); /* the survivors' abort reason */
  }
  struct stat st;
  ok = ok && stat(chrome, &st) == 0 && st.st_size > 100;
  if (!ok || verbose) show("tdist-trace", &p);
  if (!ok) fprintf(stderr, "scratch directory kept: %s\n", dir);
  ru_free(&p);
  assert_true(ok);
}

/* What every rank of a finished run must have printed and exited with. */
static int check_ranks(const char *sc, int n, int victim, const char *out, const int *codes) {
  int dies = !strcmp(sc, "kill") || !strcmp(sc, "stop");
  int ok = 1;
  for (int r = 0; r < n; r++) {
    int survivor = !dies || r != victim;
    if (codes) ok = ok && codes[r] == (survivor ? 0 : 128 + SIGKILL);
    if (!survivor) continue;
    ok = ok && said(out, r, "done") == 1;
    if (!strcmp(sc, "store"))
      ok = ok && said(out, r, "store gone: shrink -> TDIST_ERR_CLOSED") == 1 &&
           said_with(out, r, "store gone: collectives (", "rounds) and new_group ok");
    else
      ok = ok && said(out, r, "saw TDIST_ERR_") == 1 && said(out, r, "shrunk: rank") == 1;
  }
  if (!strcmp(sc, "stop")) ok = ok && said(out, victim == 0 ? 1 : 0, "killed the stopped") == 1;
  return ok;
}

/* 1 if a sanitizer reported something (ASan, UBSan, TSan write to stderr;
 * a report also makes the process exit non-zero, but not a rank that is
 * being stopped anyway). */
static int sanitizer_report(const char *err) {
  return strstr(err, "Sanitizer") != NULL || strstr(err, "runtime error:") != NULL;
}

static void make_dir(char *dir, size_t len) {
  snprintf(dir, len, "/tmp/tdist-faults-XXXXXX");
  assert_non_null(mkdtemp(dir));
}

static void remove_dir(const char *dir) {
  char cmd[128];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

/* Environment of every process of a run (the store host reads the heartbeat
 * timeout, the ranks the rest): strings in env[], pointers in envp[]
 * (NULL-terminated, room for more after it). */
static void base_env(char env[][64], char **envp, const char *sc, int store_pid) {
  int k = 0;
  snprintf(env[k++], 64, "TDIST_HEARTBEAT_TIMEOUT_MS=%d", FAULT_HB_TIMEOUT_MS);
  snprintf(env[k++], 64, "TDIST_HEARTBEAT_INTERVAL_MS=%d", FAULT_HB_INTERVAL_MS);
  snprintf(env[k++], 64, "TDIST_TIMEOUT_MS=%d",
           !strcmp(sc, "store") ? FAULT_STORE_TIMEOUT_MS : FAULT_TIMEOUT_MS);
  snprintf(env[k++], 64, "FAULT_STORE_PID=%d", store_pid);
  for (int i = 0; i < k; i++)
    envp[i] = env[i];
  envp[k] = NULL;
}

/* ---- the fork/exec harness ----------------------------------------------------- */

static void run_forked(const char *sc, int n, int victim) {
  char dir[64], vs[16], env[8][64];
  char rank_env[8][4][64];
  char *envp[8][12];
  ru_proc_t ranks[8], store = {0};
  int codes[8], store_pid = 0, port;
  double t0 = now_s();
  make_dir(dir, sizeof(dir));
  snprintf(vs, sizeof(vs), "%d", victim);
  if (!strcmp(sc, "store")) {
    port = start_store(&store);
    store_pid = (int)store.pid;
  } else {
    port = tdist_mp_free_port();
  }
  for (int r = 0; r < n; r++) {
    base_env(env, envp[r], sc, store_pid);
    int k = 4;
    snprintf(rank_env[r][0], 64, "RANK=%d", r);
    snprintf(rank_env[r][1], 64, "WORLD_SIZE=%d", n);
    snprintf(rank_env[r][2], 64, "MASTER_PORT=%d", port);
    /* rank 0 hosts the store, except when an external one runs */
    snprintf(rank_env[r][3], 64, "TDIST_STORE_HOSTED=%d", store_pid ? 1 : 0);
    for (int i = 0; i < 4; i++)
      envp[r][k++] = rank_env[r][i];
    envp[r][k++] = "MASTER_ADDR=127.0.0.1";
    envp[r][k] = NULL;
    char *argv[] = {FAULT_RANK, (char *)sc, vs, dir, NULL};
    assert_int_equal(ru_start(&ranks[r], argv, envp[r]), 0);
  }
  /* Survivors first: in `stop` one of them ends the stopped victim. */
  int dies = !strcmp(sc, "kill") || !strcmp(sc, "stop");
  for (int r = 0; r < n; r++)
    if (!dies || r != victim) codes[r] = ru_wait(&ranks[r], RUN_GUARD_S);
  if (dies) {
    if (!strcmp(sc, "stop")) { /* in case the survivor could not: no hang */
      usleep(100000);
      kill(ranks[victim].pid, SIGKILL);
      kill(ranks[victim].pid, SIGCONT);
    }
    codes[victim] = ru_wait(&ranks[victim], RUN_GUARD_S);
  }
  if (store_pid) {
    kill(store.pid, SIGKILL); /* already dead if a rank did its job */
    ru_wait(&store, RUN_GUARD_S);
  }
  size_t cap = 1;
  for (int r = 0; r < n; r++)
    cap += strlen(ranks[r].out) + 1;
  char *all = calloc(cap, 1);
  for (int r = 0; r < n; r++)
    strcat(strcat(all, ranks[r].out), "\n");
  int ok = check_ranks(sc, n, victim, all, codes);
  for (int r = 0; r < n; r++)
    ok = ok && !sanitizer_report(ranks[r].err);
  double dt = now_s() - t0;
  total_s += dt;
  printf("faults %s n=%d victim=%d (fork): %s in %.2f s; exit codes", sc, n, victim,
         ok ? "ok" : "FAILED", dt);
  for (int r = 0; r < n; r++)
    printf(" %d", codes[r]);
  printf("\n");
  for (int r = 0; r < n; r++) {
    char what[32];
    snprintf(what, sizeof(what), "rank %d", r);
    if (!ok || verbose) show(what, &ranks[r]);
    ru_free(&ranks[r]);
  }
  if (store_pid) {
    if (!ok || verbose) show("tdist-store", &store);
    ru_free(&store);
  }
  free(all);
  if (!ok) fprintf(stderr, "scratch directory kept: %s\n", dir);
  assert_true(ok);
  check_trace(dir, sc, victim);
  remove_dir(dir);
}

/* ---- under tdistrun ---------------------------------------------------------------- */

static void run_launched(const char *sc, int n, int victim, int fail_fast) {
  char dir[64], vs[16], ns[16], ps[16], env[8][64], *envp[8];
  ru_proc_t p, store = {0};
  int store_pid = 0, port = 0;
  double t0 = now_s();
  make_dir(dir, sizeof(dir));
  snprintf(vs, sizeof(vs), "%d", victim);
  snprintf(ns, sizeof(ns), "%d", n);
  if (!strcmp(sc, "store")) {
    port = start_store(&store);
    store_pid = (int)store.pid;
  }
  snprintf(ps, sizeof(ps), "%d", port);
  base_env(env, envp, sc, store_pid);
  char *argv[16];
  int k = 0;
  argv[k++] = TDISTRUN;
  argv[k++] = "-n";
  argv[k++] = ns;
  if (!fail_fast) argv[k++] = "--no-fail-fast";
  if (store_pid) {
    argv[k++] = "--external-store";
    argv[k++] = "--master-port";
    argv[k++] = ps;
  }
  argv[k++] = FAULT_RANK;
  argv[k++] = (char *)sc;
  argv[k++] = vs;
  argv[k++] = dir;
  argv[k] = NULL;
  ru_run(&p, argv, envp, RUN_GUARD_S);
  if (store_pid) {
    kill(store.pid, SIGKILL);
    ru_wait(&store, RUN_GUARD_S);
    ru_free(&store);
  }
  int dies = !strcmp(sc, "kill") || !strcmp(sc, "stop");
  char want[96], dead[96];
  snprintf(want, sizeof(want), "tdistrun: rank %d was killed by signal 9 (SIGKILL)\n", victim);
  /* A stopped victim is killed by rank 0 (the scenario's end) or, first on
   * a loaded machine, by tdistrun once the store declared it dead: either
   * last line names it. */
  snprintf(dead, sizeof(dead), "tdistrun: rank %d was declared dead by the store (", victim);
  int ok = p.code == (dies ? 128 + SIGKILL : 0);
  if (dies) { /* the last line names the rank that died first */
    size_t el = strlen(p.err);
    const char *last = el ? p.err + el - 1 : p.err;
    while (last > p.err && last[-1] != '\n')
      last--;
    static const char killed[] = "and killed (SIGKILL)\n";
    int by_store = !strcmp(sc, "stop") && !strncmp(last, dead, strlen(dead)) &&
                   el >= sizeof(killed) - 1 && !strcmp(p.err + el - (sizeof(killed) - 1), killed);
    ok = ok && (!strcmp(last, want) || by_store);
  }
  if (fail_fast) {
    /* Stopped by SIGTERM, but not before they said what they saw. */
    char named[64];
    snprintf(named, sizeof(named), "rank %d (world rank %d", victim, victim);
    for (int r = 0; r < n; r++)
      if (r != victim)
        ok = ok && said(p.out, r, "saw TDIST_ERR_REMOTE_FAILED after") == 1 &&
             said_with(p.out, r, "saw TDIST_ERR_REMOTE_FAILED", named);
    ok = ok && strstr(p.err, "stopping the other ranks") != NULL;
  } else {
    ok = ok && check_ranks(sc, n, victim, p.out, NULL);
    /* every survivor exited 0: only the victim's failure was reported */
    ok = ok && ru_count_lines(p.err, "tdistrun: rank ", "the other ranks go on") == dies;
  }
  ok = ok && !sanitizer_report(p.err) && !sanitizer_report(p.out);
  double dt = now_s() - t0;
  total_s += dt;
  printf("faults %s n=%d victim=%d (tdistrun%s): %s in %.2f s; tdistrun exit %d\n", sc, n, victim,
         fail_fast ? "" : " --no-fail-fast", ok ? "ok" : "FAILED", dt, p.code);
  if (!ok || verbose) show("tdistrun", &p);
  if (!ok) {
    fprintf(stderr, "scratch directory kept: %s\n", dir);
  }
  ru_free(&p);
  assert_true(ok);
  if (!fail_fast) check_trace(dir, sc, victim);
  remove_dir(dir);
}

/* n = 3: the victim is the last rank; n = 4: a middle one (rank 1). */
static void both_sizes(const char *sc) {
  for (int n = 3; n <= 4; n++) {
    int victim = n == 3 ? 2 : 1;
    if (use_launcher)
      run_launched(sc, n, victim, 0);
    else
      run_forked(sc, n, victim);
  }
}

static void test_kill(void **state) { both_sizes("kill"); }
static void test_stop(void **state) { both_sizes("stop"); }
static void test_skip(void **state) { both_sizes("skip"); }
static void test_store(void **state) { both_sizes("store"); }

/* Default fail-fast: the victim's death stops the survivors. */
static void test_kill_fail_fast(void **state) {
  run_launched("kill", 3, 2, 1);
  run_launched("kill", 4, 1, 1);
}

int main(int argc, char **argv) {
  use_launcher = argc > 1 && !strcmp(argv[1], "launcher");
  verbose = getenv("FAULTS_VERBOSE") != NULL;
  const struct CMUnitTest fork_tests[] = {
      cmocka_unit_test(test_kill),
      cmocka_unit_test(test_stop),
      cmocka_unit_test(test_skip),
      cmocka_unit_test(test_store),
  };
  const struct CMUnitTest launcher_tests[] = {
      cmocka_unit_test(test_kill),           cmocka_unit_test(test_stop),
      cmocka_unit_test(test_skip),           cmocka_unit_test(test_store),
      cmocka_unit_test(test_kill_fail_fast),
  };
  int rc = use_launcher ? cmocka_run_group_tests_name("faults_launcher", launcher_tests, NULL, NULL)
                        : cmocka_run_group_tests_name("faults_fork", fork_tests, NULL, NULL);
  printf("faults (%s): %.1f s of runs\n", use_launcher ? "tdistrun" : "fork", total_s);
  return rc;
}
