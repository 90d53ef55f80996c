/*
 * test_cluster_env - jobs started by srun or mpirun instead of tdistrun:
 * tdist's rendezvous takes the rank and world size from SLURM_PROCID /
 * SLURM_NTASKS or OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE when RANK and
 * WORLD_SIZE are absent, and RANK/WORLD_SIZE win when both are set.
 *
 * Each case forks 3 processes that set the variables a cluster launcher
 * would, then rendezvous for real over a TCP store (rank 0 hosts it, as
 * without tdistrun) through env:// (MASTER_ADDR/MASTER_PORT).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "mp.h"
#include "store/rendezvous.h"
#include "tdist/tdist.h"

#define N 3

typedef struct env_case {
  const char *rank_var, *size_var, *local_var; /* cluster variables to set */
  int torch_too; /* also set RANK/WORLD_SIZE to a permutation: they must win */
  int port;
} env_case_t;

static void clear_env(void) {
  static const char *const vars[] = {"RANK",
                                     "WORLD_SIZE",
                                     "LOCAL_RANK",
                                     "LOCAL_WORLD_SIZE",
                                     "SLURM_PROCID",
                                     "SLURM_NTASKS",
                                     "SLURM_LOCALID",
                                     "OMPI_COMM_WORLD_RANK",
                                     "OMPI_COMM_WORLD_SIZE",
                                     "OMPI_COMM_WORLD_LOCAL_RANK",
                                     "TDIST_STORE_HOSTED",
                                     "MASTER_ADDR",
                                     "MASTER_PORT",
                                     NULL};
  for (const char *const *v = vars; *v; v++)
    unsetenv(*v);
}

static int child(int rank, int n, void *arg) {
  const env_case_t *c = arg;
  char v[32];
  clear_env();
  snprintf(v, sizeof(v), "%d", rank);
  setenv(c->rank_var, v, 1);
  setenv(c->local_var, v, 1);
  snprintf(v, sizeof(v), "%d", n);
  setenv(c->size_var, v, 1);
  int want = rank;
  if (c->torch_too) { /* RANK reverses the order: the rendezvous must use it */
    want = n - 1 - rank;
    snprintf(v, sizeof(v), "%d", want);
    setenv("RANK", v, 1);
    snprintf(v, sizeof(v), "%d", n);
    setenv("WORLD_SIZE", v, 1);
  }
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  snprintf(v, sizeof(v), "%d", c->port);
  setenv("MASTER_PORT", v, 1);
  tdist_init_opts_t o = {.mask = TDIST_INIT_FIELD_TIMEOUT, .timeout_ms = 20000};
  tdist__rdzv_t r;
  MP_CHECK_RC(tdist__rendezvous_join(&o, &r));
  MP_CHECK(r.rank == want);
  MP_CHECK(r.size == n);
  /* Everyone really met on one store: count in and wait for all. */
  int64_t seen = 0;
  MP_CHECK_RC(tdist_store_add(r.store, "test/count", 1, &seen));
  const char *k = "test/all";
  if (seen == n) MP_CHECK_RC(tdist_store_set(r.store, k, "", 0));
  MP_CHECK_RC(tdist_store_wait(r.store, &k, 1, 20000));
  tdist_store_release(r.store);
  MP_CHECK_RC(tdist__rendezvous_cleanup());
  return 0;
}

static void run_case(env_case_t c) {
  c.port = tdist_mp_free_port();
  assert_int_equal(tdist_mp_run(N, child, &c, 45), 0);
}

static void test_slurm(void **state) {
  run_case((env_case_t){"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", 0, 0});
}

static void test_openmpi(void **state) {
  run_case((env_case_t){"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                        "OMPI_COMM_WORLD_LOCAL_RANK", 0, 0});
}

static void test_torch_vars_win(void **state) {
  run_case((env_case_t){"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", 1, 0});
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_slurm),
      cmocka_unit_test(test_openmpi),
      cmocka_unit_test(test_torch_vars_win),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
