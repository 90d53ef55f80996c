/*
 * nccl_graph_rank.c - one rank of a tdistrun job that captures NCCL ops into
 * a CUDA graph and replays it (issue 42 #1; docs/nccl-backend.md, "CUDA
 * graph capture"). The same C program runs on the simulated GPU (ctest
 * nccl_sim_graph_tdistrun) and, built against the real CUDA runtime as
 * tdist_gpu_graph, in the GPU check (tests/gpu/run.sh, step graph): it calls
 * only the CUDA runtime by name and tdist, nothing of the simulation.
 *
 * Each rank, on stream s captured in global mode (as torch.cuda.graph does):
 *   all_reduce SUM (in -> out), all_reduce PREMUL_SUM 0.5 (in place),
 *   barrier; the works are captured (COMPLETED at once, tdist_work_is_captured);
 * then 10 launches, the inputs rewritten on s before each, every output
 * checked against the host reference, an uncaptured all_reduce between
 * launches (checked); then the group is destroyed while the graph exists,
 * the graph launched once more (checked), and the graph destroyed. Prints
 * "rank R: graph ok"; exit 0 on success.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nccl_rank_util.h"

#define CUDA(call) CHECK((call) == cudaSuccess)

enum { N = 1024, REPLAYS = 10 };

/* Input of rank r, element i, launch k: small integers, exact in float. */
static float in_val(int r, int i, int k) { return (float)((r + 1) * (i % 13 + 1) + 10 * k); }
static float pm_val(int r, int i, int k) { return (float)(2 * (r + 1) + 4 * k + i % 3); }

static int check(const char *what, const float *got, int k, int premul) {
  for (int i = 0; i < N; i++) {
    float want = 0;
    for (int r = 0; r < size; r++)
      want += premul ? 0.5f * pm_val(r, i, k) : in_val(r, i, k);
    if (got[i] != want) {
      fprintf(stderr, "rank %d: %s, launch %d, element %d: %g, want %g\n", rank, what, k, i, got[i],
              want);
      return 1;
    }
  }
  return 0;
}

/* Rewrite the inputs for launch k on s, launch, and check. */
static int launch_checked(cudaGraphExec_t ex, cudaStream_t s, float *in, float *out, float *pm,
                          float *h, float *hp, int k) {
  for (int i = 0; i < N; i++) {
    h[i] = in_val(rank, i, k);
    hp[i] = pm_val(rank, i, k);
  }
  CUDA(cudaMemcpyAsync(in, h, N * sizeof(float), cudaMemcpyHostToDevice, s));
  CUDA(cudaMemcpyAsync(pm, hp, N * sizeof(float), cudaMemcpyHostToDevice, s));
  CUDA(cudaGraphLaunch(ex, s));
  CUDA(cudaStreamSynchronize(s));
  CUDA(cudaMemcpy(h, out, N * sizeof(float), cudaMemcpyDeviceToHost));
  CUDA(cudaMemcpy(hp, pm, N * sizeof(float), cudaMemcpyDeviceToHost));
  return check("all_reduce", h, k, 0) || check("premul_sum", hp, k, 1);
}

static int graph(tdist_group_t *w) {
  float *in = NULL, *out = NULL, *pm = NULL, *side = NULL;
  float *h = malloc(N * sizeof(float)), *hp = malloc(N * sizeof(float));
  CHECK(h && hp);
  CUDA(cudaMalloc((void **)&in, N * sizeof(float)));
  CUDA(cudaMalloc((void **)&out, N * sizeof(float)));
  CUDA(cudaMalloc((void **)&pm, N * sizeof(float)));
  CUDA(cudaMalloc((void **)&side, sizeof(float)));
  cudaStream_t s;
  CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  tdist_op_opts_t o = {.mask = TDIST_OP_FIELD_STREAM, .stream = s};
  tdist_op_opts_t op = {
      .mask = TDIST_OP_FIELD_STREAM | TDIST_OP_FIELD_SCALAR, .stream = s, .premul_scalar = 0.5};
  tdist_work_t *wk[3] = {NULL, NULL, NULL};

  CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  CHECK(tdist_all_reduce(w, in, out, N, TDIST_FLOAT32, TDIST_SUM, &o, &wk[0]) == 0);
  CHECK(tdist_all_reduce(w, pm, pm, N, TDIST_FLOAT32, TDIST_PREMUL_SUM, &op, &wk[1]) == 0);
  CHECK(tdist_barrier(w, &o, &wk[2]) == 0);
  cudaGraph_t g = NULL;
  CUDA(cudaStreamEndCapture(s, &g));
  for (int i = 0; i < 3; i++) {
    CHECK(tdist_work_is_captured(wk[i]) == 1);
    CHECK(tdist_work_is_completed(wk[i]) == 1);
    CHECK(tdist_work_wait(wk[i], 0) == 0);
    CHECK(strstr(tdist_work_error_message(wk[i]), "captured into a CUDA graph") != NULL);
    tdist_work_release(wk[i]);
  }
  cudaGraphExec_t ex = NULL;
  CUDA(cudaGraphInstantiate(&ex, g, 0));
  for (int k = 0; k < REPLAYS; k++) {
    if (launch_checked(ex, s, in, out, pm, h, hp, k)) return 1;
    /* An uncaptured op between launches. */
    float one = (float)(rank + k);
    CUDA(cudaMemcpy(side, &one, sizeof(float), cudaMemcpyHostToDevice));
    CHECK(tdist_all_reduce(w, side, side, 1, TDIST_FLOAT32, TDIST_SUM, &o, NULL) == 0);
    CUDA(cudaStreamSynchronize(s));
    CUDA(cudaMemcpy(&one, side, sizeof(float), cudaMemcpyDeviceToHost));
    CHECK(one == (float)(size * (size - 1) / 2 + size * k));
  }
  /* The group goes; the graph keeps its communicator. */
  CHECK(tdist_group_destroy(w) == 0);
  if (launch_checked(ex, s, in, out, pm, h, hp, REPLAYS)) return 1;
  CUDA(cudaGraphExecDestroy(ex));
  CUDA(cudaGraphDestroy(g));
  CUDA(cudaStreamDestroy(s));
  cudaFree(in);
  cudaFree(out);
  cudaFree(pm);
  cudaFree(side);
  free(h);
  free(hp);
  return 0;
}

int main(void) {
  tdist_group_t *w = NULL;
  if (rank_start(&w) != 0) return 1;
  int rc = graph(w); /* destroys w */
  if (!rc) printf("rank %d: graph ok\n", rank);
  return rc;
}
