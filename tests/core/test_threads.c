/*
 * test_threads.c - many threads submitting at once to one group and to
 * several groups: every op completes exactly once, every callback runs once,
 * nothing is lost or doubled (run under TSan in CI).
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/group/group.h"
#include "tb_world.h"
#include "test_backend.h"
#include "tdist/tdist.h"

#define THREADS 8
#define OPS 4000

static tdist_group_t *groups[2];
static atomic_long callbacks;

static void count_cb(tdist_work_t *w, void *arg) {
  (void)w;
  atomic_fetch_add((atomic_long *)arg, 1);
}

static void *submitter(void *arg) {
  long id = (long)arg;
  tdist_group_t *g = groups[id % 2];
  tdist_work_t *window[16];
  int n = 0;
  long failures = 0;
  for (int i = 0; i < OPS; i++) {
    tdist_work_t *w;
    if (tdist_barrier(g, NULL, &w) != 0) {
      failures++;
      continue;
    }
    if (i % 3 == 0) tdist_work_on_complete(w, count_cb, &callbacks);
    window[n++] = w;
    if (n == 16) {
      if (tdist_wait_all(window, (size_t)n, 10000) != 0) failures++;
      for (int j = 0; j < n; j++)
        tdist_work_release(window[j]);
      n = 0;
    }
  }
  if (tdist_wait_all(window, (size_t)n, 10000) != 0) failures++;
  for (int j = 0; j < n; j++)
    tdist_work_release(window[j]);
  return (void *)failures;
}

static void many_threads_submit(void **state) {
  (void)state;
  tb_set_mode(TB_POLL); /* completions come from the poller, racing submitters */
  assert_int_equal(tb_group_create(0, 2, 30000, &groups[0]), 0);
  assert_int_equal(tb_group_create(0, 2, 30000, &groups[1]), 0);
  int posts0 = tb_post_count();
  pthread_t t[THREADS];
  for (long i = 0; i < THREADS; i++)
    pthread_create(&t[i], NULL, submitter, (void *)i);
  long failures = 0;
  for (int i = 0; i < THREADS; i++) {
    void *ret;
    pthread_join(t[i], &ret);
    failures += (long)ret;
  }
  assert_int_equal(failures, 0);
  assert_int_equal(tb_post_count() - posts0, THREADS * OPS);
  long expected_cb = (long)THREADS * ((OPS + 2) / 3);
  /* A callback runs after its work is seen complete (tdist/work.h): the last
   * ones may still be due when the waits returned. */
  for (int ms = 0; ms < 10000 && atomic_load(&callbacks) < expected_cb; ms++)
    usleep(1000);
  assert_int_equal(atomic_load(&callbacks), expected_cb);
  /* sequence numbers: each group handed out exactly its share */
  assert_int_equal(atomic_load(&groups[0]->next_seq) + atomic_load(&groups[1]->next_seq),
                   THREADS * OPS);
  assert_int_equal(tdist_group_destroy(groups[0]), 0);
  assert_int_equal(tdist_group_destroy(groups[1]), 0);
  tb_set_mode(TB_COMPLETE);
}

static void create_and_destroy_groups_repeatedly(void **state) {
  (void)state;
  /* The progress thread starts with the first group and stops with the last. */
  for (int i = 0; i < 20; i++) {
    tdist_group_t *g;
    assert_int_equal(tb_group_create(0, 1, 5000, &g), 0);
    assert_int_equal(tdist_barrier(g, NULL, NULL), 0);
    assert_int_equal(tdist_group_destroy(g), 0);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(many_threads_submit),
      cmocka_unit_test(create_and_destroy_groups_repeatedly),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
