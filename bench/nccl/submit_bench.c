/*
 * submit_bench.c - what tdist's NCCL backend costs a caller per op, beside a raw side that
 * does the same work by hand through the same CUDA runtime and NCCL:
 *
 *   tdist_bench_submit_sim [-c COUNT] [-b BATCH] [-T SECONDS] [-P] [-t TAG]   (simulated GPU)
 *   tdist_bench_submit_gpu [...]                                              (a real GPU)
 *
 * One process, device 0, all_reduce (sum, in place) of COUNT float32 (default 256):
 *
 *   tdist  tdist_all_reduce on a world-size-1 group of backend "nccl", with the caller's
 *          stream in the op's options;
 *   raw    what the backend does for that op (src/nccl/nccl_ops.c, enqueue_locked), by
 *          hand: cudaEventRecord(start, caller stream); cudaStreamWaitEvent(NCCL stream,
 *          start); ncclAllReduce on a communicator of the same blocking mode as tdist's
 *          (config.blocking = 0: an ncclInProgress answer is polled with
 *          ncclCommGetAsyncError until ncclSuccess, as the backend does); cudaEventRecord(end,
 *          NCCL stream). It leaves out what only tdist does: the work handle, the group
 *          lock, the progress thread's wake-up host function, the flight recorder.
 *
 * Two measures, in rounds that alternate between the sides (so both see the same machine):
 *
 *   submit      CPU time of one call, call to return, BATCH ops (default 64) back to back;
 *               then the round waits for them all.
 *   completion  one op in flight: time from the call's return until the caller sees it
 *               complete, spinning on cudaEventQuery(end) (raw) or
 *               tdist_work_is_completed (tdist, "poll"), or blocked in tdist_work_wait
 *               (tdist, "wait").
 *
 * Output: a table (p50, p90, p99, mean in us, per side) and the difference tdist - raw of
 * the means and medians; with -P, lines in the format of ../shared/peers instead:
 *
 *   peer=TAG op=submit_{raw,tdist,added} n=1 bytes=B us=MEAN algbw=0 busbw=0 p50_us=P50
 *     iters=SAMPLES p90_us=P90 p99_us=P99
 *   peer=TAG op=complete_{raw,poll,wait,added} ... (the same fields)
 *
 * ("added": tdist minus raw, mean and median; n is the world size.) On the simulated GPU the
 * numbers are the host-side costs of the two paths through the simulation, not a GPU's:
 * use them to compare the sides, and the _gpu build on a GPU for absolute values. -T is the
 * time per measure, both sides together (default 2 s).
 *
 * Built against the prototypes of src/gpusim/api.h (the CUDA runtime and NCCL ABI the
 * backend loads), so one source links with libtdist_gpusim.so (_sim) or with the CUDA
 * runtime and libnccl.so.2 (_gpu, no nccl.h needed). The _sim build defaults
 * TDIST_NCCL_LIBRARY / TDIST_CUDART_LIBRARY to the simulation it is linked with; the _gpu
 * build needs them to name the files it loaded (tests/gpu/run.sh sets them).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gpusim/api.h"
#include "tdist/tdist.h"

/* The backend (src/nccl/nccl_comm.c): a strong reference pulls its objects out of the
 * static library. */
struct tdist_backend;
extern const struct tdist_backend tdist__nccl_backend;
__attribute__((used)) static const void *const nccl_backend_ref = &tdist__nccl_backend;

#define MAXBATCH 1024

#define DIE(...)                                   \
  do {                                             \
    fprintf(stderr, "submit_bench: " __VA_ARGS__); \
    fputc('\n', stderr);                           \
    exit(1);                                       \
  } while (0)
#define CU(call)                                                               \
  do {                                                                         \
    cudaError_t e__ = (call);                                                  \
    if (e__ != cudaSuccess)                                                    \
      DIE("%s:%d: %s = %s", __FILE__, __LINE__, #call, cudaGetErrorName(e__)); \
  } while (0)
#define TD(call)                                                                  \
  do {                                                                            \
    int rc__ = (call);                                                            \
    if (rc__ != 0)                                                                \
      DIE("%s:%d: %s = %s (%s)", __FILE__, __LINE__, #call, tdist_err_name(rc__), \
          tdist_last_error());                                                    \
  } while (0)

static inline int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ---- samples ----------------------------------------------------------------------------- */
typedef struct {
  double *v;
  size_t n, cap;
} samples_t;

static void add(samples_t *s, double us) {
  if (s->n == s->cap) {
    s->cap = s->cap ? 2 * s->cap : 4096;
    s->v = realloc(s->v, s->cap * sizeof(double));
    if (!s->v) DIE("out of memory");
  }
  s->v[s->n++] = us;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

typedef struct {
  double p50, p90, p99, mean;
  size_t n;
} stats_t;

static stats_t stats(samples_t *s) {
  stats_t r = {0};
  if (!s->n) return r;
  qsort(s->v, s->n, sizeof(double), cmp_double);
  double sum = 0;
  for (size_t i = 0; i < s->n; i++)
    sum += s->v[i];
  r.n = s->n;
  r.mean = sum / (double)s->n;
  r.p50 = s->v[s->n / 2];
  r.p90 = s->v[(size_t)((double)s->n * 0.90)];
  r.p99 = s->v[(size_t)((double)s->n * 0.99)];
  return r;
}

/* ---- the raw side ------------------------------------------------------------------------ */
typedef struct {
  ncclComm_t comm;
  cudaStream_t ns;           /* the NCCL stream (the backend's nc->stream) */
  cudaEvent_t start;         /* one, reused (the backend's nc->start_ev) */
  cudaEvent_t end[MAXBATCH]; /* one per op in flight (the backend's pool) */
} raw_t;

/* The backend's sleep between two ncclInProgress polls (TDIST_NCCL_POLL_SLEEP_US, 20 us
 * by default: src/nccl/nccl_state.c), read the same way, so both sides poll alike. */
static long g_poll_sleep_ns = 20000;

/* ncclInProgress: poll until the non-blocking communicator is ready (the backend's
 * tdist__nccl_wait_ready, without its deadline and abort checks). */
static void nccl_ready(ncclComm_t comm, ncclResult_t r, const char *what) {
  for (;;) {
    ncclResult_t st = ncclInProgress;
    if (r != ncclInProgress) break;
    if (ncclCommGetAsyncError(comm, &st) != ncclSuccess) DIE("%s: ncclCommGetAsyncError", what);
    r = st;
    if (r == ncclInProgress && g_poll_sleep_ns > 0) {
      struct timespec ts = {0, g_poll_sleep_ns};
      nanosleep(&ts, NULL);
    }
  }
  if (r != ncclSuccess) DIE("%s: %s", what, ncclGetErrorString(r));
}

static void raw_init(raw_t *rw, int batch) {
  ncclUniqueId id;
  if (ncclGetUniqueId(&id) != ncclSuccess) DIE("ncclGetUniqueId");
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0; /* as the backend's communicators (src/nccl/nccl_comm.c) */
  cfg.commName = "raw";
  rw->comm = NULL;
  ncclResult_t r = ncclCommInitRankConfig(&rw->comm, 1, id, 0, &cfg);
  if (r != ncclSuccess && r != ncclInProgress)
    DIE("ncclCommInitRankConfig: %s", ncclGetErrorString(r));
  nccl_ready(rw->comm, r, "ncclCommInitRankConfig");
  CU(cudaStreamCreateWithFlags(&rw->ns, cudaStreamNonBlocking));
  CU(cudaEventCreateWithFlags(&rw->start, cudaEventDisableTiming));
  for (int i = 0; i < batch; i++)
    CU(cudaEventCreateWithFlags(&rw->end[i], cudaEventDisableTiming));
}

/* One op, as enqueue_locked does it. */
static inline void raw_op(raw_t *rw, float *buf, size_t count, cudaStream_t user, int slot) {
  CU(cudaEventRecord(rw->start, user));
  CU(cudaStreamWaitEvent(rw->ns, rw->start, 0));
  ncclResult_t r = ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, rw->comm, rw->ns);
  if (r != ncclSuccess) nccl_ready(rw->comm, r, "ncclAllReduce");
  CU(cudaEventRecord(rw->end[slot], rw->ns));
}

static void raw_fini(raw_t *rw, int batch) {
  CU(cudaStreamSynchronize(rw->ns));
  for (int i = 0; i < batch; i++)
    cudaEventDestroy(rw->end[i]);
  cudaEventDestroy(rw->start);
  cudaStreamDestroy(rw->ns);
  ncclCommDestroy(rw->comm);
}

/* ---- output ------------------------------------------------------------------------------ */
static int g_peers;
static char g_tag[48] = "tdist-submit-sim";
static size_t g_bytes;

static void row(const char *op, const char *what, stats_t s) {
  if (g_peers)
    printf("peer=%s op=%s n=1 bytes=%zu us=%.3f algbw=0 busbw=0 p50_us=%.3f iters=%zu "
           "p90_us=%.3f p99_us=%.3f\n",
           g_tag, op, g_bytes, s.mean, s.p50, s.n, s.p90, s.p99);
  else
    printf("%-15s %-46s %8zu %9.2f %9.2f %9.2f %9.2f\n", op, what, s.n, s.p50, s.p90, s.p99,
           s.mean);
}

/* tdist minus raw: the means and the medians (no percentiles of a difference). */
static void added(const char *op, stats_t td, stats_t raw) {
  if (g_peers)
    printf("peer=%s op=%s n=1 bytes=%zu us=%.3f algbw=0 busbw=0 p50_us=%.3f iters=%zu\n", g_tag, op,
           g_bytes, td.mean - raw.mean, td.p50 - raw.p50, td.n < raw.n ? td.n : raw.n);
  else
    printf("%-15s %-46s %8s %9.2f %9s %9s %9.2f\n", op, "tdist - raw", "", td.p50 - raw.p50, "", "",
           td.mean - raw.mean);
}

static void usage(void) {
  fprintf(stderr,
          "usage: tdist_bench_submit_{sim,gpu} [-c COUNT] [-b BATCH (1..%d)] "
          "[-T SECONDS] [-P] [-t TAG]\n",
          MAXBATCH);
  exit(2);
}

int main(int argc, char **argv) {
  size_t count = 256;
  int batch = 64, opt;
  double budget_s = 2.0;
  while ((opt = getopt(argc, argv, "c:b:T:Pt:")) != -1) {
    switch (opt) {
    case 'c': count = strtoul(optarg, NULL, 10); break;
    case 'b': batch = atoi(optarg); break;
    case 'T': budget_s = atof(optarg); break;
    case 'P': g_peers = 1; break;
    case 't': snprintf(g_tag, sizeof(g_tag), "%s", optarg); break;
    default: usage();
    }
  }
  if (count == 0 || batch < 1 || batch > MAXBATCH || !(budget_s > 0)) usage();
  g_bytes = count * sizeof(float);
  /* Before any tdist call (settings are read once): the simulation this program is linked
   * with, unless the environment names other libraries; the store in this process. */
#ifdef SUBMIT_GPUSIM_PATH
  setenv("TDIST_NCCL_LIBRARY", SUBMIT_GPUSIM_PATH, 0);
  setenv("TDIST_CUDART_LIBRARY", SUBMIT_GPUSIM_PATH, 0);
#endif
  setenv("TDIST_STORE_IN_PROCESS", "1", 0);
  const char *ps = getenv("TDIST_NCCL_POLL_SLEEP_US");
  if (ps && *ps) g_poll_sleep_ns = atol(ps) * 1000;

  CU(cudaSetDevice(0));
  float *buf_raw, *buf_td;
  CU(cudaMalloc((void **)&buf_raw, g_bytes));
  CU(cudaMalloc((void **)&buf_td, g_bytes));
  CU(cudaMemset(buf_raw, 0, g_bytes));
  CU(cudaMemset(buf_td, 0, g_bytes));
  cudaStream_t user; /* the caller's stream, the same for both sides */
  CU(cudaStreamCreateWithFlags(&user, cudaStreamNonBlocking));

  raw_t rw;
  raw_init(&rw, batch);

  char dir[] = "/tmp/tdist_submit_XXXXXX", url[96];
  if (!mkdtemp(dir)) DIE("mkdtemp: %s", strerror(errno));
  snprintf(url, sizeof(url), "file://%s/store", dir);
  tdist_init_opts_t io = {0};
  io.mask = TDIST_INIT_FIELD_BACKEND | TDIST_INIT_FIELD_INIT_METHOD | TDIST_INIT_FIELD_RANK |
            TDIST_INIT_FIELD_WORLD_SIZE | TDIST_INIT_FIELD_TIMEOUT | TDIST_INIT_FIELD_DEVICE;
  io.backend = "nccl";
  io.init_method = url;
  io.rank = 0;
  io.world_size = 1;
  io.timeout_ms = 60000;
  io.device = 0;
  tdist_group_t *g = NULL;
  TD(tdist_init_process_group(&io, &g));
  tdist_op_opts_t oo = {0};
  oo.mask = TDIST_OP_FIELD_STREAM;
  oo.stream = user;
  tdist_work_t *ws[MAXBATCH];

  /* Warm up both (the first ops connect the communicators). */
  for (int i = 0; i < 50; i++) {
    raw_op(&rw, buf_raw, count, user, 0);
    TD(tdist_all_reduce(g, buf_td, buf_td, count, TDIST_FLOAT32, TDIST_SUM, &oo, NULL));
  }
  CU(cudaStreamSynchronize(rw.ns));

  samples_t sub_raw = {0}, sub_td = {0}, cmp_raw = {0}, cmp_poll = {0}, cmp_wait = {0};
  /* submit: rounds of `batch` ops, raw and tdist in turn */
  int64_t t_end = now_ns() + (int64_t)(budget_s * 1e9);
  for (int round = 0; round < 4 || now_ns() < t_end; round++) {
    for (int i = 0; i < batch; i++) {
      int64_t t0 = now_ns();
      raw_op(&rw, buf_raw, count, user, i);
      add(&sub_raw, (double)(now_ns() - t0) / 1e3);
    }
    CU(cudaStreamSynchronize(rw.ns));
    for (int i = 0; i < batch; i++) {
      int64_t t0 = now_ns();
      TD(tdist_all_reduce(g, buf_td, buf_td, count, TDIST_FLOAT32, TDIST_SUM, &oo, &ws[i]));
      add(&sub_td, (double)(now_ns() - t0) / 1e3);
    }
    TD(tdist_wait_all(ws, (size_t)batch, 0));
    for (int i = 0; i < batch; i++)
      tdist_work_release(ws[i]);
  }
  /* completion: one op in flight, raw / poll / wait in turn */
  t_end = now_ns() + (int64_t)(budget_s * 1e9);
  for (int round = 0; round < 20 || now_ns() < t_end; round++) {
    raw_op(&rw, buf_raw, count, user, 0);
    int64_t t0 = now_ns();
    cudaError_t e;
    while ((e = cudaEventQuery(rw.end[0])) == cudaErrorNotReady) {
    }
    if (e != cudaSuccess) DIE("cudaEventQuery: %s", cudaGetErrorName(e));
    add(&cmp_raw, (double)(now_ns() - t0) / 1e3);

    tdist_work_t *w;
    TD(tdist_all_reduce(g, buf_td, buf_td, count, TDIST_FLOAT32, TDIST_SUM, &oo, &w));
    t0 = now_ns();
    while (!tdist_work_is_completed(w)) {
    }
    add(&cmp_poll, (double)(now_ns() - t0) / 1e3);
    TD(tdist_work_wait(w, 0));
    tdist_work_release(w);

    TD(tdist_all_reduce(g, buf_td, buf_td, count, TDIST_FLOAT32, TDIST_SUM, &oo, &w));
    t0 = now_ns();
    TD(tdist_work_wait(w, 0));
    add(&cmp_wait, (double)(now_ns() - t0) / 1e3);
    tdist_work_release(w);
  }

  stats_t sr = stats(&sub_raw), st = stats(&sub_td), cr = stats(&cmp_raw), cp = stats(&cmp_poll),
          cw = stats(&cmp_wait);
  if (!g_peers) {
    int rtv = 0, dv = 0;
    cudaRuntimeGetVersion(&rtv);
    cudaDriverGetVersion(&dv);
    printf("# tdist %s, backend nccl, world size 1, device 0 (CUDA runtime %d, driver %d); "
           "all_reduce of %zu float32 (%zu B); %d ops per submit round; %.1f s per measure\n",
           tdist_version_string(), rtv, dv, count, g_bytes, batch, budget_s);
    printf("%-15s %-46s %8s %9s %9s %9s %9s\n", "op", "what (us)", "samples", "p50", "p90", "p99",
           "mean");
  }
  row("submit_raw", "record start, wait, ncclAllReduce, record end", sr);
  row("submit_tdist", "tdist_all_reduce", st);
  added("submit_added", st, sr);
  row("complete_raw", "cudaEventQuery(end) loop", cr);
  row("complete_poll", "tdist_work_is_completed loop", cp);
  row("complete_wait", "tdist_work_wait", cw);
  added("complete_added", cp, cr);

  TD(tdist_group_destroy(g));
  raw_fini(&rw, batch);
  cudaStreamDestroy(user);
  cudaFree(buf_raw);
  cudaFree(buf_td);
  char path[128];
  snprintf(path, sizeof(path), "%s/store", dir);
  unlink(path);
  rmdir(dir);
  free(sub_raw.v);
  free(sub_td.v);
  free(cmp_raw.v);
  free(cmp_poll.v);
  free(cmp_wait.v);
  return 0;
}
