/*
 * group.c - group life cycle: creation, the pieces a split or a shrink builds
 * a child from (mesh.c, shrink.c), destroy, abort on demand, the abort
 * callback's registration, accessors.
 *
 * One unwind path: a group is built in steps (identity, context, store view,
 * backend state, registration); tdist__group_free undoes whichever of them
 * happened, in reverse, the backend's destroy included. Every creation path
 * (init, split, mesh, shrink) fails through it, so a failure after the
 * backend made its state never leaks it.
 *
 * Threads: creation and destroy run on the caller's thread and reach the
 * progress thread with tdist__progress_call.
 */
#include <stdarg.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "core/group/group.h"
#include "store/store_impl.h"
#include "util/alloc.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/inject.h"

uint64_t tdist__mix64(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  return h;
}

/* ---- building and unwinding --------------------------------------------------- */

/* Undo every step that happened; the backend's destroy code. */
static int group_unwind(tdist_group_t *g) {
  int rc = 0;
  /* Also when never registered: its backend may have queued a failure. */
  tdist__progress_call(g->ctx->progress, tdist__group_unregister_task, g);
  if (g->bstate && g->bk->ops->destroy) rc = g->bk->ops->destroy(g->bstate);
  g->bstate = NULL;
  tdist_store_t *us = atomic_load(&g->user_store);
  if (us) tdist_store_release(us);
  if (g->store) tdist_store_release(g->store);
  pthread_mutex_destroy(&g->mu);
  pthread_cond_destroy(&g->cv);
  tdist__free(g->global_ranks);
  tdist__free(g->parent_ranks);
  tdist__trace_free(g->trace);
  tdist__ctx_t *ctx = g->ctx;
  tdist__free(g);
  tdist__ctx_release(ctx); /* may end the rendezvous: after the backend is gone */
  return rc;
}

void tdist__group_free(tdist_group_t *g) {
  if (g) group_unwind(g);
}

/* A group with identity fields set and a context reference; no backend
 * state yet and not registered. */
static int group_new(const tdist_backend_t *bk, tdist__ctx_t *ctx, int rank, int size,
                     const char *name, uint64_t uid, int64_t timeout_ms, tdist_group_t **out) {
  tdist_group_t *g = tdist__calloc(1, sizeof(*g));
  if (!g) return tdist__error(TDIST_ERR_NO_MEMORY, "cannot allocate a group");
  pthread_mutex_init(&g->mu, NULL);
  pthread_cond_init(&g->cv, NULL);
  tdist__list_init(&g->inflight);
  tdist__list_init(&g->held);
  tdist__list_init(&g->ctx_link);
  tdist__list_init(&g->poller.link);
  g->bk = bk;
  g->rank = rank;
  g->size = size;
  g->uid = uid;
  g->device = -1;
  g->ctx = ctx;
  tdist__ctx_acquire(ctx);
  snprintf(g->name, sizeof(g->name), "%s", name);
  atomic_store(&g->timeout_ms, timeout_ms);
  g->trace = tdist__trace_new();
  g->global_ranks = tdist__calloc((size_t)size, sizeof(int));
  *out = g;
  if (!g->global_ranks)
    return tdist__error(TDIST_ERR_NO_MEMORY, "cannot allocate a group of %d ranks", size);
  return 0;
}

void tdist__group_params(tdist_group_t *g, tdist_backend_params_t *p) {
  memset(p, 0, sizeof(*p));
  p->group = (tdist_backend_group_t *)g;
  p->progress = g->ctx->progress;
  p->rank = g->rank;
  p->size = g->size;
  p->global_ranks = g->global_ranks;
  p->uid = g->uid;
  p->name = g->name;
  p->store = g->store;
  p->timeout_ms = atomic_load(&g->timeout_ms);
  p->device = g->device;
  p->color = 0;
  if (g->parent) {
    p->parent = g->parent->bstate;
    p->parent_rank = g->parent->rank;
  }
}

int tdist__group_adopt(tdist_group_t *g, const tdist_backend_out_t *out) {
  int rc;
  g->bstate = out->state;
  g->needs_poll = out->needs_poll;
  if (out->device >= 0) g->device = out->device;
  /* From here on a failure destroys the backend state (tdist__group_free). */
  TDIST_CHECK(tdist__inject("group.register"));
  /* Registered only now: the backend's fields are final, and the hand-over
   * through the progress thread's queue publishes them. */
  tdist__progress_call(g->ctx->progress, tdist__group_register_task, g);
  TDIST_CHECKGOTO(tdist__inject("group.registered"), rc, fail);
  TDIST_INFO(INIT, "group '%s' created: rank %d/%d, backend %s", g->name, g->rank, g->size,
             g->bk->name);
  return 0;
fail:
  return rc;
}

int tdist__group_create_in(const tdist_backend_t *bk, tdist__ctx_t *ctx, int rank, int size,
                           const char *name, tdist_store_t *store, int64_t timeout_ms,
                           const tdist_init_opts_t *opts, tdist_group_t **out) {
  int rc;
  tdist_group_t *g = NULL;
  tdist__ctx_t *own = NULL;
  *out = NULL;
  if (!bk) return tdist__error(TDIST_ERR_NOT_SUPPORTED, "backend not built into this library");
  if (size < 1 || rank < 0 || rank >= size)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "rank %d is not in [0, world size %d)", rank,
                        size);
  if (timeout_ms <= 0)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "timeout %lld ms must be > 0",
                        (long long)timeout_ms);
  if (!name || !*name) name = "world";
  if (!ctx) {
    TDIST_CHECK(tdist__ctx_create(store, rank, 0, 1, NULL, -1, &own));
    ctx = own;
  }
  uint64_t uid = 1469598103934665603ULL;
  for (const char *c = name; *c; c++)
    uid = (uid ^ (unsigned char)*c) * 1099511628211ULL;
  TDIST_CHECKGOTO(group_new(bk, ctx, rank, size, name, uid, timeout_ms, &g), rc, fail);
  for (int i = 0; i < size; i++)
    g->global_ranks[i] = i;
  if (store) {
    char prefix[160];
    snprintf(prefix, sizeof(prefix), "tdist/%s/", name);
    TDIST_CHECKGOTO(tdist_store_prefix(store, prefix, &g->store), rc, fail);
  }
  TDIST_CHECKGOTO(tdist__inject("group.init"), rc, fail);
  tdist_backend_params_t p;
  tdist_backend_out_t bo = {NULL, 0, -1};
  tdist__group_params(g, &p);
  p.init_opts = opts;
  TDIST_CHECKGOTO(bk->ops->init(&p, &bo), rc, fail);
  TDIST_CHECKGOTO(tdist__group_adopt(g, &bo), rc, fail);
  tdist__ctx_release(own); /* the group holds the context now */
  *out = g;
  return 0;
fail:
  tdist__group_free(g);
  tdist__ctx_release(own);
  return rc;
}

int tdist__group_create(const tdist_backend_t *bk, int rank, int size, const char *name,
                        tdist_store_t *store, int64_t timeout_ms, const tdist_init_opts_t *opts,
                        tdist_group_t **out) {
  return tdist__group_create_in(bk, NULL, rank, size, name, store, timeout_ms, opts, out);
}

int tdist__group_child_new(tdist_group_t *parent, const int *members, int n,
                           const tdist_group_opts_t *opts, const char *default_name, uint64_t uid,
                           const char *store_tag, tdist_group_t **out) {
  int rc, my = -1;
  tdist_group_t *child = NULL;
  *out = NULL;
  for (int i = 0; i < n; i++)
    if (members[i] == parent->rank) my = i;
  if (my < 0)
    return tdist__error(TDIST_ERR_INTERNAL, "rank %d is not among the new group's members",
                        parent->rank);
  const char *name =
      (opts && (opts->mask & TDIST_GROUP_FIELD_NAME) && opts->name) ? opts->name : default_name;
  int64_t timeout = atomic_load(&parent->timeout_ms);
  if (opts && (opts->mask & TDIST_GROUP_FIELD_TIMEOUT) && opts->timeout_ms > 0)
    timeout = opts->timeout_ms;
  TDIST_CHECKGOTO(group_new(parent->bk, parent->ctx, my, n, name, uid, timeout, &child), rc, fail);
  child->parent = parent;
  child->device = parent->device;
  child->parent_ranks = tdist__calloc((size_t)n, sizeof(int));
  if (!child->parent_ranks) {
    rc = tdist__error(TDIST_ERR_NO_MEMORY, "cannot allocate a group");
    goto fail;
  }
  for (int i = 0; i < n; i++) {
    child->parent_ranks[i] = members[i];
    child->global_ranks[i] = parent->global_ranks[members[i]];
  }
  if (parent->store)
    TDIST_CHECKGOTO(tdist_store_prefix(parent->store, store_tag, &child->store), rc, fail);
  *out = child;
  return 0;
fail:
  tdist__group_free(child);
  return rc;
}

/* ---- destroy, abort and accessors ---------------------------------------------------- */

static int wait_pending(tdist_group_t *g, int64_t timeout_ms) {
  int64_t deadline = tdist__now_ns() + timeout_ms * 1000000;
  /* Ops a caller finished within its spin may still wait for their
   * bookkeeping, queued without a wake (ops.c) or held by the backend
   * (backend.h, quiet): the loop takes them now (its wake drains the queue
   * and polls the backends). */
  tdist__progress_wake_any();
  pthread_mutex_lock(&g->mu);
  while (atomic_load(&g->pending) > 0) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int64_t left = deadline - tdist__now_ns();
    if (left <= 0) break;
    if (left > 10000000) left = 10000000; /* recheck every 10 ms */
    ts.tv_nsec += left;
    ts.tv_sec += ts.tv_nsec / 1000000000;
    ts.tv_nsec %= 1000000000;
    pthread_cond_timedwait(&g->cv, &g->mu, &ts);
  }
  int64_t left = atomic_load(&g->pending);
  pthread_mutex_unlock(&g->mu);
  return left == 0 ? 0 : TDIST_ERR_TIMEOUT;
}

struct abort_req {
  tdist_group_t *g;
  int status;
  const char *fmt, *reason;
  int on_demand; /* tdist_group_abort: the program asked for it */
};

/* (progress) Only the first abort counts: a later tdist_group_abort of a
 * group that already failed leaves its cause, and its dump, as they were. */
static void abort_task(void *arg) {
  struct abort_req *r = arg;
  if (r->on_demand && !atomic_load(&r->g->aborted)) r->g->abort_on_demand = 1;
  tdist__group_abort_now(r->g, r->status, 3, r->fmt, r->reason); /* found here: tell, publish */
}

/* Caller thread, in destroy: the abort callback never starts from now on
 * (its slot is closed), and one running on another thread (the progress
 * thread, or a tdist_group_on_abort caller) has returned when this does.
 * The progress thread never waits for this thread, so the wait ends. */
static int close_abort_cb(tdist_group_t *g) {
  pthread_mutex_lock(&g->mu);
  if (g->abort_cb_running && pthread_equal(g->abort_cb_thread, pthread_self())) {
    pthread_mutex_unlock(&g->mu);
    return tdist__error(TDIST_ERR_INVALID_STATE,
                        "tdist_group_destroy: group '%s' destroyed from its own abort callback",
                        g->name);
  }
  if (g->abort_cb_state != TDIST__ABORT_CB_TAKEN) g->abort_cb_state = TDIST__ABORT_CB_CLOSED;
  while (g->abort_cb_running)
    pthread_cond_wait(&g->cv, &g->mu);
  pthread_mutex_unlock(&g->mu);
  return 0;
}

int tdist_group_destroy(tdist_group_t *g) {
  if (!g) return 0;
  if (tdist__progress_on_thread())
    return tdist__error(TDIST_ERR_INVALID_STATE,
                        "tdist_group_destroy: called on the progress thread (from a completion "
                        "callback)");
  int rc = wait_pending(g, atomic_load(&g->timeout_ms));
  if (rc != 0) {
    TDIST_WARN(CORE, "group '%s': %lld ops still pending at destroy; aborting them", g->name,
               (long long)atomic_load(&g->pending));
    struct abort_req r = {g, TDIST_ERR_ABORTED, "%s", "group destroyed with the op pending", 0};
    tdist__progress_call(g->ctx->progress, abort_task, &r);
    wait_pending(g, 5000);
  }
  /* Every work is finished: a thread still inside the backend's test of
   * one (it read the work as running just before) returns first. */
  tdist__work_quiesce_tests();
  TDIST_CHECK(close_abort_cb(g));
  TDIST_INFO(INIT, "group '%s' destroyed", g->name);
  /* Off the progress thread's lists first (group_unwind): once that
   * returns no poll or watchdog pass runs on g, so the backend may free
   * what they use. */
  int brc = group_unwind(g);
  return rc ? rc : brc;
}

int tdist_group_abort(tdist_group_t *g, const char *reason) {
  if (!g) return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "tdist_group_abort: NULL group");
  struct abort_req r = {g, TDIST_ERR_ABORTED, "aborted on demand: %s",
                        reason ? reason : "tdist_group_abort", 1};
  tdist__progress_call(g->ctx->progress, abort_task, &r);
  return 0;
}

int tdist_group_is_aborted(const tdist_group_t *g) {
  return g ? atomic_load(&((tdist_group_t *)g)->aborted) : 0;
}

/* Any thread. mu orders this against the progress thread's run_abort_cb
 * (inflight.c), which takes the callback only
 * after `aborted` was set: either the progress thread finds it registered,
 * or this call finds the group aborted and runs it itself (marked running,
 * so that a destroy on another thread waits for it). */
int tdist_group_on_abort(tdist_group_t *g, tdist_group_abort_cb_t cb, void *arg) {
  if (!g || !cb)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "tdist_group_on_abort: NULL %s",
                        g ? "callback" : "group");
  pthread_mutex_lock(&g->mu);
  if (g->abort_cb_state != TDIST__ABORT_CB_NONE) {
    int closed = g->abort_cb_state == TDIST__ABORT_CB_CLOSED;
    pthread_mutex_unlock(&g->mu);
    return tdist__error(TDIST_ERR_INVALID_STATE, "tdist_group_on_abort: group '%s' %s", g->name,
                        closed ? "is being destroyed" : "already has an abort callback");
  }
  g->abort_cb = cb;
  g->abort_cb_arg = arg;
  int now = atomic_load_explicit(&g->aborted, memory_order_acquire);
  g->abort_cb_state = now ? TDIST__ABORT_CB_TAKEN : TDIST__ABORT_CB_REGISTERED;
  if (now) {
    g->abort_cb_running = 1;
    g->abort_cb_thread = pthread_self();
  }
  pthread_mutex_unlock(&g->mu);
  if (!now) return 0;
  cb(g, g->abort_status, g->abort_reason, arg); /* already aborted: here */
  pthread_mutex_lock(&g->mu);
  g->abort_cb_running = 0;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
  return 0;
}

/* Any thread. The view is made on first use; two threads racing both make
 * one and the loser releases its own, so no lock is needed. */
tdist_store_t *tdist_group_store(tdist_group_t *g) {
  if (!g || !g->store) return NULL;
  tdist_store_t *v = atomic_load_explicit(&g->user_store, memory_order_acquire);
  if (v) return v;
  tdist_store_t *mine = NULL;
  if (tdist_store_prefix(g->store, "user/", &mine) != 0) return NULL;
  if (atomic_compare_exchange_strong_explicit(&g->user_store, &v, mine, memory_order_acq_rel,
                                              memory_order_acquire))
    return mine;
  tdist_store_release(mine); /* another thread won: v is its view */
  return v;
}

int tdist_group_rank(const tdist_group_t *g) { return g ? g->rank : -1; }
int tdist_group_size(const tdist_group_t *g) { return g ? g->size : -1; }
const char *tdist_group_name(const tdist_group_t *g) { return g ? g->name : ""; }
const char *tdist_group_backend(const tdist_group_t *g) { return g ? g->bk->name : ""; }

int tdist_group_device_memory(const tdist_group_t *g) {
  if (!g) return -1;
  return !(g->bk->caps.mem & TDIST_BACKEND_MEM_HOST) &&
         (g->bk->caps.mem & TDIST_BACKEND_MEM_DEVICE);
}

int tdist_group_global_rank(const tdist_group_t *g, int rank) {
  return (g && rank >= 0 && rank < g->size) ? g->global_ranks[rank] : -1;
}

int64_t tdist_group_timeout(const tdist_group_t *g) {
  return g ? atomic_load(&((tdist_group_t *)g)->timeout_ms) : -1;
}

int tdist_group_set_timeout(tdist_group_t *g, int64_t timeout_ms) {
  if (!g || timeout_ms <= 0)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "tdist_group_set_timeout: %s",
                        g ? "timeout must be > 0" : "NULL group");
  atomic_store(&g->timeout_ms, timeout_ms);
  return 0;
}
