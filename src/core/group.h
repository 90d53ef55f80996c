/*
 * group.h - process groups inside the runtime (internal).
 *
 * Fields marked (caller) are written once at creation and read by anyone;
 * (progress) are owned by the progress thread; (atomic) by anyone.
 */
#ifndef TDIST_CORE_GROUP_H
#define TDIST_CORE_GROUP_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "core/backend.h"
#include "core/work.h"

struct tdist_progress;

struct tdist_group {
  /* (caller) identity */
  int rank, size;
  int *global_ranks; /* group rank -> world rank */
  int *parent_ranks; /* group rank -> parent rank (NULL for the world) */
  uint64_t uid;      /* same on every rank; distinct per group */
  char name[96];
  struct tdist_group *parent;
  const tdist__backend_ops_t *ops;
  void *bstate;              /* backend state */
  tdist_store_t *store;      /* prefix view "tdist/<name>/...", private to the group */
  tdist_store_t *root_store; /* the whole store (dead set), or NULL */
  int needs_poll;            /* backend wants ops->poll while work is in flight */
  int device;                /* CUDA device or -1 */

  /* (atomic) */
  _Atomic int64_t timeout_ms;
  _Atomic uint64_t next_seq;
  _Atomic int aborted;      /* set once; abort_status/reason valid after */
  _Atomic int64_t pending;  /* submitted and not yet finished */
  atomic_uint split_count;  /* number of splits made from this group */
  atomic_uint shrink_count; /* number of shrinks made from this group */

  int abort_status;
  char abort_reason[256];
  int abort_local; /* the cause is on this rank (not another rank's report);
                    * valid when ops->abort runs (progress thread) */

  /* (progress) in-flight works in submission order, and the group list */
  tdist_work_t *inflight_head, *inflight_tail;
  struct tdist_group *pnext, *pprev;
  int registered;
  int has_monitor;  /* this group holds a monitor reference */
  int diag_pending; /* (progress) a timeout is being diagnosed by the monitor */

  /* pending reaching 0 is signalled here, for destroy */
  pthread_mutex_t mu;
  pthread_cond_t cv;

  struct tdist_progress *progress;
  struct tdist__trace *trace; /* flight recorder (progress thread), or NULL */
};

/*
 * Create a world group with the given backend (caller thread): registers it
 * with the progress thread (started on first use), then calls ops->init.
 * `store` may be NULL only for backends that need none (tests); the group
 * takes its own reference and keeps a prefix view.
 */
int tdist__group_create(const tdist__backend_ops_t *ops, int rank, int size, const char *name,
                        tdist_store_t *store, int64_t timeout_ms, const void *init_arg,
                        tdist_group_t **out);

/*
 * Split (caller thread, collective over parent): ranks with the same colour
 * form a child; `members` lists the child's parent ranks in child-rank order
 * (ignored for TDIST__NOCOLOR). *out = NULL for non-members.
 */
int tdist__group_split(tdist_group_t *parent, int color, const int *members, int n,
                       const tdist_group_opts_t *opts, tdist_group_t **out);

/*
 * Caller thread: a child of `parent` whose rank i is parent rank members[i]
 * (the caller must be one of them): identity, rank maps, store views
 * (parent's view + store_tag), a reference on the progress thread; not yet
 * registered and without backend state. Name from opts or default_name.
 */
int tdist__group_child_new(tdist_group_t *parent, const int *members, int n,
                           const tdist_group_opts_t *opts, const char *default_name, uint64_t uid,
                           const char *store_tag, tdist_group_t **out);
/* Caller thread: hand a group whose backend is set up to the progress thread
 * (and take a monitor reference when it has a store). */
int tdist__group_register(tdist_group_t *g);
/* Caller thread: free a group that never got registered or whose backend
 * state is gone (failure paths). NULL is ignored. */
void tdist__group_free(tdist_group_t *g);
/* Mix v into the hash h (group uids: the same on every rank). */
uint64_t tdist__mix64(uint64_t h, uint64_t v);

/*
 * Progress thread: abort g because of `status` (TIMEOUT, ABORTED,
 * REMOTE_FAILED...): mark it, call ops->abort, finish every work in flight
 * with `status` and a message built from fmt. Idempotent: only the first call
 * has an effect. Backends call this when a peer fails.
 */
void tdist__group_fail(tdist_group_t *g, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The same for an abort that another rank published (monitor.c): it is not
 * published again. */
void tdist__group_fail_remote(tdist_group_t *g, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Progress thread: `w` passed its deadline. Finishes it with TIMEOUT, then
 * aborts the group so every other pending op fails with ABORTED naming w.
 * `diag` (may be NULL) says which ranks had not reached the op. */
void tdist__group_timeout(tdist_group_t *g, tdist_work_t *w, const char *diag);

/* Progress thread: in-flight list maintenance (used by work.c). */
void tdist__group_inflight_add(tdist_group_t *g, tdist_work_t *w);
void tdist__group_inflight_remove(tdist_group_t *g, tdist_work_t *w);

/* Any thread: account a finished work (pending--, signals destroy). */
void tdist__group_work_done(tdist_group_t *g);

#endif
