/*
 * shm_conn.c - the shared-memory transport: a connection's byte stream
 * through two rings (shm.c) instead of its socket, between ranks of one
 * host.
 *
 * Why: a message through loopback TCP costs two system calls and two
 * copies through the kernel, and wakes the reader through epoll; through a
 * ring it costs two memcpy and, while the reader polls, nothing else. Small
 * messages and control traffic (headers, descriptors, ACKs, signatures)
 * gain most; large payloads still go as descriptors read with one copy
 * (cma.c), now announced through the ring.
 *
 * The ring replaces the socket as the connection's stream: everything io.c
 * would write to the socket (every message, in order) goes into the
 * peer's ring, and io.c's parser reads our ring as it read the socket. So
 * matching, ordering (non-overtaking), descriptors and failure messages
 * work as they did. The socket stays, for two jobs only:
 *   - doorbells: one byte that means "look at the rings". A writer rings
 *     when the reader is not polling (shm.h: the polling count, which a
 *     waiting caller raises while it drives, drive.c), and a reader rings
 *     when it made room for a writer that found the ring full (wwait),
 *     unless a writer thread polls for room itself (wpolling: a waiting
 *     caller retries its writes on every pass); each side then reads its
 *     ring, and retries its writes, from the progress thread's poll
 *     callback, as it did with the socket;
 *   - the end: the peer's EOF or a socket error is how a dead or leaving
 *     peer is seen, as before. The ring is read to its end first, so what
 *     the peer wrote before it went (its ERR, its goodbye) is read before
 *     the loss is reported (io.c, on_readable).
 *
 * Setup (caller thread, within the world's creation; with lazy connections
 * on lazy_hs.c's threads, once per pair, on a two-rank stand-in context):
 * every process makes one segment (a memfd) holding one inbound ring per
 * local peer; the
 * peers trade (pid, fd, where their ring is) over the socket, map each
 * other's segment through /proc/PID/fd/FD (the same permission
 * process_vm_readv needs), and agree: a pair that either side cannot map
 * stays on its socket. Once every peer answered, the memfd is closed: the
 * mappings keep the memory, and nothing is left behind in /dev/shm if a
 * process dies.
 *
 * Threads: setup on the caller thread; everything else under the engine
 * lock (base/lock.c): the progress thread, or a caller driving its op.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "util/alloc.h"
#include "util/error.h"
#include "cpu/base/base.h"
#include "cpu/transport/transport.h"

/* What a pair trades at setup (host byte order: both are on one host). */
typedef struct shm_hello {
  int32_t pid, fd;
  int32_t want, pad;
  uint64_t seg_bytes; /* the segment's size (mapped whole) */
  uint64_t ring_off;  /* the peer's ring in it (it writes there) */
  uint64_t ring_bytes;
} shm_hello_t;

/* ---- doorbells ------------------------------------------------------------------ */

static void ring_bell(int fd) {
  char b = 0;
  if (fd >= 0) (void)send(fd, &b, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
}

int tdist__cpu_shm_doorbells(cpu_conn_t *c) {
  char sink[256];
  for (;;) {
    ssize_t n = recv(c->fd, sink, sizeof(sink), MSG_DONTWAIT);
    if (n > 0) continue;
    if (n == 0) return -1;
    if (errno == EINTR) continue;
    return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : errno;
  }
}

/* ---- the stream ----------------------------------------------------------------- */

/* (cpu.h) The Dekker pair with tdist__cpu_shm_read's wwait check; noinline:
 * a fence inlined into its caller trips GCC's TSan (-Wtsan, shm.h). */
__attribute__((noinline)) size_t tdist__cpu_shm_put(struct tdist__cpu_ring *r,
                                                    const struct iovec *iov, int cnt) {
  size_t w = tdist__cpu_ring_writev(r, iov, cnt);
  if (w) {
    /* In: a wait left by a polling writer (the reader rang no bell for it)
     * would make the reader ring for nothing later, waking our progress
     * thread beside the callers. Set again below when full again. */
    if (atomic_load_explicit(&r->wwait, memory_order_relaxed))
      atomic_store_explicit(&r->wwait, 0, memory_order_relaxed);
    return w;
  }
  if (!cnt) return 0;
  atomic_store(&r->wwait, 1);
  atomic_thread_fence(memory_order_seq_cst);
  return tdist__cpu_ring_writev(r, iov, cnt);
}

_Atomic uint64_t tdist__cpu_shm_writes;

ssize_t tdist__cpu_shm_write(cpu_conn_t *c, const struct iovec *iov, int cnt) {
  size_t w = tdist__cpu_shm_put(c->tx_ring, iov, cnt);
  if (w) atomic_fetch_add_explicit(&tdist__cpu_shm_writes, 1, memory_order_relaxed);
  if (w && tdist__cpu_ring_needs_doorbell(c->tx_ring)) ring_bell(c->fd);
  if (w) return (ssize_t)w;
  errno = EAGAIN;
  return -1;
}

ssize_t tdist__cpu_shm_read(cpu_conn_t *c, void *buf, size_t len) {
  struct tdist__cpu_ring *r = c->rx_ring;
  size_t got = tdist__cpu_ring_read(r, buf, len);
  if (!got) {
    errno = EAGAIN;
    return -1;
  }
  /* Room was made: a writer that found the ring full waits for our bell,
   * unless one of its threads polls for room (a waiting caller retries its
   * writes on every pass): a bell would only wake its progress thread,
   * which takes a core and the engine lock from the callers (64 KiB
   * broadcast n=2: one op in eight waited tens of us on that wake). The
   * writer re-checks wwait when it stops polling (wpoll_end): either it
   * sees wwait still set, or we see wpolling at 0 and ring. */
  atomic_thread_fence(memory_order_seq_cst);
  if (atomic_load(&r->wwait) && atomic_load(&r->wpolling) == 0) {
    atomic_store(&r->wwait, 0);
    ring_bell(c->fd);
  }
  return (ssize_t)got;
}

/* ---- reading on: one pass left bytes in a ring ---------------------------------- */

static void on_ring_idle(uv_idle_t *h) {
  cpu_ctx_t *ctx = h->data;
  tdist__cpu_enter(ctx);
  int more = 0;
  for (int i = 0; i < ctx->size; i++) {
    cpu_conn_t *c = ctx->conns[i];
    if (!c || !c->rx_ring || c->dead || c->parked) continue;
    if (tdist__cpu_ring_avail(c->rx_ring) && tdist__cpu_conn_read(c) == 1) more = 1;
  }
  if (!more) uv_idle_stop(h);
  ctx->ev->settle(ctx);
  tdist__cpu_leave(ctx);
}

void tdist__cpu_shm_start(cpu_ctx_t *ctx) {
  uv_idle_init(tdist_backend_loop(ctx->progress), &ctx->ring_idle);
  ctx->ring_idle.data = ctx;
  ctx->ring_idle_on = 1;
}

void tdist__cpu_shm_more(cpu_ctx_t *ctx) {
  if (!ctx->ring_idle_on || cpu_off_loop(ctx)) return;
  if (!uv_is_active((uv_handle_t *)&ctx->ring_idle)) uv_idle_start(&ctx->ring_idle, on_ring_idle);
}

void tdist__cpu_shm_sync(cpu_ctx_t *ctx) {
  if (!ctx->ring_idle_on || uv_is_active((uv_handle_t *)&ctx->ring_idle)) return;
  for (int i = 0; i < ctx->size; i++) {
    cpu_conn_t *c = ctx->conns ? ctx->conns[i] : NULL;
    if (c && c->rx_ring && !c->dead && !c->parked && tdist__cpu_ring_avail(c->rx_ring)) {
      uv_idle_start(&ctx->ring_idle, on_ring_idle);
      return;
    }
  }
}

void tdist__cpu_shm_drain(cpu_ctx_t *ctx) {
  for (int i = 0; i < ctx->size; i++) {
    cpu_conn_t *c = ctx->conns ? ctx->conns[i] : NULL;
    if (c && c->rx_ring && !c->dead && !c->parked && tdist__cpu_ring_avail(c->rx_ring) &&
        tdist__cpu_conn_read(c) == 1)
      tdist__cpu_shm_more(ctx);
    /* A write that waits for room no bell will announce (a waiter polled
     * for it, then stopped): retried here; a wait with nothing left to
     * write (its message dropped) is taken back. */
    if (c && c->tx_ring && !c->dead && atomic_load(&c->tx_ring->wwait)) {
      if (tdist__list_empty(&c->txq))
        atomic_store(&c->tx_ring->wwait, 0);
      else
        tdist__cpu_conn_drive(c);
    }
  }
}

int tdist__cpu_shm_mark(cpu_ctx_t *ctx, int on) {
  int left = 0;
  /* Only a caller that drives retries its writes on each pass: without
   * TDIST_CPU_DRIVE the writer's side is not polled, and peers must ring.
   * Read here alone, so on and off agree. */
  int wpoll = tdist__param_CpuDrive() != 0;
  /* Under mark_mu, so a ring attached meanwhile (lazy.c) gets exactly the
   * marks that will be taken off it. */
  pthread_mutex_lock(&ctx->mark_mu);
  ctx->nmarks += on ? 1 : -1;
  for (int i = 0; i < ctx->size; i++) {
    cpu_conn_t *c = ctx->conns[i];
    if (!c || !c->rx_ring) continue;
    if (on) {
      tdist__cpu_ring_poll_begin(c->rx_ring);
      if (c->tx_ring && wpoll) tdist__cpu_ring_wpoll_begin(c->tx_ring);
    } else {
      tdist__cpu_ring_poll_end(c->rx_ring);
      if (tdist__cpu_ring_avail(c->rx_ring)) left |= CPU_SHM_LEFT_BYTES;
      if (c->tx_ring && wpoll && tdist__cpu_ring_wpoll_end(c->tx_ring)) left |= CPU_SHM_LEFT_ROOM;
    }
  }
  pthread_mutex_unlock(&ctx->mark_mu);
  return left;
}

void tdist__cpu_shm_attach(cpu_ctx_t *ctx, cpu_conn_t *c, struct tdist__cpu_ring *rx,
                           struct tdist__cpu_ring *tx) {
  if (!rx || !tx) return; /* a pair has both rings or none (setup) */
  pthread_mutex_lock(&ctx->mark_mu);
  for (int k = 0; k < ctx->nmarks; k++) {
    tdist__cpu_ring_poll_begin(rx);
    if (tdist__param_CpuDrive()) tdist__cpu_ring_wpoll_begin(tx);
  }
  c->rx_ring = rx;
  c->tx_ring = tx;
  pthread_mutex_unlock(&ctx->mark_mu);
}

/* ---- setup and teardown --------------------------------------------------------- */

static size_t ring_want(void) {
  int64_t v = tdist__param_CpuShmRingBytes();
  return v < 4096 ? 4096 : (size_t)v;
}

int tdist__cpu_shm_setup(cpu_ctx_t *ctx, const int *local, int64_t deadline) {
  int n = ctx->size, me = ctx->rank, nlocal = 0, rc = 0;
  for (int j = 0; j < n; j++)
    nlocal += j != me && local[j] && ctx->conns[j];
  if (!nlocal) return 0;
  shm_hello_t *peer = tdist__calloc((size_t)n, sizeof(*peer));
  void **maps = tdist__calloc((size_t)n, sizeof(void *));
  int32_t *ok = tdist__calloc((size_t)n, sizeof(int32_t));
  if (!peer || !maps || !ok) {
    rc = tdist__error(TDIST_ERR_NO_MEMORY, "cpu: out of memory");
    goto done;
  }
  int want = tdist__param_CpuShm() != 0;
  if (want && tdist__cpu_shm_seg_create((size_t)nlocal, ring_want(), &ctx->shm) != 0) {
    TDIST_INFO(CPU, "shm: no segment (%s): local peers over TCP", tdist_last_error());
    tdist__error_clear();
    want = 0;
  }
  /* All hellos out before any is read (small writes: no ordering between
   * ranks is needed), then the answers the same way. */
  for (int j = 0, k = 0; j < n; j++) {
    if (j == me || !local[j] || !ctx->conns[j]) continue;
    shm_hello_t h = {.pid = (int32_t)getpid(),
                     .fd = ctx->shm.fd,
                     .want = want,
                     .seg_bytes = ctx->shm.bytes,
                     .ring_off = tdist__cpu_shm_ring_offset(ctx->shm.ring_bytes, (size_t)k++),
                     .ring_bytes = ctx->shm.ring_bytes};
    TDIST_CHECKGOTO(tdist__cpu_io_full(ctx->conns[j]->fd, &h, sizeof(h), 1, deadline), rc, io);
  }
  for (int j = 0; j < n; j++) {
    if (j == me || !local[j] || !ctx->conns[j]) continue;
    shm_hello_t *h = &peer[j];
    TDIST_CHECKGOTO(tdist__cpu_io_full(ctx->conns[j]->fd, h, sizeof(*h), 0, deadline), rc, io);
    if (!want || !h->want ||
        h->ring_off + sizeof(struct tdist__cpu_ring) + h->ring_bytes > h->seg_bytes)
      continue;
    if (tdist__cpu_shm_seg_map(h->pid, h->fd, h->seg_bytes, &maps[j]) != 0) {
      TDIST_INFO(CPU, "shm: cannot map rank %d's rings (%s): TCP with it", j, tdist_last_error());
      tdist__error_clear();
      maps[j] = NULL;
      continue;
    }
    ok[j] = ((struct tdist__cpu_ring *)((char *)maps[j] + h->ring_off))->cap == h->ring_bytes;
  }
  for (int j = 0; j < n; j++)
    if (j != me && local[j] && ctx->conns[j])
      TDIST_CHECKGOTO(tdist__cpu_io_full(ctx->conns[j]->fd, &ok[j], sizeof(ok[j]), 1, deadline), rc,
                      io);
  for (int j = 0, k = 0; j < n; j++) {
    if (j == me || !local[j] || !ctx->conns[j]) continue;
    int32_t theirs = 0;
    TDIST_CHECKGOTO(tdist__cpu_io_full(ctx->conns[j]->fd, &theirs, sizeof(theirs), 0, deadline), rc,
                    io);
    cpu_conn_t *c = ctx->conns[j];
    int ring = k++;
    if (ok[j] == 1 && theirs == 1) {
      c->tx_ring = (struct tdist__cpu_ring *)((char *)maps[j] + peer[j].ring_off);
      c->tx_map = maps[j];
      c->tx_map_bytes = peer[j].seg_bytes;
      c->rx_ring = tdist__cpu_shm_ring(ctx->shm.base, ctx->shm.ring_bytes, (size_t)ring);
      maps[j] = NULL;
    }
  }
  /* Every peer mapped ours or gave up: the mappings keep the memory. */
  tdist__cpu_shm_seg_close_fd(&ctx->shm);
  int on = 0;
  for (int j = 0; j < n; j++)
    on += ctx->conns[j] && ctx->conns[j]->rx_ring;
  TDIST_INFO(CPU, "shm: rank %d: rings with %d of %d local peers (%zu bytes each)", me, on, nlocal,
             ctx->shm.ring_bytes);
  goto done;
io:
  rc = tdist__error(TDIST_ERR_IO, "cpu: shared-memory setup with a peer failed");
done:
  for (int j = 0; maps && j < n; j++)
    if (maps[j]) tdist__cpu_shm_seg_unmap(maps[j], peer[j].seg_bytes);
  tdist__free(peer);
  tdist__free(maps);
  tdist__free(ok);
  return rc;
}

void tdist__cpu_shm_release(cpu_ctx_t *ctx) {
  if (ctx->shm.base || ctx->shm.fd >= 0) tdist__cpu_shm_seg_destroy(&ctx->shm);
  ctx->shm.fd = -1;
  ctx->shm.base = NULL;
}
