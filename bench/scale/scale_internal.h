/*
 * scale_internal.h - what the files of tdist_bench_scale share (see
 * scale_bench.c for what the harness does, docs/scale.md for its results).
 *
 *   scale_bench.c   the parent: options, commands (phases), measurement, output
 *   scale_client.c  a client process (a host): its ranks' connections and
 *                   phases (rendezvous, address exchange, monitor loop),
 *                   the heartbeat thread
 *   scale_hosts.c   --hosts-agg: the host agent's beat and record watch
 *   scale_rdzv.c    --hosts-rdzv: the rendezvous through a host agent
 *   scale_server.c  the store server process, or --etcd's etcd member
 *
 * Not a library: one program split by feature; globals are per process
 * (g_cfg set by the parent before fork, g_shm shared by all processes,
 * g_p a client process's own).
 */
#ifndef TDIST_BENCH_SCALE_INTERNAL_H
#define TDIST_BENCH_SCALE_INTERNAL_H

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "tdist/store.h"

enum { PH_CONNECT = 1, PH_RDZV, PH_GROUP, PH_MON, PH_STOP };

typedef struct {
  double t_rdzv, t_group, t_dead; /* when this rank finished a phase / read a death */
  double t_beat;                  /* its last heartbeat's reply */
  atomic_int ndead;               /* death records its monitor loop has read */
} rank_slot_t;

/* Shared (MAP_SHARED) between the parent, the server and the client processes. */
typedef struct {
  atomic_int port, server_up, server_stop;
  atomic_int phase, silent; /* the parent's command; the rank told to go silent, or -1 */
  atomic_int connected, rdzv_done, group_done, mon_ready, failed;
  /* connections reopened after a call found them gone (not an error) */
  atomic_int mon_reconnects, hb_reconnects;
  atomic_llong ops, keys, conns;
  atomic_int err_taken;
  char err[512];
  rank_slot_t r[];
} shm_t;

typedef struct {
  int n, procs, addrs, conns, group;
  int etcd;      /* --etcd: the ranks use an etcd the harness starts (etcd_proc) */
  int agg;       /* --hosts-agg: one host agent per process (hosts_agg_*) */
  int lazy_addr; /* --lazy-addr: the exchange of lazy connections (rank_group_lazy) */
  int hrdzv;     /* --hosts-rdzv: the rendezvous through one agent per process (scale_rdzv.c) */
  double steady_s, phase_timeout_s;
  int64_t hb_ms, mon_ms;
} cfg_t;

/* The options (parent, set before the forks: read-only in the children). */
extern cfg_t g_cfg;
/* MAP_SHARED between the parent, the server and the client processes. */
extern shm_t *g_shm;

typedef struct {
  int lo, hi;                              /* this process's ranks */
  tdist_store_t *agent_beat, *agent_watch; /* --hosts-agg: the agent's two connections */
  tdist_store_t *agent_rdzv;               /* --hosts-rdzv: the agent's rendezvous connection */
  char agent_name[64];                     /* --hosts-rdzv: its abstract socket's name */
  int agent_lfd;                           /* --hosts-rdzv: its listening socket */
  struct trun_proxy *proxy;                /* --hosts-rdzv: its store proxy */
  tdist_store_t **wroot;                   /* --hosts-rdzv: each rank's handle through the agent */
  tdist_store_t **s; /* conns per rank: [0] rendezvous/world, [1] monitor, [2] heartbeat */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int phase;              /* relayed from the shared memory by the main thread */
  atomic_int first_beats; /* ranks past their first heartbeat (rank_monitor) */
} proc_t;

/* A client process's own state (scale_client.c). */
extern proc_t g_p;

static inline double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static inline void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (time_t)s) * 1e9)};
  nanosleep(&ts, NULL);
}

static inline int64_t env_ms(const char *name, int64_t def) {
  const char *v = getenv(name);
  return v && *v ? strtoll(v, NULL, 10) : def;
}

/* ---- scale_client.c ---- */

/* (any client thread) Record the first error and count the failure. */
void fail_msg(int rank, const char *what);
/* The ranks [lo,hi) of client process idx (the parent uses it too). */
void proc_ranks(int idx, int *lo, int *hi);
/* Connection `which` (0 rendezvous/world, 1 monitor, 2 heartbeat) of a rank. */
tdist_store_t *conn_of(int rank, int which);
/* (rank, heartbeat or agent thread) Block until the phase reaches ph; 0, or
 * -1 when told to stop first. */
int wait_phase(int ph);
/* (any client thread) The phase relayed by the main thread. */
int phase_now(void);
/* The peers rank r of n reads with --lazy-addr (into out, at most 32). */
int lazy_peers(int r, int n, int *out);
/* (client process main thread) The whole client process; its exit code. */
int client_proc(int idx);

/* ---- scale_hosts.c (--hosts-agg) ---- */

/* (rank thread) A rank behind its agent: reads the record count once. */
void hosts_agg_rank(int r);
/* (agent beat thread) arg: the process index. */
void *hosts_agg_beat(void *arg);
/* (agent relay thread) arg unused. */
void *hosts_agg_relay(void *arg);

/* ---- scale_rdzv.c (--hosts-rdzv) ---- */

/* (client main thread, before the rank threads) The agent's socket; 0 or -1. */
int hosts_rdzv_listen(int idx);
/* Threads per process that run its ranks' side of the rendezvous. */
#define RDZV_DRIVERS 32
/* (client main thread) Start them (th: RDZV_DRIVERS); how many started. */
int hosts_rdzv_start_drivers(pthread_t *th, const pthread_attr_t *at);
/* (agent thread) arg: the process index. */
void *hosts_rdzv_agent(void *arg);

/* ---- scale_server.c ---- */

/* (server process main thread) The store server; its exit code. */
int server_proc(void);
/* A free TCP port on 127.0.0.1, or -1. */
int free_port(void);
/* (--etcd, the server process) exec etcd; returns only on failure. */
int etcd_proc(const char *dir, int port, int peer_port);

#endif
