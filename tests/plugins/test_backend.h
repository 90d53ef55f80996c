/*
 * test_backend.h - a backend for tests and the overhead benchmark that moves
 * no data and completes, fails, stalls or holds work on command.
 *
 * It is a plug-in written against the installed interface alone
 * (tdist/backend.h: no file of src/ is included), built as
 * libtdist-backend-test.so: the proof that a backend is added without
 * touching the core. Its name is "test". A program either links it and
 * calls tb_register() (tdist_backend_register), or names it and lets the
 * library load it (TDIST_BACKEND_PATH, tests/plugins/test_plugin_load.c).
 *
 * The mode is read when an op is submitted (caller thread) and kept in the
 * op, so changing it affects only later ops.
 */
#ifndef TDIST_TEST_BACKEND_H
#define TDIST_TEST_BACKEND_H

#include "tdist/backend.h"

typedef enum tb_mode {
  TB_COMPLETE = 0, /* finish successfully inside post */
  TB_POLL,         /* finish successfully on the progress thread's next poll */
  TB_FAIL,         /* finish inside post with tb_set_fail_code()'s code */
  TB_STALL,        /* never finish (until timeout or abort) */
  TB_HELD,         /* finish when tb_release_held() is called */
  TB_FAIL_AT_INIT, /* init reports a failure (from the progress thread) before
                      it returns, as a CPU backend does when a peer gave up
                      during setup */
  TB_CALLER,       /* "testcaller" only: done from the tb_set_caller_tests()-th
                      test on (or once tb_caller_release() was called); post
                      completes it if done, else poll once it is */
} tb_mode_t;

extern const tdist_backend_t tb_backend;
/* The same with vtable->test ("testcaller"): the caller-driven path of the
 * core (backend.h, submit and test), checked as it is used. */
extern const tdist_backend_t tbc_backend;

/* Add "test" and "testcaller" to the library's backend table (idempotent). */
void tb_register(void);
/* TB_CALLER: an op submitted from now on is done from its k-th test on. */
void tb_set_caller_tests(int k);
/* TB_CALLER: every op is done from now on (until tb_set_caller_tests). */
void tb_caller_release(void);
/* Tests made, and breaches of test's run protocol seen (backend.h, test:
 * a single look inside a SPIN run, SPIN and LAST at once). Since process
 * start. */
int tb_test_count(void);
int tb_test_breaches(void);
/* Threads in a SPIN run right now (0 whenever no op is being waited for). */
int tb_runs_open(void);
void tb_set_mode(tb_mode_t mode);
void tb_set_fail_code(int code);
/* Finish every held work of group g successfully (runs on the progress thread). */
void tb_release_held(tdist_group_t *g);
/* Counters since process start. */
int tb_abort_count(void);
int tb_post_count(void);
int tb_destroy_count(void);
int tb_init_count(void);

#endif
