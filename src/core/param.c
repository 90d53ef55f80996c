/*
 * param.c - reading settings once. Values read are kept in a small table so
 * tdist__param_str can return stable pointers, and so that each setting is
 * logged once.
 */
#include "core/param.h"

#include <errno.h>
#include <sched.h>
#include <unistd.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"

#define MAX_STR_PARAMS 64

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
  const char *name; /* static string of the caller */
  const char *value;
} strs[MAX_STR_PARAMS];
static int nstrs;

int64_t tdist__param_load(const char *name, int64_t dflt) {
  const char *s = getenv(name);
  if (!s || !*s) return dflt;
  char *end = NULL;
  errno = 0;
  long long v = strtoll(s, &end, 0);
  if (errno || !end || *end) {
    TDIST_WARN(CORE, "%s='%s' is not an integer; using the default %lld", name, s, (long long)dflt);
    return dflt;
  }
  if (v != dflt) TDIST_INFO(CORE, "%s set by environment to %lld", name, v);
  return (int64_t)v;
}

const char *tdist__param_str(const char *name, const char *dflt) {
  const char *out = dflt;
  int log_it = 0;
  pthread_mutex_lock(&lock);
  int i;
  for (i = 0; i < nstrs; i++)
    if (strcmp(strs[i].name, name) == 0) break;
  if (i < nstrs) {
    out = strs[i].value ? strs[i].value : dflt;
  } else {
    const char *s = getenv(name);
    /* strdup with libc: these live until exit, outside the runtime's arena. */
    char *copy = (s && *s) ? strdup(s) : NULL;
    if (nstrs < MAX_STR_PARAMS) {
      strs[nstrs].name = name;
      strs[nstrs].value = copy;
      nstrs++;
    }
    if (copy) {
      out = copy;
      log_it = !dflt || strcmp(copy, dflt) != 0;
    }
  }
  pthread_mutex_unlock(&lock);
  /* Logging reads TDIST_DEBUG through this function: log outside the lock,
   * and never about the logger's own settings before it is ready. */
  if (log_it && strncmp(name, "TDIST_DEBUG", 11) != 0)
    TDIST_INFO(CORE, "%s set by environment to '%s'", name, out);
  return out;
}

int tdist__oversubscribed(void) {
  static _Atomic int cached = -1;
  int v = atomic_load_explicit(&cached, memory_order_relaxed);
  if (v >= 0) return v;
  const char *lws = getenv("LOCAL_WORLD_SIZE");
  long local = lws ? strtol(lws, NULL, 10) : 0;
  cpu_set_t set;
  long cpus = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 0;
  if (cpus <= 0) cpus = sysconf(_SC_NPROCESSORS_ONLN);
  v = local > 0 && cpus > 0 && local * 2 > cpus;
  if (v) TDIST_INFO(CORE, "%ld local ranks on %ld CPUs: spin-waiting off by default", local, cpus);
  atomic_store_explicit(&cached, v, memory_order_relaxed);
  return v;
}

const char *tdist__env_raw(const char *name) {
  const char *s = getenv(name);
  return (s && *s) ? s : NULL;
}
