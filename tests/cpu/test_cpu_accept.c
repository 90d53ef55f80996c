/*
 * test_cpu_accept.c - the full mesh forms when accept4 fails on the way
 * (issue 29).
 *
 * Every rank accepts one connection from each lower rank (src/cpu/conn/conn.c).
 * accept4 can fail with nothing to show for it: Linux hands back errors
 * pending on the new connection (ECONNABORTED for one reset before it was
 * taken, the protocol errors of accept(2) NOTES), EINTR, and EAGAIN on a
 * non-blocking listener. Before the fix such a failure was counted as a
 * connected peer: the rank stopped accepting one short, the real peer's
 * connection stayed in the backlog and setup timed out ("setup exchange
 * with a peer failed" after the whole timeout).
 *
 * The mesh is built only with TDIST_CPU_CONNECT=eager (set in main).
 *
 * This test defines accept4 itself, so the library's calls come here
 * (the executable's definition comes before libc's); armed, it fails the
 * next calls made by the thread that armed it (the one that creates the
 * world; the store server's threads are left alone) with the errors given,
 * without taking the pending connection, else it is the system call.
 *
 *  - transient: ranks 1 and 2 of 3 see ECONNABORTED, EINTR, EAGAIN and
 *    EPROTO first; the world still forms and an all-reduce is right.
 *  - hard: rank 1 of 2 sees EMFILE; init fails at once (well before the
 *    timeout) with TDIST_ERR_IO naming accept4, not with a timeout.
 */
#include <errno.h>
#include <stdlib.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "util/clock.h"
#include "cpu_test_util.h"

#define MAX_FAILS 4

static int fail_errnos[MAX_FAILS];
static _Atomic int fail_left, fail_next, fired;
static pthread_t armed_thread;

/* Fail the calling thread's next `n` accept4 calls with errs[0..n-1]. */
static void arm(const int *errs, int n) {
  for (int i = 0; i < n; i++)
    fail_errnos[i] = errs[i];
  armed_thread = pthread_self();
  atomic_store(&fail_next, 0);
  atomic_store(&fired, 0);
  atomic_store(&fail_left, n);
}

int accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags) {
  if (atomic_load(&fail_left) > 0 && pthread_equal(pthread_self(), armed_thread)) {
    atomic_fetch_sub(&fail_left, 1);
    atomic_fetch_add(&fired, 1);
    errno = fail_errnos[atomic_fetch_add(&fail_next, 1)];
    return -1;
  }
  return (int)syscall(SYS_accept4, fd, addr, len, flags);
}

static int port;

static int transient_main(int rank, int n, void *arg) {
  (void)arg;
  static const int errs1[] = {ECONNABORTED, EINTR}, errs2[] = {EAGAIN, EPROTO};
  if (rank == 1) arm(errs1, 2);
  if (rank == 2) arm(errs2, 2);
  tdist_group_t *g = NULL;
  MP_CHECK_RC(cpu_test_init(port, rank, n, 20000, &g));
  MP_CHECK(atomic_load(&fired) == (rank == 0 ? 0 : 2)); /* the failures did happen */
  int32_t v[4] = {rank + 1, rank + 1, rank + 1, rank + 1};
  MP_CHECK_RC(tdist_all_reduce(g, v, v, 4, TDIST_INT32, TDIST_SUM, NULL, NULL));
  for (int i = 0; i < 4; i++)
    MP_CHECK(v[i] == n * (n + 1) / 2);
  tdist_group_destroy(g);
  return 0;
}

static void test_transient_accept_failures(void **state) {
  (void)state;
  port = tdist_mp_free_port();
  assert_int_equal(tdist_mp_run(3, transient_main, NULL, 60), 0);
}

#define HARD_TIMEOUT_MS 20000

static int hard_main(int rank, int n, void *arg) {
  (void)arg;
  static const int errs[] = {EMFILE};
  if (rank == 1) arm(errs, 1);
  tdist_group_t *g = NULL;
  int64_t t0 = tdist__now_ms();
  int rc = cpu_test_init(port, rank, n, HARD_TIMEOUT_MS, &g);
  int64_t took = tdist__now_ms() - t0;
  const char *msg = tdist_last_error();
  fprintf(stderr, "[rank %d] init: %s after %lld ms (%s)\n", rank, tdist_err_name(rc),
          (long long)took, rc ? msg : "");
  if (g) tdist_group_destroy(g);
  MP_CHECK(rc != 0); /* rank 0 loses its peer; rank 1 cannot take it */
  MP_CHECK(took < HARD_TIMEOUT_MS / 2);
  if (rank == 1) {
    MP_CHECK(atomic_load(&fired) == 1);
    MP_CHECK(rc == TDIST_ERR_IO);
    MP_CHECK(msg && strstr(msg, "accept4") && strstr(msg, strerror(EMFILE)));
  }
  return 0;
}

static void test_hard_accept_failure(void **state) {
  (void)state;
  port = tdist_mp_free_port();
  assert_int_equal(tdist_mp_run(2, hard_main, NULL, 60), 0);
}

int main(void) {
  /* The mesh's accept loop (conn.c) is what is tested: lazy connections
   * (the default) accept on a thread of their own (lazy.c). */
  setenv("TDIST_CPU_CONNECT", "eager", 1);
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_transient_accept_failures),
                                     cmocka_unit_test(test_hard_accept_failure)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
