/*
 * tcp.c - the TCP store client: connect with jittered exponential backoff
 * until the timeout (or to the host agent that forwards to the store), the
 * handshake, and one request/reply exchange at a time
 * on a non-blocking socket whose waits use poll() with a deadline.
 *
 * Threads: any; `mu` serialises calls on the connection (one request in
 * flight, so a reply is never mixed with another's). After a transport
 * failure or a client-side deadline the stream is out of step; the socket is
 * closed and later calls fail with TDIST_ERR_CLOSED.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "util/alloc.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/param.h"
#include "util/unixsock.h"
#include "store/store_impl.h"

/* Extra time a waiting request gets beyond its server-side timeout before the
 * client gives up on the server itself: as long as the wait, between 1 and
 * 10 s (a live server answers an expired wait at once; the monitor's short
 * waits must not hold a shutdown for 10 s when the server is stopped). */
#define REPLY_GRACE_MIN_MS 1000
#define REPLY_GRACE_MAX_MS 10000

static int64_t reply_grace(int64_t wait_ms) {
  return wait_ms < REPLY_GRACE_MIN_MS   ? REPLY_GRACE_MIN_MS
         : wait_ms > REPLY_GRACE_MAX_MS ? REPLY_GRACE_MAX_MS
                                        : wait_ms;
}

typedef struct tcp_store {
  struct tdist_store base; /* first: a tdist_store_t* is a tcp_store* */
  pthread_mutex_t mu;
  int fd;        /* -1 once broken */
  char why[200]; /* (mu) the failure that broke it: later calls name it */
} tcp_store_t;

/* Wait for `events` on fd until deadline_ms; 0 ready, TDIST_ERR_TIMEOUT, TDIST_ERR_IO.
 * Past the deadline it still looks once without waiting: a thread that was
 * not scheduled until after the deadline (a loaded host) takes a reply that
 * arrived in time instead of dropping the connection over it. */
static int wait_fd(int fd, short events, int64_t deadline_ms) {
  for (;;) {
    int64_t left = deadline_ms - tdist__now_ms();
    struct pollfd p = {.fd = fd, .events = events};
    int n = poll(&p, 1, left <= 0 ? 0 : left > 1000000 ? 1000000 : (int)left);
    if (n > 0) return 0;
    if (n < 0 && errno != EINTR) return TDIST_ERR_IO;
    if (left <= 0 && n == 0) return TDIST_ERR_TIMEOUT;
  }
}

static int send_all(int fd, const uint8_t *p, size_t n, int64_t deadline_ms) {
  while (n) {
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w > 0) {
      p += w;
      n -= (size_t)w;
    } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      int rc = wait_fd(fd, POLLOUT, deadline_ms);
      if (rc) return rc;
    } else if (w < 0 && errno == EINTR) {
      continue;
    } else {
      return TDIST_ERR_CLOSED;
    }
  }
  return 0;
}

/* Read one reply frame; leave its body at rep->p[0..rep->len). */
static int recv_frame(int fd, tdist__buf_t *rep, int64_t deadline_ms) {
  size_t got = 0, want = 4;
  rep->len = 0;
  if (tdist__buf_reserve(rep, 4096)) return TDIST_ERR_NO_MEMORY;
  for (;;) {
    while (got < want) {
      ssize_t r = recv(fd, rep->p + got, rep->cap - got, 0);
      if (r > 0) {
        got += (size_t)r;
      } else if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        int rc = wait_fd(fd, POLLIN, deadline_ms);
        if (rc) return rc;
      } else if (r < 0 && errno == EINTR) {
        continue;
      } else {
        return TDIST_ERR_CLOSED; /* EOF or reset */
      }
    }
    if (want > 4) break;
    uint32_t len;
    memcpy(&len, rep->p, 4);
    if (len == 0 || len > TDIST__STORE_MAX_FRAME + 64) return TDIST_ERR_PROTOCOL;
    want = 4 + (size_t)len;
    if (rep->cap < want) {
      rep->len = got;
      if (tdist__buf_reserve(rep, want - got)) return TDIST_ERR_NO_MEMORY;
    }
    if (got >= want) break;
  }
  if (got != want) return TDIST_ERR_PROTOCOL; /* bytes beyond the one reply */
  memmove(rep->p, rep->p + 4, want - 4);
  rep->len = want - 4;
  return 0;
}

static void tcp_close(tdist_store_t *s) {
  tcp_store_t *t = (tcp_store_t *)s;
  if (t->fd >= 0) close(t->fd);
  pthread_mutex_destroy(&t->mu);
  tdist__free(t->base.token);
  tdist__free(t->base.agent);
  tdist__free(t);
}

static int tcp_call(tdist_store_t *s, const tdist__buf_t *req, tdist__buf_t *rep, int64_t wait_ms,
                    const char *what, const char *key) {
  tcp_store_t *t = (tcp_store_t *)s;
  int rc;
  pthread_mutex_lock(&t->mu);
  if (t->fd < 0) {
    char why[sizeof(t->why)];
    snprintf(why, sizeof(why), "%s", t->why);
    pthread_mutex_unlock(&t->mu);
    return tdist__error(TDIST_ERR_CLOSED,
                        "store %s '%s': connection to %s was closed by an "
                        "earlier failure (%s)",
                        what, key, s->address, why[0] ? why : "unknown");
  }
  /* The deadline counts from here, not from before the lock: a call that
   * waited for another thread's call on this connection (a wait of many
   * seconds) must not time out unsent and break the connection for all. */
  int64_t t0 = tdist__now_ms();
  int64_t deadline = t0 + (wait_ms > 0 ? wait_ms + reply_grace(wait_ms) : s->timeout_ms);
  rc = send_all(t->fd, req->p, req->len, deadline);
  if (rc == 0) rc = recv_frame(t->fd, rep, deadline);
  int64_t waited = tdist__now_ms() - t0;
  if (rc) {
    close(t->fd);
    t->fd = -1;
    atomic_store_explicit(&s->broken, 1, memory_order_relaxed);
    snprintf(t->why, sizeof(t->why), "%s '%.60s' %s after %" PRId64 " ms", what, key,
             rc == TDIST_ERR_TIMEOUT  ? "had no reply"
             : rc == TDIST_ERR_CLOSED ? "saw the server close it"
                                      : tdist_strerror(rc),
             waited);
  }
  pthread_mutex_unlock(&t->mu);
  if (rc == 0) return 0;
  switch (rc) {
  case TDIST_ERR_TIMEOUT:
    return tdist__error(rc, "store %s '%s' from %s timed out after %" PRId64 " ms (no reply)", what,
                        key, s->address, waited);
  case TDIST_ERR_CLOSED:
    return tdist__error(rc, "store %s '%s': server %s closed the connection after %" PRId64 " ms",
                        what, key, s->address, waited);
  case TDIST_ERR_NO_MEMORY:
    return tdist__error(rc, "store %s '%s': out of memory for the reply from %s", what, key,
                        s->address);
  default:
    return tdist__error(rc, "store %s '%s': %s from %s after %" PRId64 " ms", what, key,
                        tdist_strerror(rc), s->address, waited);
  }
}

static const tdist__store_vt_t tcp_vt = {tcp_call, tcp_close, NULL}; /* add is one op */

/* One attempt: a connected non-blocking socket, or -1 with errno-ish cause. */
static int connect_once(const char *host, int port, int64_t deadline_ms) {
  char ps[16];
  snprintf(ps, sizeof(ps), "%d", port);
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
  if (getaddrinfo(host, ps, &hints, &res) != 0) return -1;
  int fd = -1;
  for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    int err = 0;
    socklen_t el = sizeof(err);
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0 &&
        (errno != EINPROGRESS || wait_fd(fd, POLLOUT, deadline_ms) != 0 ||
         getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0 || err != 0)) {
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(res);
  if (fd >= 0) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  return fd;
}

/* Send HELLO and read the answer: 0, TDIST_ERR_AUTH, TDIST_ERR_PROTOCOL,
 * TDIST_ERR_STORE_ERROR (the server had no descriptor for this connection:
 * its message in busy[busy_len]), or a transport error (retryable). */
static int handshake(int fd, const char *pre, const char *token, int64_t deadline_ms,
                     uint32_t *server_version, char *busy, size_t busy_len) {
  tdist__buf_t b = {0};
  size_t tl = token ? strlen(token) : 0, pl = pre ? strlen(pre) : 0;
  int rc = tdist__buf_reserve(&b, 32 + tl + pl);
  if (rc) return rc;
  tdist__put(&b, pre, pl); /* the agent's "store" line: one write with the HELLO */
  size_t f = tdist__frame_begin(&b, TDIST__OP_HELLO);
  tdist__put_u32(&b, TDIST__STORE_MAGIC);
  tdist__put_u32(&b, TDIST__STORE_VERSION);
  tdist__put_bytes(&b, token, (uint32_t)tl);
  tdist__frame_end(&b, f);
  rc = send_all(fd, b.p, b.len, deadline_ms);
  /* A server out of descriptors sends BUSY unasked and closes: the frame may
   * be waiting even when the HELLO could not be sent. */
  if (rc == 0 || rc == TDIST_ERR_CLOSED) rc = recv_frame(fd, &b, deadline_ms);
  if (rc == 0 && b.p[0] == TDIST__ST_BUSY) {
    tdist__rd_t r = {b.p, b.len, 1};
    const uint8_t *m = (const uint8_t *)"";
    uint32_t ml = 0;
    tdist__get_bytes(&r, &m, &ml, 4096);
    snprintf(busy, busy_len, "%.*s", (int)ml, (const char *)m);
    rc = TDIST_ERR_STORE_ERROR;
  } else if (rc == 0) {
    tdist__rd_t r = {b.p, b.len, 1};
    *server_version = 0;
    tdist__get_u32(&r, server_version);
    rc = b.p[0] == TDIST__ST_OK        ? 0
         : b.p[0] == TDIST__ST_AUTH    ? TDIST_ERR_AUTH
         : b.p[0] == TDIST__ST_VERSION ? TDIST_ERR_PROTOCOL
                                       : TDIST_ERR_PROTOCOL;
  }
  tdist__buf_free(&b);
  return rc;
}

/* The token from opts, else TDIST_STORE_TOKEN; NULL when none. An error
 * for one that is too long. */
static int opts_token(const tdist_store_opts_t *opts, const char **token) {
  *token = (opts && (opts->mask & TDIST_STORE_FIELD_TOKEN))
               ? opts->token
               : tdist__param_str("TDIST_STORE_TOKEN", NULL);
  if (*token && strlen(*token) > TDIST__STORE_MAX_TOKEN)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "store token longer than %d bytes",
                        TDIST__STORE_MAX_TOKEN);
  return 0;
}

/* The handle over connected, handshaken fd (taken in all cases). */
static int make_store(int fd, const char *address, const char *token, const char *agent,
                      int64_t timeout, tdist_store_t **store) {
  tcp_store_t *t = tdist__calloc(1, sizeof(*t));
  if (!t) goto nomem;
  tdist__store_init_root(&t->base, &tcp_vt, timeout);
  snprintf(t->base.address, sizeof(t->base.address), "%s", address);
  if (token && *token && !(t->base.token = tdist__strdup(token))) goto nomem;
  if (agent && !(t->base.agent = tdist__strdup(agent))) goto nomem;
  pthread_mutex_init(&t->mu, NULL);
  t->fd = fd;
  *store = &t->base;
  return 0;
nomem:
  close(fd);
  if (t) tdist__free(t->base.token);
  tdist__free(t);
  return tdist__error(TDIST_ERR_NO_MEMORY, "store connect: out of memory");
}

int tdist__store_connect_agent(const char *agent, const char *address,
                               const tdist_store_opts_t *opts, tdist_store_t **store) {
  const char *token = NULL;
  TDIST_CHECK(opts_token(opts, &token));
  int64_t timeout = tdist__store_opts_timeout(opts);
  int64_t deadline = tdist__now_ms() + (timeout < 10000 ? timeout : 10000);
  uint32_t sv = 0;
  char busy[320] = "";
  int fd = tdist__unix_connect(agent, 0), rc = TDIST_ERR_CLOSED;
  if (fd < 0)
    return tdist__error(TDIST_ERR_CLOSED, "store %s through the host agent %s: connect: %s",
                        address, agent, strerror(errno));
  /* "store": the frames that follow are the store protocol's (not the
   * agent's line protocol of heartbeats and the rendezvous). */
  if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) == 0)
    rc = handshake(fd, "store\n", token, deadline, &sv, busy, sizeof(busy));
  if (rc) {
    close(fd);
    return tdist__error(rc, "store %s through the host agent %s: handshake: %s%s%s", address, agent,
                        tdist_strerror(rc), *busy ? ": " : "", busy);
  }
  TDIST_TRACE(STORE, "connected to store %s through the host agent %s", address, agent);
  return make_store(fd, address, token, agent, timeout, store);
}

int tdist_store_connect(const char *host, int port, const tdist_store_opts_t *opts,
                        tdist_store_t **store) {
  if (!host || !*host || port <= 0 || port > 65535 || !store)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "store connect: bad address '%s:%d'",
                        host ? host : "(null)", port);
  const char *token = NULL;
  TDIST_CHECK(opts_token(opts, &token));
  int64_t timeout = tdist__store_opts_timeout(opts);
  int64_t t0 = tdist__now_ms(), deadline = t0 + timeout;
  unsigned seed = (unsigned)(getpid() ^ t0 ^ (uintptr_t)store);
  int64_t backoff = 10;
  int attempts = 0, rc = TDIST_ERR_TIMEOUT, fd = -1;
  uint32_t sv = 0;
  char busy[320] = "";
  for (;;) {
    attempts++;
    fd = connect_once(host, port, deadline);
    if (fd >= 0) {
      rc = handshake(fd, NULL, token, deadline, &sv, busy, sizeof(busy));
      if (rc == 0) break;
      close(fd);
      fd = -1;
      /* Not retried: the server stays out of descriptors until connections
       * close, and a retry loop across thousands of ranks would hide it. */
      if (rc == TDIST_ERR_STORE_ERROR)
        return tdist__error(rc, "store connect to %s:%d refused: %s", host, port, busy);
      if (rc == TDIST_ERR_AUTH)
        return tdist__error(rc,
                            "store server %s:%d refused the token (set TDIST_STORE_TOKEN to "
                            "the server's)",
                            host, port);
      if (rc == TDIST_ERR_PROTOCOL)
        return tdist__error(rc, "store server %s:%d speaks protocol version %u, this client %u",
                            host, port, sv, TDIST__STORE_VERSION);
    }
    int64_t now = tdist__now_ms();
    if (now >= deadline)
      return tdist__error(TDIST_ERR_TIMEOUT,
                          "store connect to %s:%d timed out after %" PRId64 " ms (%d attempts)",
                          host, port, now - t0, attempts);
    /* Jitter in [backoff/2, backoff*3/2) so a thousand ranks do not retry in step. */
    int64_t d = backoff / 2 + (int64_t)(rand_r(&seed) % (unsigned)(backoff + 1));
    if (d > deadline - now) d = deadline - now;
    struct timespec ts = {d / 1000, (d % 1000) * 1000000};
    nanosleep(&ts, NULL);
    if (backoff < 1000) backoff *= 2;
  }
  char address[280];
  snprintf(address, sizeof(address), "%s:%d", host, port);
  TDIST_TRACE(STORE, "connected to store %s after %d attempt(s)", address, attempts);
  return make_store(fd, address, token, NULL, timeout, store);
}
