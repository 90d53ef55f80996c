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

enum { TDIST__MEMKIND_HOST = 0, TDIST__MEMKIND_DEVICE = 1 };

/* fn(ptr) -> TDIST__MEMKIND_*; NULL unregisters. */
void tdist__memkind_set(int (*fn)(const void *ptr));
/* The kind of ptr (HOST without a classifier or for NULL). */
int tdist__memkind(const void *ptr);

#endif
