/* memkind.c - see memkind.h. */
#include "util/memkind.h"

#include <stdatomic.h>

static _Atomic(int (*)(const void *)) classifier;

void tdist__memkind_set(int (*fn)(const void *ptr)) { atomic_store(&classifier, fn); }

int tdist__memkind(const void *ptr) {
  int (*fn)(const void *) = atomic_load_explicit(&classifier, memory_order_acquire);
  return fn && ptr ? fn(ptr) : TDIST__MEMKIND_HOST;
}
