/*
 * services.c - what the core offers a backend beyond completing and failing
 * its ops (inflight.c): the progress thread, the worker, the store's
 * all-gather, settings, errors and logging, as declared in the public,
 * versioned tdist/backend.h. Each is a thin door onto a lower layer, so a
 * backend (built in or a plug-in) reaches the core through this header
 * alone and never includes core/progress.h, store/ or util/worker.h.
 *
 * Layer: group (it calls progress, store and util; backends call it).
 * Threads: as each declaration in tdist/backend.h says.
 */
#include <stdarg.h>
#include <stdio.h>

#include "tdist/backend.h"
#include "core/progress/progress.h"
#include "store/bootstrap.h"
#include "util/error.h"
#include "util/log.h"
#include "util/param.h"
#include "util/worker.h"

void tdist_backend_call(tdist_backend_progress_t *p, void (*fn)(void *arg), void *arg) {
  tdist__progress_call(p, fn, arg);
}

void *tdist_backend_loop(tdist_backend_progress_t *p) { return tdist__progress_loop(p); }

void tdist_backend_kick(tdist_backend_progress_t *p) { tdist__progress_kick(p); }

void tdist_backend_wake_any(void) { tdist__progress_wake_any(); }

int tdist_backend_on_progress_thread(void) { return tdist__progress_on_thread(); }

int tdist_backend_worker_run(void (*fn)(void *arg), void *arg) {
  return tdist__worker_run(fn, arg);
}

int tdist_backend_allgather(tdist_store_t *store, const char *tag, int rank, int size,
                            const void *mine, size_t len, const int *from, int n_from, void **vals,
                            size_t *lens, int64_t timeout_ms) {
  return tdist__store_allgather(store, tag, rank, size, mine, len, from, n_from, vals, lens,
                                timeout_ms);
}

int64_t tdist_backend_param_int(const char *name, int64_t dflt) {
  if (!name) return dflt;
  return tdist__param_load(name, dflt);
}

int tdist_backend_error(int code, const char *fmt, ...) {
  char text[512] = "";
  if (fmt) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
  }
  return tdist__error(code, "%s", text);
}

void tdist_backend_log(int level, const char *fmt, ...) {
  int lvl = level <= 0 ? TDIST_LOG_WARN : level == 1 ? TDIST_LOG_INFO : TDIST_LOG_TRACE;
  if (!fmt || !tdist__log_enabled(lvl, TDIST_SUB_BACKEND)) return;
  char text[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof(text), fmt, ap);
  va_end(ap);
  tdist__log(lvl, TDIST_SUB_BACKEND, "backend", 0, "%s", text);
}
