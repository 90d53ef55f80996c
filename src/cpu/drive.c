/*
 * drive.c - a waiting caller that drives its own op (the backend's entry,
 * above every sub-layer), and the hooks the entry registers for them
 * (tdist__cpu_hooks: the engine lock's release and loop phases, lazy
 * connect, the shared segment's engine entries, the context's free).
 *
 * Why: a small op that only the progress thread may run crosses four thread
 * hand-offs (the caller's submission wakes the progress thread, the peer's
 * progress thread wakes on the bytes, and the completion wakes the caller
 * on both sides); on a loaded 2-core machine each costs tens of
 * microseconds, far more than the op itself. So a caller thread may run the
 * engine itself: submit starts the op at once (tdist__cpu_submit), and the
 * core's caller-driven path (core/work/work.c) tests it right after and
 * while a caller waits on it: test reads and writes the transport and runs
 * the rounds (tdist__cpu_test). The progress thread stays the owner
 * whenever nobody waits: async ops still complete while the caller
 * computes.
 *
 * One writer at a time: everything the engine and its transports own
 * (base/base.h: ctx, conns, groups, ops) is written under ctx->mu, the
 * engine lock (base/lock.c). The progress thread takes it in each of its
 * entries (tdist__cpu_enter/leave: the poll and timer callbacks, post,
 * abort, poll, the setup tasks) and may wait for it, briefly: a caller
 * holds it for one pass. A caller only ever tries it (trylock) and goes
 * back to waiting when it is taken.
 *
 * What a caller may not do while it holds the lock, and what replaces it:
 *   - touch the libuv loop (only the progress thread does): code that would
 *     start a watch or a timer calls cpu_off_loop(), which marks ctx->loop_stale;
 *     the progress thread's next entry brings the loop up to date
 *     (base/lock.c's loop_sync, then hook_sync here: the same watches and
 *     timers, recomputed from the state);
 *   - report to the core (tdist_backend_complete, tdist_backend_fail are the
 *     progress thread's): a completion is held on ctx->held and its op's
 *     cpu_bop_t.ok is set, so test lets the core claim the success at once
 *     (work.c: caller-observed completion) while the progress thread hands
 *     the completion over later; the first failure is kept in the group
 *     (pf_*) and reported by the progress thread.
 * The caller then wakes the progress thread (tdist_backend_wake_any): its
 * poll (needs_poll, caps.wakes) runs loop_sync.
 *
 * An op submit started is ahead of the core, which posts it later from its
 * queue, or never (an op that succeeded on its submitting thread is
 * finished there: backend.h, submit); the engine may complete it before
 * that (on either thread), and then only sets its ok flag: the core's
 * post, if it comes, hands the completion over (tdist__cpu_post_early).
 * Submit starts an op only when no earlier op of the group is still in the
 * core's queue (cg->queued), so the backend starts a group's ops in
 * submission order, as the core numbers them.
 *
 * Polling marks (the doorbell protocol, base/shm.h): a thread in a run of
 * SPIN tests (backend.h, test) is counted as polling this process's rings
 * from its first SPIN test to the test that ends its run (LAST, or one that
 * found its op done), so the peers' writers ring no doorbell meanwhile;
 * the end of the run is the re-check of the protocol (poll_stop). A
 * collective over the shared segment needs no ring and marks none.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "util/error.h"
#include "cpu/cpu.h"
#include "cpu/transport/transport.h"
#include "cpu/engine/engine.h"
#include "cpu/segment/sc.h"
#include "cpu/conn/conn.h"

/* ---- the caller's side ------------------------------------------------------- */

/* Lock held by a caller: leave, and have the progress thread catch up
 * with what this caller left (had: loop_stale on entry, when an earlier caller
 * woke it already). */
static void caller_leave(cpu_ctx_t *ctx, int had) {
  int wake = ctx->loop_stale && !had;
  ctx->caller = 0;
  tdist__mutex_unlock(&ctx->mu);
  if (wake) tdist_backend_wake_any();
}

int tdist__cpu_submit(void *state, tdist_backend_op_t *bop) {
  cpu_group_t *cg = state;
  cpu_ctx_t *ctx = cg->ctx;
  cpu_bop_t *b = cpu_bop(bop);
  memset(b, 0, sizeof(*b));
  b->cg = cg;
  int rc = 0;
  /* A lock, not a try: the progress thread holds it for one short pass,
   * and starting the op here saves the hand-off to that thread. */
  if (tdist__param_CpuDrive() && atomic_load(&cg->queued) == 0) {
    tdist__mutex_lock(&ctx->mu);
    int had = ctx->loop_stale;
    ctx->caller = 1;
    if (!cg->aborted && atomic_load(&cg->queued) == 0) {
      int now = tdist__param_CpuScNow() ? tdist__cpu_sc_now(cg, bop) : 0;
      if (now < 0) {
        rc = now;
      } else if (now > 0) {
        /* The now lane took it, with no engine op: done (1; the core
         * claims it at its first test, or its post hands the completion
         * over: post_early), or started, its step out and the others' not
         * in (2: the waiter's tests take it from here). */
        b->early = b->sc = 1;
        if (now == 1) atomic_store_explicit(&b->ok, 1, memory_order_release);
      } else if ((rc = tdist__cpu_post_op(cg, bop)) == 0) {
        b->early = 1;
        b->sc = ((cpu_op_t *)bop->priv)->sc.on;
        if (!b->sc) { /* as in backend.c's post: an engine op's first rounds */
          tdist__cpu_run_ready(ctx);
          tdist__cpu_shm_drain(ctx);
          tdist__cpu_ctx_unpark(ctx);
        }
        /* An op over the segment reads no ring: what came there for
         * other ops rang the bell, as when nobody polls (test below). */
        tdist__cpu_sc_progress(ctx); /* its first steps leave now */
        tdist__cpu_run_ready(ctx);
      }
    }
    caller_leave(ctx, had);
  }
  if (rc < 0) return rc;
  if (!b->early) atomic_fetch_add(&cg->queued, 1);
  return 0;
}

/* The context this thread is counted as polling (a run of SPIN tests), or
 * NULL. A thread runs on one context at a time (the core's runs). */
static _Thread_local cpu_ctx_t *tl_polling;

/* The end of this thread's run, the re-check of the doorbell protocol
 * (shm.h): bytes written, or room made in a peer's ring our writes wait
 * for, while the thread polled came without a bell, and its test is over.
 * It reads them itself when the engine lock is free (what the peers sent
 * for the next op is matched at once, without waking the progress thread,
 * which would take a core beside the callers); else the lock's holder may
 * be past its read, so the progress thread is woken to read them (its
 * poll drains). Writes that wait for room it always retries itself
 * (below). */
static void poll_stop(cpu_ctx_t *ctx) {
  tl_polling = NULL;
  int left = tdist__cpu_shm_mark(ctx, 0);
  if (!left) return;
  if (left & CPU_SHM_LEFT_ROOM) {
    /* Writes that wait for room no bell will announce: the progress thread
     * polls a group only while it has ops in flight, and what waits may be
     * a control message of a finished op (an ACK, a signature), so this
     * caller retries them itself, waiting for the lock as submit does. */
    tdist__mutex_lock(&ctx->mu);
  } else if (!tdist__param_CpuDrive() || !tdist__mutex_trylock(&ctx->mu)) {
    tdist_backend_wake_any();
    return;
  }
  int had = ctx->loop_stale;
  ctx->caller = 1;
  tdist__cpu_shm_drain(ctx);
  tdist__cpu_sc_progress(ctx);
  tdist__cpu_run_ready(ctx);
  caller_leave(ctx, had);
}

/* One pass of the engine on the calling thread, if the lock is free: 1 op
 * done, 2 not done but moved, 0 not done. spin: the thread is a waiter
 * (a SPIN run), which also makes a step of a long copy rather than wait
 * for the progress thread to; a single look (the submitting thread's first,
 * tdist_work_is_completed) leaves those steps to it, so that an async call
 * returns at once. */
static int test_pass(cpu_group_t *cg, tdist_backend_op_t *bop, int spin, int last) {
  cpu_bop_t *b = cpu_bop(bop);
  cpu_ctx_t *ctx = cg->ctx;
  if (atomic_load_explicit(&b->ok, memory_order_acquire)) return 1;
  if (!tdist__param_CpuDrive() || !tdist__mutex_trylock(&ctx->mu)) return 0;
  int had = ctx->loop_stale;
  ctx->caller = 1;
  uint64_t moves = ctx->moves;
  /* An op the now lane started: only its own look while the waiter spins
   * (the others' steps are all it waits for; a whole pass between two
   * looks made it see them later); the run's last test makes a pass. */
  int now = b->sc && spin && !last ? tdist__cpu_sc_now_test(cg, bop) : -1;
  if (now >= 0) {
    caller_leave(ctx, had);
    return now;
  }
  if (!cg->aborted) {
    /* An op over the segment needs no connection and no copy: their
     * traffic for other ops rings the bell (its waiter marks no polling),
     * and a test of it costs the same in a world of any size (the loop
     * visits every rank's slot). */
    if (!b->sc) {
      for (int i = 0; i < ctx->size; i++)
        if (ctx->conns && ctx->conns[i]) tdist__cpu_conn_drive(ctx->conns[i]);
      if (spin) tdist__cpu_copy_drive(ctx); /* the waiter copies rather than spins */
    }
    tdist__cpu_sc_progress(ctx);
    tdist__cpu_run_ready(ctx);
  }
  moves = ctx->moves - moves;
  caller_leave(ctx, had);
  /* 2: not done but moved (a step of a long op): the waiter drives on
   * (backend.h, test). */
  return atomic_load_explicit(&b->ok, memory_order_acquire) ? 1 : moves ? 2 : 0;
}

int tdist__cpu_test(void *state, tdist_backend_op_t *bop, unsigned flags) {
  cpu_group_t *cg = state;
  cpu_ctx_t *ctx = cg->ctx;
  cpu_bop_t *b = cpu_bop(bop);
  int spin = (flags & TDIST_BACKEND_TEST_SPIN) != 0;
  /* A collective over the shared segment moves through the segment alone
   * (its own bells, segment/sc_chan.c): the rings' marks would only cost
   * it (a lock and a fence each way), and without them a peer's ring
   * traffic rings the bell, as it does when nobody polls. */
  cpu_ctx_t *polling = tl_polling; /* read once: a thread-local costs a call here (-fPIC) */
  if (spin && !b->sc && polling != ctx) {
    if (polling) poll_stop(polling); /* a run elsewhere never ended */
    /* Counted before the pass: what the peers answer from now on finds
     * this thread polling. */
    tdist__cpu_shm_mark(ctx, 1);
    tl_polling = polling = ctx;
  }
  if (spin && b->sc && cg->sc && sc_crowded(cg->sc)) tdist__cpu_sc_spread(cg->sc);
  int r = test_pass(cg, bop, spin, (flags & TDIST_BACKEND_TEST_LAST) != 0);
  if (polling == ctx && (!spin || r == 1)) {
    poll_stop(ctx); /* the run ends: what came without a bell is read */
    if (r != 1 && atomic_load_explicit(&b->ok, memory_order_acquire)) r = 1;
  }
  return r;
}

/* ---- the hooks the entry registers for the sub-layers (cpu_hooks_t) ----------- */

/* (lock held; base/lock.c's tdist__cpu_leave) Shared-memory collectives left
 * to this thread: members must ring it (want_bell, segment/sc_chan.c); a
 * flag just set is followed by one more pass, the sleeping side of the
 * Dekker pair. */
static void hook_leave(cpu_ctx_t *ctx) {
  while (tdist__cpu_sc_sleep(ctx)) {
    tdist__cpu_sc_progress(ctx);
    tdist__cpu_run_ready(ctx);
  }
}

/* (progress, lock held; base/lock.c's loop_sync) Each subsystem's watches
 * and timers, recomputed from the state a driving caller left. */
static void hook_sync(cpu_ctx_t *ctx) {
  for (int i = 0; i < ctx->size; i++)
    if (ctx->conns && ctx->conns[i]) tdist__cpu_conn_watch(ctx->conns[i]);
  tdist__cpu_park_sync(ctx);
  tdist__cpu_cma_sync(ctx);
  tdist__cpu_probe_sync(ctx);
  tdist__cpu_copy_sync(ctx);
  tdist__cpu_shm_sync(ctx);
}

const cpu_hooks_t tdist__cpu_hooks = {
    .leave = hook_leave,
    .sync = hook_sync,
    .want = tdist__cpu_conn_want,
    .maybe_free = tdist__cpu_ctx_maybe_free,
    .sc_forget = tdist__cpu_sc_forget,
    .sc_engine_msg = tdist__cpu_sc_engine_msg,
    .sc_needs = tdist__cpu_sc_needs,
};
