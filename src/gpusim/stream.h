/*
 * stream.h - internals shared by the CUDA-runtime half of the simulated
 * device: device.c, memory.c, stream.c, event.c, capture.c. Not part of the
 * contract of sim.h; nothing of the NCCL half includes it.
 *
 * Locking: one process-wide mutex, gs_lock, guards every stream, event,
 * capture and graph below (queues, counters, marks, registries). Stream
 * workers never hold it while running an item, and no callback into the
 * NCCL half (instance, run, release) and no host function runs under it.
 * memory.c's own mutex is never held while gs_lock is taken.
 */
#ifndef TDIST_GPUSIM_STREAM_H
#define TDIST_GPUSIM_STREAM_H

#include <stdbool.h>

#include "gpusim/sim.h"

/* Streams a single capture may span (the origin and the ones that joined). */
#define GS_CAP_STREAMS 32
/* cudaStreamWaitEvent's cudaEventWaitExternal (driver_types.h). */
#define GS_EVENT_WAIT_EXTERNAL 0x01

typedef struct gs_capture gs_capture_t;

/* Work a stream runs in its turn, or a node of a graph (the same record, so
 * graph launch copies nodes onto the launch stream). Owned by the queue or
 * graph that holds it. */
typedef enum {
  GS_IT_KERNEL, /* kernel: queued, an instance to run; in a graph, the proto */
  GS_IT_HOST,   /* fn(arg) on the worker (cudaLaunchHostFunc) */
  GS_IT_RECORD, /* completes record number `gen` of ev (holds a ref to ev) */
  GS_IT_WAIT,   /* waits until ws->done >= wseq (holds a ref to ws); in a graph,
                   an external event wait on ev (holds a ref to ev) */
  GS_IT_COPY,   /* memcpy(dst, src, n) through the host views */
  GS_IT_SET,    /* memset(dst, val, n) through the host view */
  GS_IT_FREE    /* cudaFreeAsync(dst) */
} gs_item_kind_t;

typedef struct gs_item {
  struct gs_item *next;
  gs_item_kind_t kind;
  gs_kernel_t *kernel;
  cudaHostFn_t fn;
  void *arg;
  struct CUevent_st *ev;
  uint64_t gen;
  struct CUstream_st *ws;
  uint64_t wseq;
  void *dst;
  const void *src;
  size_t n;
  int val;
} gs_item_t;

/* Where a wait points: an eager fence (stream, items completed) or a
 * position inside an active capture (a vector clock over its streams). An
 * event's last record, or a stream's tail for gs_stream_join. Holds a ref
 * on rs and on cap. */
typedef struct gs_mark {
  struct CUstream_st *rs; /* NULL: nothing to wait for */
  uint64_t rseq;
  gs_capture_t *cap; /* non-NULL: the record was captured */
  uint32_t clock[GS_CAP_STREAMS];
} gs_mark_t;

enum { GS_SK_USER, GS_SK_LEGACY, GS_SK_PERTHREAD };

struct CUstream_st {
  int dev;
  unsigned flags; /* cudaStreamNonBlocking */
  int priority;   /* cudaStreamCreateWithPriority's, clamped; 0 otherwise */
  int kind;       /* GS_SK_* */
  int refs;       /* user handle, worker, fences, marks, capture membership */
  bool dead;      /* destroyed by the user (or its thread exited): drain, exit */
  gs_item_t *head, *tail;
  uint64_t enq, done;       /* items queued / completed, ever */
  pthread_cond_t cv;        /* the worker waits here for work */
  struct CUstream_st *next; /* all streams, gs_streams list */
  gs_capture_t *cap;        /* the capture it belongs to, or NULL */
  int cap_idx;
  uint32_t clock[GS_CAP_STREAMS];
};

struct CUevent_st {
  int dev;
  unsigned flags;
  int refs;          /* user handle, queued records, graph nodes */
  uint64_t gen;      /* records made so far */
  gs_mark_t mark;    /* the last record */
  uint64_t time_gen; /* which record time_ns belongs to (0: none completed) */
  int64_t time_ns;
};

enum { GS_CAP_ACTIVE, GS_CAP_INVALIDATED, GS_CAP_ENDED };

struct gs_capture {
  int refs;              /* active list, marks */
  unsigned long long id; /* unique over the process (cudaStreamGetCaptureInfo) */
  int status;
  int mode;
  pthread_t owner;
  struct CUgraph_st *graph;
  struct CUstream_st *members[GS_CAP_STREAMS]; /* [0] the origin; a ref each */
  int nmembers;
  gs_capture_t *next; /* gs_captures list while not ended */
};

/* A graph's references to a user object (cudaGraphRetainUserObject). */
typedef struct gs_uref {
  struct CUuserObject_st *obj;
  unsigned count;
} gs_uref_t;

struct CUgraph_st {
  int refs; /* user handle, execs */
  gs_item_t *head, *tail;
  gs_uref_t *urefs; /* released when the graph goes (capture.c) */
  int nurefs, capurefs;
};
struct CUgraphExec_st {
  struct CUgraph_st *g;
};

/* ---- stream.c ---- */
extern pthread_mutex_t gs_lock;
extern pthread_cond_t gs_progress; /* broadcast when any item completes */
extern struct CUstream_st *gs_streams;

/* Sorted sets of live handles, checked before any dereference. */
typedef struct {
  void **v;
  size_t n, cap;
} gs_hset_t;
int gs_hset_add(gs_hset_t *h, void *p);
void gs_hset_del(gs_hset_t *h, void *p);
bool gs_hset_has(const gs_hset_t *h, const void *p);
extern gs_hset_t gs_events, gs_graphs, gs_execs;

/* gs_lock held. The stream a handle names (special handles resolved and
 * created for the calling thread's current device), or NULL. */
struct CUstream_st *gs_stream_get_locked(cudaStream_t s);
/* gs_lock held. Queue or capture `it` on st (takes it over on success and
 * on failure). Applies the legacy stream's implicit synchronisation. */
cudaError_t gs_submit_locked(struct CUstream_st *st, gs_item_t *it, int *captured);
void gs_stream_unref_locked(struct CUstream_st *st);
/* Not locked: wait until st has completed everything queued so far. */
void gs_stream_drain(struct CUstream_st *st);
/* Not locked: every stream of `dev` done with what was queued so far. */
void gs_device_drain(int dev);
gs_item_t *gs_item_new(gs_item_kind_t kind);
/* gs_lock held: dispose of a list of items: their event and stream refs
 * are dropped now, their kernels released (and the items freed) by the
 * calling thread's next gs_unlock, outside gs_lock, as the NCCL half's
 * release may take its own locks. */
void gs_defer_locked(gs_item_t *list);
/* Unlock gs_lock, then finish what gs_defer_locked put aside. */
void gs_unlock(void);

/* ---- event.c ---- */
void gs_event_unref_locked(struct CUevent_st *ev);
void gs_mark_clear_locked(gs_mark_t *m);
void gs_mark_copy_locked(gs_mark_t *dst, const gs_mark_t *src);

/* ---- capture.c ---- */
/* 0 when no capture exists in the process (fast path, no lock). */
extern atomic_int gs_capture_count;
/* A "potentially unsafe" call under the thread's capture mode (CUDA Runtime
 * API, cudaThreadExchangeStreamCaptureMode): cudaErrorStreamCaptureUnsupported
 * and the offending captures invalidated, or cudaSuccess. Not locked. */
cudaError_t gs_capture_unsafe(void);
/* gs_lock held. */
void gs_capture_invalidate_locked(gs_capture_t *c);
void gs_capture_unref_locked(gs_capture_t *c);
/* gs_lock held: append to st's capture graph (st->cap active). */
void gs_capture_append_locked(struct CUstream_st *st, gs_item_t *it);
/* gs_lock held: make st wait for mark m (cudaStreamWaitEvent rules for
 * captures: join, merge, isolation). ev: the event for an external wait. */
cudaError_t gs_wait_mark_locked(struct CUstream_st *st, const gs_mark_t *m, unsigned flags,
                                struct CUevent_st *ev);
/* gs_lock held: drop a ref; the last one defers the nodes' disposal. */
void gs_graph_unref_locked(struct CUgraph_st *g);
/* Run fn(arg) with every CUDA call refused (cudaErrorNotPermitted), as on
 * CUDA's own threads: host functions, user object destructors (stream.c). */
void gs_run_no_cuda(cudaHostFn_t fn, void *arg);

/* ---- memory.c ---- */
/* On a worker: run a COPY, SET or FREE item. Returns cudaSuccess or
 * cudaErrorIllegalAddress (the range is no longer live device memory). */
cudaError_t gs_mem_run(const gs_item_t *it);

#endif
