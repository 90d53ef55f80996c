/*
 * conn.h - the CPU backend's connections (sub-layer above segment): the
 * process context's setup and teardown (conn.c), connections on first use
 * (lazy.c, lazy_hs.c) and leaving without losing what is owed (leave.c).
 */
#ifndef TDIST_CPU_CONN_CONN_H
#define TDIST_CPU_CONN_CONN_H

#include "cpu/base/base.h"

/* ---- conn.c: setup and teardown ------------------------------------------- */
/* Caller thread: listen, trade addresses over the store, connect the full
 * mesh, register the polls. p is the world group's. */
int tdist__cpu_ctx_create(const tdist_backend_params_t *p, const cpu_tp_events_t *ev,
                          const cpu_hooks_t *hooks, cpu_ctx_t **out);
/* Caller thread: drop a group's reference; the last one closes everything. */
void tdist__cpu_ctx_release(cpu_ctx_t *ctx);
/* (progress) Free ctx once no group holds it and its last handle closed. */
void tdist__cpu_ctx_maybe_free(cpu_ctx_t *ctx);
/* (caller, setup) A connection object for world rank peer on fd (-1: a
 * placeholder); with_rx: its receive buffer now (else at connect). */
cpu_conn_t *tdist__cpu_conn_new(cpu_ctx_t *ctx, int peer, int fd, const char *addr, int with_rx);
/* (any thread) Connect to "host:port", retrying until deadline_ns. */
int tdist__cpu_connect_to(const char *addr, int64_t deadline_ns, int *fd_out);
void tdist__cpu_tune_socket(int fd); /* TCP_NODELAY and TDIST_CPU_SOCKBUF */

/* ---- lazy.c: connections made on first use (TDIST_CPU_CONNECT) --------------- */
typedef struct cpu_lazy cpu_lazy_t;
/* 1: connect on first use, 0: the full mesh, for a world of `size` ranks
 * (TDIST_CPU_CONNECT: auto (the default: lazy from TDIST_CPU_LAZY_FROM = 64
 * ranks), eager or lazy). */
int tdist__cpu_lazy_mode(int size);
/* (caller, setup) Publish `me` as "cpu/addr/<rank>" and give every peer a
 * placeholder connection; lfd (listening) is the lazy state's on success. */
int tdist__cpu_lazy_create(cpu_ctx_t *ctx, const tdist_backend_params_t *p, int lfd,
                           const char *me);
void tdist__cpu_lazy_start(cpu_ctx_t *ctx);  /* (progress, start_all) the async handle */
int tdist__cpu_lazy_threads(cpu_ctx_t *ctx); /* (caller) start the dialer and acceptor */
/* (engine lock) An op needs c: connect it unless it is up or on its way.
 * Only queues (never blocks). */
void tdist__cpu_conn_want(cpu_conn_t *c);
void tdist__cpu_lazy_stop(cpu_ctx_t *ctx); /* (progress, last release) no more handoffs */
/* (caller, before the last release) A connection still being made owes
 * what is queued on it (an abort's ERR, which names the cause for the
 * peer): wait up to max_ms for such connections to come up, so the
 * linger delivers what they owe as the mesh's connections deliver theirs. */
void tdist__cpu_lazy_owing_wait(cpu_ctx_t *ctx, int64_t max_ms);
/* (after stop) Join the threads (caller) or detach them (progress thread);
 * the state goes with the last of them. */
void tdist__cpu_lazy_end(cpu_lazy_t *lz, int join);
/* Connections made since the process started, mesh and lazy (tests). */
extern _Atomic uint64_t tdist__cpu_connects;

/* ---- leave.c: leaving without losing what is owed ---------------------------- */
/* A connection being left: its fd, and what its queue still owed (the
 * caller's now: cpu_msg_t on plain heap memory, goodbye last); with a ring,
 * the owed bytes go there (the peer's segment, unmapped when done). */
typedef struct cpu_leaving {
  int fd;
  tdist__list_t owed;
  struct tdist__cpu_ring *ring;
  void *map;
  size_t map_bytes;
} cpu_leaving_t;
void tdist__cpu_conn_close(cpu_conn_t *c); /* orderly: bye, shutdown, close */
/* (progress) c leaves the loop. With `owed`, a live connection's queue
 * moves there (goodbye appended) and its fd is returned for the caller to
 * linger on (tdist__cpu_linger); without, the goodbye is written only if
 * nothing is queued, writes are shut and the fd is returned to be closed.
 * -1 when the connection had failed (its fd is closed here). */
int tdist__cpu_conn_detach(cpu_conn_t *c, cpu_leaving_t *l);
/* (caller) Write what is owed, shut writes, read until each peer's EOF;
 * at most TDIST_CPU_LINGER_MS over all of them; closes every fd. */
void tdist__cpu_linger(cpu_leaving_t *ls, int n);

#endif
