/*
 * backend.c - the registry of built-in backends and the version string.
 *
 * A library built without NCCL (none on the machine) reports "nccl" as not
 * supported. (References must be strong: a weak one would not pull the
 * backend's object out of the static archive.)
 */
#include <stdio.h>
#include <string.h>

#include "core/backend.h"

#ifdef TDIST_HAVE_NCCL
#include <nccl.h>
#endif

extern const tdist__backend_ops_t tdist__cpu_backend;

const tdist__backend_ops_t *tdist__backend_find(const char *name) {
  if (!name) return NULL;
  if (strcmp(name, "cpu") == 0 || strcmp(name, "gloo") == 0) return &tdist__cpu_backend;
#ifdef TDIST_HAVE_NCCL
  if (strcmp(name, "nccl") == 0) return &tdist__nccl_backend;
#endif
  return NULL;
}

const char *tdist_version_string(void) {
  static char buf[96];
  if (!buf[0]) {
#ifdef TDIST_HAVE_NCCL
    snprintf(buf, sizeof(buf), "%d.%d.%d (backends: cpu, nccl; built with NCCL %d.%d.%d)",
             TDIST_VERSION_MAJOR, TDIST_VERSION_MINOR, TDIST_VERSION_PATCH, NCCL_MAJOR, NCCL_MINOR,
             NCCL_PATCH);
#else
    snprintf(buf, sizeof(buf), "%d.%d.%d (backends: cpu)", TDIST_VERSION_MAJOR, TDIST_VERSION_MINOR,
             TDIST_VERSION_PATCH);
#endif
  }
  return buf;
}
