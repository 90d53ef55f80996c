/*
 * server_impl.h - the TCP store server's internals (internal), shared by
 *   server.c       start, stop, the thread, accepting, the sweep timer and
 *                  the rate-limited WARN lines about clients;
 *   server_conn.c  one connection: reading and framing (with the frame
 *                  limits and backpressure), running requests, replies,
 *                  half-close and the single close path;
 *   budget.c       the memory budget (what is charged, admission, the FULL
 *                  answer and its warning), the settings, the heap purge.
 *
 * Memory bounds (docs/store-protocol.md, "Limits"): before its HELLO a
 * connection may send a frame of at most TDIST__STORE_MAX_HELLO bytes into a
 * buffer of SRV_RBUF_PREAUTH bytes; a connection runs requests only while its
 * unsent replies are below SRV_PIPE_OUT_BYTES, and reads only while it may
 * run them; everything the server allocates for values, queued replies and
 * partial frames is charged to one budget (TDIST_STORE_MEMORY_BYTES), and a
 * request that would exceed it is answered TDIST__ST_FULL.
 *
 * Thread: everything here runs on the server's loop thread, except what
 * server.c documents for start/stop/port/num_keys.
 */
#ifndef TDIST_STORE_SERVER_IMPL_H
#define TDIST_STORE_SERVER_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <uv.h>

#include "store/kv.h"
#include "store/liveness.h"

/* Read buffer of a connection that has not authenticated: a maximal HELLO
 * (TDIST__STORE_MAX_HELLO + 4) fits; nothing larger is ever allocated for it. */
#define SRV_RBUF_PREAUTH 2048
/* The most one read takes (fewer syscalls than libuv's 64 KiB suggestion). */
#define SRV_READ_SLICE (256 * 1024)
/* What all connections reading a large frame (a buffer above
 * SRV_KEEP_BYTES) may read in one loop iteration together; past it they
 * stop reading until the next (server_conn.c, "Fair reading"). libuv reads
 * a connection up to 32 times per iteration while reads fill their
 * buffers, so 8 clients sending 64 MiB values made each iteration copy (and
 * fault in) 16 MiB while another client's small request waited; small
 * frames are never held back. */
#define SRV_READ_TURN (1024 * 1024)
/* (The same allowance, counted apart, bounds what replies larger than
 * SRV_KEEP_BYTES write per iteration, in one write each; a rest of at most
 * SRV_READ_SLICE past it is written with it.) */
/* Buffers above this are freed once empty, so an idle connection that once
 * moved a large value keeps no large buffer. */
#define SRV_KEEP_BYTES (64 * 1024)
/* A connection's requests run only while its unsent replies are below this
 * (the bounded pipeline); reading stops meanwhile. */
#define SRV_PIPE_OUT_BYTES (256 * 1024)
/* Replies up to this size are admitted whatever the budget (a full store
 * must still answer a delete or a counter); they are charged all the same. */
#define SRV_SMALL_REPLY (64 * 1024)

/* Descriptors kept free: a connection accepted onto one of the last
 * SRV_FD_RESERVE descriptors below RLIMIT_NOFILE is answered BUSY and closed
 * at once (server.c), so the server never runs out (libuv would then close
 * new connections without a word) and keeps some for itself. */
#define SRV_FD_RESERVE 16

typedef struct tdist__srv_conn tdist__srv_conn_t;

typedef struct tdist__srv_waiter {
  tdist__srv_conn_t *c;
  tdist__kv_entry_t *e;
  struct tdist__srv_waiter *prev, *next; /* in e->waiters */
  struct tdist__srv_waiter *cnext;       /* in c->waiters */
} tdist__srv_waiter_t;

struct tdist__srv_conn {
  uv_tcp_t tcp;
  uv_timer_t timer; /* the deadline of a parked request */
  uv_write_t wreq;
  struct tdist_store_server *srv;
  tdist__srv_conn_t *prev, *next; /* all connections */
  uint8_t *rbuf;
  size_t rlen, rcap, rpos; /* unprocessed bytes are rbuf[rpos..rlen) */
  tdist__buf_t out;        /* replies not yet handed to the kernel */
  tdist__buf_t wbuf;       /* the bytes of the uv_write in flight */
  /* A large GET's value, sent from the table (kv.h, tdist__kv_ref_t): `ref`
   * goes in `out` at ref.at, `wref` in wbuf; each pins its block until the
   * kernel took it (on_written) or the connection ends. */
  tdist__kv_ref_t ref, wref;
  int writing, authed, closing, close_after_flush, handles_open;
  int blocked, timer_armed, final;
  int reading;          /* uv_read_start is in effect */
  int eof;              /* the peer shut down its sending side */
  uint64_t discard;     /* bytes still to drop of a frame the budget refused */
  uint32_t discard_len; /* that frame's length (for its FULL answer) */
  uint64_t t_open;      /* uv_now at accept (the handshake deadline) */
  uint64_t t_frame;     /* uv_now of the last byte of an incomplete head frame; 0: none */
  uint64_t t_write;     /* uv_now of the last progress of the batch in wbuf */
  size_t wpos;          /* bytes of that batch handed to the kernel or to a uv_write */
  size_t wtaken;        /* bytes of it the kernel had taken at t_write */
  int wreq_busy;        /* wreq (a chunk of the batch) is in flight */
  int wheld;            /* on srv->held to write more of the batch */
  uint64_t charged;     /* bytes of this connection in srv->conn_bytes */
  size_t nwaiters;      /* 0 or 1: a parked request waits on one key at a time */
  tdist__srv_waiter_t *waiters;
  /* where the parked head frame goes on when woken (tdist__exec_t, kv.h) */
  int resume;
  uint32_t resume_idx;
  size_t resume_off;
  tdist__srv_conn_t *ready_next;
  int in_ready;
  tdist__srv_conn_t *held_next; /* in srv->held: stopped for this iteration (to read, or wheld) */
  int held;
  char peer[64];
};

struct tdist_store_server {
  uv_loop_t loop;
  uv_tcp_t listener;
  uv_async_t stop_async;
  uv_timer_t sweep; /* timeouts and the idle heap purge (server.c) */
  pthread_t thread;
  tdist__kv_t kv;
  tdist__srv_conn_t *conns;
  tdist__srv_conn_t *ready_head, *ready_tail;
  /* fair reading (server_conn.c): what large frames may still read in this
   * iteration (reset before each poll), and who stopped for want of it
   * (started again after the poll) */
  uv_prepare_t turn_start;
  uv_check_t turn_end;
  uv_idle_t turn_spin; /* active while writers are held: the poll must not block */
  size_t read_left, write_left;
  tdist__srv_conn_t *held;
  char *token;
  int port;
  tdist__live_t *live; /* dead-rank detector, or NULL */
  /* WARN lines about clients, rate-limited (tdist__srv_warn). */
  uint64_t warn_window_start;
  int warn_in_window, warn_held;
  tdist__srv_conn_t *current; /* connection whose request is executing */
  /* connections refused for want of descriptors (server.c) */
  uint64_t nofile; /* RLIMIT_NOFILE as last read */
  size_t nconns;   /* connections open */
  uint64_t busy_window_start;
  int busy_warned, busy_held;
  int stopping;
  _Atomic int64_t num_keys; /* mirror of kv.npresent for other threads */
  /* budget.c */
  uint64_t limit;         /* TDIST_STORE_MEMORY_BYTES; 0: none */
  uint64_t io_timeout_ms; /* TDIST_STORE_IO_TIMEOUT_MS; 0: none */
  uint64_t conn_bytes;    /* sum of every connection's `charged` */
  uint64_t peak;          /* most bytes charged since the last purge */
  uint64_t full_window_start;
  int full_warned, full_held; /* refusals logged / held back in the window */
  char full_msg[320];         /* the message of the last FULL answer */
  /* the heap purge (budget.c): one at a time on libuv's thread pool */
  uv_work_t purge_req;
  int purging;                     /* (loop) purge_req is queued or running */
  uint64_t purge_peak, purge_used; /* (loop, then the pool) the fall that started it */
  uint64_t purge_unused;           /* (pool) what the allocator held unused */
};

/* ---- server.c ---- */
/* A WARN line about a client, at most 10 per 10 s (then counted). */
void tdist__srv_warn(struct tdist_store_server *srv, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* ---- server_conn.c ---- */
/* A connection was accepted into c (linked, handles open): start reading. */
void tdist__srv_conn_start(tdist__srv_conn_t *c);
/* The one place a connection ends; why (may be NULL) is logged at WARN. */
void tdist__srv_conn_close(tdist__srv_conn_t *c, const char *why);
/* Close c if it is past one of its deadlines (see budget.c's settings). */
void tdist__srv_conn_sweep(tdist__srv_conn_t *c, uint64_t now);
/* Run every connection woken by a write. */
void tdist__srv_drain_ready(struct tdist_store_server *srv);
/* (prepare) a loop iteration begins: the large frames' read allowance. */
void tdist__srv_turn_start(uv_prepare_t *h);
/* (check) the poll is over: connections held back read again. */
void tdist__srv_turn_end(uv_check_t *h);
/* kv->on_write: wake the waiters of e, tell the liveness detector. */
void tdist__srv_on_write(void *ctx, tdist__kv_entry_t *e);

/* ---- budget.c ---- */
/* Read the settings into srv (limit, io_timeout_ms). */
void tdist__srv_budget_init(struct tdist_store_server *srv);
/* Bytes charged now: the table plus every connection. */
static inline uint64_t tdist__srv_used(const struct tdist_store_server *srv) {
  return srv->kv.bytes + srv->kv.held + srv->kv.spare_bytes + srv->conn_bytes;
}
/* Re-charge c after its buffers or waiters changed (and on close, with
 * everything freed, to 0). */
void tdist__srv_charge(tdist__srv_conn_t *c);
/* 1 if `bytes` more fit in the budget. */
int tdist__srv_fits(const struct tdist_store_server *srv, uint64_t bytes);
/* tdist__exec_t.admit for connection ctx (kv.h). */
const char *tdist__srv_admit(void *ctx, uint64_t store, uint64_t reply);
/* The FULL message for a frame of `len` bytes that c could not buffer, with
 * the warning. */
const char *tdist__srv_refuse_frame(tdist__srv_conn_t *c, uint32_t len);
/* After memory was given back (the charge fell well below its peak): return
 * the allocator's free pages to the system, on libuv's thread pool, when it
 * holds enough of them (INFO line with the numbers when resident fell). */
void tdist__srv_maybe_purge(struct tdist_store_server *srv);

#endif
