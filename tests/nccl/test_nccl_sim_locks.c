/*
 * test_nccl_sim_locks.c - the NCCL backend's progress thread never waits
 * for a caller inside an NCCL call, nor for NCCL itself; and an aborted op
 * is reported only once NCCL let go of its buffers (issue 39, items 3 and
 * 5). White-box: the test holds the group's `call` lock itself, as a caller
 * blocked in an NCCL call that waits (ncclCommAbort behind a stuck kernel,
 * NCCL_SHRINK_ABORT's stream sync, finalize) would. Before the fix every
 * NCCL call was made under the one mutex the progress thread's abort took,
 * so such a caller stopped the progress thread, and every group with it.
 *
 *   abort_never_waits  world group W with an all_reduce stuck behind a user
 *                      kernel, W's call lock held by another thread for 1.5 s:
 *                      tdist_group_abort(W) returns at once, a second group's
 *                      ops complete meanwhile, and W's op is reported failed
 *                      only after ncclCommAbort returned -- once the user
 *                      kernel ended (released at 2 s), not while NCCL could
 *                      still write its buffer
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "nccl_sim_util.h"

#include "core/group/group.h"
#include "nccl/nccl_backend.h"

static int port;
static atomic_int release_kernel;

/* A user kernel that runs until the test lets it go. */
static void stuck_kernel(void *arg) {
  (void)arg;
  while (!atomic_load(&release_kernel))
    usleep(1000);
}

struct holder {
  pthread_mutex_t *call;
  int ms;
  atomic_int held;
};
static void *hold_call(void *arg) {
  struct holder *h = arg;
  pthread_mutex_lock(h->call);
  atomic_store(&h->held, 1);
  usleep((useconds_t)h->ms * 1000);
  pthread_mutex_unlock(h->call);
  return NULL;
}

static int locks_child(int rank, int n, void *arg) {
  (void)arg;
  (void)n;
  tdist_group_t *w = NULL, *b = NULL;
  MP_CHECK_RC(ns_world(rank, 1, port, 20000, &w));
  int me = 0;
  MP_CHECK_RC(tdist_new_group(w, &me, 1, NULL, &b));
  float h[64] = {1};
  float *d = ns_dev(h, sizeof(h)), *e = ns_dev(h, sizeof(h));
  cudaStream_t s;
  NS_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  NS_CUDA((cudaError_t)tdist_gpusim_launch_kernel(s, stuck_kernel, NULL));
  /* An op of W behind the user kernel: its NCCL kernel is queued, so
   * ncclCommAbort will wait for it. */
  tdist_op_opts_t o = {.mask = TDIST_OP_FIELD_STREAM, .stream = s};
  tdist_work_t *wk = NULL;
  MP_CHECK_RC(tdist_all_reduce(w, d, d, 64, TDIST_FLOAT32, TDIST_SUM, &o, &wk));
  /* A caller inside an NCCL call on W for 1.5 s. */
  tdist__nccl_t *nc = ((tdist_group_t *)w)->bstate;
  struct holder hd = {&nc->call, 1500, 0};
  pthread_t t;
  MP_CHECK(pthread_create(&t, NULL, hold_call, &hd) == 0);
  while (!atomic_load(&hd.held))
    usleep(100);
  long long t0 = ns_now_ms();
  MP_CHECK_RC(tdist_group_abort(w, "test"));
  long long took = ns_now_ms() - t0;
  fprintf(stderr, "locks: tdist_group_abort took %lld ms\n", took);
  MP_CHECK(took < 500);
  /* The progress thread serves the other group meanwhile. */
  for (int i = 0; i < 20; i++) {
    long long t1 = ns_now_ms();
    MP_CHECK_RC(tdist_all_reduce(b, e, e, 64, TDIST_FLOAT32, TDIST_SUM, NULL, NULL));
    MP_CHECK(ns_now_ms() - t1 < 500);
  }
  /* W's op: not reported while NCCL may still write d (its abort waits for
   * the kernel behind the user's); reported once the user kernel ends. */
  usleep(2000 * 1000); /* past the holder's 1.5 s: the abort thread is in ncclCommAbort */
  MP_CHECK(!tdist_work_is_completed(wk));
  long long t2 = ns_now_ms();
  atomic_store(&release_kernel, 1);
  int rc = tdist_work_wait(wk, 20000);
  fprintf(stderr, "locks: W's op %s %lld ms after the kernel ended: %s\n", tdist_err_name(rc),
          ns_now_ms() - t2, tdist_work_error_message(wk));
  MP_CHECK(rc == TDIST_ERR_ABORTED);
  MP_CHECK(ns_now_ms() - t0 >= 1900);
  tdist_work_release(wk);
  pthread_join(t, NULL);
  MP_CHECK_RC(tdist_group_destroy(b));
  tdist_group_destroy(w);
  MP_CHECK(tdist_gpusim_comm_violations() == 0);
  return 0;
}
static void abort_never_waits(void **s) {
  (void)s;
  port = tdist_mp_free_port();
  assert_int_equal(tdist_mp_run(1, locks_child, NULL, 60), 0);
}

int main(int argc, char **argv) {
  setenv("TDIST_TRACE_ON_FAILURE", "0", 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(abort_never_waits),
  };
  if (argc > 1) cmocka_set_test_filter(argv[1]);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
