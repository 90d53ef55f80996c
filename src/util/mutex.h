/*
 * mutex.h - a mutex whose free paths are inline: taking a free one is one
 * compare-exchange, giving back one with no sleeper one exchange. A holder
 * that finds sleepers wakes one (a futex), and a taker that finds it held
 * sleeps in the kernel, as glibc's default mutex does (no spinning: on an
 * oversubscribed host the holder needs the CPU a spinner would take).
 *
 * Why not pthread_mutex_t: the CPU backend's engine lock (cpu/base/lock.c)
 * is taken and given back by the caller of every small op it finishes in
 * submit, and glibc's two calls (type checks, lock elision, the user count)
 * were 57 instructions (31 + 26) of an 8-byte broadcast root's 1470 (callgrind,
 * bench/cpu/RESULTS.md). Not recursive, no owner check, no condition
 * variable: for locks that need those, pthread's.
 *
 * The state (Drepper, "Futexes Are Tricky", mutex 3): 0 free, 1 held, 2 held
 * and maybe sleepers. Threads: any.
 */
#ifndef TDIST_UTIL_MUTEX_H
#define TDIST_UTIL_MUTEX_H

#include <stdatomic.h>

typedef struct tdist__mutex {
  atomic_int v;
} tdist__mutex_t;

#define TDIST__MUTEX_INIT \
  { 0 }

/* The slow halves (mutex.c): sleep until it is ours; wake a sleeper. */
void tdist__mutex_wait(tdist__mutex_t *m);
void tdist__mutex_wake(tdist__mutex_t *m);

static inline void tdist__mutex_init(tdist__mutex_t *m) { atomic_init(&m->v, 0); }

/* 1 when it was free and is now the caller's, 0 when held (never waits). */
static inline int tdist__mutex_trylock(tdist__mutex_t *m) {
  int free_ = 0;
  return atomic_compare_exchange_strong_explicit(&m->v, &free_, 1, memory_order_acquire,
                                                 memory_order_relaxed);
}

static inline void tdist__mutex_lock(tdist__mutex_t *m) {
  if (!tdist__mutex_trylock(m)) tdist__mutex_wait(m);
}

static inline void tdist__mutex_unlock(tdist__mutex_t *m) {
  if (atomic_exchange_explicit(&m->v, 0, memory_order_release) == 2) tdist__mutex_wake(m);
}

#endif
