/*
 * test_cpu_cma.c - single-copy transfers between ranks of one host
 * (src/cpu/engine/cma.c, docs/cpu-backend.md), each case in its own world:
 *
 *   engaged     large collectives and p2p at n=3 are read across processes
 *               (the cross-process read counter moves) and match a local
 *               reference; with TDIST_CPU_CMA=0 the counter stays at 0 and
 *               the same results come over TCP.
 *   eager       a large send completes before its receive is posted (the
 *               receiver posts only once the send completed, and stages the
 *               payload after TDIST_CPU_DEFER_US), and the data arrives
 *               intact.
 *   exchange    both ranks send a large message to each other, wait for the
 *               send, then receive: no rendezvous deadlock.
 *   aborted     the sender aborts its group and overwrites its buffer before
 *               the receiver posts the receive (staging held off by a 60 s
 *               TDIST_CPU_DEFER_US): the receive fails; it never completes
 *               with the overwritten bytes.
 *   mid_read_receiver, mid_read_sender
 *               a 64 MiB message is read in 4 MiB steps (copy_steps.c); the
 *               receiver (or the sender) aborts a few ms after both posted,
 *               for a few delays, so the abort lands between steps: the
 *               receive completes with the right bytes or fails, the send
 *               completes or fails (the receiver's abort still ACKs the
 *               descriptor: no hang), a receive never completes with bytes
 *               the sender overwrote after its abort, and the receiver frees
 *               its buffer at once (ASan sees any step that comes later).
 */
#include <signal.h>
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
  _Atomic int64_t posted_ms; /* eager: when the receiver posted */
  _Atomic int64_t sent_ms;   /* eager: when the sender's send completed */
  int delay_us;              /* mid_read_*: from both posted to the abort */
  _Atomic int both_posted;   /* mid_read_*: ranks that posted */
};

static void msleep(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static int engaged(int rank, int n, void *arg) {
  struct shared *sh = arg;
  tdist_group_t *g = NULL;
  MP_CHECK_RC(cpu_test_init(sh->port, rank, n, 30000, &g));
  size_t cnt = (3u << 20) + 5; /* 12 MiB of float32, not a multiple of anything */
  float *a = malloc(cnt * 4 * (size_t)n), *b = malloc(cnt * 4 * (size_t)n);
  MP_CHECK(a && b);
  for (size_t i = 0; i < cnt; i++)
    a[i] = (float)((rank + 1) * (int)(i % 1021));
  MP_CHECK_RC(tdist_all_reduce(g, a, a, cnt, TDIST_FLOAT32, TDIST_SUM, NULL, NULL));
  for (size_t i = 0; i < cnt; i++)
    MP_CHECK(a[i] == (float)(6 * (int)(i % 1021)));
  for (size_t i = 0; i < cnt; i++)
    a[i] = (float)(rank * 7 + (int)(i % 89));
  MP_CHECK_RC(tdist_all_gather(g, a, b, cnt, TDIST_FLOAT32, NULL, NULL));
  for (int r = 0; r < n; r++)
    for (size_t i = 0; i < cnt; i++)
      MP_CHECK(b[(size_t)r * cnt + i] == (float)(r * 7 + (int)(i % 89)));
  for (size_t i = 0; i < cnt; i++)
    a[i] = rank == 1 ? (float)(i % 4093) : -1.f;
  MP_CHECK_RC(tdist_broadcast(g, a, cnt, TDIST_FLOAT32, 1, NULL, NULL));
  for (size_t i = 0; i < cnt; i++)
    MP_CHECK(a[i] == (float)(i % 4093));
  /* p2p ring: rank r sends to r+1 */
  for (size_t i = 0; i < cnt; i++)
    a[i] = (float)(rank * 3 + (int)(i % 577));
  tdist_p2p_op_t ops[2] = {{.kind = TDIST_P2P_SEND,
                            .buf = a,
                            .count = cnt,
                            .dtype = TDIST_FLOAT32,
                            .peer = (rank + 1) % n,
                            .tag = 5},
                           {.kind = TDIST_P2P_RECV,
                            .buf = b,
                            .count = cnt,
                            .dtype = TDIST_FLOAT32,
                            .peer = (rank + n - 1) % n,
                            .tag = 5}};
  MP_CHECK_RC(tdist_batch_isend_irecv(g, ops, 2, NULL, NULL));
  int from = (rank + n - 1) % n;
  for (size_t i = 0; i < cnt; i++)
    MP_CHECK(b[i] == (float)(from * 3 + (int)(i % 577)));
  uint64_t reads = atomic_load(&tdist__cpu_cma_reads);
  const char *env = getenv("TDIST_CPU_CMA");
  int off = env && strcmp(env, "0") == 0;
  fprintf(stderr, "[rank %d] cma %s: %llu cross-process reads\n", rank, off ? "off" : "on",
          (unsigned long long)reads);
  MP_CHECK(off ? reads == 0 : reads >= 4);
  /* Ranks of one host talk through shared-memory rings unless told not to
   * (shm_conn.c): none of these messages may have gone over a socket. */
  uint64_t rings = atomic_load(&tdist__cpu_shm_writes);
  const char *shm = getenv("TDIST_CPU_SHM");
  int shm_off = shm && strcmp(shm, "0") == 0;
  fprintf(stderr, "[rank %d] shm %s: %llu ring writes\n", rank, shm_off ? "off" : "on",
          (unsigned long long)rings);
  MP_CHECK(shm_off ? rings == 0 : rings >= 4);
  MP_CHECK_RC(tdist_group_destroy(g));
  free(a);
  free(b);
  return 0;
}

static int eager(int rank, int n, void *arg) {
  struct shared *sh = arg;
  tdist_group_t *g = NULL;
  MP_CHECK_RC(cpu_test_init(sh->port, rank, n, 30000, &g));
  size_t cnt = 2u << 20;
  int32_t *v = malloc(cnt * 4);
  MP_CHECK(v);
  if (rank == 1) {
    for (size_t i = 0; i < cnt; i++)
      v[i] = (int32_t)(i * 2654435761u);
    MP_CHECK_RC(tdist_send(g, v, cnt, TDIST_INT32, 0, NULL));
    atomic_store(&sh->sent_ms, tdist__now_ms());
    memset(v, 0x5a, cnt * 4); /* the send is complete: the buffer is ours again */
  } else {
    /* Post the receive only once the send has completed (or after 20 s, when
     * it never would without the receive: then the check below fails). No
     * fixed sleep: under a sanitizer or a loaded machine the sender may need
     * far longer than any guess to get there. */
    for (int64_t t0 = tdist__now_ms(); !atomic_load(&sh->sent_ms) && tdist__now_ms() - t0 < 20000;)
      msleep(5);
    atomic_store(&sh->posted_ms, tdist__now_ms());
    memset(v, 0, cnt * 4);
    MP_CHECK_RC(tdist_recv(g, v, cnt, TDIST_INT32, 1, NULL));
    for (size_t i = 0; i < cnt; i++)
      MP_CHECK(v[i] == (int32_t)(i * 2654435761u));
    int64_t sent = atomic_load(&sh->sent_ms), posted = atomic_load(&sh->posted_ms);
    fprintf(stderr, "eager: send completed %lld ms before the receive was posted\n",
            (long long)(posted - sent));
    MP_CHECK(sent > 0 && sent <= posted);
  }
  MP_CHECK_RC(tdist_barrier(g, NULL, NULL));
  MP_CHECK_RC(tdist_group_destroy(g));
  free(v);
  return 0;
}

static int exchange(int rank, int n, void *arg) {
  struct shared *sh = arg;
  tdist_group_t *g = NULL;
  MP_CHECK_RC(cpu_test_init(sh->port, rank, n, 30000, &g));
  size_t cnt = 3u << 20;
  int64_t *s = malloc(cnt * 8), *r = malloc(cnt * 8);
  MP_CHECK(s && r);
  for (int it = 0; it < 4; it++) {
    for (size_t i = 0; i < cnt; i++)
      s[i] = (int64_t)(rank * 1000003 + it) * (int64_t)i;
    MP_CHECK_RC(tdist_send(g, s, cnt, TDIST_INT64, 1 - rank, NULL));
    MP_CHECK_RC(tdist_recv(g, r, cnt, TDIST_INT64, 1 - rank, NULL));
    for (size_t i = 0; i < cnt; i++)
      MP_CHECK(r[i] == (int64_t)((1 - rank) * 1000003 + it) * (int64_t)i);
  }
  MP_CHECK_RC(tdist_group_destroy(g));
  free(s);
  free(r);
  return 0;
}

static int aborted(int rank, int n, void *arg) {
  struct shared *sh = arg;
  tdist_group_t *g = NULL;
  MP_CHECK_RC(cpu_test_init(sh->port, rank, n, 10000, &g));
  size_t cnt = 1u << 20;
  int32_t *v = malloc(cnt * 4);
  MP_CHECK(v);
  MP_CHECK_RC(tdist_barrier(g, NULL, NULL));
  if (rank == 1) {
    for (size_t i = 0; i < cnt; i++)
      v[i] = (int32_t)i;
    tdist_work_t *w = NULL;
    MP_CHECK_RC(tdist_isend(g, v, cnt, TDIST_INT32, 0, NULL, &w));
    msleep(50); /* the descriptor is at rank 0, unread */
    MP_CHECK(!tdist_work_is_completed(w));
    MP_CHECK_RC(tdist_group_abort(g, "test: sender gives up"));
    int rc = tdist_work_wait(w, -1);
    MP_CHECK(rc != 0);
    memset(v, 0xee, cnt * 4);                    /* the failed send handed the buffer back */
    atomic_store(&sh->sent_ms, tdist__now_ms()); /* tell rank 0: reused */
    tdist_work_release(w);
    for (int64_t t0 = tdist__now_ms();
         !atomic_load(&sh->posted_ms) && tdist__now_ms() - t0 < 20000;)
      msleep(5);
  } else {
    /* Only once the sender has aborted and reused its buffer (no fixed
     * sleep: a loaded machine may take longer than any guess). */
    for (int64_t t0 = tdist__now_ms(); !atomic_load(&sh->sent_ms) && tdist__now_ms() - t0 < 20000;)
      msleep(5);
    memset(v, 0, cnt * 4);
    int rc = tdist_recv(g, v, cnt, TDIST_INT32, 1, NULL);
    fprintf(stderr, "aborted: the receive returned %s: %s\n", tdist_err_name(rc),
            tdist_last_error());
    /* Failed, whatever it holds (a failed op's buffer is undefined): it
     * must never complete with bytes the sender reused. */
    MP_CHECK(rc != 0);
    atomic_store(&sh->posted_ms, tdist__now_ms());
  }
  tdist_group_destroy(g);
  free(v);
  return 0;
}

/* mid_read_*: rank `aborter` aborts the group delay_us after both posted. */
static int mid_read(int rank, struct shared *sh, int aborter) {
  tdist_group_t *g = NULL;
  MP_CHECK_RC(cpu_test_init(sh->port, rank, 2, 20000, &g));
  size_t cnt = (64u << 20) / 4;
  int32_t *v = malloc(cnt * 4);
  MP_CHECK(v);
  for (size_t i = 0; i < cnt; i++)
    v[i] = rank == 1 ? (int32_t)(i * 7 + 1) : 0;
  MP_CHECK_RC(tdist_barrier(g, NULL, NULL));
  tdist_work_t *w = NULL;
  if (rank == 0)
    MP_CHECK_RC(tdist_irecv(g, v, cnt, TDIST_INT32, 1, NULL, &w));
  else
    MP_CHECK_RC(tdist_isend(g, v, cnt, TDIST_INT32, 0, NULL, &w));
  atomic_fetch_add(&sh->both_posted, 1);
  for (int64_t t0 = tdist__now_ms();
       atomic_load(&sh->both_posted) < 2 && tdist__now_ms() - t0 < 20000;)
    usleep(100);
  if (rank == aborter) {
    usleep((useconds_t)sh->delay_us);
    MP_CHECK_RC(tdist_group_abort(g, "test: gives up mid-read"));
  }
  int rc = tdist_work_wait(w, 30000);
  MP_CHECK(rc != TDIST_ERR_TIMEOUT);                       /* a dropped read must still ACK */
  if (rank == 1 && aborter == 1) memset(v, 0xee, cnt * 4); /* handed back: reused */
  if (rank == 0 && rc == 0)
    for (size_t i = 0; i < cnt; i++)
      MP_CHECK(v[i] == (int32_t)(i * 7 + 1));
  tdist_work_release(w);
  if (rank == 0) free(v); /* at once: no step may touch it any more */
  tdist_group_destroy(g);
  if (rank == 1) free(v);
  return 0;
}

static int mid_read_receiver(int rank, int n, void *arg) {
  (void)n;
  return mid_read(rank, arg, 0);
}

static int mid_read_sender(int rank, int n, void *arg) {
  (void)n;
  return mid_read(rank, arg, 1);
}

static int run(const char *name, tdist_mp_fn fn, int n, struct shared *sh) {
  sh->port = tdist_mp_free_port();
  atomic_store(&sh->posted_ms, 0);
  atomic_store(&sh->sent_ms, 0);
  atomic_store(&sh->both_posted, 0);
  int bad = tdist_mp_run(n, fn, sh, 90);
  printf("cpu_cma %s: %s\n", name, bad ? "FAILED" : "ok");
  return bad != 0;
}

int main(void) {
  struct shared *sh =
      mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (sh == MAP_FAILED) return 1;
  int fails = 0;
  /* These cases test the engine's transports (single copy, the rings):
   * collectives over the group's shared segment (TDIST_CPU_SC, sc_*.c)
   * would carry the all_reduce and all_gather instead (test_cpu_sc.c). */
  setenv("TDIST_CPU_SC", "0", 1);
  fails += run("engaged", engaged, 3, sh);
  setenv("TDIST_CPU_CMA", "0", 1);
  fails += run("engaged (TDIST_CPU_CMA=0)", engaged, 3, sh);
  setenv("TDIST_CPU_SHM", "0", 1);
  fails += run("engaged (TDIST_CPU_CMA=0 TDIST_CPU_SHM=0)", engaged, 3, sh);
  unsetenv("TDIST_CPU_CMA");
  fails += run("engaged (TDIST_CPU_SHM=0)", engaged, 3, sh);
  unsetenv("TDIST_CPU_SHM");
  fails += run("eager", eager, 2, sh);
  fails += run("exchange", exchange, 2, sh);
  setenv("TDIST_CPU_DEFER_US", "60000000", 1);
  fails += run("aborted", aborted, 2, sh);
  unsetenv("TDIST_CPU_DEFER_US");
  const int delays[] = {0, 1000, 3000, 8000};
  for (int i = 0; i < 4; i++) {
    sh->delay_us = delays[i];
    fails += run("mid_read_receiver", mid_read_receiver, 2, sh);
    fails += run("mid_read_sender", mid_read_sender, 2, sh);
  }
  return fails != 0;
}
