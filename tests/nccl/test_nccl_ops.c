/*
 * test_nccl_ops.c - the NCCL backend with a library too old for a type: the
 * scripted fake (fake_nccl.c, loaded as libfake_nccl.so) reporting NCCL
 * 2.23 (ctest's nccl_ops_2_23), which has no float8 types: they are refused
 * at submit naming the version, and no NCCL call is made. The fake reports
 * 2.28 when run without FAKE_NCCL_VERSION: the call then goes through.
 *
 * Also a runtime without the CUDA graph capture calls: capture refused.
 *
 * What an op does and moves runs on the simulated GPU instead
 * (test_nccl_sim.c): the fake is kept only for what the simulation cannot
 * be, an NCCL that lacks something. One rank over a real TCP store.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "nccl_test_util.h"

static tdist_group_t *world;
static char hostbuf[4096];

static int setup(void **state) {
  fake_reset();
  int rc = nt_world(0, 1, tdist_mp_free_port(), 10000, &world);
  if (rc) fprintf(stderr, "init: %s\n", tdist_last_error());
  return rc;
}

static int teardown(void **state) {
  int rc = tdist_group_destroy(world);
  world = NULL;
  return rc || fake_violations();
}

/* The fake reports NCCL 2.23 (nccl_ops_2_23): no float8 types. */
static int before_fp8(void) {
  const char *v = getenv("FAKE_NCCL_VERSION");
  return v && atoi(v) < 22400;
}
/* The float8 types need NCCL 2.24: ctest runs this program again with the
 * fake reporting 2.23 (nccl_ops_2_23), where they are refused at submit. */
static void test_fp8_version(void **state) {
  int old = before_fp8();
  for (int dt = TDIST_FLOAT8_E4M3; dt <= TDIST_FLOAT8_E5M2; dt++) {
    int from = fake_log_size();
    int rc = tdist_all_gather(world, hostbuf, hostbuf, 5, (tdist_dtype_t)dt, NULL, NULL);
    if (old) {
      assert_int_equal(rc, TDIST_ERR_NOT_SUPPORTED);
      assert_non_null(strstr(tdist_last_error(), "NCCL 2.24"));
      assert_int_equal(fake_find("ncclAllGather", from), -1);
    } else {
      assert_int_equal(rc, 0);
      assert_int_equal(fake_log_get(fake_find("ncclAllGather", from)).b,
                       dt == TDIST_FLOAT8_E4M3 ? ncclFloat8e4m3 : ncclFloat8e5m2);
    }
  }
}

/* A CUDA runtime without the capture calls (the fake has none): an op on a
 * capturing stream is refused, naming the first call missing, and no NCCL
 * call is made; the group stays good. */
static void test_capture_without_calls(void **state) {
  int from = fake_log_size();
  tdist_op_opts_t o = {.mask = TDIST_OP_FIELD_STREAM, .stream = FAKE_CAPTURING_STREAM};
  int rc = tdist_all_reduce(world, hostbuf, hostbuf, 4, TDIST_FLOAT32, TDIST_SUM, &o, NULL);
  assert_int_equal(rc, TDIST_ERR_NOT_SUPPORTED);
  assert_non_null(strstr(tdist_last_error(), "has no cudaStreamGetCaptureInfo"));
  assert_int_equal(fake_find("ncclAllReduce", from), -1);
  assert_int_equal(tdist_group_is_aborted(world), 0);
}

int main(int argc, char **argv) {
  if (argc > 1) cmocka_set_test_filter(argv[1]);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_fp8_version, setup, teardown),
      cmocka_unit_test_setup_teardown(test_capture_without_calls, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
