/*
 * soak.c - fault soak (issue 13): random fault trials over real processes,
 * each checked from the outside. docs/failures-soak.md has the details.
 *
 *   soak [--trials N | --seconds S] [--seed X] [--no-load]
 *        [--launcher-only | --no-launcher] [--verbose] [--keep]
 *        [--strict-latency] [--strict-store-host] [--store-in-process]
 *        [--kinds K,...] [--backend cpu|nccl] [--nccl-hostid-per-rank] [--help]
 *
 * A trial is a function of its seed: n = 3..5 ranks of soak_rank (backend
 * cpu, or with --backend nccl the NCCL backend on the simulated GPU, each
 * rank on its own device, or on the real NCCL and CUDA runtime that
 * TDIST_NCCL_LIBRARY / TDIST_CUDART_LIBRARY name; 127.0.0.1), one fault
 * kind (kill9, stop, exit, skip, callback_crash, abort_exit),
 * a victim (rank 0 one time in three), the iteration and the delay of the
 * fault (0..1 ms or 0..20 ms after the victim submitted its op), the sizes
 * of the all_reduces (8 B .. 8 MiB) and how the ranks are started:
 *   host0     fork/exec by this driver, rank 0 hosts the store (a process of
 *             its own, or with --store-in-process a thread of rank 0);
 *   extstore  fork/exec, an external tdist-store (TDIST_STORE_HOSTED=1);
 *   tdistrun  tdistrun --no-fail-fast (the launcher hosts the store).
 * Without --trials or --seconds: --seconds SOAK_DEFAULT_SECONDS (the test
 * soak_short: 60, 20 in the sanitizer passes, CMakeLists.txt).
 * The first trial's seed is --seed X (default: from the clock), trial i's is
 * a hash of X and i; `soak --trials 1 --seed <trial seed>` replays a trial.
 * Meanwhile a CPU load runs (stress-ng --cpu 2, else 2 busy-loop children;
 * --no-load turns it off).
 *
 * Every survivor's report (see soak_rank.c) is classified: wrong name (the
 * message does not name the victim, or names a survivor), wrong code, wrong
 * result (any rank, before the failure or on the shrunk group), shrink
 * failure; a trial still running at its guard is killed and counted as a
 * hang. Missing reports, unexpected exit codes and sanitizer reports are
 * "other" problems. Detection latency per kind (when tdist aborted the
 * group on the survivor), and when its caller thread saw the error: p50, p99,
 * max.
 *
 * Last lines:
 *   soak: T trials, W wrong names, C wrong codes, R wrong results, S shrink failures, H hangs
 *   N passed, F failed
 * Exit 0 only when F == 0 and no hang.
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "mp.h"
#include "run_util.h"

#ifndef SOAK_RANK
#error "SOAK_RANK (path of soak_rank) must be defined"
#endif
#ifndef TDISTRUN
#error "TDISTRUN (path of tdistrun) must be defined"
#endif
#ifndef TDIST_STORE_BIN
#error "TDIST_STORE_BIN (path of tdist-store) must be defined"
#endif
/* GPUSIM_LIB: path of libtdist_gpusim.so (undefined when it is not built).
 * With --backend nccl every process of a trial gets TDIST_BACKEND=nccl, and
 * the libraries are chosen once, in main (select_nccl_libs):
 *   - TDIST_NCCL_LIBRARY and TDIST_CUDART_LIBRARY both set in the driver's
 *     environment: the real NCCL and CUDA runtime (tests/gpu/run.sh on a GPU
 *     machine); the ranks inherit them as they are. Each rank takes device
 *     LOCAL_RANK modulo the devices it sees; on one GPU the 3..5 ranks of a
 *     trial need --nccl-hostid-per-rank (below);
 *   - neither set: TDIST_NCCL_LIBRARY and TDIST_CUDART_LIBRARY naming
 *     GPUSIM_LIB (the default: soak_nccl_short); each rank takes device
 *     LOCAL_RANK of the simulation's 8 (TDIST_GPUSIM_DEVICES), one per rank;
 *   - one set without the other, or neither and no GPUSIM_LIB: refused. Every fault kind
 * applies on NCCL as on cpu: a dead or stopped rank is named by the store's
 * death record (the monitor) or the NCCL backend's peer-failure path
 * (ncclRemoteError: the communicator revoked, the grace lets the monitor
 * name the rank), `skip` by the op timeout's diagnosis, and the shrink is
 * ncclCommShrink. */

/* Sanitizer builds run the ranks several times slower. */
#if defined(__SANITIZE_THREAD__)
#define SOAK_SCALE 3
#define SOAK_TSAN 1
#elif defined(__SANITIZE_ADDRESS__)
#define SOAK_SCALE 2
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SOAK_SCALE 3
#define SOAK_TSAN 1
#elif __has_feature(address_sanitizer)
#define SOAK_SCALE 2
#endif
#endif
#ifndef SOAK_SCALE
#define SOAK_SCALE 1
#endif

/* Settings of every process of a trial. */
#define HB_INTERVAL_MS 200
#define HB_TIMEOUT_MS 1500
#define SKIP_TIMEOUT_MS 1500
#ifndef SOAK_DEFAULT_SECONDS
#define SOAK_DEFAULT_SECONDS 60
#endif
#define TIMEOUT_MS (6000 * (SOAK_SCALE > 1 ? 2 : 1)) /* rendezvous, store, group ops */
#define GUARD_S guard_s                              /* a trial still running after it: a hang */

/* Detection bounds (informational unless --strict-latency). */
#define KILL_BOUND_MS 1000.0
#define STOP_BOUND_MS (HB_TIMEOUT_MS + 1000.0)
#define SKIP_BOUND_MS (SKIP_TIMEOUT_MS + 2500.0) /* from the survivor's submission */

#define MAX_N 5

enum { K_KILL9, K_STOP, K_EXIT, K_SKIP, K_CRASH, K_ABORTX, K_COUNT };
static const char *const kind_names[K_COUNT] = {"kill9", "stop",           "exit",
                                                "skip",  "callback_crash", "abort_exit"};
enum { M_HOST0, M_EXTSTORE, M_TDISTRUN, M_COUNT };
static const char *const mode_names[M_COUNT] = {"host0", "extstore", "tdistrun"};

static struct {
  long trials;
  double seconds;
  uint64_t seed;
  int load, launcher; /* launcher: 0 any, 1 only tdistrun, -1 never */
  int verbose, keep, strict_latency, strict_store_host, store_in_process;
  unsigned kinds; /* --kinds: a mask of the fault kinds drawn; 0 = all */
  int nccl;       /* --backend nccl */
  int hostid;     /* --nccl-hostid-per-rank */
} opt = {.load = 1};

/* The libraries of --backend nccl (select_nccl_libs): real (from the
 * environment) or NULL for the simulated GPU. Set once in main. */
static const char *real_nccl_lib;

/* --nccl-hostid-per-rank: every rank process gets its own NCCL_HOSTID, so
 * NCCL takes the ranks sharing one GPU for separate hosts (its socket
 * transport) instead of refusing them as "Duplicate GPU detected". A test
 * mode NCCL does not support (docs/nccl-backend.md); the ranks of a
 * tdistrun trial get it through a /bin/sh that sets it from RANK and execs
 * soak_rank (same pid: the fault paths see the rank process itself). */
#define HOSTID_SH "NCCL_HOSTID=soak-h$RANK; export NCCL_HOSTID; exec \"$0\" \"$@\""

/* 30 s, times the sanitizer scale; $SOAK_GUARD_S overrides (to test the
 * hang path). */
static int guard_s = 30 * SOAK_SCALE;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t splitmix(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* ---- plans ------------------------------------------------------------------------ */

typedef struct {
  uint64_t seed, size_seed;
  int n, kind, victim, mode, fault_it;
  long delay_us;
} plan_t;

static plan_t plan_make(uint64_t seed) {
  plan_t p = {.seed = seed};
  uint64_t s = seed;
  p.n = 3 + (int)(splitmix(&s) % 3);
  p.kind = (int)(splitmix(&s) % K_COUNT);
  while (opt.kinds && !(opt.kinds & (1u << p.kind))) /* the next allowed kind after it */
    p.kind = (p.kind + 1) % K_COUNT;
  p.victim = splitmix(&s) % 3 == 0 ? 0 : 1 + (int)(splitmix(&s) % (uint64_t)(p.n - 1));
  /* abort_exit leaves in order: rank 0 would take the store it hosts along. */
  if (p.kind == K_ABORTX && p.victim == 0) p.victim = 1;
  int m = (int)(splitmix(&s) % 5); /* host0 2/5, extstore 1/5, tdistrun 2/5 */
  p.mode = m < 2 ? M_HOST0 : m < 3 ? M_EXTSTORE : M_TDISTRUN;
  int fork_mode = splitmix(&s) % 3 == 0 ? M_EXTSTORE : M_HOST0;
  if (opt.launcher > 0) p.mode = M_TDISTRUN;
  if (opt.launcher < 0 && p.mode == M_TDISTRUN) p.mode = fork_mode;
  p.fault_it = (int)(splitmix(&s) % 5);
  /* half the time within 1 ms of the submission (the op in flight), else up
   * to 20 ms (often between ops) */
  uint64_t d = splitmix(&s);
  p.delay_us = (long)((d >> 1) % (d & 1 ? 1000 : 20000));
  p.size_seed = splitmix(&s);
  return p;
}

static int dies(const plan_t *p) { return p->kind != K_SKIP; }
static int reporter(const plan_t *p, int r) { return !dies(p) || r != p->victim; }
/* Rank 0 serves the store from a thread and dies or stops: the shrink
 * cannot agree. (A store process of rank 0, the default, outlives it.) */
static int store_lost(const plan_t *p) {
  return opt.store_in_process && p->mode == M_HOST0 && p->victim == 0 && dies(p);
}

/* ---- what the ranks said ------------------------------------------------------------ */

typedef struct {
  int report, shrink, done, fault, inflight, killed_victim, wrong, errors;
  int rc, failed_it, ok_before, shrink_size, layout_ok;
  double latency, seen, since, shrink_ms;
  char code[48], shrink_code[48], allreduce[16];
  char msg[1600], shrink_msg[1600], error[400];
} obs_t;

/* Value of "key=" in line [l, end): copied up to the next space (or, for
 * msg=, to the end of the line). 1 if found. */
static int field(const char *l, const char *end, const char *key, char *out, size_t cap) {
  size_t kl = strlen(key);
  for (const char *p = l; p + kl <= end; p++) {
    if ((p == l || p[-1] == ' ') && !strncmp(p, key, kl)) {
      p += kl;
      const char *e = p;
      if (strcmp(key, "msg=") != 0)
        while (e < end && *e != ' ')
          e++;
      else
        e = end;
      size_t n = (size_t)(e - p) < cap - 1 ? (size_t)(e - p) : cap - 1;
      memcpy(out, p, n);
      out[n] = '\0';
      return 1;
    }
  }
  return 0;
}

static double fnum(const char *l, const char *end, const char *key, double dflt) {
  char v[64];
  return field(l, end, key, v, sizeof(v)) ? atof(v) : dflt;
}

/* Parse every "SOAK rank R ..." line of `out` into obs[R]. */
static void parse(const char *out, obs_t *obs, int n) {
  for (const char *l = out; l && *l;) {
    const char *end = strchr(l, '\n');
    if (!end) end = l + strlen(l);
    const char *s = strstr(l, "SOAK rank ");
    if (s && s < end) {
      char *after;
      long r = strtol(s + 10, &after, 10);
      if (after != s + 10 && r >= 0 && r < n && *after == ' ') {
        obs_t *o = &obs[r];
        const char *w = after + 1;
        if (!strncmp(w, "report ", 7)) {
          o->report++;
          field(w, end, "code=", o->code, sizeof(o->code));
          o->rc = (int)fnum(w, end, "rc=", 0);
          o->failed_it = (int)fnum(w, end, "failed_it=", -1);
          o->ok_before = (int)fnum(w, end, "ok_before=", 0);
          o->latency = fnum(w, end, "latency_ms=", -1);
          o->seen = fnum(w, end, "seen_ms=", -1);
          o->since = fnum(w, end, "since_submit_ms=", -1);
          field(w, end, "msg=", o->msg, sizeof(o->msg));
        } else if (!strncmp(w, "shrink ", 7)) {
          o->shrink++;
          field(w, end, "rc=", o->shrink_code, sizeof(o->shrink_code));
          o->shrink_ms = fnum(w, end, "ms=", -1);
          o->shrink_size = (int)fnum(w, end, "size=", -1);
          char v[16] = "";
          field(w, end, "layout=", v, sizeof(v));
          o->layout_ok = !strcmp(v, "ok");
          field(w, end, "allreduce=", o->allreduce, sizeof(o->allreduce));
          field(w, end, "msg=", o->shrink_msg, sizeof(o->shrink_msg));
        } else if (!strncmp(w, "wrong_result ", 13)) {
          o->wrong++;
        } else if (!strncmp(w, "fault ", 6)) {
          o->fault++;
          o->inflight = (int)fnum(w, end, "inflight=", 0);
        } else if (!strncmp(w, "killed stopped victim", 21)) {
          o->killed_victim++;
        } else if (!strncmp(w, "done ", 5)) {
          o->done++;
        } else if (!strncmp(w, "error ", 6)) {
          if (!o->errors++) {
            size_t k =
                (size_t)(end - w) < sizeof(o->error) - 1 ? (size_t)(end - w) : sizeof(o->error) - 1;
            memcpy(o->error, w, k);
            o->error[k] = '\0';
          }
        }
      }
    }
    l = *end ? end + 1 : end;
  }
}

/* Does msg name world rank r as the failed one ("rank r (world rank r": the
 * CPU backend's "is gone", the monitor's "failed"; group rank == world rank
 * in the world group), not as the member that aborted the group for it? */
static int names_failed(const char *msg, int r) {
  char want[48];
  snprintf(want, sizeof(want), "rank %d (world rank %d", r, r);
  size_t l = strlen(want);
  /* "rank r (world rank r) aborted the group: <cause>" names the member that
   * passed the failure on, not a failed one: only the cause counts. */
  for (const char *p = strstr(msg, want); p; p = strstr(p + l, want))
    if (strncmp(p + l, ") aborted the group", 19) != 0) return 1;
  return 0;
}

/* The ranks a skip diagnosis lists: "rank V of group 'world' had not reached
 * seq" or "ranks a, b of group ...". Sets behind[] and returns how many; -1
 * if the message has no diagnosis. */
static int not_reached(const char *msg, int n, int *behind) {
  const char *h = strstr(msg, " of group 'world' had not reached seq ");
  if (!h) return -1;
  const char *p = h;
  while (p > msg && !(p[0] == 'r' && !strncmp(p, "rank", 4)))
    p--;
  if (strncmp(p, "rank", 4) != 0) return -1;
  p += 4;
  if (*p == 's') p++;
  int k = 0;
  for (int r = 0; r < n; r++)
    behind[r] = 0;
  while (p < h) {
    while (p < h && (*p == ' ' || *p == ','))
      p++;
    if (p >= h) break;
    char *e;
    long r = strtol(p, &e, 10);
    if (e == p) return -1;
    if (r >= 0 && r < n) behind[r] = 1;
    k++;
    p = e;
  }
  return k;
}

/* ---- results --------------------------------------------------------------------------- */

enum { P_NAME, P_CODE, P_RESULT, P_SHRINK, P_HANG, P_OTHER, P_SLOW, P_COUNT };

typedef struct {
  int trials, failed, by_mode[M_COUNT], victim0, store_lost, reports;
  int mid_op, large_op; /* faults with the victim's op in flight; on a >= 256 KiB op */
  int problems[P_COUNT];
  double *lat, *seen; /* detection; seen by the caller thread */
  size_t nlat, cap, nseen, seen_cap;
  char codes[8][48];
  int code_count[8];
} kind_stats_t;

static kind_stats_t stats[K_COUNT];
static int total_problems[P_COUNT];

static void add_sample(double **v, size_t *n, size_t *cap, double x) {
  if (*n == *cap) {
    *cap = *cap ? 2 * *cap : 64;
    *v = realloc(*v, *cap * sizeof(double));
    if (!*v) abort();
  }
  (*v)[(*n)++] = x;
}

static void add_code(kind_stats_t *k, const char *code) {
  for (int i = 0; i < 8; i++) {
    if (!k->codes[i][0]) snprintf(k->codes[i], sizeof(k->codes[i]), "%s", code);
    if (!strcmp(k->codes[i], code)) {
      k->code_count[i]++;
      return;
    }
  }
}

/* The problems of one trial, one line each. */
typedef struct {
  int count[P_COUNT];
  char text[4096];
  size_t len;
} verdict_t;

static void problem(verdict_t *v, int what, const char *fmt, ...) {
  v->count[what]++;
  if (v->len + 8 >= sizeof(v->text)) return;
  va_list ap;
  va_start(ap, fmt);
  v->len += (size_t)snprintf(v->text + v->len, sizeof(v->text) - v->len, "  - ");
  int k = vsnprintf(v->text + v->len, sizeof(v->text) - v->len, fmt, ap);
  va_end(ap);
  if (k > 0)
    v->len = v->len + (size_t)k < sizeof(v->text) ? v->len + (size_t)k : sizeof(v->text) - 1;
  if (v->len + 1 < sizeof(v->text)) v->text[v->len++] = '\n', v->text[v->len] = '\0';
}

static int sanitizer_report(const char *s) {
  return s && (strstr(s, "Sanitizer") != NULL || strstr(s, "runtime error:") != NULL);
}

/* Judge a finished trial. codes[r]: exit code of each rank (fork modes), or
 * -2 unknown; launcher_code: tdistrun's exit code (tdistrun mode). */
static void judge(const plan_t *p, obs_t *obs, const int *codes, int launcher_code, int hang,
                  const char *all_err, verdict_t *v, kind_stats_t *ks) {
  int n = p->n, V = p->victim;
  int lost = store_lost(p);
  if (hang) problem(v, P_HANG, "hang: still running after %d s, killed", GUARD_S);
  for (int r = 0; r < n; r++) {
    obs_t *o = &obs[r];
    if (o->wrong) problem(v, P_RESULT, "rank %d: %d wrong all_reduce result(s)", r, o->wrong);
    if (o->errors) problem(v, P_OTHER, "rank %d: %s", r, o->error);
  }
  if (!obs[V].fault) problem(v, P_OTHER, "victim %d never reached its fault", V);
  for (int r = 0; r < n; r++) {
    if (!reporter(p, r)) continue;
    obs_t *o = &obs[r];
    if (!o->report) {
      if (!hang) problem(v, P_OTHER, "rank %d: no report", r);
      continue;
    }
    ks->reports++;
    add_code(ks, o->code);
    /* the code */
    int code_ok = p->kind == K_SKIP ? !strcmp(o->code, "TDIST_ERR_TIMEOUT") ||
                                          !strcmp(o->code, "TDIST_ERR_ABORTED")
                  : p->kind == K_ABORTX ? !strcmp(o->code, "TDIST_ERR_ABORTED")
                                        : !strcmp(o->code, "TDIST_ERR_REMOTE_FAILED") ||
                                              !strcmp(o->code, "TDIST_ERR_ABORTED");
    if (!code_ok)
      problem(v, P_CODE, "rank %d: wrong code %s at it %d (fault at it %d): %s", r, o->code,
              o->failed_it, p->fault_it, o->msg);
    /* the name */
    if (o->rc != 0 && code_ok) {
      if (p->kind == K_ABORTX) {
        /* The cause itself, which a reset could drop (the victim's ERR),
         * leaving only "rank V left". */
        char why[64];
        snprintf(why, sizeof(why), "soak abort_exit by rank %d", V);
        if (!strstr(o->msg, why))
          problem(v, P_NAME, "rank %d: %s without the victim's cause '%s': %s", r, o->code, why,
                  o->msg);
      } else if (p->kind == K_SKIP) {
        int behind[MAX_N], k = not_reached(o->msg, n, behind), others = 0;
        for (int s = 0; s < n && k > 0; s++)
          others += s != V && behind[s];
        if (k < 0 || !behind[V] || others)
          problem(v, P_NAME,
                  "rank %d: %s does not name rank %d alone as not having reached the "
                  "op: %s",
                  r, o->code, V, o->msg);
      } else {
        int others = 0;
        for (int s = 0; s < n; s++)
          others += s != V && names_failed(o->msg, s);
        if (!names_failed(o->msg, V) || others)
          problem(v, P_NAME, "rank %d: %s names %s: %s", r, o->code,
                  others ? "a survivor" : "not the victim", o->msg);
      }
    }
    /* the latency */
    double lat = p->kind == K_SKIP ? o->since : o->latency;
    double bound = p->kind == K_SKIP   ? SKIP_BOUND_MS
                   : p->kind == K_STOP ? STOP_BOUND_MS
                                       : KILL_BOUND_MS;
    if (o->rc != 0 && code_ok && lat >= 0) {
      add_sample(&ks->lat, &ks->nlat, &ks->cap, lat);
      if (p->kind != K_SKIP && o->seen >= 0)
        add_sample(&ks->seen, &ks->nseen, &ks->seen_cap, o->seen);
      if (lat > bound)
        problem(v, P_SLOW, "rank %d: detection took %.1f ms (bound %.0f ms)", r, lat, bound);
    } else if (o->rc != 0 && code_ok && p->kind != K_SKIP) {
      problem(v, P_OTHER, "rank %d: no fault time to measure the latency against", r);
    }
    /* the shrink */
    int expect = dies(p) ? n - 1 : n;
    if (!o->shrink) {
      if (!hang) problem(v, P_SHRINK, "rank %d: no shrink line", r);
    } else if (lost && !opt.strict_store_host) {
      /* expected to fail with an error; a success must still be right */
      if (!strcmp(o->shrink_code, "TDIST_SUCCESS") &&
          (!o->layout_ok || strcmp(o->allreduce, "ok") != 0))
        problem(v, P_SHRINK, "rank %d: shrink (store host lost) %s: size %d, all_reduce %s: %s", r,
                o->shrink_code, o->shrink_size, o->allreduce, o->shrink_msg);
    } else if (strcmp(o->shrink_code, "TDIST_SUCCESS") != 0 || o->shrink_size != expect ||
               !o->layout_ok || strcmp(o->allreduce, "ok") != 0) {
      problem(v, P_SHRINK,
              "rank %d: shrink %s after %.0f ms, size %d (expected %d), layout %s, "
              "all_reduce %s: %s",
              r, o->shrink_code, o->shrink_ms, o->shrink_size, expect, o->layout_ok ? "ok" : "bad",
              o->allreduce, o->shrink_msg);
    }
    if (!o->done && !hang) problem(v, P_OTHER, "rank %d: never said done", r);
  }
  if (lost) ks->store_lost++;
  if (p->kind == K_STOP && !hang) {
    int low = V == 0 ? 1 : 0;
    if (!obs[low].killed_victim)
      problem(v, P_OTHER, "rank %d did not kill the stopped victim %d", low, V);
  }
  /* exit codes */
  int victim_code = p->kind == K_KILL9 || p->kind == K_STOP ? 128 + SIGKILL
                    : p->kind == K_CRASH                    ? 128 + SIGABRT
                                                            : 0;
  if (!hang && p->mode == M_TDISTRUN) {
    if (launcher_code != victim_code)
      problem(v, P_OTHER, "tdistrun exited %d, expected %d", launcher_code, victim_code);
  } else if (!hang) {
    for (int r = 0; r < n; r++) {
      int want = r == V ? victim_code : 0;
      if (codes[r] != want)
        problem(v, P_OTHER, "rank %d exited %d, expected %d", r, codes[r], want);
    }
  }
  if (sanitizer_report(all_err)) problem(v, P_OTHER, "a sanitizer reported (see stderr)");
}

/* ---- running a trial ------------------------------------------------------------------- */

static void remove_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (d) {
    struct dirent *e;
    char path[512];
    while ((e = readdir(d))) {
      if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
      snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
      unlink(path);
    }
    closedir(d);
  }
  rmdir(dir);
}

/* 1 if pid is a soak_rank process (before killing a pid read from a file). */
static int is_soak_rank(pid_t pid) {
  char path[64], cmd[512] = "";
  snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  size_t k = fread(cmd, 1, sizeof(cmd) - 1, f);
  cmd[k] = '\0';
  fclose(f);
  return strstr(cmd, "soak_rank") != NULL;
}

/* The pid of rank r from its pid file, if it is still a soak_rank; else 0. */
static pid_t rank_pid(const char *dir, int r) {
  char path[320];
  long long pid = -1;
  snprintf(path, sizeof(path), "%s/pid.%d", dir, r);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  if (fscanf(f, "%lld", &pid) != 1) pid = -1;
  fclose(f);
  return pid > 0 && is_soak_rank((pid_t)pid) ? (pid_t)pid : 0;
}

/* Kill every rank of the trial whose pid file exists (hang cleanup). */
static void kill_ranks(const char *dir, int n) {
  for (int r = 0; r < n; r++) {
    pid_t pid = rank_pid(dir, r);
    if (pid > 0) {
      kill(pid, SIGKILL);
      kill(pid, SIGCONT);
    }
  }
}

/* A hang: the threads' stacks of every rank still running (gdb, if there is
 * one; not the stopped victim, which gdb cannot attach to), and under
 * tdistrun the ranks' own logs (the launcher is killed before it relays
 * what it buffered). */
static void hang_report(const char *dir, const plan_t *p) {
  char gdb[512];
  int have_gdb = access("/usr/bin/gdb", X_OK) == 0;
  snprintf(gdb, sizeof(gdb), "/usr/bin/gdb");
  for (int r = 0; r < p->n; r++) {
    pid_t pid = rank_pid(dir, r);
    if (p->mode == M_TDISTRUN) {
      char path[320];
      snprintf(path, sizeof(path), "%s/log.%d", dir, r);
      FILE *f = fopen(path, "r");
      printf("---- rank %d log (%s):\n", r, pid ? "still running" : "exited");
      if (f) {
        char line[2048];
        while (fgets(line, sizeof(line), f))
          fputs(line, stdout);
        fclose(f);
      }
    }
    if (!pid || !have_gdb || (p->kind == K_STOP && r == p->victim)) continue;
    char pids[16];
    snprintf(pids, sizeof(pids), "%d", (int)pid);
    char *argv[] = {"/usr/bin/timeout",    "10", gdb, "-batch", "-nx", "-p", pids, "-ex",
                    "thread apply all bt", NULL};
    ru_proc_t g;
    ru_run(&g, argv, NULL, 20);
    printf("---- rank %d (pid %s) stacks:\n", r, pids);
    for (const char *l = g.out; l && *l;) { /* the frames only */
      const char *e = strchr(l, '\n');
      size_t len = e ? (size_t)(e - l) : strlen(l);
      if (!strncmp(l, "Thread ", 7) || !strncmp(l, "#", 1)) printf("%.*s\n", (int)len, l);
      l += len + (e ? 1 : 0);
    }
    ru_free(&g);
  }
}

/* 1 once p has exited (not reaped: ru_wait reaps it). */
static int exited(const ru_proc_t *p) {
  siginfo_t si;
  memset(&si, 0, sizeof(si));
  if (waitid(P_PID, (id_t)p->pid, &si, WEXITED | WNOHANG | WNOWAIT) != 0) return errno == ECHILD;
  return si.si_pid == p->pid;
}

/* Start a tdist-store on a free port; its port, or -1. */
static int start_store(ru_proc_t *p, char **envp) {
  char *argv[] = {TDIST_STORE_BIN, "--host", "127.0.0.1", "--port", "0", NULL};
  if (ru_start(p, argv, envp) != 0) return -1;
  int port = -1;
  for (int i = 0; i < 1000 * SOAK_SCALE && port < 0; i++) {
    char *out = ru_peek_out(p);
    const char *l = strstr(out, "listening on 127.0.0.1:");
    if (l) port = atoi(l + strlen("listening on 127.0.0.1:"));
    free(out);
    if (port < 0) usleep(10000);
  }
  return port;
}

typedef struct {
  int ok, hang;
  double seconds;
  verdict_t v;
} trial_result_t;

static void show_proc(const char *what, const ru_proc_t *p) {
  printf("---- %s: exit %d after %.2f s\n%s", what, p->code, p->seconds, p->out ? p->out : "");
  if (p->out && *p->out && p->out[strlen(p->out) - 1] != '\n') printf("\n");
  if (p->err && *p->err) {
    printf("---- %s stderr:\n%s", what, p->err);
    if (p->err[strlen(p->err) - 1] != '\n') printf("\n");
  }
}

static void run_trial(long index, const plan_t *p, trial_result_t *res) {
  memset(res, 0, sizeof(*res));
  double t0 = now_s();
  char dir[64];
  snprintf(dir, sizeof(dir), "/tmp/tdist-soak-XXXXXX");
  if (!mkdtemp(dir)) {
    perror("soak: mkdtemp");
    exit(2);
  }
  char env[16][640], rank_env[MAX_N][8][64], *envp[MAX_N + 1][32];
  int k = 0;
  /* The soak's own settings of the shared segment go to every rank: the
   * faults then hit the lane they choose (TDIST_CPU_SC_LEND=1: large
   * all_reduces read in place). At most 6. */
  extern char **environ;
  for (char **e = environ; *e && k < 6; e++)
    if (!strncmp(*e, "TDIST_CPU_SC_", 13)) snprintf(env[k++], 640, "%s", *e);
  snprintf(env[k++], 640, "TDIST_HEARTBEAT_INTERVAL_MS=%d", HB_INTERVAL_MS);
  snprintf(env[k++], 640, "TDIST_HEARTBEAT_TIMEOUT_MS=%d", HB_TIMEOUT_MS);
  snprintf(env[k++], 640, "TDIST_TIMEOUT_MS=%d", TIMEOUT_MS);
  snprintf(env[k++], 640, "SOAK_SKIP_TIMEOUT_MS=%d", SKIP_TIMEOUT_MS);
  snprintf(env[k++], 640, "SOAK_SCALE=%d", SOAK_SCALE);
  if (opt.nccl) {
    snprintf(env[k++], 640, "TDIST_BACKEND=nccl");
#ifdef GPUSIM_LIB
    if (!real_nccl_lib) { /* else the ranks inherit the real ones */
      snprintf(env[k++], 640, "TDIST_NCCL_LIBRARY=%s", GPUSIM_LIB);
      snprintf(env[k++], 640, "TDIST_CUDART_LIBRARY=%s", GPUSIM_LIB);
    }
#endif
  }
#ifdef SOAK_TSAN
  /* TSan's _exit sleeps atexit_sleep_ms (1 s) before exiting: the `exit`
   * victim would seem to die 1 s after its fault time. */
  static char tsan_env[600];
  const char *tso = getenv("TSAN_OPTIONS");
  snprintf(tsan_env, sizeof(tsan_env), "TSAN_OPTIONS=%s%satexit_sleep_ms=0", tso ? tso : "",
           tso && *tso ? ":" : "");
  char *tsan_entry = tsan_env;
#else
  char *tsan_entry = NULL;
#endif
  int nbase = k;
  for (int r = 0; r <= MAX_N; r++) {
    for (int i = 0; i < nbase; i++)
      envp[r][i] = env[i];
    envp[r][nbase] = tsan_entry;
    envp[r][nbase + 1] = NULL;
  }
  if (tsan_entry) nbase++;
  char kind_s[32], victim_s[16], it_s[16], delay_s[24], size_s[32], n_s[16];
  snprintf(kind_s, sizeof(kind_s), "%s", kind_names[p->kind]);
  snprintf(victim_s, sizeof(victim_s), "%d", p->victim);
  snprintf(it_s, sizeof(it_s), "%d", p->fault_it);
  snprintf(delay_s, sizeof(delay_s), "%ld", p->delay_us);
  snprintf(size_s, sizeof(size_s), "0x%016" PRIx64, p->size_seed);
  snprintf(n_s, sizeof(n_s), "%d", p->n);

  ru_proc_t procs[MAX_N], store = {0};
  int nprocs = 0, have_store = 0, port = -1;
  if (p->mode == M_EXTSTORE) {
    port = start_store(&store, envp[MAX_N]);
    have_store = 1;
  } else if (p->mode == M_HOST0) {
    port = tdist_mp_free_port();
  }
  if (p->mode == M_TDISTRUN) {
    char *argv[20];
    int a = 0;
    argv[a++] = TDISTRUN, argv[a++] = "-n", argv[a++] = n_s, argv[a++] = "--no-fail-fast";
    if (opt.nccl) argv[a++] = "--backend", argv[a++] = "nccl";
    if (opt.hostid) argv[a++] = "/bin/sh", argv[a++] = "-c", argv[a++] = HOSTID_SH;
    argv[a++] = SOAK_RANK, argv[a++] = kind_s, argv[a++] = victim_s, argv[a++] = it_s;
    argv[a++] = delay_s, argv[a++] = size_s, argv[a++] = dir, argv[a] = NULL;
    if (ru_start(&procs[0], argv, envp[MAX_N]) == 0) nprocs = 1;
  } else if (port > 0) {
    for (int r = 0; r < p->n; r++) {
      int j = nbase;
      snprintf(rank_env[r][0], 64, "RANK=%d", r);
      snprintf(rank_env[r][1], 64, "WORLD_SIZE=%d", p->n);
      snprintf(rank_env[r][2], 64, "MASTER_PORT=%d", port);
      snprintf(rank_env[r][3], 64, "TDIST_STORE_HOSTED=%d", p->mode == M_EXTSTORE);
      snprintf(rank_env[r][4], 64, "LOCAL_RANK=%d", r);
      snprintf(rank_env[r][5], 64, "MASTER_ADDR=127.0.0.1");
      snprintf(rank_env[r][6], 64, "TDIST_STORE_IN_PROCESS=%d", opt.store_in_process);
      int nre = 7;
      if (opt.hostid) snprintf(rank_env[r][nre++], 64, "NCCL_HOSTID=soak-h%d", r);
      for (int i = 0; i < nre; i++)
        envp[r][j++] = rank_env[r][i];
      envp[r][j] = NULL;
      char *argv[] = {SOAK_RANK, kind_s, victim_s, it_s, delay_s, size_s, dir, NULL};
      if (ru_start(&procs[r], argv, envp[r]) != 0) break;
      nprocs++;
    }
  }
  if (nprocs != (p->mode == M_TDISTRUN ? 1 : p->n))
    problem(&res->v, P_OTHER, "could not start the trial's processes (port %d)", port);

  /* Wait for all, bounded by the guard. */
  int done[MAX_N] = {0}, left = nprocs, hang = 0;
  double deadline = t0 + GUARD_S, stop_alone = 0;
  while (left > 0) {
    for (int i = 0; i < nprocs; i++)
      if (!done[i] && exited(&procs[i])) {
        ru_wait(&procs[i], GUARD_S + 600);
        done[i] = 1;
        left--;
      }
    if (left == 0) break;
    /* fork modes, stop: the survivors are gone and the victim still stopped */
    if (p->mode != M_TDISTRUN && p->kind == K_STOP && left == 1 && !done[p->victim]) {
      if (stop_alone == 0) stop_alone = now_s();
      if (now_s() - stop_alone > 3.0 * SOAK_SCALE) {
        problem(&res->v, P_OTHER, "the stopped victim outlived the survivors: killed by the soak");
        kill(procs[p->victim].pid, SIGKILL);
        kill(procs[p->victim].pid, SIGCONT);
      }
    }
    if (now_s() > deadline) {
      hang = 1;
      printf("soak trial %ld seed 0x%016" PRIx64 ": still running after %d s\n", index, p->seed,
             GUARD_S);
      hang_report(dir, p);
      kill_ranks(dir, p->n);
      for (int i = 0; i < nprocs; i++)
        if (!done[i]) {
          kill(procs[i].pid, SIGKILL);
          kill(procs[i].pid, SIGCONT);
        }
      for (int i = 0; i < nprocs; i++)
        if (!done[i]) {
          ru_wait(&procs[i], GUARD_S + 600);
          done[i] = 1;
        }
      kill_ranks(dir, p->n); /* under tdistrun: PDEATHSIG did it, in case */
      break;
    }
    usleep(10000);
  }
  if (have_store) {
    kill(store.pid, SIGKILL);
    ru_wait(&store, GUARD_S + 600);
  }
  /* What this driver adopted (a child subreaper, main): a store process its
   * rank 0 left behind ends by itself once the job is over; reap it, so no
   * zombie of a trial outlives it. */
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }

  /* Gather and judge. */
  size_t cap = 1;
  for (int i = 0; i < nprocs; i++)
    cap += strlen(procs[i].out) + strlen(procs[i].err) + 2;
  char *out = calloc(cap, 1), *err = calloc(cap, 1);
  for (int i = 0; i < nprocs; i++) {
    strcat(strcat(out, procs[i].out), "\n");
    strcat(strcat(err, procs[i].err), "\n");
  }
  obs_t *obs = calloc(MAX_N, sizeof(obs_t));
  parse(out, obs, p->n);
  int codes[MAX_N];
  for (int r = 0; r < p->n; r++)
    codes[r] = p->mode == M_TDISTRUN || r >= nprocs ? -2 : procs[r].code;
  kind_stats_t *ks = &stats[p->kind];
  ks->trials++;
  ks->by_mode[p->mode]++;
  ks->victim0 += p->victim == 0;
  ks->mid_op += obs[p->victim].inflight > 0;
  ks->large_op += p->fault_it % 2; /* odd iterations: 256 KiB .. 8 MiB */
  judge(p, obs, codes, p->mode == M_TDISTRUN && nprocs ? procs[0].code : -2, hang, err, &res->v,
        ks);
  if (have_store && sanitizer_report(store.err))
    problem(&res->v, P_OTHER, "a sanitizer reported in tdist-store");
  if (sanitizer_report(out) && !res->v.count[P_OTHER])
    problem(&res->v, P_OTHER, "a sanitizer reported (see output)");
  res->hang = hang;
  int failed = 0;
  for (int i = 0; i < P_COUNT; i++) {
    if (i == P_SLOW && !opt.strict_latency) continue;
    failed += res->v.count[i];
  }
  res->ok = !failed;
  res->seconds = now_s() - t0;
  for (int i = 0; i < P_COUNT; i++) {
    ks->problems[i] += res->v.count[i];
    total_problems[i] += res->v.count[i];
  }
  ks->failed += !res->ok;

  /* One line per trial; everything on failure or --verbose. */
  char lats[160] = "";
  size_t ll = 0;
  for (int r = 0; r < p->n; r++) {
    if (!reporter(p, r) || !obs[r].report) continue;
    double l = p->kind == K_SKIP ? obs[r].since : obs[r].latency;
    ll += (size_t)snprintf(lats + ll, sizeof(lats) - ll, "%s%.0f", ll ? "/" : "", l);
    if (ll >= sizeof(lats)) break;
  }
  printf("soak trial %ld seed 0x%016" PRIx64 ": %s n=%d victim=%d %s it=%d delay=%ldus: %s "
         "(%.1f s, latency ms %s%s%s)\n",
         index, p->seed, kind_names[p->kind], p->n, p->victim, mode_names[p->mode], p->fault_it,
         p->delay_us,
         res->ok ? "ok"
         : hang  ? "HANG"
                 : "FAILED",
         res->seconds, lats, obs[p->victim].inflight ? ", op in flight" : "",
         store_lost(p) ? ", store host lost" : "");
  if (res->v.len) printf("%s", res->v.text);
  if (!res->ok || opt.verbose) {
    for (int i = 0; i < nprocs; i++) {
      char what[48];
      if (p->mode == M_TDISTRUN)
        snprintf(what, sizeof(what), "tdistrun");
      else
        snprintf(what, sizeof(what), "rank %d", i);
      show_proc(what, &procs[i]);
    }
    if (have_store) show_proc("tdist-store", &store);
  }
  if (!res->ok)
    printf("soak: replay with: soak --trials 1 --seed 0x%016" PRIx64 "%s%s%s%s\n", p->seed,
           p->mode == M_TDISTRUN ? " --launcher-only" : " --no-launcher",
           opt.load ? "" : " --no-load",
           !opt.nccl    ? ""
           : opt.hostid ? " --backend nccl --nccl-hostid-per-rank"
                        : " --backend nccl",
           opt.store_in_process ? " --store-in-process" : "");
  fflush(stdout);
  for (int i = 0; i < nprocs; i++)
    ru_free(&procs[i]);
  if (have_store) ru_free(&store);
  free(out);
  free(err);
  free(obs);
  if (opt.keep || !res->ok)
    printf("soak: scratch directory kept: %s\n", dir);
  else
    remove_dir(dir);
}

/* ---- CPU load ----------------------------------------------------------------------------- */

static pid_t load_pids[2];
static ru_proc_t stress;
static int have_stress;

static int in_path(const char *name, char *out, size_t cap) {
  const char *path = getenv("PATH");
  if (!path) path = "/usr/bin:/bin";
  while (*path) {
    const char *c = strchr(path, ':');
    size_t len = c ? (size_t)(c - path) : strlen(path);
    snprintf(out, cap, "%.*s/%s", (int)len, path, name);
    if (len && access(out, X_OK) == 0) return 1;
    path += len + (c ? 1 : 0);
  }
  return 0;
}

static void load_start(void) {
  char path[512], tmo[32];
  if (in_path("stress-ng", path, sizeof(path))) {
    double s = opt.seconds > 0 ? opt.seconds + 2 * GUARD_S + 60 : 7 * 24 * 3600.0;
    snprintf(tmo, sizeof(tmo), "%.0f", s);
    char *argv[] = {path, "--cpu", "2", "--timeout", tmo, "--quiet", NULL};
    if (ru_start(&stress, argv, NULL) == 0) {
      have_stress = 1;
      printf("soak: load: stress-ng --cpu 2 (pid %d)\n", (int)stress.pid);
      return;
    }
  }
  pid_t parent = getpid();
  for (int i = 0; i < 2; i++) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(0);
      volatile uint64_t x = 1;
      for (;;)
        x = x * 6364136223846793005ull + 1442695040888963407ull;
    }
    load_pids[i] = pid;
  }
  printf("soak: load: 2 busy-loop children (pids %d %d)\n", (int)load_pids[0], (int)load_pids[1]);
}

static void load_stop(void) {
  if (have_stress) {
    kill(stress.pid, SIGTERM);
    ru_wait(&stress, 30);
    if (stress.code < 0) kill(stress.pid, SIGKILL);
    ru_free(&stress);
  }
  for (int i = 0; i < 2; i++)
    if (load_pids[i] > 0) {
      kill(load_pids[i], SIGKILL);
      waitpid(load_pids[i], NULL, 0);
    }
}

/* ---- the summary -------------------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double pct(const double *v, size_t n, double q) {
  if (!n) return -1;
  double x = q * (double)n;
  size_t i = (size_t)x;
  if ((double)i < x) i++; /* ceil */
  return v[i ? i - 1 : 0];
}

static void summary(void) {
  printf("\n==== soak summary (latency: kill9, exit, callback_crash, stop from the victim's fault "
         "time; skip from the survivor's submission of the skipped op)\n");
  for (int k = 0; k < K_COUNT; k++) {
    kind_stats_t *s = &stats[k];
    double bound = k == K_SKIP ? SKIP_BOUND_MS : k == K_STOP ? STOP_BOUND_MS : KILL_BOUND_MS;
    printf("\n%s\n", kind_names[k]);
    printf("  %-22s %d (%d failed); host0 %d, extstore %d, tdistrun %d; victim rank 0: %d, "
           "store host lost: %d\n",
           "trials", s->trials, s->failed, s->by_mode[M_HOST0], s->by_mode[M_EXTSTORE],
           s->by_mode[M_TDISTRUN], s->victim0, s->store_lost);
    printf("  %-22s %d with the victim's op in flight, %d on a >= 256 KiB op%s\n", "faults",
           s->mid_op, s->large_op, opt.nccl ? "" : " (single copy)");
    printf("  %-22s %d:", "survivor reports", s->reports);
    for (int i = 0; i < 8 && s->codes[i][0]; i++)
      printf(" %s %d", s->codes[i], s->code_count[i]);
    printf("\n");
    if (s->nlat) qsort(s->lat, s->nlat, sizeof(double), cmp_double);
    if (s->nlat)
      printf("  %-22s p50 %.1f, p99 %.1f, max %.1f (%zu samples; bound %.0f, %d over)\n",
             "detection latency ms", pct(s->lat, s->nlat, 0.5), pct(s->lat, s->nlat, 0.99),
             s->lat[s->nlat - 1], s->nlat, bound, s->problems[P_SLOW]);
    else
      printf("  %-22s -\n", "detection latency ms");
    if (s->nseen) {
      qsort(s->seen, s->nseen, sizeof(double), cmp_double);
      printf("  %-22s p50 %.1f, p99 %.1f, max %.1f (when the rank's own thread saw it)\n",
             "seen by the caller ms", pct(s->seen, s->nseen, 0.5), pct(s->seen, s->nseen, 0.99),
             s->seen[s->nseen - 1]);
    }
    printf("  %-22s wrong names %d, wrong codes %d, wrong results %d, shrink failures %d, hangs "
           "%d, other %d\n",
           "problems", s->problems[P_NAME], s->problems[P_CODE], s->problems[P_RESULT],
           s->problems[P_SHRINK], s->problems[P_HANG], s->problems[P_OTHER]);
  }
  printf("\n");
}

/* ---- main --------------------------------------------------------------------------------------
 */

/* "kill9,exit" -> a mask of kinds; an unknown name is a usage error. */
static unsigned parse_kinds(const char *list) {
  unsigned mask = 0;
  char buf[128];
  snprintf(buf, sizeof(buf), "%s", list);
  for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    int k = 0;
    while (k < K_COUNT && strcmp(t, kind_names[k]))
      k++;
    if (k == K_COUNT) {
      fprintf(stderr, "soak: unknown fault kind '%s'\n", t);
      exit(2);
    }
    mask |= 1u << k;
  }
  return mask;
}

static void usage_to(FILE *f) {
  fprintf(f,
          "usage: soak [--trials N | --seconds S] [--seed X] [--no-load] "
          "[--launcher-only | --no-launcher] [--verbose] [--keep] [--strict-latency] "
          "[--strict-store-host] [--store-in-process] [--kinds kill9,stop,...] "
          "[--backend cpu|nccl] [--nccl-hostid-per-rank] [--help]\n"
          "  --backend nccl          the NCCL backend: on the real NCCL and CUDA runtime when "
          "TDIST_NCCL_LIBRARY\n"
          "                          and TDIST_CUDART_LIBRARY are both set, else on the "
          "simulated GPU (%s)\n"
          "  --nccl-hostid-per-rank  a NCCL_HOSTID per rank process: several ranks on one "
          "GPU (a test mode\n"
          "                          NCCL does not support)\n",
#ifdef GPUSIM_LIB
          GPUSIM_LIB
#else
          "not in this build"
#endif
  );
}

static void usage(void) {
  usage_to(stderr);
  exit(2);
}

/* --backend nccl: the real libraries when the environment names both, else
 * the simulated GPU (see GPUSIM_LIB above). Exits 2 with a message when
 * neither can be used. */
static void select_nccl_libs(void) {
  const char *nccl = getenv("TDIST_NCCL_LIBRARY"), *cudart = getenv("TDIST_CUDART_LIBRARY");
  int have_nccl = nccl && *nccl, have_cudart = cudart && *cudart;
  if (have_nccl && have_cudart) {
    real_nccl_lib = nccl;
    return;
  }
  if (have_nccl || have_cudart) {
    fprintf(stderr,
            "soak: --backend nccl: TDIST_NCCL_LIBRARY and TDIST_CUDART_LIBRARY must be "
            "set together (the real libraries) or both unset (the simulated GPU); "
            "only %s is set\n",
            have_nccl ? "TDIST_NCCL_LIBRARY" : "TDIST_CUDART_LIBRARY");
    exit(2);
  }
#ifndef GPUSIM_LIB
  fprintf(stderr, "soak: --backend nccl needs libtdist_gpusim.so, which this build lacks "
                  "(-DTDIST_BUILD_GPUSIM=ON), or TDIST_NCCL_LIBRARY and TDIST_CUDART_LIBRARY "
                  "naming NCCL and the CUDA runtime\n");
  exit(2);
#endif
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  int seed_given = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--trials") && i + 1 < argc)
      opt.trials = atol(argv[++i]);
    else if (!strcmp(a, "--seconds") && i + 1 < argc)
      opt.seconds = atof(argv[++i]);
    else if (!strcmp(a, "--seed") && i + 1 < argc) {
      opt.seed = strtoull(argv[++i], NULL, 0);
      seed_given = 1;
    } else if (!strcmp(a, "--no-load"))
      opt.load = 0;
    else if (!strcmp(a, "--launcher-only"))
      opt.launcher = 1;
    else if (!strcmp(a, "--no-launcher"))
      opt.launcher = -1;
    else if (!strcmp(a, "--verbose"))
      opt.verbose = 1;
    else if (!strcmp(a, "--keep"))
      opt.keep = 1;
    else if (!strcmp(a, "--strict-latency"))
      opt.strict_latency = 1;
    else if (!strcmp(a, "--strict-store-host"))
      opt.strict_store_host = 1;
    else if (!strcmp(a, "--store-in-process"))
      opt.store_in_process = 1;
    else if (!strcmp(a, "--kinds") && i + 1 < argc)
      opt.kinds = parse_kinds(argv[++i]);
    else if (!strcmp(a, "--backend") && i + 1 < argc) {
      const char *b = argv[++i];
      if (!strcmp(b, "nccl"))
        opt.nccl = 1;
      else if (strcmp(b, "cpu") != 0)
        usage();
    } else if (!strcmp(a, "--nccl-hostid-per-rank"))
      opt.hostid = 1;
    else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage_to(stdout);
      return 0;
    } else
      usage();
  }
  if (opt.hostid && !opt.nccl) usage();
  if (opt.nccl) select_nccl_libs();
  if (opt.trials > 0 && opt.seconds > 0) usage();
  /* Orphans of a trial (a store whose rank 0 died first) become ours, not
   * PID 1's, and are reaped after each trial (run_trial). */
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  if (opt.trials <= 0 && opt.seconds <= 0) opt.seconds = SOAK_DEFAULT_SECONDS; /* soak_short */
  if (!seed_given) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t s =
        ((uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec) ^ ((uint64_t)getpid() << 32);
    opt.seed = splitmix(&s);
  }
  const char *g = getenv("SOAK_GUARD_S");
  if (g && atoi(g) > 0) guard_s = atoi(g);
  signal(SIGPIPE, SIG_IGN);
  printf("soak: seed 0x%016" PRIx64 ", backend %s, %s %g, load %s, launcher %s, scale %d (guard "
         "%d s), heartbeat %d/%d ms, timeout %d ms, skip op timeout %d ms\n",
         opt.seed,
         !opt.nccl       ? "cpu"
         : real_nccl_lib ? "nccl (TDIST_NCCL_LIBRARY, TDIST_CUDART_LIBRARY)"
                         : "nccl (simulated GPU)",
         opt.trials > 0 ? "trials" : "seconds", opt.trials > 0 ? (double)opt.trials : opt.seconds,
         opt.load ? "on" : "off",
         opt.launcher > 0   ? "only"
         : opt.launcher < 0 ? "never"
                            : "random",
         SOAK_SCALE, GUARD_S, HB_INTERVAL_MS, HB_TIMEOUT_MS, TIMEOUT_MS, SKIP_TIMEOUT_MS);
  if (opt.load) load_start();
  double t0 = now_s();
  long trials = 0, passed = 0, failed = 0, hangs = 0;
  for (long i = 0;; i++) {
    if (opt.trials > 0 && i >= opt.trials) break;
    if (opt.seconds > 0 && now_s() - t0 >= opt.seconds) break;
    uint64_t s = opt.seed + (uint64_t)i;
    uint64_t seed = i == 0 ? opt.seed : splitmix(&s);
    plan_t p = plan_make(seed);
    trial_result_t r;
    run_trial(i, &p, &r);
    trials++;
    if (r.ok)
      passed++;
    else
      failed++;
    hangs += r.hang;
  }
  if (opt.load) load_stop();
  summary();
  printf("soak: %.1f s; other problems %d (missing reports or lines, exit codes, sanitizer "
         "reports, victims that did not fault); slow detections %d%s\n",
         now_s() - t0, total_problems[P_OTHER], total_problems[P_SLOW],
         opt.strict_latency ? " (failures: --strict-latency)" : " (not failures)");
  printf("soak: %ld trials, %d wrong names, %d wrong codes, %d wrong results, %d shrink failures, "
         "%ld hangs\n",
         trials, total_problems[P_NAME], total_problems[P_CODE], total_problems[P_RESULT],
         total_problems[P_SHRINK], hangs);
  printf("%ld passed, %ld failed\n", passed, failed);
  return failed == 0 && hangs == 0 ? 0 : 1;
}
