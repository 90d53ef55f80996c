/*
 * complat_peek.c - the one internal of the NCCL backend complat_sim.c
 * needs, in its own translation unit (src/nccl/nccl_backend.h redirects
 * every CUDA and NCCL name through the backend's table of loaded calls,
 * which the bench itself must not see): an op's end event, the one the
 * progress thread's poll queries and torch's Work::isCompleted would. The
 * bench reads when it completed, and its cudaEventQuery loop polls it.
 *
 * Read on the caller's thread right after submit returned; the end event is
 * not recycled before the op completes (nccl_progress.c), nor re-recorded
 * before a later submit.
 */
#include "bench_complat_peek.h"

#include "core/work/work.h"
#include "nccl/nccl_backend.h"

void *complat_work_end_event(tdist_work_t *w) { return (void *)tdist__nccl_op(&w->bop)->end; }
