/*
 * copy.c - the CPU backend's bulk copies: payload bytes moved through the
 * shared segment's slots, between a member's own buffers, and through the
 * rings, without the C library's `rep movsb`.
 *
 * Why: glibc (2.36, Debian 12) copies 2 KiB and up with `rep movsb` where
 * the CPU advertises fast string moves, and on the AMD EPYC guests CI runs
 * on that instruction is several times slower than a vector loop for some
 * placements of source and destination: a 64 KiB all_gather at n = 2 took
 * 95 us where its buffers came from the heap after larger ones had been
 * freed, and 17 us with `GLIBC_TUNABLES=glibc.cpu.x86_rep_movsb_threshold`
 * set past it; broadcast 64 MiB 41 -> 12.6 ms, all_reduce 1 MiB 598 -> 274 us
 * (bench/cpu/RESULTS.md, 2026-12-01). A library cannot set the tunable (it
 * is read at process start), so the copies that carry payload call this
 * instead: four 32-byte (AVX2) or 16-byte (SSE2) loads and stores a turn,
 * unaligned, picked once by the CPU's features; below 256 bytes, and on
 * other architectures, memcpy. A copy into a destination larger than the
 * cache may stream instead (tdist__cpu_copy_stream). Any thread; no state
 * but the pick.
 */
#include <string.h>

#include "cpu/base/copy.h"

#include <stdatomic.h>
#include <stdint.h>

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

void tdist__cpu_copy_big(void *dst, const void *src, size_t n) {
  uint8_t *d = dst;
  const uint8_t *s = src;
  size_t i = has_avx2() ? turns_avx2(d, s, 0, n) : turns_sse2(d, s, 0, n);
  if (i < n) memcpy(d + i, s + i, n - i); /* under a turn: no string move */
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
void tdist__cpu_copy_stream(void *dst, const void *src, size_t n) { memcpy(dst, src, n); }
#endif
