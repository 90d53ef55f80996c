/*
 * kernel.c - the simulated NCCL kernels: what runs on a stream's worker
 * when the stream reaches a communicator's launch.
 *
 * A kernel holds one communicator's part of one group: its collectives in
 * order, then its sends and receives, progressed together so that a group
 * of sends and receives between two ranks cannot deadlock (as one NCCL
 * kernel runs all of a group's p2p channels at once).
 *
 * What a caller can observe, as on a GPU:
 *   - a communicator's kernels run in launch order even across streams
 *     (NCCL serialises them: enqueue.cc, the strong-stream ordering);
 *   - a kernel blocks its stream until every peer it needs has arrived: a
 *     rank that never calls hangs its peers' streams -- their events never
 *     complete -- until the communicator is aborted;
 *   - an abort (ncclCommAbort, ncclCommRevoke, shrink with
 *     NCCL_SHRINK_ABORT) makes the kernel return at its next check: the
 *     stream goes on and the events after it complete, with the output
 *     left as far as the collective got (device/common.h: the abort flag);
 *   - a peer that is gone while a kernel waits for it sets the
 *     communicator's async error to ncclRemoteError (the proxy's view of a
 *     closed connection: proxy.cc, net transports) when the peer is on
 *     another host (NCCL_HOSTID / host name); on the same host (P2P, SHM:
 *     no proxy) nothing is reported. Either way the kernel keeps waiting
 *     until the communicator is aborted;
 *   - a buffer that is not live memory of the communicator's device faults:
 *     cudaErrorIllegalAddress, sticky on the device; the peers then hang.
 * Threads: instance() on the launching thread, run() on the stream worker,
 * release() on either. The kernel's fields are immutable after instance().
 */
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpusim/nccl_sim.h"

typedef struct gs_nk {
  gs_kernel_t base; /* first: the stream sees a gs_kernel_t */
  atomic_int refs;
  ncclComm_t c;
  gs_task_t *tasks;
  int ntasks;
  int instance; /* an instance (counted in c->inflight), not a prototype */
  int ran;      /* (instance) its bookkeeping is done */
  uint64_t seq;
  int remote_reported;
} gs_nk_t;

static const char *kname(gs_func_t f) {
  static const char *const n[] = {
      "ncclAllReduce", "ncclBroadcast", "ncclReduce",  "ncclAllGather", "ncclReduceScatter",
      "ncclAlltoAll",  "ncclGather",    "ncclScatter", "ncclSend",      "ncclRecv"};
  return n[f];
}

static gs_kernel_t *nk_instance(gs_kernel_t *proto);
static cudaError_t nk_run(gs_kernel_t *k);
static void nk_release(gs_kernel_t *k);

static gs_nk_t *nk_alloc(ncclComm_t c, const gs_task_t *tasks, int n) {
  gs_nk_t *k = calloc(1, sizeof(*k));
  if (!k) return NULL;
  k->tasks = malloc(sizeof(*tasks) * (size_t)n);
  if (!k->tasks) {
    free(k);
    return NULL;
  }
  memcpy(k->tasks, tasks, sizeof(*tasks) * (size_t)n);
  k->ntasks = n;
  k->c = c;
  atomic_init(&k->refs, 1);
  k->base.instance = nk_instance;
  k->base.run = nk_run;
  k->base.release = nk_release;
  k->base.device = c->dev;
  k->base.name = kname(tasks[0].func);
  return k;
}

gs_kernel_t *gs_kernel_new(ncclComm_t c, const gs_task_t *tasks, int n) {
  gs_nk_t *k = nk_alloc(c, tasks, n);
  if (!k) return NULL;
  gs_comm_retain(c);
  return &k->base;
}

/* Launch time: a numbered copy, counted in flight. A graph replayed after
 * its communicator was destroyed cannot launch. */
static gs_kernel_t *nk_instance(gs_kernel_t *proto) {
  gs_nk_t *p = (gs_nk_t *)proto, *k = nk_alloc(p->c, p->tasks, p->ntasks);
  if (!k) return NULL;
  ncclComm_t c = p->c;
  pthread_mutex_lock(&c->mu);
  if (c->destroyed) {
    pthread_mutex_unlock(&c->mu);
    free(k->tasks);
    free(k);
    return NULL;
  }
  k->instance = 1;
  k->seq = ++c->next_seq;
  c->inflight++;
  c->refs++;
  pthread_mutex_unlock(&c->mu);
  return &k->base;
}

static void nk_finish(gs_nk_t *k) {
  ncclComm_t c = k->c;
  pthread_mutex_lock(&c->mu);
  if (!k->ran) {
    k->ran = 1;
    if (k->seq > c->done_seq) c->done_seq = k->seq;
    c->inflight--;
    pthread_cond_broadcast(&c->cv);
  }
  pthread_mutex_unlock(&c->mu);
}

static void nk_release(gs_kernel_t *kb) {
  gs_nk_t *k = (gs_nk_t *)kb;
  if (atomic_fetch_sub(&k->refs, 1) != 1) return;
  if (k->instance) nk_finish(k);
  gs_comm_release(k->c);
  free(k->tasks);
  free(k);
}

static int aborted(const gs_nk_t *k) { return atomic_load(&k->c->abort_flag) != 0; }

/* A peer we wait for is gone. Only a transport with a proxy sees it: the
 * network transports (net.cc: socket, IB), used between ranks of different
 * hosts (the host hash, misc/utils.cc getHostHash), whose proxy stores
 * ncclRemoteError in proxyState->asyncResult (proxy.cc). Between ranks of
 * one host (p2p.cc, shm.cc: no proxy) NCCL reports nothing and the kernel
 * spins until the communicator is aborted. Once per kernel. Stream worker. */
static void check_peer(gs_nk_t *k, int j) {
  if (k->remote_reported || !gs_peer_gone(&k->c->seg, j)) return;
  k->remote_reported = 1;
  if (!gs_peer_remote(&k->c->seg, j)) {
    gs_info("%s: rank %d of %s is gone; same host (P2P/SHM, no proxy): nothing reported",
            k->base.name, j, k->c->name);
    return;
  }
  gs_comm_set_proxy_error(k->c, ncclRemoteError);
  gs_fail(ncclRemoteError, "%s: rank %d of communicator %s is gone (rank %d waiting in %s)",
          k->c->name, j, k->c->name, k->c->rank, k->base.name);
}

/* Sleep until something changes, after a short spin (waits are short when
 * every rank is running). Returns 1 when the communicator is aborted. */
static int nap(gs_nk_t *k, uint32_t w, int *spins) {
  if (aborted(k)) return 1;
  if ((*spins)++ < 64) {
    sched_yield();
    return 0;
  }
  gs_seg_sleep(&k->c->seg, w);
  return aborted(k);
}

/* Publish step s, then wait until every rank has staged it. */
static int barrier(gs_nk_t *k, uint64_t s) {
  gs_seg_t *seg = &k->c->seg;
  atomic_store_explicit(&gs_slot(seg, k->c->rank)->step, s, memory_order_release);
  gs_seg_wake(seg);
  for (int j = 0; j < k->c->nranks; j++) {
    gs_slot_t *sl = gs_slot(seg, j);
    int spins = 0;
    for (;;) {
      uint32_t w = gs_seg_word(seg);
      if (atomic_load_explicit(&sl->step, memory_order_acquire) >= s) break;
      if (spins > 64) check_peer(k, j);
      if (nap(k, w, &spins)) return 1;
    }
  }
  return 0;
}

/* ---- collectives ------------------------------------------------------------------ */
typedef struct view {
  const unsigned char *in;
  unsigned char *out;
  size_t in_bytes, out_bytes;
} view_t;

static int rooted(gs_func_t f) {
  return f == GS_BROADCAST || f == GS_REDUCE || f == GS_GATHER || f == GS_SCATTER;
}

/* The bytes each buffer of task t must hold on this rank, and the bytes it
 * stages (its "publish" length). */
static void sizes(const ncclComm_t c, const gs_task_t *t, size_t *in, size_t *out, size_t *pub) {
  size_t b = t->count * gs_dtype_size(t->dt), nb = b * (size_t)c->nranks;
  int root = t->root == c->rank;
  switch (t->func) {
  case GS_ALLREDUCE: *in = b, *out = b, *pub = b; break;
  case GS_BROADCAST: *in = root ? b : 0, *out = b, *pub = root ? b : 0; break;
  case GS_REDUCE: *in = b, *out = root ? b : 0, *pub = b; break;
  case GS_ALLGATHER: *in = b, *out = nb, *pub = b; break;
  case GS_REDUCESCATTER: *in = nb, *out = b, *pub = nb; break;
  case GS_ALLTOALL: *in = nb, *out = nb, *pub = nb; break;
  case GS_GATHER: *in = b, *out = root ? nb : 0, *pub = b; break;
  case GS_SCATTER: *in = root ? nb : 0, *out = b, *pub = root ? nb : 0; break;
  case GS_SEND: *in = b, *out = 0, *pub = 0; break;
  case GS_RECV: *in = 0, *out = b, *pub = 0; break;
  }
}

/* out[o, o + n) = reduction over the ranks whose staged bytes cover
 * [a, a + n) (all of them unless ranks disagreed). */
static void reduce_range(const gs_nk_t *k, const gs_task_t *t, const gs_desc_t *d, int par,
                         size_t a, size_t n, unsigned char *out) {
  size_t es = gs_dtype_size(t->dt), cnt = n / es;
  int first = 1;
  for (int j = 0; j < k->c->nranks; j++) {
    if (d[j].publish < a + n) continue;
    const unsigned char *src = gs_chunk(&k->c->seg, j, par) + (a % k->c->seg.hdr->chunk);
    if (first)
      gs_reduce_first(&t->red, out, src, cnt);
    else
      gs_reduce_next(&t->red, out, src, cnt);
    first = 0;
  }
  if (!first) gs_reduce_last(&t->red, out, cnt);
}

/* Round [a, b) of the staged space: this rank's output from every rank's
 * chunk (offsets within a chunk are a % chunk). */
static void compute(const gs_nk_t *k, const gs_task_t *t, const view_t *v, const gs_desc_t *d,
                    int par, size_t a, size_t b) {
  ncclComm_t c = k->c;
  int r = c->rank, n = c->nranks;
  size_t ch = c->seg.hdr->chunk, B = t->count * gs_dtype_size(t->dt);
#define CHUNK_AT(j, x) (gs_chunk(&c->seg, (j), par) + ((x)-a) + (a % ch))
  switch (t->func) {
  case GS_ALLREDUCE:
  case GS_REDUCE:
    if (v->out_bytes >= b) reduce_range(k, t, d, par, a, b - a, v->out + a);
    break;
  case GS_BROADCAST:
    if (d[t->root].publish >= b && v->out_bytes >= b)
      memcpy(v->out + a, CHUNK_AT(t->root, a), b - a);
    break;
  case GS_ALLGATHER:
  case GS_GATHER:
    for (int j = 0; j < n && v->out_bytes; j++)
      if (d[j].publish >= b && b <= B) memcpy(v->out + (size_t)j * B + a, CHUNK_AT(j, a), b - a);
    break;
  case GS_REDUCESCATTER:
  case GS_ALLTOALL:
  case GS_SCATTER: {
    size_t x0 = a > (size_t)r * B ? a : (size_t)r * B,
           x1 = b < (size_t)(r + 1) * B ? b : (size_t)(r + 1) * B;
    if (x0 >= x1 || v->out_bytes < x1 - (size_t)r * B) break;
    unsigned char *o = v->out + (x0 - (size_t)r * B);
    if (t->func == GS_REDUCESCATTER) {
      reduce_range(k, t, d, par, x0, x1 - x0, o);
    } else if (t->func == GS_SCATTER) {
      if (d[t->root].publish >= x1) memcpy(o, CHUNK_AT(t->root, x0), x1 - x0);
    } else {
      for (int j = 0; j < n; j++)
        if (d[j].publish >= x1 && v->out_bytes >= (size_t)j * B + (x1 - (size_t)r * B))
          memcpy(v->out + (size_t)j * B + (x0 - (size_t)r * B), CHUNK_AT(j, x0), x1 - x0);
    }
    break;
  }
  default: break;
  }
#undef CHUNK_AT
}

/* One collective: exchange descriptors, then rounds. 1 when aborted. */
static int run_coll(gs_nk_t *k, gs_task_t *t, const view_t *v) {
  ncclComm_t c = k->c;
  gs_seg_t *seg = &c->seg;
  gs_slot_t *me = gs_slot(seg, c->rank);
  size_t in, out, pub;
  sizes(c, t, &in, &out, &pub);
  uint64_t s = atomic_load(&me->step) + 1;
  gs_desc_t *mine = &me->desc[s & 1];
  mine->seq = ++c->coll_seq;
  mine->func = (int32_t)t->func;
  mine->dtype = (int32_t)t->dt;
  mine->count = t->count;
  mine->redkind = t->has_red ? (int32_t)t->red.kind : -1;
  mine->root = rooted(t->func) ? t->root : -1;
  mine->publish = pub;
  if (barrier(k, s)) return 1;
  gs_desc_t d[GS_MAX_RANKS];
  size_t L = 0;
  int mismatch = 0;
  for (int j = 0; j < c->nranks; j++) {
    d[j] = gs_slot(seg, j)->desc[s & 1];
    if (d[j].publish > L) L = d[j].publish;
    mismatch |= d[j].func != mine->func || d[j].dtype != mine->dtype || d[j].count != mine->count ||
                d[j].redkind != mine->redkind || d[j].root != mine->root;
  }
  if (mismatch) {
    atomic_fetch_add(&gs_mismatches, 1);
    gs_warn("%s: ranks disagree on collective %llu (%s); NCCL does not check this", c->name,
            (unsigned long long)mine->seq, k->base.name);
  }
  size_t ch = seg->hdr->chunk;
  for (size_t a = 0; a < L; a += ch) {
    size_t b = a + ch < L ? a + ch : L;
    s++;
    if (a < pub) memcpy(gs_chunk(seg, c->rank, (int)(s & 1)), v->in + a, (b < pub ? b : pub) - a);
    if (barrier(k, s)) return 1;
    compute(k, t, v, d, (int)(s & 1), a, b);
  }
  return 0;
}

/* ---- send / recv --------------------------------------------------------------------- */
typedef struct p2p {
  gs_task_t *t;
  unsigned char *buf;
  size_t bytes; /* of this side's buffer */
  size_t msg;   /* recv: payload length announced by the sender */
  size_t done;  /* stream bytes moved, header included */
  int finished;
} p2p_t;

static void ring_put(gs_ring_t *rg, size_t cap, uint64_t pos, const unsigned char *src, size_t n) {
  size_t o = pos % cap, first = n < cap - o ? n : cap - o;
  memcpy(gs_ring_data(rg) + o, src, first);
  memcpy(gs_ring_data(rg), src + first, n - first);
}

static void ring_get(gs_ring_t *rg, size_t cap, uint64_t pos, unsigned char *dst, size_t n) {
  size_t o = pos % cap, first = n < cap - o ? n : cap - o;
  if (dst) {
    memcpy(dst, gs_ring_data(rg) + o, first);
    memcpy(dst + first, gs_ring_data(rg), n - first);
  }
}

/* Move what fits; 1 if anything moved. The stream of a message: 8 bytes
 * of length, then the payload. */
static int p2p_step(gs_nk_t *k, p2p_t *p) {
  ncclComm_t c = k->c;
  size_t cap = c->seg.hdr->ring;
  int send = p->t->func == GS_SEND;
  gs_ring_t *rg =
      send ? gs_ring(&c->seg, c->rank, p->t->root) : gs_ring(&c->seg, p->t->root, c->rank);
  uint64_t head = atomic_load_explicit(&rg->head, memory_order_acquire);
  uint64_t tail = atomic_load_explicit(&rg->tail, memory_order_acquire);
  int moved = 0;
  if (send) {
    uint64_t len = p->bytes;
    size_t total = 8 + p->bytes;
    while (p->done < total && head - tail < cap) {
      size_t room = cap - (size_t)(head - tail), n;
      if (p->done < 8) {
        n = 8 - p->done < room ? 8 - p->done : room;
        ring_put(rg, cap, head, (const unsigned char *)&len + p->done, n);
      } else {
        size_t left = total - p->done;
        n = left < room ? left : room;
        ring_put(rg, cap, head, p->buf + (p->done - 8), n);
      }
      head += n;
      p->done += n;
      moved = 1;
    }
    if (moved) atomic_store_explicit(&rg->head, head, memory_order_release);
    p->finished = p->done == total;
  } else {
    while (head > tail) {
      size_t avail = (size_t)(head - tail), n;
      if (p->done < 8) {
        if (avail < 8 - p->done) break;
        uint64_t len;
        ring_get(rg, cap, tail, (unsigned char *)&len, 8);
        p->msg = (size_t)len;
        n = 8;
        if (p->msg != p->bytes) {
          atomic_fetch_add(&gs_mismatches, 1);
          gs_warn("%s: rank %d receives %zu bytes from rank %d, which sent %zu", c->name, c->rank,
                  p->bytes, p->t->root, p->msg);
        }
      } else {
        size_t left = 8 + p->msg - p->done, at = p->done - 8;
        n = left < avail ? left : avail;
        /* Bytes past this side's buffer are dropped, never written. */
        size_t keep = at < p->bytes ? (p->bytes - at < n ? p->bytes - at : n) : 0;
        ring_get(rg, cap, tail, p->buf + at, keep);
      }
      tail += n;
      p->done += n;
      moved = 1;
      if (p->done == 8 + p->msg) break;
    }
    if (moved) atomic_store_explicit(&rg->tail, tail, memory_order_release);
    p->finished = p->done >= 8 && p->done == 8 + p->msg;
  }
  return moved;
}

static int run_p2p(gs_nk_t *k, p2p_t *ps, int n) {
  gs_seg_t *seg = &k->c->seg;
  int spins = 0;
  for (;;) {
    uint32_t w = gs_seg_word(seg);
    int moved = 0, left = 0;
    for (int i = 0; i < n; i++) {
      if (ps[i].finished) continue;
      /* Messages between a pair go in issue order. */
      int blocked = 0;
      for (int e = 0; e < i && !blocked; e++)
        blocked =
            !ps[e].finished && ps[e].t->func == ps[i].t->func && ps[e].t->root == ps[i].t->root;
      if (!blocked) moved |= p2p_step(k, &ps[i]);
      left += !ps[i].finished;
    }
    if (moved) {
      gs_seg_wake(seg);
      spins = 0;
    }
    if (!left) return 0;
    if (moved) continue;
    if (spins > 64)
      for (int i = 0; i < n; i++)
        if (!ps[i].finished) check_peer(k, ps[i].t->root);
    if (nap(k, w, &spins)) return 1;
  }
}

/* ---- run ------------------------------------------------------------------------------ */
static cudaError_t execute(gs_nk_t *k) {
  ncclComm_t c = k->c;
  cudaError_t e = cudaSuccess;
  view_t *v = calloc((size_t)k->ntasks, sizeof(*v));
  p2p_t *ps = calloc((size_t)k->ntasks, sizeof(*ps));
  int np = 0;
  if (!v || !ps) goto out;
  /* Every buffer first: a fault stops the kernel before it takes part. */
  for (int i = 0; i < k->ntasks; i++) {
    gs_task_t *t = &k->tasks[i];
    size_t in, out, pub;
    sizes(c, t, &in, &out, &pub);
    v[i].in = gs_dev_access(c->dev, t->send, in);
    v[i].out = gs_dev_access(c->dev, t->recv, out);
    v[i].in_bytes = in;
    v[i].out_bytes = out;
    const void *sc = NULL;
    if (t->dev_scalar) sc = gs_dev_access(c->dev, t->dev_scalar, gs_dtype_size(t->dt));
    if (!v[i].in || !v[i].out || (t->dev_scalar && !sc)) {
      gs_warn("%s rank %d: %s touched memory that is not live on device %d: illegal address",
              c->name, c->rank, kname(t->func), c->dev);
      e = cudaErrorIllegalAddress;
      goto out;
    }
    if (sc) gs_redop_premul(&t->red, t->dt, sc);
  }
  for (int i = 0; i < k->ntasks; i++) {
    gs_task_t *t = &k->tasks[i];
    if (t->func == GS_SEND || t->func == GS_RECV) {
      ps[np].t = t;
      ps[np].buf = t->func == GS_SEND ? (unsigned char *)(uintptr_t)v[i].in : v[i].out;
      ps[np].bytes = t->func == GS_SEND ? v[i].in_bytes : v[i].out_bytes;
      np++;
    } else if (run_coll(k, t, &v[i])) {
      goto out;
    }
  }
  if (np) run_p2p(k, ps, np);
out:
  free(v);
  free(ps);
  return e;
}

static cudaError_t nk_run(gs_kernel_t *kb) {
  gs_nk_t *k = (gs_nk_t *)kb;
  ncclComm_t c = k->c;
  /* Wait for the communicator's previous kernel (launch order). */
  pthread_mutex_lock(&c->mu);
  while (c->done_seq + 1 < k->seq && !atomic_load(&c->abort_flag)) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += GS_POLL_MS * 1000000L;
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(&c->cv, &c->mu, &ts);
  }
  pthread_mutex_unlock(&c->mu);
  /* Counted finished in release(), which the stream calls after it has
   * also completed the event records queued right behind the kernel: an
   * abort that returns finds those events complete. */
  return aborted(k) ? cudaSuccess : execute(k);
}
