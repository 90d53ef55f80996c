/*
 * server.c - the TCP store server: one thread running its own libuv loop,
 * serving every client connection from it (no per-client threads). This file
 * starts and stops it, accepts connections and runs the sweep timer; one
 * connection's life is server_conn.c, the memory budget budget.c (the
 * overview of the three is server_impl.h).
 *
 * The sweep timer (every io_timeout/4, 50..1000 ms) closes connections past a
 * deadline (no handshake, or a frame or a reply that moved no byte for
 * TDIST_STORE_IO_TIMEOUT_MS) and starts a heap purge (on libuv's thread pool,
 * budget.c) once the charge fell well below its peak.
 *
 * Threads: start/stop/port/num_keys on any thread; everything else on the
 * server thread. stop wakes the loop with a uv_async.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <uv.h>

#include "util/alloc.h"
#include "util/error.h"
#include "util/param.h"
#include "store/server_impl.h"

typedef tdist__srv_conn_t conn_t;

#define WARN_BURST 10
#define WARN_WINDOW_MS 10000

/* A WARN line about a client (refused, malformed, dropped). An
 * unauthenticated client that reconnects in a loop must not fill the log:
 * past WARN_BURST lines in a window the lines are counted, and the first
 * line of the next window says how many were held back. */
void tdist__srv_warn(struct tdist_store_server *srv, const char *fmt, ...) {
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

/* ---- running out of descriptors ------------------------------------------------- */

/* The server holds one descriptor per connection. Once they run out, accept()
 * fails with EMFILE and libuv closes the pending connections unanswered (its
 * own spare-descriptor trick): the clients see a closed socket, retry and
 * time out minutes later with nothing naming the cause. So the last
 * SRV_FD_RESERVE descriptors are kept free: a connection accepted onto one of
 * them gets one BUSY frame naming the limit and is closed at once (the
 * client fails with TDIST_ERR_STORE_ERROR and that message, without
 * retrying), and the server logs the first refusal of a burst at WARN and
 * how many followed in one line per BUSY_WINDOW_MS. */
#define BUSY_WINDOW_MS 10000

/* At the end of a window: the line for the refusals held back since its
 * first, and the next refusal is logged in full again. */
static void busy_summary(struct tdist_store_server *srv, uint64_t now) {
  if (!srv->busy_warned || now - srv->busy_window_start < BUSY_WINDOW_MS) return;
  if (srv->busy_held)
    TDIST_WARN(STORE,
               "store server: %d more connections refused for want of descriptors in the last "
               "%.1f s (RLIMIT_NOFILE %" PRIu64 ", %zu connections open)",
               srv->busy_held, (double)(now - srv->busy_window_start) / 1000, srv->nofile,
               srv->nconns);
  srv->busy_held = 0;
  srv->busy_warned = 0;
}

/* 1 when descriptor fd is one of the reserved ones (the lowest free
 * descriptor is handed out, so every one below fd is in use). The limit is
 * read again then: the process may have raised it since. */
static int fd_reserved(struct tdist_store_server *srv, int fd) {
  if ((uint64_t)fd + SRV_FD_RESERVE < srv->nofile) return 0;
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0)
    srv->nofile = rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : (uint64_t)rl.rlim_cur;
  return (uint64_t)fd + SRV_FD_RESERVE >= srv->nofile;
}

/* Answer c (just accepted onto a reserved descriptor) BUSY and close it. */
static void refuse_busy(conn_t *c) {
  struct tdist_store_server *srv = c->srv;
  char msg[300];
  int n = snprintf(msg, sizeof(msg),
                   "the store server is out of file descriptors: %zu connections open, "
                   "RLIMIT_NOFILE is %" PRIu64
                   " (%d kept in reserve); raise the server process's limit (ulimit -n) or "
                   "open fewer connections",
                   srv->nconns - 1, srv->nofile, SRV_FD_RESERVE);
  uint8_t frame[9 + sizeof(msg)];
  tdist__buf_t b = {frame, 0, sizeof(frame)}; /* fits: no reallocation of the stack buffer */
  size_t f = tdist__frame_begin(&b, TDIST__ST_BUSY);
  tdist__put_bytes(&b, msg, (uint32_t)n);
  tdist__frame_end(&b, f);
  uv_buf_t ub = uv_buf_init((char *)b.p, (unsigned)b.len);
  /* A fresh socket's send buffer takes a few hundred bytes: no uv_write to wait for. */
  uv_try_write((uv_stream_t *)&c->tcp, &ub, 1);
  uint64_t now = uv_now(&srv->loop);
  busy_summary(srv, now);
  if (!srv->busy_warned) {
    srv->busy_warned = 1;
    srv->busy_window_start = now;
    TDIST_WARN(STORE, "store server: refusing connection from %s: %s (further refusals counted)",
               c->peer, msg);
  } else {
    srv->busy_held++;
  }
  tdist__srv_conn_close(c, NULL);
}

/* After the detector's scan declared deaths: the monitors waiting for those
 * records are woken now, not at the next request that drains the list. */
static void on_declared(void *arg) { tdist__srv_drain_ready(arg); }

/* Timeouts of every connection, then the idle purge. */
static void on_sweep(uv_timer_t *t) {
  struct tdist_store_server *srv = t->data;
  uint64_t now = uv_now(&srv->loop);
  for (conn_t *c = srv->conns, *next; c; c = next) {
    next = c->next; /* c may close (it stays allocated until its handles close) */
    tdist__srv_conn_sweep(c, now);
  }
  tdist__srv_drain_ready(srv);
  tdist__kv_spare_trim(&srv->kv, 1); /* spares nobody took since the last sweep go */
  tdist__srv_maybe_purge(srv);
  busy_summary(srv, now);
}

static void on_connection(uv_stream_t *l, int status) {
  struct tdist_store_server *srv = l->data;
  if (status < 0) {
    TDIST_WARN(STORE, "store server: accept failed: %s (%zu connections open)", uv_strerror(status),
               srv->nconns);
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
  srv->nconns++;
  if (uv_accept(l, (uv_stream_t *)&c->tcp) != 0) {
    tdist__srv_conn_close(c, "accept failed");
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
  uv_os_fd_t fd;
  if (uv_fileno((uv_handle_t *)&c->tcp, &fd) == 0 && fd_reserved(srv, fd)) {
    refuse_busy(c);
    return;
  }
  /* A connection costs its struct and a handshake buffer: refused while
   * even that does not fit (the peer sees the connection close). */
  if (!tdist__srv_fits(srv, sizeof(*c) + SRV_RBUF_PREAUTH)) {
    tdist__srv_conn_close(c, "the memory budget (TDIST_STORE_MEMORY_BYTES) is exhausted");
    return;
  }
  tdist__srv_conn_start(c);
}

/* ---- thread, start and stop ------------------------------------------------------- */

static void on_stop(uv_async_t *a) {
  struct tdist_store_server *srv = a->data;
  srv->stopping = 1;
  tdist__live_stop(srv->live);
  srv->live = NULL;
  while (srv->conns)
    tdist__srv_conn_close(srv->conns, NULL);
  uv_close((uv_handle_t *)&srv->sweep, NULL);
  uv_close((uv_handle_t *)&srv->turn_start, NULL);
  uv_close((uv_handle_t *)&srv->turn_end, NULL);
  uv_close((uv_handle_t *)&srv->turn_spin, NULL);
  uv_close((uv_handle_t *)&srv->listener, NULL);
  uv_close((uv_handle_t *)&srv->stop_async, NULL);
}

static void *server_main(void *arg) {
  struct tdist_store_server *srv = arg;
  /* libuv writes to a socket with write/writev, not send(MSG_NOSIGNAL): a
   * client gone with a reply still being written (a killed rank, a reset)
   * raised SIGPIPE, whose default action ended the whole process. Rank 0's
   * store process runs with the default (spawn.c resets it), and a server
   * in a user's process must not change that process's disposition; the
   * signal is blocked on this thread instead, so the write fails with
   * EPIPE and only that connection closes. (Defensive: libuv closes a
   * connection on its first write error, ECONNRESET after a reset, and no
   * test here made a second write reach EPIPE.) */
  sigset_t pipe_set;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_set, NULL);
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
  srv->kv.on_write = tdist__srv_on_write;
  srv->kv.keep_spares = 1; /* large SETs reuse the blocks of the values they replace */
  tdist__srv_budget_init(srv);
  srv->kv.ctx = srv;
  srv->nofile = UINT64_MAX;
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
    srv->nofile = (uint64_t)rl.rlim_cur;
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
  uv_timer_init(&srv->loop, &srv->sweep);
  srv->sweep.data = srv;
  uint64_t every = srv->io_timeout_ms / 4;
  every = every < 50 ? 50 : every > 1000 ? 1000 : every;
  uv_timer_start(&srv->sweep, on_sweep, every, every);
  uv_prepare_init(&srv->loop, &srv->turn_start);
  uv_check_init(&srv->loop, &srv->turn_end);
  uv_idle_init(&srv->loop, &srv->turn_spin);
  srv->turn_start.data = srv->turn_end.data = srv->turn_spin.data = srv;
  uv_prepare_start(&srv->turn_start, tdist__srv_turn_start);
  uv_check_start(&srv->turn_end, tdist__srv_turn_end);
  srv->read_left = srv->write_left = SRV_READ_TURN;
  if (pthread_create(&srv->thread, NULL, server_main, srv) != 0) {
    rc = tdist__error(TDIST_ERR_INTERNAL, "store server: cannot start its thread");
    uv_close((uv_handle_t *)&srv->sweep, NULL);
    uv_close((uv_handle_t *)&srv->turn_start, NULL);
    uv_close((uv_handle_t *)&srv->turn_end, NULL);
    uv_close((uv_handle_t *)&srv->turn_spin, NULL);
    uv_close((uv_handle_t *)&srv->listener, NULL);
    uv_close((uv_handle_t *)&srv->stop_async, NULL);
    goto fail;
  }
  TDIST_INFO(STORE,
             "store server listening on %s:%d (backlog %d%s, memory budget %" PRIu64
             " bytes, I/O timeout %" PRIu64 " ms)",
             host, srv->port, backlog, srv->token ? ", token required" : "", srv->limit,
             srv->io_timeout_ms);
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
