/*
 * agent_impl.h - the host agent's state (agent.c), shared with its
 * rendezvous part (agent_rdzv.c). Internal to tdistrun.
 *
 * Ownership: the loop thread alone changes the rank table and the
 * rendezvous fields; `mu` guards the table against the relay thread's
 * sends. A rendezvous batch's thread owns the descriptors handed to it.
 */
#ifndef TDIST_TRUN_AGENT_IMPL_H
#define TDIST_TRUN_AGENT_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "tdist/tdist.h"
#include "tdistrun.h"

#define LINE_MAX_ 8192
#define BATCH 256

/* A_RDZV: a connection that asked for the rendezvous ("rdzv ..."),
 * waiting for its host's batch (agent_rdzv.c); not a monitor. A_PROXY: one
 * that said "store", handed to the store proxy (agent_proxy.c). */
enum { A_HELLO = 0, A_ALIVE, A_LEFT, A_DEAD, A_DONE, A_RDZV, A_PROXY };

typedef struct arank {
  int fd;          /* -1 once closed */
  int rank;        /* world rank, from hello */
  int state;       /* A_*; A_DONE: reported to the store, forgotten */
  int64_t next;    /* first record its monitor wants; A_RDZV: its timeout (ms) */
  int64_t last_ms; /* its last "hb" */
  char *val;       /* its last heartbeat value */
  char why[160];   /* A_DEAD: why; A_RDZV: who it is ("host:pid") */
  char in[LINE_MAX_];
  size_t inlen;
} arank_t;

struct trun_agent {
  int host;
  char name[80];
  int lfd, wake[2];
  int64_t interval_ms, timeout_ms;
  tdist_store_t *beat, *watch; /* the loop's and the relay's connections */
  char addr[256];              /* the store, for reopen */
  int port;
  tdist_store_opts_t so;
  pthread_t loop, relay;
  pthread_mutex_t mu;
  pthread_cond_t cv; /* (mu) a rank became alive, or stop: the relay waits on it */
  arank_t *r;        /* table, guarded by mu (changed by the loop thread only) */
  int n, cap;
  int urgent; /* loop: beat now */
  /* The rendezvous through the agent (agent_rdzv.c; loop thread only). */
  int first, nlocal, world; /* its ranks: first .. first + nlocal - 1 of world */
  int pending;              /* A_RDZV entries not yet in a batch */
  int counted;              /* local ranks sent in batches this round */
  int64_t last_arrival_ms;  /* of the newest pending one */
  char **seen;              /* [nlocal]: who claimed each local rank this round */
  struct trun_proxy *proxy; /* the ranks' store connections (agent_proxy.c), or NULL */
  atomic_int stop;
  atomic_int refs; /* trun_agent_stop and the relay: the last frees (agent.c) */
};

int64_t trun_now_ms(void);
/* (loop or relay, holding mu) One line to a rank; never blocks. */
void trun_agent_tell(arank_t *r, const char *line, size_t len);

/* ---- agent_rdzv.c (loop thread) ---- */
/* A "rdzv <rank> <size> <timeout_ms> <me>" line on entry r (holding mu). */
void trun_rdzv_line(trun_agent_t *a, arank_t *r, const char *args);
/* Entry r (A_RDZV) closed before its batch: withdrawn (holding mu). */
void trun_rdzv_gone(trun_agent_t *a, arank_t *r);
/* After each poll round: hand the pending ranks to a batch when all local
 * ranks are in or none came for a while; the next poll's wait bound (ms). */
int64_t trun_rdzv_tick(trun_agent_t *a, int64_t wait_ms);
void trun_rdzv_free(trun_agent_t *a);

#endif
