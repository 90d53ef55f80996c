/*
 * test_nccl_sim_real.c - the NCCL backend by what a real GPU showed (one
 * H200, NCCL 2.28.9, several ranks on one GPU with their own NCCL_HOSTID),
 * on the simulated GPU made faithful to it (docs/gpusim.md). Each scenario
 * failed on the backend before its fix, as the real run did:
 *
 *   (a death then shrink on separate NCCL hosts: test_nccl_sim_faults.c,
 *   inflight_death_shrink_hosts)
 *   skip_named             a rank skips a large all_reduce that NCCL must
 *                          connect first (its enqueue waits for every peer):
 *                          the survivors' op times out naming that rank and
 *                          no other (was: "could not be enqueued: ... timed
 *                          out after 1500 ms", nobody named)
 *   caller_group_closed    an op submitted while the calling thread has its
 *                          own NCCL group open: NCCL only queues it there;
 *                          tdist closes the group and the op runs, checked
 *                          (was: launched nothing and "completed" at once)
 *   child_cc               a subgroup's float8 reductions are decided by its
 *                          own members' devices, not the parent's oldest
 *                          (was: refused on a subgroup of sm_90 ranks)
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "nccl_sim_util.h"

static int port;

/* ---- a rank skips a collective NCCL connects at its first use ------------------------ */
#define SKIP_COUNT (256 * 1024) /* floats: 1 MiB, a new algorithm for NCCL */
static int skip_child(int rank, int n, void *arg) {
  (void)arg;
  char id[32];
  snprintf(id, sizeof(id), "sim-host-%d", rank);
  setenv("NCCL_HOSTID", id, 1);
  /* The diagnosis reads the peers' heartbeats, at most one interval old:
   * well inside the op's timeout, even on a loaded machine. */
  setenv("TDIST_HEARTBEAT_INTERVAL_MS", "200", 1);
  tdist_group_t *g = NULL;
  MP_CHECK_RC(ns_world(rank, n, port, 20000, &g));
  float *d = ns_dev(NULL, SKIP_COUNT * sizeof(float));
  MP_CHECK_RC(tdist_all_reduce(g, d, d, 8, TDIST_FLOAT32, TDIST_SUM, NULL, NULL));
  MP_CHECK_RC(ns_sync(g, "ready", 10000));
  if (rank == 2) {
    /* Never submits it; waits until the others give up. */
    NS_WAIT_FOR(tdist_group_is_aborted(g), 20000);
    MP_CHECK_RC(ns_sync(g, "reported", 20000));
    tdist_group_destroy(g);
    return 0;
  }
  tdist_op_opts_t o = {.mask = TDIST_OP_FIELD_TIMEOUT, .timeout_ms = 1500};
  tdist_work_t *w = NULL;
  long long t0 = ns_now_ms();
  int rc = tdist_all_reduce(g, d, d, SKIP_COUNT, TDIST_FLOAT32, TDIST_SUM, &o, &w);
  long long submit_ms = ns_now_ms() - t0;
  const char *msg = tdist_last_error();
  if (rc == 0) {
    rc = tdist_work_wait(w, 0);
    msg = tdist_work_error_message(w);
  }
  fprintf(stderr, "skip: rank %d: submit %lld ms, %s: %s\n", rank, submit_ms, tdist_err_name(rc),
          msg);
  /* Timed out here, or aborted by the other survivor's timeout first: either
   * way the diagnosis names the skipper, and only it. */
  MP_CHECK(rc == TDIST_ERR_TIMEOUT || rc == TDIST_ERR_ABORTED);
  NS_HAS(msg, "rank 2 of group 'world' had not reached seq 1");
  /* The submit itself does not wait for the peers (the op's timeout
   * covers that, with its diagnosis). */
  MP_CHECK(submit_ms < 1000);
  if (w) tdist_work_release(w);
  MP_CHECK(tdist_group_is_aborted(g));
  /* Both survivors have their result before either destroys the group: a
   * destroyed group leaves the rank's heartbeat, and a diagnosis that comes
   * later on a loaded host would count that rank as not having reached the
   * op. */
  MP_CHECK_RC(ns_sync(g, "reported", 20000));
  tdist_group_destroy(g);
  MP_CHECK(tdist_gpusim_comm_violations() == 0);
  MP_CHECK(tdist_gpusim_use_after_free() == 0);
  return 0;
}
static void skip_named(void **s) {
  (void)s;
  port = tdist_mp_free_port();
  assert_int_equal(tdist_mp_run(3, skip_child, NULL, 60), 0);
}

/* ---- an NCCL group of the caller's own is open at submit --------------------------- */
static int group_child(int rank, int n, void *arg) {
  (void)arg;
  tdist_group_t *g = NULL;
  MP_CHECK_RC(ns_world(rank, n, port, 20000, &g));
  float h[256];
  for (int i = 0; i < 256; i++)
    h[i] = (float)(rank + 1);
  float *d = ns_dev(h, sizeof(h));
  if (rank == 0) {
    MP_CHECK(ncclGroupStart() == ncclSuccess); /* two levels, never ended */
    MP_CHECK(ncclGroupStart() == ncclSuccess);
  }
  MP_CHECK_RC(tdist_all_reduce(g, d, d, 256, TDIST_FLOAT32, TDIST_SUM, NULL, NULL));
  MP_CHECK(ns_get(h, d, sizeof(h)) == 0);
  MP_CHECK(h[0] == 3.0f && h[255] == 3.0f);
  if (rank == 0) MP_CHECK(ncclGroupEnd() == ncclInvalidUsage); /* closed by tdist */
  MP_CHECK_RC(tdist_all_reduce(g, d, d, 256, TDIST_FLOAT32, TDIST_SUM, NULL, NULL));
  MP_CHECK(ns_get(h, d, sizeof(h)) == 0);
  MP_CHECK(h[7] == 6.0f);
  MP_CHECK(!tdist_group_is_aborted(g));
  MP_CHECK_RC(tdist_group_destroy(g));
  return 0;
}
static void caller_group_closed(void **s) {
  (void)s;
  port = tdist_mp_free_port();
  assert_int_equal(tdist_mp_run(2, group_child, NULL, 60), 0);
}

/* ---- a subgroup's own devices decide float8 reductions ------------------------------ */
static int cc_child(int rank, int n, void *arg) {
  (void)arg;
  /* Device 0 is sm_80, the others sm_90 (TDIST_GPUSIM_CC's last entry
   * applies to the devices after it). */
  setenv("TDIST_GPUSIM_CC", "8.0,9.0", 1);
  tdist_group_t *g = NULL, *sub = NULL;
  MP_CHECK_RC(ns_world(rank, n, port, 20000, &g));
  unsigned char h[4] = {0x38, 0x38, 0x40, 0x40}; /* e4m3: 1, 1, 2, 2 */
  void *d = ns_dev(h, 4);
  int rc = tdist_all_reduce(g, d, d, 4, TDIST_FLOAT8_E4M3, TDIST_SUM, NULL, NULL);
  NS_EXPECT(rc, TDIST_ERR_NOT_SUPPORTED); /* rank 0's device is sm_80 */
  int ranks[2] = {1, 2};
  MP_CHECK_RC(tdist_new_group(g, ranks, 2, NULL, &sub));
  if (rank != 0) {
    MP_CHECK_RC(tdist_all_reduce(sub, d, d, 4, TDIST_FLOAT8_E4M3, TDIST_SUM, NULL, NULL));
    MP_CHECK(ns_get(h, d, 4) == 0);
    MP_CHECK(h[0] == 0x40 && h[2] == 0x48); /* 2, 2, 4, 4 */
    MP_CHECK_RC(tdist_group_destroy(sub));
  }
  MP_CHECK_RC(tdist_group_destroy(g));
  return 0;
}
static void child_cc(void **s) {
  (void)s;
  port = tdist_mp_free_port();
  assert_int_equal(tdist_mp_run(3, cc_child, NULL, 60), 0);
}

int main(int argc, char **argv) {
  setenv("TDIST_TRACE_ON_FAILURE", "0", 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(skip_named),
      cmocka_unit_test(caller_group_closed),
      cmocka_unit_test(child_cc),
  };
  if (argc > 1) cmocka_set_test_filter(argv[1]);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
