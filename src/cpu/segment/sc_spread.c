/*
 * sc_spread.c - a crowded group's callers spread over the CPUs.
 *
 * Where a group's members outnumber the CPUs (sc_crowded: four ranks on
 * the 2-core CI VM), each op needs every member's caller to run, and
 * waiters yield the CPU to each other (core/work, spin). Split 2 + 2, an
 * 8-byte all_reduce at n = 4 took about 10 us there; split 3 + 1 it took
 * 22-28 (p50), and the split stayed for whole 2000-op runs: the lone
 * member's yields find nobody else on its CPU, so it stays runnable and
 * its CPU looks busy, while the three others ran within the last half
 * millisecond, which the kernel's balancer counts as cache-hot and does
 * not move (`TDIST_BENCH_TAIL=1`: the lone rank switched 3 times in the
 * loop, the others 1334 times each; bench/cpu/RESULTS.md, 2026-12-02).
 * No member can see that from its own CPU, but the group's segment can:
 * each waiting caller publishes its CPU in its control line, and a caller
 * that finds more members on its CPU than an even split gives moves itself
 * to the CPU of its mask with the fewest, if that leaves the two closer.
 * Only the highest rank on a crowded CPU moves, so its mates stay, and
 * only on the same pick at two looks in a row, so a member that moved since
 * it last published is not taken for a crowd; a thread moves at most once
 * per SPREAD_GAP_NS, so it never fights the kernel's own balancing for
 * long. The move narrows the thread's affinity
 * to that CPU and puts the mask back at once (core/work's move_off_cpu
 * does the same): the kernel may move it again later.
 *
 * TDIST_CPU_SC_SPREAD=0 turns it off.
 *
 * Threads: a caller's spin test (tdist__cpu_test), outside the engine lock:
 * it reads the members' published CPUs (relaxed: a stale one only delays a
 * move) and writes its own.
 */
#include <sched.h>
#include <stdatomic.h>

#include "util/clock.h"
#include "util/error.h"
#include "util/param.h"
#include "cpu/base/base.h"
#include "cpu/segment/sc.h"

TDIST_PARAM(CpuScSpread, "TDIST_CPU_SC_SPREAD", 1)

/* Spin tests between looks: a look reads n lines the others write. */
#define SC_SPREAD_EVERY 32u
/* The least time between two moves of one thread. */
#define SPREAD_GAP_NS 2000000

static _Thread_local unsigned tl_tests;
static _Thread_local int64_t tl_moved_ns;
static _Thread_local int tl_pick = -1; /* the last look's pick */

/* Most members a CPU may host in an even split of n over cpus. */
static int even_split(int n, int cpus) { return (n + cpus - 1) / cpus; }

int tdist__cpu_sc_spread_pick(const int *cpu, int n, int me, int cpus, const cpu_set_t *mask) {
  int here = 0, mine = cpu[me];
  if (mine < 0 || cpus <= 0) return -1;
  /* Every member placed, and this one the highest rank on its CPU. */
  for (int m = 0; m < n; m++) {
    if (cpu[m] < 0) return -1;
    if (cpu[m] == mine) {
      here++;
      if (m > me) return -1;
    }
  }
  if (here <= even_split(n, cpus)) return -1;
  int best = -1, fewest = n;
  for (int c = 0, seen = 0, all = CPU_COUNT(mask); c < CPU_SETSIZE && seen < all; c++) {
    if (!CPU_ISSET(c, mask)) continue;
    seen++;
    if (c == mine) continue;
    int k = 0;
    for (int m = 0; m < n; m++)
      k += cpu[m] == c;
    if (k < fewest) {
      best = c;
      fewest = k;
    }
  }
  /* Only a move that leaves the two CPUs closer: 3 + 1 becomes 2 + 2, and
   * 2 + 1 (three members on two CPUs) stays. */
  return best >= 0 && fewest + 1 < here ? best : -1;
}

void tdist__cpu_sc_spread(cpu_sc_t *ch) {
  if (!tdist__param_CpuScSpread()) return;
  /* Published on every spin test (a getcpu is a read of the thread's rseq
   * area), so a board is at most one test old for every member waiting. */
  int my = sched_getcpu();
  if (my < 0 || my >= CPU_SETSIZE) return;
  _Atomic int32_t *pub = &ch->rg[ch->me].ctl->cpu;
  if (atomic_load_explicit(pub, memory_order_relaxed) != my + 1)
    atomic_store_explicit(pub, my + 1, memory_order_relaxed);
  if (++tl_tests % SC_SPREAD_EVERY) return;
  int cpu[SC_MAX_RANKS], here = 0;
  for (int m = 0; m < ch->n; m++) {
    cpu[m] = atomic_load_explicit(&ch->rg[m].ctl->cpu, memory_order_relaxed) - 1;
    here += cpu[m] == my;
  }
  /* The common case, before any system call: no more members here than an
   * even split (the pick checks it again, with the rest). */
  if (here <= even_split(ch->n, ch->cpus)) return;
  int64_t now = tdist__now_ns();
  if (tl_moved_ns && now - tl_moved_ns < SPREAD_GAP_NS) return;
  cpu_set_t mask, to;
  if (sched_getaffinity(0, sizeof(mask), &mask) != 0) return;
  int best = tdist__cpu_sc_spread_pick(cpu, ch->n, ch->me, ch->cpus, &mask);
  /* The same pick at two looks in a row: a member that moved (or was
   * moved) since it last published is not taken for a crowd. */
  int again = best >= 0 && best == tl_pick;
  tl_pick = best;
  if (!again) return;
  tl_pick = -1;
  tl_moved_ns = now;
  CPU_ZERO(&to);
  CPU_SET(best, &to);
  if (sched_setaffinity(0, sizeof(to), &to) != 0) return;
  (void)sched_setaffinity(0, sizeof(mask), &mask);
  atomic_store_explicit(pub, best + 1, memory_order_relaxed);
  TDIST_INFO(CPU, "spread: caller of member %d moved from CPU %d (%d members) to CPU %d", ch->me,
             my, here, best);
}
