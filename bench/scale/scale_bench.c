/*
 * tdist_bench_scale - the control plane of today's design at 1k, 10k, ...
 * simulated ranks on one machine (issue 30, stage 1: the store level).
 *
 *   tdist_bench_scale [-n ranks] [-P procs] [-a addrs] [-c conns_per_rank]
 *                     [-s steady_s] [-T phase_timeout_s] [--no-group] [--etcd]
 *                     [--hosts-agg] [--hosts-rdzv] [--lazy-addr]
 *
 * What runs: one real store server (tdist_store_server_start in a process of
 * its own, so its CPU time and memory are its own) and n simulated ranks,
 * spread over P client processes (a process stands for a host), each rank a
 * thread with the library's own client (tdist_store_t); process 0 holds rank
 * 0 alone, the others share the rest. Each rank opens the
 * store connections a rank of today's design keeps open: the rendezvous /
 * world-group store (tdist_init_process_group), the monitor's connection
 * and its heartbeat connection (core/group/monitor.c: both made with
 * tdist__store_reconnect); -c sets that count. The ranks then do, phase by
 * phase, what the real code does on the store, with the real keys:
 *   1. rendezvous: store/rendezvous.c's own (tdist__rendezvous_round,
 *      under "tdist/rdzv/"): compare_set "rank/<r>", add "arrived" (on
 *      etcd: add "arrivals/<r>", set "in/0/<r>", count "in/0/"),
 *      compare_set "job/0", the last one sets "go/0", all wait for "go/0";
 *   2. the store part of the world group's creation by the CPU backend
 *      (cpu/conn/conn.c get_addrs, store/bootstrap.c): set "cpu/addr/<r>", then a
 *      multi_get of all n addresses (the TCP mesh itself is not opened here);
 *      with --lazy-addr, what lazy connections (cpu/conn/lazy.c, TDIST_CPU_CONNECT=lazy)
 *      do instead: the set, then one get per peer used, here the log2(n)
 *      partners of a recursive-doubling all_reduce;
 *   3. the monitor (monitor.c): add "tdist/aborts/count" 0, a first
 *      heartbeat, then a loop waiting TDIST_MONITOR_INTERVAL_MS (200) for
 *      "tdist/aborts/<next>" and reading it; and "tdist/hb/<r>" written
 *      every TDIST_HEARTBEAT_INTERVAL_MS (1000) on the heartbeat connection
 *      (one heartbeat thread per process paces its ranks' beats over the
 *      interval, where today each rank has a heartbeat thread).
 * --hosts-agg runs the host agent's design instead of 3. (tools/launcher/
 * agent.c, issue 30): per client process (a host) one agent with two
 * connections of its own writes "tdist/hbh/<process>" every interval
 * listing its ranks, and one record watcher waits on the next record and
 * reads every new one in one multi_get, handing deaths to its ranks (here
 * their counters; a real agent writes a line to each over a unix socket).
 * A rank told to go silent is judged by its agent (its local beats stop:
 * "<r> d ..." once they are older than the timeout, checked every 250 ms).
 * Each rank reads the record count once and keeps -c connections (default
 * 2: world and monitor; the heartbeat connection is gone); -c 0 gives the
 * ranks no connection and no thread, skipping phases 1 and 2, so that the
 * liveness part alone runs at 100k ranks within the descriptor limit.
 * --hosts-rdzv (implies --hosts-agg) runs the rendezvous per host instead
 * of 1. (scale_rdzv.c): every rank says "rdzv" (driver threads) to its process's
 * agent over a unix socket (the real rank side), the agent counts them all
 * in with one tdist_store_rendezvous_host call on a connection of its own;
 * with -c 0 the ranks have no store connection of their own.
 * The server's dead-rank detector (store/liveness.c) is the real one, with
 * TDIST_HEARTBEAT_TIMEOUT_MS from the environment (default 5000).
 *
 * Printed per run: connect time, rendezvous time, group address-exchange
 * time, store operations per second (counted by the clients: every reply,
 * a wait that expired included), the server process's CPU (utime + stime
 * from /proc/<pid>/stat) and RSS (/proc/<pid>/status) over a steady window
 * of -s seconds, its key count; then the time from SIGKILL of process 0
 * (one rank killed: its connections close) until every other rank's monitor
 * loop has read its death record; the same for one rank going silent
 * (its heartbeats stop, its connections stay open: a hung process); and the
 * time from SIGKILL of the last client process (a host lost: its
 * connections close) until every survivor has read all of that host's death
 * records.
 *
 * --etcd: the same ranks against one etcd member the harness starts on
 * 127.0.0.1 ($TDIST_ETCD_BIN, else etcd in PATH; etcd's default settings, a
 * data directory under /tmp removed at the end) through the library's etcd
 * store (tdist_store_open_url "etcd://"): connect, rendezvous, address
 * exchange and the steady state are measured, the CPU and RSS being etcd's;
 * the failure phases are not run (the etcd store detects deaths with leases,
 * another design) and the key count is not read (printed as -1). -a is
 * ignored (one address).
 *
 * Limits: RLIMIT_NOFILE is raised to its hard limit (printed). The client
 * API has no option to bind a source address, so the ranks spread their
 * connections over -a destination addresses 127.0.0.1..127.0.0.a (the
 * server listens on 0.0.0.0); every destination address has its own
 * ephemeral port range (ip_local_port_range), which is what several source
 * addresses would give.
 *
 * Threads: in each client process, one thread per simulated rank (phases
 * 1-3, its monitor loop), one heartbeat thread, and the main thread, which
 * relays the parent's phase commands (shared memory) to them. The server
 * process: its main thread publishes the key count; the server's own loop
 * thread serves. The parent process only commands and measures.
 *
 * Files: this one is the parent (options, phase commands, measurement,
 * output); scale_client.c the client processes and their ranks' phases,
 * scale_hosts.c the --hosts-agg agent, scale_server.c the store server or
 * etcd process; scale_internal.h what they share.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stddef.h>
#include <limits.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tdist/errors.h"
#include "tdist/store.h"

#include "scale_internal.h"

cfg_t g_cfg = {.n = 1000,
               .procs = 8,
               .addrs = 4,
               .conns = 3,
               .group = 1,
               .steady_s = 5,
               .phase_timeout_s = 120};
shm_t *g_shm;

/* ---- parent: command and measure ------------------------------------------------- */

/* The next phase, and a wake-up for the client processes' main threads
 * waiting on it (a futex in the shared mapping: 100 processes polling it
 * every millisecond were 100 000 wake-ups a second on this machine's two
 * cores, more than the phases they were timing). */
static void set_phase(int ph) {
  atomic_store(&g_shm->phase, ph);
  syscall(SYS_futex, &g_shm->phase, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* utime + stime of process pid, seconds. */
static double proc_cpu_s(pid_t pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  size_t l = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  buf[l] = 0;
  char *p = strrchr(buf, ')');
  unsigned long ut = 0, st = 0;
  if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
    return -1;
  return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static long proc_rss_kb(pid_t pid) {
  char path[64], line[256];
  long kb = -1;
  snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  while (fgets(line, sizeof(line), f))
    if (sscanf(line, "VmRSS: %ld", &kb) == 1) break;
  fclose(f);
  return kb;
}

/* Wait until *ctr reaches want; 0, or -1 on a failure or the phase timeout. */
static int wait_count(atomic_int *ctr, int want, const char *what) {
  double end = now_s() + g_cfg.phase_timeout_s;
  while (atomic_load(ctr) < want) {
    if (atomic_load(&g_shm->failed)) {
      fprintf(stderr, "tdist_bench_scale: %s failed: %s\n", what, g_shm->err);
      return -1;
    }
    if (now_s() > end) {
      fprintf(stderr, "tdist_bench_scale: %s: %d of %d after %.0f s\n", what, atomic_load(ctr),
              want, g_cfg.phase_timeout_s);
      return -1;
    }
    sleep_s(0.002);
  }
  return 0;
}

/* Seconds from t0 until every rank in [first,n) outside [skip_lo,skip_hi) and
 * other than skip has read `want` death records; -1 on timeout. */
static double wait_deaths(double t0, int want, int first, int skip, int skip_lo, int skip_hi,
                          int *reached) {
  double end = t0 + g_cfg.phase_timeout_s;
  for (;;) {
    int done = 0, all = 0;
    double last = t0;
    for (int r = first; r < g_cfg.n; r++) {
      if (r == skip || (r >= skip_lo && r < skip_hi)) continue;
      all++;
      if (atomic_load(&g_shm->r[r].ndead) >= want) {
        done++;
        if (g_shm->r[r].t_dead > last) last = g_shm->r[r].t_dead;
      }
    }
    *reached = done;
    if (done == all) return last - t0;
    if (atomic_load(&g_shm->failed) || now_s() > end) return -1;
    sleep_s(0.01);
  }
}

static double max_t(size_t off) {
  double m = 0;
  for (int r = 0; r < g_cfg.n; r++) {
    double t = *(double *)((char *)&g_shm->r[r] + off);
    if (t > m) m = t;
  }
  return m;
}

/* The store connections the ranks reopened after a call found one gone
 * (scale_client.c reopen_conn, as monitor.c does): not errors, but each
 * heartbeat one made the server declare that rank dead (its connection
 * closed without a goodbye), as it would a real rank's. */
static void print_reconnects(const char *label, const char *when) {
  if (g_cfg.agg) return; /* the agents' connections are not reopened */
  printf("%s monitor=%d heartbeat=%d (%s: store connections reopened after a call found one "
         "closed, as monitor.c does)\n",
         label, atomic_load(&g_shm->mon_reconnects), atomic_load(&g_shm->hb_reconnects), when);
}

static void usage(void) {
  fprintf(stderr, "usage: tdist_bench_scale [-n ranks] [-P procs] [-a addrs] [-c conns_per_rank]\n"
                  "                         [-s steady_s] [-T phase_timeout_s] [--no-group] "
                  "[--etcd]\n"
                  "                         [--hosts-agg] [--hosts-rdzv] [--lazy-addr]\n");
}

int main(int argc, char **argv) {
  int rc = 1;
  pid_t server = -1, *clients = NULL;
  char etcd_dir[] = "/tmp/tdist-scale-etcd-XXXXXX"; /* --etcd: made by mkdtemp */
  int conns_given = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--no-group")) {
      g_cfg.group = 0;
      continue;
    }
    if (!strcmp(a, "--etcd")) {
      g_cfg.etcd = 1;
      continue;
    }
    if (!strcmp(a, "--hosts-agg")) {
      g_cfg.agg = 1;
      continue;
    }
    if (!strcmp(a, "--hosts-rdzv")) {
      g_cfg.hrdzv = g_cfg.agg = 1; /* the agent does the liveness too */
      continue;
    }
    if (!strcmp(a, "--lazy-addr")) {
      g_cfg.lazy_addr = 1;
      continue;
    }
    if (!v) {
      usage();
      return 2;
    }
    if (!strcmp(a, "-n"))
      g_cfg.n = atoi(v);
    else if (!strcmp(a, "-P"))
      g_cfg.procs = atoi(v);
    else if (!strcmp(a, "-a"))
      g_cfg.addrs = atoi(v);
    else if (!strcmp(a, "-c"))
      g_cfg.conns = atoi(v), conns_given = 1;
    else if (!strcmp(a, "-s"))
      g_cfg.steady_s = atof(v);
    else if (!strcmp(a, "-T"))
      g_cfg.phase_timeout_s = atof(v);
    else {
      usage();
      return 2;
    }
    i++;
  }
  if (g_cfg.agg && !conns_given) g_cfg.conns = 2; /* world and monitor: no heartbeat conn */
  if (g_cfg.n < 8 || g_cfg.procs < 3 || g_cfg.procs > g_cfg.n / 2 || g_cfg.addrs < 1 ||
      g_cfg.addrs > 254 || g_cfg.conns < (g_cfg.agg ? 0 : 1) || g_cfg.conns > (g_cfg.agg ? 2 : 3)) {
    usage();
    return 2;
  }
  if (g_cfg.agg && g_cfg.conns == 0 && !g_cfg.hrdzv) g_cfg.group = 0;
  g_cfg.hb_ms = env_ms("TDIST_HEARTBEAT_INTERVAL_MS", 1000);
  g_cfg.mon_ms = env_ms("TDIST_MONITOR_INTERVAL_MS", 200);
  int64_t hb_timeout = env_ms("TDIST_HEARTBEAT_TIMEOUT_MS", 5000);

  struct rlimit rl;
  getrlimit(RLIMIT_NOFILE, &rl);
  rlim_t before = rl.rlim_cur;
  rl.rlim_cur = rl.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &rl)) perror("setrlimit");
  getrlimit(RLIMIT_NOFILE, &rl);
  long conns = (long)g_cfg.n * g_cfg.conns + (g_cfg.agg ? 2L * g_cfg.procs : 0) +
               (g_cfg.hrdzv ? g_cfg.procs : 0);
  printf("config ranks=%d procs=%d conns_per_rank=%d store_conns=%ld dest_addrs=127.0.0.1..%d "
         "group_exchange=%s store=%s liveness=%s rendezvous=%s\n",
         g_cfg.n, g_cfg.procs, g_cfg.conns, conns, g_cfg.etcd ? 1 : g_cfg.addrs,
         g_cfg.group ? "yes" : "no", g_cfg.etcd ? "etcd (one member, started here)" : "tdist",
         g_cfg.agg ? (g_cfg.conns ? "hosts-agg (one agent per process: 2 connections)"
                                  : "hosts-agg, ranks without store connections")
                   : "per-rank",
         g_cfg.hrdzv   ? "per host (one agent per process)"
         : g_cfg.conns ? "per rank"
                       : "none");
  /* The server keeps 16 descriptors in reserve (store/server_impl.h
   * SRV_FD_RESERVE) and a dozen for its loop, listener and stdio; a
   * connection past that gets a BUSY error naming the limit. */
  printf("limits RLIMIT_NOFILE %lu -> %lu (hard %lu): the server process holds one descriptor per "
         "store connection and keeps 16 free, so at most ~%lu connections\n",
         (unsigned long)before, (unsigned long)rl.rlim_cur, (unsigned long)rl.rlim_max,
         (unsigned long)rl.rlim_cur - 29);
  printf("settings TDIST_HEARTBEAT_INTERVAL_MS=%" PRId64 " TDIST_MONITOR_INTERVAL_MS=%" PRId64
         " TDIST_HEARTBEAT_TIMEOUT_MS=%" PRId64 " (environment, else the defaults)\n",
         g_cfg.hb_ms, g_cfg.mon_ms, hb_timeout);
  fflush(stdout);

  size_t shm_size = sizeof(shm_t) + sizeof(rank_slot_t) * (size_t)g_cfg.n;
  g_shm = mmap(NULL, shm_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (g_shm == MAP_FAILED) {
    perror("mmap");
    return 1;
  }
  atomic_store(&g_shm->silent, -1);
  clients = calloc((size_t)g_cfg.procs, sizeof(*clients));
  if (!clients) goto fail;
  for (int i = 0; i < g_cfg.procs; i++)
    clients[i] = -1;

  /* the server process */
  if (g_cfg.etcd) {
    int port = free_port(), peer_port = free_port();
    if (!mkdtemp(etcd_dir) || port < 0 || peer_port < 0) {
      perror("etcd data directory or ports");
      goto fail;
    }
    atomic_store(&g_shm->port, port);
    atomic_store(&g_shm->keys, -1); /* not counted */
    if ((server = fork()) == 0) _exit(etcd_proc(etcd_dir, port, peer_port));
    if (server > 0) atomic_store(&g_shm->server_up, 1);
  } else if ((server = fork()) == 0) {
    _exit(server_proc());
  }
  if (server < 0) goto fail;
  while (atomic_load(&g_shm->server_up) == 0)
    sleep_s(0.001);
  if (atomic_load(&g_shm->server_up) < 0) {
    fprintf(stderr, "tdist_bench_scale: %s\n", g_shm->err);
    goto fail;
  }
  double rss0 = (double)proc_rss_kb(server);

  /* the client processes: connect */
  double t = now_s();
  set_phase(PH_CONNECT);
  for (int i = 0; i < g_cfg.procs; i++) {
    fflush(stdout);
    if ((clients[i] = fork()) == 0) _exit(client_proc(i));
    if (clients[i] < 0) goto fail;
  }
  if (wait_count(&g_shm->connected, g_cfg.n, "connect")) {
    printf("connect FAILED after %.2f s with %lld of %ld connections open\n", now_s() - t,
           (long long)atomic_load(&g_shm->conns), conns);
    goto fail;
  }
  printf("connect %.3f s (%ld connections)\n", now_s() - t, conns);
  fflush(stdout);

  /* 1. rendezvous (ranks without connections: only the liveness part) */
  if (g_cfg.conns == 0 && !g_cfg.hrdzv) goto monitors;
  t = now_s();
  set_phase(PH_RDZV);
  if (wait_count(&g_shm->rdzv_done, g_cfg.n, "rendezvous")) goto fail;
  printf("rendezvous %.3f s\n", max_t(offsetof(rank_slot_t, t_rdzv)) - t);
  fflush(stdout);

  /* 2. the world group's address exchange */
  if (g_cfg.group) {
    t = now_s();
    set_phase(PH_GROUP);
    if (wait_count(&g_shm->group_done, g_cfg.n, "group address exchange")) goto fail;
    long long reads = (long long)g_cfg.n * g_cfg.n;
    if (g_cfg.lazy_addr) {
      int peers[32];
      reads = 0;
      for (int r = 0; r < g_cfg.n; r++)
        reads += lazy_peers(r, g_cfg.n, peers);
    }
    if (g_cfg.hrdzv)
      printf("world_create %.3f s (through the agents' store proxies: 1 handle, 2 requests per "
             "rank)\n",
             max_t(offsetof(rank_slot_t, t_group)) - t);
    else
      printf("group_addr_exchange%s %.3f s (%lld values read)\n", g_cfg.lazy_addr ? " (lazy)" : "",
             max_t(offsetof(rank_slot_t, t_group)) - t, reads);
    fflush(stdout);
  }

  /* 3. monitors and heartbeats; the steady state */
monitors:
  t = now_s();
  set_phase(PH_MON);
  if (wait_count(&g_shm->mon_ready, g_cfg.n, "monitor start")) goto fail;
  printf("monitor_start %.3f s\n", now_s() - t);
  sleep_s(2.0 * (double)g_cfg.hb_ms / 1000.0);
  long long ops0 = atomic_load(&g_shm->ops);
  double ccpu0 = 0, ccpu1 = 0;
  for (int i = 0; i < g_cfg.procs; i++)
    ccpu0 += proc_cpu_s(clients[i]);
  double cpu0 = proc_cpu_s(server), t0 = now_s();
  sleep_s(g_cfg.steady_s);
  long long ops1 = atomic_load(&g_shm->ops);
  double cpu1 = proc_cpu_s(server), t1 = now_s();
  for (int i = 0; i < g_cfg.procs; i++)
    ccpu1 += proc_cpu_s(clients[i]);
  if (atomic_load(&g_shm->failed)) {
    fprintf(stderr, "tdist_bench_scale: steady state failed: %s\n", g_shm->err);
    goto fail;
  }
  printf("steady store_ops_per_s=%.0f store_cpu=%.1f%% (of one core) store_rss_mb=%.1f "
         "(%.1f before any connection) store_keys=%lld window=%.1f s "
         "clients_cpu=%.1f%% (the simulated ranks, same 2 cores)\n",
         (double)(ops1 - ops0) / (t1 - t0), 100.0 * (cpu1 - cpu0) / (t1 - t0),
         (double)proc_rss_kb(server) / 1024.0, rss0 / 1024.0, (long long)atomic_load(&g_shm->keys),
         t1 - t0, 100.0 * (ccpu1 - ccpu0) / (t1 - t0));
  print_reconnects("steady_reconnects", "so far");
  fflush(stdout);
  if (g_cfg.etcd) { /* its failure detection is another design (leases): not measured here */
    printf("failure phases not run with --etcd\n");
    rc = 0;
    goto fail;
  }

  /* one rank killed: SIGKILL process 0 (rank 0 alone); its connections close */
  int reached = 0, victim = 1;
  t = now_s();
  kill(clients[0], SIGKILL);
  waitpid(clients[0], NULL, 0);
  clients[0] = -1;
  double d = wait_deaths(t, 1, 1, -1, -1, -1, &reached);
  if (d < 0) {
    printf("killed_rank_known FAILED: %d of %d survivors knew after %.0f s\n", reached, g_cfg.n - 1,
           now_s() - t);
    goto fail;
  }
  printf("killed_rank_known %.3f s (its process SIGKILLed, read by each of %d survivors)\n", d,
         g_cfg.n - 1);
  fflush(stdout);

  /* one rank goes silent (rank 1: process 1) */
  t = now_s();
  atomic_store(&g_shm->silent, victim);
  d = wait_deaths(t, 2, 1, victim, -1, -1, &reached);
  if (d < 0) {
    printf("silent_rank_known FAILED: %d of %d survivors knew after %.0f s\n", reached, g_cfg.n - 2,
           now_s() - t);
    goto fail;
  }
  printf("silent_rank_known %.3f s after its last heartbeat (%.3f s after it was told to stop; "
         "heartbeat timeout %" PRId64 " ms)\n",
         d + (t - g_shm->r[victim].t_beat), d, hb_timeout);
  fflush(stdout);

  /* a host lost: SIGKILL the last client process */
  int h = g_cfg.procs - 1;
  int hlo, hhi;
  proc_ranks(h, &hlo, &hhi);
  t = now_s();
  kill(clients[h], SIGKILL);
  waitpid(clients[h], NULL, 0);
  clients[h] = -1;
  d = wait_deaths(t, 2 + (hhi - hlo), 1, victim, hlo, hhi, &reached);
  if (d < 0) {
    long long sum = 0;
    int lo = -1;
    for (int r = 1; r < hlo; r++)
      if (r != victim) {
        int k = atomic_load(&g_shm->r[r].ndead) - 2;
        sum += k;
        if (lo < 0 || k < lo) lo = k;
      }
    printf("host_lost_known FAILED: %d of %d survivors had read all %d records after %.0f s "
           "(each had read %.1f on average, the slowest %d)\n",
           reached, g_cfg.n - 2 - (hhi - hlo), hhi - hlo, now_s() - t, (double)sum / (hlo - 2), lo);
    goto fail;
  }
  printf("host_lost_known %.3f s (%d ranks on the host, %d death records read by each of %d "
         "survivors)\n",
         d, hhi - hlo, hhi - hlo, g_cfg.n - 2 - (hhi - hlo));
  rc = 0;
fail:
  fflush(stdout);
  set_phase(PH_STOP);
  /* Ranks may be blocked in a long call (a phase that failed): after 10 s
   * of waiting, the client processes are killed. On etcd, 60 s: closing a
   * handle is requests of its own (its op record deleted, its lease
   * revoked), one handle after another in each process. */
  double kill_at = now_s() + (g_cfg.etcd ? 60 : 10);
  for (int i = 0; clients && i < g_cfg.procs; i++) {
    int st = 0;
    while (clients[i] > 0) {
      pid_t w = waitpid(clients[i], &st, WNOHANG);
      if (w == clients[i]) {
        if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0)) rc = 1;
        clients[i] = -1;
      } else if (w < 0) {
        clients[i] = -1;
      } else if (now_s() > kill_at) {
        fprintf(stderr, "tdist_bench_scale: client process %d did not stop: killed\n", i);
        kill(clients[i], SIGKILL);
        kill_at = now_s() + 10;
        rc = 1;
      } else {
        sleep_s(0.01);
      }
    }
  }
  if (server > 0) {
    atomic_store(&g_shm->server_stop, 1);
    if (g_cfg.etcd) kill(server, SIGTERM);
    waitpid(server, NULL, 0);
  }
  if (g_cfg.etcd && etcd_dir[strlen(etcd_dir) - 1] != 'X') {
    char cmd[96];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", etcd_dir);
    if (system(cmd) != 0) fprintf(stderr, "tdist_bench_scale: could not remove %s\n", etcd_dir);
  }
  if (atomic_load(&g_shm->failed) && g_shm->err[0])
    fprintf(stderr, "tdist_bench_scale: first error: %s\n", g_shm->err);
  free(clients);
  print_reconnects("reconnects", "whole run");
  munmap(g_shm, shm_size);
  printf("result %s\n", rc ? "FAILED" : "ok");
  return rc;
}
