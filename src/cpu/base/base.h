/*
 * base.h - the CPU backend's bottom sub-layer: the types every file of
 * src/cpu shares (wire header, message, op, group, connection, context),
 * the engine lock (lock.c), the hooks the sub-layers above register
 * (cpu_hooks_t), the settings and the reductions (reduce.c). Sub-layers are
 * ordered by the LAYER files of src/cpu/<folder>/ (docs/cpu-backend.md).
 *
 * The backend implements include/tdist/backend.h (the ABI version is
 * TDIST_BACKEND_ABI_VERSION there): it never sees the
 * core's group or work structs, only the parameters of a new group
 * (tdist_backend_params_t), the ops it is handed (tdist_backend_op_t) and the core's
 * services (tdist_backend_complete, tdist_backend_fail, tdist_backend_fail_remote).
 *
 * Layout:
 *   ctx     one per world group: the TCP connections (one per pair of
 *           processes: all made at creation, or placeholders connected on
 *           first use, lazy.c), the registry of groups that use it, the
 *           orphan list (messages for a group not created here yet), the
 *           ready list (ops the engine must advance) and a cache of staging
 *           buffers. Shared by the world and every subgroup (refcounted);
 *           split and shrink create only rank mappings.
 *   conn    one connection: a raw non-blocking fd watched by a uv_poll_t on
 *           the progress loop; a send queue of messages written with sendmsg
 *           straight from the caller's buffers; a receive state machine that
 *           reads headers through a small staging buffer and large payloads
 *           directly into their destination.
 *   group   per-group state (cpu_group_t: the `state` the core passes to
 *           every vtable entry): rank -> conn, active ops, unexpected
 *           messages, posted point-to-point receives.
 *   op      one collective or p2p op (cpu_op_t, from the group's pool, found
 *           from the core's op through bop->priv). Collectives are written
 *           as a sequence of rounds: round k posts sends and receives (at
 *           most one each way per peer); when all of them are done the next
 *           round starts. Messages are keyed by (group uid, seq, round,
 *           source).
 *
 * Threads: setup (conn.c: listen, store all-gather, connect, handshake,
 * shm_conn.c: the rings) and the creation and destruction of a cpu_group_t
 * run on the caller thread inside init/split/shrink/destroy, and reach the
 * progress thread with tdist_backend_call; lazy connections are made on
 * lazy_hs.c's dialer and acceptor threads and handed over through a uv_async. Everything else runs
 * under the engine lock (ctx->mu, base/lock.c): on the progress thread, which never blocks but for
 * that lock, or on a caller thread that starts its op in submit or drives it while it waits (test);
 * such a caller never touches the loop and leaves completions and failures to the progress thread.
 *
 * Transport and engine (no re-entry). The transport is the I/O call chains
 * of io.c, dispatch.c and cma.c: parse -> on_header / on_payload, flush, the
 * ACK path. It never runs an op's rounds and never completes an op: when a
 * transfer ends it only decrements op->pending, and at 0 puts the op on
 * ctx->ready (tdist__cpu_xfer_done). The engine (tdist__cpu_run_ready,
 * engine.c) pops ready ops and advances each by one step (fold the round's
 * staged receives, start the next round, or complete the op with
 * tdist_backend_complete). It runs only from top-level points with no transport
 * function on the stack: the poll callback (between two reads, and at its
 * end), post, abort, destroy and the timer callbacks. Failures are reported
 * with tdist_backend_fail (deferred by the core): until the core calls abort the
 * group keeps running, and an op whose transfer cannot finish just waits.
 * Only abort and destroy (called by the core at top level) take ops off the
 * lists; completion returns an op to the pool from the engine.
 */
#ifndef TDIST_CPU_BASE_BASE_H
#define TDIST_CPU_BASE_BASE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "tdist/backend.h"
#include "util/clock.h"
#include "util/list.h"
#include "util/log.h"
#include "util/mutex.h"
#include "util/param.h"
#include "cpu/base/copy.h"
#include "cpu/base/shm.h"

#define CPU_MAGIC 0x31434454u  /* "TDC1" */
#define CPU_RX_CAP (64u << 10) /* a connection's receive staging buffer */

/* Message kinds on the wire. */
enum {
  CPU_MSG_COLL = 1,
  CPU_MSG_P2P = 2,
  CPU_MSG_ERR = 3,
  CPU_MSG_BYE = 4,
  CPU_MSG_RMA = 5,   /* a COLL or P2P message whose payload stays in the sender:
                        the payload on the wire is a cpu_rma_desc_t (cma.c) */
  CPU_MSG_ACK = 6,   /* header only: the RMA message with cookie `seq` was read */
  CPU_MSG_PROBE = 7, /* header only: a stalled collective's signature (probe.c) */
  CPU_MSG_SIG = 8    /* header only: a collective's signature, sent at its round 0
                        to members that round sends nothing to (sigcheck.c) */
};

/* Fixed 48-byte header, host byte order (all ranks run on one architecture;
 * the handshake checks the magic, which also catches an endianness mix). */
typedef struct cpu_hdr {
  uint32_t magic;
  uint8_t kind;   /* CPU_MSG_* */
  uint8_t optype; /* tdist_optype_t */
  uint8_t dtype;  /* tdist_dtype_t */
  uint8_t redop;  /* tdist_redop_t; ERR: unused */
  uint64_t uid;   /* group uid */
  uint64_t seq;   /* collective number in the group (COLL): counts collectives
                     only, since p2p ops are not posted by every rank */
  uint64_t count; /* the op's count (COLL) or the message's (P2P) */
  uint32_t slot;  /* round number (COLL) */
  int32_t root;   /* root (COLL), tag (P2P), status (ERR) */
  uint64_t len;   /* payload bytes that follow */
} cpu_hdr_t;

/* Where an RMA message's bytes are in the sender (cma.c). */
typedef struct cpu_rma_desc {
  uint8_t kind; /* CPU_MSG_COLL or CPU_MSG_P2P: the message it stands for */
  uint8_t pad[7];
  uint64_t addr, len; /* the payload in the sender's address space */
  uint64_t word;      /* the sender group's live word ... */
  uint64_t token;     /* ... and the value it holds while the group is alive */
  uint64_t cookie;    /* echoed in the ACK */
} cpu_rma_desc_t;

/* The first bytes on a new connection: who dials (conn.c, lazy.c). */
typedef struct cpu_hello {
  uint32_t magic;
  int32_t rank, size, pad;
  uint64_t uid;
} hello_t;

/* A connection's link (lazy.c): up (the mesh's connections are born up),
 * or a placeholder not connected yet, or one being connected. */
enum { CPU_LINK_UP = 0, CPU_LINK_IDLE = 1, CPU_LINK_DIALING = 2 };

/* Traded by every pair of ranks at setup (conn.c). */
typedef struct tdist__cpu_cma_hello {
  int32_t pid;
  int32_t enabled; /* TDIST_CPU_CMA on this side */
  uint64_t probe;  /* address of a word holding token */
  uint64_t token;
} cpu_cma_hello_t;

typedef struct cpu_ctx cpu_ctx_t;
typedef struct cpu_conn cpu_conn_t;
typedef struct cpu_group cpu_group_t;
typedef struct cpu_op cpu_op_t;

/* What the transports (io.c, shm_conn.c: a connection's stream) tell the
 * engine, through the callbacks the engine registered when it created the
 * context (tdist__cpu_ctx_create), as a libuv uv__io_t carries its own: the
 * transport never calls the engine by name. header, payload and sent only
 * record (no round runs, nothing completes: no re-entry); settle is called
 * at the transport's top-level points (between two reads, at the end of a
 * poll callback), where the engine may advance what they recorded. */
typedef struct cpu_tp_events {
  void (*header)(cpu_conn_t *c);                /* c->rh arrived: set c->rx_* for its payload */
  void (*payload)(cpu_conn_t *c);               /* the current message's payload is complete */
  void (*lost)(cpu_conn_t *c, const char *why); /* c's stream ended or failed */
  void (*sent)(cpu_op_t *op);     /* a transfer of op left (written, or its ACK came) */
  void (*settle)(cpu_ctx_t *ctx); /* top level: advance what the above recorded */
} cpu_tp_events_t;

/* What the sub-layers above register for the ones below to call up without
 * naming them (libuv's loop phases; tdist's core hooks work the same way).
 * The entry (drive.c: tdist__cpu_hooks) fills one table, handed to
 * tdist__cpu_ctx_create with the engine's transport events (ctx->ev) and set
 * in the ctx before any thread can enter it; read-only afterwards. Each
 * hook names who calls it and on which thread. */
typedef struct cpu_hooks {
  /* base (the engine lock's release, tdist__cpu_leave; lock held): the work
   * a release owes the sub-layers above (the shared segment's sleeping
   * pass and the engine, drive.c). */
  void (*leave)(cpu_ctx_t *ctx);
  /* base (loop_sync; progress thread, lock held): after the failures and
   * completions a driving caller left are handed over, bring each
   * subsystem's watches and timers up to date (the loop phases). */
  void (*sync)(cpu_ctx_t *ctx);
  /* transport, engine (engine lock): an op needs connection c, which is not
   * up; connect it unless it is on its way (conn/lazy.c). Only queues. */
  void (*want)(cpu_conn_t *c);
  /* segment, progress thread: a handle of ctx closed; free ctx if it was
   * the last and no group holds it (conn/conn.c). */
  void (*maybe_free)(cpu_ctx_t *ctx);
  /* engine (engine lock) into the shared segment (segment/sc_op.c): op is
   * freed, take it off its channel; an engine message came for op, which
   * runs over the segment here (the sender disagrees); does an sc op of cg
   * still need member r. */
  void (*sc_forget)(cpu_op_t *op);
  void (*sc_engine_msg)(cpu_group_t *cg, cpu_op_t *op, const cpu_hdr_t *h, int src);
  int (*sc_needs)(const cpu_group_t *cg, int r);
} cpu_hooks_t;

/* A queued outgoing message (progress thread). data points at the caller's
 * buffer (zero copy) or at `owned` (freed once written). */
typedef struct cpu_msg {
  tdist__list_t link; /* conn's txq, then (RMA) its acks; or the message pool */
  cpu_hdr_t hdr;
  const uint8_t *data;
  size_t off;   /* bytes of header + payload written so far */
  cpu_op_t *op; /* its transfer is done when written; NULL for control messages */
  void *owned;
  uint64_t cookie;     /* RMA: op's transfer is done on the ACK with this
                          cookie; the written message waits on conn's acks */
  cpu_rma_desc_t desc; /* RMA: the payload on the wire */
} cpu_msg_t;

/* A message received before anyone wanted it (progress thread). */
typedef struct cpu_ux {
  tdist__list_t link; /* group's ux list or ctx's orphans; self-linked when
                         on neither (an ERR message being read) */
  cpu_hdr_t hdr;
  int src;       /* world rank of the sender */
  uint8_t *data; /* hdr.len bytes, from the buffer cache */
  int complete;  /* payload fully read */
  int rma;       /* an RMA descriptor not read yet (data NULL; cma.c) */
  cpu_rma_desc_t desc;
  uint64_t since;       /* uv_now() when the descriptor arrived */
  struct cpu_copy *job; /* being staged in steps (copy_steps.c), else NULL */
} cpu_ux_t;

/* One transfer of an op: a send or a receive with one peer. Lives in the
 * op's sends/recvs arrays (progress thread). */
typedef struct cpu_xfer {
  tdist__list_t plink; /* p2p receive: the group's posted-receive list */
  cpu_op_t *op;
  int peer; /* group rank */
  uint8_t *ptr;
  size_t len;
  int reduce;     /* receive: reduce into ptr at the end of the round */
  uint8_t *stage; /* reduce: the received bytes (a cached buffer) */
  int done;
  int tag;             /* p2p */
  tdist_dtype_t dtype; /* p2p */
  size_t count;        /* p2p */
} cpu_xfer_t;

/* Collective algorithm: fill op->sends/recvs for round k (local copies and
 * reductions of earlier rounds may be done here); return 1 when there is no
 * round k (the op is complete). */
typedef int (*cpu_round_fn)(cpu_op_t *op, int k);

/* An op's engine state. Owned by its group: on the group's free list, or
 * (from post until completion or abort) on its active list with bop set.
 * Progress thread only. */
struct cpu_op {
  tdist__list_t link;               /* group's active list (ops) or its pool (free_ops) */
  tdist__list_t rlink;              /* ctx->ready while it waits for the engine */
  tdist_backend_op_t *bop;          /* the core's op (bop->priv == this); NULL in the pool */
  const tdist_backend_args_t *args; /* bop->args */
  cpu_group_t *cg;
  int p2p;            /* 1 for send/recv/batch: no rounds */
  uint64_t cseq;      /* collective number (cpu_group_t.next_cseq at post) */
  uint64_t posted_at; /* probe.c's coarse clock at post, in ms */
  cpu_round_fn round_fn;
  void (*finish_fn)(cpu_op_t *op);
  int round;
  int pending; /* transfers of the current round (or p2p op) not done */
  int nsend, nrecv, cap;
  cpu_xfer_t *sends, *recvs;
  /* op parameters, copied from args */
  tdist_optype_t type;
  tdist_dtype_t dtype;
  tdist_redop_t redop;
  size_t count, es;
  int root, rank, size;
  uint8_t *buf; /* the buffer the algorithm works on */
  uint8_t *tmp; /* working copy (reduce non-root, reduce_scatter) */
  size_t tmp_cap;
  /* algorithm state */
  size_t seg; /* segment bytes (pipelined algorithms) */
  int nseg;   /* segments per chunk */
  int pof2, extra;
  /* signatures (sigcheck.c): members whose header of this op (data, SIG or
   * PROBE) agreed with it; bit i of heard is group rank i. heard lies past
   * the recvs array in the same allocation (tdist__cpu_op_reserve), with
   * room for cap bits. */
  uint64_t *heard;
  int nheard;
  int need_sigs;     /* complete only once every member was heard */
  int rounds_done;   /* the last round finished; waiting for signatures */
  int received;      /* some round of it had a receive (sigcheck.c) */
  int lagging;       /* completed for the core before every member was heard:
                        kept (bop NULL) until it is (cpu_group_t.lagging) */
  uint64_t probe_at; /* probe.c's coarse clock when the next probe is due */
  /* A collective over the group's shared segment (sc.h, sc_op.c): on is 1
   * from tdist__cpu_sc_post until the op is put. */
  struct cpu_sc_opst {
    int on;
    int role;            /* SC_ROLE_*: what this member checks and reads */
    int checked;         /* the signatures its role needs were checked */
    int started;         /* at the channel's head: s0 is set */
    int prefixed;        /* v-ops: the members' count arrays were read */
    int two;             /* a large all_reduce in two phases (sc_op.c) */
    int direct;          /* two: this member's share is read from its input */
    int lent;            /* this member's stream is read in place (sc_data.c, lend) */
    int stream;          /* its output is large: copies into it stream (sc.h, sc_out_copy) */
    int tune;            /* the tuner's look: 1 slots, 2 lent (0: none; sc_data.c) */
    int64_t t0;          /* tune: when the op started (ns) */
    int now;             /* started by the now lane (sc_op.c): one step at most */
    uint64_t blocked_at; /* a giver found no room since (ms; sc_ovf.c), 0: it did */
    int phase;           /* two: this member reduced its part of step cstep */
    uint64_t seen;       /* members whose signature was checked (bit m) */
    tdist__list_t link;  /* the channel's ops, in post order */
    uint64_t s0, nsteps; /* the op's steps (nsteps UINT64_MAX until known) */
    uint64_t wstep;      /* steps of this member's stream written */
    uint64_t cstep;      /* steps consumed */
    uint64_t total;      /* bytes of this member's stream */
    uint8_t *tmp;        /* a private copy of the input (overlapping buffers) */
    uint8_t *ltmp;       /* two: the others' lent pieces of a step (sc_op.c) */
    /* The local part still to copy (sc_data.c: a large own block of an
     * all_to_all or all_to_all_v, copied while the op waits for others) */
    uint8_t *lc_dst;
    const uint8_t *lc_src;
    size_t lc_left;
  } sc;
};

/* A group's backend state. The fields above `link` are set on the caller
 * thread before the group is registered (backend.c: attach) and read-only
 * afterwards; the others belong to the progress thread. */
struct cpu_group {
  cpu_ctx_t *ctx;
  tdist_backend_group_t *bk;          /* the core's handle (tdist_backend_fail) */
  tdist_backend_progress_t *progress; /* the process's progress thread */
  int rank, size;                     /* in this group */
  uint64_t uid;
  char name[96];
  int *global_ranks;      /* group rank -> world rank (a copy) */
  int *grank;             /* world rank -> group rank, or -1 (ctx->size entries) */
  cpu_conn_t **conns;     /* group rank -> conn (NULL for self) */
  _Atomic uint64_t *live; /* cma.c: this group's live word (NULL: no RMA sends) */
  uint64_t live_token;
  /* (atomic) ops submitted to the core's queue and not posted yet
   * (drive.c): while any is, submit starts no op itself, so ops still
   * start in submission order. */
  atomic_int queued;
  /* progress thread */
  tdist__list_t link;     /* ctx->groups */
  tdist__list_t ops;      /* active ops (cpu_op_t.link), post order */
  tdist__list_t free_ops; /* the op pool */
  tdist__list_t ux;       /* unexpected messages (cpu_ux_t.link), arrival order */
  tdist__list_t precv;    /* posted p2p receives (cpu_xfer_t.plink), post order */
  uint64_t next_cseq;     /* collectives posted so far */
  /* The last CPU_DONE_RING collectives that completed here, by cseq %
   * CPU_DONE_RING: a message that arrives for one of them was sent by a rank
   * that ran a different op (a root or a count it disagrees on), which a
   * correct run never does (every send meets a receive of the same op). */
  struct cpu_done {
    uint64_t cseq, count;
    int32_t root;
    uint8_t type, dtype, redop, valid;
  } done[64];
  int aborted; /* vtable->abort ran: no more traffic */
  /* 1 + the lowest collective number with a mismatch reported here, or 0
   * (none; the struct starts zeroed): the engine advances no op of the
   * group from that collective on (tdist__cpu_blocked), so none completes
   * between the report and the core's abort (sigcheck.c,
   * docs/cpu-backend.md "Mismatch"). */
  uint64_t broken_at;
  /* The oldest collective that completed before it heard every member
   * (sigcheck.c "lag one"): no later op of the group completes until it has,
   * except a collective in which this rank only sends, up to CPU_LAG_MAX
   * lagging ops in all; NULL when none. nlagging: how many lag. */
  cpu_op_t *lagging;
  int nlagging;
  /* cma.c: a sender aborted under a read; fail at poison_at + 1 s with
   * poison_why, unless its cause arrives first */
  int poisoned;
  uint64_t poison_at;
  char poison_why[200];
  /* lock.c: the first failure found by a driving caller, reported to the
   * core by the progress thread (tdist_backend_fail is its alone). */
  int pf_set, pf_status, pf_remote;
  char pf_why[256];
  /* sc.h: the group's shared-memory channel (set on the caller thread at
   * creation, before registration), or NULL: the engine runs everything;
   * sc_lag: it has ops completed before every member's signature was
   * checked (a p2p op, or an engine op that receives, waits);
   * sc_waited: an engine op found itself held by sc_lag (the segment then
   * checks at once instead of batching its checks, sc_op.c). */
  struct cpu_sc *sc;
  int sc_lag, sc_waited;
};

/* One connection (progress thread once started; conn.c builds it on the
 * caller thread during setup). */
struct cpu_conn {
  cpu_ctx_t *ctx;
  int peer;  /* world rank */
  int fd;    /* -1 until connected (lazy.c) */
  int link;  /* CPU_LINK_*: not UP, no poll is registered and the send queue
                waits (lazy.c) */
  int quiet; /* lazy.c: nothing came from the peer on it yet, so its loss
                waits a second for a cause (dispatch.c) */
  uv_poll_t poll;
  int events;         /* UV_READABLE | UV_WRITABLE currently watched */
  int dead;           /* closed or failed: no more I/O */
  int bye;            /* the peer said goodbye (orderly destroy) */
  int bye_cause;      /* ... after losing this world rank (-1: none), so our
                         error can name the root cause rather than the leaver */
  int tx_err;         /* errno of a failed write, reported after the reads
                         (io.c: on_poll) */
  int parked;         /* a large message for an op not posted yet: its header
                         is in rh, its payload waits in the kernel (io.c) */
  uint64_t parked_at; /* uv_now() when parked */
  char addr[80];
  tdist__list_t txq; /* cpu_msg_t.link, oldest first */
  /* single copy on one host (cma.c) */
  int32_t pid;          /* the peer's process id */
  int cma_tx;           /* the peer reads our payloads itself: send descriptors */
  uint64_t cookie_next; /* last RMA cookie used */
  tdist__list_t acks;   /* RMA messages written, waiting for their ACK, in
                           write order (usually the order they come back) */
  cpu_rma_desc_t rdesc; /* an arriving descriptor is read here */
  int rx_rma;           /* dispatching a descriptor (tdist__cpu_cma_on_desc) */
  /* shared memory (shm_conn.c): with a peer of this host, both directions
   * go through rings and the socket carries only doorbells and the end;
   * NULL when the pair talks over the socket */
  struct tdist__cpu_ring *tx_ring; /* in the peer's segment, mapped here */
  struct tdist__cpu_ring *rx_ring; /* in ours (ctx->shm) */
  void *tx_map;                    /* the peer's segment (unmapped with the conn) */
  size_t tx_map_bytes;
  tdist__cpu_shm_seg_t rx_seg; /* lazy.c: this pair's own segment holding rx_ring
                                  (base NULL: the ring is in ctx->shm, or none) */
  /* receive */
  uint8_t *rx;
  size_t rx_lo, rx_hi; /* unparsed bytes are rx[rx_lo, rx_hi) */
  int rx_body;         /* 1: reading a payload */
  cpu_hdr_t rh;
  uint8_t *rx_dst; /* where the payload goes (NULL: discard) */
  size_t rx_got;
  cpu_op_t *rx_op;  /* op that owns rx_dst (direct placement) */
  cpu_xfer_t *rx_x; /* its transfer */
  cpu_ux_t *rx_ux;  /* or the unexpected entry being filled */
  cpu_group_t *rx_g;
};

/* Forget where the current payload goes (before a header is dispatched, or
 * when its destination goes away). Progress thread. */
static inline void cpu_rx_clear(cpu_conn_t *c) {
  c->rx_dst = NULL;
  c->rx_op = NULL;
  c->rx_x = NULL;
  c->rx_ux = NULL;
  c->rx_g = NULL;
}

/* Created on the caller thread (conn.c), then owned by the progress thread;
 * freed there once the last group released it and its handles closed. */
struct cpu_ctx {
  const cpu_tp_events_t *ev; /* the engine's callbacks (set at creation) */
  const cpu_hooks_t *hooks;  /* the sub-layers' hooks (set at creation) */
  int rank, size;            /* world */
  int refs;                  /* groups using it (changed on the progress thread only) */
  int open_handles;
  tdist_backend_progress_t *progress;
  cpu_conn_t **conns;    /* world rank -> conn (lazy: placeholders until used) */
  struct cpu_lazy *lazy; /* lazy.c: the dialer and acceptor; NULL for the mesh */
  tdist__list_t groups;  /* cpu_group_t.link */
  tdist__list_t orphans; /* cpu_ux_t.link: messages for unknown group uids */
  tdist__list_t ready;   /* cpu_op_t.rlink: ops whose round (or p2p op) is
                            done, for the engine (tdist__cpu_run_ready) */
  int lost_peer;         /* world rank of the last peer lost without a goodbye, or
                            -1; sent in our own goodbye */
  /* buffer cache */
  struct cpu_buf *bufs;
  size_t cached_bytes;
  /* parked connections (io.c): unparked when an op is posted, or by this
   * timer after TDIST_CPU_DEFER_US */
  uv_timer_t park_timer;
  int timer_on; /* park_timer initialised (the ctx has connections) */
  int nparked;
  int no_park; /* set while a parked header is dispatched again */
  /* unread RMA descriptors (cma.c), staged by rma_timer after
   * TDIST_CPU_DEFER_US */
  uv_timer_t rma_timer;
  int rma_timer_on;
  int rma_pending;
  /* stalled collectives send probes (probe.c); runs while any is posted */
  uv_timer_t probe_timer;
  int probe_timer_on;
  uint64_t probe_due; /* probe.c's coarse clock when it fires; 0: not armed (so a
                         driving caller can tell without asking the loop) */
  /* long copies made in steps (copy_steps.c); copy_idle runs while any is
   * queued, initialised on first use */
  uv_idle_t copy_idle;
  int copy_idle_on;
  tdist__list_t copies;
  /* The engine lock (base/lock.c). Whoever runs the backend's code for this
   * ctx holds it: the progress thread in every entry (poll and timer
   * callbacks, post, abort, poll, the setup tasks), or a caller thread
   * that drives its own op (submit, test), which only ever tries it. Every
   * field above is written under it, so each has one writer at a time. */
  /* shared memory (shm_conn.c): our segment of inbound rings, and the idle
   * handle that reads on when one read pass left bytes in a ring */
  tdist__cpu_shm_seg_t shm;
  uv_idle_t ring_idle;
  int ring_idle_on;
  tdist__mutex_t mu;  /* util/mutex.h: its free paths inline */
  int caller;         /* the holder is a caller thread: the loop is not ours to touch */
  int loop_stale;     /* a caller left loop work (watch, timers, failures, completions) */
  tdist__list_t held; /* tdist_backend_op_t.link: completions not given to the core yet */
  /* (any thread) tdist__cpu_shm_mark's waiters, counted under mark_mu, so a
   * ring attached later (lazy.c) starts with their poll marks */
  pthread_mutex_t mark_mu;
  int nmarks;
  /* sc_chan.c: this process's bell (an abstract unix datagram socket the
   * progress thread watches: members of an sc group ring it), and the
   * socket bells are sent from; -1 when none (sc is off here) */
  int bell_fd, bell_tx;
  char bell_name[108];
  unsigned bell_len;
  uv_poll_t bell_poll;
  int bell_on;        /* bell_poll initialised */
  tdist__list_t ovfs; /* sc_ovf.c: overflow memfds received, not taken yet */
  /* (engine lock) Steps of long work done (a shared-memory step, a long
   * copy's step): a driving caller whose op is not done but moved keeps
   * driving it (drive.c, test's 2). */
  uint64_t moves;
};

/* The backend's words in the core's op (tdist_backend_op_t.scratch), set in
 * submit on the caller thread (drive.c). */
typedef struct cpu_bop {
  cpu_group_t *cg;
  atomic_int ok; /* (atomic) the engine completed it: test may claim it */
  int early;     /* submit started it (posted on the caller thread) */
  int posted;    /* the core's post has run (progress thread) */
  int held;      /* on ctx->held: completed, not yet given to the core */
  int sc;        /* submit started it over the group's shared segment: its
                    progress needs no ring, and its waiter marks none (drive.c) */
} cpu_bop_t;
_Static_assert(sizeof(cpu_bop_t) <= TDIST_BACKEND_SCRATCH, "cpu_bop_t fits the scratch");
static inline cpu_bop_t *cpu_bop(tdist_backend_op_t *bop) {
  return (cpu_bop_t *)(void *)bop->scratch;
}

/* Milliseconds on the monotonic clock: every timestamp of the backend (one
 * clock on every thread; uv_now is the loop's own, cached per iteration). */
static inline uint64_t tdist__cpu_now_ms(void) { return (uint64_t)(tdist__now_ns() / 1000000); }

/* Code that would touch the loop (start a watch or a timer) calls this
 * first: on a driving caller thread it records that the progress thread
 * must catch up (tdist__cpu_loop_sync) and returns 1, and the caller skips
 * the loop call. */
static inline int cpu_off_loop(cpu_ctx_t *ctx) {
  if (!ctx->caller) return 0;
  ctx->loop_stale = 1;
  return 1;
}

/* ---- lock.c: the engine lock, and the reports it defers -------------------- */
/* (progress) Take / drop the engine lock around a progress-thread entry;
 * enter first hands over what driving callers left (loop_stale); leave runs
 * ctx->hooks->leave, then brings the loop up to date (hooks->sync). */
void tdist__cpu_enter(cpu_ctx_t *ctx);
void tdist__cpu_leave(cpu_ctx_t *ctx);
/* The group is broken: tdist_backend_fail (remote: tdist_backend_fail_remote) on
 * the progress thread; on a driving caller the first cause is kept for the
 * progress thread to report. */
void tdist__cpu_fail(cpu_group_t *cg, int remote, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The engine completed op successfully (its cpu_op_t is already back in the
 * pool): tdist_backend_complete now, or held for the progress thread when a
 * caller drives or the core has not posted the op yet. */
void tdist__cpu_op_done(cpu_ctx_t *ctx, tdist_backend_op_t *bop);
/* (progress) The core's post of an op submit started: 1 if it was (done here), else 0. */
int tdist__cpu_post_early(cpu_group_t *cg, tdist_backend_op_t *bop);
/* (progress) Drop cg's held completions (abort: the core finishes its ops). */
void tdist__cpu_drop_held(cpu_group_t *cg);
TDIST_PARAM(CpuDrive, "TDIST_CPU_DRIVE", 1) /* 0: only the progress thread runs the engine */

/* ---- settings (docs/cpu-backend.md) ---------------------------------------- */
TDIST_PARAM(CpuSegBytes, "TDIST_CPU_SEGMENT_BYTES", 0) /* 0: tdist__cpu_seg_bytes() picks */
TDIST_PARAM(CpuRingBytes, "TDIST_CPU_ALLREDUCE_RING_BYTES", 256 << 10)
TDIST_PARAM(CpuBcastChainBytes, "TDIST_CPU_BCAST_CHAIN_BYTES", 256 << 10)
TDIST_PARAM(CpuAllgatherRingBytes, "TDIST_CPU_ALLGATHER_RING_BYTES", 1 << 20)
TDIST_PARAM(CpuSockBuf, "TDIST_CPU_SOCKBUF", 4 << 20)
TDIST_PARAM(CpuSendChunk, "TDIST_CPU_SEND_CHUNK", 1 << 20)
TDIST_PARAM(CpuCacheBytes, "TDIST_CPU_CACHE_BYTES", 256 << 20)
TDIST_PARAM(CpuDeferBytes, "TDIST_CPU_DEFER_BYTES", 256 << 10)
TDIST_PARAM(CpuDeferUs, "TDIST_CPU_DEFER_US", 5000)
TDIST_PARAM(CpuLingerMs, "TDIST_CPU_LINGER_MS", 1000) /* conn.c: leaving, wait for EOFs */
TDIST_PARAM(CpuCma, "TDIST_CPU_CMA", 1)
/* A collective still running after this long sends its signature to the
 * other members, and again each period (probe.c); 0 turns probes off. */
TDIST_PARAM(CpuProbeMs, "TDIST_CPU_PROBE_MS", 500)
/* A single-copy read costs a round trip (descriptor, then ACK) that TCP's
 * one-way send does not; measured on a 2-core VM, TCP still wins at 64 KiB
 * (broadcast n=2: ~40 vs ~90 us) and the read wins from 1 MiB (~2x). */
TDIST_PARAM(CpuCmaBytes, "TDIST_CPU_CMA_BYTES", 256 << 10)

/* ---- reduce.c (any thread) ------------------------------------------------------ */
/* dst[i] = dst[i] (op) src[i] for n elements; AVG and PREMUL_SUM reduce as SUM.
 * Only SUM/PROD of two NaNs depend on the operand order (which payload
 * wins): callers that need the same bits on every rank keep the order the
 * same everywhere (algos.c: lower-rank block first). */
void tdist__cpu_reduce(void *dst, const void *src, size_t n, tdist_dtype_t dt, tdist_redop_t op);
/* buf[i] *= scalar (PREMUL_SUM input scaling); BOOL: buf[i] = buf[i] != 0
 * (algos.c prepares every BOOL input so, scalar unused). */
void tdist__cpu_scale(void *buf, size_t n, tdist_dtype_t dt, double scalar);
/* buf[i] /= divisor (AVG; integers truncate toward zero). */
void tdist__cpu_divide(void *buf, size_t n, tdist_dtype_t dt, int divisor);
float tdist__cpu_half_to_float(uint16_t h);
uint16_t tdist__cpu_float_to_half(float f);
float tdist__cpu_bf16_to_float(uint16_t h);
uint16_t tdist__cpu_float_to_bf16(float f);
/* OCP float8: round to nearest even; E4M3 saturates at +-448 (it has
 * no infinity), E5M2 overflows to infinity. */
float tdist__cpu_e4m3_to_float(uint8_t b);
uint8_t tdist__cpu_float_to_e4m3(float f);
float tdist__cpu_e5m2_to_float(uint8_t b);
uint8_t tdist__cpu_float_to_e5m2(float f);

#endif
