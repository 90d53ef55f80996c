/*
 * copy.c - the CPU backend's bulk copies: payload bytes moved through the
 * shared segment's slots, between a member's own buffers, and through the
 * rings, each large one by the CPU's string move unless this thread
 * measured a vector loop twice as fast for its size.
 *
 * Why two ways, and a measure: on the 2-core AMD EPYC (family 26) guests
 * the project runs on, neither the CPU's string move (`rep movsb`, what
 * glibc 2.36 uses from 8 KiB on such a CPU) nor a plain vector loop wins
 * on every host. On the 2026-12-01 00:24 machine the string move was
 * several times slower for some placements of source and destination (a
 * 64 KiB all_gather at n = 2 took 95 us with it and 17 without; broadcast
 * 64 MiB 41 -> 12.6 ms), so every payload copy became the vector loop. On
 * the 2026-12-01 22:00 machine, the vector loop was the slow one: a slot's
 * lines come from the other CPU's cache, and there the loop moved them at
 * a third to a quarter of the string move's rate (broadcast 1 MiB at n = 2
 * 140-160 us against 35-74, 16 MiB 2.2-2.7 ms against 0.63-0.94), while
 * between private buffers the two were level (bench/cpu/RESULTS.md). A
 * library cannot know which host it is on, and the host's state changes,
 * so each thread times the two on its own copies: per size class (a power
 * of two from 8 KiB) and destination alignment, TDIST_CPU_COPY_LOOK copies
 * of every TDIST_CPU_COPY_EVERY alternate the two ways, and the class
 * takes the string move until the next look unless the loop's best time
 * was under half the string move's (copy.h, tdist__cpu_copy_tune_*). Why
 * not simply the faster: a copy's own time does not show what it costs
 * the other process, which reads a slot's lines next; measured at the
 * faster, a 64 KiB all_gather at n = 2 took 10.5-11.4 us against 6.1-6.6
 * with the string move forced, three alternated launches each, while the
 * loop was 2-4x slower where it lost. Under 8 KiB both glibc and this
 * file use vector loops (and below 256 bytes memcpy). TDIST_CPU_COPY_LOOP
 * forces either.
 * A copy into a destination larger than the cache may stream instead
 * (tdist__cpu_copy_stream). Any thread; each thread's looks are its own
 * (thread-local), so no state is shared.
 */
#include <string.h>

#include "cpu/base/copy.h"

#include <stdatomic.h>
#include <stdint.h>

#include "util/clock.h"
#include "util/param.h"

/* The look (copy.h): plain arithmetic, the same on every architecture. */
int tdist__cpu_copy_tune_way(tdist__cpu_copy_tune_t *t, int *timed) {
  uint32_t k = t->seen++ % TDIST_CPU_COPY_EVERY;
  *timed = k < TDIST_CPU_COPY_LOOK;
  if (!*timed) return t->loop;
  if (k == 0) t->best[0] = t->best[1] = INT64_MAX;
  return (int)(k & 1); /* alternated: both meet the same host state */
}

void tdist__cpu_copy_tune_took(tdist__cpu_copy_tune_t *t, int loop, size_t n, int64_t ns) {
  int64_t per = (int64_t)(((uint64_t)(ns > 0 ? ns : 0) << 16) / n); /* ns per 64 KiB */
  if (per < t->best[loop]) t->best[loop] = per;
  if (t->best[0] != INT64_MAX && t->best[1] != INT64_MAX)
    t->loop = t->best[1] < t->best[0] / TDIST_CPU_COPY_LOOP_GAIN;
}

#if defined(__x86_64__)
#include <immintrin.h>

/* name(d, s, i, n): bytes [i, n) a turn of four W-byte loads then four
 * stores at a time, while a whole turn fits; returns where it stopped. */
#define COPY_TURNS(name, attr, T, W, LOAD, STORE)                             \
  attr static size_t name(uint8_t *d, const uint8_t *s, size_t i, size_t n) { \
    for (; i + 4 * (W) <= n; i += 4 * (W)) {                                  \
      T a = LOAD((const T *)(const void *)(s + i));                           \
      T b = LOAD((const T *)(const void *)(s + i + (W)));                     \
      T c = LOAD((const T *)(const void *)(s + i + 2 * (W)));                 \
      T e = LOAD((const T *)(const void *)(s + i + 3 * (W)));                 \
      STORE((T *)(void *)(d + i), a);                                         \
      STORE((T *)(void *)(d + i + (W)), b);                                   \
      STORE((T *)(void *)(d + i + 2 * (W)), c);                               \
      STORE((T *)(void *)(d + i + 3 * (W)), e);                               \
    }                                                                         \
    return i;                                                                 \
  }
#define AVX2 __attribute__((target("avx2")))
COPY_TURNS(turns_avx2, AVX2, __m256i, 32, _mm256_loadu_si256, _mm256_storeu_si256)
COPY_TURNS(turns_sse2, , __m128i, 16, _mm_loadu_si128, _mm_storeu_si128)
/* Streaming stores: the destination's lines are written without being
 * read first, and leave the cache. For a destination larger than the
 * cache, which would be evicted unread anyway: a 32 MiB copy took 4.8 ms
 * (median) against 5.7 with plain stores and 6.3 with glibc's memcpy
 * (bench/cpu/copy_bench.c, 2026-12-01). They need an aligned destination. */
COPY_TURNS(stream_turns_avx2, AVX2, __m256i, 32, _mm256_loadu_si256, _mm256_stream_si256)
COPY_TURNS(stream_turns_sse2, , __m128i, 16, _mm_loadu_si128, _mm_stream_si128)

static int has_avx2(void) {
  static _Atomic int avx2; /* 0 unknown, 1 no, 2 yes; a race asks twice */
  int v = atomic_load_explicit(&avx2, memory_order_relaxed);
  if (!v) {
    __builtin_cpu_init();
    v = __builtin_cpu_supports("avx2") ? 2 : 1;
    atomic_store_explicit(&avx2, v, memory_order_relaxed);
  }
  return v == 2;
}

TDIST_PARAM(CpuCopyLoop, "TDIST_CPU_COPY_LOOP", -1)

/* The string move, the destination first aligned to its line: with a
 * misaligned destination it was reported 20x slower on AMD's Zen 3, the
 * first of its CPUs to advertise fast short string moves; n >= 64. */
void tdist__cpu_copy_string(void *dst, const void *src, size_t n) {
  uint8_t *d = dst;
  const uint8_t *s = src;
  size_t head = (size_t)(-(uintptr_t)d & 63);
  if (head) memcpy(d, s, 64); /* covers the head; its tail is copied again below */
  d += head;
  s += head;
  n -= head;
  __asm__ volatile("rep movsb" : "+D"(d), "+S"(s), "+c"(n) : : "memory");
}

void tdist__cpu_copy_loop(void *dst, const void *src, size_t n) {
  uint8_t *d = dst;
  const uint8_t *s = src;
  size_t i = has_avx2() ? turns_avx2(d, s, 0, n) : turns_sse2(d, s, 0, n);
  if (i < n) memcpy(d + i, s + i, n - i); /* under a turn: no string move */
}

/* A thread's looks: [destination off its line][size class]. */
static _Thread_local tdist__cpu_copy_tune_t tunes[2][TDIST_CPU_COPY_CLASSES];

void tdist__cpu_copy_big(void *dst, const void *src, size_t n) {
  /* Under the measured sizes the loop, as glibc's own below 8 KiB. */
  int64_t force = n < TDIST_CPU_COPY_TUNE_MIN ? 1 : tdist__param_CpuCopyLoop();
  if (force >= 0) {
    if (force)
      tdist__cpu_copy_loop(dst, src, n);
    else
      tdist__cpu_copy_string(dst, src, n);
    return;
  }
  unsigned c = 0;
  while (c + 1 < TDIST_CPU_COPY_CLASSES && ((size_t)TDIST_CPU_COPY_TUNE_MIN << (c + 1)) <= n)
    c++;
  tdist__cpu_copy_tune_t *t = &tunes[((uintptr_t)dst & 63) != 0][c];
  int timed;
  int loop = tdist__cpu_copy_tune_way(t, &timed);
  int64_t t0 = timed ? tdist__now_ns() : 0;
  if (loop)
    tdist__cpu_copy_loop(dst, src, n);
  else
    tdist__cpu_copy_string(dst, src, n);
  if (timed) tdist__cpu_copy_tune_took(t, loop, n, tdist__now_ns() - t0);
}

/* The head up to the destination's alignment and the tail under a turn
 * are copied plainly; the fence makes the streaming stores visible before
 * anything this thread publishes after (a release store does not order
 * them). */
void tdist__cpu_copy_stream(void *dst, const void *src, size_t n) {
  uint8_t *d = dst;
  const uint8_t *s = src;
  if (n < 256) {
    memcpy(d, s, n);
    return;
  }
  int avx2 = has_avx2();
  size_t i = (size_t)(-(uintptr_t)d & (avx2 ? 31 : 15));
  memcpy(d, s, i);
  i = avx2 ? stream_turns_avx2(d, s, i, n) : stream_turns_sse2(d, s, i, n);
  _mm_sfence();
  if (i < n) memcpy(d + i, s + i, n - i);
}
#else
void tdist__cpu_copy_big(void *dst, const void *src, size_t n) { memcpy(dst, src, n); }
void tdist__cpu_copy_string(void *dst, const void *src, size_t n) { memcpy(dst, src, n); }
void tdist__cpu_copy_loop(void *dst, const void *src, size_t n) { memcpy(dst, src, n); }
void tdist__cpu_copy_stream(void *dst, const void *src, size_t n) { memcpy(dst, src, n); }
#endif
