/*
 * nccl_sim.h - the simulated NCCL's private state (shm.c, comm.c,
 * enqueue.c, kernel.c).
 *
 * One communicator rank = one `struct ncclComm` in its process plus one
 * slot in a shared segment (a POSIX shared-memory file named from the
 * communicator's id) that every rank of the communicator maps:
 *
 *   header | slot[0..n) | chunk[rank][2][chunk] | ring[src][dst]
 *
 *   slot     what one rank publishes: joined/left, pid, device, compute
 *            capability, its collective step counter, the descriptor of its
 *            current collective, small bootstrap all-gather buffers (split),
 *            and which peers it has connected to (runtime connection,
 *            NCCL_RUNTIME_CONNECT as NCCL 2.22+ does by default).
 *   chunk    the staging buffers of collectives: every collective runs as
 *            rounds; in round s each rank copies a chunk of its input into
 *            its chunk[s & 1], raises its step to s, waits until every rank
 *            reached s, then computes its own output from all ranks' chunks.
 *            Double buffering by step parity is safe: a rank writes buffer
 *            s & 1 only after every rank arrived at s - 1, that is after
 *            every rank finished reading round s - 2.
 *   ring     one single-producer single-consumer byte ring per ordered pair
 *            (src -> dst) for ncclSend/ncclRecv: each message is an 8-byte
 *            length and the payload, in the order the sends were issued, as
 *            NCCL matches sends and receives between a pair in order.
 *
 * Waiting: every change anyone may wait for bumps the header's futex word
 * and wakes its waiters (shared futex: the segment is MAP_SHARED). Waits are
 * bounded (GS_POLL_MS) so they can notice an abort or a dead peer.
 *
 * Liveness: each rank holds an open-file-description lock (F_OFD_SETLK) on
 * byte `rank` of the segment file from join to leave. The kernel drops it
 * when the process dies, even while it is an unreaped zombie, so a peer
 * tests for death with F_OFD_GETLK (NCCL's network transports see the same
 * event as a closed socket and report ncclRemoteError).
 */
#ifndef TDIST_GPUSIM_NCCL_SIM_H
#define TDIST_GPUSIM_NCCL_SIM_H

#include "gpusim/sim.h"

#define GS_MAX_RANKS 64
#define GS_BOOT_BYTES 64 /* one rank's part of a bootstrap all-gather */
#define GS_POLL_MS 5     /* longest sleep of a wait before it rechecks abort and peers */
#define GS_MAX_PREMUL 64 /* live PreMulSum ops per communicator */
#define GS_ID_MAGIC "TDGPUSIM"
/* Collectives of more bytes (count times the type's size) need a second
 * algorithm, connected at its first use at 3 ranks and more (enqueue.c). */
#define GS_ALGO_BYTES (64u * 1024u)
/* Kernels of one communicator launched and not finished that its work FIFO
 * holds (enqueue.c fifo_room): the next launch waits for one to finish. */
#define GS_WORK_FIFO_KERNELS 1024

enum { GS_SLOT_FREE = 0, GS_SLOT_JOINED = 1, GS_SLOT_LEFT = 2 };

/* A collective as one rank describes it (exchanged to catch disagreement). */
typedef struct gs_desc {
  uint64_t seq;     /* the communicator's collective number */
  int32_t func;     /* gs_func_t */
  int32_t dtype;    /* ncclDataType_t */
  uint64_t count;   /* the API's count argument */
  int32_t redkind;  /* gs_redkind_t, -1 without reduction */
  int32_t root;     /* -1 when not rooted */
  uint64_t publish; /* bytes of input this rank stages (0 off the root of bcast/scatter) */
} gs_desc_t;

typedef struct gs_slot {
  _Atomic int32_t state; /* GS_SLOT_* */
  int32_t pid;
  int32_t dev;
  int32_t cc;               /* compute capability, 90 for sm_90 */
  _Atomic uint64_t step;    /* collective rounds this rank has staged (see above) */
  _Atomic uint64_t bootseq; /* bootstrap all-gathers this rank has published */
  _Atomic uint32_t coll_connected;
  /* The first collective above GS_ALGO_BYTES connected (a second algorithm's
   * runtime connection: see enqueue.c). */
  _Atomic uint32_t coll_big_connected;
  /* The rank's host hash (misc/utils.cc getHostHash: NCCL_HOSTID, else the
   * host name and boot id): ranks with equal hashes share a node. */
  uint64_t host_hash;
  gs_desc_t desc[2]; /* by step parity */
  unsigned char boot[2][GS_BOOT_BYTES];
  _Atomic uint8_t peer_connected[GS_MAX_RANKS]; /* p2p connection to each peer */
  /* What this rank passed to its init: the number of unique ids and a
   * digest of them all (ncclCommInitRankScalable; 1 id for the others).
   * Written before the slot is claimed. */
  uint32_t nids;
  uint64_t ids_digest;
} __attribute__((aligned(64))) gs_slot_t;

typedef struct gs_seg_hdr {
  /* 0, then GS_SEG_BUSY while the first rank lays it out, then GS_SEG_READY */
  _Atomic uint32_t magic;
  _Atomic uint32_t futex; /* bumped on every change a waiter may wait for */
  uint32_t nranks;
  uint32_t pad_;
  uint64_t chunk, ring; /* bytes of one chunk buffer, of one ring's data */
  uint64_t off_slots, off_chunks, off_rings, ring_stride, size;
} gs_seg_hdr_t;

typedef struct gs_ring {
  _Atomic uint64_t head; /* bytes produced (sender) */
  char pad0_[56];
  _Atomic uint64_t tail; /* bytes consumed (receiver) */
  char pad1_[56];
  /* data[ring] follows */
} gs_ring_t;

/* This process's mapping of a segment. */
typedef struct gs_seg {
  int fd;
  char name[64];
  unsigned char *base;
  gs_seg_hdr_t *hdr;
  size_t size;
} gs_seg_t;

/* ---- shm.c ------------------------------------------------------------------------ */
/* Caller or job thread: open (creating if needed) and map the segment named
 * from `key` for `nranks` ranks. ncclSystemError with a WARN on failure;
 * ncclInvalidUsage when it exists for another rank count. */
ncclResult_t gs_seg_attach(gs_seg_t *seg, const unsigned char key[16], int nranks);
void gs_seg_detach(gs_seg_t *seg); /* unmap and close (drops the liveness lock) */
void gs_seg_unlink(gs_seg_t *seg); /* remove the name (every rank has it open) */
gs_slot_t *gs_slot(const gs_seg_t *seg, int rank);
unsigned char *gs_chunk(const gs_seg_t *seg, int rank, int parity);
gs_ring_t *gs_ring(const gs_seg_t *seg, int src, int dst);
static inline unsigned char *gs_ring_data(gs_ring_t *r) { return (unsigned char *)(r + 1); }
/* Take (liveness lock) the slot of `rank`: ncclInvalidUsage if another live
 * process holds it (a duplicate rank). */
ncclResult_t gs_slot_claim(gs_seg_t *seg, int rank, int dev, int cc);
/* 1 when `rank` left the communicator or its process is gone. */
int gs_peer_gone(const gs_seg_t *seg, int rank);
/* This process's host hash, as NCCL's getHostHash (misc/utils.cc): the
 * hash of NCCL_HOSTID when set, else of the host name followed by
 * /proc/sys/kernel/random/boot_id. Computed once. Any thread. */
uint64_t gs_host_hash(void);
/* 1 when `rank` (joined) runs on another host than this process: NCCL then
 * reaches it through a network transport, which has a proxy (net.cc);
 * ranks of one host use P2P or SHM, which have none (p2p.cc, shm.cc). */
int gs_peer_remote(const gs_seg_t *seg, int rank);
/* Wake every waiter of the segment (any process). */
void gs_seg_wake(gs_seg_t *seg);
/* Sleep until the futex word differs from `seen`, at most GS_POLL_MS. */
void gs_seg_sleep(gs_seg_t *seg, uint32_t seen);
static inline uint32_t gs_seg_word(gs_seg_t *seg) {
  return atomic_load_explicit(&seg->hdr->futex, memory_order_acquire);
}

/* ---- the communicator (comm.c) ----------------------------------------------------- */
struct gs_plan;

typedef struct gs_premul {
  int used;
  ncclDataType_t dt;
  ncclScalarResidence_t residence;
  unsigned char host[8];  /* the scalar, copied at creation (host residence) */
  const void *dev_scalar; /* read by the kernel (device residence) */
} gs_premul_t;

/* The communicator's configuration as parseCommConfig (init.cc, 2.28.9)
 * leaves it: defaults applied, ranges checked (comm.c gs_config_parse). */
typedef struct gs_config {
  int cgaClusterSize, minCTAs, maxCTAs, splitShare, trafficClass;
  char netName[64]; /* "" for NULL (NCCL picks the network) */
} gs_config_t;

/* User buffer registrations of a communicator (register.c). */
typedef struct gs_reg gs_reg_t;

struct ncclComm {
  uint32_t magic; /* GS_COMM_MAGIC while registered (NCCL's CommCheck) */
  pthread_mutex_t mu;
  pthread_cond_t cv; /* (mu) kernels finished, job ended */
  int refs;          /* (mu) the API's reference + kernels and graphs holding it */

  /* Fixed once the communicator exists. */
  unsigned char key[16]; /* names its segment and seeds its children's */
  int rank, nranks, dev;
  int blocking;
  char name[64];
  gs_seg_t seg; /* mapped by the init job; valid once `ready` */

  int ready;              /* (mu) init finished: seg, min_cc valid */
  int min_cc;             /* smallest compute capability among ranks (comm->minCompCap) */
  _Atomic int async_err;  /* ncclResult_t: comm->asyncResult, stored by jobs and failures */
  _Atomic int proxy_err;  /* the proxy's own state (ncclRemoteError): stays for good */
  _Atomic int abort_flag; /* kernels and jobs poll it (comm->abortFlag) */
  atomic_int in_call;     /* API calls inside the communicator now */
  int revoked, finalized, destroyed; /* (mu) */
  /* comm->groupJob (group.cc): set when a non-blocking group launches on
   * this communicator, cleared only by ncclCommGetAsyncError once it reads
   * ncclSuccess. group_job_freed: ncclCommRevoke's ncclCommEnsureReady
   * (abort flag set) ran ncclGroupJobAbort, which frees the job but leaves
   * comm->groupJob pointing at it. (mu) */
  int group_job, group_job_freed;

  /* Jobs (non-blocking mode, NCCL's ncclAsyncJob threads). */
  pthread_t job;
  int job_running; /* (mu) a job thread exists and is not joined */

  /* Kernels: serialised per communicator in launch order (NCCL orders a
   * communicator's kernels across streams). */
  uint64_t next_seq; /* (mu) seq of the next kernel instance */
  uint64_t done_seq; /* (mu) highest seq finished */
  int inflight;      /* (mu) instances launched and not finished */
  uint64_t coll_seq; /* (kernel, serialised) collectives run so far */

  int children;                  /* (mu) splits and shrinks so far: derive children's keys */
  ncclComm_t init_parent;        /* (init job) a split/shrink parent whose abort stops this init */
  atomic_int coll_connected;     /* runtime connection made for collectives */
  atomic_int coll_big_connected; /* ... and for collectives above GS_ALGO_BYTES */
  _Atomic unsigned char *p2p_connected; /* per peer */

  gs_premul_t premul[GS_MAX_PREMUL]; /* (mu) */

  /* Scalable init, NCCL's configuration, registrations (comm.c, register.c). */
  uint32_t nids;       /* unique ids the init was given */
  uint64_t ids_digest; /* their digest, checked against every rank's */
  gs_config_t cfg;     /* fixed once created */
  gs_reg_t *regs;      /* (mu) live ncclCommRegister / window registrations */
  int last_prio;       /* (mu) priority of the stream of the last launch */
};

#define GS_COMM_MAGIC 0x6e63636cu

/* NCCL's ncclGetLastError text (one buffer per process, as NCCL's). */
void gs_set_last_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* WARN + last error, returning r. */
ncclResult_t gs_fail(ncclResult_t r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Is `c` a live communicator of this process (CommCheck)? */
int gs_comm_valid(ncclComm_t c);
void gs_comm_retain(ncclComm_t c);
/* gs_comm_valid and gs_comm_retain in one step (0: not a live communicator):
 * a call that may still be inside the communicator when another thread
 * aborts it (NCCL allows ncclCommAbort from any thread) keeps it mapped. */
int gs_comm_acquire(ncclComm_t c);
void gs_comm_release(ncclComm_t c);
/* ncclCommSetAsyncError (init.cc) simply stores the state: an error stays
 * until a job ending later stores its own result. */
void gs_comm_set_async(ncclComm_t c, ncclResult_t r);
/* ncclCommGetAsyncError: comm->asyncResult, or when that is success the
 * proxy's state (a peer's closed connection is ncclRemoteError there). */
ncclResult_t gs_comm_get_async(ncclComm_t c);
void gs_comm_set_proxy_error(ncclComm_t c, ncclResult_t r);
/* ncclCommGetAsyncError itself (init.cc): gs_comm_get_async, and when that
 * is ncclSuccess the group job linked to the communicator is completed and
 * unlinked -- a write, and a use after free when revoke freed it (counted:
 * tdist_gpusim_use_after_free). What ncclCommEnsureReady and the end of
 * ncclEnqueueCheck call. Caller thread. */
ncclResult_t gs_comm_async_error(ncclComm_t c);
/* group.cc: a non-blocking group job was launched on c (comm->groupJob). */
void gs_comm_link_group_job(ncclComm_t c);
extern atomic_long gs_use_after_free;
/* ncclCommEnsureReady (init.cc): ncclInvalidArgument while in progress,
 * else the async error (success included). */
ncclResult_t gs_comm_ensure_ready(ncclComm_t c);
/* API entry/exit on a communicator: counts concurrent callers. */
void gs_comm_enter(ncclComm_t c);
void gs_comm_leave(ncclComm_t c);
/* Run fn(c, arg) as the communicator's job: on a new thread with the
 * communicator ncclInProgress (non-blocking), or inline (blocking). The
 * job's result becomes the async error; returns what the API returns. */
typedef ncclResult_t (*gs_job_fn)(ncclComm_t c, void *arg);
ncclResult_t gs_comm_job(ncclComm_t c, gs_job_fn fn, void *arg);
/* Wake the waiters of c's segment (an abort), once it is mapped. */
void gs_comm_wake(ncclComm_t c);
/* Wait until every kernel launched on c has finished (NCCL's strong stream
 * synchronisation in revoke, shrink with abort, finalize). */
void gs_comm_drain(ncclComm_t c);
/* A new communicator for segment `key` (registered; blocking unless cfg
 * says otherwise, or `blocking_default` when cfg leaves it undefined). */
ncclResult_t gs_comm_create(ncclComm_t *out, const unsigned char key[16], int rank, int nranks,
                            int dev, const ncclConfig_t *cfg, int blocking_default,
                            const char *name, int run_init);
/* The init job: join the segment and wait for every rank. */
ncclResult_t gs_comm_init_job(ncclComm_t c, void *arg);
/* parseCommConfig (init.cc): `cfg` (NULL: NCCL's defaults) checked and
 * completed into *out; ncclInvalidArgument with NCCL's WARN text. */
ncclResult_t gs_config_parse(const ncclConfig_t *cfg, gs_config_t *out);
/* register.c: forget a communicator's registrations (destroy, abort). */
void gs_reg_free_all(ncclComm_t c);
/* register.c: live registrations (windows != 0: windows), references counted. */
long gs_reg_count(ncclComm_t c, int windows);
/* Throw away a communicator the user never received (failed split). */
void gs_comm_discard(ncclComm_t c);
/* Bootstrap all-gather of GS_BOOT_BYTES per rank over the parent (split). */
ncclResult_t gs_comm_allgather(ncclComm_t c, const void *mine, void *all);

/* ---- enqueue.c / kernel.c ------------------------------------------------------------ */
typedef enum {
  GS_ALLREDUCE,
  GS_BROADCAST,
  GS_REDUCE,
  GS_ALLGATHER,
  GS_REDUCESCATTER,
  GS_ALLTOALL,
  GS_GATHER,
  GS_SCATTER,
  GS_SEND,
  GS_RECV
} gs_func_t;

/* One operation of a plan (after the argument checks). */
typedef struct gs_task {
  gs_func_t func;
  const void *send;
  void *recv;
  size_t count;
  ncclDataType_t dt;
  int has_red;
  gs_redop_t red;         /* reduction, PreMulSum host scalar resolved */
  const void *dev_scalar; /* PreMulSum with a device scalar: read at run time */
  int root;               /* root, or peer for send/recv */
  cudaStream_t stream;
} gs_task_t;

/* The kernel of one communicator in one group: its collectives in order,
 * then its sends and receives progressed together. */
gs_kernel_t *gs_kernel_new(ncclComm_t c, const gs_task_t *tasks, int ntasks);

#endif
