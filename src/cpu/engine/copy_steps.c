/*
 * copy_steps.c - long memory copies on the progress thread, in bounded steps.
 *
 * Why: the progress thread serves every group, every socket, the core's
 * queue and its timers from one loop. A point-to-point message of hundreds
 * of MB copied in one callback (a rank sending to itself: into a staging
 * buffer, then out to the receive) held that loop for seconds on a loaded
 * host: no other op moved, no task the monitor asked for ran. So a copy of
 * more than CPU_COPY_STEP bytes is queued on the context instead and made
 * CPU_COPY_STEP bytes per loop iteration from an idle handle (which also
 * keeps the loop from sleeping in its poll while copies remain), in order;
 * the rest of the loop runs between two steps.
 *
 * Two kinds:
 *   SELF     the payload of a send to oneself into its staging buffer (an
 *            unexpected message already on the group's list, incomplete
 *            until the last step, like a message still arriving on a
 *            socket); then it is complete, offered to a posted receive, and
 *            the send's transfer is done;
 *   DELIVER  a complete unexpected message (p2p, or a collective's
 *            round that is not reduced) into its receive; the message is
 *            off the group's list and owned by the copy until the last
 *            step, then freed and the receive's transfer is done. The
 *            receive is marked done at once (no peer is needed for it any
 *            more: a goodbye of the sender must not fail the op). A
 *            receive posted while its message is still arriving takes over
 *            the rest of it (engine.c, adopt_ux) only while what came in
 *            so far is one step or less; else the message completes in
 *            its staging buffer and is delivered here.
 *   READ     a single-copy read (cma.c) of a payload larger than one step
 *            from its sender's memory into its receive (or a stage buffer
 *            of ours to reduce from): a descriptor that found its receive
 *            posted (tdist__cpu_cma_on_desc) or a receive posted after its
 *            descriptor came (tdist__cpu_deliver_ux). The connection reads
 *            on meanwhile: the message was matched when its header came.
 *            The last step checks the sender's live word, then ACKs the
 *            descriptor (the sender's transfer completes on that) and the
 *            receive's transfer is done;
 *   STAGE    an unclaimed descriptor staged after TDIST_CPU_DEFER_US (cma.c,
 *            so its sender need not wait): read into a buffer of ours; the
 *            message stays on its list, marked (u->job), and a receive that
 *            matches it meanwhile waits in the job (k->x) and is given the
 *            message when the last step is in.
 * Either way the op's transfer stays pending until the last byte is
 * copied, so the op cannot complete (and its buffers stay the caller's
 * business) before. An op freed before that (abort, destroy: the core
 * aborts before it hands buffers back) drops its copies first
 * (tdist__cpu_copy_cancel from tdist__cpu_op_put), so no copy touches a
 * buffer after its op is gone; a message freed while it is staged drops
 * its job (tdist__cpu_copy_forget_ux from tdist__cpu_ux_free). A dropped
 * read still ACKs its descriptor: the sender must not wait for it.
 *
 * Not here yet (docs/cpu-backend.md, Known limits): the copy of an
 * out-of-place op's input into its output at its start (algos.c).
 *
 * Threads: progress thread only. The idle callback is a top-level point:
 * it runs the engine (tdist__cpu_run_ready) for what the copies finished.
 */
#include <inttypes.h>
#include <string.h>

#include "util/alloc.h"
#include "util/log.h"
#include "cpu/base/base.h"
#include "cpu/transport/transport.h"
#include "cpu/engine/engine.h"

enum { COPY_SELF, COPY_DELIVER, COPY_READ, COPY_STAGE };

typedef struct cpu_copy {
  tdist__list_t link; /* ctx->copies, in order */
  int kind;
  cpu_ctx_t *ctx;
  cpu_group_t *cg; /* STAGE: NULL for an orphan (its group is not here yet) */
  cpu_op_t *op;    /* SELF, DELIVER, READ: whose transfer this is */
  cpu_xfer_t *x;   /* DELIVER, READ: the receive; STAGE: one waiting for it */
  cpu_ux_t *u;     /* SELF: on cg->ux; DELIVER: owned; STAGE: on its list */
  uint8_t *dst;
  const uint8_t *src;
  size_t len, off;
  /* READ, STAGE: the sender's memory */
  cpu_rma_desc_t d;
  int src_world;
  int32_t pid;
  int own_dst; /* READ: dst is a stage buffer of ours (a reducing receive) */
} cpu_copy_t;

/* (progress) Last step done: what the copy stood for happens now. */
static void finish(cpu_copy_t *k) {
  switch (k->kind) {
  case COPY_SELF:
    k->u->complete = 1;
    tdist__cpu_claim_p2p(k->cg, k->u); /* a posted receive takes it (maybe in steps) */
    tdist__cpu_xfer_done(k->op);
    break;
  case COPY_DELIVER:
    tdist__cpu_ux_free(k->ctx, k->u);
    tdist__cpu_xfer_done(k->op);
    break;
  case COPY_READ:
    tdist__cpu_cma_ack(k->ctx, k->src_world, k->d.cookie);
    if (k->x->reduce) k->x->stage = k->dst;
    k->x->done = 1;
    tdist__cpu_xfer_done(k->op);
    break;
  case COPY_STAGE:
    tdist__cpu_cma_ack(k->ctx, k->src_world, k->d.cookie);
    k->u->data = k->dst;
    k->u->job = NULL;
    if (k->x) tdist__cpu_deliver_ux(k->cg, k->x->op, k->x, k->u); /* it waited for this */
    break;
  }
}

/* (progress) A read step failed (the sender aborted, or is gone): the
 * transfer stays undone and the group's failure is reported (cma.c). */
static void read_failed(cpu_copy_t *k, int aborted, const char *why) {
  if (k->kind == COPY_STAGE) {
    tdist__cpu_buf_put(k->ctx, k->dst);
    k->u->job = NULL;
    tdist__cpu_ux_free(k->ctx, k->u); /* it has no bytes: never delivered */
  } else if (k->own_dst) {
    tdist__cpu_buf_put(k->ctx, k->dst);
  }
  tdist__cpu_cma_failed(k->cg, k->src_world, aborted, why);
}

/* (progress) take bytes of k; 0, or -1 when k failed (handled, unlinked). */
static int step(cpu_copy_t *k, size_t take) {
  if (k->kind != COPY_READ && k->kind != COPY_STAGE) {
    tdist__cpu_copy(k->dst + k->off, k->src + k->off, take);
    return 0;
  }
  char why[120];
  int aborted = 0;
  if (tdist__cpu_cma_read_range(k->pid, k->dst, &k->d, k->off, take, why, sizeof(why), &aborted) ==
          0 &&
      (k->off + take < k->len ||
       tdist__cpu_cma_read_end(k->pid, &k->d, why, sizeof(why), &aborted) == 0))
    return 0;
  tdist__list_remove(&k->link);
  read_failed(k, aborted, why);
  tdist__free(k);
  return -1;
}

/* (progress) One loop iteration's share: CPU_COPY_STEP bytes at most. */
/* (engine lock) One step's share of the queued copies. */
static void run_steps(cpu_ctx_t *ctx) {
  size_t budget = CPU_COPY_STEP;
  tdist__list_t *n;
  while (budget > 0 && (n = tdist__list_first(&ctx->copies))) {
    cpu_copy_t *k = tdist__list_entry(n, cpu_copy_t, link);
    size_t take = k->len - k->off < budget ? k->len - k->off : budget;
    budget -= take;
    if (step(k, take) < 0) continue;
    k->off += take;
    if (k->off < k->len) break;
    tdist__list_remove(&k->link);
    finish(k); /* may queue a DELIVER copy behind the others */
    tdist__free(k);
  }
}

void tdist__cpu_copy_drive(cpu_ctx_t *ctx) {
  if (!ctx->copy_idle_on || !tdist__list_first(&ctx->copies)) return;
  run_steps(ctx);
  ctx->moves++; /* a step of a long copy: its waiter drives on (drive.c) */
}

static void on_idle(uv_idle_t *h) {
  cpu_ctx_t *ctx = h->data;
  tdist__cpu_enter(ctx);
  run_steps(ctx);
  if (!tdist__list_first(&ctx->copies)) uv_idle_stop(h);
  tdist__cpu_run_ready(ctx); /* ops whose last transfer these copies finished */
  tdist__cpu_leave(ctx);
}

void tdist__cpu_copy_start(cpu_ctx_t *ctx) {
  uv_idle_init(tdist_backend_loop(ctx->progress), &ctx->copy_idle);
  ctx->copy_idle.data = ctx;
  tdist__list_init(&ctx->copies);
  ctx->copy_idle_on = 1;
}

void tdist__cpu_copy_sync(cpu_ctx_t *ctx) {
  if (ctx->copy_idle_on && tdist__list_first(&ctx->copies) &&
      !uv_is_active((uv_handle_t *)&ctx->copy_idle))
    uv_idle_start(&ctx->copy_idle, on_idle);
}

/* (progress) A copy of `len` bytes into dst for op (may be NULL); NULL when
 * there is no memory (the caller then copies at once). */
static cpu_copy_t *copy_new(int kind, cpu_ctx_t *ctx, cpu_group_t *cg, cpu_op_t *op, cpu_xfer_t *x,
                            uint8_t *dst, size_t len) {
  if (!ctx->copy_idle_on) return NULL; /* no loop handle (tdist__cpu_copy_start): copy at once */
  cpu_copy_t *k = tdist__calloc(1, sizeof(*k));
  if (k)
    *k = (cpu_copy_t){.kind = kind, .ctx = ctx, .cg = cg, .op = op, .x = x, .dst = dst, .len = len};
  return k;
}

/* (progress) Queue k; NULL-safe: 0 when it could not be queued. */
static int queue(cpu_ctx_t *ctx, cpu_copy_t *k) {
  if (!k) return 0;
  tdist__list_push_back(&ctx->copies, &k->link);
  if (!cpu_off_loop(ctx) && !uv_is_active((uv_handle_t *)&ctx->copy_idle))
    uv_idle_start(&ctx->copy_idle, on_idle);
  return 1;
}

void tdist__cpu_copy_self(cpu_group_t *cg, cpu_op_t *op, cpu_ux_t *u, const void *src, size_t len) {
  cpu_copy_t *k =
      len > CPU_COPY_STEP ? copy_new(COPY_SELF, cg->ctx, cg, op, NULL, u->data, len) : NULL;
  if (k) {
    k->u = u;
    k->src = src;
    if (queue(cg->ctx, k)) return;
  }
  /* Small (or no memory for the bookkeeping): at once, as before. */
  if (len) tdist__cpu_copy(u->data, src, len);
  u->complete = 1;
  tdist__cpu_claim_p2p(cg, u);
  tdist__cpu_xfer_done(op);
}

int tdist__cpu_copy_deliver(cpu_group_t *cg, cpu_op_t *op, cpu_xfer_t *x, cpu_ux_t *u) {
  if (u->hdr.len <= CPU_COPY_STEP || !u->data) return 0;
  cpu_copy_t *k = copy_new(COPY_DELIVER, cg->ctx, cg, op, x, x->ptr, u->hdr.len);
  if (!k) return 0;
  k->u = u;
  k->src = u->data;
  /* Taken: no other receive may match it while it is copied. And x is done
   * as far as its peer goes (its bytes are all here): no other message is
   * matched to it, and a peer that says goodbye now is not needed (the op
   * still completes only after the last step, through op->pending). */
  if (tdist__list_linked(&u->link)) tdist__list_remove(&u->link);
  x->done = 1;
  return queue(cg->ctx, k);
}

int tdist__cpu_copy_read(cpu_group_t *cg, cpu_op_t *op, cpu_xfer_t *x, int src_world, int32_t pid,
                         const cpu_rma_desc_t *d, uint8_t *dst) {
  if (d->len <= CPU_COPY_STEP) return 0;
  cpu_copy_t *k = copy_new(COPY_READ, cg->ctx, cg, op, x, dst, d->len);
  if (!k) return 0;
  k->d = *d;
  k->src_world = src_world;
  k->pid = pid;
  k->own_dst = x->reduce;
  TDIST_TRACE(CPU, "cma: reading %" PRIu64 " bytes from world rank %d in steps", d->len, src_world);
  return queue(cg->ctx, k);
}

int tdist__cpu_copy_stage(cpu_ctx_t *ctx, cpu_group_t *cg, cpu_ux_t *u, int32_t pid, uint8_t *dst) {
  if (u->desc.len <= CPU_COPY_STEP) return 0;
  cpu_copy_t *k = copy_new(COPY_STAGE, ctx, cg, NULL, NULL, dst, u->desc.len);
  if (!k) return 0;
  k->u = u;
  k->d = u->desc;
  k->src_world = u->src;
  k->pid = pid;
  u->job = k;
  TDIST_TRACE(CPU, "cma: staging %" PRIu64 " bytes from world rank %d in steps", u->desc.len,
              u->src);
  return queue(ctx, k);
}

int tdist__cpu_copy_wait_staged(cpu_ux_t *u, cpu_xfer_t *x) {
  if (!u->job) return 0;
  u->job->x = x;
  return 1;
}

/* (progress) Unlink and free k, idling the handle when no copy is left. */
static void drop(cpu_ctx_t *ctx, cpu_copy_t *k) {
  tdist__list_remove(&k->link);
  tdist__free(k);
  if (ctx->copy_idle_on && !tdist__list_first(&ctx->copies) && !cpu_off_loop(ctx))
    uv_idle_stop(&ctx->copy_idle);
}

void tdist__cpu_copy_forget_ux(cpu_ctx_t *ctx, cpu_ux_t *u) {
  cpu_copy_t *k = u->job;
  if (!k) return;
  u->job = NULL;
  tdist__cpu_buf_put(ctx, k->dst);
  tdist__cpu_cma_ack(ctx, k->src_world, k->d.cookie); /* nothing reads it now */
  drop(ctx, k);
}

void tdist__cpu_copy_cancel(cpu_op_t *op) {
  cpu_ctx_t *ctx = op->cg->ctx;
  if (!ctx->copy_idle_on) return;
  tdist__list_t *n, *next;
  tdist__list_foreach_safe(n, next, &ctx->copies) {
    cpu_copy_t *k = tdist__list_entry(n, cpu_copy_t, link);
    if (k->kind == COPY_STAGE) {
      if (k->x && k->x->op == op) k->x = NULL; /* the message stays, unclaimed */
      continue;
    }
    if (k->op != op) continue;
    if (k->kind == COPY_READ) {
      if (k->own_dst) tdist__cpu_buf_put(ctx, k->dst);
      tdist__cpu_cma_ack(ctx, k->src_world, k->d.cookie); /* the sender moves on */
    } else {
      /* SELF too: a message of a send that is gone must never be delivered. */
      tdist__cpu_ux_free(ctx, k->u);
    }
    drop(ctx, k);
  }
}
