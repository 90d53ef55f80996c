/*
 * test_cpu_sc.c - collectives over a group's shared segment (src/cpu/sc_*.c,
 * docs/cpu-backend.md "Collectives in shared memory"), between forked ranks
 * of one host, at one world size (argv[1], default 2; ctest runs 2..4).
 * Every result is checked against a reference computed locally.
 *
 *   sweep     every collective sc runs, at sizes around its thresholds: data
 *             inline in the step line (<= 40 bytes), one slot, a slot and a
 *             byte, and more steps than slots (slots reused), in place and
 *             out of place, rotating roots; none of it may go through the
 *             rings or single copy, and sc must have run them;
 *   vops      all_to_all_v, all_gather_v, reduce_scatter_v with random counts
 *             (zeros included, skewed to hundreds of KB);
 *   a2av_big  all_to_all_v with blocks around TDIST_CPU_SC_CMA_BYTES (1 MiB)
 *             and over a piece (4 MiB): the large ones are read in place
 *             from their giver (single copy: the counter moves), the small
 *             ones pass through the slots, in one op; every giver scribbles
 *             over its send buffer as soon as its op completes, so one that
 *             completed before its readers had read would be caught;
 *   a2av_rule the same by default with one CPU while the group is made:
 *             read in place from n = 3 (more than two members a CPU),
 *             never at n = 2;
 *   ahead     a broadcast root completes 15 ops, then one of 24 MiB, before
 *             any receiver posts (the receivers wait for a flag the root
 *             sets afterwards): the last overflows (sc_ovf.c); 16 ops
 *             ahead unchecked (the engine's bound, CPU_LAG_MAX; over the
 *             segment SC_LAG, see deep);
 *   async     ops left to the progress threads (the callers sleep): they
 *             complete, big ones too, so the bells work; 8 in flight at once;
 *   deep      10000 async broadcasts posted at once by the root and all but
 *             one receiver, mixed sizes (inline in a step line, in a slot,
 *             over a slot), while the last receiver posts its own slowly:
 *             the root runs ahead until its step lines (4096), slots or
 *             lag (SC_LAG) are used up and waits, and its signature entries
 *             (8192) wrap while the slow receiver still reads older ones;
 *             every result checked;
 *   mixed     sc ops, a gather_v (the engine's: sc does not run it), a
 *             large broadcast, p2p, in one group, in order;
 *   threads   two groups of the same ranks used by two threads at once;
 *   lazy      with connections made on first use, collectives need none.
 *   warm      a group's slots are mapped in its first op that uses them:
 *             seven 1 MiB all_reduces after the first fault no page in
 *             (getrusage's minor faults; left to each step, the second
 *             took about 512: the slots it reached first);
 *   warm_bcast  after eight 1 MiB broadcasts from rank 0, every process has
 *             mapped the lines of every member and the slots of rank 0
 *             only (the segment's resident set in /proc/self/smaps): a
 *             receiver maps no other member's slots, which no one wrote;
 *   small_mismatch_{dtype,count,redop}  the last rank disagrees on a small
 *             all_reduce (int32 vs float32 of the same bytes, 2 vs 3
 *             elements, SUM vs MAX): every rank fails MISMATCH, the message
 *             names the op and both sides. Small ops carry the signature in
 *             the data's step line (sc_op.c, step_sig), read in place of the
 *             signature ring; this is that path's check.
 *   small_mismatch_slot  the same at 1 KiB (256 vs 257 int32): the data in
 *             a slot, the signatures in the ring only.
 *   small_mismatch_bcast  the same for a small broadcast (2 vs 3 elements),
 *             whose root is done in its submit (the now lane): a rank whose
 *             broadcast succeeded (checked later) fails at its next op.
 *   small_mismatch_bcast_late  the same, the receivers posting only once
 *             the root's broadcast returned: each finds the root's step in
 *             and reads the disagreement in its line (the now lane's taker).
 *   small_mismatch_gather  the same for a small all_gather (2 vs 3 int32):
 *             every rank fails at the op itself.
 *   lanes_mismatch{,_bcast}  the last rank disagrees on the count of an
 *             all_reduce (a broadcast from rank 0) across
 *             TDIST_CPU_SC_MAX_BYTES (1 KiB here): its op runs on the
 *             engine, the others' over the segment; every rank fails
 *             MISMATCH naming both counts (the root at its next op).
 *   small_mismatch_givers  every rank broadcasts as the root, 2000 times
 *             at most: givers all, none checks before completing, so none
 *             may drop a check on the others' vseq; each fails MISMATCH
 *             naming collective #1 within the stream, or at its next
 *             all_reduce where it ran them all before the others signed.
 */
#include <sched.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include "util/clock.h"
#include "cpu_test_util.h"

struct shared {
  int port;
  _Atomic int flag;
  int variant; /* small_mismatch: which argument the last rank changes */
};

static void msleep(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

#define CHECKV(buf, i, want)                                                                 \
  do {                                                                                       \
    double g_ = get_el(buf, TDIST_INT32, i), w_ = (want);                                    \
    if (g_ != w_) {                                                                          \
      fprintf(stderr, "[rank %d] %s count %zu: element %zu is %g, want %g\n", rank, op, cnt, \
              (size_t)(i), g_, w_);                                                          \
      return 1;                                                                              \
    }                                                                                        \
  } while (0)

/* Element i of rank r's input, op case k: a small integer (sums exact). */
static int32_t in(int r, size_t i, int k) {
  return (int32_t)((r * 31 + (int)(i % 997) * 7 + k) % 23) - 11;
}

/* One size: every fixed-size collective on g, checked. */
static int sweep_one(tdist_group_t *g, int rank, int n, size_t cnt, int k) {
  const char *op = "";
  size_t big = cnt * (size_t)n + 16;
  int32_t *a = calloc(big, 4), *b = calloc(big, 4);
  MP_CHECK(a && b);
  int root = (int)(k % (size_t)n);
  /* all_reduce in place, SUM */
  op = "all_reduce";
  for (size_t i = 0; i < cnt; i++)
    a[i] = in(rank, i, k);
  MP_CHECK_RC(tdist_all_reduce(g, a, a, cnt, TDIST_INT32, TDIST_SUM, NULL, NULL));
  for (size_t i = 0; i < cnt; i++) {
    int32_t w = 0;
    for (int r = 0; r < n; r++)
      w += in(r, i, k);
    CHECKV(a, i, w);
  }
  /* all_reduce out of place, MAX */
  for (size_t i = 0; i < cnt; i++)
    a[i] = in(rank, i, k + 1);
  MP_CHECK_RC(tdist_all_reduce(g, a, b, cnt, TDIST_INT32, TDIST_MAX, NULL, NULL));
  for (size_t i = 0; i < cnt; i++) {
    int32_t w = in(0, i, k + 1);
    for (int r = 1; r < n; r++)
      w = in(r, i, k + 1) > w ? in(r, i, k + 1) : w;
    CHECKV(b, i, w);
  }
  /* broadcast from a rotating root */
  op = "broadcast";
  for (size_t i = 0; i < cnt; i++)
    a[i] = rank == root ? in(root, i, k + 2) : -99;
  MP_CHECK_RC(tdist_broadcast(g, a, cnt, TDIST_INT32, root, NULL, NULL));
  for (size_t i = 0; i < cnt; i++)
    CHECKV(a, i, in(root, i, k + 2));
  /* reduce to a rotating root, SUM; a non-root's recvbuf is untouched */
  op = "reduce";
  for (size_t i = 0; i < cnt; i++)
    a[i] = in(rank, i, k + 3), b[i] = -77;
  MP_CHECK_RC(tdist_reduce(g, a, b, cnt, TDIST_INT32, TDIST_SUM, root, NULL, NULL));
  for (size_t i = 0; i < cnt; i++) {
    int32_t w = 0;
    for (int r = 0; r < n; r++)
      w += in(r, i, k + 3);
    CHECKV(b, i, rank == root ? w : -77);
  }
  /* all_gather out of place, then in place (own block already in recvbuf) */
  op = "all_gather";
  for (size_t i = 0; i < cnt; i++)
    a[i] = in(rank, i, k + 4);
  MP_CHECK_RC(tdist_all_gather(g, a, b, cnt, TDIST_INT32, NULL, NULL));
  for (int r = 0; r < n; r++)
    for (size_t i = 0; i < cnt; i++)
      CHECKV(b, (size_t)r * cnt + i, in(r, i, k + 4));
  for (size_t i = 0; i < cnt * (size_t)n; i++)
    b[i] = -5;
  for (size_t i = 0; i < cnt; i++)
    b[(size_t)rank * cnt + i] = in(rank, i, k + 5);
  MP_CHECK_RC(tdist_all_gather(g, b + (size_t)rank * cnt, b, cnt, TDIST_INT32, NULL, NULL));
  for (int r = 0; r < n; r++)
    for (size_t i = 0; i < cnt; i++)
      CHECKV(b, (size_t)r * cnt + i, in(r, i, k + 5));
  /* gather, scatter */
  op = "gather";
  for (size_t i = 0; i < cnt; i++)
    a[i] = in(rank, i, k + 6);
  MP_CHECK_RC(tdist_gather(g, a, b, cnt, TDIST_INT32, root, NULL, NULL));
  if (rank == root)
    for (int r = 0; r < n; r++)
      for (size_t i = 0; i < cnt; i++)
        CHECKV(b, (size_t)r * cnt + i, in(r, i, k + 6));
  op = "scatter";
  for (size_t i = 0; i < cnt * (size_t)n; i++)
    b[i] = rank == root ? in((int)(i / (cnt ? cnt : 1)), i % (cnt ? cnt : 1), k + 7) : 0;
  MP_CHECK_RC(tdist_scatter(g, b, a, cnt, TDIST_INT32, root, NULL, NULL));
  for (size_t i = 0; i < cnt; i++)
    CHECKV(a, i, in(rank, i, k + 7));
  /* reduce_scatter out of place, then in place (output over its own block) */
  op = "reduce_scatter";
  for (size_t i = 0; i < cnt * (size_t)n; i++)
    b[i] = in(rank, i, k + 8);
  MP_CHECK_RC(tdist_reduce_scatter(g, b, a, cnt, TDIST_INT32, TDIST_SUM, NULL, NULL));
  for (size_t i = 0; i < cnt; i++) {
    int32_t w = 0;
    for (int r = 0; r < n; r++)
      w += in(r, (size_t)rank * cnt + i, k + 8);
    CHECKV(a, i, w);
  }
  MP_CHECK_RC(
      tdist_reduce_scatter(g, b, b + (size_t)rank * cnt, cnt, TDIST_INT32, TDIST_SUM, NULL, NULL));
  for (size_t i = 0; i < cnt; i++) {
    int32_t w = 0;
    for (int r = 0; r < n; r++)
      w += in(r, (size_t)rank * cnt + i, k + 8);
    CHECKV(b, (size_t)rank * cnt + i, w);
  }
  /* all_to_all */
  op = "all_to_all";
  for (size_t i = 0; i < cnt * (size_t)n; i++)
    b[i] = in(rank, i, k + 9);
  MP_CHECK_RC(tdist_all_to_all(g, b, a, cnt, TDIST_INT32, NULL, NULL));
  for (int r = 0; r < n; r++)
    for (size_t i = 0; i < cnt; i++)
      CHECKV(a, (size_t)r * cnt + i, in(r, (size_t)rank * cnt + i, k + 9));
  MP_CHECK_RC(tdist_barrier(g, NULL, NULL));
  free(a);
  free(b);
  return 0;
}

static int sweep(int rank, int n, void *arg) {
  struct shared *sh = arg;
  tdist_group_t *g = NULL;
  MP_CHECK_RC(cpu_test_init(sh->port, rank, n, 60000, &g));
  /* 128 KiB slots by default: 32768 int32; 10 fit in the step line. */
  static const size_t counts[] = {0, 1, 10, 11, 1000, 32767, 32768, 32769, 300001};
  int many = TEST_TSAN ? 8 : 9;
  uint64_t rings0 = atomic_load(&tdist__cpu_shm_writes), cma0 = atomic_load(&tdist__cpu_cma_reads);
  uint64_t ops0 = atomic_load(&tdist__cpu_sc_ops);
  for (int c = 0; c < many; c++)
    if (sweep_one(g, rank, n, counts[c], c)) return 1;
  /* Twelve ops a size, all over the segment. */
  uint64_t ops = atomic_load(&tdist__cpu_sc_ops) - ops0;
  fprintf(stderr, "[rank %d] sc ops %llu, ring writes %llu, single-copy reads %llu\n", rank,
          (unsigned long long)ops,
          (unsigned long long)(atomic_load(&tdist__cpu_shm_writes) - rings0),
          (unsigned long long)(atomic_load(&tdist__cpu_cma_reads) - cma0));
  MP_CHECK(ops >= (uint64_t)(12 * many));
  /* Many small ops in a row: the slots and the signature ring wrap. */
  for (int it = 0; it < 300; it++) {
    int32_t v = rank + it, w = 0;
    MP_CHECK_RC(tdist_all_reduce(g, &v, &v, 1, TDIST_INT32, TDIST_SUM, NULL, NULL));
    for (int r = 0; r < n; r++)
      w += r + it;
    MP_CHECK(v == w);
    int32_t x = rank == it % n ? it : -1;
    MP_CHECK_RC(tdist_broadcast(g, &x, 1, TDIST_INT32, it % n, NULL, NULL));
    MP_CHECK(x == it);
  }
  MP_CHECK_RC(tdist_group_destroy(g));
  return 0;
}

/* ---- v-ops ------------------------------------------------------------------------ */

static uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* Elements rank i sends rank j in trial t: zeros, small, a few large. */
static size_t vcount(int i, int j, int t) {
  uint64_t h = mix(((uint64_t)t << 16) ^ ((uint64_t)i << 8) ^ (uint64_t)j) % 10;
  return h < 2 ? 0 : h < 8 ? (size_t)(h * 37 + (size_t)i) : (size_t)(h * 20000 + (size_t)j);
}

static int32_t vval(int src, int dst, size_t i, int t) {
  return (int32_t)(src * 1000003 + dst * 101 + (int)i + t);
}

static int vops(int rank, int n, void *arg) {
  struct shared *sh = arg;
  tdist_group_t *g = NULL;
  MP_CHECK_RC(cpu_test_init(sh->port, rank, n, 60000, &g));
  size_t sc[8], sd[8], rc[8], rd[8];
  for (int t = 0; t < (TEST_TSAN ? 3 : 8); t++) {
    size_t st = 0, rt = 0;
    for (int j = 0; j < n; j++) {
      sc[j] = vcount(rank, j, t);
      rc[j] = vcount(j, rank, t);
      sd[j] = st + (size_t)j; /* gaps between the blocks */
      rd[j] = rt + 2 * (size_t)j;
      st = sd[j] + sc[j];
      rt = rd[j] + rc[j];
    }
    int32_t *s = calloc(st + 1, 4), *r = calloc(rt + 1, 4);
    MP_CHECK(s && r);
    for (int j = 0; j < n; j++)
      for (size_t i = 0; i < sc[j]; i++)
        s[sd[j] + i] = vval(rank, j, i, t);
    MP_CHECK_RC(tdist_all_to_all_v(g, s, sc, sd, r, rc, rd, TDIST_INT32, NULL, NULL));
    for (int j = 0; j < n; j++)
      for (size_t i = 0; i < rc[j]; i++)
        MP_CHECK(r[rd[j] + i] == vval(j, rank, i, t));
    /* all_gather_v: rank j gives vcount(j, j, t) elements */
    size_t mine = vcount(rank, rank, t), tot = 0, ag[8];
    for (int j = 0; j < n; j++)
      ag[j] = vcount(j, j, t), tot += ag[j];
    int32_t *x = calloc(mine + 1, 4), *y = calloc(tot + 1, 4);
    MP_CHECK(x && y);
    for (size_t i = 0; i < mine; i++)
      x[i] = vval(rank, rank, i, t);
    MP_CHECK_RC(tdist_all_gather_v(g, x, mine, y, ag, NULL, TDIST_INT32, NULL, NULL));
    for (int j = 0, o = 0; j < n; o += (int)ag[j], j++)
      for (size_t i = 0; i < ag[j]; i++)
        MP_CHECK(y[(size_t)o + i] == vval(j, j, i, t));
    /* reduce_scatter_v: everyone's input has the same counts ag[] */
    int32_t *in2 = calloc(tot + 1, 4), *out = calloc(mine + 1, 4);
    MP_CHECK(in2 && out);
    for (size_t i = 0; i < tot; i++)
      in2[i] = (int32_t)(rank + 1) * (int32_t)(i % 13);
    MP_CHECK_RC(tdist_reduce_scatter_v(g, in2, out, ag, TDIST_INT32, TDIST_SUM, NULL, NULL));
    size_t before = 0;
    for (int j = 0; j < rank; j++)
      before += ag[j];
    for (size_t i = 0; i < mine; i++)
      MP_CHECK(out[i] == (int32_t)(n * (n + 1) / 2) * (int32_t)((before + i) % 13));
    free(s), free(r), free(x), free(y), free(in2), free(out);
  }
  MP_CHECK_RC(tdist_group_destroy(g));
  return 0;
}

/* ---- all_to_all_v read in place ------------------------------------------------------ */

/* Elements rank i sends rank j in trial t: a slot's chunk or less, just
 * under and at the segment's read-in-place threshold (TDIST_CPU_SC_CMA_BYTES,
 * LEND int32), over a piece (4 MiB at n <= 4). Trial A2AV_SKEW: rank 0
 * sends one element to each rank, which the now lane takes on its own
 * (sc_op.c, now_a2av), and is sent a lent block by every other rank:
 * its one step reads them in place (tdist__cpu_sc_a2av_take). */
#define LEND (262144u)
#define A2AV_SKEW 7
static size_t bcount(int i, int j, int t) {
  static const size_t c[] = {0, 1, 5000, LEND - 1, LEND, 300001, 1100003}; /* 4.4 MiB: 2 pieces */
  if (t == A2AV_SKEW) return i != 0 && j == 0 ? LEND + 3 : 1;
  return c[(size_t)(i * 3 + j * 5 + t) % 7];
}

/* Join the test's group; one_cpu: with this process held to the CPU it
 * runs on while the group is made (the segment counts the CPUs then:
 * sc_chan.c, crowded and lend), its affinity given back after. */
static int init_on_cpus(struct shared *sh, int rank, int n, int one_cpu, tdist_group_t **g) {
  cpu_set_t cpus, one;
  if (one_cpu) {
    MP_CHECK(sched_getaffinity(0, sizeof(cpus), &cpus) == 0 && sched_getcpu() >= 0);
    CPU_ZERO(&one);
    CPU_SET(sched_getcpu(), &one);
    MP_CHECK(sched_setaffinity(0, sizeof(one), &one) == 0);
  }
  MP_CHECK_RC(cpu_test_init(sh->port, rank, n, 60000, g));
  if (one_cpu) MP_CHECK(sched_setaffinity(0, sizeof(cpus), &cpus) == 0);
  return 0;
}

static int a2av_big(int rank, int n, void *arg) {
  struct shared *sh = arg;
  tdist_group_t *g = NULL;
  /* variant 1 (a2av_rule): TDIST_CPU_SC_CMA unset, and this process has
   * one CPU while the group is made: its blocks are read in place only
   * where the members are more than twice that (sc.h, lend), so from
   * n = 3 on, and through the slots at n = 2. */
  MP_CHECK_RC(init_on_cpus(sh, rank, n, sh->variant == 1, &g));
  size_t sc[8], sd[8], rc[8], rd[8];
  for (int t = 0; t < (TEST_TSAN ? 2 : A2AV_SKEW + 1); t++) {
    size_t st = 0, rt = 0, big = 0;
    for (int j = 0; j < n; j++) {
      sc[j] = bcount(rank, j, t);
      rc[j] = bcount(j, rank, t);
      sd[j] = st + 3 * (size_t)j; /* gaps between the blocks */
      rd[j] = rt + (size_t)j;
      st = sd[j] + sc[j];
      rt = rd[j] + rc[j];
      if (j != rank && rc[j] >= LEND) big++;
    }
    int32_t *s = malloc((st + 1) * 4), *r = calloc(rt + 1, 4);
    MP_CHECK(s && r);
    for (int j = 0; j < n; j++)
      for (size_t i = 0; i < sc[j]; i++)
        s[sd[j] + i] = vval(rank, j, i, t);
    uint64_t reads0 = atomic_load(&tdist__cpu_cma_reads);
    /* The skewed trial's rank 0 comes last: the others' steps are in when
     * it looks, so the now lane completes its op in its submission. */
    if (t == A2AV_SKEW && rank == 0) usleep(20000);
    MP_CHECK_RC(tdist_all_to_all_v(g, s, sc, sd, r, rc, rd, TDIST_INT32, NULL, NULL));
    memset(s, 0x5a, (st + 1) * 4); /* the buffer is the caller's again */
    uint64_t reads = atomic_load(&tdist__cpu_cma_reads) - reads0;
    for (int j = 0; j < n; j++)
      for (size_t i = 0; i < rc[j]; i++)
        if (r[rd[j] + i] != vval(j, rank, i, t)) {
          fprintf(stderr,
                  "[rank %d] a2av_big trial %d: from %d element %zu of %zu is %d, want %d\n", rank,
                  t, j, i, rc[j], r[rd[j] + i], vval(j, rank, i, t));
          return 1;
        }
    int lent = sh->variant != 1 || n > 2;
    if (lent ? reads < big : reads != 0) {
      fprintf(stderr,
              "[rank %d] a2av_big trial %d: %zu large blocks but %llu single-copy reads (%s)\n",
              rank, t, big, (unsigned long long)reads,
              lent ? "lent" : "through the slots: 2 members, one CPU");
      return 1;
    }
    free(s);
    free(r);
    /* Every member checked before the next trial's givers scribble. */
    MP_CHECK_RC(tdist_barrier(g, NULL, NULL));
  }
  MP_CHECK_RC(tdist_group_destroy(g));
  return 0;
}

/* ---- all_gather blocks lent (read in place) ----------------------------------------- */

/* all_gather blocks of TDIST_CPU_SC_LEND_BYTES (32 KiB) and up are read
 * from their giver's buffer (sc_data.c, lend): just under and at the
 * threshold, one that spans slot steps, and one over two 1 MiB pieces with
 * a short last one, out of place and in place; then an all_reduce of the
 * same count (lent from 32 KiB in this case). A member scribbles its
 * buffers as soon as its op returns: a reader still reading them would get
 * the scribble, and a check would fail. */
static int allgather_lent(int rank, int n, void *arg) {
  struct shared *sh = arg;
  tdist_group_t *g = NULL;
  /* variant 1: every other member lends, the others never do (a member's
   * lines say which; each reads each giver as it gave). */
  if (sh->variant == 1) setenv("TDIST_CPU_SC_LEND", rank % 2 ? "0" : "1", 1);
  if (sh->variant >= 2) setenv("TDIST_CPU_SC_TUNE_SKIP", "16", 1);
  /* variant 3: measured as 2, but this process has one CPU while the
   * group is made, so its members outnumber its CPUs: nothing is lent
   * (sc_data.c, lend_now), not even in the look. */
  MP_CHECK_RC(init_on_cpus(sh, rank, n, sh->variant == 3, &g));
  static const size_t counts[] = {8191, 8192, 40000, 600001};
  /* The look's variants (2, 3) run 16 reps of each count: under
   * cpu_sc_tiny's slots of 4 KiB the largest count's op takes about 600
   * steps, and the two variants took 51 s of that run's 84 under stress-ng
   * --cpu 2. There they stop short of it; cpu_sc_n2..4 run it at the
   * default slots. */
  const char *fb = getenv("TDIST_CPU_SC_SLOT_BYTES");
  int tiny = fb && atol(fb) < 65536;
  int many = TEST_TSAN || (sh->variant >= 2 && tiny) ? 3 : 4;
  /* variant 2: the lane measured (TDIST_CPU_SC_LEND unset): enough ops of
   * each class that its look (after 16 ops here, TDIST_CPU_SC_TUNE_SKIP,
   * then 8 in two lanes) ends and its choice runs. */
  int reps = sh->variant >= 2 ? 16 : 1;
  for (int rep = 0; rep < reps; rep++)
    for (int c = 0; c < many; c++) {
      for (int inplace = 0; inplace < 2; inplace++) {
        size_t cnt = counts[c];
        int32_t *out = malloc(cnt * (size_t)n * 4),
                *mine = inplace ? out + cnt * (size_t)rank : malloc(cnt * 4);
        MP_CHECK(out && mine);
        memset(out, 0x77, cnt * (size_t)n * 4);
        for (size_t i = 0; i < cnt; i++)
          mine[i] = in(rank, i, c + 40 * inplace + rep);
        uint64_t reads0 = atomic_load(&tdist__cpu_cma_reads);
        MP_CHECK_RC(tdist_all_gather(g, mine, out, cnt, TDIST_INT32, NULL, NULL));
        uint64_t reads = atomic_load(&tdist__cpu_cma_reads) - reads0;
        if (!inplace) memset(mine, 0x5a, cnt * 4); /* the caller's again */
        for (int r = 0; r < n; r++)
          for (size_t i = 0; i < cnt; i++)
            if (out[(size_t)r * cnt + i] != in(r, i, c + 40 * inplace + rep)) {
              fprintf(stderr,
                      "[rank %d] allgather_lent %zu%s: from %d element %zu is %d, want %d\n", rank,
                      cnt, inplace ? " in place" : "", r, i, out[(size_t)r * cnt + i],
                      in(r, i, c + 40 * inplace + rep));
              return 1;
            }
        if (inplace) memset(out, 0x5a, cnt * (size_t)n * 4);
        /* A lent block is read with a system call per piece: at least one
         * from each other member (where single copy works at all). */
        uint64_t want = cnt * 4 >= 32768 && sh->variant == 0 ? (uint64_t)(n - 1) : 0;
        if (sh->variant == 3 && reads) {
          fprintf(stderr,
                  "[rank %d] allgather_lent %zu: %llu single-copy reads in a crowded group\n", rank,
                  cnt, (unsigned long long)reads);
          return 1;
        }
        if (reads < want) {
          fprintf(stderr, "[rank %d] allgather_lent %zu: %llu single-copy reads, want %llu\n", rank,
                  cnt, (unsigned long long)reads, (unsigned long long)want);
          return 1;
        }
        if (!inplace) free(mine);
        free(out);
        /* all_reduce (lent where TDIST_CPU_SC_LEND_REDUCE_BYTES allows: two
         * phases, inputs and the results' shares read in place). */
        int32_t *x = malloc(cnt * 4), *y = inplace ? x : malloc(cnt * 4);
        MP_CHECK(x && y);
        for (size_t i = 0; i < cnt; i++)
          x[i] = in(rank, i, c + 80 * inplace + rep);
        MP_CHECK_RC(tdist_all_reduce(g, x, y, cnt, TDIST_INT32, TDIST_SUM, NULL, NULL));
        if (!inplace) memset(x, 0x5a, cnt * 4);
        for (size_t i = 0; i < cnt; i++) {
          int32_t w = 0;
          for (int r = 0; r < n; r++)
            w += in(r, i, c + 80 * inplace + rep);
          if (y[i] != w) {
            fprintf(stderr, "[rank %d] allreduce_lent %zu%s: element %zu is %d, want %d\n", rank,
                    cnt, inplace ? " in place" : "", i, y[i], w);
            return 1;
          }
        }
        memset(y, 0x5a, cnt * 4);
        if (!inplace) free(y);
        free(x);
      }
    }
  MP_CHECK_RC(tdist_group_destroy(g));
  return 0;
}

/* ---- a giver runs ahead ------------------------------------------------------------ */

static int ahead(int rank, int n, void *arg) {
  struct shared *sh = arg;
  tdist_group_t *g = NULL;
  MP_CHECK_RC(cpu_test_init(sh->port, rank, n, 60000, &g));
  MP_CHECK_RC(tdist_barrier(g, NULL, NULL));
  int32_t v[64];
  enum { K = CPU_LAG_MAX - 1 };
  size_t big = 6u << 20; /* 24 MiB, far over the slots */
  int32_t *w = malloc(big * 4);
  MP_CHECK(w);
  if (rank == 0) {
    for (int it = 0; it < K; it++) {
      for (int i = 0; i < 64; i++)
        v[i] = it * 100 + i;
      MP_CHECK_RC(tdist_broadcast(g, v, 64, TDIST_INT32, 0, NULL, NULL));
    }
    for (size_t i = 0; i < big; i++)
      w[i] = (int32_t)(i * 7);
    MP_CHECK_RC(tdist_broadcast(g, w, big, TDIST_INT32, 0, NULL, NULL));
    memset(w, 0, big * 4);      /* complete: the buffer is the caller's again */
    atomic_store(&sh->flag, 1); /* only now may the receivers post */
  } else {
    for (int64_t t0 = tdist__now_ms(); !atomic_load(&sh->flag) && tdist__now_ms() - t0 < 30000;)
      msleep(1);
    MP_CHECK(atomic_load(&sh->flag) == 1);
    for (int it = 0; it < K; it++) {
      MP_CHECK_RC(tdist_broadcast(g, v, 64, TDIST_INT32, 0, NULL, NULL));
      for (int i = 0; i < 64; i++)
        MP_CHECK(v[i] == it * 100 + i);
    }
    MP_CHECK_RC(tdist_broadcast(g, w, big, TDIST_INT32, 0, NULL, NULL));
    for (size_t i = 0; i < big; i++)
      MP_CHECK(w[i] == (int32_t)(i * 7));
  }
  free(w);
  /* A receiving op after them: the root checks the receivers' signatures. */
  int32_t s = rank;
  MP_CHECK_RC(tdist_all_reduce(g, &s, &s, 1, TDIST_INT32, TDIST_SUM, NULL, NULL));
  MP_CHECK(s == n * (n - 1) / 2);
  MP_CHECK_RC(tdist_group_destroy(g));
  return 0;
}

/* ---- ops left to the progress threads --------------------------------------------- */

static int async_ops(int rank, int n, void *arg) {
  struct shared *sh = arg;
  tdist_group_t *g = NULL;
  uint64_t rings0 = atomic_load(&tdist__cpu_sc_rings), arms0 = atomic_load(&tdist__cpu_sc_arms);
  MP_CHECK_RC(cpu_test_init(sh->port, rank, n, 60000, &g));
  enum { W = 8 };
  size_t cnt[W];
  int32_t *buf[W];
  tdist_work_t *w[W];
  for (int round = 0; round < 3; round++) {
    for (int k = 0; k < W; k++) {
      cnt[k] = k == W - 1 ? (size_t)(1u << 20) + 3 : (size_t)(k * 1000 + 1); /* 4 MiB: 32 steps */
      buf[k] = malloc(cnt[k] * 4);
      MP_CHECK(buf[k]);
      for (size_t i = 0; i < cnt[k]; i++)
        buf[k][i] = in(rank, i, k + round);
      MP_CHECK_RC(tdist_all_reduce(g, buf[k], buf[k], cnt[k], TDIST_INT32, TDIST_SUM, NULL, &w[k]));
    }
    /* The callers do not touch the works: only the progress threads, woken
     * by the bells, can finish them. */
    int done = 0;
    for (int64_t t0 = tdist__now_ms(); done < W && tdist__now_ms() - t0 < 20000;) {
      msleep(5);
      done = 0;
      for (int k = 0; k < W; k++)
        done += tdist_work_state(w[k]) == TDIST_WORK_COMPLETED;
    }
    MP_CHECK(done == W);
    for (int k = 0; k < W; k++) {
      MP_CHECK_RC(tdist_work_wait(w[k], -1));
      tdist_work_release(w[k]);
      for (size_t i = 0; i < cnt[k]; i++) {
        int32_t want = 0;
        for (int r = 0; r < n; r++)
          want += in(r, i, k + round);
        MP_CHECK(buf[k][i] == want);
      }
      free(buf[k]);
    }
  }
  /* Bells (sc_chan.c): a writer takes a sleeper's want_bell flag as it
   * rings, so the group rang no more bells than its progress threads set
   * flags, but for a few set or taken while the counts are read. Left set,
   * every pass that wrote rang every sleeper. And the progress threads
   * did sleep and were rung: nobody else moved these ops. */
  uint64_t mine[2] = {atomic_load(&tdist__cpu_sc_rings) - rings0,
                      atomic_load(&tdist__cpu_sc_arms) - arms0},
           all[2 * SC_MAX_RANKS];
  MP_CHECK_RC(tdist_all_gather(g, mine, all, 2, TDIST_UINT64, NULL, NULL));
  uint64_t rings = 0, arms = 0;
  for (int r = 0; r < n; r++)
    rings += all[2 * r], arms += all[2 * r + 1];
  if (rank == 0)
    fprintf(stderr, "[rank 0] async: %llu bells, %llu flags set\n", (unsigned long long)rings,
            (unsigned long long)arms);
  MP_CHECK(rings > 0 && rings <= arms + 2 * (uint64_t)n);
  MP_CHECK_RC(tdist_group_destroy(g));
  return 0;
}

/* ---- a root far ahead of a slow receiver ------------------------------------------- */

/* Op k of `deep`: its count (mostly inline in a step line, some in a slot,
 * a few over a slot) and its elements. */
static size_t deep_count(int k) {
  if (k % 1000 == 999) return 40000; /* 160 KiB: two steps */
  if (k % 7 == 3) return 11;         /* 44 bytes: a slot */
  if (k % 97 == 5) return 3000;
  return (size_t)(k % 10) + 1; /* 4..40 bytes: the step line */
}
static int32_t deep_val(int k, size_t i) { return (int32_t)(k * 131 + (int)i * 7 + 1); }

static int deep(int rank, int n, void *arg) {
  struct shared *sh = arg;
  tdist_group_t *g = NULL;
  enum { K = 10000 };
  MP_CHECK_RC(cpu_test_init(sh->port, rank, n, 60000, &g));
  MP_CHECK_RC(tdist_barrier(g, NULL, NULL));
  uint64_t ops0 = atomic_load(&tdist__cpu_sc_ops);
  size_t *at = malloc(sizeof(size_t) * (K + 1));
  MP_CHECK(at);
  at[0] = 0;
  for (int k = 0; k < K; k++)
    at[k + 1] = at[k] + deep_count(k);
  int32_t *buf = malloc(at[K] * sizeof(int32_t));
  tdist_work_t **w = calloc(K, sizeof(*w));
  MP_CHECK(buf && w);
  for (int k = 0; k < K; k++)
    for (size_t i = 0; i < deep_count(k); i++)
      buf[at[k] + i] = rank == 0 ? deep_val(k, i) : -1;
  if (rank == n - 1 && rank != 0) {
    /* The slow receiver: one op at a time, pausing now and then, so the
     * others run thousands of ops ahead of it. */
    for (int k = 0; k < K; k++) {
      if (k % 64 == 0) msleep(1);
      MP_CHECK_RC(tdist_broadcast(g, buf + at[k], deep_count(k), TDIST_INT32, 0, NULL, NULL));
    }
  } else {
    for (int k = 0; k < K; k++)
      MP_CHECK_RC(tdist_broadcast(g, buf + at[k], deep_count(k), TDIST_INT32, 0, NULL, &w[k]));
    for (int k = 0; k < K; k++) {
      MP_CHECK_RC(tdist_work_wait(w[k], -1));
      tdist_work_release(w[k]);
    }
  }
  for (int k = 0; k < K; k++)
    for (size_t i = 0; i < deep_count(k); i++)
      if (buf[at[k] + i] != deep_val(k, i)) {
        fprintf(stderr, "[rank %d] deep op %d count %zu: element %zu is %d, want %d\n", rank, k,
                deep_count(k), i, buf[at[k] + i], deep_val(k, i));
        return 1;
      }
  /* All of them over the segment; then a receiving op checks them all. */
  MP_CHECK(atomic_load(&tdist__cpu_sc_ops) - ops0 >= (uint64_t)K);
  int32_t s = rank;
  MP_CHECK_RC(tdist_all_reduce(g, &s, &s, 1, TDIST_INT32, TDIST_SUM, NULL, NULL));
  MP_CHECK(s == n * (n - 1) / 2);
  free(buf);
  free(w);
  free(at);
  MP_CHECK_RC(tdist_group_destroy(g));
  return 0;
}

/* ---- sc, the engine and p2p in one group -------------------------------------------- */

static int mixed(int rank, int n, void *arg) {
  struct shared *sh = arg;
  tdist_group_t *g = NULL;
  MP_CHECK_RC(cpu_test_init(sh->port, rank, n, 60000, &g));
  size_t big = 300001; /* over several slots */
  int32_t *a = malloc(big * 4);
  MP_CHECK(a);
  for (int it = 0; it < 6; it++) {
    int32_t x = rank + it;
    MP_CHECK_RC(tdist_all_reduce(g, &x, &x, 1, TDIST_INT32, TDIST_SUM, NULL, NULL));
    MP_CHECK(x == n * (n - 1) / 2 + n * it);
    /* gather_v: the engine's, between two ops over the segment */
    int32_t gv[3] = {rank, it, rank * it}, got[3 * 8];
    size_t rc3[8];
    for (int r = 0; r < n; r++)
      rc3[r] = 3;
    MP_CHECK_RC(tdist_gather_v(g, gv, 3, got, rank == it % n ? rc3 : NULL, NULL, TDIST_INT32,
                               it % n, NULL, NULL));
    if (rank == it % n)
      for (int r = 0; r < n; r++)
        MP_CHECK(got[3 * r] == r && got[3 * r + 1] == it && got[3 * r + 2] == r * it);
    for (size_t i = 0; i < big; i++)
      a[i] = rank == it % n ? (int32_t)(i + (size_t)it) : 0;
    MP_CHECK_RC(tdist_broadcast(g, a, big, TDIST_INT32, it % n, NULL, NULL));
    for (size_t i = 0; i < big; i++)
      MP_CHECK(a[i] == (int32_t)(i + (size_t)it));
    /* a small broadcast (given unchecked by its root), then p2p around a ring */
    int32_t y = rank == 0 ? 1000 + it : 0;
    MP_CHECK_RC(tdist_broadcast(g, &y, 1, TDIST_INT32, 0, NULL, NULL));
    MP_CHECK(y == 1000 + it);
    int32_t s = rank * 10 + it, r = -1;
    tdist_p2p_op_t ops[2] = {{.kind = TDIST_P2P_SEND,
                              .buf = &s,
                              .count = 1,
                              .dtype = TDIST_INT32,
                              .peer = (rank + 1) % n},
                             {.kind = TDIST_P2P_RECV,
                              .buf = &r,
                              .count = 1,
                              .dtype = TDIST_INT32,
                              .peer = (rank + n - 1) % n}};
    MP_CHECK_RC(tdist_batch_isend_irecv(g, ops, 2, NULL, NULL));
    MP_CHECK(r == ((rank + n - 1) % n) * 10 + it);
  }
  free(a);
  MP_CHECK_RC(tdist_group_destroy(g));
  return 0;
}

/* ---- two groups, two threads ------------------------------------------------------------ */

struct thr {
  tdist_group_t *g;
  int rank, n, salt, rc;
};

static void *thr_main(void *p) {
  struct thr *t = p;
  t->rc = 0;
  for (int it = 0; it < (TEST_TSAN ? 50 : 300) && !t->rc; it++) {
    int32_t v[3] = {t->rank + it, t->salt, 1};
    if (tdist_all_reduce(t->g, v, v, 3, TDIST_INT32, TDIST_SUM, NULL, NULL) != 0 ||
        v[0] != t->n * (t->n - 1) / 2 + t->n * it || v[1] != t->n * t->salt || v[2] != t->n)
      t->rc = 1;
  }
  return NULL;
}

static int threads(int rank, int n, void *arg) {
  struct shared *sh = arg;
  tdist_group_t *world = NULL, *g1 = NULL, *g2 = NULL;
  MP_CHECK_RC(cpu_test_init(sh->port, rank, n, 60000, &world));
  int all[8];
  for (int i = 0; i < n; i++)
    all[i] = i;
  MP_CHECK_RC(tdist_new_group(world, all, n, NULL, &g1));
  MP_CHECK_RC(tdist_new_group(world, all, n, NULL, &g2));
  struct thr t1 = {g1, rank, n, 3, 0}, t2 = {g2, rank, n, 5, 0};
  pthread_t a, b;
  MP_CHECK(pthread_create(&a, NULL, thr_main, &t1) == 0);
  MP_CHECK(pthread_create(&b, NULL, thr_main, &t2) == 0);
  pthread_join(a, NULL);
  pthread_join(b, NULL);
  MP_CHECK(t1.rc == 0 && t2.rc == 0);
  MP_CHECK_RC(tdist_group_destroy(g1));
  MP_CHECK_RC(tdist_group_destroy(g2));
  MP_CHECK_RC(tdist_group_destroy(world));
  return 0;
}

/* ---- lazy connections ------------------------------------------------------------------ */

static int lazy(int rank, int n, void *arg) {
  struct shared *sh = arg;
  tdist_group_t *g = NULL;
  MP_CHECK_RC(cpu_test_init(sh->port, rank, n, 60000, &g));
  uint64_t c0 = atomic_load(&tdist__cpu_connects);
  int32_t v[1000];
  for (int i = 0; i < 1000; i++)
    v[i] = rank + i;
  MP_CHECK_RC(tdist_all_reduce(g, v, v, 1000, TDIST_INT32, TDIST_SUM, NULL, NULL));
  for (int i = 0; i < 1000; i++)
    MP_CHECK(v[i] == n * (n - 1) / 2 + n * i);
  int32_t s = rank, r[8];
  MP_CHECK_RC(tdist_all_gather(g, &s, r, 1, TDIST_INT32, NULL, NULL));
  for (int i = 0; i < n; i++)
    MP_CHECK(r[i] == i);
  MP_CHECK_RC(tdist_barrier(g, NULL, NULL));
  /* Over the group's segment: no pair of ranks had to connect. */
  MP_CHECK(atomic_load(&tdist__cpu_connects) == c0);
  MP_CHECK_RC(tdist_group_destroy(g));
  return 0;
}

/* ---- slots mapped once ------------------------------------------------------------------ */

static long minflt(void) {
  struct rusage ru;
  return getrusage(RUSAGE_SELF, &ru) == 0 ? ru.ru_minflt : -1;
}

static int warm(int rank, int n, void *arg) {
  struct shared *sh = arg;
  tdist_group_t *g = NULL;
  MP_CHECK_RC(cpu_test_init(sh->port, rank, n, 60000, &g));
  enum { CNT = 256 << 10 }; /* 1 MiB of int32: 8 slots of the default 16 */
  int32_t *v = malloc(sizeof(int32_t) * CNT);
  MP_CHECK(v != NULL);
  long f0 = 0;
  for (int k = 0; k < 8; k++) {
    for (int i = 0; i < CNT; i++)
      v[i] = rank + i + k;
    if (k == 1) f0 = minflt(); /* after the first op */
    MP_CHECK_RC(tdist_all_reduce(g, v, v, CNT, TDIST_INT32, TDIST_SUM, NULL, NULL));
    for (int i = 0; i < CNT; i++)
      MP_CHECK(v[i] == n * (n - 1) / 2 + n * (i + k));
  }
  long faults = minflt() - f0;
  free(v);
  MP_CHECK_RC(tdist_group_destroy(g));
  /* TSan's shadow of the slots (four pages a page) faults in as the
   * copies first reach it: the count says nothing of the slots there. */
  if (TEST_TSAN) faults = 0;
  if (f0 < 0 || faults >= 128) {
    fprintf(stderr, "[rank %d] warm: %ld minor faults in 7 ops after the first\n", rank, faults);
    return 1;
  }
  return 0;
}

/* The segment's mapping in /proc/self/smaps (the largest mapping of a
 * "tdist-shm" memfd: the rings' are 512 KiB): its size and resident KiB. */
static int seg_rss(size_t *size_kb, size_t *rss_kb) {
  FILE *f = fopen("/proc/self/smaps", "r");
  if (!f) return -1;
  char line[512];
  size_t cur = 0, best = 0, best_rss = 0;
  int in = 0;
  while (fgets(line, sizeof(line), f)) {
    unsigned long a, b;
    size_t kb;
    if (sscanf(line, "%lx-%lx ", &a, &b) == 2) { /* a mapping's first line */
      in = strstr(line, "memfd:tdist-shm") != NULL;
      cur = (b - a) / 1024;
    } else if (in && sscanf(line, "Rss: %zu kB", &kb) == 1 && cur > best) {
      best = cur;
      best_rss = kb;
    }
  }
  fclose(f);
  *size_kb = best;
  *rss_kb = best_rss;
  return best ? 0 : -1;
}

static int warm_bcast(int rank, int n, void *arg) {
  struct shared *sh = arg;
  tdist_group_t *g = NULL;
  MP_CHECK_RC(cpu_test_init(sh->port, rank, n, 60000, &g));
  enum { CNT = 256 << 10 }; /* 1 MiB of int32 */
  int32_t *v = malloc(sizeof(int32_t) * CNT);
  MP_CHECK(v != NULL);
  for (int k = 0; k < 8; k++) {
    for (int i = 0; i < CNT; i++)
      v[i] = rank == 0 ? i + k : -1;
    MP_CHECK_RC(tdist_broadcast(g, v, CNT, TDIST_INT32, 0, NULL, NULL));
    for (int i = 0; i < CNT; i++)
      MP_CHECK(v[i] == i + k);
  }
  /* Lines of every member (mapped at setup) and rank 0's slots (the
   * test's 16 of 128 KiB), and a page or two of slack. */
  size_t size_kb = 0, rss_kb = 0, data_kb = 16 * 128;
  MP_CHECK(seg_rss(&size_kb, &rss_kb) == 0);
  size_t lines_kb = size_kb - (size_t)n * data_kb, most = lines_kb + data_kb + 8;
  MP_CHECK_RC(tdist_barrier(g, NULL, NULL));
  free(v);
  MP_CHECK_RC(tdist_group_destroy(g));
  if (rss_kb > most || rss_kb < lines_kb + data_kb / 2) {
    fprintf(stderr,
            "[rank %d] warm_bcast: %zu KiB of the %zu KiB segment resident (%zu expected)\n", rank,
            rss_kb, size_kb, lines_kb + data_kb);
    return 1;
  }
  return 0;
}

static int small_mismatch(int rank, int n, void *arg) {
  struct shared *sh = arg;
  tdist_group_t *g = NULL;
  MP_CHECK_RC(cpu_test_init(sh->port, rank, n, 60000, &g));
  int32_t v[260] = {rank, 1, 2, 3};
  MP_CHECK_RC(tdist_all_reduce(g, v, v, 2, TDIST_INT32, TDIST_SUM, NULL, NULL)); /* agreed */
  MP_CHECK(v[0] == n * (n - 1) / 2 && v[1] == n);
  int odd = rank == n - 1, rc, bcast_rc = 1; /* 1: no broadcast posted by this rank */
  const char *mine, *theirs;                 /* what the message must name */
  switch (sh->variant) {
  case 0:
    rc = tdist_all_reduce(g, v, v, 2, odd ? TDIST_FLOAT32 : TDIST_INT32, TDIST_SUM, NULL, NULL);
    mine = "int32", theirs = "float32";
    break;
  case 1:
    rc = tdist_all_reduce(g, v, v, odd ? 3 : 2, TDIST_INT32, TDIST_SUM, NULL, NULL);
    mine = "count 2", theirs = "count 3";
    break;
  case 2:
    rc = tdist_all_reduce(g, v, v, 2, TDIST_INT32, odd ? TDIST_MAX : TDIST_SUM, NULL, NULL);
    mine = tdist_redop_name(TDIST_SUM), theirs = tdist_redop_name(TDIST_MAX);
    break;
  case 3:
    /* 1 KiB: the step's data in a slot, the signature in the ring only */
    rc = tdist_all_reduce(g, v, v, odd ? 257 : 256, TDIST_INT32, TDIST_SUM, NULL, NULL);
    mine = "count 256", theirs = "count 257";
    break;
  case 5:
    /* Every rank the root of its own broadcasts: each only gives, none
     * checks another's signature before completing, and none's vseq passes
     * the first (each leaves it unchecked), so no giver can take its
     * agreement from the others' vseq (sc_op.c, verify_ops): a stream of
     * them must still fail, once the givers read the signatures (from
     * SC_VERIFY_DEEP ops on), or, for a rank that ran all of them before
     * another signed its first (a loaded machine), at its next op that
     * receives. */
    for (int i = 0; i < 2000; i++)
      if ((rc = tdist_broadcast(g, v, 2, TDIST_INT32, rank, NULL, NULL)) != 0) break;
    if (rc == 0) rc = tdist_all_reduce(g, v, v, 1, TDIST_INT32, TDIST_SUM, NULL, NULL);
    mine = "root", theirs = "broadcast";
    break;
  case 6:
    /* Either side of TDIST_CPU_SC_MAX_BYTES (1024, set by main): the last
     * rank's all_reduce runs on the engine, the others' over the segment
     * (sc.h, "Which ops"): its messages meet their channel op. */
    rc = tdist_all_reduce(g, v, v, odd ? 257 : 255, TDIST_INT32, TDIST_SUM, NULL, NULL);
    mine = "count 255", theirs = "count 257";
    break;
  case 7:
    /* The same for a broadcast whose root (rank 0, the segment's side)
     * gives and is done in its submit: the last rank, on the engine, fails
     * it, the root its next op that receives. */
    rc = tdist_broadcast(g, v, odd ? 257 : 255, TDIST_INT32, 0, NULL, NULL);
    if (rc == 0) rc = tdist_all_reduce(g, v, v, 1, TDIST_INT32, TDIST_SUM, NULL, NULL);
    mine = "count 255", theirs = "count 257";
    break;
  case 9: {
    /* A small all_gather (the now lane's now_gather reads the signature in
     * each member's line): 2 vs 3 int32, every rank fails at the op. */
    int32_t out[4 * 64];
    rc = tdist_all_gather(g, v, out, odd ? 3 : 2, TDIST_INT32, NULL, NULL);
    mine = "count 2", theirs = "count 3";
    break;
  }
  case 8:
    /* A small broadcast whose receivers post only once the root's returned
     * (done in its submit: its line is in): each receiver finds the root's
     * step when it looks and takes the now lane's taker (sc_op.c,
     * now_take), which must read the disagreement in the line's signature
     * and leave it to a pass rather than copy 2 elements as 3. */
    if (rank == 0) {
      rc = tdist_broadcast(g, v, 2, TDIST_INT32, 0, NULL, NULL);
      atomic_store(&sh->flag, 1);
    } else {
      for (int64_t t0 = tdist__now_ms(); !atomic_load(&sh->flag) && tdist__now_ms() - t0 < 30000;)
        msleep(1);
      MP_CHECK(atomic_load(&sh->flag) == 1);
      rc = bcast_rc = tdist_broadcast(g, v, odd ? 3 : 2, TDIST_INT32, 0, NULL, NULL);
    }
    if (rc == 0) rc = tdist_all_reduce(g, v, v, 1, TDIST_INT32, TDIST_SUM, NULL, NULL);
    mine = "count 2", theirs = "count 3";
    break;
  default:
    /* A small broadcast: the root's is done in its submit (the now lane,
     * sc_op.c) and checked later, and a receiver that agrees with the root
     * checks the others later too where their signatures are not in yet:
     * such a rank's broadcast may succeed, and its next op that receives
     * must fail with the mismatch. */
    rc = bcast_rc = tdist_broadcast(g, v, odd ? 3 : 2, TDIST_INT32, 0, NULL, NULL);
    if (rc == 0) rc = tdist_all_reduce(g, v, v, 1, TDIST_INT32, TDIST_SUM, NULL, NULL);
    mine = "count 2", theirs = "count 3";
    break;
  }
  /* A receiver that disagrees with the root checks the root's signature
   * before it reads a byte: its broadcast itself fails, never a later op. */
  if (odd && rank != 0 && bcast_rc != 1 && bcast_rc != TDIST_ERR_MISMATCH) {
    fprintf(stderr, "[rank %d] small_mismatch %d: its broadcast returned %s\n", rank, sh->variant,
            tdist_err_name(bcast_rc));
    return 1;
  }
  const char *msg = tdist_last_error();
  if (rc != TDIST_ERR_MISMATCH || !strstr(msg, "mismatch at collective #1") || !strstr(msg, mine) ||
      !strstr(msg, theirs)) {
    fprintf(stderr, "[rank %d] small_mismatch %d: %s (%s)\n", rank, sh->variant, tdist_err_name(rc),
            msg);
    return 1;
  }
  tdist_group_destroy(g); /* aborted: its code is the abort's */
  return 0;
}

/* spread: four members on two or three CPUs (crowded), put 3 + 1 by
 * pinning each caller and putting its mask back; the callers must reach an
 * even split (at most two on a CPU) within 4000 all_reduces
 * (segment/sc_spread.c), every one of them right, with the moves made on
 * real masks. The kernel's balancer may even this split out as well (here
 * it often did, where the split a bench run fell into stayed): which
 * member moves where is cpu_spread's, on made-up boards. Other sizes and
 * hosts: nothing to check. */
static int spread(int rank, int n, void *arg) {
  struct shared *sh = arg;
  cpu_set_t mask, one;
  MP_CHECK(sched_getaffinity(0, sizeof(mask), &mask) == 0);
  int cpus = CPU_COUNT(&mask), c[2] = {-1, -1}, k = 0;
  if (n != 4 || cpus < 2 || cpus >= n) return 0;
  for (int i = 0; i < CPU_SETSIZE && k < 2; i++)
    if (CPU_ISSET(i, &mask)) c[k++] = i;
  tdist_group_t *g = NULL;
  MP_CHECK_RC(cpu_test_init(sh->port, rank, n, 60000, &g));
  MP_CHECK_RC(tdist_barrier(g, NULL, NULL));
  CPU_ZERO(&one);
  CPU_SET(rank < 3 ? c[0] : c[1], &one);
  MP_CHECK(sched_setaffinity(0, sizeof(one), &one) == 0);
  MP_CHECK(sched_setaffinity(0, sizeof(mask), &mask) == 0);
  int even_at = -1;
  for (int it = 0; it < 4000 && even_at < 0; it++) {
    int32_t x = rank + it;
    MP_CHECK_RC(tdist_all_reduce(g, &x, &x, 1, TDIST_INT32, TDIST_SUM, NULL, NULL));
    MP_CHECK(x == 6 + 4 * it);
    if (it % 50 != 49) continue;
    int32_t me = sched_getcpu(), all[4];
    MP_CHECK_RC(tdist_all_gather(g, &me, all, 1, TDIST_INT32, NULL, NULL));
    int most = 0;
    for (int i = 0; i < 4; i++) {
      int same = 0;
      for (int j = 0; j < 4; j++)
        same += all[j] == all[i];
      most = same > most ? same : most;
    }
    if (most <= 2) even_at = it + 1; /* the same gathered CPUs on every rank */
  }
  if (rank == 0) printf("cpu_sc spread: at most two callers a CPU after %d all_reduces\n", even_at);
  MP_CHECK(even_at > 0);
  tdist_group_destroy(g);
  return 0;
}

static int run(const char *name, tdist_mp_fn fn, int n, struct shared *sh) {
  sh->port = tdist_mp_free_port();
  atomic_store(&sh->flag, 0);
  int bad = tdist_mp_run(n, fn, sh, 240);
  printf("cpu_sc %s (n=%d): %s\n", name, n, bad ? "FAILED" : "ok");
  fflush(stdout);
  return bad != 0;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 2;
  const char *only = argc > 2 ? argv[2] : NULL; /* one case by name (e.g. deep) */
  struct shared *sh =
      mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (sh == MAP_FAILED) return 1;
  int fails = 0;
#define RUN(name, fn) \
  if (!only || !strcmp(only, name)) fails += run(name, fn, n, sh)
  RUN("sweep", sweep);
  RUN("vops", vops);
  setenv("TDIST_CPU_SC_CMA", "1", 1); /* lend whatever the CPUs (by default: n > 2 CPUs) */
  RUN("a2av_big", a2av_big);
  unsetenv("TDIST_CPU_SC_CMA");
  sh->variant = 1;
  RUN("a2av_rule", a2av_big);
  setenv("TDIST_CPU_SC_LEND_REDUCE_BYTES", "32768", 1); /* every all_reduce above 32 KiB */
  setenv("TDIST_CPU_SC_LEND", "1", 1);                  /* lend, not measure which is faster */
  sh->variant = 0;
  RUN("lent", allgather_lent);
  unsetenv("TDIST_CPU_SC_LEND");
  sh->variant = 1;
  RUN("lent_mixed", allgather_lent);
  sh->variant = 2;
  RUN("lent_tuned", allgather_lent);
  sh->variant = 3;
  RUN("lent_crowded", allgather_lent);
  sh->variant = 0;
  unsetenv("TDIST_CPU_SC_LEND_REDUCE_BYTES");
  RUN("ahead", ahead);
  RUN("async", async_ops);
  RUN("deep", deep);
  RUN("mixed", mixed);
  RUN("threads", threads);
  setenv("TDIST_CPU_CONNECT", "lazy", 1);
  RUN("lazy", lazy);
  unsetenv("TDIST_CPU_CONNECT");
  RUN("warm", warm);
  RUN("spread", spread);
  {
    /* the sizes warm_bcast counts, then the run's own (cpu_sc_tiny's) */
    const char *d0 = getenv("TDIST_CPU_SC_SLOTS"), *f0 = getenv("TDIST_CPU_SC_SLOT_BYTES");
    char *d = d0 ? strdup(d0) : NULL, *f = f0 ? strdup(f0) : NULL;
    setenv("TDIST_CPU_SC_SLOTS", "16", 1);
    setenv("TDIST_CPU_SC_SLOT_BYTES", "131072", 1);
    RUN("warm_bcast", warm_bcast);
    if (d)
      setenv("TDIST_CPU_SC_SLOTS", d, 1);
    else
      unsetenv("TDIST_CPU_SC_SLOTS");
    if (f)
      setenv("TDIST_CPU_SC_SLOT_BYTES", f, 1);
    else
      unsetenv("TDIST_CPU_SC_SLOT_BYTES");
    free(d);
    free(f);
  }
  static const char *const kMismatch[] = {"small_mismatch_dtype", "small_mismatch_count",
                                          "small_mismatch_redop", "small_mismatch_slot",
                                          "small_mismatch_bcast", "small_mismatch_givers"};
  setenv("TDIST_TRACE_ON_FAILURE", "0", 1); /* no flight-recorder dumps of the aborts */
  for (sh->variant = 0; sh->variant < 6; sh->variant++)
    RUN(kMismatch[sh->variant], small_mismatch);
  /* Disagreements across the lanes: one view below TDIST_CPU_SC_MAX_BYTES,
   * the other at or above it. */
  setenv("TDIST_CPU_SC_MAX_BYTES", "1024", 1);
  static const char *const kLanes[] = {"lanes_mismatch", "lanes_mismatch_bcast"};
  for (sh->variant = 6; sh->variant < 8; sh->variant++)
    RUN(kLanes[sh->variant - 6], small_mismatch);
  unsetenv("TDIST_CPU_SC_MAX_BYTES");
  sh->variant = 8;
  RUN("small_mismatch_bcast_late", small_mismatch);
  sh->variant = 9;
  RUN("small_mismatch_gather", small_mismatch);
  unsetenv("TDIST_TRACE_ON_FAILURE");
#undef RUN
  return fails != 0;
}
