/*
 * nccl_sim_p2p_rank.c - one rank of a tdistrun job checking separate
 * isend/irecv on the NCCL backend (a communicator per pair of peers,
 * src/nccl/nccl_p2p.c):
 *
 *   tdistrun -n N --backend nccl ./nccl_sim_p2p_rank
 *
 * ctest runs it on the simulated GPU at N = 2, 3, 4 (nccl_sim_p2p_tdistrun_nN);
 * tests/gpu/run.sh builds it against the real CUDA runtime as tdist_gpu_p2p
 * (step p2p). It calls the CUDA runtime by name only (gpusim/api.h declares
 * the calls; no gpusim inspection). Every op has a timeout of 20 s: before
 * the pair communicators, the first ring deadlocked until it (every rank's
 * send queued ahead of its receive on the group's one stream). Checks, each
 * against host-computed values:
 *   ring_send_first   every rank isend(next) then irecv(prev), then waits
 *   ring_recv_first   irecv(prev) then isend(next)
 *   ring_big          the first ring with 4 MiB messages (more than NCCL's
 *                     and the simulation's buffers hold: no send completes
 *                     before its receive runs)
 *   mixed             8 messages each way with every peer, posted in an
 *                     order that differs per rank and message (receive or
 *                     send first), all waited at the end: the k-th receive
 *                     from a peer gets its k-th send (order kept per pair)
 *   cross (N >= 3)    rank 0: isend(1) then send(2); rank 1: recv(2) then
 *                     recv(0); rank 2: recv(0) then send(1). Completes on the
 *                     CPU backend; with a first p2p call that waited for the
 *                     peer's (torch's getNCCLComm) it would deadlock.
 * then prints "rank R: p2p ok" and destroys the group (pair communicators
 * included). Exit 0 on success.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nccl_rank_util.h"

enum { N = 2048, MSGS = 8, BIG = 1 << 20 };
static tdist_op_opts_t opts = {TDIST_OP_FIELD_TIMEOUT, 20000, 1.0, NULL, 0};

/* Element i of the message from `src` to `dst`, number k. */
static int32_t val(int src, int dst, int k, int i) {
  return (int32_t)(src * 1000003 + dst * 10007 + k * 101 + i % 89);
}

static int32_t host[BIG];

/* Device memory holding n elements of message (src -> dst, k). */
static int32_t *dev_msg_n(int src, int dst, int k, size_t n) {
  for (size_t i = 0; i < n; i++)
    host[i] = val(src, dst, k, (int)i);
  void *d = NULL;
  if (cudaMalloc(&d, n * sizeof(int32_t)) != cudaSuccess) return NULL;
  if (cudaMemcpy(d, host, n * sizeof(int32_t), cudaMemcpyHostToDevice) != cudaSuccess) return NULL;
  return d;
}
static int32_t *dev_msg(int src, int dst, int k) { return dev_msg_n(src, dst, k, N); }

/* The device buffer holds the n elements of message (src -> dst, k). */
static int is_msg_n(const int32_t *d, int src, int dst, int k, size_t n) {
  if (cudaMemcpy(host, d, n * sizeof(int32_t), cudaMemcpyDeviceToHost) != cudaSuccess) return 0;
  for (size_t i = 0; i < n; i++)
    if (host[i] != val(src, dst, k, (int)i)) return 0;
  return 1;
}
static int is_msg(const int32_t *d, int src, int dst, int k) { return is_msg_n(d, src, dst, k, N); }

static int ring(tdist_group_t *w, int send_first, int k, size_t n) {
  int next = (rank + 1) % size, prev = (rank + size - 1) % size;
  int32_t *s = dev_msg_n(rank, next, k, n), *r = dev_msg_n(-1, -1, 0, n);
  CHECK(s && r);
  tdist_work_t *ws = NULL, *wr = NULL;
  if (send_first) {
    CHECK(tdist_isend(w, s, n, TDIST_INT32, next, &opts, &ws) == 0);
    CHECK(tdist_irecv(w, r, n, TDIST_INT32, prev, &opts, &wr) == 0);
  } else {
    CHECK(tdist_irecv(w, r, n, TDIST_INT32, prev, &opts, &wr) == 0);
    CHECK(tdist_isend(w, s, n, TDIST_INT32, next, &opts, &ws) == 0);
  }
  CHECK(tdist_work_wait(ws, 0) == 0);
  CHECK(tdist_work_wait(wr, 0) == 0);
  tdist_work_release(ws);
  tdist_work_release(wr);
  CHECK(is_msg_n(r, prev, rank, k, n));
  cudaFree(s);
  cudaFree(r);
  return 0;
}

static int mixed(tdist_group_t *w) {
  int np = size - 1, n = 0;
  int32_t **bufs = calloc((size_t)(2 * np * MSGS), sizeof(*bufs));
  tdist_work_t **works = calloc((size_t)(2 * np * MSGS), sizeof(*works));
  int *src = calloc((size_t)(2 * np * MSGS), sizeof(int)),
      *kk = calloc((size_t)(2 * np * MSGS), sizeof(int));
  CHECK(bufs && works && src && kk);
  for (int k = 0; k < MSGS; k++) {
    for (int j = 0; j < np; j++) {
      /* Peers in a rotation of this rank's own; send or receive first by
       * the parity of rank + k + j. */
      int peer = (rank + 1 + (j + k) % np) % size;
      for (int half = 0; half < 2; half++) {
        int do_send = ((rank + k + j) % 2 == 0) ? half == 0 : half == 1;
        if (do_send) {
          bufs[n] = dev_msg(rank, peer, k);
          src[n] = -1;
          CHECK(bufs[n] && tdist_isend(w, bufs[n], N, TDIST_INT32, peer, &opts, &works[n]) == 0);
        } else {
          bufs[n] = dev_msg(-1, -1, 0);
          src[n] = peer;
          kk[n] = k;
          CHECK(bufs[n] && tdist_irecv(w, bufs[n], N, TDIST_INT32, peer, &opts, &works[n]) == 0);
        }
        n++;
      }
    }
  }
  for (int i = n - 1; i >= 0; i--) { /* waited in reverse: completion order is free */
    int rc = tdist_work_wait(works[i], 0);
    if (rc != 0)
      fprintf(stderr, "rank %d: %s of op %d (peer %d) failed: %d: %s\n", rank,
              src[i] >= 0 ? "irecv" : "isend", i, src[i], rc, tdist_work_error_message(works[i]));
    CHECK(rc == 0);
    tdist_work_release(works[i]);
  }
  for (int i = 0; i < n; i++) {
    if (src[i] >= 0) CHECK(is_msg(bufs[i], src[i], rank, kk[i]));
    cudaFree(bufs[i]);
  }
  free(bufs);
  free(works);
  free(src);
  free(kk);
  return 0;
}

static int cross(tdist_group_t *w) {
  if (rank > 2) return 0;
  int32_t *a = dev_msg(rank, (rank + 1) % 3, 50), *b = dev_msg(-1, -1, 0), *c = dev_msg(-1, -1, 0);
  CHECK(a && b && c);
  if (rank == 0) {
    tdist_work_t *w1 = NULL;
    int32_t *y = dev_msg(0, 2, 51);
    CHECK(y && tdist_isend(w, a, N, TDIST_INT32, 1, &opts, &w1) == 0);
    CHECK(tdist_send(w, y, N, TDIST_INT32, 2, &opts) == 0);
    CHECK(tdist_work_wait(w1, 0) == 0);
    tdist_work_release(w1);
    cudaFree(y);
  } else if (rank == 1) {
    CHECK(tdist_recv(w, b, N, TDIST_INT32, 2, &opts) == 0);
    CHECK(tdist_recv(w, c, N, TDIST_INT32, 0, &opts) == 0);
    CHECK(is_msg(b, 2, 1, 52) && is_msg(c, 0, 1, 50));
  } else {
    int32_t *z = dev_msg(2, 1, 52);
    CHECK(z && tdist_recv(w, b, N, TDIST_INT32, 0, &opts) == 0);
    CHECK(is_msg(b, 0, 2, 51));
    CHECK(tdist_send(w, z, N, TDIST_INT32, 1, &opts) == 0);
    cudaFree(z);
  }
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  return 0;
}

int main(void) {
  tdist_group_t *w = NULL;
  if (rank_start(&w) != 0) return 1;
  int rc = 0;
  if (size > 1) {
    rc = ring(w, 1, 1, N) || ring(w, 0, 2, N) || ring(w, 1, 3, BIG) || mixed(w) ||
         (size >= 3 && cross(w));
    /* Each part on its own: a rank done early must not destroy the group
     * under a peer's ops (destroy waits only for this rank's). */
    if (!rc) rc = tdist_barrier(w, NULL, NULL) != 0;
  }
  if (tdist_group_destroy(w) != 0) rc = 1;
  if (!rc) printf("rank %d: p2p ok\n", rank);
  return rc;
}
