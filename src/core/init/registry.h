/*
 * backend.h - the core's side of the backend interface (internal).
 *
 * The interface itself is public and versioned: include/tdist/backend.h
 * (the structs, the vtable, the capabilities and the services a backend may
 * use). This header adds what only the core uses: finding a backend by name
 * (registry.c: the built-in table, registered backends, plug-ins loaded by
 * name). Backends include tdist/backend.h and util/ alone
 * (tools/check_layers.py).
 */
#ifndef TDIST_CORE_BACKEND_H
#define TDIST_CORE_BACKEND_H

#include "tdist/backend.h"

/* Any caller thread: the backend called `name`, whatever its case ("gloo" is
 * "cpu"): a built-in, a registered one, or a plug-in loaded now
 * (libtdist-backend-NAME.so, tdist/backend.h). NULL with the error recorded
 * (tdist_last_error: what was looked for, where, and why it failed). */
const tdist_backend_t *tdist__backend_find(const char *name);
/* The same, returning 0 or the error code (init). */
int tdist__backend_get(const char *name, const tdist_backend_t **out);
/* Any thread: the names in the table, ", "-separated, into buf (cap bytes). */
size_t tdist__backend_names(char *buf, size_t cap);

#endif
