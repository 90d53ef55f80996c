/*
 * pipeline - pipeline parallelism: every rank is one stage of a model, and
 * micro-batches flow through the stages with point-to-point messages.
 *
 *   tdistrun -n 4 ./pipeline [--micro M] [--elems E]
 *
 * Every stage posts all its receives first -- the activations of every
 * micro-batch from the stage below and their gradients from the stage above
 * (tag = micro-batch) -- so that receiving always overlaps computing.
 * Forward: as each activation arrives the stage "computes" (adds stage + 1)
 * and isends it up. Backward: as each gradient arrives from above the stage
 * checks it element by element, adds its own contribution and isends it
 * down. Each stage thus has receives outstanding from both neighbours
 * while it sends to both, all with separate isend/irecv.
 *
 * On the NCCL backend (tdistrun --backend nccl) the messages move CUDA
 * device memory (example_util.h's ex_alloc) and the "compute" runs on host
 * copies. The schedule needs the backend's communicator per direction of
 * each pair of peers (docs/nccl-backend.md): on one stream per group, stage
 * 0's gradient receives would sit ahead of its activation sends, which the
 * gradients wait for. NCCL has no tags: messages between two stages match
 * in the order posted, which here is the micro-batch order the tags name.
 */
#include <string.h>

#include "example_util.h"

/* Value of element i of micro-batch m entering stage 0. */
static float input(int m, size_t i) { return (float)(m * 1000 + (int)(i % 997)); }

int main(int argc, char **argv) {
  int nm = 8;
  size_t n = 1 << 16;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--micro"))
      nm = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--elems"))
      n = (size_t)atol(argv[i + 1]);
  }
  if (nm < 1 || nm > 256 || n < 1) {
    fprintf(stderr, "usage: pipeline [--micro 1..256] [--elems E]\n");
    return 2;
  }
  tdist_group_t *world = ex_init();
  ex_mem_init(world); /* device buffers on an NCCL group */
  int stage = tdist_group_rank(world), P = tdist_group_size(world);
  int prev = stage - 1, next = stage + 1 < P ? stage + 1 : -1;
  size_t bytes = (size_t)nm * n * sizeof(float);
  /* What the group moves (device memory on NCCL), and the host copies the
   * stage computes on (the same memory on a CPU group). */
  float *act_buf = ex_alloc(bytes), *grad_buf = ex_alloc(bytes);
  float *act = ex_mem.on ? malloc(bytes) : act_buf;   /* activations, per micro-batch */
  float *grad = ex_mem.on ? malloc(bytes) : grad_buf; /* gradients, per micro-batch */
  tdist_work_t **recv_w = calloc((size_t)nm, sizeof(*recv_w));
  tdist_work_t **send_w = calloc((size_t)nm, sizeof(*send_w));
  tdist_work_t **grecv_w = calloc((size_t)nm, sizeof(*grecv_w));
  tdist_work_t **gsend_w = calloc((size_t)nm, sizeof(*gsend_w));
  if (!act || !grad || !recv_w || !send_w || !grecv_w || !gsend_w)
    ex_die("malloc", TDIST_ERR_NO_MEMORY, "buffers");

  /* ---- every receive, from both neighbours, before any send ---- */
  for (int m = 0; m < nm; m++) {
    tdist_op_opts_t o = {.mask = TDIST_OP_FIELD_TAG, .tag = m};
    if (prev >= 0) /* activation of micro-batch m from below */
      EX_CHECK(tdist_irecv(world, act_buf + (size_t)m * n, n, TDIST_FLOAT32, prev, &o, &recv_w[m]));
    if (next >= 0) /* its gradient from above */
      EX_CHECK(
          tdist_irecv(world, grad_buf + (size_t)m * n, n, TDIST_FLOAT32, next, &o, &grecv_w[m]));
  }

  /* ---- forward ---- */
  for (int m = 0; m < nm; m++) {
    float *a = act + (size_t)m * n;
    if (prev < 0)
      for (size_t i = 0; i < n; i++)
        a[i] = input(m, i);
    else
      ex_wait(recv_w[m], "forward irecv");
    if (prev >= 0) ex_copy(a, act_buf + (size_t)m * n, n * sizeof(float), EX_TO_HOST);
    for (size_t i = 0; i < n; i++)
      a[i] += (float)(stage + 1); /* this stage's "layer" */
    ex_copy(act_buf + (size_t)m * n, a, n * sizeof(float), EX_TO_DEV);
    if (next >= 0) {
      tdist_op_opts_t o = {.mask = TDIST_OP_FIELD_TAG, .tag = m};
      EX_CHECK(tdist_isend(world, act_buf + (size_t)m * n, n, TDIST_FLOAT32, next, &o, &send_w[m]));
    }
  }
  /* A send buffer is ours again only once its work completed. */
  for (int m = 0; m < nm && next >= 0; m++)
    ex_wait(send_w[m], "forward isend");

  /* ---- backward ---- */
  long bad = 0;
  const float through_all = (float)(P * (P + 1) / 2); /* what the forward adds */
  for (int m = 0; m < nm; m++) {
    float *g = grad + (size_t)m * n, *a = act + (size_t)m * n;
    if (next < 0) { /* last stage: the "loss gradient" is the forward output */
      memcpy(g, a, n * sizeof(float));
    } else {
      ex_wait(grecv_w[m], "backward irecv");
      ex_copy(g, grad_buf + (size_t)m * n, n * sizeof(float), EX_TO_HOST);
    }
    /* Check: the last stage's output plus 1 per stage above this one. */
    for (size_t i = 0; i < n; i++)
      bad += g[i] != input(m, i) + through_all + (float)(P - 1 - stage);
    if (next < 0)
      for (size_t i = 0; i < n; i++)
        bad += a[i] != input(m, i) + through_all;
    for (size_t i = 0; i < n; i++)
      g[i] += 1.0f; /* this stage's contribution */
    if (prev >= 0) {
      tdist_op_opts_t o = {.mask = TDIST_OP_FIELD_TAG, .tag = m};
      ex_copy(grad_buf + (size_t)m * n, g, n * sizeof(float), EX_TO_DEV);
      EX_CHECK(
          tdist_isend(world, grad_buf + (size_t)m * n, n, TDIST_FLOAT32, prev, &o, &gsend_w[m]));
    }
  }
  for (int m = 0; m < nm && prev >= 0; m++)
    ex_wait(gsend_w[m], "backward isend");
  printf("rank %d: stage %d of %d: %s: %d micro-batches x %zu floats checked\n", stage, stage, P,
         bad ? "FAILED" : "OK", nm, n);
  int64_t badsum = bad;
  int64_t *badbuf = ex_alloc(sizeof(badsum));
  ex_copy(badbuf, &badsum, sizeof(badsum), EX_TO_DEV);
  EX_CHECK(tdist_all_reduce(world, badbuf, badbuf, 1, TDIST_INT64, TDIST_SUM, NULL, NULL));
  ex_copy(&badsum, badbuf, sizeof(badsum), EX_TO_HOST);
  ex_free(badbuf);
  if (stage == 0)
    printf("pipeline: %d stages, %d micro-batches forward and backward (isend/irecv, every "
           "receive posted first): results %s\n",
           P, nm, badsum ? "WRONG" : "checked: OK");
  if (ex_mem.on) free(act), free(grad);
  ex_free(act_buf), ex_free(grad_buf);
  free(recv_w), free(send_w), free(grecv_w), free(gsend_w);
  EX_CHECK(tdist_group_destroy(world));
  return badsum ? 1 : 0;
}
