/*
 * shm.h - shared-memory single-producer/single-consumer byte rings between
 * processes on one host (CPU backend, internal).
 *
 * Segment. A process creates ONE segment (tdist__cpu_shm_seg_create) for
 * all the rings that other local processes write INTO it: the receiver owns
 * its inbound rings. The segment is an anonymous memory file (memfd), sized
 * once and sealed against shrinking and growing, mapped MAP_SHARED. The
 * creator initialises every ring before it publishes (pid, fd, bytes,
 * ring_bytes); a peer maps the same pages with tdist__cpu_shm_seg_map, which
 * opens /proc/<pid>/fd/<fd>: that works when both processes run as the same
 * user and the peer may inspect the creator (the ptrace "read" access check,
 * which is weaker than the one process_vm_readv needs). The creator keeps
 * its fd open until every peer has mapped the segment, then may close it
 * (tdist__cpu_shm_seg_close_fd); the mappings stay valid.
 *
 * Layout. Ring i starts at tdist__cpu_shm_ring_offset(ring_bytes, i): a
 * 256-byte header (four 64-byte cache lines) followed by ring_bytes of
 * data, a power of two of at least 4096 bytes. Every ring and every header
 * line is 64-byte aligned. There is no segment header: both sides compute the
 * offsets from ring_bytes, and a ring's `cap` says its capacity.
 *
 * Ring. One writer process (a peer), one reader process (the creator), and
 * within each process one thread at a time on each side; the callers
 * serialise. head and tail count bytes ever written and consumed (64-bit,
 * never wrap in practice); byte n lives at data[n & (cap - 1)].
 *   head     written by the writer only (release); read by the reader
 *            (acquire) to learn how much data is there.
 *   tail     written by the reader only (release); read by the writer
 *            (acquire) to learn how much room there is, and that the bytes
 *            it overwrites have been copied out.
 *   polling  written by the reader side only: > 0 while one of its threads
 *            spins on this ring, so the writer need not wake it.
 *   wwait    set by the writer when the ring was full, cleared by the
 *            reader, which then rings the writer's doorbell (shm_conn.c),
 *            unless wpolling says a writer thread polls for room itself.
 *   wpolling written by the writer side only: > 0 while one of its threads
 *            retries its writes on every pass (a waiting caller), so the
 *            reader need not ring for room (the same Dekker pair as
 *            polling, the other way: shm_conn.c).
 *   closed   written by the writer only: no more data will come.
 *   cap      written by the creator before publishing; read-only after.
 * head and tail sit on cache lines of their own so the two sides do not
 * bounce one line between them on every update.
 *
 * Doorbell (a Dekker pair, both sides sequentially consistent). A reader
 * that sleeps (in the backend: on its TCP socket) must be woken by the
 * writer, but one that polls need not be:
 *
 *   reader                                writer
 *   tdist__cpu_ring_poll_begin(r)         tdist__cpu_ring_writev(r, ...)
 *   ... spin on avail/read ...              (head: release store)
 *   tdist__cpu_ring_poll_end(r)           if (tdist__cpu_ring_needs_doorbell(r))
 *     (polling--; seq_cst fence)            wake the reader (one byte on TCP)
 *   if (tdist__cpu_ring_avail(r)) ...       (seq_cst fence; load polling)
 *   else sleep
 *
 * Each side stores, fences, then loads what the other side stored. Either the
 * reader's re-check after poll_end sees the new head, or the writer's check
 * sees polling == 0 and rings: a write is never left unnoticed by a sleeping
 * reader. Spurious doorbells are possible and harmless.
 *
 * No function of the ring takes a lock or makes a system call. The two that
 * fence (needs_doorbell, poll_end) are not inline: GCC's ThreadSanitizer
 * rejects a fence inlined into its caller (-Wtsan), and a call costs little
 * next to the fence itself.
 */
#ifndef TDIST_CPU_SHM_H
#define TDIST_CPU_SHM_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#if ATOMIC_LLONG_LOCK_FREE != 2 || ATOMIC_INT_LOCK_FREE != 2
#error "shared-memory rings need lock-free 32- and 64-bit atomics"
#endif

/* Smallest data capacity of a ring, in bytes. */
#define TDIST_CPU_SHM_MIN_RING 4096u
/* Alignment of every ring and header line. */
#define TDIST_CPU_SHM_ALIGN 64u

/* One ring, as laid out in the segment (the same in every process). */
struct tdist__cpu_ring {
  /* Line 0: the writer's. */
  _Atomic uint64_t head; /* bytes ever written; writer only (release) */
  char pad0_[TDIST_CPU_SHM_ALIGN - sizeof(uint64_t)];
  /* Line 1: the reader's. */
  _Atomic uint64_t tail; /* bytes ever consumed; reader only (release) */
  char pad1_[TDIST_CPU_SHM_ALIGN - sizeof(uint64_t)];
  /* Line 2: rarely written. */
  _Atomic uint32_t polling; /* > 0 while a reader thread polls; reader side only */
  _Atomic uint32_t closed;  /* 1 once the writer left; writer only */
  uint64_t cap;             /* data bytes, a power of two; creator, before publishing */
  char pad2_[TDIST_CPU_SHM_ALIGN - 2 * sizeof(uint32_t) - sizeof(uint64_t)];
  /* Line 3: the writer side's mark and wait. Not on line 2: both sides'
   * waiters mark and unmark on every op (drive.c), and with the reader's
   * count and the writer's on one line the two processes took it from
   * each other twice per op, even when no byte went through the ring
   * (0.3 us of an 8-byte all_reduce over the group's segment, sc.h). Each
   * line is now written by one side, and read by the other only around a
   * write or a read of the ring. */
  _Atomic uint32_t wpolling; /* > 0 while a writer thread polls (a waiting caller
                                retries its writes on every pass): the reader need
                                not ring for room; writer side only */
  _Atomic uint32_t wwait;    /* 1: the writer found the ring full and waits for the
                                reader's doorbell; set by the writer, cleared by the
                                reader when it rings, or by the writer once a write
                                went in (shm_conn.c) */
  char pad3_[TDIST_CPU_SHM_ALIGN - 2 * sizeof(uint32_t)];
  /* Then cap bytes of data. */
  unsigned char data[];
};

_Static_assert(offsetof(struct tdist__cpu_ring, tail) == 64, "ring: tail on line 1");
_Static_assert(offsetof(struct tdist__cpu_ring, polling) == 128, "ring: polling on line 2");
_Static_assert(offsetof(struct tdist__cpu_ring, wpolling) == 192, "ring: wpolling on line 3");
_Static_assert(offsetof(struct tdist__cpu_ring, data) == 256, "ring: data after 4 lines");
_Static_assert(sizeof(struct tdist__cpu_ring) == 256, "ring: header is 4 lines");

/* A segment this process created (its inbound rings). */
typedef struct tdist__cpu_shm_seg {
  int fd;            /* the memfd; -1 once closed */
  void *base;        /* the mapping; NULL when none */
  size_t bytes;      /* length of the file and of the mapping */
  size_t nrings;     /* rings in the segment */
  size_t ring_bytes; /* data capacity of each ring (power of two, >= 4096) */
} tdist__cpu_shm_seg_t;

/* ---- segment (any thread; the caller owns the segment object) --------- */

/*
 * tdist__cpu_shm_ring_bytes - the data capacity a ring of `want` bytes gets.
 * @param want  wanted capacity in bytes (any value; 0 gives the minimum).
 * @return      want rounded up to a power of two of at least 4096, or 0 when
 *              that does not fit in a size_t.
 */
size_t tdist__cpu_shm_ring_bytes(size_t want);

/*
 * tdist__cpu_shm_ring_offset - where ring i starts in a segment.
 * @param ring_bytes  the segment's data capacity per ring (already rounded,
 *                    as in tdist__cpu_shm_seg_t.ring_bytes).
 * @param i           ring index, 0-based.
 * @return            byte offset from the segment's base; a multiple of 64.
 */
static inline size_t tdist__cpu_shm_ring_offset(size_t ring_bytes, size_t i) {
  return i * (sizeof(struct tdist__cpu_ring) + ring_bytes);
}

/*
 * tdist__cpu_shm_ring - ring i of a segment mapped at base.
 * @param base        the mapping (seg.base, or what seg_map returned).
 * @param ring_bytes  the segment's data capacity per ring.
 * @param i           ring index; the caller checks it is below nrings.
 * @return            the ring (never NULL).
 */
static inline struct tdist__cpu_ring *tdist__cpu_shm_ring(void *base, size_t ring_bytes, size_t i) {
  return (struct tdist__cpu_ring *)((char *)base + tdist__cpu_shm_ring_offset(ring_bytes, i));
}

/*
 * tdist__cpu_shm_seg_create - create, size and map a segment of nrings rings
 * and initialise each ring (empty, open, not polled).
 * @param nrings      number of rings, at least 1.
 * @param ring_bytes  wanted data capacity per ring; rounded up as
 *                    tdist__cpu_shm_ring_bytes does.
 * @param out         filled on success; on failure fd = -1, base = NULL.
 * @return 0, or TDIST_ERR_INVALID_ARGUMENT (nrings 0, out NULL),
 *         TDIST_ERR_TOO_LARGE (the size overflows), TDIST_ERR_NO_MEMORY or
 *         TDIST_ERR_IO (memfd_create, ftruncate, fcntl or mmap failed), with
 *         a message recorded (tdist__error).
 * Thread: any.
 */
int tdist__cpu_shm_seg_create(size_t nrings, size_t ring_bytes, tdist__cpu_shm_seg_t *out);

/*
 * tdist__cpu_shm_mem_create - create, size, seal and map a zeroed segment
 * of `bytes` bytes with no rings in it (the shared-memory collectives' own
 * layout: sc.h); nrings and ring_bytes are 0.
 * @param bytes  size of the segment (> 0).
 * @param out    filled on success; on failure fd = -1, base = NULL.
 * @return 0, or TDIST_ERR_TOO_LARGE, TDIST_ERR_NO_MEMORY or TDIST_ERR_IO,
 *         with a message recorded (tdist__error).
 * Thread: any.
 */
int tdist__cpu_shm_mem_create(size_t bytes, tdist__cpu_shm_seg_t *out);

/*
 * tdist__cpu_shm_seg_close_fd - close the segment's fd, keeping the mapping.
 * Call it once every peer has mapped the segment. Idempotent.
 * @param s  the segment.
 * Thread: the segment's owner.
 */
void tdist__cpu_shm_seg_close_fd(tdist__cpu_shm_seg_t *s);

/*
 * tdist__cpu_shm_seg_destroy - unmap the segment and close its fd (if still
 * open); leaves *s with fd = -1 and base = NULL. Idempotent. Peers' mappings
 * stay valid until they unmap theirs.
 * @param s  the segment (NULL is ignored).
 * Thread: the segment's owner, once no thread of this process uses a ring.
 */
void tdist__cpu_shm_seg_destroy(tdist__cpu_shm_seg_t *s);

/*
 * tdist__cpu_shm_seg_map - map a peer's segment, given its pid, its fd number
 * and its size, through /proc/<pid>/fd/<fd>.
 * @param pid       the creator's process id (> 0).
 * @param fd        the creator's fd number of the segment (>= 0).
 * @param bytes     the segment's size (tdist__cpu_shm_seg_t.bytes, > 0).
 * @param base_out  the mapping, on success; NULL on failure.
 * @return 0, or TDIST_ERR_INVALID_ARGUMENT (bad pid, fd, bytes or NULL
 *         base_out), TDIST_ERR_NOT_FOUND (no such process or fd),
 *         TDIST_ERR_PROTOCOL (the file is not a sealed segment of at least
 *         `bytes`), TDIST_ERR_NO_MEMORY or TDIST_ERR_IO (open, fstat, mmap),
 *         with a message recorded (tdist__error). Never touches the pages.
 * Thread: any.
 */
int tdist__cpu_shm_seg_map(int32_t pid, int32_t fd, size_t bytes, void **base_out);

/*
 * tdist__cpu_shm_seg_unmap - unmap what tdist__cpu_shm_seg_map returned.
 * @param base   the mapping (NULL is ignored).
 * @param bytes  the size given to tdist__cpu_shm_seg_map.
 * Thread: any, once no thread of this process uses its rings.
 */
void tdist__cpu_shm_seg_unmap(void *base, size_t bytes);

/* ---- ring: creator ------------------------------------------------------ */

/*
 * tdist__cpu_ring_init - make r an empty, open, unpolled ring of cap bytes.
 * @param r    the ring, in a segment with room for cap data bytes after it.
 * @param cap  data capacity: a power of two of at least 4096.
 * Thread: the creator, before it publishes the segment (seg_create calls it).
 */
void tdist__cpu_ring_init(struct tdist__cpu_ring *r, size_t cap);

/* ---- ring: writer (one thread at a time, in the writing process) ------- */

/*
 * tdist__cpu_ring_writev - append as many bytes of iov[0..cnt) as fit, in
 * order, and publish them (head, release).
 * @param r    the ring.
 * @param iov  the pieces; a piece only partly copied ends the copy.
 * @param cnt  number of pieces (<= 0 writes nothing).
 * @return     bytes appended (0 when the ring is full or iov is empty, and
 *             when tail is past head: a broken reader).
 * Thread: the writer.
 */
size_t tdist__cpu_ring_writev(struct tdist__cpu_ring *r, const struct iovec *iov, int cnt);

/*
 * tdist__cpu_ring_space - free bytes: what a writev could append now (it may
 * grow as the reader consumes).
 * @param r  the ring.
 * @return   cap - (head - tail).
 * Thread: the writer (elsewhere the answer is only a snapshot).
 */
static inline size_t tdist__cpu_ring_space(const struct tdist__cpu_ring *r) {
  uint64_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
  uint64_t tail = atomic_load_explicit(&r->tail, memory_order_acquire);
  return (size_t)(r->cap - (head - tail));
}

/*
 * tdist__cpu_ring_close - tell the reader no more data will come (release:
 * a reader that sees closed then sees every byte written before it).
 * @param r  the ring.
 * Thread: the writer, after its last write.
 */
static inline void tdist__cpu_ring_close(struct tdist__cpu_ring *r) {
  atomic_store_explicit(&r->closed, 1, memory_order_release);
}

/*
 * tdist__cpu_ring_needs_doorbell - after a write, whether the writer must
 * wake the reader by other means (seq_cst fence, then polling == 0; see the
 * doorbell protocol above).
 * @param r  the ring.
 * @return   1 when no reader thread polls the ring, else 0.
 * Thread: the writer, after tdist__cpu_ring_writev.
 */
int tdist__cpu_ring_needs_doorbell(const struct tdist__cpu_ring *r);

/* ---- ring: reader (one thread at a time, in the creating process) ----- */

/*
 * tdist__cpu_ring_avail - bytes written and not yet consumed.
 * @param r  the ring.
 * @return   head (acquire) - tail; the bytes are readable once seen here.
 * Thread: the reader.
 */
static inline size_t tdist__cpu_ring_avail(const struct tdist__cpu_ring *r) {
  uint64_t head = atomic_load_explicit(&r->head, memory_order_acquire);
  return (size_t)(head - atomic_load_explicit(&r->tail, memory_order_relaxed));
}

/*
 * tdist__cpu_ring_read - copy up to len available bytes out and consume them
 * (tail, release: the writer may then overwrite them).
 * @param r    the ring.
 * @param dst  where to copy (len bytes of room).
 * @param len  most bytes to take.
 * @return     bytes copied and consumed (0 when empty).
 * Thread: the reader.
 */
size_t tdist__cpu_ring_read(struct tdist__cpu_ring *r, void *dst, size_t len);

/*
 * tdist__cpu_ring_peek - copy up to len available bytes out without
 * consuming them.
 * @param r    the ring.
 * @param dst  where to copy (len bytes of room).
 * @param len  most bytes to copy.
 * @return     bytes copied (0 when empty; never more than cap, whatever head
 *             says).
 * Thread: the reader.
 */
size_t tdist__cpu_ring_peek(const struct tdist__cpu_ring *r, void *dst, size_t len);

/*
 * tdist__cpu_ring_skip - consume len bytes without copying them (release).
 * @param r    the ring.
 * @param len  bytes to drop; at most tdist__cpu_ring_avail(r) (checked in
 *             debug builds).
 * Thread: the reader.
 */
void tdist__cpu_ring_skip(struct tdist__cpu_ring *r, size_t len);

/*
 * tdist__cpu_ring_is_closed - whether the writer closed the ring (acquire).
 * Once it returns 1, an avail of 0 means no byte will ever come.
 * @param r  the ring.
 * @return   1 when closed, else 0.
 * Thread: the reader.
 */
static inline int tdist__cpu_ring_is_closed(const struct tdist__cpu_ring *r) {
  return atomic_load_explicit(&r->closed, memory_order_acquire) != 0;
}

/*
 * tdist__cpu_ring_poll_begin - announce that a reader thread polls the ring:
 * writers skip the doorbell until the matching poll_end (seq_cst increment).
 * @param r  the ring.
 * Thread: the reader side; calls may nest, each paired with a poll_end.
 */
static inline void tdist__cpu_ring_poll_begin(struct tdist__cpu_ring *r) {
  atomic_fetch_add_explicit(&r->polling, 1, memory_order_seq_cst);
}

/*
 * tdist__cpu_ring_poll_end - stop polling (seq_cst decrement, then a seq_cst
 * fence). The caller must then re-check tdist__cpu_ring_avail before it
 * sleeps: a write that raced with poll_end may not ring the doorbell.
 * @param r  the ring.
 * Thread: the reader side, after its poll_begin.
 */
void tdist__cpu_ring_poll_end(struct tdist__cpu_ring *r);

/*
 * tdist__cpu_ring_wpoll_begin - announce that a writer thread polls for room
 * (it retries its queued writes on every pass): the reader skips the
 * doorbell for room (wwait) until the matching wpoll_end. seq_cst increment.
 * @param r  the ring (the peer's, mapped here).
 * Thread: the writer side; calls may nest, each paired with a wpoll_end.
 */
static inline void tdist__cpu_ring_wpoll_begin(struct tdist__cpu_ring *r) {
  atomic_fetch_add_explicit(&r->wpolling, 1, memory_order_seq_cst);
}

/*
 * tdist__cpu_ring_wpoll_end - stop polling for room (seq_cst decrement, then
 * a seq_cst fence). The writer must then re-check wwait: a reader that made
 * room while wpolling was still up rang no bell, and left wwait set.
 * @param r  the ring.
 * @return   1 when wwait is set (someone must retry the writes), else 0.
 * Thread: the writer side, after its wpoll_begin.
 */
int tdist__cpu_ring_wpoll_end(struct tdist__cpu_ring *r);

#endif
