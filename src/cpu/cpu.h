/*
 * cpu.h - the CPU backend's internals (shared by the files of src/cpu only).
 *
 * The backend implements core/backend.h (contract v2): it never sees the
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
 * under the engine lock (ctx->mu, drive.c): on the progress thread, which never blocks but for that
 * lock, or on a caller thread that starts its op in submit or drives it while it waits (test); such
 * a caller never touches the loop and leaves completions and failures to the progress thread.
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
#ifndef TDIST_CPU_CPU_H
#define TDIST_CPU_CPU_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "tdist/backend.h"
#include "util/clock.h"
#include "util/list.h"
#include "util/log.h"
#include "util/param.h"
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
  uint64_t posted_at; /* uv_now() at post (probe.c) */
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
  uint64_t probe_at; /* uv_now() when the next probe is due (probe.c) */
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
    uint64_t blocked_at; /* a giver found no room since (ms; sc_ovf.c), 0: it did */
    int phase;           /* two: this member reduced its part of step cstep */
    uint64_t seen;       /* members whose signature was checked (bit m) */
    tdist__list_t link;  /* the channel's ops, in post order */
    uint64_t s0, nsteps; /* the op's steps (nsteps UINT64_MAX until known) */
    uint64_t wstep;      /* steps of this member's stream written */
    uint64_t cstep;      /* steps consumed */
    uint64_t total;      /* bytes of this member's stream */
    uint8_t *tmp;        /* a private copy of the input (overlapping buffers) */
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
  /* drive.c: the first failure found by a driving caller, reported to the
   * core by the progress thread (tdist_backend_fail is its alone). */
  int pf_set, pf_status, pf_remote;
  char pf_why[256];
  /* sc.h: the group's shared-memory channel (set on the caller thread at
   * creation, before registration), or NULL: the engine runs everything;
   * sc_lag: it has ops completed before every member's signature was
   * checked (a p2p op, or an engine op that receives, waits). */
  struct cpu_sc *sc;
  int sc_lag;
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
  uint64_t probe_due; /* tdist__cpu_now_ms() when it fires; 0: not armed (so a
                         driving caller can tell without asking the loop) */
  /* long copies made in steps (copy_steps.c); copy_idle runs while any is
   * queued, initialised on first use */
  uv_idle_t copy_idle;
  int copy_idle_on;
  tdist__list_t copies;
  /* The engine lock (drive.c). Whoever runs the backend's code for this
   * ctx holds it: the progress thread in every entry (poll and timer
   * callbacks, post, abort, poll, the setup tasks), or a caller thread
   * that drives its own op (submit, test), which only ever tries it. Every
   * field above is written under it, so each has one writer at a time. */
  /* shared memory (shm_conn.c): our segment of inbound rings, and the idle
   * handle that reads on when one read pass left bytes in a ring */
  tdist__cpu_shm_seg_t shm;
  uv_idle_t ring_idle;
  int ring_idle_on;
  pthread_mutex_t mu;
  int caller;         /* the holder is a caller thread: the loop is not ours to touch */
  int loop_stale;     /* a caller left loop work (watch, timers, failures, completions) */
  tdist__list_t held; /* tdist_backend_op_t.link: completions not given to the core yet */
  /* (any thread) tdist__cpu_shm_mark's waiters, counted under mark_mu, so a
   * ring attached later (lazy.c) starts with their poll marks */
  pthread_mutex_t mark_mu;
  int nmarks;
  int nquiet; /* of them, quiet ones held without a wake (drive.c) */
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

/* ---- drive.c: the engine lock, and a waiting caller that drives its op ---- */
/* (progress) Take / drop the engine lock around a progress-thread entry;
 * leave first brings the loop up to date with what drivers left (loop_stale). */
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
/* Backend entries on a caller thread (backend.c's vtable). */
int tdist__cpu_submit(void *state, tdist_backend_op_t *bop);
int tdist__cpu_test(void *state, tdist_backend_op_t *bop);
/* A waiter starts (on = 1) or stops (0) driving (backend.h, drive_mark). */
void tdist__cpu_drive_mark(void *state, int on);
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

/* ---- conn.c: setup and teardown ------------------------------------------- */
/* Caller thread: listen, trade addresses over the store, connect the full
 * mesh, register the polls. p is the world group's. */
int tdist__cpu_ctx_create(const tdist_backend_params_t *p, const cpu_tp_events_t *ev,
                          cpu_ctx_t **out);
/* Caller thread: drop a group's reference; the last one closes everything. */
void tdist__cpu_ctx_release(cpu_ctx_t *ctx);
/* (progress) Free ctx once no group holds it and its last handle closed. */
void tdist__cpu_ctx_maybe_free(cpu_ctx_t *ctx);
/* (caller, setup) A connection object for world rank peer on fd (-1: a
 * placeholder); with_rx: its receive buffer now (else at connect). */
cpu_conn_t *tdist__cpu_conn_new(cpu_ctx_t *ctx, int peer, int fd, const char *addr, int with_rx);
/* (any thread) Connect to "host:port", retrying until deadline_ns. */
int tdist__cpu_connect_to(const char *addr, int64_t deadline_ns, int *fd_out);
void tdist__cpu_tune_socket(int fd); /* TCP_NODELAY and TDIST_CPU_SOCKBUF */

/* ---- lazy.c: connections made on first use (TDIST_CPU_CONNECT) --------------- */
typedef struct cpu_lazy cpu_lazy_t;
/* 1: connect on first use, 0: the full mesh, for a world of `size` ranks
 * (TDIST_CPU_CONNECT: auto (the default: lazy from TDIST_CPU_LAZY_FROM = 64
 * ranks), eager or lazy). */
int tdist__cpu_lazy_mode(int size);
/* (caller, setup) Publish `me` as "cpu/addr/<rank>" and give every peer a
 * placeholder connection; lfd (listening) is the lazy state's on success. */
int tdist__cpu_lazy_create(cpu_ctx_t *ctx, const tdist_backend_params_t *p, int lfd,
                           const char *me);
void tdist__cpu_lazy_start(cpu_ctx_t *ctx);  /* (progress, start_all) the async handle */
int tdist__cpu_lazy_threads(cpu_ctx_t *ctx); /* (caller) start the dialer and acceptor */
/* (engine lock) An op needs c: connect it unless it is up or on its way.
 * Only queues (never blocks). */
void tdist__cpu_conn_want(cpu_conn_t *c);
void tdist__cpu_lazy_stop(cpu_ctx_t *ctx); /* (progress, last release) no more handoffs */
/* (caller, before the last release) A connection still being made owes
 * what is queued on it (an abort's ERR, which names the cause for the
 * peer): wait up to max_ms for such connections to come up, so the
 * linger delivers what they owe as the mesh's connections deliver theirs. */
void tdist__cpu_lazy_owing_wait(cpu_ctx_t *ctx, int64_t max_ms);
/* (after stop) Join the threads (caller) or detach them (progress thread);
 * the state goes with the last of them. */
void tdist__cpu_lazy_end(cpu_lazy_t *lz, int join);
/* Connections made since the process started, mesh and lazy (tests). */
extern _Atomic uint64_t tdist__cpu_connects;

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
/* ---- leave.c: leaving without losing what is owed ---------------------------- */
/* A connection being left: its fd, and what its queue still owed (the
 * caller's now: cpu_msg_t on plain heap memory, goodbye last); with a ring,
 * the owed bytes go there (the peer's segment, unmapped when done). */
typedef struct cpu_leaving {
  int fd;
  tdist__list_t owed;
  struct tdist__cpu_ring *ring;
  void *map;
  size_t map_bytes;
} cpu_leaving_t;
void tdist__cpu_conn_close(cpu_conn_t *c); /* orderly: bye, shutdown, close */
/* (progress) c leaves the loop. With `owed`, a live connection's queue
 * moves there (goodbye appended) and its fd is returned for the caller to
 * linger on (tdist__cpu_linger); without, the goodbye is written only if
 * nothing is queued, writes are shut and the fd is returned to be closed.
 * -1 when the connection had failed (its fd is closed here). */
int tdist__cpu_conn_detach(cpu_conn_t *c, cpu_leaving_t *l);
/* (caller) Write what is owed, shut writes, read until each peer's EOF;
 * at most TDIST_CPU_LINGER_MS over all of them; closes every fd. */
void tdist__cpu_linger(cpu_leaving_t *ls, int n);
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

/* ---- cma.c: single copy between processes of one host ---------------------- */
int tdist__cpu_cma_enabled(void);
/* (any thread) This process's host identity, "<boot_id>/net:<dev>:<inode>"
 * ("" when unknown): processes with equal identities share a kernel and a
 * network namespace, i.e. a host as the job sees it (cma.c). */
#define HOST_ID_LEN 96
void tdist__cpu_host_identity(char *id);
void tdist__cpu_cma_hello(cpu_cma_hello_t *me);        /* caller thread, setup */
int tdist__cpu_cma_probe(const cpu_cma_hello_t *peer); /* 1: we can read the peer */
void tdist__cpu_cma_group_init(cpu_group_t *cg);       /* caller thread */
void tdist__cpu_cma_group_abort(cpu_group_t *cg);      /* progress thread */
void tdist__cpu_cma_group_free(cpu_group_t *cg);       /* after unregistering */
void tdist__cpu_cma_start_timer(cpu_ctx_t *ctx);       /* progress thread */
void tdist__cpu_cma_sync(cpu_ctx_t *ctx); /* (progress) timer armed if a descriptor waits */
/* Caller thread, setup (conn.c): trade hellos over the peers' fds[], probe,
 * and say who can read whom (out[j].enabled) and who shares this host
 * (local[j]); fds[me] is unused; names[j]: the world rank j stands for in
 * logs (NULL: j itself; lazy.c trades as a pair 0, 1). */
int tdist__cpu_cma_exchange(int me, int n, const int *fds, const int *names, int64_t deadline,
                            cpu_cma_hello_t *out, int *local);
/* Copy d's bytes from process pid into dst, then check the sender's live
 * word. 0; or -1 with a description in why and *aborted set when the
 * sender had aborted (its live word changed: a failed read then names no
 * fault of the sender's). Any thread (progress thread in the library). */
int tdist__cpu_cma_read(int pid, void *dst, const cpu_rma_desc_t *d, char *why, size_t wl,
                        int *aborted);
/* The same in parts: bytes [off, off + len) of d into dst + off, and after
 * the last part the live word's check (which also counts the read). */
int tdist__cpu_cma_read_range(int pid, void *dst, const cpu_rma_desc_t *d, size_t off, size_t len,
                              char *why, size_t wl, int *aborted);
int tdist__cpu_cma_read_end(int pid, const cpu_rma_desc_t *d, char *why, size_t wl, int *aborted);
/* A read from world rank src_world failed (why): -1, cg's failure reported;
 * -2 when the sender aborted (aborted != 0): cg waits up to 1 s for its
 * cause first. cg may be NULL (an orphan's read): nothing to fail. */
int tdist__cpu_cma_failed(cpu_group_t *cg, int src_world, int aborted, const char *why);
/* (engine lock) cg fails with text (REMOTE_FAILED) in 1 s unless a cause
 * (an ERR, the abort record) aborts it first (the timer of cma.c). */
void tdist__cpu_fail_later(cpu_group_t *cg, const char *text);
void tdist__cpu_cma_ack(cpu_ctx_t *ctx, int src_world, uint64_t cookie); /* descriptor read */
void tdist__cpu_cma_take(cpu_ctx_t *ctx, cpu_ux_t *u); /* pending u is read elsewhere */
/* Set m's payload: ptr itself, or a descriptor of it when c's peer reads
 * our memory and len >= TDIST_CPU_CMA_BYTES (m->hdr must be filled). */
void tdist__cpu_msg_payload(cpu_conn_t *c, cpu_group_t *cg, cpu_msg_t *m, const void *ptr,
                            size_t len);
void tdist__cpu_cma_on_desc(cpu_conn_t *c); /* a descriptor arrived in c->rdesc */
/* Read pending descriptor u into dst and ACK it: 0; -1: the read failed and
 * cg's failure is reported; -2: the sender aborted, cg waits for the cause.
 * u is no longer pending either way (on failure the transfer never
 * completes; the caller frees u). */
int tdist__cpu_cma_fetch(cpu_ctx_t *ctx, cpu_group_t *cg, cpu_ux_t *u, void *dst);
void tdist__cpu_cma_drop(cpu_ctx_t *ctx, cpu_ux_t *u); /* never to be read: ACK it */
extern _Atomic uint64_t tdist__cpu_cma_reads;          /* payloads read across processes */

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
/* Collectives completed over a group's shared segment (sc_op.c; tests). */
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

/* ---- dispatch.c: the transport's receive side, called by io.c and cma.c ---- */
/* A header arrived on c; set c->rx_dst/rx_op/rx_x/rx_ux for its payload. */
void tdist__cpu_on_header(cpu_conn_t *c);
/* The payload of the current message is complete. */
void tdist__cpu_on_payload(cpu_conn_t *c);
/* Connection lost: reports the failure of the groups that still need the
 * peer (deferred) and stops all I/O on c. */
void tdist__cpu_on_conn_lost(cpu_conn_t *c, const char *why);
/* The engine's callbacks for the transports (cpu_tp_events_t). */
extern const cpu_tp_events_t tdist__cpu_engine_events;

/* ---- algos.c ---------------------------------------------------------------- */
/* Pipeline segment of ring and chain rounds: TDIST_CPU_SEGMENT_BYTES, else
 * 512 KiB, or 2 MiB when this host's ranks (LOCAL_WORLD_SIZE) outnumber
 * its CPUs (docs/cpu-backend.md). */
size_t tdist__cpu_seg_bytes(void);
/* Pick the algorithm for op and set round_fn/finish_fn; may allocate tmp. */
int tdist__cpu_algo_setup(cpu_op_t *op);
/* Add a transfer of the current round (room reserved by algo_setup). */
int tdist__cpu_op_send(cpu_op_t *op, int peer, const void *ptr, size_t len);
int tdist__cpu_op_recv(cpu_op_t *op, int peer, void *ptr, size_t len, int reduce);
int tdist__cpu_op_reserve(cpu_op_t *op, int n);

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

/* ---- backend.c: the backend as the core's table lists it ------------------------ */
extern const tdist_backend_t tdist__cpu_backend;

/* ---- engine.c, shared with dispatch.c, cma.c and backend.c; progress
 * thread only. ---- */
cpu_group_t *tdist__cpu_group_find(cpu_ctx_t *ctx, uint64_t uid);
/* Group rank of a world rank, or -1. */
static inline int tdist__cpu_grank_of(const cpu_group_t *cg, int world) {
  return world >= 0 && world < cg->ctx->size ? cg->grank[world] : -1;
}
/* World rank of group rank g, for messages that name both ("rank 1 (world
 * rank 3)": a group rank alone reads as the reader's own numbering). */
static inline int tdist__cpu_wrank_of(const cpu_group_t *cg, int g) {
  return g >= 0 && g < cg->size ? cg->global_ranks[g] : -1;
}
/* An unexpected message with room for its payload (none when nodata). */
cpu_ux_t *tdist__cpu_ux_new(cpu_ctx_t *ctx, const cpu_hdr_t *h, int src, int nodata);
/* Free u, taking it off its list if it is on one. */
void tdist__cpu_ux_free(cpu_ctx_t *ctx, cpu_ux_t *u);
void tdist__cpu_detach_rx(cpu_group_t *cg);   /* stop socket reads into cg's buffers */
cpu_op_t *tdist__cpu_op_get(cpu_group_t *cg); /* from the group's pool */
void tdist__cpu_op_put(cpu_op_t *op);         /* off every list, back to the pool */
/* The engine is done with op: recorded in the done ring, back to the pool
 * (lag: kept for its signatures, sigcheck.c), and completed for the core. */
void tdist__cpu_op_complete(cpu_op_t *op, int lag);
/* A transfer of op is done: op->pending--, and at 0 the op goes on the ready
 * list (once). Records only: safe anywhere in the transport. */
void tdist__cpu_xfer_done(cpu_op_t *op);
/* Put op on the ready list if it is not on it. */
void tdist__cpu_ready(cpu_op_t *op);
/* The engine: advance the ready ops until none is left. Top-level points
 * only (cpu.h). */
void tdist__cpu_run_ready(cpu_ctx_t *ctx);
/* Mismatch checks (sigcheck.c): a peer's header against the local op, a
 * collective's or a p2p receive's; 1 (the group's failure reported) when
 * they disagree. */
int tdist__cpu_check_coll(cpu_group_t *cg, cpu_op_t *op, const cpu_hdr_t *h, int src);
/* A COLL message for collective h->seq, which is not running here: if it
 * completed here, the sender disagreed with it; fail the group (MISMATCH)
 * and return 1. 0 when h->seq was not posted here yet. */
int tdist__cpu_check_done(cpu_group_t *cg, const cpu_hdr_t *h, int src);
int tdist__cpu_check_p2p(cpu_group_t *cg, cpu_xfer_t *x, const cpu_hdr_t *h, int src);
cpu_op_t *tdist__cpu_op_find(cpu_group_t *cg, uint64_t seq); /* active op #seq */
/* The done-ring entry of completed collective #seq, or NULL (not posted, or
 * too old). */
const struct cpu_done *tdist__cpu_done_of(const cpu_group_t *cg, uint64_t seq);

/* ---- sigcheck.c: every rank completes a collective only once it knows every
 * member agrees with it (progress thread; docs/cpu-backend.md "Mismatch") ---- */
/* The header-only message carrying op's signature: a SIG or a PROBE. */
cpu_hdr_t tdist__cpu_sig_hdr(const cpu_group_t *cg, const cpu_op_t *op, int kind);
/* Reset op's signature state at post; decide whether it must hear every
 * member directly (need_sigs). */
void tdist__cpu_sig_posted(cpu_op_t *op);
/* Round 0 of op was listed (engine, nothing sent yet): take the SIGs that
 * arrived before the post, then (need_sigs ops) send a SIG to every member
 * round 0 sends nothing to. 1: a failure was reported, op must stop. */
int tdist__cpu_sig_round0(cpu_op_t *op);
/* src's header of op agreed with it: mark src heard; when op only waits
 * for signatures and this was the last one, op goes on the ready list.
 * Records only: safe anywhere in the transport. */
void tdist__cpu_sig_heard(cpu_op_t *op, int src);
/* op may complete: it needs no signatures, or has heard every member. */
static inline int tdist__cpu_sigs_complete(const cpu_op_t *op) {
  return !op->need_sigs || op->nheard >= op->size - 1;
}
void tdist__cpu_on_sig(cpu_conn_t *c); /* a SIG header arrived (transport) */
/* Engine: an earlier collective of op's group still lacks signatures, so op
 * must not complete yet (it is readied again when that one has them). */
static inline int tdist__cpu_lag_blocks(const cpu_op_t *op) {
  const cpu_op_t *l = op->cg->lagging;
  if (l && l != op && op->cseq > l->cseq) return 1;
  /* Likewise behind a shared-memory op not checked yet (sc.h). */
  return op->cg->sc_lag && (op->p2p || op->received);
}
/* Collectives lagging at most in one group (sigcheck.c): how far a rank
 * that only sends (a broadcast root in a loop) runs ahead of the
 * signatures of its oldest lagging op. */
#define CPU_LAG_MAX 16
/* Engine: lagging op has heard every member: back to the pool, and the
 * ops that waited for it are readied. */
void tdist__cpu_lag_clear(cpu_op_t *op);
/* Engine: op's rounds are done. 1: complete it; 2: complete it, lagging
 * (it keeps waiting for signatures); 0: not yet (readied again by its last
 * signature or by the lagging op's clearing). */
int tdist__cpu_sig_finish(const cpu_op_t *op);
/* Report a mismatch of cg in collective #seq (UINT64_MAX: a point-to-point
 * one): ops from #seq on stop advancing (tdist__cpu_blocked) and the
 * group's failure is reported (deferred). */
void tdist__cpu_mismatch(cpu_group_t *cg, uint64_t seq, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* op may not advance: a mismatch was reported in its collective or an
 * earlier one (a p2p op: one posted before it). cseq of a p2p op is the
 * number of collectives posted before it (tdist__cpu_post_p2p). */
static inline int tdist__cpu_blocked(const cpu_op_t *op) {
  uint64_t b = op->cg->broken_at;
  return b && (op->p2p ? op->cseq >= b : op->cseq + 1 >= b);
}

/* ---- copy_steps.c: long copies in bounded steps (progress thread) ------------ */
#define CPU_COPY_STEP ((size_t)4 << 20)     /* most bytes copied per loop iteration */
void tdist__cpu_copy_start(cpu_ctx_t *ctx); /* (progress, setup) the idle handle */
void tdist__cpu_copy_sync(cpu_ctx_t *ctx);  /* (progress) running iff a copy is queued */
/* (engine lock) A driving caller makes one step's share of the copies (the
 * progress thread's idle handle makes the others). */
void tdist__cpu_copy_drive(cpu_ctx_t *ctx);
/* A send to oneself: copy len bytes of src into u (on cg->ux), then mark it
 * complete, offer it to a posted receive and finish op's transfer, at once
 * or in steps. */
void tdist__cpu_copy_self(cpu_group_t *cg, cpu_op_t *op, cpu_ux_t *u, const void *src, size_t len);
/* Deliver complete p2p message u to receive x in steps: 1 if taken (u off
 * its list, freed and x done at the last step), 0: copy it now. */
int tdist__cpu_copy_deliver(cpu_group_t *cg, cpu_op_t *op, cpu_xfer_t *x, cpu_ux_t *u);
void tdist__cpu_copy_cancel(cpu_op_t *op); /* op is freed: drop its copies */
/* Read descriptor d (from world rank src_world, process pid) into dst for
 * receive x of op in steps; dst is a stage buffer of ours when x reduces.
 * 1: queued (it ACKs and finishes x); 0: small or no memory, read at once. */
int tdist__cpu_copy_read(cpu_group_t *cg, cpu_op_t *op, cpu_xfer_t *x, int src_world, int32_t pid,
                         const cpu_rma_desc_t *d, uint8_t *dst);
/* Stage pending descriptor u (no longer pending) into dst in steps; cg is
 * NULL for an orphan. 1: queued (u->job set until done); 0: read at once. */
int tdist__cpu_copy_stage(cpu_ctx_t *ctx, cpu_group_t *cg, cpu_ux_t *u, int32_t pid, uint8_t *dst);
/* Receive x wants u, which is being staged: 1 and x waits for the last
 * step (then tdist__cpu_deliver_ux(x, u)); 0 when u is not being staged. */
int tdist__cpu_copy_wait_staged(cpu_ux_t *u, cpu_xfer_t *x);
void tdist__cpu_copy_forget_ux(cpu_ctx_t *ctx, cpu_ux_t *u); /* u is freed: drop its staging */

/* ---- probe.c: stall probes (progress thread) ---------------------------------- */
void tdist__cpu_probe_start_timer(cpu_ctx_t *ctx); /* with the other timers */
void tdist__cpu_probe_sync(cpu_ctx_t *ctx);        /* (progress) timer armed if a collective runs */
void tdist__cpu_probe_posted(cpu_op_t *op);        /* a collective was posted */
void tdist__cpu_on_probe(cpu_conn_t *c);           /* a PROBE header arrived */
cpu_xfer_t *tdist__cpu_round_recv(cpu_op_t *op, int src); /* its round's receive from src */
void tdist__cpu_deliver_ux(cpu_group_t *cg, cpu_op_t *op, cpu_xfer_t *x, cpu_ux_t *u);
int tdist__cpu_post_p2p(cpu_group_t *cg, cpu_op_t *op);
cpu_xfer_t *tdist__cpu_precv_match(cpu_group_t *cg, int src, int tag); /* posted p2p receive */
void tdist__cpu_claim_p2p(cpu_group_t *cg, cpu_ux_t *u); /* give u to its receive, if posted */
/* Receive x (taken off the posted list) gets message h from group rank src:
 * check it (tdist__cpu_check_p2p: a wildcard receive, peer TDIST_ANY_SOURCE
 * or tag TDIST_ANY_TAG, takes up to its count) and, for a wildcard, record
 * the source, tag and count in its core op (rx_*). 1 on a mismatch
 * (reported). Safe anywhere in the transport. */
int tdist__cpu_match_p2p(cpu_group_t *cg, cpu_xfer_t *x, const cpu_hdr_t *h, int src);

/* ---- algos_v.c: variable-size collectives (progress thread) ----------------- */
/* Set up a v-op (tdist_backend_op_is_v): the own block's local copy, round_fn. */
int tdist__cpu_algo_setup_v(cpu_op_t *op);
/* tdist__cpu_check_coll for a v-op: op, dtype, root, reduction, and for a
 * data message of a running op its count against what this rank expects
 * from src (MISMATCH naming both numbers). 1 on a mismatch (reported). */
int tdist__cpu_check_v(cpu_group_t *cg, cpu_op_t *op, const cpu_hdr_t *h, int src);

#endif
