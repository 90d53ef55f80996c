/*
 * test_nccl_vops.c - the variable-size collectives on the NCCL backend, with
 * NCCL and CUDA replaced by the scripted fake (fake_nccl.c), 3 real processes
 * over a real TCP store. For each v-op every rank checks what it enqueued,
 * against a reference computed from the same counts:
 *   - one ncclGroupStart/End bracketing the op's calls, after the wait on
 *     the start event and before the end event (stream order as for every
 *     op);
 *   - all_to_all_v: ncclSend of send_counts[j] and ncclRecv of
 *     recv_counts[j] to/from every j with a non-empty block, self included;
 *     empty blocks make no call;
 *   - all_gather_v / gather_v / scatter_v: the same pattern (self skipped in
 *     place), rooted ones only to/from the root;
 *   - reduce_scatter_v: one ncclReduce per non-empty block, in block order,
 *     with the reduction (PREMUL_SUM created and destroyed around it);
 *   - wildcard receives are refused at submit (NOT_SUPPORTED, naming the
 *     wildcard), the group stays usable.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "nccl_test_util.h"

#define N 3
static int port;
static char dev[1 << 16]; /* "device" memory: the fake calls every pointer device memory */

/* The calls named send/recv (ncclSend, ncclRecv) between from and to, as
 * (peer, count) pairs in log order. */
static int collect(const char *name, int from, int to, long *peer, long *count, int max) {
  int k = 0;
  for (int i = fake_find(name, from); i >= 0 && i < to && k < max; i = fake_find(name, i + 1)) {
    fake_call_t c = fake_log_get(i);
    peer[k] = c.a;
    count[k] = (long)c.scalar;
    k++;
  }
  return k;
}

/* The op's calls are inside one group, between the stream wait and the end
 * event: returns the group's [start, end] log indices. */
static int bracket(int from, int *gs, int *ge) {
  *gs = fake_find("ncclGroupStart", from);
  *ge = fake_find("ncclGroupEnd", from);
  int wait = fake_find("cudaStreamWaitEvent", from);
  int end = fake_find("cudaEventRecord", *ge);
  MP_CHECK(wait >= 0 && wait < *gs && *gs < *ge && end > *ge);
  MP_CHECK(fake_find("ncclGroupStart", *gs + 1) < 0); /* exactly one group */
  return 0;
}

/* p2p pattern check: expected (peer, count) lists, in peer order. */
static int expect(const char *name, int gs, int ge, const long *wpeer, const long *wcount, int wn) {
  long peer[16], count[16];
  int k = collect(name, gs, ge, peer, count, 16);
  if (k != wn) {
    fprintf(stderr, "%s: %d calls, want %d\n", name, k, wn);
    return 1;
  }
  for (int i = 0; i < k; i++)
    if (peer[i] != wpeer[i] || count[i] != wcount[i]) {
      fprintf(stderr, "%s #%d: peer %ld count %ld, want %ld %ld\n", name, i, peer[i], count[i],
              wpeer[i], wcount[i]);
      return 1;
    }
  return 0;
}

/* C[i][j]: what rank i sends rank j (zeros included). */
static const size_t C[N][N] = {{3, 0, 5}, {1, 2, 0}, {0, 4, 6}};

static int child(int rank, int n, void *arg) {
  (void)arg;
  fake_reset();
  tdist_group_t *g = NULL;
  MP_CHECK_RC(nt_world(rank, n, port, 20000, &g));
  long wp[8], wc[8];
  int k, gs, ge;

  /* all_to_all_v, packed */
  size_t sc[N], rc[N];
  for (int j = 0; j < N; j++) {
    sc[j] = C[rank][j];
    rc[j] = C[j][rank];
  }
  int from = fake_log_size();
  MP_CHECK_RC(
      tdist_all_to_all_v(g, dev, sc, NULL, dev + 4096, rc, NULL, TDIST_FLOAT32, NULL, NULL));
  if (bracket(from, &gs, &ge)) return 1;
  k = 0;
  for (int j = 0; j < N; j++)
    if (sc[j]) wp[k] = j, wc[k++] = (long)sc[j];
  if (expect("ncclSend", gs, ge, wp, wc, k)) return 1;
  k = 0;
  for (int j = 0; j < N; j++)
    if (rc[j]) wp[k] = j, wc[k++] = (long)rc[j];
  if (expect("ncclRecv", gs, ge, wp, wc, k)) return 1;
  MP_CHECK(fake_log_get(fake_find("ncclSend", gs)).b == ncclFloat32);

  /* all_gather_v, in place: no self call */
  size_t gc[N] = {2, 0, 7}, gd[N] = {10, 0, 20};
  from = fake_log_size();
  MP_CHECK_RC(
      tdist_all_gather_v(g, dev + gd[rank] * 8, gc[rank], dev, gc, gd, TDIST_FLOAT64, NULL, NULL));
  if (bracket(from, &gs, &ge)) return 1;
  k = 0;
  for (int j = 0; j < N; j++)
    if (j != rank && gc[rank]) wp[k] = j, wc[k++] = (long)gc[rank];
  if (expect("ncclSend", gs, ge, wp, wc, k)) return 1;
  k = 0;
  for (int j = 0; j < N; j++)
    if (j != rank && gc[j]) wp[k] = j, wc[k++] = (long)gc[j];
  if (expect("ncclRecv", gs, ge, wp, wc, k)) return 1;

  /* gather_v to root 2 (out of place: root sends to itself too) */
  from = fake_log_size();
  MP_CHECK_RC(tdist_gather_v(g, dev, gc[rank], dev + 8192, rank == 2 ? gc : NULL, NULL, TDIST_INT32,
                             2, NULL, NULL));
  if (bracket(from, &gs, &ge)) return 1;
  k = 0;
  if (gc[rank]) wp[k] = 2, wc[k++] = (long)gc[rank];
  if (expect("ncclSend", gs, ge, wp, wc, k)) return 1;
  k = 0;
  for (int j = 0; j < N && rank == 2; j++)
    if (gc[j]) wp[k] = j, wc[k++] = (long)gc[j];
  if (expect("ncclRecv", gs, ge, wp, wc, k)) return 1;

  /* scatter_v from root 0 */
  size_t scc[N] = {4, 1, 0};
  from = fake_log_size();
  MP_CHECK_RC(tdist_scatter_v(g, dev, rank == 0 ? scc : NULL, NULL, dev + 8192, scc[rank],
                              TDIST_INT64, 0, NULL, NULL));
  if (bracket(from, &gs, &ge)) return 1;
  k = 0;
  for (int j = 0; j < N && rank == 0; j++)
    if (scc[j]) wp[k] = j, wc[k++] = (long)scc[j];
  if (expect("ncclSend", gs, ge, wp, wc, k)) return 1;
  k = 0;
  if (scc[rank]) wp[k] = 0, wc[k++] = (long)scc[rank];
  if (expect("ncclRecv", gs, ge, wp, wc, k)) return 1;

  /* reduce_scatter_v: one ncclReduce per non-empty block; AVG, then PREMUL */
  size_t rsc[N] = {5, 0, 2};
  from = fake_log_size();
  MP_CHECK_RC(
      tdist_reduce_scatter_v(g, dev, dev + 8192, rsc, TDIST_FLOAT32, TDIST_AVG, NULL, NULL));
  if (bracket(from, &gs, &ge)) return 1;
  int r1 = fake_find("ncclReduce", gs), r2 = fake_find("ncclReduce", r1 + 1);
  MP_CHECK(r1 > gs && r2 > r1 && r2 < ge && fake_find("ncclReduce", r2 + 1) < 0);
  MP_CHECK(fake_log_get(r1).a == 5 && fake_log_get(r2).a == 2);
  MP_CHECK((int)fake_log_get(r1).scalar == ncclAvg);
  tdist_op_opts_t o = {.mask = TDIST_OP_FIELD_SCALAR, .premul_scalar = 0.25};
  from = fake_log_size();
  MP_CHECK_RC(
      tdist_reduce_scatter_v(g, dev, dev + 8192, rsc, TDIST_FLOAT32, TDIST_PREMUL_SUM, &o, NULL));
  int cr = fake_find("ncclRedOpCreatePreMulSum", from), de = fake_find("ncclRedOpDestroy", from);
  if (bracket(from, &gs, &ge)) return 1;
  MP_CHECK(cr >= 0 && cr < gs && de > ge);

  /* async, waited */
  tdist_work_t *w = NULL;
  MP_CHECK_RC(tdist_all_to_all_v(g, dev, sc, NULL, dev + 4096, rc, NULL, TDIST_UINT8, NULL, &w));
  MP_CHECK_RC(tdist_work_wait(w, 5000));
  MP_CHECK(tdist_work_optype(w) == TDIST_OP_ALL_TO_ALL_V);
  tdist_work_release(w);

  /* wildcards refused at submit, with a message; the group goes on */
  MP_CHECK(tdist_irecv(g, dev, 4, TDIST_FLOAT32, TDIST_ANY_SOURCE, NULL, &w) ==
           TDIST_ERR_NOT_SUPPORTED);
  MP_CHECK(strstr(tdist_last_error(), "TDIST_ANY_SOURCE") != NULL);
  MP_CHECK(strstr(tdist_last_error(), "nccl") != NULL);
  tdist_op_opts_t anyt = {.mask = TDIST_OP_FIELD_TAG, .tag = TDIST_ANY_TAG};
  MP_CHECK(tdist_recv(g, dev, 4, TDIST_FLOAT32, (rank + 1) % N, &anyt) == TDIST_ERR_NOT_SUPPORTED);
  MP_CHECK(strstr(tdist_last_error(), "TDIST_ANY_TAG") != NULL);
  MP_CHECK(!tdist_group_is_aborted(g));
  MP_CHECK_RC(tdist_barrier(g, NULL, NULL));

  MP_CHECK(fake_violations() == 0);
  MP_CHECK_RC(tdist_group_destroy(g));
  return 0;
}

static void vops_enqueue_grouped_calls(void **state) {
  (void)state;
  port = tdist_mp_free_port();
  assert_int_equal(tdist_mp_run(N, child, NULL, 60), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(vops_enqueue_grouped_calls)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
