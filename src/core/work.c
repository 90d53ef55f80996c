/*
 * work.c - work handles: the pool, reference counting, the state machine and
 * the public tdist_work_* functions.
 *
 * Pool: works are carved from the heap in slabs and never returned to it;
 * released works go back on a free list, so once the pool has grown to the
 * number of works in flight, submitting and completing allocates nothing.
 * The free list is a mutex-protected stack: submit and release each take the
 * lock once, uncontended in the common case (tens of ns).
 *
 * State: written only by the progress thread (tdist__work_finish), published
 * with a release store after status and message; readers use acquire loads,
 * so tdist_work_is_completed is one load.
 */
#include "core/work.h"

#include <assert.h>
#include <errno.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/group.h"
#include "core/param.h"
#include "core/trace.h"

#define SLAB_WORKS 64

static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static tdist_work_t *pool_free;
static uint64_t pool_total;
/* Slabs are kept on a list so the memory stays reachable (leak checkers). */
struct slab {
  struct slab *next;
  tdist_work_t works[SLAB_WORKS];
};
static struct slab *slabs;

TDIST_PARAM(WaitSpinNs, "TDIST_WAIT_SPIN_NS", TDIST_SPIN_DEFAULT(20000))

static int pool_grow(void) {
  struct slab *s = tdist__calloc(1, sizeof(*s));
  if (!s) return -1;
  for (int i = 0; i < SLAB_WORKS; i++) {
    tdist_work_t *w = &s->works[i];
    pthread_mutex_init(&w->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w->cv, &ca);
    pthread_condattr_destroy(&ca);
    w->pool_next = pool_free;
    pool_free = w;
  }
  s->next = slabs;
  slabs = s;
  pool_total += SLAB_WORKS;
  return 0;
}

uint64_t tdist__work_pool_size(void) {
  pthread_mutex_lock(&pool_mu);
  uint64_t n = pool_total;
  pthread_mutex_unlock(&pool_mu);
  return n;
}

tdist_work_t *tdist__work_alloc(tdist_group_t *g) {
  pthread_mutex_lock(&pool_mu);
  if (!pool_free && pool_grow() != 0) {
    pthread_mutex_unlock(&pool_mu);
    return NULL;
  }
  tdist_work_t *w = pool_free;
  pool_free = w->pool_next;
  pthread_mutex_unlock(&pool_mu);

  /* Reset what a previous use left (mu/cv stay initialised). */
  w->qnode.next = NULL;
  w->prev = w->next = w->pool_next = NULL;
  atomic_store_explicit(&w->refs, 2, memory_order_relaxed);
  atomic_store_explicit(&w->state, TDIST_WORK_QUEUED, memory_order_relaxed);
  w->status = TDIST_ERR_IN_PROGRESS;
  w->group = g;
  w->seq = 0; /* args: written whole by the submitter (ops.c) */
  w->timeout_ms = 0;
  w->t_enqueue_ns = w->t_start_ns = w->t_end_ns = w->deadline_ns = 0;
  w->waiters = 0;
  w->cb = NULL;
  w->cb_arg = NULL;
  w->cb_state = 0;
  w->bk = NULL;
  w->msg[0] = '\0';
  return w;
}

void tdist__work_unref(tdist_work_t *w) {
  if (atomic_fetch_sub_explicit(&w->refs, 1, memory_order_acq_rel) != 1) return;
  if (w->args.p2p && w->args.p2p != w->p2p_inline) tdist__free(w->args.p2p);
  w->args.p2p = NULL;
  pthread_mutex_lock(&pool_mu);
  w->pool_next = pool_free;
  pool_free = w;
  pthread_mutex_unlock(&pool_mu);
}

static int state_for(int status) {
  switch (status) {
  case 0: return TDIST_WORK_COMPLETED;
  case TDIST_ERR_TIMEOUT: return TDIST_WORK_TIMED_OUT;
  case TDIST_ERR_ABORTED:
  case TDIST_ERR_REMOTE_FAILED: return TDIST_WORK_ABORTED;
  default: return TDIST_WORK_FAILED;
  }
}

void tdist__work_finish(tdist_work_t *w, int status, const char *fmt, ...) {
  tdist_group_t *g = w->group;
  assert(!tdist__work_done(w));
  if (status != 0) {
    int n = snprintf(w->msg, sizeof(w->msg),
                     "%s seq %llu of group '%s' (rank %d/%d): ", tdist_op_name(w->args.type),
                     (unsigned long long)w->seq, g->name, g->rank, g->size);
    if (n < 0 || n >= (int)sizeof(w->msg)) n = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->msg + n, sizeof(w->msg) - (size_t)n, fmt, ap);
    va_end(ap);
    TDIST_INFO(CORE, "work failed: %s (%s)", w->msg, tdist_err_name(status));
  }
  w->t_end_ns = tdist__now_ns();
  w->status = status; /* read by others only after the state's release store */
  tdist__trace_end(g, w, state_for(status));
  if (w->prev || w->next || g->inflight_head == w) tdist__group_inflight_remove(g, w);

  pthread_mutex_lock(&w->mu);
  atomic_store_explicit(&w->state, state_for(status), memory_order_release);
  tdist_work_cb_t cb = NULL;
  if (w->cb_state == 1) {
    cb = w->cb;
    w->cb_state = 2;
  }
  if (w->waiters) pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);

  if (cb) cb(w, w->cb_arg);
  tdist__group_work_done(g);
  tdist__work_unref(w);
}

/* ---- public API --------------------------------------------------------- */

int tdist_work_is_completed(const tdist_work_t *w) { return w ? tdist__work_done(w) : 0; }

int tdist_work_status(const tdist_work_t *w) {
  if (!w) return TDIST_ERR_INVALID_ARGUMENT;
  return tdist__work_done(w) ? w->status : TDIST_ERR_IN_PROGRESS;
}

tdist_work_state_t tdist_work_state(const tdist_work_t *w) {
  return w ? (tdist_work_state_t)atomic_load_explicit(&((tdist_work_t *)w)->state,
                                                      memory_order_acquire)
           : TDIST_WORK_FAILED;
}

const char *tdist_work_error_message(const tdist_work_t *w) {
  return (w && tdist__work_done(w)) ? w->msg : "";
}

tdist_optype_t tdist_work_optype(const tdist_work_t *w) {
  return w ? w->args.type : TDIST_OPTYPE_COUNT;
}

uint64_t tdist_work_seq(const tdist_work_t *w) { return w ? w->seq : 0; }

/* Wait until done or until the absolute CLOCK_MONOTONIC deadline (ns).
 * Most small ops finish within microseconds, and a futex sleep/wake costs
 * more than that, so first spin: 2 us busy, then yielding the CPU until
 * TDIST_WAIT_SPIN_NS (yielding matters when threads outnumber cores: the
 * progress thread may need this core to finish the op). */
static int wait_until(tdist_work_t *w, int64_t deadline_ns) {
  int64_t start = tdist__now_ns(), now = start;
  int64_t spin_end = start + tdist__param_WaitSpinNs();
  while (!tdist__work_done(w) && now < spin_end) {
    if (now - start > 2000) sched_yield();
    now = tdist__now_ns();
  }
  if (tdist__work_done(w)) return w->status;
  pthread_mutex_lock(&w->mu);
  w->waiters++;
  int timed_out = 0;
  while (!tdist__work_done(w) && !timed_out) {
    struct timespec ts = {.tv_sec = deadline_ns / 1000000000, .tv_nsec = deadline_ns % 1000000000};
    if (pthread_cond_timedwait(&w->cv, &w->mu, &ts) == ETIMEDOUT) timed_out = 1;
  }
  w->waiters--;
  pthread_mutex_unlock(&w->mu);
  return tdist__work_done(w) ? w->status : TDIST_ERR_IN_PROGRESS;
}

/* With timeout_ms <= 0 the op's own deadline bounds the wait; the watchdog
 * fails the op shortly after it, so allow it a grace period to do so. */
static int64_t wait_deadline(const tdist_work_t *w, int64_t timeout_ms) {
  if (timeout_ms > 0) return tdist__now_ns() + timeout_ms * 1000000;
  return (w->deadline_ns ? w->deadline_ns : tdist__now_ns()) + 5000000000LL;
}

int tdist_work_wait(tdist_work_t *w, int64_t timeout_ms) {
  if (!w) return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "tdist_work_wait: NULL work");
  if (tdist__work_done(w)) return w->status;
  return wait_until(w, wait_deadline(w, timeout_ms));
}

int tdist_work_wait_stream(tdist_work_t *w, void *stream) {
  if (!w) return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "tdist_work_wait_stream: NULL work");
  const tdist__backend_ops_t *ops = w->group->ops;
  if (!ops->wait_stream)
    return tdist__error(TDIST_ERR_NOT_SUPPORTED,
                        "tdist_work_wait_stream: backend '%s' has no streams; use "
                        "tdist_work_wait",
                        ops->name);
  if (tdist__work_done(w) && w->status != 0) return w->status;
  return ops->wait_stream(w->group, w, stream);
}

int tdist_work_on_complete(tdist_work_t *w, tdist_work_cb_t cb, void *arg) {
  if (!w || !cb)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "tdist_work_on_complete: NULL %s",
                        w ? "callback" : "work");
  pthread_mutex_lock(&w->mu);
  if (w->cb_state != 0) {
    pthread_mutex_unlock(&w->mu);
    return tdist__error(TDIST_ERR_INVALID_STATE,
                        "tdist_work_on_complete: a callback is already registered");
  }
  if (tdist__work_done(w)) {
    w->cb_state = 2;
    pthread_mutex_unlock(&w->mu);
    cb(w, arg); /* already complete: run on the calling thread */
    return 0;
  }
  w->cb = cb;
  w->cb_arg = arg;
  w->cb_state = 1;
  pthread_mutex_unlock(&w->mu);
  return 0;
}

int tdist_work_release(tdist_work_t *w) {
  if (w) tdist__work_unref(w);
  return 0;
}

int tdist_wait_all(tdist_work_t *const *works, size_t n, int64_t timeout_ms) {
  if (!works && n) return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "tdist_wait_all: NULL array");
  int64_t deadline = timeout_ms > 0 ? tdist__now_ns() + timeout_ms * 1000000 : 0;
  int first_err = 0;
  for (size_t i = 0; i < n; i++) {
    tdist_work_t *w = works[i];
    if (!w) continue;
    int rc =
        tdist__work_done(w) ? w->status : wait_until(w, deadline ? deadline : wait_deadline(w, 0));
    if (rc == TDIST_ERR_IN_PROGRESS) return rc;
    if (rc != 0 && first_err == 0) first_err = rc;
  }
  return first_err;
}

int tdist_wait_any(tdist_work_t *const *works, size_t n, int64_t timeout_ms, size_t *index) {
  size_t live = 0;
  int64_t own_deadline = 0;
  for (size_t i = 0; works && i < n; i++)
    if (works[i]) {
      live++;
      int64_t d = wait_deadline(works[i], 0);
      if (!own_deadline || d > own_deadline) own_deadline = d;
    }
  if (!live || !index)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "tdist_wait_any: no work to wait for");
  int64_t deadline = timeout_ms > 0 ? tdist__now_ns() + timeout_ms * 1000000 : own_deadline;
  /* No shared condition variable spans several works: poll with a short
   * sleep that grows to 1 ms, which bounds the added latency. */
  long sleep_ns = 1000;
  for (;;) {
    for (size_t i = 0; i < n; i++)
      if (works[i] && tdist__work_done(works[i])) {
        *index = i;
        return works[i]->status;
      }
    if (tdist__now_ns() >= deadline) return TDIST_ERR_IN_PROGRESS;
    struct timespec ts = {0, sleep_ns};
    nanosleep(&ts, NULL);
    if (sleep_ns < 1000000) sleep_ns *= 2;
  }
}
