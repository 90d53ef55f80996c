/*
 * shm.c - shared-memory SPSC byte rings between processes on one host: the
 * segment (a sealed memfd, created by the receiving process, mapped by its
 * peers through /proc/<pid>/fd/<fd>) and the ring's copy routines.
 *
 * Who owns what (shm.h has the whole story): the creating process owns the
 * segment and reads its rings; each peer writes one ring. Segment calls may
 * run on any thread of their process; ring calls run on one writer thread
 * and one reader thread at a time, serialised by their callers. The ring
 * code is lock-free and makes no system call: acquire/release on head and
 * tail order the memcpy of the data against the other side.
 *
 * Layer: util only (errors) and copy.c; no libuv, nothing of core/.
 */
#include "cpu/base/shm.h"
#include "cpu/base/copy.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/error.h"

/* The seals every segment carries: its size is fixed once created, so a peer
 * that mapped it can never fault on a truncated page (SIGBUS). */
#define SHM_SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)

/* The tdist code for a failed system call's errno. */
static int errno_code(int err) {
  if (err == ENOMEM) return TDIST_ERR_NO_MEMORY;
  if (err == ENOENT || err == ESRCH) return TDIST_ERR_NOT_FOUND;
  return TDIST_ERR_IO;
}

/* ---- segment -------------------------------------------------------------- */

size_t tdist__cpu_shm_ring_bytes(size_t want) {
  size_t cap = TDIST_CPU_SHM_MIN_RING;
  while (cap < want) {
    if (cap > SIZE_MAX / 2) return 0;
    cap <<= 1;
  }
  return cap;
}

int tdist__cpu_shm_mem_create(size_t bytes, tdist__cpu_shm_seg_t *out) {
  if (!out) return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "cpu shm: no segment to fill");
  *out = (tdist__cpu_shm_seg_t){.fd = -1};
  if (bytes == 0 || bytes > (size_t)INT64_MAX)
    return tdist__error(TDIST_ERR_TOO_LARGE, "cpu shm: a segment of %zu bytes", bytes);
  int fd = memfd_create("tdist-shm", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    int err = errno;
    return tdist__error(errno_code(err), "cpu shm: memfd_create: %s", strerror(err));
  }
  const char *what = "ftruncate";
  if (ftruncate(fd, (off_t)bytes) != 0) goto fail;
  what = "fcntl(F_ADD_SEALS)";
  if (fcntl(fd, F_ADD_SEALS, SHM_SEALS) != 0) goto fail;
  what = "mmap";
  void *base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) goto fail;
  out->fd = fd;
  out->base = base;
  out->bytes = bytes;
  return 0;

fail:;
  int err = errno;
  close(fd);
  return tdist__error(errno_code(err), "cpu shm: %s of a %zu-byte segment: %s", what, bytes,
                      strerror(err));
}

int tdist__cpu_shm_seg_create(size_t nrings, size_t ring_bytes, tdist__cpu_shm_seg_t *out) {
  if (!out) return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "cpu shm: no segment to fill");
  *out = (tdist__cpu_shm_seg_t){.fd = -1};
  if (nrings == 0) return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "cpu shm: segment of 0 rings");
  size_t cap = tdist__cpu_shm_ring_bytes(ring_bytes);
  size_t stride = sizeof(struct tdist__cpu_ring) + cap;
  if (cap == 0 || stride < cap || nrings > SIZE_MAX / stride || nrings * stride > (size_t)INT64_MAX)
    return tdist__error(TDIST_ERR_TOO_LARGE, "cpu shm: %zu rings of %zu bytes overflow", nrings,
                        ring_bytes);
  TDIST_CHECK(tdist__cpu_shm_mem_create(nrings * stride, out));
  for (size_t i = 0; i < nrings; i++)
    tdist__cpu_ring_init(tdist__cpu_shm_ring(out->base, cap, i), cap);
  out->nrings = nrings;
  out->ring_bytes = cap;
  return 0;
}

void tdist__cpu_shm_seg_close_fd(tdist__cpu_shm_seg_t *s) {
  if (!s || s->fd < 0) return;
  close(s->fd);
  s->fd = -1;
}

void tdist__cpu_shm_seg_destroy(tdist__cpu_shm_seg_t *s) {
  if (!s) return;
  if (s->base) munmap(s->base, s->bytes);
  s->base = NULL;
  tdist__cpu_shm_seg_close_fd(s);
}

int tdist__cpu_shm_seg_map(int32_t pid, int32_t fd, size_t bytes, void **base_out) {
  if (!base_out) return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "cpu shm: no base to fill");
  *base_out = NULL;
  if (pid <= 0 || fd < 0 || bytes == 0 || bytes > (size_t)INT64_MAX)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                        "cpu shm: cannot map fd %d of pid %d (%zu bytes)", (int)fd, (int)pid,
                        bytes);
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)pid, (int)fd);
  int mfd = open(path, O_RDWR | O_CLOEXEC);
  if (mfd < 0) {
    int err = errno;
    return tdist__error(errno_code(err), "cpu shm: open %s: %s", path, strerror(err));
  }
  /* The fd number may have been reused for another file: map only a sealed
   * segment at least as large as announced, never a file that could shrink
   * under the mapping. */
  struct stat st;
  if (fstat(mfd, &st) != 0) {
    int err = errno;
    close(mfd);
    return tdist__error(errno_code(err), "cpu shm: fstat %s: %s", path, strerror(err));
  }
  int seals = fcntl(mfd, F_GET_SEALS);
  if (!S_ISREG(st.st_mode) || st.st_size < (off_t)bytes || seals < 0 ||
      (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW)) {
    close(mfd);
    return tdist__error(TDIST_ERR_PROTOCOL,
                        "cpu shm: %s is not a sealed segment of %zu bytes (size %lld, seals %d)",
                        path, bytes, (long long)st.st_size, seals);
  }
  void *base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
  int err = errno;
  close(mfd);
  if (base == MAP_FAILED)
    return tdist__error(errno_code(err), "cpu shm: mmap %s (%zu bytes): %s", path, bytes,
                        strerror(err));
  *base_out = base;
  return 0;
}

void tdist__cpu_shm_seg_unmap(void *base, size_t bytes) {
  if (base) munmap(base, bytes);
}

/* ---- ring ------------------------------------------------------------------- */

void tdist__cpu_ring_init(struct tdist__cpu_ring *r, size_t cap) {
  assert(cap >= TDIST_CPU_SHM_MIN_RING && (cap & (cap - 1)) == 0);
  atomic_init(&r->head, 0);
  atomic_init(&r->tail, 0);
  atomic_init(&r->polling, 0);
  atomic_init(&r->closed, 0);
  atomic_init(&r->wwait, 0);
  atomic_init(&r->wpolling, 0);
  r->cap = cap;
}

/* Copy n bytes in at stream position pos: at most two memcpy (the wrap). */
static inline void copy_in(struct tdist__cpu_ring *r, uint64_t pos, const void *src, size_t n) {
  size_t cap = (size_t)r->cap, off = (size_t)(pos & (cap - 1));
  size_t first = cap - off < n ? cap - off : n;
  tdist__cpu_copy(r->data + off, src, first);
  if (n > first) tdist__cpu_copy(r->data, (const char *)src + first, n - first);
}

/* Copy n bytes out from stream position pos: at most two memcpy. */
static inline void copy_out(const struct tdist__cpu_ring *r, uint64_t pos, void *dst, size_t n) {
  size_t cap = (size_t)r->cap, off = (size_t)(pos & (cap - 1));
  size_t first = cap - off < n ? cap - off : n;
  tdist__cpu_copy(dst, r->data + off, first);
  if (n > first) tdist__cpu_copy((char *)dst + first, r->data, n - first);
}

size_t tdist__cpu_ring_writev(struct tdist__cpu_ring *r, const struct iovec *iov, int cnt) {
  uint64_t head = atomic_load_explicit(&r->head, memory_order_relaxed); /* ours */
  /* Acquire: the reader's copies out of the bytes we are about to overwrite
   * happened before it advanced tail. */
  uint64_t tail = atomic_load_explicit(&r->tail, memory_order_acquire);
  uint64_t used = head - tail;
  /* A reader that moved tail past head is broken; write nothing rather than
   * outside the ring. */
  if (used > r->cap) return 0;
  size_t room = (size_t)(r->cap - used), done = 0;
  for (int i = 0; i < cnt && room > 0; i++) {
    size_t n = iov[i].iov_len < room ? iov[i].iov_len : room;
    if (n > 0) copy_in(r, head + done, iov[i].iov_base, n);
    done += n;
    room -= n;
    if (n < iov[i].iov_len) break;
  }
  /* Release: the data is in place before the reader can see the new head. */
  if (done > 0) atomic_store_explicit(&r->head, head + done, memory_order_release);
  return done;
}

size_t tdist__cpu_ring_peek(const struct tdist__cpu_ring *r, void *dst, size_t len) {
  uint64_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed); /* ours */
  /* Acquire: the writer's copies in happened before it published head. */
  uint64_t head = atomic_load_explicit(&r->head, memory_order_acquire);
  uint64_t n64 = head - tail;
  if (n64 > r->cap) n64 = r->cap; /* a broken writer's head: never read outside the ring */
  size_t n = n64 < len ? (size_t)n64 : len;
  if (n > 0) copy_out(r, tail, dst, n);
  return n;
}

size_t tdist__cpu_ring_read(struct tdist__cpu_ring *r, void *dst, size_t len) {
  size_t n = tdist__cpu_ring_peek(r, dst, len);
  /* Release: our copies out are done before the writer may reuse the bytes. */
  if (n > 0) {
    uint64_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
    atomic_store_explicit(&r->tail, tail + n, memory_order_release);
  }
  return n;
}

/* Out of line on purpose (shm.h): GCC's TSan rejects an inlined fence. */
int tdist__cpu_ring_needs_doorbell(const struct tdist__cpu_ring *r) {
  /* Orders our head store (writev) before the polling load: the store-load
   * half of the Dekker pair, matched by the fence in poll_end. */
  atomic_thread_fence(memory_order_seq_cst);
  return atomic_load_explicit(&r->polling, memory_order_relaxed) == 0;
}

void tdist__cpu_ring_poll_end(struct tdist__cpu_ring *r) {
  atomic_fetch_sub_explicit(&r->polling, 1, memory_order_seq_cst);
  /* Orders the polling store before the caller's re-check of head. */
  atomic_thread_fence(memory_order_seq_cst);
}

int tdist__cpu_ring_wpoll_end(struct tdist__cpu_ring *r) {
  atomic_fetch_sub_explicit(&r->wpolling, 1, memory_order_seq_cst);
  /* Orders the wpolling store before the wwait load: the writer's half of
   * the pair with the reader's tail store, fence, wpolling load
   * (shm_conn.c, tdist__cpu_shm_read). */
  atomic_thread_fence(memory_order_seq_cst);
  return atomic_load_explicit(&r->wwait, memory_order_relaxed) != 0;
}

void tdist__cpu_ring_skip(struct tdist__cpu_ring *r, size_t len) {
  assert(len <= tdist__cpu_ring_avail(r));
  if (len == 0) return;
  uint64_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
  atomic_store_explicit(&r->tail, tail + len, memory_order_release);
}
