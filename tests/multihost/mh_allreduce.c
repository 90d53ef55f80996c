/*
 * mh_allreduce - the rank program of the multi-host tests (tests/multihost):
 * checked all_reduce loops whose every result is compared element by element
 * with a reference, plus a check that single-copy transfers (cma.c) are never
 * used between ranks of different hosts and are used within one.
 *
 *   mh_allreduce [--iters N] [--loop SECONDS] [--ready-after K]
 *
 * Topology: ranks are placed in blocks of LOCAL_WORLD_SIZE per host (as
 * tdistrun --nnodes does; without it, OMPI_COMM_WORLD_LOCAL_SIZE, else the
 * whole job is one host). Rank, size and local rank come from the library
 * (tdist_init_process_group reads RANK, SLURM_PROCID or OMPI_COMM_WORLD_RANK);
 * the program prints what it got so the drivers can check srun/mpirun runs.
 *
 * Check mode (default), three phases of N iterations each:
 *   A. cross-host groups {r : r % L == k}, one rank per host, large and small
 *      all_reduces: neither tdist__cpu_cma_reads nor tdist__cpu_sc_ops may
 *      move (TCP only between hosts);
 *   B. the world group, sizes from 8 B to 1.2 MiB;
 *   C. host-local groups {ranks of one host}: with MH_EXPECT_LOCAL_CMA=1 and
 *      two or more ranks per host, a host-local path must have been used
 *      here: single copy, or the group's shared segment (sc_*.c, which
 *      carries a host-local group's collectives).
 * Loop mode (--loop S, for fault injection): world all_reduces until one
 * fails or S seconds pass. "MH READY" after K good iterations; on failure
 * "MH FAIL" with the code, the wall-clock time (CLOCK_REALTIME: one clock for
 * every namespace of this kernel, so the driver can measure detection
 * latency) and the message; then the rank waits for SIGTERM (up to 120 s)
 * instead of exiting, so that its closing sockets cannot reach a survivor
 * that has not reported yet and be blamed for the failure.
 *
 * Output lines (one write each, parsed by the drivers):
 *   MH START rank=R size=S local=L node=H env_rank=E
 *   MH PHASE name=... iters=N cma_reads=D sc_ops=S
 *   MH OK rank=R checked=C cma_cross=X cma_local=Y sc_cross=U sc_local=V
 *   MH READY rank=R
 *   MH FAIL rank=R iter=I code=NAME t_ns=T msg=...
 *   MH WRONG rank=R iter=I idx=J got=G want=W
 * Exit: 0 ok, 3 an op failed, 4 wrong result, 5 single copy between hosts,
 * 6 single copy missing within a host, 2 usage / setup.
 */
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tdist/tdist.h"

extern _Atomic uint64_t
    tdist__cpu_cma_reads; /* src/cpu/engine/cma.c: payloads read by single copy */
extern _Atomic uint64_t
    tdist__cpu_sc_ops; /* src/cpu/segment/sc_op.c: collectives in shared memory */

static int g_rank = -1;

/* Element counts per iteration, cycled: 8 B .. 1.2 MiB, so both TCP-only and
 * single-copy sizes (TDIST_CPU_CMA_BYTES, 256 KiB) and both all_reduce
 * algorithms (recursive doubling, ring) run. */
static const size_t sizes[] = {2, 1000, 70000, 300000, 17};
#define NSIZES (sizeof(sizes) / sizeof(sizes[0]))
#define MAXCOUNT 300000

static int64_t now_ns(clockid_t c) {
  struct timespec ts;
  clock_gettime(c, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int env_int(const char *name, int dflt) {
  const char *v = getenv(name);
  return v && *v ? atoi(v) : dflt;
}

/* Small integers: float32 sums are exact in any order. */
static float value(int grank, int iter, size_t i) {
  return (float)((int)((unsigned)(grank * 7 + iter * 3) + (unsigned)i) % 13 - 6);
}

/* Park after a reported failure (see the header), then leave. */
static void park_and_exit(int code) {
  sigset_t s;
  sigemptyset(&s);
  sigaddset(&s, SIGTERM);
  sigaddset(&s, SIGINT);
  sigprocmask(SIG_BLOCK, &s, NULL);
  struct timespec t = {120, 0};
  sigtimedwait(&s, NULL, &t);
  _exit(code);
}

/* One checked all_reduce of sizes[iter % NSIZES] floats on g, whose members
 * are world ranks members[0..n). 0 ok; else the exit code (after printing). */
static int checked(tdist_group_t *g, const int *members, int n, int iter, float *buf, int park) {
  size_t count = sizes[iter % NSIZES];
  int me = tdist_group_global_rank(g, tdist_group_rank(g));
  for (size_t i = 0; i < count; i++)
    buf[i] = value(me, iter, i);
  tdist_work_t *w = NULL;
  int rc = tdist_all_reduce(g, buf, buf, count, TDIST_FLOAT32, TDIST_SUM, NULL, &w);
  const char *msg = rc ? tdist_last_error() : NULL;
  if (rc == 0) {
    rc = tdist_work_wait(w, 0);
    if (rc == 0) rc = tdist_work_status(w);
    if (rc) msg = tdist_work_error_message(w);
  }
  if (rc) {
    printf("MH FAIL rank=%d iter=%d code=%s t_ns=%lld msg=%s\n", g_rank, iter, tdist_err_name(rc),
           (long long)now_ns(CLOCK_REALTIME), msg ? msg : "?");
    fflush(stdout);
    if (park) park_and_exit(3);
    return 3;
  }
  tdist_work_release(w);
  for (size_t i = 0; i < count; i++) {
    float want = 0;
    for (int r = 0; r < n; r++)
      want += value(members[r], iter, i);
    if (buf[i] != want) {
      printf("MH WRONG rank=%d iter=%d idx=%zu got=%g want=%g\n", g_rank, iter, i, (double)buf[i],
             (double)want);
      fflush(stdout);
      return 4;
    }
  }
  return 0;
}

/* Every world rank creates the subgroups {r : key(r) == k} for each k in
 * turn (new_group is collective over the world), keeping its own. */
static int my_subgroup(tdist_group_t *world, int ngroups, int (*key)(int, int), int arg,
                       tdist_group_t **mine, int *members, int *nmembers) {
  int size = tdist_group_size(world), me = tdist_group_rank(world);
  int *ranks = malloc(sizeof(int) * (size_t)size);
  if (!ranks) return -1;
  for (int k = 0; k < ngroups; k++) {
    int n = 0;
    for (int r = 0; r < size; r++)
      if (key(r, arg) == k) ranks[n++] = r;
    tdist_group_t *g = NULL;
    if (tdist_new_group(world, ranks, n, NULL, &g) != 0) {
      fprintf(stderr, "MH rank %d: tdist_new_group: %s\n", me, tdist_last_error());
      free(ranks);
      return -1;
    }
    if (key(me, arg) == k) {
      *mine = g;
      memcpy(members, ranks, sizeof(int) * (size_t)n);
      *nmembers = n;
    }
  }
  free(ranks);
  return 0;
}

static int key_cross(int r, int local_size) { return r % local_size; }
static int key_host(int r, int local_size) { return r / local_size; }

int main(int argc, char **argv) {
  int iters = 10, ready_after = 3;
  double loop_s = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--iters") && i + 1 < argc)
      iters = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--loop") && i + 1 < argc)
      loop_s = atof(argv[++i]);
    else if (!strcmp(argv[i], "--ready-after") && i + 1 < argc)
      ready_after = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: %s [--iters N] [--loop SECONDS] [--ready-after K]\n", argv[0]);
      return 2;
    }
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  tdist_group_t *world = NULL;
  if (tdist_init_process_group(NULL, &world) != 0) {
    fprintf(stderr, "MH init failed: %s\n", tdist_last_error());
    return 2;
  }
  g_rank = tdist_group_rank(world);
  int size = tdist_group_size(world);
  int local_size = env_int("LOCAL_WORLD_SIZE", env_int("OMPI_COMM_WORLD_LOCAL_SIZE", size));
  if (local_size < 1 || size % local_size) local_size = size;
  /* Open MPI before Slurm, as the library's rank: under mpirun inside a
   * Slurm step every process inherits the step's SLURM_LOCALID. */
  int local = env_int("LOCAL_RANK", env_int("OMPI_COMM_WORLD_LOCAL_RANK",
                                            env_int("SLURM_LOCALID", g_rank % local_size)));
  int env_rank = env_int("RANK", env_int("OMPI_COMM_WORLD_RANK", env_int("SLURM_PROCID", -1)));
  int nodes = size / local_size;
  printf("MH START rank=%d size=%d local=%d node=%d env_rank=%d\n", g_rank, size, local,
         g_rank / local_size, env_rank);
  float *buf = malloc(sizeof(float) * MAXCOUNT);
  int *members = malloc(sizeof(int) * (size_t)size);
  int *all = malloc(sizeof(int) * (size_t)size);
  if (!buf || !members || !all) return 2;
  for (int r = 0; r < size; r++)
    all[r] = r;
  int rc = 0;

  if (loop_s > 0) { /* fault mode: world only */
    int64_t end = now_ns(CLOCK_MONOTONIC) + (int64_t)(loop_s * 1e9);
    int it = 0;
    for (; now_ns(CLOCK_MONOTONIC) < end; it++) {
      if ((rc = checked(world, all, size, it, buf, 1)) != 0) return rc;
      if (it + 1 == ready_after) printf("MH READY rank=%d\n", g_rank);
      usleep(2000); /* leave the 2 cores some air: heartbeats must keep flowing */
    }
    printf("MH NOFAIL rank=%d iters=%d\n", g_rank, it);
    return 7;
  }

  int checks = 0;
  uint64_t cma_cross = 0, cma_local = 0, sc_cross = 0, sc_local = 0;
  if (nodes > 1) { /* A: one rank per host */
    tdist_group_t *g = NULL;
    int n = 0;
    if (my_subgroup(world, local_size, key_cross, local_size, &g, members, &n) != 0) return 2;
    uint64_t before = atomic_load(&tdist__cpu_cma_reads), sc0 = atomic_load(&tdist__cpu_sc_ops);
    for (int it = 0; it < iters && !rc; it++, checks++)
      rc = checked(g, members, n, it, buf, 0);
    cma_cross = atomic_load(&tdist__cpu_cma_reads) - before;
    sc_cross = atomic_load(&tdist__cpu_sc_ops) - sc0;
    printf("MH PHASE name=cross iters=%d cma_reads=%llu sc_ops=%llu\n", iters,
           (unsigned long long)cma_cross, (unsigned long long)sc_cross);
    if (!rc && (cma_cross || sc_cross)) rc = 5;
    if (tdist_group_destroy(g) != 0 && !rc) rc = 3;
  }
  for (int it = 0; it < iters && !rc; it++, checks++) /* B: the world */
    rc = checked(world, all, size, it, buf, 0);
  if (!rc) printf("MH PHASE name=world iters=%d\n", iters);
  if (!rc && local_size > 1) { /* C: within each host */
    tdist_group_t *g = NULL;
    int n = 0;
    if (my_subgroup(world, nodes, key_host, local_size, &g, members, &n) != 0) return 2;
    uint64_t before = atomic_load(&tdist__cpu_cma_reads), sc0 = atomic_load(&tdist__cpu_sc_ops);
    for (int it = 0; it < iters && !rc; it++, checks++)
      rc = checked(g, members, n, it, buf, 0);
    cma_local = atomic_load(&tdist__cpu_cma_reads) - before;
    sc_local = atomic_load(&tdist__cpu_sc_ops) - sc0;
    printf("MH PHASE name=local iters=%d cma_reads=%llu sc_ops=%llu\n", iters,
           (unsigned long long)cma_local, (unsigned long long)sc_local);
    if (!rc && !cma_local && !sc_local && env_int("MH_EXPECT_LOCAL_CMA", 0)) rc = 6;
    if (tdist_group_destroy(g) != 0 && !rc) rc = 3;
  }
  if (rc == 0)
    printf("MH OK rank=%d checked=%d cma_cross=%llu cma_local=%llu sc_cross=%llu sc_local=%llu\n",
           g_rank, checks, (unsigned long long)cma_cross, (unsigned long long)cma_local,
           (unsigned long long)sc_cross, (unsigned long long)sc_local);
  else
    fprintf(stderr, "MH rank %d: exit %d\n", g_rank, rc);
  if (rc) tdist_group_abort(world, "mh_allreduce: check failed"); /* peers fail fast */
  int drc = tdist_group_destroy(world);
  free(buf);
  free(members);
  free(all);
  return rc ? rc : drc ? 3 : 0;
}
