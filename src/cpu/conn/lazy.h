/*
 * lazy.h - the state of lazy connections (TDIST_CPU_CONNECT), shared by
 * lazy.c (the placeholders, the progress thread's side, creation and the
 * end: caller and progress thread) and lazy_hs.c (the dialer, acceptor and
 * handshake threads); internal to these two files.
 *
 * Ownership: in cpu_lazy_t, ctx, refs, st, the dial queue, done,
 * async_on and busy are guarded by mu (stop is atomic, looked at without
 * it); the fields set at creation (rank, size, lfd, uid, timeout_ms,
 * store) are read without it; a socket in a handshake belongs to its
 * thread until hand_over (lazy_hs.c) gives it, in a lazy_done_t, to the
 * progress thread.
 */
#ifndef TDIST_CPU_LAZY_H
#define TDIST_CPU_LAZY_H

#include "cpu/base/base.h"

enum { ST_NONE, ST_DIALING, ST_CLAIMED, ST_WAITING, ST_FAILED }; /* per peer, under mu */
#define STOP_SLICE_MS 200 /* how often a blocked thread looks at `stop` */
/* A handshake (hello, verdict, the pair's setup) that takes longer is
 * given up: a live peer's acceptor answers in milliseconds, and the one
 * dialer must not wait a whole group timeout behind a stopped process. */
#define HANDSHAKE_MS 10000

/* A finished connection (or a failure) on its way to the progress thread. */
typedef struct lazy_done {
  struct lazy_done *next;
  int peer, fd, ok;
  int32_t pid;
  int cma_tx;
  struct tdist__cpu_ring *tx_ring, *rx_ring;
  void *tx_map;
  size_t tx_map_bytes;
  tdist__cpu_shm_seg_t rx_seg;
  char addr[80];
  char why[200];
} lazy_done_t;

struct cpu_lazy {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  cpu_ctx_t *ctx; /* NULL once stopped (no handoff after that) */
  int refs;       /* ctx + the running threads + the async handle; under mu */
  _Atomic int stop;
  int rank, size, lfd;
  uint64_t uid;
  int64_t timeout_ms;
  tdist_store_t *store;         /* our own view: the threads may outlive the group's */
  uint8_t *st;                  /* per peer: ST_* */
  int *dialq, dq_head, dq_tail; /* a ring of wanted peers (each queued once) */
  lazy_done_t *done;            /* finished, for on_async (LIFO; order does not matter) */
  uv_async_t async;
  int async_on;
  pthread_t dialer, acceptor;
  int threads;
  int *busy, nbusy; /* sockets in a handshake (-1: a free slot); under mu:
                       stop shuts them down so a blocked handshake returns
                       at once, and one is closed only after it is cleared
                       here (lz_close), so stop never shuts a reused fd */
};

/* ---- lazy.c ---- */

/* (any thread) Drop a reference to lz (refs, under mu); the last one frees
 * it, with the finished handoffs nobody took. */
void tdist__cpu_lz_unref(cpu_lazy_t *lz);

/* (any thread) Free a finished connection that was not attached: its
 * socket, its mapping of the peer's ring, its own segment. */
void tdist__cpu_lz_done_free(lazy_done_t *d);

/* ---- lazy_hs.c ---- */

/* The dialer's and the acceptor's bodies (pthread_create argument: lz,
 * holding a reference each, which they drop when they return). */
void *tdist__cpu_lz_dialer_main(void *arg);
void *tdist__cpu_lz_acceptor_main(void *arg);

#endif
