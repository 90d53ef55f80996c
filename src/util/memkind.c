/* memkind.c - see memkind.h. */
#include "util/memkind.h"

_Atomic(int (*)(const void *)) tdist__memkind_fn;

void tdist__memkind_set(int (*fn)(const void *ptr)) { atomic_store(&tdist__memkind_fn, fn); }
