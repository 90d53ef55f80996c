/*
 * group.c - group life cycle: creation, split (new_group and meshes build on
 * it), destroy, abort on demand, accessors, and the flight recorder's public
 * dump.
 *
 * One unwind path: a group is built in steps (identity, context, store view,
 * backend state, registration); tdist__group_free undoes whichever of them
 * happened, in reverse, the backend's destroy included. Every creation path
 * (init, split, mesh, shrink) fails through it, so a failure after the
 * backend made its state never leaks it.
 *
 * Threads: creation, split and destroy run on the caller's thread and reach
 * the progress thread with tdist__progress_call.
 */
#include <stdarg.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "core/group.h"
#include "store/bootstrap.h"
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
  tdist__free(g->trace);
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
static int group_new(const tdist__backend_t *bk, tdist__ctx_t *ctx, int rank, int size,
                     const char *name, uint64_t uid, int64_t timeout_ms, tdist_group_t **out) {
  tdist_group_t *g = tdist__calloc(1, sizeof(*g));
  if (!g) return tdist__error(TDIST_ERR_NO_MEMORY, "cannot allocate a group");
  pthread_mutex_init(&g->mu, NULL);
  pthread_cond_init(&g->cv, NULL);
  tdist__list_init(&g->inflight);
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

void tdist__group_params(tdist_group_t *g, tdist__bk_params_t *p) {
  memset(p, 0, sizeof(*p));
  p->group = (tdist__bk_group_t *)g;
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

int tdist__group_adopt(tdist_group_t *g, const tdist__bk_out_t *out) {
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

int tdist__group_create_in(const tdist__backend_t *bk, tdist__ctx_t *ctx, int rank, int size,
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
    TDIST_CHECK(tdist__ctx_create(store, rank, 0, NULL, -1, &own));
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
  tdist__bk_params_t p;
  tdist__bk_out_t bo = {NULL, 0, -1};
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

int tdist__group_create(const tdist__backend_t *bk, int rank, int size, const char *name,
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

/* ---- split ------------------------------------------------------------------------ */

/* "c m0,m1,..." : a rank's colour and member list, as it passed them. */
static int list_text(char *buf, size_t cap, int color, int own_device, const int *members, int n) {
  size_t len = (size_t)snprintf(buf, cap, "%d%s ", color, own_device ? "d" : "");
  for (int i = 0; i < n && len < cap; i++)
    len += (size_t)snprintf(buf + len, cap - len, "%s%d", i ? "," : "", members[i]);
  return len < cap ? (int)len : -1;
}

/* Parse "c m0,..." into members (at most cap); returns the count, -1 if bad. */
static int list_parse(const char *v, size_t len, int *members, int cap) {
  char *text = tdist__malloc(len + 1);
  if (!text) return -1;
  memcpy(text, v, len);
  text[len] = '\0';
  char *p = strchr(text, ' ');
  int n = 0;
  while (p && *++p && n < cap) {
    members[n++] = (int)strtol(p, &p, 10);
    if (*p != ',') break;
  }
  tdist__free(text);
  return n;
}

static int contains(const int *list, int n, int r) {
  for (int i = 0; i < n; i++)
    if (list[i] == r) return 1;
  return 0;
}

/*
 * Every parent rank publishes the colour and member list it passed; two
 * ranks of which one lists the other must have passed the same list. So a
 * tdist_new_group called with different lists on different ranks fails
 * here, on every rank, with MISMATCH naming the ranks and both lists, before
 * any backend can hang in its split. (Mesh lines that do not overlap are not
 * compared.) Skipped without a store (then nothing can hang: no peer).
 */
/* The first token of a published list ends with 'd': a device was named. */
static int names_device(const void *v, size_t len) {
  const char *sp = memchr(v, ' ', len);
  return sp && sp > (const char *)v && sp[-1] == 'd';
}

static int agree_members(tdist_group_t *parent, unsigned idx, int color, int own_device,
                         const int *members, int n) {
  int rc = 0, size = parent->size;
  if (!parent->store || size < 2) return 0;
  char tag[48];
  snprintf(tag, sizeof(tag), "split%u/members", idx);
  size_t cap = (size_t)n * 12 + 32;
  char *mine = tdist__malloc(cap);
  void **vals = tdist__calloc((size_t)size, sizeof(void *));
  size_t *lens = tdist__calloc((size_t)size, sizeof(size_t));
  int *lists = tdist__calloc((size_t)size * (size_t)size, sizeof(int)),
      *cnt = tdist__calloc((size_t)size, sizeof(int));
  if (!mine || !vals || !lens || !lists || !cnt ||
      list_text(mine, cap, color, own_device, members, n) < 0) {
    rc = tdist__error(TDIST_ERR_NO_MEMORY, "new group of '%s': out of memory", parent->name);
    goto out;
  }
  rc = tdist__store_allgather(parent->store, tag, parent->rank, size, mine, strlen(mine), NULL, 0,
                              vals, lens, atomic_load(&parent->timeout_ms));
  if (rc == TDIST_ERR_CLOSED || rc == TDIST_ERR_IO) {
    /* The store is gone (killed): the lists cannot be compared, and a split
     * of a backend that needs no store (CPU) still works. */
    TDIST_WARN(CORE, "new group of '%s': member lists not compared: %s", parent->name,
               tdist_last_error());
    rc = 0;
    goto out;
  }
  if (rc) goto out;
  for (int r = 0; r < size; r++) {
    cnt[r] = list_parse(vals[r], lens[r], lists + (size_t)r * size, size);
    if (!rc && names_device(vals[r], lens[r]) != own_device)
      rc = tdist__error(TDIST_ERR_MISMATCH,
                        "new group of '%s': rank %d %s a device for it (TDIST_GROUP_FIELD_DEVICE) "
                        "but rank %d %s",
                        parent->name, parent->rank, own_device ? "names" : "does not name", r,
                        own_device ? "does not" : "does");
  }
  for (int a = 0; a < size && !rc; a++)
    for (int b = a + 1; b < size && !rc; b++) {
      const int *la = lists + (size_t)a * size, *lb = lists + (size_t)b * size;
      if (!contains(la, cnt[a], b) && !contains(lb, cnt[b], a)) continue;
      if (cnt[a] == cnt[b] && memcmp(la, lb, sizeof(int) * (size_t)cnt[a]) == 0) continue;
      const char *sa = memchr(vals[a], ' ', lens[a]), *sb = memchr(vals[b], ' ', lens[b]);
      sa = sa ? sa + 1 : vals[a];
      sb = sb ? sb + 1 : vals[b];
      rc = tdist__error(TDIST_ERR_MISMATCH,
                        "new group of '%s': ranks disagree on its members: rank %d passed "
                        "[%.*s] but rank %d passed [%.*s]",
                        parent->name, a, (int)(lens[a] - (size_t)(sa - (char *)vals[a])), sa, b,
                        (int)(lens[b] - (size_t)(sb - (char *)vals[b])), sb);
    }
out:
  for (int r = 0; vals && r < size; r++)
    tdist_store_free(vals[r]);
  tdist__free(mine);
  tdist__free(vals);
  tdist__free(lens);
  tdist__free(lists);
  tdist__free(cnt);
  return rc;
}

int tdist__group_split(tdist_group_t *parent, int color, const int *members, int n,
                       const tdist_group_opts_t *opts, tdist_group_t **out) {
  int rc;
  tdist_group_t *child = NULL;
  *out = NULL;
  if (atomic_load(&parent->aborted))
    return tdist__error(parent->abort_status, "group '%s' was aborted: %s", parent->name,
                        parent->abort_reason);
  int own_device = opts && (opts->mask & TDIST_GROUP_FIELD_DEVICE);
  if (own_device && (!(parent->bk->caps.mem & TDIST__MEM_DEVICE) || opts->device < 0))
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                        "new group of '%s': a device (%d) is named, but %s", parent->name,
                        opts->device,
                        opts->device < 0 ? "it is negative" : "the backend has no devices");
  unsigned idx = atomic_fetch_add(&parent->split_count, 1);
  TDIST_CHECK(agree_members(parent, idx, color, own_device, members, n));
  tdist__bk_params_t p;
  tdist__bk_out_t bo = {NULL, 0, -1};
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
    tdist__group_params(child, &p);
    p.color = color;
    p.own_device = own_device;
    if (own_device) p.device = opts->device;
  } else {
    memset(&p, 0, sizeof(p));
    p.progress = parent->ctx->progress;
    p.parent = parent->bstate;
    p.parent_rank = parent->rank;
    p.device = parent->device;
    p.timeout_ms = atomic_load(&parent->timeout_ms);
    p.color = TDIST__NOCOLOR;
    p.own_device = own_device;
    p.rank = -1;
  }
  TDIST_CHECKGOTO(tdist__inject("split.backend"), rc, fail);
  TDIST_CHECKGOTO(parent->bk->ops->split(&p, &bo), rc, fail);
  if (child) TDIST_CHECKGOTO(tdist__group_adopt(child, &bo), rc, fail);
  *out = child;
  return 0;
fail:
  if (child && !child->bstate && bo.state && parent->bk->ops->destroy)
    parent->bk->ops->destroy(bo.state); /* made, not adopted yet */
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

/* ---- destroy, abort and accessors ---------------------------------------------------- */

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

struct abort_req {
  tdist_group_t *g;
  int status;
  const char *fmt, *reason;
};

static void abort_task(void *arg) {
  struct abort_req *r = arg;
  tdist__group_abort_now(r->g, r->status, 3, r->fmt, r->reason); /* found here: tell, publish */
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
    struct abort_req r = {g, TDIST_ERR_ABORTED, "%s", "group destroyed with the op pending"};
    tdist__progress_call(g->ctx->progress, abort_task, &r);
    wait_pending(g, 5000);
  }
  /* Every work is finished: a thread still inside the backend's test of
   * one (it read the work as running just before) returns first. */
  tdist__work_quiesce_tests();
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
                        reason ? reason : "tdist_group_abort"};
  tdist__progress_call(g->ctx->progress, abort_task, &r);
  return 0;
}

int tdist_group_is_aborted(const tdist_group_t *g) {
  return g ? atomic_load(&((tdist_group_t *)g)->aborted) : 0;
}

/* Any thread. mu orders this against the progress thread's run_abort_cb
 * (inflight.c), which reads the state only after `aborted` was set: either
 * the progress thread finds the callback registered, or this call finds the
 * group aborted and runs it itself. */
int tdist_group_on_abort(tdist_group_t *g, tdist_group_abort_cb_t cb, void *arg) {
  if (!g || !cb)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "tdist_group_on_abort: NULL %s",
                        g ? "callback" : "group");
  pthread_mutex_lock(&g->mu);
  if (g->abort_cb_state != 0) {
    pthread_mutex_unlock(&g->mu);
    return tdist__error(TDIST_ERR_INVALID_STATE,
                        "tdist_group_on_abort: group '%s' already has an abort callback", g->name);
  }
  g->abort_cb = cb;
  g->abort_cb_arg = arg;
  int now = atomic_load_explicit(&g->aborted, memory_order_acquire);
  g->abort_cb_state = now ? 2 : 1;
  pthread_mutex_unlock(&g->mu);
  if (now) cb(g, g->abort_status, g->abort_reason, arg); /* already aborted: here */
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
