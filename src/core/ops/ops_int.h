/*
 * ops_int.h - what the files of the ops layer share (internal).
 * The public ops (ops.c, ops_v.c) fill a descriptor, validate it with the
 * one checker (opcheck.h) and submit it (ops.c); neither calls the other's
 * checks. Caller thread, like every public op call.
 */
#ifndef TDIST_CORE_OPS_INT_H
#define TDIST_CORE_OPS_INT_H

#include "core/group/group.h"
#include "core/ops/opcheck.h"

/* ops.c: a work from the pool, the backend's submit hook, the push; waits
 * when out is NULL (the blocking form). `a` was validated (tdist__op_check). */
int tdist__ops_submit(tdist_group_t *g, const tdist_backend_args_t *a, const tdist_op_opts_t *opts,
                      tdist_work_t **out);

/* Validate the filled-in descriptor (fn: the public call), then submit it. */
static inline int tdist__ops_check_submit(tdist_group_t *g, tdist_backend_args_t *a, const char *fn,
                                          const tdist_op_opts_t *opts, tdist_work_t **work) {
  int rc = tdist__op_check(g, a, fn);
  return rc ? rc : tdist__ops_submit(g, a, opts, work);
}

/* mesh.c (caller thread): 1 if world rank wr is dead in the store, or
 * (or_left) left the job in order; such a rank never joins a split or
 * shrink (shrink.c uses it too). */
int tdist__ops_rank_gone(const tdist_group_t *g, int wr, int or_left);

#endif
