/*
 * monitor.h - cross-rank failure records and heartbeats (internal;
 * beside the group layer, which it reports to through handlers).
 *
 * When a group aborts on one rank (an op timed out, tdist_group_abort, a
 * backend failure), the other ranks should not sit in their copy of the
 * collective until their own timeout. A monitor is a thread with its own
 * store connection (same server, same token) that
 *   - publishes this process's aborts as records "tdist/aborts/<n>" =
 *     "<group uid hex> <world rank> <status> <reason>" (n from an atomic
 *     counter);
 *   - blocks on the next record key, so a record written by any rank (or a
 *     death record the store server writes: "dead <rank> <reason>") wakes it
 *     at once, and hands it to the on_record handler;
 *   - writes a heartbeat "tdist/hb/<world rank>" every
 *     TDIST_HEARTBEAT_INTERVAL_MS whose value the snapshot handler gives (each
 *     group's next sequence number), and "bye" when it stops. The writes
 *     come from a heartbeat thread of its own (a third connection) that
 *     calls no handler: the snapshot waits for the progress thread, the
 *     heartbeat never does (it sends the latest value the monitor thread
 *     took), so a long data-path step cannot delay it;
 *   - answers timeout diagnoses: which ranks of a group never submitted an op,
 *     from their heartbeats, handed to the on_verdict handler;
 *   - watches the store itself: when it has answered nothing for
 *     TDIST_HEARTBEAT_TIMEOUT_MS (a stopped or hung host: its connection
 *     stays open, so nothing else notices), on_store_lost is called once.
 *     Its calls are bounded (STORE_CALL_MS), and a broken connection is
 *     reopened, so a store that comes back is used again.
 * Behind a host agent (TDIST_HOST_AGENT names its abstract unix socket;
 * tdistrun's, tools/launcher/agent.c) the heartbeats go to the agent ("hello
 * <rank> <next>", "hb <value>", "bye"), which beats once for its host, and
 * the records come from it ("rec <n> <record>"; "ok" after each host beat
 * that reached the store is what "the store answers" means then): no
 * heartbeat connection, no wait on the store per rank. Without an agent, or
 * when it cannot be reached at start, everything is as above.
 * It knows nothing of groups: the handlers (the group layer's) do. Handlers
 * run on the monitor thread with no monitor lock held.
 *
 * Threads: publish and diagnose from any thread (never block; the progress
 * thread calls them); start and stop from a caller thread.
 */
#ifndef TDIST_CORE_MONITOR_H
#define TDIST_CORE_MONITOR_H

#include <stddef.h>
#include <stdint.h>

#include "tdist/tdist.h"

typedef struct tdist__monitor tdist__monitor_t;

/* A record read from the store. */
typedef struct tdist__mon_record {
  int dead;     /* a death record: every group containing `rank` fails */
  uint64_t uid; /* an abort record: the group with this uid aborts */
  int status;   /* ... with this status (ABORTED, MISMATCH...) */
  int rank;     /* world rank it is about (dead) or from (abort) */
  const char *reason;
} tdist__mon_record_t;

typedef struct tdist__mon_handlers {
  void *arg;
  /* A record about another rank. */
  void (*on_record)(void *arg, const tdist__mon_record_t *r);
  /* The heartbeat's value ("<uid hex>:<next_seq> ..."); returns its length. */
  size_t (*snapshot)(void *arg, char *buf, size_t cap);
  /* Group uid's members for a diagnosis: this rank's group rank, the size and
   * world ranks (at most cap), the name; 0 if no such group. */
  int (*members)(void *arg, uint64_t uid, int *rank, int *size, int *ranks, int cap, char *name,
                 size_t name_len);
  /* A diagnosis of op `seq` of group uid: text (NULL if none). */
  void (*on_verdict)(void *arg, uint64_t uid, uint64_t seq, const char *text);
  /* The store has answered nothing for `silent_ms` (more than the heartbeat
   * timeout): called once. */
  void (*on_store_lost)(void *arg, int64_t silent_ms, const char *address);
} tdist__mon_handlers_t;

/* Caller thread: a monitor on a second connection to `store`'s server.
 * `agent`: 1 when the host agent named by TDIST_HOST_AGENT (if set) stands
 * for this store and its world ranks (the process's world on its launcher's
 * store), 0 when it does not (a further world on a store the caller gave:
 * tdist.torch's subgroups, whose ranks the agent does not know): then the
 * heartbeats go to the store itself. */
int tdist__monitor_start(tdist_store_t *store, int world_rank, int agent,
                         const tdist__mon_handlers_t *h, tdist__monitor_t **out);
/* Caller thread: publish what is queued, say "bye", stop and free. */
void tdist__monitor_stop(tdist__monitor_t *m);

/* Any thread, never blocks: queue an abort record for group uid. */
void tdist__monitor_publish(tdist__monitor_t *m, uint64_t uid, int status, const char *reason);
/* Any thread, never blocks: queue a diagnosis of op seq of group uid, whose
 * timeout was timeout_ms (it bounds how long the diagnosis may take: see
 * monitor.c diagnose). peer: the group rank a send or receive waits for,
 * the only member then looked at; -1 for a collective (every member). 1 if
 * queued. */
int tdist__monitor_diagnose(tdist__monitor_t *m, uint64_t uid, uint64_t seq, uint64_t coll,
                            int peer, int64_t timeout_ms);

#endif
