/*
 * copy.h - the CPU backend's payload copies (copy.c): memcpy and memmove
 * that take, per thread and size, the CPU's string move unless this thread
 * measured a vector loop twice as fast (each was several times slower than
 * the other on some of the project's hosts). Any thread.
 */
#ifndef TDIST_CPU_BASE_COPY_H
#define TDIST_CPU_BASE_COPY_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Copies of TDIST_CPU_COPY_TUNE_MIN bytes and up are measured, per size
 * class (a power of two; the last holds all larger) and destination
 * alignment: TDIST_CPU_COPY_LOOK of every TDIST_CPU_COPY_EVERY copies of a
 * class alternate the two ways, timed. */
#define TDIST_CPU_COPY_TUNE_MIN 8192u
#define TDIST_CPU_COPY_CLASSES 14 /* 8 KiB .. 64 MiB and up */
#define TDIST_CPU_COPY_LOOK 8u
#define TDIST_CPU_COPY_EVERY 1024u
/* The loop is taken where its best was under the string move's divided
 * by this (copy.c: why not simply the faster). */
#define TDIST_CPU_COPY_LOOP_GAIN 2

/* One class's looks (a thread's own): copies seen, the way it takes (1:
 * the vector loop, 0: the string move) and each way's best time in the
 * current look (ns per 64 KiB; INT64_MAX: none yet). Zeroed: no look yet,
 * the string move. */
typedef struct {
  uint32_t seen;
  int loop;
  int64_t best[2];
} tdist__cpu_copy_tune_t;

/* The way the next copy of t's class takes (1: the vector loop); *timed:
 * whether it is one of a look's, to be timed and told with _took. */
int tdist__cpu_copy_tune_way(tdist__cpu_copy_tune_t *t, int *timed);

/* A timed copy of n bytes the given way took ns: keeps the way's best and,
 * once both have one, picks the loop if it was TDIST_CPU_COPY_LOOP_GAIN
 * times as fast, else the string move. */
void tdist__cpu_copy_tune_took(tdist__cpu_copy_tune_t *t, int loop, size_t n, int64_t ns);

/* n bytes (256 and up), not overlapping: in vector loads and stores under
 * TDIST_CPU_COPY_TUNE_MIN bytes; from there the way this thread's looks
 * picked for the size (tdist__cpu_copy_tune_took), or the one
 * TDIST_CPU_COPY_LOOP forces. */
void tdist__cpu_copy_big(void *dst, const void *src, size_t n);

/* The two ways, each alone (n >= 256; the benchmark and tests): the
 * string move with the destination aligned to its line, and the vector
 * loop. */
void tdist__cpu_copy_string(void *dst, const void *src, size_t n);
void tdist__cpu_copy_loop(void *dst, const void *src, size_t n);

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
