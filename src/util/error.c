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

/* Indexed by tdist_dtype_t / tdist_redop_t (types.h): the designated
 * initialisers keep each entry next to its value as types are appended. */
size_t tdist_dtype_size(tdist_dtype_t d) {
  static const size_t sizes[TDIST_DTYPE_COUNT] = {
      [TDIST_INT8] = 1,    [TDIST_UINT8] = 1,    [TDIST_INT32] = 4,       [TDIST_INT64] = 8,
      [TDIST_FLOAT16] = 2, [TDIST_BFLOAT16] = 2, [TDIST_FLOAT32] = 4,     [TDIST_FLOAT64] = 8,
      [TDIST_UINT32] = 4,  [TDIST_UINT64] = 8,   [TDIST_FLOAT8_E4M3] = 1, [TDIST_FLOAT8_E5M2] = 1,
      [TDIST_BOOL] = 1,    [TDIST_INT16] = 2,    [TDIST_UINT16] = 2};
  return ((unsigned)d < TDIST_DTYPE_COUNT) ? sizes[d] : 0;
}

const char *tdist_dtype_name(tdist_dtype_t d) {
  static const char *names[TDIST_DTYPE_COUNT] = {[TDIST_INT8] = "int8",
                                                 [TDIST_UINT8] = "uint8",
                                                 [TDIST_INT32] = "int32",
                                                 [TDIST_INT64] = "int64",
                                                 [TDIST_FLOAT16] = "float16",
                                                 [TDIST_BFLOAT16] = "bfloat16",
                                                 [TDIST_FLOAT32] = "float32",
                                                 [TDIST_FLOAT64] = "float64",
                                                 [TDIST_UINT32] = "uint32",
                                                 [TDIST_UINT64] = "uint64",
                                                 [TDIST_FLOAT8_E4M3] = "float8_e4m3",
                                                 [TDIST_FLOAT8_E5M2] = "float8_e5m2",
                                                 [TDIST_BOOL] = "bool",
                                                 [TDIST_INT16] = "int16",
                                                 [TDIST_UINT16] = "uint16"};
  return ((unsigned)d < TDIST_DTYPE_COUNT) ? names[d] : "invalid";
}

const char *tdist_redop_name(tdist_redop_t op) {
  static const char *names[TDIST_REDOP_COUNT] = {
      [TDIST_SUM] = "sum",   [TDIST_PROD] = "prod", [TDIST_MIN] = "min",
      [TDIST_MAX] = "max",   [TDIST_AVG] = "avg",   [TDIST_PREMUL_SUM] = "premul_sum",
      [TDIST_BAND] = "band", [TDIST_BOR] = "bor",   [TDIST_BXOR] = "bxor"};
  return ((unsigned)op < TDIST_REDOP_COUNT) ? names[op] : "invalid";
}

const char *tdist_op_name(tdist_optype_t op) {
  static const char *names[TDIST_OPTYPE_COUNT] = {
      "all_reduce",     "broadcast",    "reduce",           "all_gather", "gather",   "scatter",
      "reduce_scatter", "all_to_all",   "barrier",          "send",       "recv",     "batch_p2p",
      "all_to_all_v",   "all_gather_v", "reduce_scatter_v", "gather_v",   "scatter_v"};
  return ((unsigned)op < TDIST_OPTYPE_COUNT) ? names[op] : "invalid";
}

int tdist_version(int *major, int *minor, int *patch) {
  if (major) *major = TDIST_VERSION_MAJOR;
  if (minor) *minor = TDIST_VERSION_MINOR;
  if (patch) *patch = TDIST_VERSION_PATCH;
  return TDIST_VERSION_CODE;
}
