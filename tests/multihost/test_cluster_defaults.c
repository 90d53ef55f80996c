/*
 * test_cluster_defaults - where env:// puts the store when a cluster
 * launcher started the process and MASTER_ADDR / MASTER_PORT are missing
 * (src/store/rendezvous.c: cluster_env, cluster_addr, cluster_port;
 * docs/launcher.md "Without tdistrun"). The shell tests run real srun and
 * mpirun on one node; this one covers what one node cannot: Slurm node
 * lists of several nodes, the documented port formulas, the errors that ask
 * for MASTER_ADDR, and Open MPI's variables winning over Slurm's inherited
 * ones (mpirun inside a Slurm step).
 *
 * Each case is a world of size 1 (the rendezvous completes at once, rank 0
 * hosts the store on the derived address and port), so the store's address
 * is exactly what the library derived. Node lists use 127.0.0.x names, which
 * resolve without DNS and reach this machine.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "store/rendezvous.h"
#include "tdist/tdist.h"

static void clear_env(void) {
  static const char *const vars[] = {
      "RANK",           "WORLD_SIZE",           "LOCAL_RANK",           "LOCAL_WORLD_SIZE",
      "MASTER_ADDR",    "MASTER_PORT",          "TDIST_STORE_HOSTED",   "SLURM_PROCID",
      "SLURM_NTASKS",   "SLURM_LOCALID",        "SLURM_JOB_ID",         "SLURM_JOBID",
      "SLURM_STEP_ID",  "SLURM_STEPID",         "SLURM_STEP_NUM_NODES", "SLURM_NNODES",
      "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST",    "OMPI_COMM_WORLD_RANK",
      "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
      "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", NULL};
  for (const char *const *v = vars; *v; v++)
    unsetenv(*v);
}

static void set_env(const char *const *kv) {
  clear_env();
  for (; *kv; kv += 2)
    setenv(kv[0], kv[1], 1);
}

/* Join with the environment `kv`; expect the store at `want` ("host:port")
 * and the world size `size`, or, with want == NULL, a failure whose message
 * contains `err`. */
static void join(const char *const *kv, const char *want, int size, const char *err) {
  set_env(kv);
  tdist_init_opts_t o = {.mask = TDIST_INIT_FIELD_TIMEOUT, .timeout_ms = 5000};
  tdist__rdzv_t r;
  int rc = tdist__rendezvous_join(&o, &r);
  if (!want) {
    assert_int_not_equal(rc, 0);
    if (!strstr(tdist_last_error(), err)) fail_msg("error '%s' lacks '%s'", tdist_last_error(), err);
    return;
  }
  if (rc != 0) fail_msg("join failed: %s", tdist_last_error());
  const char *got = tdist_store_address(r.store);
  if (strcmp(got, want) != 0) fail_msg("store at %s, want %s", got, want);
  assert_int_equal(r.rank, 0);
  assert_int_equal(r.size, size);
  tdist_store_release(r.store);
  assert_int_equal(tdist__rendezvous_cleanup(), 0);
}

static int slurm_port(uint64_t job, uint64_t step) {
  return 15000 + (int)((job * 16 + step % 16) % 17000);
}

static int ompi_port(const char *ns) {
  uint64_t h = 1469598103934665603ULL;
  for (const char *c = ns; *c; c++)
    h = (h ^ (uint8_t)*c) * 1099511628211ULL;
  return 15000 + (int)(h % 17000);
}

/* Several nodes: the first host of the step's node list, ranges expanded. */
static void test_slurm_nodelist(void **state) {
  char want[64];
  snprintf(want, sizeof(want), "127.0.0.1:%d", slurm_port(12345, 3));
  const char *kv[] = {"SLURM_PROCID", "0", "SLURM_NTASKS", "1", "SLURM_JOB_ID", "12345",
                      "SLURM_STEP_ID", "3", "SLURM_STEP_NUM_NODES", "6", "SLURM_STEP_NODELIST",
                      "127.0.0.[1-4,7],other[01-02]", "SLURM_JOB_NODELIST", "127.0.0.9", NULL};
  join(kv, want, 1, NULL);
  /* No step list: the job's; a second bracket group takes its first too. */
  snprintf(want, sizeof(want), "127.0.0.1:%d", slurm_port(77, 0));
  const char *kv2[] = {"SLURM_PROCID", "0", "SLURM_NTASKS", "1", "SLURM_JOBID", "77",
                       "SLURM_NNODES", "2", "SLURM_JOB_NODELIST", "127.0.[0-3].[1-2]", NULL};
  join(kv2, want, 1, NULL);
}

/* One node: loopback, whatever the node is called. MASTER_PORT wins. */
static void test_slurm_one_node(void **state) {
  char want[64];
  snprintf(want, sizeof(want), "127.0.0.1:%d", slurm_port(4242, 1));
  const char *kv[] = {"SLURM_PROCID", "0", "SLURM_NTASKS", "1", "SLURM_JOB_ID", "4242",
                      "SLURM_STEP_ID", "1", "SLURM_STEP_NUM_NODES", "1", "SLURM_STEP_NODELIST",
                      "no-such-node-here", NULL};
  join(kv, want, 1, NULL);
  char port[16];
  snprintf(port, sizeof(port), "%d", slurm_port(4242, 2));
  snprintf(want, sizeof(want), "127.0.0.1:%s", port);
  const char *kv2[] = {"SLURM_PROCID", "0", "SLURM_NTASKS", "1", "SLURM_JOB_ID", "99999",
                       "SLURM_STEP_NUM_NODES", "1", "MASTER_PORT", port, NULL};
  join(kv2, want, 1, NULL);
}

static void test_slurm_errors(void **state) {
  const char *kv[] = {"SLURM_PROCID", "0", "SLURM_NTASKS", "1", "SLURM_JOB_ID", "5",
                      "SLURM_STEP_NUM_NODES", "2", NULL};
  join(kv, NULL, 0, "set MASTER_ADDR");
  const char *kv2[] = {"SLURM_PROCID", "0", "SLURM_NTASKS", "1", "SLURM_STEP_NUM_NODES", "1",
                       NULL};
  join(kv2, NULL, 0, "SLURM_JOB_ID");
  /* RANK from a torchrun-style launcher: no defaults from Slurm's variables. */
  const char *kv3[] = {"RANK", "0", "WORLD_SIZE", "1", "SLURM_PROCID", "0", "SLURM_NTASKS", "1",
                       "SLURM_JOB_ID", "5", "SLURM_STEP_NUM_NODES", "1", NULL};
  join(kv3, NULL, 0, "MASTER_ADDR is not set (env://)");
}

static void test_openmpi(void **state) {
  char want[64];
  snprintf(want, sizeof(want), "127.0.0.1:%d", ompi_port("prterun-node0-4711@1"));
  const char *kv[] = {"OMPI_COMM_WORLD_RANK", "0", "OMPI_COMM_WORLD_SIZE", "1",
                      "OMPI_COMM_WORLD_LOCAL_SIZE", "1", "PMIX_NAMESPACE", "prterun-node0-4711@1",
                      NULL};
  join(kv, want, 1, NULL);
  /* Ranks on several nodes: MASTER_ADDR is required, and said so. */
  const char *kv2[] = {"OMPI_COMM_WORLD_RANK", "0", "OMPI_COMM_WORLD_SIZE", "2",
                       "OMPI_COMM_WORLD_LOCAL_SIZE", "1", "PMIX_NAMESPACE", "1234", NULL};
  join(kv2, NULL, 0, "mpirun -x MASTER_ADDR");
}

/* mpirun inside a Slurm step: SLURM_PROCID/SLURM_NTASKS are the step's (the
 * same for every process); rank, size and the store come from Open MPI. */
static void test_openmpi_inside_slurm(void **state) {
  char want[64];
  snprintf(want, sizeof(want), "127.0.0.1:%d", ompi_port("31337"));
  const char *kv[] = {"OMPI_COMM_WORLD_RANK", "0", "OMPI_COMM_WORLD_SIZE", "1",
                      "OMPI_COMM_WORLD_LOCAL_SIZE", "1", "OMPI_MCA_ess_base_jobid", "31337",
                      "SLURM_PROCID", "3", "SLURM_NTASKS", "4", "SLURM_JOB_ID", "8",
                      "SLURM_STEP_NUM_NODES", "2", NULL};
  join(kv, want, 1, NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_slurm_nodelist),
      cmocka_unit_test(test_slurm_one_node),
      cmocka_unit_test(test_slurm_errors),
      cmocka_unit_test(test_openmpi),
      cmocka_unit_test(test_openmpi_inside_slurm),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
