/*
 * alloc.c - host allocation through a dedicated jemalloc arena.
 *
 * The jemalloc is private to libtdist (cmake/TdistJemalloc.cmake): built by
 * the project with the prefix tdist__je_, so its API is tdist__je_mallocx and
 * friends and it defines no malloc, free or glibc hook; every symbol is
 * hidden, so neither libtdist.so nor libtdist.a exports one; and its TLS is
 * not initial-exec, so libtdist.so can be dlopened at any time. The
 * application's malloc, whichever it is, is therefore never replaced or mixed
 * with ours: memory from tdist__malloc must be freed with tdist__free and
 * nothing else. Its options come from TDIST__JE_MALLOC_CONF, not MALLOC_CONF.
 *
 * The arena is created on first use (pthread_once).
 */
#include "util/alloc.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef TDIST_HAVE_JEMALLOC
#include <jemalloc/jemalloc.h> /* the private build's header: tdist__je_* */
#elif defined(__GLIBC__)
#include <malloc.h> /* malloc_trim */
#endif

static _Atomic uint64_t alloc_count;

#ifdef TDIST_HAVE_JEMALLOC
static pthread_once_t arena_once = PTHREAD_ONCE_INIT;
static int arena_flags; /* MALLOCX_ARENA(n), or 0 if creation failed */
static char arena_desc[48] = "jemalloc";

static void arena_init(void) {
  unsigned arena = 0;
  size_t sz = sizeof(arena);
  if (tdist__je_mallctl("arenas.create", &arena, &sz, NULL, 0) == 0) {
    arena_flags = MALLOCX_ARENA(arena);
    snprintf(arena_desc, sizeof(arena_desc), "jemalloc arena %u", arena);
  }
}

static inline int flags(void) {
  pthread_once(&arena_once, arena_init);
  return arena_flags;
}
#endif

void *tdist__malloc(size_t size) {
  atomic_fetch_add_explicit(&alloc_count, 1, memory_order_relaxed);
#ifdef TDIST_HAVE_JEMALLOC
  return tdist__je_mallocx(size ? size : 1, flags());
#else
  return malloc(size ? size : 1);
#endif
}

void *tdist__calloc(size_t n, size_t size) {
  atomic_fetch_add_explicit(&alloc_count, 1, memory_order_relaxed);
  if (size && n > SIZE_MAX / size) return NULL;
#ifdef TDIST_HAVE_JEMALLOC
  size_t total = n * size;
  return tdist__je_mallocx(total ? total : 1, flags() | MALLOCX_ZERO);
#else
  return calloc(n ? n : 1, size ? size : 1);
#endif
}

void *tdist__realloc(void *ptr, size_t size) {
  if (!ptr) return tdist__malloc(size);
  atomic_fetch_add_explicit(&alloc_count, 1, memory_order_relaxed);
#ifdef TDIST_HAVE_JEMALLOC
  return tdist__je_rallocx(ptr, size ? size : 1, flags());
#else
  return realloc(ptr, size ? size : 1);
#endif
}

void tdist__free(void *ptr) {
  if (!ptr) return;
#ifdef TDIST_HAVE_JEMALLOC
  tdist__je_dallocx(ptr, flags());
#else
  free(ptr);
#endif
}

char *tdist__strdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *p = tdist__malloc(n);
  if (p) memcpy(p, s, n);
  return p;
}

uint64_t tdist__alloc_count(void) {
  return atomic_load_explicit(&alloc_count, memory_order_relaxed);
}

const char *tdist__alloc_backend(void) {
#ifdef TDIST_HAVE_JEMALLOC
  flags();
  return arena_desc;
#else
  return "malloc";
#endif
}

void tdist__alloc_purge(size_t *allocated, size_t *resident) {
  *allocated = *resident = 0;
#ifdef TDIST_HAVE_JEMALLOC
  char cmd[48];
  snprintf(cmd, sizeof(cmd), "arena.%u.purge", (unsigned)MALLCTL_ARENAS_ALL);
  tdist__je_mallctl(cmd, NULL, NULL, NULL, 0);
  uint64_t epoch = 1; /* stats are a snapshot taken at an epoch */
  size_t sz = sizeof(epoch), a = 0, r = 0;
  tdist__je_mallctl("epoch", &epoch, &sz, &epoch, sz);
  sz = sizeof(size_t);
  if (tdist__je_mallctl("stats.allocated", &a, &sz, NULL, 0) == 0 &&
      tdist__je_mallctl("stats.resident", &r, &sz, NULL, 0) == 0) {
    *allocated = a;
    *resident = r;
  }
#elif defined(__GLIBC__)
  malloc_trim(0);
#endif
}

size_t tdist__alloc_unused(void) {
#ifdef TDIST_HAVE_JEMALLOC
  uint64_t epoch = 1;
  size_t sz = sizeof(epoch), dirty = 0, muzzy = 0, page = 4096;
  tdist__je_mallctl("epoch", &epoch, &sz, &epoch, sz);
  char cmd[64];
  sz = sizeof(size_t);
  snprintf(cmd, sizeof(cmd), "stats.arenas.%u.pdirty", (unsigned)MALLCTL_ARENAS_ALL);
  if (tdist__je_mallctl(cmd, &dirty, &sz, NULL, 0) != 0) return 0;
  snprintf(cmd, sizeof(cmd), "stats.arenas.%u.pmuzzy", (unsigned)MALLCTL_ARENAS_ALL);
  if (tdist__je_mallctl(cmd, &muzzy, &sz, NULL, 0) != 0) muzzy = 0;
  if (tdist__je_mallctl("arenas.page", &page, &sz, NULL, 0) != 0) page = 4096;
  return (dirty + muzzy) * page;
#elif defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
  struct mallinfo2 mi = mallinfo2();
  return mi.fordblks;
#else
  return 0;
#endif
}
