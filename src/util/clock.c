/*
 * clock.c - the time stamp counter's line to CLOCK_MONOTONIC (clock.h).
 *
 * Calibration: the first slow read takes an origin (counter, ns); reads
 * are clock_gettime's for 1 ms, and then the counter's rate is the slope
 * from that origin, which grows more exact as the process lives (a pair's
 * error over the whole span). The first line starts a pair's width ahead,
 * so that no clock_gettime value handed out before is ahead of it. Each
 * anchoring reads (counter, clock_gettime, counter) and keeps the pair only
 * when the two counter reads are close, so a thread preempted between them
 * does not skew the line.
 *
 * Re-anchoring, once a period (the origin's age, up to 1 s), and only
 * then: the new line starts where the old one is when it replaces it, a
 * hair ahead (publish_slew: so no reader ever sees time go back), or at
 * CLOCK_MONOTONIC if the old line is behind it (a step forward), and
 * reaches CLOCK_MONOTONIC one period later. A line ahead of
 * CLOCK_MONOTONIC slows down (to half speed at most) until it is caught
 * up.
 *
 * Threads: any. The anchoring thread holds `mu` for a few clock reads; a
 * reader that finds it held does not take it: it reads the current line,
 * waiting only while that is being rewritten (line_at). clock_gettime is
 * read only while calibrating. A forked child re-inits `mu` (at_fork).
 */
#include "util/clock.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>

#include "util/param.h"

TDIST_PARAM(ClockTsc, "TDIST_CLOCK_TSC", 1)

struct tdist__clock_line tdist__clock;

static int64_t sys_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

#ifdef TDIST__CLOCK_TSC

#include <cpuid.h>

#define CAL_NS 1000000LL       /* the origin's age before the line is used */
#define PERIOD_NS 1000000000LL /* between anchorings, at most */
#define SLEW_AHEAD 256u        /* ticks (about 0.1 us): an out-of-order window and more */
#define PAIR_TICKS 2000u       /* two counter reads further apart (about 0.8 us): preempted */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static int usable;             /* the kernel keeps time with the counter, and TDIST_CLOCK_TSC */
static uint64_t org_tsc;       /* (mu) the calibration's origin */
static _Atomic int64_t org_ns; /* (mu; read by any) 0: none yet */

static void at_fork(void);

/* The CPU says its counter is invariant (CPUID 0x80000007, EDX bit 8:
 * the same rate in every power state, "nonstop_tsc" in /proc/cpuinfo). A
 * KVM guest's kvm-clock is that counter scaled by the host's parameters
 * (pvclock), and its vDSO reads it only when the host marks it stable
 * across vCPUs; the line re-anchors against it every second all the same
 * (a migration to a host of another rate is slewed out within a period).
 * On this project's 2-core KVM guests (2026-12-02) clock_gettime took
 * 30 ns there against 12 for the counter alone, on every op. */
static int invariant(void) {
  unsigned a, b, c, d;
  return __get_cpuid(0x80000007, &a, &b, &c, &d) && (d & (1u << 8));
}

static void probe(void) {
  char cs[32] = "";
  FILE *f = fopen("/sys/devices/system/clocksource/clocksource0/current_clocksource", "r");
  if (f) {
    if (!fgets(cs, sizeof(cs), f)) cs[0] = '\0';
    fclose(f);
  }
  usable = tdist__param_ClockTsc() != 0 &&
           (strncmp(cs, "tsc\n", 4) == 0 || (strncmp(cs, "kvm-clock\n", 10) == 0 && invariant()));
  if (usable) pthread_atfork(NULL, NULL, at_fork);
}

/* (mu) Make seq odd: readers take the line no more until store_line. The
 * fence is full, so an RDTSC after it is ordered after the store
 * (publish_slew). Returns the odd seq. */
static uint32_t line_open(void) {
  struct tdist__clock_line *l = &tdist__clock;
  uint32_t s = atomic_load_explicit(&l->seq, memory_order_relaxed) + 1;
  atomic_store_explicit(&l->seq, s, memory_order_relaxed);
  atomic_thread_fence(memory_order_seq_cst);
  return s;
}

/* (mu) Fill the line's fields (seq odd) and make seq even again. */
static void store_line(uint64_t tsc0, int64_t ns0, uint64_t mult, uint64_t span, uint32_t odd) {
  struct tdist__clock_line *l = &tdist__clock;
  atomic_store_explicit(&l->tsc0, tsc0, memory_order_relaxed);
  atomic_store_explicit(&l->ns0, ns0, memory_order_relaxed);
  atomic_store_explicit(&l->mult, mult, memory_order_relaxed);
  atomic_store_explicit(&l->span, span, memory_order_relaxed);
  atomic_store_explicit(&l->on, 1, memory_order_relaxed);
  atomic_store_explicit(&l->seq, odd + 1, memory_order_release);
}

/* A (counter, ns) pair read close together, and its width in ticks: 0,
 * or -1. */
static int pair(uint64_t *tsc, int64_t *ns, uint64_t *width) {
  for (int i = 0; i < 4; i++) {
    uint64_t a = __rdtsc();
    int64_t n = sys_ns();
    uint64_t b = __rdtsc();
    if (b >= a && b - a < PAIR_TICKS) {
      *tsc = a + (b - a) / 2;
      *ns = n;
      *width = b - a;
      return 0;
    }
  }
  return -1;
}

static int64_t at(uint64_t tsc0, int64_t ns0, uint64_t mult, uint64_t t) {
  return t <= tsc0 ? ns0 : ns0 + (int64_t)(((unsigned __int128)(t - tsc0) * mult) >> 32);
}

/* The line's value now, whatever its span (0: no line). A line being
 * rewritten (seq odd) is waited for, yielding after a while: the writer
 * holds mu for a few clock reads, and falling back to clock_gettime then
 * could hand out a value below the line's last (core_clock under TSan,
 * with the writer preempted, saw that). A forked child never finds seq
 * odd for ever: at_fork resets what a fork in the middle left. */
static int64_t line_at(void) {
  struct tdist__clock_line *l = &tdist__clock;
  for (unsigned i = 0;; i++) {
    uint32_t s = atomic_load_explicit(&l->seq, memory_order_acquire);
    if (s & 1) {
      if (i >= 64) sched_yield();
      continue;
    }
    if (!atomic_load_explicit(&l->on, memory_order_relaxed)) return 0;
    uint64_t t = __rdtsc();
    uint64_t tsc0 = atomic_load_explicit(&l->tsc0, memory_order_relaxed);
    int64_t ns0 = atomic_load_explicit(&l->ns0, memory_order_relaxed);
    uint64_t mult = atomic_load_explicit(&l->mult, memory_order_relaxed);
    atomic_thread_fence(memory_order_acquire);
    if (atomic_load_explicit(&l->seq, memory_order_relaxed) == s) return at(tsc0, ns0, mult, t);
  }
}

/* A child forked while a thread anchored: the lock is taken again from
 * scratch, and a line left half written (seq odd) is dropped, calibrated
 * anew. */
static void at_fork(void) {
  struct tdist__clock_line *l = &tdist__clock;
  pthread_mutex_init(&mu, NULL);
  uint32_t s = atomic_load_explicit(&l->seq, memory_order_relaxed);
  if (s & 1) {
    atomic_store_explicit(&l->on, 0, memory_order_relaxed);
    atomic_store_explicit(&org_ns, 0, memory_order_relaxed);
    atomic_store_explicit(&l->seq, s + 1, memory_order_release);
  }
}

static void publish(uint64_t tsc0, int64_t ns0, uint64_t mult, uint64_t span) {
  store_line(tsc0, ns0, mult, span, line_open());
}

/* (mu) The new line starts where the old one is at a counter value read
 * once readers can no longer take the old one (seq odd, and a full fence:
 * RDTSC is then ordered after the store), plus SLEW_AHEAD ticks, or at
 * CLOCK_MONOTONIC there if the old line is behind it (a step forward).
 * Had it started at the pair's counter value, a reader that took the old
 * line after the pair would find the new one, if slower, below what it
 * read a moment before (core_clock under TSan saw that once); the margin
 * covers a reader whose RDTSC ran late, out of order, after the load that
 * validated the old line. Once the line is on, every value handed out is
 * the line's, so starting at the larger of the two never goes back.
 * Stepping rather than slewing up matters when the old line ran past its
 * span (this thread preempted before anchoring): a young line's rate is
 * off by up to a pair's width over a millisecond, and a slew from where it
 * ended up would carry that error through the whole next period. The line
 * reaches the pair's CLOCK_MONOTONIC, carried on at the rate, one period
 * later; a line ahead runs at half speed at the least. */
static void publish_slew(uint64_t t, int64_t r, uint64_t rate, int64_t pns, uint64_t period) {
  struct tdist__clock_line *l = &tdist__clock;
  uint32_t s = line_open();
  uint64_t tp = __rdtsc();
  if (tp < t) tp = t;
  int64_t f = at(atomic_load_explicit(&l->tsc0, memory_order_relaxed),
                 atomic_load_explicit(&l->ns0, memory_order_relaxed),
                 atomic_load_explicit(&l->mult, memory_order_relaxed), tp + SLEW_AHEAD);
  int64_t now = r + (int64_t)(((unsigned __int128)(tp - t) * rate) >> 32);
  if (f < now) f = now;
  int64_t target = r + (int64_t)(((unsigned __int128)(tp - t + period) * rate) >> 32);
  int64_t want = target - f;
  if (want < pns / 2) want = pns / 2;
  store_line(tp, f, (uint64_t)(((unsigned __int128)(uint64_t)want << 32) / period), period, s);
}

/* (mu) Anchor the line at a fresh pair, if the calibration allows and
 * the line is due (its span is over). A read comes here too when its
 * counter lags the line's anchor (read early, out of order, or on another
 * CPU just after the anchoring): its difference wraps and fails the inline
 * span check. Anchoring then was a bug: every anchoring starts the new
 * line SLEW_AHEAD ahead, and two threads reading in a loop re-anchored
 * each other every few ms, so the line ran further ahead of
 * CLOCK_MONOTONIC with each one (core_clock's forked children, under
 * load, found it 20 us ahead). */
static void anchor(void) {
  struct tdist__clock_line *l = &tdist__clock;
  uint64_t t, width;
  int64_t r;
  int on = atomic_load_explicit(&l->on, memory_order_relaxed);
  if (on) {
    uint64_t now = __rdtsc(), tsc0 = atomic_load_explicit(&l->tsc0, memory_order_relaxed);
    if (now < tsc0 || now - tsc0 < atomic_load_explicit(&l->span, memory_order_relaxed)) return;
  }
  if (pair(&t, &r, &width) != 0) return;
  int64_t o = atomic_load_explicit(&org_ns, memory_order_relaxed);
  if (!o) {
    org_tsc = t;
    atomic_store_explicit(&org_ns, r, memory_order_relaxed);
    return;
  }
  if (r - o < CAL_NS || t <= org_tsc) return;
  /* ns per tick << 32, over everything since the origin */
  uint64_t rate = (uint64_t)(((unsigned __int128)(uint64_t)(r - o) << 32) / (t - org_tsc));
  if (!rate) return;
  /* The period grows with the origin's age (1 ms, 2, 4 ... up to 1 s):
   * the rate's error is a pair's width over that age, so a line is off by
   * about a pair's width (tens of ns) at its end, and slewed back. */
  int64_t pns = r - o < PERIOD_NS ? r - o : PERIOD_NS;
  uint64_t period = (uint64_t)(((unsigned __int128)(uint64_t)pns << 32) / rate);
  if (!on) {
    /* The first line, at a pair read now (the calibration's may be
     * milliseconds old if this thread was preempted since: the rate's
     * error over that time could put the line below a clock_gettime value
     * another thread returned meanwhile, as core_clock under TSan saw
     * once), a pair's width ahead: no value handed out before is ahead. */
    if (pair(&t, &r, &width) == 0)
      publish(t, r + (int64_t)((width * rate) >> 32) + 1, rate, period);
    return;
  }
  publish_slew(t, r, rate, pns, period);
}

int64_t tdist__now_ns_slow(void) {
  pthread_once(&once, probe);
  if (!usable) return sys_ns();
  if (!atomic_load_explicit(&tdist__clock.on, memory_order_relaxed)) {
    /* Calibrating: clock_gettime, and the lock only for the origin and
     * once the origin is old enough (a program's first ops must not pay
     * an anchoring each: the benches' 2000-op runs fell in this window
     * when it was 10 ms long and every read anchored). */
    int64_t r = sys_ns(), o = atomic_load_explicit(&org_ns, memory_order_relaxed);
    if (o && r - o < CAL_NS) return r;
  }
  if (pthread_mutex_trylock(&mu) != 0) {
    int64_t v = line_at();
    return v ? v : sys_ns();
  }
  anchor();
  pthread_mutex_unlock(&mu);
  int64_t v = line_at();
  return v ? v : sys_ns();
}

#else

int64_t tdist__now_ns_slow(void) { return sys_ns(); }

#endif
