/*
 * test_cpu_liveness_busy.c - a live rank is never declared dead, whatever
 * one op costs (issue 25). Four ranks (on a 2-core machine: more ranks than
 * cores), a short heartbeat timeout (TDIST_HEARTBEAT_TIMEOUT_MS=1000,
 * heartbeats every 200 ms), and messages of hundreds of MB:
 *   - each rank sends one to itself with the blocking send and receive,
 *     with isend + irecv, and with one batch holding both;
 *   - each rank sends one to the next rank of a ring and receives one from
 *     the previous (single copy across processes on one host);
 * a few rounds, while `stress-ng --cpu 2` (when on PATH) takes the cores
 * too. Every op must succeed with the right bytes, no group may abort, and
 * the store's dead set must stay empty.
 *
 * Before the fix the heartbeat was written by a thread that first waited for
 * the progress thread (the heartbeat's value), which spends seconds in one
 * copy of such a message on a loaded host: the store declared the rank dead
 * ("no heartbeat for ... ms") while every call it made succeeded.
 *
 * TDIST_TEST_BUSY_MB sets the message size (default 256, 64 under TSan).
 *
 * abort_mid_copy: a group aborted while such copies are still being made
 * in steps (copy_steps.c) ends its ops and is destroyed cleanly.
 */
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/wait.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "util/clock.h"
#include "cpu_test_util.h"

#define N 4
#define ROUNDS 3

extern char **environ;

struct shared {
  int port;
  size_t count; /* uint32 elements per message */
};

static uint32_t pattern(int src, int round, size_t i) {
  return (uint32_t)i * 2654435761u + (uint32_t)src * 7919u + (uint32_t)round * 131u;
}

static void fill_msg(uint32_t *b, size_t n, int src, int round) {
  for (size_t i = 0; i < n; i++)
    b[i] = pattern(src, round, i);
}

/* 0 when every element is what rank src sent in this round. */
static int check_msg(const uint32_t *b, size_t n, int src, int round) {
  for (size_t i = 0; i < n; i++)
    if (b[i] != pattern(src, round, i)) {
      fprintf(stderr, "element %zu from rank %d round %d: got %u want %u\n", i, src, round, b[i],
              pattern(src, round, i));
      return 1;
    }
  return 0;
}

static _Atomic int aborted;
static char abort_reason[400];

/* (progress) Any abort is a failure of this test: remember why. */
static void on_abort(tdist_group_t *g, int status, const char *reason, void *arg) {
  (void)g, (void)arg;
  snprintf(abort_reason, sizeof(abort_reason), "%s: %s", tdist_err_name(status), reason);
  atomic_store(&aborted, 1);
}

static int wait_ok(tdist_work_t *w, const char *what) {
  int rc = tdist_work_wait(w, 0);
  if (rc != 0)
    fprintf(stderr, "[pid %d] %s: %s (%s)\n", (int)getpid(), what, tdist_err_name(rc),
            tdist_work_error_message(w));
  tdist_work_release(w);
  return rc;
}

static int busy(int rank, int n, void *arg) {
  struct shared *sh = arg;
  tdist_group_t *g = NULL;
  MP_CHECK_RC(cpu_test_init(sh->port, rank, n, 300000, &g));
  MP_CHECK_RC(tdist_group_on_abort(g, on_abort, NULL));
  size_t cnt = sh->count;
  uint32_t *sbuf = malloc(cnt * 4), *rbuf = malloc(cnt * 4);
  MP_CHECK(sbuf && rbuf);
  int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  for (int round = 0; round < ROUNDS; round++) {
    int64_t t0 = tdist__now_ms();
    fill_msg(sbuf, cnt, rank, round);
    /* To itself, blocking: the copy into a staging buffer, then out. */
    memset(rbuf, 0, cnt * 4);
    MP_CHECK_RC(tdist_send(g, sbuf, cnt, TDIST_UINT32, rank, NULL));
    MP_CHECK_RC(tdist_recv(g, rbuf, cnt, TDIST_UINT32, rank, NULL));
    MP_CHECK(check_msg(rbuf, cnt, rank, round) == 0);
    int64_t t1 = tdist__now_ms();
    /* To itself, isend + irecv. */
    memset(rbuf, 0, cnt * 4);
    tdist_work_t *ws = NULL, *wr = NULL;
    MP_CHECK_RC(tdist_isend(g, sbuf, cnt, TDIST_UINT32, rank, NULL, &ws));
    MP_CHECK_RC(tdist_irecv(g, rbuf, cnt, TDIST_UINT32, rank, NULL, &wr));
    MP_CHECK(wait_ok(ws, "isend to self") == 0);
    MP_CHECK(wait_ok(wr, "irecv from self") == 0);
    MP_CHECK(check_msg(rbuf, cnt, rank, round) == 0);
    /* To itself, send and receive in one batch: one op, both copies. */
    memset(rbuf, 0, cnt * 4);
    tdist_p2p_op_t pair[2] = {
        {.kind = TDIST_P2P_SEND, .buf = sbuf, .count = cnt, .dtype = TDIST_UINT32, .peer = rank},
        {.kind = TDIST_P2P_RECV, .buf = rbuf, .count = cnt, .dtype = TDIST_UINT32, .peer = rank}};
    MP_CHECK_RC(tdist_batch_isend_irecv(g, pair, 2, NULL, &ws));
    MP_CHECK(wait_ok(ws, "batch to self") == 0);
    MP_CHECK(check_msg(rbuf, cnt, rank, round) == 0);
    int64_t t2 = tdist__now_ms();
    /* Around the ring. */
    memset(rbuf, 0, cnt * 4);
    MP_CHECK_RC(tdist_irecv(g, rbuf, cnt, TDIST_UINT32, prev, NULL, &wr));
    MP_CHECK_RC(tdist_isend(g, sbuf, cnt, TDIST_UINT32, next, NULL, &ws));
    MP_CHECK(wait_ok(ws, "isend to the next rank") == 0);
    MP_CHECK(wait_ok(wr, "irecv from the previous rank") == 0);
    MP_CHECK(check_msg(rbuf, cnt, prev, round) == 0);
    int64_t t3 = tdist__now_ms();
    fprintf(stderr, "[rank %d] round %d: self %lld ms, self async+batch %lld ms, ring %lld ms\n",
            rank, round, (long long)(t1 - t0), (long long)(t2 - t1), (long long)(t3 - t2));
    if (atomic_load(&aborted)) fprintf(stderr, "[rank %d] aborted: %s\n", rank, abort_reason);
    MP_CHECK(!atomic_load(&aborted));
  }
  /* Every rank is past its big ops: a false death would have been declared
   * by now, and its record may still be on its way to our monitor; the
   * store's dead set is the authority, read after everyone got here. */
  MP_CHECK_RC(tdist_barrier(g, NULL, NULL));
  if (rank == 0) {
    tdist_store_t *st = NULL;
    tdist_store_opts_t so = {.mask = TDIST_STORE_FIELD_TIMEOUT, .timeout_ms = 20000};
    MP_CHECK_RC(tdist_store_connect("127.0.0.1", sh->port, &so, &st));
    for (int r = 0; r < n; r++) {
      char key[32];
      snprintf(key, sizeof(key), "tdist/dead/%d", r);
      const char *keys[1] = {key};
      int exists = 1;
      MP_CHECK_RC(tdist_store_check(st, keys, 1, &exists));
      if (exists) {
        void *v = NULL;
        size_t vl = 0;
        if (tdist_store_get(st, key, &v, &vl, 1000) == 0)
          fprintf(stderr, "rank %d declared dead: %.*s\n", r, (int)vl, (const char *)v);
        tdist_store_free(v);
      }
      MP_CHECK(!exists);
    }
    tdist_store_release(st);
  }
  MP_CHECK_RC(tdist_barrier(g, NULL, NULL));
  MP_CHECK(!atomic_load(&aborted) && !tdist_group_is_aborted(g));
  free(sbuf);
  free(rbuf);
  MP_CHECK_RC(tdist_group_destroy(g));
  return 0;
}

/* An abort while long self copies are still being made in steps: the ops
 * end (ABORTED, or done if the copy won), nothing touches their buffers
 * afterwards (the buffers are freed at once; ASan builds would see a late
 * copy), and the group is destroyed cleanly. */
static int abort_mid_copy(int rank, int n, void *arg) {
  struct shared *sh = arg;
  tdist_group_t *g = NULL;
  MP_CHECK_RC(cpu_test_init(sh->port, rank, n, 60000, &g));
  size_t cnt = sh->count;
  uint32_t *sbuf = malloc(cnt * 4), *rbuf = malloc(cnt * 4);
  MP_CHECK(sbuf && rbuf);
  fill_msg(sbuf, cnt, rank, 0);
  tdist_work_t *ws = NULL, *wr = NULL, *ws2 = NULL;
  /* A message complete in its staging buffer, so the receive copies it out
   * in steps; then a send whose copy in is queued behind. */
  MP_CHECK_RC(tdist_send(g, sbuf, cnt, TDIST_UINT32, rank, NULL));
  MP_CHECK_RC(tdist_irecv(g, rbuf, cnt, TDIST_UINT32, rank, NULL, &wr));
  MP_CHECK_RC(tdist_isend(g, sbuf, cnt, TDIST_UINT32, rank, NULL, &ws));
  MP_CHECK_RC(tdist_isend(g, sbuf, cnt, TDIST_UINT32, rank, NULL, &ws2));
  MP_CHECK_RC(tdist_group_abort(g, "test: abort mid-copy"));
  tdist_work_t *all[3] = {ws, ws2, wr};
  for (int i = 0; i < 3; i++) {
    int rc = tdist_work_wait(all[i], 0);
    MP_CHECK(rc == 0 || rc == TDIST_ERR_ABORTED);
    tdist_work_release(all[i]);
  }
  free(sbuf);
  free(rbuf);
  tdist_group_destroy(g);
  return 0;
}

static void test_abort_mid_copy(void **state) {
  (void)state;
  struct shared *sh =
      mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  assert_true(sh != MAP_FAILED);
  sh->count = (64u << 20) / 4;
  sh->port = tdist_mp_free_port();
  assert_int_equal(tdist_mp_run(1, abort_mid_copy, sh, 120), 0); /* alone: no peer aborts first */
  munmap(sh, sizeof(*sh));
}

/* Load the cores too, as CI does, when stress-ng is installed. */
static pid_t start_stress(void) {
  char *argv[] = {"stress-ng", "--cpu", "2", "--timeout", "300s", "--quiet", NULL};
  pid_t pid = 0;
  if (posix_spawnp(&pid, "stress-ng", NULL, NULL, argv, environ) != 0) return 0;
  return pid;
}

static void test_busy_ranks_stay_alive(void **state) {
  (void)state;
  struct shared *sh =
      mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  assert_true(sh != MAP_FAILED);
  const char *mb = getenv("TDIST_TEST_BUSY_MB");
  size_t bytes = (size_t)(mb && atoi(mb) > 0 ? atoi(mb) : TEST_TSAN ? 64 : 256) << 20;
  sh->count = bytes / 4;
  sh->port = tdist_mp_free_port();
  pid_t stress = start_stress();
  int failed = tdist_mp_run(N, busy, sh, 280);
  if (stress > 0) {
    kill(stress, SIGTERM);
    waitpid(stress, NULL, 0);
  }
  assert_int_equal(failed, 0);
  munmap(sh, sizeof(*sh));
}

int main(void) {
  /* Read by every rank and by the store process rank 0 starts. */
  setenv("TDIST_HEARTBEAT_TIMEOUT_MS", "1000", 0);
  setenv("TDIST_HEARTBEAT_INTERVAL_MS", "200", 0);
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_busy_ranks_stay_alive),
                                     cmocka_unit_test(test_abort_mid_copy)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
