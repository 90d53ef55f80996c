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
 * neither failed nor blocked. Two threads per world do the blocking part
 * (lazy_hs.c), each handshake on a short-lived thread of its own
 * (hs_start), so a stopped peer holds up only its own pair:
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
 * Files: this one holds the placeholders, the progress thread's side
 * (on_async, attach), the last release's wait, creation and the end;
 * lazy_hs.c the dialer, acceptor and handshake threads and the tie-break;
 * lazy.h the state both share.
 *
 * Threads: create on the caller; want under the engine lock (it only
 * queues); the two threads own their sockets until the handoff; on_async
 * on the progress thread; stop on the progress thread (release_task), then
 * join on the caller (or detach when the last release runs on the
 * progress thread: the threads then free the state themselves).
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "util/alloc.h"
#include "util/error.h"
#include "cpu/base/base.h"
#include "cpu/transport/transport.h"
#include "cpu/engine/engine.h"
#include "cpu/segment/sc.h"
#include "cpu/conn/conn.h"
#include "cpu/conn/lazy.h"

_Atomic uint64_t tdist__cpu_connects;

/* ---- the progress thread's side ------------------------------------------------- */

/* (progress, engine lock) The placeholder becomes a live connection. */
static void attach(cpu_ctx_t *ctx, lazy_done_t *d) {
  cpu_conn_t *c = ctx->conns[d->peer];
  if (!c || c->link == CPU_LINK_UP || c->dead) {
    tdist__cpu_lz_done_free(d);
    return;
  }
  snprintf(c->addr, sizeof(c->addr), "%s", d->addr);
  if (!d->ok) {
    ctx->ev->lost(c, d->why); /* c->link stays: its poll never started */
    tdist__cpu_lz_done_free(d);
    return;
  }
  c->rx = tdist__malloc(CPU_RX_CAP);
  if (!c->rx) {
    tdist__cpu_lz_done_free(d);
    ctx->ev->lost(c, "could not be connected: out of memory");
    return;
  }
  fcntl(d->fd, F_SETFL, fcntl(d->fd, F_GETFL) | O_NONBLOCK);
  c->fd = d->fd;
  c->pid = d->pid;
  c->cma_tx = d->cma_tx;
  c->tx_map = d->tx_map;
  c->tx_map_bytes = d->tx_map_bytes;
  c->rx_seg = d->rx_seg;
  tdist__cpu_shm_attach(ctx, c, d->rx_ring, d->tx_ring);
  d->fd = -1;
  d->tx_map = NULL;
  d->rx_seg = (tdist__cpu_shm_seg_t){.fd = -1};
  tdist__cpu_lz_done_free(d);
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

static void on_async_closed(uv_handle_t *h) { tdist__cpu_lz_unref(h->data); }

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

void tdist__cpu_lz_done_free(lazy_done_t *d) {
  if (d->fd >= 0) close(d->fd);
  if (d->tx_map) tdist__cpu_shm_seg_unmap(d->tx_map, d->tx_map_bytes);
  if (d->rx_seg.base || d->rx_seg.fd >= 0) tdist__cpu_shm_seg_destroy(&d->rx_seg);
  tdist__free(d);
}

void tdist__cpu_lz_unref(cpu_lazy_t *lz) {
  pthread_mutex_lock(&lz->mu);
  int last = --lz->refs == 0;
  pthread_mutex_unlock(&lz->mu);
  if (!last) return;
  if (lz->lfd >= 0) close(lz->lfd);
  while (lz->done) {
    lazy_done_t *d = lz->done;
    lz->done = d->next;
    tdist__cpu_lz_done_free(d);
  }
  if (lz->store) tdist_store_release(lz->store);
  pthread_mutex_destroy(&lz->mu);
  pthread_cond_destroy(&lz->cv);
  tdist__free(lz->st);
  tdist__free(lz->dialq);
  tdist__free(lz->busy);
  tdist__free(lz);
}

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
  tdist__cpu_lz_unref(lz);
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
  if (pthread_create(&lz->dialer, NULL, tdist__cpu_lz_dialer_main, lz) != 0) {
    tdist__cpu_lz_unref(lz);
    tdist__cpu_lz_unref(lz);
    return tdist__error(TDIST_ERR_INTERNAL, "cpu: cannot start the dialer thread");
  }
  if (pthread_create(&lz->acceptor, NULL, tdist__cpu_lz_acceptor_main, lz) != 0) {
    tdist__cpu_lz_unref(lz);
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
  tdist__cpu_lz_unref(lz);
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
