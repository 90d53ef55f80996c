/*
 * tdist/group.h - process groups: initialisation, subgroups, meshes, abort.
 *
 * A group is a set of ranks that run collectives together. The world group
 * comes from tdist_init_process_group(); subgroups from tdist_new_group() or
 * tdist_mesh_create(). Every group belongs to one backend ("cpu" for host
 * memory over TCP, "nccl" for CUDA device memory).
 *
 * Collective-call rule (as in MPI and torch.distributed): calls that create or
 * destroy groups are collective over the parent group and must be made by
 * every rank of it in the same order. Operations on one group are ordered by
 * the order of the calls on each rank; issuing them from several threads at
 * once gives an order the ranks may not agree on.
 *
 * Thread safety: group functions may be called from any thread except from a
 * work completion callback. tdist_group_rank/size/name are safe at any time.
 */
#ifndef TDIST_GROUP_H
#define TDIST_GROUP_H

#include "tdist/types.h"

#ifdef __cplusplus
extern "C" {
#endif

enum {
  TDIST_INIT_FIELD_BACKEND = 1u << 0,
  TDIST_INIT_FIELD_INIT_METHOD = 1u << 1,
  TDIST_INIT_FIELD_RANK = 1u << 2,
  TDIST_INIT_FIELD_WORLD_SIZE = 1u << 3,
  TDIST_INIT_FIELD_STORE = 1u << 4,
  TDIST_INIT_FIELD_TIMEOUT = 1u << 5,
  TDIST_INIT_FIELD_DEVICE = 1u << 6,
  TDIST_INIT_FIELD_NAME = 1u << 7,
  TDIST_INIT_FIELD_HOST_STORE = 1u << 8,
  TDIST_INIT_FIELD_NCCL = 1u << 9,
};

/*
 * NCCL's communicator configuration (ncclConfig_t) and the group's stream,
 * for tdist_init_opts_t.nccl and tdist_group_opts_t.nccl (docs/nccl-backend.md,
 * "NCCL's configuration"). Only the fields whose TDIST_NCCL_FIELD_* bit is in
 * `mask` are passed; the others keep NCCL's default (or, for a subgroup, the
 * parent's value). Set the same values on every rank of the group.
 * Checked when the group is made: a value out of NCCL's range is
 * TDIST_ERR_INVALID_ARGUMENT naming the field; a field the loaded NCCL does not
 * know (trafficClass before 2.25) is TDIST_ERR_NOT_SUPPORTED naming both
 * versions. Groups on the CPU backend ignore these options, so one program
 * runs on either backend.
 */
enum {
  TDIST_NCCL_FIELD_MIN_CTAS = 1u << 0,         /* ncclConfig_t.minCTAs (NCCL 2.17) */
  TDIST_NCCL_FIELD_MAX_CTAS = 1u << 1,         /* ncclConfig_t.maxCTAs (2.17) */
  TDIST_NCCL_FIELD_CGA_CLUSTER_SIZE = 1u << 2, /* ncclConfig_t.cgaClusterSize (2.17) */
  TDIST_NCCL_FIELD_NET_NAME = 1u << 3,         /* ncclConfig_t.netName (2.17) */
  TDIST_NCCL_FIELD_SPLIT_SHARE = 1u << 4,      /* ncclConfig_t.splitShare (2.18) */
  TDIST_NCCL_FIELD_TRAFFIC_CLASS = 1u << 5,    /* ncclConfig_t.trafficClass (2.25) */
  TDIST_NCCL_FIELD_HIGH_PRIORITY = 1u << 6,    /* the group's stream (any NCCL) */
};
typedef struct tdist_nccl_opts {
  uint64_t mask;        /* TDIST_NCCL_FIELD_* bits of the fields set */
  int min_ctas;         /* 1..64 CTAs per collective at least (NCCL caps at
                           64); with max_ctas, min_ctas <= max_ctas */
  int max_ctas;         /* 1..64 at most; setting min_ctas needs max_ctas too
                           (NCCL 2.28's parseCommConfig compares them) */
  int cga_cluster_size; /* 0..8 (sm_90 and later; NCCL's default 4) */
  const char *net_name; /* the network plug-in to use ("IB", "Socket"...):
                           copied, NCCL fails the init if none has it */
  int split_share;      /* 0 or 1: subgroups split from this group share its
                           NCCL resources (a mesh's dimensions); applies to
                           the communicators split from it */
  int traffic_class;    /* >= 0: the network's traffic class (QoS) */
  int high_priority;    /* 0 or 1: the group's internal stream, on which every
                           NCCL kernel runs, gets the device's greatest stream
                           priority (torch: TORCH_NCCL_HIGH_PRIORITY) */
} tdist_nccl_opts_t;

typedef struct tdist_init_opts {
  uint64_t mask;           /* TDIST_INIT_FIELD_* bits of the fields set */
  const char *backend;     /* "cpu" or "nccl"; default $TDIST_BACKEND, else "cpu" */
  const char *init_method; /* "env://" (default; through $TDIST_STORE_URL when
                              set), "tcp://host:port", "file:///path",
                              "etcd://host:port[,host:port...]/prefix" */
  int rank;                /* this process's rank; default from the environment
                              (RANK, then OMPI_COMM_WORLD_RANK, then
                              SLURM_PROCID: docs/launcher.md) */
  int world_size;          /* default from WORLD_SIZE, OMPI_COMM_WORLD_SIZE,
                              SLURM_NTASKS (the launcher the rank came from) */
  tdist_store_t *store;    /* an existing store to rendezvous on (the group
                              takes its own reference); overrides init_method */
  int64_t timeout_ms;      /* rendezvous timeout and the groups' default op
                              timeout; default $TDIST_TIMEOUT_MS, else 600000 */
  int device;              /* NCCL: CUDA device; default LOCAL_RANK, else 0 */
  const char *name;        /* group name in logs and errors; default "world" */
  int host_store;          /* tcp:// and env://: TDIST_HOST_STORE_* (below).
                              Default: 0 if $TDIST_STORE_HOSTED=1 (set by
                              tdistrun), else 1 */
  /* NCCL's configuration (tdist_nccl_opts_t above), with
   * TDIST_INIT_FIELD_NCCL; read during the call only. */
  const tdist_nccl_opts_t *nccl;
} tdist_init_opts_t;

/* tdist_init_opts_t.host_store. Rank 0 hosts the store as a process of its
 * own (`tdist-store`, found next to libtdist) so that it outlives rank 0: a
 * killed or stopped rank 0 is declared dead like any rank, and the survivors
 * can shrink. A store served by a thread of rank 0 dies or stops with it:
 * the survivors are told (REMOTE_FAILED naming rank 0 as the store's host)
 * but can agree on nothing afterwards, so tdist_group_shrink fails. */
enum {
  TDIST_HOST_STORE_NONE = 0,    /* a store already runs (a launcher, tdist-store) */
  TDIST_HOST_STORE_DEFAULT = 1, /* a process; a thread if $TDIST_STORE_IN_PROCESS=1
                                   or no tdist-store program is found (one warning) */
  TDIST_HOST_STORE_PROCESS = 2, /* a process, or init fails */
  TDIST_HOST_STORE_THREAD = 3,  /* a thread of rank 0 */
};

/*
 * tdist_init_process_group - rendezvous with the other ranks and create the
 * world group. Blocks until every rank arrived or the timeout passed.
 * One world per process from env://, tcp://, file:// or etcd:// (a second
 * is TDIST_ERR_INVALID_STATE until the first is destroyed); a process may
 * make further independent worlds on stores it passes in opts->store, each
 * with its own rank, size and name (tdist.torch makes torch's subgroups so).
 * Such a world's liveness records live at the root of its store, so give
 * each its own store (server), not a prefix of another world's; its monitor
 * beats to that store (never to tdistrun's host agent, TDIST_HOST_AGENT,
 * which knows the launcher's world only), and with rank and world_size both
 * in opts LOCAL_RANK / LOCAL_WORLD_SIZE are not checked against it.
 * Thread: the caller's.
 * @return 0; TDIST_ERR_INVALID_ARGUMENT when a setting is missing or
 *         contradictory (tdist_last_error() names the variable);
 *         TDIST_ERR_TIMEOUT if the others did not arrive; TDIST_ERR_NOT_SUPPORTED
 *         for a backend this build lacks; backend errors.
 */
int tdist_init_process_group(const tdist_init_opts_t *opts, tdist_group_t **world);

enum {
  TDIST_GROUP_FIELD_TIMEOUT = 1u << 0,
  TDIST_GROUP_FIELD_NAME = 1u << 1,
  TDIST_GROUP_FIELD_DEVICE = 1u << 2,
  TDIST_GROUP_FIELD_NCCL = 1u << 3,
};
typedef struct tdist_group_opts {
  uint64_t mask;
  int64_t timeout_ms; /* default: the parent's */
  const char *name;   /* default: "<parent>/<index>" */
  /* NCCL groups: this rank's CUDA device for the new group (default: the
   * parent's). A process that drives two GPUs makes one group per device.
   * Set on every rank of the parent that calls tdist_new_group, or on none
   * (TDIST_ERR_MISMATCH otherwise); the group's communicator is then made by
   * ncclCommInitRankConfig over the new group's store, not ncclCommSplit
   * (which keeps the parent's device). */
  int device;
  /* NCCL groups: NCCL's configuration of the new group's communicator
   * (tdist_nccl_opts_t). Fields not set are the parent's (as ncclCommSplit
   * without a config inherits its parent's); read during the call only. */
  const tdist_nccl_opts_t *nccl;
} tdist_group_opts_t;

/*
 * tdist_new_group - create a subgroup of `parent` from `n` distinct parent
 * ranks; collective over the parent (every parent rank calls it, with the same
 * list, in the same order of calls). Members get a group whose rank i is
 * ranks[i]; non-members get *group = NULL and 0. The CPU backend reuses the
 * parent's connections; the NCCL backend calls ncclCommSplit (non-members pass
 * NCCL_SPLIT_NOCOLOR), or, with TDIST_GROUP_FIELD_DEVICE, makes a new
 * communicator on that device.
 * Every rank of the parent waits, up to the new group's timeout (opts, else
 * the parent's), until every other rank of the parent has called it.
 * Thread: any caller thread (not a completion or abort callback).
 * @return 0; TDIST_ERR_INVALID_ARGUMENT for an empty list, a rank out of range
 *         or a duplicate, or a device option on a group whose backend has no
 *         devices; TDIST_ERR_MISMATCH if ranks disagree on the members or on
 *         whether a device is named; TDIST_ERR_TIMEOUT if a rank of the
 *         parent never called it within that timeout, the message naming the
 *         group and the missing ranks (parent and world ranks), e.g.
 *         "tdist_new_group 'tp' (ranks 0,1,2,3 of 'world'): rank 3 of 'world'
 *         (world rank 3) never joined within 1000 ms ...";
 *         TDIST_ERR_REMOTE_FAILED at once (well before the timeout) if such a
 *         rank was declared dead by the store meanwhile, naming it; the
 *         parent's abort status (TDIST_ERR_ABORTED, TDIST_ERR_REMOTE_FAILED...)
 *         if the parent was or gets aborted. After a TIMEOUT the parent's
 *         ops still work, but its ranks no longer agree on how many splits
 *         it made: do not split it again.
 */
int tdist_new_group(tdist_group_t *parent, const int *ranks, int n, const tdist_group_opts_t *opts,
                    tdist_group_t **group);

/*
 * tdist_mesh_create - an N-dimensional device mesh over `parent`, e.g.
 * dims = {TP, DP, CP}, the last dimension varying fastest over parent ranks
 * (row-major, like torch's init_device_mesh). For each dimension d, this rank
 * gets in groups[d] the group of ranks that differ from it only in
 * coordinate d. Collective over the parent.
 * Each dimension is one split, with the waits and errors of
 * tdist_new_group (`opts`' timeout bounds each).
 * @param coords  optional out: this rank's coordinate in each dimension.
 * @return 0; TDIST_ERR_INVALID_ARGUMENT if a dimension is < 1 or the product
 *         of dims differs from the parent's size (the message says both);
 *         TDIST_ERR_TIMEOUT naming the mesh, the dimension, the group and the
 *         parent ranks that never called it; TDIST_ERR_REMOTE_FAILED if one
 *         of them died; as tdist_new_group otherwise.
 *         On failure no group is returned.
 */
int tdist_mesh_create(tdist_group_t *parent, const int *dims, int ndims,
                      const tdist_group_opts_t *opts, tdist_group_t **groups, int *coords);

/* Rank of the caller in the group, and the group's size. -1 for NULL. */
int tdist_group_rank(const tdist_group_t *group);
int tdist_group_size(const tdist_group_t *group);
/* The rank in the world group of group rank `rank`; -1 if out of range. */
int tdist_group_global_rank(const tdist_group_t *group, int rank);
/* The group's name, and its backend's ("cpu", "nccl"). */
const char *tdist_group_name(const tdist_group_t *group);
const char *tdist_group_backend(const tdist_group_t *group);
/*
 * tdist_group_device_memory - 1 if the group's backend takes CUDA device
 * buffers only (NCCL), 0 if it takes host memory (the CPU backend, a
 * plug-in that declares host memory), -1 for NULL. Bindings use it to
 * check a buffer's kind before the call. Thread: any.
 */
int tdist_group_device_memory(const tdist_group_t *group);
/* The group's default op timeout in milliseconds; settable at any time. */
int64_t tdist_group_timeout(const tdist_group_t *group);
int tdist_group_set_timeout(tdist_group_t *group, int64_t timeout_ms);

/*
 * tdist_group_abort - abort the group on demand: its backend stops
 * communicating (NCCL: ncclCommAbort), every pending op fails with
 * TDIST_ERR_ABORTED naming `reason`, later ops fail at once, and the other
 * ranks are told through the store so they abort their copy too: their
 * errors read "rank G (world rank W) aborted the group: aborted on demand:
 * <reason>". No flight-recorder dump on this rank for it (the other ranks
 * write theirs: tdist/debug.h). Idempotent. Returns 0.
 */
int tdist_group_abort(tdist_group_t *group, const char *reason);

/*
 * tdist_group_shrink - after a rank failed, a group of the survivors, so the
 * job can go on without restarting. Called by every surviving rank of
 * `group` (collective over the survivors; the parent may be aborted).
 *
 * Who is dead is decided by the store (one authority, so every survivor
 * gets the same group): a killed process is declared dead as soon as its
 * store connection drops, a silent one after TDIST_HEARTBEAT_TIMEOUT_MS. The
 * call waits, up to the group's timeout, until every rank of `group` has
 * either called it or been declared dead; the first survivor to get there
 * fixes the member list in the store and all survivors use that list.
 * Ranks keep their order: the new rank is the position among the survivors.
 * NCCL: a fresh communicator through the store (ncclCommShrink fails on a
 * communicator NCCL saw a peer die on); CPU: the survivors' existing
 * connections are reused. `group` itself stays aborted: destroy it later.
 * @param opts   name and timeout of the new group, as for tdist_new_group.
 * @return 0; TDIST_ERR_TIMEOUT naming the ranks that neither came nor died;
 *         TDIST_ERR_REMOTE_FAILED if this rank was itself declared dead;
 *         TDIST_ERR_NOT_SUPPORTED for a group without a store.
 */
int tdist_group_shrink(tdist_group_t *group, const tdist_group_opts_t *opts,
                       tdist_group_t **shrunk);

/*
 * tdist_group_store - the key-value store behind the group, for programs that
 * trade their own metadata (shapes, routing tables) next to the group: a
 * prefix view private to this group ("tdist/<group>/user/"), so keys never
 * clash with tdist's own or another group's. The same view on every rank of
 * the group. Borrowed: valid while the group lives; do not release it (take
 * a reference with tdist_store_prefix(view, "", &mine) to keep it longer).
 * Store calls block: not from a completion callback.
 * @return the view, or NULL for NULL, a group without a store (made on a
 *         backend test harness without one), or no memory (tdist_last_error).
 */
tdist_store_t *tdist_group_store(tdist_group_t *group);

/* 1 if the group was aborted (on demand, by a timeout or by a peer). */
int tdist_group_is_aborted(const tdist_group_t *group);

/* A group's abort callback: `status` and `reason` are the abort's (what
 * pending ops fail with; `reason` is valid during the call only). */
typedef void (*tdist_group_abort_cb_t)(tdist_group_t *group, int status, const char *reason,
                                       void *arg);

/*
 * tdist_group_on_abort - have `cb` called once when the group is aborted, for
 * any cause (a peer's failure, a timeout, tdist_group_abort here or on
 * another rank, a destroy that had to abort pending ops). The role of MPI's
 * error handler: a rank busy computing learns of a failure at once, without
 * an op to wait on.
 *
 * Order, for a callback registered before the abort. The progress thread
 * aborts the group in this order:
 *   1. marks it aborted: from here tdist_group_is_aborted() returns 1 and a
 *      new op on the group is refused at submission with the abort's status
 *      (these two may be seen before the callback ran);
 *   2. runs `cb` and waits for it to return;
 *   3. fails the group's pending ops (the op that timed out with
 *      TDIST_ERR_TIMEOUT, the others with the abort's status): only now can
 *      tdist_work_wait/wait_all/wait_any return their failure,
 *      tdist_work_is_completed return 1 for them, or their completion
 *      callbacks run. Ops still queued fail after that too.
 * So a thread that sees an op of the group fail because of the abort finds
 * the callback's effects done (a flag it set, with the usual happens-before:
 * the wait's return acquires what the progress thread released). While `cb`
 * runs, the pending ops are still running: one whose success a waiter had
 * already seen stays a success. Across groups there is no order: the world
 * and a subgroup aborted by the same death run their callbacks in any order.
 *
 * Registered when the group is already aborted (or while the progress thread
 * is aborting it), `cb` runs at once on the calling thread, before this call
 * returns; ops may then have been reported failed before it.
 *
 * Thread: any. `cb` runs on the progress thread (or, as above, on the
 * registering thread). Like a completion callback, on the progress thread it
 * must not block (blocking tdist calls from there fail at once) and must not
 * destroy the group. It never runs after tdist_group_destroy returned: one
 * not yet started by then never starts, one running on another thread has
 * returned (so after a shrink, destroying the old group guarantees its late
 * callback cannot touch state the program resets afterwards).
 * @param cb   the callback (not NULL); @param arg  passed to it.
 * @return 0; TDIST_ERR_INVALID_ARGUMENT for a NULL group or cb;
 *         TDIST_ERR_INVALID_STATE if a callback is already registered.
 */
int tdist_group_on_abort(tdist_group_t *group, tdist_group_abort_cb_t cb, void *arg);

/*
 * tdist_group_destroy - wait up to the group's timeout for its pending work,
 * abort what is left, release the backend (NCCL: finalize then destroy), free
 * the group. Destroying the last group stops the progress thread. Not
 * collective for the CPU backend; NCCL's finalize expects every rank to call
 * it. NULL is ignored. Once it returns, the group's abort callback neither
 * runs nor will run (tdist_group_on_abort).
 * Thread: any caller thread; not from a completion callback or from the
 * group's own abort callback (TDIST_ERR_INVALID_STATE). No other call on
 * the group may be running meanwhile (a synchronous op, or a submission
 * not yet returned): its pending work is what it waits for, and a handle's
 * tdist_work_wait on another thread is waited out.
 * @return 0, or TDIST_ERR_TIMEOUT if work had to be aborted.
 */
int tdist_group_destroy(tdist_group_t *group);

#ifdef __cplusplus
}
#endif
#endif /* TDIST_GROUP_H */
