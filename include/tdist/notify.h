/*
 * tdist/notify.h - completion queues for language bindings, and the ABI
 * layout of the public structs.
 *
 * A completion callback (tdist_work_on_complete, tdist_group_on_abort) runs on
 * tdist's progress thread. A binding whose callbacks need a global lock (the
 * Python GIL, a JVM attach) must not take it there: one thread holding that
 * lock for seconds would stall every completion, heartbeat and abort of the
 * process. A notification queue moves the hand-off out of the progress
 * thread: the binding registers (work, queue, token) or (group, queue,
 * token); the progress thread only appends the token to the queue (a mutex
 * held for a few stores, no allocation, no foreign code), and the binding's
 * own dispatcher thread takes the events off with tdist_notify_queue_pop
 * (which blocks without any of the binding's locks) or polls the queue's
 * file descriptor, then runs the binding's callbacks there.
 *
 * Thread safety: every function may be called from any thread, at the same
 * time as the progress thread fills the queue.
 */
#ifndef TDIST_NOTIFY_H
#define TDIST_NOTIFY_H

#include "tdist/types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A notification queue. Opaque. */
typedef struct tdist_notify_queue tdist_notify_queue_t;

/* What an event reports. Values are part of the ABI. */
typedef enum tdist_notify_kind {
  TDIST_NOTIFY_WORK = 0,  /* a work registered with tdist_work_notify completed */
  TDIST_NOTIFY_ABORT = 1, /* a group registered with tdist_group_notify_abort aborted */
  TDIST_NOTIFY_POST = 2   /* tdist_notify_post */
} tdist_notify_kind_t;

/* One event, as tdist_notify_queue_pop returns it. */
typedef struct tdist_notify_event {
  uint64_t token;    /* the registration's token */
  int kind;          /* tdist_notify_kind_t */
  int status;        /* WORK: the work's status (0 or a negative code);
                        ABORT: the abort's status; POST: the posted status */
  size_t reason_len; /* ABORT: the length of the abort's reason (the copy
                        in the caller's buffer may be shorter); else 0 */
} tdist_notify_event_t;

/*
 * tdist_notify_queue_create - a new, empty, open queue.
 * Its file descriptor (tdist_notify_queue_fd) is an eventfd that is readable
 * while the queue holds events.
 * @return 0; TDIST_ERR_INVALID_ARGUMENT for NULL; TDIST_ERR_NO_MEMORY;
 *         TDIST_ERR_IO if no eventfd can be made. Any thread.
 */
int tdist_notify_queue_create(tdist_notify_queue_t **queue);

/* The queue's file descriptor (readable while events are queued; do not read
 * or close it: tdist_notify_queue_pop drains it), or -1 for NULL. */
int tdist_notify_queue_fd(const tdist_notify_queue_t *queue);

/*
 * tdist_work_notify - when `work` completes, append {token, TDIST_NOTIFY_WORK,
 * status} to `queue`. Uses the work's one completion callback
 * (tdist_work_on_complete): a handle gets either this or a callback of its
 * own. The event is allocated here, on the calling thread, so the progress
 * thread only links it in. If the work is already complete the event is
 * queued before this returns. The registration holds the queue: a queue
 * destroyed before the work completes is freed after it did.
 * Thread: any; the append runs on the progress thread (or here).
 * @return 0; TDIST_ERR_INVALID_ARGUMENT for NULL; TDIST_ERR_NO_MEMORY;
 *         TDIST_ERR_INVALID_STATE if the work already has a callback.
 */
int tdist_work_notify(tdist_work_t *work, tdist_notify_queue_t *queue, uint64_t token);

/*
 * tdist_group_notify_abort - when `group` aborts (any cause, with
 * tdist_group_on_abort's order: the event is queued before any op the abort
 * fails is seen failed), append {token, TDIST_NOTIFY_ABORT, status} and a copy
 * of the reason to `queue`. Uses the group's one abort callback. The abort
 * callback copies the reason (one allocation, at abort time only); without
 * memory the event is queued with an empty reason.
 * Lifetime: destroy the group before the queue (tdist_group_destroy
 * guarantees the callback never runs after it returned).
 * Thread: any; the append runs on the progress thread (or here, if the group
 * is already aborted).
 * @return 0; TDIST_ERR_INVALID_ARGUMENT for NULL; TDIST_ERR_NO_MEMORY;
 *         TDIST_ERR_INVALID_STATE if the group already has an abort callback.
 */
int tdist_group_notify_abort(tdist_group_t *group, tdist_notify_queue_t *queue, uint64_t token);

/*
 * tdist_notify_post - append {token, TDIST_NOTIFY_POST, status} from any
 * thread (a binding's own wake-ups, e.g. a callback added to a work that has
 * already completed).
 * @return 0; TDIST_ERR_INVALID_ARGUMENT for NULL; TDIST_ERR_NO_MEMORY;
 *         TDIST_ERR_CLOSED once the queue is closed.
 */
int tdist_notify_post(tdist_notify_queue_t *queue, uint64_t token, int status);

/*
 * tdist_notify_queue_pop - take up to `max` events, oldest first, waiting up
 * to timeout_ms (< 0: no limit, 0: do not wait) for the first one. The abort
 * reason of an ABORT event is copied, NUL-terminated and possibly truncated,
 * into reasons + i * reason_cap (reasons may be NULL when reason_cap is 0).
 * Blocks on a condition variable only: a binding calls it with its own locks
 * released (ctypes releases the GIL around it).
 * Thread: any; several threads may pop from one queue.
 * @return the number of events (>= 1); 0 if timeout_ms passed with none;
 *         TDIST_ERR_CLOSED once the queue is closed and empty (every event
 *         queued before the close is still handed out first);
 *         TDIST_ERR_INVALID_ARGUMENT for NULL queue or events, or max == 0.
 */
int tdist_notify_queue_pop(tdist_notify_queue_t *queue, tdist_notify_event_t *events, size_t max,
                           char *reasons, size_t reason_cap, int64_t timeout_ms);

/*
 * tdist_notify_queue_close - stop the queue: waiters wake up, pops hand out
 * what is left and then return TDIST_ERR_CLOSED, posts fail, and events of
 * works that complete later are dropped (their registrations still free
 * themselves). Idempotent. @return 0; TDIST_ERR_INVALID_ARGUMENT for NULL.
 */
int tdist_notify_queue_close(tdist_notify_queue_t *queue);

/*
 * tdist_notify_queue_destroy - close, then drop the caller's reference: the
 * memory goes once no tdist_work_notify registration is pending. Call it after
 * every thread blocked in tdist_notify_queue_pop on it has returned, and after
 * the groups registered with tdist_group_notify_abort were destroyed.
 * NULL is ignored. @return 0.
 */
int tdist_notify_queue_destroy(tdist_notify_queue_t *queue);

#ifdef __cplusplus
}
#endif
#endif /* TDIST_NOTIFY_H */
