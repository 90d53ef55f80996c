/*
 * fault_rank.c - one rank of a fault-injection run (issue 7).
 *
 *   fault_rank kill|stop|skip|store VICTIM DIR
 *
 * The same program runs under tdistrun (env://, the launcher hosts the store)
 * and under the fork/exec harness of test_faults.c (RANK, WORLD_SIZE,
 * MASTER_ADDR, MASTER_PORT set per child; rank 0 hosts the store, or an
 * external tdist-store with TDIST_STORE_HOSTED=1). Backend cpu. DIR is a
 * scratch directory of this run: the flight recorder writes there
 * (TDIST_TRACE_PREFIX=DIR/), and so do the victim's pid and fault time.
 *
 * Every rank runs FAULT_WARMUPS checked all_reduces, then the scenario:
 *   kill   the survivors submit a 16 MiB all_reduce (seq FAULT_SEQ) and say
 *          so in DIR/submitted.<rank>; then VICTIM submits it too and
 *          SIGKILLs itself 2 ms later, the op in flight on every rank.
 *          Survivors: REMOTE_FAILED naming it within FAULT_KILL_BOUND_MS of
 *          the kill, then shrink + all_reduce.
 *   stop   VICTIM SIGSTOPs itself before seq FAULT_SEQ; the survivors'
 *          all_reduce (group timeout 20 s) fails with REMOTE_FAILED naming it
 *          ("no heartbeat") within the heartbeat timeout + 1 s; shrink +
 *          all_reduce; the lowest survivor then SIGKILLs (and SIGCONTs) it.
 *   skip   VICTIM skips seq FAULT_SEQ and waits until its group is aborted;
 *          the survivors' op (timeout 1.5 s) fails with TIMEOUT or ABORTED
 *          naming VICTIM as not having reached the seq. Nobody died, so the
 *          shrink keeps every rank (VICTIM included) and the all_reduce runs
 *          over all of them.
 *   store  VICTIM SIGKILLs the store server ($FAULT_STORE_PID, a tdist-store
 *          process) and waits until its port refuses connections (after an
 *          all_to_all and a barrier: every lazy connection is made). The CPU
 *          collectives go on (they never use the store), also while the
 *          monitor's heartbeats fail for three intervals; a split
 *          (tdist_new_group) still works since the CPU backend reuses the
 *          parent's connections; tdist_group_shrink, which agrees through
 *          the store, fails at once with CLOSED; nothing is aborted and
 *          destroy returns within FAULT_STORE_TIMEOUT_MS.
 *
 * SIGTERM is blocked until every survivor has printed what it saw, so that
 * under tdistrun's fail-fast (SIGTERM on the first death) the reports get
 * out before the survivors are stopped, and none of them dies early enough
 * to be the failure another one sees. Exit: 0 when every check passed, 1 otherwise
 * (the failed check is printed); the kill and stop victims die by SIGKILL.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "faults.h"
#include "tdist/tdist.h"

static int me = -1, nranks, victim;
static int victim_dies; /* kill, stop: the victim never reports */
static char dir[256];

#define CHECK(cond)                                                                      \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      printf("FAULT rank %d check failed (%s:%d): %s\n", me, __FILE__, __LINE__, #cond); \
      return 1;                                                                          \
    }                                                                                    \
  } while (0)

#define CHECK_RC(call)                                                                           \
  do {                                                                                           \
    int rc__ = (call);                                                                           \
    if (rc__ != 0) {                                                                             \
      printf("FAULT rank %d check failed (%s:%d): %s returned %s: %s\n", me, __FILE__, __LINE__, \
             #call, tdist_err_name(rc__), tdist_last_error());                                   \
      return 1;                                                                                  \
    }                                                                                            \
  } while (0)

static int64_t wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};
  nanosleep(&ts, NULL);
}

/* DIR/<name>: numbers shared between ranks (faults.h). */
static void put_num(const char *name, int64_t v) { fault_put_num(dir, name, v); }
static int64_t get_num(const char *name) { return fault_get_num(dir, name); }

/* Input element i of world rank r: small integers, so float sums are exact
 * in any order. */
static float gen(int r, size_t i, int salt) {
  unsigned h = (unsigned)r * 7u + (unsigned)(i % 1000003) * 13u + (unsigned)salt * 5u;
  return (float)((int)(h % 9u) - 4);
}

/* all_reduce SUM of `count` floats over g, checked element by element
 * against the sum of the inputs of the world ranks in g. */
static int checked_all_reduce(tdist_group_t *g, size_t count, int salt) {
  float *v = malloc(count * sizeof(float));
  CHECK(v != NULL);
  int n = tdist_group_size(g), bad = -1, world[8];
  for (int r = 0; r < n && r < 8; r++)
    world[r] = tdist_group_global_rank(g, r);
  for (size_t i = 0; i < count; i++)
    v[i] = gen(me, i, salt);
  int rc = tdist_all_reduce(g, v, v, count, TDIST_FLOAT32, TDIST_SUM, NULL, NULL);
  if (rc == 0) {
    for (size_t i = 0; i < count && bad < 0; i++) {
      float want = 0;
      for (int r = 0; r < n; r++)
        want += gen(world[r], i, salt);
      if (v[i] != want) {
        printf("FAULT rank %d all_reduce on '%s': element %zu is %g, expected %g\n", me,
               tdist_group_name(g), i, (double)v[i], (double)want);
        bad = (int)i;
      }
    }
  }
  free(v);
  CHECK_RC(rc);
  CHECK(bad < 0);
  return 0;
}

/* 1 if msg names `r` as the failed rank, in the form the CPU backend ("rank
 * r (world rank r, host:port) is gone") or the monitor ("rank r (world rank
 * r) failed") use; in the world group both numbers are r. */
static int names_failed(const char *msg, int r) {
  char want[64];
  snprintf(want, sizeof(want), "rank %d (world rank %d", r, r);
  return strstr(msg, want) != NULL;
}

static void unblock_sigterm(void) {
  sigset_t s;
  sigemptyset(&s);
  sigaddset(&s, SIGTERM);
  fflush(stdout);
  pthread_sigmask(SIG_UNBLOCK, &s, NULL); /* a pending SIGTERM ends us here */
}

/* Survivors of kill/stop/skip: the fault op failed with `rc`/`msg` `dt` ms
 * after the fault. SIGTERM stays blocked until every survivor has said what
 * it saw (DIR/reported.<rank>, waited for at most 5 s): under fail-fast a
 * survivor that died early would otherwise be the first failure that a
 * slower one sees. */
static void report(int rc, int64_t dt, const char *msg) {
  printf("FAULT rank %d saw %s after %lld ms: %s\n", me, tdist_err_name(rc), (long long)dt, msg);
  char name[32];
  snprintf(name, sizeof(name), "reported.%d", me);
  put_num(name, 1);
  int64_t t0 = mono_ms();
  for (int r = 0; r < nranks; r++) {
    if (victim_dies && r == victim) continue;
    snprintf(name, sizeof(name), "reported.%d", r);
    while (get_num(name) < 0 && mono_ms() - t0 < 5000)
      sleep_ms(1);
  }
  unblock_sigterm();
}

/* The recovery: shrink to the ranks the store did not declare dead, then a
 * checked all_reduce among them. */
static int shrink_and_go_on(tdist_group_t *g, int expect_size) {
  tdist_group_t *s = NULL;
  CHECK(tdist_group_is_aborted(g));
  CHECK_RC(tdist_group_shrink(g, NULL, &s));
  CHECK(tdist_group_size(s) == expect_size);
  /* Ranks keep their order: the new rank is the position among survivors. */
  int expect_rank = expect_size == nranks || me < victim ? me : me - 1;
  CHECK(tdist_group_rank(s) == expect_rank);
  for (int i = 0, r = 0; i < expect_size; i++, r++) {
    if (expect_size < nranks && r == victim) r++;
    CHECK(tdist_group_global_rank(s, i) == r);
  }
  CHECK(checked_all_reduce(s, FAULT_CHECK_COUNT, 11) == 0);
  CHECK(checked_all_reduce(s, 1000, 12) == 0);
  printf("FAULT rank %d shrunk: rank %d of %d, all_reduce ok\n", me, tdist_group_rank(s),
         tdist_group_size(s));
  CHECK_RC(tdist_group_destroy(s));
  return 0;
}

static int scenario_kill(tdist_group_t *g) {
  float *v = malloc((size_t)FAULT_BIG_COUNT * sizeof(float));
  CHECK(v != NULL);
  for (size_t i = 0; i < FAULT_BIG_COUNT; i++)
    v[i] = gen(me, i, 3);
  tdist_work_t *w = NULL;
  char name[32];
  if (me == victim) {
    /* Submit only once every survivor has: the op is then in flight on all
     * ranks, and it cannot complete within the 2 ms before the kill. */
    int64_t t0 = mono_ms();
    for (int r = 0; r < nranks; r++) {
      snprintf(name, sizeof(name), "submitted.%d", r);
      while (r != me && get_num(name) < 0 && mono_ms() - t0 < 10000)
        sleep_ms(1);
      CHECK(r == me || get_num(name) >= 0);
    }
    CHECK_RC(tdist_all_reduce(g, v, v, FAULT_BIG_COUNT, TDIST_FLOAT32, TDIST_SUM, NULL, &w));
    CHECK(tdist_work_seq(w) == FAULT_SEQ);
    sleep_ms(2);
    CHECK(!tdist_work_is_completed(w)); /* in flight: the others need our data */
    put_num("fault_time", wall_ms());
    printf("FAULT rank %d killing itself with all_reduce seq %d in flight\n", me, FAULT_SEQ);
    fflush(stdout);
    kill(getpid(), SIGKILL);
    for (;;)
      pause();
  }
  int rc = tdist_all_reduce(g, v, v, FAULT_BIG_COUNT, TDIST_FLOAT32, TDIST_SUM, NULL, &w);
  snprintf(name, sizeof(name), "submitted.%d", me);
  put_num(name, 1); /* even if the submission failed: that is checked below */
  const char *msg;
  if (rc == 0) {
    CHECK(tdist_work_seq(w) == FAULT_SEQ);
    rc = tdist_work_wait(w, 0);
    msg = tdist_work_error_message(w);
  } else {
    msg = tdist_last_error();
  }
  int64_t t = get_num("fault_time"), dt = t > 0 ? wall_ms() - t : -1;
  report(rc, dt, msg);
  CHECK(rc == TDIST_ERR_REMOTE_FAILED && w != NULL); /* submitted, then failed */
  CHECK(names_failed(msg, victim));
  CHECK(t > 0 && dt <= FAULT_KILL_BOUND_MS);
  tdist_work_release(w);
  free(v); /* the buffer belongs to tdist until the work completed: it has */
  return shrink_and_go_on(g, nranks - 1);
}

static int scenario_stop(tdist_group_t *g) {
  if (me == victim) {
    put_num("victim_pid", getpid());
    put_num("fault_time", wall_ms());
    printf("FAULT rank %d stopping itself before seq %d\n", me, FAULT_SEQ);
    fflush(stdout);
    raise(SIGSTOP);
    /* Only SIGCONT without the SIGKILL (a harness bug) gets here. */
    printf("FAULT rank %d continued: nobody killed it\n", me);
    return 1;
  }
  float v[1000];
  for (int i = 0; i < 1000; i++)
    v[i] = gen(me, (size_t)i, 4);
  tdist_work_t *w = NULL;
  int rc = tdist_all_reduce(g, v, v, 1000, TDIST_FLOAT32, TDIST_SUM, NULL, &w);
  const char *msg = tdist_last_error();
  if (rc == 0) {
    rc = tdist_work_wait(w, 0);
    msg = tdist_work_error_message(w);
  }
  int64_t t = get_num("fault_time"), dt = t > 0 ? wall_ms() - t : -1;
  report(rc, dt, msg);
  CHECK(rc == TDIST_ERR_REMOTE_FAILED);
  CHECK(names_failed(msg, victim));
  CHECK(strstr(msg, "no heartbeat") != NULL);
  CHECK(t > 0 && dt <= FAULT_STOP_BOUND_MS);
  tdist_work_release(w);
  CHECK(shrink_and_go_on(g, nranks - 1) == 0);
  /* The lowest survivor ends the stopped victim (tdist never kills). */
  if (me == (victim == 0 ? 1 : 0)) {
    pid_t pid = (pid_t)get_num("victim_pid");
    CHECK(pid > 0);
    kill(pid, SIGKILL);
    kill(pid, SIGCONT);
    printf("FAULT rank %d killed the stopped rank %d\n", me, victim);
  }
  return 0;
}

static int scenario_skip(tdist_group_t *g) {
  char want[96];
  snprintf(want, sizeof(want), "rank %d of group 'world' had not reached seq %d", victim,
           FAULT_SEQ);
  if (me == victim) {
    printf("FAULT rank %d skips all_reduce seq %d\n", me, FAULT_SEQ);
    fflush(stdout);
    int64_t t0 = mono_ms();
    while (!tdist_group_is_aborted(g) && mono_ms() - t0 < FAULT_SKIP_BOUND_MS + 5000)
      sleep_ms(10);
    CHECK(tdist_group_is_aborted(g));
    /* Our own copy of the recorder: seq FAULT_SEQ never submitted here. */
    CHECK_RC(tdist_dump_trace(g, NULL));
    int rc = tdist_barrier(g, NULL, NULL); /* refused: says why the group aborted */
    report(rc, mono_ms() - t0, tdist_last_error());
    CHECK(rc == TDIST_ERR_ABORTED);
    CHECK(strstr(tdist_last_error(), want) != NULL);
    return shrink_and_go_on(g, nranks);
  }
  float v[1000];
  for (int i = 0; i < 1000; i++)
    v[i] = gen(me, (size_t)i, 5);
  tdist_op_opts_t o = {.mask = TDIST_OP_FIELD_TIMEOUT, .timeout_ms = FAULT_SKIP_OP_TIMEOUT_MS};
  tdist_work_t *w = NULL;
  int64_t t0 = mono_ms();
  int rc = tdist_all_reduce(g, v, v, 1000, TDIST_FLOAT32, TDIST_SUM, &o, &w);
  const char *msg = tdist_last_error();
  if (rc == 0) {
    CHECK(tdist_work_seq(w) == FAULT_SEQ);
    rc = tdist_work_wait(w, 0);
    msg = tdist_work_error_message(w);
  }
  int64_t dt = mono_ms() - t0;
  report(rc, dt, msg);
  /* TIMEOUT on a rank whose own deadline passed first, ABORTED on one told
   * by that rank's abort record; both carry the diagnosis. */
  CHECK(rc == TDIST_ERR_TIMEOUT || rc == TDIST_ERR_ABORTED);
  CHECK(strstr(msg, want) != NULL);
  CHECK(dt >= FAULT_SKIP_OP_TIMEOUT_MS - 50 && dt <= FAULT_SKIP_BOUND_MS);
  tdist_work_release(w);
  return shrink_and_go_on(g, nranks);
}

/* 1 once nothing accepts connections on the store's address any more. */
static int store_port_closed(void) {
  const char *addr = getenv("MASTER_ADDR"), *port = getenv("MASTER_PORT");
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_port = htons((uint16_t)atoi(port ? port : "0"))};
  inet_pton(AF_INET, addr ? addr : "127.0.0.1", &a.sin_addr);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  int refused = connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0 && errno == ECONNREFUSED;
  close(fd);
  return refused;
}

static int scenario_store(tdist_group_t *g) {
  /* Lazy connections (src/cpu/conn/lazy.c, TDIST_CPU_CONNECT=lazy) read a peer's address
   * from the store when a pair is first used: every pair is made before
   * the store goes (an all_to_all needs every pair; a rank enters the
   * barrier only once its all_to_all is done, and the victim's barrier
   * completes only once every member entered it). After that the CPU
   * collectives never use the store, as with the eager mesh. */
  int32_t a2a_in[8] = {0}, a2a_out[8];
  CHECK_RC(tdist_all_to_all(g, a2a_in, a2a_out, 1, TDIST_INT32, NULL, NULL));
  CHECK_RC(tdist_barrier(g, NULL, NULL));
  if (me == victim) {
    const char *pid = getenv("FAULT_STORE_PID");
    CHECK(pid && atoi(pid) > 0);
    CHECK(kill(atoi(pid), SIGKILL) == 0);
    int64_t t0 = mono_ms();
    while (!store_port_closed() && mono_ms() - t0 < 5000)
      sleep_ms(5);
    CHECK(store_port_closed());
    printf("FAULT rank %d killed the store server (pid %s)\n", me, pid);
  }
  /* seq FAULT_SEQ doubles as the barrier after which the store is gone. */
  CHECK(checked_all_reduce(g, FAULT_CHECK_COUNT, 6) == 0);
  CHECK(checked_all_reduce(g, 1u << 20, 7) == 0);
  unblock_sigterm();

  /* Shrink agrees through the store: a clear error at once, not a hang. */
  tdist_group_t *s = NULL;
  int64_t t0 = mono_ms();
  int rc = tdist_group_shrink(g, NULL, &s);
  int64_t dt = mono_ms() - t0;
  printf("FAULT rank %d store gone: shrink -> %s after %lld ms: %s\n", me, tdist_err_name(rc),
         (long long)dt, tdist_last_error());
  CHECK(rc == TDIST_ERR_CLOSED && s == NULL);
  CHECK(strstr(tdist_last_error(), "closed the connection") != NULL ||
        strstr(tdist_last_error(), "closed by an earlier failure") != NULL);
  CHECK(dt < FAULT_STORE_TIMEOUT_MS);

  /* Collectives go on for a while: the monitor meanwhile finds its
   * heartbeats and abort-record waits failing, which must not abort or stall
   * the group. The count of rounds is agreed (rank 0's), not timed per rank. */
  int64_t rounds = 0, t1 = mono_ms();
  for (int more = 1; more; rounds++) {
    CHECK(checked_all_reduce(g, 4096, 20 + (int)(rounds % 8)) == 0);
    int32_t go = me == 0 ? mono_ms() - t1 < 3 * FAULT_HB_INTERVAL_MS : 0;
    CHECK_RC(tdist_broadcast(g, &go, 1, TDIST_INT32, 0, NULL, NULL));
    more = go;
  }
  CHECK(!tdist_group_is_aborted(g));

  /* A CPU split needs no store: it maps the new ranks over existing sockets. */
  int all[8];
  for (int r = 0; r < nranks; r++)
    all[r] = nranks - 1 - r; /* reversed, so the child renumbers */
  tdist_group_t *sub = NULL;
  CHECK_RC(tdist_new_group(g, all, nranks, NULL, &sub));
  CHECK(sub && tdist_group_rank(sub) == nranks - 1 - me);
  CHECK(checked_all_reduce(sub, FAULT_CHECK_COUNT, 8) == 0);
  CHECK_RC(tdist_group_destroy(sub));
  CHECK(checked_all_reduce(g, 1000, 9) == 0);
  CHECK(!tdist_group_is_aborted(g));
  printf("FAULT rank %d store gone: collectives (%lld rounds) and new_group ok\n", me,
         (long long)rounds);
  return 0;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc != 4) {
    fprintf(stderr, "usage: fault_rank kill|stop|skip|store VICTIM DIR\n");
    return 2;
  }
  const char *sc = argv[1];
  victim = atoi(argv[2]);
  victim_dies = !strcmp(sc, "kill") || !strcmp(sc, "stop");
  snprintf(dir, sizeof(dir), "%s", argv[3]);
  char prefix[300];
  snprintf(prefix, sizeof(prefix), "%s/", dir);
  setenv("TDIST_TRACE_PREFIX", prefix, 1);
  /* Blocked before any thread starts, so no tdist thread takes it either. */
  sigset_t s;
  sigemptyset(&s);
  sigaddset(&s, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &s, NULL);

  tdist_group_t *g = NULL;
  tdist_init_opts_t o = {.mask = TDIST_INIT_FIELD_BACKEND, .backend = "cpu"};
  int rc = tdist_init_process_group(&o, &g);
  if (rc) {
    printf("FAULT init failed: %s: %s\n", tdist_err_name(rc), tdist_last_error());
    return 1;
  }
  me = tdist_group_rank(g);
  nranks = tdist_group_size(g);
  if (victim < 0 || victim >= nranks || nranks > 8) {
    printf("FAULT rank %d: victim %d / size %d out of range\n", me, victim, nranks);
    return 2;
  }
  /* `store`: TDIST_TIMEOUT_MS is short there, to bound the store calls; the
   * collectives keep a long timeout (they must not time out by slowness). */
  tdist_group_set_timeout(g, FAULT_TIMEOUT_MS);
  for (int i = 0; i < FAULT_WARMUPS; i++)
    if (checked_all_reduce(g, 4096u * (unsigned)(i + 1) + 7, i)) return 1;
  printf("FAULT rank %d warm-up ok (%d ranks, pid %d)\n", me, nranks, (int)getpid());
  if (!strcmp(sc, "kill"))
    rc = scenario_kill(g);
  else if (!strcmp(sc, "stop"))
    rc = scenario_stop(g);
  else if (!strcmp(sc, "skip"))
    rc = scenario_skip(g);
  else if (!strcmp(sc, "store"))
    rc = scenario_store(g);
  else {
    printf("FAULT rank %d: unknown scenario '%s'\n", me, sc);
    rc = 2;
  }
  unblock_sigterm();
  /* After a failure, destroy may report TIMEOUT (a dead rank never says
   * goodbye to the store); it must return, within the group timeout. */
  int64_t t0 = mono_ms();
  int drc = tdist_group_destroy(g);
  int64_t dt = mono_ms() - t0;
  if (dt > (!strcmp(sc, "store") ? FAULT_STORE_TIMEOUT_MS + 2000 : 5000)) {
    printf("FAULT rank %d destroy took %lld ms (%s)\n", me, (long long)dt, tdist_err_name(drc));
    rc = rc ? rc : 1;
  }
  if (rc == 0) printf("FAULT rank %d done (destroy %lld ms)\n", me, (long long)dt);
  return rc;
}
