/*
 * faults.h - what the fault-injection rank program (fault_rank.c) and the
 * tests that run it (test_faults.c, test_faults_launcher.c) agree on: the
 * scenarios, the op sequence, the settings that bound detection, and the
 * lines the program prints.
 *
 * Op sequence of group 'world' on every rank: seqs 0 .. FAULT_WARMUPS-1 are
 * checked all_reduces; seq FAULT_SEQ is the op the fault hits (the large
 * all_reduce for `kill`, the op the victim never reaches for `stop` and
 * `skip`, the first op after the store died for `store`).
 *
 * Output: every line the program prints starts with "FAULT rank <world
 * rank> " so the tests can count them per rank, with or without tdistrun's
 * "[rank r] " prefix. The lines the tests look for:
 *   FAULT rank R saw <TDIST_ERR_...> after <ms> ms: <message>
 *   FAULT rank R shrunk: rank r of m, all_reduce ok
 *   FAULT rank R store gone: shrink -> <TDIST_ERR_...> after <ms> ms
 *   FAULT rank R done
 */
#ifndef TDIST_TEST_FAULTS_H
#define TDIST_TEST_FAULTS_H

#define FAULT_WARMUPS 3
#define FAULT_SEQ FAULT_WARMUPS

/* "Large" all_reduce: 16 MiB of float32, long enough to be in flight when
 * the victim kills itself 2 ms after submitting it. */
#define FAULT_BIG_COUNT (4u << 20)
/* The all_reduce after recovery: not a multiple of any group size. */
#define FAULT_CHECK_COUNT ((1u << 18) + 3)

/* Settings given to every process (the store host reads the heartbeat
 * timeout, the ranks the interval and the group timeout). */
#define FAULT_HB_TIMEOUT_MS 1500
#define FAULT_HB_INTERVAL_MS 250
#define FAULT_TIMEOUT_MS 20000        /* group timeout: detection must beat it */
#define FAULT_STORE_TIMEOUT_MS 5000   /* `store`: bounds every store call and destroy */
#define FAULT_SKIP_OP_TIMEOUT_MS 1500 /* `skip`: the timeout of the skipped op */

/* Detection bounds, from the fault to the survivor seeing the error. */
#define FAULT_KILL_BOUND_MS 1000
#define FAULT_STOP_BOUND_MS (FAULT_HB_TIMEOUT_MS + 1000)
#define FAULT_SKIP_BOUND_MS (FAULT_SKIP_OP_TIMEOUT_MS + 2500) /* from the survivor's submit */

/* DIR/<name>: a number written by one rank and read by another (fault_rank
 * and soak_rank). Written through a rename, so a reader never sees half a
 * number; -1 when absent. */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

static inline void fault_put_num(const char *dir, const char *name, int64_t v) {
  char path[320], tmp[340];
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  snprintf(tmp, sizeof(tmp), "%s.tmp%d", path, (int)getpid());
  FILE *f = fopen(tmp, "w");
  if (!f) return;
  fprintf(f, "%lld\n", (long long)v);
  fclose(f);
  rename(tmp, path);
}

/* For a time taken right before a fault: open DIR/name now (fault_arm), and
 * fault_stamp then costs one pwrite, with no file creation or rename between
 * the time and the fault (under load those could be preempted and the
 * detection latency would include them). -1 if it cannot be opened. */
static inline int fault_arm(const char *dir, const char *name) {
  char path[320];
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  return open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
}

static inline void fault_stamp(int fd, int64_t v) {
  char b[32];
  int n = snprintf(b, sizeof(b), "%lld\n", (long long)v);
  if (fd >= 0 && pwrite(fd, b, (size_t)n, 0) != n) {
    /* nothing to do: the reader finds no time and reports it */
  }
}

static inline int64_t fault_get_num(const char *dir, const char *name) {
  char path[320];
  long long v = -1;
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  if (fscanf(f, "%lld", &v) != 1) v = -1;
  fclose(f);
  return v;
}

#endif
