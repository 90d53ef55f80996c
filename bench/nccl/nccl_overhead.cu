// nccl_overhead.cu - what tdist adds on top of NCCL for a small all_reduce, on
// one GPU (world size 1), in one program:
//
//   submit   CPU time per op, call to return, ops issued back to back:
//              raw:   ncclAllReduce + cudaEventRecord on a stream
//              tdist: tdist_all_reduce(..., &work) (+ release)
//   latency  one op in flight: time from the call's return until completion
//            is observed by a spinning host thread:
//              raw:   cudaEventQuery(end) == cudaSuccess
//              tdist: tdist_work_is_completed(work) (set by the progress thread)
//            and tdist_work_wait() (spin then sleep) for the same op.
//   idle     CPU time used by the process during 2 s with the group alive and
//            nothing in flight (the progress thread must sleep).
//
// Goal (issue 5): tdist adds < 1 us per op over raw and observes completion
// within 20 us, with no busy core when idle. Compare with torch_allreduce.py.
//
// Usage: tdist_bench_nccl [PORT] [COUNT] [ITERS]
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

#include "tdist/tdist.h"

// Linked against the static library, whose backend registry refers to the
// NCCL backend weakly: this strong reference pulls it into the program.
extern "C" {
struct tdist_backend;
extern const struct tdist_backend tdist__nccl_backend;
}
__attribute__((used)) static const void *const nccl_backend_ref = &tdist__nccl_backend;

#define CUDA(call)                                                                          \
  do {                                                                                      \
    cudaError_t e_ = (call);                                                                \
    if (e_ != cudaSuccess) {                                                                \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      exit(1);                                                                              \
    }                                                                                       \
  } while (0)
#define NCCL(call)                                                                          \
  do {                                                                                      \
    ncclResult_t r_ = (call);                                                               \
    if (r_ != ncclSuccess) {                                                                \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, ncclGetErrorString(r_)); \
      exit(1);                                                                              \
    }                                                                                       \
  } while (0)

static double now_us() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}
static double cpu_ms() {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e3 +
         (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e3;
}
static void report(const char *what, std::vector<double> &v) {
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v)
    sum += x;
  printf("%-34s mean %8.2f us  p50 %8.2f  p99 %8.2f  (n=%zu)\n", what, sum / v.size(),
         v[v.size() / 2], v[(size_t)(v.size() * 0.99)], v.size());
}

int main(int argc, char **argv) {
  int port = argc > 1 ? atoi(argv[1]) : 29533;
  size_t count = argc > 2 ? strtoul(argv[2], NULL, 10) : 256;
  int iters = argc > 3 ? atoi(argv[3]) : 20000;
  const int batch = 256; // ops in flight during the submit test
  CUDA(cudaSetDevice(0));
  float *buf;
  CUDA(cudaMalloc(&buf, count * sizeof(float)));
  CUDA(cudaMemset(buf, 0, count * sizeof(float)));
  printf("tdist %s; all_reduce of %zu float32, %d iterations\n", tdist_version_string(), count,
         iters);

  // ---- raw NCCL ----
  ncclUniqueId id;
  ncclComm_t comm;
  NCCL(ncclGetUniqueId(&id));
  NCCL(ncclCommInitRank(&comm, 1, id, 0));
  cudaStream_t s;
  CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::vector<cudaEvent_t> evs(batch);
  for (auto &e : evs)
    CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  for (int i = 0; i < 1000; i++)
    NCCL(ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, comm, s));
  CUDA(cudaStreamSynchronize(s));
  std::vector<double> raw_submit, raw_lat, td_submit, td_lat, td_wait;
  for (int done = 0; done < iters; done += batch) {
    for (int i = 0; i < batch; i++) {
      double t0 = now_us();
      NCCL(ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, comm, s));
      CUDA(cudaEventRecord(evs[i], s));
      raw_submit.push_back(now_us() - t0);
    }
    CUDA(cudaStreamSynchronize(s));
  }
  for (int i = 0; i < iters / 4; i++) {
    NCCL(ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, comm, s));
    CUDA(cudaEventRecord(evs[0], s));
    double t0 = now_us();
    while (cudaEventQuery(evs[0]) != cudaSuccess) {
    }
    raw_lat.push_back(now_us() - t0);
  }

  // ---- tdist ----
  char url[64];
  snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", port);
  tdist_init_opts_t o = {};
  o.mask = TDIST_INIT_FIELD_BACKEND | TDIST_INIT_FIELD_INIT_METHOD | TDIST_INIT_FIELD_RANK |
           TDIST_INIT_FIELD_WORLD_SIZE | TDIST_INIT_FIELD_HOST_STORE | TDIST_INIT_FIELD_DEVICE;
  o.backend = "nccl";
  o.init_method = url;
  o.rank = 0;
  o.world_size = 1;
  o.host_store = 1;
  o.device = 0;
  tdist_group_t *g = NULL;
  if (tdist_init_process_group(&o, &g) != 0) {
    fprintf(stderr, "tdist init: %s\n", tdist_last_error());
    return 1;
  }
  std::vector<tdist_work_t *> ws(batch);
  for (int i = 0; i < 1000; i++)
    tdist_all_reduce(g, buf, buf, count, TDIST_FLOAT32, TDIST_SUM, NULL, NULL);
  for (int done = 0; done < iters; done += batch) {
    for (int i = 0; i < batch; i++) {
      double t0 = now_us();
      tdist_all_reduce(g, buf, buf, count, TDIST_FLOAT32, TDIST_SUM, NULL, &ws[i]);
      td_submit.push_back(now_us() - t0);
    }
    tdist_wait_all(ws.data(), batch, 0);
    for (auto w : ws)
      tdist_work_release(w);
  }
  for (int i = 0; i < iters / 4; i++) {
    tdist_work_t *w;
    tdist_all_reduce(g, buf, buf, count, TDIST_FLOAT32, TDIST_SUM, NULL, &w);
    double t0 = now_us();
    while (!tdist_work_is_completed(w)) {
    }
    td_lat.push_back(now_us() - t0);
    tdist_work_release(w);
  }
  for (int i = 0; i < iters / 4; i++) {
    tdist_work_t *w;
    tdist_all_reduce(g, buf, buf, count, TDIST_FLOAT32, TDIST_SUM, NULL, &w);
    double t0 = now_us();
    tdist_work_wait(w, 0);
    td_wait.push_back(now_us() - t0);
    tdist_work_release(w);
  }
  double c0 = cpu_ms(), w0 = now_us();
  sleep(2);
  double idle_cpu = cpu_ms() - c0, idle_wall = (now_us() - w0) / 1e3;

  report("raw   submit (AllReduce+Record)", raw_submit);
  report("tdist submit (tdist_all_reduce)", td_submit);
  report("raw   completion seen (EventQuery)", raw_lat);
  report("tdist completion seen (is_completed)", td_lat);
  report("tdist tdist_work_wait", td_wait);
  double rs = 0, ts = 0, rl = 0, tl = 0;
  for (double x : raw_submit)
    rs += x;
  for (double x : td_submit)
    ts += x;
  for (double x : raw_lat)
    rl += x;
  for (double x : td_lat)
    tl += x;
  printf("added per op (mean submit): %.2f us  [goal < 1 us]\n",
         ts / td_submit.size() - rs / raw_submit.size());
  printf("added completion latency (mean): %.2f us  [goal < 20 us]\n",
         tl / td_lat.size() - rl / raw_lat.size());
  printf("idle: %.1f ms CPU over %.0f ms wall (%.2f%% of a core)\n", idle_cpu, idle_wall,
         100.0 * idle_cpu / idle_wall);
  tdist_group_destroy(g);
  for (auto &e : evs)
    cudaEventDestroy(e);
  cudaStreamDestroy(s);
  ncclCommDestroy(comm);
  cudaFree(buf);
  return 0;
}
