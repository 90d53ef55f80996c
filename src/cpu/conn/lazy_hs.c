/*
 * lazy_hs.c - the blocking side of lazy connections (see lazy.c for the
 * design): the dialer, the acceptor, each handshake on a short-lived
 * thread of its own, the tie-break between two ranks dialing each other,
 * and the handoff of the result to the progress thread.
 *
 * Threads: everything here runs on the dialer (tdist__cpu_lz_dialer_main),
 * the acceptor (tdist__cpu_lz_acceptor_main) or a handshake thread
 * (hs_main; or on the dialer/acceptor itself when none can start). Each
 * owns its socket until hand_over queues it for the progress thread
 * (lazy.c: on_async); the per-peer state, the dial queue and the busy
 * sockets are under lz->mu (lazy.h).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
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

/* ---- a handshake's socket, its end and the handoff (any of the threads) --------- */

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
  if (d) tdist__cpu_lz_done_free(d);
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
      tdist__cpu_lz_done_free(d);
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
    tdist__cpu_lz_done_free(d);
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
  tdist__cpu_lz_unref(h.lz);
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
    tdist__cpu_lz_unref(lz); /* not the last: the caller's thread holds one */
  }
  if (incoming)
    take_incoming(lz, arg);
  else
    dial(lz, arg);
}

void *tdist__cpu_lz_dialer_main(void *arg) {
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
  tdist__cpu_lz_unref(lz);
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

void *tdist__cpu_lz_acceptor_main(void *arg) {
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
  tdist__cpu_lz_unref(lz);
  return NULL;
}
