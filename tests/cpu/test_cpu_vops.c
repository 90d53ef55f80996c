/*
 * test_cpu_vops.c - the variable-size collectives of the CPU backend at one
 * world size (argv[1], default 2), over real sockets between forked ranks,
 * checked element by element against a reference computed in the test:
 *
 *   all_to_all_v, all_gather_v, gather_v, scatter_v, reduce_scatter_v with
 *   random counts drawn from one seed on every rank (so every rank knows the
 *   whole count matrix): zeros, skewed (Zipf-like: a few peers get most),
 *   one large round (above the single-copy and deferred-read thresholds);
 *   packed (NULL) and gapped displacements (gaps must stay untouched); in
 *   and out of place where the op allows it; every dtype of the original
 *   eight; every reduction of reduce_scatter_v; several v-ops in flight at
 *   once;
 *   one rank's all_to_all_v block above a slot while the others give a few
 *   elements (the now lane meets a longer stream, or a block read in place);
 *   local argument errors (INVALID_ARGUMENT, nothing submitted);
 *   counts that disagree between ranks: MISMATCH on every rank, naming both
 *   numbers (in a subgroup, so the world goes on);
 *   tdist_group_store: the same borrowed view each call, shared by the ranks.
 */
#include <stdatomic.h>

#include "cpu_test_util.h"

#define FAIL_AT(what, ...)                                      \
  do {                                                          \
    fprintf(stderr, "[rank %d] " what "\n", rank, __VA_ARGS__); \
    return 1;                                                   \
  } while (0)

#define SENT 77.0 /* sentinel: never a generated value (those are < 50) */

static const tdist_dtype_t dts[] = {TDIST_INT8,    TDIST_UINT8,    TDIST_INT32,   TDIST_INT64,
                                    TDIST_FLOAT16, TDIST_BFLOAT16, TDIST_FLOAT32, TDIST_FLOAT64};
#define NDT ((int)(sizeof(dts) / sizeof(dts[0])))

static uint64_t rnd(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

/* Element e of what rank `src` sends for `dst` (a block or a rank). */
static double val(int src, int dst, size_t e, int salt) {
  return (double)((src * 31 + dst * 17 + (int)(e % 1009) * 7 + salt) % 50);
}

/* A count up to maxc: a quarter are 0, the rest skewed toward a few hot
 * (src, dst) pairs, like tokens routed to experts. */
static size_t skewed(uint64_t *s, int src, int dst, int n, size_t maxc) {
  uint64_t u = rnd(s);
  if (u % 4 == 0 || maxc == 0) return 0;
  int hot = (src + 3 * dst) % n; /* 0 = the hottest */
  size_t cap = maxc / (size_t)((hot + 1) * (hot + 1));
  return (size_t)(rnd(s) % (cap + 1));
}

/* Displacements for counts: packed (NULL returned) or gapped (random
 * 0..3-element gaps, and blocks in reverse order to catch a backend that
 * assumes packing). *ext = elements the buffer needs. */
static size_t *layout(const size_t *counts, int n, int gapped, uint64_t *s, size_t *ext) {
  size_t off = 0;
  if (!gapped) {
    for (int j = 0; j < n; j++)
      off += counts[j];
    *ext = off;
    return NULL;
  }
  size_t *d = malloc(sizeof(size_t) * (size_t)n);
  for (int j = n - 1; j >= 0; j--) {
    off += rnd(s) % 4;
    d[j] = off;
    off += counts[j];
  }
  *ext = off + rnd(s) % 3;
  return d;
}

static size_t disp(const size_t *d, const size_t *counts, int j) {
  size_t o = 0;
  if (d) return d[j];
  for (int i = 0; i < j; i++)
    o += counts[i];
  return o;
}

static void *xbuf(size_t elems, tdist_dtype_t dt) {
  void *b = malloc(elems * tdist_dtype_size(dt) + 8);
  for (size_t i = 0; i < elems; i++)
    set_el(b, dt, i, SENT);
  return b;
}

/* Every element of buf outside the blocks (counts, d) is still SENT. */
static int gaps_ok(int rank, const void *buf, size_t ext, const size_t *counts, const size_t *d,
                   int n, tdist_dtype_t dt, const char *op) {
  for (size_t i = 0; i < ext; i++) {
    int inside = 0;
    for (int j = 0; j < n && !inside; j++) {
      size_t lo = disp(d, counts, j);
      inside = i >= lo && i < lo + counts[j];
    }
    if (!inside && get_el(buf, dt, i) != SENT) FAIL_AT("%s: gap element %zu was written", op, i);
  }
  return 0;
}

static int a2av(tdist_group_t *g, int rank, int n, int it, size_t maxc) {
  tdist_dtype_t dt = dts[it % NDT];
  uint64_t s = 0x9e3779b97f4a7c15ULL + (uint64_t)it, ls = (uint64_t)(rank + 1) * 7919 + it;
  size_t *C = malloc(sizeof(size_t) * (size_t)(n * n)), sc[8] = {0}, rc[8] = {0}, sext, rext;
  for (int i = 0; i < n; i++)
    for (int j = 0; j < n; j++)
      C[i * n + j] = skewed(&s, i, j, n, maxc);
  for (int j = 0; j < n; j++) {
    sc[j] = C[rank * n + j];
    rc[j] = C[j * n + rank];
  }
  size_t *sd = layout(sc, n, it & 1, &ls, &sext), *rd = layout(rc, n, (it >> 1) & 1, &ls, &rext);
  void *sb = xbuf(sext, dt), *rb = xbuf(rext, dt);
  for (int j = 0; j < n; j++)
    for (size_t e = 0; e < sc[j]; e++)
      set_el(sb, dt, disp(sd, sc, j) + e, val(rank, j, e, it));
  tdist_work_t *w = NULL;
  MP_CHECK_RC(tdist_all_to_all_v(g, sb, sc, sd, rb, rc, rd, dt, NULL, &w));
  MP_CHECK(tdist_work_optype(w) == TDIST_OP_ALL_TO_ALL_V);
  MP_CHECK_RC(tdist_work_wait(w, 0));
  tdist_work_release(w);
  for (int j = 0; j < n; j++)
    for (size_t e = 0; e < rc[j]; e++) {
      double got = get_el(rb, dt, disp(rd, rc, j) + e), want = val(j, rank, e, it);
      if (got != want)
        FAIL_AT("all_to_all_v it %d %s: block from %d [%zu] = %g, want %g", it,
                tdist_dtype_name(dt), j, e, got, want);
    }
  if (gaps_ok(rank, rb, rext, rc, rd, n, dt, "all_to_all_v")) return 1;
  for (int j = 0; j < n; j++) /* the input is untouched */
    for (size_t e = 0; e < sc[j]; e++)
      if (get_el(sb, dt, disp(sd, sc, j) + e) != val(rank, j, e, it))
        FAIL_AT("all_to_all_v clobbered sendbuf block %d", j);
  free(C), free(sd), free(rd), free(sb), free(rb);
  return 0;
}

/* all_gather_v and gather_v (root = it % n), in place on odd iterations. */
static int gathers(tdist_group_t *g, int rank, int n, int it, size_t maxc) {
  tdist_dtype_t dt = dts[(it + 3) % NDT];
  uint64_t s = 0x51ed27ULL * (uint64_t)(it + 1), ls = (uint64_t)rank * 31 + (uint64_t)it + 5;
  size_t c[8] = {0}, ext;
  for (int j = 0; j < n; j++)
    c[j] = skewed(&s, j, it % n, n, maxc);
  int root = it % n, in_place = it & 1;
  for (int pass = 0; pass < 2; pass++) {
    int all = pass == 0, receives = all || rank == root;
    size_t *d = layout(c, n, (it >> 1) & 1, &ls, &ext);
    void *rb = xbuf(ext, dt), *own = xbuf(c[rank], dt);
    void *sb = in_place && receives ? (uint8_t *)rb + disp(d, c, rank) * tdist_dtype_size(dt) : own;
    for (size_t e = 0; e < c[rank]; e++)
      set_el(sb, dt, e, val(rank, 0, e, it));
    if (all)
      MP_CHECK_RC(tdist_all_gather_v(g, sb, c[rank], rb, c, d, dt, NULL, NULL));
    else /* off root the receive arrays may be NULL */
      MP_CHECK_RC(tdist_gather_v(g, sb, c[rank], receives ? rb : NULL, receives ? c : NULL,
                                 receives ? d : NULL, dt, root, NULL, NULL));
    for (int j = 0; j < n && receives; j++)
      for (size_t e = 0; e < c[j]; e++) {
        double got = get_el(rb, dt, disp(d, c, j) + e), want = val(j, 0, e, it);
        if (got != want)
          FAIL_AT("%s it %d %s%s: block %d [%zu] = %g, want %g", all ? "all_gather_v" : "gather_v",
                  it, tdist_dtype_name(dt), in_place ? " in place" : "", j, e, got, want);
      }
    if (receives && gaps_ok(rank, rb, ext, c, d, n, dt, all ? "all_gather_v" : "gather_v"))
      return 1;
    free(d), free(rb), free(own);
  }
  return 0;
}

static int scatterv(tdist_group_t *g, int rank, int n, int it, size_t maxc) {
  tdist_dtype_t dt = dts[(it + 5) % NDT];
  uint64_t s = 0xabcdefULL + (uint64_t)it * 3, ls = (uint64_t)it + 11;
  size_t c[8] = {0}, ext = 0;
  for (int j = 0; j < n; j++)
    c[j] = skewed(&s, (it + 1) % n, j, n, maxc);
  int root = (it + 1) % n, in_place = it & 1, isroot = rank == root;
  size_t *d = isroot ? layout(c, n, (it >> 1) & 1, &ls, &ext) : NULL;
  void *sb = isroot ? xbuf(ext, dt) : NULL, *rb = xbuf(c[rank], dt);
  for (int j = 0; j < n && isroot; j++)
    for (size_t e = 0; e < c[j]; e++)
      set_el(sb, dt, disp(d, c, j) + e, val(root, j, e, it));
  void *out = in_place && isroot ? (uint8_t *)sb + disp(d, c, rank) * tdist_dtype_size(dt) : rb;
  MP_CHECK_RC(tdist_scatter_v(g, sb, isroot ? c : NULL, d, out, c[rank], dt, root, NULL, NULL));
  for (size_t e = 0; e < c[rank]; e++)
    if (get_el(out, dt, e) != val(root, rank, e, it))
      FAIL_AT("scatter_v it %d %s root %d: [%zu] = %g, want %g", it, tdist_dtype_name(dt), root, e,
              get_el(out, dt, e), val(root, rank, e, it));
  free(d), free(sb), free(rb);
  return 0;
}

static int rsv(tdist_group_t *g, int rank, int n, int it, size_t maxc, tdist_redop_t rop) {
  tdist_dtype_t dt = dts[(it + 1) % NDT];
  uint64_t s = 0x1234567ULL + (uint64_t)it * 77;
  size_t c[8] = {0}, total = 0, mine = 0;
  for (int j = 0; j < n; j++) {
    c[j] = skewed(&s, j, it % n, n, maxc);
    if (j < rank) mine += c[j];
    total += c[j];
  }
  double scalar = 0.5;
  tdist_op_opts_t o = {.mask = TDIST_OP_FIELD_SCALAR, .premul_scalar = scalar};
  uint8_t *in = malloc(total * tdist_dtype_size(dt) + 8), *out = malloc(c[rank] * 8 + 8);
  fill(in, dt, total, rank, it, rop);
  int in_place = it & 1;
  void *rb = in_place ? in + mine * tdist_dtype_size(dt) : out;
  MP_CHECK_RC(tdist_reduce_scatter_v(g, in, rb, c, dt, rop, &o, NULL));
  for (size_t e = 0; e < c[rank]; e++) {
    double want = ref_reduce(mine + e, n, it, rop, dt, scalar), got = get_el(rb, dt, e);
    if (!close_enough(got, want, dt))
      FAIL_AT("reduce_scatter_v it %d %s %s%s: [%zu] = %g, want %g", it, tdist_dtype_name(dt),
              tdist_redop_name(rop), in_place ? " in place" : "", e, got, want);
  }
  free(in), free(out);
  return 0;
}

/* Local argument errors: refused at the call, nothing submitted. */
static int bad_args(tdist_group_t *g, int rank, int n) {
  size_t c[8], z[8] = {0};
  float buf[64];
  for (int j = 0; j < n; j++)
    c[j] = 1;
  MP_CHECK(tdist_all_to_all_v(g, buf, NULL, NULL, buf + 8, c, NULL, TDIST_FLOAT32, NULL, NULL) ==
           TDIST_ERR_INVALID_ARGUMENT);
  MP_CHECK(tdist_all_to_all_v(g, buf, c, NULL, buf, c, NULL, TDIST_FLOAT32, NULL, NULL) ==
           TDIST_ERR_INVALID_ARGUMENT); /* in place */
  MP_CHECK(strstr(tdist_last_error(), "in-place") != NULL);
  MP_CHECK(tdist_all_to_all_v(g, NULL, c, NULL, buf, c, NULL, TDIST_FLOAT32, NULL, NULL) ==
           TDIST_ERR_INVALID_ARGUMENT); /* NULL with a non-empty extent */
  size_t huge[8];
  for (int j = 0; j < n; j++)
    huge[j] = SIZE_MAX / 2;
  MP_CHECK(tdist_all_to_all_v(g, buf, huge, NULL, buf + 8, c, NULL, TDIST_FLOAT32, NULL, NULL) ==
           TDIST_ERR_INVALID_ARGUMENT); /* overflow */
  MP_CHECK(tdist_all_gather_v(g, buf, 2, buf + 8, c, NULL, TDIST_FLOAT32, NULL, NULL) ==
           TDIST_ERR_INVALID_ARGUMENT); /* recv_counts[rank] != send_count */
  MP_CHECK(strstr(tdist_last_error(), "recv_counts") != NULL);
  MP_CHECK(tdist_gather_v(g, buf, 1, buf + 8, c, NULL, TDIST_FLOAT32, n, NULL, NULL) ==
           TDIST_ERR_INVALID_ARGUMENT); /* root out of range */
  MP_CHECK(tdist_reduce_scatter_v(g, buf, buf + 8, c, TDIST_FLOAT32, TDIST_REDOP_COUNT, NULL,
                                  NULL) == TDIST_ERR_INVALID_ARGUMENT);
  /* all zero: valid, NULL buffers accepted */
  MP_CHECK_RC(tdist_all_to_all_v(g, NULL, z, NULL, NULL, z, NULL, TDIST_FLOAT32, NULL, NULL));
  MP_CHECK_RC(tdist_reduce_scatter_v(g, NULL, NULL, z, TDIST_INT32, TDIST_SUM, NULL, NULL));
  (void)rank;
  return 0;
}

/* Rank i's send_counts[j] (5) != rank j's recv_counts[i] (7), and a gather_v
 * root that expects 4 from a rank sending 6: MISMATCH everywhere, both
 * numbers named. In a subgroup of every rank, so the world goes on.
 * which 2: the all_to_all_v again with rank j, the one that finds it,
 * posting last: every other step is in when it looks, so the CPU backend's
 * now lane checks its counts (sc_op.c, now_a2av), where in 0 it is mostly
 * a pass of the slow lane. */
static int mismatch(tdist_group_t *world, int rank, int n, int which) {
  int all[8] = {0};
  for (int i = 0; i < n; i++)
    all[i] = i;
  tdist_group_t *sub = NULL;
  MP_CHECK_RC(tdist_new_group(world, all, n, NULL, &sub));
  /* A rank slow to leave this barrier may already hear of the mismatch the
   * faster ranks found in the op below: its barrier then fails with it. */
  int brc = tdist_barrier(sub, NULL, NULL);
  int32_t sb[64] = {0}, rb[64];
  size_t sc[8], rc[8];
  for (int j = 0; j < n; j++)
    sc[j] = rc[j] = 2;
  int i = 0, j = n - 1, rc0;
  const char *want_a, *want_b;
  if (brc != 0) {
    rc0 = brc;
    want_a = which != 1 ? "sent 5 int32" : "sent 6 int32";
    want_b = which != 1 ? "expects 7" : "expects 4";
  } else if (which != 1) {
    if (rank == i) sc[j] = 5;
    if (rank == j) rc[i] = 7;
    if (which == 2 && rank == j) usleep(20000);
    rc0 = tdist_all_to_all_v(sub, sb, sc, NULL, rb, rc, NULL, TDIST_INT32, NULL, NULL);
    want_a = "sent 5 int32";
    want_b = "expects 7";
  } else {
    rc[1] = 4; /* root 0 expects 4 from rank 1, which sends 6 */
    rc0 = tdist_gather_v(sub, sb, rank == 1 ? 6 : 2, rb, rank == 0 ? rc : NULL, NULL, TDIST_INT32,
                         0, NULL, NULL);
    want_a = "sent 6 int32";
    want_b = "expects 4";
  }
  char msg[512];
  snprintf(msg, sizeof(msg), "%s", tdist_last_error());
  if (rc0 == 0) { /* completed here before the cause came: the next op fails */
    rc0 = tdist_barrier(sub, NULL, NULL);
    snprintf(msg, sizeof(msg), "%s", tdist_last_error());
  }
  if (rc0 != TDIST_ERR_MISMATCH || !strstr(msg, want_a) || !strstr(msg, want_b))
    FAIL_AT("mismatch %d: %s: %s", which, tdist_err_name(rc0), msg);
  if (rank == 0)
    fprintf(stderr, "[rank 0] mismatch %d -> %s: %s\n", which, tdist_err_name(rc0), msg);
  MP_CHECK(tdist_group_is_aborted(sub));
  tdist_group_destroy(sub);
  MP_CHECK_RC(tdist_barrier(world, NULL, NULL)); /* nobody leaves early */
  return 0;
}

/* One member gives a block larger than a slot (400 KiB), the others a few
 * elements each: the small givers take the now lane and meet a stream
 * longer than their one step (handed to the slow lane: two ranks), or a
 * block read in place (lent where the ranks outnumber the CPUs: one step,
 * read in the lane); the large giver takes the slow lane. The large rank
 * moves each round; every element is checked. */
static int lopsided(tdist_group_t *g, int rank, int n) {
  const size_t big = 100000;
  for (int round = 0; round < 2 * n; round++) {
    int L = round % n, dst = (L + 1) % n;
    size_t sc[8], rc[8], so[9] = {0}, ro[9] = {0};
    for (int j = 0; j < n; j++) {
      sc[j] = rank == L && j == dst ? big : (size_t)((rank + j + round) % 3);
      rc[j] = j == L && rank == dst ? big : (size_t)((j + rank + round) % 3);
      so[j + 1] = so[j] + sc[j];
      ro[j + 1] = ro[j] + rc[j];
    }
    int32_t *in = malloc((so[n] + 1) * sizeof(int32_t)),
            *out = malloc((ro[n] + 1) * sizeof(int32_t));
    MP_CHECK(in && out);
    for (int j = 0; j < n; j++)
      for (size_t e = 0; e < sc[j]; e++)
        in[so[j] + e] = rank * 1000003 + j * 7919 + round * 31 + (int32_t)e;
    for (size_t e = 0; e < ro[n]; e++)
      out[e] = -1;
    MP_CHECK_RC(tdist_all_to_all_v(g, in, sc, NULL, out, rc, NULL, TDIST_INT32, NULL, NULL));
    for (int j = 0; j < n; j++)
      for (size_t e = 0; e < rc[j]; e++)
        if (out[ro[j] + e] != j * 1000003 + rank * 7919 + round * 31 + (int32_t)e)
          FAIL_AT("lopsided round %d: from %d element %zu is %d", round, j, e, (int)out[ro[j] + e]);
    free(in);
    free(out);
  }
  return 0;
}

static int store(tdist_group_t *g, int rank, int n) {
  tdist_store_t *s = tdist_group_store(g);
  MP_CHECK(s != NULL && tdist_group_store(g) == s);
  char key[32], v[32];
  snprintf(key, sizeof(key), "meta/%d", rank);
  snprintf(v, sizeof(v), "shape-%d", rank * 10);
  MP_CHECK_RC(tdist_store_set(s, key, v, strlen(v)));
  for (int r = 0; r < n; r++) {
    void *val = NULL;
    size_t len = 0;
    snprintf(key, sizeof(key), "meta/%d", r);
    snprintf(v, sizeof(v), "shape-%d", r * 10);
    MP_CHECK_RC(tdist_store_get(s, key, &val, &len, 20000));
    MP_CHECK(len == strlen(v) && memcmp(val, v, len) == 0);
    tdist_store_free(val);
  }
  MP_CHECK(tdist_group_store(NULL) == NULL);
  return 0;
}

static int child(int rank, int n, void *arg) {
  tdist_group_t *g = NULL;
  MP_CHECK_RC(cpu_test_init(*(int *)arg, rank, n, 60000, &g));
  if (store(g, rank, n)) return 1;
  if (bad_args(g, rank, n)) return 1;
  static const size_t maxcs[] = {0, 1, 7, 300, 2000};
  int it = 0;
  for (int k = 0; k < 16; k++, it++) {
    size_t maxc = maxcs[k % 5];
    if (a2av(g, rank, n, it, maxc) || gathers(g, rank, n, it, maxc) ||
        scatterv(g, rank, n, it, maxc))
      return 1;
  }
  for (int op = 0; op <= TDIST_PREMUL_SUM; op++)
    for (int k = 0; k < 4; k++, it++)
      if (rsv(g, rank, n, it, maxcs[(k + op) % 5], (tdist_redop_t)op)) return 1;
  /* Large: skewed blocks above the single-copy / deferred-read thresholds. */
  if (a2av(g, rank, n, 8 * 6 + 6, 300000) || gathers(g, rank, n, 6, 200000) ||
      scatterv(g, rank, n, 6, 200000) || rsv(g, rank, n, 5 * 8, 300000, TDIST_SUM))
    return 1;
  /* Several v-ops in flight at once, waited together. */
  {
    size_t c[8], gc[8], off[9] = {0}, goff[9] = {0};
    int32_t in[64], out[64], own[8], ag[64], rin[64], rout[8];
    for (int j = 0; j < n; j++) {
      c[j] = (size_t)((rank + j) % 3) + 1; /* symmetric: what I send j = what j sends me */
      gc[j] = (size_t)(j % 3) + 1;         /* the same on every rank */
      off[j + 1] = off[j] + c[j];
      goff[j + 1] = goff[j] + gc[j];
    }
    for (int j = 0; j < n; j++)
      for (size_t e = 0; e < c[j]; e++)
        in[off[j] + e] = 1000 * rank + 10 * j + (int32_t)e;
    for (size_t e = 0; e < gc[rank]; e++)
      own[e] = 1000 * rank + (int32_t)e;
    for (size_t k = 0; k < goff[n]; k++)
      rin[k] = rank + (int32_t)k;
    tdist_work_t *w[3];
    MP_CHECK_RC(tdist_all_to_all_v(g, in, c, NULL, out, c, NULL, TDIST_INT32, NULL, &w[0]));
    MP_CHECK_RC(tdist_all_gather_v(g, own, gc[rank], ag, gc, NULL, TDIST_INT32, NULL, &w[1]));
    MP_CHECK_RC(tdist_reduce_scatter_v(g, rin, rout, gc, TDIST_INT32, TDIST_SUM, NULL, &w[2]));
    MP_CHECK_RC(tdist_wait_all(w, 3, 0));
    MP_CHECK(tdist_work_optype(w[0]) == TDIST_OP_ALL_TO_ALL_V);
    MP_CHECK(tdist_work_optype(w[1]) == TDIST_OP_ALL_GATHER_V);
    MP_CHECK(tdist_work_optype(w[2]) == TDIST_OP_REDUCE_SCATTER_V);
    for (int k = 0; k < 3; k++)
      tdist_work_release(w[k]);
    for (int j = 0; j < n; j++) {
      for (size_t e = 0; e < c[j]; e++)
        MP_CHECK(out[off[j] + e] == 1000 * j + 10 * rank + (int32_t)e);
      for (size_t e = 0; e < gc[j]; e++)
        MP_CHECK(ag[goff[j] + e] == 1000 * j + (int32_t)e);
    }
    for (size_t e = 0; e < gc[rank]; e++) {
      int32_t want = 0;
      for (int r = 0; r < n; r++)
        want += r + (int32_t)(goff[rank] + e);
      MP_CHECK(rout[e] == want);
    }
  }
  if (n >= 2 && lopsided(g, rank, n)) return 1;
  if (n >= 2 && (mismatch(g, rank, n, 0) || mismatch(g, rank, n, 1) || mismatch(g, rank, n, 2)))
    return 1;
  MP_CHECK_RC(tdist_barrier(g, NULL, NULL));
  MP_CHECK_RC(tdist_group_destroy(g));
  return 0;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 2;
  if (n < 1 || n > 8) return 2;
  setenv("TDIST_TRACE_ON_FAILURE", "0", 1);
  int port = tdist_mp_free_port();
  int rc = tdist_mp_run(n, child, &port, 170);
  printf("cpu_vops n=%d: %s\n", n, rc ? "FAILED" : "ok");
  return rc ? 1 : 0;
}
