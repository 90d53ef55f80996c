/*
 * backend.h - the interface between the core runtime and a backend (internal).
 *
 * The core owns work handles, their state machine, timeouts and the progress
 * thread. A backend ("cpu", "nccl", the tests' "test") moves data. It sees a
 * work's arguments (w->args), keeps per-op state in w->bk / w->bk_inline, and
 * reports the outcome with tdist__work_finish() from the progress thread.
 *
 * Threads (the rule every backend relies on):
 *   init, split, destroy, submit  run on the CALLER's thread. They may block
 *       (store exchanges, NCCL init polling) but only within the group's
 *       timeout. To touch the event loop they use tdist__progress_call().
 *   post, poll, abort, peer-failure handling  run on the PROGRESS thread; they
 *       must not block. Only the progress thread touches the libuv loop.
 *
 * Abort contract: when the core aborts a group (timeout, tdist_group_abort,
 * a peer failure reported with tdist__group_fail, a remote abort record), it
 * calls ops->abort(g, status, reason) on the progress thread (g->abort_local
 * says whether the cause is this rank's own, so the backend may tell the
 * other ranks itself, faster than the monitor's abort record). The backend
 * stops communicating for that group and forgets every work of it: after
 * abort returns it never again touches those works or their buffers and never
 * finishes them. The core then finishes each of them with `status`.
 */
#ifndef TDIST_CORE_BACKEND_H
#define TDIST_CORE_BACKEND_H

#include "tdist/tdist.h"

/* Colour of non-members in a split (NCCL_SPLIT_NOCOLOR's role). */
#define TDIST__NOCOLOR (-1)

typedef struct tdist__backend_ops {
  const char *name;

  /* Caller thread. Set up g->bstate for a new world group: g->rank, g->size,
   * g->store (a prefix view private to the group), g->timeout_ms and g->uid
   * are set. `arg` is the backend-specific init argument (tdist_init_opts_t*
   * for the public backends). Return 0 or a tdist error (message recorded
   * with tdist__error). */
  int (*init)(tdist_group_t *g, const void *arg);

  /* Caller thread; collective over `parent` (every parent rank calls it in
   * the same order). Ranks with the same colour form one child; child is
   * NULL for TDIST__NOCOLOR. When child != NULL its rank, size, parent_ranks
   * (child rank -> parent rank), global_ranks, store, uid are set; the backend
   * sets child->bstate (and child->needs_poll). */
  int (*split)(tdist_group_t *parent, int color, tdist_group_t *child);

  /* Caller thread, optional (NULL = nothing to do). Runs after validation
   * and before the work goes to the progress thread; the NCCL backend issues
   * its kernels here so they are stream-ordered with the caller's work.
   * Returning an error fails the call (the work is not submitted). */
  int (*submit)(tdist_group_t *g, tdist_work_t *w);

  /* Progress thread. Start the op. It may finish the work right away. A
   * negative return finishes the work with that status. */
  int (*post)(tdist_group_t *g, tdist_work_t *w);

  /* Progress thread, only when g->needs_poll is set and g has work in
   * flight: check for completion and errors, finish what is done. Return the
   * number of works finished (0 lets the core back off). */
  int (*poll)(tdist_group_t *g);

  /* Progress thread. See the abort contract above. */
  void (*abort)(tdist_group_t *g, int status, const char *reason);

  /* Caller thread, after the group's work is finished or aborted. Release
   * everything; NCCL finalizes and destroys (aborting if that fails). */
  int (*destroy)(tdist_group_t *g);

  /* Caller thread, called by the survivors only (tdist_group_shrink): like
   * split, for a child of every parent rank except the `nexclude` parent
   * ranks in `exclude` (dead). The parent may be aborted. NULL = the
   * backend cannot shrink (TDIST_ERR_NOT_SUPPORTED). */
  int (*shrink)(tdist_group_t *parent, const int *exclude, int nexclude, tdist_group_t *child);

  /* Caller thread, optional: stream-ordered wait (NCCL). */
  int (*wait_stream)(tdist_group_t *g, tdist_work_t *w, void *stream);
} tdist__backend_ops_t;

/* Backends built into this library (NULL when not compiled in). */
const tdist__backend_ops_t *tdist__backend_find(const char *name);
extern const tdist__backend_ops_t tdist__cpu_backend;
#ifdef TDIST_HAVE_NCCL
extern const tdist__backend_ops_t tdist__nccl_backend;
#endif

#endif
