/*
 * tdist/debug.h - the flight recorder.
 *
 * Every group keeps a ring buffer of its last TDIST_TRACE_BUFFER_SIZE ops
 * (default 1024): sequence number, op, dtype, count, root or peer, state, and
 * enqueue, start and end times. When a group fails (timeout, peer failure,
 * mismatch, another rank's tdist_group_abort) each rank writes its buffer as
 * JSON Lines automatically (unless TDIST_TRACE_ON_FAILURE=0); a rank's own
 * tdist_group_abort writes none on that rank (the program asked for it:
 * call tdist_dump_trace first to keep its state). tdist_dump_trace() writes
 * it on demand.
 * `tdist-trace` (tools/) merges the files of all ranks, names the first op on
 * which ranks diverge or stall, and writes a Chrome trace-event file for
 * Perfetto. The format is in docs/flight-recorder.md.
 *
 * Files go to "<TDIST_TRACE_PREFIX><job>.<group>.rank<world rank>.json",
 * where <job> is the job's id (TDIST_JOB_ID, else agreed by the ranks when
 * they meet); "<TDIST_TRACE_PREFIX><group>.rank<world rank>.json" for a
 * group without one. The prefix defaults to "/tmp/tdist_trace_" (group names
 * have '/' and spaces replaced by '_'); a prefix ending in '/' is a
 * directory.
 */
#ifndef TDIST_DEBUG_H
#define TDIST_DEBUG_H

#include "tdist/types.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * tdist_dump_trace - write the flight recorder of `group` as JSON Lines.
 * @param group  the group; NULL dumps every group of this process (each to
 *               its default file; `path` must then be NULL).
 * @param path   the file to write, or NULL for the default name above.
 * @return 0; TDIST_ERR_IO if the file cannot be written (tdist_last_error()
 *         names it); TDIST_ERR_INVALID_ARGUMENT for a path without a group.
 * Thread: any, except a completion callback.
 */
int tdist_dump_trace(tdist_group_t *group, const char *path);

#ifdef __cplusplus
}
#endif
#endif /* TDIST_DEBUG_H */
