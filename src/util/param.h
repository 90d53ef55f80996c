/*
 * param.h - settings from the environment, read once (internal).
 *
 * Every TDIST_* environment variable is read through these helpers, never
 * with getenv() elsewhere, so that each is read once per process and logged at
 * INFO when it differs from its default. Define a setting with
 *
 *   TDIST_PARAM(SpinUs, "TDIST_SPIN_US", 200)   -> int64_t tdist__param_SpinUs(void)
 *
 * Thread safety: any thread; the first read wins a benign race (same value).
 */
#ifndef TDIST_UTIL_PARAM_H
#define TDIST_UTIL_PARAM_H

#include <stdatomic.h>
#include <stdint.h>

/* Parse env `name` as an integer; `dflt` when unset or unparsable (warned). */
int64_t tdist__param_load(const char *name, int64_t dflt);

/* The value of env `name`, or `dflt` when unset or empty; the string is
 * cached for the life of the process (later setenv calls are not seen). */
const char *tdist__param_str(const char *name, const char *dflt);

/* Uncached raw read for the launcher-style variables (RANK, MASTER_ADDR...)
 * that rendezvous must see as they are at init time. */
const char *tdist__env_raw(const char *name);

/*
 * 1 when the ranks on this host have more threads than it has cores: each
 * rank runs a caller and a progress thread, so LOCAL_WORLD_SIZE * 2 > the
 * CPUs this process may use. Busy-waiting then takes the core a peer needs,
 * so the spin settings default to 0. Read once.
 */
int tdist__oversubscribed(void);

/*
 * 1 when this host's ranks (LOCAL_WORLD_SIZE) outnumber the CPUs this
 * process may use: a waiting caller that busy-polls would then hold the
 * core a peer's caller needs, so it yields from its first test instead
 * (core/work/work.c, TDIST_DRIVE_BUSY_US). Unlike tdist__oversubscribed it
 * does not count progress threads: a caller that drives its own op leaves
 * the progress thread asleep. 0 when LOCAL_WORLD_SIZE is unset.
 */
int tdist__ranks_exceed_cpus(void);

/* Make s (NUL-terminated, in place) a job id that is safe in a file name
 * and a JSON string: printable ASCII without '"', '\\' or '/', at most 63
 * characters, "-" when nothing is left. */
void tdist__job_id_clean(char *s);

/* `dflt`, or 0 on an oversubscribed host (the spin settings' default). */
#define TDIST_SPIN_DEFAULT(dflt) (tdist__oversubscribed() ? 0 : (dflt))

#define TDIST_PARAM_UNSET_ INT64_MIN
#define TDIST_PARAM(fn, env, dflt)                                    \
  static inline int64_t tdist__param_##fn(void) {                     \
    static _Atomic int64_t cache_ = TDIST_PARAM_UNSET_;               \
    int64_t v_ = atomic_load_explicit(&cache_, memory_order_relaxed); \
    if (v_ == TDIST_PARAM_UNSET_) {                                   \
      v_ = tdist__param_load(env, dflt);                              \
      atomic_store_explicit(&cache_, v_, memory_order_relaxed);       \
    }                                                                 \
    return v_;                                                        \
  }

#endif
