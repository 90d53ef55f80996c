/*
 * error.c - the error table's strings, the thread-local last-error text, and
 * the small name tables of the public types (dtypes, reductions, ops).
 */
#include "util/error.h"

#include <stdarg.h>
#include <stdio.h>

#include "tdist/types.h"
#include "tdist/version.h"

static _Thread_local char last_error[512];

const char *tdist_strerror(int rc) {
  switch (rc) {
  case 0: return "success";
#define TDIST_STRERROR_CASE_(name, val, msg) \
  case val: return msg;
    TDIST_ERRNO_MAP(TDIST_STRERROR_CASE_)
#undef TDIST_STRERROR_CASE_
  default: return "unknown error";
  }
}

const char *tdist_err_name(int rc) {
  switch (rc) {
  case 0: return "TDIST_SUCCESS";
#define TDIST_ERRNAME_CASE_(name, val, msg) \
  case val: return "TDIST_ERR_" #name;
    TDIST_ERRNO_MAP(TDIST_ERRNAME_CASE_)
#undef TDIST_ERRNAME_CASE_
  default: return "TDIST_ERR_UNKNOWN";
  }
}

const char *tdist_last_error(void) { return last_error; }

void tdist__error_clear(void) { last_error[0] = '\0'; }

int tdist__error(int rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof(last_error), fmt, ap);
  va_end(ap);
  TDIST_INFO(CORE, "%s: %s", tdist_err_name(rc), last_error);
  return rc;
}

size_t tdist_dtype_size(tdist_dtype_t d) {
  static const size_t sizes[TDIST_DTYPE_COUNT] = {1, 1, 4, 8, 2, 2, 4, 8};
  return ((unsigned)d < TDIST_DTYPE_COUNT) ? sizes[d] : 0;
}

const char *tdist_dtype_name(tdist_dtype_t d) {
  static const char *names[TDIST_DTYPE_COUNT] = {"int8",    "uint8",    "int32",   "int64",
                                                 "float16", "bfloat16", "float32", "float64"};
  return ((unsigned)d < TDIST_DTYPE_COUNT) ? names[d] : "invalid";
}

const char *tdist_redop_name(tdist_redop_t op) {
  static const char *names[TDIST_REDOP_COUNT] = {"sum", "prod", "min", "max", "avg", "premul_sum"};
  return ((unsigned)op < TDIST_REDOP_COUNT) ? names[op] : "invalid";
}

const char *tdist_op_name(tdist_optype_t op) {
  static const char *names[TDIST_OPTYPE_COUNT] = {
      "all_reduce",     "broadcast",  "reduce",  "all_gather", "gather", "scatter",
      "reduce_scatter", "all_to_all", "barrier", "send",       "recv",   "batch_p2p"};
  return ((unsigned)op < TDIST_OPTYPE_COUNT) ? names[op] : "invalid";
}

int tdist_version(int *major, int *minor, int *patch) {
  if (major) *major = TDIST_VERSION_MAJOR;
  if (minor) *minor = TDIST_VERSION_MINOR;
  if (patch) *patch = TDIST_VERSION_PATCH;
  return TDIST_VERSION_CODE;
}
