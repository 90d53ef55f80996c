/*
 * group.h - process groups and the runtime context (internal;
 * above trace, work, progress and util; the monitor reports to it through
 * handlers it registers).
 *
 * The context (tdist__ctx_t, "context" as UCC calls it) is what every group
 * of one world shares: a reference on the progress thread, the root store,
 * the monitor, and, for a world made by tdist_init_process_group, the
 * rendezvous (the hosted store server). Every group holds one reference;
 * the last release tears it down, in order.
 *
 * Fields marked (caller) are written once at creation and read by anyone;
 * (progress) are owned by the progress thread; (atomic) by anyone.
 */
#ifndef TDIST_CORE_GROUP_H
#define TDIST_CORE_GROUP_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "tdist/backend.h"
#include "core/group/monitor.h"
#include "core/progress/progress.h"
#include "core/trace/trace.h"
#include "core/work/work.h"

/* tdist_group_t.abort_cb_state. A callback is taken (REGISTERED -> TAKEN)
 * by the one thread that runs it; destroy closes the slot (-> CLOSED), so
 * one not taken by then never runs. */
enum {
  TDIST__ABORT_CB_NONE = 0,
  TDIST__ABORT_CB_REGISTERED = 1,
  TDIST__ABORT_CB_TAKEN = 2,
  TDIST__ABORT_CB_CLOSED = 3,
};

/* A monitor record kept for groups registered after it came (inflight.c):
 * an abort record no registered group took (its group is still being
 * created on this rank while the other members already use it), and every
 * death record (a group being created may contain the dead rank). */
typedef struct tdist__kept_record {
  tdist__mon_record_t r; /* r.reason points at reason */
  char reason[200];
} tdist__kept_record_t;

#define TDIST__KEPT_RECORDS 32
#define TDIST__LEFT_GROUPS 8

typedef struct tdist__ctx {
  _Atomic int refs;
  tdist_progress_t *progress; /* (caller) a reference */
  tdist_store_t *root;        /* (caller) the whole store, or NULL */
  int world_rank;             /* (caller) */
  int rendezvous;             /* (caller) end the rendezvous at teardown */
  char job[64];               /* (caller) the job's id ("-": unknown), in every dump */
  int store_host;             /* (caller) world rank hosting the store server, or -1 */
  tdist__monitor_t *monitor;  /* (caller) NULL without a store */
  tdist__list_t groups;       /* (progress) registered groups */
  tdist__ticker_t watchdog;   /* (progress) op deadlines */
  tdist__kept_record_t kept[TDIST__KEPT_RECORDS]; /* (progress) a ring, the oldest overwritten */
  unsigned nkept;                                 /* (progress) records kept so far */
  /* (progress) the last groups destroyed here, uid and next_seq, which the
   * heartbeat lists ("uid:next_seq-") until `until` (the group's timeout
   * plus 30 s after its destruction: an op of another member that waits on
   * this rank times out by then, unless submitted later still): that member
   * is told this rank destroyed the group, not that it is behind. A few
   * at most, so a heartbeat stays short in a large job. */
  struct {
    uint64_t uid, next;
    int64_t until;
  } left[TDIST__LEFT_GROUPS];
  unsigned nleft;
  tdist__list_t link; /* (progress) on the list of live contexts */
} tdist__ctx_t;

struct tdist_group {
  /* (caller) identity */
  int rank, size;
  int *global_ranks; /* group rank -> world rank */
  int *parent_ranks; /* group rank -> parent rank (NULL for the world) */
  uint64_t uid;      /* same on every rank; distinct per group */
  char name[96];
  struct tdist_group *parent;
  const tdist_backend_t *bk;
  void *bstate;                        /* the backend's state */
  int needs_poll;                      /* the backend wants poll while work is in flight */
  int device;                          /* CUDA device or -1 */
  tdist_store_t *store;                /* prefix view "tdist/<name>/...", private to the group */
  _Atomic(tdist_store_t *) user_store; /* (atomic) tdist_group_store's "user/" view of
                                          store, made on first use; freed with g */
  tdist__ctx_t *ctx;                   /* a reference */

  /* (atomic) */
  _Atomic int64_t timeout_ms;
  _Atomic uint64_t next_seq;
  /* Collectives submitted (their numbers: tdist_work_t.coll): what the
   * heartbeat publishes for the timeout's diagnosis, which compares ranks
   * (next_seq counts p2p ops too, which only some ranks run). */
  _Atomic uint64_t next_coll;
  _Atomic int aborted;      /* set once; abort_status/reason valid after */
  _Atomic int64_t pending;  /* submitted and not yet finished */
  atomic_uint split_count;  /* number of splits made from this group */
  atomic_uint shrink_count; /* number of shrinks made from this group */
  int abort_status;
  char abort_reason[256];
  int abort_on_demand; /* (progress) the abort is this rank's tdist_group_abort:
                          no flight-recorder dump (docs/flight-recorder.md) */

  /* (progress) */
  tdist__list_t inflight; /* started works, submission order */
  tdist__list_t ctx_link; /* on ctx->groups while registered */
  int registered;
  tdist__poller_t poller; /* registered when needs_poll */
  int diag_pending;       /* a timeout is being diagnosed by the monitor */
  /* Failures held until the backend's device let go of their buffers
   * (tdist_backend_hold_failures, inflight.c): works failed by an abort,
   * their status set, not yet published; released by
   * tdist_backend_released or at hold_deadline_ns. */
  int hold;
  int64_t hold_deadline_ns;
  tdist__list_t held;
  tdist__qnode_t fail_node; /* a backend's failure, queued */
  int fail_queued, fail_status, fail_local;
  int fail_held; /* (progress) a cause that came before registration, held
                    until the group is registered (the caller thread is
                    still writing its fields) */
  char fail_reason[256];
  tdist__trace_t *trace; /* flight recorder, or NULL */

  /* (mu) tdist_group_on_abort's callback (TDIST__ABORT_CB_*), and whether
   * it is running now and on which thread (destroy waits for it) */
  tdist_group_abort_cb_t abort_cb;
  void *abort_cb_arg;
  int abort_cb_state;
  int abort_cb_running;
  pthread_t abort_cb_thread;

  /* pending reaching 0 is signalled here, for destroy; guards abort_cb */
  pthread_mutex_t mu;
  pthread_cond_t cv;
};

/* ---- context (context.c) ---------------------------------------------------- */

/* Caller thread: a context over `store` (NULL: none, no monitor) for world
 * rank world_rank; `rendezvous`: tdist__rendezvous_cleanup at teardown.
 * `agent`: the monitor may beat through the host agent (monitor.h), 0 for a
 * world the agent does not know.
 * `job`: the job's id, or NULL (TDIST_JOB_ID, else agreed on the store,
 * else "-"). `store_host`: the world rank whose process serves the store, or
 * -1 (another process): when that store stops answering, the groups holding
 * the rank fail naming it (monitor.h). */
int tdist__ctx_create(tdist_store_t *store, int world_rank, int rendezvous, int agent,
                      const char *job, int store_host, tdist__ctx_t **out);
void tdist__ctx_acquire(tdist__ctx_t *ctx);
/* Caller thread: the last release stops the monitor, writes pending dumps,
 * ends the rendezvous and drops the progress thread. */
void tdist__ctx_release(tdist__ctx_t *ctx);

/* ---- life cycle (group.c) --------------------------------------------------- */

/*
 * Create a world group with the given backend (caller thread) in context
 * ctx (NULL: a new one over `store`, which may be NULL only for backends that
 * need none, i.e. tests). Takes its own references.
 */
int tdist__group_create_in(const tdist_backend_t *bk, tdist__ctx_t *ctx, int rank, int size,
                           const char *name, tdist_store_t *store, int64_t timeout_ms,
                           const tdist_init_opts_t *opts, tdist_group_t **out);
int tdist__group_create(const tdist_backend_t *bk, int rank, int size, const char *name,
                        tdist_store_t *store, int64_t timeout_ms, const tdist_init_opts_t *opts,
                        tdist_group_t **out);

/* Caller thread: a child of `parent` whose rank i is parent rank members[i]
 * (the caller must be one of them; TDIST_ERR_INTERNAL if not): identity, rank
 * maps, store view (parent's view + store_tag), the parent's context; not yet
 * registered and without backend state. */
int tdist__group_child_new(tdist_group_t *parent, const int *members, int n,
                           const tdist_group_opts_t *opts, const char *default_name, uint64_t uid,
                           const char *store_tag, tdist_group_t **out);
/* The backend parameters for g (creation). */
void tdist__group_params(tdist_group_t *g, tdist_backend_params_t *p);
/* Caller thread: adopt what the backend made, then register g with the
 * progress thread. On failure the backend's state is destroyed (the one
 * unwind path) and g is left for tdist__group_free. */
int tdist__group_adopt(tdist_group_t *g, const tdist_backend_out_t *out);
/* Caller thread: free a group, registered or not: unregisters it, destroys
 * its backend state if it has one, drops its references. NULL is ignored. */
void tdist__group_free(tdist_group_t *g);
/* Mix v into the hash h (group uids: the same on every rank). */
uint64_t tdist__mix64(uint64_t h, uint64_t v);

/* ---- in flight (inflight.c), progress thread -------------------------------- */

/* Queue node run for a submitted work: start it on its backend. */
void tdist__group_start_work(tdist__qnode_t *node);
/* Caller thread: finish a work that succeeded on its submitting thread
 * before it was handed over (tdist__work_start): recorded in the flight
 * recorder, the runtime's reference released (and the caller's too when
 * out is NULL: a synchronous op), else the work goes to *out. Never on the
 * progress thread's lists. Returns 0. */
int tdist__group_finish_inline(tdist_work_t *w, tdist_work_t **out);
/* Caller thread: finish a work whose op the backend captured into a CUDA
 * graph (submit answered TDIST_BACKEND_CAPTURED): COMPLETED at once, marked
 * captured, its message saying so, recorded in the flight recorder; the
 * runtime's reference released (and the caller's too when out is NULL: a
 * synchronous op), else the work goes to *out. Never on the progress
 * thread's lists: no deadline, no watchdog. Returns 0. */
int tdist__group_finish_captured(tdist_work_t *w, tdist_work_t **out);
/* Abort g because of `status`: mark it, call the backend's abort, spread the
 * cause (`spread`: 1 the backend tells the members, 2 an abort record is
 * published, 3 both: a cause found on this rank), finish every work in
 * flight. Idempotent. */
void tdist__group_abort_now(tdist_group_t *g, int status, int spread, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* w passed its deadline: finish it with TIMEOUT, abort the rest. `diag`
 * (may be NULL) says which ranks had not reached the op. */
void tdist__group_timeout(tdist_group_t *g, tdist_work_t *w, const char *diag);
/* Register/unregister g with the progress thread (its context's list and,
 * when it polls, a poller). */
void tdist__group_register_task(void *g);
void tdist__group_unregister_task(void *g);
/* The monitor's handlers for ctx (context.c starts the monitor with them). */
extern const tdist__mon_handlers_t tdist__group_mon_handlers;
/* Progress thread: what a flight-recorder dump says about g. */
/* Progress thread: poll g's backend now, so that what it holds (backend.h,
 * quiet completions) reaches the core before a flight-recorder snapshot. */
void tdist__group_poll_now(tdist_group_t *g);
void tdist__group_trace_meta(const tdist_group_t *g, tdist__trace_meta_t *m);
/* Any thread: the ticker function of a context's watchdog. */
int tdist__group_watchdog(tdist__ticker_t *t);

#endif
