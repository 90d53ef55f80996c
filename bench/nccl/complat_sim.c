/*
 * complat_sim.c - completion latency of the NCCL backend, measured on the
 * simulated GPU (libtdist_gpusim.so, docs/gpusim.md): the time from an op's
 * end event completing to the caller observing the completion (issue 24).
 *
 *   tdist_bench_complat_sim [-k 1,8,64] [-m query,poll,wait] [-H short,long]
 *                           [-T seconds] [-S short_us] [-L lo_ms,hi_ms]
 *                           [-P] [-t tag] [-s seed]
 *
 * One process, a world of size 1 on backend "nccl" (device 0). A round:
 *
 *   caller stream:    [hold] -> start event (x K)
 *   internal stream:  wait -> allreduce_1 -> [end_1] -> wait -> ... -> allreduce_K -> [end_K]
 *
 * `hold` is a host function (the stand-in for a long kernel) that blocks its
 * stream's worker until the caller releases it; K ops (all_reduce of one
 * float, in place) are submitted on the caller's stream behind it. The
 * instant end_i completes is read from the simulation itself: its stream
 * worker stamps every event record with CLOCK_MONOTONIC as it completes it
 * (struct CUevent_st.time_ns, src/gpusim/stream.h; the end event is the
 * backend's own, complat_peek.c), before any thread can see the record
 * complete. The caller sleeps `hold` (below), releases, and observes each
 * op's completion in launch order (the order they complete in: one stream),
 * stamping CLOCK_MONOTONIC when it sees it:
 *
 *   query  spins on cudaEventQuery(end_i) itself: what torch's
 *          Work::isCompleted does (the floor: the event is seen at once)
 *   poll   spins on tdist_work_is_completed(w_i)
 *   wait   calls tdist_work_wait(w_i, 0)
 *
 * latency_i = observed_i - end_i. The three modes take turns round by
 * round within one run, so they see the same machine. Two hold regimes:
 *
 *   short  the release comes S us (default 200) after the last submit, while
 *          the progress thread still spins after the submissions
 *          (TDIST_POLL_SPIN_US, 2 ms): an op shorter than that
 *   long   the release comes a random 3 to 10 ms (-L) after the last submit,
 *          when the progress thread has backed off to its poll timer (1, 2,
 *          then TDIST_POLL_MAX_MS = 4 ms): any op longer than the spin
 *
 * Output: a table per case (p50, p90, p99, max, mean in us), and with -P one
 * line per case in the format of ../shared/peers (n is the number of ops in
 * flight here; the world has one rank; peers.d/tdist-nccl-sim.sh runs it
 * from peers/run.sh through EXTRA_DIRS):
 *
 *   peer=TAG op=complat_MODE_HOLD n=K bytes=0 us=MEAN algbw=0 busbw=0 p50_us=P50
 *     iters=SAMPLES p90_us=P90 p99_us=P99 max_us=MAX load1=LOADAVG
 *
 * (release -> end event) rows: the simulation's own time from the release
 * to the first end event (its stream workers' wakeups), for reference only.
 *
 * -T is the time per (hold, K) case, all modes together (default 8 s; the
 * whole default run takes about 50 s). TDIST_NCCL_LIBRARY and
 * TDIST_CUDART_LIBRARY default to the libtdist_gpusim.so this program was
 * built with, TDIST_STORE_IN_PROCESS to 1.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_complat_peek.h"
#include "gpusim/api.h"
#include "gpusim/stream.h" /* struct CUevent_st: when a record completed */
#include "tdist/tdist.h"

/* The backend (src/nccl/nccl_comm.c): a strong reference pulls its objects
 * out of the static library. */
struct tdist_backend;
extern const struct tdist_backend tdist__nccl_backend;
__attribute__((used)) static const void *const nccl_backend_ref = &tdist__nccl_backend;

#define MAXK 256
#define MAXSAMPLES (1 << 20)

enum { M_QUERY, M_POLL, M_WAIT, NMODES };
static const char *const kModeName[NMODES] = {"query", "poll", "wait"};
static const char *const kModeWhat[NMODES] = {"cudaEventQuery loop", "tdist_work_is_completed",
                                              "tdist_work_wait"};
enum { H_SHORT, H_LONG, NHOLDS };
static const char *const kHoldName[NHOLDS] = {"short", "long"};

static double g_budget_s = 8.0;
static int g_short_us = 200;
static int g_long_lo_ms = 3, g_long_hi_ms = 10;
static int g_peers = 0;
static char g_tag[48] = "tdist-nccl-sim";

#define DIE(...)                                  \
  do {                                            \
    fprintf(stderr, "complat_sim: " __VA_ARGS__); \
    fputc('\n', stderr);                          \
    exit(1);                                      \
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

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

/* ---- the host functions ------------------------------------------------------------------ */

/* The "kernel" in front of the ops: blocks its stream's worker (no spinning:
 * the machine may have 2 cores) until released. */
typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int open;
} gate_t;

static void hold_fn(void *arg) {
  gate_t *g = arg;
  pthread_mutex_lock(&g->mu);
  while (!g->open)
    pthread_cond_wait(&g->cv, &g->mu);
  pthread_mutex_unlock(&g->mu);
}

/* When the last record of `ev` completed (CLOCK_MONOTONIC ns), 0 if it has
 * not. The simulation stamps every record as its stream's worker completes
 * it, timing disabled or not (stream.c complete_locked: the stamp is taken
 * right after the work in front of the record ended, before the record is
 * visible to cudaEventQuery). Read once the op is complete: the completion
 * was seen through gs_lock and the work's release store after the record
 * was written, and the event is not re-recorded before the next submit. */
static int64_t event_done_ns(cudaEvent_t ev) {
  const struct CUevent_st *e = (const struct CUevent_st *)ev;
  return e->time_gen == e->gen ? e->time_ns : 0;
}

/* ---- samples and percentiles ------------------------------------------------------------- */

typedef struct {
  double *v; /* us */
  size_t n;
} samples_t;

static void add_sample(samples_t *s, double us) {
  if (s->n < MAXSAMPLES) s->v[s->n++] = us;
}

static int cmpd(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of sorted v[0, n). */
static double pct(const double *v, size_t n, double q) {
  if (!n) return 0;
  size_t r = (size_t)(q * (double)n + 0.999999);
  if (r < 1) r = 1;
  if (r > n) r = n;
  return v[r - 1];
}

/* ---- one round ---------------------------------------------------------------------------- */

typedef struct {
  tdist_group_t *g;
  cudaStream_t user; /* the caller's stream (holds the ops) */
  float *buf;        /* one float of device memory */
} ctx_t;

static tdist_work_t *g_w[MAXK];
static cudaEvent_t g_end[MAXK];
static int64_t g_obs[MAXK];

static void sleep_ns(int64_t ns) {
  struct timespec ts = {.tv_sec = ns / 1000000000, .tv_nsec = ns % 1000000000};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* One round of K ops observed in `mode` after holding `hold_ns`; adds K
 * samples to `out` (unless warmup), and the release-to-first-end-event
 * time to `chain`. */
static void round_once(ctx_t *c, int mode, int k, int64_t hold_ns, samples_t *out,
                       samples_t *chain) {
  gate_t gate = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
  CU(cudaLaunchHostFunc(c->user, hold_fn, &gate));
  tdist_op_opts_t o = {.mask = TDIST_OP_FIELD_STREAM, .stream = c->user};
  for (int i = 0; i < k; i++) {
    TD(tdist_all_reduce(c->g, c->buf, c->buf, 1, TDIST_FLOAT32, TDIST_SUM, &o, &g_w[i]));
    g_end[i] = (cudaEvent_t)complat_work_end_event(g_w[i]);
    if (!g_end[i]) DIE("op %d has no end event", i);
  }
  if (tdist_work_is_completed(g_w[0])) DIE("op completed while its stream was held");
  sleep_ns(hold_ns);
  int64_t t_release = now_ns();
  pthread_mutex_lock(&gate.mu);
  gate.open = 1;
  pthread_cond_signal(&gate.cv);
  pthread_mutex_unlock(&gate.mu);
  /* Observe, in launch order (the order they complete in: one stream). */
  switch (mode) {
  case M_QUERY:
    for (int i = 0; i < k; i++) {
      cudaError_t e;
      while ((e = cudaEventQuery(g_end[i])) == cudaErrorNotReady)
        cpu_relax();
      g_obs[i] = now_ns();
      if (e != cudaSuccess) DIE("cudaEventQuery: %s", cudaGetErrorName(e));
    }
    break;
  case M_POLL:
    for (int i = 0; i < k; i++) {
      while (!tdist_work_is_completed(g_w[i]))
        cpu_relax();
      g_obs[i] = now_ns();
    }
    break;
  default:
    for (int i = 0; i < k; i++) {
      int rc = tdist_work_wait(g_w[i], 0);
      g_obs[i] = now_ns();
      if (rc != 0) DIE("tdist_work_wait: %s (%s)", tdist_err_name(rc), tdist_last_error());
    }
  }
  /* Every op done in tdist (query mode observed the events only); then the
   * samples. */
  for (int i = 0; i < k; i++) {
    TD(tdist_work_wait(g_w[i], 0));
    int64_t end = event_done_ns(g_end[i]);
    if (!end) DIE("op %d complete, its end event not", i);
    if (out) add_sample(out, (double)(g_obs[i] - end) / 1e3);
    if (chain && i == 0) add_sample(chain, (double)(end - t_release) / 1e3);
    tdist_work_release(g_w[i]);
  }
}

static int64_t hold_for(int hold) {
  if (hold == H_SHORT) return (int64_t)g_short_us * 1000;
  int64_t lo = (int64_t)g_long_lo_ms * 1000000, hi = (int64_t)g_long_hi_ms * 1000000;
  return lo + (int64_t)((double)(hi - lo) * ((double)rand() / ((double)RAND_MAX + 1.0)));
}

/* The 1-minute load average: the machine may be shared. */
static double load1(void) {
  double l = -1;
  FILE *f = fopen("/proc/loadavg", "r");
  if (f) {
    if (fscanf(f, "%lf", &l) != 1) l = -1;
    fclose(f);
  }
  return l;
}

static void report(int hold, int k, int mode, samples_t *s, size_t rounds) {
  qsort(s->v, s->n, sizeof(double), cmpd);
  double sum = 0;
  for (size_t i = 0; i < s->n; i++)
    sum += s->v[i];
  double mean = s->n ? sum / (double)s->n : 0;
  double p50 = pct(s->v, s->n, 0.50), p90 = pct(s->v, s->n, 0.90), p99 = pct(s->v, s->n, 0.99);
  double mx = s->n ? s->v[s->n - 1] : 0;
  if (g_peers)
    printf("peer=%s op=complat_%s_%s n=%d bytes=0 us=%.2f algbw=0 busbw=0 p50_us=%.2f iters=%zu "
           "p90_us=%.2f p99_us=%.2f max_us=%.2f load1=%.2f\n",
           g_tag, kModeName[mode], kHoldName[hold], k, mean, p50, s->n, p90, p99, mx, load1());
  else
    printf("%-6s %3d  %-24s %6zu %6zu %9.1f %9.1f %9.1f %9.1f %9.1f\n", kHoldName[hold], k,
           kModeWhat[mode], rounds, s->n, p50, p90, p99, mx, mean);
  fflush(stdout);
}

/* ---- main --------------------------------------------------------------------------------- */

static int parse_list(const char *arg, const char *const *names, int nnames, int *on) {
  char buf[128];
  snprintf(buf, sizeof(buf), "%s", arg);
  memset(on, 0, sizeof(int) * (size_t)nnames);
  for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    int found = 0;
    for (int i = 0; i < nnames; i++)
      if (!strcmp(t, names[i])) on[i] = found = 1;
    if (!found) return -1;
  }
  return 0;
}

static void usage(void) {
  fprintf(stderr,
          "usage: tdist_bench_complat_sim [-k 1,8,64] [-m query,poll,wait] [-H short,long]\n"
          "         [-T seconds_per_case] [-S short_us] [-L lo_ms,hi_ms] [-P] [-t tag] "
          "[-s seed]\n");
  exit(2);
}

int main(int argc, char **argv) {
  int ks[16] = {1, 8, 64}, nk = 3;
  int modes[NMODES] = {1, 1, 1}, holds[NHOLDS] = {1, 1};
  unsigned seed = 24;
  int opt;
  while ((opt = getopt(argc, argv, "k:m:H:T:S:L:Pt:s:h")) != -1) {
    switch (opt) {
    case 'k': {
      nk = 0;
      char buf[128];
      snprintf(buf, sizeof(buf), "%s", optarg);
      for (char *save = NULL, *t = strtok_r(buf, ",", &save); t && nk < 16;
           t = strtok_r(NULL, ",", &save)) {
        int v = atoi(t);
        if (v < 1 || v > MAXK) DIE("-k: 1 to %d ops in flight", MAXK);
        ks[nk++] = v;
      }
      break;
    }
    case 'm':
      if (parse_list(optarg, kModeName, NMODES, modes)) usage();
      break;
    case 'H':
      if (parse_list(optarg, kHoldName, NHOLDS, holds)) usage();
      break;
    case 'T': g_budget_s = atof(optarg); break;
    case 'S': g_short_us = atoi(optarg); break;
    case 'L':
      if (sscanf(optarg, "%d,%d", &g_long_lo_ms, &g_long_hi_ms) != 2 || g_long_lo_ms < 0 ||
          g_long_hi_ms < g_long_lo_ms)
        usage();
      break;
    case 'P': g_peers = 1; break;
    case 't': snprintf(g_tag, sizeof(g_tag), "%s", optarg); break;
    case 's': seed = (unsigned)strtoul(optarg, NULL, 10); break;
    default: usage();
    }
  }
  srand(seed);
  /* The simulated device, as the backend should load it (before any tdist
   * call: settings are read once). */
#ifdef COMPLAT_GPUSIM_PATH
  setenv("TDIST_NCCL_LIBRARY", COMPLAT_GPUSIM_PATH, 0);
  setenv("TDIST_CUDART_LIBRARY", COMPLAT_GPUSIM_PATH, 0);
#endif
  setenv("TDIST_STORE_IN_PROCESS", "1", 0);

  CU(cudaSetDevice(0));
  ctx_t c = {0};
  CU(cudaMalloc((void **)&c.buf, sizeof(float)));
  CU(cudaMemset(c.buf, 0, sizeof(float)));
  CU(cudaStreamCreateWithFlags(&c.user, cudaStreamNonBlocking));

  char dir[] = "/tmp/tdist_complat_XXXXXX", url[96];
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
  TD(tdist_init_process_group(&io, &c.g));

  samples_t s[NMODES], chain = {0};
  for (int m = 0; m < NMODES; m++) {
    s[m].v = malloc(sizeof(double) * MAXSAMPLES);
    if (!s[m].v) DIE("out of memory");
  }
  chain.v = malloc(sizeof(double) * MAXSAMPLES);
  if (!chain.v) DIE("out of memory");

  if (!g_peers) {
    printf("# completion latency on the simulated GPU: end event completed -> observed (us)\n");
    printf("# world of 1 (nccl backend on libtdist_gpusim), %ld CPUs, load average %.2f; short "
           "hold %d us, long hold %d-%d ms; %.1f s per case\n",
           sysconf(_SC_NPROCESSORS_ONLN), load1(), g_short_us, g_long_lo_ms, g_long_hi_ms,
           g_budget_s);
    printf("%-6s %3s  %-24s %6s %6s %9s %9s %9s %9s %9s\n", "hold", "K", "observer", "rounds",
           "samples", "p50", "p90", "p99", "max", "mean");
  }
  /* Warm up: the first op connects the communicator. */
  for (int i = 0; i < 3; i++)
    round_once(&c, M_WAIT, 1, 100000, NULL, NULL);

  for (int h = 0; h < NHOLDS; h++) {
    if (!holds[h]) continue;
    for (int ki = 0; ki < nk; ki++) {
      int k = ks[ki];
      for (int m = 0; m < NMODES; m++)
        s[m].n = 0;
      chain.n = 0;
      for (int m = 0; m < NMODES; m++)
        if (modes[m]) round_once(&c, m, k, hold_for(h), NULL, NULL); /* warmup */
      size_t rounds = 0;
      int64_t t_end = now_ns() + (int64_t)(g_budget_s * 1e9);
      /* Modes take turns, round by round; at least 20 rounds each. */
      while (rounds < 20 || now_ns() < t_end) {
        for (int m = 0; m < NMODES; m++)
          if (modes[m]) round_once(&c, m, k, hold_for(h), &s[m], &chain);
        rounds++;
        if ((rounds + 1) * (size_t)k > MAXSAMPLES) break;
      }
      for (int m = 0; m < NMODES; m++)
        if (modes[m]) report(h, k, m, &s[m], rounds);
      if (!g_peers) {
        printf("# load average %.2f\n", load1());
        qsort(chain.v, chain.n, sizeof(double), cmpd);
        printf("%-6s %3d  %-24s %6zu %6zu %9.1f %9.1f %9.1f %9.1f %9s\n", kHoldName[h], k,
               "(release -> end event)", rounds, chain.n, pct(chain.v, chain.n, 0.5),
               pct(chain.v, chain.n, 0.9), pct(chain.v, chain.n, 0.99),
               chain.n ? chain.v[chain.n - 1] : 0.0, "");
      }
    }
  }

  TD(tdist_group_destroy(c.g));
  CU(cudaStreamDestroy(c.user));
  CU(cudaFree(c.buf));
  char path[160];
  snprintf(path, sizeof(path), "%s/store", dir);
  unlink(path);
  rmdir(dir);
  for (int m = 0; m < NMODES; m++)
    free(s[m].v);
  free(chain.v);
  return 0;
}
