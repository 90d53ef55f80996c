/*
 * rendezvous.c - the part of tdist_init_process_group below the core (it
 * uses only the store and util): find rank, world size, timeout and a store
 * from opts and the environment (env://, tcp://, file://, etcd://, a URL in
 * TDIST_STORE_URL, or a given store; the variables are read in rdzv_env.c),
 * host the store on rank 0 when asked (a process of its own, spawn.h, or a
 * thread), check that no two processes
 * claim one rank, wait until every rank arrived. core/init.c then creates the
 * world group.
 *
 * Keys (under "tdist/rdzv/"): "rank/<r>" holds the claiming process's id
 * (compare_set, so a second claimant sees someone else's id: duplicate RANK);
 * "arrived" counts arrivals, the one that completes a round of world_size sets
 * "go/<round>", which the others wait on (woken by that write). On a store
 * whose counters contend (etcd, tdist__store_count_prefix) each rank puts
 * "in/<round>/<rank>" instead and counts the round's keys; its round is
 * its own count "arrivals/<rank>" (rendezvous(), arrive_by_keys). "left"
 * counts ranks that ran tdist__rendezvous_cleanup (not on etcd).
 * "list/<round>" collects "<rank>," of the ranks that joined by themselves
 * (one append each; not on etcd, whose "in/" keys say it), so a timeout
 * names the ranks that never arrived. "exit/<round>" is a launcher's
 * record that a rank of its exited before joining that round (tdistrun,
 * tools/launcher/main.c): the waiters check it between slices of their
 * wait and fail at once naming that rank and its exit (tdist__rdzv_wait_go).
 *
 * The hosted server and the rendezvous store handle live in a process-global
 * record until tdist__rendezvous_cleanup() (called by the core's runtime
 * context when the last group of the world is gone): every rank adds to "left"; rank 0 then waits,
 * bounded by the timeout, until all ranks have left before stopping the server
 * (thread or process). A store process whose rank 0 is gone ends by itself.
 *
 * Threads: the caller's; the record is guarded by a mutex.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "store/rendezvous.h"
#include "store/spawn.h"
#include "store/store_impl.h"
#include "tdist/group.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/param.h"

#define RDZV_PREFIX "tdist/rdzv/"

TDIST_PARAM(TimeoutMs, "TDIST_TIMEOUT_MS", 600000)
TDIST_PARAM(StoreHosted, "TDIST_STORE_HOSTED", 0)
TDIST_PARAM(StoreInProcess, "TDIST_STORE_IN_PROCESS", 0)
/* 0: a rank under tdistrun opens its store connections itself rather than
 * through the host agent's proxy. */
TDIST_PARAM(StoreViaAgent, "TDIST_STORE_VIA_AGENT", 1)

static pthread_mutex_t rdzv_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
  tdist_store_server_t *server; /* hosted by a thread of this process (rank 0), or NULL */
  tdist__store_proc_t proc;     /* hosted by a process rank 0 started, or pid -1 */
  tdist_store_t *store;         /* view RDZV_PREFIX, for the exit count */
  int rank, size;
  int64_t timeout_ms;
} rdzv;

/* The job's id: TDIST_JOB_ID when a launcher set one, else the first rank's
 * proposal for this round ("job/<round>": the same on every rank, new for
 * every job even on a long-lived store). */
int tdist__rdzv_agree_job(tdist_store_t *v, int64_t round, char *job, size_t jl) {
  const char *env = tdist__env_raw("TDIST_JOB_ID");
  if (env) {
    snprintf(job, jl, "%s", env);
    tdist__job_id_clean(job);
    return 0;
  }
  char key[64], mine[64], host[32] = "?";
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  gethostname(host, sizeof(host) - 1);
  for (char *c = host; *c; c++)
    if (*c == '.') *c = '\0';
  snprintf(mine, sizeof(mine), "%s-%d-%lld", host, (int)getpid(), (long long)ts.tv_sec);
  snprintf(key, sizeof(key), "job/%" PRId64, round);
  void *cur = NULL;
  size_t cl = 0;
  TDIST_CHECK(tdist_store_compare_set(v, key, NULL, 0, mine, strlen(mine), &cur, &cl));
  snprintf(job, jl, "%.*s", (int)cl, (const char *)cur);
  tdist_store_free(cur);
  tdist__job_id_clean(job);
  return 0;
}

/* Count this rank in on a store that counts key prefixes (etcd, where
 * all ranks adding to one counter cost O(n^2) compare-txns: each round of
 * conflicts lets one writer through). The round is this rank's own count
 * of arrivals ("arrivals/<rank>": one writer, so its add never conflicts;
 * the k-th join of every rank is round k-1, as (arrived - 1) / size is on
 * a counter). The rank puts "in/<round>/<rank>" and then counts the keys
 * under "in/<round>/" in one read: *seen.
 *
 * Why the last arrival always sees all of them: every rank's put completes
 * before its own count is sent, and etcd's reads are linearizable (a read
 * sees every write that completed before it began). Take the put that
 * completed last (the highest revision of the round's n puts): all n puts
 * completed before its rank's count began, so that count is n, and that
 * rank sets "go/<round>". Other ranks may see n too and set it again:
 * harmless (the waiters wait for the key to exist). A rank that joins
 * twice in one round is refused by the claim before, and its key would be
 * the same key anyway. */
static int arrive_by_keys(tdist_store_t *v, int rank, int64_t *round, int64_t *seen) {
  char key[96];
  int64_t joins = 0;
  snprintf(key, sizeof(key), "arrivals/%d", rank);
  TDIST_CHECK(tdist_store_add(v, key, 1, &joins));
  *round = joins - 1;
  snprintf(key, sizeof(key), "in/%" PRId64 "/%d", *round, rank);
  TDIST_CHECK(tdist_store_set(v, key, "", 0));
  snprintf(key, sizeof(key), "in/%" PRId64 "/", *round);
  return tdist__store_count_prefix(v, key, seen);
}

/* How often a waiter looks for a launcher's "exit/<round>" record: first
 * every 250 ms (a rank that exits at its start is seen well within the
 * launcher's 1 s dump grace, so the others fail with its cause rather than
 * a SIGTERM), then less often, up to every 4 s: a long rendezvous of many
 * ranks (docs/scale.md, etcd) pays one check and one new wait per slice. */
#define EXIT_CHECK_MS 250
#define EXIT_CHECK_MAX_MS 4000

int tdist__rdzv_wait_go(tdist_store_t *v, int64_t round, int64_t timeout_ms, char *why, size_t wl) {
  char go[64], ex[64];
  snprintf(go, sizeof(go), "go/%" PRId64, round);
  snprintf(ex, sizeof(ex), "exit/%" PRId64, round);
  const char *gk = go, *ek = ex;
  int64_t deadline = tdist__now_ms() + timeout_ms, slice = EXIT_CHECK_MS;
  for (;; slice = slice * 2 < EXIT_CHECK_MAX_MS ? slice * 2 : EXIT_CHECK_MAX_MS) {
    int64_t left = deadline - tdist__now_ms();
    if (left <= 0) return TDIST_ERR_TIMEOUT;
    int rc = tdist_store_wait(v, &gk, 1, left < slice ? left : slice);
    if (rc != TDIST_ERR_TIMEOUT) return rc;
    int exists = 0;
    TDIST_CHECK(tdist_store_check(v, &ek, 1, &exists));
    if (!exists) continue;
    void *val = NULL;
    size_t vl = 0;
    TDIST_CHECK(tdist_store_get(v, ex, &val, &vl, 1000));
    snprintf(why, wl, "%.*s", (int)vl, (const char *)val);
    tdist_store_free(val);
    /* the round may have completed meanwhile (the rank exited after it) */
    TDIST_CHECK(tdist_store_check(v, &gk, 1, &exists));
    return exists ? 0 : TDIST_ERR_REMOTE_FAILED;
  }
}

/* Append "; ranks 1,3 never arrived" (the first 16) to buf when the ranks
 * that arrived in `round` are known: the "in/" keys on etcd, else
 * "list/<round>" when it lists as many ranks as the count says arrived (a
 * host agent counts its ranks in without listing them). */
void tdist__rdzv_missing(tdist_store_t *v, int64_t round, int size, int64_t arrived, char *buf,
                         size_t bl) {
  char key[64];
  unsigned char *in = calloc((size_t)size, 1);
  void *val = NULL;
  size_t vl = 0, n = strlen(buf);
  int listed = 0, missing = 0;
  if (!in || size > 65536 || arrived < 0) goto out;
  if (tdist__store_counts_prefixes(v)) {
    for (int r = 0; r < size; r++) {
      snprintf(key, sizeof(key), "in/%" PRId64 "/%d", round, r);
      const char *k = key;
      int e = 0;
      if (tdist_store_check(v, &k, 1, &e) != 0) goto out;
      if (e) in[r] = 1, listed++;
    }
  } else {
    snprintf(key, sizeof(key), "list/%" PRId64, round);
    const char *k = key;
    int e = 0;
    if (tdist_store_check(v, &k, 1, &e) != 0) goto out;
    if (e && tdist_store_get(v, key, &val, &vl, 1000) != 0) goto out;
    for (size_t i = 0; i < vl;) {
      int r = atoi((const char *)val + i);
      if (r >= 0 && r < size && !in[r]) in[r] = 1, listed++;
      while (i < vl && ((const char *)val)[i] != ',')
        i++;
      i++;
    }
  }
  if (listed != arrived) goto out;
  for (int r = 0; r < size && n + 16 < bl; r++) {
    if (in[r]) continue;
    if (++missing <= 16)
      n += (size_t)snprintf(buf + n, bl - n, "%s%d", missing == 1 ? "; ranks " : ",", r);
  }
  if (missing > 16 && n < bl) n += (size_t)snprintf(buf + n, bl - n, " and %d more", missing - 16);
  if (missing && n < bl) snprintf(buf + n, bl - n, " never arrived");
out:
  tdist_store_free(val);
  free(in);
}

/* How many ranks of `round` arrived, for a timeout's message; -1 unknown. */
static int64_t arrived_in(tdist_store_t *v, int by_keys, int64_t round, int size) {
  char key[64];
  int64_t now = -1;
  snprintf(key, sizeof(key), "in/%" PRId64 "/", round);
  if (by_keys) return tdist__store_count_prefix(v, key, &now) ? -1 : now;
  if (tdist_store_add(v, "arrived", 0, &now)) return -1;
  return now - round * size;
}

/* Claim our rank, count in, wait for the round to complete. Counting in is
 * one add to "arrived" (TCP, file: one op at the store), or one key per
 * rank where the store counts prefixes (arrive_by_keys). */
static int rendezvous(tdist_store_t *v, int rank, int size, int64_t timeout_ms, char *job,
                      size_t jl) {
  char key[64], me[128], host[64] = "?";
  gethostname(host, sizeof(host) - 1);
  snprintf(me, sizeof(me), "%s:%d", host, (int)getpid());
  snprintf(key, sizeof(key), "rank/%d", rank);
  void *cur = NULL;
  size_t cl = 0;
  TDIST_CHECK(tdist_store_compare_set(v, key, NULL, 0, me, strlen(me), &cur, &cl));
  int dup = cl != strlen(me) || memcmp(cur, me, cl) != 0;
  if (dup) {
    int rc = tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                          "RANK=%d is claimed by two processes: "
                          "%.*s and %s (this one)",
                          rank, (int)cl, (char *)cur, me);
    tdist_store_free(cur);
    return rc;
  }
  tdist_store_free(cur);
  int64_t arrived = 0, round = 0;
  int by_keys = tdist__store_counts_prefixes(v), rc;
  if (by_keys) {
    TDIST_CHECK(arrive_by_keys(v, rank, &round, &arrived));
  } else { /* TCP, file: its add is one op at the store */
    TDIST_CHECK(tdist_store_add(v, "arrived", 1, &arrived));
    round = (arrived - 1) / size;
    arrived -= round * size;
    /* who arrived, for a timeout to name who did not */
    char entry[16];
    snprintf(key, sizeof(key), "list/%" PRId64, round);
    snprintf(entry, sizeof(entry), "%d,", rank);
    TDIST_CHECK(tdist_store_append(v, key, entry, strlen(entry)));
  }
  snprintf(key, sizeof(key), "go/%" PRId64, round);
  TDIST_CHECK(tdist__rdzv_agree_job(v, round, job, jl));
  if (by_keys ? arrived >= size : arrived == size) TDIST_CHECK(tdist_store_set(v, key, "", 0));
  char why[256] = "", names[256] = "";
  rc = tdist__rdzv_wait_go(v, round, timeout_ms, why, sizeof(why));
  if (rc == TDIST_ERR_TIMEOUT || rc == TDIST_ERR_REMOTE_FAILED) {
    int64_t now = arrived_in(v, by_keys, round, size);
    tdist__rdzv_missing(v, round, size, now, names, sizeof(names));
    if (rc == TDIST_ERR_REMOTE_FAILED)
      return tdist__error(rc,
                          "rendezvous on %s failed: %s before joining (%" PRId64
                          " of WORLD_SIZE=%d ranks arrived%s)",
                          tdist_store_address(v), why, now, size, names);
    return tdist__error(rc,
                        "rendezvous on %s timed out after %" PRId64 " ms: %" PRId64 " of "
                        "WORLD_SIZE=%d ranks arrived%s",
                        tdist_store_address(v), timeout_ms, now, size, names);
  }
  return rc;
}

int tdist__rendezvous_round(tdist_store_t *view, int rank, int size, int64_t timeout_ms, char *job,
                            size_t jl) {
  return rendezvous(view, rank, size, timeout_ms, job, jl);
}

/* Rank 0 starts the store on `port` as `mode` (TDIST_HOST_STORE_*) asks:
 * a process (proc), else a thread (srv). */
static int host_store_on(int mode, int port, int size, tdist_store_server_t **srv,
                         tdist__store_proc_t *proc) {
  static int warned;
  if (mode == TDIST_HOST_STORE_DEFAULT && tdist__param_StoreInProcess() == 1)
    mode = TDIST_HOST_STORE_THREAD;
  if (mode != TDIST_HOST_STORE_THREAD) {
    int rc = tdist__store_proc_start(port, size, proc);
    if (rc != TDIST_ERR_NOT_SUPPORTED || mode == TDIST_HOST_STORE_PROCESS) return rc;
    if (!warned++)
      TDIST_WARN(INIT,
                 "%s: rank 0 serves the store from a thread, so survivors cannot shrink "
                 "if rank 0 dies",
                 tdist_last_error());
    tdist__error_clear();
  }
  tdist_store_server_opts_t sv = {.mask = TDIST_STORE_SERVER_FIELD_PORT, .port = port};
  return tdist_store_server_start(&sv, srv);
}

/* What joining takes from the options and the environment. */
typedef struct {
  int rank, size, host_store;
  int env_url; /* method: env:// replaced by $TDIST_STORE_URL */
  int64_t timeout;
  const char *method; /* an init_method URL */
} join_cfg_t;

static int join_cfg(const tdist_init_opts_t *o, join_cfg_t *c) {
  uint64_t m = o ? o->mask : 0;
  c->timeout = (m & TDIST_INIT_FIELD_TIMEOUT) && o->timeout_ms > 0 ? o->timeout_ms
                                                                   : tdist__param_TimeoutMs();
  if (c->timeout <= 0)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "TDIST_TIMEOUT_MS=%" PRId64 " must be > 0",
                        c->timeout);
  TDIST_CHECK(tdist__rdzv_rank_size(o, &c->rank, &c->size));
  c->method = (m & TDIST_INIT_FIELD_INIT_METHOD) && o->init_method ? o->init_method : "env://";
  /* env:// with TDIST_STORE_URL (tdistrun --store): the store is that URL. */
  const char *url = tdist__env_raw("TDIST_STORE_URL");
  if (strncmp(c->method, "env://", 6) == 0 && url && *url) {
    c->method = url;
    c->env_url = 1;
  }
  c->host_store = (m & TDIST_INIT_FIELD_HOST_STORE) ? o->host_store
                  : tdist__param_StoreHosted() == 1 ? TDIST_HOST_STORE_NONE
                                                    : TDIST_HOST_STORE_DEFAULT;
  if (c->host_store < TDIST_HOST_STORE_NONE || c->host_store > TDIST_HOST_STORE_THREAD)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                        "tdist_init_opts_t.host_store=%d is not a TDIST_HOST_STORE_* value",
                        c->host_store);
  return 0;
}

/* 1 when this rank meets on the store its launcher's host agent stands for:
 * env:// (TDIST_STORE_URL=tcp://... from tdistrun, or MASTER_ADDR/MASTER_PORT
 * from an older one), no store or rank given in opts, and the store not hosted
 * by a rank. The agent checks the rest (the rank is one of its own, the world
 * size is the job's). */
static int uses_launcher_store(const tdist_init_opts_t *o, const join_cfg_t *c) {
  uint64_t m = o ? o->mask : 0;
  if ((m & TDIST_INIT_FIELD_STORE) && o->store) return 0;
  if ((m & (TDIST_INIT_FIELD_RANK | TDIST_INIT_FIELD_WORLD_SIZE)) != 0) return 0;
  int env =
      strcmp(c->method, "env://") == 0 || (c->env_url && strncmp(c->method, "tcp://", 6) == 0);
  return c->host_store == TDIST_HOST_STORE_NONE && env;
}

/* The store everyone meets on: the one given, or one opened from the init
 * method, hosted first by rank 0 (*srv or *proc) when asked. */
static int open_root(const tdist_init_opts_t *o, const join_cfg_t *c, tdist_store_t **root,
                     tdist_store_server_t **srv, tdist__store_proc_t *proc) {
  tdist_store_opts_t so = {.mask = TDIST_STORE_FIELD_TIMEOUT, .timeout_ms = c->timeout};
  char host[256];
  int port = 0;
  if (o && (o->mask & TDIST_INIT_FIELD_STORE) && o->store) {
    *root = o->store;
    atomic_fetch_add_explicit(&(*root)->refs, 1, memory_order_relaxed);
    return 0;
  }
  if (strncmp(c->method, "file://", 7) == 0 || strncmp(c->method, "etcd://", 7) == 0)
    return tdist_store_open_url(c->method, &so, root);
  if (strncmp(c->method, "tcp://", 6) == 0 || strncmp(c->method, "env://", 6) == 0) {
    TDIST_CHECK(tdist__rdzv_store_addr(c->method, host, sizeof(host), &port));
    if (c->rank == 0 && c->host_store)
      TDIST_CHECK(host_store_on(c->host_store, port, c->size, srv, proc));
    /* The launcher's store through its host agent, which forwards on a few
     * connections of its own (tools/launcher/agent_proxy.c): the store
     * holds O(hosts) connections, not one or two per rank. */
    const char *agent = tdist__env_raw("TDIST_HOST_AGENT");
    if (agent && *agent && tdist__param_StoreViaAgent() && uses_launcher_store(o, c)) {
      char address[300];
      snprintf(address, sizeof(address), "%s:%d", host, port);
      if (tdist__store_connect_agent(agent, address, &so, root) == 0) return 0;
      TDIST_WARN(INIT, "%s: connecting to the store directly", tdist_last_error());
    }
    return tdist_store_connect(host, port, &so, root);
  }
  return tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                      "init_method '%s' is not env://, tcp://host:port, "
                      "file:///path or etcd://host:port[,host:port...][/prefix]",
                      c->method);
}

/* 0 when the store dies with rank 0 (a thread of it), else -1 (unknown or
 * independent: a given store, a file, etcd, a store process). */
static int store_host(const tdist_init_opts_t *o, const join_cfg_t *c, int hosted_thread) {
  if (o && (o->mask & TDIST_INIT_FIELD_STORE) && o->store) return -1;
  if (strncmp(c->method, "file://", 7) == 0 || strncmp(c->method, "etcd://", 7) == 0) return -1;
  return hosted_thread ? 0 : -1;
}

/* (caller) One world per process: the record (rdzv, under rdzv_mu) holds
 * it until tdist__rendezvous_cleanup. */
int tdist__rendezvous_join(const tdist_init_opts_t *o, tdist__rdzv_t *out) {
  int rc, thread_host = 0;
  join_cfg_t c = {0};
  tdist_store_server_t *srv = NULL;
  tdist__store_proc_t proc = {-1};
  tdist_store_t *root = NULL, *view = NULL;
  TDIST_CHECK(join_cfg(o, &c));
  int given = o && (o->mask & TDIST_INIT_FIELD_STORE) && o->store;
  pthread_mutex_lock(&rdzv_mu);
  if (rdzv.store && given) {
    /* Another world on the caller's store: nothing to host or count out. */
    pthread_mutex_unlock(&rdzv_mu);
    TDIST_CHECK(open_root(o, &c, &root, &srv, &proc));
    rc = tdist_store_prefix(root, RDZV_PREFIX, &view);
    if (rc == 0) rc = rendezvous(view, c.rank, c.size, c.timeout, out->job, sizeof(out->job));
    tdist_store_release(view);
    if (rc) {
      tdist_store_release(root);
      return rc;
    }
    out->store = root;
    out->rank = c.rank;
    out->size = c.size;
    out->timeout_ms = c.timeout;
    out->store_host = -1;
    out->recorded = 0;
    return 0;
  }
  if (rdzv.store) {
    rc = tdist__error(TDIST_ERR_INVALID_STATE, "tdist_init_process_group: this process "
                                               "already has a world group (destroy it first)");
    goto fail;
  }
  TDIST_CHECKGOTO(open_root(o, &c, &root, &srv, &proc), rc, fail);
  TDIST_CHECKGOTO(tdist_store_prefix(root, RDZV_PREFIX, &view), rc, fail);
  /* Whether the store dies with rank 0 (a thread of it), for everyone's
   * monitor (core/inflight.c names rank 0 when it stops answering); written
   * before rank 0 arrives, so every rank reads it once all arrived. */
  if (srv) TDIST_CHECKGOTO(tdist_store_set(view, "thread_host", "0", 1), rc, fail);
  /* Through the host agent when tdistrun started us on its own store (the
   * agent counts its ranks in with one request: rdzv_host.c); the store
   * hosted by tdistrun has no thread host. */
  int via = 0;
  if (uses_launcher_store(o, &c))
    TDIST_CHECKGOTO(via = tdist__rdzv_via_agent(tdist__env_raw("TDIST_HOST_AGENT"), c.rank, c.size,
                                                c.timeout, out->job, sizeof(out->job)),
                    rc, fail);
  if (!via)
    TDIST_CHECKGOTO(rendezvous(view, c.rank, c.size, c.timeout, out->job, sizeof(out->job)), rc,
                    fail);
  if (!via && !srv && c.rank != 0) {
    const char *k = "thread_host";
    TDIST_CHECKGOTO(tdist_store_check(view, &k, 1, &thread_host), rc, fail);
  }
  TDIST_INFO(INIT, "rank %d of %d joined on %s%s%s", c.rank, c.size, tdist_store_address(root),
             via ? " through the host agent" : "",
             root->root->agent ? " (its store calls go through the agent too)" : "");
  rdzv.server = srv;
  rdzv.proc = proc;
  rdzv.store = view;
  rdzv.rank = c.rank;
  rdzv.size = c.size;
  rdzv.timeout_ms = c.timeout;
  pthread_mutex_unlock(&rdzv_mu);
  out->store = root; /* out->job: rendezvous */
  out->rank = c.rank;
  out->size = c.size;
  out->timeout_ms = c.timeout;
  out->store_host = store_host(o, &c, srv || thread_host);
  out->recorded = 1;
  return 0;
fail:
  pthread_mutex_unlock(&rdzv_mu);
  tdist_store_release(view);
  tdist_store_release(root);
  tdist_store_server_stop(srv);
  {
    /* The store this rank started ended under it: say how, beside what
     * the failed call saw (a closed connection, a timeout). Half a second
     * at most, on this failure path only. */
    char why[96], prev[512];
    pid_t pid = proc.pid;
    if (tdist__store_proc_ended(&proc, why, sizeof(why), 500)) {
      snprintf(prev, sizeof(prev), "%s", tdist_last_error());
      rc = tdist__error(rc, "%s (the store process %d this rank started %s)", prev, (int)pid, why);
    }
  }
  tdist__store_proc_stop(&proc);
  return rc;
}

/* Ranks 0..size-1 in the store's dead set ("tdist/dead/<rank>"). */
static int count_dead(tdist_store_t *v, int size) {
  tdist_store_t *root = NULL;
  int dead = 0;
  if (tdist__store_root_view(v, &root) != 0) return 0;
  for (int r = 0; r < size; r++) {
    char key[48];
    snprintf(key, sizeof(key), "tdist/dead/%d", r);
    const char *keys[1] = {key};
    int exists = 0;
    if (tdist_store_check(root, keys, 1, &exists) == 0 && exists) dead++;
  }
  tdist_store_release(root);
  return dead;
}

int tdist__rendezvous_cleanup(void) {
  pthread_mutex_lock(&rdzv_mu);
  tdist_store_server_t *srv = rdzv.server;
  tdist__store_proc_t proc = rdzv.proc;
  tdist_store_t *v = rdzv.store;
  int size = rdzv.size;
  int64_t timeout = rdzv.timeout_ms;
  memset(&rdzv, 0, sizeof(rdzv));
  pthread_mutex_unlock(&rdzv_mu);
  if (!v) return 0;
  int64_t left = 0;
  /* The count is for a rank that hosts the store: none hosts etcd, where n
   * adds to one key would cost O(n^2) txns (rendezvous()). */
  int by_keys = tdist__store_counts_prefixes(v);
  int rc = by_keys ? 0 : tdist_store_add(v, "left", 1, &left);
  if (rc == 0 && !by_keys && left % size == 0) {
    rc = tdist_store_set(v, "all_left", "", 0);
    /* The host may have seen the count reach the size first and stopped
     * serving: every rank left, which is all this write says. */
    if (rc == TDIST_ERR_CLOSED && !srv && proc.pid <= 0) rc = 0;
  }
  if ((srv || proc.pid > 0) && rc == 0) {
    /* Keep serving until every rank is done with the store; a rank the
     * store declared dead (store/liveness.h) will never say so. */
    const char *k = "all_left";
    int64_t deadline = tdist__now_ms() + timeout;
    for (;;) {
      int64_t wait = deadline - tdist__now_ms();
      rc = tdist_store_wait(v, &k, 1, wait < 200 ? (wait > 0 ? wait : 1) : 200);
      if (rc != TDIST_ERR_TIMEOUT || tdist__now_ms() >= deadline) break;
      if (tdist_store_add(v, "left", 0, &left) == 0 && left + count_dead(v, size) >= size) {
        rc = 0;
        break;
      }
    }
    if (rc)
      TDIST_WARN(INIT, "stopping the hosted store before every rank left: %s", tdist_last_error());
  }
  tdist_store_release(v);
  tdist_store_server_stop(srv);
  tdist__store_proc_stop(&proc);
  return rc;
}
