/*
 * wakeup.c - the process-wide wake-up for caller threads that drive their
 * own completion (beside progress.c: it calls only util).
 *
 * Why: a caller blocked in tdist_work_wait on an op of a backend that can
 * test an op from any thread (backend.h, vtable->test: NCCL's end events)
 * need not wait for the progress thread to notice the completion, publish
 * it and wake the caller -- two thread hand-offs, tens of microseconds each
 * on a loaded machine. It sleeps here instead, and whatever may have
 * completed an op (a backend's wake, tdist__progress_wake_any, from a CUDA
 * host function; a work published by the progress thread) wakes it. It
 * then tests its op itself (work.c), and returns when it is done.
 *
 * One generation counter and one futex for the whole process: drivers are
 * few (the threads blocked in a wait right now), a spurious wake costs one
 * test, and a wake nobody sleeps for costs one fence and one load.
 *
 * The Dekker pair (all seq_cst): a sleeper counts itself in `sleepers`,
 * reads `gen`, then re-checks its condition before it sleeps on `gen`; a
 * waker makes the condition true, then reads `sleepers` and, if any, bumps
 * `gen` and wakes them. Either the sleeper sees the condition, or the waker
 * sees the sleeper, and its bump makes the futex wait return at once.
 *
 * Threads: any, CUDA host functions included (no lock, no CUDA call).
 */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "core/progress/progress.h"
#include "util/clock.h"

static _Atomic uint32_t gen;
static atomic_int sleepers;

uint32_t tdist__wakeup_prepare(void) {
  atomic_fetch_add(&sleepers, 1);
  return atomic_load(&gen);
}

void tdist__wakeup_cancel(void) { atomic_fetch_sub(&sleepers, 1); }

void tdist__wakeup_sleep(uint32_t seen, int64_t deadline_ns) {
  int64_t left = deadline_ns - tdist__now_ns();
  if (left > 0 && atomic_load(&gen) == seen) {
    struct timespec ts = {.tv_sec = left / 1000000000, .tv_nsec = left % 1000000000};
    /* Returns on a wake, at once if gen moved (EAGAIN), at the timeout, or
     * on a signal (EINTR): every case goes back to the caller's test. */
    syscall(SYS_futex, (uint32_t *)&gen, FUTEX_WAIT_PRIVATE, seen, &ts, NULL, 0);
  }
  atomic_fetch_sub(&sleepers, 1);
}

void tdist__wakeup_all(void) {
  atomic_thread_fence(memory_order_seq_cst);
  if (atomic_load(&sleepers) == 0) return;
  atomic_fetch_add(&gen, 1);
  syscall(SYS_futex, (uint32_t *)&gen, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}
