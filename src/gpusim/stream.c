/*
 * stream.c - streams as worker threads that run their queue strictly in
 * order: kernels, host functions, event records, waits, copies and sets.
 * The legacy default stream (one per device, made lazily, never destroyed),
 * the per-thread default stream (one per thread and device, destroyed when
 * the thread exits), and the legacy stream's implicit synchronisation with
 * blocking streams.
 *
 * Threads: caller threads queue items under gs_lock; each stream's worker
 * takes them one by one, runs each with gs_lock released, counts it done
 * and broadcasts gs_progress. A host function is handed to the process's
 * one host-function thread (below), which runs them one at a time. Waiters (a wait item on another
 * worker, cudaStreamSynchronize, cudaEventSynchronize) sleep on gs_progress; an idle worker sleeps
 * on its stream's cv. Nobody spins.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpusim/sim.h"
#include "gpusim/stream.h"

pthread_mutex_t gs_lock = PTHREAD_MUTEX_INITIALIZER;
pthread_cond_t gs_progress = PTHREAD_COND_INITIALIZER;
struct CUstream_st *gs_streams; /* every stream not yet freed */
gs_hset_t gs_events, gs_graphs, gs_execs;

static struct CUstream_st *g_legacy[GS_MAX_DEVICES];
static pthread_once_t g_pt_once = PTHREAD_ONCE_INIT;
static pthread_key_t g_pt_key;            /* value: per_thread_t of the thread */
static _Thread_local gs_item_t *tl_defer; /* items gs_unlock finishes */

typedef struct {
  struct CUstream_st *s[GS_MAX_DEVICES];
} per_thread_t;

/* ---- handle sets ---------------------------------------------------------------- */

static size_t hset_pos(const gs_hset_t *h, const void *p) {
  size_t lo = 0, hi = h->n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if ((uintptr_t)h->v[mid] < (uintptr_t)p)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

int gs_hset_add(gs_hset_t *h, void *p) {
  if (h->n == h->cap) {
    size_t cap = h->cap ? h->cap * 2 : 64;
    void **v = realloc(h->v, cap * sizeof(*v));
    if (!v) return -1;
    h->v = v;
    h->cap = cap;
  }
  size_t i = hset_pos(h, p);
  memmove(&h->v[i + 1], &h->v[i], (h->n - i) * sizeof(*h->v));
  h->v[i] = p;
  h->n++;
  return 0;
}

void gs_hset_del(gs_hset_t *h, void *p) {
  size_t i = hset_pos(h, p);
  if (i < h->n && h->v[i] == p) {
    memmove(&h->v[i], &h->v[i + 1], (h->n - i - 1) * sizeof(*h->v));
    h->n--;
  }
}

bool gs_hset_has(const gs_hset_t *h, const void *p) {
  size_t i = hset_pos(h, p);
  return p && i < h->n && h->v[i] == p;
}

/* ---- items ------------------------------------------------------------------------- */

gs_item_t *gs_item_new(gs_item_kind_t kind) {
  gs_item_t *it = calloc(1, sizeof(*it));
  if (it) it->kind = kind;
  return it;
}

void gs_defer_locked(gs_item_t *list) {
  while (list) {
    gs_item_t *it = list;
    list = it->next;
    if (it->ev) gs_event_unref_locked(it->ev);
    if (it->ws) gs_stream_unref_locked(it->ws);
    it->ev = NULL;
    it->ws = NULL;
    it->next = tl_defer;
    tl_defer = it;
  }
}

void gs_unlock(void) {
  gs_item_t *l = tl_defer;
  tl_defer = NULL;
  pthread_mutex_unlock(&gs_lock);
  while (l) {
    gs_item_t *it = l;
    l = it->next;
    if (it->kind == GS_IT_KERNEL && it->kernel) it->kernel->release(it->kernel);
    free(it);
  }
}

/* ---- streams ----------------------------------------------------------------------- */

void gs_stream_unref_locked(struct CUstream_st *st) {
  if (--st->refs > 0) return;
  struct CUstream_st **pp = &gs_streams;
  while (*pp != st)
    pp = &(*pp)->next;
  *pp = st->next;
  pthread_cond_destroy(&st->cv);
  free(st);
}

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ---- host functions -------------------------------------------------------------- */
/* CUDA runs the host functions of every stream of a process on one driver
 * thread, one at a time, in the order they become ready: a host function
 * that blocks delays every other one, on any stream (CUDA Runtime API,
 * cudaLaunchHostFunc: "Host functions without a mandated order ... may be
 * serialized"; observed on an H200, issue 39), and it may not call CUDA
 * (cudaErrorNotPermitted, device.c). A stream's worker that reaches a host
 * function hands it to that thread and waits for it, so the stream stays in
 * order. The thread starts at the first host function and lives as long as
 * the process. */
typedef struct hf_req {
  struct hf_req *next;
  cudaHostFn_t fn;
  void *arg;
  int dev;
  int done; /* (hf_mu) */
} hf_req_t;

static pthread_mutex_t hf_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t hf_work = PTHREAD_COND_INITIALIZER; /* a request queued */
static pthread_cond_t hf_done = PTHREAD_COND_INITIALIZER; /* a request finished */
static hf_req_t *hf_head, *hf_tail;                       /* (hf_mu) in readiness order */
static int hf_started;                                    /* (hf_mu) */
static _Thread_local int tl_in_host_fn;

int gs_in_host_fn(void) { return tl_in_host_fn; }

void gs_run_no_cuda(cudaHostFn_t fn, void *arg) {
  tl_in_host_fn = 1;
  fn(arg);
  tl_in_host_fn = 0;
}

/* The host-function thread. */
static void *hf_main(void *unused) {
  (void)unused;
  pthread_mutex_lock(&hf_mu);
  for (;;) {
    while (!hf_head)
      pthread_cond_wait(&hf_work, &hf_mu);
    hf_req_t *r = hf_head;
    hf_head = r->next;
    if (!hf_head) hf_tail = NULL;
    pthread_mutex_unlock(&hf_mu);
    gs_set_current_device(r->dev); /* as the stream's own: no stray context */
    tl_in_host_fn = 1;
    r->fn(r->arg);
    tl_in_host_fn = 0;
    pthread_mutex_lock(&hf_mu);
    r->done = 1;
    pthread_cond_broadcast(&hf_done);
  }
  return NULL;
}

/* Worker thread (gs_lock not held): run fn(arg) on the host-function thread
 * and wait for it. Falls back to the worker itself if the thread cannot be
 * made (out of threads), with a WARN. */
static void host_fn_run(int dev, cudaHostFn_t fn, void *arg) {
  hf_req_t r = {NULL, fn, arg, dev, 0};
  pthread_mutex_lock(&hf_mu);
  if (!hf_started) {
    pthread_attr_t attr;
    pthread_t thr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    hf_started = pthread_create(&thr, &attr, hf_main, NULL) == 0;
    pthread_attr_destroy(&attr);
    if (!hf_started) {
      pthread_mutex_unlock(&hf_mu);
      gs_warn("no host-function thread: host function run on the stream's worker");
      tl_in_host_fn = 1;
      fn(arg);
      tl_in_host_fn = 0;
      return;
    }
  }
  if (hf_tail)
    hf_tail->next = &r;
  else
    hf_head = &r;
  hf_tail = &r;
  pthread_cond_signal(&hf_work);
  while (!r.done)
    pthread_cond_wait(&hf_done, &hf_mu);
  pthread_mutex_unlock(&hf_mu);
}

/* ---- user kernels (tdist/gpusim.h tdist_gpusim_launch_kernel) ------------------ */
typedef struct user_kernel {
  gs_kernel_t base; /* first: the stream sees a gs_kernel_t */
  atomic_int refs;
  void (*fn)(void *);
  void *arg;
} user_kernel_t;

static gs_kernel_t *uk_instance(gs_kernel_t *k) {
  atomic_fetch_add(&((user_kernel_t *)k)->refs, 1); /* no per-launch state: one record */
  return k;
}
static cudaError_t uk_run(gs_kernel_t *k) {
  user_kernel_t *u = (user_kernel_t *)k;
  u->fn(u->arg); /* on the stream's worker, as a kernel occupies its stream */
  return cudaSuccess;
}
static void uk_release(gs_kernel_t *k) {
  if (atomic_fetch_sub(&((user_kernel_t *)k)->refs, 1) == 1) free(k);
}

GS_API int tdist_gpusim_launch_kernel(void *stream, void (*fn)(void *), void *arg) {
  cudaError_t e = gs_context_current();
  if (e != cudaSuccess) return (int)gs_err(e);
  if (!fn) return (int)gs_err(cudaErrorInvalidValue);
  pthread_mutex_lock(&gs_lock);
  struct CUstream_st *st = gs_stream_get_locked((cudaStream_t)stream);
  int dev = st ? st->dev : -1;
  pthread_mutex_unlock(&gs_lock);
  if (!st) return (int)gs_err(cudaErrorInvalidResourceHandle);
  user_kernel_t *u = calloc(1, sizeof(*u));
  if (!u) return (int)gs_err(cudaErrorMemoryAllocation);
  u->base.instance = uk_instance;
  u->base.run = uk_run;
  u->base.release = uk_release;
  u->base.device = dev;
  u->base.name = "user kernel";
  atomic_init(&u->refs, 1);
  u->fn = fn;
  u->arg = arg;
  int captured = 0;
  return (int)gs_err(gs_launch((cudaStream_t)stream, &u->base, &captured));
}

/* Worker thread: one item, gs_lock not held. Once the device has a sticky
 * error its context is gone: queued work is dropped, not run (CUDA Runtime
 * API, Error Handling), but still counted done so nobody waits forever. */
static void run_item(struct CUstream_st *st, gs_item_t *it) {
  if (gs_sticky(st->dev) != cudaSuccess) return;
  cudaError_t e = cudaSuccess;
  switch (it->kind) {
  case GS_IT_KERNEL: e = it->kernel->run(it->kernel); break;
  case GS_IT_HOST: host_fn_run(st->dev, it->fn, it->arg); break;
  case GS_IT_COPY:
  case GS_IT_SET:
  case GS_IT_FREE: e = gs_mem_run(it); break;
  case GS_IT_RECORD:
  case GS_IT_WAIT: break;
  }
  if (e != cudaSuccess) {
    gs_warn("%s on device %d failed: %s", it->kind == GS_IT_KERNEL ? it->kernel->name : "copy",
            st->dev, cudaGetErrorName(e));
    gs_set_sticky(st->dev, e);
  }
}

/* gs_lock held: the head item of st is done. A record is timestamped
 * (cudaEventElapsedTime) unless a later record of the event completed. */
static void complete_locked(struct CUstream_st *st, int64_t t) {
  gs_item_t *it = st->head;
  if (it->kind == GS_IT_RECORD && it->gen > it->ev->time_gen) {
    it->ev->time_gen = it->gen;
    it->ev->time_ns = t;
  }
  st->head = it->next;
  if (!st->head) st->tail = NULL;
  st->done++;
  it->next = NULL;
  gs_defer_locked(it);
}

/* The worker of st (owns one ref): runs the queue in order; exits once the
 * stream is destroyed and drained (CUDA Runtime API, cudaStreamDestroy:
 * the call returns at once, the work still completes). Its current device
 * is the stream's, so a host function's CUDA calls use that context.
 * Event records right behind a finished item complete with it (they have
 * no work of their own), before a kernel is released: whoever learns from
 * release() that a kernel is over sees the records after it completed. */
static void *worker(void *arg) {
  struct CUstream_st *st = arg;
  gs_set_current_device(st->dev);
  pthread_mutex_lock(&gs_lock);
  for (;;) {
    gs_item_t *it = st->head;
    if (!it) {
      if (st->dead) break;
      pthread_cond_wait(&st->cv, &gs_lock);
      continue;
    }
    if (it->kind == GS_IT_WAIT && it->ws && it->ws->done < it->wseq &&
        gs_sticky(st->dev) == cudaSuccess) {
      pthread_cond_wait(&gs_progress, &gs_lock);
      continue;
    }
    pthread_mutex_unlock(&gs_lock);
    run_item(st, it);
    gs_kernel_t *k = it->kind == GS_IT_KERNEL ? it->kernel : NULL;
    it->kernel = NULL;
    int64_t t = now_ns();
    pthread_mutex_lock(&gs_lock);
    complete_locked(st, t);
    while (st->head && st->head->kind == GS_IT_RECORD)
      complete_locked(st, t);
    pthread_cond_broadcast(&gs_progress);
    gs_unlock();
    if (k) k->release(k);
    pthread_mutex_lock(&gs_lock);
  }
  gs_stream_unref_locked(st);
  pthread_mutex_unlock(&gs_lock);
  return NULL;
}

/* gs_lock held. A stream of `dev` with its worker, or NULL. Refs: the
 * handle (user, legacy table, per-thread table) and the worker. */
static struct CUstream_st *stream_new_locked(int dev, unsigned flags, int kind) {
  struct CUstream_st *st = calloc(1, sizeof(*st));
  if (!st) return NULL;
  st->dev = dev;
  st->flags = flags;
  st->kind = kind;
  st->refs = 2;
  pthread_cond_init(&st->cv, NULL);
  pthread_attr_t attr;
  pthread_t thr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  int rc = pthread_create(&thr, &attr, worker, st);
  pthread_attr_destroy(&attr);
  if (rc != 0) {
    pthread_cond_destroy(&st->cv);
    free(st);
    return NULL;
  }
  st->next = gs_streams;
  gs_streams = st;
  return st;
}

/* gs_lock held: st is destroyed; its worker drains the queue and exits. */
static void stream_kill_locked(struct CUstream_st *st) {
  st->dead = true;
  if (st->cap) gs_capture_invalidate_locked(st->cap);
  pthread_cond_signal(&st->cv);
  gs_stream_unref_locked(st);
}

/* Thread exit: its per-thread default streams go (CUDA Runtime API, Stream
 * synchronization behavior: per-thread default stream). */
static void pt_destroy(void *p) {
  per_thread_t *pt = p;
  pthread_mutex_lock(&gs_lock);
  for (int i = 0; i < GS_MAX_DEVICES; i++)
    if (pt->s[i]) stream_kill_locked(pt->s[i]);
  gs_unlock();
  free(pt);
}

static void pt_once(void) { pthread_key_create(&g_pt_key, pt_destroy); }

struct CUstream_st *gs_stream_get_locked(cudaStream_t s) {
  int dev = gs_current_device();
  if (dev < 0 || dev >= gs_device_count()) return NULL;
  if (s == NULL || s == cudaStreamLegacy) {
    if (!g_legacy[dev]) g_legacy[dev] = stream_new_locked(dev, 0, GS_SK_LEGACY);
    return g_legacy[dev];
  }
  if (s == cudaStreamPerThread) {
    pthread_once(&g_pt_once, pt_once);
    per_thread_t *pt = pthread_getspecific(g_pt_key);
    if (!pt) {
      if (!(pt = calloc(1, sizeof(*pt)))) return NULL;
      pthread_setspecific(g_pt_key, pt);
    }
    if (!pt->s[dev]) pt->s[dev] = stream_new_locked(dev, 0, GS_SK_PERTHREAD);
    return pt->s[dev];
  }
  for (struct CUstream_st *st = gs_streams; st; st = st->next)
    if (st == (struct CUstream_st *)s) return st->kind == GS_SK_USER && !st->dead ? st : NULL;
  return NULL;
}

static void push_locked(struct CUstream_st *st, gs_item_t *it) {
  it->next = NULL;
  if (st->tail)
    st->tail->next = it;
  else
    st->head = it;
  st->tail = it;
  st->enq++;
}

static bool blocking(const struct CUstream_st *b) {
  return b->kind != GS_SK_LEGACY && !(b->flags & cudaStreamNonBlocking);
}

/* Queue a wait for everything queued on b so far (if anything is left). */
static int implicit_wait_locked(struct CUstream_st *st, struct CUstream_st *b) {
  if (!b || b == st || b->done >= b->enq) return 0;
  gs_item_t *w = gs_item_new(GS_IT_WAIT);
  if (!w) return -1;
  w->ws = b;
  w->wseq = b->enq;
  b->refs++;
  push_locked(st, w);
  return 0;
}

cudaError_t gs_submit_locked(struct CUstream_st *st, gs_item_t *it, int *captured) {
  cudaError_t e = gs_sticky(st->dev);
  *captured = 0;
  if (e != cudaSuccess) goto fail;
  if (st->cap) {
    /* CUDA Programming Guide, Stream Capture: work on a capturing stream is
     * recorded in the graph, not run. */
    if (st->cap->status != GS_CAP_ACTIVE) {
      e = cudaErrorStreamCaptureInvalidated;
      goto fail;
    }
    gs_capture_append_locked(st, it);
    if (it->kind == GS_IT_RECORD) {
      gs_mark_t *m = &it->ev->mark;
      gs_mark_clear_locked(m);
      m->cap = st->cap;
      st->cap->refs++;
      memcpy(m->clock, st->clock, sizeof(m->clock));
      it->gen = ++it->ev->gen;
    }
    *captured = 1;
    return cudaSuccess;
  }
  if (it->kind == GS_IT_WAIT && it->ev) {
    /* An external event wait node of a graph: waits for the event's last
     * record as of the launch (CUDA Runtime API, cudaStreamWaitEvent,
     * cudaEventWaitExternal). */
    const gs_mark_t *m = &it->ev->mark;
    if (m->rs && !m->cap) {
      it->ws = m->rs;
      it->wseq = m->rseq;
      it->ws->refs++;
    }
    gs_event_unref_locked(it->ev);
    it->ev = NULL;
    if (!it->ws) {
      it->next = NULL;
      gs_defer_locked(it);
      return cudaSuccess;
    }
  }
  /* CUDA Programming Guide, Implicit Synchronization, and CUDA Runtime API,
   * Stream synchronization behavior: work on the legacy default stream waits
   * for all earlier work of the device's blocking streams, and work on a
   * blocking stream waits for earlier legacy-stream work. A capturing
   * blocking stream cannot be waited for (cudaErrorStreamCaptureImplicit). */
  if (st->kind == GS_SK_LEGACY) {
    for (struct CUstream_st *b = gs_streams; b; b = b->next)
      if (b->dev == st->dev && blocking(b) && b->cap) {
        gs_capture_invalidate_locked(b->cap);
        e = cudaErrorStreamCaptureImplicit;
        goto fail;
      }
    for (struct CUstream_st *b = gs_streams; b; b = b->next)
      if (b->dev == st->dev && blocking(b) && implicit_wait_locked(st, b) != 0) goto nomem;
  } else if (blocking(st) && implicit_wait_locked(st, g_legacy[st->dev]) != 0) {
    goto nomem;
  }
  push_locked(st, it);
  if (it->kind == GS_IT_RECORD) {
    gs_mark_t *m = &it->ev->mark;
    gs_mark_clear_locked(m);
    m->rs = st;
    m->rseq = st->enq;
    st->refs++;
    it->gen = ++it->ev->gen;
  }
  pthread_cond_signal(&st->cv);
  return cudaSuccess;
nomem:
  e = cudaErrorMemoryAllocation;
fail:
  it->next = NULL;
  gs_defer_locked(it);
  return e;
}

void gs_stream_drain(struct CUstream_st *st) {
  pthread_mutex_lock(&gs_lock);
  uint64_t target = st->enq;
  while (st->done < target)
    pthread_cond_wait(&gs_progress, &gs_lock);
  pthread_mutex_unlock(&gs_lock);
}

/* Wait for what every stream of dev (destroyed ones still draining too)
 * had queued at the call: a snapshot, so work queued meanwhile by other
 * threads cannot keep the caller waiting forever. */
void gs_device_drain(int dev) {
  pthread_mutex_lock(&gs_lock);
  size_t n = 0;
  for (struct CUstream_st *st = gs_streams; st; st = st->next)
    n += st->dev == dev;
  struct {
    struct CUstream_st *st;
    uint64_t target;
  } *w = calloc(n ? n : 1, sizeof(*w));
  size_t k = 0;
  for (struct CUstream_st *st = gs_streams; st && w; st = st->next)
    if (st->dev == dev) {
      w[k].st = st;
      w[k++].target = st->enq;
      st->refs++;
    }
  for (size_t i = 0; i < k; i++) {
    while (w[i].st->done < w[i].target)
      pthread_cond_wait(&gs_progress, &gs_lock);
    gs_stream_unref_locked(w[i].st);
  }
  pthread_mutex_unlock(&gs_lock);
  free(w);
}

/* ---- API --------------------------------------------------------------------------- */

/* CUDA Runtime API, cudaStreamCreateWithFlags: the stream belongs to the
 * current device. */
GS_API cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags) {
  cudaError_t e = gs_context_current();
  if (e != cudaSuccess) return gs_err(e);
  if (!s || (flags & ~(unsigned)cudaStreamNonBlocking)) return gs_err(cudaErrorInvalidValue);
  pthread_mutex_lock(&gs_lock);
  struct CUstream_st *st = stream_new_locked(gs_current_device(), flags, GS_SK_USER);
  pthread_mutex_unlock(&gs_lock);
  if (!st) return gs_err(cudaErrorMemoryAllocation);
  *s = st;
  return cudaSuccess;
}

/* CUDA Runtime API, cudaDeviceGetStreamPriorityRange: "lower numbers imply
 * greater priorities"; the range of an H100 / H200 with CUDA 12, least 0
 * and greatest -5. */
#define GS_PRIO_LEAST 0
#define GS_PRIO_GREATEST (-5)
GS_API cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest) {
  cudaError_t e = gs_context_current();
  if (e != cudaSuccess) return gs_err(e);
  if (least) *least = GS_PRIO_LEAST;
  if (greatest) *greatest = GS_PRIO_GREATEST;
  return cudaSuccess;
}

/* CUDA Runtime API, cudaStreamCreateWithPriority: a priority outside the
 * range "will automatically be clamped to the lowest or the highest number
 * in the range". The simulation records it (cudaStreamGetPriority, the
 * communicator inspection of tdist/gpusim.h); its workers do not schedule
 * by it. */
GS_API cudaError_t cudaStreamCreateWithPriority(cudaStream_t *s, unsigned int flags, int prio) {
  cudaError_t e = cudaStreamCreateWithFlags(s, flags);
  if (e != cudaSuccess) return e;
  if (prio > GS_PRIO_LEAST) prio = GS_PRIO_LEAST;
  if (prio < GS_PRIO_GREATEST) prio = GS_PRIO_GREATEST;
  pthread_mutex_lock(&gs_lock);
  (*s)->priority = prio;
  pthread_mutex_unlock(&gs_lock);
  return cudaSuccess;
}

int gs_stream_priority(cudaStream_t s) {
  if (s == NULL || s == cudaStreamLegacy || s == cudaStreamPerThread) return 0;
  pthread_mutex_lock(&gs_lock);
  struct CUstream_st *st = gs_stream_get_locked(s);
  int p = st ? st->priority : 0;
  pthread_mutex_unlock(&gs_lock);
  return p;
}

/* CUDA Runtime API, cudaStreamGetPriority. */
GS_API cudaError_t cudaStreamGetPriority(cudaStream_t s, int *priority) {
  cudaError_t e = gs_context_current();
  if (e != cudaSuccess) return gs_err(e);
  if (!priority) return gs_err(cudaErrorInvalidValue);
  *priority = gs_stream_priority(s);
  return cudaSuccess;
}

/* CUDA Runtime API, cudaStreamCreate. */
GS_API cudaError_t cudaStreamCreate(cudaStream_t *s) {
  return cudaStreamCreateWithFlags(s, cudaStreamDefault);
}

/* CUDA Runtime API, cudaStreamDestroy: returns at once; work still queued
 * completes before the resources go. */
GS_API cudaError_t cudaStreamDestroy(cudaStream_t s) {
  cudaError_t e = gs_context_current();
  if (e != cudaSuccess) return gs_err(e);
  pthread_mutex_lock(&gs_lock);
  struct CUstream_st *st = s == NULL || s == cudaStreamLegacy || s == cudaStreamPerThread
                               ? NULL
                               : gs_stream_get_locked(s);
  if (st) stream_kill_locked(st);
  gs_unlock();
  return gs_err(st ? cudaSuccess : cudaErrorInvalidResourceHandle);
}

/* Resolve s, refuse a capturing stream (CUDA Programming Guide, Stream
 * Capture / Prohibited and Unhandled Operations: it is invalid to
 * synchronize or query a capturing stream; the capture is invalidated),
 * and take a ref. */
static cudaError_t sync_target(cudaStream_t s, struct CUstream_st **out) {
  cudaError_t e = gs_context_current();
  if (e == cudaSuccess) e = gs_capture_unsafe();
  if (e != cudaSuccess) return e;
  pthread_mutex_lock(&gs_lock);
  struct CUstream_st *st = gs_stream_get_locked(s);
  if (!st) {
    e = cudaErrorInvalidResourceHandle;
  } else if (st->cap) {
    gs_capture_invalidate_locked(st->cap);
    e = cudaErrorStreamCaptureUnsupported;
  } else {
    st->refs++;
    *out = st;
  }
  pthread_mutex_unlock(&gs_lock);
  return e;
}

/* CUDA Runtime API, cudaStreamSynchronize. */
GS_API cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  struct CUstream_st *st;
  cudaError_t e = sync_target(s, &st);
  if (e != cudaSuccess) return gs_err(e);
  gs_stream_drain(st);
  pthread_mutex_lock(&gs_lock);
  int dev = st->dev;
  gs_stream_unref_locked(st);
  pthread_mutex_unlock(&gs_lock);
  return gs_err(gs_sticky(dev));
}

/* CUDA Runtime API, cudaStreamQuery: cudaErrorNotReady while work is
 * pending (not an error: the last error is left alone). */
GS_API cudaError_t cudaStreamQuery(cudaStream_t s) {
  struct CUstream_st *st;
  cudaError_t e = sync_target(s, &st);
  if (e != cudaSuccess) return gs_err(e);
  pthread_mutex_lock(&gs_lock);
  bool pending = st->done < st->enq;
  int dev = st->dev;
  gs_stream_unref_locked(st);
  pthread_mutex_unlock(&gs_lock);
  if ((e = gs_sticky(dev)) != cudaSuccess) return gs_err(e);
  return pending ? cudaErrorNotReady : cudaSuccess;
}

/* CUDA Runtime API, cudaLaunchHostFunc: fn runs after all earlier work of
 * the stream, on the process's one host-function thread (above), and later
 * work waits for it. */
GS_API cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *arg) {
  cudaError_t e = gs_context_current();
  if (e != cudaSuccess) return gs_err(e);
  if (!fn) return gs_err(cudaErrorInvalidValue);
  gs_item_t *it = gs_item_new(GS_IT_HOST);
  if (!it) return gs_err(cudaErrorMemoryAllocation);
  it->fn = fn;
  it->arg = arg;
  int captured;
  pthread_mutex_lock(&gs_lock);
  struct CUstream_st *st = gs_stream_get_locked(s);
  if (st)
    e = gs_submit_locked(st, it, &captured);
  else
    free(it);
  gs_unlock();
  return gs_err(st ? e : cudaErrorInvalidResourceHandle);
}

/* sim.h: a kernel launch (CUDA Runtime API, cudaLaunchKernel; captured as a
 * kernel node, CUDA Programming Guide, Stream Capture). The instance is
 * made outside gs_lock: the NCCL half may take its own locks in it. */
cudaError_t gs_launch(cudaStream_t s, gs_kernel_t *k, int *captured) {
  gs_kernel_t *run = NULL;
  cudaError_t e = cudaSuccess;
  *captured = 0;
  for (int pass = 0; pass < 2; pass++) {
    pthread_mutex_lock(&gs_lock);
    struct CUstream_st *st = gs_stream_get_locked(s);
    if (!st || st->dev != k->device)
      e = cudaErrorInvalidResourceHandle;
    else
      e = gs_context_use(st->dev);
    if (e == cudaSuccess && (st->cap || pass == 1)) {
      gs_item_t *it = gs_item_new(GS_IT_KERNEL);
      if (!it) {
        e = cudaErrorMemoryAllocation;
      } else {
        /* Capturing: the graph keeps the proto (our ref); else the instance. */
        it->kernel = st->cap ? k : run;
        if (st->cap)
          k = NULL;
        else
          run = NULL;
        e = gs_submit_locked(st, it, captured);
      }
    }
    gs_unlock();
    if (e != cudaSuccess || pass == 1 || *captured) break;
    if (!(run = k->instance(k))) {
      e = cudaErrorLaunchFailure;
      break;
    }
  }
  if (run) run->release(run);
  if (k) k->release(k);
  return gs_err(e);
}

/* sim.h: waiter waits for everything queued on signaler so far, as an
 * event recorded on signaler and waited for by waiter would. */
cudaError_t gs_stream_join(cudaStream_t waiter, cudaStream_t signaler) {
  cudaError_t e = cudaSuccess;
  pthread_mutex_lock(&gs_lock);
  struct CUstream_st *w = gs_stream_get_locked(waiter);
  struct CUstream_st *sg = gs_stream_get_locked(signaler);
  if (!w || !sg) {
    e = cudaErrorInvalidResourceHandle;
  } else if (w != sg) {
    gs_mark_t m;
    memset(&m, 0, sizeof(m));
    if (sg->cap) {
      m.cap = sg->cap;
      memcpy(m.clock, sg->clock, sizeof(m.clock));
    } else {
      m.rs = sg;
      m.rseq = sg->enq;
    }
    e = gs_wait_mark_locked(w, &m, 0, NULL);
  }
  gs_unlock();
  return gs_err(e);
}
