/*
 * probe.c - stall probes: disagreements that send no message are caught.
 *
 * Why: a mismatch is found by comparing a peer's message header with the
 * local op (engine.c: tdist__cpu_check_coll). Some disagreements move no
 * message at all: at n = 2, a reduce or gather where each rank believes it
 * is the root has both ranks waiting to receive, and nothing is ever sent;
 * without help they would wait for the op timeout and fail as TIMEOUT.
 *
 * How: a collective still running TDIST_CPU_PROBE_MS after it was posted
 * sends a PROBE (a header with the op's signature, no payload) to every
 * other member, and again each period while it runs. A member compares it
 * with its own op of the same collective number, running or recently
 * completed (the done ring), through the same check as a data header: a
 * difference fails the group with MISMATCH there, and that rank's abort
 * tells everyone (the cause names both sides). A probe for an op not posted
 * yet is ignored; the next one is checked. An op that is merely slow costs
 * one small message per member per period, and only while it is slow.
 *
 * Threads: everything here runs on the progress thread. Receiving a probe
 * is part of the transport (it only reports a failure, deferred); the timer
 * callback is a top-level point.
 */
#include <inttypes.h>
#include <stdio.h>
#include <time.h>

#include "cpu/base/base.h"
#include "cpu/transport/transport.h"
#include "cpu/engine/engine.h"

static uint64_t period_ms(void) {
  int64_t v = tdist__param_CpuProbeMs();
  return v <= 0 ? 0 : (uint64_t)v;
}

static void send_probe(cpu_group_t *cg, const cpu_op_t *op) {
  for (int r = 0; r < cg->size; r++) {
    cpu_conn_t *c = r == cg->rank ? NULL : cg->conns[r];
    if (!c || c->dead) continue;
    cpu_msg_t *m = tdist__cpu_msg_new();
    if (!m) return; /* a probe is best effort; the next period tries again */
    m->hdr = tdist__cpu_sig_hdr(cg, op, CPU_MSG_PROBE);
    tdist__cpu_send(c, m);
  }
}

/* Timer callback (progress thread, top level). One-shot, re-armed for the
 * earliest probe due: each op probes exactly one period after its post and
 * every period after that, so a stall is reported within one period (a
 * periodic timer started by an earlier op could add up to one more). */
static void arm(cpu_ctx_t *ctx, uint64_t now, uint64_t at);

/* The probes' clock: the coarse monotonic clock (the kernel's tick, 1-4 ms,
 * read without the TSC: 5 ns against 23 for CLOCK_MONOTONIC on this VM).
 * Every op's post stamps it, and probes are due a period (seconds) later,
 * so a tick's error moves a probe by a tick; a timer that fires before the
 * coarse clock reached the due time just re-arms for the rest. Only
 * probe.c reads it: the stamps are compared with nothing else. */
static uint64_t probe_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void on_probe_timer(uv_timer_t *t) {
  cpu_ctx_t *ctx = t->data;
  tdist__cpu_enter(ctx);
  ctx->probe_due = 0;
  uint64_t now = probe_now_ms(), p = period_ms(), next = UINT64_MAX;
  tdist__list_t *n, *m;
  tdist__list_foreach(n, &ctx->groups) {
    cpu_group_t *cg = tdist__list_entry(n, cpu_group_t, link);
    if (cg->aborted) continue;
    tdist__list_foreach(m, &cg->ops) {
      cpu_op_t *op = tdist__list_entry(m, cpu_op_t, link);
      if (op->p2p || !p) continue;
      if (now >= op->probe_at) {
        send_probe(cg, op);
        op->probe_at = now + p;
      }
      if (op->probe_at < next) next = op->probe_at;
    }
  }
  if (next != UINT64_MAX) arm(ctx, now, next);
  tdist__cpu_run_ready(ctx); /* what the writes here finished */
  tdist__cpu_leave(ctx);
}

static void arm(cpu_ctx_t *ctx, uint64_t now, uint64_t at) {
  if (at <= now) at = now + 1;
  ctx->probe_due = at;
  uv_timer_start(&ctx->probe_timer, on_probe_timer, at - now, 0);
}

void tdist__cpu_probe_sync(cpu_ctx_t *ctx) {
  if (!ctx->probe_timer_on || !period_ms() || uv_is_active((uv_handle_t *)&ctx->probe_timer))
    return;
  uint64_t now = probe_now_ms();
  arm(ctx, now, now + 1); /* on_probe_timer probes what is due and re-arms for the rest */
}

void tdist__cpu_probe_start_timer(cpu_ctx_t *ctx) {
  uv_timer_init(tdist_backend_loop(ctx->progress), &ctx->probe_timer);
  ctx->probe_timer.data = ctx;
  ctx->probe_timer_on = 1;
}

void tdist__cpu_probe_posted(cpu_op_t *op) {
  cpu_ctx_t *ctx = op->cg->ctx;
  op->posted_at = probe_now_ms();
  tdist__cpu_sig_posted(op); /* sigcheck.c */
  uint64_t p = period_ms();
  op->probe_at = op->posted_at + p;
  /* Armed for a probe due no later than this one's: it re-arms for this. */
  if (!p || !ctx->probe_timer_on || (ctx->probe_due && ctx->probe_due <= op->probe_at)) return;
  if (cpu_off_loop(ctx)) return; /* tdist__cpu_probe_sync arms it */
  arm(ctx, op->posted_at, op->probe_at);
}

void tdist__cpu_on_probe(cpu_conn_t *c) {
  const cpu_hdr_t *h = &c->rh;
  if (h->len != 0) {
    tdist__cpu_on_conn_lost(c, "sent a malformed message (probe with a payload)");
    return;
  }
  cpu_group_t *cg = tdist__cpu_group_find(c->ctx, h->uid);
  if (!cg || cg->aborted) return;
  int src = tdist__cpu_grank_of(cg, c->peer);
  if (src < 0) return;
  cpu_op_t *op = tdist__cpu_op_find(cg, h->seq);
  if (op && op->sc.on) { /* over shared memory here: the sender disagrees (sc_op.c) */
    cg->ctx->hooks->sc_engine_msg(cg, op, h, src); /* segment/sc_op.c */
    return;
  }
  if (op) {
    (void)tdist__cpu_check_coll(cg, op, h, src);
    return;
  }
  /* Completed here, or not posted yet: only a completed op that is still
   * in the done ring can be compared. */
  const struct cpu_done *d = tdist__cpu_done_of(cg, h->seq);
  if (!d) return;
  cpu_op_t ran = {.type = (tdist_optype_t)d->type,
                  .dtype = (tdist_dtype_t)d->dtype,
                  .redop = (tdist_redop_t)d->redop,
                  .count = d->count,
                  .root = d->root};
  (void)tdist__cpu_check_coll(cg, &ran, h, src);
}
