/* bench_complat_peek.h - the internal of the NCCL backend read by complat_sim.c
 * (complat_peek.c). */
#ifndef TDIST_BENCH_COMPLAT_PEEK_H
#define TDIST_BENCH_COMPLAT_PEEK_H

#include "tdist/tdist.h"

/* The end event (cudaEvent_t) of a launched, not yet completed NCCL op. */
void *complat_work_end_event(tdist_work_t *w);

#endif
