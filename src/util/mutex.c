/*
 * mutex.c - the sleeping halves of mutex.h's lock.
 */
#include "util/mutex.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Marks the lock contended (2) and sleeps while it stays so; it leaves
 * holding the lock in state 2, so that its unlock wakes the next sleeper
 * (one that was not there costs that unlock one futex call). */
void tdist__mutex_wait(tdist__mutex_t *m) {
  while (atomic_exchange_explicit(&m->v, 2, memory_order_acquire) != 0)
    syscall(SYS_futex, &m->v, FUTEX_WAIT_PRIVATE, 2, NULL, NULL, 0); /* EAGAIN: not 2 any more */
}

void tdist__mutex_wake(tdist__mutex_t *m) {
  syscall(SYS_futex, &m->v, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}
