/*
 * test_store_ops.c - every store operation across several processes over
 * real sockets: waits woken by another process's write, timeouts (with the
 * error naming key, address and time), a server started after its clients,
 * prefix isolation, the token, and a client dying while it waits.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>
#include <stdint.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>

#include "store_test_util.h"

#define NPROC 4

static int g_port;

/* Rank 0 hosts the server, started late on purpose: the others connect first
 * and must retry until it listens. */
static int ops_child(int rank, int n, void *arg) {
  tdist_store_server_t *srv = NULL;
  tdist_store_t *s = NULL;
  char key[64], val[64];
  if (rank == 0) {
    st_sleep_ms(300);
    MP_CHECK_RC(st_start_server(g_port, NULL, &srv));
  }
  MP_CHECK_RC(st_connect(g_port, 20000, &s));

  /* set / get across processes: get blocks until the other rank's set. */
  snprintf(key, sizeof(key), "rank/%d", rank);
  snprintf(val, sizeof(val), "value-of-%d", rank);
  MP_CHECK_RC(tdist_store_set(s, key, val, strlen(val)));
  for (int r = 0; r < n; r++) {
    void *v;
    size_t len;
    snprintf(key, sizeof(key), "rank/%d", r);
    snprintf(val, sizeof(val), "value-of-%d", r);
    MP_CHECK_RC(tdist_store_get(s, key, &v, &len, 20000));
    MP_CHECK(len == strlen(val) && memcmp(v, val, len) == 0);
    tdist_store_free(v);
  }

  /* add: atomic counter; the last arriver opens a barrier with set, the
   * others wait for it (woken by that write). */
  int64_t c;
  MP_CHECK_RC(tdist_store_add(s, "counter", 1, &c));
  MP_CHECK(c >= 1 && c <= n);
  if (c == n) MP_CHECK_RC(tdist_store_set(s, "barrier", "", 0));
  const char *bk[] = {"barrier"};
  MP_CHECK_RC(tdist_store_wait(s, bk, 1, 20000));
  int64_t total;
  MP_CHECK_RC(tdist_store_add(s, "counter", 0, &total));
  MP_CHECK(total == n);
  /* add on a non-integer value is refused */
  MP_CHECK(tdist_store_add(s, "rank/0", 1, NULL) == TDIST_ERR_INVALID_ARGUMENT);

  /* compare_set: exactly one rank wins the empty -> rank transition. */
  snprintf(val, sizeof(val), "%d", rank);
  void *cur;
  size_t cl;
  MP_CHECK_RC(tdist_store_compare_set(s, "leader", NULL, 0, val, strlen(val), &cur, &cl));
  int won = cl == strlen(val) && memcmp(cur, val, cl) == 0;
  tdist_store_free(cur);
  MP_CHECK_RC(tdist_store_add(s, "winners", won, NULL));

  /* append: every rank appends one letter. */
  char letter = (char)('a' + rank);
  MP_CHECK_RC(tdist_store_append(s, "letters", &letter, 1));

  /* multi_set / multi_get */
  char k1[32], k2[32];
  snprintf(k1, sizeof(k1), "m/%d/x", rank);
  snprintf(k2, sizeof(k2), "m/%d/y", rank);
  const char *mk[] = {k1, k2};
  const void *mv[] = {"xx", "yyy"};
  size_t ml[] = {2, 3};
  MP_CHECK_RC(tdist_store_multi_set(s, mk, mv, ml, 2));
  int right = (rank + 1) % n;
  snprintf(k1, sizeof(k1), "m/%d/x", right);
  snprintf(k2, sizeof(k2), "m/%d/y", right);
  void *gv[2];
  size_t gl[2];
  MP_CHECK_RC(tdist_store_multi_get(s, mk, 2, gv, gl, 20000));
  MP_CHECK(gl[0] == 2 && memcmp(gv[0], "xx", 2) == 0 && gl[1] == 3 && memcmp(gv[1], "yyy", 3) == 0);
  tdist_store_free(gv[0]);
  tdist_store_free(gv[1]);

  /* second barrier, then check the shared results */
  MP_CHECK_RC(tdist_store_add(s, "counter2", 1, &c));
  if (c == n) MP_CHECK_RC(tdist_store_set(s, "barrier2", "", 0));
  const char *bk2[] = {"barrier2"};
  MP_CHECK_RC(tdist_store_wait(s, bk2, 1, 20000));
  MP_CHECK_RC(tdist_store_add(s, "winners", 0, &c));
  MP_CHECK(c == 1);
  MP_CHECK_RC(tdist_store_get(s, "letters", &cur, &cl, 1000));
  MP_CHECK(cl == (size_t)n);
  tdist_store_free(cur);

  /* check, delete */
  int all = 0;
  const char *ck[] = {"rank/0", "rank/1"};
  MP_CHECK_RC(tdist_store_check(s, ck, 2, &all));
  MP_CHECK(all == 1);
  const char *ck2[] = {"rank/0", "nope"};
  MP_CHECK_RC(tdist_store_check(s, ck2, 2, &all));
  MP_CHECK(all == 0);
  if (rank == 1) {
    int del = 0;
    MP_CHECK_RC(tdist_store_delete(s, "leader", &del));
    MP_CHECK(del == 1);
    MP_CHECK_RC(tdist_store_delete(s, "leader", &del));
    MP_CHECK(del == 0);
  }
  int64_t nk;
  MP_CHECK_RC(tdist_store_num_keys(s, &nk));
  MP_CHECK(nk > n);

  /* timeout: the error names the key, the address and the time */
  int64_t t0 = st_now_ms();
  int rc = tdist_store_get(s, "never/there", &cur, &cl, 200);
  MP_CHECK(rc == TDIST_ERR_TIMEOUT);
  MP_CHECK(st_now_ms() - t0 >= 190);
  MP_CHECK(strstr(tdist_last_error(), "never/there") != NULL);
  MP_CHECK(strstr(tdist_last_error(), tdist_store_address(s)) != NULL);
  MP_CHECK(strstr(tdist_last_error(), " ms") != NULL);
  const char *wk[] = {"rank/0", "missing/wait"};
  MP_CHECK(tdist_store_wait(s, wk, 2, 100) == TDIST_ERR_TIMEOUT);
  MP_CHECK(strstr(tdist_last_error(), "missing/wait") != NULL);

  /* done: rank 0 keeps serving until every rank said goodbye */
  snprintf(key, sizeof(key), "bye/%d", rank);
  MP_CHECK_RC(tdist_store_set(s, key, "", 0));
  if (rank == 0) {
    for (int r = 0; r < n; r++) {
      snprintf(key, sizeof(key), "bye/%d", r);
      const char *k = key;
      MP_CHECK_RC(tdist_store_wait(s, &k, 1, 20000));
    }
  }
  tdist_store_release(s);
  if (rank == 0) {
    MP_CHECK(tdist_store_server_num_keys(srv) > n);
    tdist_store_server_stop(srv);
  }
  return 0;
}

static void test_ops_multiprocess(void **state) {
  g_port = tdist_mp_free_port();
  assert_int_equal(tdist_mp_run(NPROC, ops_child, NULL, 40), 0);
}

/* A wait in one process is woken by a set in another, well before its
 * timeout; a client killed while waiting does not disturb the server. */
static int wake_child(int rank, int n, void *arg) {
  tdist_store_server_t *srv = NULL;
  tdist_store_t *s = NULL;
  if (rank == 0) MP_CHECK_RC(st_start_server(g_port, NULL, &srv));
  MP_CHECK_RC(st_connect(g_port, 10000, &s));
  if (rank == 1) {
    int64_t t0 = st_now_ms();
    void *v;
    size_t l;
    MP_CHECK_RC(tdist_store_get(s, "wake/key", &v, &l, 30000));
    MP_CHECK(st_now_ms() - t0 < 20000);
    MP_CHECK(l == 5 && memcmp(v, "hello", 5) == 0);
    tdist_store_free(v);
    MP_CHECK_RC(tdist_store_set(s, "wake/done", "", 0));
  } else if (rank == 2) {
    /* a waiter that dies: fork a grandchild that waits and is killed */
    pid_t pid = fork();
    if (pid == 0) {
      tdist_store_t *s2;
      if (st_connect(g_port, 10000, &s2) == 0) {
        void *v;
        size_t l;
        tdist_store_get(s2, "never/set", &v, &l, 60000);
      }
      _exit(0);
    }
    st_sleep_ms(200);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    MP_CHECK_RC(tdist_store_set(s, "killed", "", 0));
  } else {
    const char *k = "killed";
    MP_CHECK_RC(tdist_store_wait(s, &k, 1, 10000));
    st_sleep_ms(100);
    MP_CHECK_RC(tdist_store_set(s, "wake/key", "hello", 5));
    const char *d = "wake/done";
    MP_CHECK_RC(tdist_store_wait(s, &d, 1, 10000));
    /* the killed waiter's placeholder is gone: only real keys count */
    int64_t nk;
    MP_CHECK_RC(tdist_store_num_keys(s, &nk));
    MP_CHECK(nk == 3);
  }
  tdist_store_release(s);
  if (rank == 0) {
    tdist_store_server_stop(srv);
  }
  return 0;
}

static void test_wait_woken_by_other_process(void **state) {
  g_port = tdist_mp_free_port();
  assert_int_equal(tdist_mp_run(3, wake_child, NULL, 30), 0);
}

/* Prefix views: same key in two views does not clash; views of views
 * concatenate; the base sees the full keys; views outlive their base handle. */
static int prefix_child(int rank, int n, void *arg) {
  tdist_store_server_t *srv = NULL;
  tdist_store_t *s, *a, *b, *ab;
  if (rank == 0) MP_CHECK_RC(st_start_server(g_port, NULL, &srv));
  MP_CHECK_RC(st_connect(g_port, 10000, &s));
  MP_CHECK_RC(tdist_store_prefix(s, "group/a/", &a));
  MP_CHECK_RC(tdist_store_prefix(s, "group/b/", &b));
  MP_CHECK_RC(tdist_store_prefix(a, "sub/", &ab));
  if (rank == 1) {
    MP_CHECK_RC(tdist_store_add(a, "n", 5, NULL)); /* before the keys rank 0 waits for */
    MP_CHECK_RC(tdist_store_set(a, "k", "A", 1));
    MP_CHECK_RC(tdist_store_set(ab, "k", "AB", 2));
    MP_CHECK_RC(tdist_store_set(b, "k", "B", 1));
  } else {
    void *v;
    size_t l;
    MP_CHECK_RC(tdist_store_get(b, "k", &v, &l, 10000));
    MP_CHECK(l == 1 && ((char *)v)[0] == 'B');
    tdist_store_free(v);
    MP_CHECK_RC(tdist_store_get(a, "k", &v, &l, 10000));
    MP_CHECK(l == 1 && ((char *)v)[0] == 'A');
    tdist_store_free(v);
    MP_CHECK_RC(tdist_store_get(s, "group/a/sub/k", &v, &l, 10000));
    MP_CHECK(l == 2 && memcmp(v, "AB", 2) == 0);
    tdist_store_free(v);
    int64_t x;
    MP_CHECK_RC(tdist_store_add(s, "group/a/n", 0, &x));
    MP_CHECK(x == 5);
    int all;
    const char *k = "n";
    MP_CHECK_RC(tdist_store_check(b, &k, 1, &all));
    MP_CHECK(all == 0);
    MP_CHECK(strcmp(tdist_store_address(ab), tdist_store_address(s)) == 0);
    /* release the base first: views keep the connection alive */
    tdist_store_release(s);
    s = NULL;
    MP_CHECK_RC(tdist_store_set(ab, "after", "1", 1));
    MP_CHECK_RC(tdist_store_set(a, "done", "", 0));
  }
  const char *d = "done";
  MP_CHECK_RC(tdist_store_wait(a, &d, 1, 10000));
  if (rank == 1) MP_CHECK_RC(tdist_store_set(a, "bye", "", 0));
  const char *bye = "bye";
  if (rank == 0) MP_CHECK_RC(tdist_store_wait(a, &bye, 1, 10000));
  tdist_store_release(ab);
  tdist_store_release(a);
  tdist_store_release(b);
  tdist_store_release(s);
  if (rank == 0) tdist_store_server_stop(srv);
  return 0;
}

static void test_prefix_isolation(void **state) {
  g_port = tdist_mp_free_port();
  assert_int_equal(tdist_mp_run(2, prefix_child, NULL, 30), 0);
}

/* Token: a client without it (or with a wrong one) is refused with
 * TDIST_ERR_AUTH; the right one works. */
static void test_token(void **state) {
  int port = tdist_mp_free_port();
  tdist_store_server_t *srv;
  assert_int_equal(st_start_server(port, "s3cret", &srv), 0);
  tdist_store_opts_t o = {.mask = TDIST_STORE_FIELD_TIMEOUT | TDIST_STORE_FIELD_TOKEN,
                          .timeout_ms = 5000,
                          .token = NULL};
  tdist_store_t *s = NULL;
  assert_int_equal(tdist_store_connect("127.0.0.1", port, &o, &s), TDIST_ERR_AUTH);
  o.token = "wrong!";
  assert_int_equal(tdist_store_connect("127.0.0.1", port, &o, &s), TDIST_ERR_AUTH);
  o.token = "s3cret";
  assert_int_equal(tdist_store_connect("127.0.0.1", port, &o, &s), 0);
  assert_int_equal(tdist_store_set(s, "k", "v", 1), 0);
  assert_int_equal(tdist_store_server_num_keys(srv), 1);
  tdist_store_release(s);
  tdist_store_server_stop(srv);
}

/* Connect with no server at all times out, naming host:port; a server that
 * stops makes a waiting client fail with TDIST_ERR_CLOSED. */
static void test_connect_timeout_and_close(void **state) {
  int port = tdist_mp_free_port();
  tdist_store_t *s = NULL;
  int64_t t0 = st_now_ms();
  assert_int_equal(st_connect(port, 300, &s), TDIST_ERR_TIMEOUT);
  assert_true(st_now_ms() - t0 >= 290);
  char want[64];
  snprintf(want, sizeof(want), "127.0.0.1:%d", port);
  assert_non_null(strstr(tdist_last_error(), want));
}

/* One connection, two threads: a quick call that waits behind another
 * thread's long wait gets its reply (the server's timeout) and leaves the
 * connection usable; its deadline counts from when it had the connection.
 * Before, it timed out unsent behind the lock and broke the connection for
 * every later call. A connection a failure did break names that failure in
 * every later call's error. */
static tdist_store_t *g_shared;

static void *long_wait(void *arg) {
  (void)arg;
  void *v = NULL;
  size_t l = 0;
  int rc = tdist_store_get(g_shared, "never/set", &v, &l, 2500);
  return (void *)(intptr_t)rc;
}

static void test_shared_connection(void **state) {
  int port = tdist_mp_free_port();
  tdist_store_server_t *srv = NULL;
  assert_int_equal(st_start_server(port, NULL, &srv), 0);
  assert_int_equal(st_connect(port, 10000, &g_shared), 0);
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, long_wait, NULL), 0);
  st_sleep_ms(200); /* the long wait holds the connection */
  void *v = NULL;
  size_t l = 0;
  assert_int_equal(tdist_store_get(g_shared, "not/there", &v, &l, 1), TDIST_ERR_TIMEOUT);
  void *r = NULL;
  pthread_join(t, &r);
  assert_int_equal((int)(intptr_t)r, TDIST_ERR_TIMEOUT);
  assert_int_equal(tdist_store_set(g_shared, "still/usable", "1", 1), 0);
  /* The server goes: the next call breaks the connection, the one after
   * says by what. */
  tdist_store_server_stop(srv);
  assert_int_not_equal(tdist_store_set(g_shared, "a", "1", 1), 0);
  assert_int_equal(tdist_store_set(g_shared, "b", "1", 1), TDIST_ERR_CLOSED);
  const char *msg = tdist_last_error();
  printf("after the server stopped: %s\n", msg);
  assert_non_null(strstr(msg, "closed by an earlier failure (set 'a'"));
  tdist_store_release(g_shared);
}

static void test_bad_arguments(void **state) {
  int port = tdist_mp_free_port();
  tdist_store_server_t *srv;
  tdist_store_t *s;
  assert_int_equal(st_start_server(port, NULL, &srv), 0);
  assert_int_equal(st_connect(port, 5000, &s), 0);
  assert_int_equal(tdist_store_set(s, "", "v", 1), TDIST_ERR_INVALID_ARGUMENT);
  assert_int_equal(tdist_store_set(s, NULL, "v", 1), TDIST_ERR_INVALID_ARGUMENT);
  char *big = malloc(TDIST_STORE_MAX_KEY + 2);
  memset(big, 'k', TDIST_STORE_MAX_KEY + 1);
  big[TDIST_STORE_MAX_KEY + 1] = 0;
  assert_int_equal(tdist_store_set(s, big, "v", 1), TDIST_ERR_TOO_LARGE);
  big[TDIST_STORE_MAX_KEY] = 0; /* exactly the limit: fine */
  assert_int_equal(tdist_store_set(s, big, "v", 1), 0);
  free(big);
  assert_int_equal(tdist_store_set(s, "k", "v", (size_t)TDIST_STORE_MAX_VALUE + 1),
                   TDIST_ERR_TOO_LARGE);
  /* a large value round-trips */
  size_t n = 8 << 20;
  char *v = malloc(n);
  for (size_t i = 0; i < n; i++)
    v[i] = (char)(i * 7);
  assert_int_equal(tdist_store_set(s, "big", v, n), 0);
  void *g;
  size_t gl;
  assert_int_equal(tdist_store_get(s, "big", &g, &gl, 1000), 0);
  assert_int_equal(gl, n);
  assert_memory_equal(g, v, n);
  tdist_store_free(g);
  free(v);
  /* zero-length values come back as non-NULL */
  assert_int_equal(tdist_store_set(s, "empty", NULL, 0), 0);
  assert_int_equal(tdist_store_get(s, "empty", &g, &gl, 1000), 0);
  assert_non_null(g);
  assert_int_equal(gl, 0);
  tdist_store_free(g);
  tdist_store_release(s);
  tdist_store_server_stop(srv);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ops_multiprocess),
      cmocka_unit_test(test_wait_woken_by_other_process),
      cmocka_unit_test(test_prefix_isolation),
      cmocka_unit_test(test_connect_timeout_and_close),
      cmocka_unit_test(test_token),
      cmocka_unit_test(test_bad_arguments),
      cmocka_unit_test(test_shared_connection),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
