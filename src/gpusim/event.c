/*
 * event.c - events: records, queries, synchronisation, elapsed time, and
 * cudaStreamWaitEvent.
 *
 * An event's state is its last record (a gs_mark_t, stream.h): a fence
 * (stream, position) for an eager record, or a position inside a capture
 * for a captured one. Queries and waits use the record as of the call
 * (CUDA Runtime API, cudaEventRecord: "Other APIs such as
 * cudaStreamWaitEvent() use the most recently captured state at the time
 * of the API call"). Events are reference counted: the user's handle,
 * queued record items and graph nodes; cudaEventDestroy drops the handle
 * and the memory goes with the last ref. All state is under gs_lock.
 */
#include <stdlib.h>
#include <string.h>

#include "gpusim/sim.h"
#include "gpusim/stream.h"

void gs_mark_clear_locked(gs_mark_t *m) {
  if (m->rs) gs_stream_unref_locked(m->rs);
  if (m->cap) gs_capture_unref_locked(m->cap);
  memset(m, 0, sizeof(*m));
}

void gs_mark_copy_locked(gs_mark_t *dst, const gs_mark_t *src) {
  gs_mark_clear_locked(dst);
  *dst = *src;
  if (dst->rs) dst->rs->refs++;
  if (dst->cap) dst->cap->refs++;
}

void gs_event_unref_locked(struct CUevent_st *ev) {
  if (--ev->refs > 0) return;
  gs_mark_clear_locked(&ev->mark);
  free(ev);
}

/* CUDA Runtime API, cudaEventCreateWithFlags: the event belongs to the
 * current device; cudaEventInterprocess needs cudaEventDisableTiming. */
GS_API cudaError_t cudaEventCreateWithFlags(cudaEvent_t *ev, unsigned int flags) {
  cudaError_t e = gs_context_current();
  if (e != cudaSuccess) return gs_err(e);
  unsigned all = cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess;
  if (!ev || (flags & ~all) ||
      ((flags & cudaEventInterprocess) && !(flags & cudaEventDisableTiming)))
    return gs_err(cudaErrorInvalidValue);
  struct CUevent_st *x = calloc(1, sizeof(*x));
  if (!x) return gs_err(cudaErrorMemoryAllocation);
  x->dev = gs_current_device();
  x->flags = flags;
  x->refs = 1;
  pthread_mutex_lock(&gs_lock);
  int rc = gs_hset_add(&gs_events, x);
  pthread_mutex_unlock(&gs_lock);
  if (rc != 0) {
    free(x);
    return gs_err(cudaErrorMemoryAllocation);
  }
  *ev = x;
  return cudaSuccess;
}

/* CUDA Runtime API, cudaEventCreate. */
GS_API cudaError_t cudaEventCreate(cudaEvent_t *ev) {
  return cudaEventCreateWithFlags(ev, cudaEventDefault);
}

/* CUDA Runtime API, cudaEventDestroy: allowed while the event's record is
 * pending; the resources go once it completes. */
GS_API cudaError_t cudaEventDestroy(cudaEvent_t ev) {
  cudaError_t e = gs_context_current();
  if (e != cudaSuccess) return gs_err(e);
  pthread_mutex_lock(&gs_lock);
  bool ok = gs_hset_has(&gs_events, ev);
  if (ok) {
    gs_hset_del(&gs_events, ev);
    gs_event_unref_locked(ev);
  }
  gs_unlock();
  return gs_err(ok ? cudaSuccess : cudaErrorInvalidResourceHandle);
}

/* CUDA Runtime API, cudaEventRecord: the event and the stream must be on
 * the same device; the record captures the stream's work as of the call
 * (in a capturing stream, a position in the capture). */
GS_API cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t s) {
  cudaError_t e = gs_context_current();
  if (e != cudaSuccess) return gs_err(e);
  gs_item_t *it = gs_item_new(GS_IT_RECORD);
  if (!it) return gs_err(cudaErrorMemoryAllocation);
  int captured;
  pthread_mutex_lock(&gs_lock);
  struct CUstream_st *st = gs_stream_get_locked(s);
  if (!st || !gs_hset_has(&gs_events, ev) || ev->dev != st->dev) {
    free(it);
    e = cudaErrorInvalidResourceHandle;
  } else {
    it->ev = ev;
    ev->refs++;
    e = gs_submit_locked(st, it, &captured);
  }
  gs_unlock();
  return gs_err(e);
}

/* Checks shared by cudaEventQuery and cudaEventSynchronize: a context, the
 * thread's capture mode (both are potentially unsafe calls, CUDA Runtime
 * API, cudaThreadExchangeStreamCaptureMode), a live handle, and a record
 * that was not captured (cudaErrorCapturedEvent, CUDA Programming Guide,
 * Stream Capture / Prohibited and Unhandled Operations: the attempt
 * invalidates the capture). On success (*rs, *rseq) is the fence to wait for
 * (rs NULL: nothing) with a ref on rs, *dev the event's device. */
static cudaError_t event_target(cudaEvent_t ev, struct CUstream_st **rs, uint64_t *rseq, int *dev) {
  cudaError_t e = gs_context_current();
  if (e == cudaSuccess) e = gs_capture_unsafe();
  if (e != cudaSuccess) return e;
  *rs = NULL;
  pthread_mutex_lock(&gs_lock);
  if (!gs_hset_has(&gs_events, ev)) {
    e = cudaErrorInvalidResourceHandle;
  } else if (ev->mark.cap) {
    if (ev->mark.cap->status != GS_CAP_ENDED) gs_capture_invalidate_locked(ev->mark.cap);
    e = cudaErrorCapturedEvent;
  } else {
    *dev = ev->dev;
    if ((*rs = ev->mark.rs)) {
      (*rs)->refs++;
      *rseq = ev->mark.rseq;
    }
  }
  pthread_mutex_unlock(&gs_lock);
  return e;
}

/* CUDA Runtime API, cudaEventQuery: cudaSuccess when the last record has
 * completed or the event was never recorded, else cudaErrorNotReady (not
 * an error: the last error is left alone). Makes a context on the calling
 * thread's current device, whatever the event's device. */
GS_API cudaError_t cudaEventQuery(cudaEvent_t ev) {
  struct CUstream_st *rs;
  uint64_t rseq = 0;
  int dev = 0;
  cudaError_t e = event_target(ev, &rs, &rseq, &dev);
  if (e != cudaSuccess) return gs_err(e);
  bool done = true;
  if (rs) {
    pthread_mutex_lock(&gs_lock);
    done = rs->done >= rseq;
    gs_stream_unref_locked(rs);
    pthread_mutex_unlock(&gs_lock);
  }
  if ((e = gs_sticky(dev)) != cudaSuccess) return gs_err(e);
  return done ? cudaSuccess : cudaErrorNotReady;
}

/* CUDA Runtime API, cudaEventSynchronize: waits for the last record (as of
 * the call) to complete. */
GS_API cudaError_t cudaEventSynchronize(cudaEvent_t ev) {
  struct CUstream_st *rs;
  uint64_t rseq = 0;
  int dev = 0;
  cudaError_t e = event_target(ev, &rs, &rseq, &dev);
  if (e != cudaSuccess) return gs_err(e);
  if (rs) {
    pthread_mutex_lock(&gs_lock);
    while (rs->done < rseq)
      pthread_cond_wait(&gs_progress, &gs_lock);
    gs_stream_unref_locked(rs);
    pthread_mutex_unlock(&gs_lock);
  }
  return gs_err(gs_sticky(dev));
}

/* CUDA Runtime API, cudaEventElapsedTime: milliseconds between the last
 * records of two timing events; cudaErrorInvalidResourceHandle when either
 * has cudaEventDisableTiming or was never recorded, cudaErrorNotReady when
 * either record has not completed. */
GS_API cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
  cudaError_t e = gs_context_current();
  if (e != cudaSuccess) return gs_err(e);
  if (!ms) return gs_err(cudaErrorInvalidValue);
  pthread_mutex_lock(&gs_lock);
  struct CUevent_st *ev[2] = {start, end};
  for (int i = 0; i < 2 && e == cudaSuccess; i++) {
    if (!gs_hset_has(&gs_events, ev[i]) || (ev[i]->flags & cudaEventDisableTiming) ||
        ev[i]->gen == 0)
      e = cudaErrorInvalidResourceHandle;
    else if (ev[i]->mark.cap)
      e = cudaErrorCapturedEvent;
  }
  for (int i = 0; i < 2 && e == cudaSuccess; i++)
    if (ev[i]->time_gen != ev[i]->gen) e = cudaErrorNotReady;
  if (e == cudaSuccess) *ms = (float)((double)(end->time_ns - start->time_ns) / 1e6);
  pthread_mutex_unlock(&gs_lock);
  if (e == cudaErrorNotReady) return e;
  return gs_err(e);
}

/* CUDA Runtime API, cudaStreamWaitEvent: later work on s waits for the
 * event's last record as of this call; an event never recorded means no
 * wait. The capture rules (join, merge, isolation) are in capture.c. */
GS_API cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t ev, unsigned int flags) {
  cudaError_t e = gs_context_current();
  if (e != cudaSuccess) return gs_err(e);
  if (flags & ~(unsigned)GS_EVENT_WAIT_EXTERNAL) return gs_err(cudaErrorInvalidValue);
  pthread_mutex_lock(&gs_lock);
  struct CUstream_st *st = gs_stream_get_locked(s);
  if (!st || !gs_hset_has(&gs_events, ev))
    e = cudaErrorInvalidResourceHandle;
  else if ((e = gs_sticky(st->dev)) == cudaSuccess)
    e = gs_wait_mark_locked(st, &ev->mark, flags, ev);
  gs_unlock();
  return gs_err(e);
}
