/*
 * test_store_hardening.c - bad input over real sockets: garbage, oversized
 * lengths, half messages, requests before the handshake, unknown ops. Each
 * bad connection is closed by the server; a well-behaved client connected
 * the whole time keeps working, and so do new ones.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include "store/proto.h"
#include "store_test_util.h"

static int raw_connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
  return fd;
}

/* 1 if the server closed fd within 3 s (EOF or reset), else 0. */
static int closed_by_server(int fd) {
  char buf[256];
  int64_t end = st_now_ms() + 3000;
  while (st_now_ms() < end) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, 100) <= 0) continue;
    ssize_t r = recv(fd, buf, sizeof(buf), 0);
    if (r <= 0) return 1; /* replies (r > 0) are skipped */
  }
  return 0;
}

static void send_hello(int fd) {
  tdist__buf_t b = {0};
  assert_int_equal(st_hello_frame(&b), 0);
  assert_int_equal(send(fd, b.p, b.len, 0), (ssize_t)b.len);
  tdist__buf_free(&b);
}

static void check_good_client(tdist_store_t *s, int i) {
  char key[32];
  snprintf(key, sizeof(key), "good/%d", i);
  assert_int_equal(tdist_store_set(s, key, "ok", 2), 0);
  void *v;
  size_t l;
  assert_int_equal(tdist_store_get(s, key, &v, &l, 2000), 0);
  assert_int_equal(l, 2);
  tdist_store_free(v);
}

static void test_garbage_and_half_messages(void **state) {
  int port = tdist_mp_free_port();
  tdist_store_server_t *srv;
  tdist_store_t *good, *waiter;
  assert_int_equal(st_start_server(port, NULL, &srv), 0);
  assert_int_equal(st_connect(port, 5000, &good), 0);
  assert_int_equal(st_connect(port, 5000, &waiter), 0);
  check_good_client(good, 0);
  int step = 1;

  /* 1. pure garbage instead of a handshake */
  int fd = raw_connect(port);
  const char junk[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  send(fd, junk, sizeof(junk), 0);
  assert_true(closed_by_server(fd));
  close(fd);
  check_good_client(good, step++);

  /* 2. an oversized length prefix */
  fd = raw_connect(port);
  uint32_t huge = 0xffffffffu;
  send(fd, &huge, 4, 0);
  assert_true(closed_by_server(fd));
  close(fd);
  check_good_client(good, step++);

  /* 3. a zero length */
  fd = raw_connect(port);
  uint32_t zero = 0;
  send(fd, &zero, 4, 0);
  assert_true(closed_by_server(fd));
  close(fd);

  /* 4. a half message, then the client vanishes */
  fd = raw_connect(port);
  uint8_t half[] = {100, 0, 0, 0, TDIST__OP_HELLO, 0x54};
  send(fd, half, sizeof(half), 0);
  close(fd);
  check_good_client(good, step++);

  /* 5. a half message that stays open: the server keeps serving others */
  int stuck = raw_connect(port);
  send(stuck, half, sizeof(half), 0);
  check_good_client(good, step++);

  /* 6. a valid handshake, then an unknown op, a truncated set, bad key sizes */
  uint8_t bad_ops[][16] = {
      {1, 0, 0, 0, 200},                                   /* unknown op */
      {5, 0, 0, 0, TDIST__OP_SET, 10, 0, 0, 0},            /* key length past the end */
      {9, 0, 0, 0, TDIST__OP_SET, 0, 0, 0, 0, 0, 0, 0, 0}, /* empty key */
      {1, 0, 0, 0, TDIST__OP_HELLO},                       /* second handshake */
      {3, 0, 0, 0, TDIST__OP_NUM_KEYS, 1, 2},              /* trailing bytes */
  };
  size_t bad_len[] = {5, 9, 13, 5, 7};
  for (size_t i = 0; i < sizeof(bad_len) / sizeof(bad_len[0]); i++) {
    fd = raw_connect(port);
    send_hello(fd);
    send(fd, bad_ops[i], bad_len[i], 0);
    assert_true(closed_by_server(fd));
    close(fd);
    check_good_client(good, step++);
  }

  /* 7. a key longer than TDIST_STORE_MAX_KEY */
  fd = raw_connect(port);
  send_hello(fd);
  uint32_t kl = TDIST_STORE_MAX_KEY + 1, flen = 1 + 4 + kl + 4;
  uint8_t *m = calloc(1, 4 + flen);
  memcpy(m, &flen, 4);
  m[4] = TDIST__OP_SET;
  memcpy(m + 5, &kl, 4);
  memset(m + 9, 'k', kl);
  send(fd, m, 4 + flen, 0);
  free(m);
  assert_true(closed_by_server(fd));
  close(fd);

  /* 8. a client blocked in get, connected the whole time, is still woken */
  pid_t pid = fork();
  if (pid == 0) {
    tdist_store_t *s2;
    if (st_connect(port, 5000, &s2)) _exit(1);
    st_sleep_ms(200);
    _exit(tdist_store_set(s2, "late/key", "L", 1) ? 1 : 0);
  }
  void *v;
  size_t l;
  assert_int_equal(tdist_store_get(waiter, "late/key", &v, &l, 10000), 0);
  tdist_store_free(v);
  int status;
  waitpid(pid, &status, 0);
  assert_int_equal(status, 0);

  close(stuck);
  check_good_client(good, step++);
  tdist_store_t *fresh;
  assert_int_equal(st_connect(port, 5000, &fresh), 0);
  check_good_client(fresh, step++);
  tdist_store_release(fresh);
  tdist_store_release(waiter);
  tdist_store_release(good);
  tdist_store_server_stop(srv);
}

/* A wrong protocol version is refused with TDIST_ERR_PROTOCOL-worthy reply. */
static void test_version_mismatch(void **state) {
  int port = tdist_mp_free_port();
  tdist_store_server_t *srv;
  assert_int_equal(st_start_server(port, NULL, &srv), 0);
  int fd = raw_connect(port);
  uint8_t m[] = {13, 0, 0, 0, TDIST__OP_HELLO, 0x54, 0x53, 0x44, 0x54, 99, 0, 0, 0, 0, 0, 0, 0};
  send(fd, m, sizeof(m), 0);
  uint8_t r[16];
  ssize_t n = recv(fd, r, sizeof(r), MSG_WAITALL);
  assert_true(n >= 5);
  assert_int_equal(r[4], TDIST__ST_VERSION);
  assert_true(closed_by_server(fd));
  close(fd);
  tdist_store_server_stop(srv);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_garbage_and_half_messages),
      cmocka_unit_test(test_version_mismatch),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
