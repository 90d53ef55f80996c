/*
 * io.c - socket I/O on the progress thread (the transport), and the
 * staging-buffer cache.
 *
 * Sending: tdist__cpu_send appends a message to the connection's queue and,
 * if the queue was empty, flushes at once; flush writes as many queued
 * messages as the socket takes with one sendmsg (header + payload iovecs,
 * payloads straight from the caller's buffers). What does not fit waits for
 * UV_WRITABLE. Once a message's last byte is in the kernel (or, for an RMA
 * descriptor, once the peer ACKs it) its transfer is recorded done
 * (tdist__cpu_xfer_done): flush never runs the engine, so it is never
 * re-entered and no op or group goes away under it.
 *
 * Receiving: bytes are read into a 64 KiB staging buffer and parsed there
 * (several small messages per read() call); a large payload whose
 * destination is known is read directly into it. dispatch.c decides where a
 * payload goes (tdist__cpu_on_header) and what happens when it is complete
 * (tdist__cpu_on_payload).
 *
 * The poll callback is a top-level point (cpu.h): between two reads and at
 * its end it runs the engine (tdist__cpu_run_ready), so a round finished by
 * one read starts before the next read (its messages are then placed
 * directly), and its sends go out in the same callback.
 *
 * EOF or an error on a socket: tdist__cpu_on_conn_lost, which reports the
 * failure of every group that still needs that peer. Everything here runs
 * on the progress thread and never blocks (non-blocking fds,
 * level-triggered uv_poll).
 */
#include <errno.h>
#include <inttypes.h>
#include <string.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "util/alloc.h"
#include "util/error.h"
#include "util/log.h"
#include "cpu/base/base.h"
#include "cpu/transport/transport.h"

#define RX_CAP CPU_RX_CAP
#define DIRECT_MIN 4096 /* payload left at least this: read() into the destination */
#define MAX_IOV 64

/* ---- message pool (progress thread only) ---------------------------------- */

static tdist__list_t msg_pool = {&msg_pool, &msg_pool};

cpu_msg_t *tdist__cpu_msg_new(void) {
  tdist__list_t *n = tdist__list_first(&msg_pool);
  cpu_msg_t *m;
  if (n) {
    tdist__list_remove(n);
    m = tdist__list_entry(n, cpu_msg_t, link);
  } else {
    m = tdist__malloc(sizeof(*m));
  }
  if (!m) return NULL;
  memset(m, 0, sizeof(*m));
  tdist__list_init(&m->link);
  return m;
}

/* m must be off every queue. */
static void msg_free(cpu_msg_t *m) {
  tdist__free(m->owned);
  m->owned = NULL;
  tdist__list_push_front(&msg_pool, &m->link);
}

/* ---- buffer cache (progress thread only) ---------------------------------- */

struct cpu_buf {
  struct cpu_buf *next;
  size_t cap;
};
#define BUF_HDR 64 /* keeps the data 64-byte aligned after the malloc's 16 */

void *tdist__cpu_buf_get(cpu_ctx_t *ctx, size_t len) {
  struct cpu_buf **pp = &ctx->bufs;
  for (; *pp; pp = &(*pp)->next) {
    struct cpu_buf *b = *pp;
    if (b->cap >= len && b->cap <= 2 * len + (64u << 10)) {
      *pp = b->next;
      ctx->cached_bytes -= b->cap;
      return (uint8_t *)b + BUF_HDR;
    }
  }
  struct cpu_buf *b = tdist__malloc(BUF_HDR + (len ? len : 1));
  if (!b) return NULL;
  b->cap = len;
  return (uint8_t *)b + BUF_HDR;
}

void tdist__cpu_buf_put(cpu_ctx_t *ctx, void *p) {
  if (!p) return;
  struct cpu_buf *b = (struct cpu_buf *)((uint8_t *)p - BUF_HDR);
  if (ctx->cached_bytes + b->cap > (size_t)tdist__param_CpuCacheBytes()) {
    tdist__free(b);
    return;
  }
  b->next = ctx->bufs;
  ctx->bufs = b;
  ctx->cached_bytes += b->cap;
}

void tdist__cpu_buf_drain(cpu_ctx_t *ctx) {
  while (ctx->bufs) {
    struct cpu_buf *b = ctx->bufs;
    ctx->bufs = b->next;
    tdist__free(b);
  }
  ctx->cached_bytes = 0;
}

/* ---- sending ------------------------------------------------------------------ */

static void on_poll(uv_poll_t *h, int status, int events);

static void watch(cpu_conn_t *c) {
  if (c->dead || c->link != CPU_LINK_UP) return; /* not connected: no poll yet */
  /* Parked: no reads, but a peer that goes away must still be noticed. */
  /* A ring's room is announced by a doorbell on the socket (shm_conn.c),
   * which is always writable. */
  int ev = (c->parked ? UV_DISCONNECT : UV_READABLE) |
           (!tdist__list_empty(&c->txq) && !c->tx_err && !c->tx_ring ? UV_WRITABLE : 0);
  if (ev != c->events && !cpu_off_loop(c->ctx)) {
    c->events = ev;
    uv_poll_start(&c->poll, ev, on_poll);
  }
}

/* Bytes handed to one sendmsg. tcp_sendmsg holds the socket lock while it
 * copies, and the ACKs that open the peer's window wait in the backlog
 * until it lets go: one 64 MiB call stalls the stream at every window's
 * end. 1 MiB calls keep it flowing (n=2 broadcast of 16 MiB: 6.2 -> 3.5 ms,
 * docs/cpu-backend.md). */
static size_t send_chunk(void) {
  int64_t v = tdist__param_CpuSendChunk();
  return v < 4096 ? 4096 : (size_t)v;
}

int tdist__cpu_msgs_iov(tdist__list_t *q, size_t budget, struct iovec *iov, int max) {
  const size_t hs = sizeof(cpu_hdr_t);
  int cnt = 0;
  for (tdist__list_t *n = q->next; n != q && cnt + 2 <= max && budget; n = n->next) {
    cpu_msg_t *m = tdist__list_entry(n, cpu_msg_t, link);
    if (m->off < hs) iov[cnt++] = (struct iovec){(uint8_t *)&m->hdr + m->off, hs - m->off};
    size_t poff = m->off > hs ? m->off - hs : 0, left = m->hdr.len - poff;
    if (left > budget) left = budget;
    if (left) iov[cnt++] = (struct iovec){(void *)(m->data + poff), left};
    budget -= left;
  }
  return cnt;
}

ssize_t tdist__cpu_msgs_write(int fd, tdist__list_t *q, size_t budget, int flags) {
  struct iovec iov[MAX_IOV];
  int cnt = tdist__cpu_msgs_iov(q, budget, iov, MAX_IOV);
  /* sendmsg, not writev: MSG_NOSIGNAL, a dead peer must not SIGPIPE us. */
  struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)cnt};
  return sendmsg(fd, &mh, MSG_NOSIGNAL | flags);
}

/* Write the head of c's queue to its stream: the socket, or the ring. */
static ssize_t conn_write(cpu_conn_t *c, size_t budget) {
  if (!c->tx_ring) return tdist__cpu_msgs_write(c->fd, &c->txq, budget, 0);
  struct iovec iov[MAX_IOV];
  int cnt = tdist__cpu_msgs_iov(&c->txq, budget, iov, MAX_IOV);
  return tdist__cpu_shm_write(c, iov, cnt);
}

/* Read from c's stream: the socket, or the ring (empty: EAGAIN; the
 * ring's end is the socket's EOF, shm_conn.c). */
static ssize_t conn_read(cpu_conn_t *c, void *buf, size_t len) {
  if (!c->rx_ring) return recv(c->fd, buf, len, 0);
  return tdist__cpu_shm_read(c, buf, len);
}

cpu_msg_t *tdist__cpu_msgs_written(tdist__list_t *q, size_t *left) {
  tdist__list_t *it = tdist__list_first(q);
  if (!it) return NULL;
  cpu_msg_t *m = tdist__list_entry(it, cpu_msg_t, link);
  size_t rest = sizeof(cpu_hdr_t) + m->hdr.len - m->off;
  if (*left < rest) {
    m->off += *left;
    *left = 0;
    return NULL;
  }
  *left -= rest;
  tdist__list_remove(it);
  return m;
}

/* Write what the socket takes. Transport only: a written message's op is
 * told with tdist__cpu_xfer_done, which records and returns. */
static void flush(cpu_conn_t *c) {
  const size_t chunk = send_chunk();
  while (!tdist__list_empty(&c->txq) && !c->dead && !c->tx_err) {
    ssize_t n = conn_write(c, chunk);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      if (errno == EPIPE || errno == ECONNRESET) {
        /* The peer closed. What it sent before (an ERR message naming the
         * real cause, e.g. a mismatch it found with our payload unread) is
         * read first: the socket now polls readable/error, and on_poll
         * reports the loss after the reads. */
        c->tx_err = errno;
        break;
      }
      char why[96];
      snprintf(why, sizeof(why), "write failed: %s", strerror(errno));
      c->ctx->ev->lost(c, why);
      return;
    }
    size_t left = (size_t)n;
    cpu_msg_t *m;
    while ((m = tdist__cpu_msgs_written(&c->txq, &left))) {
      cpu_op_t *op = m->op;
      if (m->cookie && op) {
        /* RMA descriptor: the peer still reads the payload; the transfer is
         * done on the ACK (tdist__cpu_conn_acked). */
        tdist__list_push_back(&c->acks, &m->link);
        continue;
      }
      msg_free(m);
      if (op) c->ctx->ev->sent(op);
    }
  }
  watch(c);
}

void tdist__cpu_send(cpu_conn_t *c, cpu_msg_t *m) {
  if (c->dead) {
    /* Callers check first; a message for a dead peer goes nowhere. */
    msg_free(m);
    return;
  }
  m->off = 0;
  int idle = tdist__list_empty(&c->txq);
  tdist__list_push_back(&c->txq, &m->link);
  if (c->link != CPU_LINK_UP) { /* queued until connected (lazy.c: attach flushes) */
    c->ctx->hooks->want(c);     /* conn/lazy.c, registered by the entry */
    return;
  }
  /* Only a message at the head may be written now; behind others, the
   * socket is full and UV_WRITABLE flushes it in turn. */
  if (idle) flush(c);
}

void tdist__cpu_conn_acked(cpu_conn_t *c, uint64_t cookie) {
  tdist__list_t *n;
  tdist__list_foreach(n, &c->acks) {
    cpu_msg_t *m = tdist__list_entry(n, cpu_msg_t, link);
    if (m->cookie != cookie) continue;
    tdist__list_remove(n);
    cpu_op_t *op = m->op;
    msg_free(m);
    if (op) c->ctx->ev->sent(op);
    return;
  }
  /* Not found: its op was aborted (tdist__cpu_conn_forget). */
}

static void drop_acks(cpu_conn_t *c, int all, uint64_t uid) {
  tdist__list_t *n, *next;
  tdist__list_foreach_safe(n, next, &c->acks) {
    cpu_msg_t *m = tdist__list_entry(n, cpu_msg_t, link);
    if (!all && m->hdr.uid != uid) continue;
    tdist__list_remove(n);
    msg_free(m);
  }
}

void tdist__cpu_conn_free_queues(cpu_conn_t *c) {
  tdist__list_t *n;
  while ((n = tdist__list_first(&c->txq))) {
    tdist__list_remove(n);
    msg_free(tdist__list_entry(n, cpu_msg_t, link));
  }
  drop_acks(c, 1, 0);
}

void tdist__cpu_conn_forget(cpu_conn_t *c, uint64_t uid) {
  drop_acks(c, 0, uid);
  tdist__list_t *n, *next;
  tdist__list_foreach_safe(n, next, &c->txq) {
    cpu_msg_t *m = tdist__list_entry(n, cpu_msg_t, link);
    if (!m->op || m->hdr.uid != uid) continue;
    if (m->off == 0) {
      tdist__list_remove(n);
      msg_free(m);
      continue;
    }
    /* Partly written: the stream must stay whole, so the rest is copied out
     * of the caller's buffer (which is no longer ours to read). */
    size_t hs = sizeof(cpu_hdr_t);
    uint8_t *copy = tdist__malloc(m->hdr.len ? m->hdr.len : 1);
    if (copy && m->hdr.len) {
      size_t poff = m->off > hs ? m->off - hs : 0;
      tdist__cpu_copy(copy + poff, m->data + poff, m->hdr.len - poff);
    }
    tdist__free(m->owned);
    m->owned = copy;
    m->data = copy;
    m->op = NULL;
    if (!copy) {
      c->ctx->ev->lost(c, "out of memory");
      return;
    }
  }
  watch(c);
}

/* ---- receiving ---------------------------------------------------------------- */

/* Parse staged bytes: headers and payload pieces. -1 when the conn died. */
static int parse(cpu_conn_t *c) {
  const size_t hs = sizeof(cpu_hdr_t);
  for (;;) {
    if (!c->rx_body) {
      if (c->rx_hi - c->rx_lo < hs) break;
      memcpy(&c->rh, c->rx + c->rx_lo, hs);
      c->rx_lo += hs;
      if (c->rh.magic != CPU_MAGIC) {
        c->ctx->ev->lost(c, "sent a malformed message (bad magic)");
        return -1;
      }
      c->rx_body = 1;
      c->rx_got = 0;
      cpu_rx_clear(c);
      c->ctx->ev->header(c);
      if (c->dead) return -1;
      if (c->parked) return 0; /* the staged bytes wait with the rest */
    }
    size_t need = c->rh.len - c->rx_got, have = c->rx_hi - c->rx_lo;
    size_t take = need < have ? need : have;
    if (take) {
      if (c->rx_dst) tdist__cpu_copy(c->rx_dst + c->rx_got, c->rx + c->rx_lo, take);
      c->rx_lo += take;
      c->rx_got += take;
    }
    if (c->rx_got < c->rh.len) break;
    c->rx_body = 0;
    c->ctx->ev->payload(c);
    if (c->dead) return -1;
  }
  if (c->rx_lo == c->rx_hi) c->rx_lo = c->rx_hi = 0;
  return 0;
}

/* Why the peer's stream ended (EOF), for the failure's message. */
static void eof_why(const cpu_conn_t *c, char *why, size_t wl) {
  if (c->bye && c->bye_cause >= 0)
    snprintf(why, wl, "left after losing world rank %d", c->bye_cause);
  else
    snprintf(why, wl, "%s", c->bye ? "left (destroyed its group)" : "closed its connection");
}

/* Bytes the next read may stage: all that fits from a socket (one call,
 * many messages); from a ring only up to the next header's end, so a
 * payload with a destination is then read into it directly (one copy out
 * of the ring, not two; docs/cpu-backend.md, Transports). */
static size_t stage_len(const cpu_conn_t *c) {
  const size_t hs = sizeof(cpu_hdr_t);
  size_t room = RX_CAP - c->rx_hi, have = c->rx_hi - c->rx_lo;
  size_t need = c->rx_body ? c->rh.len - c->rx_got + hs : hs; /* to the next header's end */
  size_t want = need > have ? need - have : hs;               /* (parse took what was whole) */
  return c->rx_ring && want < room ? want : room;
}

/* Read what c's stream has (at most 64 reads). Between two reads no
 * transport call is on the stack, so the engine runs there: a round
 * completed by one read starts before the next, whose messages then find
 * their receive (and a receive adopted by the engine gets the rest of its
 * payload directly). 0: all read; 1: more is there (the limit); -1: c died
 * or parked. */
int tdist__cpu_conn_read(cpu_conn_t *c) {
  cpu_ctx_t *ctx = c->ctx;
  for (int iter = 0; iter < 64; iter++) {
    if (c->dead || c->parked) return -1;
    ssize_t n;
    if (c->rx_body && c->rx_dst && c->rx_lo == c->rx_hi && c->rh.len - c->rx_got >= DIRECT_MIN) {
      n = conn_read(c, c->rx_dst + c->rx_got, c->rh.len - c->rx_got);
      if (n > 0) {
        c->rx_got += (size_t)n;
        if (c->rx_got == c->rh.len) {
          c->rx_body = 0;
          c->ctx->ev->payload(c);
          ctx->ev->settle(ctx);
        }
        continue;
      }
    } else {
      if (c->rx_lo > 0) {
        tdist__cpu_move(c->rx, c->rx + c->rx_lo, c->rx_hi - c->rx_lo);
        c->rx_hi -= c->rx_lo;
        c->rx_lo = 0;
      }
      n = conn_read(c, c->rx + c->rx_hi, stage_len(c));
      if (n > 0) {
        c->rx_hi += (size_t)n;
        if (parse(c) < 0) return -1;
        ctx->ev->settle(ctx);
        continue;
      }
    }
    char why[96];
    if (n == 0) {
      eof_why(c, why, sizeof(why));
      c->ctx->ev->lost(c, why);
      return -1;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    snprintf(why, sizeof(why), "connection failed: %s", strerror(errno));
    c->ctx->ev->lost(c, why);
    return -1;
  }
  return 1;
}

/* The socket's turn to be read. A ring's socket carries only doorbells and
 * the peer's end (shm_conn.c): those are taken first; the ring is read
 * after them, so what the peer wrote before it left is read before its end
 * is reported. */
static void on_readable(cpu_conn_t *c) {
  if (!c->rx_ring) {
    tdist__cpu_conn_read(c);
    return;
  }
  int end = tdist__cpu_shm_doorbells(c);           /* 0, or the errno of the end (-1: EOF) */
  if (end && c->parked) tdist__cpu_conn_unpark(c); /* the rest is read now, or never */
  int more = tdist__cpu_conn_read(c);
  if (c->dead) return;
  if (more == 1) tdist__cpu_shm_more(c->ctx);
  if (!tdist__list_empty(&c->txq)) flush(c); /* the doorbell may say there is room */
  if (end && !c->dead && more == 0) {
    char why[96];
    if (end < 0)
      eof_why(c, why, sizeof(why));
    else
      snprintf(why, sizeof(why), "connection failed: %s", strerror(end));
    c->ctx->ev->lost(c, why);
  }
}

static void poll_conn(cpu_conn_t *c, int status, int events) {
  int tx_err = c->tx_err; /* a write failed since the last call */
  if (status < 0) {
    /* libuv reports EPOLLERR as UV_EBADF. What the peer sent before it went
     * away is read first (an ERR message names the real cause, e.g. a
     * mismatch, where the peer then closed with our payload unread: RST);
     * the read then meets the socket's error. */
    if (c->parked) tdist__cpu_conn_unpark(c);
    if (!c->dead) on_readable(c);
    if (c->dead) return;
    /* Not met (data left after 64 reads): ask the socket what happened. */
    int err = 0;
    socklen_t len = sizeof(err);
    char why[96];
    if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err)
      snprintf(why, sizeof(why), "connection failed: %s", strerror(err));
    else
      snprintf(why, sizeof(why), "connection failed: %s", uv_strerror(status));
    c->ctx->ev->lost(c, why);
    return;
  }
  if (c->parked && (events & UV_DISCONNECT)) tdist__cpu_conn_unpark(c); /* read to the EOF */
  /* Reads first, for the same reason: a peer's ERR or BYE is seen before a
   * write to it fails with EPIPE. */
  if (!c->dead && (events & (UV_READABLE | UV_DISCONNECT))) on_readable(c);
  if (!c->dead && (events & UV_WRITABLE)) flush(c);
  if (!c->dead && tx_err) {
    /* The write failed before this call and the reads found no EOF. */
    char why[96];
    snprintf(why, sizeof(why), "write failed: %s", strerror(tx_err));
    c->ctx->ev->lost(c, why);
  }
}

/* The uv_poll callback (progress thread, top level). */
static void on_poll(uv_poll_t *h, int status, int events) {
  cpu_conn_t *c = h->data; /* freed only after uv_close (conn.c) */
  cpu_ctx_t *ctx = c->ctx;
  tdist__cpu_enter(ctx);
  if (!c->dead) poll_conn(c, status, events);
  ctx->ev->settle(ctx); /* what this callback's writes and reads finished */
  tdist__cpu_leave(ctx);
  /* No tdist_backend_kick here: sockets wake epoll by themselves, and
   * spinning after every message costs more than it saves when ranks share
   * cores (measured in docs/cpu-backend.md). */
}

/* ---- deferred reads (cpu.h) ----------------------------------------------------- */

static uint64_t defer_ms(void) {
  int64_t us = tdist__param_CpuDeferUs();
  return us <= 1000 ? 1 : (uint64_t)(us + 999) / 1000;
}

static void on_park_timer(uv_timer_t *t) {
  cpu_ctx_t *ctx = t->data;
  tdist__cpu_enter(ctx);
  uint64_t now = tdist__cpu_now_ms(), wait = 0;
  for (int i = 0; i < ctx->size && ctx->nparked; i++) {
    cpu_conn_t *c = ctx->conns[i];
    if (!c || !c->parked) continue;
    if (now - c->parked_at >= defer_ms()) {
      tdist__cpu_conn_unpark(c); /* the caller is busy elsewhere: stage it */
    } else {
      uint64_t left = c->parked_at + defer_ms() - now;
      if (!wait || left < wait) wait = left;
    }
  }
  if (ctx->nparked && wait) uv_timer_start(t, on_park_timer, wait, 0);
  ctx->ev->settle(ctx); /* top level: what the unparked headers finished */
  tdist__cpu_leave(ctx);
}

void tdist__cpu_park_sync(cpu_ctx_t *ctx) {
  if (!ctx->timer_on) return;
  int active = uv_is_active((uv_handle_t *)&ctx->park_timer);
  if (ctx->nparked && !active)
    uv_timer_start(&ctx->park_timer, on_park_timer, 1, 0); /* it re-arms for the rest */
  else if (!ctx->nparked && active)
    uv_timer_stop(&ctx->park_timer);
}

void tdist__cpu_ctx_start_timer(cpu_ctx_t *ctx) {
  uv_timer_init(tdist_backend_loop(ctx->progress), &ctx->park_timer);
  ctx->park_timer.data = ctx;
  ctx->timer_on = 1;
}

void tdist__cpu_conn_park(cpu_conn_t *c) {
  cpu_ctx_t *ctx = c->ctx;
  c->parked = 1;
  c->parked_at = tdist__cpu_now_ms();
  TDIST_TRACE(CPU,
              "world rank %d: %" PRIu64 "-byte message for collective #%" PRIu64
              " waits in the kernel",
              c->peer, c->rh.len, c->rh.seq);
  if (ctx->nparked++ == 0 && !cpu_off_loop(ctx))
    uv_timer_start(&ctx->park_timer, on_park_timer, defer_ms(), 0);
  watch(c);
}

void tdist__cpu_conn_unpark(cpu_conn_t *c) {
  cpu_ctx_t *ctx = c->ctx;
  if (!c->parked) return;
  c->parked = 0;
  if (--ctx->nparked == 0 && !cpu_off_loop(ctx)) uv_timer_stop(&ctx->park_timer);
  if (c->dead) return;
  TDIST_TRACE(CPU, "world rank %d: reading on after %" PRIu64 " ms", c->peer,
              tdist__cpu_now_ms() - c->parked_at);
  /* Dispatch the header again (it may not park twice): now it finds its
   * receive, or goes to the unexpected list, or is discarded (aborted). */
  cpu_rx_clear(c);
  ctx->no_park = 1;
  c->ctx->ev->header(c);
  ctx->no_park = 0;
  /* Staged payload bytes are parsed at the next read: more of the payload
   * (which is larger than the staging buffer) is still in the socket, so
   * the poll fires. */
  watch(c);
}

void tdist__cpu_ctx_unpark(cpu_ctx_t *ctx) {
  for (int i = 0; i < ctx->size && ctx->nparked; i++)
    if (ctx->conns[i]) tdist__cpu_conn_unpark(ctx->conns[i]);
}

void tdist__cpu_conn_watch(cpu_conn_t *c) {
  if (!c->dead) {
    watch(c);
  } else if (c->events) {
    uv_poll_stop(&c->poll); /* lost while a caller drove (dispatch.c) */
    c->events = 0;
  }
}

void tdist__cpu_conn_drive(cpu_conn_t *c) {
  if (c->link != CPU_LINK_UP) return;
  /* A ring is read without a system call; its socket (doorbells, the EOF)
   * is the progress thread's, woken by epoll. */
  if (!c->dead && !c->parked && (!c->rx_ring || tdist__cpu_ring_avail(c->rx_ring)))
    if (tdist__cpu_conn_read(c) == 1) tdist__cpu_shm_more(c->ctx);
  if (!c->dead && !tdist__list_empty(&c->txq) && !c->tx_err) flush(c);
}

void tdist__cpu_conn_start(cpu_conn_t *c) {
  uv_poll_init(tdist_backend_loop(c->ctx->progress), &c->poll, c->fd);
  c->poll.data = c;
  c->events = UV_READABLE;
  uv_poll_start(&c->poll, UV_READABLE, on_poll);
}

/* Blocking I/O with a deadline (setup only). */
int tdist__cpu_io_full(int fd, void *buf, size_t len, int writing, int64_t deadline_ns) {
  uint8_t *p = buf;
  while (len) {
    struct pollfd pfd = {.fd = fd, .events = writing ? POLLOUT : POLLIN};
    int64_t left_ms = (deadline_ns - tdist__now_ns()) / 1000000;
    if (left_ms <= 0) return TDIST_ERR_TIMEOUT;
    if (poll(&pfd, 1, (int)(left_ms > 1000 ? 1000 : left_ms)) <= 0) continue;
    ssize_t n = writing ? send(fd, p, len, MSG_NOSIGNAL) : recv(fd, p, len, 0);
    if (n == 0) return TDIST_ERR_CLOSED;
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return TDIST_ERR_IO;
    }
    p += n;
    len -= (size_t)n;
  }
  return 0;
}
