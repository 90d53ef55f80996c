/*
 * evloop.c - the event-loop load generator of store_bench (the default mode).
 *
 * Built to drive a server the way redis-benchmark does, so the two servers
 * are compared under the same kind of client: ONE thread, N non-blocking TCP
 * connections multiplexed with epoll, one request outstanding per connection
 * (no pipelining, like redis-benchmark -P 1); when a reply arrives it is
 * checked and that connection's next request is written at once. A thread
 * per client (the --threads mode in store_bench.c) instead puts N runnable
 * threads next to a single-threaded server, which on a small machine measures
 * the scheduler more than the server.
 *
 * Shape (redis-benchmark -t set,get,incr -d 3 -r 1000): keys "key:<12 digits>"
 * and "counter:<12 digits>" (16 and 20 bytes) with a random index among 1000
 * per request, values of cfg->vsize bytes ('x'). Before the runs all 1000
 * keys are set, so every GET hits. Each op runs cfg->warmup seconds
 * uncounted, then completed requests are counted over cfg->seconds; then the
 * outstanding requests are drained so the next op starts on quiet streams.
 *
 * Verification (a broken server must not look fast): every reply must be a
 * whole frame of the expected kind with status OK and nothing after it; a GET
 * must return exactly the value set; after the add run each counter is read
 * back and must equal the number of adds this client made to it (counters are
 * fresh per run: their indexes start at a per-process random base).
 *
 * Wire formats: tdist as in docs/store-protocol.md (src/store/proto.h: frames
 * [u32 len][u8 op][payload], HELLO first); with cfg->redis, RESP commands SET,
 * GET, INCR so the same client can measure Redis as a cross-check.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "store/proto.h"
#include "store_bench.h"

enum { OP_SET, OP_GET, OP_ADD, OP_N };
static const char *const op_names[OP_N] = {"set", "get", "add"};

#define WCAP (4096 + 256)
#define RCAP (4096 + 256)

typedef struct conn {
  int fd;
  int busy;           /* a request is outstanding */
  int key;            /* key index (0..SB_NKEYS) of the outstanding request */
  int counter;        /* the template names a counter ("counter:...") */
  uint64_t rng;       /* xorshift64 state */
  size_t wlen, doff;  /* request template length; offset of its 12 key digits */
  size_t rlen;        /* bytes of the reply read so far */
  uint8_t wbuf[WCAP]; /* request template for the current op */
  uint8_t rbuf[RCAP];
} conn_t;

typedef struct run {
  const sb_cfg_t *cfg;
  conn_t *conns;
  int n, ep;
  uint64_t done;   /* replies verified */
  uint64_t cbase;  /* first counter index of this run */
  uint32_t *added; /* adds this client made per counter */
  char val[4096];
} run_t;

typedef struct reply {
  const uint8_t *val; /* GET: the value */
  size_t vlen;
  int64_t num; /* ADD: the new count */
} reply_t;

static char g_why[160];
static uint64_t g_total; /* replies verified by all runs, warm-up included */

uint64_t sb_evloop_total(void) { return g_total; }

/* Record why the run failed; returns -1. */
__attribute__((format(printf, 1, 2))) static int fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_why, sizeof(g_why), fmt, ap);
  va_end(ap);
  return -1;
}

/* ---- requests ---------------------------------------------------------------------- */

static size_t put_u32(uint8_t *p, uint32_t v) { return memcpy(p, &v, 4), 4; }

/* Build conn's template for op on a key ("counter:..." if `counter`, else
 * "key:..."); the key's 12 digits are filled per request. */
static void build(run_t *r, conn_t *c, int op, int counter) {
  const char *kp = counter ? "counter:" : "key:";
  c->counter = counter;
  size_t kl = strlen(kp) + 12, vl = (size_t)r->cfg->vsize;
  uint8_t *p = c->wbuf;
  size_t o = 0;
  if (r->cfg->redis) {
    static const char *const cmd[OP_N] = {"SET", "GET", "INCR"};
    o += (size_t)sprintf((char *)p, "*%d\r\n$%zu\r\n%s\r\n$%zu\r\n", op == OP_SET ? 3 : 2,
                         strlen(cmd[op]), cmd[op], kl);
    memcpy(p + o, kp, strlen(kp));
    c->doff = o + strlen(kp);
    o += kl;
    o += (size_t)sprintf((char *)p + o, "\r\n");
    if (op == OP_SET) {
      o += (size_t)sprintf((char *)p + o, "$%zu\r\n", vl);
      memcpy(p + o, r->val, vl);
      o += vl;
      o += (size_t)sprintf((char *)p + o, "\r\n");
    }
  } else {
    static const uint8_t code[OP_N] = {TDIST__OP_SET, TDIST__OP_GET, TDIST__OP_ADD};
    o = 4; /* length, patched below */
    p[o++] = code[op];
    if (op == OP_GET) { /* u64 timeout_ms = 0: the key exists, never wait */
      memset(p + o, 0, 8);
      o += 8;
    }
    o += put_u32(p + o, (uint32_t)kl);
    memcpy(p + o, kp, strlen(kp));
    c->doff = o + strlen(kp);
    o += kl;
    if (op == OP_SET) {
      o += put_u32(p + o, (uint32_t)vl);
      memcpy(p + o, r->val, vl);
      o += vl;
    } else if (op == OP_ADD) {
      int64_t one = 1;
      memcpy(p + o, &one, 8);
      o += 8;
    }
    put_u32(p, (uint32_t)(o - 4));
  }
  c->wlen = o;
}

static void put_digits(conn_t *c, uint64_t idx) {
  for (int i = 11; i >= 0; i--, idx /= 10)
    c->wbuf[c->doff + (size_t)i] = (uint8_t)('0' + idx % 10);
}

static int send_req(run_t *r, conn_t *c, int key) {
  c->key = key;
  put_digits(c, c->counter ? r->cbase + (uint64_t)key : (uint64_t)key);
  ssize_t w = send(c->fd, c->wbuf, c->wlen, MSG_NOSIGNAL);
  /* One small request on an otherwise idle socket always fits whole. */
  if (w != (ssize_t)c->wlen) return fail("send: %s (%d)", strerror(errno), (int)w);
  c->busy = 1;
  return 0;
}

static int next_key(conn_t *c) {
  c->rng ^= c->rng << 13;
  c->rng ^= c->rng >> 7;
  c->rng ^= c->rng << 17;
  return (int)(c->rng % SB_NKEYS);
}

/* ---- replies ----------------------------------------------------------------------- */

/* A RESP line's end within p[0..n): the index of '\r', or -1 when incomplete. */
static long crlf(const uint8_t *p, size_t n) {
  for (size_t i = 0; i + 1 < n; i++)
    if (p[i] == '\r' && p[i + 1] == '\n') return (long)i;
  return -1;
}

/* One reply to `op` at p[0..n): bytes consumed, 0 if incomplete, -1 if wrong. */
static long parse(int redis, int op, const uint8_t *p, size_t n, reply_t *rp) {
  if (redis) {
    long e = crlf(p, n);
    if (e < 0) return 0;
    if (e < 1) return fail("empty redis reply line");
    char line[64];
    snprintf(line, sizeof(line), "%.*s", (int)(e - 1 < 63 ? e - 1 : 63), (const char *)p + 1);
    if (p[0] == '-') return fail("redis error: %s", line);
    if (op == OP_SET)
      return p[0] == '+' && !strcmp(line, "OK") ? e + 2 : fail("SET reply '%s'", line);
    if (op == OP_ADD && p[0] == ':') return rp->num = strtoll(line, NULL, 10), e + 2;
    if (p[0] != '$') return fail("unexpected redis reply type '%c'", p[0]);
    long vl = strtol(line, NULL, 10);
    if (vl < 0) return fail("GET of a missing key");
    if ((size_t)(e + 2 + vl + 2) > n) return 0;
    rp->val = p + e + 2;
    rp->vlen = (size_t)vl;
    return e + 2 + vl + 2;
  }
  if (n < 5) return 0;
  uint32_t len;
  memcpy(&len, p, 4);
  if (len == 0 || len > RCAP - 4) return fail("reply frame length %u", len);
  if (n < 4 + (size_t)len) return 0;
  if (p[4] != TDIST__ST_OK) return fail("reply status %u (not OK)", p[4]);
  uint32_t vl;
  if (op == OP_SET && len != 1) return fail("SET reply of %u bytes", len);
  if (op == OP_ADD) {
    if (len != 9) return fail("ADD reply of %u bytes", len);
    memcpy(&rp->num, p + 5, 8);
  }
  if (op == OP_GET) {
    if (len < 5 || (memcpy(&vl, p + 5, 4), len != 5 + vl))
      return fail("GET reply of %u bytes", len);
    rp->val = p + 9;
    rp->vlen = vl;
  }
  return 4 + (long)len;
}

/* Read what c has and, if a whole reply is there, check it: 1 got one, 0 not
 * yet, -1 failure. */
static int on_readable(run_t *r, conn_t *c, int op, reply_t *rp) {
  ssize_t got = recv(c->fd, c->rbuf + c->rlen, RCAP - c->rlen, 0);
  if (got == 0) return fail("server closed the connection");
  if (got < 0) return errno == EAGAIN || errno == EINTR ? 0 : fail("recv: %s", strerror(errno));
  c->rlen += (size_t)got;
  long used = parse(r->cfg->redis, op, c->rbuf, c->rlen, rp);
  if (used <= 0) return (int)used;
  if ((size_t)used != c->rlen) return fail("bytes after the reply");
  c->rlen = 0;
  c->busy = 0;
  g_total++;
  if (op == OP_GET && !c->counter &&
      (rp->vlen != (size_t)r->cfg->vsize || memcmp(rp->val, r->val, rp->vlen)))
    return fail("GET returned a %zu-byte value that was not set", rp->vlen);
  if (op == OP_ADD && (rp->num < 1 || rp->num > (int64_t)r->added[c->key]))
    return fail("ADD returned %" PRId64 ", outside 1..adds made", rp->num);
  return 1;
}

/* One request on c, waiting for its reply (setup and verification). */
static int sync_call(run_t *r, conn_t *c, int op, int key, reply_t *rp) {
  if (send_req(r, c, key)) return -1;
  for (;;) {
    struct pollfd pf = {.fd = c->fd, .events = POLLIN};
    if (poll(&pf, 1, 10000) <= 0) return fail("no reply within 10 s");
    int rc = on_readable(r, c, op, rp);
    if (rc) return rc < 0 ? -1 : 0;
  }
}

/* ---- connections ------------------------------------------------------------------- */

static int open_conn(run_t *r, conn_t *c) {
  char ps[16];
  snprintf(ps, sizeof(ps), "%d", r->cfg->port);
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
  if (getaddrinfo(r->cfg->host, ps, &hints, &res) != 0)
    return fail("cannot resolve %s", r->cfg->host);
  c->fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int ok = c->fd >= 0 && connect(c->fd, res->ai_addr, res->ai_addrlen) == 0;
  freeaddrinfo(res);
  if (!ok) return fail("connect: %s", strerror(errno));
  int one = 1;
  setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  fcntl(c->fd, F_SETFL, fcntl(c->fd, F_GETFL) | O_NONBLOCK);
  if (!r->cfg->redis) { /* HELLO: u32 magic, u32 version, bytes token -> OK u32 version */
    const char *tok = getenv("TDIST_STORE_TOKEN");
    size_t tl = tok ? strlen(tok) : 0, o = 4;
    if (tl > TDIST__STORE_MAX_TOKEN) return fail("token too long");
    c->wbuf[o++] = TDIST__OP_HELLO;
    o += put_u32(c->wbuf + o, TDIST__STORE_MAGIC);
    o += put_u32(c->wbuf + o, TDIST__STORE_VERSION);
    o += put_u32(c->wbuf + o, (uint32_t)tl);
    memcpy(c->wbuf + o, tok ? tok : "", tl);
    o += tl;
    put_u32(c->wbuf, (uint32_t)(o - 4));
    uint8_t want[9] = {5, 0, 0, 0, TDIST__ST_OK};
    put_u32(want + 5, TDIST__STORE_VERSION);
    size_t got = 0;
    if (send(c->fd, c->wbuf, o, MSG_NOSIGNAL) != (ssize_t)o) return fail("send HELLO");
    while (got < 9) {
      struct pollfd pf = {.fd = c->fd, .events = POLLIN};
      ssize_t n = poll(&pf, 1, 10000) == 1 ? recv(c->fd, c->rbuf + got, 9 - got, 0) : 0;
      if (n <= 0) return fail("no HELLO reply");
      got += (size_t)n;
    }
    if (memcmp(c->rbuf, want, 9)) return fail("HELLO refused");
  }
  struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
  return epoll_ctl(r->ep, EPOLL_CTL_ADD, c->fd, &ev) ? fail("epoll_ctl: %s", strerror(errno)) : 0;
}

/* ---- the measured loop ------------------------------------------------------------- */

/* Drive op on every connection; returns completed requests per second over
 * the measured interval, or -1. */
static double run_op(run_t *r, int op) {
  struct epoll_event evs[256];
  double t_start = sb_now(), t_meas = t_start + r->cfg->warmup;
  double t_end = t_meas + r->cfg->seconds, t0 = 0, t1 = 0;
  uint64_t d0 = 0, d1 = 0;
  int measuring = 0, stopping = 0, busy = 0;
  for (int i = 0; i < r->n; i++) {
    build(r, &r->conns[i], op, op == OP_ADD);
    int k = next_key(&r->conns[i]);
    if (op == OP_ADD) r->added[k]++;
    if (send_req(r, &r->conns[i], k)) return -1;
    busy++;
  }
  while (busy > 0) {
    double now = sb_now();
    if (!measuring && now >= t_meas) measuring = 1, t0 = now, d0 = r->done;
    if (!stopping && now >= t_end) stopping = 1, t1 = now, d1 = r->done;
    if (stopping && now > t_end + 10)
      return fail("%d requests unanswered 10 s after the run", busy), -1;
    double until = stopping ? t_end + 10 : measuring ? t_end : t_meas;
    int ms = (int)((until - now) * 1000) + 1;
    int ne = epoll_wait(r->ep, evs, 256, ms);
    if (ne < 0 && errno != EINTR) return fail("epoll_wait: %s", strerror(errno)), -1;
    for (int i = 0; i < ne; i++) {
      conn_t *c = evs[i].data.ptr;
      reply_t rp;
      int rc = on_readable(r, c, op, &rp);
      if (rc < 0) return -1;
      if (rc == 0) continue;
      r->done++;
      busy--;
      if (stopping) continue;
      int k = next_key(c);
      if (op == OP_ADD) r->added[k]++;
      if (send_req(r, c, k)) return -1;
      busy++;
    }
  }
  return (double)(d1 - d0) / (t1 - t0);
}

int sb_evloop_run(const sb_cfg_t *cfg, int clients) {
  static uint64_t calls;
  run_t r = {.cfg = cfg, .n = clients, .ep = -1};
  int rc = -1;
  memset(r.val, 'x', sizeof(r.val));
  r.conns = calloc((size_t)clients, sizeof(*r.conns));
  r.added = calloc(SB_NKEYS, sizeof(*r.added));
  r.cbase = ((uint64_t)getpid() * 7919u + (uint64_t)time(NULL)) % 900000000u * 1000u +
            (calls++ % 1000u) * SB_NKEYS;
  r.cbase %= 999999000000ull; /* stays 12 digits */
  if (!r.conns || !r.added || (r.ep = epoll_create1(EPOLL_CLOEXEC)) < 0) goto out;
  for (int i = 0; i < clients; i++)
    r.conns[i].fd = -1;
  for (int i = 0; i < clients; i++) {
    r.conns[i].rng = 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1) ^ (uint64_t)(sb_now() * 1e9);
    if (open_conn(&r, &r.conns[i])) goto out;
  }
  reply_t rp;
  build(&r, &r.conns[0], OP_SET, 0); /* every GET must hit: set all keys first */
  for (int k = 0; k < SB_NKEYS; k++)
    if (sync_call(&r, &r.conns[0], OP_SET, k, &rp)) goto out;
  for (int op = 0; op < OP_N; op++) {
    double ops = run_op(&r, op);
    if (ops < 0) goto out;
    printf("%s %d %.0f ops/s\n", op_names[op], clients, ops);
    fflush(stdout);
  }
  /* Each counter must hold exactly the adds made to it. */
  build(&r, &r.conns[0], OP_GET, 1);
  for (int k = 0; k < SB_NKEYS; k++) {
    char want[24];
    if (!r.added[k]) continue;
    if (sync_call(&r, &r.conns[0], OP_GET, k, &rp)) goto out;
    snprintf(want, sizeof(want), "%" PRIu32, r.added[k]);
    if (rp.vlen != strlen(want) || memcmp(rp.val, want, rp.vlen)) {
      fail("counter %d does not hold the adds made to it", k);
      goto out;
    }
  }
  rc = 0;
out:
  if (rc)
    fprintf(stderr, "store_bench (%s, %d clients): %s\n", cfg->redis ? "redis" : "tdist", clients,
            g_why);
  for (int i = 0; r.conns && i < clients; i++)
    if (r.conns[i].fd >= 0) close(r.conns[i].fd);
  if (r.ep >= 0) close(r.ep);
  free(r.conns);
  free(r.added);
  return rc;
}
