/*
 * transport.h - the CPU backend's transports (sub-layer above base): a
 * connection's TCP stream (io.c: send queue, receive parser, parking, the
 * buffer cache) and the shared-memory rings (shm_conn.c). They tell the
 * engine what arrived only through ctx->ev (cpu_tp_events_t) and ask for a
 * connection through ctx->hooks->want: they never name a higher sub-layer.
 */
#ifndef TDIST_CPU_TRANSPORT_TRANSPORT_H
#define TDIST_CPU_TRANSPORT_TRANSPORT_H

#include "cpu/base/base.h"

/* ---- io.c: the progress thread's socket work ------------------------------ */
void tdist__cpu_conn_start(cpu_conn_t *c); /* register the uv_poll (progress thread) */
/* (progress) Watch c for what it needs now (stop a dead one's poll). */
void tdist__cpu_conn_watch(cpu_conn_t *c);
/* (engine lock) One pass over c without waiting: read what arrived, write
 * what is queued (a driving caller; no loop call). */
void tdist__cpu_conn_drive(cpu_conn_t *c);
/* (progress) Park timer armed iff some connection is parked. */
void tdist__cpu_park_sync(cpu_ctx_t *ctx);
/* Queue a message; writes at once if the queue was empty. m->op's transfer
 * is done when m is written (or ACKed): recorded only (tdist__cpu_xfer_done). */
void tdist__cpu_send(cpu_conn_t *c, cpu_msg_t *m);
/* One sendmsg of queue q (oldest first: each message's unwritten header and
 * payload, at most `budget` payload bytes): its result (errno on -1). */
ssize_t tdist__cpu_msgs_write(int fd, tdist__list_t *q, size_t budget, int flags);
/* After `*left` more bytes of q were written: the oldest message now fully
 * written, off q (the caller owns it), with *left reduced; NULL when none
 * (the partly written one's offset is moved on). */
cpu_msg_t *tdist__cpu_msgs_written(tdist__list_t *q, size_t *left);
cpu_msg_t *tdist__cpu_msg_new(void);
/* The iovecs (at most max) of queue q's unwritten bytes, at most `budget`
 * payload bytes: how many. */
int tdist__cpu_msgs_iov(tdist__list_t *q, size_t budget, struct iovec *iov, int max);
/* (engine lock) Read what c's stream has (64 reads at most): 0 all read, 1
 * more is there, -1 c died or parked. */
int tdist__cpu_conn_read(cpu_conn_t *c);

/* ---- io.c: leaving, parking, queues ---- */
/* Drop queued messages of ops of group uid (abort), copying a partly sent one. */
void tdist__cpu_conn_forget(cpu_conn_t *c, uint64_t uid);
/* Deferred reads. A rank that is idle (no op active, no receive posted) and
 * sees the header of a large message for an op it has not posted yet leaves
 * the payload in the kernel (tdist__cpu_conn_park, from tdist__cpu_on_header)
 * rather than copying it twice (into a staging buffer, then into the
 * destination): the caller is usually about to post that op. Any post, the
 * group's abort, a peer's disconnect or TDIST_CPU_DEFER_US dispatches the
 * header again (tdist__cpu_ctx_unpark), and the payload then goes straight
 * where it belongs. */
void tdist__cpu_conn_park(cpu_conn_t *c);
void tdist__cpu_conn_unpark(cpu_conn_t *c);
void tdist__cpu_ctx_unpark(cpu_ctx_t *ctx);      /* every parked connection */
void tdist__cpu_ctx_start_timer(cpu_ctx_t *ctx); /* init park_timer (progress thread) */

/* RMA message with cookie acked by c's peer: its transfer is done (io.c). */
void tdist__cpu_conn_acked(cpu_conn_t *c, uint64_t cookie);
/* Free the send queue and the ACK waiters (the conn is dead). */
void tdist__cpu_conn_free_queues(cpu_conn_t *c);

/* ---- shm_conn.c: the shared-memory transport ----------------------------------- */
/* (caller, setup) Give every pair of this host (local[j]) a ring each way:
 * our inbound rings in one segment (ctx->shm), the peer's mapped. A pair
 * either side cannot set up stays on its socket. fds: world rank -> socket. */
int tdist__cpu_shm_setup(cpu_ctx_t *ctx, const int *local, int64_t deadline);
/* (caller, setup) All of buf through blocking-with-deadline I/O on fd: 0 or
 * TDIST_ERR_TIMEOUT / TDIST_ERR_CLOSED / TDIST_ERR_IO (conn.c). */
int tdist__cpu_io_full(int fd, void *buf, size_t len, int writing, int64_t deadline_ns);
void tdist__cpu_shm_start(cpu_ctx_t *ctx); /* (progress) the idle handle */
/* (engine lock) c's rings (both, or nothing when either is NULL) come into
 * use: they start with the marks of the waiters polling now (lazy.c, at
 * connect): the inbound ring's polling, the outbound's wpolling. */
void tdist__cpu_shm_attach(cpu_ctx_t *ctx, cpu_conn_t *c, struct tdist__cpu_ring *rx,
                           struct tdist__cpu_ring *tx);
void tdist__cpu_shm_release(cpu_ctx_t *ctx); /* (progress) unmap what is left */
/* Write iov to c's ring: bytes written, or -1 with errno EAGAIN when full
 * (the peer's doorbell says when there is room). Rings the peer's doorbell
 * if nobody polls its ring. */
ssize_t tdist__cpu_shm_write(cpu_conn_t *c, const struct iovec *iov, int cnt);
extern _Atomic uint64_t tdist__cpu_shm_writes; /* ring writes (tests, docs) */
/* Collectives completed over a group's shared segment (sc_op.c; tests).
 * Added to without an atomic read-modify-write (under the engine lock):
 * exact in a process with one CPU context (a rank), and in one with
 * several, a count that may miss an op two contexts finished at once. */
extern _Atomic uint64_t tdist__cpu_sc_ops;
/* Write to ring r what fits; when nothing does, set r->wwait (the reader
 * then rings our doorbell when it makes room) and try once more. Bytes
 * written. The writer's thread (engine lock, or a leaving caller). */
size_t tdist__cpu_shm_put(struct tdist__cpu_ring *r, const struct iovec *iov, int cnt);
/* Read from c's ring: bytes, or -1 with errno EAGAIN when empty. */
ssize_t tdist__cpu_shm_read(cpu_conn_t *c, void *buf, size_t len);
/* Take the doorbells off c's socket: 0, -1 at its EOF, or an errno. */
int tdist__cpu_shm_doorbells(cpu_conn_t *c);
/* A read pass left bytes in a ring: another pass soon (the idle handle). */
void tdist__cpu_shm_more(cpu_ctx_t *ctx);
void tdist__cpu_shm_sync(cpu_ctx_t *ctx); /* (progress) the idle handle as needed */
/* (engine lock, top level) Read every ring that has bytes: after an op is
 * posted, what arrived meanwhile is matched at once; and retry the writes
 * that wait for room in a peer's ring (wwait). */
void tdist__cpu_shm_drain(cpu_ctx_t *ctx);
/* (any caller) A waiter starts (on = 1) or stops (0) polling our rings,
 * inbound (for bytes) and, with TDIST_CPU_DRIVE, outbound (for room: it
 * retries its writes on every pass): while any does, peers need not ring
 * our doorbells. On 0, what came meanwhile without a bell, which someone
 * must handle (tdist__cpu_shm_drain): CPU_SHM_LEFT_BYTES (bytes to read),
 * CPU_SHM_LEFT_ROOM (writes that wait for room to retry); else 0. */
int tdist__cpu_shm_mark(cpu_ctx_t *ctx, int on);
#define CPU_SHM_LEFT_BYTES 1
#define CPU_SHM_LEFT_ROOM 2
TDIST_PARAM(CpuShm, "TDIST_CPU_SHM", 1)
TDIST_PARAM(CpuShmRingBytes, "TDIST_CPU_SHM_RING_BYTES", 512 << 10)

/* ---- buffer cache (io.c, progress thread) ------------------------------------ */
void *tdist__cpu_buf_get(cpu_ctx_t *ctx, size_t len);
void tdist__cpu_buf_put(cpu_ctx_t *ctx, void *p);
void tdist__cpu_buf_drain(cpu_ctx_t *ctx);

#endif
