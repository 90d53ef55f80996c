/* clock.h - monotonic time (internal). Any thread. */
#ifndef TDIST_UTIL_CLOCK_H
#define TDIST_UTIL_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline int64_t tdist__now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline int64_t tdist__now_ms(void) { return tdist__now_ns() / 1000000; }

#endif
