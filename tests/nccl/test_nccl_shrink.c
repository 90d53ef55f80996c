/*
 * test_nccl_shrink.c - recovery on the NCCL backend (fake NCCL/CUDA, real
 * processes and a real TCP store): rank 2 of 3 is killed; the store declares
 * it dead; the survivors' communicator is revoked (ncclCommRevoke, not
 * aborted, so it can be shrunk); tdist_group_shrink calls ncclCommShrink
 * excluding rank 2 (NCCL_SHRINK_DEFAULT on a revoked communicator), and the
 * new group runs an all_reduce; destroy aborts the revoked parent (on the
 * caller's thread: the fake counts a violation for an abort on the progress
 * thread).
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmocka.h>

#include "nccl_test_util.h"

static int port;

static int shrink_child(int rank, int n, void *arg) {
  fake_reset();
  tdist_group_t *g = NULL, *s = NULL;
  MP_CHECK_RC(nt_world(rank, n, port, 20000, &g));
  tdist_store_t *st;
  tdist_store_opts_t o = {.mask = TDIST_STORE_FIELD_TIMEOUT, .timeout_ms = 20000};
  MP_CHECK_RC(tdist_store_connect("127.0.0.1", port, &o, &st));
  MP_CHECK_RC(tdist_store_add(st, "test/ready", 1, NULL));
  const char *k = "test/ready";
  int64_t ready = 0;
  for (int i = 0; i < 2000 && ready < n; i++) {
    tdist_store_add(st, k, 0, &ready);
    usleep(2000);
  }
  if (rank == 2) raise(SIGKILL);
  for (int i = 0; i < 1000 && !tdist_group_is_aborted(g); i++)
    usleep(10000);
  MP_CHECK(tdist_group_is_aborted(g));
  /* The group reads as aborted a moment before the backend's abort (which
   * revokes, on the progress thread) has run. */
  MP_CHECK(nt_wait_count("ncclCommRevoke", 1, 5000) == 1);
  MP_CHECK(fake_count("ncclCommAbort") == 0);
  MP_CHECK(tdist_barrier(g, NULL, NULL) == TDIST_ERR_REMOTE_FAILED);

  MP_CHECK_RC(tdist_group_shrink(g, NULL, &s));
  int i = fake_find("ncclCommShrink", 0);
  MP_CHECK(i >= 0);
  fake_call_t c = fake_log_get(i);
  MP_CHECK(c.a == 2);                   /* excluded rank */
  MP_CHECK(c.b == NCCL_SHRINK_DEFAULT); /* the parent was revoked */
  MP_CHECK(tdist_group_size(s) == 2 && tdist_group_rank(s) == rank);
  float x[4] = {1, 2, 3, 4};
  MP_CHECK_RC(tdist_all_reduce(s, x, x, 4, TDIST_FLOAT32, TDIST_SUM, NULL, NULL));
  MP_CHECK(fake_count("ncclAllReduce") == 1);
  MP_CHECK_RC(tdist_store_add(st, "test/done", 1, NULL));
  int64_t done = 0;
  for (int j = 0; j < 2000 && done < 2; j++) {
    tdist_store_add(st, "test/done", 0, &done);
    usleep(2000);
  }
  tdist_store_release(st);
  MP_CHECK_RC(tdist_group_destroy(s));
  tdist_group_destroy(g);
  MP_CHECK(fake_count("ncclCommAbort") == 1); /* the revoked parent */
  MP_CHECK(fake_violations() == 0);
  return 0;
}

static void survivors_shrink_the_communicator(void **state) {
  (void)state;
  port = tdist_mp_free_port();
  int codes[3];
  tdist_mp_run_codes(3, shrink_child, NULL, 60, codes);
  assert_int_equal(codes[0], 0);
  assert_int_equal(codes[1], 0);
  assert_int_equal(codes[2], 128 + SIGKILL);
}

int main(void) {
  setenv("TDIST_TRACE_ON_FAILURE", "0", 1);
  const struct CMUnitTest tests[] = {cmocka_unit_test(survivors_shrink_the_communicator)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
