/*
 * lazy.c - connections made on first use (TDIST_CPU_CONNECT=lazy, and
 * the default `auto` for worlds of TDIST_CPU_LAZY_FROM = 64 ranks or more):
 * the world's creation publishes this rank's address and
 * nothing else, and a pair connects when an op first needs it.
 *
 * Why: the full mesh (conn.c, TDIST_CPU_CONNECT=eager) costs every rank n
 * store reads and n - 1 connections at creation, however few peers its
 * program talks to (issue 30: p2p among a few ranks, recursive doubling
 * over log2(n) peers). Here creation is O(1) store work per rank, and a
 * rank reads one address per peer it actually uses.
 *
 * Shape. At creation every peer gets a placeholder cpu_conn_t (no socket,
 * link = CPU_LINK_IDLE), so groups, subgroups, shrink and meshes keep
 * sharing the world's connections (cg->conns points at them) exactly as
 * with the mesh. A message queued on a placeholder (tdist__cpu_send) or a
 * receive posted from its peer (engine.c) asks for the connection
 * (tdist__cpu_conn_want): the message waits in the send queue, the op is
 * neither failed nor blocked. Two threads per world do the blocking part,
 * each handshake on a short-lived thread of its own (hs_start), so a
 * stopped peer holds up only its own pair:
 *   dialer    takes the wanted peers in order: reads "cpu/addr/<peer>"
 *             (tdist_store_get, waiting), connects, sends the 24-byte
 *             hello, reads the verdict (1 accept, 0 reject);
 *   acceptor  owns the listening socket: takes a connection, reads its
 *             hello, answers the verdict.
 * An accepted pair then trades the single-copy hellos (cma.c) and, on one
 * host, sets up its two rings (shm_conn.c, one segment per pair): the
 * shared-memory path is as lazy as the socket. The result goes to the
 * progress thread through a uv_async handle (on_async), which turns the
 * placeholder into a live connection under the engine lock and flushes
 * what was queued. A dialer only waits on acceptors and an acceptor never
 * dials, so two ranks dialing each other cannot deadlock.
 *
 * Both sides at once: one connection per pair, by rank. A rank that gets a
 * hello from peer p while it is itself dialing p accepts it when p < me
 * (the lower rank's connection wins) and rejects it when p > me (then p
 * accepts ours, by the same rule). A rejected dialer waits for the peer's
 * connection, which the rule guarantees is on its way. A hello from a peer
 * already connected, or given up on, is rejected.
 *
 * Failures are named as the mesh names them: a connect refused (after
 * retrying for a second: the listener exists before its address is
 * published, so a refusal means the peer is gone), no address within the
 * world's timeout, a failed handshake (HANDSHAKE_MS at most): the placeholder is reported lost
 * (tdist__cpu_on_conn_lost: "rank X (world rank Y, addr) ..."), which
 * fails the groups that need the peer; later ops find it dead ("is gone").
 * The monitor's death record aborts waiting groups as before.
 *
 * Threads: create on the caller; want under the engine lock (it only
 * queues); the two threads own their sockets until the handoff; on_async
 * on the progress thread; stop on the progress thread (release_task), then
 * join on the caller (or detach when the last release runs on the
 * progress thread: the threads then free the state themselves).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "util/alloc.h"
#include "util/error.h"
#include "cpu/cpu.h"

_Atomic uint64_t tdist__cpu_connects;

enum { ST_NONE, ST_DIALING, ST_CLAIMED, ST_WAITING, ST_FAILED }; /* per peer, under mu */
#define STOP_SLICE_MS 200 /* how often a blocked thread looks at `stop` */
/* A handshake (hello, verdict, the pair's setup) that takes longer is
 * given up: a live peer's acceptor answers in milliseconds, and the one
 * dialer must not wait a whole group timeout behind a stopped process. */
#define HANDSHAKE_MS 10000

/* A finished connection (or a failure) on its way to the progress thread. */
typedef struct lazy_done {
  struct lazy_done *next;
  int peer, fd, ok;
  int32_t pid;
  int cma_tx;
  struct tdist__cpu_ring *tx_ring, *rx_ring;
  void *tx_map;
  size_t tx_map_bytes;
  tdist__cpu_shm_seg_t rx_seg;
  char addr[80];
  char why[200];
} lazy_done_t;

struct cpu_lazy {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  cpu_ctx_t *ctx; /* NULL once stopped (no handoff after that) */
  int refs;       /* ctx + the running threads + the async handle; under mu */
  _Atomic int stop;
  int rank, size, lfd;
  uint64_t uid;
  int64_t timeout_ms;
  tdist_store_t *store;         /* our own view: the threads may outlive the group's */
  uint8_t *st;                  /* per peer: ST_* */
  int *dialq, dq_head, dq_tail; /* a ring of wanted peers (each queued once) */
  lazy_done_t *done;            /* finished, for on_async (LIFO; order does not matter) */
  uv_async_t async;
  int async_on;
  pthread_t dialer, acceptor;
  int threads;
  int *busy, nbusy; /* sockets in a handshake (-1: a free slot); under mu:
                       stop shuts them down so a blocked handshake returns
                       at once, and one is closed only after it is cleared
                       here (lz_close), so stop never shuts a reused fd */
};

/* No free slot (more handshakes than peers: not ours): not registered,
 * bounded by HANDSHAKE_MS alone. */
static void lz_busy(cpu_lazy_t *lz, int fd) {
  pthread_mutex_lock(&lz->mu);
  for (int i = 0; i < lz->nbusy; i++)
    if (lz->busy[i] < 0) {
      lz->busy[i] = fd;
      break;
    }
  pthread_mutex_unlock(&lz->mu);
}

/* fd is no longer in a handshake (closed by the caller, or handed over). */
static void lz_unbusy(cpu_lazy_t *lz, int fd) {
  if (fd < 0) return;
  pthread_mutex_lock(&lz->mu);
  for (int i = 0; i < lz->nbusy; i++)
    if (lz->busy[i] == fd) lz->busy[i] = -1;
  pthread_mutex_unlock(&lz->mu);
}

static void lz_close(cpu_lazy_t *lz, int fd) {
  lz_unbusy(lz, fd);
  if (fd >= 0) close(fd);
}

static void done_free(lazy_done_t *d) {
  if (d->fd >= 0) close(d->fd);
  if (d->tx_map) tdist__cpu_shm_seg_unmap(d->tx_map, d->tx_map_bytes);
  if (d->rx_seg.base || d->rx_seg.fd >= 0) tdist__cpu_shm_seg_destroy(&d->rx_seg);
  tdist__free(d);
}

static void lazy_unref(cpu_lazy_t *lz) {
  pthread_mutex_lock(&lz->mu);
  int last = --lz->refs == 0;
  pthread_mutex_unlock(&lz->mu);
  if (!last) return;
  if (lz->lfd >= 0) close(lz->lfd);
  while (lz->done) {
    lazy_done_t *d = lz->done;
    lz->done = d->next;
    done_free(d);
  }
  if (lz->store) tdist_store_release(lz->store);
  pthread_mutex_destroy(&lz->mu);
  pthread_cond_destroy(&lz->cv);
  tdist__free(lz->st);
  tdist__free(lz->dialq);
  tdist__free(lz->busy);
  tdist__free(lz);
}

/* (any of the threads) Hand d to the progress thread, or drop it once stopped. */
static void hand_over(cpu_lazy_t *lz, lazy_done_t *d) {
  lz_unbusy(lz, d->fd);
  pthread_mutex_lock(&lz->mu);
  if (lz->ctx && lz->async_on) {
    d->next = lz->done;
    lz->done = d;
    uv_async_send(&lz->async);
    d = NULL;
  }
  pthread_mutex_unlock(&lz->mu);
  if (d) done_free(d);
}

static lazy_done_t *done_new(int peer) {
  lazy_done_t *d = tdist__calloc(1, sizeof(*d));
  if (!d) return NULL;
  d->peer = peer;
  d->fd = -1;
  d->rx_seg.fd = -1;
  snprintf(d->addr, sizeof(d->addr), "no address yet");
  return d;
}

/* The pair cannot be connected. The placeholder is quiet (nothing came
 * over it), so its loss waits a second for a cause (dispatch.c): a peer
 * that left because its group failed (a mismatch it found, say) had no
 * connection to tell us on, unlike the mesh, where its ERR comes before
 * its EOF; its abort record reaches us through the store meanwhile. */
static void fail_peer(cpu_lazy_t *lz, lazy_done_t *d, const char *fmt, const char *arg) {
  pthread_mutex_lock(&lz->mu);
  lz->st[d->peer] = ST_FAILED;
  pthread_mutex_unlock(&lz->mu);
  snprintf(d->why, sizeof(d->why), fmt, arg);
  lz_close(lz, d->fd);
  d->fd = -1;
  d->ok = 0;
  hand_over(lz, d);
}

/* Both sides of an accepted pair: single-copy hellos, then (one host) the
 * rings, over the still-blocking socket. 0, or -1 (d->why set). */
static int pair_setup(cpu_lazy_t *lz, lazy_done_t *d, int64_t deadline) {
  int fds[2] = {-1, d->fd}, local[2] = {0, 0}, names[2] = {lz->rank, d->peer};
  cpu_cma_hello_t cma[2];
  memset(cma, 0, sizeof(cma));
  if (tdist__cpu_cma_exchange(0, 2, fds, names, deadline, cma, local) != 0) {
    snprintf(d->why, sizeof(d->why), "failed in the connection handshake: %s", tdist_last_error());
    return -1;
  }
  d->pid = cma[1].pid;
  d->cma_tx = cma[1].enabled;
  if (local[1]) {
    /* shm_conn.c's setup, run on a two-rank stand-in context whose one
     * peer is this socket: its segment holds the one ring this pair needs. */
    cpu_ctx_t t;
    cpu_conn_t tc;
    cpu_conn_t *tconns[2] = {NULL, &tc};
    memset(&t, 0, sizeof(t));
    memset(&tc, 0, sizeof(tc));
    t.size = 2;
    t.shm.fd = -1;
    t.conns = tconns;
    tc.fd = d->fd;
    if (tdist__cpu_shm_setup(&t, local, deadline) != 0) {
      if (t.shm.base || t.shm.fd >= 0) tdist__cpu_shm_seg_destroy(&t.shm);
      snprintf(d->why, sizeof(d->why), "failed in the shared-memory setup: %s", tdist_last_error());
      return -1;
    }
    d->rx_seg = t.shm;
    d->tx_ring = tc.tx_ring;
    d->rx_ring = tc.rx_ring;
    d->tx_map = tc.tx_map;
    d->tx_map_bytes = tc.tx_map_bytes;
  }
  (void)lz;
  return 0;
}

/* ---- the dialer ----------------------------------------------------------------- */

/* The peer's address from the store, waiting in slices (stop is looked at). */
static int peer_addr(cpu_lazy_t *lz, int peer, int64_t deadline, char *out, size_t ol) {
  char key[32];
  snprintf(key, sizeof(key), "%d", peer);
  for (;;) {
    void *v = NULL;
    size_t len = 0;
    int64_t left = (deadline - tdist__now_ns()) / 1000000;
    if (left <= 0 || atomic_load(&lz->stop)) return TDIST_ERR_TIMEOUT;
    int rc = tdist_store_get(lz->store, key, &v, &len, left > STOP_SLICE_MS ? STOP_SLICE_MS : left);
    if (rc == TDIST_ERR_TIMEOUT) continue;
    if (rc) return rc;
    snprintf(out, ol, "%.*s", (int)(len < ol ? len : ol - 1), (const char *)v);
    tdist_store_free(v);
    return 0;
  }
}

static void dial(cpu_lazy_t *lz, int peer) {
  lazy_done_t *d = done_new(peer);
  if (!d) return; /* the op waits for its timeout */
  int64_t deadline = tdist__now_ns() + lz->timeout_ms * 1000000;
  int rc = peer_addr(lz, peer, deadline, d->addr, sizeof(d->addr));
  if (rc != 0) {
    if (atomic_load(&lz->stop)) {
      done_free(d);
      return;
    }
    if (rc == TDIST_ERR_TIMEOUT)
      fail_peer(lz, d, "published no address within %s", "the world's timeout");
    else
      fail_peer(lz, d, "could not be connected: its address is unknown (the store: %s)",
                tdist_last_error());
    return;
  }
  /* A second of retries at most: the address exists, so its listener does. */
  int64_t cdl = tdist__now_ns() + 1000000000LL;
  if (tdist__cpu_connect_to(d->addr, cdl < deadline ? cdl : deadline, &d->fd) != 0) {
    fail_peer(lz, d, "refused the connection (%s)", tdist_last_error());
    return;
  }
  lz_busy(lz, d->fd);
  int64_t hs = tdist__now_ns() + (int64_t)HANDSHAKE_MS * 1000000;
  deadline = hs < deadline ? hs : deadline;
  hello_t hi = {.magic = CPU_MAGIC, .rank = lz->rank, .size = lz->size, .uid = lz->uid};
  int32_t verdict = 0;
  if (tdist__cpu_io_full(d->fd, &hi, sizeof(hi), 1, deadline) != 0 ||
      tdist__cpu_io_full(d->fd, &verdict, sizeof(verdict), 0, deadline) != 0) {
    fail_peer(lz, d, "did not answer the connection's handshake (%s)",
              tdist__now_ns() >= deadline ? "in time" : "closed");
    return;
  }
  pthread_mutex_lock(&lz->mu);
  if (!verdict && lz->st[peer] == ST_DIALING) lz->st[peer] = ST_WAITING; /* theirs comes */
  if (verdict) lz->st[peer] = ST_CLAIMED;
  pthread_mutex_unlock(&lz->mu);
  if (!verdict) {
    lz_close(lz, d->fd);
    d->fd = -1;
    done_free(d);
    return;
  }
  if (pair_setup(lz, d, deadline) != 0) {
    fail_peer(lz, d, "%s", d->why);
    return;
  }
  d->ok = 1;
  hand_over(lz, d);
}

/* One handshake on a thread of its own (detached, holding a reference):
 * a peer stopped in the middle of one (SIGSTOP, a debugger) must not hold
 * up the pair's other handshakes for HANDSHAKE_MS. */
typedef struct {
  cpu_lazy_t *lz;
  int arg, incoming; /* a peer to dial, or an accepted socket */
} hs_t;

static void take_incoming(cpu_lazy_t *lz, int fd);

static void *hs_main(void *arg) {
  hs_t h = *(hs_t *)arg;
  tdist__free(arg);
  if (h.incoming)
    take_incoming(h.lz, h.arg);
  else
    dial(h.lz, h.arg);
  lazy_unref(h.lz);
  return NULL;
}

/* Run the handshake on its own thread, or here if none can start. */
static void hs_start(cpu_lazy_t *lz, int arg, int incoming) {
  hs_t *h = tdist__malloc(sizeof(*h));
  pthread_t t;
  pthread_attr_t at;
  if (h) {
    *h = (hs_t){lz, arg, incoming};
    pthread_mutex_lock(&lz->mu);
    lz->refs++;
    pthread_mutex_unlock(&lz->mu);
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&t, &at, hs_main, h);
    pthread_attr_destroy(&at);
    if (rc == 0) return;
    tdist__free(h);
    lazy_unref(lz); /* not the last: the caller's thread holds one */
  }
  if (incoming)
    take_incoming(lz, arg);
  else
    dial(lz, arg);
}

static void *dialer_main(void *arg) {
  cpu_lazy_t *lz = arg;
  pthread_mutex_lock(&lz->mu);
  while (!atomic_load(&lz->stop)) {
    if (lz->dq_head == lz->dq_tail) {
      pthread_cond_wait(&lz->cv, &lz->mu);
      continue;
    }
    int peer = lz->dialq[lz->dq_head];
    lz->dq_head = (lz->dq_head + 1) % lz->size;
    pthread_mutex_unlock(&lz->mu);
    hs_start(lz, peer, 0);
    pthread_mutex_lock(&lz->mu);
  }
  pthread_mutex_unlock(&lz->mu);
  lazy_unref(lz);
  return NULL;
}

/* ---- the acceptor --------------------------------------------------------------- */

static void take_incoming(cpu_lazy_t *lz, int fd) {
  /* A hello that does not come in time is not one of ours. */
  int64_t deadline = tdist__now_ns() + (int64_t)HANDSHAKE_MS * 1000000;
  hello_t h;
  lz_busy(lz, fd);
  if (tdist__cpu_io_full(fd, &h, sizeof(h), 0, deadline) != 0 || h.magic != CPU_MAGIC ||
      h.size != lz->size || h.uid != lz->uid || h.rank < 0 || h.rank >= lz->size ||
      h.rank == lz->rank) {
    lz_close(lz, fd);
    return;
  }
  int p = h.rank;
  pthread_mutex_lock(&lz->mu);
  int st = lz->st[p];
  int32_t verdict = st == ST_NONE || st == ST_WAITING || (st == ST_DIALING && p < lz->rank);
  if (verdict) lz->st[p] = ST_CLAIMED;
  pthread_mutex_unlock(&lz->mu);
  if (tdist__cpu_io_full(fd, &verdict, sizeof(verdict), 1, deadline) != 0 || !verdict) {
    lz_close(lz, fd);
    if (!verdict) return;
    lazy_done_t *d = done_new(p);
    if (d) fail_peer(lz, d, "closed the connection during its handshake%s", "");
    return;
  }
  tdist__cpu_tune_socket(fd);
  lazy_done_t *d = done_new(p);
  if (!d) {
    lz_close(lz, fd);
    return;
  }
  d->fd = fd;
  struct sockaddr_in a;
  socklen_t al = sizeof(a);
  char host[64] = "?";
  if (getpeername(fd, (struct sockaddr *)&a, &al) == 0)
    inet_ntop(AF_INET, &a.sin_addr, host, sizeof(host));
  snprintf(d->addr, sizeof(d->addr), "%s:%d (it connected)", host, ntohs(a.sin_port));
  if (pair_setup(lz, d, deadline) != 0) {
    fail_peer(lz, d, "%s", d->why);
    return;
  }
  d->ok = 1;
  hand_over(lz, d);
}

static void *acceptor_main(void *arg) {
  cpu_lazy_t *lz = arg;
  while (!atomic_load(&lz->stop)) {
    struct pollfd pfd = {.fd = lz->lfd, .events = POLLIN};
    if (poll(&pfd, 1, STOP_SLICE_MS) <= 0) continue;
    int fd = accept4(lz->lfd, NULL, NULL, SOCK_CLOEXEC);
    if (fd >= 0) {
      hs_start(lz, fd, 1);
    } else if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
      /* Out of descriptors or memory: the pending connection stays in the
       * backlog; try again a slice later rather than spin. */
      TDIST_WARN(CPU, "rank %d: accept4: %s; retrying", lz->rank, strerror(errno));
      usleep(STOP_SLICE_MS * 1000);
    } /* else nothing to take (conn.c: accept_retryable): wait on */
  }
  lazy_unref(lz);
  return NULL;
}

/* ---- the progress thread's side ------------------------------------------------- */

/* (progress, engine lock) The placeholder becomes a live connection. */
static void attach(cpu_ctx_t *ctx, lazy_done_t *d) {
  cpu_conn_t *c = ctx->conns[d->peer];
  if (!c || c->link == CPU_LINK_UP || c->dead) {
    done_free(d);
    return;
  }
  snprintf(c->addr, sizeof(c->addr), "%s", d->addr);
  if (!d->ok) {
    ctx->ev->lost(c, d->why); /* c->link stays: its poll never started */
    done_free(d);
    return;
  }
  c->rx = tdist__malloc(CPU_RX_CAP);
  if (!c->rx) {
    done_free(d);
    ctx->ev->lost(c, "could not be connected: out of memory");
    return;
  }
  fcntl(d->fd, F_SETFL, fcntl(d->fd, F_GETFL) | O_NONBLOCK);
  c->fd = d->fd;
  c->pid = d->pid;
  c->cma_tx = d->cma_tx;
  c->tx_ring = d->tx_ring;
  c->tx_map = d->tx_map;
  c->tx_map_bytes = d->tx_map_bytes;
  c->rx_seg = d->rx_seg;
  tdist__cpu_shm_attach_rx(ctx, c, d->rx_ring);
  d->fd = -1;
  d->tx_map = NULL;
  d->rx_seg = (tdist__cpu_shm_seg_t){.fd = -1};
  done_free(d);
  c->link = CPU_LINK_UP;
  atomic_fetch_add_explicit(&tdist__cpu_connects, 1, memory_order_relaxed);
  TDIST_INFO(CPU, "rank %d: connected to world rank %d (%s)%s", ctx->rank, c->peer, c->addr,
             c->rx_ring ? ", rings" : "");
  tdist__cpu_conn_start(c);
  tdist__cpu_conn_drive(c); /* what was queued, what already arrived */
}

static void on_async(uv_async_t *h) {
  cpu_lazy_t *lz = h->data;
  pthread_mutex_lock(&lz->mu);
  lazy_done_t *d = lz->done;
  lz->done = NULL;
  cpu_ctx_t *ctx = lz->ctx;
  pthread_mutex_unlock(&lz->mu);
  if (!ctx) return; /* not reached: stop closes the handle first */
  tdist__cpu_enter(ctx);
  while (d) {
    lazy_done_t *next = d->next;
    attach(ctx, d);
    d = next;
  }
  ctx->ev->settle(ctx);
  tdist__cpu_leave(ctx);
}

static void on_async_closed(uv_handle_t *h) { lazy_unref(h->data); }

void tdist__cpu_conn_want(cpu_conn_t *c) {
  cpu_lazy_t *lz = c->ctx->lazy;
  if (c->link != CPU_LINK_IDLE || c->dead || !lz) return;
  c->link = CPU_LINK_DIALING;
  pthread_mutex_lock(&lz->mu);
  if (lz->st[c->peer] == ST_NONE) {
    lz->st[c->peer] = ST_DIALING;
    lz->dialq[lz->dq_tail] = c->peer;
    lz->dq_tail = (lz->dq_tail + 1) % lz->size;
    pthread_cond_signal(&lz->cv);
  }
  pthread_mutex_unlock(&lz->mu);
}

/* (progress) For the last release: connections being made with messages
 * queued on them (q->n). */
typedef struct {
  cpu_ctx_t *ctx;
  int n;
} owing_req_t;
static void count_owing(void *arg) {
  owing_req_t *q = arg;
  cpu_ctx_t *ctx = q->ctx;
  q->n = 0;
  if (ctx->refs != 1 || !ctx->lazy) return;
  tdist__cpu_enter(ctx);
  for (int i = 0; i < ctx->size; i++) {
    cpu_conn_t *c = ctx->conns[i];
    q->n += c && c->link == CPU_LINK_DIALING && !c->dead && !tdist__list_empty(&c->txq);
  }
  tdist__cpu_leave(ctx);
}

void tdist__cpu_lazy_owing_wait(cpu_ctx_t *ctx, int64_t max_ms) {
  int64_t end = tdist__now_ns() + max_ms * 1000000;
  for (owing_req_t q = {ctx, 0};; usleep(2000)) {
    tdist_backend_call(ctx->progress, count_owing, &q);
    if (!q.n || tdist__now_ns() >= end) break;
  }
}

/* ---- creation and the end ------------------------------------------------------- */

int tdist__cpu_lazy_create(cpu_ctx_t *ctx, const tdist_backend_params_t *p, int lfd,
                           const char *me) {
  int rc = 0;
  cpu_lazy_t *lz = tdist__calloc(1, sizeof(*lz));
  if (!lz) return tdist__error(TDIST_ERR_NO_MEMORY, "cpu: out of memory");
  pthread_mutex_init(&lz->mu, NULL);
  pthread_cond_init(&lz->cv, NULL);
  lz->refs = 1;
  lz->lfd = lfd;
  lz->nbusy = 2 * p->size;
  lz->rank = p->rank;
  lz->size = p->size;
  lz->uid = p->uid;
  lz->timeout_ms = p->timeout_ms > 0 ? p->timeout_ms : 1800000;
  lz->st = tdist__calloc((size_t)p->size, 1);
  lz->dialq = tdist__calloc((size_t)p->size, sizeof(int));
  lz->busy = tdist__malloc(sizeof(int) * (size_t)lz->nbusy);
  for (int i = 0; lz->busy && i < lz->nbusy; i++)
    lz->busy[i] = -1;
  if (!lz->st || !lz->dialq || !lz->busy) {
    rc = tdist__error(TDIST_ERR_NO_MEMORY, "cpu: out of memory");
    goto fail;
  }
  TDIST_CHECKGOTO(tdist_store_prefix(p->store, "cpu/addr/", &lz->store), rc, fail);
  char key[32];
  snprintf(key, sizeof(key), "%d", p->rank);
  TDIST_CHECKGOTO(tdist_store_set(lz->store, key, me, strlen(me)), rc, fail);
  for (int i = 0; i < p->size; i++) {
    if (i == p->rank) continue;
    cpu_conn_t *c = tdist__cpu_conn_new(ctx, i, -1, "not connected yet", 0);
    if (!c) {
      rc = tdist__error(TDIST_ERR_NO_MEMORY, "cpu: out of memory");
      goto fail;
    }
    c->link = CPU_LINK_IDLE;
    c->quiet = 1;
    ctx->conns[i] = c;
  }
  ctx->lazy = lz;
  return 0;
fail:
  lz->lfd = -1; /* the caller's still */
  lazy_unref(lz);
  return rc;
}

/* (progress, from start_all) */
void tdist__cpu_lazy_start(cpu_ctx_t *ctx) {
  cpu_lazy_t *lz = ctx->lazy;
  uv_async_init(tdist_backend_loop(ctx->progress), &lz->async, on_async);
  lz->async.data = lz;
  pthread_mutex_lock(&lz->mu);
  lz->ctx = ctx;
  lz->async_on = 1;
  lz->refs++; /* the handle's */
  pthread_mutex_unlock(&lz->mu);
}

int tdist__cpu_lazy_threads(cpu_ctx_t *ctx) {
  cpu_lazy_t *lz = ctx->lazy;
  pthread_mutex_lock(&lz->mu);
  lz->refs += 2;
  pthread_mutex_unlock(&lz->mu);
  int rc = 0;
  if (pthread_create(&lz->dialer, NULL, dialer_main, lz) != 0) {
    lazy_unref(lz);
    lazy_unref(lz);
    return tdist__error(TDIST_ERR_INTERNAL, "cpu: cannot start the dialer thread");
  }
  if (pthread_create(&lz->acceptor, NULL, acceptor_main, lz) != 0) {
    lazy_unref(lz);
    rc = tdist__error(TDIST_ERR_INTERNAL, "cpu: cannot start the acceptor thread");
    pthread_mutex_lock(&lz->mu);
    atomic_store(&lz->stop, 1);
    pthread_cond_broadcast(&lz->cv);
    pthread_mutex_unlock(&lz->mu);
    pthread_join(lz->dialer, NULL);
    return rc;
  }
  lz->threads = 1;
  return 0;
}

/* (progress, the last release) No handoff from here on. */
void tdist__cpu_lazy_stop(cpu_ctx_t *ctx) {
  cpu_lazy_t *lz = ctx->lazy;
  pthread_mutex_lock(&lz->mu);
  lz->ctx = NULL;
  int on = lz->async_on;
  lz->async_on = 0;
  atomic_store(&lz->stop, 1);
  pthread_cond_broadcast(&lz->cv);
  for (int i = 0; i < lz->nbusy; i++) /* a handshake in progress returns at once */
    if (lz->busy[i] >= 0) shutdown(lz->busy[i], SHUT_RDWR);
  pthread_mutex_unlock(&lz->mu);
  if (on) uv_close((uv_handle_t *)&lz->async, on_async_closed);
}

void tdist__cpu_lazy_end(cpu_lazy_t *lz, int join) {
  if (!lz) return;
  if (lz->threads && join) {
    pthread_join(lz->dialer, NULL);
    pthread_join(lz->acceptor, NULL);
  } else if (lz->threads) {
    pthread_detach(lz->dialer);
    pthread_detach(lz->acceptor);
  }
  lazy_unref(lz);
}

/* From how many ranks `auto` connects on first use: below it the full mesh
 * costs a few milliseconds at creation and spares the first collectives a
 * connect per new pair (about 1 ms each here); from it on the mesh's n - 1
 * sockets per rank and the store's O(n^2) address reads dominate. */
TDIST_PARAM(CpuLazyFrom, "TDIST_CPU_LAZY_FROM", 64)

int tdist__cpu_lazy_mode(int size) {
  const char *m = tdist__param_str("TDIST_CPU_CONNECT", "auto");
  if (!strcmp(m, "eager")) return 0;
  if (!strcmp(m, "lazy")) return 1;
  return size >= tdist__param_CpuLazyFrom();
}
