/*
 * test_cpu_lazy.c - connections made on first use (src/cpu/conn/lazy.c,
 * TDIST_CPU_CONNECT=lazy, set explicitly here: the default is lazy only from 64 ranks), each case
 * in its own world:
 *
 *   lazy          n=4: creating the world connects nobody; ranks 0 and 1
 *                 trade p2p messages (checked) and then each has made one
 *                 connection, while ranks 2 and 3, which have not
 *                 communicated yet, have made none. Then an all_reduce and
 *                 an all_to_all over the world connect the rest on first use
 *                 with right results, one connection per pair (each rank
 *                 counts exactly n - 1: the tie-break keeps no duplicate).
 *   both_dial     n=2, five worlds: both ranks send to each other at once,
 *                 so both dial at once; the tie-break leaves one connection
 *                 (each side counts 1) and the data is right.
 *   dead_peer     n=3: rank 2 exits right after the world is created, before
 *                 anyone connected to it; once it is gone, rank 0's receive
 *                 from it fails naming rank 2 (the refused connection, or
 *                 the monitor's death record, whichever comes first), and
 *                 does not hang.
 *   eager         n=4 with TDIST_CPU_CONNECT=eager: the full mesh is made at
 *                 creation (n - 1 connections before any op).
 *   auto          the default: with TDIST_CPU_LAZY_FROM=4 a world of 4 runs
 *                 the lazy case, with 5 the eager one.
 *
 * The connection counter (tdist__cpu_connects) counts connections that
 * became usable in this process.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "util/clock.h"
#include "cpu_test_util.h"

struct shared {
  int port;
  _Atomic int pair_done; /* lazy: ranks 0 and 1 finished their p2p */
  _Atomic int checked;   /* lazy: ranks 2 and 3 looked at their counter */
  _Atomic int dead_pid;  /* dead_peer: rank 2's process */
  _Atomic int created;   /* lazy: ranks that checked their counter after creation */
};

static void msleep(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static uint64_t connects(void) { return atomic_load(&tdist__cpu_connects); }

static int lazy(int rank, int n, void *arg) {
  struct shared *sh = arg;
  tdist_group_t *g = NULL;
  MP_CHECK_RC(cpu_test_init(sh->port, rank, n, 60000, &g));
  MP_CHECK(connects() == 0);
  atomic_fetch_add(&sh->created, 1);
  for (int64_t t0 = tdist__now_ms(); atomic_load(&sh->created) < n && tdist__now_ms() - t0 < 60000;)
    msleep(5);
  enum { CNT = 1000 };
  int32_t s[CNT], r[CNT];
  if (rank < 2) {
    for (int it = 0; it < 10; it++) {
      for (int i = 0; i < CNT; i++)
        s[i] = rank * 100000 + it * 1000 + i;
      tdist_p2p_op_t ops[2] = {
          {.kind = TDIST_P2P_SEND, .buf = s, .count = CNT, .dtype = TDIST_INT32, .peer = 1 - rank},
          {.kind = TDIST_P2P_RECV, .buf = r, .count = CNT, .dtype = TDIST_INT32, .peer = 1 - rank}};
      MP_CHECK_RC(tdist_batch_isend_irecv(g, ops, 2, NULL, NULL));
      for (int i = 0; i < CNT; i++)
        MP_CHECK(r[i] == (1 - rank) * 100000 + it * 1000 + i);
    }
    MP_CHECK(connects() == 1);
    atomic_fetch_add(&sh->pair_done, 1);
  } else {
    for (int64_t t0 = tdist__now_ms();
         atomic_load(&sh->pair_done) < 2 && tdist__now_ms() - t0 < 60000;)
      msleep(5);
    MP_CHECK(atomic_load(&sh->pair_done) == 2);
    MP_CHECK(connects() == 0);
    atomic_fetch_add(&sh->checked, 1);
  }
  /* The all_reduce below connects ranks 2 and 3: not before both looked. */
  for (int64_t t0 = tdist__now_ms(); atomic_load(&sh->checked) < 2 && tdist__now_ms() - t0 < 60000;)
    msleep(5);
  /* The world's collectives connect what they need on first use. */
  for (int i = 0; i < CNT; i++)
    s[i] = rank + i;
  MP_CHECK_RC(tdist_all_reduce(g, s, r, CNT, TDIST_INT32, TDIST_SUM, NULL, NULL));
  for (int i = 0; i < CNT; i++)
    MP_CHECK(r[i] == n * (n - 1) / 2 + n * i);
  MP_CHECK(connects() >= 1 && connects() <= (uint64_t)(n - 1));
  int32_t a[16], b[16];
  for (int i = 0; i < n; i++)
    a[i] = rank * 10 + i;
  MP_CHECK_RC(tdist_all_to_all(g, a, b, 1, TDIST_INT32, NULL, NULL));
  for (int i = 0; i < n; i++)
    MP_CHECK(b[i] == i * 10 + rank);
  MP_CHECK(connects() == (uint64_t)(n - 1));
  MP_CHECK_RC(tdist_group_destroy(g));
  return 0;
}

static int both_dial(int rank, int n, void *arg) {
  struct shared *sh = arg;
  (void)n;
  tdist_group_t *g = NULL;
  MP_CHECK_RC(cpu_test_init(sh->port, rank, n, 60000, &g));
  int64_t s = 1000 + rank, r = 0;
  tdist_work_t *ws = NULL, *wr = NULL;
  MP_CHECK_RC(tdist_isend(g, &s, 1, TDIST_INT64, 1 - rank, NULL, &ws));
  MP_CHECK_RC(tdist_irecv(g, &r, 1, TDIST_INT64, 1 - rank, NULL, &wr));
  MP_CHECK_RC(tdist_work_wait(ws, -1));
  MP_CHECK_RC(tdist_work_wait(wr, -1));
  tdist_work_release(ws);
  tdist_work_release(wr);
  MP_CHECK(r == 1000 + (1 - rank));
  MP_CHECK(connects() == 1);
  MP_CHECK_RC(tdist_group_destroy(g));
  return 0;
}

static int dead_peer(int rank, int n, void *arg) {
  struct shared *sh = arg;
  (void)n;
  tdist_group_t *g = NULL;
  MP_CHECK_RC(cpu_test_init(sh->port, rank, n, 30000, &g));
  if (rank == 2) {
    atomic_store(&sh->dead_pid, (int)getpid());
    _exit(0); /* gone before anyone connected to it */
  }
  if (rank == 1) {
    /* Not talking to rank 2: the world fails anyway once rank 0 finds it
     * gone (or the monitor does); wait for that, bounded. */
    int32_t v = 0;
    int rc = tdist_recv(g, &v, 1, TDIST_INT32, 0, NULL);
    MP_CHECK(rc != 0);
    tdist_group_destroy(g);
    return 0;
  }
  /* Only once rank 2's process is gone (a zombie, or reaped). */
  for (int64_t t0 = tdist__now_ms(); tdist__now_ms() - t0 < 30000; msleep(5)) {
    char path[64], st = 0;
    snprintf(path, sizeof(path), "/proc/%d/stat", atomic_load(&sh->dead_pid));
    FILE *f = atomic_load(&sh->dead_pid) ? fopen(path, "r") : NULL;
    if (!f && atomic_load(&sh->dead_pid)) break;
    if (f && fscanf(f, "%*d %*s %c", &st) == 1 && st == 'Z') {
      fclose(f);
      break;
    }
    if (f) fclose(f);
  }
  /* A receive needs the peer as a send does: it asks for the connection. */
  int32_t v = 0;
  tdist_work_t *w = NULL;
  /* The monitor may have aborted the world already: then the receive is
   * refused at once, with the death record's message. */
  int rc = tdist_irecv(g, &v, 1, TDIST_INT32, 2, NULL, &w);
  if (rc == 0) rc = tdist_work_wait(w, -1);
  const char *msg = w ? tdist_work_error_message(w) : tdist_last_error();
  fprintf(stderr, "dead_peer: rc %d: %s\n", rc, msg ? msg : "(none)");
  MP_CHECK(rc != 0);
  MP_CHECK(msg && strstr(msg, "rank 2"));
  if (w) tdist_work_release(w);
  tdist_group_destroy(g);
  return 0;
}

static int eager(int rank, int n, void *arg) {
  struct shared *sh = arg;
  tdist_group_t *g = NULL;
  MP_CHECK_RC(cpu_test_init(sh->port, rank, n, 60000, &g));
  MP_CHECK(connects() == (uint64_t)(n - 1));
  int32_t v = rank, sum = 0;
  MP_CHECK_RC(tdist_all_reduce(g, &v, &sum, 1, TDIST_INT32, TDIST_SUM, NULL, NULL));
  MP_CHECK(sum == n * (n - 1) / 2);
  MP_CHECK_RC(tdist_group_destroy(g));
  return 0;
}

static int run(const char *name, tdist_mp_fn fn, int n, struct shared *sh) {
  sh->port = tdist_mp_free_port();
  atomic_store(&sh->pair_done, 0);
  atomic_store(&sh->checked, 0);
  atomic_store(&sh->dead_pid, 0);
  atomic_store(&sh->created, 0);
  int rc = tdist_mp_run(n, fn, sh, 120);
  fprintf(stderr, "%s (n=%d): %s\n", name, n, rc ? "FAILED" : "ok");
  return rc;
}

int main(void) {
  struct shared *sh =
      mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (sh == MAP_FAILED) return 1;
  int fails = 0;
  /* The collectives here are the engine's, which connect the pairs they
   * need: over the group's shared segment (TDIST_CPU_SC) they would need
   * no connection at all (test_cpu_sc.c checks that). */
  setenv("TDIST_CPU_SC", "0", 1);
  setenv("TDIST_CPU_CONNECT", "lazy", 1);
  fails += run("lazy", lazy, 4, sh);
  setenv("TDIST_CPU_SHM", "0", 1);
  fails += run("lazy (TDIST_CPU_SHM=0)", lazy, 4, sh);
  unsetenv("TDIST_CPU_SHM");
  for (int i = 0; i < 5; i++)
    fails += run("both_dial", both_dial, 2, sh);
  fails += run("dead_peer", dead_peer, 3, sh);
  setenv("TDIST_CPU_CONNECT", "eager", 1);
  fails += run("eager", eager, 4, sh);
  /* auto, the default: lazy from TDIST_CPU_LAZY_FROM ranks, the mesh below. */
  unsetenv("TDIST_CPU_CONNECT");
  setenv("TDIST_CPU_LAZY_FROM", "4", 1);
  fails += run("auto, 4 ranks from 4: lazy", lazy, 4, sh);
  setenv("TDIST_CPU_LAZY_FROM", "5", 1);
  fails += run("auto, 4 ranks from 5: eager", eager, 4, sh);
  return fails != 0;
}
