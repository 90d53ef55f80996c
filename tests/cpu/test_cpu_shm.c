/*
 * test_cpu_shm.c - the shared-memory SPSC byte rings (src/cpu/base/shm.c).
 *
 *   layout        capacities round up to powers of two >= 4096; rings and
 *                 their header lines are 64-byte aligned; sizes add up.
 *   full_wrap     one process: writev stops at a full ring (short count,
 *                 then 0), space/avail add up to cap, and reads, peeks and
 *                 skips across the end of the data buffer return the bytes
 *                 written, in order.
 *   doorbell      needs_doorbell is 1 with nobody polling, 0 between
 *                 poll_begin and poll_end (nested too), 1 again after.
 *   room_bell     the writer's side of the doorbell (shm_conn.c): a reader
 *                 that makes room in a ring a writer found full (wwait)
 *                 rings its bell only while no writer thread polls
 *                 (wpolling); wpoll_end reports the wait left set; a write
 *                 that goes in clears it.
 *   map_errors    seg_map of a bad pid, a bad fd, a file that is not a
 *                 segment, or a size beyond the segment fails with a code
 *                 (no crash); mapping our own segment aliases its pages.
 *   two_procs     a forked child drops its inherited mapping, maps the
 *                 parent's segment through /proc/<ppid>/fd/<fd>, and writes
 *                 an 8 MiB pseudo-random stream into ring 0 (messages of
 *                 1..9000 bytes in 1-3 iovecs: the 4 KiB ring fills and
 *                 wraps many times) while reading another 8 MiB stream the
 *                 parent writes into ring 1. Each reader checks every byte
 *                 against the generator, with mixed read/peek/skip sizes.
 *   threads       the same over one ring between two threads of one process
 *                 (what ThreadSanitizer can see), the reader sleeping on an
 *                 eventfd by the doorbell protocol: a lost wake-up times out.
 *
 * alarm(50) in the parent and the child: a hang fails, it never stalls.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cpu/base/base.h"
#include "cpu/transport/transport.h"
#include "cpu/engine/engine.h"
#include "cpu/segment/sc.h"
#include "cpu/base/shm.h"
#include "tdist/errors.h"

#define STREAM_BYTES (8u << 20)
#define MAX_MSG 9000u
#define SEED_UP 0x5eed0001u   /* child -> parent, ring 0 */
#define SEED_DOWN 0x5eed0002u /* parent -> child, ring 1 */

/* ---- the streams ------------------------------------------------------- */

static uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/* Byte pos of the stream `seed`: random access, so both sides agree. */
static uint8_t stream_byte(uint64_t seed, uint64_t pos) {
  return (uint8_t)(mix(seed * 0x100000001b3ULL ^ (pos >> 3)) >> ((pos & 7) * 8));
}

static void stream_fill(uint64_t seed, uint64_t pos, uint8_t *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    p[i] = stream_byte(seed, pos + i);
}

/* First mismatch of p[0..n) against the stream at pos, or -1. */
static long stream_check(uint64_t seed, uint64_t pos, const uint8_t *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != stream_byte(seed, pos + i)) return (long)i;
  return -1;
}

/* A small PRNG for sizes and choices (xorshift64). */
static uint64_t rnd(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

/* One direction's writer: a message of 1..MAX_MSG stream bytes at a time,
 * handed to writev in 1-3 pieces until it is all in. */
struct writer {
  struct tdist__cpu_ring *r;
  uint64_t seed, rng, pos, total;
  uint8_t msg[MAX_MSG];
  size_t len, off; /* message length, bytes of it written */
  long shorts;     /* writes that did not take all they were offered */
};

/* Step: write what fits. Returns bytes written (0: ring full or done). */
static size_t writer_step(struct writer *w) {
  if (w->off == w->len) {
    if (w->pos == w->total) return 0;
    w->len = 1 + (size_t)(rnd(&w->rng) % MAX_MSG);
    if (w->len > w->total - w->pos) w->len = (size_t)(w->total - w->pos);
    stream_fill(w->seed, w->pos, w->msg, w->len);
    w->off = 0;
  }
  size_t left = w->len - w->off;
  struct iovec iov[3];
  int cnt = 1 + (int)(rnd(&w->rng) % 3);
  size_t at = w->off;
  for (int i = 0; i < cnt; i++) {
    size_t piece = i == cnt - 1 ? w->len - at : (size_t)(rnd(&w->rng) % (w->len - at + 1));
    iov[i].iov_base = w->msg + at;
    iov[i].iov_len = piece;
    at += piece;
  }
  size_t n = tdist__cpu_ring_writev(w->r, iov, cnt);
  if (n > left) return (size_t)-1; /* impossible: flagged by the caller */
  if (n < left) w->shorts++;
  w->off += n;
  w->pos += n;
  return n;
}

/* One direction's reader: mixed read, peek, peek+skip sizes. */
struct reader {
  struct tdist__cpu_ring *r;
  uint64_t seed, rng, pos, total;
  uint8_t buf[2 * MAX_MSG];
  long bad; /* stream offset of the first wrong byte, or -1 */
};

/* Step: consume what is there. Returns bytes consumed; sets bad on a wrong
 * byte. */
static size_t reader_step(struct reader *rd) {
  size_t want = 1 + (size_t)(rnd(&rd->rng) % sizeof(rd->buf));
  size_t n = 0;
  long at;
  switch (rnd(&rd->rng) % 3) {
  case 0: /* read */
    n = tdist__cpu_ring_read(rd->r, rd->buf, want);
    if ((at = stream_check(rd->seed, rd->pos, rd->buf, n)) >= 0 && rd->bad < 0)
      rd->bad = (long)rd->pos + at;
    break;
  case 1: { /* peek, check, skip part of it, check peek is stable */
    size_t got = tdist__cpu_ring_peek(rd->r, rd->buf, want);
    if ((at = stream_check(rd->seed, rd->pos, rd->buf, got)) >= 0 && rd->bad < 0)
      rd->bad = (long)rd->pos + at;
    n = got ? 1 + (size_t)(rnd(&rd->rng) % got) : 0;
    tdist__cpu_ring_skip(rd->r, n);
    break;
  }
  default: /* skip blind (what the backend does with a header it parsed) */
    n = tdist__cpu_ring_avail(rd->r);
    if (n > want) n = want;
    tdist__cpu_ring_skip(rd->r, n);
    break;
  }
  rd->pos += n;
  return n;
}

static void writer_setup(struct writer *w, struct tdist__cpu_ring *r, uint64_t seed) {
  memset(w, 0, sizeof(*w));
  w->r = r;
  w->seed = seed;
  w->rng = seed * 7 + 1;
  w->total = STREAM_BYTES;
}

static void reader_setup(struct reader *rd, struct tdist__cpu_ring *r, uint64_t seed) {
  memset(rd, 0, sizeof(*rd));
  rd->r = r;
  rd->seed = seed;
  rd->rng = seed * 13 + 5;
  rd->total = STREAM_BYTES;
  rd->bad = -1;
}

/* ---- single process ---------------------------------------------------- */

static void test_layout(void **state) {
  assert_int_equal(tdist__cpu_shm_ring_bytes(0), 4096);
  assert_int_equal(tdist__cpu_shm_ring_bytes(1), 4096);
  assert_int_equal(tdist__cpu_shm_ring_bytes(4096), 4096);
  assert_int_equal(tdist__cpu_shm_ring_bytes(4097), 8192);
  assert_int_equal(tdist__cpu_shm_ring_bytes(65536), 65536);
  assert_int_equal(tdist__cpu_shm_ring_bytes(SIZE_MAX), 0);
  tdist__cpu_shm_seg_t s;
  assert_int_equal(tdist__cpu_shm_seg_create(0, 4096, &s), TDIST_ERR_INVALID_ARGUMENT);
  assert_int_equal(tdist__cpu_shm_seg_create(SIZE_MAX / 4096, SIZE_MAX / 4, &s),
                   TDIST_ERR_TOO_LARGE);
  assert_int_equal(tdist__cpu_shm_seg_create(3, 5000, &s), 0);
  assert_true(s.fd >= 0);
  assert_int_equal(s.nrings, 3);
  assert_int_equal(s.ring_bytes, 8192);
  assert_int_equal(s.bytes, 3 * (256 + 8192)); /* four header lines, then the data */
  for (size_t i = 0; i < 3; i++) {
    struct tdist__cpu_ring *r = tdist__cpu_shm_ring(s.base, s.ring_bytes, i);
    assert_int_equal(tdist__cpu_shm_ring_offset(s.ring_bytes, i) % 64, 0);
    assert_int_equal((uintptr_t)r % 64, 0);
    assert_int_equal(r->cap, 8192);
    assert_int_equal(tdist__cpu_ring_avail(r), 0);
    assert_int_equal(tdist__cpu_ring_space(r), 8192);
    assert_false(tdist__cpu_ring_is_closed(r));
    /* The last data byte of each ring is inside the mapping. */
    assert_true((char *)r->data + r->cap <= (char *)s.base + s.bytes);
  }
  tdist__cpu_shm_seg_close_fd(&s);
  assert_int_equal(s.fd, -1);
  tdist__cpu_shm_seg_close_fd(&s);
  tdist__cpu_shm_seg_destroy(&s);
  assert_null(s.base);
  tdist__cpu_shm_seg_destroy(&s);
}

static void test_full_wrap(void **state) {
  tdist__cpu_shm_seg_t s;
  assert_int_equal(tdist__cpu_shm_seg_create(1, 4096, &s), 0);
  struct tdist__cpu_ring *r = tdist__cpu_shm_ring(s.base, s.ring_bytes, 0);
  static uint8_t src[3 * 4096], dst[3 * 4096];
  stream_fill(42, 0, src, sizeof(src));
  uint64_t wpos = 0, rpos = 0;

  /* Fill: 3000 taken, then only 1096 of the next 3000, then nothing. */
  struct iovec iov[2] = {{src, 1000}, {src + 1000, 2000}};
  assert_int_equal(tdist__cpu_ring_writev(r, iov, 2), 3000);
  wpos = 3000;
  struct iovec more = {src + wpos, 3000};
  assert_int_equal(tdist__cpu_ring_writev(r, &more, 1), 1096);
  wpos += 1096;
  assert_int_equal(tdist__cpu_ring_space(r), 0);
  assert_int_equal(tdist__cpu_ring_avail(r), 4096);
  struct iovec one = {src + wpos, 1};
  assert_int_equal(tdist__cpu_ring_writev(r, &one, 1), 0);
  assert_int_equal(tdist__cpu_ring_writev(r, NULL, 0), 0);

  /* Peek does not consume; read does. */
  assert_int_equal(tdist__cpu_ring_peek(r, dst, 100), 100);
  assert_memory_equal(dst, src, 100);
  assert_int_equal(tdist__cpu_ring_avail(r), 4096);
  assert_int_equal(tdist__cpu_ring_read(r, dst, 2500), 2500);
  assert_memory_equal(dst, src, 2500);
  rpos = 2500;
  assert_int_equal(tdist__cpu_ring_space(r), 2500);

  /* This write wraps: 2000 bytes, 0 at the end of the buffer and 2000 at
   * its start (head = 4096); then 500 more, and a piece that fills it. */
  struct iovec w3[3] = {{src + wpos, 2000}, {src + wpos + 2000, 0}, {src + wpos + 2000, 900}};
  assert_int_equal(tdist__cpu_ring_writev(r, w3, 3), 2500);
  wpos += 2500;
  assert_int_equal(tdist__cpu_ring_space(r), 0);

  /* A read across the wrap returns the bytes in order. */
  assert_int_equal(tdist__cpu_ring_read(r, dst, 2000), 2000);
  assert_memory_equal(dst, src + rpos, 2000);
  rpos += 2000;
  /* Skip across nothing special, then peek across the rest. */
  tdist__cpu_ring_skip(r, 96);
  rpos += 96;
  size_t left = tdist__cpu_ring_avail(r);
  assert_int_equal(left, wpos - rpos);
  assert_int_equal(tdist__cpu_ring_peek(r, dst, sizeof(dst)), left);
  assert_memory_equal(dst, src + rpos, left);

  /* Many more laps with odd sizes: the bytes stay in order. */
  for (int lap = 0; lap < 2000; lap++) {
    size_t n = 1 + (size_t)(lap * 37 % 4096), room = tdist__cpu_ring_space(r);
    uint8_t tmp[4096];
    stream_fill(42, wpos, tmp, n);
    struct iovec t = {tmp, n};
    size_t put = tdist__cpu_ring_writev(r, &t, 1);
    assert_int_equal(put, n < room ? n : room);
    wpos += put;
    size_t rd = tdist__cpu_ring_read(r, dst, 1 + (size_t)(lap * 53 % 4096));
    assert_int_equal(stream_check(42, rpos, dst, rd), -1);
    rpos += rd;
    assert_int_equal(tdist__cpu_ring_avail(r), wpos - rpos);
    assert_int_equal(tdist__cpu_ring_space(r), 4096 - (wpos - rpos));
  }
  assert_true(wpos > 100 * 4096); /* wrapped many times */
  tdist__cpu_shm_seg_destroy(&s);
}

static void test_doorbell(void **state) {
  tdist__cpu_shm_seg_t s;
  assert_int_equal(tdist__cpu_shm_seg_create(2, 4096, &s), 0);
  struct tdist__cpu_ring *r = tdist__cpu_shm_ring(s.base, s.ring_bytes, 1);
  assert_int_equal(tdist__cpu_ring_needs_doorbell(r), 1);
  tdist__cpu_ring_poll_begin(r);
  assert_int_equal(tdist__cpu_ring_needs_doorbell(r), 0);
  tdist__cpu_ring_poll_begin(r); /* a second polling thread */
  tdist__cpu_ring_poll_end(r);
  assert_int_equal(tdist__cpu_ring_needs_doorbell(r), 0);
  tdist__cpu_ring_poll_end(r);
  assert_int_equal(tdist__cpu_ring_needs_doorbell(r), 1);
  /* The other ring of the segment is independent. */
  tdist__cpu_ring_poll_begin(tdist__cpu_shm_ring(s.base, s.ring_bytes, 0));
  assert_int_equal(tdist__cpu_ring_needs_doorbell(r), 1);
  tdist__cpu_ring_close(r);
  assert_true(tdist__cpu_ring_is_closed(r));
  tdist__cpu_shm_seg_destroy(&s);
}

/* One byte on fd within a short wait: a bell (1), or none (0). */
static int bell_rang(int fd) {
  struct pollfd p = {.fd = fd, .events = POLLIN};
  char b[16];
  if (poll(&p, 1, 50) != 1) return 0;
  return recv(fd, b, sizeof(b), MSG_DONTWAIT) > 0;
}

static void test_room_bell(void **state) {
  tdist__cpu_shm_seg_t s;
  assert_int_equal(tdist__cpu_shm_seg_create(1, 4096, &s), 0);
  struct tdist__cpu_ring *r = tdist__cpu_shm_ring(s.base, s.ring_bytes, 0);
  int sv[2];
  assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  cpu_conn_t c = {.fd = sv[0], .rx_ring = r}; /* the reader's side of the pair */
  static uint8_t buf[4096];
  struct iovec iov = {buf, sizeof(buf)};
  assert_int_equal(tdist__cpu_shm_put(r, &iov, 1), 4096);
  assert_int_equal(tdist__cpu_shm_put(r, &iov, 1), 0); /* full: waits for room */
  assert_int_equal(atomic_load(&r->wwait), 1);
  /* A polling writer: room made without a bell, the wait left set. */
  tdist__cpu_ring_wpoll_begin(r);
  tdist__cpu_ring_wpoll_begin(r); /* nested */
  assert_int_equal(tdist__cpu_shm_read(&c, buf, 100), 100);
  assert_int_equal(bell_rang(sv[1]), 0);
  assert_int_equal(tdist__cpu_ring_wpoll_end(r), 1); /* still one polling */
  assert_int_equal(tdist__cpu_shm_read(&c, buf, 100), 100);
  assert_int_equal(bell_rang(sv[1]), 0);
  assert_int_equal(tdist__cpu_ring_wpoll_end(r), 1); /* the last: someone must retry */
  /* Nobody polls: the next room made rings, and clears the wait. */
  assert_int_equal(tdist__cpu_shm_read(&c, buf, 100), 100);
  assert_int_equal(bell_rang(sv[1]), 1);
  assert_int_equal(atomic_load(&r->wwait), 0);
  /* A write that goes in clears a wait a polling writer left. */
  assert_int_equal(tdist__cpu_shm_put(r, &iov, 1), 300);
  assert_int_equal(tdist__cpu_shm_put(r, &iov, 1), 0);
  tdist__cpu_ring_wpoll_begin(r);
  assert_int_equal(tdist__cpu_shm_read(&c, buf, 64), 64);
  assert_int_equal(tdist__cpu_shm_put(r, &iov, 1), 64);
  assert_int_equal(atomic_load(&r->wwait), 0);
  assert_int_equal(tdist__cpu_ring_wpoll_end(r), 0);
  assert_int_equal(tdist__cpu_shm_read(&c, buf, 64), 64);
  assert_int_equal(bell_rang(sv[1]), 0); /* no wait, no bell */
  close(sv[0]);
  close(sv[1]);
  tdist__cpu_shm_seg_destroy(&s);
}

static void test_map_errors(void **state) {
  tdist__cpu_shm_seg_t s;
  assert_int_equal(tdist__cpu_shm_seg_create(2, 4096, &s), 0);
  void *b = (void *)1;
  assert_int_equal(tdist__cpu_shm_seg_map(-1, s.fd, s.bytes, &b), TDIST_ERR_INVALID_ARGUMENT);
  assert_null(b);
  assert_int_equal(tdist__cpu_shm_seg_map(getpid(), -1, s.bytes, &b), TDIST_ERR_INVALID_ARGUMENT);
  assert_int_equal(tdist__cpu_shm_seg_map(getpid(), s.fd, 0, &b), TDIST_ERR_INVALID_ARGUMENT);
  assert_int_equal(tdist__cpu_shm_seg_map(getpid(), s.fd, s.bytes, NULL),
                   TDIST_ERR_INVALID_ARGUMENT);
  /* No such fd. */
  assert_int_equal(tdist__cpu_shm_seg_map(getpid(), 1000000, s.bytes, &b), TDIST_ERR_NOT_FOUND);
  assert_null(b);
  /* No such process: a child that has exited and been reaped. */
  pid_t gone = fork();
  assert_true(gone >= 0);
  if (gone == 0) _exit(0);
  assert_int_equal(waitpid(gone, NULL, 0), gone);
  assert_true(tdist__cpu_shm_seg_map(gone, s.fd, s.bytes, &b) < 0);
  assert_null(b);
  /* Files that are not segments: a device, an unsealed memfd. */
  int dn = open("/dev/null", O_RDWR | O_CLOEXEC);
  assert_true(dn >= 0);
  assert_int_equal(tdist__cpu_shm_seg_map(getpid(), dn, 4096, &b), TDIST_ERR_PROTOCOL);
  close(dn);
  int mf = memfd_create("not-a-segment", MFD_CLOEXEC);
  assert_true(mf >= 0);
  assert_int_equal(ftruncate(mf, 1 << 16), 0);
  assert_int_equal(tdist__cpu_shm_seg_map(getpid(), mf, 4096, &b), TDIST_ERR_PROTOCOL);
  close(mf);
  /* More bytes than the segment has. */
  assert_int_equal(tdist__cpu_shm_seg_map(getpid(), s.fd, s.bytes + 4096, &b), TDIST_ERR_PROTOCOL);
  assert_null(b);

  /* Our own segment, mapped a second time: the same pages. */
  assert_int_equal(tdist__cpu_shm_seg_map(getpid(), s.fd, s.bytes, &b), 0);
  assert_non_null(b);
  assert_ptr_not_equal(b, s.base);
  struct tdist__cpu_ring *mine = tdist__cpu_shm_ring(s.base, s.ring_bytes, 1);
  struct tdist__cpu_ring *theirs = tdist__cpu_shm_ring(b, s.ring_bytes, 1);
  assert_int_equal(theirs->cap, 4096);
  struct iovec iov = {"hello", 5};
  assert_int_equal(tdist__cpu_ring_writev(theirs, &iov, 1), 5);
  char got[8] = {0};
  assert_int_equal(tdist__cpu_ring_read(mine, got, sizeof(got)), 5);
  assert_string_equal(got, "hello");
  assert_int_equal(tdist__cpu_ring_space(theirs), 4096);
  tdist__cpu_shm_seg_unmap(b, s.bytes);
  tdist__cpu_shm_seg_destroy(&s);
}

/* ---- two processes ------------------------------------------------------- */

/* Whether the peer process `peer` (0: none to watch) has exited; reaps it
 * into *st. Checked while idle, so a dead peer fails the test at once. */
static int peer_gone(pid_t peer, int *st, int *reaped) {
  if (peer <= 0 || *reaped) return *reaped;
  if (waitpid(peer, st, WNOHANG) == peer) *reaped = 1;
  return *reaped;
}

/* Both directions at once, on one thread: never blocks, so never deadlocks.
 * Returns 0, or a nonzero code naming what went wrong. */
static int run_pair(struct writer *w, struct reader *rd, const char *who, pid_t peer, int *st,
                    int *reaped) {
  int closed = 0;
  unsigned idle = 0;
  while (w->pos < w->total || rd->pos < rd->total) {
    size_t put = writer_step(w);
    if (put == (size_t)-1) return 3;
    size_t got = reader_step(rd);
    if (rd->bad >= 0) {
      fprintf(stderr, "%s: wrong byte at stream offset %ld\n", who, rd->bad);
      return 4;
    }
    if (rd->pos > rd->total) return 5;
    if (w->pos == w->total && !closed) {
      tdist__cpu_ring_close(w->r);
      closed = 1;
    }
    if (put == 0 && got == 0) {
      sched_yield();
      if (++idle % 1024 == 0 && peer_gone(peer, st, reaped)) return 8;
    } else {
      idle = 0;
    }
  }
  if (!closed) tdist__cpu_ring_close(w->r);
  /* The peer closes its ring after its last byte: wait for it, then nothing
   * more may come. */
  while (!tdist__cpu_ring_is_closed(rd->r)) {
    sched_yield();
    if (++idle % 1024 == 0 && peer_gone(peer, st, reaped)) return 8;
  }
  if (tdist__cpu_ring_avail(rd->r) != 0) return 6;
  if (w->shorts == 0) {
    fprintf(stderr, "%s: the ring never filled\n", who);
    return 7;
  }
  return 0;
}

static void child_main(const tdist__cpu_shm_seg_t *s) {
  alarm(50);
  /* Forget what fork handed down: map the parent's segment as a peer would. */
  munmap(s->base, s->bytes);
  close(s->fd);
  void *base = NULL;
  if (tdist__cpu_shm_seg_map(getppid(), s->fd, s->bytes, &base) != 0) _exit(10);
  static struct writer w;
  static struct reader rd;
  writer_setup(&w, tdist__cpu_shm_ring(base, s->ring_bytes, 0), SEED_UP);
  reader_setup(&rd, tdist__cpu_shm_ring(base, s->ring_bytes, 1), SEED_DOWN);
  if (w.r->cap != 4096 || rd.r->cap != 4096) _exit(11);
  int st = 0, reaped = 0;
  int rc = run_pair(&w, &rd, "child", 0, &st, &reaped);
  tdist__cpu_shm_seg_unmap(base, s->bytes);
  _exit(rc ? 20 + rc : 0);
}

static void test_two_procs(void **state) {
  alarm(50);
  tdist__cpu_shm_seg_t s;
  assert_int_equal(tdist__cpu_shm_seg_create(2, 4096, &s), 0);
  assert_int_equal(s.ring_bytes, 4096);
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) child_main(&s);
  static struct writer w;
  static struct reader rd;
  reader_setup(&rd, tdist__cpu_shm_ring(s.base, s.ring_bytes, 0), SEED_UP);
  writer_setup(&w, tdist__cpu_shm_ring(s.base, s.ring_bytes, 1), SEED_DOWN);
  int st = 0, reaped = 0;
  int rc = run_pair(&w, &rd, "parent", pid, &st, &reaped);
  if (!reaped) assert_int_equal(waitpid(pid, &st, 0), pid);
  if (rc != 0) fprintf(stderr, "parent: run_pair failed (%d), child status 0x%x\n", rc, st);
  alarm(0);
  assert_int_equal(rc, 0);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 0);
  assert_int_equal(rd.pos, STREAM_BYTES);
  assert_int_equal(w.pos, STREAM_BYTES);
  tdist__cpu_shm_seg_destroy(&s);
}

/* ---- two threads, the doorbell ------------------------------------------- */

struct thr {
  struct writer w;
  int efd;
  long bells;
  int err;
};

static void *writer_thread(void *arg) {
  struct thr *t = arg;
  uint64_t one = 1;
  while (t->w.pos < t->w.total) {
    size_t n = writer_step(&t->w);
    if (n == (size_t)-1) {
      t->err = 1;
      break;
    }
    if (n > 0 && tdist__cpu_ring_needs_doorbell(t->w.r)) {
      t->bells++;
      if (write(t->efd, &one, sizeof(one)) != sizeof(one)) t->err = 2;
    }
    if (n == 0) sched_yield();
  }
  tdist__cpu_ring_close(t->w.r);
  if (tdist__cpu_ring_needs_doorbell(t->w.r) && write(t->efd, &one, sizeof(one)) != sizeof(one))
    t->err = 2;
  return NULL;
}

static void test_threads(void **state) {
  alarm(50);
  tdist__cpu_shm_seg_t s;
  assert_int_equal(tdist__cpu_shm_seg_create(1, 4096, &s), 0);
  struct tdist__cpu_ring *r = tdist__cpu_shm_ring(s.base, s.ring_bytes, 0);
  static struct thr t;
  static struct reader rd;
  writer_setup(&t.w, r, 99);
  t.w.total = 4u << 20;
  reader_setup(&rd, r, 99);
  rd.total = t.w.total;
  t.efd = eventfd(0, EFD_CLOEXEC);
  assert_true(t.efd >= 0);
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, writer_thread, &t), 0);
  long sleeps = 0, lost = 0;
  for (;;) {
    tdist__cpu_ring_poll_begin(r);
    for (int idle = 0; idle < 64 && rd.bad < 0;)
      idle = reader_step(&rd) ? 0 : idle + 1;
    tdist__cpu_ring_poll_end(r);
    if (rd.bad >= 0) break;
    if (tdist__cpu_ring_avail(r)) continue; /* the re-check of the protocol */
    if (tdist__cpu_ring_is_closed(r) && tdist__cpu_ring_avail(r) == 0) break;
    struct pollfd pfd = {.fd = t.efd, .events = POLLIN};
    sleeps++;
    if (poll(&pfd, 1, 10000) != 1) {
      lost++; /* the writer wrote and never rang: a lost wake-up */
      break;
    }
    uint64_t v;
    assert_int_equal(read(t.efd, &v, sizeof(v)), sizeof(v));
  }
  assert_int_equal(pthread_join(th, NULL), 0);
  alarm(0);
  fprintf(stderr, "threads: %ld sleeps, %ld doorbells, %ld short writes\n", sleeps, t.bells,
          t.w.shorts);
  assert_int_equal(lost, 0);
  assert_int_equal(t.err, 0);
  assert_int_equal(rd.bad, -1);
  assert_int_equal(rd.pos, t.w.total);
  close(t.efd);
  tdist__cpu_shm_seg_destroy(&s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_layout),     cmocka_unit_test(test_full_wrap),
      cmocka_unit_test(test_doorbell),   cmocka_unit_test(test_room_bell),
      cmocka_unit_test(test_map_errors), cmocka_unit_test(test_two_procs),
      cmocka_unit_test(test_threads),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
