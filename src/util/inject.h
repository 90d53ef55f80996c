/*
 * inject.h - failure injection for tests (internal).
 *
 * Code that builds something in steps calls tdist__inject("site") between
 * them; a test arms a site with tdist__inject_arm and the next call at that
 * site fails with the armed code (recorded with tdist__error, naming the
 * site), once, or sleeps (a delay armed for it). Unarmed, a call is one
 * relaxed atomic load. The unwind tests
 * (tests/core/test_unwind.c) walk every site of init, split, mesh and shrink.
 *
 * Thread safety: any thread.
 */
#ifndef TDIST_UTIL_INJECT_H
#define TDIST_UTIL_INJECT_H

#include <stdatomic.h>

extern _Atomic int tdist__inject_armed_;
int tdist__inject_slow(const char *site);

/* 0, or the armed code for this site (once); an armed delay sleeps, then 0. */
static inline int tdist__inject(const char *site) {
  return atomic_load_explicit(&tdist__inject_armed_, memory_order_relaxed)
             ? tdist__inject_slow(site)
             : 0;
}

/* Arm `site` to fail with rc (a negative tdist code) at its next call;
 * rc > 0 makes that call sleep rc milliseconds and succeed instead (a slow
 * rank, for the races between ranks). Site NULL disarms. */
void tdist__inject_arm(const char *site, int rc);
/* Number of armed failures that fired so far. */
int tdist__inject_fired(void);

#endif
