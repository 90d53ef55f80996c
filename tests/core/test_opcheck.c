/*
 * test_opcheck.c - the one argument checker (core/opcheck.c): every fixed
 * collective and its v sibling, given the same bad arguments, fail with the
 * same code and the same words (issue 29: all_to_all refused any overlap
 * but all_to_all_v only identical pointers; reduce_scatter_v refused
 * overlap, reduce_scatter none). Also the in-place forms both accept.
 *
 * One process is rank 1 of a 4-rank group on the test backend (it completes
 * every op at once): only the caller-thread checks matter here, and rank 1
 * is the root of the rooted calls unless a case says otherwise.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "tb_world.h"
#include "test_backend.h"
#include "tdist/tdist.h"

enum { N = 4, RANK = 1, C = 2 }; /* group size, this rank, block count */

static tdist_group_t *g;
static int32_t buf[4 * N * C];
static const size_t counts[N] = {C, C, C, C}; /* the fixed ops' layout, packed */
#define BIG ((size_t)1 << (sizeof(size_t) * 8 - 2))
static const size_t big[N] = {BIG, BIG, BIG, BIG};

static int setup(void **state) {
  (void)state;
  tb_set_mode(TB_COMPLETE);
  return tb_group_create(RANK, N, 10000, &g);
}

static int teardown(void **state) {
  (void)state;
  return tdist_group_destroy(g);
}

/* The fixed call's and the v call's codes agree and are `want`; both
 * messages name their call and contain `needle` (when failing). */
static void same_(int want, const char *needle, const char *ffn, int rf, const char *mf,
                  const char *vfn, int rv, const char *mv, int line) {
  if (rf != want || rv != want)
    fail_msg("line %d: %s -> %s (%s), %s -> %s (%s); want %s", line, ffn, tdist_err_name(rf), mf,
             vfn, tdist_err_name(rv), mv, tdist_err_name(want));
  if (want == 0) return;
  if (!strstr(mf, ffn) || !strstr(mv, vfn) || !strstr(mf, needle) || !strstr(mv, needle))
    fail_msg("line %d: want '%s' in both:\n  %s\n  %s", line, needle, mf, mv);
}

#define SAME(want, needle, ...) SAME_(want, needle, __VA_ARGS__)
#define SAME_(want, needle, FIXED, ffn, V, vfn)                                         \
  do {                                                                                  \
    char mf_[512];                                                                      \
    int rf_ = (FIXED);                                                                  \
    snprintf(mf_, sizeof(mf_), "%s", tdist_last_error());                               \
    int rv_ = (V);                                                                      \
    same_((want), (needle), (ffn), rf_, mf_, (vfn), rv_, tdist_last_error(), __LINE__); \
  } while (0)

/* The calls, with (send, recv) buffers, count/counts, dtype, reduction, root. */
#define A2A(s, r, c, cs, dt)                                        \
  tdist_all_to_all(g, s, r, c, dt, NULL, NULL), "tdist_all_to_all", \
      tdist_all_to_all_v(g, s, cs, NULL, r, cs, NULL, dt, NULL, NULL), "tdist_all_to_all_v"
#define AG(s, r, c, cs, dt)                                         \
  tdist_all_gather(g, s, r, c, dt, NULL, NULL), "tdist_all_gather", \
      tdist_all_gather_v(g, s, c, r, cs, NULL, dt, NULL, NULL), "tdist_all_gather_v"
#define GA(s, r, c, cs, dt, root)                                 \
  tdist_gather(g, s, r, c, dt, root, NULL, NULL), "tdist_gather", \
      tdist_gather_v(g, s, c, r, cs, NULL, dt, root, NULL, NULL), "tdist_gather_v"
#define SC(s, r, c, cs, dt, root)                                   \
  tdist_scatter(g, s, r, c, dt, root, NULL, NULL), "tdist_scatter", \
      tdist_scatter_v(g, s, cs, NULL, r, c, dt, root, NULL, NULL), "tdist_scatter_v"
#define RS(s, r, c, cs, dt, op)                                                 \
  tdist_reduce_scatter(g, s, r, c, dt, op, NULL, NULL), "tdist_reduce_scatter", \
      tdist_reduce_scatter_v(g, s, r, cs, dt, op, NULL, NULL), "tdist_reduce_scatter_v"

#define BAD TDIST_ERR_INVALID_ARGUMENT
#define I32 TDIST_INT32

static int32_t *at(size_t i) { return buf + i; }

/* Overlap: one rule per pair (opcheck.h). */
static void overlap(void **state) {
  (void)state;
  size_t whole = N * C;
  /* all_to_all(_v): no in-place form, identical or partial. */
  SAME(BAD, "no in-place form", A2A(at(0), at(0), C, counts, I32));
  SAME(BAD, "no in-place form", A2A(at(0), at(whole - 1), C, counts, I32));
  SAME(BAD, "no in-place form", A2A(at(whole - 1), at(0), C, counts, I32));
  SAME(0, "", A2A(at(0), at(whole), C, counts, I32));
  /* reduce_scatter(_v): recvbuf at this rank's block only. */
  SAME(BAD, "overlap", RS(at(0), at(0), C, counts, I32, TDIST_SUM));
  SAME(BAD, "overlap", RS(at(0), at(RANK * C + 1), C, counts, I32, TDIST_SUM));
  SAME(0, "", RS(at(0), at(RANK * C), C, counts, I32, TDIST_SUM));
  SAME(0, "", RS(at(0), at(whole), C, counts, I32, TDIST_SUM));
  /* all_gather(_v): sendbuf at this rank's block only. */
  SAME(BAD, "overlap", AG(at(0), at(0), C, counts, I32));
  SAME(BAD, "overlap", AG(at(1), at(0), C, counts, I32));
  SAME(0, "", AG(at(RANK * C), at(0), C, counts, I32));
  /* gather(_v) on root: sendbuf at root's block only; off root recvbuf is
   * not used, so nothing overlaps. */
  SAME(BAD, "overlap", GA(at(0), at(0), C, counts, I32, RANK));
  SAME(0, "", GA(at(RANK * C), at(0), C, counts, I32, RANK));
  SAME(0, "", GA(at(0), at(0), C, counts, I32, 0));
  /* scatter(_v) on root: recvbuf at root's block only. */
  SAME(BAD, "overlap", SC(at(0), at(0), C, counts, I32, RANK));
  SAME(BAD, "overlap", SC(at(0), at(RANK * C - 1), C, counts, I32, RANK));
  SAME(0, "", SC(at(0), at(RANK * C), C, counts, I32, RANK));
  SAME(0, "", SC(at(0), at(0), C, counts, I32, 0));
  /* Empty blocks never overlap. */
  static const size_t zero[N] = {0, 0, 0, 0};
  SAME(0, "", A2A(at(0), at(0), 0, zero, I32));
}

/* A reduction that means nothing for the type; one out of range. */
static void reduction_dtype(void **state) {
  (void)state;
  SAME(BAD, "bitwise", RS(at(0), at(N * C), C, counts, TDIST_FLOAT32, TDIST_BAND));
  SAME(BAD, "of bool", RS(at(0), at(N * C), C, counts, TDIST_BOOL, TDIST_AVG));
  SAME(BAD, "unknown reduction", RS(at(0), at(N * C), C, counts, I32, (tdist_redop_t)42));
  /* all_reduce and reduce (no v sibling) say the same. */
  assert_int_equal(tdist_all_reduce(g, at(0), at(0), C, TDIST_FLOAT32, TDIST_BXOR, NULL, NULL),
                   BAD);
  assert_non_null(strstr(tdist_last_error(), "bitwise"));
  assert_int_equal(tdist_reduce(g, at(0), at(0), C, TDIST_BOOL, TDIST_PREMUL_SUM, RANK, NULL, NULL),
                   BAD);
  assert_non_null(strstr(tdist_last_error(), "of bool"));
}

static void bad_dtype(void **state) {
  (void)state;
  tdist_dtype_t bad = (tdist_dtype_t)99;
  SAME(BAD, "unknown dtype", A2A(at(0), at(N * C), C, counts, bad));
  SAME(BAD, "unknown dtype", AG(at(0), at(N * C), C, counts, bad));
  SAME(BAD, "unknown dtype", GA(at(0), at(N * C), C, counts, bad, RANK));
  SAME(BAD, "unknown dtype", SC(at(0), at(N * C), C, counts, bad, RANK));
  SAME(BAD, "unknown dtype", RS(at(0), at(N * C), C, counts, bad, TDIST_SUM));
}

static void bad_root(void **state) {
  (void)state;
  SAME(BAD, "root 4 is not in [0, 4)", GA(at(0), at(N * C), C, counts, I32, N));
  SAME(BAD, "root -1 is not in [0, 4)", GA(at(0), at(N * C), C, counts, I32, -1));
  SAME(BAD, "root 4 is not in [0, 4)", SC(at(0), at(N * C), C, counts, I32, N));
  SAME(BAD, "root -1 is not in [0, 4)", SC(at(0), at(N * C), C, counts, I32, -1));
}

static void null_buffers(void **state) {
  (void)state;
  SAME(BAD, "sendbuf is NULL", A2A(NULL, at(N * C), C, counts, I32));
  SAME(BAD, "recvbuf is NULL", A2A(at(0), NULL, C, counts, I32));
  SAME(BAD, "sendbuf is NULL", AG(NULL, at(N * C), C, counts, I32));
  SAME(BAD, "recvbuf is NULL", AG(at(0), NULL, C, counts, I32));
  SAME(BAD, "sendbuf is NULL", GA(NULL, at(N * C), C, counts, I32, RANK));
  SAME(BAD, "recvbuf (on root) is NULL", GA(at(0), NULL, C, counts, I32, RANK));
  SAME(0, "", GA(at(0), NULL, C, counts, I32, 0)); /* off root */
  SAME(BAD, "sendbuf (on root) is NULL", SC(NULL, at(N * C), C, counts, I32, RANK));
  SAME(0, "", SC(NULL, at(N * C), C, counts, I32, 0)); /* off root */
  SAME(BAD, "recvbuf is NULL", SC(at(0), NULL, C, counts, I32, RANK));
  SAME(BAD, "sendbuf is NULL", RS(NULL, at(N * C), C, counts, I32, TDIST_SUM));
  SAME(BAD, "recvbuf is NULL", RS(at(0), NULL, C, counts, I32, TDIST_SUM));
  /* NULL is fine for empty blocks */
  static const size_t zero[N] = {0, 0, 0, 0};
  SAME(0, "", A2A(NULL, NULL, 0, zero, I32));
  SAME(0, "", RS(NULL, NULL, 0, zero, I32, TDIST_SUM));
}

/* Counts whose byte size overflows (a negative count cast to size_t is one). */
static void oversized(void **state) {
  (void)state;
  SAME(BAD, "overflows the address space", A2A(at(0), at(N * C), BIG, big, I32));
  SAME(BAD, "overflows the address space", RS(at(0), at(N * C), BIG, big, I32, TDIST_SUM));
  SAME(BAD, "overflows the address space", GA(at(0), at(N * C), BIG, big, I32, RANK));
  SAME(BAD, "overflows the address space", SC(at(0), at(N * C), BIG, big, I32, RANK));
  size_t neg = (size_t)-1;
  size_t negs[N] = {neg, neg, neg, neg};
  SAME(BAD, "overflows the address space", AG(at(0), at(N * C), neg, negs, I32));
  SAME(BAD, "overflows the address space", A2A(at(0), at(N * C), neg, negs, I32));
}

/* What only v-ops have: their arrays (NULL where read, own block agreeing). */
static void v_arrays(void **state) {
  (void)state;
  assert_int_equal(
      tdist_all_to_all_v(g, at(0), NULL, NULL, at(N * C), counts, NULL, I32, NULL, NULL), BAD);
  assert_non_null(strstr(tdist_last_error(), "send_counts is NULL"));
  assert_int_equal(tdist_reduce_scatter_v(g, at(0), at(N * C), NULL, I32, TDIST_SUM, NULL, NULL),
                   BAD);
  assert_non_null(strstr(tdist_last_error(), "recv_counts is NULL"));
  assert_int_equal(tdist_all_gather_v(g, at(0), C + 1, at(N * C), counts, NULL, I32, NULL, NULL),
                   BAD);
  assert_non_null(strstr(tdist_last_error(), "recv_counts[1] = 2"));
  /* off root, gather_v's and scatter_v's arrays are not read */
  assert_int_equal(tdist_gather_v(g, at(0), C, NULL, NULL, NULL, I32, 0, NULL, NULL), 0);
  assert_int_equal(tdist_scatter_v(g, NULL, NULL, NULL, at(0), C, I32, 0, NULL, NULL), 0);
}

/* An all_to_all_v whose arrays are the same memory as the last valid
 * one's but hold other counts is checked again (opcheck.c keeps the last
 * valid one and compares the arrays' contents): a count changed in place to
 * one too large, or to one whose blocks overlap the receive buffer, fails
 * as it would on a first call; the valid layout passes again. */
static void v_memo(void **state) {
  (void)state;
  size_t sc[N] = {C, C, C, C}, rc[N] = {C, C, C, C};
  for (int k = 0; k < 2; k++)
    assert_int_equal(tdist_all_to_all_v(g, at(0), sc, NULL, at(N * C), rc, NULL, I32, NULL, NULL),
                     0);
  sc[2] = BIG;
  assert_int_equal(tdist_all_to_all_v(g, at(0), sc, NULL, at(N * C), rc, NULL, I32, NULL, NULL),
                   BAD);
  assert_non_null(strstr(tdist_last_error(), "overflows the address space"));
  sc[2] = C;
  assert_int_equal(tdist_all_to_all_v(g, at(0), sc, NULL, at(N * C), rc, NULL, I32, NULL, NULL), 0);
  sc[3] = C + 5; /* the packed send blocks now reach into recvbuf */
  assert_int_equal(tdist_all_to_all_v(g, at(0), sc, NULL, at(N * C), rc, NULL, I32, NULL, NULL),
                   BAD);
  assert_non_null(strstr(tdist_last_error(), "overlap"));
  sc[3] = C;
  rc[1] = BIG; /* the receive side too */
  assert_int_equal(tdist_all_to_all_v(g, at(0), sc, NULL, at(N * C), rc, NULL, I32, NULL, NULL),
                   BAD);
  rc[1] = C;
  assert_int_equal(tdist_all_to_all_v(g, at(0), sc, NULL, at(N * C), rc, NULL, I32, NULL, NULL), 0);
}

int main(void) {
  tb_register();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(overlap),  cmocka_unit_test(reduction_dtype), cmocka_unit_test(bad_dtype),
      cmocka_unit_test(bad_root), cmocka_unit_test(null_buffers),    cmocka_unit_test(oversized),
      cmocka_unit_test(v_arrays), cmocka_unit_test(v_memo),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
