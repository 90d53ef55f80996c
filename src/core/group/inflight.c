/*
 * inflight.c - the group layer on the progress thread: starting works,
 * delivering the backends' deferred completions and failures, aborting,
 * timeouts (the watchdog ticker), the pollers, the group registry, and the
 * monitor's handlers.
 *
 * Threads: everything here runs on the progress thread, except the monitor
 * handlers (monitor thread, which reach the progress thread through
 * tdist__progress_call), tdist_backend_aborted (any thread) and
 * tdist__group_finish_inline (the caller thread of an op that succeeded
 * before it was handed over).
 *
 * A backend's completion (tdist_backend_complete) writes the status and message
 * into the work and queues its dnode on the progress thread's deferred queue;
 * a backend's failure (tdist_backend_fail) records the first cause in the group
 * and queues its fail_node. Both are delivered after the I/O step that made
 * them, so a user callback, an abort or a failure never runs inside a
 * backend's call chain.
 */
#include <assert.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/group/group.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/param.h"

/* How long a timed-out op waits for the monitor's verdict naming the ranks
 * that never reached it: the diagnosis may take a second look one heartbeat
 * period (1.2 s by default) after the first (monitor.c diagnose). */
TDIST_PARAM(DiagGraceMs, "TDIST_TIMEOUT_DIAG_MS", 3000)
/* How long failures an abort made wait for the backend's device to let go
 * of their buffers (tdist_backend_hold_failures); 0: the group's timeout. */
TDIST_PARAM(ReleaseWaitMs, "TDIST_ABORT_RELEASE_MS", 0)

/* ---- finishing a work --------------------------------------------------------- */

/* "<op> seq <n> of group '<name>' (rank r/size): " + text into w->msg. */
static void set_message(tdist_work_t *w, int status, const char *fmt, va_list ap) {
  tdist_group_t *g = w->group;
  w->status = status;
  if (status == 0) {
    w->msg[0] = '\0';
    return;
  }
  int n = snprintf(w->msg, sizeof(w->msg),
                   "%s seq %" PRIu64 " of group '%s' (rank %d/%d): ", tdist_op_name(w->args.type),
                   w->bop.seq, g->name, g->rank, g->size);
  if (n < 0 || n >= (int)sizeof(w->msg)) n = 0;
  vsnprintf(w->msg + n, sizeof(w->msg) - (size_t)n, fmt, ap);
  TDIST_INFO(CORE, "work failed: %s (%s)", w->msg, tdist_err_name(status));
}

/* Finish w now: off the in-flight list, recorded, published (waiters woken,
 * callback run), accounted; the runtime's reference dropped. */
static void finish(tdist_work_t *w) {
  tdist_group_t *g = w->group;
  if (tdist__list_linked(&w->inflight)) tdist__list_remove(&w->inflight);
  w->t_end_ns = tdist__work_caller_claimed(w)
                    ? atomic_load_explicit(&w->t_claimed_ns, memory_order_relaxed)
                    : tdist__now_ns();
  tdist__trace_end(g->trace, w);
  tdist__work_publish(w);
  if (atomic_fetch_sub(&g->pending, 1) == 1) {
    pthread_mutex_lock(&g->mu);
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
  }
  tdist__work_unref(w);
}

static void finish_fmt(tdist_work_t *w, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void finish_fmt(tdist_work_t *w, int status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  /* A caller that saw the op succeed first keeps its status (work.h). */
  if (tdist__work_claim(w)) set_message(w, status, fmt, ap);
  va_end(ap);
  finish(w);
}

/* A failure an abort made: published at once, or, while the backend holds
 * failures (its device may still use the op's buffers: an NCCL kernel that
 * ncclCommAbort has not stopped yet), given its status now and published
 * when the backend says the buffers are free (tdist_backend_released) or
 * at the hold's deadline. A success a caller claimed first is published as
 * it is. (progress) */
static void fail_or_hold(tdist_work_t *w, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void fail_or_hold(tdist_work_t *w, int status, const char *fmt, ...) {
  tdist_group_t *g = w->group;
  va_list ap;
  va_start(ap, fmt);
  int ours = tdist__work_claim(w);
  if (ours) set_message(w, status, fmt, ap);
  va_end(ap);
  if (!ours || !g->hold) {
    finish(w);
    return;
  }
  if (tdist__list_linked(&w->inflight)) tdist__list_remove(&w->inflight);
  tdist__list_push_back(&g->held, &w->inflight);
}

/* Publish every held failure, in the order they were made. (progress) */
static void release_held(tdist_group_t *g, const char *note) {
  g->hold = 0;
  tdist__list_t *l;
  while ((l = tdist__list_first(&g->held)) != NULL) {
    tdist_work_t *w = tdist__list_entry(l, tdist_work_t, inflight);
    if (note) {
      size_t n = strlen(w->msg);
      snprintf(w->msg + n, sizeof(w->msg) - n, "%s", note);
    }
    finish(w);
  }
}

void tdist_backend_hold_failures(tdist_backend_group_t *h) {
  tdist_group_t *g = (tdist_group_t *)h;
  int64_t ms = tdist__param_ReleaseWaitMs();
  if (ms <= 0) ms = atomic_load(&g->timeout_ms);
  if (ms <= 0) ms = 600000;
  g->hold = 1;
  g->hold_deadline_ns = tdist__now_ns() + ms * 1000000;
  tdist__progress_ticker_arm(g->ctx->progress); /* the watchdog enforces the deadline */
}

static void released_task(void *arg) {
  tdist_group_t *g = arg;
  if (g->hold) release_held(g, NULL);
}

void tdist_backend_released(tdist_backend_group_t *h) {
  tdist_group_t *g = (tdist_group_t *)h;
  tdist__progress_call(g->ctx->progress, released_task, g);
}

static void deliver_completion(tdist__qnode_t *node) {
  finish(tdist__list_entry(node, tdist_work_t, dnode));
}

void tdist_backend_complete(tdist_backend_op_t *op, int status, const char *fmt, ...) {
  tdist_work_t *w = tdist__work_of(op);
  /* Done read before the claim: a caller claims (CAS) before it stores the
   * state, so a work seen done here was claimed by that caller. The other
   * order could read the claim still open, then the state the caller stored
   * meanwhile. */
  assert(!w->completing && (!tdist__work_done(w) || tdist__work_caller_claimed(w)));
  va_list ap;
  va_start(ap, fmt);
  if (tdist__work_claim(w)) set_message(w, status, fmt, ap);
  va_end(ap);
  w->completing = 1;
  w->dnode.run = deliver_completion;
  tdist__progress_defer(w->group->ctx->progress, &w->dnode);
}

/* A work finished on its submitting thread, nobody else ever saw it: to
 * the caller (out; the runtime's reference dropped), or, synchronous,
 * back to the cache with no atomic (the caller held the other). */
static int hand_out(tdist_work_t *w, tdist_work_t **out) {
  if (!out) {
    tdist__work_release_owned(w);
    return 0;
  }
  *out = w;
  tdist__work_unref(w);
  return 0;
}

int tdist__group_finish_inline(tdist_work_t *w, tdist_work_t **out) {
  w->t_start_ns = w->t_enqueue_ns; /* it ran from its submission, on this thread */
  w->t_end_ns = atomic_load_explicit(&w->t_claimed_ns, memory_order_relaxed);
  tdist__trace_whole(w->group->trace, w);
  return hand_out(w, out);
}

int tdist__group_finish_captured(tdist_work_t *w, tdist_work_t **out) {
  tdist_group_t *g = w->group;
  int64_t now = tdist__now_ns();
  w->captured = 1;
  tdist__work_stamp(w, now);
  w->t_start_ns = w->t_end_ns = now;
  atomic_store_explicit(&w->t_claimed_ns, now, memory_order_relaxed);
  snprintf(w->msg, sizeof(w->msg),
           "%s seq %" PRIu64 " of group '%s' (rank %d/%d): captured into a CUDA graph; it runs "
           "at each launch of the graph, which this handle does not follow (order work after "
           "a launch on the graph's stream)",
           tdist_op_name(w->args.type), w->bop.seq, g->name, g->rank, g->size);
  /* Nobody else holds the work yet: no CAS, no lock, no wake-up. */
  atomic_store_explicit(&w->claim, TDIST__CLAIM_CALLER, memory_order_relaxed);
  w->status = 0;
  atomic_store_explicit(&w->state, TDIST_WORK_COMPLETED, memory_order_release);
  tdist__trace_whole(g->trace, w);
  return hand_out(w, out);
}

/* ---- aborting ------------------------------------------------------------------ */

void tdist__group_trace_meta(const tdist_group_t *g, tdist__trace_meta_t *m) {
  memset(m, 0, sizeof(*m));
  snprintf(m->name, sizeof(m->name), "%s", g->name);
  snprintf(m->backend, sizeof(m->backend), "%s", g->bk->name);
  snprintf(m->job, sizeof(m->job), "%s", g->ctx->job);
  m->uid = g->uid;
  m->rank = g->rank;
  m->size = g->size;
  m->ranks = g->global_ranks;
  m->next_seq = atomic_load(&((tdist_group_t *)g)->next_seq);
  m->aborted = atomic_load(&((tdist_group_t *)g)->aborted);
  snprintf(m->abort_reason, sizeof(m->abort_reason), "%s", g->abort_reason);
}

/* How an abort's cause spreads: TELL, the backend tells the other members in
 * its own stream (ahead of a goodbye, so none of them names this rank as the
 * cause for leaving); PUBLISH, an abort record goes to the store. A cause
 * found here does both; one learnt from the store (a death record, a silent
 * store) only TELLs, since another member may not have read the store yet;
 * one told by another member (its ERR message) neither. */
enum { SPREAD_TELL = 1, SPREAD_PUBLISH = 2, SPREAD_LOCAL = 3 };

/* Mark g aborted and stop its backend; 0 if it already was aborted. */
static int mark_aborted(tdist_group_t *g, int status, const char *reason, int spread) {
  /* Only the progress thread aborts, so no race between writers; readers on
   * other threads see `aborted` only after the status and reason (release). */
  if (atomic_load_explicit(&g->aborted, memory_order_relaxed)) return 0;
  g->abort_status = status;
  snprintf(g->abort_reason, sizeof(g->abort_reason), "%s", reason);
  atomic_store_explicit(&g->aborted, 1, memory_order_release);
  TDIST_WARN(CORE, "group '%s' (rank %d/%d) aborted: %s", g->name, g->rank, g->size, reason);
  if (g->bstate && g->bk->ops->abort)
    g->bk->ops->abort(g->bstate, status, reason, (spread & SPREAD_TELL) != 0);
  if (spread & SPREAD_PUBLISH) tdist__monitor_publish(g->ctx->monitor, g->uid, status, reason);
  return 1;
}

/* The user's abort callback, once (tdist_group_on_abort), run right after
 * the group was marked aborted and before any of its works is published
 * failed because of it: a thread that sees an op fail (a wait returning,
 * is_completed, the op's callback) finds the callback done. Works still
 * RUNNING meanwhile (a caller may still claim one's success: work.h). Not
 * once destroy closed the slot; marked running so that destroy waits for it. */
static void run_abort_cb(tdist_group_t *g) {
  pthread_mutex_lock(&g->mu);
  tdist_group_abort_cb_t cb = g->abort_cb_state == TDIST__ABORT_CB_REGISTERED ? g->abort_cb : NULL;
  if (cb) {
    g->abort_cb_state = TDIST__ABORT_CB_TAKEN;
    g->abort_cb_running = 1;
    g->abort_cb_thread = pthread_self();
  }
  pthread_mutex_unlock(&g->mu);
  if (!cb) return;
  cb(g, g->abort_status, g->abort_reason, g->abort_cb_arg);
  pthread_mutex_lock(&g->mu);
  g->abort_cb_running = 0;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
}

/* Tell the user's abort callback, then finish everything in flight (but
 * what the backend already completed: it keeps its own status), then have
 * the flight recorder written, unless this rank aborted the group on
 * demand: the program asked for it, and a dump per deliberate abort (an
 * elastic job's every shrink) fills /tmp with files nobody asked for; the
 * other members, for whom the abort was not their program's choice, dump. */
static void fail_inflight(tdist_group_t *g, int status, const char *reason) {
  run_abort_cb(g);
  tdist__list_t *it, *tmp;
  tdist__list_foreach_safe(it, tmp, &g->inflight) {
    tdist_work_t *w = tdist__list_entry(it, tdist_work_t, inflight);
    if (w->completing) {
      /* Its completion is queued (tdist_backend_complete) and is delivered
       * after this dump: record its end now, or the dump shows it still
       * running (a synchronous op its caller finished long before, then
       * blamed by tdist-trace as a stall). finish records it again. */
      w->t_end_ns = tdist__work_caller_claimed(w)
                        ? atomic_load_explicit(&w->t_claimed_ns, memory_order_relaxed)
                        : tdist__now_ns();
      tdist__trace_end(g->trace, w);
      continue;
    }
    fail_or_hold(w, status, "%s", reason);
  }
  if (g->abort_on_demand) return;
  tdist__trace_meta_t m;
  tdist__group_trace_meta(g, &m);
  tdist__trace_dump_on_failure(g->trace, &m);
}

void tdist__group_abort_now(tdist_group_t *g, int status, int spread, const char *fmt, ...) {
  char reason[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(reason, sizeof(reason), fmt, ap);
  va_end(ap);
  if (mark_aborted(g, status, reason, spread)) fail_inflight(g, status, reason);
}

static void deliver_failure(tdist__qnode_t *node) {
  tdist_group_t *g = tdist__list_entry(node, tdist_group_t, fail_node);
  if (!g->registered) {
    /* A backend may report a failure from inside its init (a peer that
     * already gave up), while the caller thread still fills in the group
     * (tdist__group_adopt): it is delivered once the group is registered. */
    g->fail_held = 1;
    return;
  }
  g->fail_queued = 0;
  tdist__group_abort_now(g, g->fail_status, g->fail_local ? SPREAD_LOCAL : 0, "%s", g->fail_reason);
}

static void bk_fail_v(tdist_backend_group_t *h, int status, int local, const char *fmt,
                      va_list ap) {
  tdist_group_t *g = (tdist_group_t *)h;
  if (atomic_load(&g->aborted) || g->fail_queued) return; /* the first cause wins */
  g->fail_queued = 1;
  g->fail_status = status;
  g->fail_local = local;
  vsnprintf(g->fail_reason, sizeof(g->fail_reason), fmt, ap);
  g->fail_node.run = deliver_failure;
  tdist__progress_defer(g->ctx->progress, &g->fail_node);
}

void tdist_backend_fail(tdist_backend_group_t *h, int status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  bk_fail_v(h, status, 1, fmt, ap);
  va_end(ap);
}

void tdist_backend_fail_remote(tdist_backend_group_t *h, int status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  bk_fail_v(h, status, 0, fmt, ap);
  va_end(ap);
}

int tdist_backend_aborted(const tdist_backend_group_t *h) {
  return atomic_load(&((tdist_group_t *)h)->aborted);
}

void tdist__group_timeout(tdist_group_t *g, tdist_work_t *w, const char *diag) {
  char reason[256];
  int64_t waited_ms = (tdist__now_ns() - w->t_enqueue_ns) / 1000000;
  snprintf(reason, sizeof(reason), "%s seq %" PRIu64 " timed out after %lld ms%s%s",
           tdist_op_name(w->args.type), w->bop.seq, (long long)waited_ms, diag ? "; " : "",
           diag ? diag : "");
  if (!mark_aborted(g, TDIST_ERR_ABORTED, reason, SPREAD_LOCAL)) return;
  run_abort_cb(g); /* before the op that timed out is published */
  if (!w->completing)
    fail_or_hold(w, TDIST_ERR_TIMEOUT, "timed out after %lld ms (timeout %lld ms)%s%s",
                 (long long)waited_ms, (long long)w->bop.timeout_ms, diag ? "; " : "",
                 diag ? diag : "");
  char why[300];
  snprintf(why, sizeof(why), "group aborted because %s", reason);
  fail_inflight(g, TDIST_ERR_ABORTED, why);
}

/* ---- starting a work and the watchdog ---------------------------------------------- */

void tdist__group_start_work(tdist__qnode_t *node) {
  tdist_work_t *w = tdist__list_entry(node, tdist_work_t, qnode);
  tdist_group_t *g = w->group;
  /* An op handed over after its group aborted is posted all the same
   * (backend.h, post): the backend may have started it in submit and its
   * caller driven it until the abort, whose last look took in what had
   * already arrived (backend.h, abort) and may have finished it; that
   * success stands (post hands it over). Only one that did not finish
   * fails, held like the others the abort failed (a backend that launches
   * in submit, NCCL, had started it). Only this thread aborts: `aborted`
   * cannot change below. */
  int aborted = atomic_load(&g->aborted);
  tdist__work_running(w);
  tdist__list_push_back(&g->inflight, &w->inflight);
  tdist__trace_start(g->trace, w);
  if (aborted) {
    g->bk->ops->post(g->bstate, &w->bop);
    if (!w->completing && tdist__list_linked(&w->inflight))
      fail_or_hold(w, g->abort_status, "group was aborted before the op finished: %s",
                   g->abort_reason);
    return;
  }
  tdist__progress_ticker_arm(g->ctx->progress);
  int rc = g->bk->ops->post(g->bstate, &w->bop);
  /* A group failure the backend queued with the refusal is delivered first:
   * the abort (and its callback) comes before the op is seen failed. */
  if (rc < 0 && g->fail_queued) {
    tdist__progress_undefer(g->ctx->progress, &g->fail_node);
    deliver_failure(&g->fail_node);
  }
  /* Still on the list: nothing finished it inside post (a caller may have
   * claimed its success already; finish_fmt keeps that). */
  if (rc < 0 && !w->completing && tdist__list_linked(&w->inflight))
    finish_fmt(w, rc, "backend '%s' could not start the op: %s", g->bk->name, tdist_strerror(rc));
}

/* The member a timed-out op waits for alone: the peer (group rank) of an
 * op kind that has one (the kind table's PEER: send, recv), else -1 (a
 * collective, or a batch of several peers). */
static int diag_peer(const tdist_work_t *w) {
  const tdist_backend_args_t *a = w->bop.args;
  return a && (tdist_backend_op_props(a->type) & TDIST_BACKEND_OP_PEER) ? a->root : -1;
}

int tdist__group_watchdog(tdist__ticker_t *t) {
  tdist__ctx_t *ctx = tdist__list_entry(t, tdist__ctx_t, watchdog);
  int64_t now = tdist__now_ns();
  int busy = 0;
  tdist__list_t *gi;
  tdist__list_foreach(gi, &ctx->groups) {
    tdist_group_t *g = tdist__list_entry(gi, tdist_group_t, ctx_link);
    tdist__list_t *it;
    tdist__list_foreach(it, &g->inflight) {
      tdist_work_t *w = tdist__list_entry(it, tdist_work_t, inflight);
      /* A caller saw it succeed (work.h): poll finishes it soon. */
      if (w->completing || tdist__work_caller_claimed(w) || !w->deadline_ns || now < w->deadline_ns)
        continue;
      /* Before failing, let the monitor learn from the store which ranks
       * never reached this op (bounded: past the grace, fail without it). */
      int in_grace = now < w->deadline_ns + tdist__param_DiagGraceMs() * 1000000;
      if (g->size > 1 && ctx->monitor && in_grace &&
          (g->diag_pending || tdist__monitor_diagnose(ctx->monitor, g->uid, w->bop.seq, w->coll,
                                                      diag_peer(w), w->bop.timeout_ms))) {
        g->diag_pending = 1;
        break;
      }
      tdist__group_timeout(g, w, NULL);
      break; /* the group's list was emptied by the abort */
    }
    if (g->hold && now >= g->hold_deadline_ns) {
      TDIST_WARN(CORE,
                 "group '%s': the backend had not let go of its aborted ops' buffers "
                 "by the deadline; reporting them failed",
                 g->name);
      release_held(g, "; the device had not stopped using the buffers when this was reported");
    }
    if (!tdist__list_empty(&g->inflight) || g->hold) busy = 1;
  }
  return busy;
}

/* ---- registry and pollers ------------------------------------------------------ */

static int group_poll(tdist__poller_t *pl, int *busy) {
  tdist_group_t *g = tdist__list_entry(pl, tdist_group_t, poller);
  *busy = 0;
  if (tdist__list_empty(&g->inflight) || atomic_load(&g->aborted)) return 0;
  int n = g->bk->ops->poll(g->bstate);
  if (!tdist__list_empty(&g->inflight))
    *busy = g->bk->caps.wakes ? TDIST__POLL_BUSY_WOKEN : TDIST__POLL_BUSY;
  return n;
}

void tdist__group_poll_now(tdist_group_t *g) {
  int busy;
  if (g->registered && g->needs_poll && g->bk->ops->poll) (void)group_poll(&g->poller, &busy);
}

static int apply_record(tdist_group_t *g, const tdist__mon_record_t *r);

void tdist__group_register_task(void *arg) {
  tdist_group_t *g = arg;
  tdist__list_push_back(&g->ctx->groups, &g->ctx_link);
  if (g->needs_poll && g->bk->ops->poll) {
    g->poller.fn = group_poll;
    tdist__progress_poller_add(g->ctx->progress, &g->poller);
  }
  g->registered = 1;
  if (g->fail_held) {
    g->fail_held = 0;
    tdist__progress_defer(g->ctx->progress, &g->fail_node);
  }
  /* The records that came while g was being created (record_task). */
  tdist__ctx_t *ctx = g->ctx;
  unsigned n = ctx->nkept < TDIST__KEPT_RECORDS ? ctx->nkept : TDIST__KEPT_RECORDS;
  for (unsigned i = 0; i < n; i++)
    if (apply_record(g, &ctx->kept[i].r)) break;
}

void tdist__group_unregister_task(void *arg) {
  tdist_group_t *g = arg;
  if (g->registered) {
    tdist__ctx_t *ctx = g->ctx;
    unsigned k = ctx->nleft++ % TDIST__LEFT_GROUPS;
    ctx->left[k].uid = g->uid;
    ctx->left[k].next = atomic_load(&g->next_coll);
    ctx->left[k].until = tdist__now_ms() + atomic_load(&g->timeout_ms) + 30000;
    tdist__progress_poller_remove(g->ctx->progress, &g->poller);
    tdist__list_remove(&g->ctx_link);
    g->registered = 0;
  }
  /* A failure still queued (or held) for a group that goes away is moot;
   * also for one never registered, whose backend reported from its init. */
  if (g->fail_queued && !g->fail_held) tdist__progress_undefer(g->ctx->progress, &g->fail_node);
  g->fail_queued = 0;
  g->fail_held = 0;
}

/* ---- the monitor's handlers (monitor thread -> progress thread) ------------------- */

static int group_rank_of(const tdist_group_t *g, int world_rank) {
  for (int i = 0; i < g->size; i++)
    if (g->global_ranks[i] == world_rank) return i;
  return -1;
}

struct record_req {
  tdist__ctx_t *ctx;
  const tdist__mon_record_t *r;
};

/* Abort g if record r names it: a death record for a group containing
 * the dead rank, an abort record for the group itself. 1 if it did. */
static int apply_record(tdist_group_t *g, const tdist__mon_record_t *r) {
  if (atomic_load(&g->aborted)) return 0;
  int gr = group_rank_of(g, r->rank);
  if (r->dead) {
    if (gr < 0 || gr == g->rank) return 0;
    tdist__group_abort_now(g, TDIST_ERR_REMOTE_FAILED, SPREAD_TELL,
                           "rank %d (world rank %d) failed: the store declared it dead: %s", gr,
                           r->rank, r->reason);
    return 1;
  }
  if (g->uid != r->uid) return 0;
  /* Both ranks: the group rank alone read as this rank's own number
   * ("rank 1 aborted" on world rank 1, about world rank 3). */
  if (gr >= 0)
    tdist__group_abort_now(g, r->status, 0, "rank %d (world rank %d) aborted the group: %s", gr,
                           r->rank, r->reason);
  else
    tdist__group_abort_now(g, r->status, 0, "world rank %d aborted the group: %s", r->rank,
                           r->reason);
  return 1;
}

/* Abort the local copies of the groups a record names. A record none of
 * them takes may be about a group this rank is still creating: the other
 * members finished their part of the creation, used the group and failed
 * while this rank was still in its backend's setup (seen under ASan: a
 * member of a subgroup waited out its whole timeout for a mismatch the
 * others had named at once). It is kept, and applied when that group
 * registers (tdist__group_register_task); death records always are. */
static void record_task(void *arg) {
  struct record_req *q = arg;
  const tdist__mon_record_t *r = q->r;
  tdist__ctx_t *ctx = q->ctx;
  int taken = 0;
  tdist__list_t *it, *tmp;
  tdist__list_foreach_safe(it, tmp, &ctx->groups) {
    tdist_group_t *g = tdist__list_entry(it, tdist_group_t, ctx_link);
    taken |= apply_record(g, r);
  }
  if (taken && !r->dead) return; /* uids are never reused */
  tdist__kept_record_t *k = &ctx->kept[ctx->nkept++ % TDIST__KEPT_RECORDS];
  k->r = *r;
  snprintf(k->reason, sizeof(k->reason), "%s", r->reason);
  k->r.reason = k->reason;
}

static void on_record(void *arg, const tdist__mon_record_t *r) {
  struct record_req q = {arg, r};
  tdist__progress_call(((tdist__ctx_t *)arg)->progress, record_task, &q);
}

struct snap_req {
  tdist__ctx_t *ctx;
  char *buf;
  size_t cap, len;
};

/* "uid:next_coll ..." of every group, the heartbeat's value: collectives
 * only, the count all members agree on (monitor.c diagnose). */
static void snap_task(void *arg) {
  struct snap_req *s = arg;
  tdist__list_t *it;
  s->len = 0;
  tdist__list_foreach(it, &s->ctx->groups) {
    tdist_group_t *g = tdist__list_entry(it, tdist_group_t, ctx_link);
    int n = snprintf(s->buf + s->len, s->cap - s->len, "%016" PRIx64 ":%" PRIu64 " ", g->uid,
                     (uint64_t)atomic_load(&g->next_coll));
    if (n < 0 || (size_t)n >= s->cap - s->len) break;
    s->len += (size_t)n;
  }
  /* The groups destroyed last, marked: the diagnosis (monitor.c) names a
   * member that left rather than one that never reached the op. */
  tdist__ctx_t *ctx = s->ctx;
  unsigned n = ctx->nleft < TDIST__LEFT_GROUPS ? ctx->nleft : TDIST__LEFT_GROUPS;
  int64_t now = tdist__now_ms();
  for (unsigned i = 0; i < n; i++) {
    if (ctx->left[i].until < now) continue;
    int k = snprintf(s->buf + s->len, s->cap - s->len, "%016" PRIx64 ":%" PRIu64 "- ",
                     ctx->left[i].uid, ctx->left[i].next);
    if (k < 0 || (size_t)k >= s->cap - s->len) break;
    s->len += (size_t)k;
  }
}

static size_t snapshot(void *arg, char *buf, size_t cap) {
  struct snap_req s = {arg, buf, cap, 0};
  tdist__progress_call(((tdist__ctx_t *)arg)->progress, snap_task, &s);
  return s.len;
}

struct members_req {
  tdist__ctx_t *ctx;
  uint64_t uid;
  int *rank, *size, *ranks, cap, found;
  char *name;
  size_t name_len;
};

static void members_task(void *arg) {
  struct members_req *q = arg;
  tdist__list_t *it;
  tdist__list_foreach(it, &q->ctx->groups) {
    tdist_group_t *g = tdist__list_entry(it, tdist_group_t, ctx_link);
    if (g->uid != q->uid) continue;
    q->found = 1;
    *q->rank = g->rank;
    *q->size = g->size < q->cap ? g->size : q->cap;
    memcpy(q->ranks, g->global_ranks, sizeof(int) * (size_t)*q->size);
    snprintf(q->name, q->name_len, "%s", g->name);
    return;
  }
}

static int members(void *arg, uint64_t uid, int *rank, int *size, int *ranks, int cap, char *name,
                   size_t name_len) {
  struct members_req q = {arg, uid, rank, size, ranks, cap, 0, name, name_len};
  tdist__progress_call(((tdist__ctx_t *)arg)->progress, members_task, &q);
  return q.found;
}

struct verdict_req {
  tdist__ctx_t *ctx;
  uint64_t uid, seq;
  const char *text;
};

static void verdict_task(void *arg) {
  struct verdict_req *v = arg;
  tdist__list_t *it;
  tdist__list_foreach(it, &v->ctx->groups) {
    tdist_group_t *g = tdist__list_entry(it, tdist_group_t, ctx_link);
    if (g->uid != v->uid) continue;
    g->diag_pending = 0;
    tdist__list_t *wi;
    tdist__list_foreach(wi, &g->inflight) {
      tdist_work_t *w = tdist__list_entry(wi, tdist_work_t, inflight);
      if (w->bop.seq == v->seq && !w->completing) {
        tdist__group_timeout(g, w, v->text);
        return;
      }
    }
  }
}

static void on_verdict(void *arg, uint64_t uid, uint64_t seq, const char *text) {
  struct verdict_req v = {arg, uid, seq, text};
  tdist__progress_call(((tdist__ctx_t *)arg)->progress, verdict_task, &v);
}

struct lost_req {
  tdist__ctx_t *ctx;
  int64_t silent_ms;
  const char *address;
};

/* The store stopped answering. Served by a rank's process (rank 0 under
 * init_process_group): that process is stopped or hung, and no death can be
 * declared without the store, so every group holding it fails now, naming
 * it, rather than at its op timeout. Served by another process (a launcher,
 * tdist-store): no rank is to blame; collectives go on over their own
 * connections, and what needs the store (shrink, new NCCL groups) fails. */
static void lost_task(void *arg) {
  struct lost_req *q = arg;
  int host = q->ctx->store_host;
  if (host < 0) {
    TDIST_WARN(CORE, "the store at %s has not answered for %lld ms; groups go on without it",
               q->address, (long long)q->silent_ms);
    return;
  }
  tdist__list_t *it, *tmp;
  tdist__list_foreach_safe(it, tmp, &q->ctx->groups) {
    tdist_group_t *g = tdist__list_entry(it, tdist_group_t, ctx_link);
    int gr = group_rank_of(g, host);
    if (atomic_load(&g->aborted) || gr < 0 || gr == g->rank) continue;
    tdist__group_abort_now(g, TDIST_ERR_REMOTE_FAILED, SPREAD_TELL,
                           "rank %d (world rank %d) failed: it hosts the store (%s), which has "
                           "not answered for %lld ms (stopped or hung)",
                           gr, host, q->address, (long long)q->silent_ms);
  }
}

static void on_store_lost(void *arg, int64_t silent_ms, const char *address) {
  struct lost_req q = {arg, silent_ms, address};
  tdist__progress_call(((tdist__ctx_t *)arg)->progress, lost_task, &q);
}

const tdist__mon_handlers_t tdist__group_mon_handlers = {.arg = NULL,
                                                         .on_record = on_record,
                                                         .snapshot = snapshot,
                                                         .members = members,
                                                         .on_verdict = on_verdict,
                                                         .on_store_lost = on_store_lost};
