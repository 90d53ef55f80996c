/*
 * scale_client.c - a client process of tdist_bench_scale (a host): its
 * ranks' store connections, one thread per rank doing the real code's store
 * calls phase by phase (rendezvous, group address exchange, monitor loop),
 * one heartbeat thread, and the main thread relaying the parent's phase
 * commands. See scale_bench.c and docs/scale.md.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "tdist/errors.h"
#include "tdist/store.h"

#include "agent_proxy.h"
#include "scale_internal.h"
#include "store/rendezvous.h"

/* (any client thread) Record the first error and count the failure. */
void fail_msg(int rank, const char *what) {
  if (atomic_fetch_add(&g_shm->err_taken, 1) == 0)
    snprintf(g_shm->err, sizeof(g_shm->err), "rank %d: %s: %s", rank, what, tdist_last_error());
  atomic_fetch_add(&g_shm->failed, 1);
}

proc_t g_p;

/* Where connection `which` of a rank is in g_p.s (see conn_of). */
static size_t conn_index(int rank, int which) {
  size_t base = (size_t)(rank - g_p.lo) * (size_t)g_cfg.conns;
  if (g_cfg.agg) return base + (size_t)(which && g_cfg.conns > 1);
  int w = which == 2 ? g_cfg.conns - 1 : which == 1 && g_cfg.conns == 3 ? 1 : 0;
  return base + (size_t)w;
}

/* The ranks of client process idx: process 0 holds rank 0 alone (killing it
 * kills one rank), the others share ranks 1..n-1 evenly (a host each). */
void proc_ranks(int idx, int *lo, int *hi) {
  if (idx == 0) {
    *lo = 0;
    *hi = 1;
    return;
  }
  *lo = 1 + (int)((int64_t)(g_cfg.n - 1) * (idx - 1) / (g_cfg.procs - 1));
  *hi = 1 + (int)((int64_t)(g_cfg.n - 1) * idx / (g_cfg.procs - 1));
}

/* Connection `which` (0 rendezvous/world, 1 monitor, 2 heartbeat) of a rank.
 * With -c 2 the monitor shares the world's connection and the heartbeats
 * keep their own (a closed heartbeat connection is a death); with -c 1 all
 * share one, which is good only for the phases before the monitor: the one
 * heartbeat thread of a process then waits behind each rank's monitor wait
 * on the shared handle, falls behind, and the detector declares ranks dead. */
tdist_store_t *conn_of(int rank, int which) { return g_p.s[conn_index(rank, which)]; }

/* (rank or heartbeat thread) Block until the parent's phase reaches ph; 0,
 * or -1 when told to stop first. */
int wait_phase(int ph) {
  pthread_mutex_lock(&g_p.mu);
  while (g_p.phase < ph)
    pthread_cond_wait(&g_p.cv, &g_p.mu);
  int stop = g_p.phase == PH_STOP && ph != PH_STOP;
  pthread_mutex_unlock(&g_p.mu);
  return stop ? -1 : 0;
}

int phase_now(void) {
  pthread_mutex_lock(&g_p.mu);
  int ph = g_p.phase;
  pthread_mutex_unlock(&g_p.mu);
  return ph;
}

/* A store connection to `host` (TCP) or to the etcd member (--etcd, where
 * -a does not apply), with the phase timeout (a connect retries until
 * then); 0 or the store's error. */
static int open_store(const char *host, tdist_store_t **out) {
  int port = atomic_load(&g_shm->port);
  tdist_store_opts_t o = {.mask = TDIST_STORE_FIELD_TIMEOUT,
                          .timeout_ms = (int64_t)(g_cfg.phase_timeout_s * 1000)};
  char url[64];
  snprintf(url, sizeof(url), "etcd://127.0.0.1:%d", port);
  return g_cfg.etcd ? tdist_store_open_url(url, &o, out) : tdist_store_connect(host, port, &o, out);
}

/* Open connection i of this process (rank lo + i / conns), as every one is
 * opened: its destination address spread over -a. */
static int open_conn(int i, tdist_store_t **out) {
  int r = g_p.lo + i / g_cfg.conns;
  char host[32];
  snprintf(host, sizeof(host), "127.0.0.%d", 1 + (r * g_cfg.conns + i % g_cfg.conns) % g_cfg.addrs);
  return open_store(host, out);
}

/* 1 when a store call's rc says its connection is gone (closed by the
 * server, or by the client after a reply later than its grace: every later
 * call then fails with TDIST_ERR_CLOSED). monitor.c's store_check asks
 * tdist__store_alive; the public API tells it by the error code. */
static int conn_gone(int rc) { return rc == TDIST_ERR_CLOSED || rc == TDIST_ERR_IO; }

/* (the slot's only user in the monitor phase: the rank thread for its
 * monitor connection, the heartbeat thread for heartbeat connections, which
 * starts only after every local rank's first beat) Replace connection
 * `which` of rank r, found gone, by a fresh one opened as the first was,
 * and count it in *count: what monitor.c does (store_check, heartbeat), so
 * one late reply under load is not the run's failure. 0; -1 (the caller
 * fails, tdist_last_error says why) when the reopen failed (its connect
 * retried up to the phase timeout), the run is stopping, or -c 1 (one
 * connection shared by the rank and heartbeat threads: not replaceable). */
static int reopen_conn(int r, int which, atomic_int *count) {
  if (g_cfg.conns < 2 || phase_now() == PH_STOP) return -1;
  size_t i = conn_index(r, which);
  tdist_store_t *fresh = NULL;
  if (open_conn((int)i, &fresh)) return -1;
  tdist_store_release(g_p.s[i]);
  g_p.s[i] = fresh;
  atomic_fetch_add(count, 1);
  return 0;
}

/* (rank thread) store/rendezvous.c's rendezvous() itself, on this rank's
 * world connection: claim, count in (one add on the TCP store; one key per
 * rank and a count on etcd), agree on the job id, wait for the round. */
static int rank_rendezvous(int r) {
  tdist_store_t *view = NULL;
  char job[64];
  if (tdist_store_prefix(conn_of(r, 0), "tdist/rdzv/", &view)) goto fail;
  int rc = tdist__rendezvous_round(view, r, g_cfg.n, (int64_t)(g_cfg.phase_timeout_s * 1000), job,
                                   sizeof(job));
  tdist_store_release(view);
  if (rc) goto fail;
  atomic_fetch_add(&g_shm->ops, 5);
  return 0;
fail:
  fail_msg(r, "rendezvous");
  return -1;
}

/* Peers a rank of n reads with --lazy-addr: its recursive-doubling
 * partners r ^ 2^k below n (all_reduce's small-message algorithm). */
int lazy_peers(int r, int n, int *out) {
  int k = 0;
  for (int m = 1; m < n; m <<= 1)
    if ((r ^ m) < n) out[k++] = r ^ m;
  return k;
}

/* (rank thread) --lazy-addr: the store part of lazy connections
 * (cpu/conn/lazy.c): one set of "cpu/addr/<r>" at creation, then one get
 * (waiting for the key) per peer an op uses, here the log2(n) peers of a
 * recursive-doubling all_reduce. */
static int rank_group_lazy(int r) {
  tdist_store_t *s = conn_of(r, 0);
  char key[64], val[64];
  int peers[32], np = lazy_peers(r, g_cfg.n, peers);
  snprintf(key, sizeof(key), "tdist/g/0/cpu/addr/%d", r);
  int vl = snprintf(val, sizeof(val), "127.0.%d.%d:%d", (r >> 8) & 255, r & 255, 20000 + r % 30000);
  if (tdist_store_set(s, key, val, (size_t)vl)) goto fail;
  for (int i = 0; i < np; i++) {
    void *v = NULL;
    size_t len = 0;
    snprintf(key, sizeof(key), "tdist/g/0/cpu/addr/%d", peers[i]);
    if (tdist_store_get(s, key, &v, &len, (int64_t)(g_cfg.phase_timeout_s * 1000))) goto fail;
    tdist_store_free(v);
  }
  atomic_fetch_add(&g_shm->ops, 1 + np);
  return 0;
fail:
  fail_msg(r, "group address exchange (lazy)");
  return -1;
}

/* (rank thread) The store part of the CPU backend's group creation:
 * store/bootstrap.c's all-gather of "cpu/addr" under the group's prefix
 * (TDIST_CPU_CONNECT=eager). */
static int rank_group(int r) {
  if (g_cfg.lazy_addr) return rank_group_lazy(r);
  tdist_store_t *s = conn_of(r, 0);
  int rc = -1, n = g_cfg.n;
  char key[64], val[64];
  char(*keys)[40] = calloc((size_t)n, sizeof(*keys));
  const char **kp = calloc((size_t)n, sizeof(*kp));
  void **vals = calloc((size_t)n, sizeof(*vals));
  size_t *lens = calloc((size_t)n, sizeof(*lens));
  if (!keys || !kp || !vals || !lens) goto done;
  snprintf(key, sizeof(key), "tdist/g/0/cpu/addr/%d", r);
  int vl = snprintf(val, sizeof(val), "127.0.%d.%d:%d", (r >> 8) & 255, r & 255, 20000 + r % 30000);
  if (tdist_store_set(s, key, val, (size_t)vl)) goto done;
  for (int i = 0; i < n; i++) {
    snprintf(keys[i], sizeof(keys[i]), "tdist/g/0/cpu/addr/%d", i);
    kp[i] = keys[i];
  }
  if (tdist_store_multi_get(s, kp, (size_t)n, vals, lens, (int64_t)(g_cfg.phase_timeout_s * 1000)))
    goto done;
  for (int i = 0; i < n; i++)
    tdist_store_free(vals[i]);
  atomic_fetch_add(&g_shm->ops, 2);
  rc = 0;
done:
  if (rc) fail_msg(r, "group address exchange");
  free(keys);
  free(kp);
  free(vals);
  free(lens);
  return rc;
}

/* (rank thread) monitor.c's start and monitor_main loop, reading records. */
static void rank_monitor(int r) {
  int64_t count = 0;
  int beat0 = 0;
  char key[64], hb[64];
  if (tdist_store_add(conn_of(r, 1), "tdist/aborts/count", 0, &count)) goto fail;
  snprintf(key, sizeof(key), "tdist/hb/%d", r);
  int hl = snprintf(hb, sizeof(hb), "0000000000000001:%d", 0);
  int brc = tdist_store_set(conn_of(r, 2), key, hb, (size_t)hl);
  atomic_fetch_add(&g_p.first_beats, 1); /* the heartbeat thread may start */
  beat0 = 1;
  if (brc) goto fail;
  atomic_fetch_add(&g_shm->ops, 2);
  atomic_fetch_add(&g_shm->mon_ready, 1);
  int64_t next = count + 1;
  while (phase_now() != PH_STOP) {
    snprintf(key, sizeof(key), "tdist/aborts/%" PRId64, next);
    const char *k = key;
    int rc = tdist_store_wait(conn_of(r, 1), &k, 1, g_cfg.mon_ms);
    atomic_fetch_add(&g_shm->ops, 1);
    if (rc == TDIST_ERR_TIMEOUT) continue; /* expired, or its reply was late: see below */
    if (conn_gone(rc) && reopen_conn(r, 1, &g_shm->mon_reconnects) == 0) continue;
    if (rc) goto fail;
    void *v = NULL;
    size_t len = 0;
    rc = tdist_store_get(conn_of(r, 1), key, &v, &len, g_cfg.mon_ms);
    /* A late reply closed the connection (the next call reopens it) or it
     * was gone: the same record again, not a failure. */
    if (rc == TDIST_ERR_TIMEOUT) continue;
    if (conn_gone(rc) && reopen_conn(r, 1, &g_shm->mon_reconnects) == 0) continue;
    if (rc) goto fail;
    atomic_fetch_add(&g_shm->ops, 1);
    if (len > 5 && memcmp(v, "dead ", 5) == 0) {
      g_shm->r[r].t_dead = now_s();
      atomic_fetch_add(&g_shm->r[r].ndead, 1);
    }
    tdist_store_free(v);
    next++;
  }
  return;
fail:
  if (phase_now() != PH_STOP) fail_msg(r, "monitor");
  if (!beat0) atomic_fetch_add(&g_p.first_beats, 1); /* nor will it beat */
}

static void *rank_main(void *arg) {
  int r = (int)(intptr_t)arg;
  if (wait_phase(PH_RDZV)) return NULL;
  if (!g_cfg.hrdzv) { /* --hosts-rdzv: the driver threads (scale_rdzv.c) */
    if (rank_rendezvous(r)) return NULL;
    g_shm->r[r].t_rdzv = now_s();
    atomic_fetch_add(&g_shm->rdzv_done, 1);
  }
  if (g_cfg.group && !g_cfg.hrdzv) { /* --hosts-rdzv: the drivers (world_create) */
    if (wait_phase(PH_GROUP) || rank_group(r)) return NULL;
    g_shm->r[r].t_group = now_s();
    atomic_fetch_add(&g_shm->group_done, 1);
  }
  if (wait_phase(PH_MON)) return NULL;
  if (g_cfg.agg) {
    hosts_agg_rank(r);
    return NULL;
  }
  rank_monitor(r);
  return NULL;
}

/* (heartbeat thread) Every rank's "tdist/hb/<r>" once per interval, the
 * beats spread evenly over it; none for the rank told to go silent. */
static void *hb_main(void *arg) {
  (void)arg;
  if (wait_phase(PH_MON)) return NULL;
  int nl = g_p.hi - g_p.lo;
  char key[64], hb[64];
  /* The ranks' first beats use the heartbeat connections too: once they are
   * done this thread is their only user and may replace one (reopen_conn). */
  while (atomic_load(&g_p.first_beats) < nl && phase_now() != PH_STOP)
    sleep_s(0.001);
  double t = now_s(), step = (double)g_cfg.hb_ms / 1000.0 / (nl ? nl : 1);
  while (phase_now() != PH_STOP) {
    for (int r = g_p.lo; r < g_p.hi && phase_now() != PH_STOP; r++) {
      t += step;
      double d = t - now_s();
      if (d > 0) sleep_s(d);
      if (atomic_load(&g_shm->silent) == r) continue;
      snprintf(key, sizeof(key), "tdist/hb/%d", r);
      int hl = snprintf(hb, sizeof(hb), "0000000000000001:%d", 0);
      int rc = tdist_store_set(conn_of(r, 2), key, hb, (size_t)hl);
      /* Gone (monitor.c's heartbeat reopens it before its next beat): this
       * beat again on the fresh one; failing there too is a real error. */
      if (conn_gone(rc) && reopen_conn(r, 2, &g_shm->hb_reconnects) == 0)
        rc = tdist_store_set(conn_of(r, 2), key, hb, (size_t)hl);
      if (rc) {
        if (phase_now() != PH_STOP) fail_msg(r, "heartbeat");
        return NULL;
      }
      g_shm->r[r].t_beat = now_s();
      atomic_fetch_add(&g_shm->ops, 1);
    }
  }
  return NULL;
}

/* (client process main thread) Connect, start the threads, relay phases. */
int client_proc(int idx) {
  int rc = 1, nl, nthreads = 0;
  pthread_t *th = NULL, hb, relay, rdzv;
  int hb_started = 0, relay_started = 0, rdzv_started = 0, ndrivers = 0;
  pthread_t drivers[RDZV_DRIVERS];
  g_p.agent_lfd = -1;
  proc_ranks(idx, &g_p.lo, &g_p.hi);
  nl = g_p.hi - g_p.lo;
  pthread_mutex_init(&g_p.mu, NULL);
  pthread_cond_init(&g_p.cv, NULL);
  g_p.s = calloc((size_t)nl * (size_t)g_cfg.conns, sizeof(*g_p.s));
  th = calloc((size_t)nl, sizeof(*th));
  if ((nl > 0 && g_cfg.conns > 0 && !g_p.s) || !th) goto fail;
  if (g_cfg.agg) { /* the agent's two connections (etcd: two handles) */
    char host[32];
    snprintf(host, sizeof(host), "127.0.0.%d", 1 + idx % g_cfg.addrs);
    if (open_store(host, &g_p.agent_beat) || open_store(host, &g_p.agent_watch)) {
      fail_msg(g_p.lo, "host agent connect");
      goto fail;
    }
    atomic_fetch_add(&g_shm->conns, 2);
  }
  if (g_cfg.hrdzv) {
    char host[32];
    snprintf(host, sizeof(host), "127.0.0.%d", 1 + idx % g_cfg.addrs);
    g_p.wroot = calloc((size_t)nl, sizeof(*g_p.wroot));
    if (g_cfg.etcd) { /* the agent's rendezvous and proxy need the TCP store */
      fail_msg(g_p.lo, "--hosts-rdzv with --etcd");
      goto fail;
    }
    if (!g_p.wroot || hosts_rdzv_listen(idx) || open_store(host, &g_p.agent_rdzv) ||
        trun_proxy_start("127.0.0.1", atomic_load(&g_shm->port), &g_p.proxy)) {
      fail_msg(g_p.lo, "host agent (rendezvous) listen or connect");
      goto fail;
    }
    atomic_fetch_add(&g_shm->conns, 1);
  }
  for (int i = 0; i < nl * g_cfg.conns; i++) {
    int r = g_p.lo + i / g_cfg.conns;
    if (open_conn(i, &g_p.s[i])) {
      fail_msg(r, "connect");
      goto fail;
    }
    atomic_fetch_add(&g_shm->conns, 1);
  }
  atomic_fetch_add(&g_shm->connected, nl);
  pthread_attr_t at;
  pthread_attr_init(&at);
  pthread_attr_setstacksize(&at, 256 << 10);
  for (int i = 0; g_cfg.conns && i < nl; i++, nthreads++)
    if (pthread_create(&th[i], &at, rank_main, (void *)(intptr_t)(g_p.lo + i))) {
      snprintf(g_shm->err, sizeof(g_shm->err), "process %d: pthread_create failed", idx);
      atomic_fetch_add(&g_shm->failed, 1);
      break;
    }
  if (g_cfg.agg) {
    hb_started = pthread_create(&hb, &at, hosts_agg_beat, (void *)(intptr_t)idx) == 0;
    relay_started = pthread_create(&relay, &at, hosts_agg_relay, NULL) == 0;
  } else {
    hb_started = pthread_create(&hb, &at, hb_main, NULL) == 0;
  }
  if (g_cfg.hrdzv) {
    rdzv_started = pthread_create(&rdzv, &at, hosts_rdzv_agent, (void *)(intptr_t)idx) == 0;
    ndrivers = hosts_rdzv_start_drivers(drivers, &at);
  }
  pthread_attr_destroy(&at);
  for (int last = 0; last != PH_STOP;) {
    int ph = atomic_load(&g_shm->phase);
    if (ph != last) {
      pthread_mutex_lock(&g_p.mu);
      g_p.phase = last = ph;
      pthread_cond_broadcast(&g_p.cv);
      pthread_mutex_unlock(&g_p.mu);
    }
    /* Until the parent's next phase (set_phase wakes it), or 100 ms. */
    struct timespec ts = {0, 100 * 1000 * 1000};
    syscall(SYS_futex, &g_shm->phase, FUTEX_WAIT, last, &ts, NULL, 0);
  }
  rc = 0;
fail:
  /* stop: wake every thread, join, say goodbye (not a death), disconnect */
  pthread_mutex_lock(&g_p.mu);
  g_p.phase = PH_STOP;
  pthread_cond_broadcast(&g_p.cv);
  pthread_mutex_unlock(&g_p.mu);
  for (int i = 0; i < nthreads; i++)
    pthread_join(th[i], NULL);
  if (hb_started) pthread_join(hb, NULL);
  if (relay_started) pthread_join(relay, NULL);
  if (rdzv_started) pthread_join(rdzv, NULL);
  for (int i = 0; i < ndrivers; i++)
    pthread_join(drivers[i], NULL);
  if (g_p.agent_rdzv) tdist_store_release(g_p.agent_rdzv);
  for (int i = 0; g_p.wroot && i < nl; i++) /* the ranks' handles, then their proxy */
    if (g_p.wroot[i]) tdist_store_release(g_p.wroot[i]);
  trun_proxy_stop(g_p.proxy);
  free(g_p.wroot);
  if (g_p.agent_lfd >= 0) close(g_p.agent_lfd);
  if (g_p.agent_beat) { /* its ranks leave, then the agent */
    size_t cap = (size_t)nl * 16 + 16, len = 0;
    char *v = malloc(cap), key[48];
    snprintf(key, sizeof(key), "tdist/hbh/%d", idx);
    for (int r = g_p.lo; v && r < g_p.hi; r++)
      len += (size_t)snprintf(v + len, cap - len, "%d b\n", r);
    if (v) tdist_store_set(g_p.agent_beat, key, v, len);
    tdist_store_set(g_p.agent_beat, key, "bye", 3);
    free(v);
  }
  if (g_p.agent_beat) tdist_store_release(g_p.agent_beat);
  if (g_p.agent_watch) tdist_store_release(g_p.agent_watch);
  for (int r = g_p.lo; !g_cfg.agg && g_p.s && r < g_p.hi; r++) {
    char key[64];
    snprintf(key, sizeof(key), "tdist/hb/%d", r);
    if (conn_of(r, 2)) tdist_store_set(conn_of(r, 2), key, "bye", 3);
  }
  for (int i = 0; g_p.s && i < nl * g_cfg.conns; i++)
    if (g_p.s[i]) tdist_store_release(g_p.s[i]);
  free(g_p.s);
  free(th);
  return rc;
}
