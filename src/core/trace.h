/*
 * trace.h - the flight recorder inside the runtime (internal).
 *
 * A ring of the last N ops of a group, written by the progress thread only
 * (when an op starts and when it finishes); dumps take a snapshot on the
 * progress thread, so no lock is needed. Times are CLOCK_MONOTONIC ns,
 * converted to wall-clock microseconds when written, so that files of
 * different hosts line up.
 */
#ifndef TDIST_CORE_TRACE_H
#define TDIST_CORE_TRACE_H

#include <stdint.h>

#include "core/work.h"

typedef struct tdist__trace_rec {
  uint64_t seq;
  int64_t t_enqueue_ns, t_start_ns, t_end_ns;
  uint64_t count;
  int16_t op, dtype, redop, state;
  int32_t root; /* root, peer, or -1 */
  int32_t status;
} tdist__trace_rec_t;

typedef struct tdist__trace {
  uint64_t recorded; /* records ever written (dropped = recorded - cap) */
  uint32_t cap;
  tdist__trace_rec_t recs[];
} tdist__trace_t;

/* Caller thread, at group creation: NULL when TDIST_TRACE_BUFFER_SIZE=0. */
tdist__trace_t *tdist__trace_new(void);
/* Progress thread. */
void tdist__trace_start(tdist_group_t *g, const tdist_work_t *w);
void tdist__trace_end(tdist_group_t *g, const tdist_work_t *w, int final_state);
/* Progress thread: write g's dump to its default file (after a failure). */
void tdist__trace_dump_on_failure(tdist_group_t *g);

#endif
