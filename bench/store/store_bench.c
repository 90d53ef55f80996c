/*
 * store_bench - store throughput and rendezvous wall time (issue 3).
 *
 *   store_bench [--host H] [--port P] [--clients 1,16,64] [--seconds S]
 *               [--warmup W] [--value-size B] [--rendezvous N]
 *               [--threads] [--redis] [--etcd URL]
 *
 * With --port 0 (default) it starts a server in-process; run_store_bench.sh
 * starts the standalone tdist-store instead, so the server runs in its own
 * process as redis-server does.
 *
 * ops/s table: for each client count and each op (set, get, add) one line
 * "set 16 123456 ops/s". Default: the event-loop client of evloop.c, which
 * loads the server the way redis-benchmark does (one thread, N non-blocking
 * connections, one request outstanding on each, W s warm-up then S s counted,
 * every reply verified; see evloop.c). --redis points that same client at a
 * Redis server (RESP SET/GET/INCR) as a cross-check of redis-benchmark.
 * --threads instead runs a thread per client with blocking tdist_store_t
 * calls (the library's own client, keys "key:<client>:<i % 1000>"); with
 * many clients on few cores those threads compete with the server for CPU,
 * so that mode measures the library client, not the server. After the
 * event-loop runs: "requests <n> total" (every reply, warm-ups included), so
 * a script can divide the server's CPU time by it.
 *
 * Rendezvous (tdist only, N > 0): N connections (from 16 threads, library
 * client) each set their address, multi-get everyone's and add to a
 * counter; the last sets "go" and all wait for it. Prints the wall time.
 *
 * --etcd URL (etcd://host:port[,...][/prefix]): the TCP store (in-process
 * server, or --port) and the etcd store side by side in one run, both with
 * the library client (--threads mode: a thread and a handle per client),
 * then the N-client rendezvous on each. Prints one line per measurement in
 * the bench format ("peer=etcd op=set clients=16 ops_s=..."), then a table
 * with the etcd/TCP ratios. run_store_bench_etcd.sh starts a local cluster.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "tdist/errors.h"
#include "store_bench.h"
#include "tdist/store.h"

static sb_cfg_t g_cfg = {.host = "127.0.0.1", .seconds = 2.0, .warmup = 0.5, .vsize = 3};
static atomic_int g_stop;
static const char *g_url; /* the etcd store's URL while measuring it, else NULL */
static double g_last[3];  /* ops/s of set, get, add of the last run_ops_threads */

double sb_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static tdist_store_t *connect_or_die(void) {
  tdist_store_t *s;
  tdist_store_opts_t o = {.mask = TDIST_STORE_FIELD_TIMEOUT, .timeout_ms = 60000};
  if (g_url ? tdist_store_open_url(g_url, &o, &s)
            : tdist_store_connect(g_cfg.host, g_cfg.port, &o, &s)) {
    fprintf(stderr, "store_bench: %s\n", tdist_last_error());
    exit(1);
  }
  return s;
}

typedef struct {
  int id, op;
  tdist_store_t *s;
  uint64_t ops, nset; /* nset: keys this client has set (get reads only those) */
  pthread_barrier_t *start;
} worker_t;

static void *worker(void *arg) {
  worker_t *w = arg;
  char key[64], val[4096];
  memset(val, 'x', sizeof(val));
  pthread_barrier_wait(w->start);
  uint64_t n = 0;
  while (!atomic_load_explicit(&g_stop, memory_order_relaxed)) {
    uint64_t nkeys = w->op == 1 ? (w->nset < 1000 ? (w->nset ? w->nset : 1) : 1000) : 1000;
    snprintf(key, sizeof(key), "key:%d:%d", w->id, (int)(n % nkeys));
    int rc;
    if (w->op == 0) {
      rc = tdist_store_set(w->s, key, val, (size_t)g_cfg.vsize);
    } else if (w->op == 1) {
      void *v;
      size_t l;
      rc = tdist_store_get(w->s, key, &v, &l, 10000);
      if (rc == 0) tdist_store_free(v);
    } else {
      rc = tdist_store_add(w->s, key + 4 /* distinct counters */, 1, NULL);
    }
    if (rc) {
      fprintf(stderr, "store_bench: %s\n", tdist_last_error());
      exit(1);
    }
    n++;
  }
  w->ops = n;
  if (w->op == 0) w->nset = n;
  return NULL;
}

/* --threads: a thread per client, blocking library calls. */
static void run_ops_threads(int clients) {
  static const char *names[] = {"set", "get", "add"};
  worker_t *ws = calloc((size_t)clients, sizeof(*ws));
  pthread_t *th = calloc((size_t)clients, sizeof(*th));
  for (int i = 0; i < clients; i++)
    ws[i].s = connect_or_die();
  for (int op = 0; op < 3; op++) {
    pthread_barrier_t b;
    pthread_barrier_init(&b, NULL, (unsigned)clients + 1);
    atomic_store(&g_stop, 0);
    for (int i = 0; i < clients; i++) {
      ws[i].id = i;
      ws[i].op = op;
      ws[i].start = &b;
      pthread_create(&th[i], NULL, worker, &ws[i]);
    }
    pthread_barrier_wait(&b);
    double t0 = sb_now();
    struct timespec ts = {(time_t)g_cfg.seconds,
                          (long)((g_cfg.seconds - (time_t)g_cfg.seconds) * 1e9)};
    nanosleep(&ts, NULL);
    atomic_store(&g_stop, 1);
    uint64_t total = 0;
    for (int i = 0; i < clients; i++) {
      pthread_join(th[i], NULL);
      total += ws[i].ops;
    }
    double dt = sb_now() - t0;
    g_last[op] = (double)total / dt;
    printf("%s %d %.0f ops/s\n", names[op], clients, (double)total / dt);
    fflush(stdout);
    pthread_barrier_destroy(&b);
  }
  for (int i = 0; i < clients; i++)
    tdist_store_release(ws[i].s);
  free(ws);
  free(th);
}

/* ---- rendezvous ---------------------------------------------------------------------- */

typedef struct {
  int first, count, n;
  tdist_store_t **conns;
  char run[32];
} rdzv_arg_t;

static void *rdzv_thread(void *p) {
  rdzv_arg_t *a = p;
  char key[96], val[64];
  for (int i = a->first; i < a->first + a->count; i++) {
    snprintf(key, sizeof(key), "%s/addr/%d", a->run, i);
    snprintf(val, sizeof(val), "10.0.%d.%d:%d", i / 256, i % 256, 20000 + i);
    if (tdist_store_set(a->conns[i], key, val, strlen(val))) goto fail;
  }
  char **keys = malloc(sizeof(char *) * (size_t)a->n);
  void **vals = malloc(sizeof(void *) * (size_t)a->n);
  size_t *lens = malloc(sizeof(size_t) * (size_t)a->n);
  for (int j = 0; j < a->n; j++) {
    keys[j] = malloc(96);
    snprintf(keys[j], 96, "%s/addr/%d", a->run, j);
  }
  for (int i = a->first; i < a->first + a->count; i++) {
    if (tdist_store_multi_get(a->conns[i], (const char *const *)keys, (size_t)a->n, vals, lens,
                              60000))
      goto fail;
    for (int j = 0; j < a->n; j++)
      tdist_store_free(vals[j]);
  }
  snprintf(key, sizeof(key), "%s/go", a->run);
  for (int i = a->first; i < a->first + a->count; i++) {
    int64_t v;
    char ck[96];
    snprintf(ck, sizeof(ck), "%s/arrived", a->run);
    if (tdist_store_add(a->conns[i], ck, 1, &v)) goto fail;
    if (v == a->n && tdist_store_set(a->conns[i], key, "", 0)) goto fail;
  }
  const char *k = key;
  for (int i = a->first; i < a->first + a->count; i++)
    if (tdist_store_wait(a->conns[i], &k, 1, 60000)) goto fail;
  for (int j = 0; j < a->n; j++)
    free(keys[j]);
  free(keys);
  free(vals);
  free(lens);
  return NULL;
fail:
  fprintf(stderr, "store_bench rendezvous: %s\n", tdist_last_error());
  exit(1);
}

/* Wall time of the whole rendezvous (connect included), in seconds. */
static double run_rendezvous(int n) {
  struct rlimit rl;
  getrlimit(RLIMIT_NOFILE, &rl);
  rl.rlim_cur = rl.rlim_max;
  setrlimit(RLIMIT_NOFILE, &rl);
  enum { NT = 16 };
  tdist_store_t **conns = calloc((size_t)n, sizeof(*conns));
  double t0 = sb_now();
  for (int i = 0; i < n; i++)
    conns[i] = connect_or_die();
  double t1 = sb_now();
  pthread_t th[NT];
  rdzv_arg_t args[NT];
  snprintf(args[0].run, sizeof(args[0].run), "rdzv%d", (int)(t0 * 1000) % 100000);
  for (int t = 0; t < NT; t++) {
    args[t] = args[0];
    args[t].n = n;
    args[t].conns = conns;
    args[t].first = t * n / NT;
    args[t].count = (t + 1) * n / NT - args[t].first;
    pthread_create(&th[t], NULL, rdzv_thread, &args[t]);
  }
  for (int t = 0; t < NT; t++)
    pthread_join(th[t], NULL);
  double t2 = sb_now();
  printf("rendezvous %d clients: connect %.3f s, exchange+barrier %.3f s, total %.3f s\n", n,
         t1 - t0, t2 - t1, t2 - t0);
  for (int i = 0; i < n; i++)
    tdist_store_release(conns[i]);
  free(conns);
  return t2 - t0;
}

/* --etcd: the TCP store and the etcd store in one run, library client on
 * both; bench lines per measurement, then the ratios. */
static int run_compare(const char *url, const char *clients, int rdzv_n) {
  enum { MAXC = 8 };
  static const char *names[] = {"set", "get", "add"};
  int cs[MAXC], nc = 0;
  double ops[2][MAXC][3], rdzv[2] = {0, 0};
  char list[128];
  snprintf(list, sizeof(list), "%s", clients);
  for (char *tok = strtok(list, ","); tok && nc < MAXC; tok = strtok(NULL, ","))
    if (atoi(tok) > 0) cs[nc++] = atoi(tok);
  for (int st = 0; st < 2; st++) {
    const char *peer = st ? "etcd" : "tcp-store";
    g_url = st ? url : NULL;
    printf("# %s (%s)\n", peer, st ? url : "in-process tdist store server");
    for (int c = 0; c < nc; c++) {
      run_ops_threads(cs[c]);
      for (int op = 0; op < 3; op++) {
        ops[st][c][op] = g_last[op];
        printf("peer=%s op=%s clients=%d ops_s=%.0f\n", peer, names[op], cs[c], g_last[op]);
      }
    }
    if (rdzv_n > 0) {
      rdzv[st] = run_rendezvous(rdzv_n);
      printf("peer=%s op=rendezvous clients=%d s=%.3f\n", peer, rdzv_n, rdzv[st]);
    }
    fflush(stdout);
  }
  g_url = NULL;
  printf("\n%-10s %7s %14s %14s %10s\n", "op", "clients", "tcp-store", "etcd", "etcd/tcp");
  for (int c = 0; c < nc; c++)
    for (int op = 0; op < 3; op++)
      printf("%-10s %7d %10.0f ops/s %8.0f ops/s %9.3fx\n", names[op], cs[c], ops[0][c][op],
             ops[1][c][op], ops[0][c][op] > 0 ? ops[1][c][op] / ops[0][c][op] : 0);
  if (rdzv_n > 0)
    printf("%-10s %7d %12.3f s %12.3f s %9.1fx slower\n", "rendezvous", rdzv_n, rdzv[0], rdzv[1],
           rdzv[0] > 0 ? rdzv[1] / rdzv[0] : 0);
  return 0;
}

int main(int argc, char **argv) {
  char clients[128] = "1,16,64";
  int rdzv_n = 1024, threads = 0;
  const char *etcd = NULL;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--threads")) {
      threads = 1;
    } else if (!strcmp(a, "--redis")) {
      g_cfg.redis = 1;
    } else if (v && !strcmp(a, "--host")) {
      g_cfg.host = argv[++i];
    } else if (v && !strcmp(a, "--port")) {
      g_cfg.port = atoi(argv[++i]);
    } else if (v && !strcmp(a, "--clients")) {
      snprintf(clients, sizeof(clients), "%s", argv[++i]);
    } else if (v && !strcmp(a, "--seconds")) {
      g_cfg.seconds = atof(argv[++i]);
    } else if (v && !strcmp(a, "--warmup")) {
      g_cfg.warmup = atof(argv[++i]);
    } else if (v && !strcmp(a, "--value-size")) {
      g_cfg.vsize = atoi(argv[++i]);
    } else if (v && !strcmp(a, "--etcd")) {
      etcd = argv[++i];
    } else if (v && !strcmp(a, "--rendezvous")) {
      rdzv_n = atoi(argv[++i]);
    } else {
      fprintf(stderr, "store_bench: unknown or incomplete option '%s'\n", a);
      return 2;
    }
  }
  if (g_cfg.vsize < 0 || g_cfg.vsize > 4096) g_cfg.vsize = 3;
  if (g_cfg.seconds <= 0) g_cfg.seconds = 2.0;
  if (g_cfg.warmup < 0) g_cfg.warmup = 0;
  if (g_cfg.redis && (threads || g_cfg.port == 0)) {
    fprintf(stderr, "store_bench: --redis needs --port of a running Redis, and no --threads\n");
    return 2;
  }
  tdist_store_server_t *srv = NULL;
  if (g_cfg.port == 0) {
    tdist_store_server_opts_t o = {.mask = TDIST_STORE_SERVER_FIELD_HOST, .host = "127.0.0.1"};
    if (tdist_store_server_start(&o, &srv)) {
      fprintf(stderr, "store_bench: %s\n", tdist_last_error());
      return 1;
    }
    g_cfg.port = tdist_store_server_port(srv);
  }
  int rc = 0;
  if (etcd) {
    rc = run_compare(etcd, clients, rdzv_n);
    tdist_store_server_stop(srv);
    return rc;
  }
  for (char *tok = strtok(clients, ","); tok && !rc; tok = strtok(NULL, ","))
    if (atoi(tok) > 0) {
      if (threads)
        run_ops_threads(atoi(tok));
      else
        rc = sb_evloop_run(&g_cfg, atoi(tok)) ? 1 : 0;
    }
  if (!rc && !threads) printf("requests %" PRIu64 " total\n", sb_evloop_total());
  if (!rc && rdzv_n > 0 && !g_cfg.redis) run_rendezvous(rdzv_n);
  tdist_store_server_stop(srv);
  return rc;
}
