/*
 * work.c - work handles: the pool, reference counting, the state machine and
 * the public tdist_work_* functions (layer 3: calls progress and util only).
 *
 * Pool: works are carved from the heap in slabs and never returned to it;
 * released works go back on a free list, so once the pool has grown to the
 * number of works in flight, submitting and completing allocates nothing.
 * The free list is a mutex-protected stack: submit and release each take the
 * lock once, uncontended in the common case (tens of ns).
 *
 * State: written only by the progress thread (tdist__work_publish), published
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

#include "util/alloc.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/param.h"

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

tdist_work_t *tdist__work_alloc(struct tdist_group *g) {
  pthread_mutex_lock(&pool_mu);
  if (!pool_free && pool_grow() != 0) {
    pthread_mutex_unlock(&pool_mu);
    return NULL;
  }
  tdist_work_t *w = pool_free;
  pool_free = w->pool_next;
  pthread_mutex_unlock(&pool_mu);

  /* Reset what a previous use left (mu/cv stay initialised; args and the
   * backend's part of bop are written by their owners). */
  w->qnode.next = NULL;
  w->dnode.next = NULL;
  tdist__list_init(&w->inflight);
  w->pool_next = NULL;
  atomic_store_explicit(&w->refs, 2, memory_order_relaxed);
  atomic_store_explicit(&w->state, TDIST_WORK_QUEUED, memory_order_relaxed);
  w->status = TDIST_ERR_IN_PROGRESS;
  w->completing = 0;
  w->group = g;
  w->bop.args = &w->args;
  w->bop.seq = 0;
  w->bop.timeout_ms = 0;
  tdist__list_init(&w->bop.link);
  w->t_enqueue_ns = w->t_start_ns = w->t_end_ns = w->deadline_ns = 0;
  w->waiters = 0;
  w->cb = NULL;
  w->cb_arg = NULL;
  w->cb_state = 0;
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

int tdist__work_state_for(int status) {
  switch (status) {
  case 0: return TDIST_WORK_COMPLETED;
  case TDIST_ERR_TIMEOUT: return TDIST_WORK_TIMED_OUT;
  case TDIST_ERR_ABORTED:
  case TDIST_ERR_REMOTE_FAILED: return TDIST_WORK_ABORTED;
  default: return TDIST_WORK_FAILED;
  }
}

void tdist__work_running(tdist_work_t *w) {
  w->t_start_ns = tdist__now_ns();
  atomic_store_explicit(&w->state, TDIST_WORK_RUNNING, memory_order_release);
}

void tdist__work_publish(tdist_work_t *w) {
  assert(!tdist__work_done(w));
  if (!w->t_end_ns) w->t_end_ns = tdist__now_ns();
  pthread_mutex_lock(&w->mu);
  /* status and msg were written before: readers see them after this. */
  atomic_store_explicit(&w->state, tdist__work_state_for(w->status), memory_order_release);
  tdist_work_cb_t cb = NULL;
  if (w->cb_state == 1) {
    cb = w->cb;
    w->cb_state = 2;
  }
  if (w->waiters) pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
  if (cb) cb(w, w->cb_arg);
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

uint64_t tdist_work_seq(const tdist_work_t *w) { return w ? w->bop.seq : 0; }

/* Wait until done or until the absolute CLOCK_MONOTONIC deadline (ns; 0:
 * none). Most small ops finish within microseconds, and a futex sleep/wake
 * costs more than that, so first spin: 2 us busy, then yielding the CPU
 * until TDIST_WAIT_SPIN_NS (yielding matters when threads outnumber cores:
 * the progress thread may need this core to finish the op). */
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
    if (!deadline_ns) {
      pthread_cond_wait(&w->cv, &w->mu);
      continue;
    }
    struct timespec ts = {.tv_sec = deadline_ns / 1000000000, .tv_nsec = deadline_ns % 1000000000};
    if (pthread_cond_timedwait(&w->cv, &w->mu, &ts) == ETIMEDOUT) timed_out = 1;
  }
  w->waiters--;
  pthread_mutex_unlock(&w->mu);
  return tdist__work_done(w) ? w->status : TDIST_ERR_IN_PROGRESS;
}

/* A wait that could never end: the progress thread (a completion callback)
 * would wait for itself. */
static int refuse_on_progress(const char *fn) {
  return tdist__error(TDIST_ERR_INVALID_STATE,
                      "%s: blocking wait on the progress thread (from a completion callback); "
                      "use tdist_work_is_completed or another callback",
                      fn);
}

/* timeout_ms <= 0 waits for the op itself: its deadline is enforced by the
 * watchdog, which finishes it (TIMED_OUT) at the deadline, so the wait always
 * ends, and never returns while the op still owns the caller's buffers. */
int tdist_work_wait(tdist_work_t *w, int64_t timeout_ms) {
  if (!w) return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "tdist_work_wait: NULL work");
  if (tdist__work_done(w)) return w->status;
  if (tdist__progress_on_thread()) return refuse_on_progress("tdist_work_wait");
  return wait_until(w, timeout_ms > 0 ? tdist__now_ns() + timeout_ms * 1000000 : 0);
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
    if (!tdist__work_done(w) && tdist__progress_on_thread())
      return refuse_on_progress("tdist_wait_all");
    int rc = tdist__work_done(w) ? w->status : wait_until(w, deadline);
    if (rc == TDIST_ERR_IN_PROGRESS) return rc;
    if (rc != 0 && first_err == 0) first_err = rc;
  }
  return first_err;
}

int tdist_wait_any(tdist_work_t *const *works, size_t n, int64_t timeout_ms, size_t *index) {
  size_t live = 0;
  for (size_t i = 0; works && i < n; i++)
    if (works[i]) live++;
  if (!live || !index)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "tdist_wait_any: no work to wait for");
  int64_t deadline = timeout_ms > 0 ? tdist__now_ns() + timeout_ms * 1000000 : 0;
  /* No shared condition variable spans several works: poll with a short
   * sleep that grows to 1 ms, which bounds the added latency. Without a
   * timeout each work's own deadline ends the wait (the watchdog). */
  long sleep_ns = 1000;
  for (;;) {
    for (size_t i = 0; i < n; i++)
      if (works[i] && tdist__work_done(works[i])) {
        *index = i;
        return works[i]->status;
      }
    if (tdist__progress_on_thread()) return refuse_on_progress("tdist_wait_any");
    if (deadline && tdist__now_ns() >= deadline) return TDIST_ERR_IN_PROGRESS;
    struct timespec ts = {0, sleep_ns};
    nanosleep(&ts, NULL);
    if (sleep_ns < 1000000) sleep_ns *= 2;
  }
}
