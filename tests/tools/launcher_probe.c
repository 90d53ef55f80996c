/*
 * launcher_probe - the rank program test_launcher runs under tdistrun. It
 * reports what a rank sees and misbehaves on command:
 *
 *   env                 print "ENV rank=.. world=.. local=.. lws=.. group=..
 *                       addr=.. port=.. hosted=.. backend=.."
 *   store               connect to $TDIST_STORE_URL, set probe/<rank>,
 *                       wait for every rank's key, print "STORE OK <sum>"
 *   rdzv                tdist__rendezvous_join from the environment (the
 *                       launcher's store, TDIST_STORE_HOSTED honoured), print
 *                       "RDZV rank r size n", then clean up
 *   lines K             K lines on stdout and stderr, each written in pieces,
 *                       plus one 100000-byte line on stdout
 *   fail R CODE         rank R exits CODE after 0.2 s; others wait for SIGTERM
 *   kill9 R             rank R kills itself with SIGKILL; others wait
 *   ignore-term R       rank R exits 1; the others ignore SIGTERM
 *   late-exit R MS DIR  like a tdist job whose ranks dump after a failure:
 *                       once every other rank is waiting, rank R exits 3;
 *                       the others learn it (through the store), wait until
 *                       tdistrun reaped it (its pid is gone), take MS ms
 *                       (writing their dump), create DIR/done.<rank> and
 *                       exit 1
 *   wait-signal         print "ready", then report SIGUSR1 and exit 0 on
 *                       SIGTERM/SIGINT ("got SIGxxx")
 *   init [R]            join the tdist job (tdist_init_process_group), a
 *                       barrier, print "INIT <backend>"; rank 0 first prints
 *                       "STORE <pid> <start time>" of the tdist-store it
 *                       started, if any; then destroy and exit 0 - except
 *                       rank R (if given), which _exit(0)s without destroying
 *                       anything (with a third argument "kill": raise(SIGKILL))
 *   stop-self R         every rank prints "PID <pid>", joins the tdist job
 *                       (tdist_init_process_group: heartbeats to the store)
 *                       and waits in a barrier; then rank R stops itself
 *                       (raise(SIGSTOP): no heartbeat any more, its
 *                       connections open) and the others destroy the group,
 *                       print "done" and exit 0
 *   watch-death HOW R,R..
 *                       every rank prints "PID <pid>", joins the tdist job
 *                       with an abort callback and waits in a barrier;
 *                       then the first rank listed kills itself (HOW kill9)
 *                       or stops itself (stop); with HOW none nobody acts
 *                       (the test kills a launcher). Every other rank waits
 *                       (up to 120 s) for its world group to abort and for
 *                       the store's dead set to hold every listed rank,
 *                       lets 3 s pass (the death records reach its
 *                       monitor, which logs them with TDIST_DEBUG=INFO),
 *                       prints "ABORT <reason>", destroys and exits 0
 *
 * "Others wait" means: print "waiting", sleep up to 60 s, and on SIGTERM print
 * "TERM" and exit 0.
 */
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "run_util.h"
#include "store/rendezvous.h"
#include "tdist/tdist.h"

static volatile sig_atomic_t got_sig;
static int env_int(const char *n) {
  const char *v = getenv(n);
  return v ? atoi(v) : -1;
}

static const char *env_str(const char *n) {
  const char *v = getenv(n);
  return v ? v : "-";
}

static char abort_why[512];
static volatile int aborted; /* set by the progress thread, polled below */

static void on_abort(tdist_group_t *g, int status, const char *reason, void *arg) {
  (void)g, (void)status, (void)arg;
  snprintf(abort_why, sizeof(abort_why), "%s", reason);
  __atomic_store_n(&aborted, 1, __ATOMIC_RELEASE);
}

/* watch-death (see the top). */
static int watch_death(int rank, const char *how, const char *list) {
  int dead[16], nd = 0;
  for (const char *p = list; *p && nd < 16; p++) {
    dead[nd++] = atoi(p);
    while (p[1] && p[1] != ',')
      p++;
    if (p[1] == ',') p++;
  }
  printf("PID %d\n", (int)getpid());
  fflush(stdout);
  tdist_group_t *g = NULL;
  if (tdist_init_process_group(NULL, &g) || tdist_group_on_abort(g, on_abort, NULL) ||
      tdist_barrier(g, NULL, NULL)) {
    fprintf(stderr, "watch-death: %s\n", tdist_last_error());
    return 1;
  }
  if (nd > 0 && rank == dead[0] && strcmp(how, "none") != 0) {
    printf("acting\n");
    fflush(stdout);
    raise(!strcmp(how, "stop") ? SIGSTOP : SIGKILL);
    return 9; /* only if someone sent SIGCONT: the launcher must SIGKILL */
  }
  printf("waiting\n");
  fflush(stdout);
  tdist_store_t *st = NULL; /* the job's store itself (the group's is a prefix view) */
  if (tdist_store_open_url(env_str("TDIST_STORE_URL"), NULL, &st) != 0) {
    fprintf(stderr, "watch-death: %s\n", tdist_last_error());
    return 1;
  }
  int known = 0;
  for (int t = 0; t < 12000 && !known; t++) {
    usleep(10000);
    if (!__atomic_load_n(&aborted, __ATOMIC_ACQUIRE)) continue;
    known = 1;
    for (int i = 0; i < nd && known; i++) {
      char key[48];
      snprintf(key, sizeof(key), "tdist/dead/%d", dead[i]);
      const char *keys[1] = {key};
      int exists = 0;
      if (tdist_store_check(st, keys, 1, &exists) != 0 || !exists) known = 0;
    }
  }
  tdist_store_release(st);
  if (!known) {
    fprintf(stderr, "watch-death: not every listed rank was declared dead in 120 s\n");
    return 1;
  }
  sleep(3);
  printf("ABORT %s\n", abort_why);
  fflush(stdout);
  tdist_group_destroy(g);
  return 0;
}
static void on_sig(int s) { got_sig = s; }

/* Write s in three pieces with pauses, so the launcher sees partial lines. */
static void write_pieces(int fd, const char *s) {
  size_t n = strlen(s), a = n / 3, b = 2 * n / 3;
  if (write(fd, s, a) < 0 || (usleep(200), write(fd, s + a, b - a)) < 0 ||
      write(fd, s + b, n - b) < 0)
    _exit(10);
}

static int wait_for_term(void) {
  signal(SIGTERM, on_sig);
  printf("waiting\n");
  fflush(stdout);
  for (int i = 0; i < 6000 && !got_sig; i++)
    usleep(10000);
  printf(got_sig ? "TERM\n" : "not stopped\n");
  return got_sig ? 0 : 9;
}

static int do_store(int rank, int size) {
  tdist_store_t *s = NULL;
  tdist_store_opts_t o = {.mask = TDIST_STORE_FIELD_TIMEOUT, .timeout_ms = 20000};
  if (tdist_store_open_url(env_str("TDIST_STORE_URL"), &o, &s)) goto fail;
  char key[64], val[32];
  snprintf(key, sizeof(key), "probe/%d", rank);
  snprintf(val, sizeof(val), "%d", rank + 1);
  if (tdist_store_set(s, key, val, strlen(val))) goto fail;
  long sum = 0;
  for (int r = 0; r < size; r++) {
    void *v;
    size_t len;
    snprintf(key, sizeof(key), "probe/%d", r);
    if (tdist_store_get(s, key, &v, &len, 20000)) goto fail;
    snprintf(val, sizeof(val), "%.*s", (int)len, (char *)v); /* values are not NUL-terminated */
    sum += strtol(val, NULL, 10);
    tdist_store_free(v);
  }
  /* Nobody leaves before all have read, so the keys stay meaningful. */
  int64_t out = 0;
  if (tdist_store_add(s, "probe/read", 1, &out)) goto fail;
  const char *k = "probe/all_read";
  if (out == size && tdist_store_set(s, k, "", 0)) goto fail;
  if (tdist_store_wait(s, &k, 1, 20000)) goto fail;
  printf("STORE OK %ld\n", sum);
  tdist_store_release(s);
  return 0;
fail:
  fprintf(stderr, "store: %s\n", tdist_last_error());
  tdist_store_release(s);
  return 1;
}

/* The tdist-store this process started (its child), printed as
 * "STORE <pid> <start time>" so that the test can tell later whether that
 * very process is still there. */
static void print_store_child(void) {
  DIR *d = opendir("/proc");
  struct dirent *e;
  while (d && (e = readdir(d))) {
    char comm[32], state;
    pid_t ppid;
    unsigned long long start;
    pid_t pid = (pid_t)atoi(e->d_name);
    if (pid <= 0 || ru_proc_stat(pid, comm, sizeof(comm), &state, &ppid, &start) != 0) continue;
    if (ppid == getpid() && !strcmp(comm, "tdist-store"))
      printf("STORE %d %llu\n", (int)pid, start);
  }
  if (d) closedir(d);
}

static int do_init(int rank, int exiter, int kill_self) {
  tdist_group_t *g = NULL;
  if (tdist_init_process_group(NULL, &g) || tdist_barrier(g, NULL, NULL)) {
    fprintf(stderr, "init: %s\n", tdist_last_error());
    return 1;
  }
  if (rank == 0) print_store_child();
  printf("INIT %s\n", tdist_group_backend(g));
  fflush(stdout);
  if (rank == exiter && kill_self) raise(SIGKILL);
  if (rank == exiter) _exit(0);
  return tdist_group_destroy(g) ? 1 : 0;
}

static int do_lines(int rank, int k) {
  char line[256];
  for (int i = 0; i < k; i++) {
    snprintf(line, sizeof(line), "L %d %d %0100d\n", rank, i, rank);
    write_pieces(1, line);
    snprintf(line, sizeof(line), "E %d %d %080d\n", rank, i, rank);
    write_pieces(2, line);
  }
  char *big = malloc(100002);
  memset(big, 'a' + rank, 100000);
  big[100000] = '\n';
  big[100001] = 0;
  write_pieces(1, big);
  free(big);
  return 0;
}

int main(int argc, char **argv) {
  int rank = env_int("RANK"), size = env_int("WORLD_SIZE");
  const char *mode = argc > 1 ? argv[1] : "";
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (!strcmp(mode, "env")) {
    printf("ENV rank=%d world=%d local=%d lws=%d group=%d addr=%s port=%s store=%s hosted=%s "
           "backend=%s\n",
           rank, size, env_int("LOCAL_RANK"), env_int("LOCAL_WORLD_SIZE"), env_int("GROUP_RANK"),
           env_str("MASTER_ADDR"), env_str("MASTER_PORT"), env_str("TDIST_STORE_URL"),
           env_str("TDIST_STORE_HOSTED"), env_str("TDIST_BACKEND"));
    return 0;
  }
  if (!strcmp(mode, "store")) return do_store(rank, size);
  if (!strcmp(mode, "rdzv")) {
    tdist__rdzv_t r;
    if (tdist__rendezvous_join(NULL, &r)) {
      fprintf(stderr, "rdzv: %s\n", tdist_last_error());
      return 1;
    }
    printf("RDZV rank %d size %d\n", r.rank, r.size);
    tdist_store_release(r.store);
    return tdist__rendezvous_cleanup() ? 1 : 0;
  }
  if (!strcmp(mode, "lines") && argc > 2) return do_lines(rank, atoi(argv[2]));
  if (!strcmp(mode, "fail") && argc > 3) {
    if (rank != atoi(argv[2])) return wait_for_term();
    usleep(200000);
    return atoi(argv[3]);
  }
  if (!strcmp(mode, "kill9") && argc > 2) {
    if (rank != atoi(argv[2])) return wait_for_term();
    usleep(200000);
    raise(SIGKILL);
  }
  if (!strcmp(mode, "ignore-term") && argc > 2) {
    /* The failing rank exits once every other rank ignores SIGTERM (told
     * through the launcher's store), so the launcher must use SIGKILL. */
    tdist_store_t *s = NULL;
    tdist_store_opts_t o = {.mask = TDIST_STORE_FIELD_TIMEOUT, .timeout_ms = 20000};
    if (tdist_store_open_url(env_str("TDIST_STORE_URL"), &o, &s)) return 8;
    int64_t n = 0;
    if (rank == atoi(argv[2])) {
      while (n < size - 1 && tdist_store_add(s, "ignoring", 0, &n) == 0)
        usleep(10000);
      tdist_store_release(s);
      return 1;
    }
    signal(SIGTERM, SIG_IGN);
    printf("ignoring\n");
    tdist_store_add(s, "ignoring", 1, &n);
    sleep(60);
    return 9;
  }
  if (!strcmp(mode, "late-exit") && argc > 4) {
    tdist_store_t *s = NULL;
    tdist_store_opts_t o = {.mask = TDIST_STORE_FIELD_TIMEOUT, .timeout_ms = 20000};
    if (tdist_store_open_url(env_str("TDIST_STORE_URL"), &o, &s)) return 8;
    int64_t n = 0;
    if (rank == atoi(argv[2])) {
      while (n < size - 1 && tdist_store_add(s, "waiting", 0, &n) == 0)
        usleep(10000);
      char pid[16];
      snprintf(pid, sizeof(pid), "%d", (int)getpid());
      tdist_store_set(s, "failed", pid, strlen(pid));
      tdist_store_release(s);
      return 3;
    }
    const char *key = "failed";
    tdist_store_add(s, "waiting", 1, &n);
    if (tdist_store_wait(s, &key, 1, 20000)) return 9;
    /* The MS ms count from when tdistrun reaped rank R, as the dump grace
     * does: an ASan rank R exits (its leak check) long after it set the
     * key, and under stress-ng the others' 300 ms had passed before
     * tdistrun saw it (test_dump_grace: 2 done files with no grace). */
    void *v = NULL;
    size_t vl = 0;
    if (tdist_store_get(s, "failed", &v, &vl, 20000)) return 9;
    char pid[16] = "";
    snprintf(pid, sizeof(pid), "%.*s", (int)(vl < sizeof(pid) ? vl : sizeof(pid) - 1),
             v ? (const char *)v : "");
    tdist_store_free(v);
    pid_t failed = (pid_t)atoi(pid);
    for (int i = 0; failed > 0 && i < 20000 && kill(failed, 0) == 0; i++)
      usleep(1000);
    usleep((useconds_t)atoi(argv[3]) * 1000);
    char path[512];
    snprintf(path, sizeof(path), "%s/done.%d", argv[4], rank);
    FILE *f = fopen(path, "w");
    if (!f || fputs("done\n", f) < 0 || fclose(f)) return 10;
    tdist_store_release(s);
    return 1;
  }
  if (!strcmp(mode, "init"))
    return do_init(rank, argc > 2 ? atoi(argv[2]) : -1, argc > 3 && !strcmp(argv[3], "kill"));
  if (!strcmp(mode, "watch-death") && argc > 3) return watch_death(rank, argv[2], argv[3]);
  if (!strcmp(mode, "stop-self") && argc > 2) {
    tdist_group_t *g = NULL;
    printf("PID %d\n", (int)getpid());
    if (tdist_init_process_group(NULL, &g) || tdist_barrier(g, NULL, NULL)) {
      fprintf(stderr, "stop-self: %s\n", tdist_last_error());
      return 1;
    }
    if (rank == atoi(argv[2])) {
      printf("stopping\n");
      raise(SIGSTOP);
      return 9; /* only if someone sent SIGCONT: the launcher must SIGKILL */
    }
    tdist_group_destroy(g);
    printf("done\n");
    return 0;
  }
  if (!strcmp(mode, "wait-signal")) {
    signal(SIGUSR1, on_sig);
    signal(SIGTERM, on_sig);
    signal(SIGINT, on_sig);
    printf("ready\n");
    for (int i = 0; i < 6000; i++) {
      usleep(10000);
      if (got_sig == SIGUSR1) {
        printf("got SIGUSR1\n");
        got_sig = 0;
      } else if (got_sig) {
        printf("got %s\n", got_sig == SIGTERM ? "SIGTERM" : "SIGINT");
        return 0;
      }
    }
    return 9;
  }
  fprintf(stderr, "launcher_probe: bad arguments\n");
  return 2;
}
