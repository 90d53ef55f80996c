/*
 * spin.h - a spinlock for critical sections of a few dozen stores, taken on
 * every op by a thread that must not pay a mutex's two calls (the flight
 * recorder's ring: core/trace/trace.c, written by the caller of every
 * synchronous op it finishes itself).
 *
 * Taking it is one atomic exchange when it is free, inline; giving it back
 * is one release store. A waiter spins a few pauses, then yields the CPU
 * between tries: a holder preempted on an oversubscribed machine gets it
 * back, and a long holder (a snapshot copying a ring, tens of
 * microseconds, on a failure only) costs the others yields, not a core.
 * Not for sections that may block or run long on a hot path (the CPU
 * engine's lock stays a mutex: its passes copy MiBs).
 *
 * Threads: any; no owner check, not recursive.
 */
#ifndef TDIST_UTIL_SPIN_H
#define TDIST_UTIL_SPIN_H

#include <sched.h>
#include <stdatomic.h>

typedef struct tdist__spin {
  atomic_int held;
} tdist__spin_t;

/* A pause between two tries (the sibling hyperthread gets the pipeline). */
static inline void tdist__cpu_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield" ::: "memory");
#endif
}

static inline void tdist__spin_lock(tdist__spin_t *s) {
  for (unsigned i = 0;; i++) {
    /* read before the exchange: waiters share the line until it is free */
    if (!atomic_load_explicit(&s->held, memory_order_relaxed) &&
        !atomic_exchange_explicit(&s->held, 1, memory_order_acquire))
      return;
    if (i < 64)
      tdist__cpu_pause();
    else
      sched_yield();
  }
}

static inline void tdist__spin_unlock(tdist__spin_t *s) {
  atomic_store_explicit(&s->held, 0, memory_order_release);
}

#endif
