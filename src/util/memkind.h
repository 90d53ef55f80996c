/*
 * memkind.h - which kind of memory a buffer is in, when the process can say
 * (internal).
 *
 * util cannot know CUDA; the NCCL backend, once it has loaded the CUDA
 * runtime, registers a classifier here, and opcheck.c asks it for the buffers
 * of groups whose backend takes host memory only (a device pointer given
 * to a CPU group is refused up front, as torch does). Without a classifier
 * (no CUDA loaded by tdist in this process) every buffer counts as host
 * memory and nothing is checked.
 *
 * Thread safety: any thread; the classifier is set once (atomic).
 */
#ifndef TDIST_UTIL_MEMKIND_H
#define TDIST_UTIL_MEMKIND_H

#include <stdatomic.h>

enum { TDIST__MEMKIND_HOST = 0, TDIST__MEMKIND_DEVICE = 1 };

/* fn(ptr) -> TDIST__MEMKIND_*; NULL unregisters. */
void tdist__memkind_set(int (*fn)(const void *ptr));
/* The registered classifier (memkind.c); read through tdist__memkind. */
extern _Atomic(int (*)(const void *)) tdist__memkind_fn;
/* The kind of ptr (HOST without a classifier or for NULL). Inline: every
 * op of a host-only group asks it for both buffers, and without CUDA the
 * answer is one load. */
static inline int tdist__memkind(const void *ptr) {
  int (*fn)(const void *) = atomic_load_explicit(&tdist__memkind_fn, memory_order_acquire);
  return fn && ptr ? fn(ptr) : TDIST__MEMKIND_HOST;
}

#endif
