/*
 * log.h - NCCL_DEBUG-style logging (internal).
 *
 *   TDIST_DEBUG=WARN|INFO|TRACE    level (default: none; WARN also shows errors)
 *   TDIST_DEBUG_SUBSYS=CORE,STORE  subsystems to show (default ALL; a leading
 *                                  ^ excludes the listed ones instead)
 *   TDIST_DEBUG_FILE=path          write there instead of stderr; %h is
 *                                  replaced by the host name, %p by the pid
 *
 * Each line: "host:pid:tid TDIST LEVEL [SUBSYS] message". The settings are
 * read once, on the first log call. Any thread may log.
 */
#ifndef TDIST_UTIL_LOG_H
#define TDIST_UTIL_LOG_H

#include <stdatomic.h>

enum tdist__log_level { TDIST_LOG_NONE = 0, TDIST_LOG_WARN, TDIST_LOG_INFO, TDIST_LOG_TRACE };

enum tdist__subsys {
  TDIST_SUB_CORE = 1u << 0,
  TDIST_SUB_STORE = 1u << 1,
  TDIST_SUB_CPU = 1u << 2,
  TDIST_SUB_NCCL = 1u << 3,
  TDIST_SUB_INIT = 1u << 4,
  TDIST_SUB_TOOL = 1u << 5,
  TDIST_SUB_BACKEND = 1u << 6, /* plug-in backends (tdist_backend_log) */
  TDIST_SUB_ALL = 0x7f
};

/* -1 until the settings are read; then the level. */
extern _Atomic int tdist__log_level_;
extern unsigned tdist__log_subsys_;

void tdist__log_init(void);
void tdist__log(int level, unsigned subsys, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static inline int tdist__log_enabled(int level, unsigned subsys) {
  int l = atomic_load_explicit(&tdist__log_level_, memory_order_relaxed);
  if (l < 0) {
    tdist__log_init();
    l = atomic_load_explicit(&tdist__log_level_, memory_order_relaxed);
  }
  return level <= l && (tdist__log_subsys_ & subsys);
}

#define TDIST_LOG_(lvl, sub, ...)                                \
  do {                                                           \
    if (tdist__log_enabled((lvl), (sub)))                        \
      tdist__log((lvl), (sub), __FILE__, __LINE__, __VA_ARGS__); \
  } while (0)

#define TDIST_WARN(sub, ...) TDIST_LOG_(TDIST_LOG_WARN, TDIST_SUB_##sub, __VA_ARGS__)
#define TDIST_INFO(sub, ...) TDIST_LOG_(TDIST_LOG_INFO, TDIST_SUB_##sub, __VA_ARGS__)
#define TDIST_TRACE(sub, ...) TDIST_LOG_(TDIST_LOG_TRACE, TDIST_SUB_##sub, __VA_ARGS__)

#endif
