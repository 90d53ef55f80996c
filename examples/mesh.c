/*
 * mesh - a tensor x data x context parallel mesh (TP x DP x CP) carved out of
 * the world, with one collective in each dimension, all three in flight at
 * once on their own subgroups, results checked element by element.
 *
 *   tdistrun -n 4 ./mesh [TP DP CP]      (or TP_SIZE / DP_SIZE / CP_SIZE)
 *
 * Rank layout is row-major with CP varying fastest, like torch's
 * init_device_mesh((TP, DP, CP)). Defaults: TP = 2 when the world size is
 * even, CP = 1, DP = the rest.
 *  - TP group: all_reduce (sum) of partial activations;
 *  - DP group: all_gather of a shard of parameters;
 *  - CP group: all_to_all of sequence chunks (as Ulysses-style attention).
 */
#include <string.h>

#include "example_util.h"

#define E 1024 /* elements per block */

static int dim_arg(int argc, char **argv, int i, const char *env, int dflt) {
  if (argc > 3) return atoi(argv[i]);
  const char *v = getenv(env);
  return v ? atoi(v) : dflt;
}

int main(int argc, char **argv) {
  tdist_group_t *world = ex_init();
  int me = tdist_group_rank(world), size = tdist_group_size(world);
  int tp = dim_arg(argc, argv, 1, "TP_SIZE", size % 2 == 0 ? 2 : 1);
  int cp = dim_arg(argc, argv, 3, "CP_SIZE", 1);
  int dp = dim_arg(argc, argv, 2, "DP_SIZE", tp * cp > 0 ? size / (tp * cp) : 0);
  int dims[3] = {tp, dp, cp}, coords[3];
  tdist_group_t *g[3]; /* [0] TP, [1] DP, [2] CP: the groups this rank is in */
  /* Collective over the world; a wrong product fails on every rank with a
   * message naming the dims and the world size. */
  EX_CHECK(tdist_mesh_create(world, dims, 3, NULL, g, coords));

  /* TP: all_reduce; element i of global rank r is r * 10000 + i. */
  int ntp = tdist_group_size(g[0]), ndp = tdist_group_size(g[1]), ncp = tdist_group_size(g[2]);
  int32_t *tp_buf = malloc(E * sizeof(int32_t));
  /* DP: all_gather; rank r contributes r * 7 + i. */
  int32_t *dp_send = malloc(E * sizeof(int32_t)), *dp_recv = malloc((size_t)ndp * E * 4);
  /* CP: all_to_all; block j of rank r's send is r * 1000 + j * 10 + (i % 10). */
  int32_t *cp_send = malloc((size_t)ncp * E * 4), *cp_recv = malloc((size_t)ncp * E * 4);
  if (!tp_buf || !dp_send || !dp_recv || !cp_send || !cp_recv)
    ex_die("malloc", TDIST_ERR_NO_MEMORY, "buffers");
  for (int i = 0; i < E; i++) {
    tp_buf[i] = me * 10000 + i;
    dp_send[i] = me * 7 + i;
  }
  for (int j = 0; j < ncp; j++)
    for (int i = 0; i < E; i++)
      cp_send[j * E + i] = me * 1000 + j * 10 + i % 10;

  /* Three groups, three ops in flight at once: they progress independently. */
  tdist_work_t *w[3];
  EX_CHECK(tdist_all_reduce(g[0], tp_buf, tp_buf, E, TDIST_INT32, TDIST_SUM, NULL, &w[0]));
  EX_CHECK(tdist_all_gather(g[1], dp_send, dp_recv, E, TDIST_INT32, NULL, &w[1]));
  EX_CHECK(tdist_all_to_all(g[2], cp_send, cp_recv, E, TDIST_INT32, NULL, &w[2]));
  ex_wait(w[0], "TP all_reduce");
  ex_wait(w[1], "DP all_gather");
  ex_wait(w[2], "CP all_to_all");

  /* Check against references computed from the members' global ranks. */
  long bad = 0;
  int64_t tp_ranks = 0;
  for (int j = 0; j < ntp; j++)
    tp_ranks += tdist_group_global_rank(g[0], j);
  for (int i = 0; i < E; i++)
    bad += tp_buf[i] != (int32_t)(tp_ranks * 10000 + (int64_t)ntp * i);
  for (int j = 0; j < ndp; j++) {
    int r = tdist_group_global_rank(g[1], j);
    for (int i = 0; i < E; i++)
      bad += dp_recv[j * E + i] != r * 7 + i;
  }
  int cme = tdist_group_rank(g[2]);
  for (int j = 0; j < ncp; j++) {
    int r = tdist_group_global_rank(g[2], j);
    for (int i = 0; i < E; i++)
      bad += cp_recv[j * E + i] != r * 1000 + cme * 10 + i % 10;
  }
  printf("rank %d: coords (tp %d, dp %d, cp %d): %s: TP all_reduce over %d, DP all_gather over "
         "%d, CP all_to_all over %d ranks checked\n",
         me, coords[0], coords[1], coords[2], bad ? "FAILED" : "OK", ntp, ndp, ncp);
  int64_t badsum = bad;
  EX_CHECK(tdist_all_reduce(world, &badsum, &badsum, 1, TDIST_INT64, TDIST_SUM, NULL, NULL));
  if (me == 0)
    printf("mesh: TP=%d x DP=%d x CP=%d over %d ranks: results %s\n", tp, dp, cp, size,
           badsum ? "WRONG" : "checked: OK");

  free(tp_buf), free(dp_send), free(dp_recv), free(cp_send), free(cp_recv);
  for (int d = 0; d < 3; d++)
    EX_CHECK(tdist_group_destroy(g[d]));
  EX_CHECK(tdist_group_destroy(world));
  return badsum ? 1 : 0;
}
