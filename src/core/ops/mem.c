/*
 * mem.c - tdist_mem_register / tdist_mem_deregister (tdist/mem.h): the
 * public handle around the backend's (vtable mem_register/mem_deregister).
 *
 * Threads: caller threads only; never the progress thread (a window is
 * collective and blocks, so a completion callback must not make one). The
 * handle is owned by the caller between the two calls; the backend keeps
 * its own bookkeeping of what it registered (NCCL: its registration cache).
 */
#include <stdint.h>
#include <string.h>

#include "core/group/group.h"
#include "core/progress/progress.h"
#include "tdist/mem.h"
#include "util/alloc.h"
#include "util/error.h"

struct tdist_mem {
  tdist_group_t *group; /* (caller) the group it was registered with */
  void *handle;         /* (caller) the backend's */
  unsigned flags;
};

/* The group's abort as call's error: its cause's code and words. */
static int aborted_error(const tdist_group_t *g, const char *call) {
  return tdist__error(g->abort_status, "%s: group '%s' was aborted: %s", call, g->name,
                      g->abort_reason);
}

/* The checks both calls share: a live group whose backend registers. */
static int usable(tdist_group_t *g, const char *call) {
  if (!g) return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "%s: NULL group", call);
  if (tdist__progress_on_thread())
    return tdist__error(TDIST_ERR_INVALID_STATE,
                        "%s: called on the progress thread (from a completion or abort "
                        "callback): it may block",
                        call);
  if (!g->bk->ops->mem_register || !g->bk->ops->mem_deregister)
    return tdist__error(TDIST_ERR_NOT_SUPPORTED,
                        "%s: group '%s' is on backend '%s', which has no buffer registration "
                        "(host memory needs none)",
                        call, g->name, g->bk->name);
  return 0;
}

int tdist_mem_register(tdist_group_t *g, void *ptr, size_t bytes, unsigned flags,
                       tdist_mem_t **mem) {
  int rc = 0;
  tdist_mem_t *m = NULL;
  tdist__error_clear();
  if (!mem) return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "tdist_mem_register: NULL mem");
  *mem = NULL;
  TDIST_CHECK(usable(g, "tdist_mem_register"));
  if (!ptr || bytes == 0)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                        "tdist_mem_register on group '%s': %s (a buffer of at least one byte)",
                        g->name, ptr ? "0 bytes" : "NULL pointer");
  if (flags != TDIST_MEM_REGISTER_LOCAL && flags != TDIST_MEM_REGISTER_WINDOW)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                        "tdist_mem_register on group '%s': unknown flags 0x%x (want "
                        "TDIST_MEM_REGISTER_LOCAL or TDIST_MEM_REGISTER_WINDOW)",
                        g->name, flags);
  if (atomic_load(&g->aborted)) return aborted_error(g, "tdist_mem_register");
  m = tdist__calloc(1, sizeof(*m));
  if (!m) return tdist__error(TDIST_ERR_NO_MEMORY, "tdist_mem_register: out of memory");
  m->group = g;
  m->flags = flags;
  TDIST_CHECKGOTO(g->bk->ops->mem_register(g->bstate, ptr, bytes, flags, &m->handle), rc, fail);
  *mem = m;
  return 0;
fail:
  tdist__free(m);
  /* The group aborted while the backend registered (another member's
   * failure, its record applied meanwhile): the backend knows only that it
   * did ("group aborted"); the cause and its code are the group's. */
  if (rc == TDIST_ERR_ABORTED && atomic_load(&g->aborted))
    rc = aborted_error(g, "tdist_mem_register");
  return rc;
}

int tdist_mem_deregister(tdist_group_t *g, tdist_mem_t *m) {
  tdist__error_clear();
  if (!m) return 0;
  int rc = usable(g, "tdist_mem_deregister");
  if (rc == 0 && m->group != g)
    rc = tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                      "tdist_mem_deregister: the handle belongs to group '%s', not '%s'",
                      m->group->name, g->name);
  if (rc == 0) rc = g->bk->ops->mem_deregister(g->bstate, m->handle);
  if (rc == TDIST_ERR_INVALID_ARGUMENT && m->group != g) return rc; /* not ours: not freed */
  tdist__free(m);
  return rc;
}

int tdist_mem_alloc(tdist_group_t *g, size_t bytes, void **ptr) {
  tdist__error_clear();
  if (!ptr) return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "tdist_mem_alloc: NULL ptr");
  *ptr = NULL;
  TDIST_CHECK(usable(g, "tdist_mem_alloc"));
  if (!g->bk->ops->mem_alloc || !g->bk->ops->mem_free)
    return tdist__error(TDIST_ERR_NOT_SUPPORTED,
                        "tdist_mem_alloc: group '%s' is on backend '%s', which has no allocator",
                        g->name, g->bk->name);
  if (bytes == 0)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "tdist_mem_alloc on group '%s': 0 bytes",
                        g->name);
  return g->bk->ops->mem_alloc(g->bstate, bytes, ptr);
}

int tdist_mem_free(tdist_group_t *g, void *ptr) {
  tdist__error_clear();
  if (!ptr) return 0;
  TDIST_CHECK(usable(g, "tdist_mem_free"));
  if (!g->bk->ops->mem_free)
    return tdist__error(TDIST_ERR_NOT_SUPPORTED,
                        "tdist_mem_free: group '%s' is on backend '%s', which has no allocator",
                        g->name, g->bk->name);
  return g->bk->ops->mem_free(g->bstate, ptr);
}
