/*
 * test_host_agent - liveness through tdistrun's host agent (issue 30;
 * tools/launcher/agent.c, store/liveness.c host heartbeats): real
 * processes, real sockets, two launchers on this machine standing for two
 * hosts of two ranks each (ranks 0, 1 on host 0; 2, 3 on host 1).
 *
 *   - a rank killed with SIGKILL: every survivor, on its own host and the
 *     other, gets the death record naming it (its monitor logs it with
 *     TDIST_DEBUG=INFO) and its world group aborts; with the agent and with
 *     --no-host-agent (each rank beating to the store itself);
 *   - a rank stopped with SIGSTOP (hung): the agent misses its beats and it
 *     is declared dead ("no heartbeat"), named on every survivor; both paths;
 *   - the agent itself dies (host 1's launcher SIGKILLed): its ranks die with
 *     it (PR_SET_PDEATHSIG) and the store, seeing the agent's connection
 *     close, declares them dead: host 0's ranks get both death records;
 *   - the agent's relay connection to the store is reset under it (ss -K):
 *     it opens a new one, and a rank killed afterwards is still named on
 *     every survivor, its host's included;
 *   - the world rendezvous through the agents, and with one host's ranks
 *     joining the store themselves (--no-host-agent) in the same world.
 * No timing is asserted; short heartbeat timeouts keep the runs short.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "mp.h"
#include "run_util.h"

#define RUN_TIMEOUT 150 /* hang guard per tdistrun run (seconds) */

static char *const env_short[] = {"TDIST_DEBUG=INFO", "TDIST_HEARTBEAT_TIMEOUT_MS=2000", NULL};

static void dump(const ru_proc_t *p) {
  fprintf(stderr, "--- exit %d after %.2f s\n--- stdout:\n%s--- stderr:\n%s---\n", p->code,
          p->seconds, p->out, p->err);
}

/* Start host `node` of the two-host job: the probe with args (NULL-ended). */
static void start_host_args(ru_proc_t *p, int node, const char *port, int agent,
                            const char *const *args) {
  char nr[8];
  snprintf(nr, sizeof(nr), "%d", node);
  char *argv[24];
  int n = 0;
  char *fixed[] = {TDISTRUN,     "-n",
                   "2",          "--nnodes",
                   "2",          "--node-rank",
                   nr,           "--master-addr",
                   "127.0.0.1",  "--master-port",
                   (char *)port, "--no-fail-fast"};
  for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++)
    argv[n++] = fixed[i];
  if (!agent) argv[n++] = "--no-host-agent"; /* the agent is the default */
  argv[n++] = PROBE;
  for (; *args && n < 23; args++)
    argv[n++] = (char *)*args;
  argv[n] = NULL;
  assert_int_equal(ru_start(p, argv, env_short), 0);
}

/* Start host `node` of the two-host job: probe watch-death HOW LIST. */
static void start_host(ru_proc_t *p, int node, const char *port, int agent, const char *how,
                       const char *list) {
  const char *args[] = {"watch-death", how, list, NULL};
  start_host_args(p, node, port, agent, args);
}

/* Lines of host output `s` that start with "[rank r] " and contain needle. */
static int count(const char *s, int r, const char *needle) {
  char pre[16];
  snprintf(pre, sizeof(pre), "[rank %d] ", r);
  return ru_count_lines(s, pre, needle);
}

/* Wait until host p's stdout holds n lines containing needle (bounded). */
static int wait_out(const ru_proc_t *p, const char *needle, int n) {
  for (int i = 0; i < 1200; i++) {
    char *o = ru_peek_out(p);
    int c = o ? ru_count_lines(o, "[rank ", needle) : 0;
    free(o);
    if (c >= n) return 1;
    usleep(100000);
  }
  return 0;
}

/* Rank `dead` (on host 1) killed or stopped; ranks 0, 1, 2 (not dead) must
 * each read its death record and abort with `why` in the reason. */
static void run_one(int agent, const char *how, int dead, const char *why) {
  char port[16], list[8], rec[64];
  snprintf(port, sizeof(port), "%d", tdist_mp_free_port());
  snprintf(list, sizeof(list), "%d", dead);
  snprintf(rec, sizeof(rec), "death record from rank %d ", dead);
  ru_proc_t h0, h1;
  start_host(&h1, 1, port, agent, how, list); /* before the store: it retries */
  start_host(&h0, 0, port, agent, how, list);
  ru_wait(&h1, RUN_TIMEOUT);
  ru_wait(&h0, RUN_TIMEOUT);
  int ok = 1;
  for (int r = 0; r < 4; r++) {
    if (r == dead) continue;
    const ru_proc_t *h = r < 2 ? &h0 : &h1;
    if (count(h->err, r, rec) < 1 || count(h->out, r, "ABORT ") != 1 ||
        count(h->out, r, why) != 1) {
      fprintf(stderr, "rank %d: no death record of rank %d naming '%s'\n", r, dead, why);
      ok = 0;
    }
  }
  if (!ok) dump(&h0), dump(&h1);
  assert_true(ok);
  /* The dead rank was stopped or killed by the launcher, not left hanging. */
  assert_int_equal(h1.code, 128 + SIGKILL);
  ru_free(&h0);
  ru_free(&h1);
}

static void test_killed_agent(void **state) {
  (void)state;
  run_one(1, "kill9", 3, "its connection to the host agent closed");
}

static void test_killed_per_rank(void **state) {
  (void)state;
  run_one(0, "kill9", 3, "its store connection closed");
}

static void test_stopped_agent(void **state) {
  (void)state;
  run_one(1, "stop", 2, "no heartbeat for");
}

static void test_stopped_per_rank(void **state) {
  (void)state;
  run_one(0, "stop", 2, "no heartbeat for");
}

/* Host 1's agent (its launcher) is SIGKILLed: its ranks die with it, host
 * 0's ranks are told both deaths by the store. */
static void test_agent_killed(void **state) {
  (void)state;
  char port[16];
  snprintf(port, sizeof(port), "%d", tdist_mp_free_port());
  ru_proc_t h0, h1;
  start_host(&h1, 1, port, 1, "none", "2,3");
  start_host(&h0, 0, port, 1, "none", "2,3");
  assert_true(wait_out(&h0, "waiting", 2));
  assert_true(wait_out(&h1, "waiting", 2));
  char *o1 = ru_peek_out(&h1);
  assert_non_null(o1);
  int pids[2] = {0, 0};
  for (int r = 2; r < 4; r++) {
    char pre[32];
    snprintf(pre, sizeof(pre), "[rank %d] PID ", r);
    const char *p = strstr(o1, pre);
    assert_non_null(p);
    pids[r - 2] = atoi(p + strlen(pre));
  }
  free(o1);
  kill(h1.pid, SIGKILL);
  assert_true(wait_out(&h0, "ABORT ", 2));
  /* Host 0's launcher would wait for host 1 to say it is done: SIGTERM,
   * again once it is past its ranks (the first may come while they exit). */
  for (int t = 0; t < 60; t++) {
    char st = 0, comm[32];
    pid_t pp;
    unsigned long long started;
    if (ru_proc_stat(h0.pid, comm, sizeof(comm), &st, &pp, &started) != 0 || st == 'Z') break;
    kill(h0.pid, SIGTERM);
    sleep(1);
  }
  ru_wait(&h0, RUN_TIMEOUT);
  ru_wait(&h1, RUN_TIMEOUT);
  int ok = 1;
  for (int r = 0; r < 2; r++)
    for (int d = 2; d < 4; d++) {
      char rec[64];
      snprintf(rec, sizeof(rec), "death record from rank %d ", d);
      if (count(h0.err, r, rec) < 1) ok = 0;
    }
  if (count(h0.out, 0, "host agent's store connection closed") +
          count(h0.out, 1, "host agent's store connection closed") !=
      2)
    ok = 0;
  if (!ok) dump(&h0), dump(&h1);
  assert_true(ok);
  /* Host 1's ranks died with their agent (gone, or zombies not yet reaped). */
  for (int i = 0; i < 2; i++) {
    int gone = 0;
    for (int t = 0; t < 100 && !gone; t++) {
      char st = 0, comm[32];
      pid_t pp;
      unsigned long long started;
      gone = ru_proc_stat(pids[i], comm, sizeof(comm), &st, &pp, &started) != 0 || st == 'Z';
      if (!gone) usleep(100000);
    }
    assert_true(gone);
  }
  ru_free(&h0);
  ru_free(&h1);
}

/* The world rank r's pid, from host p's "[rank r] PID n" line (0 if none). */
static int rank_pid(const ru_proc_t *p, int r) {
  char *o = ru_peek_out(p), pre[32];
  snprintf(pre, sizeof(pre), "[rank %d] PID ", r);
  const char *at = o ? strstr(o, pre) : NULL;
  int pid = at ? atoi(at + strlen(pre)) : 0;
  free(o);
  return pid;
}

/* Abort (ss -K, the kernel's SOCK_DESTROY) the TCP connection to the
 * store's port that process `pid` opened last (the highest descriptor: the
 * host agent's relay, which connects after the launcher's own connection
 * and the agent's beat). Returns 0, or -1 if ss cannot (not root, no
 * kernel support) or finds fewer than three such connections. */
static int reset_relay_conn(pid_t pid, const char *port) {
  char cmd[256], line[512], needle[32], best[16] = "";
  snprintf(cmd, sizeof(cmd), "ss -tnpH state established '( dport = :%s )' 2>/dev/null", port);
  snprintf(needle, sizeof(needle), "pid=%d,fd=", (int)pid);
  FILE *f = popen(cmd, "r");
  if (!f) return -1;
  int n = 0, top = -1;
  while (fgets(line, sizeof(line), f)) {
    const char *at = strstr(line, needle);
    char local[128];
    if (!at || sscanf(line, "%*s %*s %127s", local) != 1 || !strrchr(local, ':')) continue;
    int fd = atoi(at + strlen(needle));
    n++;
    if (fd > top) {
      top = fd;
      snprintf(best, sizeof(best), "%s", strrchr(local, ':') + 1);
    }
  }
  pclose(f);
  if (n < 3) return -1;
  snprintf(cmd, sizeof(cmd), "ss -tnK '( sport = :%s and dport = :%s )' >/dev/null 2>&1", best,
           port);
  return system(cmd) == 0 ? 0 : -1;
}

/* Host 1's agent loses its relay's store connection (reset under it, as a
 * client that gave up on a late reply closes it): it must open a new one,
 * or the death record of a rank killed afterwards never reaches its own
 * host's survivor (rank 2 hears of deaths through the agent alone). */
static void test_agent_store_reset(void **state) {
  (void)state;
  char port[16];
  snprintf(port, sizeof(port), "%d", tdist_mp_free_port());
  ru_proc_t h0, h1;
  start_host(&h1, 1, port, 1, "none", "3");
  start_host(&h0, 0, port, 1, "none", "3");
  assert_true(wait_out(&h0, "waiting", 2));
  assert_true(wait_out(&h1, "waiting", 2));
  int victim = rank_pid(&h1, 3);
  assert_true(victim > 0);
  if (reset_relay_conn(h1.pid, port) != 0) {
    kill(h0.pid, SIGKILL), kill(h1.pid, SIGKILL), kill(victim, SIGKILL);
    ru_wait(&h0, RUN_TIMEOUT), ru_wait(&h1, RUN_TIMEOUT);
    ru_free(&h0), ru_free(&h1);
    skip(); /* ss -K needs root and SOCK_DESTROY */
  }
  sleep(1);
  kill(victim, SIGKILL);
  ru_wait(&h1, RUN_TIMEOUT);
  ru_wait(&h0, RUN_TIMEOUT);
  int ok = 1;
  for (int r = 0; r < 3; r++) {
    const ru_proc_t *h = r < 2 ? &h0 : &h1;
    if (count(h->err, r, "death record from rank 3 ") < 1 || count(h->out, r, "ABORT ") != 1 ||
        count(h->out, r, "its connection to the host agent closed") != 1 ||
        count(h->err, r, "death record from rank 2 ") != 0) {
      fprintf(stderr, "rank %d: not told rank 3's death alone\n", r);
      ok = 0;
    }
  }
  if (!ok) dump(&h0), dump(&h1);
  assert_true(ok);
  ru_free(&h0);
  ru_free(&h1);
}

/* The world rendezvous through the agents (agent_rdzv.c, store/rdzv_host.c):
 * with both hosts' agents every rank joins through its agent; with host 1
 * under --no-host-agent its ranks join the store themselves and the two
 * kinds meet in one world (the probe's init: a barrier over it). */
static void run_rdzv(int agent1) {
  char port[16];
  snprintf(port, sizeof(port), "%d", tdist_mp_free_port());
  const char *args[] = {"init", NULL};
  ru_proc_t h0, h1;
  start_host_args(&h1, 1, port, agent1, args);
  start_host_args(&h0, 0, port, 1, args);
  ru_wait(&h1, RUN_TIMEOUT);
  ru_wait(&h0, RUN_TIMEOUT);
  int ok = h0.code == 0 && h1.code == 0;
  for (int r = 0; r < 4; r++) {
    const ru_proc_t *h = r < 2 ? &h0 : &h1;
    int via = r < 2 || agent1;
    if (count(h->out, r, "INIT cpu") != 1 || count(h->err, r, "joined on 127.0.0.1") != 1 ||
        count(h->err, r, "through the host agent") != via ||
        count(h->err, r, "its store calls go through the agent too") != via) {
      fprintf(stderr, "rank %d: not joined %s\n", r, via ? "through its agent" : "directly");
      ok = 0;
    }
  }
  if (!ok) dump(&h0), dump(&h1);
  assert_true(ok);
  ru_free(&h0);
  ru_free(&h1);
}

static void test_agent_rendezvous(void **state) {
  (void)state;
  run_rdzv(1);
}

static void test_agent_rendezvous_mixed(void **state) {
  (void)state;
  run_rdzv(0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_killed_agent),     cmocka_unit_test(test_killed_per_rank),
      cmocka_unit_test(test_stopped_agent),    cmocka_unit_test(test_stopped_per_rank),
      cmocka_unit_test(test_agent_killed),     cmocka_unit_test(test_agent_store_reset),
      cmocka_unit_test(test_agent_rendezvous), cmocka_unit_test(test_agent_rendezvous_mixed),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
