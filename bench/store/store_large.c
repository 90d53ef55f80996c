/*
 * store_large - large values and a bystander's latency, on tdist-store and on
 * Redis with the same client code (issue 44), so the two servers are measured
 * by one client in the same run:
 *
 *   store_large large PROTO HOST PORT [REPS]
 *       SET then GET of one key with values of 1 KiB .. 64 MiB, REPS times
 *       each (default 3); one line per (op, size) with the mean and the best.
 *   store_large pair HOST REDIS_PORT TDIST_PORT [REPS]
 *       the same, both servers in one loop: each rep on Redis and on
 *       tdist-store back to back (order swapped every rep), so that the
 *       load of a shared machine falls on both alike; lines end interleaved=1.
 *       With STORE_LARGE_PAIR_SAME=redis|tdist both ports run that server
 *       (peers redis-a/-b or tdist-store-a/-b): the control for the loop.
 *       Its lines add p50_us, the median rep (a few slow reps of this
 *       shared machine move a mean by tens of percent at 1 MiB).
 *   Both take STORE_LARGE_SIZES=B1,B2,...: only those value sizes.
 *   store_large ping PROTO HOST PORT [SECONDS] [ATTACKERS] [LABEL]
 *       ATTACKERS (default 8) connections SET 64 MiB values in a loop while
 *       another client connects, authenticates and asks the number of keys
 *       (tdist: HELLO + NUM_KEYS; redis: PING + DBSIZE) every 5 ms for
 *       SECONDS (default 10); its p50/p99/max in one line. With
 *       STORE_LARGE_ATTACK_OP=get the attackers GET a 64 MiB value instead.
 *
 * PROTO is "tdist" (the store's wire protocol, src/store/proto.h; token from
 * $TDIST_STORE_TOKEN) or "redis" (RESP). Blocking sockets, one thread per
 * connection: the client is the same simple one for both servers. Lines are
 * in the peers format (../shared/peers/README.md):
 *   peer=P op=set|get bytes=B us=MEAN best_us=MIN [p50_us=MEDIAN] MBps=B/best reps=R
 *   peer=P op=ping_under_set64m|ping_under_get64m attackers=A n=N p50_us p99_us max_us
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "store/proto.h"

static int g_redis;
static const char *g_host;
static int g_port;

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static void die(const char *what) {
  fprintf(stderr, "store_large: %s: %s\n", what, strerror(errno));
  exit(1);
}

static void send_all(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n) {
    ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) die("send");
    c += w;
    n -= (size_t)w;
  }
}

static void recv_all(int fd, void *p, size_t n) {
  char *c = p;
  while (n) {
    ssize_t r = recv(fd, c, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) die("recv");
    c += r;
    n -= (size_t)r;
  }
}

/* ---- tdist protocol ---- */

static void put32(uint8_t **p, uint32_t v) {
  memcpy(*p, &v, 4);
  *p += 4;
}

/* Send one frame: op, then the parts given as (ptr, len) pairs, each
 * prefixed by its u32 length when `prefixed`; a value part is sent from
 * its own buffer (no copy into the frame). */
static void td_send(int fd, uint8_t op, const void *a, uint32_t al, const void *pre, uint32_t pl,
                    const void *v, uint32_t vl, int with_v) {
  uint8_t head[4096], *p = head;
  uint32_t len = 1 + pl + (a ? 4 + al : 0) + (with_v ? 4 + vl : 0);
  put32(&p, len);
  *p++ = op;
  if (pl) {
    memcpy(p, pre, pl);
    p += pl;
  }
  if (a) {
    put32(&p, al);
    memcpy(p, a, al);
    p += al;
  }
  if (with_v) put32(&p, vl);
  send_all(fd, head, (size_t)(p - head));
  if (with_v && vl) send_all(fd, v, vl);
}

/* Read one reply frame; its status, its body (after the status) into *body
 * (grown as needed), its length into *n. */
static int td_recv(int fd, uint8_t **body, size_t *cap, uint32_t *n) {
  uint32_t len;
  uint8_t st;
  recv_all(fd, &len, 4);
  recv_all(fd, &st, 1);
  *n = len - 1;
  if (*n > *cap) {
    *body = realloc(*body, *n);
    *cap = *n;
    if (!*body) die("realloc");
  }
  recv_all(fd, *body, *n);
  return st;
}

static int connect_to(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) die("socket");
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)g_port)};
  inet_pton(AF_INET, g_host, &a.sin_addr);
  if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) die("connect");
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

typedef struct {
  int fd;
  uint8_t *buf;
  size_t cap;
} cl_t;

static void cl_open(cl_t *c) {
  c->fd = connect_to();
  if (g_redis) return;
  const char *tok = getenv("TDIST_STORE_TOKEN");
  uint8_t pre[8];
  uint8_t *p = pre;
  put32(&p, TDIST__STORE_MAGIC);
  put32(&p, TDIST__STORE_VERSION);
  td_send(c->fd, TDIST__OP_HELLO, tok ? tok : "", tok ? (uint32_t)strlen(tok) : 0, pre, 8, NULL, 0,
          0);
  uint32_t n;
  if (td_recv(c->fd, &c->buf, &c->cap, &n) != TDIST__ST_OK) {
    fprintf(stderr, "store_large: handshake refused\n");
    exit(1);
  }
}

/* ---- RESP ---- */

/* Read one RESP reply: a line, then for a bulk string its bytes. */
static void resp_recv(cl_t *c, size_t *vlen) {
  char line[64];
  size_t n = 0;
  for (;;) {
    recv_all(c->fd, line + n, 1);
    if (line[n] == '\n') break;
    if (++n >= sizeof(line) - 1) die("resp line");
  }
  line[n] = 0;
  *vlen = 0;
  if (line[0] == '-') {
    fprintf(stderr, "store_large: redis: %s\n", line);
    exit(1);
  }
  if (line[0] == '$') {
    long l = atol(line + 1);
    if (l < 0) return;
    if ((size_t)l + 2 > c->cap) {
      c->buf = realloc(c->buf, (size_t)l + 2);
      c->cap = (size_t)l + 2;
      if (!c->buf) die("realloc");
    }
    recv_all(c->fd, c->buf, (size_t)l + 2);
    *vlen = (size_t)l;
  }
}

static void resp_cmd(cl_t *c, const char *cmd, const char *key, const void *v, size_t vl) {
  char head[256];
  int n;
  if (!key)
    n = snprintf(head, sizeof(head), "*1\r\n$%zu\r\n%s\r\n", strlen(cmd), cmd);
  else if (!v)
    n = snprintf(head, sizeof(head), "*2\r\n$%zu\r\n%s\r\n$%zu\r\n%s\r\n", strlen(cmd), cmd,
                 strlen(key), key);
  else
    n = snprintf(head, sizeof(head), "*3\r\n$%zu\r\n%s\r\n$%zu\r\n%s\r\n$%zu\r\n", strlen(cmd), cmd,
                 strlen(key), key, vl);
  send_all(c->fd, head, (size_t)n);
  if (v) {
    send_all(c->fd, v, vl);
    send_all(c->fd, "\r\n", 2);
  }
}

/* ---- the operations, both protocols ---- */

static void op_set(cl_t *c, const char *key, const void *v, size_t vl) {
  if (g_redis) {
    resp_cmd(c, "SET", key, v, vl);
    size_t n;
    resp_recv(c, &n);
    return;
  }
  td_send(c->fd, TDIST__OP_SET, key, (uint32_t)strlen(key), NULL, 0, v, (uint32_t)vl, 1);
  uint32_t n;
  int st = td_recv(c->fd, &c->buf, &c->cap, &n);
  if (st != TDIST__ST_OK && st != TDIST__ST_FULL) {
    fprintf(stderr, "store_large: set: status %d\n", st);
    exit(1);
  }
}

/* The value's length; the value is at *val (in c->buf). */
static size_t op_get(cl_t *c, const char *key, const uint8_t **val) {
  *val = c->buf;
  if (g_redis) {
    resp_cmd(c, "GET", key, NULL, 0);
    size_t n;
    resp_recv(c, &n);
    *val = c->buf;
    return n;
  }
  uint8_t pre[8] = {0}; /* u64 timeout 0 */
  td_send(c->fd, TDIST__OP_GET, key, (uint32_t)strlen(key), pre, 8, NULL, 0, 0);
  uint32_t n;
  if (td_recv(c->fd, &c->buf, &c->cap, &n) != TDIST__ST_OK) {
    fprintf(stderr, "store_large: get refused\n");
    exit(1);
  }
  *val = c->buf + 4;
  return n - 4;
}

static void op_ping(cl_t *c) {
  if (g_redis) {
    size_t n;
    resp_cmd(c, "PING", NULL, NULL, 0);
    resp_recv(c, &n);
    resp_cmd(c, "DBSIZE", NULL, NULL, 0);
    resp_recv(c, &n);
    return;
  }
  td_send(c->fd, TDIST__OP_NUM_KEYS, NULL, 0, NULL, 0, NULL, 0, 0);
  uint32_t n;
  td_recv(c->fd, &c->buf, &c->cap, &n);
}

static void cl_close(cl_t *c) {
  close(c->fd);
  free(c->buf);
  c->buf = NULL;
  c->cap = 0;
}

/* ---- modes ---- */

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* The median of v[0..n-1] (sorts v). */
static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof(double), cmp_d);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* STORE_LARGE_SIZES="65536,1048576": only those value sizes (default: all),
 * e.g. to count a server's page faults per op of one size. */
static int size_wanted(size_t n) {
  const char *e = getenv("STORE_LARGE_SIZES");
  if (!e || !*e) return 1;
  for (const char *p = e; *p;) {
    char *end = NULL;
    unsigned long long v = strtoull(p, &end, 10);
    if (end == p) return 1; /* unreadable: every size */
    if (v == n) return 1;
    p = *end ? end + 1 : end;
  }
  return 0;
}

static int large(const char *peer, int reps) {
  static const size_t sizes[] = {1 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20};
  uint8_t *v = malloc(64 << 20);
  if (!v) die("malloc");
  for (size_t i = 0; i < (size_t)64 << 20; i++)
    v[i] = (uint8_t)(i * 131 + 7);
  cl_t c = {0};
  cl_open(&c);
  for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
    size_t n = sizes[s];
    if (!size_wanted(n)) continue;
    char key[32];
    snprintf(key, sizeof(key), "large/%zu", n);
    double tset = 0, tget = 0, bset = 1e30, bget = 1e30;
    int r = n <= (1 << 20) ? reps * 20 : reps;
    for (int i = 0; i < r + 1; i++) { /* the first is a warmup */
      double t0 = now_us();
      op_set(&c, key, v, n);
      double t1 = now_us();
      const uint8_t *val;
      size_t got = op_get(&c, key, &val);
      double t2 = now_us();
      if (got != n || memcmp(val, v, n) != 0) {
        fprintf(stderr, "store_large: %s: wrong value for %zu bytes\n", peer, n);
        return 1;
      }
      if (i == 0) continue;
      tset += t1 - t0;
      tget += t2 - t1;
      if (t1 - t0 < bset) bset = t1 - t0;
      if (t2 - t1 < bget) bget = t2 - t1;
    }
    printf("peer=%s op=set bytes=%zu us=%.1f best_us=%.1f MBps=%.1f reps=%d\n", peer, n, tset / r,
           bset, n / bset, r);
    printf("peer=%s op=get bytes=%zu us=%.1f best_us=%.1f MBps=%.1f reps=%d\n", peer, n, tget / r,
           bget, n / bget, r);
    fflush(stdout);
  }
  cl_close(&c);
  free(v);
  return 0;
}

/* large, both servers by one client in the same loop: each rep does the
 * SET and GET on Redis and on tdist-store back to back (the order swapped
 * every rep), so a change in the machine's load falls on both alike. */
static int large_pair(int rport, int tport, int reps) {
  static const size_t sizes[] = {1 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20};
  /* STORE_LARGE_PAIR_SAME=redis|tdist: both ports run that server (the
   * control: what the loop alone makes of two identical servers). */
  const char *same = getenv("STORE_LARGE_PAIR_SAME");
  int redis[2] = {1, 0};
  const char *names[2] = {"redis", "tdist-store"};
  if (same && (!strcmp(same, "redis") || !strcmp(same, "tdist"))) {
    redis[0] = redis[1] = !strcmp(same, "redis");
    names[0] = redis[0] ? "redis-a" : "tdist-store-a";
    names[1] = redis[0] ? "redis-b" : "tdist-store-b";
  }
  const int ports[2] = {rport, tport};
  uint8_t *v = malloc(64 << 20);
  if (!v) die("malloc");
  for (size_t i = 0; i < (size_t)64 << 20; i++)
    v[i] = (uint8_t)(i * 131 + 7);
  cl_t c[2] = {{0}, {0}};
  for (int p = 0; p < 2; p++) {
    g_redis = redis[p];
    g_port = ports[p];
    cl_open(&c[p]);
  }
  for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
    size_t n = sizes[s];
    if (!size_wanted(n)) continue;
    char key[32];
    snprintf(key, sizeof(key), "large/%zu", n);
    double tset[2] = {0}, tget[2] = {0}, bset[2] = {1e30, 1e30}, bget[2] = {1e30, 1e30};
    int r = n <= (1 << 20) ? reps * 20 : reps;
    double *lat = malloc(sizeof(double) * 4 * (size_t)r); /* [p][set, get][rep] */
    if (!lat) die("malloc");
    for (int i = 0; i < r + 1; i++) { /* the first is a warmup */
      for (int k = 0; k < 2; k++) {
        int p = (i + k) % 2;
        g_redis = redis[p];
        double t0 = now_us();
        op_set(&c[p], key, v, n);
        double t1 = now_us();
        const uint8_t *val;
        size_t got = op_get(&c[p], key, &val);
        double t2 = now_us();
        if (got != n || memcmp(val, v, n) != 0) {
          fprintf(stderr, "store_large: %s: wrong value for %zu bytes\n", names[p], n);
          return 1;
        }
        if (i == 0) continue;
        tset[p] += t1 - t0;
        tget[p] += t2 - t1;
        if (t1 - t0 < bset[p]) bset[p] = t1 - t0;
        if (t2 - t1 < bget[p]) bget[p] = t2 - t1;
        lat[(size_t)(2 * p) * r + i - 1] = t1 - t0;
        lat[(size_t)(2 * p + 1) * r + i - 1] = t2 - t1;
      }
    }
    for (int p = 0; p < 2; p++) {
      printf("peer=%s op=set bytes=%zu us=%.1f best_us=%.1f p50_us=%.1f MBps=%.1f reps=%d "
             "interleaved=1\n",
             names[p], n, tset[p] / r, bset[p], median(lat + (size_t)(2 * p) * r, r), n / bset[p],
             r);
      printf("peer=%s op=get bytes=%zu us=%.1f best_us=%.1f p50_us=%.1f MBps=%.1f reps=%d "
             "interleaved=1\n",
             names[p], n, tget[p] / r, bget[p], median(lat + (size_t)(2 * p + 1) * r, r),
             n / bget[p], r);
    }
    free(lat);
    fflush(stdout);
  }
  for (int p = 0; p < 2; p++)
    cl_close(&c[p]);
  free(v);
  return 0;
}

static atomic_int g_stop;
static uint8_t *g_big;

static void *attacker(void *arg) {
  /* STORE_LARGE_ATTACK_NICE=k: the attackers run k nice levels below the
   * bystander, so that on a 2-core machine the bystander's own client gets
   * the CPU and what is measured is how long the server makes it wait. */
  const char *nv = getenv("STORE_LARGE_ATTACK_NICE");
  if (nv && atoi(nv) > 0)
    setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), getpriority(PRIO_PROCESS, 0) + atoi(nv));
  char key[32];
  snprintf(key, sizeof(key), "attack/%d", (int)(intptr_t)arg);
  cl_t c = {0};
  cl_open(&c);
  /* STORE_LARGE_ATTACK_OP=get: the attackers GET their 64 MiB value in a
   * loop instead (set once first), so the server writes instead of reads. */
  const char *op = getenv("STORE_LARGE_ATTACK_OP");
  int get = op && !strcmp(op, "get");
  if (get) op_set(&c, key, g_big, (size_t)64 << 20);
  while (!atomic_load(&g_stop)) {
    const uint8_t *val;
    if (get)
      op_get(&c, key, &val);
    else
      op_set(&c, key, g_big, (size_t)64 << 20);
  }
  cl_close(&c);
  return NULL;
}

static int ping(const char *peer, double seconds, int nattack, const char *label) {
  g_big = malloc((size_t)64 << 20);
  if (!g_big) die("malloc");
  memset(g_big, 'x', (size_t)64 << 20);
  pthread_t th[64];
  if (nattack > 64) nattack = 64;
  for (int i = 0; i < nattack; i++)
    pthread_create(&th[i], NULL, attacker, (void *)(intptr_t)i);
  usleep(200 * 1000); /* the attack under way */
  size_t cap = 1 << 16, n = 0;
  double *lat = malloc(cap * sizeof(double));
  double end = now_us() + seconds * 1e6;
  while (now_us() < end) {
    double t0 = now_us();
    cl_t c = {0};
    cl_open(&c);
    double t_h = now_us();
    op_ping(&c);
    double t1 = now_us();
    if (getenv("STORE_LARGE_VERBOSE") && t1 - t0 > 50000)
      fprintf(stderr, "slow ping: open %.0f us, request %.0f us\n", t_h - t0, t1 - t_h);
    cl_close(&c);
    if (n == cap) lat = realloc(lat, (cap *= 2) * sizeof(double));
    lat[n++] = t1 - t0;
    usleep(5000);
  }
  atomic_store(&g_stop, 1);
  for (int i = 0; i < nattack; i++)
    pthread_join(th[i], NULL);
  qsort(lat, n, sizeof(double), cmp_d);
  const char *aop = getenv("STORE_LARGE_ATTACK_OP");
  printf("peer=%s op=ping_under_%s64m load=%s attackers=%d n=%zu p50_us=%.0f p99_us=%.0f "
         "max_us=%.0f\n",
         peer, aop && !strcmp(aop, "get") ? "get" : "set", label, nattack, n, lat[n / 2],
         lat[(size_t)(n * 0.99)], lat[n - 1]);
  free(lat);
  free(g_big);
  return 0;
}

int main(int argc, char **argv) {
  if (argc >= 5 && !strcmp(argv[1], "pair")) { /* pair HOST REDIS_PORT TDIST_PORT [REPS] */
    g_host = argv[2];
    return large_pair(atoi(argv[3]), atoi(argv[4]), argc > 5 ? atoi(argv[5]) : 3);
  }
  if (argc < 5) {
    fprintf(stderr, "usage: store_large large|ping tdist|redis HOST PORT [...]\n");
    return 2;
  }
  g_redis = !strcmp(argv[2], "redis");
  g_host = argv[3];
  g_port = atoi(argv[4]);
  const char *peer = g_redis ? "redis" : "tdist-store";
  if (!strcmp(argv[1], "large")) return large(peer, argc > 5 ? atoi(argv[5]) : 3);
  if (!strcmp(argv[1], "ping"))
    return ping(peer, argc > 5 ? atof(argv[5]) : 10, argc > 6 ? atoi(argv[6]) : 8,
                argc > 7 ? argv[7] : "idle");
  return 2;
}
