/*
 * test_store_memory.c - the store server's memory bounds (issue 26), each
 * against a real `tdist-store` process started here with a budget of 256 MiB
 * (TDIST_STORE_MEMORY_BYTES) and a short TDIST_STORE_IO_TIMEOUT_MS:
 *   - clients that send GETs of a 64 MiB value back to back and never read;
 *   - connections that never authenticate and send 64 MiB of a HELLO frame,
 *     and one that sends nothing;
 *   - authenticated connections that each send a 64 MiB SET, and one that
 *     stops halfway;
 *   - a GET of 64 MiB followed by shutdown(SHUT_WR);
 *   - a reader taking a 16 MiB reply slowly but steadily, past the I/O
 *     timeout: it gets every byte (the timeout counts from the last byte);
 *   - repeated 64 MiB SETs: no heap purge that gives nothing back is logged,
 *     and one after deleting many 64 KiB values does give memory back;
 *   - a 32 MiB GET whose key is overwritten and deleted while the reply is
 *     in flight: the reader gets the old value (zero-copy GET's lifetime);
 *   - a small request sent after 40 large SET frames that are all ready to
 *     be read is answered before all of them were read (fair reading);
 *   - large SETs reusing the blocks of the values they replaced, within the
 *     budget (spare blocks);
 *   - eight 16 MiB GETs at once, written in chunks out of the allowance per
 *     loop iteration: every reader gets every byte.
 * Each attack checks the server's peak resident memory (VmHWM of
 * /proc/PID/status) against the budget plus a margin, and that another
 * client's ping (the best of five num_keys round trips, taken while the
 * attack is held) stays under 100 ms; the half-closed GET must receive every
 * byte.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include "store/proto.h"
#include "run_util.h"
#include "store_test_util.h"

#define MIB ((size_t)1 << 20)
#define BUDGET (256 * MIB)
#define BIG (64 * MIB)
/* A GET's bound: only to end a hung test. Under ASan with both CPUs loaded
 * (stress-ng --cpu 2) a 64 MiB reply read back after the server freed four
 * clients' replies took over a second (a 1000 ms bound failed there with
 * TDIST_ERR_TIMEOUT); the tests' timing checks are the pings. */
#define GET_MS 30000

/* Sanitizers change what resident memory means. ASan adds shadow (1/8 of the
 * memory touched) and a quarantine of freed blocks (limited to 16 MiB in the
 * server's environment below): the margin grows by budget/8 + 64 MiB. TSan's
 * shadow is several times the memory touched, so under TSan the resident
 * checks are skipped and only the behaviour (refusals, pings, bytes) is. */
#if defined(__SANITIZE_ADDRESS__)
#define ST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ST_ASAN 1
#endif
#if __has_feature(thread_sanitizer)
#define ST_TSAN 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define ST_TSAN 1
#endif

#ifdef ST_ASAN
#define MARGIN (48 * MIB + BUDGET / 8 + 64 * MIB)
#else
#define MARGIN (48 * MIB)
#endif

typedef struct {
  pid_t pid;
  int port;
  int out; /* the read end of its stdout, open until it ended (its last line) */
} store_proc_t;

/* Servers still running: a failed assertion leaves its test at once, and a
 * server left behind would hold ctest's output pipe open. */
static pid_t g_running[8];
/* When set, the next start_store logs at INFO into this file. */
static const char *g_log_path;

static void kill_leftovers(void) {
  for (int i = 0; i < 8; i++)
    if (g_running[i] > 0) {
      kill(g_running[i], SIGKILL);
      waitpid(g_running[i], NULL, 0);
      g_running[i] = 0;
    }
}

/* Start tdist-store on a free loopback port with the given budget, I/O
 * timeout and token (NULL: none); wait for its "listening" line. */
static store_proc_t start_store(size_t budget, int io_timeout_ms, const char *token) {
  int p[2];
  assert_int_equal(pipe(p), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    char b[32], t[32], asan[512];
    snprintf(b, sizeof(b), "%zu", budget);
    snprintf(t, sizeof(t), "%d", io_timeout_ms);
    setenv("TDIST_STORE_MEMORY_BYTES", b, 1);
    setenv("TDIST_STORE_IO_TIMEOUT_MS", t, 1);
    if (token)
      setenv("TDIST_STORE_TOKEN", token, 1);
    else
      unsetenv("TDIST_STORE_TOKEN");
    if (g_log_path) {
      setenv("TDIST_DEBUG", "INFO", 1);
      setenv("TDIST_DEBUG_SUBSYS", "STORE", 1);
      setenv("TDIST_DEBUG_FILE", g_log_path, 1);
    }
    const char *a = getenv("ASAN_OPTIONS");
    snprintf(asan, sizeof(asan), "%s%squarantine_size_mb=16", a ? a : "", a && *a ? ":" : "");
    setenv("ASAN_OPTIONS", asan, 1);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    /* SIGPIPE as rank 0 starts it (spawn.c resets it to the default): this
     * test ignores it for its own sends, and exec would pass that on. */
    signal(SIGPIPE, SIG_DFL);
    dup2(p[1], 1);
    close(p[0]);
    close(p[1]);
    execl(TDIST_STORE_BIN, TDIST_STORE_BIN, "--host", "127.0.0.1", "--port", "0", (char *)NULL);
    _exit(127);
  }
  close(p[1]);
  for (int i = 0; i < 8; i++)
    if (g_running[i] <= 0) {
      g_running[i] = pid;
      break;
    }
  char line[256];
  size_t n = 0;
  int64_t end = st_now_ms() + 30000;
  while (n < sizeof(line) - 1 && st_now_ms() < end) {
    ssize_t r = read(p[0], line + n, 1);
    if (r <= 0) break;
    if (line[n++] == '\n') break;
  }
  line[n] = 0;
  const char *colon = strrchr(line, ':');
  assert_non_null(colon);
  store_proc_t s = {pid, atoi(colon + 1), p[0]};
  assert_true(s.port > 0);
  return s;
}

static void stop_store(store_proc_t *s) {
  for (int i = 0; i < 8; i++)
    if (g_running[i] == s->pid) g_running[i] = 0;
  kill(s->pid, SIGTERM);
  int status = 0;
  waitpid(s->pid, &status, 0);
  close(s->out);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    printf("tdist-store %d: %s %d\n", (int)s->pid, WIFEXITED(status) ? "exit code" : "signal",
           WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* A field of /proc/PID/status in bytes ("VmRSS", "VmHWM"). */
static size_t proc_mem(pid_t pid, const char *field) {
  char path[64], l[256];
  snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  size_t kb = 0, fl = strlen(field);
  while (fgets(l, sizeof(l), f))
    if (!strncmp(l, field, fl) && l[fl] == ':') kb = strtoull(l + fl + 1, NULL, 10);
  fclose(f);
  return kb * 1024;
}

static int raw_connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
  return fd;
}

static void send_all(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n) {
    ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
    assert_true(w > 0);
    c += w;
    n -= (size_t)w;
  }
}

/* Read exactly n bytes (3 s without progress fails). */
static void recv_all(int fd, void *p, size_t n) {
  char *c = p;
  while (n) {
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    assert_true(poll(&pf, 1, 3000) == 1);
    ssize_t r = recv(fd, c, n, 0);
    assert_true(r > 0);
    c += r;
    n -= (size_t)r;
  }
}

/* HELLO, and its OK reply read. */
static void hello(int fd) {
  tdist__buf_t b = {0};
  assert_int_equal(st_hello_frame(&b), 0);
  send_all(fd, b.p, b.len);
  tdist__buf_free(&b);
  uint8_t r[9];
  recv_all(fd, r, sizeof(r));
  assert_int_equal(r[4], TDIST__ST_OK);
}

/* A GET request frame for key with timeout 0 into b (appended). */
static void put_get(tdist__buf_t *b, const char *key) {
  assert_int_equal(tdist__buf_reserve(b, 64 + strlen(key)), 0);
  size_t f = tdist__frame_begin(b, TDIST__OP_GET);
  tdist__put_u64(b, 0);
  tdist__put_bytes(b, key, (uint32_t)strlen(key));
  tdist__frame_end(b, f);
}

/* 1 if the server closed fd within ms (EOF or reset; replies are skipped). */
static int closed_within(int fd, int ms) {
  char buf[4096];
  int64_t end = st_now_ms() + ms;
  while (st_now_ms() < end) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, 50) <= 0) continue;
    ssize_t r = recv(fd, buf, sizeof(buf), 0);
    if (r <= 0) return 1;
  }
  return 0;
}

/* The best of five num_keys round trips on an open client, in ms. */
/* The bound on a bystander's best ping of five: the stalls this file
 * guards against lasted 1.3-2.6 s (issue 44); the figure itself is the
 * bench's (bench/store). A sanitized server under stress-ng took longer
 * than 100 ms once, so its bound is 1 s. */
#if defined(ST_ASAN) || defined(ST_TSAN)
#define PING_MAX_MS 1000
#else
#define PING_MAX_MS 100
#endif

static int64_t ping_ms(tdist_store_t *s) {
  int64_t best = INT64_MAX;
  for (int i = 0; i < 5; i++) {
    int64_t n = 0, t0 = st_now_ms();
    assert_int_equal(tdist_store_num_keys(s, &n), 0);
    int64_t d = st_now_ms() - t0;
    if (d < best) best = d;
  }
  return best;
}

static void check_peak(const store_proc_t *s, const char *what) {
  size_t hwm = proc_mem(s->pid, "VmHWM");
  printf("%s: server peak resident %.1f MiB (budget %zu MiB + margin %zu MiB)\n", what,
         (double)hwm / MIB, BUDGET / MIB, (size_t)MARGIN / MIB);
#ifndef ST_TSAN
  assert_true(hwm <= BUDGET + MARGIN);
#endif
}

static char *big_value(void) {
  char *v = malloc(BIG);
  assert_non_null(v);
  for (size_t i = 0; i < BIG; i++)
    v[i] = (char)(i * 131 + (i >> 20));
  return v;
}

/* Four clients send 16 GETs of a 64 MiB value each and never read. */
static void test_unread_replies(void **state) {
  store_proc_t s = start_store(BUDGET, 5000, NULL);
  tdist_store_t *c;
  assert_int_equal(st_connect(s.port, 10000, &c), 0);
  char *v = big_value();
  assert_int_equal(tdist_store_set(c, "big", v, BIG), 0);
  free(v);
  size_t base = proc_mem(s.pid, "VmRSS");
  tdist__buf_t req = {0};
  for (int i = 0; i < 16; i++)
    put_get(&req, "big");
  int fds[4];
  for (int i = 0; i < 4; i++) {
    fds[i] = raw_connect(s.port);
    hello(fds[i]);
    send_all(fds[i], req.p, req.len);
  }
  tdist__buf_free(&req);
  st_sleep_ms(300); /* the server has run what it will run */
  int64_t ping = ping_ms(c);
  printf("unread replies: resident %.1f MiB before, %.1f MiB held; ping %lld ms\n",
         (double)base / MIB, (double)proc_mem(s.pid, "VmRSS") / MIB, (long long)ping);
  assert_true(ping < PING_MAX_MS);
  check_peak(&s, "unread replies");
  /* A full budget answers a new large read with TDIST_ERR_NO_MEMORY, naming it. */
  void *g = NULL;
  size_t gl = 0;
  int rc = tdist_store_get(c, "big", &g, &gl, GET_MS);
  if (rc == 0) {
    tdist_store_free(g);
  } else {
    assert_int_equal(rc, TDIST_ERR_NO_MEMORY);
    assert_non_null(strstr(tdist_last_error(), "TDIST_STORE_MEMORY_BYTES"));
  }
  for (int i = 0; i < 4; i++)
    close(fds[i]);
  /* Once they are gone, the memory goes back (the server purges its heap). */
  size_t after = 0;
  for (int i = 0; i < 40; i++) {
    st_sleep_ms(100);
    after = proc_mem(s.pid, "VmRSS");
    if (after < base + 16 * MIB) break;
  }
  printf("unread replies: resident %.1f MiB after the clients closed\n", (double)after / MIB);
#if !defined(ST_ASAN) && !defined(ST_TSAN)
  assert_true(after < base + 16 * MIB);
#endif
  assert_int_equal(tdist_store_get(c, "big", &g, &gl, GET_MS), 0); /* and serves it again */
  assert_int_equal(gl, BIG);
  tdist_store_free(g);
  tdist_store_release(c);
  stop_store(&s);
}

/* Connections that never authenticate: 64 MiB of a HELLO frame each, and
 * one that sends nothing. */
static void test_unauthenticated_large_frames(void **state) {
  store_proc_t s = start_store(BUDGET, 1500, "secret");
  tdist_store_opts_t o = {.mask = TDIST_STORE_FIELD_TIMEOUT | TDIST_STORE_FIELD_TOKEN,
                          .timeout_ms = 10000,
                          .token = "secret"};
  tdist_store_t *c;
  assert_int_equal(tdist_store_connect("127.0.0.1", s.port, &o, &c), 0);
  size_t base = proc_mem(s.pid, "VmRSS");
  int silent = raw_connect(s.port);
  int fds[4];
  char *junk = calloc(1, 4 * MIB);
  for (int i = 0; i < 4; i++) {
    fds[i] = raw_connect(s.port);
    fcntl(fds[i], F_SETFL, O_NONBLOCK);
    uint8_t h[9] = {0, 0, 0, 4, TDIST__OP_HELLO, 0x54, 0x53, 0x44, 0x54}; /* 64 MiB */
    send(fds[i], h, sizeof(h), MSG_NOSIGNAL);
    for (int k = 0; k < 16; k++) /* until the socket refuses: the server closed it */
      if (send(fds[i], junk, 4 * MIB, MSG_NOSIGNAL) <= 0) break;
  }
  free(junk);
  int64_t ping = ping_ms(c);
  printf("unauthenticated: resident %.1f MiB before, %.1f MiB after; ping %lld ms\n",
         (double)base / MIB, (double)proc_mem(s.pid, "VmRSS") / MIB, (long long)ping);
  assert_true(ping < PING_MAX_MS);
  for (int i = 0; i < 4; i++) {
    assert_true(closed_within(fds[i], 3000));
    close(fds[i]);
  }
  check_peak(&s, "unauthenticated");
#ifndef ST_TSAN
  assert_true(proc_mem(s.pid, "VmHWM") < base + 16 * MIB);
#endif
  int64_t t0 = st_now_ms(); /* no handshake within the I/O timeout: closed */
  assert_true(closed_within(silent, 10000));
  printf("unauthenticated: the silent connection was closed after %lld ms more\n",
         (long long)(st_now_ms() - t0));
  close(silent);
  tdist_store_release(c);
  stop_store(&s);
}

/* Eight authenticated connections each send a 64 MiB SET and do not read;
 * one more stops halfway through its frame. */
static void test_authenticated_large_frames(void **state) {
  store_proc_t s = start_store(BUDGET, 3000, NULL);
  tdist_store_t *c;
  assert_int_equal(st_connect(s.port, 10000, &c), 0);
  char *v = big_value();
  uint8_t h[4 + 1 + 4 + 8 + 4];
  uint32_t flen = 1 + 4 + 8 + 4 + (uint32_t)BIG, kl = 8, vl = (uint32_t)BIG;
  memcpy(h, &flen, 4);
  h[4] = TDIST__OP_SET;
  memcpy(h + 5, &kl, 4);
  int fds[8];
  for (int i = 0; i < 8; i++) {
    fds[i] = raw_connect(s.port);
    hello(fds[i]);
    snprintf((char *)h + 9, 9, "set/%04d", i);
    memcpy(h + 17, &vl, 4);
    send_all(fds[i], h, sizeof(h));
    send_all(fds[i], v, BIG);
  }
  int half = raw_connect(s.port);
  hello(half);
  memcpy(h + 9, "set/half", 8);
  send_all(half, h, sizeof(h));
  send_all(half, v, BIG / 2);
  int64_t ping = ping_ms(c);
  printf("authenticated: resident %.1f MiB held; ping %lld ms\n",
         (double)proc_mem(s.pid, "VmRSS") / MIB, (long long)ping);
  assert_true(ping < PING_MAX_MS);
  check_peak(&s, "authenticated");
  int ok = 0, full = 0;
  for (int i = 0; i < 8; i++) {
    uint8_t r[5];
    recv_all(fds[i], r, 5);
    uint32_t len;
    memcpy(&len, r, 4);
    if (r[4] == TDIST__ST_OK) ok++;
    if (r[4] == TDIST__ST_FULL) {
      full++;
      char *m = calloc(1, len);
      recv_all(fds[i], m, len - 1);
      assert_non_null(strstr(m + 4, "TDIST_STORE_MEMORY_BYTES"));
      free(m);
    }
    close(fds[i]);
  }
  printf("authenticated: %d sets stored, %d refused\n", ok, full);
  assert_true(ok >= 1 && full >= 1 && ok + full == 8);
  /* Through the API, a refusal is TDIST_ERR_NO_MEMORY. */
  int rc = 0, api_ok = 0;
  for (int i = 0; i < 8 && rc == 0; i++) {
    char key[16];
    snprintf(key, sizeof(key), "set/api%d", i);
    if ((rc = tdist_store_set(c, key, v, BIG)) == 0) api_ok++;
  }
  assert_int_equal(rc, TDIST_ERR_NO_MEMORY);
  assert_non_null(strstr(tdist_last_error(), "TDIST_STORE_MEMORY_BYTES"));
  free(v);
  int64_t t0 = st_now_ms(); /* the half frame is closed after the I/O timeout */
  assert_true(closed_within(half, 15000));
  printf("authenticated: the half frame was closed after %lld ms more\n",
         (long long)(st_now_ms() - t0));
  close(half);
  int64_t n = 0;
  assert_int_equal(tdist_store_num_keys(c, &n), 0);
  assert_int_equal(n, ok + api_ok);
  tdist_store_release(c);
  stop_store(&s);
}

/* A GET of 64 MiB, then shutdown(SHUT_WR): every byte of the reply arrives. */
static void test_half_close(void **state) {
  store_proc_t s = start_store(BUDGET, 5000, NULL);
  tdist_store_t *c;
  assert_int_equal(st_connect(s.port, 10000, &c), 0);
  char *v = big_value();
  assert_int_equal(tdist_store_set(c, "big", v, BIG), 0);
  int fd = raw_connect(s.port);
  hello(fd);
  tdist__buf_t req = {0};
  put_get(&req, "big");
  send_all(fd, req.p, req.len);
  tdist__buf_free(&req);
  shutdown(fd, SHUT_WR);
  st_sleep_ms(200); /* the server sees the end of input before we read */
  size_t want = 4 + 1 + 4 + BIG, got = 0;
  char *r = malloc(want + 1);
  for (;;) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    assert_true(poll(&p, 1, 5000) == 1);
    ssize_t n = recv(fd, r + got, want + 1 - got, 0);
    if (n <= 0) break;
    got += (size_t)n;
  }
  printf("half-closed GET: %zu of %zu bytes\n", got, want);
  assert_int_equal(got, want);
  assert_int_equal(r[4], TDIST__ST_OK);
  assert_memory_equal(r + 9, v, BIG);
  free(r);
  free(v);
  close(fd);
  tdist_store_release(c);
  stop_store(&s);
}

/* A reader that resets its connection (SO_LINGER 0) while a large reply
 * is being written to it: the server's next write fails with EPIPE, which
 * must not kill the server (libuv writes with writev, so the process must
 * not take SIGPIPE's default action). Another client is served after. */
static void test_reader_reset_midreply(void **state) {
  store_proc_t s = start_store(BUDGET, 5000, NULL);
  tdist_store_t *c;
  assert_int_equal(st_connect(s.port, 10000, &c), 0);
  char *v = big_value();
  assert_int_equal(tdist_store_set(c, "big", v, 16 * MIB), 0);
  free(v);
  for (int i = 0; i < 4; i++) {
    int fd = raw_connect(s.port);
    hello(fd);
    tdist__buf_t req = {0};
    put_get(&req, "big");
    put_get(&req, "big"); /* a second reply queued behind the first */
    send_all(fd, req.p, req.len);
    tdist__buf_free(&req);
    char head[4096];
    recv_all(fd, head, sizeof(head)); /* the reply has started */
    struct linger lg = {1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    close(fd); /* RST */
    st_sleep_ms(100);
  }
  int st = 0;
  assert_int_equal(waitpid(s.pid, &st, WNOHANG), 0); /* still running */
  int64_t n = -1;
  assert_int_equal(tdist_store_num_keys(c, &n), 0);
  assert_int_equal(n, 1);
  tdist_store_release(c);
  stop_store(&s);
}

/* A reader that takes a 16 MiB reply steadily but slowly (160 KiB every
 * 40 ms, about 4.2 s) is not cut off by an I/O timeout of 2 s: the timeout
 * counts from the last byte taken, not from the start of the write. (Before,
 * the reply was cut off 2-2.5 s after it began, with at most 10 MB read and
 * the 4 MiB the kernel buffers.) */
static void test_slow_reader(void **state) {
  store_proc_t s = start_store(BUDGET, 2000, NULL);
  tdist_store_t *c;
  assert_int_equal(st_connect(s.port, 10000, &c), 0);
  size_t n = 16 * MIB;
  char *v = big_value();
  assert_int_equal(tdist_store_set(c, "slow", v, n), 0);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  int rcv = 64 * 1024; /* small, so the kernel buffers little of the reply */
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcv, sizeof(rcv));
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)s.port)};
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
  hello(fd);
  tdist__buf_t req = {0};
  put_get(&req, "slow");
  send_all(fd, req.p, req.len);
  tdist__buf_free(&req);
  size_t want = 4 + 1 + 4 + n, got = 0;
  char *r = malloc(want);
  int64_t t0 = st_now_ms();
  while (got < want) {
    size_t step = want - got < 160 * 1024 ? want - got : 160 * 1024, part = 0;
    while (part < step) {
      struct pollfd p = {.fd = fd, .events = POLLIN};
      if (poll(&p, 1, 5000) != 1) break;
      ssize_t k = recv(fd, r + got + part, step - part, 0);
      if (k <= 0) break;
      part += (size_t)k;
    }
    got += part;
    if (part < step) break; /* closed */
    st_sleep_ms(40);
  }
  printf("slow reader: %zu of %zu bytes in %lld ms (I/O timeout 2000 ms)\n", got, want,
         (long long)(st_now_ms() - t0));
  assert_int_equal(got, want);
  assert_int_equal(r[4], TDIST__ST_OK);
  assert_memory_equal(r + 9, v, n);
  free(r);
  free(v);
  close(fd);
  tdist_store_release(c);
  stop_store(&s);
}

/* The purge lines of the log at `path`: how many, and how many of them say
 * the resident set fell. */
static void purge_lines(const char *path, int *lines, int *freed) {
  *lines = *freed = 0;
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  char l[1024];
  while (fgets(l, sizeof(l), f)) {
    const char *r = strstr(l, "heap purged");
    if (!r || !(r = strstr(r, "resident "))) continue;
    double before = 0, after = 0;
    if (sscanf(r, "resident %lf -> %lf", &before, &after) != 2) continue;
    printf("purge: %s", l);
    (*lines)++;
    if (after < before) (*freed)++;
  }
  fclose(f);
}

/* The heap purge runs only when it gives memory back. Eight 64 MiB SETs of
 * one key make the charge rise and fall by 64 MiB each time, but leave the
 * allocator nothing to give back (the value's buffer is reused, the frame's
 * returned as it is freed): at most one purge is logged, and none that did
 * not lower the resident set (before: one per SET, the same numbers each
 * time). Deleting 32 MiB of 64 KiB values (which the allocator keeps) is
 * purged, and its line says resident fell. */
static void test_purge_only_when_it_frees(void **state) {
#ifdef ST_TSAN
  /* Allocator behaviour (jemalloc's purges), which a sanitizer build does
   * not have, and under TSan 64 MiB copies at a tenth of the speed: about
   * a tenth of the TSan pass's CPU time, for lines it cannot have. The
   * ASan pass keeps the check that no useless line is logged. */
  skip();
#endif
  char log[] = "/tmp/test_store_memory_purge_XXXXXX";
  int lfd = mkstemp(log);
  assert_true(lfd >= 0);
  close(lfd);
  g_log_path = log;
  store_proc_t s = start_store((size_t)1 << 30, 400, NULL); /* the default budget; sweep 100 ms */
  g_log_path = NULL;
  tdist_store_t *c;
  assert_int_equal(st_connect(s.port, 10000, &c), 0);
  char *v = big_value();
  for (int i = 0; i < 8; i++) {
    assert_int_equal(tdist_store_set(c, "big", v, BIG), 0);
    st_sleep_ms(150); /* sweeps run between the sets (pacing, not waiting for them) */
  }
  int lines = 0, freed = 0;
  purge_lines(log, &lines, &freed);
  printf("purge: %d lines after eight 64 MiB sets, %d with resident falling\n", lines, freed);
  assert_true(lines <= 1);
  assert_int_equal(freed, lines);
  char key[32];
  for (int i = 0; i < 512; i++) {
    snprintf(key, sizeof(key), "small/%d", i);
    assert_int_equal(tdist_store_set(c, key, v + i, 64 * 1024), 0);
  }
  for (int i = 0; i < 512; i++) {
    snprintf(key, sizeof(key), "small/%d", i);
    assert_int_equal(tdist_store_delete(c, key, NULL), 0);
  }
  free(v);
  int before = lines;
  /* The purge that follows the deletes: its line, within 10 s. */
  for (int64_t end = st_now_ms() + 10000; st_now_ms() < end;) {
    purge_lines(log, &lines, &freed);
#if defined(ST_ASAN) || defined(ST_TSAN)
    break; /* freed memory is quarantined or shadowed: only useless lines are checked */
#endif
    if (lines > before) break;
    st_sleep_ms(100);
  }
  printf("purge: %d lines in all, %d with resident falling\n", lines, freed);
  assert_int_equal(freed, lines);
#if !defined(ST_ASAN) && !defined(ST_TSAN)
  assert_true(lines > before);
#endif
  tdist_store_release(c);
  stop_store(&s);
  unlink(log);
}

/* A large SET keeps the frame's buffer as its value (no copy); what follows
 * on that key must see the right bytes: GET, APPEND onto it, a small SET
 * that replaces it, a large SET over a plain value, DELETE. */
static void test_large_value_in_place(void **state) {
  store_proc_t s = start_store(BUDGET, 5000, NULL);
  tdist_store_t *c;
  assert_int_equal(st_connect(s.port, 10000, &c), 0);
  char *v = big_value();
  size_t n = MIB;
  void *g = NULL;
  size_t gl = 0;
  assert_int_equal(tdist_store_set(c, "k", v, n), 0);
  assert_int_equal(tdist_store_get(c, "k", &g, &gl, GET_MS), 0);
  assert_int_equal(gl, n);
  assert_memory_equal(g, v, n);
  tdist_store_free(g);
  assert_int_equal(tdist_store_append(c, "k", v + n, 100), 0);
  assert_int_equal(tdist_store_get(c, "k", &g, &gl, GET_MS), 0);
  assert_int_equal(gl, n + 100);
  assert_memory_equal(g, v, n + 100);
  tdist_store_free(g);
  assert_int_equal(tdist_store_set(c, "k", v + 7, 200), 0);
  assert_int_equal(tdist_store_get(c, "k", &g, &gl, GET_MS), 0);
  assert_int_equal(gl, 200);
  assert_memory_equal(g, v + 7, 200);
  tdist_store_free(g);
  assert_int_equal(tdist_store_set(c, "k", v + 3, 2 * n), 0);
  assert_int_equal(tdist_store_get(c, "k", &g, &gl, GET_MS), 0);
  assert_int_equal(gl, 2 * n);
  assert_memory_equal(g, v + 3, 2 * n);
  tdist_store_free(g);
  int deleted = 0;
  assert_int_equal(tdist_store_delete(c, "k", &deleted), 0);
  assert_int_equal(deleted, 1);
  int64_t keys = -1;
  assert_int_equal(tdist_store_num_keys(c, &keys), 0);
  assert_int_equal(keys, 0);
  free(v);
  tdist_store_release(c);
  stop_store(&s);
}

/* A large GET is sent from where the value is stored (no copy into a reply
 * buffer), so the server must keep those bytes unchanged until the kernel
 * took them. A reader with a small receive buffer asks for a 32 MiB value
 * and stops after the reply's head, leaving most of it in the server's
 * write; meanwhile another client overwrites the key with a value of the
 * same size through multi_set (which writes into the old buffer in place
 * when nobody holds it), reads the new value back, and deletes the key
 * (which frees the buffer). The stalled reader must still get every byte
 * of the old value. (Checked to fail with the pin ignored by the in-place
 * write: the reader then gets the new bytes past the first few MiB.) */
static void test_get_outlives_overwrite(void **state) {
  /* An I/O timeout far above the other client's four 32 MiB requests: the
   * stalled reader takes nothing meanwhile, and under TSan on a loaded
   * machine they outlasted 5 s (the reader was cut off, as it should be). */
  store_proc_t s = start_store(BUDGET, 60000, NULL);
  tdist_store_t *c;
  assert_int_equal(st_connect(s.port, 10000, &c), 0);
  size_t n = 32 * MIB;
  char *v = big_value();
  const char *key = "zc";
  const void *val = v;
  assert_int_equal(tdist_store_multi_set(c, &key, &val, &n, 1), 0);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  int rcv = 64 * 1024;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcv, sizeof(rcv));
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)s.port)};
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
  hello(fd);
  tdist__buf_t req = {0};
  put_get(&req, "zc");
  send_all(fd, req.p, req.len);
  tdist__buf_free(&req);
  size_t want = 4 + 1 + 4 + n, got = 0;
  char *r = malloc(want);
  recv_all(fd, r, 9); /* the GET ran: the rest of its reply is on its way */
  got = 9;
  /* The same key, same size, other bytes; then read back and deleted. */
  const void *val2 = v + 1;
  assert_int_equal(tdist_store_multi_set(c, &key, &val2, &n, 1), 0);
  void *g = NULL;
  size_t gl = 0;
  assert_int_equal(tdist_store_get(c, "zc", &g, &gl, GET_MS), 0);
  assert_int_equal(gl, n);
  assert_memory_equal(g, v + 1, n);
  tdist_store_free(g);
  int deleted = 0;
  assert_int_equal(tdist_store_delete(c, "zc", &deleted), 0);
  assert_int_equal(deleted, 1);
  /* A large SET of another key reuses what was freed, if anything was. */
  assert_int_equal(tdist_store_set(c, "other", v + 2, n), 0);
  recv_all(fd, r + got, want - got);
  uint32_t len;
  memcpy(&len, r, 4);
  assert_int_equal(len, 1 + 4 + n);
  assert_int_equal(r[4], TDIST__ST_OK);
  assert_memory_equal(r + 9, v, n);
  printf("get outlives overwrite: %zu bytes of the old value, exact\n", n);
  free(r);
  free(v);
  close(fd);
  tdist_store_release(c);
  stop_store(&s);
}

/* Fair reading: a small request is not queued behind other clients' large
 * frames that are all there to be read. The server is stopped (SIGSTOP)
 * while NFAIR connections each send a whole SET frame of 96 KiB (above the
 * 64 KiB where a read buffer counts as large; their send buffers take it
 * all) and then a bystander sends NUM_KEYS; once the server runs again, its
 * poll finds all of them ready, the bystander last. The bystander's answer
 * must count fewer than NFAIR keys: it was served before every large frame
 * had been read. (Before the read allowance per loop iteration, libuv read
 * each ready connection up to 32 times in the same iteration, so all NFAIR
 * frames were read and stored first and the answer was NFAIR.) */
#define NFAIR 40

/* Whether every thread of pid is in the stopped state ('T' in
 * /proc/TID/stat, run_util.h). kill(SIGSTOP) only queues the stop: a
 * server that is runnable but not running under load stops when it next
 * runs, and one woken in epoll_wait by the first frame collects that event
 * before it stops -- its first poll after SIGCONT would then miss the
 * bystander. */
static int all_stopped(pid_t pid) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
  DIR *d = opendir(path);
  if (!d) return 0;
  int stopped = 1, seen = 0;
  struct dirent *e;
  while (stopped && (e = readdir(d))) {
    char comm[32], st = 0;
    pid_t ppid;
    unsigned long long t0;
    if (e->d_name[0] == '.' ||
        ru_proc_stat((pid_t)atoi(e->d_name), comm, sizeof(comm), &st, &ppid, &t0) != 0)
      continue; /* a thread that just ended */
    stopped = st == 'T' || st == 't';
    seen++;
  }
  closedir(d);
  return stopped && seen > 0;
}
static void test_fair_reading(void **state) {
  store_proc_t s = start_store(BUDGET, 10000, NULL);
  size_t vlen = 96 * 1024;
  char *v = big_value();
  int fds[NFAIR];
  for (int i = 0; i < NFAIR; i++) {
    fds[i] = socket(AF_INET, SOCK_STREAM, 0);
    int snd = 1 << 20;
    setsockopt(fds[i], SOL_SOCKET, SO_SNDBUF, &snd, sizeof(snd));
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)s.port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    assert_int_equal(connect(fds[i], (struct sockaddr *)&a, sizeof(a)), 0);
    hello(fds[i]);
  }
  int by = raw_connect(s.port);
  hello(by);
  assert_int_equal(kill(s.pid, SIGSTOP), 0);
  for (int64_t end = st_now_ms() + 30000; !all_stopped(s.pid);) {
    assert_true(st_now_ms() < end);
    st_sleep_ms(1);
  }
  for (int i = 0; i < NFAIR; i++) {
    tdist__buf_t b = {0};
    char key[32];
    snprintf(key, sizeof(key), "fair/%d", i);
    assert_int_equal(tdist__buf_reserve(&b, 64 + vlen), 0);
    size_t f = tdist__frame_begin(&b, TDIST__OP_SET);
    tdist__put_bytes(&b, key, (uint32_t)strlen(key));
    tdist__put_bytes(&b, v, (uint32_t)vlen);
    tdist__frame_end(&b, f);
    /* all of it into the kernel's buffers now (the server is stopped) */
    assert_int_equal(send(fds[i], b.p, b.len, MSG_DONTWAIT | MSG_NOSIGNAL), (ssize_t)b.len);
    tdist__buf_free(&b);
  }
  uint8_t req[5];
  uint32_t one = 1;
  memcpy(req, &one, 4);
  req[4] = TDIST__OP_NUM_KEYS;
  send_all(by, req, sizeof(req));
  assert_int_equal(kill(s.pid, SIGCONT), 0);
  uint8_t r[13];
  recv_all(by, r, sizeof(r));
  assert_int_equal(r[4], TDIST__ST_OK);
  uint64_t keys;
  memcpy(&keys, r + 5, 8);
  for (int i = 0; i < NFAIR; i++) { /* and every large SET is stored */
    uint8_t ok[5];
    recv_all(fds[i], ok, sizeof(ok));
    assert_int_equal(ok[4], TDIST__ST_OK);
    close(fds[i]);
  }
  printf("fair reading: the bystander saw %llu of %d large SETs stored\n", (unsigned long long)keys,
         NFAIR);
  assert_true(keys < NFAIR);
  close(by);
  free(v);
  stop_store(&s);
}

/* Spare blocks: a large SET's value block, when a later SET replaces it, is
 * kept for the next frame of the same size (its pages already resident)
 * and charged to the budget meanwhile, but never at the cost of a refusal.
 * With a 256 MiB budget: "a" is set three times (64 MiB, then one and two
 * bytes less), leaving two spare blocks, 192 MiB charged in all; "b" of
 * the second size takes a spare (right bytes, nothing more charged); "c" of
 * yet another size needs 64 MiB more, which fits only once the other spare
 * is given back: it must be stored, not refused FULL. (Checked to fail with
 * the spares kept when a frame does not fit.) */
static void test_spare_blocks(void **state) {
#ifdef ST_TSAN
  /* Its check is the peak resident memory, which TSan's shadow hides
   * (check_peak); the bytes of reused blocks are checked in the other
   * passes. */
  skip();
#endif
  store_proc_t s = start_store(BUDGET, 5000, NULL);
  tdist_store_t *c;
  assert_int_equal(st_connect(s.port, 10000, &c), 0);
  char *v = big_value();
  for (int i = 0; i < 3; i++)
    assert_int_equal(tdist_store_set(c, "a", v + i, BIG - i), 0);
  assert_int_equal(tdist_store_set(c, "b", v + 1, BIG - 1), 0);
  assert_int_equal(tdist_store_set(c, "c", v + 3, BIG - 3), 0);
  void *g = NULL;
  size_t gl = 0;
  const char *keys[] = {"a", "b", "c"};
  size_t off[] = {2, 1, 3};
  for (int i = 0; i < 3; i++) {
    assert_int_equal(tdist_store_get(c, keys[i], &g, &gl, GET_MS), 0);
    assert_int_equal(gl, BIG - off[i]);
    assert_memory_equal(g, v + off[i], gl);
    tdist_store_free(g);
  }
  check_peak(&s, "spare blocks");
  free(v);
  tdist_store_release(c);
  stop_store(&s);
}

/* Large replies are written in chunks out of an allowance per loop
 * iteration shared by all connections; a connection that spent it waits
 * for the next iteration with no socket event to wake the loop. Eight
 * clients ask for a 16 MiB value at once and read their replies
 * round-robin: each must get every byte, exactly. (Checked to fail, the
 * replies stalled and cut off, with the idle handle that keeps the poll
 * from blocking while writers wait removed; so did three other tests.) */
#define NGET 8
static void test_concurrent_large_gets(void **state) {
  store_proc_t s = start_store(BUDGET, 5000, NULL);
  tdist_store_t *c;
  assert_int_equal(st_connect(s.port, 10000, &c), 0);
  size_t n = 16 * MIB, want = 4 + 1 + 4 + n;
  char *v = big_value();
  assert_int_equal(tdist_store_set(c, "shared", v + 5, n), 0);
  int fds[NGET];
  char *r[NGET];
  size_t got[NGET];
  tdist__buf_t req = {0};
  put_get(&req, "shared");
  for (int i = 0; i < NGET; i++) {
    fds[i] = raw_connect(s.port);
    hello(fds[i]);
    r[i] = malloc(want);
    got[i] = 0;
  }
  for (int i = 0; i < NGET; i++)
    send_all(fds[i], req.p, req.len);
  tdist__buf_free(&req);
  for (int left = NGET; left > 0;) {
    struct pollfd p[NGET];
    for (int i = 0; i < NGET; i++)
      p[i] = (struct pollfd){.fd = got[i] < want ? fds[i] : -1, .events = POLLIN};
    assert_true(poll(p, NGET, 3000) > 0);
    for (int i = 0; i < NGET; i++) {
      if (!(p[i].revents & POLLIN)) continue;
      ssize_t k = recv(fds[i], r[i] + got[i], want - got[i], 0);
      assert_true(k > 0);
      got[i] += (size_t)k;
      if (got[i] == want) left--;
    }
  }
  for (int i = 0; i < NGET; i++) {
    assert_int_equal(r[i][4], TDIST__ST_OK);
    assert_memory_equal(r[i] + 9, v + 5, n);
    free(r[i]);
    close(fds[i]);
  }
  printf("concurrent large gets: %d x %zu bytes, exact\n", NGET, n);
  free(v);
  tdist_store_release(c);
  stop_store(&s);
}

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  if (argc > 1) cmocka_set_test_filter(argv[1]); /* one case, by name */
  atexit(kill_leftovers);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_half_close),
      cmocka_unit_test(test_reader_reset_midreply),
      cmocka_unit_test(test_unauthenticated_large_frames),
      cmocka_unit_test(test_unread_replies),
      cmocka_unit_test(test_authenticated_large_frames),
      cmocka_unit_test(test_slow_reader),
      cmocka_unit_test(test_large_value_in_place),
      cmocka_unit_test(test_purge_only_when_it_frees),
      cmocka_unit_test(test_get_outlives_overwrite),
      cmocka_unit_test(test_fair_reading),
      cmocka_unit_test(test_spare_blocks),
      cmocka_unit_test(test_concurrent_large_gets),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
