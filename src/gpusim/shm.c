/*
 * shm.c - the shared segment of a communicator (nccl_sim.h has the layout),
 * futex waits on it, and the liveness of its ranks.
 *
 * Real NCCL ranks meet through the bootstrap network (bootstrap.cc) and then
 * move data through transports (P2P/NVLink, SHM, NET). The simulation has
 * one transport: a POSIX shared-memory file per communicator, named from its
 * id. Any thread may call these; none holds a lock across a wait.
 */
#include <errno.h>
#include <stdlib.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "gpusim/nccl_sim.h"

#define GS_SEG_BUSY 0x62757379u
#define GS_SEG_READY 0x72656479u
#define GS_PAGE 4096u

static size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

/* Sizes by communicator size: large staging for the few-rank cases the
 * tests and one-host jobs use, smaller ones so 64 ranks stay in memory
 * (the file is sparse: only touched pages cost). */
static void layout(gs_seg_hdr_t *h, int nranks) {
  h->nranks = (uint32_t)nranks;
  h->chunk = nranks <= 8 ? (1u << 20) : (256u << 10);
  h->ring = nranks <= 8 ? (256u << 10) : (32u << 10);
  h->off_slots = GS_PAGE;
  h->off_chunks = round_up(h->off_slots + sizeof(gs_slot_t) * (size_t)nranks, GS_PAGE);
  h->off_rings = h->off_chunks + (size_t)nranks * 2 * h->chunk;
  h->ring_stride = round_up(sizeof(gs_ring_t) + h->ring, 128);
  h->size = round_up(h->off_rings + (size_t)nranks * (size_t)nranks * h->ring_stride, GS_PAGE);
}

ncclResult_t gs_seg_attach(gs_seg_t *seg, const unsigned char key[16], int nranks) {
  gs_seg_hdr_t want;
  memset(&want, 0, sizeof(want));
  layout(&want, nranks);
  memset(seg, 0, sizeof(*seg));
  seg->fd = -1;
  int n = snprintf(seg->name, sizeof(seg->name), "/tdist-gpusim-%u-", (unsigned)getuid());
  for (int i = 0; i < 16; i++)
    n += snprintf(seg->name + n, sizeof(seg->name) - (size_t)n, "%02x", key[i]);
  /* O_CLOEXEC: a spawned program must not inherit the liveness lock. */
  seg->fd = shm_open(seg->name, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (seg->fd < 0) goto fail_errno;
  struct stat st;
  if (fstat(seg->fd, &st) != 0) goto fail_errno;
  /* Every rank grows the file to the size its rank count needs (growing is
   * idempotent; a rank with another count is caught on the header below). */
  if ((size_t)st.st_size < want.size && ftruncate(seg->fd, (off_t)want.size) != 0) goto fail_errno;
  seg->size = want.size;
  seg->base = mmap(NULL, seg->size, PROT_READ | PROT_WRITE, MAP_SHARED, seg->fd, 0);
  if (seg->base == MAP_FAILED) {
    seg->base = NULL;
    goto fail_errno;
  }
  seg->hdr = (gs_seg_hdr_t *)(void *)seg->base;
  uint32_t zero = 0;
  if (atomic_compare_exchange_strong(&seg->hdr->magic, &zero, GS_SEG_BUSY)) {
    /* First here: lay it out. The rest wait for READY (a few stores). */
    seg->hdr->nranks = want.nranks;
    seg->hdr->chunk = want.chunk;
    seg->hdr->ring = want.ring;
    seg->hdr->off_slots = want.off_slots;
    seg->hdr->off_chunks = want.off_chunks;
    seg->hdr->off_rings = want.off_rings;
    seg->hdr->ring_stride = want.ring_stride;
    seg->hdr->size = want.size;
    atomic_store(&seg->hdr->magic, GS_SEG_READY);
  } else {
    while (atomic_load(&seg->hdr->magic) != GS_SEG_READY)
      sched_yield();
  }
  if (seg->hdr->nranks != want.nranks) {
    gs_fail(ncclInvalidUsage, "communicator %s: this rank was told nranks %d, another %u",
            seg->name, nranks, seg->hdr->nranks);
    gs_seg_detach(seg);
    return ncclInvalidUsage;
  }
  return ncclSuccess;

fail_errno:;
  int e = errno;
  gs_fail(ncclSystemError, "shared segment %s (%zu bytes): %s", seg->name, want.size, strerror(e));
  gs_seg_detach(seg);
  return ncclSystemError;
}

void gs_seg_detach(gs_seg_t *seg) {
  if (seg->base) munmap(seg->base, seg->size);
  if (seg->fd >= 0) close(seg->fd);
  seg->base = NULL;
  seg->hdr = NULL;
  seg->fd = -1;
}

void gs_seg_unlink(gs_seg_t *seg) {
  if (seg->name[0]) shm_unlink(seg->name); /* ENOENT: another rank did it */
}

gs_slot_t *gs_slot(const gs_seg_t *seg, int rank) {
  return (gs_slot_t *)(void *)(seg->base + seg->hdr->off_slots) + rank;
}

unsigned char *gs_chunk(const gs_seg_t *seg, int rank, int parity) {
  return seg->base + seg->hdr->off_chunks + ((size_t)rank * 2 + (size_t)parity) * seg->hdr->chunk;
}

gs_ring_t *gs_ring(const gs_seg_t *seg, int src, int dst) {
  size_t i = (size_t)src * seg->hdr->nranks + (size_t)dst;
  return (gs_ring_t *)(void *)(seg->base + seg->hdr->off_rings + i * seg->hdr->ring_stride);
}

static int lock_byte(int fd, int rank, int cmd, short type) {
  struct flock fl;
  memset(&fl, 0, sizeof(fl));
  fl.l_type = type;
  fl.l_whence = SEEK_SET;
  fl.l_start = rank;
  fl.l_len = 1;
  int rc = fcntl(fd, cmd, &fl);
  if (cmd == F_OFD_GETLK) return rc == 0 ? fl.l_type != F_UNLCK : -1;
  return rc;
}

ncclResult_t gs_slot_claim(gs_seg_t *seg, int rank, int dev, int cc) {
  /* The lock is the claim: a second process asking for the same rank finds
   * it held (NCCL's bootstrap would see two ranks with one number). */
  if (lock_byte(seg->fd, rank, F_OFD_SETLK, F_WRLCK) != 0)
    return gs_fail(ncclInvalidUsage, "rank %d of %s is already taken by another process", rank,
                   seg->name);
  gs_slot_t *s = gs_slot(seg, rank);
  s->pid = (int32_t)getpid();
  s->dev = dev;
  s->cc = cc;
  s->host_hash = gs_host_hash();
  atomic_store(&s->state, GS_SLOT_JOINED);
  gs_seg_wake(seg);
  return ncclSuccess;
}

int gs_peer_gone(const gs_seg_t *seg, int rank) {
  gs_slot_t *s = gs_slot(seg, rank);
  int st = atomic_load(&s->state);
  if (st == GS_SLOT_LEFT) return 1;
  if (st != GS_SLOT_JOINED) return 0; /* not arrived yet: nothing to say */
  /* Joined and its lock dropped: the process is gone. */
  return lock_byte(seg->fd, rank, F_OFD_GETLK, F_WRLCK) == 0;
}

void gs_seg_wake(gs_seg_t *seg) {
  atomic_fetch_add_explicit(&seg->hdr->futex, 1, memory_order_acq_rel);
  /* A shared futex (no FUTEX_PRIVATE_FLAG): waiters are in other processes. */
  syscall(SYS_futex, &seg->hdr->futex, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

void gs_seg_sleep(gs_seg_t *seg, uint32_t seen) {
  struct timespec ts = {0, GS_POLL_MS * 1000000L};
  syscall(SYS_futex, &seg->hdr->futex, FUTEX_WAIT, seen, &ts, NULL, 0);
}

/* misc/utils.cc getHostHashOnce: the host name (up to its end), then the
 * boot id appended -- or NCCL_HOSTID alone when it is set -- hashed. The
 * simulation hashes with FNV-1a (the value is never shown; only equality
 * between ranks matters, as for NCCL's hostHash comparisons in init.cc). */
static uint64_t host_hash_value;
static pthread_once_t host_hash_once = PTHREAD_ONCE_INIT;

static void host_hash_init(void) {
  char buf[1024] = {0};
  const char *id = getenv("NCCL_HOSTID");
  if (id) {
    snprintf(buf, sizeof(buf), "%s", id);
  } else {
    if (gethostname(buf, sizeof(buf) - 1) != 0) buf[0] = '\0';
    size_t off = strlen(buf);
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
      if (!fgets(buf + off, (int)(sizeof(buf) - off), f)) buf[off] = '\0';
      fclose(f);
      buf[strcspn(buf, "\n")] = '\0';
    }
  }
  uint64_t h = 0xcbf29ce484222325ull;
  for (const unsigned char *q = (const unsigned char *)buf; *q; q++)
    h = (h ^ *q) * 0x100000001b3ull;
  host_hash_value = h;
}

uint64_t gs_host_hash(void) {
  pthread_once(&host_hash_once, host_hash_init);
  return host_hash_value;
}

int gs_peer_remote(const gs_seg_t *seg, int rank) {
  return gs_slot(seg, rank)->host_hash != gs_host_hash();
}
