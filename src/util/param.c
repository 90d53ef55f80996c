/*
 * param.c - reading settings once. Values read are kept in a small table so
 * tdist__param_str can return stable pointers, and so that each setting is
 * logged once.
 */
#include "util/param.h"

#include <errno.h>
#include <sched.h>
#include <unistd.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "util/log.h"

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

#define MAX_STR_PARAMS 64

static struct {
  const char *name; /* static string of the caller */
  const char *value;
} strs[MAX_STR_PARAMS];
static int nstrs;

/* Integer settings already read: one entry per name for the whole process
 * (TDIST_PARAM's per-function cache is only the fast path), so a setting used
 * by several files is read and logged once. */
#define MAX_INT_PARAMS 128
static struct {
  const char *name;
  int64_t value;
} ints[MAX_INT_PARAMS];
static int nints;

static int64_t parse_int(const char *name, int64_t dflt) {
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

int64_t tdist__param_load(const char *name, int64_t dflt) {
  pthread_mutex_lock(&lock);
  for (int i = 0; i < nints; i++)
    if (strcmp(ints[i].name, name) == 0) {
      int64_t v = ints[i].value;
      pthread_mutex_unlock(&lock);
      return v;
    }
  pthread_mutex_unlock(&lock);
  /* Parsed (and logged) outside the lock: logging reads settings too. Two
   * threads racing on a first read may both parse; only one entry is kept. */
  int64_t v = parse_int(name, dflt);
  pthread_mutex_lock(&lock);
  int i;
  for (i = 0; i < nints; i++)
    if (strcmp(ints[i].name, name) == 0) break;
  if (i == nints && nints < MAX_INT_PARAMS) {
    ints[nints].name = name;
    ints[nints].value = v;
    nints++;
  } else if (i < nints) {
    v = ints[i].value;
  }
  pthread_mutex_unlock(&lock);
  return v;
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

/* LOCAL_WORLD_SIZE (0: unknown) and the CPUs this process may use, read once. */
static void host_counts(long *local, long *cpus) {
  static _Atomic long c_local = -1, c_cpus = -1;
  long l = atomic_load_explicit(&c_local, memory_order_relaxed);
  long c = atomic_load_explicit(&c_cpus, memory_order_relaxed);
  if (l < 0 || c < 0) {
    const char *lws = getenv("LOCAL_WORLD_SIZE");
    l = lws ? strtol(lws, NULL, 10) : 0;
    if (l < 0) l = 0;
    cpu_set_t set;
    c = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 0;
    if (c <= 0) c = sysconf(_SC_NPROCESSORS_ONLN);
    if (c < 0) c = 0;
    atomic_store_explicit(&c_cpus, c, memory_order_relaxed);
    atomic_store_explicit(&c_local, l, memory_order_relaxed);
  }
  *local = l;
  *cpus = c;
}

int tdist__oversubscribed(void) {
  static _Atomic int cached = -1;
  int v = atomic_load_explicit(&cached, memory_order_relaxed);
  if (v >= 0) return v;
  long local, cpus;
  host_counts(&local, &cpus);
  v = local > 0 && cpus > 0 && local * 2 > cpus;
  if (v) TDIST_INFO(CORE, "%ld local ranks on %ld CPUs: spin-waiting off by default", local, cpus);
  atomic_store_explicit(&cached, v, memory_order_relaxed);
  return v;
}

int tdist__ranks_exceed_cpus(void) {
  long local, cpus;
  host_counts(&local, &cpus);
  return local > 0 && cpus > 0 && local > cpus;
}

const char *tdist__env_raw(const char *name) {
  const char *s = getenv(name);
  return (s && *s) ? s : NULL;
}

void tdist__job_id_clean(char *s) {
  size_t o = 0;
  for (size_t i = 0; s[i] && o < 63; i++) {
    unsigned char ch = (unsigned char)s[i];
    s[o++] = (ch < 0x21 || ch > 0x7e || ch == '"' || ch == '\\' || ch == '/') ? '_' : (char)ch;
  }
  s[o] = '\0';
  if (o == 0) strcpy(s, "-");
}
