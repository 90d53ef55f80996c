/*
 * trace.h - the flight recorder inside the runtime (internal; above
 * work, progress and util).
 *
 * A passive ring of the last N ops of a group, written when an op starts
 * and when it finishes: by the progress thread, or by the caller thread of
 * a synchronous op that never reached the progress thread (ops.c: a caller
 * that drives its op to the end within its spin records it itself). `mu`
 * makes the two writers and a snapshot take turns. A dump is a
 * snapshot (the ring and a description of the group, taken on the progress
 * thread by whoever owns the group) written to a file by another thread: the
 * progress thread never writes files. Times are CLOCK_MONOTONIC ns,
 * converted to wall-clock microseconds when written, so that files of
 * different hosts line up.
 */
#ifndef TDIST_CORE_TRACE_H
#define TDIST_CORE_TRACE_H

#include <stdint.h>

#include "core/work/work.h"
#include "util/spin.h"

typedef struct tdist__trace_rec {
  uint64_t seq;
  int64_t t_enqueue_ns, t_start_ns, t_end_ns;
  uint64_t count;
  int16_t op, dtype, redop, state;
  int32_t root; /* root, peer, or -1 */
  int32_t status;
} tdist__trace_rec_t;

typedef struct tdist__trace {
  tdist__spin_t mu;  /* every access below (a record is tens of bytes: util/spin.h) */
  uint64_t recorded; /* records ever written (dropped = recorded - cap) */
  uint32_t cap;
  tdist__trace_rec_t recs[];
} tdist__trace_t;

/* What a dump says about its group, besides the ring. */
typedef struct tdist__trace_meta {
  char name[96];
  char backend[16];
  char job[64]; /* the job's id ("-": unknown) */
  uint64_t uid;
  int rank, size;
  const int *ranks; /* group rank -> world rank (copied by the snapshot) */
  uint64_t next_seq;
  int aborted;
  char abort_reason[256];
} tdist__trace_meta_t;

typedef struct tdist__trace_dump tdist__trace_dump_t;

/* Caller thread, at group creation: NULL when TDIST_TRACE_BUFFER_SIZE=0. */
tdist__trace_t *tdist__trace_new(void);
/* Progress thread, or the caller thread of a synchronous op it finished
 * itself (ops.c). */
void tdist__trace_start(tdist__trace_t *t, const tdist_work_t *w);
void tdist__trace_end(tdist__trace_t *t, const tdist_work_t *w);
/* Caller thread: the start and the end of a synchronous op that never
 * reached the progress thread, in one turn. */
void tdist__trace_whole(tdist__trace_t *t, const tdist_work_t *w);
/* Caller thread, at group destroy. */
void tdist__trace_free(tdist__trace_t *t);

/* Progress thread (the copy is taken under mu: a caller may be recording):
 * a copy of the ring and of m, or NULL (no memory). */
tdist__trace_dump_t *tdist__trace_snapshot(const tdist__trace_t *t, const tdist__trace_meta_t *m);
/* Any thread but the progress thread (it writes a file): write d to `path`
 * (NULL: the default path, TDIST_TRACE_PREFIX + name + rank) as JSON Lines
 * (json-c) and free it. 0, TDIST_ERR_IO, or TDIST_ERR_NO_MEMORY when json-c
 * could not build a line (message recorded). */
int tdist__trace_write(tdist__trace_dump_t *d, const char *path);
/* Progress thread: after a failure (TDIST_TRACE_ON_FAILURE=1), snapshot t
 * and have the worker thread write it to the default path, with one line on
 * stderr saying where. */
void tdist__trace_dump_on_failure(const tdist__trace_t *t, const tdist__trace_meta_t *m);

#endif
