/*
 * cpu.h - what the CPU backend's entry points share (backend.c, drive.c):
 * the top of src/cpu, above every sub-layer (src/cpu/<folder>/LAYER).
 */
#ifndef TDIST_CPU_CPU_H
#define TDIST_CPU_CPU_H

#include "cpu/base/base.h"

/* ---- backend.c: the backend as the core's table lists it ------------------------ */
extern const tdist_backend_t tdist__cpu_backend;

/* ---- drive.c: a waiting caller that drives its op, and the hooks ---------------- */
/* The hooks the entry registers for the sub-layers (cpu_hooks_t). */
extern const cpu_hooks_t tdist__cpu_hooks;
/* Backend entries on a caller thread (backend.c's vtable). */
int tdist__cpu_submit(void *state, tdist_backend_op_t *bop);
/* flags: TDIST_BACKEND_TEST_* (backend.h, test). */
int tdist__cpu_test(void *state, tdist_backend_op_t *bop, unsigned flags);
/* backend.c: start op bop of cg in the engine (the core's post, or submit's
 * early start): 0, or a negative code. Engine lock held. */
int tdist__cpu_post_op(cpu_group_t *cg, tdist_backend_op_t *bop);

#endif
