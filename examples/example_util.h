/*
 * example_util.h - the error handling every tdist program needs, shared by
 * the examples (overlap.c, mesh.c, pipeline.c).
 *
 * Two kinds of failure:
 *  - a call fails synchronously (bad argument, rendezvous timeout, aborted
 *    group): it returns a negative code and tdist_last_error() says why;
 *  - an operation fails after submission (a peer died, a timeout, ranks that
 *    disagree): the work handle's status is negative and
 *    tdist_work_error_message() says which op, group and rank, and why.
 * Either way a real program cannot go on with a half-done collective: it
 * aborts the world group (the other ranks' ops then fail fast instead of
 * waiting for their timeout) and exits non-zero, and tdistrun stops the job.
 */
#ifndef TDIST_EXAMPLE_UTIL_H
#define TDIST_EXAMPLE_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "tdist/tdist.h"

/* The world group, so that a failure anywhere can abort it. */
static tdist_group_t *ex_world;

static inline void ex_die(const char *what, int rc, const char *detail) {
  fprintf(stderr, "error: %s: %s (%s)\n", what, tdist_err_name(rc), detail);
  if (ex_world) tdist_group_abort(ex_world, what); /* peers fail fast */
  exit(1);
}

/* EX_CHECK(call): a synchronous call must return 0. */
#define EX_CHECK(call)                                          \
  do {                                                          \
    int ex_rc_ = (call);                                        \
    if (ex_rc_ != 0) ex_die(#call, ex_rc_, tdist_last_error()); \
  } while (0)

/* Wait for a work handle (bounded by the op's own timeout), release it, and
 * die with the op's own error message if it failed. */
static inline void ex_wait(tdist_work_t *w, const char *what) {
  int rc = tdist_work_wait(w, 0);
  if (rc != 0) ex_die(what, rc, tdist_work_error_message(w));
  tdist_work_release(w);
}

/* Join the job started by tdistrun (RANK, WORLD_SIZE, MASTER_ADDR, ... come
 * from the environment; the backend from --backend / TDIST_BACKEND). */
static inline tdist_group_t *ex_init(void) {
  EX_CHECK(tdist_init_process_group(NULL, &ex_world));
  return ex_world;
}

static inline double ex_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#endif
