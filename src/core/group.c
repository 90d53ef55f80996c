/*
 * group.c - group life cycle: creation, split (new_group and meshes build on
 * it), failure and timeout handling, abort on demand, destroy, accessors.
 *
 * Threads: creation, split and destroy run on the caller's thread and reach
 * the progress thread with tdist__progress_call. tdist__group_fail and
 * tdist__group_timeout run on the progress thread; the in-flight list is the
 * progress thread's alone.
 */
#include "core/group.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/monitor.h"
#include "core/progress.h"
#include "core/trace.h"
#include "store/rendezvous.h"
#include "store/store_impl.h"

/* ---- in-flight list (progress thread) ---------------------------------------- */

void tdist__group_inflight_add(tdist_group_t *g, tdist_work_t *w) {
  w->next = NULL;
  w->prev = g->inflight_tail;
  if (g->inflight_tail)
    g->inflight_tail->next = w;
  else
    g->inflight_head = w;
  g->inflight_tail = w;
}

void tdist__group_inflight_remove(tdist_group_t *g, tdist_work_t *w) {
  if (w->prev)
    w->prev->next = w->next;
  else
    g->inflight_head = w->next;
  if (w->next)
    w->next->prev = w->prev;
  else
    g->inflight_tail = w->prev;
  w->prev = w->next = NULL;
}

void tdist__group_work_done(tdist_group_t *g) {
  if (atomic_fetch_sub(&g->pending, 1) == 1) {
    pthread_mutex_lock(&g->mu);
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
  }
}

/* ---- failure, timeout, abort (progress thread) --------------------------------- */

/* Mark g aborted, stop its backend and (for a local abort) tell the other
 * ranks through the monitor; 0 if it already was aborted. */
static int mark_aborted(tdist_group_t *g, int status, const char *reason, int publish) {
  /* Only the progress thread aborts, so no race between writers; readers on
   * other threads see `aborted` only after the status and reason (release). */
  if (atomic_load_explicit(&g->aborted, memory_order_relaxed)) return 0;
  g->abort_status = status;
  snprintf(g->abort_reason, sizeof(g->abort_reason), "%s", reason);
  g->abort_local = publish;
  atomic_store_explicit(&g->aborted, 1, memory_order_release);
  TDIST_WARN(CORE, "group '%s' (rank %d/%d) aborted: %s", g->name, g->rank, g->size, reason);
  if (g->ops->abort) g->ops->abort(g, status, reason);
  if (publish && g->store) tdist__monitor_publish(g->uid, status, reason);
  return 1;
}

/* Finish everything in flight, then write the flight recorder. */
static void fail_inflight(tdist_group_t *g, int status, const char *reason) {
  while (g->inflight_head)
    tdist__work_finish(g->inflight_head, status, "%s", reason);
  tdist__trace_dump_on_failure(g);
}

static void group_fail_v(tdist_group_t *g, int status, int publish, const char *fmt, va_list ap) {
  char reason[256];
  vsnprintf(reason, sizeof(reason), fmt, ap);
  if (!mark_aborted(g, status, reason, publish)) return;
  fail_inflight(g, status, reason);
}

void tdist__group_fail(tdist_group_t *g, int status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  group_fail_v(g, status, 1, fmt, ap);
  va_end(ap);
}

void tdist__group_fail_remote(tdist_group_t *g, int status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  group_fail_v(g, status, 0, fmt, ap);
  va_end(ap);
}

void tdist__group_timeout(tdist_group_t *g, tdist_work_t *w, const char *diag) {
  char reason[256];
  int64_t waited_ms = (tdist__now_ns() - w->t_enqueue_ns) / 1000000;
  snprintf(reason, sizeof(reason), "%s seq %llu timed out after %lld ms%s%s",
           tdist_op_name(w->args.type), (unsigned long long)w->seq, (long long)waited_ms,
           diag ? "; " : "", diag ? diag : "");
  if (!mark_aborted(g, TDIST_ERR_ABORTED, reason, 1)) return;
  tdist__work_finish(w, TDIST_ERR_TIMEOUT, "timed out after %lld ms (timeout %lld ms)%s%s",
                     (long long)waited_ms, (long long)w->timeout_ms, diag ? "; " : "",
                     diag ? diag : "");
  char why[300];
  snprintf(why, sizeof(why), "group aborted because %s", reason);
  fail_inflight(g, TDIST_ERR_ABORTED, why);
}

struct abort_req {
  tdist_group_t *g;
  const char *reason;
};

static void abort_task(void *arg) {
  struct abort_req *r = arg;
  tdist__group_fail(r->g, TDIST_ERR_ABORTED, "aborted on demand: %s", r->reason);
}

int tdist_group_abort(tdist_group_t *g, const char *reason) {
  if (!g) return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "tdist_group_abort: NULL group");
  struct abort_req r = {g, reason ? reason : "tdist_group_abort"};
  tdist__progress_call(g->progress, abort_task, &r);
  return 0;
}

int tdist_group_is_aborted(const tdist_group_t *g) {
  return g ? atomic_load(&((tdist_group_t *)g)->aborted) : 0;
}

/* ---- creation ------------------------------------------------------------------ */

uint64_t tdist__mix64(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  return h;
}

static void register_task(void *arg) {
  tdist_group_t *g = arg;
  tdist__progress_add_group(g->progress, g);
}

static void unregister_task(void *arg) {
  tdist_group_t *g = arg;
  tdist__progress_remove_group(g->progress, g);
}

static void group_free(tdist_group_t *g) {
  if (!g) return;
  /* The last group with a store ends the rendezvous: rank 0 may host the
   * store that the other ranks need until their last group is gone too. */
  int last = g->has_monitor && tdist__monitor_release();
  if (g->progress) {
    if (g->registered) tdist__progress_call(g->progress, unregister_task, g);
    tdist__progress_release(g->progress);
  }
  if (g->store) tdist_store_release(g->store);
  if (g->root_store) tdist_store_release(g->root_store);
  pthread_mutex_destroy(&g->mu);
  pthread_cond_destroy(&g->cv);
  tdist__free(g->global_ranks);
  tdist__free(g->parent_ranks);
  tdist__free(g->trace);
  tdist__free(g);
  if (last) tdist__rendezvous_cleanup();
}

/* Allocate a group with identity fields set and a reference on the progress
 * thread; no backend state yet and not registered (the caller registers it
 * once the backend set it up). */
static int group_new(const tdist__backend_ops_t *ops, int rank, int size, const char *name,
                     uint64_t uid, int64_t timeout_ms, tdist_group_t **out) {
  int rc;
  tdist_group_t *g = tdist__calloc(1, sizeof(*g));
  if (!g) return tdist__error(TDIST_ERR_NO_MEMORY, "cannot allocate a group");
  pthread_mutex_init(&g->mu, NULL);
  pthread_cond_init(&g->cv, NULL);
  g->ops = ops;
  g->rank = rank;
  g->size = size;
  g->uid = uid;
  g->device = -1;
  snprintf(g->name, sizeof(g->name), "%s", name);
  atomic_store(&g->timeout_ms, timeout_ms);
  g->trace = tdist__trace_new();
  g->global_ranks = tdist__calloc((size_t)size, sizeof(int));
  if (!g->global_ranks) {
    rc = tdist__error(TDIST_ERR_NO_MEMORY, "cannot allocate a group of %d ranks", size);
    goto fail;
  }
  TDIST_CHECKGOTO(tdist__progress_acquire(&g->progress), rc, fail);
  *out = g;
  return 0;
fail:
  group_free(g);
  return rc;
}

static int make_store_view(tdist_store_t *base, const char *prefix, tdist_store_t **view) {
  if (!base) {
    *view = NULL;
    return 0;
  }
  return tdist_store_prefix(base, prefix, view);
}

int tdist__group_create(const tdist__backend_ops_t *ops, int rank, int size, const char *name,
                        tdist_store_t *store, int64_t timeout_ms, const void *init_arg,
                        tdist_group_t **out) {
  int rc;
  tdist_group_t *g = NULL;
  *out = NULL;
  if (!ops) return tdist__error(TDIST_ERR_NOT_SUPPORTED, "backend not built into this library");
  if (size < 1 || rank < 0 || rank >= size)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "rank %d is not in [0, world size %d)", rank,
                        size);
  if (timeout_ms <= 0)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "timeout %lld ms must be > 0",
                        (long long)timeout_ms);
  if (!name || !*name) name = "world";
  uint64_t uid = 1469598103934665603ULL;
  for (const char *c = name; *c; c++)
    uid = (uid ^ (unsigned char)*c) * 1099511628211ULL;
  TDIST_CHECKGOTO(group_new(ops, rank, size, name, uid, timeout_ms, &g), rc, fail);
  for (int i = 0; i < size; i++)
    g->global_ranks[i] = i;
  char prefix[160];
  snprintf(prefix, sizeof(prefix), "tdist/%s/", name);
  TDIST_CHECKGOTO(make_store_view(store, prefix, &g->store), rc, fail);
  if (store) TDIST_CHECKGOTO(tdist__store_root_view(store, &g->root_store), rc, fail);
  TDIST_CHECKGOTO(ops->init(g, init_arg), rc, fail);
  /* Registered only now: the backend's fields (needs_poll...) are final, and
   * the hand-over through the progress thread's queue publishes them. */
  tdist__progress_call(g->progress, register_task, g);
  if (g->store) {
    TDIST_CHECKGOTO(tdist__monitor_acquire(store, rank, g->progress), rc, fail);
    g->has_monitor = 1;
  }
  TDIST_INFO(INIT, "group '%s' created: rank %d/%d, backend %s, timeout %lld ms", g->name, rank,
             size, ops->name, (long long)timeout_ms);
  *out = g;
  return 0;
fail:
  group_free(g);
  return rc;
}

int tdist__group_child_new(tdist_group_t *parent, const int *members, int n,
                           const tdist_group_opts_t *opts, const char *default_name, uint64_t uid,
                           const char *store_tag, tdist_group_t **out) {
  int rc, my = -1;
  tdist_group_t *child = NULL;
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
  TDIST_CHECKGOTO(group_new(parent->ops, my, n, name, uid, timeout, &child), rc, fail);
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
  TDIST_CHECKGOTO(make_store_view(parent->store, store_tag, &child->store), rc, fail);
  if (parent->root_store)
    TDIST_CHECKGOTO(tdist_store_prefix(parent->root_store, "", &child->root_store), rc, fail);
  *out = child;
  return 0;
fail:
  group_free(child);
  return rc;
}

int tdist__group_register(tdist_group_t *g) {
  if (g->store) {
    TDIST_CHECK(tdist__monitor_acquire(g->store, g->global_ranks[g->rank], g->progress));
    g->has_monitor = 1;
  }
  tdist__progress_call(g->progress, register_task, g);
  TDIST_INFO(INIT, "group '%s' created from '%s': rank %d/%d", g->name,
             g->parent ? g->parent->name : "-", g->rank, g->size);
  return 0;
}

void tdist__group_free(tdist_group_t *g) { group_free(g); }

int tdist__group_split(tdist_group_t *parent, int color, const int *members, int n,
                       const tdist_group_opts_t *opts, tdist_group_t **out) {
  int rc;
  tdist_group_t *child = NULL;
  *out = NULL;
  if (atomic_load(&parent->aborted))
    return tdist__error(TDIST_ERR_ABORTED, "group '%s' was aborted: %s", parent->name,
                        parent->abort_reason);
  unsigned idx = atomic_fetch_add(&parent->split_count, 1);
  if (color != TDIST__NOCOLOR) {
    char name[96], tag[48];
    if (color == 0)
      snprintf(name, sizeof(name), "%.60s/%u", parent->name, idx);
    else
      snprintf(name, sizeof(name), "%.60s/%u.%d", parent->name, idx, color);
    snprintf(tag, sizeof(tag), "%u.%d/", idx, color);
    uint64_t uid = tdist__mix64(tdist__mix64(parent->uid, idx), (uint64_t)(unsigned)color);
    TDIST_CHECKGOTO(tdist__group_child_new(parent, members, n, opts, name, uid, tag, &child), rc,
                    fail);
  }
  TDIST_CHECKGOTO(parent->ops->split(parent, color, child), rc, fail);
  if (child) TDIST_CHECKGOTO(tdist__group_register(child), rc, fail);
  *out = child;
  return 0;
fail:
  tdist__group_free(child);
  return rc;
}

int tdist_new_group(tdist_group_t *parent, const int *ranks, int n, const tdist_group_opts_t *opts,
                    tdist_group_t **group) {
  tdist__error_clear();
  if (!group) return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "tdist_new_group: NULL out-param");
  *group = NULL;
  if (!parent || !ranks || n < 1)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "tdist_new_group: %s",
                        !parent ? "NULL parent" : "empty rank list");
  if (n > parent->size)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                        "tdist_new_group: %d ranks given, parent '%s' has %d", n, parent->name,
                        parent->size);
  int member = 0;
  for (int i = 0; i < n; i++) {
    if (ranks[i] < 0 || ranks[i] >= parent->size)
      return tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                          "tdist_new_group: ranks[%d] = %d is not in [0, %d)", i, ranks[i],
                          parent->size);
    for (int j = 0; j < i; j++)
      if (ranks[j] == ranks[i])
        return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "tdist_new_group: rank %d is listed twice",
                            ranks[i]);
    if (ranks[i] == parent->rank) member = 1;
  }
  return tdist__group_split(parent, member ? 0 : TDIST__NOCOLOR, ranks, n, opts, group);
}

/* ---- destroy and accessors ----------------------------------------------------- */

static int wait_pending(tdist_group_t *g, int64_t timeout_ms) {
  int64_t deadline = tdist__now_ns() + timeout_ms * 1000000;
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

struct fail_req {
  tdist_group_t *g;
  int status;
  const char *why;
};

static void fail_task(void *arg) {
  struct fail_req *r = arg;
  tdist__group_fail(r->g, r->status, "%s", r->why);
}

int tdist_group_destroy(tdist_group_t *g) {
  if (!g) return 0;
  int rc = wait_pending(g, atomic_load(&g->timeout_ms));
  if (rc != 0) {
    TDIST_WARN(CORE, "group '%s': %lld ops still pending at destroy; aborting them", g->name,
               (long long)atomic_load(&g->pending));
    struct fail_req r = {g, TDIST_ERR_ABORTED, "group destroyed with the op pending"};
    tdist__progress_call(g->progress, fail_task, &r);
    wait_pending(g, 5000);
  }
  /* Off the progress thread's list first: once this returns no poll or
   * watchdog pass is running on g or will start, so the backend may free
   * what they use. */
  if (g->registered) tdist__progress_call(g->progress, unregister_task, g);
  if (g->ops->destroy) {
    int brc = g->ops->destroy(g);
    if (brc < 0 && rc == 0) rc = brc;
  }
  TDIST_INFO(INIT, "group '%s' destroyed", g->name);
  group_free(g);
  return rc;
}

int tdist_group_rank(const tdist_group_t *g) { return g ? g->rank : -1; }
int tdist_group_size(const tdist_group_t *g) { return g ? g->size : -1; }
const char *tdist_group_name(const tdist_group_t *g) { return g ? g->name : ""; }
const char *tdist_group_backend(const tdist_group_t *g) { return g ? g->ops->name : ""; }

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
