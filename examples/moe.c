/*
 * moe - one expert-parallel step of a mixture-of-experts layer: every rank
 * holds some experts and some tokens; a router sends each token to one
 * expert, wherever it lives.
 *
 *   tdistrun -n 4 ./moe [--tokens T] [--hidden H] [--experts-per-rank E]
 *
 *   1. route     each token picks an expert; the choice is skewed (a few
 *                experts are popular, as trained routers make them), so
 *                ranks send and receive very different amounts;
 *   2. counts    tdist_all_to_all of the per-destination token counts: each
 *                rank learns how much it will receive from each other rank;
 *   3. dispatch  tdist_all_to_all_v of the token rows and, at the same time
 *                (two work handles), of their expert ids: split sizes vary
 *                per pair and are often 0;
 *   4. compute   each expert applies its own affine map y = a_e * x + b_e;
 *   5. combine   tdist_all_to_all_v back with the counts swapped, so every
 *                token returns to the rank and slot it came from;
 *   6. check     every rank compares its tokens' outputs with the map applied
 *                locally, and rank 0 recomputes every rank's tokens in one
 *                process and compares the sum with an all_reduce of the
 *                ranks' sums.
 */
#include <math.h>
#include <string.h>

#include "example_util.h"

static int g_epr = 2; /* experts per rank */

/* Token t of rank r: its hidden values, and the expert its router picks
 * (deterministic, so rank 0 can redo every rank's routing). */
static float x_of(int r, int t, int h) { return (float)((r * 131 + t * 7 + h * 3) % 97) / 8.0f; }
static int expert_of(int r, int t, int E) {
  unsigned u = (unsigned)(r * 2654435761u) ^ (unsigned)(t * 40503u + 12345u);
  u ^= u >> 13;
  u *= 0x5bd1e995u;
  u ^= u >> 15;
  /* skewed: expert e with probability ~ 1/(e+1) (a Zipf-like load) */
  double p = (double)(u % 100000) / 100000.0, acc = 0, norm = 0;
  for (int e = 0; e < E; e++)
    norm += 1.0 / (e + 1);
  for (int e = 0; e < E; e++) {
    acc += 1.0 / (e + 1) / norm;
    if (p < acc) return e;
  }
  return E - 1;
}
static float a_of(int e) { return 1.0f + 0.25f * (float)e; }
static float b_of(int e) { return (float)e - 2.0f; }
static int tokens_of(int r, int T) { return T + (r * 37) % 17; }

int main(int argc, char **argv) {
  int T = 256, H = 64;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--tokens"))
      T = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--hidden"))
      H = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--experts-per-rank"))
      g_epr = atoi(argv[i + 1]);
  }
  if (T < 0 || T > 1 << 20 || H < 1 || H > 1 << 16 || g_epr < 1 || g_epr > 64) {
    fprintf(stderr, "usage: moe [--tokens T] [--hidden H] [--experts-per-rank E]\n");
    return 2;
  }
  tdist_group_t *world = ex_init();
  int me = tdist_group_rank(world), P = tdist_group_size(world), E = P * g_epr;
  int nt = tokens_of(me, T);

  /* 1. route: sort this rank's tokens by destination rank (expert / epr) */
  size_t *send_tok = calloc((size_t)P, sizeof(size_t)),
         *recv_tok = calloc((size_t)P, sizeof(size_t));
  int *order = malloc(sizeof(int) * (size_t)(nt + 1));
  int k = 0;
  for (int dst = 0; dst < P; dst++)
    for (int t = 0; t < nt; t++)
      if (expert_of(me, t, E) / g_epr == dst) {
        order[k++] = t;
        send_tok[dst]++;
      }
  float *xs = malloc(sizeof(float) * (size_t)nt * H + 1);
  int32_t *ids = malloc(sizeof(int32_t) * (size_t)nt + 1);
  for (int i = 0; i < nt; i++) {
    for (int h = 0; h < H; h++)
      xs[(size_t)i * H + h] = x_of(me, order[i], h);
    ids[i] = expert_of(me, order[i], E);
  }

  /* 2. counts: rank j learns what rank i sends it */
  int64_t *sc64 = malloc(sizeof(int64_t) * (size_t)P), *rc64 = malloc(sizeof(int64_t) * (size_t)P);
  for (int j = 0; j < P; j++)
    sc64[j] = (int64_t)send_tok[j];
  EX_CHECK(tdist_all_to_all(world, sc64, rc64, 1, TDIST_INT64, NULL, NULL));
  size_t nrecv = 0;
  for (int j = 0; j < P; j++)
    nrecv += recv_tok[j] = (size_t)rc64[j];

  /* 3. dispatch rows (H floats per token) and ids together */
  size_t *send_el = malloc(sizeof(size_t) * (size_t)P),
         *recv_el = malloc(sizeof(size_t) * (size_t)P);
  for (int j = 0; j < P; j++) {
    send_el[j] = send_tok[j] * (size_t)H;
    recv_el[j] = recv_tok[j] * (size_t)H;
  }
  float *xr = malloc(sizeof(float) * nrecv * H + 1);
  int32_t *idr = malloc(sizeof(int32_t) * nrecv + 1);
  tdist_work_t *w[2];
  double t0 = ex_now();
  EX_CHECK(
      tdist_all_to_all_v(world, xs, send_el, NULL, xr, recv_el, NULL, TDIST_FLOAT32, NULL, &w[0]));
  EX_CHECK(tdist_all_to_all_v(world, ids, send_tok, NULL, idr, recv_tok, NULL, TDIST_INT32, NULL,
                              &w[1]));
  ex_wait(w[0], "dispatch rows");
  ex_wait(w[1], "dispatch ids");

  /* 4. the local experts */
  for (size_t i = 0; i < nrecv; i++) {
    int e = idr[i];
    if (e / g_epr != me) ex_die("routing", TDIST_ERR_INTERNAL, "a token reached the wrong rank");
    for (int h = 0; h < H; h++)
      xr[i * H + h] = a_of(e) * xr[i * H + h] + b_of(e);
  }

  /* 5. combine: the same blocks back, counts swapped */
  float *ys = malloc(sizeof(float) * (size_t)nt * H + 1);
  EX_CHECK(
      tdist_all_to_all_v(world, xr, recv_el, NULL, ys, send_el, NULL, TDIST_FLOAT32, NULL, &w[0]));
  ex_wait(w[0], "combine");
  double dt = ex_now() - t0;

  /* 6. check: each token against the map applied here, then the global sum
   * against one process redoing every rank's tokens */
  double mine = 0;
  for (int i = 0; i < nt; i++) {
    int t = order[i], e = expert_of(me, t, E);
    for (int h = 0; h < H; h++) {
      float want = a_of(e) * x_of(me, t, h) + b_of(e), got = ys[(size_t)i * H + h];
      if (got != want) {
        char why[128];
        snprintf(why, sizeof(why), "token %d [%d] = %g, want %g", t, h, got, want);
        ex_die("check", TDIST_ERR_INTERNAL, why);
      }
      mine += got;
    }
  }
  printf("rank %d: experts %d..%d: OK: %d tokens sent, %zu computed here, outputs checked\n", me,
         me * g_epr, me * g_epr + g_epr - 1, nt, nrecv);
  fflush(stdout);
  double total = mine;
  EX_CHECK(tdist_all_reduce(world, &mine, &total, 1, TDIST_FLOAT64, TDIST_SUM, NULL, NULL));
  int64_t load = (int64_t)nrecv, lmax = 0, lmin = 0; /* tokens each rank's experts got */
  EX_CHECK(tdist_all_reduce(world, &load, &lmax, 1, TDIST_INT64, TDIST_MAX, NULL, NULL));
  EX_CHECK(tdist_all_reduce(world, &load, &lmin, 1, TDIST_INT64, TDIST_MIN, NULL, NULL));
  if (me == 0) {
    double ref = 0;
    long all = 0;
    for (int r = 0; r < P; r++)
      for (int t = 0; t < tokens_of(r, T); t++, all++) {
        int e = expert_of(r, t, E);
        for (int h = 0; h < H; h++)
          ref += a_of(e) * x_of(r, t, h) + b_of(e);
      }
    if (fabs(total - ref) > 1e-6 * fabs(ref) + 1e-3) {
      char why[128];
      snprintf(why, sizeof(why), "sum %.6f over the ranks, %.6f in one process", total, ref);
      ex_die("check", TDIST_ERR_INTERNAL, why);
    }
    printf("moe: %d experts over %d ranks, %ld tokens x %d, per-rank load %lld..%lld tokens, "
           "dispatch+combine %.2f ms: results checked: OK\n",
           E, P, all, H, (long long)lmin, (long long)lmax, dt * 1e3);
  }
  EX_CHECK(tdist_barrier(world, NULL, NULL));
  free(send_tok), free(recv_tok), free(order), free(xs), free(ids), free(sc64), free(rc64);
  free(send_el), free(recv_el), free(xr), free(idr), free(ys);
  EX_CHECK(tdist_group_destroy(world));
  return 0;
}
