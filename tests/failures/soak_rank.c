/*
 * soak_rank.c - one rank of a fault soak trial (issue 13; the driver is
 * soak.c, docs/failures-soak.md says what is checked).
 *
 *   soak_rank KIND VICTIM FAULT_IT DELAY_US SIZE_SEED DIR
 *
 * KIND is kill9, stop, exit, skip, callback_crash or abort_exit. The same program runs
 * under tdistrun --no-fail-fast (env://, the launcher hosts the store) and
 * under the driver's fork/exec harness (RANK, WORLD_SIZE, MASTER_ADDR,
 * MASTER_PORT per child; rank 0 hosts the store, or an external tdist-store
 * with TDIST_STORE_HOSTED=1). DIR is the trial's scratch directory: pids,
 * the fault time, the report and shrink markers and the flight-recorder
 * dumps go there.
 *
 * Backend: $TDIST_BACKEND, "cpu" when unset (soak --backend nccl sets
 * "nccl", and TDIST_NCCL_LIBRARY / TDIST_CUDART_LIBRARY to the simulated GPU,
 * libtdist_gpusim.so). On "nccl" every op runs on one device buffer of this
 * rank's device (LOCAL_RANK modulo the device count: the device the backend
 * picks too, each rank its own), allocated once with cudaMalloc; the host
 * array is copied in with cudaMemcpy before each op and the result copied
 * out after it, then checked exactly as on "cpu". The CUDA runtime calls come
 * from the library TDIST_CUDART_LIBRARY names (dlopen: the backend opens the
 * same file, so both share one instance of it), so the program needs no CUDA
 * at build time and runs on a real GPU as well.
 *
 * Every rank runs checked all_reduces (float32 SUM of small integers, exact
 * in any order, compared element by element with the reference): iteration
 * `it` moves a count drawn from SIZE_SEED, below 256 KiB on even iterations
 * (cpu: the TCP path) and from 256 KiB to 8 MiB on odd ones (cpu: the
 * single-copy path). At
 * iteration FAULT_IT the victim, DELAY_US after submitting (before, for
 * skip and callback_crash), does its fault:
 *   kill9           SIGKILLs itself, its op in flight;
 *   stop            SIGSTOPs itself, its op in flight; the lowest survivor
 *                   SIGKILLs (and SIGCONTs) it once every survivor reported
 *                   and shrunk (DIR/shrunk.<rank>);
 *   exit            _exit(0)s, its op in flight, nothing destroyed;
 *   skip            never submits that op, waits until the group is aborted
 *                   (the others' op has a $SOAK_SKIP_TIMEOUT_MS timeout),
 *                   reports what a barrier then says, and joins the shrink;
 *   callback_crash  submits the op with a completion callback
 *                   (tdist_work_on_complete) that calls abort();
 *   abort_exit      aborts the world with tdist_group_abort (reason "soak
 *                   abort_exit by rank V"), its op in flight and the
 *                   others' data unread, destroys it and _exit(0)s: the
 *                   reset case (docs/cpu-backend.md, "Leaving"): the
 *                   survivors must get the cause, not only "rank V left".
 *                   On cpu it first isends 8 MiB to every other rank
 *                   (none receives it), so it leaves owing most of that
 *                   with its ERR queued behind; on odd FAULT_IT over TCP
 *                   (TDIST_CPU_CMA=0 in the victim), else as descriptors.
 * The victim writes the fault time (CLOCK_MONOTONIC, one clock for every
 * process of the host) to DIR/fault_time just before the fault.
 *
 * Survivors (and the skip victim) loop until an op fails (at most FAULT_IT+4
 * iterations), then print one report line, wait (bounded) until every other
 * survivor reported - SIGTERM stays blocked until then, so no survivor
 * is stopped early enough to be the failure a slower one sees - call
 * tdist_group_shrink, run 3 checked all_reduces on the shrunk group and
 * print one shrink line. Lines (each starts "SOAK rank <world rank> "):
 *
 *   SOAK rank R fault KIND it=I delay_us=D inflight=0|1
 *   SOAK rank R wrong_result phase=loop|shrunk it=I count=C elem=E got=G want=W
 *   SOAK rank R report kind=K victim=V code=NAME rc=N fault_it=I failed_it=J
 *        ok_before=M wrong_results=X latency_ms=L seen_ms=E since_submit_ms=S
 *        store_lost=0|1 msg=<the error message, to the end of the line>
 *   SOAK rank R shrink rc=NAME ms=T size=S rank=r layout=ok|bad
 *        allreduce=ok|failed|skipped msg=<shrink or all_reduce error>
 *   SOAK rank R killed stopped victim V
 *   SOAK rank R done destroy_ms=T
 *   SOAK rank R error <what>          (anything else that went wrong)
 *
 * latency_ms is from the victim's fault time to the moment tdist detected
 * the failure here: its world group was aborted (tdist_group_on_abort's
 * callback), whether or not this rank was waiting on an op then; seen_ms to
 * the moment this rank's caller thread saw the error (its wait returned, or
 * a submission was refused), which adds the time it spent in its own loop
 * (filling and checking buffers); both -1 if it has no error.
 * since_submit_ms is from this rank's submission of the failing op.
 * store_lost=1: the victim is rank 0, which serves the store from a thread
 * (TDIST_STORE_IN_PROCESS=1; no launcher, no external store), and dies or
 * stops: nothing can be agreed through the store afterwards, so the shrink
 * is expected to fail (with an error, not a hang).
 *
 * Environment: SOAK_SKIP_TIMEOUT_MS (default 1500), SOAK_SCALE (sanitizer
 * slow-down factor for this program's own bounded waits, default 1), plus
 * the TDIST_* settings the driver gives every process.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "faults.h"
#include "tdist/tdist.h"

enum { K_KILL9, K_STOP, K_EXIT, K_SKIP, K_CRASH, K_ABORTX, K_COUNT };
static const char *const kind_names[K_COUNT] = {"kill9", "stop",           "exit",
                                                "skip",  "callback_crash", "abort_exit"};

#define MAX_RANKS 16
#define SHRUNK_SMALL 1003u            /* floats, TCP path */
#define SHRUNK_LARGE ((1u << 18) + 3) /* floats, just over 1 MiB: single copy */
#define SHRUNK_TINY 2u

static int me = -1, nranks, victim, kind, fault_it, scale = 1;
static long delay_us;
static uint64_t size_seed;
static int64_t skip_timeout_ms = 1500;
static int store_lost;
static char dir[256];

/* ---- backend nccl: the device buffer ------------------------------------------ */

static int nccl;                          /* TDIST_BACKEND=nccl */
static float *dbuf;                       /* device memory of DBUF_FLOATS floats (nccl) */
#define DBUF_FLOATS ((8u << 20) / 4 + 64) /* the largest op: 8 MiB */

/* The CUDA runtime calls this program makes (cudaError_t: int, 0 success;
 * cudaMemcpyKind: 1 host to device, 2 device to host). */
static struct {
  int (*get_device_count)(int *);
  int (*set_device)(int);
  int (*malloc_)(void **, size_t);
  int (*free_)(void *);
  int (*memcpy_)(void *, const void *, size_t, int);
  const char *(*error_name)(int);
} cu;

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* dlopen TDIST_CUDART_LIBRARY, set this thread's device (the group's:
 * LOCAL_RANK modulo the device count, as the backend picks it) and allocate
 * the buffer. 0, or -1 with an error line said. */
static int cuda_setup(int world_rank) {
  const char *lib = getenv("TDIST_CUDART_LIBRARY");
  if (!lib || !*lib) lib = "libcudart.so";
  void *h = dlopen(lib, RTLD_NOW | RTLD_GLOBAL);
  if (!h) {
    say("SOAK rank %d error dlopen %s: %s\n", world_rank, lib, dlerror());
    return -1;
  }
#define SOAK_SYM(field, name)                                        \
  if (!(*(void **)&cu.field = dlsym(h, name))) {                     \
    say("SOAK rank %d error %s has no %s\n", world_rank, lib, name); \
    return -1;                                                       \
  }
  SOAK_SYM(get_device_count, "cudaGetDeviceCount")
  SOAK_SYM(set_device, "cudaSetDevice")
  SOAK_SYM(malloc_, "cudaMalloc")
  SOAK_SYM(free_, "cudaFree")
  SOAK_SYM(memcpy_, "cudaMemcpy")
  SOAK_SYM(error_name, "cudaGetErrorName")
#undef SOAK_SYM
  int n = 0, e = cu.get_device_count(&n);
  const char *lr = getenv("LOCAL_RANK");
  int dev = lr && n > 0 ? atoi(lr) % n : 0;
  if (e != 0 || n <= 0 || (e = cu.set_device(dev)) != 0 ||
      (e = cu.malloc_((void **)&dbuf, DBUF_FLOATS * sizeof(float))) != 0) {
    say("SOAK rank %d error CUDA setup (%d devices, device %d): %s\n", world_rank, n, dev,
        cu.error_name(e));
    return -1;
  }
  return 0;
}

/* The buffer an op of `count` floats runs on, holding host[0, count): host
 * itself on cpu, the device buffer on nccl. Exits on a CUDA error. */
static float *op_buf(float *host, size_t count) {
  if (!nccl) return host;
  int e = cu.memcpy_(dbuf, host, count * sizeof(float), 1);
  if (e != 0) {
    say("SOAK rank %d error cudaMemcpy to the device (%zu floats): %s\n", me, count,
        cu.error_name(e));
    exit(1);
  }
  return dbuf;
}

/* After a successful op: its result into host[0, count) (nccl). */
static void op_result(float *host, size_t count) {
  if (!nccl) return;
  int e = cu.memcpy_(host, dbuf, count * sizeof(float), 2);
  if (e != 0) {
    say("SOAK rank %d error cudaMemcpy from the device (%zu floats): %s\n", me, count,
        cu.error_name(e));
    exit(1);
  }
}

static int log_rank = -1; /* world rank for DIR/log.<rank>, known before init */
static FILE *log_file;

/* A line on stdout, flushed, and in DIR/log.<rank> too: what the driver
 * shows for a rank whose launcher was killed before it relayed its output. */
static void say(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  fflush(stdout);
  if (!log_file && log_rank >= 0) {
    char path[320];
    snprintf(path, sizeof(path), "%s/log.%d", dir, log_rank);
    log_file = fopen(path, "a");
    if (log_file) setvbuf(log_file, NULL, _IONBF, 0);
  }
  if (log_file) {
    va_start(ap, fmt);
    vfprintf(log_file, fmt, ap);
    va_end(ap);
  }
}

static int64_t mono_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* When tdist aborted the world group here (its abort callback, run once on
 * the progress thread): the moment this rank detected the failure, whether
 * or not the caller's thread was waiting on an op then. */
static _Atomic int64_t t_abort;

static void on_world_abort(tdist_group_t *g, int status, const char *reason, void *arg) {
  (void)g, (void)status, (void)reason, (void)arg;
  atomic_store(&t_abort, mono_us());
}

static void sleep_us(long us) {
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

/* DIR/<name>: numbers shared between ranks (faults.h). */
static void put_num(const char *name, int64_t v) { fault_put_num(dir, name, v); }
static int64_t get_num(const char *name) { return fault_get_num(dir, name); }

static uint64_t splitmix(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Element count of iteration `it`: log-uniform bytes, 8 B .. 256 KiB on even
 * iterations, 256 KiB .. 8 MiB on odd ones; the same on every rank. */
static size_t count_of(int it) {
  uint64_t s = size_seed ^ ((uint64_t)(it + 1) * 0xd1b54a32d192ed03ull);
  unsigned lo = it % 2 ? 18 : 3, hi = it % 2 ? 23 : 18;   /* log2 of bytes */
  unsigned e = lo + (unsigned)(splitmix(&s) % (hi - lo)); /* [2^e, 2^(e+1)) */
  size_t bytes = ((size_t)1 << e) + (size_t)(splitmix(&s) % ((uint64_t)1 << e));
  if (it % 2 && bytes > (8u << 20)) bytes = 8u << 20;
  size_t count = bytes / 4;
  return count < 2 ? 2 : count;
}

/* Input element i of world rank r: a small integer, so sums are exact. */
static float gen(int r, size_t i, int salt) {
  unsigned h = (unsigned)r * 7u + (unsigned)(i % 1000003) * 13u + (unsigned)salt * 5u;
  return (float)((int)(h % 9u) - 4);
}

static int wrong_results;

/* Compare v[0..count) with the sum over the world ranks of g; print the
 * first mismatch. Returns 1 if wrong. */
static int check_sum(tdist_group_t *g, const float *v, size_t count, int salt, const char *phase,
                     int it) {
  int n = tdist_group_size(g), world[MAX_RANKS];
  for (int r = 0; r < n && r < MAX_RANKS; r++)
    world[r] = tdist_group_global_rank(g, r);
  for (size_t i = 0; i < count; i++) {
    float want = 0;
    for (int r = 0; r < n; r++)
      want += gen(world[r], i, salt);
    if (v[i] != want) {
      say("SOAK rank %d wrong_result phase=%s it=%d count=%zu elem=%zu got=%g want=%g\n", me, phase,
          it, count, i, (double)v[i], (double)want);
      wrong_results++;
      return 1;
    }
  }
  return 0;
}

/* One line for a message: newlines become spaces. */
static void one_line(char *dst, size_t cap, const char *src) {
  snprintf(dst, cap, "%s", src ? src : "");
  for (char *p = dst; *p; p++)
    if (*p == '\n' || *p == '\r') *p = ' ';
}

static void unblock_sigterm(void) {
  sigset_t s;
  sigemptyset(&s);
  sigaddset(&s, SIGTERM);
  fflush(stdout);
  pthread_sigmask(SIG_UNBLOCK, &s, NULL); /* a pending SIGTERM ends us here */
}

static int is_reporter(int r) { return kind == K_SKIP || r != victim; }
static int lowest_survivor(void) { return kind == K_SKIP || victim != 0 ? 0 : 1; }

/* Wait (bounded) until every reporter (every rank: all) wrote
 * DIR/<prefix>.<rank>. */
static void wait_all(const char *prefix, int64_t bound_ms, int all) {
  char name[48];
  int64_t t0 = mono_us();
  for (int r = 0; r < nranks; r++) {
    if (!all && !is_reporter(r)) continue;
    snprintf(name, sizeof(name), "%s.%d", prefix, r);
    while (get_num(name) < 0 && mono_us() - t0 < bound_ms * 1000)
      sleep_us(2000);
  }
}

/* ---- the victim's faults ------------------------------------------------------ */

static void fault_line(int inflight) {
  say("SOAK rank %d fault %s it=%d delay_us=%ld inflight=%d\n", me, kind_names[kind], fault_it,
      delay_us, inflight);
  fflush(stdout);
}

#define MAX_OWED 16       /* abort_exit: ranks sent the owed message */
static int fault_fd = -1; /* fault_arm: DIR/fault_time, opened before the fault */

static void crash_cb(tdist_work_t *w, void *arg) {
  (void)w;
  (void)arg;
  fault_stamp(fault_fd, mono_us());
  abort();
}

/* kill9, stop, exit, callback_crash at iteration fault_it; never returns. */
static void die_now(tdist_group_t *g, float *v, size_t count) {
  tdist_work_t *w = NULL;
  v = op_buf(v, count);
  fault_fd = fault_arm(dir, "fault_time");
  if (kind == K_CRASH) {
    sleep_us(delay_us);
    int rc = tdist_all_reduce(g, v, v, count, TDIST_FLOAT32, TDIST_SUM, NULL, &w);
    if (rc != 0) {
      say("SOAK rank %d error callback_crash: all_reduce returned %s: %s\n", me, tdist_err_name(rc),
          tdist_last_error());
      fflush(stdout);
      _exit(3);
    }
    fault_line(!tdist_work_is_completed(w));
    rc = tdist_work_on_complete(w, crash_cb, NULL); /* may abort right here */
    if (rc != 0) {
      say("SOAK rank %d error tdist_work_on_complete returned %s\n", me, tdist_err_name(rc));
      fflush(stdout);
      _exit(3);
    }
    int64_t t0 = mono_us();
    tdist_work_wait(w, 0);
    while (mono_us() - t0 < 20000000LL * scale)
      sleep_us(10000);
    say("SOAK rank %d error the completion callback never ran (status %s)\n", me,
        tdist_err_name(tdist_work_status(w)));
    fflush(stdout);
    _exit(3);
  }
  int rc = tdist_all_reduce(g, v, v, count, TDIST_FLOAT32, TDIST_SUM, NULL, &w);
  if (rc != 0) {
    say("SOAK rank %d error fault op: all_reduce returned %s: %s\n", me, tdist_err_name(rc),
        tdist_last_error());
    fflush(stdout);
    _exit(3);
  }
  sleep_us(delay_us);
  fault_line(!tdist_work_is_completed(w));
  fault_stamp(fault_fd, mono_us());
  switch (kind) {
  case K_KILL9: kill(getpid(), SIGKILL); break;
  case K_STOP:
    raise(SIGSTOP);
    /* Only a SIGCONT without the SIGKILL (a harness bug) gets here. */
    say("SOAK rank %d error continued: nobody killed the stopped victim\n", me);
    fflush(stdout);
    _exit(3);
  case K_EXIT: _exit(0);
  case K_ABORTX: {
    /* On cpu, a large message to every other rank first, which none of
     * them receives: the victim leaves owing most of it (their sockets
     * fill), its ERR queued behind, with their data unread too. */
    enum { OWED_FLOATS = 2u << 20 };
    float *owed = nccl ? NULL : calloc(OWED_FLOATS, sizeof(float));
    tdist_work_t *ow[MAX_OWED] = {0};
    tdist_op_opts_t tag = {.mask = TDIST_OP_FIELD_TAG, .tag = 77};
    for (int r = 0; owed && r < nranks && r < MAX_OWED; r++)
      if (r != me) tdist_isend(g, owed, OWED_FLOATS, TDIST_FLOAT32, r, &tag, &ow[r]);
    char why[64];
    snprintf(why, sizeof(why), "soak abort_exit by rank %d", me);
    tdist_group_abort(g, why);
    tdist_work_wait(w, 0);
    tdist_work_release(w);
    for (int r = 0; r < MAX_OWED; r++)
      if (ow[r]) {
        tdist_work_wait(ow[r], 0);
        tdist_work_release(ow[r]);
      }
    tdist_group_destroy(g); /* leaves: goodbyes, then closes its sockets */
    _exit(0);
  }
  }
  for (;;)
    pause();
}

/* ---- survivors ------------------------------------------------------------------ */

typedef struct {
  int rc;
  char msg[1536];
  int failed_it, ok_before;
  int64_t t_submit, t_seen;
} seen_t;

/* The checked loop until an op fails. */
static void survive_loop(tdist_group_t *g, seen_t *s) {
  s->rc = 0;
  s->failed_it = -1;
  s->ok_before = 0;
  s->msg[0] = '\0';
  int maxit = fault_it + 4;
  for (int it = 0; it < maxit; it++) {
    size_t count = count_of(it);
    float *v = malloc(count * sizeof(float));
    if (!v) {
      say("SOAK rank %d error out of memory\n", me);
      exit(1);
    }
    for (size_t i = 0; i < count; i++)
      v[i] = gen(me, i, it);
    if (me == victim && it == fault_it) {
      /* Fault only once every rank is past init: the soak checks ops, and a
       * rank whose init failed has no group to report on or shrink. */
      wait_all("init", 30000LL * scale, 1);
      if (kind != K_SKIP) die_now(g, v, count);
      free(v);
      sleep_us(delay_us);
      fault_line(0);
      put_num("fault_time", mono_us());
      s->t_submit = mono_us();
      /* Never submit seq fault_it: wait until the group is aborted. */
      int64_t bound = (skip_timeout_ms + 8000) * scale * 1000;
      while (!tdist_group_is_aborted(g) && mono_us() - s->t_submit < bound)
        sleep_us(5000);
      int rc = tdist_barrier(g, NULL, NULL); /* refused: says why the group aborted */
      s->t_seen = mono_us();
      s->rc = rc;
      one_line(s->msg, sizeof(s->msg), rc ? tdist_last_error() : "");
      s->failed_it = it;
      return;
    }
    tdist_op_opts_t o = {.mask = TDIST_OP_FIELD_TIMEOUT, .timeout_ms = skip_timeout_ms};
    int short_op = kind == K_SKIP && it == fault_it;
    tdist_work_t *w = NULL;
    s->t_submit = mono_us();
    float *buf = op_buf(v, count);
    int rc =
        tdist_all_reduce(g, buf, buf, count, TDIST_FLOAT32, TDIST_SUM, short_op ? &o : NULL, &w);
    const char *msg = tdist_last_error();
    if (rc == 0) {
      rc = tdist_work_wait(w, 0);
      msg = tdist_work_error_message(w);
    }
    s->t_seen = mono_us();
    if (rc != 0) {
      s->rc = rc;
      one_line(s->msg, sizeof(s->msg), msg);
      s->failed_it = it;
      tdist_work_release(w);
      free(v); /* complete (failed): the buffer is ours again */
      return;
    }
    tdist_work_release(w);
    op_result(v, count);
    check_sum(g, v, count, it, "loop", it);
    free(v);
    s->ok_before++;
  }
}

/* One checked all_reduce on the shrunk group. 0, or the error. */
static int shrunk_op(tdist_group_t *s, size_t count, int salt, char *err, size_t cap) {
  float *v = malloc(count * sizeof(float));
  if (!v) return snprintf(err, cap, "out of memory"), -1;
  for (size_t i = 0; i < count; i++)
    v[i] = gen(me, i, salt);
  float *buf = op_buf(v, count);
  int rc = tdist_all_reduce(s, buf, buf, count, TDIST_FLOAT32, TDIST_SUM, NULL, NULL);
  if (rc == 0) op_result(v, count);
  if (rc != 0) {
    char m[1024];
    one_line(m, sizeof(m), tdist_last_error());
    snprintf(err, cap, "all_reduce of %zu floats: %s: %s", count, tdist_err_name(rc), m);
  } else if (check_sum(s, v, count, salt, "shrunk", salt)) {
    snprintf(err, cap, "all_reduce of %zu floats: wrong result", count);
    rc = -1;
  }
  free(v);
  return rc;
}

static void shrink_and_go_on(tdist_group_t *g, int aborted) {
  int expect = kind == K_SKIP ? nranks : nranks - 1;
  tdist_group_t *s = NULL;
  char err[1536] = "";
  const char *layout = "bad", *ar = "skipped";
  int64_t t0 = mono_us();
  int rc = aborted ? tdist_group_shrink(g, NULL, &s) : TDIST_ERR_INVALID_STATE;
  double ms = (double)(mono_us() - t0) / 1000.0;
  if (!aborted) snprintf(err, sizeof(err), "not shrunk: the group was never aborted");
  if (rc != 0 && aborted) one_line(err, sizeof(err), tdist_last_error());
  if (rc == 0) {
    int ok = tdist_group_size(s) == expect;
    /* Ranks keep their order: the new rank is the position among survivors. */
    for (int i = 0, r = 0; ok && i < expect; i++, r++) {
      if (expect < nranks && r == victim) r++;
      ok = tdist_group_global_rank(s, i) == r;
      if (r == me) ok = ok && tdist_group_rank(s) == i;
    }
    layout = ok ? "ok" : "bad";
    ar = "ok";
    if (ok) {
      const size_t counts[3] = {SHRUNK_SMALL, SHRUNK_LARGE, SHRUNK_TINY};
      for (int k = 0; k < 3; k++)
        if (shrunk_op(s, counts[k], 100 + k, err, sizeof(err)) != 0) {
          ar = "failed";
          break;
        }
    } else {
      ar = "skipped";
      snprintf(err, sizeof(err), "shrunk group: size %d (expected %d), my rank %d",
               tdist_group_size(s), expect, tdist_group_rank(s));
    }
  }
  say("SOAK rank %d shrink rc=%s ms=%.1f size=%d rank=%d layout=%s allreduce=%s msg=%s\n", me,
      tdist_err_name(rc), ms, rc == 0 ? tdist_group_size(s) : -1,
      rc == 0 ? tdist_group_rank(s) : -1, layout, ar, err);
  fflush(stdout);
  char name[48];
  snprintf(name, sizeof(name), "shrunk.%d", me);
  put_num(name, 1);
  if (kind == K_STOP && me == lowest_survivor()) {
    /* tdist never kills: end the stopped victim, once everyone is past it. */
    wait_all("shrunk", 60000LL * scale, 0);
    snprintf(name, sizeof(name), "pid.%d", victim);
    pid_t pid = (pid_t)get_num(name);
    if (pid > 0) {
      kill(pid, SIGKILL);
      kill(pid, SIGCONT);
      say("SOAK rank %d killed stopped victim %d\n", me, victim);
    } else {
      say("SOAK rank %d error no pid for the stopped victim %d\n", me, victim);
    }
    fflush(stdout);
  }
  if (s) {
    int drc = tdist_group_destroy(s);
    if (drc != 0 && drc != TDIST_ERR_TIMEOUT)
      say("SOAK rank %d error destroying the shrunk group: %s\n", me, tdist_err_name(drc));
  }
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc != 7) {
    fprintf(stderr,
            "usage: soak_rank kill9|stop|exit|skip|callback_crash|abort_exit VICTIM FAULT_IT "
            "DELAY_US SIZE_SEED DIR\n");
    return 2;
  }
  kind = -1;
  for (int k = 0; k < K_COUNT; k++)
    if (!strcmp(argv[1], kind_names[k])) kind = k;
  victim = atoi(argv[2]);
  fault_it = atoi(argv[3]);
  delay_us = atol(argv[4]);
  size_seed = strtoull(argv[5], NULL, 0);
  snprintf(dir, sizeof(dir), "%s", argv[6]);
  if (kind < 0 || fault_it < 0 || delay_us < 0) {
    fprintf(stderr, "soak_rank: bad arguments\n");
    return 2;
  }
  const char *e = getenv("SOAK_SKIP_TIMEOUT_MS");
  if (e && atoll(e) > 0) skip_timeout_ms = atoll(e);
  e = getenv("SOAK_SCALE");
  if (e && atoi(e) > 0) scale = atoi(e);
  char prefix[300];
  snprintf(prefix, sizeof(prefix), "%s/", dir);
  setenv("TDIST_TRACE_PREFIX", prefix, 1);
  /* callback_crash aborts: no core file. */
  struct rlimit nocore = {0, 0};
  setrlimit(RLIMIT_CORE, &nocore);
  /* Blocked before any thread starts, so no tdist thread takes it either. */
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, NULL);
  const char *rank_env = getenv("RANK");
  int world_rank = rank_env ? atoi(rank_env) : -1;
  log_rank = world_rank;
  if (world_rank >= 0) {
    char name[48];
    snprintf(name, sizeof(name), "pid.%d", world_rank);
    put_num(name, getpid()); /* for the stop kill and the driver's hang cleanup */
  }

  const char *backend = getenv("TDIST_BACKEND");
  if (!backend || !*backend) backend = "cpu";
  nccl = !strcmp(backend, "nccl");
  /* The device before init, as a program on a GPU does (cudaSetDevice on
   * the local rank); the backend picks the same one. */
  if (nccl && cuda_setup(world_rank) != 0) return 1;
  /* abort_exit on odd fault iterations: the victim's payloads go over TCP
   * (its peers see single copy disabled too), so what it owes when it
   * leaves is bytes in its queue, not a descriptor (leave.c). */
  if (kind == K_ABORTX && world_rank == victim && (fault_it & 1)) setenv("TDIST_CPU_CMA", "0", 1);

  tdist_group_t *g = NULL;
  tdist_init_opts_t o = {.mask = TDIST_INIT_FIELD_BACKEND, .backend = backend};
  int rc = tdist_init_process_group(&o, &g);
  if (rc) {
    say("SOAK rank %d error init failed: %s: %s\n", world_rank, tdist_err_name(rc),
        tdist_last_error());
    return 1;
  }
  me = tdist_group_rank(g);
  nranks = tdist_group_size(g);
  if (tdist_group_on_abort(g, on_world_abort, NULL)) {
    say("SOAK rank %d error tdist_group_on_abort: %s\n", me, tdist_last_error());
    return 1;
  }
  if (victim < 0 || victim >= nranks || nranks > MAX_RANKS || me != world_rank) {
    say("SOAK rank %d error victim %d / size %d out of range\n", me, victim, nranks);
    return 2;
  }
  char name[48];
  snprintf(name, sizeof(name), "init.%d", me);
  put_num(name, 1);
  const char *hosted = getenv("TDIST_STORE_HOSTED"), *inproc = getenv("TDIST_STORE_IN_PROCESS");
  store_lost = victim == 0 && kind != K_SKIP && !(hosted && atoi(hosted) == 1) && inproc &&
               atoi(inproc) == 1;

  seen_t s;
  survive_loop(g, &s); /* the dying victims do not come back */
  double lat = -1, seen = -1, since = (double)(s.t_seen - s.t_submit) / 1000.0;
  int64_t ft = get_num("fault_time"), ta = atomic_load(&t_abort);
  if (s.rc != 0 && ft > 0) {
    seen = (double)(s.t_seen - ft) / 1000.0;
    lat = (double)((ta > 0 && ta < s.t_seen ? ta : s.t_seen) - ft) / 1000.0;
  }
  if (s.rc == 0) {
    since = -1;
    snprintf(s.msg, sizeof(s.msg), "no op failed in %d iterations", s.ok_before);
  }
  say("SOAK rank %d report kind=%s victim=%d code=%s rc=%d fault_it=%d failed_it=%d "
      "ok_before=%d wrong_results=%d latency_ms=%.1f seen_ms=%.1f since_submit_ms=%.1f "
      "store_lost=%d msg=%s\n",
      me, kind_names[kind], victim, tdist_err_name(s.rc), s.rc, fault_it, s.failed_it, s.ok_before,
      wrong_results, lat, seen, since, store_lost, s.msg);
  fflush(stdout);
  snprintf(name, sizeof(name), "reported.%d", me);
  put_num(name, 1);
  wait_all("reported", 20000LL * scale, 0);
  unblock_sigterm();

  shrink_and_go_on(g, tdist_group_is_aborted(g));
  int64_t t0 = mono_us();
  int drc = tdist_group_destroy(g);
  say("SOAK rank %d done destroy_ms=%.1f (%s)\n", me, (double)(mono_us() - t0) / 1000.0,
      tdist_err_name(drc));
  if (nccl) cu.free_(dbuf);
  return 0;
}
