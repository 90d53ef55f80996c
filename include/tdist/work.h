/*
 * tdist/work.h - asynchronous work handles.
 *
 * Every collective and point-to-point call returns a tdist_work_t. The handle
 * is owned by the caller until tdist_work_release(); the runtime keeps its own
 * reference while the operation is in flight, so releasing early is allowed
 * (the operation still runs to completion, its buffers must stay valid).
 *
 * Buffer lifetime rule: the buffers passed to an operation belong to tdist
 * until the work is complete (tdist_work_is_completed() returns 1, a wait
 * returns, or the completion callback runs), whatever the outcome. After a
 * failed or aborted op their content is unspecified.
 *
 * Life cycle (one state machine, owned by the runtime's progress thread):
 *
 *   QUEUED --> RUNNING --> COMPLETED
 *      |          |------> FAILED      (status < 0, message set)
 *      |          |------> TIMED_OUT   (status TDIST_ERR_TIMEOUT)
 *      '----------'------> ABORTED     (status TDIST_ERR_ABORTED or
 *                                        TDIST_ERR_REMOTE_FAILED)
 *
 * The last four states are terminal; a handle never leaves them.
 *
 * When a group aborts, its abort callback (tdist_group_on_abort, if
 * registered before the abort) has returned before any op that the abort
 * fails (FAILED, TIMED_OUT or ABORTED) is seen complete by
 * tdist_work_is_completed/wait/wait_all/wait_any or a completion callback
 * (tdist/group.h, tdist_group_on_abort, gives the whole order).
 *
 * A work submitted on a CUDA stream that is being captured into a graph
 * (NCCL backend) is a captured work: its op runs at each launch of the
 * graph, not now, and the handle does not follow those launches. It is
 * COMPLETED with status 0 as soon as the call returns (is_completed 1, wait
 * returns 0 at once, a callback runs at registration), is never timed out,
 * and tdist_work_is_captured says so; tdist_work_error_message then says it
 * was captured. Order later work after a launch on the graph's stream.
 *
 * Thread safety: every function here may be called from any thread, at the
 * same time as the runtime completes the work. A handle must not be used after
 * the caller's tdist_work_release().
 */
#ifndef TDIST_WORK_H
#define TDIST_WORK_H

#include "tdist/types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tdist_work_state {
  TDIST_WORK_QUEUED = 0, /* handed to the progress thread, not started */
  TDIST_WORK_RUNNING,    /* posted to the backend */
  TDIST_WORK_COMPLETED,  /* success */
  TDIST_WORK_FAILED,     /* error; see tdist_work_status() */
  TDIST_WORK_TIMED_OUT,  /* exceeded its timeout; its group was aborted */
  TDIST_WORK_ABORTED     /* its group was aborted or a peer died */
} tdist_work_state_t;

/*
 * Completion callback. Runs exactly once per registration, after the work
 * reached a terminal state.
 *
 * Which thread: the runtime's progress thread, or the registering thread
 * itself when the work was already complete at registration.
 *
 * What it may call: tdist_work_is_completed/status/state/error_message,
 * tdist_work_release (of any handle, this one included), and submit new
 * operations (submission never blocks). It must not block: no
 * tdist_work_wait on incomplete work, no synchronous collective, no group
 * creation or destruction, no store call. Blocking here stalls every group's
 * progress in the process. Keep it short; hand heavy work to another thread.
 */
typedef void (*tdist_work_cb_t)(tdist_work_t *work, void *arg);

/*
 * tdist_work_is_completed - non-blocking, O(1) test.
 * @return 1 when the work reached a terminal state (success or not), else 0.
 *         On the NCCL backend, 1 means host-visible completion: the end event
 *         has completed and no asynchronous NCCL error was seen.
 */
int tdist_work_is_completed(const tdist_work_t *work);

/*
 * tdist_work_wait - block the calling thread until the work is complete.
 * @param timeout_ms  how long to wait: > 0 milliseconds, 0 means "use the
 *                    operation's own timeout" (the op fails with TIMEOUT at its
 *                    deadline, so this never blocks forever).
 * @return the work's status (0 or a negative error code) once complete;
 *         TDIST_ERR_IN_PROGRESS if timeout_ms elapsed first (the work goes on;
 *         wait again or release it); TDIST_ERR_INVALID_ARGUMENT for NULL.
 */
int tdist_work_wait(tdist_work_t *work, int64_t timeout_ms);

/*
 * tdist_work_wait_stream - make a CUDA stream wait for the work (NCCL backend).
 * The host does not block: `stream` (a cudaStream_t) waits on the work's end
 * event, so kernels enqueued after this call see the result.
 * @return 0; TDIST_ERR_NOT_SUPPORTED for work of a non-CUDA backend (use
 *         tdist_work_wait); TDIST_ERR_CUDA_ERROR if the wait cannot be enqueued;
 *         the work's status if it already failed.
 */
int tdist_work_wait_stream(tdist_work_t *work, void *stream);

/*
 * tdist_work_status - 0 when completed successfully, a negative error code
 * after failure, TDIST_ERR_IN_PROGRESS while queued or running.
 */
int tdist_work_status(const tdist_work_t *work);

/* tdist_work_state - the current state (see the diagram above). */
tdist_work_state_t tdist_work_state(const tdist_work_t *work);

/*
 * tdist_work_error_message - why the work failed, naming the op, group,
 * sequence number and cause, e.g. "all_reduce seq 12 of group 'world'
 * (rank 1/4): timed out after 1000 ms". "" while running or after success,
 * except for a captured work (tdist_work_is_captured), whose message says
 * that it was captured into a CUDA graph. The string lives as long as the
 * handle.
 */
const char *tdist_work_error_message(const tdist_work_t *work);

/* tdist_work_optype / tdist_work_seq - what the work is, its sequence number
 * in its group (the same on every rank for the same collective). */
tdist_optype_t tdist_work_optype(const tdist_work_t *work);
uint64_t tdist_work_seq(const tdist_work_t *work);

/*
 * tdist_work_is_captured - whether the work's op was captured into a CUDA
 * graph (its stream was capturing when it was submitted: see above).
 * @return 1 for a captured work, 0 otherwise (and for NULL). Any thread.
 */
int tdist_work_is_captured(const tdist_work_t *work);

/*
 * tdist_work_status_info - what a completed receive got (MPI_Status): the
 * sender's group rank, its tag and the number of elements received. For a
 * receive posted with TDIST_ANY_SOURCE or TDIST_ANY_TAG (tdist/ops.h) these
 * are what matched (the count may be below the posted one); for a named
 * receive, its own peer, tag and count. Any out-pointer may be NULL.
 * @return 0 once the receive completed successfully; the work's status if
 *         it failed; TDIST_ERR_IN_PROGRESS while it runs;
 *         TDIST_ERR_INVALID_ARGUMENT for NULL or a work that is not a
 *         receive (send, collective, batch).
 */
int tdist_work_status_info(const tdist_work_t *work, int *source, int *tag, size_t *count);

/*
 * tdist_work_on_complete - register a completion callback (see the type for
 * the thread and the rules). One callback per handle: a second registration
 * returns TDIST_ERR_INVALID_STATE. If the work is already complete, `cb` runs
 * now, on the calling thread, before this returns. The callback runs after
 * the work is seen complete, not before: a thread waiting on the work (or
 * testing it) may return while the callback has not run yet or still runs,
 * as with a callback chained on a torch Future. A caller that needs to know
 * the callback finished has the callback say so (a counter, a semaphore).
 * @return 0, TDIST_ERR_INVALID_ARGUMENT (NULL work or cb), or
 *         TDIST_ERR_INVALID_STATE.
 */
int tdist_work_on_complete(tdist_work_t *work, tdist_work_cb_t cb, void *arg);

/*
 * tdist_work_release - drop the caller's reference. The operation itself is
 * not cancelled; the handle returns to the pool once the runtime is done with
 * it. NULL is accepted and ignored. Returns 0.
 */
int tdist_work_release(tdist_work_t *work);

/*
 * tdist_wait_all - wait for every handle in `works` (NULL entries skipped).
 * @param timeout_ms  total budget as for tdist_work_wait (0: each op's own).
 * @return 0 if all succeeded; otherwise the status of the first failed work
 *         in array order; TDIST_ERR_IN_PROGRESS if the budget ran out.
 */
int tdist_wait_all(tdist_work_t *const *works, size_t n, int64_t timeout_ms);

/*
 * tdist_wait_any - wait until at least one handle is complete.
 * @param index  out: the index of a completed work.
 * @return that work's status; TDIST_ERR_IN_PROGRESS on timeout;
 *         TDIST_ERR_INVALID_ARGUMENT if n == 0 or every entry is NULL.
 */
int tdist_wait_any(tdist_work_t *const *works, size_t n, int64_t timeout_ms, size_t *index);

#ifdef __cplusplus
}
#endif
#endif /* TDIST_WORK_H */
