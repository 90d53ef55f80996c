/*
 * overlap - hide gradient communication behind computation, as data-parallel
 * training does: the backward pass produces gradients bucket by bucket, and
 * each bucket's all_reduce starts as soon as the bucket is ready, while the
 * next bucket is being computed.
 *
 *   tdistrun -n 4 ./overlap [--buckets B] [--elems E] [--work W] [--steps S]
 *
 * Runs the same steps twice, first waiting for each all_reduce before
 * computing the next bucket, then overlapping, checks every gradient against
 * a locally computed reference, and prints both times (the slowest rank's).
 */
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "example_util.h"

static volatile double sink; /* keeps the simulated compute from being optimised away */

/* "Compute" bucket b of step s: `work` multiply-adds per element, and the
 * gradient value itself is an exact small integer so sums are exact. */
static void compute_bucket(float *g, size_t n, int rank, int s, int b, int work) {
  double acc = 0;
  for (size_t i = 0; i < n; i++) {
    double x = (double)i;
    for (int k = 0; k < work; k++)
      x = x * 0.999 + 1.0;
    acc += x;
    g[i] = (float)((rank + 1) * (int)((i + (size_t)b + (size_t)s) % 13));
  }
  sink += acc;
}

/* The reference: what the all_reduce (sum) must give on every rank. */
static float expected(int world, size_t i, int s, int b) {
  int ranks_sum = world * (world + 1) / 2;
  return (float)(ranks_sum * (int)((i + (size_t)b + (size_t)s) % 13));
}

static long check(float *const *grad, int nb, size_t n, int world, int s) {
  long bad = 0;
  for (int b = 0; b < nb; b++)
    for (size_t i = 0; i < n; i++)
      if (grad[b][i] != expected(world, i, s, b)) bad++;
  return bad;
}

int main(int argc, char **argv) {
  int nb = 8, work = 40, steps = 3;
  size_t n = 1 << 17; /* 512 KiB of float32 per bucket */
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--buckets"))
      nb = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--elems"))
      n = (size_t)atol(argv[i + 1]);
    else if (!strcmp(argv[i], "--work"))
      work = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--steps"))
      steps = atoi(argv[i + 1]);
  }
  if (nb < 1 || nb > 64 || n < 1 || steps < 1 || work < 0) {
    fprintf(stderr, "usage: overlap [--buckets 1..64] [--elems E] [--work W] [--steps S]\n");
    return 2;
  }
  tdist_group_t *world = ex_init();
  int rank = tdist_group_rank(world), size = tdist_group_size(world);
  float *grad[64];
  tdist_work_t *works[64];
  for (int b = 0; b < nb; b++)
    if (!(grad[b] = malloc(n * sizeof(float)))) ex_die("malloc", TDIST_ERR_NO_MEMORY, "buckets");

  double t[2]; /* [0] serial, [1] overlapped */
  long bad = 0;
  for (int mode = 0; mode < 2; mode++) {
    EX_CHECK(tdist_barrier(world, NULL, NULL)); /* start together */
    double t0 = ex_now();
    for (int s = 0; s < steps; s++) {
      for (int b = 0; b < nb; b++) {
        compute_bucket(grad[b], n, rank, s, b, work);
        /* In place, asynchronous: returns at once with a handle. The bucket
         * belongs to tdist until the work completes. */
        EX_CHECK(tdist_all_reduce(world, grad[b], grad[b], n, TDIST_FLOAT32, TDIST_SUM, NULL,
                                  &works[b]));
        if (mode == 0) { /* serial: wait before computing the next bucket */
          ex_wait(works[b], "all_reduce (serial)");
          works[b] = NULL;
        }
      }
      /* The optimizer step needs every bucket: wait for what is in flight. */
      if (mode == 1) {
        int rc = tdist_wait_all(works, (size_t)nb, 0);
        for (int b = 0; b < nb; b++) {
          if (rc != 0 && tdist_work_status(works[b]) != 0)
            ex_die("all_reduce (overlapped)", rc, tdist_work_error_message(works[b]));
          tdist_work_release(works[b]);
        }
      }
      bad += check(grad, nb, n, size, s);
    }
    t[mode] = ex_now() - t0;
  }
  /* Report the slowest rank's times, and whether any rank saw a wrong value. */
  double tmax[2];
  EX_CHECK(tdist_all_reduce(world, t, tmax, 2, TDIST_FLOAT64, TDIST_MAX, NULL, NULL));
  int64_t badsum = bad;
  EX_CHECK(tdist_all_reduce(world, &badsum, &badsum, 1, TDIST_INT64, TDIST_SUM, NULL, NULL));
  printf("rank %d: %s: %d steps x %d buckets x %zu floats checked against the reference\n", rank,
         bad ? "FAILED" : "OK", steps, nb, n);
  if (rank == 0) {
    double mb = (double)steps * nb * (double)n * sizeof(float) / 1e6;
    printf("overlap: all_reduce of %.0f MB of gradients in %d-float buckets on %d ranks (%s)\n", mb,
           (int)n, size, tdist_group_backend(world));
    printf("overlap:   compute then wait each bucket : %7.1f ms\n", tmax[0] * 1e3);
    printf("overlap:   all_reduce behind compute     : %7.1f ms  (%+.0f%% time saved)\n",
           tmax[1] * 1e3, 100.0 * (tmax[0] - tmax[1]) / tmax[0]);
    /* Overlap pays when the transfer waits on the network or the GPU. Over
     * loopback TCP the transfer is CPU work too, so with fewer cores than
     * ranks x 2 threads it competes with the compute instead of hiding. */
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (tmax[1] >= tmax[0] && cores < 2L * size)
      printf("overlap:   (no gain here: %d ranks share %ld cores, so the loopback transfer\n"
             "overlap:    competes with the compute; on a network or GPUs it runs beside it)\n",
             size, cores);
    printf("overlap: results %s on every rank\n", badsum ? "WRONG" : "checked: OK");
  }
  for (int b = 0; b < nb; b++)
    free(grad[b]);
  EX_CHECK(tdist_group_destroy(world));
  return badsum ? 1 : 0;
}
