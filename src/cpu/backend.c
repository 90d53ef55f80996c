/*
 * backend.c - the CPU backend's vtable (tdist__cpu_backend): groups (init,
 * split, shrink, destroy) over the process's connections, posting an op to
 * the round engine (engine.c), and abort.
 *
 * Threads: init/split/shrink/destroy run on the caller's thread and reach the
 * progress thread with tdist__progress_call; post and abort run on the
 * progress thread. A cpu_group_t belongs to its tdist group (g->bstate).
 */
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "cpu/cpu.h"

/* ---- the vtable -------------------------------------------------------------------- */

struct reg {
  cpu_group_t *cg;
};

static void register_task(void *arg) {
  cpu_group_t *cg = arg;
  cpu_ctx_t *ctx = cg->ctx;
  cg->next = ctx->groups;
  if (ctx->groups) ctx->groups->prev = cg;
  ctx->groups = cg;
  /* Claim messages that arrived before this group existed here. */
  for (cpu_ux_t *u = ctx->orphans, *next; u; u = next) {
    next = u->next;
    if (u->hdr.uid != cg->g->uid) continue;
    cpu_ux_unlink(&ctx->orphans, u);
    cpu_ux_append(&cg->ux, u);
  }
  for (int i = 0; i < ctx->size; i++) {
    cpu_conn_t *c = ctx->conns[i];
    if (c && c->rx_body && c->rx_ux && !c->rx_g && c->rh.uid == cg->g->uid &&
        c->rh.kind != CPU_MSG_ERR)
      c->rx_g = cg; /* the orphan being read now is ours */
  }
}

static int attach(tdist_group_t *g, cpu_ctx_t *ctx) {
  cpu_group_t *cg = tdist__calloc(1, sizeof(*cg));
  if (!cg) return tdist__error(TDIST_ERR_NO_MEMORY, "cpu: out of memory");
  cg->conns = tdist__calloc((size_t)g->size, sizeof(cpu_conn_t *));
  if (!cg->conns) {
    tdist__free(cg);
    return tdist__error(TDIST_ERR_NO_MEMORY, "cpu: out of memory");
  }
  cg->ctx = ctx;
  cg->g = g;
  cpu_cma_group_init(cg);
  for (int i = 0; i < g->size; i++)
    cg->conns[i] = i == g->rank ? NULL : ctx->conns[g->global_ranks[i]];
  g->bstate = cg;
  tdist__progress_call(g->progress, register_task, cg);
  return 0;
}

static int cpu_init(tdist_group_t *g, const void *arg) {
  cpu_ctx_t *ctx = NULL;
  TDIST_CHECK(cpu_ctx_create(g, &ctx));
  int rc = attach(g, ctx);
  if (rc) cpu_ctx_release(ctx);
  return rc;
}

static void ref_task(void *arg) { ((cpu_ctx_t *)arg)->refs++; }

static int cpu_split(tdist_group_t *parent, int color, tdist_group_t *child) {
  if (!child) return 0;
  cpu_ctx_t *ctx = ((cpu_group_t *)parent->bstate)->ctx;
  tdist__progress_call(parent->progress, ref_task, ctx);
  int rc = attach(child, ctx);
  if (rc) cpu_ctx_release(ctx);
  return rc;
}

/* Survivors only: the child uses their existing connections; those to the
 * excluded (dead) ranks are simply never used by it. */
static int cpu_shrink(tdist_group_t *parent, const int *exclude, int nexclude,
                      tdist_group_t *child) {
  return cpu_split(parent, 0, child);
}

static int post_op(tdist_group_t *g, tdist_work_t *w) {
  cpu_group_t *cg = g->bstate;
  cpu_op_t *op = cpu_op_get(cg);
  if (!op) return TDIST_ERR_NO_MEMORY;
  const tdist__op_args_t *a = &w->args;
  op->w = w;
  w->bk = op;
  op->type = a->type;
  op->dtype = a->dtype;
  op->redop = a->redop;
  op->count = a->count;
  op->es = tdist_dtype_size(a->dtype);
  op->root = a->root;
  op->rank = g->rank;
  op->size = g->size;
  op->p2p = a->type == TDIST_OP_SEND || a->type == TDIST_OP_RECV || a->type == TDIST_OP_BATCH_P2P;
  op->prev = NULL;
  op->next = NULL;
  if (!cg->ops) {
    cg->ops = op;
  } else {
    cpu_op_t *t = cg->ops;
    while (t->next)
      t = t->next;
    t->next = op;
    op->prev = t;
  }
  if (op->p2p) {
    int rc = cpu_post_p2p(cg, op);
    if (rc < 0 && op->w == w) {
      /* Some transfers may be queued: fail the group rather than leave them. */
      tdist__group_fail(cg->g, rc, "cpu: cannot post the point-to-point op");
    }
    return 0;
  }
  op->cseq = cg->next_cseq++;
  int rc = cpu_algo_setup(op);
  if (rc < 0) {
    cpu_op_unlink(op);
    cpu_op_put(op);
    return rc;
  }
  /* Peers that already sent this op: check they agree before starting. */
  for (cpu_ux_t *u = cg->ux; u; u = u->next)
    if (u->hdr.kind == CPU_MSG_COLL && u->hdr.seq == op->cseq &&
        cpu_check_coll(cg, op, &u->hdr, cpu_grank_of(cg, u->src)))
      return 0;
  cpu_advance(op);
  return 0;
}

static int cpu_post(tdist_group_t *g, tdist_work_t *w) {
  cpu_ctx_t *ctx = ((cpu_group_t *)g->bstate)->ctx;
  int rc = post_op(g, w);
  /* A parked message is for this op (its receive is posted now, so it is
   * read in place), or for a later one, or behind something this op needs:
   * in every case reading goes on (cpu.h, deferred reads). */
  cpu_ctx_unpark(ctx);
  return rc;
}

/* Stop all of cg's traffic and forget its ops, receives and unexpected
 * messages (progress thread; the core finishes the works). */
static void abort_group(cpu_group_t *cg) {
  tdist_group_t *g = cg->g;
  cg->aborted = 1;
  cpu_cma_group_abort(cg); /* first: before any buffer goes back to its owner */
  for (int i = 0; i < g->size; i++)
    if (cg->conns[i] && !cg->conns[i]->dead) cpu_conn_forget(cg->conns[i], g->uid);
  cpu_detach_rx(cg);
  while (cg->ops) {
    cpu_op_t *op = cg->ops;
    cpu_op_unlink(op);
    cpu_op_put(op);
  }
  while (cg->precv)
    cpu_precv_unlink(cg, cg->precv);
  while (cg->ux) {
    cpu_ux_t *u = cg->ux;
    cpu_ux_unlink(&cg->ux, u);
    cpu_ux_free(cg->ctx, u);
  }
}

/* ERR message with text to every other member of cg. It goes in the stream
 * ahead of anything this rank sends later (its goodbye included). */
static void tell_members(cpu_group_t *cg, int status, const char *text) {
  size_t len = strlen(text);
  for (int i = 0; i < cg->g->size; i++) {
    cpu_conn_t *c = cg->conns[i];
    if (!c || c->dead) continue;
    cpu_msg_t *m = cpu_msg_new();
    char *copy = tdist__malloc(len + 1);
    if (!m || !copy) {
      tdist__free(copy);
      continue;
    }
    memcpy(copy, text, len + 1);
    m->hdr = (cpu_hdr_t){
        .magic = CPU_MAGIC, .kind = CPU_MSG_ERR, .uid = cg->g->uid, .root = status, .len = len};
    m->data = (const uint8_t *)copy;
    m->owned = copy;
    cpu_send(c, m);
  }
}

static void cpu_abort(tdist_group_t *g, int status, const char *reason) {
  cpu_group_t *cg = g->bstate;
  if (!cg) return;
  abort_group(cg);
  /* A cause of our own (a mismatch, a timeout, an abort on demand, a lost
   * peer) goes to the other members in the stream, ahead of our goodbye if
   * we leave now: the monitor's abort record may arrive after that goodbye,
   * and a peer would then report only that we left. Same words as the
   * record (monitor.c), whichever arrives first. A cause reported by
   * another rank is not echoed: that rank told everyone. */
  if (g->abort_local) {
    char text[320];
    snprintf(text, sizeof(text), "rank %d aborted the group: %s", g->rank, reason);
    tell_members(cg, status, text);
  }
}

static void unregister_task(void *arg) {
  cpu_group_t *cg = arg;
  cpu_ctx_t *ctx = cg->ctx;
  abort_group(cg);
  if (cg->prev)
    cg->prev->next = cg->next;
  else
    ctx->groups = cg->next;
  if (cg->next) cg->next->prev = cg->prev;
  while (cg->free_ops) {
    cpu_op_t *op = cg->free_ops;
    cg->free_ops = op->next;
    tdist__free(op->sends);
    tdist__free(op->recvs);
    tdist__free(op);
  }
}

static int cpu_destroy(tdist_group_t *g) {
  cpu_group_t *cg = g->bstate;
  if (!cg) return 0;
  tdist__progress_call(g->progress, unregister_task, cg);
  cpu_ctx_t *ctx = cg->ctx;
  cpu_cma_group_free(cg);
  tdist__free(cg->conns);
  tdist__free(cg);
  g->bstate = NULL;
  cpu_ctx_release(ctx);
  return 0;
}

const tdist__backend_ops_t tdist__cpu_backend = {
    .name = "cpu",
    .init = cpu_init,
    .split = cpu_split,
    .shrink = cpu_shrink,
    .post = cpu_post,
    .abort = cpu_abort,
    .destroy = cpu_destroy,
};
