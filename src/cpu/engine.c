/*
 * engine.c - the CPU backend's progress-thread engine: ops (rounds,
 * completion), point-to-point matching, unexpected messages and mismatch
 * detection. Message dispatch and peer loss are in dispatch.c, the vtable
 * (groups, post, abort) in backend.c.
 *
 * Ownership: a cpu_group_t belongs to its tdist group (g->bstate) and is
 * touched only on the progress thread once registered. An op (w->bk) lives
 * on its group's active list from post until completion or abort; abort puts
 * every op back on the group's free list without finishing its work (the
 * core does that), and detaches any socket read that was filling one of the
 * group's buffers.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "cpu/cpu.h"

int cpu_grank_of(const cpu_group_t *cg, int world) {
  for (int i = 0; i < cg->g->size; i++)
    if (cg->g->global_ranks[i] == world) return i;
  return -1;
}

cpu_group_t *cpu_group_find(cpu_ctx_t *ctx, uint64_t uid) {
  for (cpu_group_t *cg = ctx->groups; cg; cg = cg->next)
    if (cg->g->uid == uid) return cg;
  return NULL;
}

/* ---- unexpected messages ---------------------------------------------------- */

/* nodata: an RMA descriptor (cma.c), read only when claimed. */
cpu_ux_t *cpu_ux_new(cpu_ctx_t *ctx, const cpu_hdr_t *h, int src, int nodata) {
  cpu_ux_t *u = tdist__calloc(1, sizeof(*u));
  if (!u) return NULL;
  u->hdr = *h;
  u->src = src;
  if (nodata) return u;
  u->data = cpu_buf_get(ctx, h->len);
  if (!u->data) {
    tdist__free(u);
    return NULL;
  }
  return u;
}

void cpu_ux_free(cpu_ctx_t *ctx, cpu_ux_t *u) {
  cpu_cma_drop(ctx, u);
  cpu_buf_put(ctx, u->data);
  tdist__free(u);
}

void cpu_ux_append(cpu_ux_t **head, cpu_ux_t *u) {
  u->next = NULL;
  u->prev = NULL;
  if (!*head) {
    *head = u;
    return;
  }
  cpu_ux_t *t = *head;
  while (t->next)
    t = t->next;
  t->next = u;
  u->prev = t;
}

void cpu_ux_unlink(cpu_ux_t **head, cpu_ux_t *u) {
  if (u->prev)
    u->prev->next = u->next;
  else
    *head = u->next;
  if (u->next) u->next->prev = u->prev;
  u->next = u->prev = NULL;
}

/* Forget any socket read that targets group cg (abort, destroy). */
void cpu_detach_rx(cpu_group_t *cg) {
  cpu_ctx_t *ctx = cg->ctx;
  for (int i = 0; i < ctx->size; i++) {
    cpu_conn_t *c = ctx->conns[i];
    if (!c || !c->rx_body || c->rx_g != cg) continue;
    if (c->parked) {
      cpu_conn_unpark(c); /* cg is aborted: the payload is discarded */
      continue;
    }
    if (c->rx_x && c->rx_x->reduce && c->rx_dst) cpu_buf_put(ctx, c->rx_dst);
    cpu_rx_clear(c);
  }
}

/* ---- ops ------------------------------------------------------------------------ */

cpu_op_t *cpu_op_get(cpu_group_t *cg) {
  cpu_op_t *op = cg->free_ops;
  if (op) {
    cg->free_ops = op->next;
  } else {
    op = tdist__calloc(1, sizeof(*op));
    if (!op) return NULL;
    if (cpu_op_reserve(op, cg->g->size + 1) != 0) {
      tdist__free(op);
      return NULL;
    }
  }
  op->next = op->prev = NULL;
  op->cg = cg;
  op->round = -1;
  op->pending = 0;
  op->advancing = 0;
  op->nsend = op->nrecv = 0;
  op->tmp = NULL;
  op->tmp_cap = 0;
  op->finish_fn = NULL;
  op->round_fn = NULL;
  return op;
}

static void release_stages(cpu_op_t *op) {
  for (int i = 0; i < op->nrecv; i++) {
    cpu_xfer_t *x = &op->recvs[i];
    if (x->reduce && x->done && x->stage) cpu_buf_put(op->cg->ctx, x->stage);
    x->stage = NULL;
  }
}

void cpu_op_put(cpu_op_t *op) {
  cpu_group_t *cg = op->cg;
  release_stages(op);
  if (op->tmp) cpu_buf_put(cg->ctx, op->tmp);
  op->tmp = NULL;
  op->w = NULL;
  op->nsend = op->nrecv = 0;
  op->next = cg->free_ops;
  cg->free_ops = op;
}

void cpu_op_unlink(cpu_op_t *op) {
  cpu_group_t *cg = op->cg;
  if (op->prev)
    op->prev->next = op->next;
  else if (cg->ops == op)
    cg->ops = op->next;
  if (op->next) op->next->prev = op->prev;
  op->next = op->prev = NULL;
}

static void op_complete(cpu_op_t *op) {
  tdist_work_t *w = op->w;
  cpu_op_unlink(op);
  if (op->finish_fn) op->finish_fn(op);
  cpu_op_put(op);
  tdist__work_finish(w, 0, "ok");
}

cpu_op_t *cpu_op_find(cpu_group_t *cg, uint64_t seq) {
  for (cpu_op_t *op = cg->ops; op; op = op->next)
    if (!op->p2p && op->cseq == seq) return op;
  return NULL;
}

/* ---- failures -------------------------------------------------------------- */

/* Compare a peer's header with the local op; 1 (and the group failed) if
 * they disagree. */
int cpu_check_coll(cpu_group_t *cg, cpu_op_t *op, const cpu_hdr_t *h, int src) {
  int rooted = op->type == TDIST_OP_BROADCAST || op->type == TDIST_OP_REDUCE ||
               op->type == TDIST_OP_GATHER || op->type == TDIST_OP_SCATTER;
  int reducing = op->type == TDIST_OP_ALL_REDUCE || op->type == TDIST_OP_REDUCE ||
                 op->type == TDIST_OP_REDUCE_SCATTER;
  if (h->optype == op->type && h->dtype == op->dtype && h->count == op->count &&
      (!rooted || h->root == op->root) && (!reducing || h->redop == op->redop))
    return 0;
  char text[256], extra_a[48] = "", extra_b[48] = "";
  if (rooted) {
    snprintf(extra_a, sizeof(extra_a), " root %d", (int)h->root);
    snprintf(extra_b, sizeof(extra_b), " root %d", op->root);
  }
  if (reducing) {
    size_t la = strlen(extra_a), lb = strlen(extra_b);
    snprintf(extra_a + la, sizeof(extra_a) - la, " %s", tdist_redop_name(h->redop));
    snprintf(extra_b + lb, sizeof(extra_b) - lb, " %s", tdist_redop_name(op->redop));
  }
  snprintf(text, sizeof(text),
           "mismatch at collective #%" PRIu64 ": rank %d sent %s count %" PRIu64
           " %s%s but rank %d "
           "posted %s count %zu %s%s",
           h->seq, src, tdist_op_name((tdist_optype_t)h->optype), h->count,
           tdist_dtype_name((tdist_dtype_t)h->dtype), extra_a, cg->g->rank, tdist_op_name(op->type),
           op->count, tdist_dtype_name(op->dtype), extra_b);
  tdist__group_fail(cg->g, TDIST_ERR_MISMATCH, "%s", text);
  return 1;
}

int cpu_check_p2p(cpu_group_t *cg, cpu_xfer_t *x, const cpu_hdr_t *h, int src) {
  if (h->count == x->count && h->dtype == x->dtype) return 0;
  char text[256];
  snprintf(text, sizeof(text),
           "mismatch: rank %d sent count %" PRIu64 " %s with tag %d but rank %d posted a "
           "receive of count %zu %s",
           src, h->count, tdist_dtype_name((tdist_dtype_t)h->dtype), (int)h->root, cg->g->rank,
           x->count, tdist_dtype_name(x->dtype));
  tdist__group_fail(cg->g, TDIST_ERR_MISMATCH, "%s", text);
  return 1;
}

/* ---- the round engine ------------------------------------------------------ */

void cpu_xfer_done(cpu_op_t *op) {
  if (--op->pending > 0) return;
  if (op->p2p)
    op_complete(op);
  else
    cpu_advance(op);
}

void cpu_on_sent(cpu_op_t *op) { cpu_xfer_done(op); }

/* Hand a complete unexpected message to receive x of op, and free it. */
void cpu_deliver_ux(cpu_group_t *cg, cpu_op_t *op, cpu_xfer_t *x, cpu_ux_t *u) {
  cpu_ux_unlink(&cg->ux, u);
  if (u->hdr.len != x->len) {
    char text[160];
    snprintf(text, sizeof(text), "rank %d sent %" PRIu64 " bytes where %zu were expected",
             cpu_grank_of(cg, u->src), u->hdr.len, x->len);
    cpu_ux_free(cg->ctx, u);
    tdist__group_fail(cg->g, TDIST_ERR_MISMATCH, "%s", text);
    return;
  }
  if (u->rma) {
    /* Read from the sender now, into place (or a stage to reduce). */
    uint8_t *dst = x->reduce ? cpu_buf_get(cg->ctx, x->len) : x->ptr;
    if (!dst) {
      cpu_ux_free(cg->ctx, u);
      tdist__group_fail(cg->g, TDIST_ERR_NO_MEMORY, "cpu: out of memory for a message");
      return;
    }
    tdist_work_t *w = op->w;
    int rc = cpu_cma_fetch(cg->ctx, cg, u, dst);
    if (rc != 0 || op->w != w) { /* the group failed */
      if (x->reduce) cpu_buf_put(cg->ctx, dst);
      cpu_ux_free(cg->ctx, u);
      return;
    }
    if (x->reduce) x->stage = dst;
  } else if (x->reduce) {
    x->stage = u->data; /* reduced at the end of the round */
    u->data = NULL;
  } else if (x->len) {
    memcpy(x->ptr, u->data, x->len);
  }
  x->done = 1;
  cpu_ux_free(cg->ctx, u);
  cpu_xfer_done(op);
}

/* Receive x of op wants message u, whose payload is still being read from
 * its connection: the bytes in so far are moved (or, for a reducing
 * receive, the staging buffer is taken over) and the rest of the payload is
 * read straight into the destination. A rank that posts an op a little
 * after its peer sent it (the usual case in a loop of large ops) copies only
 * what arrived in between, not the whole payload. */
static void adopt_ux(cpu_group_t *cg, cpu_op_t *op, cpu_xfer_t *x, cpu_ux_t *u) {
  cpu_conn_t *c = cg->ctx->conns[u->src];
  if (!c || c->dead || !c->rx_body || c->rx_ux != u || u->hdr.len != x->len) return;
  if (x->reduce) {
    c->rx_dst = u->data; /* becomes x->stage when complete */
    u->data = NULL;
  } else {
    if (c->rx_got) memcpy(x->ptr, u->data, c->rx_got);
    c->rx_dst = x->ptr;
  }
  c->rx_op = op;
  c->rx_x = x;
  c->rx_ux = NULL;
  cpu_ux_unlink(&cg->ux, u);
  cpu_ux_free(cg->ctx, u);
}

cpu_xfer_t *cpu_round_recv(cpu_op_t *op, int src) {
  for (int i = 0; i < op->nrecv; i++)
    if (op->recvs[i].peer == src && !op->recvs[i].done) return &op->recvs[i];
  return NULL;
}

static int have_ux(cpu_group_t *cg, uint64_t cseq, int k, int world_src) {
  for (cpu_ux_t *u = cg->ux; u; u = u->next)
    if (u->complete && u->hdr.kind == CPU_MSG_COLL && u->hdr.seq == cseq &&
        u->hdr.slot == (uint32_t)k && u->src == world_src)
      return 1;
  return 0;
}

void cpu_advance(cpu_op_t *op) {
  if (op->advancing) return;
  op->advancing = 1;
  cpu_group_t *cg = op->cg;
  tdist_work_t *w = op->w;
  while (op->pending == 0) {
    /* End of the previous round: fold the staged receives in. */
    for (int i = 0; i < op->nrecv; i++) {
      cpu_xfer_t *x = &op->recvs[i];
      if (x->reduce && x->stage) {
        cpu_reduce(x->ptr, x->stage, x->len / op->es, op->dtype, op->redop);
        cpu_buf_put(cg->ctx, x->stage);
        x->stage = NULL;
      }
    }
    op->nsend = op->nrecv = 0;
    int k = ++op->round;
    if (op->round_fn(op, k)) {
      op_complete(op);
      return;
    }
    /* A peer that is gone: what it sent before leaving still counts; a send
     * to it is dropped (it finished, or it crashed and the others fail). */
    for (int i = 0; i < op->nrecv; i++) {
      cpu_conn_t *pc = cg->conns[op->recvs[i].peer];
      if (pc && pc->dead && !have_ux(cg, op->cseq, k, pc->peer)) {
        tdist__group_fail(cg->g, TDIST_ERR_REMOTE_FAILED, "rank %d (world rank %d, %s) is gone",
                          op->recvs[i].peer, pc->peer, pc->addr);
        return;
      }
    }
    op->pending = op->nsend + op->nrecv + 1; /* +1: nothing completes the round early */
    for (int i = 0; i < op->nsend && !cg->aborted && op->w == w; i++) {
      cpu_xfer_t *x = &op->sends[i];
      if (cg->conns[x->peer]->dead) {
        op->pending--;
        continue;
      }
      cpu_msg_t *m = cpu_msg_new();
      if (!m) {
        tdist__group_fail(cg->g, TDIST_ERR_NO_MEMORY, "cpu: out of memory");
        return;
      }
      m->hdr = (cpu_hdr_t){.magic = CPU_MAGIC,
                           .kind = CPU_MSG_COLL,
                           .optype = (uint8_t)op->type,
                           .dtype = (uint8_t)op->dtype,
                           .redop = (uint8_t)op->redop,
                           .uid = cg->g->uid,
                           .seq = op->cseq,
                           .count = op->count,
                           .slot = (uint32_t)k,
                           .root = op->root,
                           .len = x->len};
      cpu_msg_payload(cg->conns[x->peer], cg, m, x->ptr, x->len);
      m->op = op;
      cpu_send(cg->conns[x->peer], m);
    }
    if (cg->aborted || op->w != w) return; /* a peer failed under us */
    /* Messages of this round that arrived early. */
    for (cpu_ux_t *u = cg->ux, *next; u && op->w == w; u = next) {
      next = u->next;
      if (u->hdr.kind != CPU_MSG_COLL || u->hdr.seq != op->cseq || u->hdr.slot != (uint32_t)k)
        continue;
      cpu_xfer_t *x = cpu_round_recv(op, cpu_grank_of(cg, u->src));
      if (!x) continue;
      if (u->complete)
        cpu_deliver_ux(cg, op, x, u);
      else
        adopt_ux(cg, op, x, u);
    }
    if (cg->aborted || op->w != w) return;
    op->pending--;
  }
  op->advancing = 0;
}

/* ---- point-to-point ----------------------------------------------------------- */

cpu_xfer_t *cpu_precv_match(cpu_group_t *cg, int src, int tag) {
  for (cpu_xfer_t *x = cg->precv; x; x = x->next)
    if (x->peer == src && x->tag == tag) return x;
  return NULL;
}

void cpu_precv_unlink(cpu_group_t *cg, cpu_xfer_t *x) {
  if (x->prev)
    x->prev->next = x->next;
  else
    cg->precv = x->next;
  if (x->next) x->next->prev = x->prev;
  x->next = x->prev = NULL;
}

/* A complete unexpected p2p message: give it to the first matching receive. */
void cpu_claim_p2p(cpu_group_t *cg, cpu_ux_t *u) {
  int src = cpu_grank_of(cg, u->src);
  cpu_xfer_t *x = cpu_precv_match(cg, src, u->hdr.root);
  if (!x) return;
  cpu_precv_unlink(cg, x);
  if (cpu_check_p2p(cg, x, &u->hdr, src)) return;
  cpu_deliver_ux(cg, x->op, x, u);
}

/* A complete message for receive p is already here. */
static int p2p_waiting(cpu_group_t *cg, const tdist_p2p_op_t *p) {
  int world = cg->g->global_ranks[p->peer];
  for (cpu_ux_t *u = cg->ux; u; u = u->next)
    if (u->complete && u->hdr.kind == CPU_MSG_P2P && u->src == world && u->hdr.root == p->tag)
      return 1;
  return 0;
}

int cpu_post_p2p(cpu_group_t *cg, cpu_op_t *op) {
  tdist_work_t *w = op->w;
  const tdist__op_args_t *a = &w->args;
  tdist_p2p_op_t single = {.kind = a->type == TDIST_OP_SEND ? TDIST_P2P_SEND : TDIST_P2P_RECV,
                           .buf = a->recvbuf,
                           .count = a->count,
                           .dtype = a->dtype,
                           .peer = a->root,
                           .tag = a->tag};
  const tdist_p2p_op_t *list = a->type == TDIST_OP_BATCH_P2P ? a->p2p : &single;
  int n = a->type == TDIST_OP_BATCH_P2P ? a->np2p : 1;
  TDIST_CHECK(cpu_op_reserve(op, n));
  op->pending = n + 1;
  int me = cg->g->global_ranks[cg->g->rank];
  for (int i = 0; i < n && op->w == w && !cg->aborted; i++) {
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
    cpu_hdr_t h = {.magic = CPU_MAGIC,
                   .kind = CPU_MSG_P2P,
                   .dtype = (uint8_t)p->dtype,
                   .uid = cg->g->uid,
                   .count = p->count,
                   .root = p->tag,
                   .len = len};
    if (p->kind == TDIST_P2P_SEND && p->peer == cg->g->rank) {
      /* To self: a copy queued as if it had arrived. */
      cpu_ux_t *u = cpu_ux_new(cg->ctx, &h, me, 0);
      if (!u) return TDIST_ERR_NO_MEMORY;
      if (len) memcpy(u->data, p->buf, len);
      u->complete = 1;
      cpu_ux_append(&cg->ux, u);
      cpu_claim_p2p(cg, u);
      if (op->w == w) cpu_xfer_done(op);
    } else if (cg->conns[p->peer] && cg->conns[p->peer]->dead &&
               (p->kind == TDIST_P2P_SEND || !p2p_waiting(cg, p))) {
      cpu_conn_t *pc = cg->conns[p->peer];
      tdist__group_fail(cg->g, TDIST_ERR_REMOTE_FAILED, "rank %d (world rank %d, %s) is gone",
                        p->peer, pc->peer, pc->addr);
      return 0;
    } else if (p->kind == TDIST_P2P_SEND) {
      cpu_msg_t *m = cpu_msg_new();
      if (!m) return TDIST_ERR_NO_MEMORY;
      m->hdr = h;
      cpu_msg_payload(cg->conns[p->peer], cg, m, p->buf, len);
      m->op = op;
      cpu_send(cg->conns[p->peer], m);
    } else {
      /* Receive: the oldest matching message already here, else post. */
      cpu_ux_t *u = cg->ux;
      int world = cg->g->global_ranks[p->peer];
      for (; u; u = u->next)
        if (u->hdr.kind == CPU_MSG_P2P && u->src == world && u->hdr.root == p->tag) break;
      if (u && u->complete) {
        if (cpu_check_p2p(cg, x, &u->hdr, p->peer)) return 0;
        cpu_deliver_ux(cg, op, x, u);
      } else {
        x->next = NULL;
        x->prev = NULL;
        if (!cg->precv) {
          cg->precv = x;
        } else {
          cpu_xfer_t *t = cg->precv;
          while (t->next)
            t = t->next;
          t->next = x;
          x->prev = t;
        }
      }
    }
  }
  if (op->w == w && !cg->aborted) cpu_xfer_done(op);
  return 0;
}
