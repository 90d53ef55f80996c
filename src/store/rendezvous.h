/*
 * rendezvous.h - joining a world over the store, and leaving it (internal;
 * the store layer: it calls only the store and util).
 */
#ifndef TDIST_STORE_RENDEZVOUS_H
#define TDIST_STORE_RENDEZVOUS_H

#include <stdint.h>

#include "tdist/group.h"

typedef struct tdist__rdzv {
  tdist_store_t *store; /* the root store (a reference owned by the caller) */
  int rank, size;
  int64_t timeout_ms; /* the one timeout for the store and the world group */
  int store_host;     /* world rank that hosts the store server (0), or -1 (a
                         launcher, tdist-store, a file, the caller's store) */
  char job[64];       /* the job's id: TDIST_JOB_ID, else one agreed on the store
                         for this rendezvous round (flight-recorder dumps carry it) */
  int recorded;       /* 1: this join is the process's recorded world (end it with
                         tdist__rendezvous_cleanup); 0: another world on a store the
                         caller gave (nothing hosted, nothing to clean up) */
} tdist__rdzv_t;

/*
 * tdist__rendezvous_join - everything tdist_init_process_group does before
 * creating the group (caller thread): resolve rank, size, timeout and store
 * from opts and the environment, start the server on rank 0 when hosting,
 * claim the rank (a duplicate fails naming RANK), wait until all ranks
 * arrived. Records the hosted server for tdist__rendezvous_cleanup.
 * One recorded world per process; a process that has one may join more
 * worlds on stores it gives in opts (torch subgroups, tdist.torch): those
 * are not recorded (out->recorded = 0).
 */
int tdist__rendezvous_join(const tdist_init_opts_t *opts, tdist__rdzv_t *out);

/*
 * tdist__rendezvous_round - the waiting part of joining, alone (caller
 * thread; bench/scale runs it for its simulated ranks): on `view` (the
 * store under "tdist/rdzv/"), claim `rank` (a duplicate fails naming
 * RANK), count in (one add; one key per rank where the store counts
 * prefixes, store_impl.h), agree on the job id (written to job, jl bytes),
 * wait up to timeout_ms for all `size` ranks of the round.
 * @return 0; TDIST_ERR_INVALID_ARGUMENT (duplicate rank); TDIST_ERR_TIMEOUT
 *         naming how many ranks arrived; a store error.
 */
int tdist__rendezvous_round(tdist_store_t *view, int rank, int size, int64_t timeout_ms, char *job,
                            size_t jl);

/*
 * tdist__rendezvous_cleanup - call once the world group made by
 * tdist_init_process_group is destroyed (caller thread, after the backend
 * released its store use). Every rank counts out on the store (not on
 * etcd: no rank hosts it, and a shared counter contends); the rank that
 * hosts the server keeps it running until all ranks counted out (bounded by
 * the init timeout), then stops it. Idempotent; 0 or a store error (the
 * cleanup still completes).
 */
int tdist__rendezvous_cleanup(void);

/*
 * tdist__rdzv_wait_go - wait up to timeout_ms for "go/<round>" on the view
 * "tdist/rdzv/", checking every 250 ms (backing off to 4 s) for a launcher's "exit/<round>"
 * record (a rank that exited before joining: the round can never
 * complete). Caller's thread.
 * @return 0 (the round completed); TDIST_ERR_TIMEOUT (no error set);
 *         TDIST_ERR_REMOTE_FAILED with the record ("rank 1 exited with code
 *         3") in why (no error set); a store error (set).
 */
int tdist__rdzv_wait_go(tdist_store_t *v, int64_t round, int64_t timeout_ms, char *why, size_t wl);
/* Append "; ranks 1,3 never arrived" to buf (NUL-terminated, bl bytes) when
 * the ranks that arrived in `round` are known and `arrived` of them came;
 * else leave it. For messages only: errors are ignored. */
void tdist__rdzv_missing(tdist_store_t *v, int64_t round, int size, int64_t arrived, char *buf,
                         size_t bl);

/* rdzv_env.c: this rank and the world's size from opts and the environment
 * (a missing or contradictory variable is TDIST_ERR_INVALID_ARGUMENT naming
 * it), and the store's host:port from a tcp:// method or the environment. */
int tdist__rdzv_rank_size(const tdist_init_opts_t *opts, int *rank, int *size);
int tdist__rdzv_store_addr(const char *method, char *host, size_t hl, int *port);

/* The job's id for rendezvous round `round` on the view "tdist/rdzv/"
 * (rendezvous.c): TDIST_JOB_ID, else the first proposal stored. */
int tdist__rdzv_agree_job(tdist_store_t *view, int64_t round, char *job, size_t jl);

/*
 * tdist__rdzv_via_agent - the rank's side of the rendezvous through its host
 * agent (rdzv_host.c): send "rdzv <rank> <size> <timeout_ms> <me>" on the
 * agent's socket `agent` and wait, up to timeout_ms plus a grace, for
 * "go <job>" or "err <code> <message>". Returns 1 when the world is complete
 * (job set), 0 when the agent cannot be reached (the caller does the
 * rendezvous itself), or a negative TDIST_ERR_* with the error set.
 * Thread: the caller's.
 */
int tdist__rdzv_via_agent(const char *agent, int rank, int size, int64_t timeout_ms, char *job,
                          size_t jl);
/* Its two halves, for a caller that stands for many ranks (bench/scale):
 * ask sends the line (1 and *fd set, 0 unreachable, or an error); answer
 * waits for the reply on fd and closes it (1, or an error). */
int tdist__rdzv_agent_ask(const char *agent, int rank, int size, int64_t timeout_ms, int *fd);
int tdist__rdzv_agent_answer(int fd, const char *agent, int64_t timeout_ms, char *job, size_t jl);

#endif
