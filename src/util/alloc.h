/*
 * alloc.h - the runtime's host allocations (internal).
 *
 * Every host allocation tdist makes for itself goes through these functions.
 * With jemalloc (the default build) they use a dedicated jemalloc arena, so
 * the runtime's memory neither fragments nor is fragmented by the
 * application's heap; without it (or under ASan/TSan/valgrind builds) they
 * fall back to malloc. Counters let the benchmark prove that steady-state
 * submission allocates nothing.
 *
 * Thread safety: all functions may be called from any thread.
 */
#ifndef TDIST_UTIL_ALLOC_H
#define TDIST_UTIL_ALLOC_H

#include <stddef.h>
#include <stdint.h>

void *tdist__malloc(size_t size);
void *tdist__calloc(size_t n, size_t size);
void *tdist__realloc(void *ptr, size_t size);
void tdist__free(void *ptr);
char *tdist__strdup(const char *s);

/* Number of tdist__malloc/calloc/realloc/strdup calls so far (all threads). */
uint64_t tdist__alloc_count(void);
/* "jemalloc arena N" or "malloc". */
const char *tdist__alloc_backend(void);
/* Give memory freed to the allocator back to the system: every jemalloc
 * arena purged (or, without jemalloc, malloc_trim). Then what the allocator
 * holds: *allocated and *resident bytes (jemalloc's stats), both 0 when not
 * known. Slow (walks every arena): for an idle moment, not a hot path. */
void tdist__alloc_purge(size_t *allocated, size_t *resident);
/* Bytes freed to the allocator that it still holds, resident or lazily
 * given back (jemalloc: the dirty and muzzy pages of every arena; glibc: the
 * free bytes of the heap): what tdist__alloc_purge could give back. 0 when
 * not known. Refreshes the statistics (cheaper than a purge, not free).
 * Thread: any. */
size_t tdist__alloc_unused(void);

#endif
