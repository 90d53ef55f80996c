/*
 * scale_hosts.c - tdist_bench_scale --hosts-agg: the host agent's design
 * (tools/launcher/agent.c, issue 30): per client process one agent with
 * two connections of its own, a beat thread writing "tdist/hbh/<process>"
 * and a record watcher handing deaths to its ranks. See scale_bench.c.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tdist/errors.h"
#include "tdist/store.h"

#include "scale_internal.h"

/* (rank thread) A monitor behind an agent: it reads the record count once
 * (where its records start) and then talks only to its agent (here: shared
 * memory), never to the store. */
void hosts_agg_rank(int r) {
  int64_t count = 0;
  if (tdist_store_add(conn_of(r, 1), "tdist/aborts/count", 0, &count)) {
    fail_msg(r, "monitor start");
    return;
  }
  atomic_fetch_add(&g_shm->ops, 1);
  wait_phase(PH_STOP);
}

/* (agent beat thread) Every interval one "tdist/hbh/<process>" listing the
 * process's ranks ("<r> a <value>"); the rank told to go silent is listed
 * until its local beats are older than the timeout, then as dead ("<r> d
 * ..."), as the agent judges a rank whose beats stopped. */
void *hosts_agg_beat(void *arg) {
  int host = (int)(intptr_t)arg, nl = g_p.hi - g_p.lo;
  int64_t timeout = env_ms("TDIST_HEARTBEAT_TIMEOUT_MS", 5000);
  size_t cap = (size_t)nl * 40 + 256;
  char *v = malloc(cap), key[48];
  double silent_since = 0;
  int silent_done = 0;
  if (!v) return NULL;
  snprintf(key, sizeof(key), "tdist/hbh/%d", host);
  if (wait_phase(PH_MON)) goto done;
  for (int first = 1; phase_now() != PH_STOP; first = 0) {
    double t = now_s();
    size_t len = 0;
    int silent = atomic_load(&g_shm->silent);
    if (silent >= g_p.lo && silent < g_p.hi && silent_since == 0) {
      silent_since = t; /* its local beats stop now: the last one */
      g_shm->r[silent].t_beat = t;
    }
    for (int r = g_p.lo; r < g_p.hi; r++) {
      if (r == silent && silent_done) continue;
      if (r == silent && (t - silent_since) * 1000 > (double)timeout) {
        len += (size_t)snprintf(v + len, cap - len, "%d d no heartbeat for %.0f ms\n", r,
                                (t - silent_since) * 1000);
        silent_done = 1;
        continue;
      }
      len += (size_t)snprintf(v + len, cap - len, "%d a 0000000000000001:0\n", r);
    }
    if (tdist_store_set(g_p.agent_beat, key, v, len)) {
      if (phase_now() != PH_STOP) fail_msg(g_p.lo, "host heartbeat");
      goto done;
    }
    atomic_fetch_add(&g_shm->ops, 1);
    for (int r = g_p.lo; r < g_p.hi; r++) /* the local beats the agent had */
      if (r != silent) g_shm->r[r].t_beat = now_s();
    if (first) atomic_fetch_add(&g_shm->mon_ready, nl);
    /* judged every quarter of the timeout at most, beat every interval */
    double step = (double)g_cfg.hb_ms / 1000.0, judge = (double)timeout / 4000.0;
    if (judge > 0.25) judge = 0.25; /* as the agent's loop: at most 250 ms */
    double next = t + step;
    while (phase_now() != PH_STOP && now_s() < next) {
      sleep_s(judge < step ? judge : step);
      silent = atomic_load(&g_shm->silent);
      if (silent < g_p.lo || silent >= g_p.hi || silent_done) continue;
      if (silent_since == 0) { /* its local beats stop now: the last one */
        silent_since = now_s();
        g_shm->r[silent].t_beat = silent_since;
      }
      if ((now_s() - silent_since) * 1000 > (double)timeout) break; /* reported at once */
    }
  }
done:
  free(v);
  return NULL;
}

/* (agent relay thread) One watcher per host: wait for the next record,
 * read every new one in one multi_get, hand each death to the local ranks
 * (here: their counters; a real agent writes a line to each rank). */
void *hosts_agg_relay(void *arg) {
  (void)arg;
  enum { BATCH = 512 };
  int64_t next = 0;
  char(*key)[48] = calloc(BATCH, sizeof(*key));
  const char **keys = calloc(BATCH, sizeof(*keys));
  void **vals = calloc(BATCH, sizeof(*vals));
  size_t *lens = calloc(BATCH, sizeof(*lens));
  if (!key || !keys || !vals || !lens || wait_phase(PH_MON)) goto done;
  if (tdist_store_add(g_p.agent_watch, "tdist/aborts/count", 0, &next)) goto fail;
  next++;
  while (phase_now() != PH_STOP) {
    snprintf(key[0], sizeof(key[0]), "tdist/aborts/%" PRId64, next);
    keys[0] = key[0];
    int rc = tdist_store_wait(g_p.agent_watch, keys, 1, 500);
    atomic_fetch_add(&g_shm->ops, 1);
    if (rc == TDIST_ERR_TIMEOUT) continue;
    if (rc) goto fail;
    int64_t count = next;
    if (tdist_store_add(g_p.agent_watch, "tdist/aborts/count", 0, &count)) goto fail;
    size_t n = count >= next ? (size_t)(count - next + 1) : 1;
    if (n > BATCH) n = BATCH;
    for (size_t k = 1; k < n; k++) {
      snprintf(key[k], sizeof(key[k]), "tdist/aborts/%" PRId64, next + (int64_t)k);
      keys[k] = key[k];
    }
    if (tdist_store_multi_get(g_p.agent_watch, keys, n, vals, lens, 5000)) goto fail;
    atomic_fetch_add(&g_shm->ops, 2);
    int deaths = 0;
    for (size_t k = 0; k < n; k++) {
      deaths += lens[k] > 5 && memcmp(vals[k], "dead ", 5) == 0;
      tdist_store_free(vals[k]);
    }
    /* One hand-over per rank per batch (the agent writes a batch at once). */
    double t = now_s();
    for (int r = g_p.lo; deaths && r < g_p.hi; r++) {
      g_shm->r[r].t_dead = t;
      atomic_fetch_add(&g_shm->r[r].ndead, deaths);
    }
    next += (int64_t)n;
  }
  goto done;
fail:
  if (phase_now() != PH_STOP) fail_msg(g_p.lo, "host agent's record watch");
done:
  free(key);
  free(keys);
  free(vals);
  free(lens);
  return NULL;
}
