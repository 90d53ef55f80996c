/*
 * ops_int.h - what the files of the ops layer (layer 6: ops.c, ops_v.c)
 * share (internal). ops.c owns validation and submission; ops_v.c, the
 * variable-size collectives and the wildcard receives, reuses them so a v-op
 * is checked and submitted exactly like a fixed one. Caller thread, like
 * every public op call.
 */
#ifndef TDIST_CORE_OPS_INT_H
#define TDIST_CORE_OPS_INT_H

#include "core/group.h"

/* ops.c: the checks of the fixed ops (see there), 0 or the recorded error. */
/* Caller thread (mesh.c): 1 if world rank wr is dead in the store, or (or_left)
 * left the job in order; such a rank never joins a split or shrink. */
int tdist__ops_rank_gone(const tdist_group_t *g, int wr, int or_left);
int tdist__ops_check_group(tdist_group_t *g, tdist_optype_t type, const char *fn);
int tdist__ops_check_dtype(const tdist_group_t *g, tdist_dtype_t dt, size_t count, size_t blocks,
                           const char *fn);
int tdist__ops_check_redop(const tdist_group_t *g, tdist_redop_t op, const char *fn);
int tdist__ops_check_rank(const tdist_group_t *g, int r, const char *what, const char *fn);
int tdist__ops_check_buf(const tdist_group_t *g, const void *buf, size_t count, const char *what,
                         const char *fn);
/* Zeroed arguments of `type` with the options' scalar, stream and tag. */
void tdist__ops_args_init(tdist_backend_args_t *a, tdist_optype_t type, const tdist_op_opts_t *opts);
/* Work from the pool, the backend's submit hook, the push; waits when out
 * is NULL (the blocking form). */
int tdist__ops_submit(tdist_group_t *g, const tdist_backend_args_t *a, const tdist_op_opts_t *opts,
                      tdist_work_t **out);

/* ops_v.c: the group's backend takes wildcard receives (caps.any_source);
 * else TDIST_ERR_NOT_SUPPORTED naming `what` and the backend. */
int tdist__ops_check_any(const tdist_group_t *g, const char *what, const char *fn);

#endif
