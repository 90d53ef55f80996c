/*
 * tdist/errors.h - return codes.
 *
 * Every tdist function returns an int: 0 on success, a negative code from the
 * table below on failure. The table is the one place error codes are defined;
 * names, numbers and messages are generated from it.
 *
 * Thread safety: every function here may be called from any thread.
 */
#ifndef TDIST_ERRORS_H
#define TDIST_ERRORS_H

#ifdef __cplusplus
extern "C" {
#endif

/* X(NAME, value, message). Values are stable: new codes are appended. */
#define TDIST_ERRNO_MAP(X)                                                     \
  X(INVALID_ARGUMENT, -1, "invalid argument")                                  \
  X(NO_MEMORY, -2, "out of memory")                                            \
  X(TIMEOUT, -3, "operation timed out")                                        \
  X(ABORTED, -4, "operation aborted")                                          \
  X(REMOTE_FAILED, -5, "a remote rank failed")                                 \
  X(MISMATCH, -6, "ranks disagree on the collective (op, dtype, count, root)") \
  X(CUDA_ERROR, -7, "CUDA error")                                              \
  X(NCCL_ERROR, -8, "NCCL error")                                              \
  X(STORE_ERROR, -9, "key-value store error")                                  \
  X(NOT_SUPPORTED, -10, "operation not supported")                             \
  X(INTERNAL, -11, "internal error")                                           \
  X(IO, -12, "network or I/O error")                                           \
  X(IN_PROGRESS, -13, "operation still in progress")                           \
  X(INVALID_STATE, -14, "object in the wrong state for this call")             \
  X(PROTOCOL, -15, "malformed or unexpected protocol message")                 \
  X(AUTH, -16, "authentication failed")                                        \
  X(NOT_FOUND, -17, "not found")                                               \
  X(CLOSED, -18, "connection or object closed")                                \
  X(TOO_LARGE, -19, "value or message too large")

/* TDIST_ERR_INVALID_ARGUMENT = -1, ... */
enum tdist_errno {
  TDIST_SUCCESS = 0,
#define TDIST_ERRNO_ENUM_(name, val, msg) TDIST_ERR_##name = (val),
  TDIST_ERRNO_MAP(TDIST_ERRNO_ENUM_)
#undef TDIST_ERRNO_ENUM_
      TDIST_ERR_MIN_ = -20 /* one below the lowest code; not an error code */
};

/*
 * tdist_strerror - human-readable message for a return code.
 * @param rc  any value returned by a tdist function.
 * @return    a static string; "success" for 0, "unknown error" for values
 *            outside the table. Never NULL.
 */
const char *tdist_strerror(int rc);

/*
 * tdist_err_name - symbolic name of a return code, e.g. "TDIST_ERR_TIMEOUT".
 * @return a static string; "TDIST_SUCCESS" for 0, "TDIST_ERR_UNKNOWN" for
 *         values outside the table. Never NULL.
 */
const char *tdist_err_name(int rc);

/*
 * tdist_last_error - detail of the last failed call made by this thread.
 *
 * Synchronous calls that fail (bad argument, store timeout, init failure...)
 * record a sentence naming the cause, e.g. "store get 'addr/3' from
 * 127.0.0.1:29500 timed out after 5000 ms". The text is thread-local and
 * overwritten by the next failing call of the same thread. Errors of
 * asynchronous work are read with tdist_work_error_message() instead.
 * @return a thread-local string, "" if nothing failed yet. Never NULL.
 */
const char *tdist_last_error(void);

#ifdef __cplusplus
}
#endif
#endif /* TDIST_ERRORS_H */
