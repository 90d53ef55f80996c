/*
 * nccl_sim_rank.c - one rank of an NCCL-backend job launched by tdistrun on
 * the simulated GPU, as a user would run it without a GPU:
 *
 *   TDIST_NCCL_LIBRARY=libtdist_gpusim.so TDIST_CUDART_LIBRARY=libtdist_gpusim.so \
 *   tdistrun -n 4 --backend nccl ./nccl_sim_rank
 *
 * Everything comes from the launcher's environment (RANK, WORLD_SIZE,
 * LOCAL_RANK, MASTER_*), the device included: LOCAL_RANK modulo the devices
 * the process sees (ctest runs it once with every device visible and once
 * with CUDA_VISIBLE_DEVICES naming one, so that every rank is on its device
 * 0). Each rank checks: all_reduce of every reduction, broadcast and reduce
 * from every root, all_gather, reduce_scatter, all_to_all, a ring of
 * batched send/recv, a new group of the even ranks and a 2 x (n/2) mesh, then
 * prints "rank R: ok". Exit 0 on success.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nccl_rank_util.h"

enum { N = 4096 };

static int32_t *dev_from(const int32_t *h) {
  void *d = NULL;
  if (cudaMalloc(&d, N * sizeof(int32_t)) != cudaSuccess) return NULL;
  if (cudaMemcpy(d, h, N * sizeof(int32_t), cudaMemcpyHostToDevice) != cudaSuccess) return NULL;
  return d;
}

static int get(int32_t *h, const int32_t *d, size_t n) {
  return cudaMemcpy(h, d, n * sizeof(int32_t), cudaMemcpyDeviceToHost) == cudaSuccess ? 0 : -1;
}

static int32_t val(int r, int i) { return (int32_t)(r * 1000 + i % 977); }

static int collectives(tdist_group_t *w) {
  int32_t *h = malloc(N * sizeof(int32_t) * (size_t)size),
          *o = malloc(N * sizeof(int32_t) * (size_t)size);
  CHECK(h && o);
  for (int i = 0; i < N; i++)
    h[i] = val(rank, i);
  static const tdist_redop_t reds[] = {TDIST_SUM, TDIST_PROD, TDIST_MIN, TDIST_MAX};
  for (int k = 0; k < 4; k++) {
    int32_t *d = dev_from(h);
    CHECK(d && tdist_all_reduce(w, d, d, N, TDIST_INT32, reds[k], NULL, NULL) == 0);
    CHECK(get(o, d, N) == 0);
    for (int i = 0; i < N; i += 97) {
      int64_t want = val(0, i);
      for (int r = 1; r < size; r++) {
        int32_t x = val(r, i);
        want = reds[k] == TDIST_SUM    ? (int32_t)(want + x)
               : reds[k] == TDIST_PROD ? (int32_t)((uint32_t)want * (uint32_t)x)
               : reds[k] == TDIST_MIN  ? (x < want ? x : want)
                                       : (x > want ? x : want);
      }
      CHECK(o[i] == (int32_t)want);
    }
    cudaFree(d);
  }
  for (int root = 0; root < size; root++) {
    int32_t *d = dev_from(h);
    CHECK(d && tdist_broadcast(w, d, N, TDIST_INT32, root, NULL, NULL) == 0);
    CHECK(get(o, d, N) == 0 && o[5] == val(root, 5) && o[N - 1] == val(root, N - 1));
    CHECK(cudaMemcpy(d, h, N * sizeof(int32_t), cudaMemcpyHostToDevice) == cudaSuccess);
    CHECK(tdist_reduce(w, d, d, N, TDIST_INT32, TDIST_SUM, root, NULL, NULL) == 0);
    if (rank == root) {
      CHECK(get(o, d, N) == 0);
      int32_t want = 0;
      for (int r = 0; r < size; r++)
        want += val(r, 7);
      CHECK(o[7] == want);
    }
    cudaFree(d);
  }
  void *all = NULL;
  int32_t *d = dev_from(h);
  CHECK(d && cudaMalloc(&all, N * sizeof(int32_t) * (size_t)size) == cudaSuccess);
  CHECK(tdist_all_gather(w, d, all, N, TDIST_INT32, NULL, NULL) == 0);
  CHECK(get(o, all, N * (size_t)size) == 0);
  for (int r = 0; r < size; r++)
    CHECK(o[(size_t)r * N + 11] == val(r, 11));
  /* all_to_all: block b of my input is val(rank, b * N/size + i) */
  CHECK(tdist_all_to_all(w, d, all, N / size, TDIST_INT32, NULL, NULL) == 0);
  CHECK(get(o, all, N) == 0);
  for (int r = 0; r < size; r++)
    CHECK(o[r * (N / size)] == val(r, rank * (N / size)));
  CHECK(tdist_reduce_scatter(w, d, all, N / size, TDIST_INT32, TDIST_SUM, NULL, NULL) == 0);
  CHECK(get(o, all, N / size) == 0);
  int32_t want = 0;
  for (int r = 0; r < size; r++)
    want += val(r, rank * (N / size) + 3);
  CHECK(o[3] == want);
  cudaFree(d);
  cudaFree(all);
  free(h);
  free(o);
  return 0;
}

static int p2p_ring(tdist_group_t *w) {
  int32_t h[N], o[N];
  for (int i = 0; i < N; i++)
    h[i] = val(rank, i);
  int32_t *s = dev_from(h), *r = dev_from(h);
  CHECK(s && r);
  /* One batch (an NCCL group): a separate irecv then isend would be two
   * kernels in stream order, each rank's receive waiting for a send queued
   * behind its own -- the ring deadlock NCCL users avoid the same way. */
  tdist_p2p_op_t ops[2] = {
      {TDIST_P2P_RECV, r, N, TDIST_INT32, (rank + size - 1) % size, 0},
      {TDIST_P2P_SEND, s, N, TDIST_INT32, (rank + 1) % size, 0},
  };
  tdist_work_t *wb = NULL;
  CHECK(tdist_batch_isend_irecv(w, ops, 2, NULL, &wb) == 0);
  CHECK(tdist_work_wait(wb, 0) == 0);
  tdist_work_release(wb);
  CHECK(get(o, r, N) == 0 && o[9] == val((rank + size - 1) % size, 9));
  cudaFree(s);
  cudaFree(r);
  return 0;
}

static int subgroups(tdist_group_t *w) {
  int even[64], ne = 0;
  for (int r = 0; r < size; r += 2)
    even[ne++] = r;
  tdist_group_t *g = NULL;
  CHECK(tdist_new_group(w, even, ne, NULL, &g) == 0);
  CHECK((g != NULL) == (rank % 2 == 0));
  int32_t h[N], o[N];
  for (int i = 0; i < N; i++)
    h[i] = 1;
  if (g) {
    int32_t *d = dev_from(h);
    CHECK(d && tdist_all_reduce(g, d, d, N, TDIST_INT32, TDIST_SUM, NULL, NULL) == 0);
    CHECK(get(o, d, N) == 0 && o[0] == ne);
    cudaFree(d);
    CHECK(tdist_group_destroy(g) == 0);
  }
  if (size % 2 == 0) {
    int dims[2] = {2, size / 2}, coords[2];
    tdist_group_t *mg[2];
    CHECK(tdist_mesh_create(w, dims, 2, NULL, mg, coords) == 0);
    for (int k = 0; k < 2; k++) {
      int32_t *d = dev_from(h);
      CHECK(d && tdist_all_reduce(mg[k], d, d, N, TDIST_INT32, TDIST_SUM, NULL, NULL) == 0);
      CHECK(get(o, d, N) == 0 && o[N - 1] == dims[k]);
      cudaFree(d);
    }
    for (int k = 0; k < 2; k++)
      CHECK(tdist_group_destroy(mg[k]) == 0);
  }
  return 0;
}

int main(void) {
  tdist_group_t *w = NULL;
  if (rank_start(&w) != 0) return 1;
  int rc = collectives(w) || p2p_ring(w) || subgroups(w);
  if (tdist_group_destroy(w) != 0) rc = 1;
  if (!rc) printf("rank %d: ok\n", rank);
  return rc;
}
