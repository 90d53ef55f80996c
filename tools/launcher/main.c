/*
 * tdistrun - start the ranks of a tdist job on this node (docs/launcher.md).
 *
 *   tdistrun -n N [--nnodes M --node-rank R] [--master-addr A] [--master-port P]
 *            [--store URL] [--backend cpu|nccl] [--grace S] [--dump-grace MS]
 *            [--external-store] [--no-prefix] [--no-fail-fast] [--no-host-agent]
 *            [--] prog args...
 *
 * Local rank i gets RANK = R*N + i, WORLD_SIZE = M*N, LOCAL_RANK = i,
 * LOCAL_WORLD_SIZE = N, GROUP_RANK = R, TDIST_STORE_URL=tcp://A:P (the store),
 * MASTER_ADDR/MASTER_PORT (a second port nobody listens on, for the program's
 * own rendezvous, e.g. torch's env://), TDIST_STORE_HOSTED=1 (rank 0 must not host another store)
 * and, with
 * --backend, TDIST_BACKEND.
 *
 * The store: node 0's launcher hosts it, unless --master-addr names an
 * address that is not on this machine or --external-store says a server
 * (tdist-store) already runs there. A single-node job binds 127.0.0.1 on a
 * free port unless told otherwise; a multi-node job binds 0.0.0.0 on
 * --master-port (required, the other nodes must know it).
 *
 * --store URL (etcd://h:p,h:p/prefix, tcp://h:p, file:///path): the ranks
 * get that TDIST_STORE_URL (MASTER_ADDR/MASTER_PORT on one node only) and nobody hosts a
 * store; a single-node job adds a sub-prefix unique to the run to an etcd
 * URL, so runs never see each other's keys.
 *
 * Multi-node: every launcher also connects to the store. The first one whose
 * rank fails writes "tdistrun/failed"; the others see it within ~250 ms and
 * stop their ranks. Each launcher counts itself into "tdistrun/done" when its
 * ranks are gone; node 0 keeps the store up until all nodes are done.
 *
 * The host agent (agent.c): unless --no-host-agent or --store, the launcher
 * heartbeats for its ranks (one "tdist/hbh/<node rank>" per interval) and
 * relays the store's abort and death records to them; the ranks find it
 * through TDIST_HOST_AGENT. Without it each rank beats and watches itself.
 *
 * Orphans: tdistrun is a child subreaper (PR_SET_CHILD_SUBREAPER), so what
 * a rank leaves running when it dies - the tdist-store a rank 0 hosting its
 * own store started (src/store/spawn.c), which outlives a killed rank 0 on
 * purpose and ends by itself once the job is over - is adopted by tdistrun,
 * not by PID 1, and reaped before tdistrun returns (reap_adopted). The
 * launcher is the right owner: it is the one process that outlives every
 * rank and knows when the job ends; rank 0 cannot reap after its own death,
 * and a double fork would hand the store to PID 1, which in a container is
 * often a program that never reaps (the zombies of issue 44).
 *
 * Threads: main thread, the store server's thread when hosting, the host
 * agent's two threads.
 */
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tdist/errors.h"
#include "tdist/store.h"
#include "tdistrun.h"

extern char **environ;

typedef struct opts {
  int nproc, nnodes, node_rank, master_port, external_store, prefix, keep_going;
  int no_agent; /* --no-host-agent */
  const char *master_addr, *backend;
  const char *store_url; /* --store; for etcd with one node, the run's own sub-prefix */
  double grace_s;
  int dump_grace_ms; /* -1: not given (TDIST_DUMP_GRACE_MS, else 1000) */
  char **argv;       /* the rank program and its arguments */
} opts_t;

static void usage(FILE *f) {
  fprintf(f, "usage: tdistrun -n N [options] [--] prog [args...]\n"
             "  -n, --nproc-per-node N  ranks to start on this node\n"
             "  --nnodes M              nodes in the job (default 1)\n"
             "  --node-rank R           this node's index, 0..M-1 (default 0)\n"
             "  --master-addr A         store address given to ranks (default 127.0.0.1)\n"
             "  --master-port P         store port (default: a free one; required if M > 1)\n"
             "  --store URL             the ranks meet on this store instead of a hosted one:\n"
             "                          etcd://host:port[,host:port...][/prefix], tcp://host:port\n"
             "                          or file:///path (exported as TDIST_STORE_URL)\n"
             "  --backend B             exported as TDIST_BACKEND (cpu or nccl)\n"
             "  --grace S               seconds between SIGTERM and SIGKILL (default 3)\n"
             "  --dump-grace MS         after a rank fails, milliseconds the others get to\n"
             "                          exit on their own and write their flight-recorder\n"
             "                          dumps before SIGTERM (default: TDIST_DUMP_GRACE_MS,\n"
             "                          else 1000; 0: SIGTERM at once)\n"
             "  --external-store        a store server already runs at A:P; do not host one\n"
             "  --no-prefix             do not prefix output lines with \"[rank r] \"\n"
             "  --no-fail-fast          a failed rank does not stop the others; exit non-zero\n"
             "                          at the end naming the first failure\n"
             "  --no-host-agent         each rank heartbeats to the store and watches its\n"
             "                          records itself (default: this launcher does it for\n"
             "                          its ranks, one heartbeat per host; not with --store)\n"
             "See docs/launcher.md.\n");
}

static int parse_int(const char *flag, const char *s, int min, int max, int *out) {
  char *end;
  long v = strtol(s, &end, 10);
  if (!*s || *end || v < min || v > max) {
    fprintf(stderr, "tdistrun: %s '%s': expected an integer in [%d, %d]\n", flag, s, min, max);
    return -1;
  }
  *out = (int)v;
  return 0;
}

static int parse_args(int argc, char **argv, opts_t *o) {
  *o = (opts_t){.nproc = 0, .nnodes = 1, .grace_s = 3, .dump_grace_ms = -1, .prefix = 1};
  int i;
  for (i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--")) {
      i++;
      break;
    }
    if (a[0] != '-') break;
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      exit(0);
    } else if (!strcmp(a, "--external-store")) {
      o->external_store = 1;
      continue;
    } else if (!strcmp(a, "--no-prefix")) {
      o->prefix = 0;
      continue;
    } else if (!strcmp(a, "--no-fail-fast")) {
      o->keep_going = 1;
      continue;
    } else if (!strcmp(a, "--no-host-agent")) {
      o->no_agent = 1;
      continue;
    }
    if (!v) {
      fprintf(stderr, "tdistrun: %s needs a value\n", a);
      return -1;
    }
    i++;
    int rc = 0;
    if (!strcmp(a, "-n") || !strcmp(a, "--nproc-per-node")) {
      rc = parse_int(a, v, 1, 4096, &o->nproc);
    } else if (!strcmp(a, "--nnodes")) {
      rc = parse_int(a, v, 1, 1 << 20, &o->nnodes);
    } else if (!strcmp(a, "--node-rank")) {
      rc = parse_int(a, v, 0, 1 << 20, &o->node_rank);
    } else if (!strcmp(a, "--master-addr")) {
      o->master_addr = v;
    } else if (!strcmp(a, "--master-port")) {
      rc = parse_int(a, v, 1, 65535, &o->master_port);
    } else if (!strcmp(a, "--backend")) {
      o->backend = v;
    } else if (!strcmp(a, "--store")) {
      o->store_url = v;
      if (strncmp(v, "etcd://", 7) && strncmp(v, "tcp://", 6) && strncmp(v, "file://", 7)) {
        fprintf(stderr, "tdistrun: --store '%s': expected etcd://, tcp:// or file://\n", v);
        rc = -1;
      }
    } else if (!strcmp(a, "--dump-grace")) {
      rc = parse_int(a, v, 0, 3600000, &o->dump_grace_ms);
    } else if (!strcmp(a, "--grace")) {
      char *end;
      o->grace_s = strtod(v, &end);
      if (*end || o->grace_s < 0 || o->grace_s > 3600) {
        fprintf(stderr, "tdistrun: --grace '%s': expected seconds in [0, 3600]\n", v);
        rc = -1;
      }
    } else {
      fprintf(stderr, "tdistrun: unknown option %s\n", a);
      usage(stderr);
      rc = -1;
    }
    if (rc) return rc;
  }
  if (i >= argc) {
    fprintf(stderr, "tdistrun: no program given\n");
    usage(stderr);
    return -1;
  }
  o->argv = argv + i;
  if (o->nproc < 1) {
    fprintf(stderr, "tdistrun: -n N is required\n");
    return -1;
  }
  if (o->node_rank >= o->nnodes) {
    fprintf(stderr, "tdistrun: --node-rank %d is not below --nnodes %d\n", o->node_rank, o->nnodes);
    return -1;
  }
  if ((long)o->nproc * o->nnodes > (1 << 30)) {
    fprintf(stderr, "tdistrun: too many ranks\n");
    return -1;
  }
  if (o->store_url && (o->master_addr || o->master_port || o->external_store)) {
    fprintf(stderr, "tdistrun: --store replaces --master-addr, --master-port and "
                    "--external-store\n");
    return -1;
  }
  if (o->nnodes > 1 && !o->store_url && (!o->master_addr || !o->master_port)) {
    fprintf(stderr,
            "tdistrun: a multi-node job (--nnodes %d) needs --master-addr and "
            "--master-port, the same on every node\n",
            o->nnodes);
    return -1;
  }
  if (o->external_store && !o->master_port) {
    fprintf(stderr, "tdistrun: --external-store needs --master-port\n");
    return -1;
  }
  if (o->dump_grace_ms < 0) {
    const char *e = getenv("TDIST_DUMP_GRACE_MS");
    o->dump_grace_ms = 1000;
    if (e && *e && parse_int("TDIST_DUMP_GRACE_MS", e, 0, 3600000, &o->dump_grace_ms)) return -1;
  }
  return 0;
}

/* 1 if `addr` resolves to an address of one of this machine's interfaces
 * (loopback included), so the launcher should host the store there. */
static int is_local_addr(const char *addr) {
  struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
  if (getaddrinfo(addr, NULL, &hints, &res) != 0) return 0;
  struct ifaddrs *ifs = NULL;
  int local = 0;
  if (getifaddrs(&ifs) != 0) ifs = NULL;
  for (struct addrinfo *ai = res; ai && !local; ai = ai->ai_next) {
    if (ai->ai_family == AF_INET) {
      struct in_addr a = ((struct sockaddr_in *)ai->ai_addr)->sin_addr;
      if ((ntohl(a.s_addr) >> 24) == 127) local = 1;
      for (struct ifaddrs *i = ifs; i && !local; i = i->ifa_next)
        if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET &&
            ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr == a.s_addr)
          local = 1;
    } else if (ai->ai_family == AF_INET6) {
      struct in6_addr a = ((struct sockaddr_in6 *)ai->ai_addr)->sin6_addr;
      if (IN6_IS_ADDR_LOOPBACK(&a)) local = 1;
      for (struct ifaddrs *i = ifs; i && !local; i = i->ifa_next)
        if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET6 &&
            !memcmp(&((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr, &a, sizeof(a)))
          local = 1;
    }
  }
  if (ifs) freeifaddrs(ifs);
  freeaddrinfo(res);
  return local;
}

/* A TCP port nobody listens on now (the kernel's pick), or 0. Another
 * process may take it before the rank binds it; the kernel hands out
 * ephemeral ports in turn, so that is rare. */
static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), port = 0;
  if (fd < 0) return 0;
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY)};
  socklen_t l = sizeof(a);
  if (!bind(fd, (struct sockaddr *)&a, sizeof(a)) && !getsockname(fd, (struct sockaddr *)&a, &l))
    port = ntohs(a.sin_port);
  close(fd);
  return port;
}

/* The variables tdistrun sets; inherited copies are dropped. */
static const char *const own_vars[] = {
    "RANK",        "WORLD_SIZE",  "LOCAL_RANK",         "LOCAL_WORLD_SIZE", "GROUP_RANK",
    "MASTER_ADDR", "MASTER_PORT", "TDIST_STORE_HOSTED", "TDIST_STORE_URL",  "TDIST_HOST_AGENT",
    NULL};

static int is_own_var(const char *kv) {
  for (const char *const *v = own_vars; *v; v++) {
    size_t l = strlen(*v);
    if (!strncmp(kv, *v, l) && kv[l] == '=') return 1;
  }
  return 0;
}

/* Environment of one rank: ours, then the inherited ones we do not set. */
static char **rank_env(const opts_t *o, int local, const char *addr, int port, int torch_port,
                       const char *agent) {
  size_t n = 0;
  while (environ[n])
    n++;
  char **env = calloc(n + 16, sizeof(char *));
  if (!env) return NULL;
  size_t k = 0;
  char tmp[512];
#define PUT(...)                             \
  do {                                       \
    snprintf(tmp, sizeof(tmp), __VA_ARGS__); \
    env[k++] = strdup(tmp);                  \
  } while (0)
  PUT("RANK=%d", o->node_rank * o->nproc + local);
  PUT("WORLD_SIZE=%d", o->nnodes * o->nproc);
  PUT("LOCAL_RANK=%d", local);
  PUT("LOCAL_WORLD_SIZE=%d", o->nproc);
  PUT("GROUP_RANK=%d", o->node_rank);
  if (o->store_url) {
    size_t l = strlen(o->store_url) + 17; /* may be longer than tmp */
    if ((env[k] = malloc(l))) snprintf(env[k], l, "TDIST_STORE_URL=%s", o->store_url);
    k++;
  } else {
    /* The store as a URL; MASTER_ADDR/MASTER_PORT stay free for a program's
     * own rendezvous (torch's env:// makes rank 0 listen on MASTER_PORT). */
    PUT(strchr(addr, ':') ? "TDIST_STORE_URL=tcp://[%s]:%d" : "TDIST_STORE_URL=tcp://%s:%d", addr,
        port);
  }
  if (torch_port > 0) {
    PUT("MASTER_ADDR=%s", addr);
    PUT("MASTER_PORT=%d", torch_port);
  }
  PUT("TDIST_STORE_HOSTED=1");
  if (agent) PUT("TDIST_HOST_AGENT=%s", agent);
  /* --backend wins over an inherited TDIST_BACKEND, which is kept otherwise
   * (TDIST_BACKEND=nccl tdistrun ... runs on nccl). */
  if (o->backend) PUT("TDIST_BACKEND=%s", o->backend);
#undef PUT
  for (size_t i = 0; i < n; i++)
    if (!is_own_var(environ[i]) && !(o->backend && !strncmp(environ[i], "TDIST_BACKEND=", 14)))
      env[k++] = strdup(environ[i]);
  for (size_t i = 0; i < k; i++)
    if (!env[i]) return NULL; /* out of memory: the process exits anyway */
  return env;
}

/* ---- coordination between the launchers of a multi-node job ---------------- */

typedef struct coord {
  tdist_store_t *store;
  int world; /* WORLD_SIZE of the job */
  int node_rank;
} coord_t;

/* Tick: has another node reported a failure? */
static int coord_tick(void *arg, char *msg, size_t len) {
  coord_t *c = arg;
  const char *key = "tdistrun/failed";
  int exists = 0;
  if (tdist_store_check(c->store, &key, 1, &exists) != 0 || !exists) return 0;
  void *v = NULL;
  size_t vl = 0;
  if (tdist_store_get(c->store, key, &v, &vl, 1000) != 0) return 0;
  snprintf(msg, len, "%.*s", (int)vl, (char *)v);
  tdist_store_free(v);
  return 1;
}

/* ---- the store's death records ----------------------------------------------- */

/* What the launcher knows of the job's death records (liveness.h): the store
 * declares a rank dead by setting "tdist/dead/<rank>" = reason, then the
 * abort record "tdist/aborts/<n>" with n from "tdist/aborts/count". */
typedef struct deaths {
  tdist_store_t *store; /* coord.store: not owned */
  int64_t seen;         /* count of records up to which every death was looked at */
} deaths_t;

/* Scan (supervision loop, main thread, every ~250 ms): mark the running
 * ranks the store declared dead. The per-rank keys are only read when the
 * record count moved; the count is taken as seen once its last record
 * exists (the count is bumped before the dead key is set), so a death is
 * never missed and a quiet job costs two requests per tick. */
static void deaths_scan(void *arg, trun_job_t *job) {
  deaths_t *d = arg;
  const char *ck = "tdist/aborts/count";
  int exists = 0;
  int64_t n = 0;
  void *v = NULL;
  size_t vl = 0;
  char num[32];
  /* Read, not add 0: no write (an etcd store would count a revision). */
  if (tdist_store_check(d->store, &ck, 1, &exists) != 0 || !exists) return;
  if (tdist_store_get(d->store, ck, &v, &vl, 1000) != 0) return;
  snprintf(num, sizeof(num), "%.*s", (int)vl, (char *)v); /* decimal text */
  tdist_store_free(v);
  n = strtoll(num, NULL, 10);
  if (n == d->seen) return;
  char key[64];
  snprintf(key, sizeof(key), "tdist/aborts/%" PRId64, n);
  const char *rk = key;
  int last = 0;
  if (tdist_store_check(d->store, &rk, 1, &last) != 0) return;
  for (int i = 0; i < job->nlocal; i++) {
    trun_rank_t *r = &job->ranks[i];
    if (r->pid <= 0 || r->dead) continue;
    char dkey[48];
    snprintf(dkey, sizeof(dkey), "tdist/dead/%d", r->global_rank);
    const char *dk = dkey;
    if (tdist_store_check(d->store, &dk, 1, &exists) != 0 || !exists) continue;
    if (tdist_store_get(d->store, dkey, &v, &vl, 1000) != 0) continue;
    snprintf(r->dead_why, sizeof(r->dead_why), "%.*s", (int)vl, (char *)v);
    tdist_store_free(v);
    r->dead = 1;
  }
  if (last) d->seen = n;
}

/* (main thread, supervision loop) A rank of this node was reaped: record
 * it for the world rendezvous, so that ranks still waiting there fail at
 * once naming it instead of waiting out their timeout (store/rendezvous.c
 * tdist__rdzv_wait_go). The record is "tdist/rdzv/exit/<round>" for the
 * round the rank can no longer join: its own count of joins
 * ("arrivals/<rank>", on a store that counts keys per rank, etcd), else
 * the round open on the shared counter ("arrived" / world size). A round
 * it already completed is not touched (its "go" is set: waiters do not
 * look), so a rank that exits at the job's normal end harms nobody, and
 * a record left on a long-lived store by an earlier job names an earlier
 * round. The first record of a round wins. */
static void rank_exited(void *arg, int rank, int status) {
  coord_t *c = arg;
  char key[64], msg[160], why[96], num[32];
  void *v = NULL;
  size_t vl = 0;
  int64_t round = 0;
  int exists = 0;
  snprintf(key, sizeof(key), "tdist/rdzv/arrivals/%d", rank);
  const char *k = key;
  if (tdist_store_check(c->store, &k, 1, &exists) == 0 && exists &&
      tdist_store_get(c->store, key, &v, &vl, 1000) == 0) {
    snprintf(num, sizeof(num), "%.*s", (int)vl, (char *)v);
    round = strtoll(num, NULL, 10);
  } else {
    const char *ak = "tdist/rdzv/arrived";
    if (tdist_store_check(c->store, &ak, 1, &exists) == 0 && exists &&
        tdist_store_get(c->store, ak, &v, &vl, 1000) == 0) {
      snprintf(num, sizeof(num), "%.*s", (int)vl, (char *)v);
      round = strtoll(num, NULL, 10) / c->world;
    }
  }
  tdist_store_free(v);
  trun_describe_status(status, why, sizeof(why));
  snprintf(msg, sizeof(msg), "rank %d %s", rank, why);
  snprintf(key, sizeof(key), "tdist/rdzv/exit/%" PRId64, round);
  tdist_store_compare_set(c->store, key, NULL, 0, msg, strlen(msg), NULL, NULL);
}

/* After this node's ranks are gone: report a local failure (first one wins),
 * count this node done, and on the hosting node wait (bounded, interruptible
 * by the handled signals) until every node is done before the store stops. */
static void coord_finish(coord_t *c, const trun_job_t *job, int hosting, int nnodes) {
  if (job->fail_rank >= 0) {
    char msg[256], why[200];
    if (job->fail_dead)
      snprintf(why, sizeof(why), "was declared dead by the store (%s)", job->fail_why);
    else
      trun_describe_status(job->fail_status, why, sizeof(why));
    snprintf(msg, sizeof(msg), "node %d: rank %d %s", c->node_rank, job->fail_rank, why);
    tdist_store_compare_set(c->store, "tdistrun/failed", NULL, 0, msg, strlen(msg), NULL, NULL);
  }
  int64_t done = 0;
  if (tdist_store_add(c->store, "tdistrun/done", 1, &done) != 0) return;
  if (done == nnodes) tdist_store_set(c->store, "tdistrun/all_done", "", 0);
  if (!hosting) return;
  const char *key = "tdistrun/all_done";
  const char *t = getenv("TDIST_TIMEOUT_MS");
  int64_t budget_ms = t && atoll(t) > 0 ? atoll(t) : 600000;
  for (int64_t waited = 0; waited < budget_ms; waited += 500) {
    if (tdist_store_wait(c->store, &key, 1, 500) == 0) return;
    struct pollfd p = {.fd = job->sigfd, .events = POLLIN};
    if (poll(&p, 1, 0) > 0) break;
  }
  fprintf(stderr, "tdistrun: stopping the store before every node finished\n");
}

/* How long tdistrun waits, once its ranks ended, for what it adopted. */
#define ADOPTED_MS 10000

/* Reap every process this launcher adopted (see "Orphans" above), waiting
 * at most ADOPTED_MS for those still running; the rest are named and left
 * (PID 1 adopts them when tdistrun exits). Main thread, after every rank was
 * reaped, so nothing reaped here is a rank. */
static void reap_adopted(void) {
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {
    int st = 0;
    pid_t p = waitpid(-1, &st, WNOHANG);
    if (p > 0) continue;
    if (p < 0 && errno == EINTR) continue;
    if (p < 0) return; /* ECHILD: nothing left */
    clock_gettime(CLOCK_MONOTONIC, &t);
    if ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 >= ADOPTED_MS) break;
    struct timespec nap = {0, 10 * 1000 * 1000};
    nanosleep(&nap, NULL);
  }
  fprintf(stderr,
          "tdistrun: processes left behind by the ranks still run %d s after the job ended; "
          "not waiting for them\n",
          ADOPTED_MS / 1000);
}

int main(int argc, char **argv) {
  opts_t o;
  if (parse_args(argc, argv, &o)) return 2;
  if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0)
    fprintf(stderr, "tdistrun: PR_SET_CHILD_SUBREAPER: %s\n", strerror(errno));
  int rc = 1, nenv = 0;
  tdist_store_server_t *srv = NULL;
  trun_agent_t *agent = NULL;
  coord_t coord = {.node_rank = o.node_rank, .world = o.nnodes * o.nproc};
  deaths_t deaths = {.seen = 0};
  trun_job_t job = {.nlocal = o.nproc,
                    .grace_s = o.grace_s,
                    .dump_grace_s = o.dump_grace_ms / 1000.0,
                    .prefix = o.prefix,
                    .keep_going = o.keep_going,
                    .sigfd = -1};
  char ***envs = NULL;
  const char *addr = o.master_addr ? o.master_addr : "127.0.0.1";
  int port = o.master_port;
  int hosting = o.node_rank == 0 && !o.external_store && !o.store_url && is_local_addr(addr);
  char *run_url = NULL;
  if (o.store_url && o.nnodes == 1 && !strncmp(o.store_url, "etcd://", 7)) {
    /* A run of its own under the given prefix (default "tdist"): rank
     * claims and records of an earlier run stay out of sight. */
    char host[64] = "host";
    gethostname(host, sizeof(host) - 1);
    host[strcspn(host, ".")] = 0;
    size_t l = strlen(o.store_url) + 160;
    int has_prefix = strchr(o.store_url + 7, '/') != NULL;
    if (!(run_url = malloc(l))) goto nomem;
    snprintf(run_url, l, "%s%s%srun-%s-%d-%lld", o.store_url, has_prefix ? "" : "/tdist",
             o.store_url[strlen(o.store_url) - 1] == '/' ? "" : "/", host, (int)getpid(),
             (long long)time(NULL));
    o.store_url = run_url;
  }

  /* Before the server thread starts, so it inherits the blocked mask. */
  if ((job.sigfd = trun_signals_block()) < 0) {
    perror("tdistrun: signalfd");
    goto done;
  }
  if (hosting) {
    int loopback = o.nnodes == 1 &&
                   (!o.master_addr || !strcmp(addr, "127.0.0.1") || !strcmp(addr, "localhost"));
    tdist_store_server_opts_t so = {.mask = TDIST_STORE_SERVER_FIELD_HOST |
                                            TDIST_STORE_SERVER_FIELD_PORT,
                                    .host = loopback ? "127.0.0.1" : "0.0.0.0",
                                    .port = port};
    if (tdist_store_server_start(&so, &srv) != 0) {
      fprintf(stderr, "tdistrun: cannot host the store: %s\n", tdist_last_error());
      goto done;
    }
    port = tdist_store_server_port(srv);
  } else if (!port && !o.store_url) {
    fprintf(stderr,
            "tdistrun: this launcher does not host the store (%s is not a local "
            "address): give --master-port\n",
            addr);
    goto done;
  }
  /* A connection of the launcher's own: the death records (every job) and
   * the coordination between nodes (multi-node). A single-node job whose
   * store cannot be reached still starts (its ranks will say why), only
   * without the death watch; its ops give up after 5 s, so a store that
   * went away cannot hold the supervision loop. */
  tdist_store_opts_t co = {.mask = TDIST_STORE_FIELD_TIMEOUT, .timeout_ms = 5000};
  if (o.nnodes > 1) co.mask = 0; /* the other launchers may start much later */
  int crc = o.store_url ? tdist_store_open_url(o.store_url, &co, &coord.store)
                        : tdist_store_connect(addr, port, &co, &coord.store);
  if (crc != 0 && o.nnodes > 1) {
    fprintf(stderr, "tdistrun: cannot reach the store at %s: %s\n",
            o.store_url ? o.store_url : addr, tdist_last_error());
    goto done;
  }
  if (crc != 0) {
    fprintf(stderr,
            "tdistrun: cannot reach the store at %s (%s): ranks the store declares "
            "dead will not be stopped\n",
            o.store_url ? o.store_url : addr, tdist_last_error());
    coord.store = NULL;
  } else {
    deaths.store = coord.store;
    job.scan = deaths_scan;
    job.scan_arg = &deaths;
    job.exited = rank_exited;
    job.exited_arg = &coord;
  }
  /* The host agent needs the store server (not etcd or a file). */
  if (coord.store && !o.store_url && !o.no_agent)
    trun_agent_start(addr, port, o.node_rank, o.node_rank * o.nproc, o.nproc, o.nnodes * o.nproc,
                     &agent);
  if (o.nnodes > 1) {
    job.tick = coord_tick;
    job.tick_arg = &coord;
  }
  /* MASTER_PORT for the program's own rendezvous (torch's TCPStore on rank
   * 0): a free port on one node, --master-port + 1 on several (every node
   * must name the same one). With --store on several nodes there is no
   * address to give: no MASTER_ADDR/MASTER_PORT. */
  int torch_port = o.nnodes > 1 ? (o.store_url ? 0 : port + 1) : free_port();
  if (torch_port > 65535) torch_port = 0;
  job.ranks = calloc((size_t)o.nproc, sizeof(trun_rank_t));
  envs = calloc((size_t)o.nproc, sizeof(char **));
  if (!job.ranks || !envs) goto nomem;
  for (; nenv < o.nproc; nenv++) {
    job.ranks[nenv].global_rank = o.node_rank * o.nproc + nenv;
    job.ranks[nenv].out.fd = job.ranks[nenv].err.fd = -1;
    if (!(envs[nenv] =
              rank_env(&o, nenv, addr, port, torch_port, agent ? trun_agent_name(agent) : NULL)))
      goto nomem;
  }
  if (trun_spawn(&job, o.argv, envs) != 0) goto done;
  rc = trun_supervise(&job);
  trun_agent_stop(agent); /* every local rank ended: its last beat, "bye" */
  agent = NULL;
  if (coord.store && o.nnodes > 1) coord_finish(&coord, &job, hosting, o.nnodes);
  goto done;
nomem:
  fprintf(stderr, "tdistrun: out of memory\n");
done:
  for (int i = 0; i < nenv; i++) {
    for (char **e = envs[i]; e && *e; e++)
      free(*e);
    free(envs[i]);
  }
  free(envs);
  free(job.ranks);
  trun_agent_stop(agent);
  tdist_store_release(coord.store);
  tdist_store_server_stop(srv);
  free(run_url);
  if (job.sigfd >= 0) close(job.sigfd);
  reap_adopted();
  return rc;
}
