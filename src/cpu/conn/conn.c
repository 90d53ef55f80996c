/*
 * conn.c - listening, the advertised address, the eager full mesh
 * (TDIST_CPU_CONNECT=eager; lazy.c makes connections on first use, the
 * default), and tearing connections down.
 *
 * Eager, on the caller thread (inside the backend's init of the world group, bounded by
 * the group's timeout): every rank listens on an ephemeral port and trades
 * "host:port" with every other rank through the group's store view
 * (tdist_backend_allgather, keys "cpu/addr/<rank>"), then connects to every
 * higher rank (retrying until the peer listens) and accepts one connection
 * from every lower rank (an accept4 that takes no connection, ECONNABORTED
 * and the like, is waited past, never counted as a peer). A 24-byte handshake (magic, rank, world
 * size, world uid) identifies the connecting rank. Connecting first cannot deadlock: the kernel
 * completes a connection in the listen backlog before accept() is called.
 *
 * The sockets then become non-blocking, get TCP_NODELAY and large buffers,
 * and are handed to the progress thread (tdist__cpu_conn_start via
 * tdist_backend_call), which owns them, and the ctx, from then on. The
 * ctx is freed there once the last group released it and every libuv
 * handle is closed.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "util/alloc.h"
#include "util/clock.h"
#include "util/error.h"
#include "cpu/base/base.h"
#include "cpu/transport/transport.h"
#include "cpu/engine/engine.h"
#include "cpu/segment/sc.h"
#include "cpu/conn/conn.h"

void tdist__cpu_tune_socket(int fd) {
  int one = 1, buf = (int)tdist__param_CpuSockBuf();
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (buf > 0) {
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
  }
}

/* The local IPv4 address this host would use to reach the store ("host:port"):
 * a connected UDP socket's name (nothing is sent). 0, or -1 if unknown. */
static int route_to_store(const char *sa, char *host, size_t hl) {
  char h[256];
  const char *colon = strrchr(sa, ':');
  if (!colon || (size_t)(colon - sa) >= sizeof(h)) return -1;
  memcpy(h, sa, (size_t)(colon - sa));
  h[colon - sa] = '\0';
  struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_DGRAM}, *res = NULL;
  if (getaddrinfo(h, colon + 1, &hints, &res) != 0 || !res) return -1;
  struct sockaddr_in a;
  socklen_t len = sizeof(a);
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0), rc = -1;
  if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
      getsockname(fd, (struct sockaddr *)&a, &len) == 0 && a.sin_addr.s_addr != htonl(INADDR_ANY) &&
      inet_ntop(AF_INET, &a.sin_addr, host, (socklen_t)hl))
    rc = 0;
  if (fd >= 0) close(fd);
  freeaddrinfo(res);
  return rc;
}

/* The address other ranks should use: TDIST_CPU_HOST, else loopback when the
 * store is on loopback (single host), else this host's first IPv4 address;
 * when the host name resolves to loopback (Debian maps it to 127.0.1.1) while
 * the store is elsewhere, the address of the interface that reaches the
 * store instead (peers on other hosts could not reach a loopback address). */
static void advertised_host(tdist_store_t *store, char *host, size_t hl) {
  const char *h = tdist__param_str("TDIST_CPU_HOST", NULL);
  if (h) {
    snprintf(host, hl, "%s", h);
    return;
  }
  const char *sa = store ? tdist_store_address(store) : "127.0.0.1:0";
  if (strncmp(sa, "127.", 4) == 0 || strncmp(sa, "localhost", 9) == 0 ||
      strncmp(sa, "file:", 5) == 0) {
    snprintf(host, hl, "127.0.0.1");
    if (strncmp(sa, "file:", 5) != 0) return;
  }
  char name[256];
  struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res = NULL;
  if (gethostname(name, sizeof(name)) == 0 && getaddrinfo(name, NULL, &hints, &res) == 0 && res) {
    inet_ntop(AF_INET, &((struct sockaddr_in *)res->ai_addr)->sin_addr, host, (socklen_t)hl);
    freeaddrinfo(res);
    if (strncmp(host, "127.", 4) != 0 || strncmp(sa, "file:", 5) == 0 ||
        route_to_store(sa, host, hl) != 0)
      return;
    TDIST_INFO(CPU, "host name %s is loopback: advertising %s, the route to the store %s", name,
               host, sa);
    return;
  }
  if (strncmp(sa, "file:", 5) != 0 && route_to_store(sa, host, hl) == 0) return;
  snprintf(host, hl, "127.0.0.1");
}

/* Non-blocking: a connection that goes between poll and accept4 must not
 * block setup past its deadline (accept_next). */
static int listen_on(const char *host, int backlog, int *fd_out, int *port_out) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return tdist__error(TDIST_ERR_IO, "cpu: socket: %s", strerror(errno));
  struct sockaddr_in a = {.sin_family = AF_INET};
  const char *bind_host = tdist__param_str("TDIST_CPU_BIND", NULL);
  if (!bind_host) bind_host = strncmp(host, "127.", 4) == 0 ? host : "0.0.0.0";
  socklen_t len = sizeof(a);
  if (inet_pton(AF_INET, bind_host, &a.sin_addr) != 1 ||
      bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(fd, backlog) != 0 ||
      getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
    int e = errno;
    close(fd);
    return tdist__error(TDIST_ERR_IO, "cpu: cannot listen on %s: %s", bind_host, strerror(e));
  }
  *fd_out = fd;
  *port_out = ntohs(a.sin_port);
  return 0;
}

int tdist__cpu_connect_to(const char *addr, int64_t deadline_ns, int *fd_out) {
  char host[64];
  const char *colon = strrchr(addr, ':');
  if (!colon || (size_t)(colon - addr) >= sizeof(host))
    return tdist__error(TDIST_ERR_PROTOCOL, "cpu: bad peer address '%s'", addr);
  memcpy(host, addr, (size_t)(colon - addr));
  host[colon - addr] = 0;
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
  if (inet_pton(AF_INET, host, &a.sin_addr) != 1)
    return tdist__error(TDIST_ERR_PROTOCOL, "cpu: bad peer address '%s'", addr);
  int delay_us = 1000;
  for (;;) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return tdist__error(TDIST_ERR_IO, "cpu: socket: %s", strerror(errno));
    tdist__cpu_tune_socket(fd); /* before connect, so the window scale covers the buffers */
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0) {
      *fd_out = fd;
      return 0;
    }
    int e = errno;
    close(fd);
    if (tdist__now_ns() + (int64_t)delay_us * 1000 > deadline_ns)
      return tdist__error(TDIST_ERR_TIMEOUT, "cpu: cannot connect to %s: %s", addr, strerror(e));
    usleep((useconds_t)delay_us);
    if (delay_us < 100000) delay_us *= 2;
  }
}

/* Trade addresses: publish `me`, read everyone's (addrs[i], NUL-ended). */
static int get_addrs(const tdist_backend_params_t *p, const char *me, int64_t deadline_ns,
                     char **addrs) {
  int rc = 0, n = p->size;
  void **vals = tdist__calloc((size_t)n, sizeof(void *));
  size_t *lens = tdist__calloc((size_t)n, sizeof(size_t));
  if (!vals || !lens) {
    rc = tdist__error(TDIST_ERR_NO_MEMORY, "cpu: out of memory");
    goto done;
  }
  int64_t left_ms = (deadline_ns - tdist__now_ns()) / 1000000;
  TDIST_CHECKGOTO(tdist_backend_allgather(p->store, "cpu/addr", p->rank, n, me, strlen(me), NULL, 0,
                                          vals, lens, left_ms > 0 ? left_ms : 1),
                  rc, done);
  for (int i = 0; i < n; i++) {
    addrs[i] = tdist__calloc(1, lens[i] + 1);
    if (addrs[i] && lens[i]) memcpy(addrs[i], vals[i], lens[i]);
    if (!addrs[i]) rc = tdist__error(TDIST_ERR_NO_MEMORY, "cpu: out of memory");
  }
done:
  for (int i = 0; vals && i < n; i++)
    tdist_store_free(vals[i]);
  tdist__free(vals);
  tdist__free(lens);
  return rc;
}

cpu_conn_t *tdist__cpu_conn_new(cpu_ctx_t *ctx, int peer, int fd, const char *addr, int with_rx) {
  cpu_conn_t *c = tdist__calloc(1, sizeof(*c));
  if (!c) return NULL;
  c->rx_seg.fd = -1;
  c->rx = with_rx ? tdist__malloc(CPU_RX_CAP) : NULL;
  if (with_rx && !c->rx) {
    tdist__free(c);
    return NULL;
  }
  c->ctx = ctx;
  c->peer = peer;
  c->fd = fd;
  c->bye_cause = -1;
  tdist__list_init(&c->txq);
  tdist__list_init(&c->acks);
  snprintf(c->addr, sizeof(c->addr), "%s", addr);
  return c;
}

/* (progress) From here on the progress thread owns the ctx and its sockets. */
static void start_all(void *arg) {
  cpu_ctx_t *ctx = arg;
  tdist__cpu_ctx_start_timer(ctx);
  tdist__cpu_cma_start_timer(ctx);
  tdist__cpu_probe_start_timer(ctx);
  tdist__cpu_copy_start(ctx);
  tdist__cpu_shm_start(ctx);
  tdist__cpu_sc_bell_start(ctx);
  if (ctx->lazy) tdist__cpu_lazy_start(ctx);
  for (int i = 0; i < ctx->size; i++)
    if (ctx->conns[i] && ctx->conns[i]->link == CPU_LINK_UP) tdist__cpu_conn_start(ctx->conns[i]);
}

/* ---- context creation (caller thread) --------------------------------------- */

/* What creating the mesh holds until it is done (caller): the listening
 * socket, everyone's address, one blocking socket per peer until it becomes
 * a cpu_conn_t, and what the single-copy exchange learned. */
typedef struct {
  int n, lfd;
  int64_t deadline;
  char me[96]; /* "host:port" this rank listens on */
  char **addrs;
  int *fds;
  cpu_cma_hello_t *cma;
  int *local;
} mesh_setup_t;

static int setup_init(mesh_setup_t *s, int n, int64_t timeout_ms) {
  *s = (mesh_setup_t){.n = n, .lfd = -1, .deadline = tdist__now_ns() + timeout_ms * 1000000};
  s->addrs = tdist__calloc((size_t)n, sizeof(char *));
  s->fds = tdist__malloc(sizeof(int) * (size_t)n);
  s->cma = tdist__calloc((size_t)n, sizeof(*s->cma));
  s->local = tdist__calloc((size_t)n, sizeof(int));
  if (!s->addrs || !s->fds || !s->cma || !s->local)
    return tdist__error(TDIST_ERR_NO_MEMORY, "cpu: out of memory");
  for (int i = 0; i < n; i++)
    s->fds[i] = -1;
  return 0;
}

/* Once, on success and failure alike: a socket still here was not handed
 * to a connection (those are freed by free_unstarted or the progress thread). */
static void setup_free(mesh_setup_t *s) {
  if (s->lfd >= 0) close(s->lfd);
  for (int i = 0; i < s->n; i++) {
    if (s->fds && s->fds[i] >= 0) close(s->fds[i]);
    if (s->addrs) tdist__free(s->addrs[i]);
  }
  tdist__free(s->addrs);
  tdist__free(s->fds);
  tdist__free(s->cma);
  tdist__free(s->local);
}

static cpu_ctx_t *ctx_new(const tdist_backend_params_t *p, const cpu_tp_events_t *ev,
                          const cpu_hooks_t *hooks) {
  cpu_ctx_t *ctx = tdist__calloc(1, sizeof(*ctx));
  if (!ctx) return NULL;
  ctx->conns = tdist__calloc((size_t)p->size, sizeof(cpu_conn_t *));
  if (!ctx->conns) {
    tdist__free(ctx);
    return NULL;
  }
  ctx->ev = ev;
  ctx->hooks = hooks;
  ctx->shm.fd = -1;
  ctx->bell_fd = ctx->bell_tx = -1;
  ctx->rank = p->rank;
  ctx->size = p->size;
  ctx->lost_peer = -1;
  ctx->refs = 1;
  ctx->progress = p->progress;
  tdist__list_init(&ctx->groups);
  tdist__list_init(&ctx->orphans);
  tdist__list_init(&ctx->ready);
  tdist__list_init(&ctx->held);
  tdist__list_init(&ctx->ovfs);
  tdist__mutex_init(&ctx->mu);
  pthread_mutex_init(&ctx->mark_mu, NULL);
  return ctx;
}

/* A connection without a registered poll, or whose poll is closed. */
static void conn_free(cpu_conn_t *c) {
  if (c->fd >= 0) close(c->fd);
  if (c->tx_map) tdist__cpu_shm_seg_unmap(c->tx_map, c->tx_map_bytes);
  if (c->rx_seg.base || c->rx_seg.fd >= 0) tdist__cpu_shm_seg_destroy(&c->rx_seg);
  tdist__free(c->rx);
  tdist__free(c);
}

/* A ctx that never reached the progress thread: nothing of it is started,
 * so its connections and shared memory are undone here (caller). */
static void ctx_free_unstarted(cpu_ctx_t *ctx) {
  for (int i = 0; i < ctx->size; i++) {
    cpu_conn_t *c = ctx->conns[i];
    if (!c) continue;
    conn_free(c);
  }
  tdist__cpu_shm_release(ctx);
  tdist__cpu_sc_bell_close(ctx); /* never watched: closes its sockets */
  tdist__cpu_sc_ovf_forget(ctx, 0);
  pthread_mutex_destroy(&ctx->mark_mu);
  tdist__free(ctx->conns);
  tdist__free(ctx);
}

/* Connect to every higher rank and say who we are. */
static int connect_higher(const tdist_backend_params_t *p, mesh_setup_t *s) {
  hello_t hi = {.magic = CPU_MAGIC, .rank = p->rank, .size = s->n, .uid = p->uid};
  for (int j = p->rank + 1; j < s->n; j++) {
    TDIST_CHECK(tdist__cpu_connect_to(s->addrs[j], s->deadline, &s->fds[j]));
    if (tdist__cpu_io_full(s->fds[j], &hi, sizeof(hi), 1, s->deadline) != 0)
      return tdist__error(TDIST_ERR_IO, "cpu: handshake with rank %d (%s) failed", j, s->addrs[j]);
  }
  return 0;
}

/* accept(2), NOTES: Linux passes errors already pending on the new
 * connection to accept (ECONNABORTED: reset before it was taken; the
 * protocol's network errors), and a signal or a connection gone between poll
 * and accept (the listener is non-blocking) leave nothing to take. None is a
 * peer, and none stops the listener: wait for the next connection. */
static int accept_retryable(int e) {
  return e == EINTR || e == EAGAIN || e == EWOULDBLOCK || e == ECONNABORTED || e == EPROTO ||
         e == ENETDOWN || e == ENOPROTOOPT || e == EHOSTDOWN || e == ENONET || e == EHOSTUNREACH ||
         e == EOPNOTSUPP || e == ENETUNREACH;
}

/* The next connection to the listening socket, waiting until the deadline:
 * 0 and *fd_out; TDIST_ERR_TIMEOUT (not recorded: the caller says who is
 * missing); TDIST_ERR_IO with the call that failed for good (*what: poll or
 * accept4) and its errno (*err). */
static int accept_next(const mesh_setup_t *s, int *fd_out, const char **what, int *err) {
  for (;;) {
    struct pollfd pfd = {.fd = s->lfd, .events = POLLIN};
    int64_t left_ms = (s->deadline - tdist__now_ns()) / 1000000;
    if (left_ms <= 0) return TDIST_ERR_TIMEOUT;
    int r = poll(&pfd, 1, (int)(left_ms > 1000 ? 1000 : left_ms));
    *what = "poll";
    if (r < 0 && errno != EINTR) break;
    if (r <= 0) continue;
    *what = "accept4";
    int fd = accept4(s->lfd, NULL, NULL, SOCK_CLOEXEC);
    if (fd >= 0) {
      *fd_out = fd;
      return 0;
    }
    if (!accept_retryable(errno)) break;
    TDIST_INFO(CPU, "accept4 on %s: %s; waiting on", s->me, strerror(errno));
  }
  *err = errno;
  return TDIST_ERR_IO;
}

/* Accept one connection from every lower rank. A connection whose hello is
 * not one of ours (another job, a stale process, a rank already here) is
 * closed and not counted. */
static int accept_lower(const tdist_backend_params_t *p, mesh_setup_t *s) {
  for (int k = 0; k < p->rank;) {
    const char *what = "";
    int fd = -1, err = 0, rc = accept_next(s, &fd, &what, &err);
    if (rc == TDIST_ERR_TIMEOUT)
      return tdist__error(rc, "cpu: rank %d: %d of %d lower ranks connected to %s", p->rank, k,
                          p->rank, s->me);
    if (rc != 0)
      return tdist__error(rc, "cpu: rank %d: %s on %s failed (%d of %d lower ranks in): %s",
                          p->rank, what, s->me, k, p->rank, strerror(err));
    hello_t h;
    if (tdist__cpu_io_full(fd, &h, sizeof(h), 0, s->deadline) != 0 || h.magic != CPU_MAGIC ||
        h.size != s->n || h.uid != p->uid || h.rank < 0 || h.rank >= p->rank ||
        s->fds[h.rank] >= 0) {
      close(fd);
      continue;
    }
    tdist__cpu_tune_socket(fd);
    s->fds[h.rank] = fd;
    k++;
  }
  return 0;
}

/* Every peer's socket becomes a non-blocking connection of the ctx. */
static int make_conns(cpu_ctx_t *ctx, mesh_setup_t *s) {
  for (int j = 0; j < s->n; j++) {
    if (j == ctx->rank) continue;
    fcntl(s->fds[j], F_SETFL, fcntl(s->fds[j], F_GETFL) | O_NONBLOCK);
    ctx->conns[j] = tdist__cpu_conn_new(ctx, j, s->fds[j], s->addrs[j], 1);
    if (!ctx->conns[j]) return tdist__error(TDIST_ERR_NO_MEMORY, "cpu: out of memory");
    ctx->conns[j]->pid = s->cma[j].pid;
    ctx->conns[j]->cma_tx = s->cma[j].enabled; /* here: the peer can read us */
    s->fds[j] = -1;                            /* the connection's now */
    atomic_fetch_add_explicit(&tdist__cpu_connects, 1, memory_order_relaxed);
  }
  return 0;
}

/* Listen, trade addresses, connect up and accept down, then the single-copy
 * and shared-memory setup over the new sockets. */
static int build_mesh(const tdist_backend_params_t *p, cpu_ctx_t *ctx, mesh_setup_t *s) {
  char host[64];
  int port = 0;
  if (!p->store)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "cpu: a store is needed to connect ranks");
  advertised_host(p->store, host, sizeof(host));
  TDIST_CHECK(listen_on(host, s->n, &s->lfd, &port));
  snprintf(s->me, sizeof(s->me), "%s:%d", host, port);
  TDIST_CHECK(get_addrs(p, s->me, s->deadline, s->addrs));
  TDIST_CHECK(connect_higher(p, s));
  TDIST_CHECK(accept_lower(p, s));
  TDIST_CHECK(tdist__cpu_cma_exchange(p->rank, s->n, s->fds, NULL, s->deadline, s->cma, s->local));
  TDIST_CHECK(make_conns(ctx, s));
  TDIST_CHECK(tdist__cpu_shm_setup(ctx, s->local, s->deadline));
  return 0;
}

/* Lazy (lazy.c): listen and publish our address; peers connect on use.
 * The backlog holds the peers that dial at once (at most n - 1). */
static int listen_lazy(const tdist_backend_params_t *p, cpu_ctx_t *ctx, mesh_setup_t *s) {
  char host[64];
  int port = 0;
  if (!p->store)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "cpu: a store is needed to connect ranks");
  advertised_host(p->store, host, sizeof(host));
  TDIST_CHECK(listen_on(host, s->n < 4096 ? s->n : 4096, &s->lfd, &port));
  snprintf(s->me, sizeof(s->me), "%s:%d", host, port);
  TDIST_CHECK(tdist__cpu_lazy_create(ctx, p, s->lfd, s->me));
  s->lfd = -1; /* the lazy state's now */
  return 0;
}

/* (caller) Bounded by p->timeout_ms; on success the progress thread owns
 * the ctx (start_all). */
int tdist__cpu_ctx_create(const tdist_backend_params_t *p, const cpu_tp_events_t *ev,
                          const cpu_hooks_t *hooks, cpu_ctx_t **out) {
  int rc = 0;
  mesh_setup_t s;
  cpu_ctx_t *ctx = ctx_new(p, ev, hooks);
  TDIST_CHECKGOTO(setup_init(&s, p->size, p->timeout_ms), rc, fail);
  if (!ctx) {
    rc = tdist__error(TDIST_ERR_NO_MEMORY, "cpu: out of memory");
    goto fail;
  }
  /* The bell members of a shared-memory group ring (sc_chan.c); without
   * one, collectives run over messages only. */
  if (p->size > 1) (void)tdist__cpu_sc_bell_open(ctx);
  if (p->size > 1 && tdist__cpu_lazy_mode(p->size)) {
    TDIST_CHECKGOTO(listen_lazy(p, ctx, &s), rc, fail);
    tdist_backend_call(p->progress, start_all, ctx);
    if (tdist__cpu_lazy_threads(ctx) != 0) {
      rc = TDIST_ERR_INTERNAL;
      tdist__cpu_ctx_release(ctx); /* started: the progress thread's to free */
      ctx = NULL;
      goto fail;
    }
    TDIST_INFO(CPU, "rank %d/%d: listening on %s, connecting on first use", p->rank, p->size, s.me);
  } else if (p->size > 1) {
    TDIST_CHECKGOTO(build_mesh(p, ctx, &s), rc, fail);
    tdist_backend_call(p->progress, start_all, ctx);
    TDIST_INFO(CPU, "rank %d/%d: listening on %s, connected to %d peers", p->rank, p->size, s.me,
               p->size - 1);
  }
  *out = ctx;
  ctx = NULL;
fail:
  setup_free(&s);
  if (ctx) ctx_free_unstarted(ctx);
  return rc;
}

/* ---- teardown (progress thread) -------------------------------------------- */

void tdist__cpu_ctx_maybe_free(cpu_ctx_t *ctx) {
  if (ctx->refs > 0 || ctx->open_handles > 0) return;
  tdist__list_t *n;
  while ((n = tdist__list_first(&ctx->orphans)))
    tdist__cpu_ux_free(ctx, tdist__list_entry(n, cpu_ux_t, link)); /* unlinks it */
  tdist__cpu_buf_drain(ctx);
  tdist__cpu_sc_ovf_forget(ctx, 0);
  tdist__cpu_shm_release(ctx);
  pthread_mutex_destroy(&ctx->mark_mu);
  tdist__free(ctx->conns);
  tdist__free(ctx);
}

static void on_closed(uv_handle_t *h) {
  cpu_conn_t *c = h->data;
  cpu_ctx_t *ctx = c->ctx;
  c->fd = -1;   /* closed by detach or the linger */
  conn_free(c); /* the tx mapping unless lingering on it took it */
  ctx->open_handles--;
  tdist__cpu_ctx_maybe_free(ctx);
}

static void on_timer_closed(uv_handle_t *h) {
  cpu_ctx_t *ctx = h->data;
  ctx->open_handles--;
  tdist__cpu_ctx_maybe_free(ctx);
}

/* What the last release hands back to its caller: the live connections,
 * with what their queues still owed, to linger on (leave.c). */
typedef struct release_req {
  cpu_ctx_t *ctx;
  cpu_leaving_t *ls; /* ctx->size entries, or NULL: no lingering */
  int n;
  cpu_lazy_t *lazy; /* the last release: the lazy state to end */
} release_req_t;

static void release_task(void *arg) {
  release_req_t *r = arg;
  cpu_ctx_t *ctx = r->ctx;
  if (--ctx->refs > 0) return;
  if (ctx->lazy) { /* no connection is handed over from here on */
    tdist__cpu_lazy_stop(ctx);
    r->lazy = ctx->lazy;
    ctx->lazy = NULL;
  }
  if (ctx->timer_on) {
    ctx->timer_on = 0;
    ctx->open_handles++;
    uv_close((uv_handle_t *)&ctx->park_timer, on_timer_closed);
  }
  if (ctx->rma_timer_on) {
    ctx->rma_timer_on = 0;
    ctx->open_handles++;
    uv_close((uv_handle_t *)&ctx->rma_timer, on_timer_closed);
  }
  if (ctx->probe_timer_on) {
    ctx->probe_timer_on = 0;
    ctx->open_handles++;
    uv_close((uv_handle_t *)&ctx->probe_timer, on_timer_closed);
  }
  if (ctx->ring_idle_on) {
    ctx->ring_idle_on = 0;
    ctx->open_handles++;
    uv_close((uv_handle_t *)&ctx->ring_idle, on_timer_closed);
  }
  tdist__cpu_sc_bell_close(ctx);
  if (ctx->copy_idle_on) { /* copy_steps.c; the groups are gone, so no copy is left */
    ctx->copy_idle_on = 0;
    ctx->open_handles++;
    uv_close((uv_handle_t *)&ctx->copy_idle, on_timer_closed);
  }
  for (int i = 0; i < ctx->size; i++) {
    cpu_conn_t *c = ctx->conns[i];
    if (!c) continue;
    ctx->conns[i] = NULL;
    if (c->link != CPU_LINK_UP) { /* never connected (lazy.c): no poll, no fd */
      tdist__cpu_conn_free_queues(c);
      conn_free(c);
      continue;
    }
    /* Out of the loop; with lingering, the fd and what the queue owes
     * are the caller's (below), else closed here after a goodbye. */
    cpu_leaving_t *l = r->ls ? &r->ls[r->n] : NULL;
    if (l) *l = (cpu_leaving_t){.fd = -1};
    if (l) tdist__list_init(&l->owed);
    int fd = tdist__cpu_conn_detach(c, l);
    if (fd >= 0 && l) {
      l->fd = fd;
      r->n++;
    } else if (fd >= 0) {
      close(fd);
    }
    ctx->open_handles++;
    uv_close((uv_handle_t *)&c->poll, on_closed);
  }
  tdist__cpu_ctx_maybe_free(ctx);
}

void tdist__cpu_ctx_release(cpu_ctx_t *ctx) {
  release_req_t r = {ctx, NULL, 0, NULL};
  /* Lingering blocks: never on the progress thread (a release from a
   * callback closes at once). */
  if (tdist__param_CpuLingerMs() > 0 && !tdist_backend_on_progress_thread()) {
    r.ls = tdist__malloc(sizeof(*r.ls) * (size_t)ctx->size);
    tdist__cpu_lazy_owing_wait(ctx, tdist__param_CpuLingerMs());
  }
  tdist_backend_call(ctx->progress, release_task, &r);
  if (r.ls) tdist__cpu_linger(r.ls, r.n);
  tdist__free(r.ls);
  tdist__cpu_lazy_end(r.lazy, !tdist_backend_on_progress_thread());
}
