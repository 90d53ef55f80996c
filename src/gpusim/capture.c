/*
 * capture.c - stream capture and graphs.
 *
 * A capture (gs_capture_t, stream.h) begins on an origin stream; other
 * streams join it by waiting on an event recorded in it and leave it at
 * cudaStreamEndCapture. Items enqueued on a capturing stream are appended
 * to the capture's graph: the simulation linearises the capture into the
 * order the items were recorded, so a graph is one ordered list that
 * cudaGraphLaunch replays on its launch stream. Which streams' work the
 * origin has joined back is tracked with vector clocks: each member stream
 * counts its own nodes and knows, per member, how many nodes it depends on;
 * an event record copies the recording stream's clock and a wait merges it.
 *
 * The capture mode rules for "potentially unsafe" calls are the ones of
 * CUDA Runtime API, cudaThreadExchangeStreamCaptureMode. All state is
 * under gs_lock; gs_capture_count lets calls skip the lock when no capture
 * exists.
 *
 * User objects (CUDA Programming Guide, Graph Memory Nodes / "User Objects";
 * Runtime API cudaUserObjectCreate, cudaUserObjectRelease,
 * cudaGraphRetainUserObject): a reference count with a destructor. A graph
 * owns the references it was given until it is freed (the last of the
 * graph handle and its executable graphs); references a graph launch would
 * release are held until the launch has finished executing. The destructor
 * runs when the count reaches zero, on a thread of the simulation (never
 * the releasing caller's), and may not call CUDA: every call there is
 * cudaErrorNotPermitted, as in a host function.
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "gpusim/sim.h"
#include "gpusim/stream.h"

atomic_int gs_capture_count;
static gs_capture_t *g_captures;         /* not yet ended */
static unsigned long long g_capture_ids; /* (gs_lock) the last capture id given */

struct CUuserObject_st {
  void *ptr;
  cudaHostFn_t fn;
  long refs; /* (gs_lock) */
};
static gs_hset_t g_uobjs; /* (gs_lock) live user objects */
static _Thread_local int tl_mode = cudaStreamCaptureModeGlobal;

void gs_capture_invalidate_locked(gs_capture_t *c) {
  if (c->status == GS_CAP_ACTIVE) {
    c->status = GS_CAP_INVALIDATED;
    gs_warn("stream capture invalidated");
  }
}

void gs_capture_unref_locked(gs_capture_t *c) {
  if (--c->refs == 0) free(c);
}

void gs_capture_append_locked(struct CUstream_st *st, gs_item_t *it) {
  struct CUgraph_st *g = st->cap->graph;
  it->next = NULL;
  if (g->tail)
    g->tail->next = it;
  else
    g->head = it;
  g->tail = it;
  st->clock[st->cap_idx]++;
}

/* CUDA Runtime API, cudaThreadExchangeStreamCaptureMode: a thread in
 * Global mode may not make potentially unsafe calls while it has a
 * non-Relaxed capture of its own or any other thread has a Global one; in
 * ThreadLocal mode only its own captures count; Relaxed is never
 * prohibited. CUDA Programming Guide, Stream Capture / Invalidation: the
 * attempt invalidates the capture. */
cudaError_t gs_capture_unsafe(void) {
  if (atomic_load(&gs_capture_count) == 0 || tl_mode == cudaStreamCaptureModeRelaxed)
    return cudaSuccess;
  bool bad = false;
  pthread_t self = pthread_self();
  pthread_mutex_lock(&gs_lock);
  for (gs_capture_t *c = g_captures; c; c = c->next) {
    bool mine = pthread_equal(c->owner, self);
    bool hit =
        (mine && c->mode != cudaStreamCaptureModeRelaxed) ||
        (!mine && tl_mode == cudaStreamCaptureModeGlobal && c->mode == cudaStreamCaptureModeGlobal);
    if (hit) {
      gs_capture_invalidate_locked(c);
      bad = true;
    }
  }
  pthread_mutex_unlock(&gs_lock);
  return bad ? cudaErrorStreamCaptureUnsupported : cudaSuccess;
}

/* gs_lock held: every member leaves the capture; the graph goes to *graph
 * (or is disposed of when graph is NULL). */
static void capture_end_locked(gs_capture_t *c, struct CUgraph_st **graph) {
  for (int i = 0; i < c->nmembers; i++) {
    c->members[i]->cap = NULL;
    gs_stream_unref_locked(c->members[i]);
  }
  c->status = GS_CAP_ENDED;
  gs_capture_t **pp = &g_captures;
  while (*pp != c)
    pp = &(*pp)->next;
  *pp = c->next;
  atomic_fetch_sub(&gs_capture_count, 1);
  if (graph)
    *graph = c->graph;
  else
    gs_graph_unref_locked(c->graph);
  c->graph = NULL;
  gs_capture_unref_locked(c);
}

cudaError_t gs_wait_mark_locked(struct CUstream_st *st, const gs_mark_t *m, unsigned flags,
                                struct CUevent_st *ev) {
  if (flags & GS_EVENT_WAIT_EXTERNAL) {
    /* CUDA Runtime API, cudaStreamWaitEvent: cudaEventWaitExternal puts an
     * external event wait node in the graph; invalid outside capture. */
    if (!st->cap || !ev) return cudaErrorInvalidValue;
    if (st->cap->status != GS_CAP_ACTIVE) return cudaErrorStreamCaptureInvalidated;
    gs_item_t *it = gs_item_new(GS_IT_WAIT);
    if (!it) return cudaErrorMemoryAllocation;
    it->ev = ev;
    ev->refs++;
    gs_capture_append_locked(st, it);
    return cudaSuccess;
  }
  gs_capture_t *c = m->cap;
  if (c) {
    /* CUDA Programming Guide, Stream Capture / Cross-stream Dependencies and
     * Events: waiting on an event recorded in a capture joins the waiting
     * stream to that capture; waiting from another capture would merge two
     * (invalid); the legacy stream cannot capture. */
    if (c->status == GS_CAP_ENDED) return cudaErrorCapturedEvent;
    if (st->cap == c) {
      if (c->status != GS_CAP_ACTIVE) return cudaErrorStreamCaptureInvalidated;
      for (int i = 0; i < GS_CAP_STREAMS; i++)
        if (m->clock[i] > st->clock[i]) st->clock[i] = m->clock[i];
      return cudaSuccess;
    }
    if (st->cap) {
      gs_capture_invalidate_locked(st->cap);
      gs_capture_invalidate_locked(c);
      return cudaErrorStreamCaptureMerge;
    }
    if (st->kind == GS_SK_LEGACY) {
      gs_capture_invalidate_locked(c);
      return cudaErrorStreamCaptureImplicit;
    }
    if (c->status != GS_CAP_ACTIVE) return cudaErrorStreamCaptureInvalidated;
    if (c->nmembers == GS_CAP_STREAMS) {
      gs_warn("stream capture: more than %d streams are not simulated", GS_CAP_STREAMS);
      gs_capture_invalidate_locked(c);
      return cudaErrorStreamCaptureUnsupported;
    }
    st->cap = c;
    st->cap_idx = c->nmembers;
    c->members[c->nmembers++] = st;
    st->refs++;
    memcpy(st->clock, m->clock, sizeof(st->clock));
    return cudaSuccess;
  }
  if (st->cap) {
    /* CUDA Programming Guide, Stream Capture / Prohibited and Unhandled
     * Operations: waiting on a non-captured event from a capturing stream
     * without cudaEventWaitExternal is invalid; only in-stream order may
     * cross the capture's boundary. Never recorded: an empty set of work. */
    if (!m->rs) return cudaSuccess;
    gs_capture_invalidate_locked(st->cap);
    return cudaErrorStreamCaptureIsolation;
  }
  if (!m->rs || m->rs == st) return cudaSuccess; /* in-stream order already */
  gs_item_t *it = gs_item_new(GS_IT_WAIT);
  if (!it) return cudaErrorMemoryAllocation;
  it->ws = m->rs;
  it->wseq = m->rseq;
  m->rs->refs++;
  int captured;
  return gs_submit_locked(st, it, &captured);
}

/* CUDA Runtime API, cudaStreamBeginCapture: not on the legacy stream
 * (cudaErrorStreamCaptureUnsupported); a stream already capturing gives
 * cudaErrorIllegalState. */
GS_API cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode) {
  cudaError_t e = gs_context_current();
  if (e != cudaSuccess) return gs_err(e);
  if ((unsigned)mode > cudaStreamCaptureModeRelaxed) return gs_err(cudaErrorInvalidValue);
  if (s == NULL || s == cudaStreamLegacy) return gs_err(cudaErrorStreamCaptureUnsupported);
  gs_capture_t *c = calloc(1, sizeof(*c));
  struct CUgraph_st *g = calloc(1, sizeof(*g));
  pthread_mutex_lock(&gs_lock);
  struct CUstream_st *st = gs_stream_get_locked(s);
  if (!c || !g)
    e = cudaErrorMemoryAllocation;
  else if (!st)
    e = cudaErrorInvalidResourceHandle;
  else if ((e = gs_sticky(st->dev)) != cudaSuccess)
    (void)0;
  else if (st->cap)
    e = cudaErrorIllegalState;
  if (e == cudaSuccess) {
    g->refs = 1;
    c->refs = 1; /* the capture list's, dropped at the end */
    c->id = ++g_capture_ids;
    c->status = GS_CAP_ACTIVE;
    c->mode = mode;
    c->owner = pthread_self();
    c->graph = g;
    c->members[0] = st;
    c->nmembers = 1;
    st->refs++;
    st->cap = c;
    st->cap_idx = 0;
    memset(st->clock, 0, sizeof(st->clock));
    c->next = g_captures;
    g_captures = c;
    atomic_fetch_add(&gs_capture_count, 1);
  }
  pthread_mutex_unlock(&gs_lock);
  if (e != cudaSuccess) {
    free(c);
    free(g);
  }
  return gs_err(e);
}

/* CUDA Runtime API, cudaStreamEndCapture: only on the origin stream
 * (cudaErrorStreamCaptureUnmatched), from the capturing thread unless the
 * capture is Relaxed (cudaErrorStreamCaptureWrongThread); an invalidated
 * capture gives cudaErrorStreamCaptureInvalidated and no graph; a joined
 * stream whose work the origin never waited for gives
 * cudaErrorStreamCaptureUnjoined (CUDA Programming Guide, Stream Capture /
 * Cross-stream Dependencies: all streams must be rejoined to the origin). */
GS_API cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph) {
  cudaError_t e = gs_context_current();
  if (e != cudaSuccess) return gs_err(e);
  if (!graph) return gs_err(cudaErrorInvalidValue);
  *graph = NULL;
  pthread_mutex_lock(&gs_lock);
  struct CUstream_st *st = gs_stream_get_locked(s);
  gs_capture_t *c = st ? st->cap : NULL;
  if (!st) {
    e = cudaErrorInvalidResourceHandle;
  } else if (!c) {
    e = cudaErrorIllegalState;
  } else if (c->members[0] != st) {
    gs_capture_invalidate_locked(c);
    e = cudaErrorStreamCaptureUnmatched;
  } else if (c->mode != cudaStreamCaptureModeRelaxed && !pthread_equal(c->owner, pthread_self())) {
    e = cudaErrorStreamCaptureWrongThread;
  } else if (c->status != GS_CAP_ACTIVE) {
    e = cudaErrorStreamCaptureInvalidated;
    capture_end_locked(c, NULL);
  } else {
    for (int i = 1; i < c->nmembers; i++)
      if (st->clock[i] < c->members[i]->clock[i]) e = cudaErrorStreamCaptureUnjoined;
    struct CUgraph_st *g = NULL;
    capture_end_locked(c, e == cudaSuccess ? &g : NULL);
    if (g && gs_hset_add(&gs_graphs, g) != 0) {
      gs_graph_unref_locked(g);
      e = cudaErrorMemoryAllocation;
      g = NULL;
    }
    *graph = g;
  }
  gs_unlock();
  return gs_err(e);
}

/* The legacy stream never captures itself, but while a blocking stream of
 * its device captures, asking about it is cudaErrorStreamCaptureImplicit
 * (Runtime API, cudaStreamIsCapturing). gs_lock held. */
static cudaError_t legacy_capture_check(const struct CUstream_st *st) {
  for (struct CUstream_st *b = gs_streams; b; b = b->next)
    if (b->dev == st->dev && b->cap && !(b->flags & cudaStreamNonBlocking))
      return cudaErrorStreamCaptureImplicit;
  return cudaSuccess;
}

/* CUDA Runtime API, cudaStreamIsCapturing: on the legacy stream while a
 * blocking stream of the device captures, cudaErrorStreamCaptureImplicit. */
GS_API cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *status) {
  cudaError_t e = gs_context_current();
  if (e != cudaSuccess) return gs_err(e);
  if (!status) return gs_err(cudaErrorInvalidValue);
  pthread_mutex_lock(&gs_lock);
  struct CUstream_st *st = gs_stream_get_locked(s);
  if (!st) {
    e = cudaErrorInvalidResourceHandle;
  } else if (st->kind == GS_SK_LEGACY) {
    *status = cudaStreamCaptureStatusNone;
    e = legacy_capture_check(st);
  } else {
    *status = !st->cap                           ? cudaStreamCaptureStatusNone
              : st->cap->status == GS_CAP_ACTIVE ? cudaStreamCaptureStatusActive
                                                 : cudaStreamCaptureStatusInvalidated;
  }
  pthread_mutex_unlock(&gs_lock);
  return gs_err(e);
}

/* CUDA Runtime API, cudaThreadExchangeStreamCaptureMode: sets the calling
 * thread's mode and returns the previous one in *mode. */
GS_API cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *mode) {
  if (!mode || (unsigned)*mode > cudaStreamCaptureModeRelaxed) return gs_err(cudaErrorInvalidValue);
  int old = tl_mode;
  tl_mode = *mode;
  *mode = (enum cudaStreamCaptureMode)old;
  return cudaSuccess;
}

/* ---- user objects ----------------------------------------------------------------- */

static void *destructor_main(void *arg) {
  struct CUuserObject_st *o = arg;
  gs_run_no_cuda(o->fn, o->ptr);
  free(o);
  return NULL;
}

/* gs_lock held: drop n references; at zero the destructor runs on a thread
 * of its own (CUDA runs it on an internal thread, asynchronously: with
 * cudaUserObjectNoDestructorSync nothing may wait for it). */
static void uobj_unref_locked(struct CUuserObject_st *o, unsigned n) {
  o->refs -= (long)n;
  if (o->refs > 0) return;
  if (o->refs < 0) gs_warn("user object %p: more references released than owned", (void *)o);
  gs_hset_del(&g_uobjs, o);
  pthread_attr_t at;
  pthread_t t;
  pthread_attr_init(&at);
  pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
  int rc = pthread_create(&t, &at, destructor_main, o);
  pthread_attr_destroy(&at);
  if (rc != 0) {
    gs_warn("no thread for a user object's destructor: run on the releasing thread");
    destructor_main(o);
  }
}

static void urefs_release_locked(gs_uref_t *u, int n) {
  for (int i = 0; i < n; i++)
    uobj_unref_locked(u[i].obj, u[i].count);
}

/* A launch's hold on its graph's user objects, released by a host item
 * queued after the launch's nodes (it runs once they have run). */
typedef struct {
  int n;
  gs_uref_t u[];
} launch_hold_t;

static void launch_hold_release(void *arg) {
  launch_hold_t *h = arg;
  pthread_mutex_lock(&gs_lock);
  urefs_release_locked(h->u, h->n);
  pthread_mutex_unlock(&gs_lock);
  free(h);
}

/* CUDA Runtime API, cudaUserObjectCreate: flags must be
 * cudaUserObjectNoDestructorSync (the only one defined, and required); the
 * initial references (nonzero) belong to the caller; a destructor is
 * required. */
GS_API cudaError_t cudaUserObjectCreate(cudaUserObject_t *obj, void *ptr, cudaHostFn_t destroy,
                                        unsigned int refs, unsigned int flags) {
  cudaError_t e = gs_context_current();
  if (e != cudaSuccess) return gs_err(e);
  if (!obj || !destroy || refs == 0 || refs > INT_MAX || flags != cudaUserObjectNoDestructorSync)
    return gs_err(cudaErrorInvalidValue);
  struct CUuserObject_st *o = calloc(1, sizeof(*o));
  if (!o) return gs_err(cudaErrorMemoryAllocation);
  o->ptr = ptr;
  o->fn = destroy;
  o->refs = refs;
  pthread_mutex_lock(&gs_lock);
  if (gs_hset_add(&g_uobjs, o) != 0) e = cudaErrorMemoryAllocation;
  pthread_mutex_unlock(&gs_lock);
  if (e != cudaSuccess) {
    free(o);
    return gs_err(e);
  }
  *obj = o;
  return cudaSuccess;
}

/* CUDA Runtime API, cudaUserObjectRetain: count nonzero, at most INT_MAX. */
GS_API cudaError_t cudaUserObjectRetain(cudaUserObject_t obj, unsigned int count) {
  cudaError_t e = gs_context_current();
  if (e != cudaSuccess) return gs_err(e);
  if (count == 0 || count > INT_MAX) return gs_err(cudaErrorInvalidValue);
  pthread_mutex_lock(&gs_lock);
  if (!gs_hset_has(&g_uobjs, obj))
    e = cudaErrorInvalidResourceHandle;
  else
    obj->refs += count;
  pthread_mutex_unlock(&gs_lock);
  return gs_err(e);
}

/* CUDA Runtime API, cudaUserObjectRelease: releases references the caller
 * owns; the destructor runs when the count reaches zero (releasing more
 * than owned is undefined: the simulation warns). */
GS_API cudaError_t cudaUserObjectRelease(cudaUserObject_t obj, unsigned int count) {
  cudaError_t e = gs_context_current();
  if (e != cudaSuccess) return gs_err(e);
  if (count == 0 || count > INT_MAX) return gs_err(cudaErrorInvalidValue);
  pthread_mutex_lock(&gs_lock);
  if (!gs_hset_has(&g_uobjs, obj))
    e = cudaErrorInvalidResourceHandle;
  else
    uobj_unref_locked(obj, count);
  pthread_mutex_unlock(&gs_lock);
  return gs_err(e);
}

/* gs_lock held: a graph a handle may name: one returned by
 * cudaStreamEndCapture, or the graph of a capture in progress
 * (cudaStreamGetCaptureInfo's graph_out: "All operations other than destroy
 * and node removal are permitted on the graph while the capture sequence is
 * in progress"). */
static int graph_live_locked(struct CUgraph_st *g) {
  if (gs_hset_has(&gs_graphs, g)) return 1;
  for (gs_capture_t *c = g_captures; c; c = c->next)
    if (c->graph == g && c->status == GS_CAP_ACTIVE) return 1;
  return 0;
}

/* CUDA Runtime API, cudaGraphRetainUserObject: count nonzero and at most
 * INT_MAX; flags 0 (new references) or cudaGraphUserObjectMove (the
 * caller's references move to the graph). */
GS_API cudaError_t cudaGraphRetainUserObject(cudaGraph_t graph, cudaUserObject_t obj,
                                             unsigned int count, unsigned int flags) {
  cudaError_t e = gs_context_current();
  if (e != cudaSuccess) return gs_err(e);
  if (count == 0 || count > INT_MAX || (flags & ~(unsigned)cudaGraphUserObjectMove))
    return gs_err(cudaErrorInvalidValue);
  pthread_mutex_lock(&gs_lock);
  if (!graph_live_locked(graph) || !gs_hset_has(&g_uobjs, obj)) {
    e = cudaErrorInvalidResourceHandle;
  } else if (graph->nurefs == graph->capurefs) {
    int cap = graph->capurefs ? graph->capurefs * 2 : 4;
    gs_uref_t *u = realloc(graph->urefs, sizeof(*u) * (size_t)cap);
    if (!u) {
      e = cudaErrorMemoryAllocation;
    } else {
      graph->urefs = u;
      graph->capurefs = cap;
    }
  }
  if (e == cudaSuccess) {
    graph->urefs[graph->nurefs++] = (gs_uref_t){obj, count};
    if (!(flags & cudaGraphUserObjectMove)) obj->refs += count;
  }
  pthread_mutex_unlock(&gs_lock);
  return gs_err(e);
}

/* CUDA Runtime API, cudaStreamGetCaptureInfo (CUDA 12's signature): the
 * status; while capturing, the capture's id (unique in the process) and its
 * graph (NULL once the capture is invalidated: "the graph handle may be
 * invalidated before end of capture"). The dependency set is not simulated
 * (the simulation linearises captures): asking for it is refused with a
 * warning rather than answered wrongly. */
GS_API cudaError_t cudaStreamGetCaptureInfo(cudaStream_t s, enum cudaStreamCaptureStatus *status,
                                            unsigned long long *id, cudaGraph_t *graph,
                                            const cudaGraphNode_t **deps, size_t *ndeps) {
  cudaError_t e = gs_context_current();
  if (e != cudaSuccess) return gs_err(e);
  if (!status) return gs_err(cudaErrorInvalidValue);
  if (deps || ndeps) {
    gs_warn("cudaStreamGetCaptureInfo: the dependency set is not simulated");
    return gs_err(cudaErrorInvalidValue);
  }
  pthread_mutex_lock(&gs_lock);
  struct CUstream_st *st = gs_stream_get_locked(s);
  if (!st) {
    e = cudaErrorInvalidResourceHandle;
  } else if (st->kind == GS_SK_LEGACY) {
    *status = cudaStreamCaptureStatusNone;
    e = legacy_capture_check(st);
  } else if (!st->cap) {
    *status = cudaStreamCaptureStatusNone;
  } else {
    int active = st->cap->status == GS_CAP_ACTIVE;
    *status = active ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusInvalidated;
    if (id) *id = st->cap->id;
    if (graph) *graph = active ? st->cap->graph : NULL;
  }
  pthread_mutex_unlock(&gs_lock);
  return gs_err(e);
}

void gs_graph_unref_locked(struct CUgraph_st *g) {
  if (--g->refs > 0) return;
  gs_defer_locked(g->head);
  urefs_release_locked(g->urefs, g->nurefs);
  free(g->urefs);
  free(g);
}

/* CUDA Runtime API, cudaGraphInstantiate: the executable graph keeps the
 * graph's nodes alive; cudaGraphDestroy may come first. */
GS_API cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph,
                                        unsigned long long flags) {
  cudaError_t e = gs_context_current();
  if (e != cudaSuccess) return gs_err(e);
  (void)flags;
  if (!exec) return gs_err(cudaErrorInvalidValue);
  struct CUgraphExec_st *x = calloc(1, sizeof(*x));
  if (!x) return gs_err(cudaErrorMemoryAllocation);
  pthread_mutex_lock(&gs_lock);
  if (!gs_hset_has(&gs_graphs, graph))
    e = cudaErrorInvalidResourceHandle;
  else if (gs_hset_add(&gs_execs, x) != 0)
    e = cudaErrorMemoryAllocation;
  if (e == cudaSuccess) {
    x->g = graph;
    graph->refs++;
    *exec = x;
  }
  pthread_mutex_unlock(&gs_lock);
  if (e != cudaSuccess) free(x);
  return gs_err(e);
}

/* CUDA Runtime API, cudaGraphLaunch: the nodes run on s in the order they
 * were captured, after the work already on s; each kernel node gets a
 * fresh instance (k->instance) per launch, made outside gs_lock. A launch
 * into a capturing stream is captured node by node. */
GS_API cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
  cudaError_t e = gs_context_current();
  if (e != cudaSuccess) return gs_err(e);
  pthread_mutex_lock(&gs_lock);
  struct CUgraph_st *g = gs_hset_has(&gs_execs, exec) ? exec->g : NULL;
  if (g) g->refs++;
  pthread_mutex_unlock(&gs_lock);
  if (!g) return gs_err(cudaErrorInvalidResourceHandle);
  /* Copies of the nodes; the graph cannot change while we hold a ref. */
  gs_item_t *head = NULL, **tail = &head;
  for (gs_item_t *n = g->head; n && e == cudaSuccess; n = n->next) {
    gs_item_t *it = gs_item_new(n->kind);
    if (!it) {
      e = cudaErrorMemoryAllocation;
      break;
    }
    *it = *n;
    it->next = NULL;
    it->ev = NULL; /* the ref is taken under gs_lock below */
    if (n->kind == GS_IT_KERNEL && !(it->kernel = n->kernel->instance(n->kernel)))
      e = cudaErrorLaunchFailure;
    *tail = it;
    tail = &it->next;
  }
  pthread_mutex_lock(&gs_lock);
  for (gs_item_t *it = head, *n = g->head; it; it = it->next, n = n->next)
    if ((it->ev = n->ev)) it->ev->refs++;
  struct CUstream_st *st = e == cudaSuccess ? gs_stream_get_locked(s) : NULL;
  if (e == cudaSuccess && !st) e = cudaErrorInvalidResourceHandle;
  while (head && e == cudaSuccess) {
    gs_item_t *it = head;
    head = it->next;
    int captured;
    e = gs_submit_locked(st, it, &captured);
  }
  gs_defer_locked(head); /* what was not queued */
  if (e == cudaSuccess && g->nurefs > 0 && !st->cap) {
    /* Programming Guide, User Objects: references a graph would release
     * are held until its launches have finished executing. */
    launch_hold_t *h = malloc(sizeof(*h) + sizeof(gs_uref_t) * (size_t)g->nurefs);
    gs_item_t *it = h ? gs_item_new(GS_IT_HOST) : NULL;
    if (it) {
      h->n = g->nurefs;
      memcpy(h->u, g->urefs, sizeof(gs_uref_t) * (size_t)g->nurefs);
      for (int i = 0; i < h->n; i++)
        h->u[i].obj->refs += h->u[i].count;
      it->fn = launch_hold_release;
      it->arg = h;
      int captured;
      if (gs_submit_locked(st, it, &captured) != cudaSuccess) {
        urefs_release_locked(h->u, h->n); /* sticky device: nothing runs */
        free(h);
      }
    } else {
      free(h);
      e = cudaErrorMemoryAllocation;
    }
  }
  gs_graph_unref_locked(g);
  gs_unlock();
  return gs_err(e);
}

/* CUDA Runtime API, cudaGraphExecDestroy: launches already queued run on. */
GS_API cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  cudaError_t e = gs_context_current();
  if (e != cudaSuccess) return gs_err(e);
  pthread_mutex_lock(&gs_lock);
  bool ok = gs_hset_has(&gs_execs, exec);
  if (ok) {
    gs_hset_del(&gs_execs, exec);
    gs_graph_unref_locked(exec->g);
    free(exec);
  }
  gs_unlock();
  return gs_err(ok ? cudaSuccess : cudaErrorInvalidResourceHandle);
}

/* CUDA Runtime API, cudaGraphDestroy: the nodes (kernel protos released)
 * go with the last executable graph made from it. */
GS_API cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  cudaError_t e = gs_context_current();
  if (e != cudaSuccess) return gs_err(e);
  pthread_mutex_lock(&gs_lock);
  bool ok = gs_hset_has(&gs_graphs, graph);
  if (ok) {
    gs_hset_del(&gs_graphs, graph);
    gs_graph_unref_locked(graph);
  }
  gs_unlock();
  return gs_err(ok ? cudaSuccess : cudaErrorInvalidResourceHandle);
}
