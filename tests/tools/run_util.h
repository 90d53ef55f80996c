/*
 * run_util.h - run a program (tdistrun) from a test with its stdout and
 * stderr captured in memory, bounded by a timeout (tests/tools only).
 *
 * ru_start forks and execs argv with `extra_env` ("NAME=value" strings added
 * to the environment, NULL-terminated or NULL), stdout/stderr redirected to
 * temporary files. ru_wait waits up to timeout_s (then SIGKILLs the program
 * and reports it) and reads both files. Main thread of the test only.
 */
#ifndef TDIST_TEST_RUN_UTIL_H
#define TDIST_TEST_RUN_UTIL_H

#include <sys/types.h>

typedef struct ru_proc {
  pid_t pid;
  char out_path[64], err_path[64];
  char *out, *err; /* NUL-terminated contents after ru_wait (free with ru_free) */
  int code;        /* exit code, or 128 + signal; -1 on timeout */
  double started;  /* monotonic start time */
  double seconds;  /* how long it ran */
} ru_proc_t;

int ru_start(ru_proc_t *p, char *const *argv, char *const *extra_env);
int ru_wait(ru_proc_t *p, int timeout_s);
/* ru_start + ru_wait. Returns the exit code (p->code). */
int ru_run(ru_proc_t *p, char *const *argv, char *const *extra_env, int timeout_s);
/* Current contents of the stdout file while running (malloc'd; free it). */
char *ru_peek_out(const ru_proc_t *p);
void ru_free(ru_proc_t *p);
/* Number of lines of s that start with `prefix` and contain `needle`. */
int ru_count_lines(const char *s, const char *prefix, const char *needle);
/* From /proc/<pid>/stat: the command name (comm, up to 15 characters), the
 * state ('R', 'S', 'T', 'Z'...), the parent and the start time (clock ticks
 * after boot; with the pid it names one process, pids being reused). 0, or
 * -1 when no such process exists (gone, and reaped if it was a zombie). */
int ru_proc_stat(pid_t pid, char *comm, size_t commlen, char *state, pid_t *ppid,
                 unsigned long long *start);

#endif
