/*
 * alloc.c - host allocation through a dedicated jemalloc arena.
 *
 * The arena is created on first use (pthread_once). jemalloc's non-standard
 * API (mallocx/dallocx) is used so that the application's malloc, whichever
 * it is, is never replaced or mixed with ours: memory from tdist__malloc must
 * be freed with tdist__free and nothing else.
 */
#include "util/alloc.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef TDIST_HAVE_JEMALLOC
#include <jemalloc/jemalloc.h>
#endif

static _Atomic uint64_t alloc_count;

#ifdef TDIST_HAVE_JEMALLOC
static pthread_once_t arena_once = PTHREAD_ONCE_INIT;
static int arena_flags; /* MALLOCX_ARENA(n), or 0 if creation failed */
static char arena_desc[48] = "jemalloc";

static void arena_init(void) {
  unsigned arena = 0;
  size_t sz = sizeof(arena);
  if (mallctl("arenas.create", &arena, &sz, NULL, 0) == 0) {
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
  return mallocx(size ? size : 1, flags());
#else
  return malloc(size ? size : 1);
#endif
}

void *tdist__calloc(size_t n, size_t size) {
  atomic_fetch_add_explicit(&alloc_count, 1, memory_order_relaxed);
  if (size && n > SIZE_MAX / size) return NULL;
#ifdef TDIST_HAVE_JEMALLOC
  size_t total = n * size;
  return mallocx(total ? total : 1, flags() | MALLOCX_ZERO);
#else
  return calloc(n ? n : 1, size ? size : 1);
#endif
}

void *tdist__realloc(void *ptr, size_t size) {
  if (!ptr) return tdist__malloc(size);
  atomic_fetch_add_explicit(&alloc_count, 1, memory_order_relaxed);
#ifdef TDIST_HAVE_JEMALLOC
  return rallocx(ptr, size ? size : 1, flags());
#else
  return realloc(ptr, size ? size : 1);
#endif
}

void tdist__free(void *ptr) {
  if (!ptr) return;
#ifdef TDIST_HAVE_JEMALLOC
  dallocx(ptr, flags());
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
