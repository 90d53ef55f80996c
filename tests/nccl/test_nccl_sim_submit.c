/*
 * test_nccl_sim_submit.c - what an NCCL submit costs the calling thread, by
 * count (issue 39, item 6): tdist's submit path creates no thread and never
 * sleeps. The program interposes pthread_create, nanosleep, clock_nanosleep
 * and usleep (its own definitions win for the statically linked library,
 * and, exported, for libtdist_gpusim.so) and counts the calls the
 * submitting thread makes inside tdist_all_reduce and tdist_barrier.
 *
 * A thread whose start routine lies in the simulated NCCL is NCCL's own: a
 * non-blocking communicator launches every group from a job thread of its
 * own (NCCL 2.28 group.cc: one thread per ncclGroupEnd that has work), and
 * tdist keeps non-blocking communicators (docs/nccl-backend.md: every
 * abort and timeout guarantee needs them). Those are counted apart and
 * allowed: at most one per op, as a raw program in the same mode makes.
 * Before the fix, submit slept in its ncclInProgress loop (20 us per turn)
 * until NCCL's job ended.
 *
 * Not built under the sanitizers: they intercept the same calls.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "nccl_sim_util.h"

static int port;
static __thread int in_submit;
static atomic_long sleeps, threads_ours, threads_nccl;

static int from_nccl(void *(*fn)(void *)) {
  Dl_info di;
  return dladdr((void *)fn, &di) && di.dli_fname && strstr(di.dli_fname, "libtdist_gpusim");
}

int pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*fn)(void *), void *arg) {
  static int (*real)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);
  if (!real) *(void **)&real = dlsym(RTLD_NEXT, "pthread_create");
  if (in_submit) atomic_fetch_add(from_nccl(fn) ? &threads_nccl : &threads_ours, 1);
  return real(t, a, fn, arg);
}
int nanosleep(const struct timespec *req, struct timespec *rem) {
  static int (*real)(const struct timespec *, struct timespec *);
  if (!real) *(void **)&real = dlsym(RTLD_NEXT, "nanosleep");
  if (in_submit) atomic_fetch_add(&sleeps, 1);
  return real(req, rem);
}
int clock_nanosleep(clockid_t c, int flags, const struct timespec *req, struct timespec *rem) {
  static int (*real)(clockid_t, int, const struct timespec *, struct timespec *);
  if (!real) *(void **)&real = dlsym(RTLD_NEXT, "clock_nanosleep");
  if (in_submit) atomic_fetch_add(&sleeps, 1);
  return real(c, flags, req, rem);
}
int usleep(useconds_t us) {
  struct timespec ts = {us / 1000000, (long)(us % 1000000) * 1000};
  return nanosleep(&ts, NULL);
}

#define OPS 200
static int submit_child(int rank, int n, void *arg) {
  (void)arg;
  tdist_group_t *g = NULL;
  MP_CHECK_RC(ns_world(rank, n, port, 20000, &g));
  float h[256];
  for (int i = 0; i < 256; i++)
    h[i] = 1.0f;
  float *d = ns_dev(h, sizeof(h));
  MP_CHECK_RC(ns_sync(g, "ready", 10000));
  for (int i = 0; i < OPS; i++) {
    tdist_work_t *w = NULL;
    in_submit = 1;
    int rc = i % 10 == 9 ? tdist_barrier(g, NULL, &w)
                         : tdist_all_reduce(g, d, d, 256, TDIST_FLOAT32, TDIST_MAX, NULL, &w);
    in_submit = 0;
    MP_CHECK_RC(rc);
    MP_CHECK_RC(tdist_work_wait(w, 10000));
    tdist_work_release(w);
  }
  MP_CHECK(ns_get(h, d, sizeof(h)) == 0);
  MP_CHECK(h[0] == 1.0f && h[255] == 1.0f);
  fprintf(stderr, "submit: rank %d, %d ops: %ld sleeps, %ld threads of tdist, %ld of NCCL\n", rank,
          OPS, atomic_load(&sleeps), atomic_load(&threads_ours), atomic_load(&threads_nccl));
  MP_CHECK(atomic_load(&sleeps) == 0);
  MP_CHECK(atomic_load(&threads_ours) == 0);
  MP_CHECK(atomic_load(&threads_nccl) <= OPS);
  MP_CHECK_RC(tdist_group_destroy(g));
  return 0;
}
static void submit_no_thread_no_sleep(void **s) {
  (void)s;
  port = tdist_mp_free_port();
  assert_int_equal(tdist_mp_run(2, submit_child, NULL, 60), 0);
}

int main(int argc, char **argv) {
  setenv("TDIST_TRACE_ON_FAILURE", "0", 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(submit_no_thread_no_sleep),
  };
  if (argc > 1) cmocka_set_test_filter(argv[1]);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
