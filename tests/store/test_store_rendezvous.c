/*
 * test_store_rendezvous.c - init methods over real processes: env:// with
 * rank 0 hosting the server (ranks started before it), tcp:// against an
 * already running server, file://; errors naming the variable for missing or
 * contradictory settings; two processes claiming one RANK; the rendezvous
 * per host (tdist_store_rendezvous_host, rdzv_host.c) mixed with ranks
 * joining directly, an agent calling twice, a host claimed twice, its
 * timeout naming how many arrived; rank 0's store process killed under it
 * during the rendezvous, named in rank 0's error. Uses
 * tdist__rendezvous_join, the part of tdist_init_process_group before the
 * backend, so it runs without one.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <pthread.h>
#include <sys/wait.h>

#include "store/rendezvous.h"
#include "store_test_util.h"

static int g_port;
static char g_method[300];

static void set_env(int rank, int n) {
  char b[32];
  snprintf(b, sizeof(b), "%d", rank);
  setenv("RANK", b, 1);
  snprintf(b, sizeof(b), "%d", n);
  setenv("WORLD_SIZE", b, 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  snprintf(b, sizeof(b), "%d", g_port);
  setenv("MASTER_PORT", b, 1);
}

static int join_child(int rank, int n, void *arg) {
  set_env(rank, n);
  if (rank != 0) st_sleep_ms(10 * rank);
  tdist_init_opts_t o = {.mask = TDIST_INIT_FIELD_TIMEOUT, .timeout_ms = 20000};
  if (g_method[0]) {
    o.mask |= TDIST_INIT_FIELD_INIT_METHOD;
    o.init_method = g_method;
  }
  if (arg) { /* a server is already running: nobody hosts */
    o.mask |= TDIST_INIT_FIELD_HOST_STORE;
    o.host_store = 0;
  }
  tdist__rdzv_t r;
  MP_CHECK_RC(tdist__rendezvous_join(&o, &r));
  MP_CHECK(r.rank == rank && r.size == n && r.timeout_ms == 20000);
  /* after the barrier every rank's claim is visible */
  int all = 0;
  char k[64];
  snprintf(k, sizeof(k), "tdist/rdzv/rank/%d", n - 1);
  const char *kk = k;
  MP_CHECK_RC(tdist_store_check(r.store, &kk, 1, &all));
  MP_CHECK(all == 1);
  tdist_store_release(r.store);
  MP_CHECK_RC(tdist__rendezvous_cleanup());
  return 0;
}

static void test_env_rank0_hosts(void **state) {
  g_port = tdist_mp_free_port();
  g_method[0] = 0;
  assert_int_equal(tdist_mp_run(4, join_child, NULL, 40), 0);
}

/* A store server in a child process on g_port, for `secs` at most; kill it
 * with stop_server. The method becomes tcp:// to it. */
static pid_t fork_server(int secs) {
  snprintf(g_method, sizeof(g_method), "tcp://127.0.0.1:%d", g_port);
  pid_t pid = fork();
  if (pid == 0) {
    tdist_store_server_t *srv;
    if (st_start_server(g_port, NULL, &srv)) _exit(1);
    st_sleep_ms(secs * 1000);
    _exit(0);
  }
  return pid;
}

static void stop_server(pid_t pid) {
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
}

static void test_tcp_external_server(void **state) {
  g_port = tdist_mp_free_port();
  pid_t pid = fork_server(30);
  int rc = tdist_mp_run(3, join_child, (void *)1, 40);
  stop_server(pid);
  assert_int_equal(rc, 0);
}

static void test_file_method(void **state) {
  char path[128];
  snprintf(path, sizeof(path), "/tmp/tdist-rdzv-test-%d", (int)getpid());
  unlink(path);
  snprintf(g_method, sizeof(g_method), "file://%s", path);
  assert_int_equal(tdist_mp_run(3, join_child, NULL, 40), 0);
  unlink(path);
}

/* World ranks 0 and 2 of WORLD_SIZE=4 started by hand (no launcher) on a
 * store server of their own: both time out naming the ranks that never
 * came, not only how many did. */
static int missing_child(int idx, int n, void *arg) {
  (void)n;
  (void)arg;
  int rank = idx * 2;
  set_env(rank, 4);
  tdist_init_opts_t o = {.mask = TDIST_INIT_FIELD_TIMEOUT | TDIST_INIT_FIELD_INIT_METHOD |
                                 TDIST_INIT_FIELD_HOST_STORE,
                         .timeout_ms = 1500,
                         .init_method = g_method,
                         .host_store = 0};
  tdist__rdzv_t r;
  int rc = tdist__rendezvous_join(&o, &r);
  if (rc != TDIST_ERR_TIMEOUT || !strstr(tdist_last_error(), "ranks 1,3 never arrived"))
    fprintf(stderr, "rank %d: %s: %s\n", rank, tdist_err_name(rc), tdist_last_error());
  MP_CHECK(rc == TDIST_ERR_TIMEOUT);
  MP_CHECK(strstr(tdist_last_error(), "2 of WORLD_SIZE=4 ranks arrived; ranks 1,3 never arrived"));
  return 0;
}

static void test_timeout_names_missing(void **state) {
  g_port = tdist_mp_free_port();
  pid_t pid = fork_server(30);
  int rc = tdist_mp_run(2, missing_child, NULL, 40);
  stop_server(pid);
  g_method[0] = 0;
  assert_int_equal(rc, 0);
}

static void *kill_my_store(void *arg) {
  (void)arg;
  for (int i = 0; i < 500; i++) {
    pid_t st = tdist_mp_store_of(getpid(), g_port);
    if (st > 0) {
      st_sleep_ms(200); /* rank 0 waits in the rendezvous by now */
      kill(st, SIGKILL);
      return NULL;
    }
    st_sleep_ms(10);
  }
  return NULL;
}

/* Rank 0 of two hosts the store as a process; it is killed while rank 0
 * waits for rank 1 (which never comes): rank 0's error says so, beside
 * what its client saw. */
static int store_killed_child(int rank, int n, void *arg) {
  const char *self_killing_bin = arg;
  if (rank != 0) return 0;
  set_env(0, n);
  if (self_killing_bin) setenv("TDIST_STORE_BIN", self_killing_bin, 1);
  pthread_t t;
  if (!self_killing_bin) MP_CHECK(pthread_create(&t, NULL, kill_my_store, NULL) == 0);
  tdist_init_opts_t o = {.mask = TDIST_INIT_FIELD_TIMEOUT | TDIST_INIT_FIELD_HOST_STORE,
                         .timeout_ms = 15000,
                         .host_store = TDIST_HOST_STORE_PROCESS};
  tdist__rdzv_t r;
  int rc = tdist__rendezvous_join(&o, &r);
  if (!self_killing_bin) pthread_join(t, NULL);
  const char *msg = tdist_last_error();
  if (rc == 0 || !strstr(msg, "this rank started was killed by signal 9"))
    fprintf(stderr, "rank 0: %s: %s\n", tdist_err_name(rc), msg);
  MP_CHECK(rc != 0);
  MP_CHECK(strstr(msg, "this rank started was killed by signal 9") != NULL);
  return 0;
}

static void test_store_killed_is_named(void **state) {
  g_port = tdist_mp_free_port();
  g_method[0] = 0;
  assert_int_equal(tdist_mp_run(2, store_killed_child, NULL, 40), 0);
}

/* The same, killed before it said it listens (CI once killed the store of
 * the case above while it started, under load): the start's error names
 * the signal too. The store program here kills itself at once. */
static void test_store_killed_at_start_is_named(void **state) {
  (void)state;
  char dir[] = "/tmp/tdist-rdzv-XXXXXX", bin[64];
  assert_non_null(mkdtemp(dir));
  snprintf(bin, sizeof(bin), "%s/tdist-store", dir);
  FILE *f = fopen(bin, "w");
  assert_non_null(f);
  fputs("#!/bin/sh\nkill -9 $$\n", f);
  fclose(f);
  assert_int_equal(chmod(bin, 0755), 0);
  g_port = tdist_mp_free_port();
  g_method[0] = 0;
  int rc = tdist_mp_run(2, store_killed_child, bin, 40);
  unlink(bin);
  rmdir(dir);
  assert_int_equal(rc, 0);
}

/* Each case: environment, expected code, a word the message must contain. */
static int error_child(int rank, int n, void *arg) {
  tdist_init_opts_t o = {.mask = TDIST_INIT_FIELD_TIMEOUT, .timeout_ms = 2000};
  tdist__rdzv_t r;
  unsetenv("RANK");
  unsetenv("WORLD_SIZE");
  unsetenv("MASTER_ADDR");
  unsetenv("MASTER_PORT");
  unsetenv("SLURM_PROCID");
  unsetenv("OMPI_COMM_WORLD_RANK");
  unsetenv("SLURM_NTASKS");
  unsetenv("OMPI_COMM_WORLD_SIZE");
  MP_CHECK(tdist__rendezvous_join(&o, &r) == TDIST_ERR_INVALID_ARGUMENT);
  MP_CHECK(strstr(tdist_last_error(), "RANK"));
  setenv("RANK", "5", 1);
  MP_CHECK(tdist__rendezvous_join(&o, &r) == TDIST_ERR_INVALID_ARGUMENT);
  MP_CHECK(strstr(tdist_last_error(), "WORLD_SIZE"));
  setenv("WORLD_SIZE", "4", 1);
  MP_CHECK(tdist__rendezvous_join(&o, &r) == TDIST_ERR_INVALID_ARGUMENT);
  MP_CHECK(strstr(tdist_last_error(), "RANK=5 is not below WORLD_SIZE=4"));
  setenv("RANK", "x", 1);
  MP_CHECK(tdist__rendezvous_join(&o, &r) == TDIST_ERR_INVALID_ARGUMENT);
  MP_CHECK(strstr(tdist_last_error(), "RANK='x'"));
  setenv("RANK", "1", 1);
  MP_CHECK(tdist__rendezvous_join(&o, &r) == TDIST_ERR_INVALID_ARGUMENT);
  MP_CHECK(strstr(tdist_last_error(), "MASTER_ADDR"));
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  MP_CHECK(tdist__rendezvous_join(&o, &r) == TDIST_ERR_INVALID_ARGUMENT);
  MP_CHECK(strstr(tdist_last_error(), "MASTER_PORT"));
  setenv("LOCAL_RANK", "3", 1);
  setenv("LOCAL_WORLD_SIZE", "2", 1);
  MP_CHECK(tdist__rendezvous_join(&o, &r) == TDIST_ERR_INVALID_ARGUMENT);
  MP_CHECK(strstr(tdist_last_error(), "LOCAL_RANK=3"));
  unsetenv("LOCAL_RANK");
  unsetenv("LOCAL_WORLD_SIZE");
  /* SLURM fallbacks */
  unsetenv("RANK");
  unsetenv("WORLD_SIZE");
  setenv("SLURM_PROCID", "7", 1);
  setenv("SLURM_NTASKS", "2", 1);
  MP_CHECK(tdist__rendezvous_join(&o, &r) == TDIST_ERR_INVALID_ARGUMENT);
  MP_CHECK(strstr(tdist_last_error(), "SLURM_PROCID=7"));
  setenv("SLURM_PROCID", "1", 1);
  o.mask |= TDIST_INIT_FIELD_INIT_METHOD;
  o.init_method = "udp://x";
  MP_CHECK(tdist__rendezvous_join(&o, &r) == TDIST_ERR_INVALID_ARGUMENT);
  MP_CHECK(strstr(tdist_last_error(), "udp://x"));
  /* no server and not hosting (rank 1): times out, naming host:port */
  o.init_method = "tcp://127.0.0.1:1";
  o.timeout_ms = 300;
  MP_CHECK(tdist__rendezvous_join(&o, &r) == TDIST_ERR_TIMEOUT);
  MP_CHECK(strstr(tdist_last_error(), "127.0.0.1:1"));
  return 0;
}

static void test_errors_name_the_variable(void **state) {
  assert_int_equal(tdist_mp_run(1, error_child, NULL, 30), 0);
}

/* Two processes claim RANK=1 of 2: exactly one of them fails naming RANK
 * (whichever comes second: on a loaded machine the later-started one may
 * well come first). Counted in memory shared across the fork. */
static atomic_int *dup_counts; /* [0] joined as RANK=1, [1] refused */

static int dup_child(int rank, int n, void *arg) {
  int r = rank == 0 ? 0 : 1;
  set_env(r, 2);
  tdist_init_opts_t o = {.mask = TDIST_INIT_FIELD_TIMEOUT, .timeout_ms = 10000};
  if (rank == 2) st_sleep_ms(300);
  tdist__rdzv_t out;
  int rc = tdist__rendezvous_join(&o, &out);
  if (rank > 0 && rc == TDIST_ERR_INVALID_ARGUMENT) {
    MP_CHECK(strstr(tdist_last_error(), "RANK=1"));
    atomic_fetch_add(&dup_counts[1], 1);
    return 0;
  }
  MP_CHECK_RC(rc);
  if (rank > 0) atomic_fetch_add(&dup_counts[0], 1);
  tdist_store_release(out.store);
  /* Rank 0 keeps serving until the duplicate was told (bounded). */
  for (int i = 0; rank == 0 && i < 2000; i++) {
    if (atomic_load(&dup_counts[0]) + atomic_load(&dup_counts[1]) >= 2) break;
    st_sleep_ms(10);
  }
  tdist__rendezvous_cleanup();
  return 0;
}

static void test_duplicate_rank(void **state) {
  g_port = tdist_mp_free_port();
  dup_counts =
      mmap(NULL, 2 * sizeof(atomic_int), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  assert_true(dup_counts != MAP_FAILED);
  atomic_store(&dup_counts[0], 0);
  atomic_store(&dup_counts[1], 0);
  assert_int_equal(tdist_mp_run(3, dup_child, NULL, 30), 0);
  assert_int_equal(atomic_load(&dup_counts[0]), 1);
  assert_int_equal(atomic_load(&dup_counts[1]), 1);
  munmap(dup_counts, 2 * sizeof(atomic_int));
}

/* ---- the rendezvous per host (rdzv_host.c) ---- */

/* Shared across the forks: [0] processes of the world done, [1] failures
 * seen as expected; jobs[i]: the job id process i got. */
static atomic_int *host_counts;
static char (*host_jobs)[64];

static tdist_store_t *host_store_open(void) {
  tdist_store_t *s = NULL;
  tdist_store_opts_t so = {.mask = TDIST_STORE_FIELD_TIMEOUT, .timeout_ms = 20000};
  if (tdist_store_connect("127.0.0.1", g_port, &so, &s)) return NULL;
  return s;
}

static void *second_call(void *arg) {
  /* the same agent (process) counts in one more rank of host 1, later */
  (void)arg;
  st_sleep_ms(200);
  /* its own connection: a handle serves one call at a time, and the first
   * call waits for the world (the agent opens one per batch too) */
  tdist_store_t *s = host_store_open();
  static char job[64];
  int rc = s ? tdist_store_rendezvous_host(s, 1, 1, 5, 20000, job, sizeof(job)) : -1;
  tdist_store_release(s);
  return rc == 0 ? (void *)job : NULL;
}

/* World of 5: host 0 (process 0) brings ranks 0-1 in one call, host 1
 * (process 1) ranks 2 and 3 in two calls, rank 4 (process 2) joins the store
 * itself. Process 3, once the world is complete, claims host 0 again (a
 * second agent for it) and is refused naming both; then, on a fresh prefix,
 * waits for a world that never completes and is told how many arrived. */
static int host_child(int idx, int n, void *arg) {
  tdist_store_t *s = host_store_open();
  MP_CHECK(s != NULL);
  if (idx == 0) {
    MP_CHECK_RC(tdist_store_rendezvous_host(s, 0, 2, 5, 20000, host_jobs[0], 64));
  } else if (idx == 1) {
    pthread_t t;
    void *ok = NULL;
    MP_CHECK(pthread_create(&t, NULL, second_call, s) == 0);
    int rc = tdist_store_rendezvous_host(s, 1, 1, 5, 20000, host_jobs[1], 64);
    pthread_join(t, &ok);
    MP_CHECK_RC(rc);
    MP_CHECK(ok != NULL && strcmp(ok, host_jobs[1]) == 0);
  } else if (idx == 2) {
    set_env(4, 5);
    tdist_init_opts_t o = {.mask = TDIST_INIT_FIELD_TIMEOUT | TDIST_INIT_FIELD_HOST_STORE |
                                   TDIST_INIT_FIELD_INIT_METHOD,
                           .timeout_ms = 20000,
                           .host_store = 0,
                           .init_method = g_method};
    tdist__rdzv_t r;
    MP_CHECK_RC(tdist__rendezvous_join(&o, &r));
    snprintf(host_jobs[2], 64, "%s", r.job);
    tdist_store_release(r.store);
  } else {
    for (int i = 0; i < 3000 && atomic_load(&host_counts[0]) < 3; i++)
      st_sleep_ms(10);
    MP_CHECK(atomic_load(&host_counts[0]) == 3);
    char job[64];
    MP_CHECK(tdist_store_rendezvous_host(s, 0, 1, 5, 2000, job, sizeof(job)) ==
             TDIST_ERR_INVALID_ARGUMENT);
    MP_CHECK(strstr(tdist_last_error(), "host 0 is claimed by two agents"));
    tdist_store_t *v = NULL;
    MP_CHECK_RC(tdist_store_prefix(s, "fresh/", &v));
    MP_CHECK(tdist_store_rendezvous_host(v, 0, 1, 3, 300, job, sizeof(job)) == TDIST_ERR_TIMEOUT);
    MP_CHECK(strstr(tdist_last_error(), "1 of WORLD_SIZE=3 ranks arrived"));
    MP_CHECK(tdist_store_rendezvous_host(v, 0, 4, 3, 300, job, sizeof(job)) ==
             TDIST_ERR_INVALID_ARGUMENT);
    tdist_store_release(v);
    atomic_fetch_add(&host_counts[1], 1);
  }
  if (idx < 3) atomic_fetch_add(&host_counts[0], 1);
  tdist_store_release(s);
  return 0;
}

static void test_rendezvous_per_host(void **state) {
  g_port = tdist_mp_free_port();
  host_counts = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  assert_true(host_counts != MAP_FAILED);
  host_jobs = (char(*)[64])((char *)host_counts + 64);
  pid_t pid = fork_server(60);
  int rc = tdist_mp_run(4, host_child, NULL, 60);
  stop_server(pid);
  assert_int_equal(rc, 0);
  assert_int_equal(atomic_load(&host_counts[0]), 3);
  assert_int_equal(atomic_load(&host_counts[1]), 1);
  /* one world, one job id */
  assert_true(host_jobs[0][0] != 0);
  assert_string_equal(host_jobs[0], host_jobs[1]);
  assert_string_equal(host_jobs[0], host_jobs[2]);
  munmap(host_counts, 4096);
  g_method[0] = 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_env_rank0_hosts),
      cmocka_unit_test(test_tcp_external_server),
      cmocka_unit_test(test_file_method),
      cmocka_unit_test(test_errors_name_the_variable),
      cmocka_unit_test(test_duplicate_rank),
      cmocka_unit_test(test_rendezvous_per_host),
      cmocka_unit_test(test_timeout_names_missing),
      cmocka_unit_test(test_store_killed_is_named),
      cmocka_unit_test(test_store_killed_at_start_is_named),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
