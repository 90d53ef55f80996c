/*
 * init.c - the top layer: tdist_init_process_group (rendezvous, then the
 * runtime context, then the world group), the table of backends, and the
 * version string.
 *
 * The backend table lists the built-in backends (name, vtable, capabilities:
 * backend.h); tdist__backend_register adds others at run time (the tests'
 * backend) without any core file knowing them. References to the built-ins
 * are strong, so a static link pulls their objects out of the archive.
 *
 * Threads: the caller's; the table is guarded by a mutex.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "core/group.h"
#include "store/rendezvous.h"
#include "util/error.h"
#include "util/param.h"

extern const tdist__backend_t tdist__cpu_backend;
extern const tdist__backend_t tdist__nccl_backend; /* always built: NCCL is opened at run time */

#define MAX_BACKENDS 8

static pthread_mutex_t table_mu = PTHREAD_MUTEX_INITIALIZER;
static const tdist__backend_t *table[MAX_BACKENDS] = {
    &tdist__cpu_backend,
    &tdist__nccl_backend,
};

/* Backend names are matched without regard to case ("CPU", "NCCL", "Gloo"),
 * as torch does. */
const tdist__backend_t *tdist__backend_find(const char *name) {
  if (!name) return NULL;
  if (strcasecmp(name, "gloo") == 0) name = "cpu"; /* torch's name for the CPU backend */
  const tdist__backend_t *found = NULL;
  pthread_mutex_lock(&table_mu);
  for (int i = 0; i < MAX_BACKENDS && table[i] && !found; i++)
    if (strcasecmp(table[i]->name, name) == 0) found = table[i];
  pthread_mutex_unlock(&table_mu);
  return found;
}

/* The error for a name no backend answers to, listing the known ones:
 * "unknown backend 'foo'; known: cpu, nccl (gloo = cpu)". */
static int unknown_backend(const char *name) {
  char names[256] = "";
  size_t len = 0;
  pthread_mutex_lock(&table_mu);
  for (int i = 0; i < MAX_BACKENDS && table[i] && len < sizeof(names); i++)
    len +=
        (size_t)snprintf(names + len, sizeof(names) - len, "%s%s", i ? ", " : "", table[i]->name);
  pthread_mutex_unlock(&table_mu);
  return tdist__error(TDIST_ERR_NOT_SUPPORTED, "unknown backend '%s'; known: %s (gloo = cpu)", name,
                      names);
}

int tdist__backend_register(const tdist__backend_t *b) {
  int rc = TDIST_ERR_INVALID_STATE;
  if (!b || !b->name || !b->ops)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "backend register: incomplete descriptor");
  pthread_mutex_lock(&table_mu);
  int i = 0;
  for (; i < MAX_BACKENDS && table[i]; i++)
    if (strcasecmp(table[i]->name, b->name) == 0) break;
  if (i < MAX_BACKENDS && !table[i]) {
    table[i] = b;
    rc = 0;
  }
  pthread_mutex_unlock(&table_mu);
  if (rc) return tdist__error(rc, "backend register: '%s' is taken or the table is full", b->name);
  return 0;
}

int tdist_init_process_group(const tdist_init_opts_t *opts, tdist_group_t **world) {
  int rc;
  tdist__ctx_t *ctx = NULL;
  tdist__error_clear();
  const tdist_init_opts_t *o = opts;
  uint64_t m = o ? o->mask : 0;
  if (!world) return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "tdist_init_process_group: NULL");
  *world = NULL;
  const char *backend = (m & TDIST_INIT_FIELD_BACKEND) && o->backend
                            ? o->backend
                            : tdist__param_str("TDIST_BACKEND", "cpu");
  const tdist__backend_t *bk = tdist__backend_find(backend);
  if (!bk) return unknown_backend(backend);
  const char *name = (m & TDIST_INIT_FIELD_NAME) && o->name ? o->name : "world";
  tdist__rdzv_t r;
  TDIST_CHECK(tdist__rendezvous_join(o, &r));
  rc = tdist__ctx_create(r.store, r.rank, 1, r.job, r.store_host, &ctx);
  if (rc) {
    tdist_store_release(r.store);
    tdist__rendezvous_cleanup();
    return rc;
  }
  /* One timeout for the store and the group's ops. The group holds its own
   * references on the store and the context; on failure its unwinding drops
   * the context's last one, which ends the rendezvous. */
  rc = tdist__group_create_in(bk, ctx, r.rank, r.size, name, r.store, r.timeout_ms, o, world);
  tdist_store_release(r.store);
  tdist__ctx_release(ctx);
  return rc;
}

const char *tdist_version_string(void) {
  static char buf[96];
  if (!buf[0]) {
    char names[64] = "";
    size_t len = 0;
    pthread_mutex_lock(&table_mu);
    for (int i = 0; i < MAX_BACKENDS && table[i]; i++)
      len +=
          (size_t)snprintf(names + len, sizeof(names) - len, "%s%s", i ? ", " : "", table[i]->name);
    pthread_mutex_unlock(&table_mu);
    snprintf(buf, sizeof(buf), "%d.%d.%d (backends: %s)", TDIST_VERSION_MAJOR, TDIST_VERSION_MINOR,
             TDIST_VERSION_PATCH, names);
  }
  return buf;
}
