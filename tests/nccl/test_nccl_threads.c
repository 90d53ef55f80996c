/*
 * test_nccl_threads.c - the NCCL backend under concurrent use (also run under
 * TSan, label "threads"), NCCL and CUDA scripted by fake_nccl.c:
 *   - several caller threads submit ops on one group while the progress
 *     thread polls and completion callbacks submit more ops: every op
 *     completes once, and the fake never sees two threads inside calls on the
 *     same communicator (the per-communicator mutex serialises them);
 *   - tdist_work_wait_stream races with completion and event recycling: it
 *     either enqueues a wait on the op's own end event or sees it complete.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <unistd.h>

#include <cmocka.h>

#include "nccl_test_util.h"

#define THREADS 3
#define PER_THREAD 150

static tdist_group_t *world;
static char buf[256];
static atomic_int cb_runs, cb_submits;

static void on_done(tdist_work_t *w, void *arg) {
  /* Allowed in a callback: submitting (never blocks), releasing. */
  if (tdist_work_status(w) == 0 && (tdist_work_seq(w) % 5) == 0) {
    tdist_work_t *x = NULL;
    if (tdist_all_reduce(world, buf, buf, 1, TDIST_INT32, TDIST_SUM, NULL, &x) == 0) {
      atomic_fetch_add(&cb_submits, 1);
      tdist_work_release(x);
    }
  }
  atomic_fetch_add(&cb_runs, 1); /* last: the test counts submits after this */
}

static void *submitter(void *arg) {
  tdist_work_t *w[PER_THREAD];
  long bad = 0;
  for (int i = 0; i < PER_THREAD; i++) {
    int rc = (i % 3 == 0)
                 ? tdist_broadcast(world, buf, 4, TDIST_FLOAT32, 0, NULL, &w[i])
                 : tdist_all_reduce(world, buf, buf, 4, TDIST_FLOAT32, TDIST_SUM, NULL, &w[i]);
    if (rc != 0) {
      w[i] = NULL;
      bad++;
      continue;
    }
    if (i % 2) tdist_work_on_complete(w[i], on_done, NULL);
    /* Race a stream-ordered wait with the progress thread's completion. */
    int ws = tdist_work_wait_stream(w[i], (void *)(uintptr_t)0x7700);
    if (ws != 0) bad++;
  }
  if (tdist_wait_all(w, PER_THREAD, 20000) != 0) bad++;
  for (int i = 0; i < PER_THREAD; i++) {
    if (w[i] && tdist_work_state(w[i]) != TDIST_WORK_COMPLETED) bad++;
    tdist_work_release(w[i]);
  }
  return (void *)bad;
}

/* Completes end events a few at a time, so completion interleaves with
 * submission instead of happening at record time. */
static atomic_int stop;
static void *completer(void *arg) {
  while (!atomic_load(&stop)) {
    fake_complete_events(3);
    usleep(50);
  }
  return NULL;
}

static void test_concurrent_submit(void **state) {
  fake_reset();
  assert_int_equal(nt_world(0, 1, tdist_mp_free_port(), 20000, &world), 0);
  fake_script_t sc = {.ev_mode = FAKE_EV_MANUAL, .slow_us = 5};
  fake_set_script(&sc);
  pthread_t th[THREADS], comp;
  pthread_create(&comp, NULL, completer, NULL);
  for (int i = 0; i < THREADS; i++)
    pthread_create(&th[i], NULL, submitter, NULL);
  long bad = 0;
  for (int i = 0; i < THREADS; i++) {
    void *r;
    pthread_join(th[i], &r);
    bad += (long)r;
  }
  /* A waiter may wake before the callback ran: wait for every callback, then
   * drain the ops they submitted with a barrier behind them. */
  for (int i = 0; i < 20000 && atomic_load(&cb_runs) < THREADS * (PER_THREAD / 2); i++)
    usleep(1000);
  assert_int_equal(tdist_barrier(world, NULL, NULL), 0);
  atomic_store(&stop, 1);
  pthread_join(comp, NULL);
  assert_int_equal(bad, 0);
  int ops = fake_count("ncclAllReduce") + fake_count("ncclBroadcast");
  assert_int_equal(ops, THREADS * PER_THREAD + atomic_load(&cb_submits) + 1);
  assert_int_equal(atomic_load(&cb_runs), THREADS * (PER_THREAD / 2));
  assert_int_equal(fake_violations(), 0);
  assert_int_equal(tdist_group_destroy(world), 0);
  assert_int_equal(fake_count("cudaEventDestroy"), fake_count("cudaEventCreateWithFlags"));
  assert_int_equal(fake_violations(), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_concurrent_submit),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
