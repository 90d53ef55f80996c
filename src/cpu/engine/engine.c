/*
 * engine.c - the CPU backend's engine (progress thread): ops (pool, rounds,
 * completion), the ready list, unexpected messages, mismatch detection and
 * point-to-point matching. Message dispatch and peer loss are in
 * dispatch.c, the vtable (groups, post, abort) in backend.c.
 *
 * Ownership: a cpu_group_t is the core's `state` for its group and is
 * touched only on the progress thread once registered. An op (bop->priv)
 * lives on its group's active list from post until the engine completes it
 * or abort forgets it; either returns it to the group's pool. Abort (and
 * destroy) also take it off the ready list and detach any socket read that
 * was filling one of the group's buffers; the core finishes the core's ops.
 *
 * No re-entry (cpu.h): the transport calls only tdist__cpu_xfer_done,
 * tdist__cpu_deliver_ux and the matching helpers here, which record progress
 * and never run rounds; rounds run in tdist__cpu_run_ready, called from
 * top-level points only, and every failure is reported with tdist_backend_fail
 * (deferred by the core).
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "util/alloc.h"
#include "util/error.h"
#include "cpu/base/base.h"
#include "cpu/transport/transport.h"
#include "cpu/engine/engine.h"

cpu_group_t *tdist__cpu_group_find(cpu_ctx_t *ctx, uint64_t uid) {
  tdist__list_t *n;
  tdist__list_foreach(n, &ctx->groups) {
    cpu_group_t *cg = tdist__list_entry(n, cpu_group_t, link);
    if (cg->uid == uid) return cg;
  }
  return NULL;
}

/* ---- unexpected messages ---------------------------------------------------- */

/* nodata: an RMA descriptor (cma.c), read only when claimed. */
cpu_ux_t *tdist__cpu_ux_new(cpu_ctx_t *ctx, const cpu_hdr_t *h, int src, int nodata) {
  cpu_ux_t *u = tdist__calloc(1, sizeof(*u));
  if (!u) return NULL;
  tdist__list_init(&u->link);
  u->hdr = *h;
  u->src = src;
  if (nodata) return u;
  u->data = tdist__cpu_buf_get(ctx, h->len);
  if (!u->data) {
    tdist__free(u);
    return NULL;
  }
  return u;
}

void tdist__cpu_ux_free(cpu_ctx_t *ctx, cpu_ux_t *u) {
  if (tdist__list_linked(&u->link)) tdist__list_remove(&u->link);
  tdist__cpu_copy_forget_ux(ctx, u); /* being staged: stop (and ACK) */
  tdist__cpu_cma_drop(ctx, u);
  tdist__cpu_buf_put(ctx, u->data);
  tdist__free(u);
}

/* Forget any socket read that targets group cg (abort, destroy). */
void tdist__cpu_detach_rx(cpu_group_t *cg) {
  cpu_ctx_t *ctx = cg->ctx;
  for (int i = 0; i < ctx->size; i++) {
    cpu_conn_t *c = ctx->conns[i];
    if (!c || !c->rx_body || c->rx_g != cg) continue;
    if (c->parked) {
      tdist__cpu_conn_unpark(c); /* cg is aborted: the payload is discarded */
      continue;
    }
    if (c->rx_x && c->rx_x->reduce && c->rx_dst) tdist__cpu_buf_put(ctx, c->rx_dst);
    cpu_rx_clear(c);
  }
}

/* ---- ops ------------------------------------------------------------------------ */

cpu_op_t *tdist__cpu_op_get(cpu_group_t *cg) {
  cpu_op_t *op;
  tdist__list_t *n = tdist__list_first(&cg->free_ops);
  if (n) {
    tdist__list_remove(n);
    op = tdist__list_entry(n, cpu_op_t, link);
  } else {
    op = tdist__calloc(1, sizeof(*op));
    if (!op) return NULL;
    if (tdist__cpu_op_reserve(op, cg->size + 1) != 0) {
      tdist__free(op->sends);
      tdist__free(op->recvs);
      tdist__free(op);
      return NULL;
    }
    tdist__list_init(&op->link);
    tdist__list_init(&op->rlink);
  }
  op->cg = cg;
  op->bop = NULL;
  op->args = NULL;
  op->round = -1;
  op->pending = 0;
  op->nsend = op->nrecv = 0;
  op->tmp = NULL;
  op->tmp_cap = 0;
  op->finish_fn = NULL;
  op->round_fn = NULL;
  op->need_sigs = op->rounds_done = op->lagging = op->nheard = op->received = 0; /* sigcheck.c */
  op->sc.on = 0;
  return op;
}

cpu_op_t *tdist__cpu_op_new(cpu_group_t *cg, tdist_backend_op_t *bop) {
  cpu_op_t *op = tdist__cpu_op_get(cg);
  if (!op) return NULL;
  const tdist_backend_args_t *a = bop->args;
  op->bop = bop;
  op->args = a;
  bop->priv = op;
  op->type = a->type;
  op->dtype = a->dtype;
  op->redop = a->redop;
  op->count = a->count;
  op->es = tdist_dtype_size(a->dtype);
  op->root = a->root;
  op->rank = cg->rank;
  op->size = cg->size;
  op->p2p = tdist_backend_op_is_p2p(a->type);
  tdist__list_push_back(&cg->ops, &op->link);
  return op;
}

static void release_stages(cpu_op_t *op) {
  for (int i = 0; i < op->nrecv; i++) {
    cpu_xfer_t *x = &op->recvs[i];
    if (x->reduce && x->done && x->stage) tdist__cpu_buf_put(op->cg->ctx, x->stage);
    x->stage = NULL;
  }
}

void tdist__cpu_op_put(cpu_op_t *op) {
  cpu_group_t *cg = op->cg;
  if (op->lagging) {
    op->lagging = 0;
    cg->nlagging--;
    if (cg->lagging == op) { /* the next oldest lagging op, if any (post order) */
      cg->lagging = NULL;
      tdist__list_t *n;
      tdist__list_foreach(n, &cg->ops) {
        cpu_op_t *o = tdist__list_entry(n, cpu_op_t, link);
        if (o->lagging) {
          cg->lagging = o;
          break;
        }
      }
    }
  }
  tdist__cpu_copy_cancel(op);                       /* before its buffers go back to the caller */
  if (op->sc.on) op->cg->ctx->hooks->sc_forget(op); /* off its channel (segment/sc_op.c) */
  if (tdist__list_linked(&op->link)) tdist__list_remove(&op->link);
  if (tdist__list_linked(&op->rlink)) tdist__list_remove(&op->rlink);
  release_stages(op);
  if (op->tmp) tdist__cpu_buf_put(cg->ctx, op->tmp);
  op->tmp = NULL;
  if (op->bop) op->bop->priv = NULL;
  op->bop = NULL;
  op->args = NULL;
  op->nsend = op->nrecv = 0;
  tdist__list_push_front(&cg->free_ops, &op->link);
}

#define DONE_RING ((int)(sizeof(((cpu_group_t *)0)->done) / sizeof(((cpu_group_t *)0)->done[0])))

void tdist__cpu_done_note(const cpu_op_t *op) {
  cpu_group_t *cg = op->cg;
  struct cpu_done *d = &cg->done[op->cseq % DONE_RING];
  *d = (struct cpu_done){.cseq = op->cseq,
                         .count = op->count,
                         .root = op->root,
                         .type = (uint8_t)op->type,
                         .dtype = (uint8_t)op->dtype,
                         .redop = (uint8_t)op->redop,
                         .valid = 1};
  tdist__list_t *n;
  tdist__list_foreach(n, &cg->ux) {
    cpu_ux_t *u = tdist__list_entry(n, cpu_ux_t, link);
    if (u->hdr.kind == CPU_MSG_COLL && u->hdr.seq == op->cseq &&
        tdist__cpu_check_done(cg, &u->hdr, tdist__cpu_grank_of(cg, u->src)))
      break;
  }
}

/* Engine only: the op is done; the core hears after this I/O step. A
 * collective is remembered (tdist__cpu_check_done), and a message of it
 * that arrived early and is still unclaimed means a peer ran another op.
 * lag: the op has not heard every member yet (sigcheck.c): the core's op
 * completes, but the engine's stays on the active list, without its core
 * op and buffers, until the last signature (tdist__cpu_lag_clear). */
void tdist__cpu_op_complete(cpu_op_t *op, int lag) {
  tdist_backend_op_t *bop = op->bop;
  cpu_group_t *cg = op->cg;
  if (op->finish_fn) op->finish_fn(op);
  if (!op->p2p) tdist__cpu_done_note(op);
  if (lag) {
    release_stages(op);
    if (op->tmp) tdist__cpu_buf_put(cg->ctx, op->tmp);
    op->tmp = NULL;
    bop->priv = NULL;
    op->bop = NULL;
    op->args = NULL;
    op->lagging = 1;
    cg->nlagging++;
    if (!cg->lagging) cg->lagging = op; /* ops lag in post order: the oldest */
  } else {
    tdist__cpu_op_put(op);
  }
  tdist__cpu_op_done(cg->ctx, bop);
}

/* Engine: the op's rounds are done; complete it now, lagging, or not yet
 * (sigcheck.c: tdist__cpu_sig_finish). */
static void finish(cpu_op_t *op) {
  int how = tdist__cpu_sig_finish(op);
  if (how) tdist__cpu_op_complete(op, how == 2);
}

const struct cpu_done *tdist__cpu_done_of(const cpu_group_t *cg, uint64_t seq) {
  if (seq >= cg->next_cseq) return NULL;
  const struct cpu_done *d = &cg->done[seq % DONE_RING];
  return d->valid && d->cseq == seq ? d : NULL;
}

cpu_op_t *tdist__cpu_op_find(cpu_group_t *cg, uint64_t seq) {
  tdist__list_t *n;
  tdist__list_foreach(n, &cg->ops) {
    cpu_op_t *op = tdist__list_entry(n, cpu_op_t, link);
    if (!op->p2p && op->cseq == seq) return op;
  }
  return NULL;
}

/* ---- recording progress (safe anywhere in the transport) --------------------- */

void tdist__cpu_ready(cpu_op_t *op) {
  if (!tdist__list_linked(&op->rlink)) tdist__list_push_back(&op->cg->ctx->ready, &op->rlink);
}

void tdist__cpu_xfer_done(cpu_op_t *op) {
  if (--op->pending == 0) tdist__cpu_ready(op);
}

/* Hand a complete unexpected message to receive x of op, and free it. On a
 * failure (reported) x stays undone, so op waits for the abort. */
void tdist__cpu_deliver_ux(cpu_group_t *cg, cpu_op_t *op, cpu_xfer_t *x, cpu_ux_t *u) {
  /* A wildcard receive may get less than it posted (checked by the match). */
  int shorter = op->p2p && (x->peer < 0 || x->tag < 0) && u->hdr.len < x->len;
  if (u->hdr.len != x->len && !shorter) {
    char text[192];
    snprintf(text, sizeof(text),
             "rank %d (world rank %d) sent %" PRIu64 " bytes where %zu were expected",
             tdist__cpu_grank_of(cg, u->src), u->src, u->hdr.len, x->len);
    tdist__cpu_ux_free(cg->ctx, u);
    tdist__cpu_mismatch(cg, op->p2p ? UINT64_MAX : op->cseq, "%s", text);
    return;
  }
  if (tdist__cpu_copy_wait_staged(u, x)) return; /* x gets it when it is in */
  if (u->rma) {
    /* Read from the sender now, into place (or a stage to reduce). */
    uint8_t *dst = x->reduce ? tdist__cpu_buf_get(cg->ctx, x->len) : x->ptr;
    if (!dst) {
      tdist__cpu_ux_free(cg->ctx, u);
      tdist__cpu_fail(cg, 0, TDIST_ERR_NO_MEMORY, "cpu: out of memory for a message");
      return;
    }
    cpu_conn_t *c = cg->ctx->conns[u->src];
    if (c && !c->dead &&
        tdist__cpu_copy_read(cg, op, x, u->src, c->pid, &u->desc, dst)) { /* in steps */
      tdist__cpu_cma_take(cg->ctx, u);
      tdist__cpu_ux_free(cg->ctx, u);
      return;
    }
    if (tdist__cpu_cma_fetch(cg->ctx, cg, u, dst) != 0) {
      if (x->reduce) tdist__cpu_buf_put(cg->ctx, dst);
      tdist__cpu_ux_free(cg->ctx, u);
      return;
    }
    if (x->reduce) x->stage = dst;
  } else if (x->reduce) {
    x->stage = u->data; /* reduced at the end of the round */
    u->data = NULL;
  } else if (u->hdr.len) {
    if (tdist__cpu_copy_deliver(cg, op, x, u)) return; /* in steps; it finishes x */
    tdist__cpu_copy(x->ptr, u->data, u->hdr.len);
  }
  x->done = 1;
  tdist__cpu_ux_free(cg->ctx, u);
  tdist__cpu_xfer_done(op);
}

/* Receive x of op wants message u, whose payload is still being read from
 * its connection: the bytes in so far are moved (or, for a reducing
 * receive, the staging buffer is taken over) and the rest of the payload is
 * read straight into the destination. A rank that posts an op a little
 * after its peer sent it (the usual case in a loop of large ops) copies only
 * what arrived in between, not the whole payload. Engine only: it runs
 * between two reads of that connection, never inside one. */
static void adopt_ux(cpu_group_t *cg, cpu_op_t *op, cpu_xfer_t *x, cpu_ux_t *u) {
  cpu_conn_t *c = cg->ctx->conns[u->src];
  if (!c || c->dead || !c->rx_body || c->rx_ux != u || u->hdr.len != x->len) return;
  /* More than one copy step in already: not adopted. It completes in its
   * staging buffer and is then delivered in steps (copy_steps.c), rather
   * than copied here in one go on the progress thread. */
  if (!x->reduce && c->rx_got > CPU_COPY_STEP) return;
  if (x->reduce) {
    c->rx_dst = u->data; /* becomes x->stage when complete */
    u->data = NULL;
  } else {
    if (c->rx_got) tdist__cpu_copy(x->ptr, u->data, c->rx_got);
    c->rx_dst = x->ptr;
  }
  c->rx_op = op;
  c->rx_x = x;
  c->rx_ux = NULL;
  tdist__cpu_ux_free(cg->ctx, u);
}

cpu_xfer_t *tdist__cpu_round_recv(cpu_op_t *op, int src) {
  for (int i = 0; i < op->nrecv; i++)
    if (op->recvs[i].peer == src && !op->recvs[i].done) return &op->recvs[i];
  return NULL;
}

static int have_ux(cpu_group_t *cg, uint64_t cseq, int k, int world_src) {
  tdist__list_t *n;
  tdist__list_foreach(n, &cg->ux) {
    cpu_ux_t *u = tdist__list_entry(n, cpu_ux_t, link);
    if (u->complete && u->hdr.kind == CPU_MSG_COLL && u->hdr.seq == cseq &&
        u->hdr.slot == (uint32_t)k && u->src == world_src)
      return 1;
  }
  return 0;
}

/* ---- the engine -------------------------------------------------------------- */

/* Send x of round k of collective op. */
static void send_one(cpu_group_t *cg, cpu_op_t *op, cpu_xfer_t *x, int k) {
  cpu_conn_t *c = cg->conns[x->peer];
  cpu_msg_t *m = tdist__cpu_msg_new();
  if (!m) {
    tdist__cpu_fail(cg, 0, TDIST_ERR_NO_MEMORY, "cpu: out of memory");
    return; /* x never completes: op waits for the abort */
  }
  m->hdr = (cpu_hdr_t){.magic = CPU_MAGIC,
                       .kind = CPU_MSG_COLL,
                       .optype = (uint8_t)op->type,
                       .dtype = (uint8_t)op->dtype,
                       .redop = (uint8_t)op->redop,
                       .uid = cg->uid,
                       .seq = op->cseq,
                       /* v-ops: this message's own count (algos_v.c) */
                       .count = tdist_backend_op_is_v(op->type) ? x->count : op->count,
                       .slot = (uint32_t)k,
                       .root = op->root,
                       .len = x->len};
  tdist__cpu_msg_payload(c, cg, m, x->ptr, x->len);
  m->op = op;
  tdist__cpu_send(c, m); /* may be written (and x done) at once: recorded only */
}

/* One step of a ready op (its pending count is 0): fold the finished round's
 * staged receives in, then start the next round or complete the op. A
 * round that is done at once puts the op back on the ready list. A
 * collective completes only once it has heard every member it must
 * (sigcheck.c); until then it waits, and the last signature readies it. */
static void advance(cpu_op_t *op) {
  cpu_group_t *cg = op->cg;
  /* A mismatch was reported in this op or an earlier one: it neither moves
   * nor completes before the core's abort (sigcheck.c). */
  if (tdist__cpu_blocked(op)) return;
  if (op->lagging) { /* completed already: its last signature is in */
    if (tdist__cpu_sigs_complete(op)) tdist__cpu_lag_clear(op);
    return;
  }
  if (op->p2p) {
    if (!tdist__cpu_lag_blocks(op)) tdist__cpu_op_complete(op, 0);
    return;
  }
  if (op->rounds_done) {
    finish(op);
    return;
  }
  for (int i = 0; i < op->nrecv; i++) {
    cpu_xfer_t *x = &op->recvs[i];
    if (x->reduce && x->stage) {
      tdist__cpu_reduce(x->ptr, x->stage, x->len / op->es, op->dtype, op->redop);
      tdist__cpu_buf_put(cg->ctx, x->stage);
      x->stage = NULL;
    }
  }
  op->nsend = op->nrecv = 0;
  int k = ++op->round;
  int last = op->round_fn(op, k);
  if (op->nrecv) op->received = 1;
  if (k == 0 && tdist__cpu_sig_round0(op)) return;
  if (last) {
    op->rounds_done = 1;
    finish(op);
    return;
  }
  op->pending = op->nsend + op->nrecv;
  /* A peer that is gone: what it sent before leaving still counts; a send
   * to it is dropped (it finished, or it crashed and the others fail). A
   * receive that can no longer come fails the group; the op then waits
   * (its count never reaches 0) until the core aborts the group. */
  for (int i = 0; i < op->nrecv; i++) {
    cpu_conn_t *pc = cg->conns[op->recvs[i].peer];
    /* conn/lazy.c (a hook): a dead peer is named on connect */
    if (pc && pc->link == CPU_LINK_IDLE) pc->ctx->hooks->want(pc);
    if (pc && pc->dead && !have_ux(cg, op->cseq, k, pc->peer)) {
      tdist__cpu_fail(cg, 0, TDIST_ERR_REMOTE_FAILED, "rank %d (world rank %d, %s) is gone",
                      op->recvs[i].peer, pc->peer, pc->addr);
      return;
    }
  }
  for (int i = 0; i < op->nsend; i++) {
    cpu_xfer_t *x = &op->sends[i];
    if (cg->conns[x->peer]->dead)
      op->pending--;
    else
      send_one(cg, op, x, k);
  }
  /* Messages of this round that arrived early. */
  tdist__list_t *n, *next;
  tdist__list_foreach_safe(n, next, &cg->ux) {
    cpu_ux_t *u = tdist__list_entry(n, cpu_ux_t, link);
    if (u->hdr.kind != CPU_MSG_COLL || u->hdr.seq != op->cseq || u->hdr.slot != (uint32_t)k)
      continue;
    cpu_xfer_t *x = tdist__cpu_round_recv(op, tdist__cpu_grank_of(cg, u->src));
    if (!x) continue;
    if (u->complete)
      tdist__cpu_deliver_ux(cg, op, x, u);
    else
      adopt_ux(cg, op, x, u);
  }
  if (op->pending == 0) tdist__cpu_ready(op);
}

void tdist__cpu_run_ready(cpu_ctx_t *ctx) {
  tdist__list_t *n;
  while ((n = tdist__list_first(&ctx->ready))) {
    tdist__list_remove(n);
    advance(tdist__list_entry(n, cpu_op_t, rlink));
  }
}

/* ---- point-to-point ----------------------------------------------------------- */

cpu_xfer_t *tdist__cpu_precv_match(cpu_group_t *cg, int src, int tag) {
  tdist__list_t *n;
  tdist__list_foreach(n, &cg->precv) {
    cpu_xfer_t *x = tdist__list_entry(n, cpu_xfer_t, plink);
    if ((x->peer == src || x->peer == TDIST_ANY_SOURCE) &&
        (x->tag == tag || x->tag == TDIST_ANY_TAG))
      return x;
  }
  return NULL;
}

/* A complete unexpected p2p message: give it to the first matching receive. */
void tdist__cpu_claim_p2p(cpu_group_t *cg, cpu_ux_t *u) {
  int src = tdist__cpu_grank_of(cg, u->src);
  cpu_xfer_t *x = tdist__cpu_precv_match(cg, src, u->hdr.root);
  if (!x) return;
  tdist__list_remove(&x->plink);
  if (tdist__cpu_match_p2p(cg, x, &u->hdr, src)) return;
  tdist__cpu_deliver_ux(cg, x->op, x, u);
}

/* The oldest unexpected p2p message from world rank `world` with `tag`
 * (either may be -1: any). The ux list is in arrival order, so messages of
 * one sender come out in the order it sent them (non-overtaking). */
static cpu_ux_t *p2p_oldest(cpu_group_t *cg, int world, int tag) {
  tdist__list_t *n;
  tdist__list_foreach(n, &cg->ux) {
    cpu_ux_t *u = tdist__list_entry(n, cpu_ux_t, link);
    if (u->hdr.kind == CPU_MSG_P2P && (world < 0 || u->src == world) &&
        (tag < 0 || u->hdr.root == tag))
      return u;
  }
  return NULL;
}

int tdist__cpu_match_p2p(cpu_group_t *cg, cpu_xfer_t *x, const cpu_hdr_t *h, int src) {
  if (tdist__cpu_check_p2p(cg, x, h, src)) return 1;
  if ((x->peer < 0 || x->tag < 0) && x->op->bop) {
    /* Read by tdist_work_status_info once the completion is published. */
    x->op->bop->rx_source = src;
    x->op->bop->rx_tag = (int)h->root;
    x->op->bop->rx_count = (size_t)h->count;
  }
  return 0;
}

/* A complete message for receive p is already here. */
static int p2p_waiting(cpu_group_t *cg, const tdist_p2p_op_t *p) {
  int world = cg->global_ranks[p->peer];
  tdist__list_t *n;
  tdist__list_foreach(n, &cg->ux) {
    cpu_ux_t *u = tdist__list_entry(n, cpu_ux_t, link);
    if (u->complete && u->hdr.kind == CPU_MSG_P2P && u->src == world &&
        (p->tag < 0 || u->hdr.root == p->tag))
      return 1;
  }
  return 0;
}

/* Post every transfer of a p2p op (sends and receives alike live in
 * op->recvs). op->pending counts them; when it reaches 0 the engine
 * completes the op. A transfer that cannot be made reports the group's
 * failure and returns: the op then waits for the abort. */
int tdist__cpu_post_p2p(cpu_group_t *cg, cpu_op_t *op) {
  const tdist_backend_args_t *a = op->args;
  tdist_p2p_op_t single = {.kind = a->type == TDIST_OP_SEND ? TDIST_P2P_SEND : TDIST_P2P_RECV,
                           .buf = a->recvbuf,
                           .count = a->count,
                           .dtype = a->dtype,
                           .peer = a->root,
                           .tag = a->tag};
  const tdist_p2p_op_t *list = a->type == TDIST_OP_BATCH_P2P ? a->p2p : &single;
  int n = a->type == TDIST_OP_BATCH_P2P ? a->np2p : 1;
  TDIST_CHECK(tdist__cpu_op_reserve(op, n));
  op->pending = n;
  op->cseq = cg->next_cseq; /* collectives posted before it (tdist__cpu_blocked) */
  int me = cg->global_ranks[cg->rank];
  for (int i = 0; i < n; i++) {
    const tdist_p2p_op_t *p = &list[i];
    size_t len = p->count * tdist_dtype_size(p->dtype);
    cpu_xfer_t *x = &op->recvs[i];
    *x = (cpu_xfer_t){.op = op,
                      .peer = p->peer,
                      .ptr = p->buf,
                      .len = len,
                      .tag = p->tag,
                      .dtype = p->dtype,
                      .count = p->count};
    tdist__list_init(&x->plink);
    cpu_hdr_t h = {.magic = CPU_MAGIC,
                   .kind = CPU_MSG_P2P,
                   .dtype = (uint8_t)p->dtype,
                   .uid = cg->uid,
                   .count = p->count,
                   .root = p->tag,
                   .len = len};
    cpu_conn_t *pc = p->peer >= 0 ? cg->conns[p->peer] : NULL; /* -1: any source */
    /* conn/lazy.c (a hook): connect on first use */
    if (pc && pc->link == CPU_LINK_IDLE) pc->ctx->hooks->want(pc);
    if (p->kind == TDIST_P2P_SEND && p->peer == cg->rank) {
      /* To self: a copy queued as if it had arrived. */
      cpu_ux_t *u = tdist__cpu_ux_new(cg->ctx, &h, me, 0);
      if (!u) return TDIST_ERR_NO_MEMORY;
      tdist__list_push_back(&cg->ux, &u->link);
      tdist__cpu_copy_self(cg, op, u, p->buf, len); /* a long copy in steps */
    } else if (pc && pc->dead && (p->kind == TDIST_P2P_SEND || !p2p_waiting(cg, p))) {
      tdist__cpu_fail(cg, 0, TDIST_ERR_REMOTE_FAILED, "rank %d (world rank %d, %s) is gone",
                      p->peer, pc->peer, pc->addr);
      return 0;
    } else if (p->kind == TDIST_P2P_SEND) {
      cpu_msg_t *m = tdist__cpu_msg_new();
      if (!m) return TDIST_ERR_NO_MEMORY;
      m->hdr = h;
      tdist__cpu_msg_payload(pc, cg, m, p->buf, len);
      m->op = op;
      tdist__cpu_send(pc, m);
    } else {
      /* Receive: the oldest matching message already here, else post. */
      cpu_ux_t *u = p2p_oldest(cg, p->peer >= 0 ? cg->global_ranks[p->peer] : -1, p->tag);
      if (u && u->complete) {
        if (tdist__cpu_match_p2p(cg, x, &u->hdr, tdist__cpu_grank_of(cg, u->src))) return 0;
        tdist__cpu_deliver_ux(cg, op, x, u);
      } else {
        tdist__list_push_back(&cg->precv, &x->plink);
      }
    }
  }
  if (op->pending == 0) tdist__cpu_ready(op); /* an empty batch */
  return 0;
}
