/*
 * init.c - the top layer: tdist_init_process_group (rendezvous, then the
 * runtime context, then the world group) and the version string. The
 * backend is found by name in registry.c.
 *
 * Threads: the caller's.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "core/init/registry.h"
#include "core/group/group.h"
#include "store/rendezvous.h"
#include "util/error.h"
#include "util/param.h"

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
  const tdist_backend_t *bk = NULL;
  TDIST_CHECK(tdist__backend_get(backend, &bk));
  const char *name = (m & TDIST_INIT_FIELD_NAME) && o->name ? o->name : "world";
  tdist__rdzv_t r;
  TDIST_CHECK(tdist__rendezvous_join(o, &r));
  /* A further world on the caller's store (unrecorded): tdistrun's host
   * agent knows the process's world only, so its monitor beats to that store. */
  rc = tdist__ctx_create(r.store, r.rank, r.recorded, r.recorded, r.job, r.store_host, &ctx);
  if (rc) {
    tdist_store_release(r.store);
    if (r.recorded) tdist__rendezvous_cleanup();
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
    char names[64];
    tdist__backend_names(names, sizeof(names));
    snprintf(buf, sizeof(buf), "%d.%d.%d (backends: %s)", TDIST_VERSION_MAJOR, TDIST_VERSION_MINOR,
             TDIST_VERSION_PATCH, names);
  }
  return buf;
}
