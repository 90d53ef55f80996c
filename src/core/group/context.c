/*
 * context.c - the runtime context every group of one world holds (see
 * group.h): the progress thread, the root store, the monitor and the
 * rendezvous, set up in that order and torn down in the reverse one by the
 * last reference; and tdist_dump_trace (debug.h), whose "every group" is
 * every group of every context.
 *
 * Threads: create/acquire/release on caller threads (release never on the
 * progress thread: it joins threads). The group list and the watchdog ticker
 * are the progress thread's; they are (un)registered through
 * tdist__progress_call.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/group/group.h"
#include "store/rendezvous.h"
#include "store/store_impl.h"
#include "util/alloc.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/param.h"
#include "util/worker.h"

/* (progress) every live context: they share the process's one progress
 * thread, which alone walks or changes this list. */
static tdist__list_t all_ctx = {&all_ctx, &all_ctx};

static void add_task(void *arg) {
  tdist__ctx_t *ctx = arg;
  tdist__progress_ticker_add(ctx->progress, &ctx->watchdog);
  tdist__list_push_back(&all_ctx, &ctx->link);
}

static void remove_task(void *arg) {
  tdist__ctx_t *ctx = arg;
  tdist__progress_ticker_remove(ctx->progress, &ctx->watchdog);
  if (tdist__list_linked(&ctx->link)) tdist__list_remove(&ctx->link);
}

/* The job's id for a context made without a rendezvous (tests, tools): the
 * launcher's, else the first proposal on the store, else unknown. */
static void pick_job(tdist__ctx_t *ctx, const char *job) {
  const char *env = tdist__env_raw("TDIST_JOB_ID");
  snprintf(ctx->job, sizeof(ctx->job), "%s", job ? job : env ? env : "-");
  tdist__job_id_clean(ctx->job);
  if (job || env || !ctx->root) return;
  char mine[64];
  snprintf(mine, sizeof(mine), "local-%d-%lld", (int)getpid(), (long long)tdist__now_ms());
  void *cur = NULL;
  size_t cl = 0;
  if (tdist_store_compare_set(ctx->root, "tdist/job", NULL, 0, mine, strlen(mine), &cur, &cl) == 0)
    snprintf(ctx->job, sizeof(ctx->job), "%.*s", (int)cl, (const char *)cur);
  tdist_store_free(cur);
  tdist__job_id_clean(ctx->job);
}

int tdist__ctx_create(tdist_store_t *store, int world_rank, int rendezvous, int agent,
                      const char *job, int store_host, tdist__ctx_t **out) {
  int rc;
  *out = NULL;
  tdist__ctx_t *ctx = tdist__calloc(1, sizeof(*ctx));
  if (!ctx) return tdist__error(TDIST_ERR_NO_MEMORY, "cannot allocate the runtime context");
  atomic_init(&ctx->refs, 1);
  ctx->world_rank = world_rank;
  ctx->store_host = store_host;
  tdist__list_init(&ctx->groups);
  tdist__list_init(&ctx->watchdog.link);
  tdist__list_init(&ctx->link);
  ctx->watchdog.fn = tdist__group_watchdog;
  TDIST_CHECKGOTO(tdist__progress_acquire(&ctx->progress), rc, fail);
  tdist__progress_call(ctx->progress, add_task, ctx);
  if (store) {
    TDIST_CHECKGOTO(tdist__store_root_view(store, &ctx->root), rc, fail);
  }
  pick_job(ctx, job);
  if (store) {
    tdist__mon_handlers_t h = tdist__group_mon_handlers;
    h.arg = ctx;
    TDIST_CHECKGOTO(tdist__monitor_start(store, world_rank, agent, &h, &ctx->monitor), rc, fail);
  }
  /* Set last: a failure above must not end a rendezvous the caller still
   * owns (it cleans up itself). */
  ctx->rendezvous = rendezvous;
  *out = ctx;
  return 0;
fail:
  tdist__ctx_release(ctx);
  return rc;
}

void tdist__ctx_acquire(tdist__ctx_t *ctx) {
  atomic_fetch_add_explicit(&ctx->refs, 1, memory_order_relaxed);
}

void tdist__ctx_release(tdist__ctx_t *ctx) {
  if (!ctx || atomic_fetch_sub_explicit(&ctx->refs, 1, memory_order_acq_rel) != 1) return;
  /* The monitor first: it calls into the progress thread and the store. */
  tdist__monitor_stop(ctx->monitor);
  if (ctx->progress) tdist__progress_call(ctx->progress, remove_task, ctx);
  /* Flight-recorder files of failures are written before anything ends
   * (a launcher may kill the process once it returns). */
  tdist__worker_drain();
  if (ctx->root) tdist_store_release(ctx->root);
  /* The last group of the world ends the rendezvous: rank 0 may host the
   * store that the other ranks need until their last group is gone too. */
  if (ctx->rendezvous) tdist__rendezvous_cleanup();
  if (ctx->progress) tdist__progress_release(ctx->progress);
  tdist__free(ctx);
}

/* ---- flight-recorder dumps on demand -------------------------------------------- */

struct snaps {
  tdist_group_t *one; /* or NULL: every group of every context */
  tdist__trace_dump_t **d;
  int n, cap;
};

static void snap_group(struct snaps *s, tdist_group_t *g) {
  if (s->n == s->cap || !g->trace) return;
  tdist__trace_meta_t m;
  tdist__group_trace_meta(g, &m);
  tdist__trace_dump_t *d = tdist__trace_snapshot(g->trace, &m);
  if (d) s->d[s->n++] = d;
}

static void poll_group(struct snaps *s, tdist_group_t *g) {
  (void)s;
  tdist__group_poll_now(g);
}

/* Progress thread: fn on the one group, or on every group of every context. */
static void each_group(struct snaps *s, void (*fn)(struct snaps *, tdist_group_t *)) {
  if (s->one) {
    fn(s, s->one);
    return;
  }
  tdist__list_t *ci, *gi;
  tdist__list_foreach(ci, &all_ctx) {
    tdist__ctx_t *ctx = tdist__list_entry(ci, tdist__ctx_t, link);
    tdist__list_foreach(gi, &ctx->groups) fn(s, tdist__list_entry(gi, tdist_group_t, ctx_link));
  }
}

/* Progress thread: what backends hold goes to the core first (its
 * completions are delivered once this call returns, before the next). */
static void poll_task(void *arg) { each_group(arg, poll_group); }

/* Progress thread: copies, so nothing is read after a group goes away. */
static void snap_task(void *arg) { each_group(arg, snap_group); }

int tdist_dump_trace(tdist_group_t *g, const char *path) {
  tdist__error_clear();
  if (!g && path)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                        "tdist_dump_trace: a path needs a group (NULL dumps every group)");
  if (g && !g->trace)
    return tdist__error(TDIST_ERR_INVALID_STATE,
                        "trace: the flight recorder is off (TDIST_TRACE_BUFFER_SIZE=0)");
  tdist_progress_t *p = NULL;
  if (tdist__progress_acquire_existing(&p) != 0) return 0; /* no group exists */
  tdist__trace_dump_t *one[1];
  struct snaps s = {g, one, 0, 1};
  if (!g) {
    s.cap = 1024;
    s.d = tdist__calloc((size_t)s.cap, sizeof(*s.d));
    if (!s.d) {
      tdist__progress_release(p);
      return tdist__error(TDIST_ERR_NO_MEMORY, "trace: out of memory");
    }
  }
  tdist__progress_call(p, poll_task, &s);
  tdist__progress_call(p, snap_task, &s);
  tdist__progress_release(p);
  int rc = 0;
  if (g && s.n == 0) rc = tdist__error(TDIST_ERR_NO_MEMORY, "trace: out of memory");
  for (int i = 0; i < s.n; i++) {
    int one_rc = tdist__trace_write(s.d[i], g ? path : NULL);
    if (one_rc != 0 && rc == 0) rc = one_rc;
  }
  if (!g) tdist__free(s.d);
  return rc;
}
