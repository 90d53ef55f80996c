/*
 * test_nccl_sim_graph.c - CUDA graph capture of NCCL ops (src/nccl/nccl_capture.c,
 * docs/nccl-backend.md "CUDA graph capture"), on the simulated GPU.
 *
 * Real processes over a real TCP store (tests/support/mp.c), device buffers,
 * every result checked against a host reference:
 *   replay_n3          all_reduce (SUM), all_reduce (PREMUL_SUM 0.5),
 *                      barrier and broadcast captured in one graph, which
 *                      is replayed 10 times, the inputs changed between
 *                      launches by copies on the stream: 10 checked
 *                      results of each; an uncaptured all_reduce between
 *                      the launches works and is checked; the captured
 *                      works are COMPLETED at once, tdist_work_is_captured,
 *                      their message says so, their callback runs at
 *                      registration, and the capture ran nothing;
 *   no_watchdog        a captured op never launched outlives twice the
 *                      group's timeout without aborting the group; the
 *                      graph then runs and is checked;
 *   destroy_with_graph tdist_group_destroy while a graph that captured the
 *                      group's ops exists succeeds; the graph still runs
 *                      (checked), the communicator lives until the graph
 *                      and its executable graph are destroyed, then goes;
 *   refused_and_batch  send and recv under capture are NOT_SUPPORTED with
 *                      a message naming tdist_batch_isend_irecv, the
 *                      capture and the group stay good; a batch exchange
 *                      captured instead replays correctly;
 *   two_graphs         two captures in progress at once on one group
 *                      (interleaved ops, a fork stream each), both graphs
 *                      checked; the group destroyed, the communicator
 *                      stays until the second graph goes;
 *   abort_then_replay  after an abort the graph's launch fails
 *                      (cudaErrorLaunchFailure on the simulation: the
 *                      communicator was aborted), the group's state is
 *                      freed with the graph.
 */
#include <stdatomic.h>
#include <stdlib.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "nccl_sim_util.h"
#include "util/inject.h"

static int port;

enum { C = 8, REPLAYS = 10 };

static atomic_int cb_runs;
static void count_cb(tdist_work_t *w, void *arg) {
  (void)w;
  (void)arg;
  atomic_fetch_add(&cb_runs, 1);
}

/* What a captured work's handle says (work.h). */
static int check_captured(tdist_work_t *w) {
  MP_CHECK(w != NULL);
  MP_CHECK(tdist_work_is_captured(w) == 1);
  MP_CHECK(tdist_work_is_completed(w) == 1);
  MP_CHECK(tdist_work_state(w) == TDIST_WORK_COMPLETED);
  NS_EXPECT(tdist_work_wait(w, 0), 0);
  NS_EXPECT(tdist_work_status(w), 0);
  NS_HAS(tdist_work_error_message(w), "captured into a CUDA graph");
  int before = atomic_load(&cb_runs);
  NS_EXPECT(tdist_work_on_complete(w, count_cb, NULL), 0);
  MP_CHECK(atomic_load(&cb_runs) == before + 1); /* ran at registration */
  return 0;
}

static int check_floats(const char *what, const float *got, const float *want, int n, int k) {
  for (int i = 0; i < n; i++)
    if (got[i] != want[i]) {
      fprintf(stderr, "[pid %d] %s, launch %d, element %d: %g, want %g\n", (int)getpid(), what, k,
              i, got[i], want[i]);
      return 1;
    }
  return 0;
}

/* ---- 10 replays, each checked ---------------------------------------------------------- */
static int replay_child(int rank, int n, void *arg) {
  (void)arg;
  tdist_group_t *g = NULL;
  MP_CHECK_RC(ns_world(rank, n, port, 20000, &g));
  float *in = ns_dev(NULL, 4 * C), *out = ns_dev(NULL, 4 * C), *pm = ns_dev(NULL, 4 * C);
  float *bc = ns_dev(NULL, 4 * C), *side = ns_dev(NULL, 4);
  MP_CHECK(in && out && pm && bc && side);
  cudaStream_t s;
  NS_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  tdist_op_opts_t o = {.mask = TDIST_OP_FIELD_STREAM, .stream = s};
  tdist_op_opts_t op = {
      .mask = TDIST_OP_FIELD_STREAM | TDIST_OP_FIELD_SCALAR, .stream = s, .premul_scalar = 0.5};
  tdist_work_t *w[4] = {NULL};
  uint64_t seq0 = 0;

  NS_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  NS_EXPECT(tdist_all_reduce(g, in, out, C, TDIST_FLOAT32, TDIST_SUM, &o, &w[0]), 0);
  NS_EXPECT(tdist_all_reduce(g, pm, pm, C, TDIST_FLOAT32, TDIST_PREMUL_SUM, &op, &w[1]), 0);
  NS_EXPECT(tdist_barrier(g, &o, &w[2]), 0);
  NS_EXPECT(tdist_broadcast(g, bc, C, TDIST_FLOAT32, n - 1, &o, &w[3]), 0);
  cudaGraph_t graph = NULL;
  NS_CUDA(cudaStreamEndCapture(s, &graph));
  MP_CHECK(graph != NULL);
  for (int i = 0; i < 4; i++)
    if (check_captured(w[i])) return 1;
  seq0 = tdist_work_seq(w[0]);
  MP_CHECK(tdist_work_seq(w[3]) == seq0 + 3); /* numbered once each, in order */
  /* The capture ran nothing: out is still zero. */
  float got[C], want[C], zero[C] = {0};
  MP_CHECK_RC(ns_get(got, out, sizeof(got)));
  if (check_floats("out before any launch", got, zero, C, -1)) return 1;

  cudaGraphExec_t ex = NULL;
  NS_CUDA(cudaGraphInstantiate(&ex, graph, 0));
  for (int k = 0; k < REPLAYS; k++) {
    float hin[C], hpm[C], hbc[C], hside = (float)(k + 1);
    for (int i = 0; i < C; i++) {
      hin[i] = (float)((rank + 1) * (i + 1) + 100 * k);
      hpm[i] = (float)(2 * (rank + 1) * (k + 1));
      hbc[i] = (float)(1000 * rank + 10 * k + i);
    }
    /* The inputs change on the stream, between launches. */
    NS_CUDA(cudaMemcpyAsync(in, hin, sizeof(hin), cudaMemcpyHostToDevice, s));
    NS_CUDA(cudaMemcpyAsync(pm, hpm, sizeof(hpm), cudaMemcpyHostToDevice, s));
    NS_CUDA(cudaMemcpyAsync(bc, hbc, sizeof(hbc), cudaMemcpyHostToDevice, s));
    NS_CUDA(cudaGraphLaunch(ex, s));
    NS_CUDA(cudaStreamSynchronize(s));
    for (int i = 0; i < C; i++) {
      want[i] = 0;
      for (int r = 0; r < n; r++)
        want[i] += (float)((r + 1) * (i + 1) + 100 * k);
    }
    MP_CHECK_RC(ns_get(got, out, sizeof(got)));
    if (check_floats("all_reduce", got, want, C, k)) return 1;
    for (int i = 0; i < C; i++) {
      want[i] = 0;
      for (int r = 0; r < n; r++)
        want[i] += 0.5f * (float)(2 * (r + 1) * (k + 1));
    }
    MP_CHECK_RC(ns_get(got, pm, sizeof(got)));
    if (check_floats("premul_sum", got, want, C, k)) return 1;
    for (int i = 0; i < C; i++)
      want[i] = (float)(1000 * (n - 1) + 10 * k + i);
    MP_CHECK_RC(ns_get(got, bc, sizeof(got)));
    if (check_floats("broadcast", got, want, C, k)) return 1;
    /* An uncaptured op between launches, on the same stream. */
    MP_CHECK_RC(ns_put(side, &hside, 4));
    tdist_work_t *sw = NULL;
    NS_EXPECT(tdist_all_reduce(g, side, side, 1, TDIST_FLOAT32, TDIST_SUM, &o, &sw), 0);
    MP_CHECK(tdist_work_is_captured(sw) == 0);
    NS_EXPECT(tdist_work_wait(sw, 0), 0);
    MP_CHECK(tdist_work_seq(sw) == seq0 + 4 + (uint64_t)k);
    tdist_work_release(sw);
    MP_CHECK_RC(ns_get(&hside, side, 4));
    want[0] = (float)(n * (k + 1));
    if (check_floats("uncaptured all_reduce", &hside, want, 1, k)) return 1;
  }
  MP_CHECK(!tdist_group_is_aborted(g));
  for (int i = 0; i < 4; i++)
    tdist_work_release(w[i]);
  NS_CUDA(cudaGraphExecDestroy(ex));
  NS_CUDA(cudaGraphDestroy(graph));
  MP_CHECK_RC(tdist_group_destroy(g));
  cudaStreamDestroy(s);
  return 0;
}

/* ---- no watchdog for a captured op ------------------------------------------------------ */
static int no_watchdog_child(int rank, int n, void *arg) {
  (void)arg;
  tdist_group_t *g = NULL;
  const int timeout_ms = 1000;
  /* The rendezvous with room (a loaded machine under TSan took over a
   * second to start the ranks and the store); the ops' timeout short. */
  MP_CHECK_RC(ns_world(rank, n, port, 60000, &g));
  MP_CHECK_RC(tdist_group_set_timeout(g, timeout_ms));
  float h[C];
  for (int i = 0; i < C; i++)
    h[i] = (float)(rank + i);
  float *d = ns_dev(h, sizeof(h));
  MP_CHECK(d);
  cudaStream_t s;
  NS_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  tdist_op_opts_t o = {.mask = TDIST_OP_FIELD_STREAM, .stream = s};
  tdist_work_t *w = NULL;
  NS_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  NS_EXPECT(tdist_all_reduce(g, d, d, C, TDIST_FLOAT32, TDIST_SUM, &o, &w), 0);
  cudaGraph_t graph = NULL;
  NS_CUDA(cudaStreamEndCapture(s, &graph));
  /* Never launched for 2.5 timeouts: a watched op would have timed out and
   * aborted the group after one. */
  NS_WAIT_FOR(tdist_group_is_aborted(g), 5 * timeout_ms / 2);
  MP_CHECK(!tdist_group_is_aborted(g));
  MP_CHECK(tdist_work_state(w) == TDIST_WORK_COMPLETED);
  cudaGraphExec_t ex = NULL;
  NS_CUDA(cudaGraphInstantiate(&ex, graph, 0));
  NS_CUDA(cudaGraphLaunch(ex, s));
  NS_CUDA(cudaStreamSynchronize(s));
  float got[C], want[C];
  MP_CHECK_RC(ns_get(got, d, sizeof(got)));
  for (int i = 0; i < C; i++) {
    want[i] = 0;
    for (int r = 0; r < n; r++)
      want[i] += (float)(r + i);
  }
  if (check_floats("all_reduce", got, want, C, 0)) return 1;
  /* The group is still good for uncaptured ops. */
  NS_EXPECT(tdist_all_reduce(g, d, d, C, TDIST_FLOAT32, TDIST_SUM, &o, NULL), 0);
  tdist_work_release(w);
  NS_CUDA(cudaGraphExecDestroy(ex));
  NS_CUDA(cudaGraphDestroy(graph));
  MP_CHECK_RC(tdist_group_destroy(g));
  return 0;
}

/* ---- destroy the group while a graph holds it -------------------------------------------- */
static int destroy_child(int rank, int n, void *arg) {
  (void)arg;
  tdist_group_t *g = NULL;
  MP_CHECK_RC(ns_world(rank, n, port, 20000, &g));
  float *d = ns_dev(NULL, 4 * C);
  MP_CHECK(d);
  cudaStream_t s;
  NS_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  tdist_op_opts_t o = {.mask = TDIST_OP_FIELD_STREAM, .stream = s};
  NS_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  NS_EXPECT(tdist_barrier(g, &o, NULL), 0); /* uses the group's scratch */
  NS_EXPECT(tdist_all_reduce(g, d, d, C, TDIST_FLOAT32, TDIST_MAX, &o, NULL), 0);
  cudaGraph_t graph = NULL;
  NS_CUDA(cudaStreamEndCapture(s, &graph));
  cudaGraphExec_t ex = NULL;
  NS_CUDA(cudaGraphInstantiate(&ex, graph, 0));
  int live = tdist_gpusim_live_comms();
  MP_CHECK(live >= 1);
  NS_EXPECT(tdist_group_destroy(g), 0);
  /* Destroyed for tdist; the communicator stays for the graph. */
  MP_CHECK(tdist_gpusim_live_comms() == live);
  for (int k = 0; k < 3; k++) {
    float h[C], got[C], want[C];
    for (int i = 0; i < C; i++) {
      h[i] = (float)(10 * rank + i + k);
      want[i] = (float)(10 * (n - 1) + i + k);
    }
    NS_CUDA(cudaMemcpyAsync(d, h, sizeof(h), cudaMemcpyHostToDevice, s));
    NS_CUDA(cudaGraphLaunch(ex, s));
    NS_CUDA(cudaStreamSynchronize(s));
    MP_CHECK_RC(ns_get(got, d, sizeof(got)));
    if (check_floats("all_reduce MAX after destroy", got, want, C, k)) return 1;
  }
  NS_CUDA(cudaGraphExecDestroy(ex));
  MP_CHECK(tdist_gpusim_live_comms() == live); /* the graph still holds it */
  NS_CUDA(cudaGraphDestroy(graph));
  /* The last graph gone: the communicator is destroyed (worker thread). */
  NS_WAIT_FOR(tdist_gpusim_live_comms() == live - 1, 20000);
  MP_CHECK(tdist_gpusim_live_comms() == live - 1);
  return 0;
}

/* ---- refused ops; a captured batch instead ------------------------------------------------ */
static int refused_child(int rank, int n, void *arg) {
  (void)arg;
  tdist_group_t *g = NULL;
  MP_CHECK_RC(ns_world(rank, n, port, 20000, &g));
  int peer = (rank + 1) % n, from = (rank + n - 1) % n;
  float *sb = ns_dev(NULL, 4 * C), *rb = ns_dev(NULL, 4 * C);
  MP_CHECK(sb && rb);
  cudaStream_t s;
  NS_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  tdist_op_opts_t o = {.mask = TDIST_OP_FIELD_STREAM, .stream = s};
  tdist_work_t *w = NULL;
  NS_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  NS_EXPECT(tdist_isend(g, sb, C, TDIST_FLOAT32, peer, &o, &w), TDIST_ERR_NOT_SUPPORTED);
  NS_HAS(tdist_last_error(), "tdist_batch_isend_irecv");
  MP_CHECK(w == NULL);
  NS_EXPECT(tdist_irecv(g, rb, C, TDIST_FLOAT32, from, &o, &w), TDIST_ERR_NOT_SUPPORTED);
  tdist_p2p_op_t ops[2] = {
      {.kind = TDIST_P2P_SEND, .buf = sb, .count = C, .dtype = TDIST_FLOAT32, .peer = peer},
      {.kind = TDIST_P2P_RECV, .buf = rb, .count = C, .dtype = TDIST_FLOAT32, .peer = from},
  };
  NS_EXPECT(tdist_batch_isend_irecv(g, ops, 2, &o, &w), 0);
  cudaGraph_t graph = NULL;
  NS_CUDA(cudaStreamEndCapture(s, &graph)); /* the refusals left the capture good */
  if (check_captured(w)) return 1;
  tdist_work_release(w);
  cudaGraphExec_t ex = NULL;
  NS_CUDA(cudaGraphInstantiate(&ex, graph, 0));
  for (int k = 0; k < 3; k++) {
    float h[C], got[C], want[C];
    for (int i = 0; i < C; i++) {
      h[i] = (float)(100 * rank + 10 * k + i);
      want[i] = (float)(100 * from + 10 * k + i);
    }
    NS_CUDA(cudaMemcpyAsync(sb, h, sizeof(h), cudaMemcpyHostToDevice, s));
    NS_CUDA(cudaGraphLaunch(ex, s));
    NS_CUDA(cudaStreamSynchronize(s));
    MP_CHECK_RC(ns_get(got, rb, sizeof(got)));
    if (check_floats("batch ring exchange", got, want, C, k)) return 1;
  }
  MP_CHECK(!tdist_group_is_aborted(g));
  NS_CUDA(cudaGraphExecDestroy(ex));
  NS_CUDA(cudaGraphDestroy(graph));
  MP_CHECK_RC(tdist_group_destroy(g));
  return 0;
}

/* ---- abort, then a launch ------------------------------------------------------------------ */
static int abort_child(int rank, int n, void *arg) {
  (void)arg;
  (void)n;
  tdist_group_t *g = NULL;
  MP_CHECK_RC(ns_world(rank, n, port, 20000, &g));
  float *d = ns_dev(NULL, 4 * C);
  MP_CHECK(d);
  cudaStream_t s;
  NS_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  tdist_op_opts_t o = {.mask = TDIST_OP_FIELD_STREAM, .stream = s};
  NS_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  NS_EXPECT(tdist_all_reduce(g, d, d, C, TDIST_FLOAT32, TDIST_SUM, &o, NULL), 0);
  cudaGraph_t graph = NULL;
  NS_CUDA(cudaStreamEndCapture(s, &graph));
  cudaGraphExec_t ex = NULL;
  NS_CUDA(cudaGraphInstantiate(&ex, graph, 0));
  int live = tdist_gpusim_live_comms();
  /* The abort thread reports to the core 300 ms after its ncclCommAbort:
   * the destroy below comes first, and must wait for that report (CI's
   * ASan pass once saw the report read the freed group). */
  tdist__inject_arm("nccl.abort.released", 300);
  NS_EXPECT(tdist_group_abort(g, "test: abort with a graph"), 0);
  /* The abort thread aborts the communicator (ncclCommAbort). */
  NS_WAIT_FOR(tdist_gpusim_live_comms() == live - 1, 20000);
  MP_CHECK(tdist_gpusim_live_comms() == live - 1);
  /* A launch of a graph whose communicator was aborted fails (NCCL leaves
   * it undefined; the simulation refuses it). */
  MP_CHECK(cudaGraphLaunch(ex, s) == cudaErrorLaunchFailure);
  cudaGetLastError();
  tdist_group_destroy(g);
  /* A report that destroy did not wait for would come now, into the freed
   * group (ASan names it): the process stays until it would have. */
  usleep(500 * 1000);
  NS_CUDA(cudaGraphExecDestroy(ex));
  NS_CUDA(cudaGraphDestroy(graph));
  return 0;
}

/* ---- two captures in progress at once; the communicator goes with the last graph ------- */
static int two_graphs_child(int rank, int n, void *arg) {
  (void)arg;
  tdist_group_t *g = NULL;
  MP_CHECK_RC(ns_world(rank, n, port, 20000, &g));
  float *a = ns_dev(NULL, 4 * C), *b = ns_dev(NULL, 4 * C);
  MP_CHECK(a && b);
  cudaStream_t s1, s2;
  NS_CUDA(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  NS_CUDA(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  tdist_op_opts_t o1 = {.mask = TDIST_OP_FIELD_STREAM, .stream = s1};
  tdist_op_opts_t o2 = {.mask = TDIST_OP_FIELD_STREAM, .stream = s2};
  /* Interleaved: each op forks onto the fork stream of its own capture. */
  NS_CUDA(cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal));
  NS_CUDA(cudaStreamBeginCapture(s2, cudaStreamCaptureModeGlobal));
  NS_EXPECT(tdist_all_reduce(g, a, a, C, TDIST_FLOAT32, TDIST_SUM, &o1, NULL), 0);
  NS_EXPECT(tdist_all_reduce(g, b, b, C, TDIST_FLOAT32, TDIST_MAX, &o2, NULL), 0);
  NS_EXPECT(tdist_barrier(g, &o1, NULL), 0);
  cudaGraph_t g1 = NULL, g2 = NULL;
  NS_CUDA(cudaStreamEndCapture(s2, &g2));
  NS_CUDA(cudaStreamEndCapture(s1, &g1));
  cudaGraphExec_t x1 = NULL, x2 = NULL;
  NS_CUDA(cudaGraphInstantiate(&x1, g1, 0));
  NS_CUDA(cudaGraphInstantiate(&x2, g2, 0));
  for (int k = 0; k < 2; k++) {
    float h[C], got[C], want[C];
    for (int i = 0; i < C; i++)
      h[i] = (float)(rank + i + k);
    MP_CHECK_RC(ns_put(a, h, sizeof(h)));
    MP_CHECK_RC(ns_put(b, h, sizeof(h)));
    /* Every rank launches them in the same order: g2, then g1. */
    NS_CUDA(cudaGraphLaunch(x2, s2));
    NS_CUDA(cudaStreamSynchronize(s2));
    NS_CUDA(cudaGraphLaunch(x1, s1));
    NS_CUDA(cudaStreamSynchronize(s1));
    for (int i = 0; i < C; i++)
      want[i] = (float)(n * (i + k) + n * (n - 1) / 2);
    MP_CHECK_RC(ns_get(got, a, sizeof(got)));
    if (check_floats("all_reduce SUM, graph 1", got, want, C, k)) return 1;
    for (int i = 0; i < C; i++)
      want[i] = (float)(n - 1 + i + k);
    MP_CHECK_RC(ns_get(got, b, sizeof(got)));
    if (check_floats("all_reduce MAX, graph 2", got, want, C, k)) return 1;
  }
  int live = tdist_gpusim_live_comms();
  NS_EXPECT(tdist_group_destroy(g), 0);
  NS_CUDA(cudaGraphExecDestroy(x1));
  NS_CUDA(cudaGraphDestroy(g1));
  /* g2 still holds the communicator. */
  NS_CUDA(cudaGraphLaunch(x2, s2));
  NS_CUDA(cudaStreamSynchronize(s2));
  MP_CHECK(tdist_gpusim_live_comms() == live);
  NS_CUDA(cudaGraphExecDestroy(x2));
  NS_CUDA(cudaGraphDestroy(g2));
  NS_WAIT_FOR(tdist_gpusim_live_comms() == live - 1, 20000);
  MP_CHECK(tdist_gpusim_live_comms() == live - 1);
  return 0;
}

static void run_n(int n, tdist_mp_fn fn, int timeout_s) {
  port = tdist_mp_free_port();
  assert_int_equal(tdist_mp_run(n, fn, NULL, timeout_s), 0);
}
static void replay_n3(void **st) {
  (void)st;
  run_n(3, replay_child, 90);
}
static void no_watchdog(void **st) {
  (void)st;
  run_n(2, no_watchdog_child, 60);
}
static void destroy_with_graph(void **st) {
  (void)st;
  run_n(2, destroy_child, 60);
}
static void refused_and_batch(void **st) {
  (void)st;
  run_n(2, refused_child, 60);
}
static void two_graphs(void **st) {
  (void)st;
  run_n(2, two_graphs_child, 60);
}
static void abort_then_replay(void **st) {
  (void)st;
  run_n(1, abort_child, 60);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(replay_n3),          cmocka_unit_test(no_watchdog),
      cmocka_unit_test(destroy_with_graph), cmocka_unit_test(refused_and_batch),
      cmocka_unit_test(two_graphs),         cmocka_unit_test(abort_then_replay),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
