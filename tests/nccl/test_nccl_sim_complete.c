/*
 * test_nccl_sim_complete.c - caller-observed completion on the NCCL backend
 * (src/core/work/work.c, backend.h vtable->test), on the simulated GPU.
 *
 * A thread that waits on an NCCL op, or tests it, sees its end event
 * complete itself and publishes the success, without the progress thread;
 * the progress thread later finishes the work (its callback, the trace).
 * The scenario proves it by keeping the progress thread busy: a completion
 * callback that blocks (test only: callbacks must not block) holds it while
 * the op completes, and the waits must still return. Then:
 *   - the blocked progress thread, once free, runs the op's own callback
 *     exactly once and keeps the status;
 *   - two threads waiting on the same op both return 0;
 *   - a wait that times out before the op completes says IN_PROGRESS;
 *   - tdist_work_is_completed, polled, turns true while the progress thread
 *     is still blocked; an op submitted meanwhile (never started by the
 *     progress thread) is not claimed, and completes once it is free;
 *   - the results are right (checked against the host reference), and a
 *     failing op is never reported as success (a peer that never arrives:
 *     the waits give TIMEOUT/ABORTED, not 0).
 * Every check is made through the public API, in real processes over a
 * real TCP store (tests/support/mp.c).
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <unistd.h>

#include <setjmp.h>
#include <cmocka.h>

#include "nccl_sim_util.h"

static int port;

/* A user kernel (tdist_gpusim_launch_kernel) on a stream: blocks the stream
 * until `open` is set (bounded: a broken test must not hang the suite). */
typedef struct gate {
  atomic_int open, reached;
} gate_t;
static void gate_fn(void *p) {
  gate_t *g = p;
  atomic_store(&g->reached, 1);
  for (int i = 0; i < 20000 && !atomic_load(&g->open); i++)
    usleep(500);
}

/* The callback that holds the progress thread until released. */
static atomic_int in_block_cb, release_cb, block_cb_runs;
static void block_cb(tdist_work_t *w, void *arg) {
  (void)w;
  (void)arg;
  atomic_store(&in_block_cb, 1);
  for (int i = 0; i < 20000 && !atomic_load(&release_cb); i++)
    usleep(500);
  atomic_fetch_add(&block_cb_runs, 1);
}

/* The callback of the op completed by its caller. */
static atomic_int b_cb_runs, b_cb_status;
static void b_cb(tdist_work_t *w, void *arg) {
  (void)arg;
  atomic_store(&b_cb_status, tdist_work_status(w));
  atomic_fetch_add(&b_cb_runs, 1);
}

typedef struct waiter {
  tdist_work_t *w;
  int rc;
} waiter_t;
static void *wait_main(void *p) {
  waiter_t *x = p;
  x->rc = tdist_work_wait(x->w, 20000);
  return NULL;
}

static int check_sum(const float *dev, int n, int count, float scale) {
  float got[16];
  MP_CHECK(count <= 16);
  MP_CHECK_RC(ns_get(got, dev, sizeof(float) * (size_t)count));
  for (int i = 0; i < count; i++) {
    float want = 0;
    for (int r = 0; r < n; r++)
      want += scale * (float)(r + 1) * (float)(i + 1);
    if (got[i] != want) {
      fprintf(stderr, "[pid %d] element %d: %g, want %g\n", (int)getpid(), i, got[i], want);
      return 1;
    }
  }
  return 0;
}

static int busy_progress_child(int rank, int n, void *arg) {
  (void)arg;
  tdist_group_t *g = NULL;
  MP_CHECK_RC(ns_world(rank, n, port, 20000, &g));
  float hc[16], hb[16];
  for (int i = 0; i < 16; i++) {
    hc[i] = (float)(rank + 1) * (float)(i + 1);
    hb[i] = 2.0f * hc[i];
  }
  float *c = ns_dev(hc, sizeof(hc)), *b = ns_dev(hb, sizeof(hb));
  MP_CHECK(c && b);
  cudaStream_t s;
  NS_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  tdist_op_opts_t o = {.mask = TDIST_OP_FIELD_STREAM, .stream = s};

  /* s: [gate1] C [gate2] B. C's callback blocks the progress thread; B
   * completes only once that happened. */
  gate_t g1 = {0}, g2 = {0}, g3 = {0};
  NS_CUDA((cudaError_t)tdist_gpusim_launch_kernel(s, gate_fn, &g1));
  tdist_work_t *wc = NULL, *wb = NULL, *we = NULL;
  MP_CHECK_RC(tdist_all_reduce(g, c, c, 16, TDIST_FLOAT32, TDIST_SUM, &o, &wc));
  MP_CHECK_RC(tdist_work_on_complete(wc, block_cb, NULL));
  NS_CUDA((cudaError_t)tdist_gpusim_launch_kernel(s, gate_fn, &g2));
  MP_CHECK_RC(tdist_all_reduce(g, b, b, 16, TDIST_FLOAT32, TDIST_SUM, &o, &wb));
  MP_CHECK_RC(tdist_work_on_complete(wb, b_cb, NULL));
  NS_CUDA((cudaError_t)tdist_gpusim_launch_kernel(s, gate_fn, &g3));
  MP_CHECK_RC(tdist_all_reduce(g, b, b, 16, TDIST_FLOAT32, TDIST_SUM, &o, &we));
  /* Started by the progress thread (posted): only then may a caller claim. */
  NS_WAIT_FOR(tdist_work_state(we) == TDIST_WORK_RUNNING, 10000);
  MP_CHECK(tdist_work_state(wb) == TDIST_WORK_RUNNING);
  MP_CHECK(tdist_work_state(we) == TDIST_WORK_RUNNING);
  /* Not done yet: a wait with a timeout gives up and says so. */
  NS_EXPECT(tdist_work_wait(wb, 30), TDIST_ERR_IN_PROGRESS);
  MP_CHECK(tdist_work_is_completed(wb) == 0);

  atomic_store(&g1.open, 1);
  NS_WAIT_FOR(atomic_load(&in_block_cb), 10000);
  MP_CHECK(atomic_load(&in_block_cb) == 1);
  MP_CHECK_RC(tdist_work_status(wc));

  /* The progress thread is held in block_cb: B's completion can reach the
   * waiters only through their own test. Two waiters on one op. */
  waiter_t x1 = {wb, 1}, x2 = {wb, 1};
  pthread_t t1, t2;
  MP_CHECK(pthread_create(&t1, NULL, wait_main, &x1) == 0);
  MP_CHECK(pthread_create(&t2, NULL, wait_main, &x2) == 0);
  usleep(20000); /* let them block (either order is fine) */
  atomic_store(&g2.open, 1);
  pthread_join(t1, NULL);
  pthread_join(t2, NULL);
  MP_CHECK_RC(x1.rc);
  MP_CHECK_RC(x2.rc);
  MP_CHECK(atomic_load(&block_cb_runs) == 0); /* still held */
  MP_CHECK(tdist_work_is_completed(wb) == 1);
  MP_CHECK(tdist_work_state(wb) == TDIST_WORK_COMPLETED);
  MP_CHECK(tdist_work_error_message(wb)[0] == '\0');
  MP_CHECK(atomic_load(&b_cb_runs) == 0); /* the callback is the progress thread's */
  if (check_sum(b, n, 16, 2.0f)) return 1;

  /* E, polled with is_completed while the progress thread is still held:
   * turns true by the poller's own test. */
  MP_CHECK(tdist_work_is_completed(we) == 0);
  atomic_store(&g3.open, 1);
  for (int i = 0; i < 400000 && !tdist_work_is_completed(we); i++)
    usleep(25);
  MP_CHECK(tdist_work_is_completed(we) == 1);
  MP_CHECK(atomic_load(&block_cb_runs) == 0); /* still held */
  MP_CHECK_RC(tdist_work_status(we));
  if (check_sum(b, n, 16, 2.0f * (float)n)) return 1;

  /* D, submitted while the progress thread is held: never posted, so no
   * caller may claim it (the progress thread would mark it RUNNING after
   * the claim); it completes once the thread is free. */
  tdist_work_t *wd = NULL;
  MP_CHECK_RC(tdist_all_reduce(g, c, c, 16, TDIST_FLOAT32, TDIST_SUM, &o, &wd));
  usleep(20000); /* ran on the GPU by now, most likely */
  MP_CHECK(tdist_work_is_completed(wd) == 0);
  MP_CHECK(tdist_work_state(wd) == TDIST_WORK_QUEUED);

  atomic_store(&release_cb, 1);
  NS_WAIT_FOR(atomic_load(&b_cb_runs) == 1, 10000);
  MP_CHECK(atomic_load(&block_cb_runs) == 1);
  MP_CHECK(atomic_load(&b_cb_runs) == 1);
  MP_CHECK(atomic_load(&b_cb_status) == 0);
  MP_CHECK_RC(tdist_work_wait(wd, 20000));
  MP_CHECK_RC(tdist_work_status(wb));
  tdist_work_release(wb);
  tdist_work_release(wc);
  tdist_work_release(wd);
  tdist_work_release(we);
  /* C then D summed c twice: n * (n * x). */
  if (check_sum(c, n, 16, (float)n)) return 1;
  usleep(50000);
  MP_CHECK(atomic_load(&b_cb_runs) == 1); /* exactly once */

  MP_CHECK(tdist_gpusim_comm_violations() == 0);
  MP_CHECK_RC(tdist_group_destroy(g));
  NS_CUDA(cudaStreamDestroy(s));
  cudaFree(c);
  cudaFree(b);
  return 0;
}

/* Failures stay the progress thread's: an op a peer never joins is never
 * claimed as success by a waiter that tests it. */
static int never_success_child(int rank, int n, void *arg) {
  (void)arg;
  tdist_group_t *g = NULL;
  MP_CHECK_RC(ns_world(rank, n, port, 20000, &g));
  float *d = ns_dev(NULL, 64);
  MP_CHECK_RC(tdist_all_reduce(g, d, d, 4, TDIST_FLOAT32, TDIST_SUM, NULL, NULL));
  MP_CHECK_RC(ns_sync(g, "warm", 10000));
  MP_CHECK_RC(tdist_group_set_timeout(g, 300));
  if (rank == 0) {
    tdist_work_t *w = NULL;
    MP_CHECK_RC(tdist_all_reduce(g, d, d, 4, TDIST_FLOAT32, TDIST_SUM, NULL, &w));
    int polls = 0;
    while (!tdist_work_is_completed(w) && polls < 200000) {
      polls++;
      usleep(20);
    }
    int rc = tdist_work_wait(w, 0);
    if (rc != TDIST_ERR_TIMEOUT && rc != TDIST_ERR_ABORTED) {
      fprintf(stderr, "[pid %d] the unmatched op ended with %s (%s)\n", (int)getpid(),
              tdist_err_name(rc), tdist_work_error_message(w));
      return 1;
    }
    MP_CHECK(tdist_work_state(w) != TDIST_WORK_COMPLETED);
    tdist_work_release(w);
  } else {
    NS_WAIT_FOR(tdist_group_is_aborted(g), 10000);
    MP_CHECK(tdist_group_is_aborted(g));
  }
  tdist_group_destroy(g);
  cudaFree(d);
  return 0;
}

static void run_n(int n, tdist_mp_fn fn, int timeout_s) {
  port = tdist_mp_free_port();
  assert_int_equal(tdist_mp_run(n, fn, NULL, timeout_s), 0);
}

static void busy_progress_n1(void **s) {
  (void)s;
  run_n(1, busy_progress_child, 60);
}
static void busy_progress_n2(void **s) {
  (void)s;
  run_n(2, busy_progress_child, 60);
}
static void never_success(void **s) {
  (void)s;
  run_n(2, never_success_child, 60);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(busy_progress_n1),
      cmocka_unit_test(busy_progress_n2),
      cmocka_unit_test(never_success),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
