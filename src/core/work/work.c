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
 * The caller-driven path, one state machine (backend.h, submit and test):
 *
 *   submitted --test once--> done?  yes: finished on its thread (claimed,
 *       |                                never handed over: start)
 *       | sync: test (SPIN) while it succeeds within the spin, idem
 *       v
 *   handed over (pushed: QUEUED, then RUNNING when the progress thread
 *       posts it) --> its waiters test it (SPIN runs ending with LAST, then
 *       single looks after each wake-up); the first success a caller sees
 *       is claimed (caller-observed completion), or the progress thread
 *       finishes it (poll, failure, timeout, abort).
 *
 * Owner: the submitting thread until the hand-over, the progress thread
 * after. A handed-over work has one writer of its outcome: a caller claims
 * it with one CAS on w->claim before it writes status and state; the
 * progress thread claims it the same way before it writes a status
 * (tdist__work_claim), and the loser writes nothing. Only success is ever
 * claimed by a caller; failures stay the progress thread's. On a loaded
 * machine each hand-off between threads costs tens of microseconds
 * (bench/nccl/complat_sim.c), more than a small op: so the submitting
 * thread looks first, and a waiter tests rather than waits to be told.
 *
 * A backend's test may move the op (the CPU backend reads and writes its
 * transport and runs the rounds on the testing thread, under its own lock):
 * a waiter keeps testing (TDIST_DRIVE_SPIN_US: busy for TDIST_DRIVE_BUSY_US,
 * then yielding between tests, counted again from each move the test
 * reports) before it sleeps on the process-wide wake-up (wakeup.c) that the
 * backend's completion wake and every publication signal.
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
#include "util/spin.h"

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
/* A waiter whose backend tests (vtable->test) keeps testing this long,
 * yielding the CPU between tests, before it sleeps: the CPU backend's op
 * moves only while someone drives it, and small ops finish within
 * microseconds this way where a sleep and a wake-up cost tens (the CPU
 * backend, docs/cpu-backend.md). Not turned off on a host with few cores:
 * there the waiter does the op's work itself, it does not wait for another
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
/* 1: a synchronous op is driven by its own thread before the progress
 * thread hears of it, and never handed over when it succeeds within the
 * spin (tdist__work_start; docs/architecture.md). 0: handed over after one
 * look, its thread then waits as any waiter. */
TDIST_PARAM(InlineSync, "TDIST_INLINE_SYNC", 1)

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
static _Thread_local int tl_slow;       /* yields in a row that ran another thread */
static _Thread_local int tl_slow_limit; /* ... after which it moves (0: not drawn) */
static _Thread_local uint64_t tl_rand;  /* that limit's draw (the clock mixed in) */

static int64_t busy_window(void) {
  if (tl_busy_ns < 0) tl_busy_ns = tdist__param_DriveBusyUs() * 1000;
  return tl_busy_ns;
}

/* This thread leaves the CPU it shares with another that keeps yielding to
 * it (yield_timed): its affinity is narrowed to the other CPUs it may use,
 * which moves it at once, and put back, which leaves it where it went. A
 * short sleep did that once (the thread woke where a CPU was idle), but a
 * guest whose scheduler packs its vCPUs (this project's 2-core PVM VM,
 * 2026-11-29) woke it beside its peer again, with the other CPU idle: 2 of
 * 3 peers reps of 2000 8-byte all_reduces at n = 2 averaged 5-7 us, the
 * third 0.75. A thread confined to one CPU, or whose mask cannot be read
 * or set, sleeps briefly as before. TDIST_DRIVE_MOVE=0: always the sleep. */
TDIST_PARAM(DriveMove, "TDIST_DRIVE_MOVE", 1)
static void move_off_cpu(void) {
  cpu_set_t mask, others;
  int cpu = sched_getcpu();
  if (tdist__param_DriveMove() && cpu >= 0 && cpu < CPU_SETSIZE &&
      sched_getaffinity(0, sizeof(mask), &mask) == 0 && CPU_ISSET(cpu, &mask) &&
      CPU_COUNT(&mask) > 1) {
    others = mask;
    CPU_CLR(cpu, &others);
    if (sched_setaffinity(0, sizeof(others), &others) == 0) {
      (void)sched_setaffinity(0, sizeof(mask), &mask);
      return;
    }
  }
  struct timespec ts = {0, 1000};
  nanosleep(&ts, NULL);
}

static void yield_timed(void) {
  int64_t t0 = tdist__now_ns();
  sched_yield();
  int64_t dt = tdist__now_ns() - t0, max = tdist__param_DriveBusyUs() * 1000;
  /* A yield that took a scheduler slice (200 us and more) did not run the
   * peer's caller, which yields back within its own test: it ran another
   * job's thread, and yielding again hands that one the next slice while
   * the peer, on the other CPU, waits. Counted as a yield that found
   * nobody: busy again. With three busy processes of another job on the
   * two CPUs (bench/cpu/loaded.sh 3), 8-byte all_reduce at n = 2 took
   * 0.31-590 us a call in five runs (median 0.26-0.68) against 1438-1590
   * in four of five (median 11.5-16) when such yields closed the window
   * too. */
  if (dt <= 5000 || dt >= 200000) {
    tl_slow = 0;
    if (tl_busy_ns < max) tl_busy_ns = tl_busy_ns * 2 + 2000 < max ? tl_busy_ns * 2 + 2000 : max;
    return;
  }
  tl_busy_ns = 0;
  /* Two threads that only yield to each other stay on one CPU: a yielding
   * thread stays runnable, and the balancer moves it late or never (whole
   * 2000-op runs took turns on one CPU of two, 11-13 us an op). Only where
   * busy polling is on at all (a core per rank): on a host whose ranks
   * outnumber its cores, taking turns is all there is. */
  if (max <= 0) return;
  /* Both threads count their yields alike, so both would move at once, to
   * the same CPU: each draws its limit at random in [16, 48), anew after
   * each move. */
  if (!tl_slow_limit || tl_slow >= tl_slow_limit) {
    tl_rand = (tl_rand ^ (uint64_t)t0) * 6364136223846793005ull + 1442695040888963407ull;
    tl_slow_limit = 16 + (int)(tl_rand >> 59);
  }
  if (++tl_slow >= tl_slow_limit) {
    tl_slow = 0;
    tl_slow_limit = 0;
    move_off_cpu();
  }
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

/* One released work kept by the thread that released it, for its next
 * submission: a thread that submits and waits (the synchronous ops, the
 * caller-driven path) then takes no pool lock at all. A thread that ends
 * gives its work back to the pool (cache_key's destructor). */
static _Thread_local tdist_work_t *tl_cached;
static _Thread_local int tl_cache_armed; /* cache_key set for this thread: 1, or -1 (failed) */
static pthread_key_t cache_key;
static pthread_once_t cache_once = PTHREAD_ONCE_INIT;
static int cache_ok;

static void pool_put(tdist_work_t *w) {
  pthread_mutex_lock(&pool_mu);
  w->pool_next = pool_free;
  pool_free = w;
  pthread_mutex_unlock(&pool_mu);
}

/* Thread exit (the key's destructor runs on the exiting thread): its
 * cached work goes back to the pool. */
static void cache_exit(void *arg) {
  (void)arg;
  tdist_work_t *w = tl_cached;
  tl_cached = NULL;
  if (w) pool_put(w);
}

static void cache_init(void) { cache_ok = pthread_key_create(&cache_key, cache_exit) == 0; }

tdist_work_t *tdist__work_alloc(struct tdist_group *g) {
  tdist_work_t *w = tl_cached;
  if (w) {
    tl_cached = NULL;
  } else {
    pthread_mutex_lock(&pool_mu);
    if (!pool_free && pool_grow() != 0) {
      pthread_mutex_unlock(&pool_mu);
      return NULL;
    }
    w = pool_free;
    pool_free = w->pool_next;
    pthread_mutex_unlock(&pool_mu);
  }

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
  w->spun = 0;
  atomic_store_explicit(&w->claim, TDIST__CLAIM_OPEN, memory_order_relaxed);
  w->group = g;
  w->bop.args = &w->args;
  w->bop.seq = 0;
  w->bop.timeout_ms = 0;
  atomic_store_explicit(&w->t_claimed_ns, 0, memory_order_relaxed);
  tdist__list_init(&w->bop.link);
  w->t_enqueue_ns = w->t_start_ns = w->t_end_ns = w->deadline_ns = 0;
  w->start_at_stamp = 0;
  w->waiters = 0;
  w->cb = NULL;
  w->cb_arg = NULL;
  w->cb_state = 0;
  w->msg[0] = '\0';
  return w;
}

void tdist__work_unref(tdist_work_t *w) {
  if (atomic_fetch_sub_explicit(&w->refs, 1, memory_order_acq_rel) == 1)
    tdist__work_release_owned(w);
}

void tdist__work_release_owned(tdist_work_t *w) {
  if (w->args.p2p && w->args.p2p != w->p2p_inline) tdist__free(w->args.p2p);
  w->args.p2p = NULL;
  /* Any thread, the progress thread too: it keeps at most one, and asking
   * which thread this is would cost a second thread-local lookup per op. */
  if (!tl_cached) {
    if (!tl_cache_armed) {
      /* Once per thread: the key (any non-NULL value) makes the thread's
       * exit run cache_exit. */
      pthread_once(&cache_once, cache_init);
      tl_cache_armed = cache_ok && pthread_setspecific(cache_key, &tl_cached) == 0 ? 1 : -1;
    }
    if (tl_cache_armed == 1) {
      tl_cached = w; /* this thread's next submission takes it */
      return;
    }
  }
  pool_put(w);
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
  /* A waiter may have seen the op succeed while it was still QUEUED (the
   * backend started it in submit): SUCCESS stays. */
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

/* Caller thread (never the progress thread): one test of w with `flags`,
 * and a success claimed and published (the callback is left to the
 * progress thread, which finishes the work when it sees it). owned: w is
 * still only this thread's (tdist__work_start): no CAS, no lock, no
 * wake-up. Returns the test's answer (1, 0, 2), or -1 when w was finished
 * already and no test was needed (a LAST test is made all the same: it
 * ends this thread's run, backend.h). */
static int test_once(tdist_work_t *w, unsigned flags, int owned) {
  int last = (flags & TDIST_BACKEND_TEST_LAST) != 0;
  if (!owned && !last && (tdist__work_done(w) || atomic_load(&w->claim) != TDIST__CLAIM_OPEN))
    return -1;
  /* Counted before the state is read again: a group destroy that saw every
   * work finished then waits for this test to return
   * (tdist__work_quiesce_tests). An owned work is not counted: it is inside
   * its submission on this thread, not yet pending, so no destroy waits
   * for it (one that runs meanwhile races the whole submission, which the
   * API does not allow), and the two atomic operations were a sixth of a
   * small synchronous op's. */
  if (!owned) atomic_fetch_add(&testing, 1);
  int r = w->test(w->test_state, &w->bop, flags);
  if (owned && r != 1 && !w->t_enqueue_ns) tdist__work_stamp(w, tdist__now_ns());
  if (r == 1 && owned) {
    int64_t now = tdist__now_ns();
    tdist__work_stamp(w, now); /* done at its first test: the op's only clock read */
    atomic_store_explicit(&w->t_claimed_ns, now, memory_order_relaxed);
    atomic_store_explicit(&w->claim, TDIST__CLAIM_CALLER, memory_order_relaxed);
    w->status = 0;
    atomic_store_explicit(&w->state, TDIST_WORK_COMPLETED, memory_order_release);
  } else if (r == 1 && !tdist__work_done(w)) {
    int open = TDIST__CLAIM_OPEN;
    atomic_store_explicit(&w->t_claimed_ns, tdist__now_ns(), memory_order_relaxed);
    if (atomic_compare_exchange_strong(&w->claim, &open, TDIST__CLAIM_CALLER)) {
      w->status = 0; /* msg is "" since alloc */
      store_state(w, 0);
    }
  }
  if (!owned) atomic_fetch_sub(&testing, 1);
  return r;
}

/* One look (test_once, no flags): 1 once w is done, by anyone. */
static int drive(tdist_work_t *w) {
  if (tdist__work_done(w)) return 1;
  if (!w->test || tdist__progress_on_thread()) return 0;
  test_once(w, 0, 0);
  return tdist__work_done(w);
}

/* A caller thread's run of SPIN tests on w: until it is done, *aborted is
 * set, the deadline, or the spin's end (TDIST_DRIVE_SPIN_US from the start
 * or the last move the test reported), busy for the busy window and then
 * yielding between tests; then one LAST test ends the run (backend.h).
 * 1 once w is done. */
static int spin(tdist_work_t *w, int owned, int64_t deadline_ns, const atomic_int *aborted) {
  int64_t start = 0, now, end = 0;
  int64_t busy_ns = busy_window(), spin_ns = tdist__param_DriveSpinUs() * 1000;
  unsigned looks = 0;
  int yielding = 0, moved = 0;
  int r;
  for (;;) {
    r = test_once(w, TDIST_BACKEND_TEST_SPIN, owned);
    if (r == 1 || (r == -1 && tdist__work_done(w))) break;
    if (aborted && atomic_load_explicit(aborted, memory_order_acquire)) break;
    /* Busy polling reads the clock every 8th test only, the first too: on
     * a virtual machine a clock read costs about what a test of a small op
     * does (a quarter of an 8-byte all_reduce's cycles at n = 2 went to
     * it), and most small ops end within a few tests. With no busy window
     * (a contended CPU) the first failed test reads it and yields. */
    moved |= r == 2;
    if (busy_ns > 0 && !yielding && (++looks & 7)) {
      tdist__cpu_pause(); /* the sibling hyperthread gets the pipeline */
      continue;
    }
    now = tdist__now_ns();
    if (!start) { /* the window counts from the first clock read */
      start = now;
      end = now + spin_ns;
      if (deadline_ns && end > deadline_ns) end = deadline_ns;
    }
    if (moved) { /* it moved since the last read: this thread keeps it, busy again */
      moved = 0;
      start = now;
      end = now + spin_ns;
      if (deadline_ns && end > deadline_ns) end = deadline_ns;
    }
    if (now >= end) break;
    yielding = now - start >= busy_ns;
    if (yielding) {
      yield_timed();
      busy_ns = tl_busy_ns;
    } else {
      tdist__cpu_pause();
    }
  }
  /* A test that said 1 ended the run; any other end is told (LAST), and the
   * backend's last look may still find the op done. */
  if (r != 1) r = test_once(w, TDIST_BACKEND_TEST_LAST, owned);
  /* Not owned: a success seen here may have lost its claim to the progress
   * thread, which publishes it in a moment (the waiter sleeps until then). */
  return owned ? r == 1 : tdist__work_done(w);
}

void tdist__work_stamp(tdist_work_t *w, int64_t now) {
  if (w->t_enqueue_ns) return;
  w->t_enqueue_ns = now;
  w->deadline_ns = now + w->bop.timeout_ms * 1000000;
  if (w->start_at_stamp) w->t_start_ns = now;
}

int tdist__work_start(tdist_work_t *w, int sync, const atomic_int *aborted) {
  if (!w->test) return 0;
  if (sync && tdist__param_InlineSync()) {
    w->spun = 1; /* a wait that follows goes to sleep at once (wait_until) */
    /* The run's first test before spin sets its windows up: most small ops
     * are done here (the CPU backend's now lane finished them in submit). */
    if (test_once(w, TDIST_BACKEND_TEST_SPIN, 1) == 1) return 1;
    return spin(w, 1, 0, aborted);
  }
  return test_once(w, 0, 1) == 1; /* progress once inline */
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
 * costs more than that, so first spin. A waiter whose backend tests tests
 * (spin: each test may do the op's work, and sees a completion without a
 * hand-off), then sleeps on the process-wide wake-up (wait_driving).
 * Without a test: 2 us busy, then yielding the CPU until
 * TDIST_WAIT_SPIN_NS (yielding matters when threads outnumber cores: the
 * progress thread may need this core to finish the op), then the work's
 * condition variable. */
static int wait_until(tdist_work_t *w, int64_t deadline_ns) {
  if (w->test) {
    /* Its thread spun on it already (tdist__work_start): sleep now. */
    if (!w->spun && spin(w, 0, deadline_ns, NULL)) return w->status;
    return wait_driving(w, deadline_ns);
  }
  int64_t start = tdist__now_ns(), now = start;
  int64_t spin_end = start + tdist__param_WaitSpinNs();
  if (deadline_ns && spin_end > deadline_ns) spin_end = deadline_ns;
  while (!tdist__work_done(w) && now < spin_end) {
    if (now - start >= 2000)
      sched_yield();
    else
      tdist__cpu_pause();
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
