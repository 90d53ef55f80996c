/*
 * store_bench.h - shared pieces of the store benchmark (bench only).
 *
 * store_bench.c holds main, the thread-per-client mode and the rendezvous;
 * evloop.c holds the event-loop client that produces the default ops/s table.
 */
#ifndef TDIST_BENCH_STORE_BENCH_H
#define TDIST_BENCH_STORE_BENCH_H

#include <stdint.h>

typedef struct sb_cfg {
  const char *host;
  int port;
  double seconds; /* measured interval per (op, clients) */
  double warmup;  /* run but not counted, before each measured interval */
  int vsize;      /* value bytes for set/get (redis-benchmark -d) */
  int redis;      /* 1: speak RESP to a Redis server instead of the tdist protocol */
} sb_cfg_t;

/* Keys: like redis-benchmark -r 1000 (12-digit zero-padded random index). */
#define SB_NKEYS 1000

double sb_now(void);

/* Event-loop mode: one thread, `clients` non-blocking connections, one
 * request outstanding on each. Runs set, get, add in turn and prints
 * "<op> <clients> <ops/s> ops/s" per op. Returns 0, or -1 after printing why
 * (connect failure, a wrong or malformed reply, a stalled server). */
int sb_evloop_run(const sb_cfg_t *cfg, int clients);
/* Requests answered in all sb_evloop_run calls so far, warm-ups included (to
 * divide a server's CPU time by). */
uint64_t sb_evloop_total(void);

#endif
