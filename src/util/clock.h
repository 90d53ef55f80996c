/*
 * clock.h - monotonic time (internal). Any thread.
 *
 * tdist__now_ns is CLOCK_MONOTONIC's time line, read from the CPU's time
 * stamp counter where the kernel itself keeps time with it (its clocksource
 * is "tsc": invariant and the same on every CPU; or "kvm-clock", a KVM
 * guest's scaling of that counter, on a CPU that says it is invariant:
 * clock.c, invariant). A small op reads the clock once (its submission,
 * also its end when it is done at its first look: work.c), and on the
 * 2-core KVM this project runs on, clock_gettime took 23 ns against 10 for
 * rdtsc.
 *
 * The counter is turned into nanoseconds by a line (tsc0, ns0, mult) that
 * clock.c re-anchors against clock_gettime (every second once the process
 * is a second old), continuous at the anchor and aimed at CLOCK_MONOTONIC
 * one period later (a slew, as NTP does: no step, so time does not go
 * back). A deadline computed from it may go to pthread_cond_timedwait on
 * CLOCK_MONOTONIC: three threads reading for 3 s found every value within
 * 0.7 us of a clock_gettime taken beside it (tests/core/test_clock.c).
 * TDIST_CLOCK_TSC=0, another clocksource, or another architecture:
 * clock_gettime on every read.
 *
 * Threads: any, the progress thread too. A read takes no lock; one that
 * lands while the line is rewritten (once a second, a few stores by the
 * thread that anchors it) waits for that, yielding if the writer was
 * preempted.
 */
#ifndef TDIST_UTIL_CLOCK_H
#define TDIST_UTIL_CLOCK_H

#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <x86intrin.h>
#define TDIST__CLOCK_TSC 1
#endif

/* The line from counter to nanoseconds (clock.c). A seqlock: seq is odd
 * while clock.c rewrites the fields; a reader that sees it change reads
 * again the slow way. The fields are atomics for that reason (relaxed).
 * A cache line of its own: every thread reads it on every op, and a
 * written neighbour would make each read a miss (it did: +100 ns an op). */
struct tdist__clock_line {
  _Alignas(64) _Atomic uint32_t seq;
  _Atomic int on;        /* the line is valid and tsc is this host's clock */
  _Atomic uint64_t tsc0; /* anchor: counter */
  _Atomic int64_t ns0;   /* anchor: CLOCK_MONOTONIC ns */
  _Atomic uint64_t mult; /* ns per tick << 32 */
  _Atomic uint64_t span; /* ticks after tsc0 the line holds for (then re-anchored) */
  char pad_[16];
};
extern struct tdist__clock_line tdist__clock;

/* The slow way: clock_gettime, and the line's anchoring when it is due. */
int64_t tdist__now_ns_slow(void);

static inline int64_t tdist__now_ns(void) {
#ifdef TDIST__CLOCK_TSC
  struct tdist__clock_line *l = &tdist__clock;
  uint32_t s = atomic_load_explicit(&l->seq, memory_order_acquire);
  if (atomic_load_explicit(&l->on, memory_order_relaxed) && !(s & 1)) {
    uint64_t d = __rdtsc() - atomic_load_explicit(&l->tsc0, memory_order_relaxed);
    int64_t ns0 = atomic_load_explicit(&l->ns0, memory_order_relaxed);
    uint64_t mult = atomic_load_explicit(&l->mult, memory_order_relaxed);
    uint64_t span = atomic_load_explicit(&l->span, memory_order_relaxed);
    atomic_thread_fence(memory_order_acquire);
    if (d < span && atomic_load_explicit(&l->seq, memory_order_relaxed) == s)
      return ns0 + (int64_t)(((unsigned __int128)d * mult) >> 32);
  }
#endif
  return tdist__now_ns_slow();
}

static inline int64_t tdist__now_ms(void) { return tdist__now_ns() / 1000000; }

#endif
