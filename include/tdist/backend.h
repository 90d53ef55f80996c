/*
 * tdist/backend.h - the backend plug-in interface (installed, versioned).
 *
 * A backend moves data; the core owns work handles, their state machine,
 * timeouts, groups and the progress thread. A backend sees exactly what this
 * header gives it: a parameter struct when a group is made
 * (tdist_backend_params_t), an op description when an op runs
 * (tdist_backend_op_t), and the services at the end of this file. The
 * built-in backends ("cpu", "nccl") are written against it too and join the
 * same table an external one does.
 *
 * A backend is a tdist_backend_t: the ABI version it was built with, its
 * name, its vtable and its capabilities. The core validates every op
 * against the capabilities before submission, so a combination a backend
 * cannot do fails the same way on every backend.
 *
 * Finding a backend by name (tdist_init_process_group's backend, or
 * TDIST_BACKEND): the built-in table first, then backends a program
 * registered (tdist_backend_register), then a shared object
 * libtdist-backend-NAME.so, looked for in each folder of TDIST_BACKEND_PATH
 * (':'-separated) and then in the folder "tdist-backends" next to
 * libtdist.so (installed: <libdir>/tdist-backends). The object exports
 *     const tdist_backend_t *tdist_backend_plugin(void);
 * (TDIST_BACKEND_PLUGIN_SYMBOL), whose result must stay valid for the life
 * of the process. An object built for another ABI version is refused with
 * TDIST_ERR_NOT_SUPPORTED and a message naming both versions. A plug-in is
 * linked without libtdist: the services below resolve against the program
 * that loads it (libtdist.so exports them; a program linked with the static
 * library must export its symbols, -Wl,--export-dynamic).
 *
 * Threads (the rule every backend relies on):
 *   init, split, shrink, destroy, submit, wait_stream run on a CALLER
 *       thread. They may block (store exchanges, device init polling) but
 *       only within the group's timeout. To touch the event loop they use
 *       tdist_backend_call().
 *   test (optional) runs on any caller thread, next to the others.
 *   post, poll, abort run on the PROGRESS thread and must not block (no
 *       file writes, no communicator abort: hand blocking work to
 *       tdist_backend_worker_run). Only the progress thread touches the
 *       libuv loop (tdist_backend_loop).
 *
 * Completions are deferred: tdist_backend_complete and tdist_backend_fail
 * only queue; the progress loop delivers queued completions after the I/O
 * step that made them (libuv's write-completed queue pattern). So no user
 * callback, no abort and no group failure ever runs inside a backend's own
 * call chain, and a backend needs no re-entry guards.
 *
 * Abort contract: when the core aborts a group (timeout, tdist_group_abort,
 * a failure the backend reported with tdist_backend_fail, a remote abort
 * record), it calls vtable->abort on the progress thread. The backend stops
 * communicating for that group and forgets every op of it: after abort
 * returns it never again touches those ops or their buffers and never
 * completes them. The core then finishes each of them with the status. Ops
 * the backend completed before abort (queued, not yet delivered) keep their
 * own status.
 */
#ifndef TDIST_BACKEND_H
#define TDIST_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "tdist/list.h"
#include "tdist/tdist.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped on any change of the structs, the vtable or the services below
 * that a plug-in built before it would misread. */
/* 2: params.group_opts, mem_* entries, TDIST_BACKEND_CAPTURED; 3: one caller-
 * driven path (test's flags; no drive_mark, op.quiet, caps.drives, submit's 1) */
#define TDIST_BACKEND_ABI_VERSION 3
/* The function a plug-in exports (see above). */
#define TDIST_BACKEND_PLUGIN_SYMBOL "tdist_backend_plugin"

/* The core's group and progress thread as a backend sees them: opaque
 * handles for the services below. */
typedef struct tdist_backend_group tdist_backend_group_t;
typedef struct tdist_progress tdist_backend_progress_t;

/* Colour of non-members in a split (NCCL_SPLIT_NOCOLOR's role). */
#define TDIST_BACKEND_NOCOLOR (-1)

typedef struct tdist_backend_args {
  tdist_optype_t type;
  const void *sendbuf;
  void *recvbuf; /* == sendbuf-equivalent for in-place ops; broadcast: buf */
  size_t count;
  tdist_dtype_t dtype;
  tdist_redop_t redop;
  double scalar; /* PREMUL_SUM factor */
  int root;      /* root (rooted collectives) or peer (send/recv), group rank */
  int tag;
  void *stream;        /* caller's CUDA stream, or NULL */
  tdist_p2p_op_t *p2p; /* batch ops */
  int np2p;
  /* Variable-size collectives (TDIST_OP_*_V, tdist_backend_op_is_v): the caller's
   * arrays of group size, in elements, NOT copied: like MPI's nonblocking
   * *v calls, they stay valid and unchanged until the op completes (the
   * buffer rule), so a backend may read them from submit (caller thread) or
   * post (progress thread) to its completion. NULL where the op has none or
   * where the array is only read on another rank (gather_v's recv arrays
   * off root, scatter_v's send arrays off root); NULL displacements mean
   * packed (prefix sums of the counts). `count` above is then this rank's
   * own block where the op has one (all_gather_v, gather_v: send_count;
   * scatter_v: recv_count; reduce_scatter_v: rcounts[rank]; all_to_all_v:
   * the sum of scounts), for traces. */
  const size_t *scounts, *sdispls, *rcounts, *rdispls;
} tdist_backend_args_t;

/*
 * What each op kind is: one table, read by the core (validation, the flight
 * recorder) and by the backends instead of their own lists of op types, so
 * a new op kind is classified in one place.
 *   ROOTED    args->root is a group rank every member must agree on
 *             (broadcast, reduce, gather, scatter, gather_v, scatter_v)
 *   REDUCING  args->redop is applied (all_reduce, reduce, reduce_scatter,
 *             reduce_scatter_v)
 *   V         counts per rank in args->scounts/rcounts (see above)
 *   PEER      args->root is the peer of a send or receive
 *   P2P       point-to-point: send, recv, batch_p2p (matched by peer and
 *             tag, not by the collective sequence)
 */
enum {
  TDIST_BACKEND_OP_ROOTED = 1u << 0,
  TDIST_BACKEND_OP_REDUCING = 1u << 1,
  TDIST_BACKEND_OP_V = 1u << 2,
  TDIST_BACKEND_OP_PEER = 1u << 3,
  TDIST_BACKEND_OP_P2P = 1u << 4,
};

/* The TDIST_BACKEND_OP_* bits of op kind t; 0 for a value out of range. */
static inline unsigned tdist_backend_op_props(tdist_optype_t t) {
  static const unsigned char props[TDIST_OPTYPE_COUNT] = {
      [TDIST_OP_ALL_REDUCE] = TDIST_BACKEND_OP_REDUCING,
      [TDIST_OP_BROADCAST] = TDIST_BACKEND_OP_ROOTED,
      [TDIST_OP_REDUCE] = TDIST_BACKEND_OP_ROOTED | TDIST_BACKEND_OP_REDUCING,
      [TDIST_OP_ALL_GATHER] = 0,
      [TDIST_OP_GATHER] = TDIST_BACKEND_OP_ROOTED,
      [TDIST_OP_SCATTER] = TDIST_BACKEND_OP_ROOTED,
      [TDIST_OP_REDUCE_SCATTER] = TDIST_BACKEND_OP_REDUCING,
      [TDIST_OP_ALL_TO_ALL] = 0,
      [TDIST_OP_BARRIER] = 0,
      [TDIST_OP_SEND] = TDIST_BACKEND_OP_PEER | TDIST_BACKEND_OP_P2P,
      [TDIST_OP_RECV] = TDIST_BACKEND_OP_PEER | TDIST_BACKEND_OP_P2P,
      [TDIST_OP_BATCH_P2P] = TDIST_BACKEND_OP_P2P,
      [TDIST_OP_ALL_TO_ALL_V] = TDIST_BACKEND_OP_V,
      [TDIST_OP_ALL_GATHER_V] = TDIST_BACKEND_OP_V,
      [TDIST_OP_REDUCE_SCATTER_V] = TDIST_BACKEND_OP_V | TDIST_BACKEND_OP_REDUCING,
      [TDIST_OP_GATHER_V] = TDIST_BACKEND_OP_V | TDIST_BACKEND_OP_ROOTED,
      [TDIST_OP_SCATTER_V] = TDIST_BACKEND_OP_V | TDIST_BACKEND_OP_ROOTED,
  };
  return (unsigned)t < TDIST_OPTYPE_COUNT ? props[t] : 0u;
}

static inline int tdist_backend_op_is_rooted(tdist_optype_t t) {
  return (tdist_backend_op_props(t) & TDIST_BACKEND_OP_ROOTED) != 0;
}
static inline int tdist_backend_op_is_reducing(tdist_optype_t t) {
  return (tdist_backend_op_props(t) & TDIST_BACKEND_OP_REDUCING) != 0;
}
static inline int tdist_backend_op_is_v(tdist_optype_t t) {
  return (tdist_backend_op_props(t) & TDIST_BACKEND_OP_V) != 0;
}
static inline int tdist_backend_op_is_p2p(tdist_optype_t t) {
  return (tdist_backend_op_props(t) & TDIST_BACKEND_OP_P2P) != 0;
}

#define TDIST_BACKEND_SCRATCH 256

/*
 * One op as the backend sees it. Lives inside the work handle; valid from
 * submit/post until the backend completes it or the group is aborted.
 * (caller) fields are set before submit and never change.
 */
typedef struct tdist_backend_op {
  const tdist_backend_args_t *args; /* (caller) */
  uint64_t seq;                     /* (caller) op number in the group */
  int64_t timeout_ms;               /* (caller) */
  /* The backend's own, from submit/post until completion or abort: a link
   * for its lists, a pointer, and scratch it may use without allocating.
   * Left as the previous use of the handle had them (initialise them). */
  tdist_list_t link;
  void *priv;
  unsigned char scratch[TDIST_BACKEND_SCRATCH] __attribute__((aligned(16)));
  /* A receive posted with TDIST_ANY_SOURCE or TDIST_ANY_TAG (caps.any_source):
   * the backend writes what matched (the sender's group rank, its tag, the
   * elements received) before it completes the op; the core reads them only
   * after the completion is published (tdist_work_status_info). */
  int rx_source, rx_tag;
  size_t rx_count;
} tdist_backend_op_t;

/* What a group is made from (init, split, shrink). (caller) thread. */
typedef struct tdist_backend_params {
  tdist_backend_group_t *group;       /* the new group's handle (NULL: split non-member) */
  tdist_backend_progress_t *progress; /* the process's progress thread */
  int rank, size;                     /* in the new group */
  const int *global_ranks;            /* new group rank -> world rank */
  uint64_t uid;                       /* the same on every rank of the group */
  const char *name;                   /* the group's name */
  tdist_store_t *store;               /* a prefix view private to the group, or NULL */
  int64_t timeout_ms;                 /* bound for every blocking step */
  int device;                         /* parent's device (split, shrink), else -1 */
  int own_device;                     /* split: the group names its own device (then
                                         `device` is it, for members) */
  const tdist_init_opts_t *init_opts; /* init: the caller's options, or NULL */
  void *parent;                       /* split, shrink: the parent's backend state */
  int parent_rank;                    /* split, shrink: this process's rank in the parent */
  int color;                          /* split: TDIST_BACKEND_NOCOLOR for non-members */
  const int *exclude;                 /* shrink: parent ranks left out (dead) */
  int nexclude;
  const tdist_group_opts_t *group_opts; /* split, shrink: the caller's options, or NULL */
} tdist_backend_params_t;

/* What the backend made. */
typedef struct tdist_backend_out {
  void *state;    /* the group's backend state (NULL for a split non-member) */
  int needs_poll; /* call vtable->poll while the group has ops in flight */
  int device;     /* CUDA device, or -1 */
} tdist_backend_out_t;

typedef struct tdist_backend_ops {
  /* Caller thread. A new world group. Return 0 or a tdist error (message
   * recorded with tdist_backend_error). */
  int (*init)(const tdist_backend_params_t *p, tdist_backend_out_t *out);

  /* Caller thread; collective over the parent (every parent rank calls it,
   * in the same order). p->color == TDIST_BACKEND_NOCOLOR: this rank is not in the
   * child (p->group is NULL, out->state must stay NULL). */
  int (*split)(const tdist_backend_params_t *p, tdist_backend_out_t *out);

  /* Caller thread, survivors only (tdist_group_shrink): like split, for a
   * child of every parent rank except p->exclude. The parent may be aborted.
   * NULL when caps.shrink is 0. */
  int (*shrink)(const tdist_backend_params_t *p, tdist_backend_out_t *out);

  /* Caller thread, optional. Runs after validation, before the op goes to
   * the progress thread; the backend may start the op here (NCCL launches
   * here, ordered with the caller's stream; the CPU backend posts it to its
   * engine). 0, or an error: the call fails and the op is not submitted.
   * TDIST_BACKEND_CAPTURED (below): the op was captured into a CUDA graph
   * the caller's stream is capturing; it runs at each launch of the graph,
   * and the backend keeps nothing of it that the core must finish.
   *
   * The caller-driven path (core/work/work.c, one state machine): right
   * after submit the submitting thread owns the op and tests it once
   * (test, flags 0: "progress once inline", as UCC posts a task); a
   * synchronous op's thread then keeps testing it (TDIST_BACKEND_TEST_SPIN)
   * for up to TDIST_DRIVE_SPIN_US. An op that succeeds there is finished on
   * that thread and never handed over: post is never called for it. So a
   * backend whose op needs post to be forgotten again (NCCL's poll list)
   * answers 1 from test only for ops it was posted; one that can (the CPU
   * backend) keeps nothing for a finished op that only a post would clear.
   * Every other op is handed to the progress thread (post). */
  int (*submit)(void *state, tdist_backend_op_t *op);

  /* Progress thread. The op is handed over: start it, or take over the op
   * submit started (complete it at once if it finished meanwhile). A
   * negative return fails the op with that status (the backend must then
   * not keep it). Also called for an op handed over after its group was
   * aborted (abort returned before): the backend completes it only if it
   * had finished, else keeps nothing of it (the core fails it). */
  int (*post)(void *state, tdist_backend_op_t *op);

  /* Progress thread, when out->needs_poll was set and the group has ops in
   * flight: check for completions and errors. Return the number of ops
   * completed (0 lets the core back off). */
  int (*poll)(void *state);

  /* Progress thread. See the abort contract above. `local`: tell the other
   * members the cause in the backend's own stream, ahead of anything this
   * rank sends later (its goodbye): the cause was found on this rank, or
   * learnt from the store, which the others may not have read yet. 0: the
   * cause came from another member, and `reason` is its own words naming
   * it; a backend whose members need not all be connected to that member
   * passes `reason` on unchanged (the CPU backend, whose connections are
   * lazy), so that no member names this rank's goodbye as the cause. */
  void (*abort)(void *state, int status, const char *reason, int local);

  /* Caller thread, once no op of the group is in flight (finished or
   * aborted). Release everything. Also the unwind step of a group whose
   * creation failed after init/split/shrink succeeded. */
  int (*destroy)(void *state);

  /* Caller thread, optional: make `stream` wait for op (NCCL). */
  int (*wait_stream)(void *state, tdist_backend_op_t *op, void *stream);

  /* Any caller thread (never the progress thread), optional: progress the
   * op if the backend can from this thread, and say where it is: 1 when it
   * has finished successfully and may be reported so now; 0 not yet (or
   * failed: failures are the progress thread's to report); 2 not yet, but
   * this call moved it (a step of a long op: the waiter keeps driving it,
   * TDIST_DRIVE_SPIN_US counting from the last move). The submitting
   * thread and every waiter call it (see submit): a completion is seen
   * without waiting for the progress thread ("caller-observed
   * completion"), and a backend that moves the op here (the CPU backend
   * reads and writes its transport and runs the rounds) needs no thread
   * hand-off for a small op. The progress thread still completes a
   * handed-over op through poll as usual; the first of the two to claim
   * the work decides its status. Must not block (trylock, not lock), must
   * not change the thread's visible state (its CUDA device, its capture
   * mode), and may run at the same time as post, poll, abort, submit and
   * another test of the same op. Called from submit's return until the op
   * is finished, never after destroy began.
   *
   * flags (TDIST_BACKEND_TEST_*) say how the calling thread tests: SPIN,
   * it tests again in a moment and may be counted on to (the CPU backend's
   * peers then ring no doorbell for what they write to it); LAST, it stops
   * after this call (it sleeps, or goes on with other work), so the backend
   * stops counting on it and then looks once more, missing nothing. Every
   * run of SPIN tests by one thread ends with one LAST test by that thread.
   * 0: a single look. A backend whose completions come through
   * tdist_backend_wake_any sets test, so that the woken caller sees them. */
  int (*test)(void *state, tdist_backend_op_t *op, unsigned flags);

  /* Caller thread, optional (NULL: tdist_mem_register answers
   * TDIST_ERR_NOT_SUPPORTED): register [ptr, ptr + bytes) with the group
   * (tdist/mem.h; flags TDIST_MEM_REGISTER_*), the backend's handle in
   * *handle. A window is collective and may block within the group's
   * timeout. deregister undoes it (handle from mem_register of this state).
   * Both return 0 or a tdist error with its message recorded. */
  int (*mem_register)(void *state, void *ptr, size_t bytes, unsigned flags, void **handle);
  int (*mem_deregister)(void *state, void *handle);
  /* Caller thread, optional (NULL: NOT_SUPPORTED): memory the backend's
   * registration wants (NCCL: ncclMemAlloc, cuMem, on the group's device),
   * and its release. 0 or a tdist error with its message recorded. */
  int (*mem_alloc)(void *state, size_t bytes, void **ptr);
  int (*mem_free)(void *state, void *ptr);
} tdist_backend_ops_t;

/* submit's answer for an op captured into a CUDA graph (since ABI 2): the
 * core never posts, polls or times it out; its work is finished at once as
 * COMPLETED and marked captured (tdist_work_is_captured). The backend must
 * not touch op after returning it. */
#define TDIST_BACKEND_CAPTURED 3

/* test's flags (see test). */
enum { TDIST_BACKEND_TEST_SPIN = 1u << 0, TDIST_BACKEND_TEST_LAST = 1u << 1 };

/* Memory kinds a backend's buffers may be in. */
enum { TDIST_BACKEND_MEM_HOST = 1u << 0, TDIST_BACKEND_MEM_DEVICE = 1u << 1 };

typedef struct tdist_backend_caps {
  unsigned mem;    /* TDIST__MEM_* */
  uint32_t ops;    /* bit (1u << tdist_optype_t) per op it runs */
  uint32_t dtypes; /* bit per tdist_dtype_t it carries (else TDIST_ERR_NOT_SUPPORTED) */
  uint32_t redops; /* bit per tdist_redop_t it reduces with (else TDIST_ERR_NOT_SUPPORTED);
                      pairs that mean nothing (a bitwise op on a float) are refused
                      by the core for every backend */
  int shrink;      /* vtable->shrink works */
  int stream_wait; /* vtable->wait_stream works */
  int any_source;  /* receives take TDIST_ANY_SOURCE / TDIST_ANY_TAG (and fill
                      tdist_backend_op_t.rx_*); without it the core refuses them */
  int wakes;       /* an op's completion calls tdist_backend_wake_any: the
                      progress thread need not spin while its ops are in flight */
} tdist_backend_caps_t;

#define TDIST_BACKEND_ALL_OPS ((1u << TDIST_OPTYPE_COUNT) - 1)
#define TDIST_BACKEND_ALL_DTYPES ((1u << TDIST_DTYPE_COUNT) - 1)
#define TDIST_BACKEND_ALL_REDOPS ((1u << TDIST_REDOP_COUNT) - 1)
/* caps.dtypes and caps.redops hold one bit per value. */
_Static_assert(TDIST_DTYPE_COUNT <= 32 && TDIST_REDOP_COUNT <= 32, "caps masks are 32 bits");

typedef struct tdist_backend {
  uint32_t abi_version; /* TDIST_BACKEND_ABI_VERSION the backend was built with */
  const char *name;
  const tdist_backend_ops_t *ops;
  tdist_backend_caps_t caps;
} tdist_backend_t;

/* ---- services the core gives backends -------------------------------------------- */

/*
 * tdist_backend_complete - op is done with `status` (0, or a tdist error
 * whose message is built from fmt: the core prefixes "<op> seq <n> of group
 * ..."). Queued: delivered after the current I/O step. The backend must not
 * touch op afterwards; completing one op twice is a bug (asserted).
 * Thread: progress.
 */
void tdist_backend_complete(tdist_backend_op_t *op, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/*
 * tdist_backend_fail - the group is broken (a peer is lost, a mismatch, a
 * device error...). Queued; when delivered, the core aborts the group
 * (vtable->abort with local = 1), tells the other ranks, and fails every
 * op in flight with `status` and the text. The first cause reported wins.
 * Thread: progress.
 */
void tdist_backend_fail(tdist_backend_group_t *g, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The same for a cause another rank reported to this one (the backend's own
 * error message): the core does not tell the others again (local = 0).
 * Thread: progress. */
void tdist_backend_fail_remote(tdist_backend_group_t *g, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/*
 * tdist_backend_hold_failures - called from vtable->abort when the device
 * may still use the aborted ops' buffers after abort returns (an NCCL
 * kernel that the communicator's abort, finishing on a thread of its own,
 * has not stopped yet). The core then gives those ops their failure at once
 * but publishes it (waiters woken, callbacks run, buffers the caller's
 * again) only when the backend calls tdist_backend_released, or after
 * TDIST_ABORT_RELEASE_MS (default: the group's timeout), with a message
 * saying the device had not let go. Thread: progress, inside abort.
 */
void tdist_backend_hold_failures(tdist_backend_group_t *g);

/* The device no longer uses any buffer of g's aborted ops: publish the
 * failures held since tdist_backend_hold_failures. Before the backend's
 * destroy returns. Any thread (waits for the progress thread). */
void tdist_backend_released(tdist_backend_group_t *g);

/* 1 once the group is aborted (caller-side wait loops give up). Any thread. */
int tdist_backend_aborted(const tdist_backend_group_t *g);

/* Run fn(arg) on the progress thread and wait for it to return (inline when
 * called there). Any thread. */
void tdist_backend_call(tdist_backend_progress_t *p, void (*fn)(void *arg), void *arg);

/* The progress thread's libuv loop (a uv_loop_t *), for the backend's
 * sockets and timers. Thread: progress (tdist_backend_call from others). */
void *tdist_backend_loop(tdist_backend_progress_t *p);

/* Note activity, so the loop keeps polling for a while. Thread: progress. */
void tdist_backend_kick(tdist_backend_progress_t *p);

/* Wake the progress thread to poll now, and every caller blocked on an op
 * it tests itself (caps.wakes: a completion found off the loop). Any thread. */
void tdist_backend_wake_any(void);

/* 1 on a progress thread. Any thread. */
int tdist_backend_on_progress_thread(void);

/* Run fn(arg) later on the worker thread, which may block (file writes, a
 * communicator abort); jobs run in order. 0, or a tdist error (then fn ran
 * here and now). Any thread. */
int tdist_backend_worker_run(void (*fn)(void *arg), void *arg);

/*
 * tdist_backend_allgather - collective over `size` ranks sharing the store
 * view `store` (tdist_backend_params_t.store): rank `rank` contributes len
 * bytes of `mine` under "<tag>/<rank>"; then vals[i], lens[i] hold rank i's
 * contribution (free each with tdist_store_free). Only the n_from ranks in
 * `from` (NULL: all) are waited for and returned; the others' vals[i] are
 * NULL. Blocks up to timeout_ms. 0; TDIST_ERR_TIMEOUT naming the tag and a
 * missing rank; store errors. Thread: caller.
 */
int tdist_backend_allgather(tdist_store_t *store, const char *tag, int rank, int size,
                            const void *mine, size_t len, const int *from, int n_from, void **vals,
                            size_t *lens, int64_t timeout_ms);

/* A setting: the integer in environment variable `name`, or dflt when unset
 * or empty. Read once per process and per name (later changes are not seen)
 * and logged when set. Any thread. */
int64_t tdist_backend_param_int(const char *name, int64_t dflt);

/* Record `code` and the message as the calling thread's last error
 * (tdist_last_error) and return code. Any thread. */
int tdist_backend_error(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Log at TDIST_DEBUG level `level` (0 warn, 1 info, 2 trace) under the
 * subsystem "BACKEND". Any thread. */
void tdist_backend_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/*
 * tdist_backend_register - add a backend built into the program (as the
 * tests do) to the table, under b->name. TDIST_ERR_INVALID_ARGUMENT for an
 * incomplete descriptor, TDIST_ERR_NOT_SUPPORTED for another ABI version,
 * TDIST_ERR_INVALID_STATE if the name is taken or the table is full. Any
 * thread.
 */
int tdist_backend_register(const tdist_backend_t *b);

#ifdef __cplusplus
}
#endif

#endif /* TDIST_BACKEND_H */
