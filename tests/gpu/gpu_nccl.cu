// gpu_nccl.cu - the NCCL backend on a real GPU (run by tests/gpu/run.sh).
//
//   gpu_nccl one PORT          world size 1: every op with results checked,
//                              self send/recv in a batch, a 1-to-1 split, a
//                              stream-ordered wait followed by a kernel that
//                              reads the result, compute/all_reduce overlap,
//                              and a timeout driven by a kernel spinning on a
//                              flag (the abort path really runs).
//   gpu_nccl two RANK PORT     one rank of a 2-rank world on the same GPU (run
//                              twice with different NCCL_HOSTID): all_reduce
//                              and all_gather checked.
//
// Prints "PASS name" / "FAIL name: why" per check; exit status = failures.
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <vector>

#include "tdist/tdist.h"

// Linked against the static library, whose backend registry refers to the
// NCCL backend weakly: this strong reference pulls it into the program.
extern "C" {
struct tdist_backend;
extern const struct tdist_backend tdist__nccl_backend;
}
__attribute__((used)) static const void *const nccl_backend_ref = &tdist__nccl_backend;

static int failures;

#define CHECK(cond, name, ...)                           \
  do {                                                   \
    if (cond) {                                          \
      printf("PASS %s\n", name);                         \
    } else {                                             \
      failures++;                                        \
      printf("FAIL %s: ", name);                         \
      printf(__VA_ARGS__);                               \
      printf(" (last error: %s)\n", tdist_last_error()); \
    }                                                    \
    fflush(stdout);                                      \
  } while (0)

#define CUDA(call)                                                                      \
  do {                                                                                  \
    cudaError_t e_ = (call);                                                            \
    if (e_ != cudaSuccess) {                                                            \
      printf("FAIL %s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      exit(100);                                                                        \
    }                                                                                   \
  } while (0)

static float *dev(size_t n) {
  float *p;
  CUDA(cudaMalloc(&p, n * sizeof(float)));
  return p;
}
static void put(float *d, const std::vector<float> &h) {
  CUDA(cudaMemcpy(d, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice));
}
static std::vector<float> get(const float *d, size_t n) {
  std::vector<float> h(n);
  CUDA(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
  return h;
}
static bool same(const std::vector<float> &a, const std::vector<float> &b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); i++)
    if (a[i] != b[i]) {
      printf("  [%zu] got %g want %g\n", i, a[i], b[i]);
      return false;
    }
  return true;
}
static std::vector<float> ramp(size_t n, float base) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; i++)
    v[i] = base + (float)i;
  return v;
}

static int init_world(int rank, int size, int port, int64_t timeout_ms, tdist_group_t **g) {
  char url[64];
  snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", port);
  tdist_init_opts_t o = {};
  o.mask = TDIST_INIT_FIELD_BACKEND | TDIST_INIT_FIELD_INIT_METHOD | TDIST_INIT_FIELD_RANK |
           TDIST_INIT_FIELD_WORLD_SIZE | TDIST_INIT_FIELD_TIMEOUT | TDIST_INIT_FIELD_HOST_STORE |
           TDIST_INIT_FIELD_DEVICE;
  o.backend = "nccl";
  o.init_method = url;
  o.rank = rank;
  o.world_size = size;
  o.timeout_ms = timeout_ms;
  o.host_store = 1;
  o.device = 0;
  return tdist_init_process_group(&o, g);
}

// y[i] = 2 * x[i]: reads the collective's result on another stream.
__global__ void twice(const float *x, float *y, size_t n) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n) y[i] = 2.0f * x[i];
}
__global__ void fill(float *x, size_t n, float v) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n) x[i] = v + (float)i;
}
// Busy for about `cycles` clock cycles (the compute side of the overlap).
__global__ void busy(long long cycles) {
  long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}
// Spins until *flag != 0 (host-mapped memory), holding its stream.
__global__ void spin_on(volatile int *flag) {
  while (*flag == 0) {
  }
}

static void every_op(tdist_group_t *g) {
  const size_t n = 1024;
  float *a = dev(n), *b = dev(n);
  tdist_work_t *w = NULL;
  int rc;
  // all_reduce: sum / avg / max / premul_sum on one rank is the input (scaled).
  const tdist_redop_t ops[] = {TDIST_SUM, TDIST_AVG, TDIST_MAX, TDIST_PREMUL_SUM};
  for (tdist_redop_t op : ops) {
    put(a, ramp(n, 1));
    tdist_op_opts_t o = {};
    o.mask = TDIST_OP_FIELD_SCALAR;
    o.premul_scalar = 0.5;
    rc = tdist_all_reduce(g, a, b, n, TDIST_FLOAT32, op, &o, &w);
    rc = rc ? rc : tdist_work_wait(w, 10000);
    std::vector<float> want = ramp(n, 1);
    if (op == TDIST_PREMUL_SUM)
      for (float &x : want)
        x *= 0.5f;
    char name[64];
    snprintf(name, sizeof(name), "all_reduce %s", tdist_redop_name(op));
    CHECK(rc == 0 && tdist_work_is_completed(w) && same(get(b, n), want), name, "rc %s",
          tdist_err_name(rc));
    tdist_work_release(w);
  }
  // In place.
  put(a, ramp(n, 3));
  rc = tdist_all_reduce(g, a, a, n, TDIST_FLOAT32, TDIST_SUM, NULL, NULL);
  CHECK(rc == 0 && same(get(a, n), ramp(n, 3)), "all_reduce in place", "rc %s", tdist_err_name(rc));
  put(a, ramp(n, 5));
  rc = tdist_broadcast(g, a, n, TDIST_FLOAT32, 0, NULL, NULL);
  CHECK(rc == 0 && same(get(a, n), ramp(n, 5)), "broadcast", "rc %s", tdist_err_name(rc));
  put(a, ramp(n, 6));
  rc = tdist_reduce(g, a, b, n, TDIST_FLOAT32, TDIST_SUM, 0, NULL, NULL);
  CHECK(rc == 0 && same(get(b, n), ramp(n, 6)), "reduce", "rc %s", tdist_err_name(rc));
  put(a, ramp(n, 7));
  rc = tdist_all_gather(g, a, b, n, TDIST_FLOAT32, NULL, NULL);
  CHECK(rc == 0 && same(get(b, n), ramp(n, 7)), "all_gather", "rc %s", tdist_err_name(rc));
  put(a, ramp(n, 8));
  rc = tdist_gather(g, a, b, n, TDIST_FLOAT32, 0, NULL, NULL);
  CHECK(rc == 0 && same(get(b, n), ramp(n, 8)), "gather", "rc %s", tdist_err_name(rc));
  put(a, ramp(n, 9));
  rc = tdist_scatter(g, a, b, n, TDIST_FLOAT32, 0, NULL, NULL);
  CHECK(rc == 0 && same(get(b, n), ramp(n, 9)), "scatter", "rc %s", tdist_err_name(rc));
  put(a, ramp(n, 10));
  rc = tdist_reduce_scatter(g, a, b, n, TDIST_FLOAT32, TDIST_SUM, NULL, NULL);
  CHECK(rc == 0 && same(get(b, n), ramp(n, 10)), "reduce_scatter", "rc %s", tdist_err_name(rc));
  put(a, ramp(n, 11));
  rc = tdist_all_to_all(g, a, b, n, TDIST_FLOAT32, NULL, NULL);
  CHECK(rc == 0 && same(get(b, n), ramp(n, 11)), "all_to_all", "rc %s", tdist_err_name(rc));
  rc = tdist_barrier(g, NULL, NULL);
  CHECK(rc == 0, "barrier", "rc %s", tdist_err_name(rc));
  // Self send/recv in one batch (would deadlock as two separate ops).
  put(a, ramp(n, 12));
  CUDA(cudaMemset(b, 0, n * sizeof(float)));
  tdist_p2p_op_t p[2] = {};
  p[0].kind = TDIST_P2P_SEND;
  p[0].buf = a;
  p[0].count = n;
  p[0].dtype = TDIST_FLOAT32;
  p[0].peer = 0;
  p[1] = p[0];
  p[1].kind = TDIST_P2P_RECV;
  p[1].buf = b;
  rc = tdist_batch_isend_irecv(g, p, 2, NULL, &w);
  rc = rc ? rc : tdist_work_wait(w, 10000);
  CHECK(rc == 0 && same(get(b, n), ramp(n, 12)), "batch self send/recv", "rc %s",
        tdist_err_name(rc));
  tdist_work_release(w);
  cudaFree(a);
  cudaFree(b);
}

static void split_one(tdist_group_t *g) {
  int me = 0;
  tdist_group_t *sub = NULL;
  int rc = tdist_new_group(g, &me, 1, NULL, &sub);
  const size_t n = 256;
  float *a = dev(n);
  put(a, ramp(n, 20));
  if (rc == 0) rc = tdist_all_reduce(sub, a, a, n, TDIST_FLOAT32, TDIST_SUM, NULL, NULL);
  CHECK(rc == 0 && same(get(a, n), ramp(n, 20)), "split 1-to-1 + all_reduce", "rc %s",
        tdist_err_name(rc));
  if (sub) CHECK(tdist_group_destroy(sub) == 0, "split destroy", "destroy failed");
  cudaFree(a);
}

static void stream_wait(tdist_group_t *g) {
  const size_t n = 1 << 20;
  float *a = dev(n), *y = dev(n);
  cudaStream_t s1, s2;
  CUDA(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CUDA(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  // Produced on s1 right before the call: the op must wait for it.
  fill<<<(n + 255) / 256, 256, 0, s1>>>(a, n, 1.0f);
  tdist_op_opts_t o = {};
  o.mask = TDIST_OP_FIELD_STREAM;
  o.stream = s1;
  tdist_work_t *w = NULL;
  int rc = tdist_all_reduce(g, a, a, n, TDIST_FLOAT32, TDIST_SUM, &o, &w);
  if (rc == 0) rc = tdist_work_wait_stream(w, s2); // host does not block
  twice<<<(n + 255) / 256, 256, 0, s2>>>(a, y, n);
  CUDA(cudaStreamSynchronize(s2));
  std::vector<float> want = ramp(n, 1);
  for (float &x : want)
    x *= 2;
  CHECK(rc == 0 && same(get(y, n), want), "wait_stream then kernel", "rc %s", tdist_err_name(rc));
  tdist_work_wait(w, 10000);
  tdist_work_release(w);
  cudaStreamDestroy(s1);
  cudaStreamDestroy(s2);
  cudaFree(a);
  cudaFree(y);
}

static void overlap(tdist_group_t *g) {
  cudaStream_t compute, comm;
  CUDA(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  CUDA(cudaStreamCreateWithFlags(&comm, cudaStreamNonBlocking));
  const size_t n = 1 << 16;
  float *a = dev(n);
  put(a, ramp(n, 1));
  int clk = 0;
  CUDA(cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, 0)); // kHz
  busy<<<1, 1, 0, compute>>>((long long)clk * 200);            // ~200 ms
  tdist_op_opts_t o = {};
  o.mask = TDIST_OP_FIELD_STREAM;
  o.stream = comm;
  tdist_work_t *w = NULL;
  int rc = tdist_all_reduce(g, a, a, n, TDIST_FLOAT32, TDIST_SUM, &o, &w);
  if (rc == 0) rc = tdist_work_wait(w, 10000);
  bool still_busy = cudaStreamQuery(compute) == cudaErrorNotReady;
  CHECK(rc == 0 && still_busy, "all_reduce completes while a compute kernel runs",
        "rc %s, compute kernel %s", tdist_err_name(rc), still_busy ? "busy" : "already done");
  CUDA(cudaStreamSynchronize(compute));
  tdist_work_release(w);
  cudaStreamDestroy(compute);
  cudaStreamDestroy(comm);
  cudaFree(a);
}

// Last: the group ends aborted. The spinning kernel holds the op's NCCL
// kernel on the stream, and ncclCommAbort waits for that kernel (commReclaim
// synchronises the communicator's work): the abort returns only once the flag
// is released below. So the timed-out op is published at the hold's deadline
// (TDIST_ABORT_RELEASE_MS, set to 2000 by main; by default the group's
// timeout, 30 s here), with the note that the device had not let go of its
// buffers. On the H200 with the default the 20 s wait returned IN_PROGRESS.
static void timeout_abort(tdist_group_t *g) {
  int *flag_h, *flag_d;
  CUDA(cudaHostAlloc(&flag_h, sizeof(int), cudaHostAllocMapped));
  *flag_h = 0;
  CUDA(cudaHostGetDevicePointer(&flag_d, flag_h, 0));
  cudaStream_t s;
  CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const size_t n = 1024;
  float *a = dev(n);
  spin_on<<<1, 1, 0, s>>>(flag_d); // holds s: the op's start event never fires
  tdist_op_opts_t o = {};
  o.mask = TDIST_OP_FIELD_STREAM | TDIST_OP_FIELD_TIMEOUT;
  o.stream = s;
  o.timeout_ms = 500;
  tdist_work_t *w = NULL, *w2 = NULL;
  int rc = tdist_all_reduce(g, a, a, n, TDIST_FLOAT32, TDIST_SUM, &o, &w);
  int rc2 = tdist_all_reduce(g, a, a, n, TDIST_FLOAT32, TDIST_SUM, NULL, &w2);
  int st = rc ? rc : tdist_work_wait(w, 20000);
  int st2 = rc2 ? rc2 : tdist_work_wait(w2, 20000);
  CHECK(st == TDIST_ERR_TIMEOUT && tdist_work_state(w) == TDIST_WORK_TIMED_OUT,
        "spinning kernel -> op TIMEOUT", "status %s: %s", tdist_err_name(st),
        w ? tdist_work_error_message(w) : "");
  CHECK(w && strstr(tdist_work_error_message(w), "had not stopped using the buffers"),
        "published at the hold's deadline, saying the device still held the buffers", "%s",
        w ? tdist_work_error_message(w) : "");
  CHECK(st2 == TDIST_ERR_ABORTED, "queued op behind it -> ABORTED", "status %s",
        tdist_err_name(st2));
  CHECK(tdist_group_is_aborted(g), "group aborted (ncclCommAbort ran)", "not aborted");
  rc = tdist_all_reduce(g, a, a, n, TDIST_FLOAT32, TDIST_SUM, NULL, NULL);
  CHECK(rc == TDIST_ERR_ABORTED, "later op refused", "rc %s", tdist_err_name(rc));
  *(volatile int *)flag_h = 1; // release the kernel
  CUDA(cudaStreamSynchronize(s));
  tdist_work_release(w);
  tdist_work_release(w2);
  cudaStreamDestroy(s);
  cudaFree(a);
  cudaFreeHost(flag_h);
}

static int run_one(int port) {
  tdist_group_t *g = NULL;
  int rc = init_world(0, 1, port, 30000, &g);
  CHECK(rc == 0, "init world size 1", "rc %s", tdist_err_name(rc));
  if (rc) return failures;
  every_op(g);
  split_one(g);
  stream_wait(g);
  overlap(g);
  timeout_abort(g);
  tdist_group_destroy(g);
  return failures;
}

static int run_two(int rank, int port) {
  tdist_group_t *g = NULL;
  int rc = init_world(rank, 2, port, 60000, &g);
  CHECK(rc == 0, "init world size 2 on one GPU", "rc %s", tdist_err_name(rc));
  if (rc) return failures;
  const size_t n = 4096;
  float *a = dev(n), *b = dev(2 * n);
  put(a, ramp(n, (float)rank));
  rc = tdist_all_reduce(g, a, a, n, TDIST_FLOAT32, TDIST_SUM, NULL, NULL);
  std::vector<float> want(n);
  for (size_t i = 0; i < n; i++)
    want[i] = 1.0f + 2.0f * (float)i;
  CHECK(rc == 0 && same(get(a, n), want), "2-rank all_reduce", "rc %s", tdist_err_name(rc));
  put(a, ramp(n, 100.0f * (float)rank));
  rc = tdist_all_gather(g, a, b, n, TDIST_FLOAT32, NULL, NULL);
  std::vector<float> wg = ramp(n, 0);
  std::vector<float> w1 = ramp(n, 100);
  wg.insert(wg.end(), w1.begin(), w1.end());
  CHECK(rc == 0 && same(get(b, 2 * n), wg), "2-rank all_gather", "rc %s", tdist_err_name(rc));
  tdist_group_destroy(g);
  cudaFree(a);
  cudaFree(b);
  return failures;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  printf("tdist %s\n", tdist_version_string());
  setenv("TDIST_ABORT_RELEASE_MS", "2000", 0); // timeout_abort: read once, at the first hold
  if (argc >= 3 && strcmp(argv[1], "one") == 0) return run_one(atoi(argv[2]));
  if (argc >= 4 && strcmp(argv[1], "two") == 0) return run_two(atoi(argv[2]), atoi(argv[3]));
  fprintf(stderr, "usage: %s one PORT | two RANK PORT\n", argv[0]);
  return 2;
}
