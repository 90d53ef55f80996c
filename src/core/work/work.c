/*
 * work.c - work handles: the pool, reference counting, the state machine and
 * the public tdist_work_* functions (calls progress and util only).
 *
 * Pool: works are carved from the heap in slabs and never returned to it;
 * released works go back on a free list, so once the pool has grown to the
 * number of works in flight, submitting and completing allocates nothing.
 * The free list is a mutex-protected stack: submit and release each take the
 * lock once, uncontended in the common case (tens of ns).
 *
 * State: written by the progress thread (tdist__work_publish), published
 * with a store after status and message; readers use acquire loads, so
 * tdist_work_is_completed of a finished work is one load.
 *
 * Caller-observed completion: a caller thread that tests or waits on a
 * RUNNING work whose backend has vtable->test asks the backend itself
 * (drive) instead of waiting for the progress thread to notice, publish and
 * wake it -- on a loaded machine each of those hand-offs costs tens of
 * microseconds (bench/nccl/complat_sim.c). Single writer: the caller claims
 * the work with one CAS on w->claim before it writes status and state; the
 * progress thread claims it the same way before it writes a status
 * (tdist__work_claim), and the loser writes nothing. Only success is ever
 * claimed by a caller; failures stay the progress thread's. A waiter that
 * finds its op still running sleeps on the process-wide wake-up (wakeup.c)
 * that the backend's completion wake and every publication signal.
 *
 * Caller-driven ops (caps.drives, the CPU backend): the backend's test does
 * more than look, it moves the op (reads and writes its transport, runs its
 * rounds) on the waiting thread, under the backend's own lock. Such a
 * waiter keeps testing (TDIST_DRIVE_SPIN_US: busy for TDIST_DRIVE_BUSY_US,
 * then yielding between tests) before it sleeps, and may test an op the
 * backend started in submit while the work is still QUEUED; a success
 * claimed then stays (tdist__work_running moves only QUEUED to RUNNING).
 * A synchronous op the backend started in submit is first driven by its
 * thread before the progress thread hears of it at all
 * (tdist__work_drive_inline): finished within the spin, it never reaches
 * the progress thread.
 */
#include "core/work/work.h"

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
/* A waiter whose backend drives its op from the waiting thread (caps.drives)
 * keeps driving this long, yielding the CPU between tests, before it sleeps:
 * the op moves only while someone drives it, and small ops finish within
 * microseconds this way where a sleep and a wake-up cost tens (the CPU
 * backend, docs/cpu-backend.md). Not turned off on a host with few cores:
 * here the waiter does the op's work itself, it does not wait for another
 * thread to. */
TDIST_PARAM(DriveSpinUs, "TDIST_DRIVE_SPIN_US", 1000)
/* Of that spin, the first microseconds are busy polling (a pause between
 * tests, no system call) before the waiter starts yielding between tests:
 * on a host with a core per rank the peer answers within a microsecond or
 * two, and a sched_yield is a system call that costs about as much on a
 * virtual machine (1.2-1.4 us on the 2-core CI VM), so yielding from the
 * first test doubled a small op's time. Where this host's ranks outnumber
 * its CPUs (tdist__ranks_exceed_cpus) a busy waiter would hold the core a
 * peer's caller needs: it yields at once. */
TDIST_PARAM(DriveBusyUs, "TDIST_DRIVE_BUSY_US", tdist__ranks_exceed_cpus() ? 0 : 20)

/* The busy part of this thread's spin, adapted to whether a peer's caller
 * shares its CPU (yield_timed): up to TDIST_DRIVE_BUSY_US. A yield that
 * returns at once (its system call alone) found nothing else to run on
 * this CPU: busy polling costs nobody, and the window grows back. One that
 * took longer ran another thread first: most often the peer's caller,
 * which the scheduler put on this CPU (a waiter woken from a sleep lands
 * beside its waker), and which busy polling would keep from its op for a
 * whole window (20 us per op, where yielding at once takes 3): the window
 * closes until the threads are apart again. */
static _Thread_local int64_t tl_busy_ns = -1;
static _Thread_local int tl_slow; /* yields in a row that ran another thread */

static int64_t busy_window(void) {
  if (tl_busy_ns < 0) tl_busy_ns = tdist__param_DriveBusyUs() * 1000;
  return tl_busy_ns;
}

static void yield_timed(void) {
  int64_t t0 = tdist__now_ns();
  sched_yield();
  int64_t dt = tdist__now_ns() - t0, max = tdist__param_DriveBusyUs() * 1000;
  if (dt <= 5000) {
    tl_slow = 0;
    if (tl_busy_ns < max) tl_busy_ns = tl_busy_ns * 2 + 2000 < max ? tl_busy_ns * 2 + 2000 : max;
    return;
  }
  tl_busy_ns = 0;
  /* Two threads that only yield to each other stay on one CPU: a yielding
   * thread stays runnable, and the balancer moves it late or never (whole
   * 2000-op runs took turns on one CPU of two, 11 us an op). A short sleep
   * takes it off the run queue: it wakes where a CPU is idle. Only where
   * busy polling is on at all (a core per rank): on a host whose ranks
   * outnumber its cores, taking turns is all there is. */
  if (max > 0 && ++tl_slow >= 16) {
    tl_slow = 0;
    struct timespec ts = {0, 1000};
    nanosleep(&ts, NULL);
  }
}

/* A pause between two busy tests: the sibling hyperthread gets the core's
 * pipeline, and the loop does not flood the memory system. */
static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield" ::: "memory");
#endif
}

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
  w->captured = 0;
  w->test = NULL;
  w->test_state = NULL;
  w->drives = 0;
  w->drive_mark = NULL;
  w->marked = 0;
  w->spun = 0;
  w->moved = 0;
  atomic_store_explicit(&w->claim, TDIST__CLAIM_OPEN, memory_order_relaxed);
  w->group = g;
  w->bop.args = &w->args;
  w->bop.seq = 0;
  w->bop.timeout_ms = 0;
  w->bop.quiet = 0;
  atomic_store_explicit(&w->t_claimed_ns, 0, memory_order_relaxed);
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
  /* An op the backend started in submit has its start time already (ops.c). */
  if (!w->t_start_ns) w->t_start_ns = tdist__now_ns();
  /* A driving caller may have seen the op succeed while it was still QUEUED
   * (caps.drives: the backend started it in submit): SUCCESS stays. */
  int queued = TDIST_WORK_QUEUED;
  atomic_compare_exchange_strong_explicit(&w->state, &queued, TDIST_WORK_RUNNING,
                                          memory_order_release, memory_order_relaxed);
}

/* Threads inside a backend's test right now (tdist__work_quiesce_tests). */
static atomic_int testing;

int tdist__work_claim(tdist_work_t *w) {
  int open = TDIST__CLAIM_OPEN;
  if (atomic_compare_exchange_strong(&w->claim, &open, TDIST__CLAIM_PROGRESS)) return 1;
  if (open == TDIST__CLAIM_PROGRESS) return 1;
  /* A caller won: it writes the status, then the state, in a moment. */
  while (!tdist__work_done(w))
    sched_yield();
  return 0;
}

void tdist__work_quiesce_tests(void) {
  while (atomic_load(&testing) > 0)
    sched_yield();
}

/* Store the terminal state (status and msg written before: readers see
 * them after this), wake the waiters; return the callback to run, if any. */
static tdist_work_cb_t store_state(tdist_work_t *w, int run_cb) {
  pthread_mutex_lock(&w->mu);
  atomic_store(&w->state, tdist__work_state_for(w->status));
  tdist_work_cb_t cb = NULL;
  if (run_cb && w->cb_state == 1) {
    cb = w->cb;
    w->cb_state = 2;
  }
  if (w->waiters) pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
  tdist__wakeup_all(); /* the waiters that drive their own op (wakeup.c) */
  return cb;
}

void tdist__work_publish(tdist_work_t *w) {
  if (!w->t_end_ns) w->t_end_ns = tdist__now_ns();
  tdist_work_cb_t cb = NULL;
  if (tdist__work_caller_claimed(w)) {
    /* Published by a caller already (drive); the callback is ours. */
    pthread_mutex_lock(&w->mu);
    if (w->cb_state == 1) {
      cb = w->cb;
      w->cb_state = 2;
    }
    pthread_mutex_unlock(&w->mu);
  } else {
    assert(!tdist__work_done(w));
    cb = store_state(w, 1);
  }
  if (cb) cb(w, w->cb_arg);
}

/* Caller thread (never the progress thread): ask the backend whether the
 * work succeeded, and if so claim and publish it. The callback is left to
 * the progress thread (the type's contract names it or the registering
 * thread), which finishes the work when it sees it. Returns 1 once the work
 * is done, by anyone. */
static int drive(tdist_work_t *w) {
  if (tdist__work_done(w)) return 1;
  if (!w->test || tdist__progress_on_thread()) return 0;
  /* Counted before the state is read: a group destroy that saw every work
   * finished then waits for this test to return (tdist__work_quiesce_tests). */
  atomic_fetch_add(&testing, 1);
  int st = atomic_load(&w->state);
  int r = 0;
  if ((st == TDIST_WORK_RUNNING || (st == TDIST_WORK_QUEUED && w->drives)) &&
      atomic_load(&w->claim) == TDIST__CLAIM_OPEN && (r = w->test(w->test_state, &w->bop)) == 2)
    w->moved = 1; /* not done, but it moved: the waiter drives on (wait_until) */
  if (r == 1) {
    int open = TDIST__CLAIM_OPEN;
    atomic_store_explicit(&w->t_claimed_ns, tdist__now_ns(), memory_order_relaxed);
    if (atomic_compare_exchange_strong(&w->claim, &open, TDIST__CLAIM_CALLER)) {
      w->status = 0; /* msg is "" since alloc */
      store_state(w, 0);
    }
  }
  atomic_fetch_sub(&testing, 1);
  return tdist__work_done(w);
}

int tdist__work_drive_inline(tdist_work_t *w, const atomic_int *aborted) {
  int64_t start = tdist__now_ns(), now = start;
  int64_t busy_ns = busy_window(), spin_ns = tdist__param_DriveSpinUs() * 1000;
  int64_t end = start + spin_ns;
  int done = 0;
  for (;;) {
    /* Counted as drive() counts (tdist__work_quiesce_tests). */
    atomic_fetch_add(&testing, 1);
    int r = w->test(w->test_state, &w->bop);
    atomic_fetch_sub(&testing, 1);
    done = r == 1;
    if (done || atomic_load_explicit(aborted, memory_order_acquire)) break;
    now = tdist__now_ns();
    if (r == 2) { /* it moves: this thread keeps it, busy again */
      end = now + spin_ns;
      start = now;
    }
    if (now >= end) break;
    if (now - start >= busy_ns) {
      yield_timed();
      busy_ns = tl_busy_ns;
    } else {
      cpu_relax();
    }
  }
  w->spun = 1; /* a wait that follows goes to sleep at once (wait_until) */
  if (!done) return 0;
  /* Nobody else holds the work (it was never pushed): the claim and the
   * state need no CAS, no lock and no wake-up. */
  atomic_store_explicit(&w->t_claimed_ns, tdist__now_ns(), memory_order_relaxed);
  atomic_store_explicit(&w->claim, TDIST__CLAIM_CALLER, memory_order_relaxed);
  w->status = 0;
  atomic_store_explicit(&w->state, TDIST_WORK_COMPLETED, memory_order_release);
  return 1;
}

/* ---- public API --------------------------------------------------------- */

int tdist_work_is_completed(const tdist_work_t *w) { return w ? drive((tdist_work_t *)w) : 0; }

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

/* Written by the submitting thread before the handle was returned. */
int tdist_work_is_captured(const tdist_work_t *w) { return w ? w->captured : 0; }

/* Any thread: the fields are written before the completion is published
 * (release) and read after tdist__work_done (acquire); backend.h, rx_*. */
int tdist_work_status_info(const tdist_work_t *w, int *source, int *tag, size_t *count) {
  if (!w) return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "tdist_work_status_info: NULL work");
  if (w->args.type != TDIST_OP_RECV)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                        "tdist_work_status_info: the work is a %s, not a receive",
                        tdist_op_name(w->args.type));
  if (!tdist__work_done(w)) return TDIST_ERR_IN_PROGRESS;
  if (w->status != 0) return w->status;
  int any = w->args.root == TDIST_ANY_SOURCE || w->args.tag == TDIST_ANY_TAG;
  if (source) *source = any ? w->bop.rx_source : w->args.root;
  if (tag) *tag = any ? w->bop.rx_tag : w->args.tag;
  if (count) *count = any ? w->bop.rx_count : w->args.count;
  return 0;
}

/* A waiter that tests its own op (drive) sleeps on the process-wide
 * wake-up, which the backend's completion wake and every publication signal
 * (wakeup.c); this nap bounds a sleep that nothing signals (a work still
 * QUEUED when its op finished is tested again after the progress thread
 * publishes it, which signals too; the nap is only a safety net). */
#define DRIVE_NAP_NS (100 * 1000000LL)

static int wait_driving(tdist_work_t *w, int64_t deadline_ns) {
  while (!drive(w)) {
    int64_t now = tdist__now_ns();
    if (deadline_ns && now >= deadline_ns) return TDIST_ERR_IN_PROGRESS;
    uint32_t seen = tdist__wakeup_prepare();
    if (drive(w)) {
      tdist__wakeup_cancel();
      break;
    }
    int64_t until = now + DRIVE_NAP_NS;
    tdist__wakeup_sleep(seen, deadline_ns && deadline_ns < until ? deadline_ns : until);
  }
  return w->status;
}

/* Wait until done or until the absolute CLOCK_MONOTONIC deadline (ns; 0:
 * none). Most small ops finish within microseconds, and a futex sleep/wake
 * costs more than that, so first spin: 2 us busy, then yielding the CPU
 * until TDIST_WAIT_SPIN_NS (yielding matters when threads outnumber cores:
 * the progress thread may need this core to finish the op). A waiter that
 * drives its op yields from its first test on: each test does the op's
 * work, so a busy spin gains nothing, while a peer's caller that shares
 * this core (ranks outnumber cores, or the scheduler put two on one core of
 * a busy host) is what the op waits for: 2 us busy on each side made such
 * a pair take about 7 us per small op where yielding at once takes about 3
 * (2-core VM, all_gather 1 KiB n=2, p50), and n=4 all_reduce 8 B p50
 * 11-20 us where yielding takes 5-6. */
static int wait_until(tdist_work_t *w, int64_t deadline_ns) {
  int64_t start = tdist__now_ns(), now = start;
  int64_t busy_ns = w->drives ? busy_window() : 2000;
  int64_t spin_end =
      start + (w->drives ? tdist__param_DriveSpinUs() * 1000 : tdist__param_WaitSpinNs());
  /* Its thread spun on it already (tdist__work_drive_inline): sleep now. */
  if (w->spun) spin_end = start;
  if (deadline_ns && spin_end > deadline_ns) spin_end = deadline_ns;
  /* Written only when set: only the thread of a synchronous op sets it (ops.c),
   * and other threads may wait on a shared work at the same time. */
  int marked = w->marked;
  if (marked) w->marked = 0;
  int64_t spin_ns = spin_end - start;
  while (!drive(w) && now < spin_end) {
    if (!marked && w->drive_mark) {
      w->drive_mark(w->test_state, 1); /* polled from here on (backend.h) */
      marked = 1;
    }
    if (w->moved) { /* a step of a long op: the spin (busy first) counts from here */
      w->moved = 0;
      if (!w->spun) {
        spin_end = now + spin_ns;
        start = now;
      }
    }
    if (now - start >= busy_ns && w->drives) {
      yield_timed();
      busy_ns = tl_busy_ns;
    } else if (now - start >= busy_ns) {
      sched_yield();
    } else {
      cpu_relax();
    }
    now = tdist__now_ns();
  }
  /* Unmarked before the tests below, which then see what arrived meanwhile. */
  if (marked) w->drive_mark(w->test_state, 0);
  if (tdist__work_done(w)) return w->status;
  if (w->test) return wait_driving(w, deadline_ns);
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
  if (tdist__work_done(w)) {
    if (w->marked) { /* ops.c marked it (its thread alone writes it) */
      if (w->drive_mark) w->drive_mark(w->test_state, 0);
      w->marked = 0;
    }
    return w->status;
  }
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
      if (works[i] && drive(works[i])) {
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
