/*
 * test_store_waits.c - waiting get/wait/multi_get at the edges of the
 * server's resume logic (kv.c exec_waiting: a parked request waits on one
 * key at a time and goes on from it), and a server out of descriptors
 * (server.c: BUSY), each against a real server in another process:
 *   - a multi_get of 301 keys (one named twice) whose keys are written in
 *     reverse order by another process, one of them deleted after the
 *     waiter has passed it and written again with a new value: the reply
 *     holds every value, the new one for the deleted key;
 *   - wait on the same keys, and a multi_get that times out naming its first
 *     missing key;
 *   - a server whose RLIMIT_NOFILE is 64: the connection past its
 *     descriptors fails with TDIST_ERR_STORE_ERROR naming the limit (not a
 *     connect timeout), and connecting works again once others closed.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>
#include <signal.h>
#include <sys/wait.h>

#include "store_test_util.h"

#define NKEYS 300

static int g_port;

static void key_of(char *k, size_t n, int i) { snprintf(k, n, "k/%d", i); }

/* Rank 0: server and writer; rank 1: the waiter. */
static int waits_child(int rank, int n, void *arg) {
  (void)n;
  (void)arg;
  tdist_store_server_t *srv = NULL;
  tdist_store_t *s = NULL;
  char k[32], v[32];
  if (rank == 0) MP_CHECK_RC(st_start_server(g_port, NULL, &srv));
  MP_CHECK_RC(st_connect(g_port, 20000, &s));
  if (rank == 0) {
    MP_CHECK_RC(tdist_store_set(s, "k/0", "old", 3)); /* present at the waiter's first run */
    const char *ready = "ready";
    MP_CHECK_RC(tdist_store_wait(s, &ready, 1, 20000));
    for (int i = NKEYS - 1; i >= 2; i--) {
      key_of(k, sizeof(k), i);
      snprintf(v, sizeof(v), "v%d", i);
      MP_CHECK_RC(tdist_store_set(s, k, v, strlen(v)));
    }
    int deleted = 0;
    MP_CHECK_RC(tdist_store_delete(s, "k/0", &deleted));
    MP_CHECK(deleted == 1);
    /* k/1 last but one: the waiter cannot finish before it, so it must see
     * k/0 missing and wait for its new value. */
    MP_CHECK_RC(tdist_store_set(s, "k/1", "v1", 2));
    MP_CHECK_RC(tdist_store_set(s, "k/0", "new", 3));
  } else {
    const char *keys[NKEYS + 1];
    char names[NKEYS][32];
    for (int i = 0; i < NKEYS; i++) {
      key_of(names[i], sizeof(names[i]), i);
      keys[i] = names[i];
    }
    keys[NKEYS] = "k/7"; /* a key named twice */
    void *vals[NKEYS + 1];
    size_t lens[NKEYS + 1];
    MP_CHECK_RC(tdist_store_set(s, "ready", "", 0));
    MP_CHECK_RC(tdist_store_multi_get(s, keys, NKEYS + 1, vals, lens, 20000));
    MP_CHECK(lens[0] == 3 && memcmp(vals[0], "new", 3) == 0);
    for (int i = 1; i <= NKEYS; i++) {
      snprintf(v, sizeof(v), "v%d", i == NKEYS ? 7 : i);
      MP_CHECK(lens[i] == strlen(v) && memcmp(vals[i], v, lens[i]) == 0);
    }
    for (int i = 0; i <= NKEYS; i++)
      tdist_store_free(vals[i]);
    MP_CHECK_RC(tdist_store_wait(s, keys, NKEYS + 1, 20000));
    /* At the deadline the first missing key is named, whatever was waited on. */
    const char *tk[] = {"k/0", "never/a", "k/1", "never/b"};
    MP_CHECK(tdist_store_multi_get(s, tk, 4, vals, lens, 300) == TDIST_ERR_TIMEOUT);
    MP_CHECK(strstr(tdist_last_error(), "'never/a'") != NULL);
    MP_CHECK_RC(tdist_store_set(s, "done", "", 0));
  }
  const char *done = "done";
  if (rank == 0) MP_CHECK_RC(tdist_store_wait(s, &done, 1, 20000));
  tdist_store_release(s);
  if (rank == 0) tdist_store_server_stop(srv);
  return 0;
}

static void test_multi_get_resume(void **state) {
  (void)state;
  g_port = tdist_mp_free_port();
  assert_int_equal(tdist_mp_run(2, waits_child, NULL, 60), 0);
}

#define NOFILE 64

/* A server with RLIMIT_NOFILE = NOFILE in a child of its own. */
static pid_t start_small_server(int port) {
  pid_t pid = fork();
  if (pid != 0) return pid;
  struct rlimit rl;
  getrlimit(RLIMIT_NOFILE, &rl);
  rl.rlim_cur = NOFILE;
  tdist_store_server_t *srv = NULL;
  if (setrlimit(RLIMIT_NOFILE, &rl) != 0 || st_start_server(port, NULL, &srv) != 0) _exit(1);
  for (;;)
    pause(); /* killed by the test */
}

static void test_out_of_descriptors(void **state) {
  (void)state;
  int port = tdist_mp_free_port();
  pid_t pid = start_small_server(port);
  assert_true(pid > 0);
  tdist_store_t *conns[NOFILE + 8];
  int n = 0, rc = 0;
  /* 20 s of connect timeout: a refusal must come as an error, not as it */
  while (n < NOFILE + 8 && (rc = st_connect(port, 20000, &conns[n])) == 0)
    n++;
  assert_int_equal(rc, TDIST_ERR_STORE_ERROR);
  const char *msg = tdist_last_error();
  assert_non_null(strstr(msg, "out of file descriptors"));
  assert_non_null(strstr(msg, "RLIMIT_NOFILE is 64"));
  assert_true(n > 8 && n < NOFILE); /* the server process has a few descriptors of its own */
  /* the refused connections cost the server nothing: the others still work */
  assert_int_equal(tdist_store_set(conns[0], "k", "v", 1), 0);
  /* once some close, connecting works again (the server may see the closes
   * a little after them: retried) */
  for (int i = 0; i < 4; i++)
    tdist_store_release(conns[--n]);
  rc = -1;
  for (int tries = 0; tries < 400 && rc != 0; tries++) {
    rc = st_connect(port, 20000, &conns[n]);
    if (rc) st_sleep_ms(50);
  }
  assert_int_equal(rc, 0);
  n++;
  int64_t nk = 0;
  assert_int_equal(tdist_store_num_keys(conns[n - 1], &nk), 0);
  assert_int_equal(nk, 1);
  while (n > 0)
    tdist_store_release(conns[--n]);
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_multi_get_resume),
      cmocka_unit_test(test_out_of_descriptors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
