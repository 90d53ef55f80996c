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
} tb_mode_t;

extern const tdist_backend_t tb_backend;

/* Add "test" to the library's backend table (idempotent). */
void tb_register(void);
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
