/*
 * dispatch.c - where an incoming message goes (progress thread, called by
 * io.c and cma.c; part of the transport): a header picks the receive its
 * payload is read into (a posted round or p2p receive, an unexpected-list
 * buffer, the orphan list, or a parked socket), a finished payload marks
 * its transfer done or waits to be claimed, and a lost connection reports
 * the failure of the groups that still need the peer.
 *
 * Nothing here runs the engine (cpu.h): a finished transfer only puts its
 * op on the ready list (tdist__cpu_xfer_done), and failures go through
 * tdist_backend_fail / tdist_backend_fail_remote, which the core delivers after the
 * current I/O step. A group whose failure is reported keeps receiving
 * harmlessly until the core aborts it.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "util/alloc.h"
#include "util/error.h"
#include "cpu/base/base.h"
#include "cpu/transport/transport.h"
#include "cpu/engine/engine.h"

/* ---- dispatch from io.c ----------------------------------------------------------- */

/* Leave a large unexpected payload in the kernel for now (cpu.h, deferred
 * reads)? Only while this process runs nothing (no active op, no posted
 * receive, in any group): then nothing it waits for can be queued behind
 * it on this connection, and the next post (any op) reads on. */
static int may_park(cpu_ctx_t *ctx, const cpu_hdr_t *h) {
  int64_t min = tdist__param_CpuDeferBytes();
  if (ctx->no_park || !ctx->timer_on || min <= 0 || tdist__param_CpuDeferUs() <= 0) return 0;
  if (min < 2 * CPU_RX_CAP) min = 2 * CPU_RX_CAP; /* more than can be staged */
  if (h->len < (uint64_t)min) return 0;
  tdist__list_t *n, *m;
  tdist__list_foreach(n, &ctx->groups) {
    cpu_group_t *cg = tdist__list_entry(n, cpu_group_t, link);
    if (!tdist__list_empty(&cg->precv)) return 0;
    tdist__list_foreach(m, &cg->ops) {
      /* an op that completed and only waits for signatures runs nothing */
      if (!tdist__list_entry(m, cpu_op_t, link)->lagging) return 0;
    }
  }
  return 1;
}

/* Messages that belong to the connection, not to a group: goodbye, acks,
 * liveness probes, signatures, single-copy descriptors. 1 if h was one. */
static int on_conn_header(cpu_conn_t *c, const cpu_hdr_t *h) {
  switch (h->kind) {
  case CPU_MSG_BYE:
    c->bye = 1;
    c->bye_cause = h->root;
    return 1;
  case CPU_MSG_ACK: tdist__cpu_conn_acked(c, h->seq); return 1;
  case CPU_MSG_PROBE: tdist__cpu_on_probe(c); return 1;
  case CPU_MSG_SIG: tdist__cpu_on_sig(c); return 1; /* sigcheck.c */
  case CPU_MSG_RMA:
    if (h->len != sizeof(c->rdesc)) {
      tdist__cpu_on_conn_lost(c, "sent a malformed message (descriptor size)");
      return 1;
    }
    c->rx_dst = (uint8_t *)&c->rdesc; /* tdist__cpu_on_payload -> tdist__cpu_cma_on_desc */
    return 1;
  default: return 0;
  }
}

/* A collective's message: straight into its round's buffer (or a staging
 * buffer when it is reduced) if the op is here and in that round. 1 if h
 * is dealt with (a destination set, or checked and discarded); 0: it waits
 * in the unexpected list. */
static int rx_coll(cpu_conn_t *c, cpu_group_t *cg, const cpu_hdr_t *h, int src) {
  cpu_op_t *op = tdist__cpu_op_find(cg, h->seq);
  if (op && op->sc.on) {                           /* over shared memory here: read and discarded */
    cg->ctx->hooks->sc_engine_msg(cg, op, h, src); /* segment/sc_op.c */
    return 1;
  }
  if (op && tdist__cpu_check_coll(cg, op, h, src)) return 1;
  /* completed here (lagging for signatures): as for any completed op */
  if (op && op->lagging && tdist__cpu_check_done(cg, h, src)) return 1;
  if (!op && tdist__cpu_check_done(cg, h, src)) return 1; /* read and discarded */
  if (!op || op->round != (int)h->slot) return 0;
  cpu_xfer_t *x = tdist__cpu_round_recv(op, src);
  if (!x || x->len != h->len) return 0;
  c->rx_op = op;
  c->rx_x = x;
  c->rx_dst = x->reduce ? tdist__cpu_buf_get(c->ctx, h->len) : x->ptr;
  if (c->rx_dst) return 1;
  c->rx_op = NULL; /* no staging buffer: unexpected, read later */
  c->rx_x = NULL;
  return 0;
}

/* A point-to-point message: into the earliest posted receive that fits
 * (its peer or TDIST_ANY_SOURCE, its tag or TDIST_ANY_TAG: engine.c). 1 if
 * h is dealt with; 0: it waits in the unexpected list. */
static int rx_p2p(cpu_conn_t *c, cpu_group_t *cg, const cpu_hdr_t *h, int src) {
  cpu_xfer_t *x = tdist__cpu_precv_match(cg, src, h->root);
  if (!x) return 0;
  /* Only if nothing older from this peer that x would take is waiting
   * (same tag, or any tag for an any-tag receive): per-pair order. */
  tdist__list_t *n;
  tdist__list_foreach(n, &cg->ux) {
    cpu_ux_t *u = tdist__list_entry(n, cpu_ux_t, link);
    if (u->hdr.kind == CPU_MSG_P2P && u->src == c->peer &&
        (u->hdr.root == h->root || x->tag == TDIST_ANY_TAG))
      return 0;
  }
  tdist__list_remove(&x->plink);
  /* checks it (a wildcard receive takes up to its count) and records
   * what matched for tdist_work_status_info */
  if (tdist__cpu_match_p2p(cg, x, h, src)) return 1;
  c->rx_op = x->op;
  c->rx_x = x;
  c->rx_dst = x->ptr;
  return 1;
}

/* Nothing posted takes it: park the socket (may_park) or read it into the
 * group's unexpected list. */
static void rx_unexpected(cpu_conn_t *c, cpu_group_t *cg, const cpu_hdr_t *h) {
  if (!c->rx_rma && may_park(c->ctx, h)) {
    tdist__cpu_conn_park(c);
    return;
  }
  cpu_ux_t *u = tdist__cpu_ux_new(c->ctx, h, c->peer, c->rx_rma);
  if (!u) {
    tdist__cpu_fail(cg, 0, TDIST_ERR_NO_MEMORY, "cpu: out of memory for a message");
    return; /* the payload is discarded */
  }
  tdist__list_push_back(&cg->ux, &u->link);
  c->rx_ux = u;
  c->rx_dst = u->data;
}

/* (progress) A header was read from c: say where its payload goes
 * (c->rx_dst and what it belongs to), park the socket, or leave rx_dst
 * NULL: the payload is read and discarded. */
void tdist__cpu_on_header(cpu_conn_t *c) {
  cpu_ctx_t *ctx = c->ctx;
  const cpu_hdr_t *h = &c->rh;
  c->quiet = 0; /* the peer can tell us a cause on c from now on */
  if (on_conn_header(c, h)) return;
  cpu_group_t *cg = tdist__cpu_group_find(ctx, h->uid);
  if (h->kind == CPU_MSG_ERR || !cg) {
    /* Errors are read whole; messages of groups not created here yet wait
     * in the orphan list. */
    cpu_ux_t *u = tdist__cpu_ux_new(ctx, h, c->peer, c->rx_rma);
    if (!u) return; /* no memory: the payload is discarded */
    if (h->kind != CPU_MSG_ERR) tdist__list_push_back(&ctx->orphans, &u->link);
    /* an ERR joins them whole, if it still has no group (on_err) */
    c->rx_ux = u;
    c->rx_dst = u->data;
    return;
  }
  if (cg->aborted) return; /* discard */
  int src = tdist__cpu_grank_of(cg, c->peer);
  if (src < 0) return;
  c->rx_g = cg;
  if (h->kind == CPU_MSG_COLL && rx_coll(c, cg, h, src)) return;
  if (h->kind == CPU_MSG_P2P && rx_p2p(c, cg, h, src)) return;
  rx_unexpected(c, cg, h);
}

void tdist__cpu_take_err(cpu_group_t *cg, cpu_ux_t *u) {
  if (!cg->aborted) {
    int status =
        u->hdr.root < 0 && u->hdr.root > TDIST_ERR_MIN_ ? u->hdr.root : TDIST_ERR_REMOTE_FAILED;
    /* The text names the sender ("rank 1 aborted the group: ..."); the
     * sender published the abort record itself. */
    tdist__cpu_fail(cg, 1, status, "%.*s", (int)u->hdr.len, (const char *)u->data);
  }
  tdist__cpu_ux_free(cg->ctx, u);
}

static void on_err(cpu_conn_t *c, cpu_ux_t *u) {
  cpu_group_t *cg = tdist__cpu_group_find(c->ctx, u->hdr.uid);
  if (cg) {
    tdist__cpu_take_err(cg, u);
    return;
  }
  /* A group this rank is still creating: the other members finished their
   * part of its creation, used it and failed while this rank was still in
   * its setup (sc_setup's store exchange). The cause waits with the
   * orphans and fails the group as it registers (backend.c); dropped, it
   * left this member waiting out its whole timeout. Uids are never reused. */
  u->complete = 1;
  tdist__list_push_back(&c->ctx->orphans, &u->link);
}

void tdist__cpu_on_payload(cpu_conn_t *c) {
  if (c->rh.kind == CPU_MSG_RMA) {
    tdist__cpu_cma_on_desc(c);
    return;
  }
  cpu_op_t *op = c->rx_op;
  cpu_xfer_t *x = c->rx_x;
  cpu_ux_t *u = c->rx_ux;
  cpu_group_t *cg = c->rx_g;
  c->rx_op = NULL;
  c->rx_x = NULL;
  c->rx_ux = NULL;
  c->rx_g = NULL;
  uint8_t *dst = c->rx_dst;
  c->rx_dst = NULL;
  if (c->rh.kind == CPU_MSG_ERR) {
    if (u) on_err(c, u);
    return;
  }
  if (x) {
    if (x->reduce) x->stage = dst;
    x->done = 1;
    tdist__cpu_xfer_done(op);
    return;
  }
  if (!u) return;
  u->complete = 1;
  if (!cg) return; /* orphan */
  if (u->hdr.kind == CPU_MSG_P2P) {
    tdist__cpu_claim_p2p(cg, u);
    return;
  }
  cpu_op_t *o = tdist__cpu_op_find(cg, u->hdr.seq);
  if (!o || o->round != (int)u->hdr.slot) return;
  cpu_xfer_t *rx = tdist__cpu_round_recv(o, tdist__cpu_grank_of(cg, u->src));
  if (rx) tdist__cpu_deliver_ux(cg, o, rx, u);
}

/* Does group cg still need peer r (group rank) for what it is running? Used
 * after an orderly goodbye: a peer that finished its part of an op may leave
 * before the others finish theirs. */
static int needs_peer(cpu_group_t *cg, int r, const cpu_conn_t *c) {
  if (cg->ctx->hooks->sc_needs(cg, r)) return 1; /* segment/sc_op.c */
  tdist__list_t *n;
  tdist__list_foreach(n, &c->txq) {
    const cpu_msg_t *m = tdist__list_entry(n, cpu_msg_t, link);
    if (m->op && m->op->cg == cg) return 1;
  }
  tdist__list_foreach(n, &c->acks) {
    const cpu_msg_t *m = tdist__list_entry(n, cpu_msg_t, link);
    if (m->op && m->op->cg == cg) return 1; /* it has not read our payload */
  }
  tdist__list_foreach(n, &cg->ops) {
    const cpu_op_t *op = tdist__list_entry(n, cpu_op_t, link);
    if (op->p2p) {
      /* Receives not in yet; a p2p op keeps sends and receives alike in
       * recvs[] (tdist__cpu_post_p2p), and sends are covered above. */
      const tdist_backend_args_t *a = op->args;
      int batch = a->type == TDIST_OP_BATCH_P2P, np = batch ? a->np2p : 1;
      for (int i = 0; i < np; i++) {
        int recv = batch ? a->p2p[i].kind == TDIST_P2P_RECV : a->type == TDIST_OP_RECV;
        if (recv && op->recvs[i].peer == r && !op->recvs[i].done) return 1;
      }
      continue;
    }
    for (int i = 0; i < op->nrecv; i++)
      if (op->recvs[i].peer == r && !op->recvs[i].done) return 1;
    /* a collective that must still hear its signature (sigcheck.c) */
    if (op->need_sigs && !((op->heard[r / 64] >> (r % 64)) & 1)) return 1;
  }
  return 0;
}

void tdist__cpu_on_conn_lost(cpu_conn_t *c, const char *why) {
  if (c->dead) return;
  cpu_ctx_t *ctx = c->ctx;
  TDIST_INFO(CPU, "world rank %d (%s) %s", c->peer, c->addr, why);
  if (!c->bye) ctx->lost_peer = c->peer;
  /* Which groups fail is decided before the queues are dropped; the
   * failures are only queued (the core aborts those groups after this I/O
   * step), so the loop and the cleanup below run undisturbed. */
  tdist__list_t *n;
  tdist__list_foreach(n, &ctx->groups) {
    cpu_group_t *cg = tdist__list_entry(n, cpu_group_t, link);
    int r = tdist__cpu_grank_of(cg, c->peer);
    if (r < 0 || cg->aborted || !needs_peer(cg, r, c)) continue;
    char text[200];
    snprintf(text, sizeof(text), "rank %d (world rank %d, %s) %s", r, c->peer, c->addr, why);
    /* A lazy connection lost before anything came over it (or never
     * made): the peer may have left after a failure of its own, with no
     * connection to send its ERR on; its abort record (the store) gets a
     * second to name the cause first. Likewise a peer that left on
     * purpose (BYE) with lazy connections: it is not the cause, and the
     * rank that is may still be connecting to us to say so. */
    if (c->quiet || (c->bye && ctx->lazy))
      tdist__cpu_fail_later(cg, text);
    else
      tdist__cpu_fail(cg, 0, TDIST_ERR_REMOTE_FAILED, "%s", text);
  }
  if (c->parked) {
    c->parked = 0;
    if (--ctx->nparked == 0 && !cpu_off_loop(ctx)) uv_timer_stop(&ctx->park_timer);
  }
  c->dead = 1;
  /* A connection never made (lazy.c) has no poll to stop. */
  if (c->link == CPU_LINK_UP && !cpu_off_loop(ctx)) { /* else stopped by tdist__cpu_loop_sync */
    uv_poll_stop(&c->poll);
    c->events = 0;
  }
  tdist__cpu_conn_free_queues(c);
  if (c->rx_x && c->rx_x->reduce && c->rx_dst) tdist__cpu_buf_put(ctx, c->rx_dst);
  c->rx_body = 0;
  if (c->rx_ux && !c->rx_g && c->rh.kind == CPU_MSG_ERR) tdist__cpu_ux_free(ctx, c->rx_ux);
  cpu_rx_clear(c);
}

const cpu_tp_events_t tdist__cpu_engine_events = {
    .header = tdist__cpu_on_header,
    .payload = tdist__cpu_on_payload,
    .lost = tdist__cpu_on_conn_lost,
    .sent = tdist__cpu_xfer_done,
    .settle = tdist__cpu_run_ready,
};
