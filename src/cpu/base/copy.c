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
 * other architectures, memcpy. Any thread; no state but the pick.
 */
#include <string.h>

#include "cpu/base/copy.h"

#include <stdatomic.h>
#include <stdint.h>

#if defined(__x86_64__)
#include <immintrin.h>

__attribute__((target("avx2"))) static void copy_avx2(uint8_t *d, const uint8_t *s, size_t n) {
  size_t i = 0;
  for (; i + 128 <= n; i += 128) {
    __m256i a = _mm256_loadu_si256((const __m256i *)(const void *)(s + i));
    __m256i b = _mm256_loadu_si256((const __m256i *)(const void *)(s + i + 32));
    __m256i c = _mm256_loadu_si256((const __m256i *)(const void *)(s + i + 64));
    __m256i e = _mm256_loadu_si256((const __m256i *)(const void *)(s + i + 96));
    _mm256_storeu_si256((__m256i *)(void *)(d + i), a);
    _mm256_storeu_si256((__m256i *)(void *)(d + i + 32), b);
    _mm256_storeu_si256((__m256i *)(void *)(d + i + 64), c);
    _mm256_storeu_si256((__m256i *)(void *)(d + i + 96), e);
  }
  if (i < n) memcpy(d + i, s + i, n - i); /* under 128 bytes: no string move */
}

static void copy_sse2(uint8_t *d, const uint8_t *s, size_t n) {
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    __m128i a = _mm_loadu_si128((const __m128i *)(const void *)(s + i));
    __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(s + i + 16));
    __m128i c = _mm_loadu_si128((const __m128i *)(const void *)(s + i + 32));
    __m128i e = _mm_loadu_si128((const __m128i *)(const void *)(s + i + 48));
    _mm_storeu_si128((__m128i *)(void *)(d + i), a);
    _mm_storeu_si128((__m128i *)(void *)(d + i + 16), b);
    _mm_storeu_si128((__m128i *)(void *)(d + i + 32), c);
    _mm_storeu_si128((__m128i *)(void *)(d + i + 48), e);
  }
  if (i < n) memcpy(d + i, s + i, n - i);
}

typedef void (*copy_fn)(uint8_t *, const uint8_t *, size_t);
static copy_fn pick(void) {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") ? copy_avx2 : copy_sse2;
}

void tdist__cpu_copy_big(void *dst, const void *src, size_t n) {
  static _Atomic(copy_fn) fn; /* picked once; a race picks the same twice */
  copy_fn f = atomic_load_explicit(&fn, memory_order_relaxed);
  if (!f) atomic_store_explicit(&fn, f = pick(), memory_order_relaxed);
  f(dst, src, n);
}
#else
void tdist__cpu_copy_big(void *dst, const void *src, size_t n) { memcpy(dst, src, n); }
#endif
