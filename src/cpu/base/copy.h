/*
 * copy.h - the CPU backend's payload copies (copy.c): memcpy and memmove
 * without glibc's `rep movsb`, several times slower on the CI's AMD guests
 * for some placements of source and destination. Any thread.
 */
#ifndef TDIST_CPU_BASE_COPY_H
#define TDIST_CPU_BASE_COPY_H

#include <stddef.h>
#include <string.h>

/* n bytes (256 and up), not overlapping, in vector loads and stores. */
void tdist__cpu_copy_big(void *dst, const void *src, size_t n);

/* n bytes, not overlapping, with streaming stores (the destination's lines
 * are not read first and leave the cache) and a store fence: for an op
 * whose output is larger than the cache (TDIST_CPU_SC_STREAM_BYTES). */
void tdist__cpu_copy_stream(void *dst, const void *src, size_t n);

/* memcpy for payload: not overlapping. */
static inline void tdist__cpu_copy(void *dst, const void *src, size_t n) {
  if (n < 256)
    memcpy(dst, src, n); /* below glibc's string-move sizes */
  else
    tdist__cpu_copy_big(dst, src, n);
}

/* memmove for payload: tdist__cpu_copy unless the ranges overlap. Inline:
 * a reduction's first block (sc_data.c) takes it on every small op. */
static inline void tdist__cpu_move(void *dst, const void *src, size_t n) {
  const unsigned char *d = dst, *s = src;
  if (n < 256 || (d < s + n && s < d + n))
    memmove(dst, src, n); /* small, or overlapping: the C library's */
  else
    tdist__cpu_copy_big(dst, src, n);
}

#endif
