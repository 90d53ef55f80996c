/*
 * test_agent_proxy - the host agent's store proxy (tools/launcher/
 * agent_proxy.c) between the library's client (tdist__store_connect_agent)
 * and a real store server, over real sockets, in one process: a listener
 * thread stands for agent.c (reads the "store" line, hands the connection
 * over with what followed it).
 *
 *   - every operation's reply comes back as the server gave it (set, get,
 *     add, compare_set, check, multi_set, multi_get, delete, num_keys);
 *   - more waiting gets than the proxy has workers, all parked before the
 *     keys they wait for are written by another client: all are answered
 *     with their values (a wait never holds a shared worker);
 *   - a wait that expires: TDIST_ERR_TIMEOUT, and the connection still
 *     serves calls;
 *   - a wrong token: TDIST_ERR_AUTH, as from the server itself;
 *   - the proxy stopped while a wait is out: that call fails at once with
 *     TDIST_ERR_CLOSED (not at its timeout), and a reconnect is refused.
 * No timing is asserted except that last "at once" (bounded by 20 s
 * against a 60 s wait).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "agent_proxy.h"
#include "store/store_impl.h"
#include "tdist/tdist.h"
#include "util/clock.h"

#define NWAIT 12 /* waiting clients: three times the proxy's workers */

static tdist_store_server_t *g_srv;
static trun_proxy_t *g_proxy;
static char g_name[64], g_addr[64];
static int g_lfd = -1;
static atomic_int g_stop;
static pthread_t g_listener;

/* (listener) What agent.c does with a connection that says "store". */
static void *listen_main(void *arg) {
  (void)arg;
  while (!atomic_load(&g_stop)) {
    int fd = accept(g_lfd, NULL, NULL);
    if (fd < 0) continue;
    char buf[8192];
    size_t len = 0;
    char *nl = NULL;
    while (!nl && len < sizeof(buf)) {
      ssize_t r = recv(fd, buf + len, sizeof(buf) - len, 0);
      if (r <= 0) break;
      len += (size_t)r;
      nl = memchr(buf, '\n', len);
    }
    if (!nl || strncmp(buf, "store\n", 6) != 0) {
      close(fd);
      continue;
    }
    trun_proxy_adopt(g_proxy, fd, nl + 1, len - (size_t)(nl + 1 - buf));
  }
  return NULL;
}

static int setup(void **state) {
  (void)state;
  tdist_store_server_opts_t so = {0};
  assert_int_equal(tdist_store_server_start(&so, &g_srv), 0);
  snprintf(g_addr, sizeof(g_addr), "127.0.0.1:%d", tdist_store_server_port(g_srv));
  assert_int_equal(trun_proxy_start("127.0.0.1", tdist_store_server_port(g_srv), &g_proxy), 0);
  snprintf(g_name, sizeof(g_name), "tdist-test-proxy-%d", (int)getpid());
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  memcpy(sa.sun_path + 1, g_name, strlen(g_name));
  g_lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  assert_true(g_lfd >= 0);
  assert_int_equal(bind(g_lfd, (struct sockaddr *)&sa,
                        (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(g_name))),
                   0);
  assert_int_equal(listen(g_lfd, 128), 0);
  atomic_store(&g_stop, 0);
  assert_int_equal(pthread_create(&g_listener, NULL, listen_main, NULL), 0);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  atomic_store(&g_stop, 1);
  shutdown(g_lfd, SHUT_RDWR);
  pthread_join(g_listener, NULL);
  close(g_lfd);
  trun_proxy_stop(g_proxy);
  g_proxy = NULL;
  tdist_store_server_stop(g_srv);
  return 0;
}

static tdist_store_t *open_client(int64_t timeout_ms) {
  tdist_store_opts_t o = {.mask = TDIST_STORE_FIELD_TIMEOUT, .timeout_ms = timeout_ms};
  tdist_store_t *s = NULL;
  assert_int_equal(tdist__store_connect_agent(g_name, g_addr, &o, &s), 0);
  return s;
}

static void test_every_op(void **state) {
  (void)state;
  tdist_store_t *s = open_client(10000);
  assert_string_equal(tdist_store_address(s), g_addr);
  assert_int_equal(tdist_store_set(s, "a", "one", 3), 0);
  void *v = NULL;
  size_t l = 0;
  assert_int_equal(tdist_store_get(s, "a", &v, &l, 1000), 0);
  assert_int_equal(l, 3);
  assert_memory_equal(v, "one", 3);
  tdist_store_free(v);
  int64_t n = 0;
  assert_int_equal(tdist_store_add(s, "c", 5, &n), 0);
  assert_int_equal(tdist_store_add(s, "c", -2, &n), 0);
  assert_int_equal(n, 3);
  assert_int_equal(tdist_store_add(s, "a", 1, &n), TDIST_ERR_INVALID_ARGUMENT); /* not a counter */
  assert_int_equal(tdist_store_compare_set(s, "a", "one", 3, "two", 3, &v, &l), 0);
  assert_memory_equal(v, "two", 3);
  tdist_store_free(v);
  const char *keys[] = {"m1", "m2"};
  const void *vals[] = {"x", "yy"};
  size_t lens[] = {1, 2}, got_l[2];
  void *got[2];
  assert_int_equal(tdist_store_multi_set(s, keys, vals, lens, 2), 0);
  assert_int_equal(tdist_store_multi_get(s, keys, 2, got, got_l, 1000), 0);
  assert_int_equal(got_l[1], 2);
  assert_memory_equal(got[1], "yy", 2);
  tdist_store_free(got[0]);
  tdist_store_free(got[1]);
  int all = 0, del = 0;
  assert_int_equal(tdist_store_check(s, keys, 2, &all), 0);
  assert_int_equal(all, 1);
  assert_int_equal(tdist_store_delete(s, "m1", &del), 0);
  assert_int_equal(del, 1);
  assert_int_equal(tdist_store_num_keys(s, &n), 0);
  assert_int_equal(n, 3); /* a, c, m2 */
  tdist_store_release(s);
}

typedef struct {
  int i, rc;
  char val[32];
} waiter_t;

static void *wait_main(void *arg) {
  waiter_t *w = arg;
  tdist_store_t *s = open_client(30000);
  char key[32];
  snprintf(key, sizeof(key), "w/%d", w->i);
  void *v = NULL;
  size_t l = 0;
  w->rc = tdist_store_get(s, key, &v, &l, 30000);
  if (w->rc == 0) snprintf(w->val, sizeof(w->val), "%.*s", (int)l, (char *)v);
  tdist_store_free(v);
  tdist_store_release(s);
  return NULL;
}

static void test_waits_do_not_starve_writers(void **state) {
  (void)state;
  pthread_t t[NWAIT];
  waiter_t w[NWAIT];
  for (int i = 0; i < NWAIT; i++) {
    w[i] = (waiter_t){.i = i, .rc = 1};
    assert_int_equal(pthread_create(&t[i], NULL, wait_main, &w[i]), 0);
  }
  usleep(300 * 1000); /* (most are parked by now; the test holds either way) */
  tdist_store_t *s = open_client(10000);
  for (int i = 0; i < NWAIT; i++) {
    char key[32], val[32];
    snprintf(key, sizeof(key), "w/%d", i);
    int vl = snprintf(val, sizeof(val), "value %d", i);
    assert_int_equal(tdist_store_set(s, key, val, (size_t)vl), 0);
  }
  for (int i = 0; i < NWAIT; i++) {
    char want[32];
    pthread_join(t[i], NULL);
    snprintf(want, sizeof(want), "value %d", i);
    assert_int_equal(w[i].rc, 0);
    assert_string_equal(w[i].val, want);
  }
  /* a wait that expires, then the same connection serves a call */
  const char *k = "never";
  assert_int_equal(tdist_store_wait(s, &k, 1, 200), TDIST_ERR_TIMEOUT);
  assert_int_equal(tdist_store_set(s, "after", "1", 1), 0);
  tdist_store_release(s);
}

static void test_wrong_token(void **state) {
  (void)state;
  tdist_store_opts_t o = {.mask = TDIST_STORE_FIELD_TIMEOUT | TDIST_STORE_FIELD_TOKEN,
                          .timeout_ms = 5000,
                          .token = "not-the-agents"};
  tdist_store_t *s = NULL;
  assert_int_equal(tdist__store_connect_agent(g_name, g_addr, &o, &s), TDIST_ERR_AUTH);
}

static void *late_stop(void *arg) {
  (void)arg;
  usleep(500 * 1000);
  trun_proxy_stop(g_proxy);
  g_proxy = NULL;
  return NULL;
}

static void test_stop_ends_waits(void **state) {
  (void)state;
  tdist_store_t *s = open_client(60000);
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, late_stop, NULL), 0);
  int64_t t0 = tdist__now_ms();
  const char *k = "never";
  assert_int_equal(tdist_store_wait(s, &k, 1, 60000), TDIST_ERR_CLOSED);
  assert_true(tdist__now_ms() - t0 < 20000);
  pthread_join(t, NULL);
  tdist_store_release(s);
  /* restart for teardown */
  assert_int_equal(trun_proxy_start("127.0.0.1", tdist_store_server_port(g_srv), &g_proxy), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_op),
      cmocka_unit_test(test_waits_do_not_starve_writers),
      cmocka_unit_test(test_wrong_token),
      cmocka_unit_test(test_stop_ends_waits),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
