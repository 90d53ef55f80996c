/*
 * error.h - error recording and propagation macros (internal).
 *
 * tdist__error(rc, fmt, ...) records a sentence for tdist_last_error() on the
 * calling thread, logs it at INFO, and returns rc, so a failing path reads
 *
 *     if (count > max) return tdist__error(TDIST_ERR_INVALID_ARGUMENT,
 *                                          "count %zu exceeds %zu", count, max);
 *
 * TDIST_CHECK / TDIST_CHECKGOTO propagate a negative code and log the path it
 * takes on the way up (at INFO), NCCL-style, so a failure deep inside shows
 * where it surfaced:
 *
 *     TDIST_CHECK(store_get(...));
 *     TDIST_CHECKGOTO(connect_peers(...), rc, fail);
 */
#ifndef TDIST_UTIL_ERROR_H
#define TDIST_UTIL_ERROR_H

#include "util/log.h"
#include "tdist/errors.h"

int tdist__error(int rc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Clear this thread's last error (at the start of public entry points that
 * may fail without calling tdist__error). */
void tdist__error_clear(void);

#define TDIST_CHECK(call)                                                       \
  do {                                                                          \
    int rc_ = (call);                                                           \
    if (rc_ < 0) {                                                              \
      TDIST_INFO(CORE, "%s:%d -> %s", __FILE__, __LINE__, tdist_err_name(rc_)); \
      return rc_;                                                               \
    }                                                                           \
  } while (0)

#define TDIST_CHECKGOTO(call, rc, label)                                       \
  do {                                                                         \
    (rc) = (call);                                                             \
    if ((rc) < 0) {                                                            \
      TDIST_INFO(CORE, "%s:%d -> %s", __FILE__, __LINE__, tdist_err_name(rc)); \
      goto label;                                                              \
    }                                                                          \
  } while (0)

#endif
