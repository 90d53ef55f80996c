/*
 * monitor.c - see monitor.h. Two threads per runtime context, each with a
 * store connection of its own (behind a host agent: the monitor thread's
 * is opened on first use, the heartbeat thread talks to the agent):
 *   - the monitor thread (here) publishes abort records, waits for records
 *     (from the store, or relayed by the host agent), runs diagnoses and
 *     refreshes the heartbeat's value; its handlers go through the progress
 *     thread (tdist__progress_call), so it may wait behind one long step of
 *     that thread;
 *   - the heartbeat thread (heartbeat.c, with the host agent's client) only
 *     writes the heartbeat, so a long data-path step never delays one.
 * Start and stop run on the caller. The monitor object and who owns which
 * of its fields: monitor_impl.h.
 */
#include "core/group/monitor.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/group/monitor_impl.h"
#include "store/store_impl.h"
#include "util/alloc.h"
#include "util/clock.h"
#include "util/error.h"

#define COUNT_KEY "tdist/aborts/count"

void tdist__monitor_publish(tdist__monitor_t *m, uint64_t uid, int status, const char *reason) {
  if (!m) return;
  pthread_mutex_lock(&m->mu);
  if (m->nq < QUEUE_MAX)
    snprintf(m->queue[m->nq++], sizeof(m->queue[0]), "%016" PRIx64 " %d %d %s", uid, m->world_rank,
             status, reason);
  pthread_mutex_unlock(&m->mu);
}

int tdist__monitor_diagnose(tdist__monitor_t *m, uint64_t uid, uint64_t seq, uint64_t coll,
                            int peer, int64_t timeout_ms) {
  int queued = 0;
  if (!m) return 0;
  pthread_mutex_lock(&m->mu);
  if (m->ndiag < QUEUE_MAX) {
    m->diag[m->ndiag].uid = uid;
    m->diag[m->ndiag].seq = seq;
    m->diag[m->ndiag].coll = coll;
    m->diag[m->ndiag].timeout_ms = timeout_ms;
    m->diag[m->ndiag].peer = peer;
    m->ndiag++;
    queued = 1;
  }
  pthread_mutex_unlock(&m->mu);
  return queued;
}

void tdist__mon_apply_record(tdist__monitor_t *m, const char *rec, size_t len) {
  char buf[400];
  snprintf(buf, sizeof(buf), "%.*s", (int)len, rec);
  char *end = NULL;
  int dead = strncmp(buf, "dead ", 5) == 0;
  uint64_t uid = dead ? 0 : strtoull(buf, &end, 16);
  if (dead) end = buf + 4;
  if (!end || *end != ' ') return;
  int rank = (int)strtol(end + 1, &end, 10);
  if (!end || *end != ' ' || rank == m->world_rank) return; /* about ourselves */
  int status = TDIST_ERR_REMOTE_FAILED;
  if (!dead) {
    status = (int)strtol(end + 1, &end, 10);
    if (!end || *end != ' ' || status >= 0 || status <= TDIST_ERR_MIN_) return;
  }
  tdist__mon_record_t r = {dead, uid, status, rank, end + 1};
  TDIST_INFO(CORE, "%s record from rank %d for group %016" PRIx64 ": %s", dead ? "death" : "abort",
             rank, uid, end + 1);
  m->h.on_record(m->h.arg, &r);
}

/* The store's address for messages: the connection's, or the base's. */
static const char *mon_address(const tdist__monitor_t *m) {
  return tdist_store_address(m->conn ? m->conn : m->base);
}

/* (monitor) The monitor's own connection, opened on first use when its
 * store is reached through a host agent: a rank that never publishes or
 * diagnoses costs the agent nothing (100k ranks: 100k connections fewer
 * at creation, docs/scale.md). 1 when it can be called. */
static int conn_ready(tdist__monitor_t *m) {
  if (m->conn) return 1;
  tdist_store_t *fresh = NULL;
  if (tdist__store_reconnect(m->base, STORE_CALL_MS, &fresh) != 0) {
    TDIST_WARN(CORE, "monitor: no store connection through the host agent: %s", tdist_last_error());
    return 0;
  }
  fresh->timeout_ms = STORE_CALL_MS;
  m->conn = fresh;
  return 1;
}

/* (monitor) Something waits for a store call (a record, a diagnosis). */
static int pending(tdist__monitor_t *m) {
  pthread_mutex_lock(&m->mu);
  int n = m->nq + m->ndiag;
  pthread_mutex_unlock(&m->mu);
  return n > 0;
}

static void publish_queued(tdist__monitor_t *m) {
  char recs[QUEUE_MAX][320];
  if (!m->conn && (!pending(m) || !conn_ready(m))) return; /* (kept for the next round) */
  pthread_mutex_lock(&m->mu);
  int n = m->nq;
  memcpy(recs, m->queue, sizeof(recs[0]) * (size_t)n);
  m->nq = 0;
  pthread_mutex_unlock(&m->mu);
  for (int i = 0; i < n; i++) {
    int64_t idx = 0;
    char key[64];
    if (tdist_store_add(m->conn, COUNT_KEY, 1, &idx) != 0) goto fail;
    snprintf(key, sizeof(key), "tdist/aborts/%" PRId64, idx);
    if (tdist_store_set(m->conn, key, recs[i], strlen(recs[i])) != 0) goto fail;
    continue;
  fail:
    TDIST_WARN(CORE, "monitor: could not publish an abort record: %s", tdist_last_error());
  }
}

/* ---- the heartbeat's value (monitor thread; heartbeat.c sends it) ---------- */

/* (monitor) Ask the group layer for the heartbeat's value. This waits for
 * the progress thread, which is why the heartbeat thread never does it: a
 * stale value only makes a diagnosis one interval older. */
static void refresh_snapshot(tdist__monitor_t *m) {
  char buf[sizeof(m->snap)];
  size_t len = m->h.snapshot(m->h.arg, buf, sizeof(buf));
  if (len == 0 || len > sizeof(buf)) len = (size_t)snprintf(buf, sizeof(buf), "-");
  pthread_mutex_lock(&m->mu);
  memcpy(m->snap, buf, len);
  m->snap_len = len;
  m->snap_fresh = 1; /* the heartbeat thread sends it now */
  pthread_cond_signal(&m->cv);
  pthread_mutex_unlock(&m->mu);
}

/* ---- timeout diagnosis (monitor thread) ------------------------------------------ */

/* next_coll of group `uid` in a heartbeat value (not NUL-terminated); -1 if
 * absent. *left = 1 when the entry is a destroyed group's
 * ("uid:next_coll-", inflight.c snap_task). */
static int64_t seq_in(const char *val, size_t len, uint64_t uid, int *left) {
  char want[24];
  snprintf(want, sizeof(want), "%016" PRIx64 ":", uid);
  for (size_t i = 0; i + 17 < len; i++) {
    if ((i != 0 && val[i - 1] != ' ') || memcmp(val + i, want, 17) != 0) continue;
    int64_t v = 0;
    size_t j = i + 17;
    for (; j < len && val[j] >= '0' && val[j] <= '9'; j++)
      v = v * 10 + (val[j] - '0');
    *left = j < len && val[j] == '-';
    return v;
  }
  return -1;
}

/* A host's heartbeat, read once per diagnosis for all its ranks. */
struct host_cache {
  long host; /* -1: none */
  void *val;
  size_t len;
};

/* (monitor) Does `key` exist? Never waits (a missing key is the answer). */
static int exists(tdist__monitor_t *m, const char *key) {
  const char *keys[1] = {key};
  int all = 0;
  return tdist_store_check(m->conn, keys, 1, &all) == 0 && all;
}

/* peer_seq's answer for a heartbeat it could not read (no key yet, a store
 * call that failed on a loaded host): unknown, unlike -1 (read, and the
 * group is not in it). */
#define PEER_UNREAD (-2)

/* next_coll of group uid in world rank wr's heartbeat: its own key, or, for a
 * rank behind a host agent, its line "<wr> a <value>" in the host's
 * heartbeat (the store's detector wrote which host: "tdist/hbat/<wr>").
 * -1 if the heartbeat lists no such group; PEER_UNREAD. *left = 1 when
 * the rank destroyed the group (its next_coll then is where it left). */
static int64_t peer_seq(tdist__monitor_t *m, int wr, uint64_t uid, struct host_cache *hc,
                        int *left) {
  char key[48];
  void *val = NULL;
  size_t len = 0;
  int64_t next = PEER_UNREAD;
  snprintf(key, sizeof(key), "tdist/hb/%d", wr);
  if (exists(m, key) && tdist_store_get(m->conn, key, &val, &len, 100) == 0) {
    next = seq_in(val, len, uid, left);
    tdist_store_free(val);
    return next;
  }
  snprintf(key, sizeof(key), "tdist/hbat/%d", wr);
  if (!exists(m, key) || tdist_store_get(m->conn, key, &val, &len, 100) != 0) return PEER_UNREAD;
  char hs[24];
  snprintf(hs, sizeof(hs), "%.*s", (int)(len < 16 ? len : 16), (char *)val);
  tdist_store_free(val);
  long host = strtol(hs, NULL, 10);
  if (hc->host != host) {
    tdist_store_free(hc->val);
    hc->val = NULL;
    hc->host = -1;
    snprintf(key, sizeof(key), "tdist/hbh/%ld", host);
    if (tdist_store_get(m->conn, key, &hc->val, &hc->len, 100) != 0) return PEER_UNREAD;
    hc->host = host;
  }
  char want[24];
  int wl = snprintf(want, sizeof(want), "%d a ", wr);
  const char *p = hc->val, *end = p + hc->len;
  while (p < end) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    const char *le = nl ? nl : end;
    if (le - p >= wl && memcmp(p, want, (size_t)wl) == 0) {
      next = seq_in(p + wl, (size_t)(le - p - wl), uid, left);
      break;
    }
    p = le + 1;
  }
  return next;
}

struct members {
  int size, rank;
  int ranks[4096];
  char name[96];
};

/* Which members of the group never submitted op `seq`? Learnt from their
 * heartbeats (each member's count of the group's collectives: `coll` is
 * the op's number among them, tdist_work_t.coll; seqs count p2p ops too,
 * and so differ across ranks once some ran p2p ops: a 3-stage pipeline's
 * middle rank is twice as far as the others), which are at most one
 * heartbeat period old: a rank that
 * submitted the op just before the deadline may not have beaten since. So
 * the ranks found behind are read once more after one period (the
 * monitor's thread may wait; the op waits for the verdict) and only a rank
 * still behind then is named -- when that period is at most half the op's
 * timeout: the failure then comes at most half a timeout late, and an op
 * with a shorter timeout than that is named from one look, as before.
 * Without the second look a loaded machine named a rank that was waiting
 * in the op itself (cpu_failures stopped, 1.5 s timeout, under stress-ng
 * and two builds: "ranks 0, 2 had not reached seq 1", rank 0 had). */
/* "0, 2, 5" of ranks r[0..n-1] into text (cut short when full). */
static void rank_list(char *text, size_t cap, const int *r, int n) {
  size_t tl = 0;
  text[0] = '\0';
  for (int j = 0; j < n; j++) {
    int k = snprintf(text + tl, cap - tl, "%s%d", j ? ", " : "", r[j]);
    if (k < 0 || (size_t)k >= cap - tl) break;
    tl += (size_t)k;
  }
}

static void diagnose(tdist__monitor_t *m, uint64_t uid, uint64_t seq, uint64_t coll, int peer,
                     int64_t timeout_ms) {
  struct members *mb = tdist__calloc(1, sizeof(*mb));
  /* late[]: ranks found behind; gone_r[] (its second half): ranks that
   * had destroyed the group */
  int *late = tdist__calloc(2 * 4096, sizeof(int)), *gone_r = late ? late + 4096 : NULL;
  if (!mb || !late) {
    tdist__free(mb);
    tdist__free(late);
    return;
  }
  int found = m->h.members(m->h.arg, uid, &mb->rank, &mb->size, mb->ranks, 4096, mb->name,
                           sizeof(mb->name));
  char text[256], gtext[256];
  int behind = 0, gone = 0;
  struct host_cache hc = {-1, NULL, 0};
  int64_t period = tdist__param_HeartbeatIntervalMs() + tdist__param_MonitorIntervalMs();
  int looks = period * 2 <= timeout_ms ? 2 : 1;
  for (int look = 0; found && look < looks; look++) {
    if (look == 1) {
      if (behind == 0) break;
      struct timespec ts = {period / 1000, (period % 1000) * 1000000L};
      nanosleep(&ts, NULL);
      tdist_store_free(hc.val); /* read the hosts' beats afresh */
      hc.val = NULL;
      hc.host = -1;
    }
    /* A send or receive waits for its peer alone: another member's late
     * heartbeat says nothing about it (under load, nccl_sim_p2p's timed-out
     * send to rank 1 named "ranks 1, 2", and rank 2 had posted its ops).
     * Heartbeats count collectives, not the ops of each pair: the peer is
     * known to be behind only when it had not submitted every collective
     * that came before this op here (coll of them); when it had, whether
     * it posted the matching op is not known (the verdict says so). */
    int one = look == 0 && peer >= 0 && peer < mb->size;
    int n = one ? 1 : look == 0 ? mb->size : behind, still = 0;
    for (int j = 0; j < n; j++) {
      int i = one ? peer : look == 0 ? j : late[j];
      if (i == mb->rank) continue;
      int left = 0;
      int64_t next = peer_seq(m, mb->ranks[i], uid, &hc, &left);
      for (int again = 0; next == PEER_UNREAD && again < 3; again++) {
        struct timespec ts = {0, 50 * 1000000}; /* a loaded store: read it again */
        nanosleep(&ts, NULL);
        next = peer_seq(m, mb->ranks[i], uid, &hc, &left);
      }
      /* A collective: it submitted this op. A p2p op: it is past the
       * collectives before it (inconclusive), and has not destroyed the
       * group (then it never will post its side). */
      if (peer >= 0 ? !left && next >= (int64_t)coll : next > (int64_t)coll) continue;
      if (left) {
        /* It destroyed the group before this op: the op can never finish,
         * and "had not reached" would blame it for being slow. */
        gone_r[gone++] = i;
        continue;
      }
      /* Still unread, or read without the group (a rank whose last beat
       * predates the group's creation, or one that destroyed it longer ago
       * than its heartbeat lists): it cannot be vouched for, and counts as
       * not having reached the op. */
      late[still++] = i;
    }
    behind = still;
  }
  rank_list(text, sizeof(text), late, behind);
  rank_list(gtext, sizeof(gtext), gone_r, gone);
  char verdict[480];
  if (!found)
    verdict[0] = '\0';
  else if (gone)
    snprintf(verdict, sizeof(verdict),
             "rank%s %.150s of group '%.95s' had destroyed the group before seq %" PRIu64
             "%s%s%.150s%s",
             gone > 1 ? "s" : "", gtext, mb->name, seq, behind ? "; " : "",
             behind > 1 ? "ranks "
             : behind   ? "rank "
                        : "",
             text, behind ? " had not reached it" : "");
  else if (behind)
    snprintf(verdict, sizeof(verdict),
             "rank%s %.255s of group '%.95s' had not reached seq %" PRIu64, behind > 1 ? "s" : "",
             text, mb->name, seq);
  else if (peer >= 0 && peer < mb->size)
    snprintf(
        verdict, sizeof(verdict),
        "its peer, rank %d of group '%.95s', had submitted every collective before seq %" PRIu64
        " (whether it posted the matching op is not known)",
        peer, mb->name, seq);
  else
    snprintf(verdict, sizeof(verdict),
             "every rank of group '%.95s' had reached seq %" PRIu64 " (stuck in the backend)",
             mb->name, seq);
  m->h.on_verdict(m->h.arg, uid, seq, verdict[0] ? verdict : NULL);
  tdist_store_free(hc.val);
  tdist__free(mb);
  tdist__free(late);
}

static void run_diagnoses(tdist__monitor_t *m) {
  struct diag_req reqs[QUEUE_MAX];
  if (!m->conn && (!pending(m) || !conn_ready(m))) return; /* (kept for the next round) */
  pthread_mutex_lock(&m->mu);
  int n = m->ndiag;
  memcpy(reqs, m->diag, sizeof(reqs[0]) * (size_t)n);
  m->ndiag = 0;
  pthread_mutex_unlock(&m->mu);
  for (int i = 0; i < n; i++)
    diagnose(m, reqs[i].uid, reqs[i].seq, reqs[i].coll, reqs[i].peer, reqs[i].timeout_ms);
}

/* Keep the connection usable and notice a store that stopped answering.
 * Returns 1 when the store can be called this round. */
static int store_check(tdist__monitor_t *m) {
  int64_t silent = tdist__now_ms() - m->last_ok_ms, limit = tdist__param_HeartbeatTimeoutMs();
  if (m->agent_fd >= 0 && !m->store_lost && limit > 0 && (silent > limit || m->agent_gone)) {
    /* Behind an agent, "the store answers" is its "ok" (each of its beats
     * that reached the store): a silent agent or store is a lost store. */
    m->store_lost = 1;
    TDIST_WARN(CORE,
               "monitor: the store (through the host agent '%s') has not answered for %lld ms",
               m->agent_name, (long long)silent);
    m->h.on_store_lost(m->h.arg, silent, mon_address(m));
  }
  /* Not opened yet (behind an agent): opened when something needs it. */
  if (!m->conn) return !pending(m) || conn_ready(m);
  if (tdist__store_alive(m->conn)) return 1;
  if (!m->store_lost && limit > 0 && silent > limit) {
    m->store_lost = 1;
    TDIST_WARN(CORE, "monitor: the store at %s has not answered for %lld ms",
               tdist_store_address(m->conn), (long long)silent);
    m->h.on_store_lost(m->h.arg, silent, tdist_store_address(m->conn));
  }
  /* A reconnect attempt ends by the time the store would count as lost. */
  int64_t budget = limit > 0 && !m->store_lost ? limit - silent : STORE_CALL_MS;
  if (budget > STORE_CALL_MS) budget = STORE_CALL_MS;
  if (budget < 50) budget = 50;
  tdist_store_t *fresh = NULL;
  if (tdist__store_reconnect(m->conn, budget, &fresh) == 0) {
    tdist_store_release(m->conn);
    m->conn = fresh;
    m->conn->timeout_ms = STORE_CALL_MS;
    m->last_ok_ms = tdist__now_ms();
    TDIST_INFO(CORE, "monitor: store connection reopened");
    return 1;
  }
  return 0;
}

static void *monitor_main(void *arg) {
  tdist__monitor_t *m = arg;
  int64_t interval = tdist__param_MonitorIntervalMs();
  int warned = 0;
  for (;;) {
    if (!store_check(m)) {
      pthread_mutex_lock(&m->mu);
      int stop = m->stop;
      pthread_mutex_unlock(&m->mu);
      if (stop) break;
      struct timespec ts = {0, 20 * 1000000}; /* the reconnect attempt waited already */
      nanosleep(&ts, NULL);
      continue;
    }
    pthread_mutex_lock(&m->mu);
    int stop = m->stop;
    pthread_mutex_unlock(&m->mu);
    publish_queued(m); /* also on the way out: a final abort must get out */
    run_diagnoses(m);
    if (stop) break; /* the heartbeat thread says "bye" after us */
    int64_t now = tdist__now_ms();
    if (now - m->last_snap_ms >= tdist__param_HeartbeatIntervalMs()) {
      refresh_snapshot(m);
      m->last_snap_ms = now;
    }
    if (m->agent_fd >= 0) {
      /* the agent watches the records for this host; the ones it relays go
       * to the handler passed down (heartbeat.c never calls up into here) */
      tdist__mon_agent_poll(m, interval, tdist__mon_apply_record);
      continue;
    }
    char key[64];
    snprintf(key, sizeof(key), "tdist/aborts/%" PRId64, m->next);
    const char *keys[1] = {key};
    int rc = tdist_store_wait(m->conn, keys, 1, interval);
    if (rc == 0 || (rc == TDIST_ERR_TIMEOUT && tdist__store_alive(m->conn)))
      m->last_ok_ms = tdist__now_ms(); /* answered (a wait that expired on the server) */
    if (rc == TDIST_ERR_TIMEOUT) continue;
    if (rc != 0) {
      if (!warned++) TDIST_WARN(CORE, "monitor: store unreachable: %s", tdist_last_error());
      struct timespec ts = {0, (long)interval * 1000000};
      nanosleep(&ts, NULL);
      continue;
    }
    void *val = NULL;
    size_t len = 0;
    if (tdist_store_get(m->conn, key, &val, &len, interval) == 0) {
      tdist__mon_apply_record(m, val, len);
      tdist_store_free(val);
    }
    m->next++;
  }
  return NULL;
}

int tdist__monitor_start(tdist_store_t *store, int world_rank, int agent,
                         const tdist__mon_handlers_t *h, tdist__monitor_t **out) {
  int rc = 0, registered = 0, monitor_started = 0;
  *out = NULL;
  tdist__monitor_t *m = tdist__calloc(1, sizeof(*m));
  if (!m) return tdist__error(TDIST_ERR_NO_MEMORY, "monitor: out of memory");
  pthread_mutex_init(&m->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&m->cv, &ca);
  pthread_condattr_destroy(&ca);
  m->world_rank = world_rank;
  m->h = *h;
  m->agent_fd = -1;
  int64_t count = 0;
  if (store->root->agent) {
    /* Through a host agent (tools/launcher/agent_proxy.c): the count on the
     * caller's own connection (nothing else waits on it while its context
     * is made), the monitor's connection on first use (conn_ready). */
    TDIST_CHECKGOTO(tdist__store_root_view(store, &m->base), rc, fail);
    TDIST_CHECKGOTO(tdist_store_add(m->base, COUNT_KEY, 0, &count), rc, fail);
  } else {
    /* No lock is held here: connecting may take a while. */
    TDIST_CHECKGOTO(tdist__store_reconnect(store, STORE_CALL_MS * 10, &m->conn), rc, fail);
    /* The first read is part of the caller's init: it may take as long as
     * the caller's own store calls (64 ranks starting at once on two loaded
     * cores got their answer after STORE_CALL_MS, failed init, and left the
     * others waiting in NCCL's init: nccl_sim_cfg_n64 under stress-ng). */
    m->conn->timeout_ms = store->timeout_ms > STORE_CALL_MS ? store->timeout_ms : STORE_CALL_MS;
    TDIST_CHECKGOTO(tdist_store_add(m->conn, COUNT_KEY, 0, &count), rc, fail);
    m->conn->timeout_ms = STORE_CALL_MS; /* bounds the calls that do not wait */
  }
  m->next = count + 1; /* records of earlier jobs on this store are history */
  if (agent) tdist__mon_agent_open(m);
  /* No agent to relay the records after all: the monitor waits for them. */
  if (m->agent_fd < 0 && !m->conn) {
    TDIST_CHECKGOTO(tdist__store_reconnect(m->base, STORE_CALL_MS * 10, &m->conn), rc, fail);
    m->conn->timeout_ms = STORE_CALL_MS;
  }
  if (m->agent_fd < 0)
    TDIST_CHECKGOTO(tdist__store_reconnect(store, STORE_CALL_MS * 10, &m->hb_conn), rc, fail);
  /* A heartbeat may wait for a slow store up to the heartbeat timeout: one
   * that gives up sooner closes its connection, which the store takes for a
   * death. */
  int64_t hb_timeout = tdist__param_HeartbeatTimeoutMs();
  if (m->hb_conn) m->hb_conn->timeout_ms = hb_timeout > STORE_CALL_MS ? hb_timeout : STORE_CALL_MS;

  /* Register with the liveness detector before the group exists, so a rank
   * that dies at once is still known (and declared dead). */
  refresh_snapshot(m);
  tdist__mon_heartbeat(m, 0);
  m->snap_fresh = 0; /* sent; no thread runs yet */
  registered = 1;
  m->last_snap_ms = m->last_ok_ms = tdist__now_ms();
  if (pthread_create(&m->thread, NULL, monitor_main, m) != 0) {
    rc = tdist__error(TDIST_ERR_INTERNAL, "monitor: cannot start its thread");
    goto fail;
  }
  monitor_started = 1;
  if (pthread_create(&m->hb_thread, NULL, tdist__mon_heartbeat_main, m) != 0) {
    rc = tdist__error(TDIST_ERR_INTERNAL, "monitor: cannot start its heartbeat thread");
    goto fail;
  }
  *out = m;
  return 0;
fail:
  if (monitor_started) {
    pthread_mutex_lock(&m->mu);
    m->stop = 1;
    pthread_mutex_unlock(&m->mu);
    pthread_join(m->thread, NULL);
  }
  if (registered) {
    if (m->hb_conn) m->hb_conn->timeout_ms = STORE_CALL_MS;
    tdist__mon_heartbeat(m, 1); /* registered but never ran: not a death */
  }
  if (m->agent_fd >= 0) close(m->agent_fd);
  if (m->hb_conn) tdist_store_release(m->hb_conn);
  if (m->conn) tdist_store_release(m->conn);
  if (m->base) tdist_store_release(m->base);
  pthread_cond_destroy(&m->cv);
  pthread_mutex_destroy(&m->mu);
  tdist__free(m);
  return rc;
}

/* (caller) The monitor thread first (it publishes the last abort records),
 * then the heartbeat thread, whose "bye" is this process's last word. */
void tdist__monitor_stop(tdist__monitor_t *m) {
  if (!m) return;
  pthread_mutex_lock(&m->mu);
  m->stop = 1;
  pthread_mutex_unlock(&m->mu);
  pthread_join(m->thread, NULL); /* returns within one wait interval */
  pthread_mutex_lock(&m->mu);
  m->hb_stop = 1;
  pthread_cond_signal(&m->cv);
  pthread_mutex_unlock(&m->mu);
  pthread_join(m->hb_thread, NULL);
  if (m->agent_fd >= 0) close(m->agent_fd); /* after its "bye" */
  if (m->hb_conn) tdist_store_release(m->hb_conn);
  if (m->conn) tdist_store_release(m->conn);
  if (m->base) tdist_store_release(m->base);
  pthread_cond_destroy(&m->cv);
  pthread_mutex_destroy(&m->mu);
  tdist__free(m);
}
