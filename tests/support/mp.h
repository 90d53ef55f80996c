/*
 * mp.h - multi-process test harness.
 *
 * tdist_mp_run(n, fn, arg, timeout_s) forks n child processes that each run
 * fn(rank, n, arg) and exit with its return value (0 = pass). The parent
 * waits for all of them; a child still running at the timeout is killed
 * (SIGKILL) and counts as a failure, so a hang fails the test instead of
 * stalling the suite. Returns 0 when every child exited 0, else the number
 * of failed children (their rank and reason are printed).
 *
 * Rules for child code: do not use cmocka asserts (they would longjmp inside
 * the child); use MP_CHECK, which prints the location and returns 1 from fn.
 * Fork before the parent starts threads (a store server, a group): start
 * those in a child (rank 0) or after tdist_mp_run returns.
 */
#ifndef TDIST_TEST_MP_H
#define TDIST_TEST_MP_H

#include <stdio.h>
#include <sys/types.h>

typedef int (*tdist_mp_fn)(int rank, int n, void *arg);

int tdist_mp_run(int n, tdist_mp_fn fn, void *arg, int timeout_s);

/* Like tdist_mp_run, but also returns each child's exit status (or
 * 128+signal) in codes[n], for tests that expect some children to fail. */
int tdist_mp_run_codes(int n, tdist_mp_fn fn, void *arg, int timeout_s, int *codes);

/* A TCP port free for a test server to listen on (checked, then released;
 * tests only): drawn below the kernel's ephemeral range, so that no
 * outgoing connection of a test running beside it can take it meanwhile,
 * and reserved against the other tests' picks for as long as this process
 * (and the ranks it forks) lives (a lock on /tmp/tdist-test-port-N.lock). */
int tdist_mp_free_port(void);

/* The pid of the tdist-store that process `parent` started (its --parent)
 * on `port` (its --port), or 0. Both: pid_max can be 32768, so a dead
 * parent's pid may already be another test's process, with a store of its
 * own. */
pid_t tdist_mp_store_of(pid_t parent, int port);

#define MP_CHECK(cond)                                                                         \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      fprintf(stderr, "[pid %d] %s:%d: check failed: %s\n", (int)getpid(), __FILE__, __LINE__, \
              #cond);                                                                          \
      return 1;                                                                                \
    }                                                                                          \
  } while (0)

/* MP_CHECK_RC(call): the call must return 0; prints the code and last error. */
#define MP_CHECK_RC(call)                                                                         \
  do {                                                                                            \
    int rc__ = (call);                                                                            \
    if (rc__ != 0) {                                                                              \
      fprintf(stderr, "[pid %d] %s:%d: %s returned %s (%s)\n", (int)getpid(), __FILE__, __LINE__, \
              #call, tdist_err_name(rc__), tdist_last_error());                                   \
      return 1;                                                                                   \
    }                                                                                             \
  } while (0)

#endif
