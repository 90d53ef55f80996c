/*
 * monitor_impl.h - the monitor object shared by monitor.c (the monitor
 * thread, start and stop, timeout diagnosis) and heartbeat.c (the heartbeat
 * thread and the rank's side of the host agent's protocol); internal to
 * this folder, see monitor.h for the interface.
 *
 * Ownership: the queues, the value (`snap`) and the stop flags are guarded
 * by m->mu, which is never held across a store call or a handler; `conn`,
 * `next`, `last_snap_ms`, `last_ok_ms` and the agent's read buffer are the
 * monitor thread's, `hb_conn` the heartbeat thread's (after start).
 */
#ifndef TDIST_CORE_GROUP_MONITOR_IMPL_H
#define TDIST_CORE_GROUP_MONITOR_IMPL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "core/group/monitor.h"
#include "util/param.h"

TDIST_PARAM(MonitorIntervalMs, "TDIST_MONITOR_INTERVAL_MS", 200)
TDIST_PARAM(HeartbeatIntervalMs, "TDIST_HEARTBEAT_INTERVAL_MS", 1000)
TDIST_PARAM(HeartbeatTimeoutMs, "TDIST_HEARTBEAT_TIMEOUT_MS", 5000)

/* Bound of one store call that does not wait (a set, an add): a live store
 * answers in well under a millisecond; a call that takes longer closes the
 * connection, which the next round reopens. */
#define STORE_CALL_MS 1000

#define QUEUE_MAX 32

struct tdist__monitor {
  pthread_mutex_t mu;
  pthread_cond_t cv; /* wakes the heartbeat thread: a fresh value, or stop */
  int stop;
  int hb_stop;
  char snap[4096]; /* the heartbeat's value, refreshed by the monitor thread */
  size_t snap_len;
  int snap_fresh; /* refreshed since the last heartbeat */
  int nq;
  char queue[QUEUE_MAX][320];
  int ndiag; /* timeout diagnoses asked for by the progress thread */
  struct diag_req {
    uint64_t uid, seq, coll; /* coll: tdist_work_t.coll */
    int64_t timeout_ms;
    int peer; /* a send's or receive's peer (group rank), or -1 */
  } diag[QUEUE_MAX];

  /* monitor thread (and start/stop) */
  pthread_t thread;
  tdist_store_t *conn; /* NULL until first use when base is set */
  tdist_store_t *base; /* store through a host agent: conn is opened from it on
                          first use (a publish, a diagnosis), or NULL */
  tdist__mon_handlers_t h;
  int world_rank;
  int64_t next; /* next record number to wait for */
  int64_t last_snap_ms;
  int64_t last_ok_ms; /* the store last answered */
  int store_lost;     /* on_store_lost was called */

  /* heartbeat thread (and start/stop) */
  pthread_t hb_thread;
  tdist_store_t *hb_conn; /* NULL with a host agent */

  /* The host agent (TDIST_HOST_AGENT), -1 without: the heartbeat thread
   * writes to it, the monitor thread reads the records it relays (a socket
   * may be written and read by two threads at once). */
  int agent_fd;
  char agent_name[108];
  char abuf[8192]; /* monitor thread: a partial line from the agent */
  size_t alen;
  int agent_gone; /* monitor thread: it closed its end */
};

/* ---- monitor.c ---- */

/* (monitor) Parse one abort or death record (`len` bytes, not
 * NUL-terminated) and hand it to on_record; records about this rank and
 * malformed ones are ignored. */
void tdist__mon_apply_record(tdist__monitor_t *m, const char *rec, size_t len);

/* ---- heartbeat.c ---- */

/* (caller in start) Connect to the host agent named by TDIST_HOST_AGENT
 * and say hello (this rank, records from m->next on); sets m->agent_fd and
 * m->agent_name, or leaves agent_fd at -1 when there is none (then the
 * rank beats to the store itself). */
void tdist__mon_agent_open(tdist__monitor_t *m);

/* (monitor) Wait up to `ms` for what the agent relays: records (each
 * handed to `apply`, which the monitor thread passes: monitor.c's
 * tdist__mon_apply_record, so this file calls nothing of monitor.c) and
 * "ok" (the store answered: m->last_ok_ms). */
typedef void (*tdist__mon_record_fn)(tdist__monitor_t *m, const char *rec, size_t len);
void tdist__mon_agent_poll(tdist__monitor_t *m, int64_t ms, tdist__mon_record_fn apply);

/* (heartbeat, or the caller in start/its failure) One heartbeat: the value
 * the monitor thread left, or "bye" (bye != 0); to the agent if there is
 * one, else on hb_conn. */
void tdist__mon_heartbeat(tdist__monitor_t *m, int bye);

/* The heartbeat thread's body (pthread_create argument: m). */
void *tdist__mon_heartbeat_main(void *arg);

#endif
