/*
 * engine.h - the CPU backend's engine (sub-layer above transport): matching
 * (engine.c, dispatch.c), the algorithms (algos.c, algos_v.c), mismatch
 * signatures and stall probes (sigcheck.c, probe.c), long copies in steps
 * (copy_steps.c) and single copy between processes (cma.c). It reaches the
 * shared segment above it only through ctx->hooks (sc_*).
 */
#ifndef TDIST_CPU_ENGINE_ENGINE_H
#define TDIST_CPU_ENGINE_ENGINE_H

#include "cpu/base/base.h"

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
/* (progress, engine lock) An ERR message read whole (u, freed here) fails
 * cg with its status and text, unless cg already failed (dispatch.c). */
void tdist__cpu_take_err(cpu_group_t *cg, cpu_ux_t *u);
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
/* One from the pool for the core's op bop, its fields from bop's arguments,
 * on cg->ops (its cseq and its start are the caller's); NULL: no memory. */
cpu_op_t *tdist__cpu_op_new(cpu_group_t *cg, tdist_backend_op_t *bop);
void tdist__cpu_op_put(cpu_op_t *op); /* off every list, back to the pool */
/* The engine is done with op: recorded in the done ring, back to the pool
 * (lag: kept for its signatures, sigcheck.c), and completed for the core. */
void tdist__cpu_op_complete(cpu_op_t *op, int lag);
/* Engine only: collective op is done here: remembered (tdist__cpu_done_of),
 * and a message of it that arrived early and is still unclaimed means a
 * peer ran another op (part of tdist__cpu_op_complete; the segment's
 * give-now lane, which has no engine op to complete, calls it alone). */
void tdist__cpu_done_note(const cpu_op_t *op);
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
  /* Likewise behind a shared-memory op not checked yet (sc.h); the
   * segment is told that someone waits (cg->sc_waited). */
  if (!op->cg->sc_lag || !(op->p2p || op->received)) return 0;
  op->cg->sc_waited = 1;
  return 1;
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
