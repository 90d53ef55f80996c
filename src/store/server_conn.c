/*
 * server_conn.c - one connection of the TCP store server (server_impl.h).
 *
 * Per connection: a read buffer framed incrementally ([u32 len][body]); the
 * first frame must be HELLO (magic, version, token) and may be at most
 * TDIST__STORE_MAX_HELLO bytes; later frames at most TDIST__STORE_MAX_FRAME.
 * Requests run through kv.c; replies collect in `out` and leave in one write
 * per batch (uv_try_write, then uv_write for what remains). Anything
 * malformed, oversized or out of order closes that connection, with the
 * reason logged at WARN; other clients are not affected.
 *
 * Backpressure: requests run only while the connection's unsent replies are
 * below SRV_PIPE_OUT_BYTES, and the socket is read only while they may run,
 * so a client that sends requests and never reads holds at most one large
 * reply and the frames the kernel buffered. The read buffer is sized to the
 * frame at its head once its length is known, and charged to the budget
 * then (wanted_cap); a frame that does not fit is read and dropped, then
 * answered FULL. A large SET keeps that buffer as its value (run_frame),
 * and a large frame's buffer is a spare block of its size when the table
 * kept one (kv.h: the block of a value a SET replaced, pages resident).
 * Large frames are read fairly: see "fair reading" below.
 *
 * Deadlines (the sweep, tdist__srv_conn_sweep): the handshake within the
 * I/O timeout of the accept; an incomplete frame and a reply in flight
 * within the I/O timeout of their last byte moved, so a slow but steady
 * peer is never cut off, one that moves nothing is.
 *
 * Half-close: at the end of input the requests already received still run
 * and their replies are written before the connection closes, unless a
 * request is parked waiting for a key (the client is taken to be gone).
 *
 * Waiting: a get/wait/multi_get whose keys are missing leaves its frame at
 * the head of the read buffer, links one waiter onto its first missing key's
 * entry and arms the connection's timer with the request's timeout. A write
 * to that key (kv->on_write) puts the waiting connections on the ready list;
 * the list is drained at the end of the callback that made the write, and
 * each connection re-runs its head frame from the key it waited on (c->resume:
 * kv.h), blocking again on the next missing key if there is one. The timer
 * re-runs it with `final` set, which answers TIMEOUT.
 * Nothing polls. While blocked, a connection keeps reading into the room its
 * buffer has (so a disconnect is seen and its waiters are freed).
 *
 * Liveness (liveness.h): every write of a heartbeat key is reported to the
 * dead-rank detector with its connection, and tdist__srv_conn_close(), the
 * single place a connection ends, reports the close, so a rank whose
 * connection drops without a "bye" is declared dead at once.
 *
 * Thread: the server's loop thread.
 */
#include <stdio.h>
#include <sys/socket.h>

#include "store/server_impl.h"
#include "util/alloc.h"

typedef tdist__srv_conn_t conn_t;
typedef tdist__srv_waiter_t waiter_t;

static void conn_process(conn_t *c);
static void read_start(conn_t *c);
static int large_reader(const conn_t *c);
static void hold(conn_t *c, int write);

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
  c->nwaiters++;
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
  c->nwaiters = 0;
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

void tdist__srv_on_write(void *ctx, tdist__kv_entry_t *e) {
  struct tdist_store_server *srv = ctx;
  for (waiter_t *w = e->waiters; w; w = w->next)
    make_ready(srv, w->c);
  tdist__live_on_write(srv->live, e, srv->current);
}

void tdist__srv_drain_ready(struct tdist_store_server *srv) {
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

/* ---- buffers and state ------------------------------------------------------------ */

/* Reply bytes not yet taken by the kernel (what the pipeline bound counts),
 * values sent from the table included. */
static size_t unsent(const conn_t *c) {
  return c->out.len + c->ref.len + (c->writing ? c->wbuf.len + c->wref.len : 0);
}

/* Let go of a zero-copy value (sent, or never to be). */
static void unref(conn_t *c, tdist__kv_ref_t *r) {
  if (r->pin) tdist__kv_unpin(&c->srv->kv, r->pin);
  memset(r, 0, sizeof(*r));
}

/* Free b when it is empty and large: an idle connection keeps no big buffer. */
static void shrink_buf(tdist__buf_t *b) {
  if (b->len == 0 && b->cap > SRV_KEEP_BYTES) tdist__buf_free(b);
}

/* Length of the frame at the head of the read buffer, or 0 when its length
 * prefix has not arrived. */
static uint32_t head_len(const conn_t *c) {
  uint32_t len = 0;
  if (c->rlen - c->rpos >= 4) memcpy(&len, c->rbuf + c->rpos, 4);
  return len;
}

/* 1 when the head frame has begun but not fully arrived. */
static int head_partial(const conn_t *c) {
  size_t avail = c->rlen - c->rpos;
  return c->discard > 0 || (avail > 0 && (avail < 4 || avail - 4 < head_len(c)));
}

/* Read while requests may run: not after the end of input, not while the
 * pipeline is full. (A blocked connection reads into the room it has:
 * on_alloc stops it when that is gone.) */
static void update_reading(conn_t *c) {
  if (c->closing) return;
  int want = !c->eof && unsent(c) < SRV_PIPE_OUT_BYTES;
  if (want && !c->reading) {
    c->reading = 1;
    read_start(c);
  } else if (!want && c->reading) {
    uv_read_stop((uv_stream_t *)&c->tcp);
    c->reading = 0;
  }
}

/* ---- connection lifetime -------------------------------------------------------- */

static void on_handle_closed(uv_handle_t *h) {
  conn_t *c = h->data;
  if (--c->handles_open > 0) return;
  unref(c, &c->ref);
  unref(c, &c->wref);
  tdist__free(c->rbuf);
  tdist__buf_free(&c->out);
  tdist__buf_free(&c->wbuf);
  tdist__free(c);
}

void tdist__srv_conn_close(conn_t *c, const char *why) {
  if (c->closing) return;
  if (why) tdist__srv_warn(c->srv, "closing connection from %s: %s", c->peer, why);
  c->closing = 1;
  conn_unwait(c);
  tdist__srv_charge(c); /* closing: its buffers go with the handles */
  struct tdist_store_server *srv = c->srv;
  if (!srv->stopping) {
    tdist__live_on_close(srv->live, c);
    tdist__srv_drain_ready(srv); /* a death record wakes the monitors waiting for it */
  }
  srv->nconns--;
  if (c->held) { /* off the held list: it is not to read or write again */
    for (tdist__srv_conn_t **pp = &srv->held; *pp; pp = &(*pp)->held_next)
      if (*pp == c) {
        *pp = c->held_next;
        break;
      }
    /* Not found: it is on the list tdist__srv_turn_end is working through,
     * which skips a closing connection (freed only after the check phase). */
    c->held = 0;
  }
  if (c->prev)
    c->prev->next = c->next;
  else
    srv->conns = c->next;
  if (c->next) c->next->prev = c->prev;
  uv_close((uv_handle_t *)&c->timer, on_handle_closed);
  uv_close((uv_handle_t *)&c->tcp, on_handle_closed);
}

/* The deadline of a reply counts from the last byte the peer took, not from
 * the start of the write: a reader that takes a 64 MiB reply slowly but
 * steadily is not cut off; one that takes nothing is. What the kernel took
 * of the batch is what was handed out (wpos) less libuv's write queue
 * (what a uv_write in flight has not written yet); when it grew since the
 * last look, that is progress (seen at the sweep's granularity). */
static size_t taken(const conn_t *c) {
  return c->wpos - uv_stream_get_write_queue_size((const uv_stream_t *)&c->tcp);
}

static void note_progress(conn_t *c, uint64_t now) {
  size_t t = taken(c);
  if (t > c->wtaken) {
    c->wtaken = t;
    c->t_write = now;
  }
}

void tdist__srv_conn_sweep(conn_t *c, uint64_t now) {
  struct tdist_store_server *srv = c->srv;
  uint64_t t = srv->io_timeout_ms;
  char why[160];
  if (!t || c->closing) return;
  if (c->writing) note_progress(c, now);
  if (!c->authed && now - c->t_open >= t) {
    snprintf(why, sizeof(why), "no handshake within %llu ms", (unsigned long long)t);
  } else if (c->t_frame && now - c->t_frame >= t) {
    snprintf(why, sizeof(why), "no byte of an incomplete request (%u bytes) in %llu ms",
             c->discard ? c->discard_len : head_len(c), (unsigned long long)(now - c->t_frame));
  } else if (c->writing && now - c->t_write >= t) {
    snprintf(why, sizeof(why), "a reply of %zu bytes (%zu left) has taken no byte in %llu ms",
             c->wbuf.len + c->wref.len, c->wbuf.len + c->wref.len - c->wtaken,
             (unsigned long long)(now - c->t_write));
  } else {
    return;
  }
  tdist__srv_conn_close(c, why);
}

/* ---- writing -------------------------------------------------------------------- */

static void conn_flush(conn_t *c);
static int write_more(conn_t *c);

/* The bytes of buffer b with zero-copy value r (if any) spliced in at r->at:
 * up to three uv bufs; returns how many. */
static int bufs_of(const tdist__buf_t *b, const tdist__kv_ref_t *r, uv_buf_t *v) {
  if (!r->pin) {
    v[0] = uv_buf_init((char *)b->p, (unsigned)b->len);
    return 1;
  }
  int n = 0;
  v[n++] = uv_buf_init((char *)b->p, (unsigned)r->at);
  v[n++] = uv_buf_init((char *)r->p, r->len);
  if (b->len > r->at) v[n++] = uv_buf_init((char *)b->p + r->at, (unsigned)(b->len - r->at));
  return n;
}

/* Bytes [off, off + n) of the batch in wbuf (and wref) as uv bufs. */
static int slice_bufs(const conn_t *c, size_t off, size_t n, uv_buf_t *v) {
  uv_buf_t all[3];
  int na = bufs_of(&c->wbuf, &c->wref, all), k = 0;
  for (int i = 0; i < na && n > 0; i++) {
    if (off >= all[i].len) {
      off -= all[i].len;
      continue;
    }
    size_t len = all[i].len - off < n ? all[i].len - off : n;
    v[k++] = uv_buf_init(all[i].base + off, (unsigned)len);
    n -= len;
    off = 0;
  }
  return k;
}

/* Everything queued went out: reset `out`, and close if that was the last. */
static void flushed(conn_t *c) {
  c->out.len = 0;
  unref(c, &c->ref);
  shrink_buf(&c->out);
  tdist__srv_charge(c);
  if (c->close_after_flush) tdist__srv_conn_close(c, NULL);
}

/* The batch in wbuf is out: its pin goes; the next batch is sent and what
 * waited for room in the pipeline runs (from a callback, not from within
 * conn_process). */
static void batch_done(conn_t *c) {
  c->writing = 0;
  c->wbuf.len = 0;
  unref(c, &c->wref);
  shrink_buf(&c->wbuf);
  conn_flush(c);
  conn_process(c);
  tdist__srv_drain_ready(c->srv);
}

static void on_written(uv_write_t *req, int status) {
  conn_t *c = req->data;
  c->wreq_busy = 0;
  if (c->closing || status < 0) {
    c->writing = 0;
    c->wbuf.len = 0;
    unref(c, &c->wref);                              /* never to be sent */
    if (!c->closing) tdist__srv_conn_close(c, NULL); /* the peer went away */
    return;
  }
  if (write_more(c) && !c->closing) batch_done(c);
}

/* Hand the kernel more of the batch in wbuf (and wref): what uv_try_write
 * takes, then the rest of the chunk in one uv_write (on_written goes on).
 * A batch larger than SRV_KEEP_BYTES is written out of the loop
 * iteration's write allowance (shared by all connections, like reads:
 * "fair reading"), and waits on the held list for
 * the next iteration when it is spent: libuv alone writes as much as the
 * socket takes, several MiB per connection, so 8 clients reading 64 MiB
 * values held every iteration for tens of ms. 1: the whole batch is out
 * (the caller ends it); 0: not yet, or the connection was closed. */
static int write_more(conn_t *c) {
  struct tdist_store_server *srv = c->srv;
  size_t total = c->wbuf.len + c->wref.len;
  int large = total > SRV_KEEP_BYTES;
  while (c->wpos < total) {
    size_t n = total - c->wpos;
    if (large) {
      if (!srv->write_left) {
        hold(c, 1);
        return 0;
      }
      /* What is left of the allowance, in one write (the kernel takes a
       * MiB on loopback at once: four 256 KiB slices made a 1 MiB GET's
       * reply four writes, a POLLOUT and two epoll_ctl, where Redis
       * writes it with one writev); and, as a large frame's reading
       * (on_alloc), a rest of at most one slice past the allowance goes
       * now, not an iteration later (the reply's last 9 bytes, as many as
       * its head, waited for a poll). */
      if (n > srv->write_left + SRV_READ_SLICE) n = srv->write_left;
      srv->write_left -= n < srv->write_left ? n : srv->write_left;
    }
    uv_buf_t b[3];
    int nb = slice_bufs(c, c->wpos, n, b);
    int r = uv_try_write((uv_stream_t *)&c->tcp, b, (unsigned)nb);
    if (r < 0 && r != UV_EAGAIN) {
      tdist__srv_conn_close(c, NULL);
      return 0;
    }
    size_t took = r < 0 ? 0 : (size_t)r;
    c->wpos += took;
    if (took == n) continue;
    nb = slice_bufs(c, c->wpos, n - took, b);
    c->wreq.data = c;
    if (uv_write(&c->wreq, (uv_stream_t *)&c->tcp, b, (unsigned)nb, on_written) != 0) {
      tdist__srv_conn_close(c, NULL);
      return 0;
    }
    c->wreq_busy = 1;
    c->wpos += n - took;
    return 0;
  }
  return 1;
}

/* Send `out` (with its zero-copy value): it becomes the batch in wbuf (and
 * wref), which keep the bytes and the value's pin until the kernel took
 * them; `out` and `ref` collect the next batch. */
static void conn_flush(conn_t *c) {
  if (c->closing || c->writing) return;
  if (c->out.len == 0) {
    flushed(c);
    return;
  }
  tdist__buf_t t = c->wbuf;
  c->wbuf = c->out;
  c->out = t;
  c->out.len = 0;
  c->wref = c->ref;
  memset(&c->ref, 0, sizeof(c->ref));
  c->writing = 1;
  c->wpos = c->wtaken = 0;
  c->t_write = uv_now(&c->srv->loop);
  if (write_more(c) && !c->closing) { /* all of it at once */
    c->writing = 0;
    c->wbuf.len = 0;
    unref(c, &c->wref);
    shrink_buf(&c->wbuf);
    flushed(c);
    return;
  }
  if (c->closing) return;
  shrink_buf(&c->out);
  tdist__srv_charge(c);
}

/* ---- requests ------------------------------------------------------------------- */

static int reply_status(conn_t *c, uint8_t st, uint32_t extra) {
  if (tdist__buf_reserve(&c->out, 9)) return -1;
  size_t f = tdist__frame_begin(&c->out, st);
  tdist__put_u32(&c->out, extra);
  tdist__frame_end(&c->out, f);
  return 0;
}

/* A FULL answer (status, bytes message). 0 or -1 (no memory). */
static int reply_full(conn_t *c, const char *msg) {
  uint32_t n = (uint32_t)strlen(msg);
  if (tdist__buf_reserve(&c->out, 9 + n)) return -1;
  size_t f = tdist__frame_begin(&c->out, TDIST__ST_FULL);
  tdist__put_bytes(&c->out, msg, n);
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
    tdist__srv_warn(c->srv, "client %s speaks protocol %u, server %u", c->peer, ver,
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
    tdist__srv_warn(c->srv, "client %s refused: wrong or missing token", c->peer);
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
  tdist__srv_drain_ready(c->srv);
}

/* Run one complete frame of len bytes at the head. 0 done (advance), 1
 * blocked (keep it at the head), -1 the connection was closed. */
static int run_frame(conn_t *c, const uint8_t *body, uint32_t len) {
  struct tdist_store_server *srv = c->srv;
  const char *why = NULL;
  char why_buf[96];
  if (!c->authed) {
    int h = handle_hello(c, body, len, &why);
    if (h < 0) return tdist__srv_conn_close(c, why), -1;
    if (h > 0) c->close_after_flush = 1;
    return 0;
  }
  tdist__exec_t x = {.final = c->final,
                     .on_missing = on_missing,
                     .admit = tdist__srv_admit,
                     .ctx = c,
                     .resume = c->resume,
                     .resume_idx = c->resume_idx,
                     .resume_off = c->resume_off,
                     .ref = &c->ref};
  /* A large frame that ends the read buffer (it was sized to the frame:
   * wanted_cap): a SET may keep the buffer as its value (kv.h, take). */
  if (len >= TDIST__KV_TAKE_MIN && body + len == c->rbuf + c->rcap && c->rlen == c->rcap) {
    x.take = &c->rbuf;
    x.take_cap = c->rcap;
  }
  srv->current = c;
  int rc = tdist__kv_exec(&srv->kv, body, len, &c->out, &x);
  srv->current = NULL;
  if (x.take && !c->rbuf) { /* the table took the buffer, this frame with it */
    c->rcap = c->rlen = c->rpos = 0;
    tdist__srv_charge(c);
  }
  /* kept only while this frame stays parked at the head */
  c->resume = rc == TDIST__EXEC_BLOCKED ? x.resume : 0;
  c->resume_idx = x.resume_idx;
  c->resume_off = x.resume_off;
  if (rc == TDIST__EXEC_BLOCKED) {
    c->blocked = 1;
    if (!c->timer_armed) {
      uv_timer_start(&c->timer, on_timer, x.timeout_ms, 0);
      c->timer_armed = 1;
    }
    return 1;
  }
  if (rc != TDIST__EXEC_DONE) {
    snprintf(why_buf, sizeof(why_buf), "%s request: %s", tdist__store_op_name(len ? body[0] : 0),
             rc == TDIST__EXEC_NOMEM ? "out of memory" : x.why);
    return tdist__srv_conn_close(c, why_buf), -1;
  }
  if (c->timer_armed) {
    uv_timer_stop(&c->timer);
    c->timer_armed = 0;
  }
  return 0;
}

/* Run complete frames until the buffer runs dry, a request blocks or the
 * pipeline is full; then send, re-charge and decide whether to read. */
static void conn_process(conn_t *c) {
  struct tdist_store_server *srv = c->srv;
  char why_buf[96];
  while (!c->blocked && !c->closing && !c->close_after_flush && !c->discard &&
         unsent(c) < SRV_PIPE_OUT_BYTES) {
    size_t avail = c->rlen - c->rpos;
    if (avail < 4) break;
    uint32_t len = head_len(c);
    uint32_t max = c->authed ? TDIST__STORE_MAX_FRAME : TDIST__STORE_MAX_HELLO;
    if (len == 0 || len > max) {
      snprintf(why_buf, sizeof(why_buf), "frame length %u outside 1..%u%s", len, max,
               c->authed ? "" : " (before the handshake)");
      tdist__srv_conn_close(c, why_buf);
      return;
    }
    if (avail - 4 < len) break;
    int rc = run_frame(c, c->rbuf + c->rpos + 4, len);
    if (rc < 0) return;
    if (rc > 0) break;
    if (c->rbuf) c->rpos += 4 + (size_t)len; /* else taken with the buffer */
  }
  if (c->closing) return;
  if (c->rpos == c->rlen) {
    c->rpos = c->rlen = 0;
    if (c->rcap > SRV_KEEP_BYTES) { /* the large frame has run: give its buffer back */
      tdist__free(c->rbuf);
      c->rbuf = NULL;
      c->rcap = 0;
    }
  }
  if (!head_partial(c) || c->blocked)
    c->t_frame = 0;
  else if (!c->t_frame)
    c->t_frame = uv_now(&srv->loop);
  /* End of input: a frame that has not fully arrived never will; once no
   * complete one is left to run, close when the replies are out. */
  if (c->eof && !c->blocked && (c->rlen - c->rpos < 4 || head_partial(c))) c->close_after_flush = 1;
  /* before the replies leave, so a client that saw its write also sees it counted */
  atomic_store_explicit(&srv->num_keys, srv->kv.npresent, memory_order_relaxed);
  conn_flush(c);
  if (c->closing) return;
  tdist__srv_charge(c);
  update_reading(c);
}

/* ---- reading -------------------------------------------------------------------- */

/* The capacity the read buffer should have now (>= c->rcap unless it is
 * unallocated): the whole head frame once its length is known, in one
 * allocation, charged at once. Grown in steps, a 64 MiB frame cost a
 * realloc copy per doubling on the loop thread (tens of ms each while other
 * clients waited) and fresh pages each time; sized exactly, the frame ends
 * the buffer, so a large SET keeps it as its value (run_frame). A client
 * that declares a large frame and sends nothing holds its charge until
 * TDIST_STORE_IO_TIMEOUT_MS passes without a byte (the sweep), and only
 * the pages that arrived are resident. */
static size_t wanted_cap(const conn_t *c) {
  size_t base = SRV_RBUF_PREAUTH;
  if (c->rcap < base) return base;
  if (c->blocked || c->discard) return c->rcap;
  size_t avail = c->rlen - c->rpos;
  if (avail < 4) return c->rcap;
  size_t end = c->rpos + 4 + (size_t)head_len(c); /* validated by conn_process */
  return end > c->rcap ? end : c->rcap;
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  conn_t *c = h->data;
  if (c->rcap - c->rlen < 4096 && c->rpos > 0) { /* the unprocessed bytes move to the front */
    memmove(c->rbuf, c->rbuf + c->rpos, c->rlen - c->rpos);
    c->rlen -= c->rpos;
    c->rpos = 0;
  }
  size_t cap = wanted_cap(c);
  struct tdist_store_server *srv = c->srv;
  if (cap > SRV_KEEP_BYTES && cap > c->rcap) {
    /* A spare block of the frame's size (the table's, kv.h): its pages are
     * resident already, where a fresh 64 MiB buffer is faulted in page by
     * page as the bytes arrive. It moves from the table's charge to ours. */
    uint8_t *p = tdist__kv_spare_take(&srv->kv, cap);
    if (p) {
      if (c->rlen) memcpy(p, c->rbuf, c->rlen);
      tdist__free(c->rbuf);
      c->rbuf = p;
      c->rcap = cap;
      tdist__srv_charge(c);
    } else if (!tdist__srv_fits(srv, cap - c->rcap) && srv->kv.spare_bytes) {
      tdist__kv_spare_trim(&srv->kv, 0); /* the spares go before a frame is refused */
    }
  }
  /* Small frames are always taken (a full store must still read a delete). */
  if (cap > SRV_KEEP_BYTES && cap > c->rcap && !tdist__srv_fits(srv, cap - c->rcap)) {
    /* The head frame does not fit in the budget: drop what came of it and
     * the rest as it comes, then answer FULL (on_read). */
    c->discard_len = head_len(c);
    c->discard = 4 + (uint64_t)c->discard_len - (c->rlen - c->rpos);
    c->rlen = c->rpos;
    cap = c->rcap;
  }
  if (cap > c->rcap) {
    uint8_t *p = tdist__realloc(c->rbuf, cap);
    if (p) {
      c->rbuf = p;
      c->rcap = cap;
      tdist__srv_charge(c);
    }
  }
  /* len 0 (a blocked connection's buffer is full, no memory, or the large
   * frames' allowance is spent): on_read gets UV_ENOBUFS and stops reading
   * until the connection runs again (or, held, after the poll). */
  size_t room = c->rcap - c->rlen;
  /* A large frame reads what is left of the allowance, or all of its rest
   * when that is at most one slice more (a 1 MiB SET's last bytes do not
   * wait for the next iteration); nothing once the allowance is spent. */
  size_t left = c->srv->read_left;
  if (large_reader(c) && !c->discard && (!left || room > left + SRV_READ_SLICE)) room = left;
  *buf = uv_buf_init((char *)c->rbuf + c->rlen,
                     (unsigned)(room > SRV_READ_SLICE ? SRV_READ_SLICE : room));
}

/* ---- fair reading ---------------------------------------------------------------- */

/* A connection reading a large frame (its buffer is above SRV_KEEP_BYTES)
 * reads only while srv->read_left (SRV_READ_TURN per loop iteration, for all
 * of them together) lasts; then it stops and goes on the held list, and
 * reads again after the poll (tdist__srv_turn_end), so the next iteration
 * polls it with everyone else. A small request therefore waits for at most
 * SRV_READ_TURN of other clients' large frames, where libuv alone would read
 * each ready connection up to 32 times per iteration. */
static int large_reader(const conn_t *c) { return c->rcap > SRV_KEEP_BYTES; }

static void spin(uv_idle_t *h) { (void)h; } /* its being active is what counts */

/* c waits for the next iteration's allowance: to read (its reading
 * stops now) or, with `write`, to write more of its batch. */
static void hold(conn_t *c, int write) {
  if (write) {
    /* No socket event will come for it: the next poll must not block. */
    c->wheld = 1;
    if (!uv_is_active((uv_handle_t *)&c->srv->turn_spin)) uv_idle_start(&c->srv->turn_spin, spin);
  } else if (c->reading) {
    uv_read_stop((uv_stream_t *)&c->tcp);
    c->reading = 0;
  }
  if (c->held) return;
  c->held = 1;
  c->held_next = c->srv->held;
  c->srv->held = c;
}

void tdist__srv_turn_start(uv_prepare_t *h) {
  struct tdist_store_server *srv = h->data;
  srv->read_left = SRV_READ_TURN;
  srv->write_left = SRV_READ_TURN;
}

void tdist__srv_turn_end(uv_check_t *h) {
  struct tdist_store_server *srv = h->data;
  srv->read_left = SRV_READ_TURN; /* timers and the next poll's callbacks */
  srv->write_left = SRV_READ_TURN;
  conn_t *list = srv->held; /* those held again now wait for the next turn */
  srv->held = NULL;
  while (list) {
    conn_t *c = list;
    list = c->held_next;
    c->held = 0;
    if (c->closing) continue;
    if (c->wheld) {
      c->wheld = 0;
      if (c->writing && !c->wreq_busy && write_more(c) && !c->closing) batch_done(c);
      if (c->closing) continue;
    }
    update_reading(c);
  }
  int writers = 0;
  for (conn_t *c = srv->held; c && !writers; c = c->held_next)
    writers = c->wheld;
  if (!writers) uv_idle_stop(&srv->turn_spin);
}

/* The end of input: see the half-close note in the header. */
static void on_eof(conn_t *c) {
  c->eof = 1;
  if (c->blocked) {
    tdist__srv_conn_close(c, NULL);
    return;
  }
  if (c->discard) { /* a refused frame that will not complete */
    c->discard = 0;
    c->rlen = c->rpos;
  }
  conn_process(c);
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf) {
  conn_t *c = s->data;
  if (n == UV_ENOBUFS) {
    if (large_reader(c) && !c->srv->read_left && c->rlen < c->rcap) {
      hold(c, 0); /* its turn is over, not its room */
      return;
    }
    uv_read_stop(s);
    c->reading = 0;
    return;
  }
  if (n == UV_EOF) {
    on_eof(c);
  } else if (n < 0) {
    tdist__srv_conn_close(c, n == UV_ECONNRESET ? NULL : uv_strerror((int)n));
  } else if (n > 0) {
    if (c->discard) { /* bytes of a refused frame: drop them, keep what follows */
      size_t take = (uint64_t)n < c->discard ? (size_t)n : (size_t)c->discard;
      memmove(c->rbuf + c->rlen, c->rbuf + c->rlen + take, (size_t)n - take);
      n -= (ssize_t)take;
      c->discard -= take;
      if (!c->discard && reply_full(c, tdist__srv_refuse_frame(c, c->discard_len))) {
        tdist__srv_conn_close(c, "out of memory");
        return;
      }
    }
    c->rlen += (size_t)n;
    if (large_reader(c)) {
      size_t used = (size_t)n < c->srv->read_left ? (size_t)n : c->srv->read_left;
      c->srv->read_left -= used;
    }
    c->t_frame = 0; /* bytes came: an incomplete frame's deadline starts again */
    conn_process(c);
  }
  tdist__srv_drain_ready(c->srv);
}

static void read_start(conn_t *c) {
  if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) != 0) c->reading = 0;
}

/* A client speaks first, and its HELLO has usually arrived by the time the
 * listener's event is handled: it is read here, in the accept's iteration,
 * rather than in the next one. Under load, every loop iteration a request
 * waits for is a further wait for the CPU (a new client's connect, HELLO
 * and first request took three iterations; now two). */
static void read_now(conn_t *c) {
  uv_os_fd_t fd;
  if (uv_fileno((uv_handle_t *)&c->tcp, &fd) != 0) return;
  uv_buf_t b;
  on_alloc((uv_handle_t *)&c->tcp, SRV_RBUF_PREAUTH, &b);
  if (b.len == 0) return;
  ssize_t n = recv(fd, b.base, b.len, MSG_DONTWAIT);
  if (n > 0) on_read((uv_stream_t *)&c->tcp, n, &b); /* nothing yet, or an error: libuv sees it */
}

void tdist__srv_conn_start(conn_t *c) {
  c->t_open = uv_now(&c->srv->loop);
  tdist__srv_charge(c);
  update_reading(c);
  if (c->reading) read_now(c);
}
