/*
 * lock.c - the engine lock (ctx->mu), and the reports a driving caller
 * leaves for the progress thread.
 *
 * One writer at a time: everything the engine and its transports own
 * (base.h: ctx, conns, groups, ops) is written under ctx->mu. The progress
 * thread takes it in each of its entries (tdist__cpu_enter/leave: the poll
 * and timer callbacks, post, abort, poll, the setup tasks) and may wait for
 * it, briefly: a caller holds it for one pass (drive.c). A caller that
 * holds it may not touch the loop nor report to the core: it marks
 * ctx->loop_stale (cpu_off_loop), holds completions on ctx->held and keeps
 * the first failure in the group (pf_*); the progress thread's next entry
 * hands them over (loop_sync).
 *
 * This is the bottom sub-layer: the work a release owes the layers above
 * (the shared segment's sleeping pass, the engine) and the loop's phases
 * (each subsystem's watches and timers) are hooks the entry registered in
 * ctx->hooks (cpu_hooks_t, drive.c), called in the same order as before,
 * so the lock never names what runs under it.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "util/error.h"
#include "cpu/base/base.h"

/* ---- the loop, brought up to date (progress thread, lock held) ---------------- */

static void deliver_held(cpu_ctx_t *ctx) {
  tdist__list_t *n, *next;
  tdist__list_foreach_safe(n, next, &ctx->held) {
    tdist_backend_op_t *bop = tdist__list_entry(n, tdist_backend_op_t, link);
    cpu_bop_t *b = cpu_bop(bop);
    tdist__list_remove(n);
    b->held = 0;
    tdist_backend_complete(bop, 0, "ok");
  }
}

static void loop_sync(cpu_ctx_t *ctx) {
  ctx->loop_stale = 0;
  tdist__list_t *n;
  tdist__list_foreach(n, &ctx->groups) {
    cpu_group_t *cg = tdist__list_entry(n, cpu_group_t, link);
    if (!cg->pf_set) continue;
    cg->pf_set = 0;
    if (cg->pf_remote)
      tdist_backend_fail_remote(cg->bk, cg->pf_status, "%s", cg->pf_why);
    else
      tdist_backend_fail(cg->bk, cg->pf_status, "%s", cg->pf_why);
  }
  deliver_held(ctx);
  ctx->hooks->sync(ctx); /* the sub-layers' watches and timers (drive.c) */
}

/* What a caller left is handed over first: its completions and failures
 * came before anything this entry finds. */
void tdist__cpu_enter(cpu_ctx_t *ctx) {
  tdist__mutex_lock(&ctx->mu);
  if (ctx->loop_stale) loop_sync(ctx);
}

void tdist__cpu_leave(cpu_ctx_t *ctx) {
  /* What the release owes the sub-layers above (drive.c: the shared
   * segment's sleeping pass), before the loop is brought up to date. */
  ctx->hooks->leave(ctx);
  if (ctx->loop_stale) loop_sync(ctx);
  tdist__mutex_unlock(&ctx->mu);
}

/* ---- reports the progress thread makes for a driving caller ------------------- */

void tdist__cpu_fail(cpu_group_t *cg, int remote, int status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (!cg->ctx->caller) {
    char why[256];
    vsnprintf(why, sizeof(why), fmt, ap);
    if (remote)
      tdist_backend_fail_remote(cg->bk, status, "%s", why);
    else
      tdist_backend_fail(cg->bk, status, "%s", why);
  } else if (!cg->pf_set) {
    /* The first cause wins, as in the core. */
    cg->pf_set = 1;
    cg->pf_status = status;
    cg->pf_remote = remote;
    vsnprintf(cg->pf_why, sizeof(cg->pf_why), fmt, ap);
    cg->ctx->loop_stale = 1;
  }
  va_end(ap);
}

void tdist__cpu_op_done(cpu_ctx_t *ctx, tdist_backend_op_t *bop) {
  cpu_bop_t *b = cpu_bop(bop);
  /* An op the core has not posted yet is handed over by that post
   * (tdist__cpu_post_early), or never: an op that succeeded on its
   * submitting thread is finished by the core there (backend.h, submit).
   * Either way ok is all it needs, and bop is not touched after the
   * store: the caller may reuse it at once. */
  if (b->early && !b->posted) {
    atomic_store_explicit(&b->ok, 1, memory_order_release);
    return;
  }
  atomic_store_explicit(&b->ok, 1, memory_order_release);
  if (!ctx->caller) {
    tdist_backend_complete(bop, 0, "ok");
    return;
  }
  /* A handed-over op a caller's pass completed: the progress thread hands
   * it over at its next entry, which the caller wakes it for (leave). */
  b->held = 1;
  tdist__list_push_back(&ctx->held, &bop->link);
  ctx->loop_stale = 1;
}

void tdist__cpu_drop_held(cpu_group_t *cg) {
  tdist__list_t *n, *next;
  tdist__list_foreach_safe(n, next, &cg->ctx->held) {
    tdist_backend_op_t *bop = tdist__list_entry(n, tdist_backend_op_t, link);
    if (cpu_bop(bop)->cg != cg) continue;
    tdist__list_remove(n);
    cpu_bop(bop)->held = 0;
  }
}

int tdist__cpu_post_early(cpu_group_t *cg, tdist_backend_op_t *bop) {
  cpu_bop_t *b = cpu_bop(bop);
  if (!b->early) {
    atomic_fetch_sub(&cg->queued, 1);
    return 0;
  }
  b->posted = 1;
  /* Completed before this post (engine lock: no race with op_done). */
  if (atomic_load_explicit(&b->ok, memory_order_acquire)) tdist_backend_complete(bop, 0, "ok");
  return 1;
}
