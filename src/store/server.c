/*
 * server.c - the TCP store server: one thread running its own libuv loop,
 * serving every client connection from it (no per-client threads).
 *
 * Per connection: a read buffer framed incrementally ([u32 len][body]); the
 * first frame must be HELLO (magic, version, token). Requests run through
 * kv.c; replies collect in `out` and leave in one write per batch (uv_try_write,
 * then uv_write for what remains). Anything malformed, oversized or out of
 * order closes that connection, with the reason logged at WARN; other clients
 * are not affected.
 *
 * Waiting: a get/wait/multi_get whose keys are missing leaves its frame at
 * the head of the read buffer, links a waiter onto each missing key's entry
 * and arms the connection's timer with the request's timeout. A write to such
 * a key (kv->on_write) puts the waiting connections on the ready list; the
 * list is drained at the end of the callback that made the write, and each
 * connection re-runs its head frame (blocking again if another key is still
 * missing). The timer re-runs it with `final` set, which answers TIMEOUT.
 * Nothing polls. While blocked, a connection keeps reading (so a disconnect
 * is seen and its waiters are freed) but runs no further frames.
 *
 * Liveness (liveness.h): every write of a heartbeat key is reported to the
 * dead-rank detector with its connection, and conn_close(), the single place
 * a connection ends, reports the close, so a rank whose connection drops
 * without a "bye" is declared dead at once.
 *
 * Threads: start/stop/port/num_keys on any thread; everything else on the
 * server thread. stop wakes the loop with a uv_async.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <uv.h>

#include "util/alloc.h"
#include "util/error.h"
#include "util/param.h"
#include "store/kv.h"
#include "store/liveness.h"

#define READ_CHUNK (64 * 1024)
/* Most bytes buffered for one connection: one maximal frame plus slack. */
#define MAX_BUFFERED ((size_t)TDIST__STORE_MAX_FRAME + 4 + READ_CHUNK)

typedef struct conn conn_t;

typedef struct waiter {
  conn_t *c;
  tdist__kv_entry_t *e;
  struct waiter *prev, *next; /* in e->waiters */
  struct waiter *cnext;       /* in c->waiters */
} waiter_t;

struct conn {
  uv_tcp_t tcp;
  uv_timer_t timer;
  uv_write_t wreq;
  struct tdist_store_server *srv;
  conn_t *prev, *next; /* all connections */
  uint8_t *rbuf;
  size_t rlen, rcap, rpos; /* unprocessed bytes are rbuf[rpos..rlen) */
  tdist__buf_t out;        /* replies not yet handed to the kernel */
  tdist__buf_t wbuf;       /* the bytes of the uv_write in flight */
  int writing, authed, closing, close_after_flush, handles_open;
  int blocked, timer_armed, final;
  waiter_t *waiters;
  conn_t *ready_next;
  int in_ready;
  char peer[64];
};

struct tdist_store_server {
  uv_loop_t loop;
  uv_tcp_t listener;
  uv_async_t stop_async;
  pthread_t thread;
  tdist__kv_t kv;
  conn_t *conns;
  conn_t *ready_head, *ready_tail;
  char *token;
  int port;
  tdist__live_t *live; /* dead-rank detector, or NULL */
  /* WARN lines about clients, rate-limited (warn_client): at most
   * WARN_BURST per WARN_WINDOW_MS, then one summary of what was held back. */
  uint64_t warn_window_start;
  int warn_in_window, warn_held;
  conn_t *current; /* connection whose request is executing */
  int stopping;
  _Atomic int64_t num_keys; /* mirror of kv.npresent for other threads */
};

static void conn_process(conn_t *c);

#define WARN_BURST 10
#define WARN_WINDOW_MS 10000

/* A WARN line about a client (refused, malformed, dropped). An
 * unauthenticated client that reconnects in a loop must not fill the log:
 * past WARN_BURST lines in a window the lines are counted, and the first
 * line of the next window says how many were held back. */
static void warn_client(struct tdist_store_server *srv, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void warn_client(struct tdist_store_server *srv, const char *fmt, ...) {
  uint64_t now = uv_now(&srv->loop);
  if (now - srv->warn_window_start >= WARN_WINDOW_MS) {
    if (srv->warn_held)
      TDIST_WARN(STORE, "store server: %d more client warnings held back in the last %d s",
                 srv->warn_held, WARN_WINDOW_MS / 1000);
    srv->warn_window_start = now;
    srv->warn_in_window = 0;
    srv->warn_held = 0;
  }
  if (srv->warn_in_window >= WARN_BURST) {
    srv->warn_held++;
    return;
  }
  srv->warn_in_window++;
  char line[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof(line), fmt, ap);
  va_end(ap);
  TDIST_WARN(STORE, "store server: %s%s", line,
             srv->warn_in_window == WARN_BURST ? " (further client warnings are counted)" : "");
}

/* ---- waiters ---------------------------------------------------------------- */

static int on_missing(void *ctx, tdist__kv_entry_t *e) {
  conn_t *c = ctx;
  waiter_t *w = tdist__malloc(sizeof(*w));
  if (!w) return -1;
  w->c = c;
  w->e = e;
  w->prev = NULL;
  w->next = e->waiters;
  if (w->next) w->next->prev = w;
  e->waiters = w;
  w->cnext = c->waiters;
  c->waiters = w;
  return 0;
}

/* Unlink and free every waiter of c; drop placeholders nobody needs. */
static void conn_unwait(conn_t *c) {
  waiter_t *w = c->waiters;
  while (w) {
    waiter_t *next = w->cnext;
    if (w->prev)
      w->prev->next = w->next;
    else
      w->e->waiters = w->next;
    if (w->next) w->next->prev = w->prev;
    tdist__kv_drop_if_unused(&c->srv->kv, w->e);
    tdist__free(w);
    w = next;
  }
  c->waiters = NULL;
}

static void make_ready(struct tdist_store_server *srv, conn_t *c) {
  if (c->in_ready || c->closing) return;
  c->in_ready = 1;
  c->ready_next = NULL;
  if (srv->ready_tail)
    srv->ready_tail->ready_next = c;
  else
    srv->ready_head = c;
  srv->ready_tail = c;
}

static void on_write(void *ctx, tdist__kv_entry_t *e) {
  struct tdist_store_server *srv = ctx;
  for (waiter_t *w = e->waiters; w; w = w->next)
    make_ready(srv, w->c);
  tdist__live_on_write(srv->live, e, srv->current);
}

/* Run every woken connection; they may wake others, which join the list. */
static void drain_ready(struct tdist_store_server *srv) {
  while (srv->ready_head) {
    conn_t *c = srv->ready_head;
    srv->ready_head = c->ready_next;
    if (!srv->ready_head) srv->ready_tail = NULL;
    c->in_ready = 0;
    if (c->closing || !c->blocked) continue;
    conn_unwait(c);
    c->blocked = 0;
    conn_process(c);
  }
  atomic_store_explicit(&srv->num_keys, srv->kv.npresent, memory_order_relaxed);
}

/* After the detector's scan declared deaths: the monitors waiting for those
 * records are woken now, not at the next request that drains the list. */
static void on_declared(void *arg) { drain_ready(arg); }

/* ---- connection lifetime -------------------------------------------------------- */

static void on_handle_closed(uv_handle_t *h) {
  conn_t *c = h->data;
  if (--c->handles_open > 0) return;
  tdist__free(c->rbuf);
  tdist__buf_free(&c->out);
  tdist__buf_free(&c->wbuf);
  tdist__free(c);
}

/* The one place a connection ends (see the liveness note above). */
static void conn_close(conn_t *c, const char *why) {
  if (c->closing) return;
  if (why) warn_client(c->srv, "closing connection from %s: %s", c->peer, why);
  c->closing = 1;
  conn_unwait(c);
  struct tdist_store_server *srv = c->srv;
  if (!srv->stopping) {
    tdist__live_on_close(srv->live, c);
    drain_ready(srv); /* a death record wakes the monitors waiting for it */
  }
  if (c->prev)
    c->prev->next = c->next;
  else
    srv->conns = c->next;
  if (c->next) c->next->prev = c->prev;
  uv_close((uv_handle_t *)&c->timer, on_handle_closed);
  uv_close((uv_handle_t *)&c->tcp, on_handle_closed);
}

static void conn_flush(conn_t *c);

static void on_written(uv_write_t *req, int status) {
  conn_t *c = req->data;
  c->writing = 0;
  c->wbuf.len = 0;
  if (c->closing) return;
  if (status < 0) {
    conn_close(c, NULL); /* the peer went away; nothing to report */
    return;
  }
  conn_flush(c);
}

static void conn_flush(conn_t *c) {
  if (c->closing || c->writing) return;
  if (c->out.len == 0) {
    if (c->close_after_flush) conn_close(c, NULL);
    return;
  }
  uv_buf_t b = uv_buf_init((char *)c->out.p, (unsigned)c->out.len);
  int n = uv_try_write((uv_stream_t *)&c->tcp, &b, 1);
  if (n == (int)c->out.len) {
    c->out.len = 0;
    if (c->close_after_flush) conn_close(c, NULL);
    return;
  }
  if (n < 0 && n != UV_EAGAIN) {
    conn_close(c, NULL);
    return;
  }
  if (n < 0) n = 0;
  /* Hand the rest to uv_write from wbuf; `out` collects the next batch. */
  tdist__buf_t t = c->wbuf;
  c->wbuf = c->out;
  c->out = t;
  c->out.len = 0;
  b = uv_buf_init((char *)c->wbuf.p + n, (unsigned)(c->wbuf.len - (size_t)n));
  c->wreq.data = c;
  if (uv_write(&c->wreq, (uv_stream_t *)&c->tcp, &b, 1, on_written) != 0) {
    conn_close(c, NULL);
    return;
  }
  c->writing = 1;
}

/* ---- requests ------------------------------------------------------------------- */

static int reply_status(conn_t *c, uint8_t st, uint32_t extra) {
  if (tdist__buf_reserve(&c->out, 9)) return -1;
  size_t f = tdist__frame_begin(&c->out, st);
  tdist__put_u32(&c->out, extra);
  tdist__frame_end(&c->out, f);
  return 0;
}

/* HELLO: 0 accepted; -1 close now (malformed); 1 refused (reply, then close). */
static int handle_hello(conn_t *c, const uint8_t *body, size_t n, const char **why) {
  tdist__rd_t r = {body, n, 0};
  uint8_t op;
  uint32_t magic, ver;
  const uint8_t *tok;
  uint32_t tl;
  if (tdist__get_u8(&r, &op) || op != TDIST__OP_HELLO) return *why = "no handshake", -1;
  if (tdist__get_u32(&r, &magic) || magic != TDIST__STORE_MAGIC) return *why = "bad magic", -1;
  if (tdist__get_u32(&r, &ver) || tdist__get_bytes(&r, &tok, &tl, TDIST__STORE_MAX_TOKEN) ||
      r.off != r.n)
    return *why = "malformed handshake", -1;
  if (ver != TDIST__STORE_VERSION) {
    warn_client(c->srv, "client %s speaks protocol %u, server %u", c->peer, ver,
                TDIST__STORE_VERSION);
    reply_status(c, TDIST__ST_VERSION, TDIST__STORE_VERSION);
    return 1;
  }
  const char *want = c->srv->token;
  size_t wl = want ? strlen(want) : 0;
  unsigned diff = (unsigned)(wl ^ tl);
  for (size_t i = 0; i < wl && i < tl; i++)
    diff |= (unsigned)(want[i] ^ tok[i]);
  if (want && diff) {
    warn_client(c->srv, "client %s refused: wrong or missing token", c->peer);
    reply_status(c, TDIST__ST_AUTH, 0);
    return 1;
  }
  c->authed = 1;
  return reply_status(c, TDIST__ST_OK, TDIST__STORE_VERSION);
}

static void on_timer(uv_timer_t *t) {
  conn_t *c = t->data;
  c->timer_armed = 0;
  if (!c->blocked || c->closing) return;
  conn_unwait(c);
  c->blocked = 0;
  c->final = 1; /* re-run the head frame once more: it answers TIMEOUT */
  conn_process(c);
  c->final = 0;
  drain_ready(c->srv);
}

/* Run complete frames until the buffer runs dry or a request blocks. */
static void conn_process(conn_t *c) {
  struct tdist_store_server *srv = c->srv;
  char why_buf[96];
  while (!c->blocked && !c->closing && !c->close_after_flush) {
    size_t avail = c->rlen - c->rpos;
    if (avail < 4) break;
    uint32_t len;
    memcpy(&len, c->rbuf + c->rpos, 4);
    if (len == 0 || len > TDIST__STORE_MAX_FRAME) {
      snprintf(why_buf, sizeof(why_buf), "frame length %u outside 1..%u", len,
               TDIST__STORE_MAX_FRAME);
      conn_close(c, why_buf);
      return;
    }
    if (avail - 4 < len) break;
    const uint8_t *body = c->rbuf + c->rpos + 4;
    const char *why = NULL;
    if (!c->authed) {
      int h = handle_hello(c, body, len, &why);
      if (h < 0) {
        conn_close(c, why);
        return;
      }
      if (h > 0) c->close_after_flush = 1;
    } else {
      tdist__exec_t x = {.final = c->final, .on_missing = on_missing, .ctx = c};
      srv->current = c;
      int rc = tdist__kv_exec(&srv->kv, body, len, &c->out, &x);
      srv->current = NULL;
      if (rc == TDIST__EXEC_BLOCKED) {
        c->blocked = 1;
        if (!c->timer_armed) {
          uv_timer_start(&c->timer, on_timer, x.timeout_ms, 0);
          c->timer_armed = 1;
        }
        break;
      }
      if (rc != TDIST__EXEC_DONE) {
        snprintf(why_buf, sizeof(why_buf), "%s request: %s",
                 tdist__store_op_name(len ? body[0] : 0),
                 rc == TDIST__EXEC_NOMEM ? "out of memory" : x.why);
        conn_close(c, why_buf);
        return;
      }
      if (c->timer_armed) {
        uv_timer_stop(&c->timer);
        c->timer_armed = 0;
      }
    }
    c->rpos += 4 + (size_t)len;
  }
  if (c->rpos == c->rlen) c->rpos = c->rlen = 0;
  /* before the replies leave, so a client that saw its write also sees it counted */
  atomic_store_explicit(&srv->num_keys, srv->kv.npresent, memory_order_relaxed);
  conn_flush(c);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  conn_t *c = h->data;
  if (c->rcap - c->rlen < 4096) {
    if (c->rpos > 0) { /* compact: the unprocessed bytes move to the front */
      memmove(c->rbuf, c->rbuf + c->rpos, c->rlen - c->rpos);
      c->rlen -= c->rpos;
      c->rpos = 0;
    }
    if (c->rcap - c->rlen < 4096 && c->rcap < MAX_BUFFERED) {
      size_t cap = c->rcap ? c->rcap * 2 : 16384;
      if (cap > MAX_BUFFERED) cap = MAX_BUFFERED;
      uint8_t *p = tdist__realloc(c->rbuf, cap);
      if (p) {
        c->rbuf = p;
        c->rcap = cap;
      }
    }
  }
  *buf = uv_buf_init((char *)c->rbuf + c->rlen, (unsigned)(c->rcap - c->rlen));
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf) {
  conn_t *c = s->data;
  if (n < 0) {
    conn_close(c, n == UV_EOF || n == UV_ECONNRESET ? NULL : uv_strerror((int)n));
    drain_ready(c->srv);
    return;
  }
  if (n == 0) {
    if (buf->len == 0) conn_close(c, "buffered data exceeds the frame limit");
    return;
  }
  c->rlen += (size_t)n;
  conn_process(c);
  drain_ready(c->srv);
}

static void on_connection(uv_stream_t *l, int status) {
  struct tdist_store_server *srv = l->data;
  if (status < 0) {
    TDIST_WARN(STORE, "store server: accept failed: %s", uv_strerror(status));
    return;
  }
  conn_t *c = tdist__calloc(1, sizeof(*c));
  if (!c) {
    TDIST_WARN(STORE, "store server: out of memory for a new connection");
    return;
  }
  c->srv = srv;
  uv_tcp_init(&srv->loop, &c->tcp);
  uv_timer_init(&srv->loop, &c->timer);
  c->tcp.data = c->timer.data = c;
  c->handles_open = 2;
  c->next = srv->conns;
  if (c->next) c->next->prev = c;
  srv->conns = c;
  if (uv_accept(l, (uv_stream_t *)&c->tcp) != 0) {
    conn_close(c, "accept failed");
    return;
  }
  uv_tcp_nodelay(&c->tcp, 1);
  struct sockaddr_storage ss;
  int sl = sizeof(ss);
  snprintf(c->peer, sizeof(c->peer), "?");
  if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&ss, &sl) == 0) {
    char ip[48] = "?";
    int port = 0;
    if (ss.ss_family == AF_INET) {
      uv_ip4_name((struct sockaddr_in *)&ss, ip, sizeof(ip));
      port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
    } else if (ss.ss_family == AF_INET6) {
      uv_ip6_name((struct sockaddr_in6 *)&ss, ip, sizeof(ip));
      port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    }
    snprintf(c->peer, sizeof(c->peer), "%s:%d", ip, port);
  }
  uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
}

/* ---- thread, start and stop ------------------------------------------------------- */

static void on_stop(uv_async_t *a) {
  struct tdist_store_server *srv = a->data;
  srv->stopping = 1;
  tdist__live_stop(srv->live);
  srv->live = NULL;
  while (srv->conns)
    conn_close(srv->conns, NULL);
  uv_close((uv_handle_t *)&srv->listener, NULL);
  uv_close((uv_handle_t *)&srv->stop_async, NULL);
}

static void *server_main(void *arg) {
  struct tdist_store_server *srv = arg;
  uv_run(&srv->loop, UV_RUN_DEFAULT);
  return NULL;
}

static int somaxconn(void) {
  int v = 4096;
  FILE *f = fopen("/proc/sys/net/core/somaxconn", "r");
  if (f) {
    if (fscanf(f, "%d", &v) != 1 || v <= 0) v = 4096;
    fclose(f);
  }
  return v;
}

int tdist_store_server_start(const tdist_store_server_opts_t *opts, tdist_store_server_t **server) {
  if (!server) return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "store server: NULL out pointer");
  uint64_t m = opts ? opts->mask : 0;
  const char *host = (m & TDIST_STORE_SERVER_FIELD_HOST) && opts->host ? opts->host : "0.0.0.0";
  int port = (m & TDIST_STORE_SERVER_FIELD_PORT) ? opts->port : 0;
  const char *token = (m & TDIST_STORE_SERVER_FIELD_TOKEN)
                          ? opts->token
                          : tdist__param_str("TDIST_STORE_TOKEN", NULL);
  int backlog =
      (m & TDIST_STORE_SERVER_FIELD_BACKLOG) && opts->backlog > 0 ? opts->backlog : somaxconn();
  if (port < 0 || port > 65535)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "store server: port %d out of range", port);
  struct tdist_store_server *srv = tdist__calloc(1, sizeof(*srv));
  if (!srv) return tdist__error(TDIST_ERR_NO_MEMORY, "store server: out of memory");
  int rc = 0, uvrc, loop_ok = 0;
  if (tdist__kv_init(&srv->kv)) {
    rc = tdist__error(TDIST_ERR_NO_MEMORY, "store server: out of memory");
    goto fail;
  }
  srv->kv.on_write = on_write;
  srv->kv.ctx = srv;
  if (token && *token && !(srv->token = tdist__strdup(token))) {
    rc = tdist__error(TDIST_ERR_NO_MEMORY, "store server: out of memory");
    goto fail;
  }
  if ((uvrc = uv_loop_init(&srv->loop)) != 0) {
    rc = tdist__error(TDIST_ERR_INTERNAL, "store server: uv_loop_init: %s", uv_strerror(uvrc));
    goto fail;
  }
  loop_ok = 1;
  if (tdist__live_start(&srv->loop, &srv->kv, &srv->live) != 0) {
    rc = tdist__error(TDIST_ERR_NO_MEMORY, "store server: out of memory");
    goto fail;
  }
  tdist__live_on_declared(srv->live, on_declared, srv);
  struct sockaddr_storage addr;
  if (uv_ip4_addr(host, port, (struct sockaddr_in *)&addr) != 0 &&
      uv_ip6_addr(host, port, (struct sockaddr_in6 *)&addr) != 0) {
    rc = tdist__error(TDIST_ERR_INVALID_ARGUMENT, "store server: '%s' is not an IP address", host);
    goto fail;
  }
  uv_tcp_init(&srv->loop, &srv->listener);
  srv->listener.data = srv;
  if ((uvrc = uv_tcp_bind(&srv->listener, (struct sockaddr *)&addr, 0)) != 0 ||
      (uvrc = uv_listen((uv_stream_t *)&srv->listener, backlog, on_connection)) != 0) {
    rc = tdist__error(TDIST_ERR_IO, "store server: cannot listen on %s:%d: %s", host, port,
                      uv_strerror(uvrc));
    uv_close((uv_handle_t *)&srv->listener, NULL);
    goto fail;
  }
  int al = sizeof(addr);
  uv_tcp_getsockname(&srv->listener, (struct sockaddr *)&addr, &al);
  srv->port = ntohs(addr.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&addr)->sin6_port
                                               : ((struct sockaddr_in *)&addr)->sin_port);
  uv_async_init(&srv->loop, &srv->stop_async, on_stop);
  srv->stop_async.data = srv;
  if (pthread_create(&srv->thread, NULL, server_main, srv) != 0) {
    rc = tdist__error(TDIST_ERR_INTERNAL, "store server: cannot start its thread");
    uv_close((uv_handle_t *)&srv->listener, NULL);
    uv_close((uv_handle_t *)&srv->stop_async, NULL);
    goto fail;
  }
  TDIST_INFO(STORE, "store server listening on %s:%d (backlog %d%s)", host, srv->port, backlog,
             srv->token ? ", token required" : "");
  *server = srv;
  return 0;
fail:
  if (loop_ok) {
    tdist__live_stop(srv->live);
    uv_run(&srv->loop, UV_RUN_DEFAULT); /* run the close callbacks */
    uv_loop_close(&srv->loop);
  }
  tdist__kv_destroy(&srv->kv);
  tdist__free(srv->token);
  tdist__free(srv);
  return rc;
}

int tdist_store_server_port(const tdist_store_server_t *server) {
  return server ? server->port : -1;
}

int64_t tdist_store_server_num_keys(const tdist_store_server_t *server) {
  return server ? atomic_load_explicit(&server->num_keys, memory_order_relaxed) : 0;
}

int tdist_store_server_stop(tdist_store_server_t *srv) {
  if (!srv) return 0;
  uv_async_send(&srv->stop_async);
  pthread_join(srv->thread, NULL);
  uv_loop_close(&srv->loop);
  tdist__kv_destroy(&srv->kv);
  tdist__free(srv->token);
  tdist__free(srv);
  return 0;
}
