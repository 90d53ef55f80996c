/* test_errors.c - the error table, type names and version. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "util/error.h"
#include "tdist/tdist.h"

static void every_code_has_a_name_and_message(void **state) {
  (void)state;
  int seen = 0;
#define CHECK_CODE(name, val, msg)                              \
  assert_string_equal(tdist_strerror(val), msg);                \
  assert_string_equal(tdist_err_name(val), "TDIST_ERR_" #name); \
  assert_true((val) < 0 && (val) > TDIST_ERR_MIN_);             \
  seen++;
  TDIST_ERRNO_MAP(CHECK_CODE)
#undef CHECK_CODE
  assert_true(seen >= 19);
  assert_string_equal(tdist_strerror(0), "success");
  assert_string_equal(tdist_err_name(0), "TDIST_SUCCESS");
  assert_string_equal(tdist_strerror(-999), "unknown error");
  assert_string_equal(tdist_err_name(42), "TDIST_ERR_UNKNOWN");
}

static void codes_are_distinct(void **state) {
  (void)state;
  int codes[] = {
#define LIST_CODE(name, val, msg) val,
      TDIST_ERRNO_MAP(LIST_CODE)
#undef LIST_CODE
  };
  size_t n = sizeof(codes) / sizeof(codes[0]);
  for (size_t i = 0; i < n; i++)
    for (size_t j = i + 1; j < n; j++)
      assert_int_not_equal(codes[i], codes[j]);
}

static void last_error_is_thread_local_text(void **state) {
  (void)state;
  tdist__error_clear();
  assert_string_equal(tdist_last_error(), "");
  int rc = tdist__error(TDIST_ERR_TIMEOUT, "waited %d ms for '%s'", 5, "key");
  assert_int_equal(rc, TDIST_ERR_TIMEOUT);
  assert_string_equal(tdist_last_error(), "waited 5 ms for 'key'");
}

static void dtypes_and_ops(void **state) {
  (void)state;
  assert_int_equal(tdist_dtype_size(TDIST_INT8), 1);
  assert_int_equal(tdist_dtype_size(TDIST_UINT8), 1);
  assert_int_equal(tdist_dtype_size(TDIST_INT32), 4);
  assert_int_equal(tdist_dtype_size(TDIST_INT64), 8);
  assert_int_equal(tdist_dtype_size(TDIST_FLOAT16), 2);
  assert_int_equal(tdist_dtype_size(TDIST_BFLOAT16), 2);
  assert_int_equal(tdist_dtype_size(TDIST_FLOAT32), 4);
  assert_int_equal(tdist_dtype_size(TDIST_FLOAT64), 8);
  assert_int_equal(tdist_dtype_size(TDIST_DTYPE_COUNT), 0);
  assert_string_equal(tdist_dtype_name(TDIST_BFLOAT16), "bfloat16");
  assert_string_equal(tdist_dtype_name((tdist_dtype_t)99), "invalid");
  assert_string_equal(tdist_redop_name(TDIST_PREMUL_SUM), "premul_sum");
  assert_string_equal(tdist_op_name(TDIST_OP_REDUCE_SCATTER), "reduce_scatter");
  assert_string_equal(tdist_op_name(TDIST_OP_BATCH_P2P), "batch_p2p");
  assert_string_equal(tdist_op_name((tdist_optype_t)-1), "invalid");
}

static void version(void **state) {
  (void)state;
  int ma = -1, mi = -1, pa = -1;
  assert_int_equal(tdist_version(&ma, &mi, &pa), TDIST_VERSION_CODE);
  assert_int_equal(ma, TDIST_VERSION_MAJOR);
  assert_int_equal(mi, TDIST_VERSION_MINOR);
  assert_int_equal(pa, TDIST_VERSION_PATCH);
  assert_non_null(strstr(tdist_version_string(), "cpu"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(every_code_has_a_name_and_message),
      cmocka_unit_test(codes_are_distinct),
      cmocka_unit_test(last_error_is_thread_local_text),
      cmocka_unit_test(dtypes_and_ops),
      cmocka_unit_test(version),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
