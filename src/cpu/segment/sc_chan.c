/*
 * sc_chan.c - the shared-memory collectives' channel (sc.h): a group's
 * segment, made and mapped when the group is created; the process's bell;
 * and the progress thread's want_bell flags.
 *
 * Setup (caller thread, inside the group's creation: backend.c attach).
 * Every member of a group of 2..SC_MAX_RANKS ranks with a store takes part,
 * so the decision below is the same everywhere:
 *   1. member 0 makes the segment (a sealed memfd, zeroed); every member
 *      publishes its host identity (cma.c), pid, bell address and whether
 *      it wants sc (TDIST_CPU_SC, shared memory on, a bell), member 0 also
 *      its segment's fd, size and layout (store: "cpu/sc/1");
 *   2. if every member wants it and all share one host, each maps member
 *      0's segment through /proc/<pid>/fd/<fd> (shm.c: the seals are
 *      checked) and publishes whether that worked ("cpu/sc/2");
 *   3. the channel is on iff every member mapped it; member 0 then closes
 *      its fd (the mappings keep the memory; nothing is left on a
 *      filesystem when the processes end).
 * A member that dies later leaves its region mapped in the others: they
 * never fault on it.
 *
 * Bells: an abstract unix datagram socket per process (one syscall to
 * ring, no connection, no file), named from the pid and a random word and
 * published with the group's setup; the progress thread watches it and
 * runs the channels when it rings. Abstract names live in the network
 * namespace, which the host identity includes.
 *
 * Threads: setup and free on the caller thread; the bell's watch and the
 * want_bell flags on the progress thread; ringing under the engine lock.
 */
#include <errno.h>
#include <sched.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

#include "util/alloc.h"
#include "util/clock.h"
#include "util/error.h"
#include "cpu/base/base.h"
#include "cpu/transport/transport.h"
#include "cpu/engine/engine.h"
#include "cpu/segment/sc.h"

TDIST_PARAM(CpuSc, "TDIST_CPU_SC", 1)
TDIST_PARAM(CpuScSlots, "TDIST_CPU_SC_SLOTS", 16)
TDIST_PARAM(CpuScSlotBytes, "TDIST_CPU_SC_SLOT_BYTES", 128 << 10)
/* all_to_all_v blocks read in place (sc.h, lend): -1 when the group's
 * members are more than twice this process's CPUs, 0 never, 1 whenever
 * possible. */
TDIST_PARAM(CpuScCma, "TDIST_CPU_SC_CMA", -1)
/* Step lines per member (sc.h): how far a root of small broadcasts runs
 * ahead of its readers (64 bytes each). */
TDIST_PARAM(CpuScLines, "TDIST_CPU_SC_LINES", 4096)

/* ---- the bell ------------------------------------------------------------------ */

int tdist__cpu_sc_bell_open(cpu_ctx_t *ctx) {
  ctx->bell_fd = ctx->bell_tx = -1;
  if (!tdist__param_CpuSc() || !tdist__param_CpuShm()) return -1;
  uint64_t word = 0;
  if (getrandom(&word, sizeof(word), GRND_NONBLOCK) != sizeof(word))
    word = (uint64_t)tdist__now_ns() ^ ((uint64_t)getpid() << 32);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  /* Abstract: sun_path[0] is NUL, the name is the bytes after it. */
  int nl = snprintf(a.sun_path + 1, sizeof(a.sun_path) - 1, "tdist-sc/%d/%016llx", (int)getpid(),
                    (unsigned long long)word);
  socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)nl);
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int tx = socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  /* An abstract name has no permissions: anyone in this network namespace
   * may send to it. A bell costs at most a pass; an overflow memfd is taken
   * only from its giver's pid, which the kernel vouches for (sc_ovf.c). */
  int one = 1;
  if (fd < 0 || tx < 0 || bind(fd, (struct sockaddr *)&a, len) != 0 ||
      setsockopt(fd, SOL_SOCKET, SO_PASSCRED, &one, sizeof(one)) != 0) {
    TDIST_INFO(CPU, "sc: no bell (%s): collectives over messages only", strerror(errno));
    if (fd >= 0) close(fd);
    if (tx >= 0) close(tx);
    return -1;
  }
  ctx->bell_fd = fd;
  ctx->bell_tx = tx;
  memcpy(ctx->bell_name, a.sun_path, sizeof(ctx->bell_name));
  ctx->bell_len = (unsigned)len;
  return 0;
}

/* Progress thread: the bell rang. Drain it, then run the channels. */
static void on_bell(uv_poll_t *h, int status, int events) {
  (void)status;
  (void)events;
  cpu_ctx_t *ctx = h->data;
  tdist__cpu_enter(ctx);
  tdist__cpu_sc_bell_drain(ctx); /* bells, and overflow memfds (sc_ovf.c) */
  tdist__cpu_sc_progress(ctx);
  tdist__cpu_run_ready(ctx);
  tdist__cpu_leave(ctx);
}

void tdist__cpu_sc_bell_start(cpu_ctx_t *ctx) {
  if (ctx->bell_fd < 0) return;
  if (uv_poll_init(tdist_backend_loop(ctx->progress), &ctx->bell_poll, ctx->bell_fd) != 0) return;
  ctx->bell_poll.data = ctx;
  ctx->bell_on = 1;
  uv_poll_start(&ctx->bell_poll, UV_READABLE, on_bell);
}

static void bell_fds_close(cpu_ctx_t *ctx) {
  if (ctx->bell_fd >= 0) close(ctx->bell_fd);
  if (ctx->bell_tx >= 0) close(ctx->bell_tx);
  ctx->bell_fd = ctx->bell_tx = -1;
}

static void on_bell_closed(uv_handle_t *h) {
  cpu_ctx_t *ctx = h->data;
  bell_fds_close(ctx);
  ctx->open_handles--;
  ctx->hooks->maybe_free(ctx); /* conn/conn.c, registered by the entry */
}

void tdist__cpu_sc_bell_close(cpu_ctx_t *ctx) {
  if (!ctx->bell_on) {
    bell_fds_close(ctx); /* never watched (a ctx that never started) */
    return;
  }
  ctx->bell_on = 0;
  ctx->open_handles++;
  uv_close((uv_handle_t *)&ctx->bell_poll, on_bell_closed);
}

_Atomic uint64_t tdist__cpu_sc_rings, tdist__cpu_sc_arms;

void tdist__cpu_sc_ring(cpu_sc_t *ch, cpu_ctx_t *ctx, int m) {
  if (ctx->bell_tx < 0 || m == ch->me || !ch->bell_len[m]) return;
  char b = 0;
  (void)sendto(ctx->bell_tx, &b, 1, MSG_DONTWAIT | MSG_NOSIGNAL, (struct sockaddr *)&ch->bell[m],
               ch->bell_len[m]);
}

/* The writers' half of the Dekker pair with tdist__cpu_sc_sleep: what this
 * pass wrote (release stores) before the fence, want_bell after it. The
 * one that finds a flag set takes it (exchange) and rings: one bell per
 * sleep, which the sleeper sets again before it sleeps again. Left set,
 * every pass of every writer rang every sleeper: a 64 MiB Zipf
 * all_to_all_v at n = 4 on 2 cores rang about 360 bells an op, each a
 * system call and a progress thread woken beside a copying caller. */
void tdist__cpu_sc_bells(cpu_sc_t *ch, cpu_ctx_t *ctx) {
  if (!ch->wrote) return;
  ch->wrote = 0;
  atomic_thread_fence(memory_order_seq_cst);
  for (int m = 0; m < ch->n; m++) {
    _Atomic uint32_t *w = &ch->rg[m].ctl->want_bell;
    if (m != ch->me && atomic_load_explicit(w, memory_order_relaxed) &&
        atomic_exchange_explicit(w, 0, memory_order_relaxed)) {
      tdist__cpu_sc_ring(ch, ctx, m);
      atomic_fetch_add_explicit(&tdist__cpu_sc_rings, 1, memory_order_relaxed);
    }
  }
}

int tdist__cpu_sc_sleep(cpu_ctx_t *ctx) {
  int again = 0;
  tdist__list_t *n;
  tdist__list_foreach(n, &ctx->groups) {
    cpu_group_t *cg = tdist__list_entry(n, cpu_group_t, link);
    cpu_sc_t *ch = cg->sc;
    if (!ch) continue;
    int want = !ch->broken && (!tdist__list_empty(&ch->ops) || ch->nunverified > 0);
    /* Still set: no writer rang since; taken: a bell is on its way, and
     * the flag is set again below, with one more pass. */
    _Atomic uint32_t *w = &ch->rg[ch->me].ctl->want_bell;
    if ((uint32_t)want == atomic_load_explicit(w, memory_order_relaxed)) continue;
    if (!want) {
      atomic_store_explicit(w, 0, memory_order_seq_cst);
      continue;
    }
    /* Counted before a writer can take it. */
    atomic_fetch_add_explicit(&tdist__cpu_sc_arms, 1, memory_order_relaxed);
    atomic_store_explicit(w, 1, memory_order_seq_cst);
    /* The readers' half: what a writer did before it could see the flag
     * is looked at once more before the thread sleeps. */
    atomic_thread_fence(memory_order_seq_cst);
    again = 1;
  }
  return again;
}

/* ---- the segment ---------------------------------------------------------------- */

static int is_pow2(uint64_t v) { return v && !(v & (v - 1)); }
static uint32_t pow2_floor(uint64_t v) { return (uint32_t)(1ull << (63 - __builtin_clzll(v))); }

/* What a member publishes in round 1. */
typedef struct sc_hello {
  char host[HOST_ID_LEN];
  int32_t pid, want;
  int32_t seg_fd; /* member 0: its memfd */
  uint32_t slots; /* member 0: D */
  uint32_t lines; /* member 0: L */
  uint32_t pad0;
  uint64_t slot_bytes, seg_bytes;
  char bell[108];
  uint32_t bell_len, pad;
  cpu_cma_hello_t cma; /* single copy: pid, probe word (cma.c) */
} sc_hello_t;

/* What a member publishes in round 2. */
typedef struct sc_mapped {
  int32_t ok;  /* it mapped the segment */
  int32_t cma; /* it can read every other member's memory */
} sc_mapped_t;

static size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

/* Bytes of one member's region for L step lines and D slots of F bytes:
 * the control lines, the signature and step rings, then the page-aligned
 * slots. */
static size_t region_bytes(unsigned D, unsigned L, size_t F) {
  size_t head = sizeof(sc_ctl_t) + SC_H * sizeof(sc_sig_t) + (size_t)L * sizeof(sc_step_t);
  return round_up(head, 4096) + (size_t)D * F;
}

/* Map [p, p + bytes) into this process, whole pages: its page tables
 * filled (writable or readable only), then each page read once from user
 * space, for a guest whose host shadows its page tables (carve). */
static void touch(unsigned char *p, size_t bytes, int writable) {
  uintptr_t a = (uintptr_t)p & ~(uintptr_t)4095, e = round_up((uintptr_t)p + bytes, 4096);
  /* before Linux 5.14: no populate, the reads below fault */
  (void)madvise((void *)a, e - a, writable ? MADV_POPULATE_WRITE : MADV_POPULATE_READ);
  for (uintptr_t o = a; o < e; o += 4096)
    (void)*(volatile unsigned char *)o;
}

/* Also maps every member's control, signature and step lines into this
 * process now (768 KiB a member by default): each op takes the next
 * signature entry and step line, so left to first use they cost every
 * process a page fault every 64 ops for their first 8192 (a 1 KiB
 * broadcast loop at n = 4 paid 15-20 % of its time). MADV_POPULATE_WRITE
 * fills this process's page tables, but a guest whose page tables its
 * host shadows (a PVM guest: this project's 2-core VM on 2026-11-29) pays
 * a hidden fault to the host at the first access from user space to each
 * page all the same: there every 64th 8-byte all_reduce of a fresh group
 * took 6-14 us, three ops in a row (the step pages of both members and
 * the signature page), and 2000 of them averaged 1.4 us for a median of
 * 0.68 (0.84-0.87 with this read; Open MPI 0.79-0.89). So
 * every page is also read once here, from user space (a read is enough:
 * measured alike with a write to this member's own pages). The slots are
 * mapped on first use (tdist__cpu_sc_warm): a group of small ops never
 * touches most of their pages. */
static void carve(cpu_sc_t *ch) {
  size_t head = round_up(
      sizeof(sc_ctl_t) + SC_H * sizeof(sc_sig_t) + (size_t)ch->L * sizeof(sc_step_t), 4096);
  for (int r = 0; r < ch->n; r++) {
    unsigned char *b = (unsigned char *)ch->base + (size_t)r * ch->region_bytes;
    sc_region_t *g = &ch->rg[r];
    g->ctl = (sc_ctl_t *)b;
    g->sig = (sc_sig_t *)(b + sizeof(sc_ctl_t));
    g->step = (sc_step_t *)(b + sizeof(sc_ctl_t) + SC_H * sizeof(sc_sig_t));
    g->data = b + head;
    touch(b, head, 1);
  }
}

/* (engine lock) What sc_slot_data asks: member m's slots' first `len`
 * bytes (writable in this member's own region, read only in the others'),
 * at least four times what was warm, so that a group touches them
 * in at most a few goes however its ops grow (log4(F / 4096)), all of them
 * in its first op of a size: the pages that op would have faulted one step
 * at a time, and those of the ops of that size after it. Only the regions
 * this process reads or writes: a member's pages are the memfd's, and one
 * no member writes is never allocated. */
void tdist__cpu_sc_warm(cpu_sc_t *ch, int m, size_t len) {
  size_t have = ch->warm[m], want = round_up(len, 4096);
  unsigned char *d = ch->rg[m].data;
  if (want < have * 4) want = have * 4;
  if (want >= ch->F || ch->F < 4096) { /* the whole data area at once */
    touch(d, (size_t)ch->D * ch->F, m == ch->me);
    ch->warm[m] = SIZE_MAX;
    return;
  }
  for (unsigned k = 0; k < ch->D; k++)
    touch(d + (size_t)k * ch->F + have, want - have, m == ch->me);
  ch->warm[m] = want;
}

static void chan_free(cpu_sc_t *ch) {
  if (!ch) return;
  if (ch->ovf) tdist__cpu_sc_ovf_done(ch);
  tdist__free(ch->ovf);
  if (ch->base) tdist__cpu_shm_seg_unmap(ch->base, ch->bytes);
  tdist__free(ch->rg);
  tdist__free(ch->bell);
  tdist__free(ch->bell_len);
  tdist__free(ch->pid);
  tdist__free(ch->totals);
  tdist__free(ch->lo);
  tdist__free(ch->hi);
  tdist__free(ch->warm);
  tdist__free(ch->desc);
  tdist__free(ch);
}

/* One round of the exchange: every member's `mine` into vals/lens. 1: the
 * store is gone (killed, closed): the group is made without the channel,
 * as a split of this backend needs no store otherwise (core/ops/mesh.c
 * compares member lists the same way); a member that still got through
 * would then run ops the others run over messages, which is caught as a
 * mismatch (sc_op.c). 0, or an error (a timeout names who is missing). */
static int exchange(const tdist_backend_params_t *p, const char *tag, const void *mine, size_t len,
                    void **vals, size_t *lens) {
  int rc = tdist_backend_allgather(p->store, tag, p->rank, p->size, mine, len, NULL, 0, vals, lens,
                                   p->timeout_ms > 0 ? p->timeout_ms : 1);
  if (rc != TDIST_ERR_CLOSED && rc != TDIST_ERR_IO) return rc;
  TDIST_WARN(CPU, "sc: %s: the store is gone (%s): collectives over messages", tag,
             tdist_last_error());
  tdist__error_clear();
  return 1;
}

static void vals_free(void **vals, int n) {
  for (int i = 0; vals && i < n; i++)
    tdist_store_free(vals[i]);
}

int tdist__cpu_sc_setup(cpu_group_t *cg, const tdist_backend_params_t *p) {
  int n = p->size, me = p->rank, rc = 0;
  cg->sc = NULL;
  /* Only what every member sees alike decides whether to take part. */
  if (n < 2 || n > SC_MAX_RANKS || !p->store) return 0;
  cpu_ctx_t *ctx = cg->ctx;
  tdist__cpu_shm_seg_t seg = {.fd = -1};
  void **vals = tdist__calloc((size_t)n, sizeof(void *));
  size_t *lens = tdist__calloc((size_t)n, sizeof(size_t));
  cpu_sc_t *ch = tdist__calloc(1, sizeof(*ch));
  if (!vals || !lens || !ch) {
    rc = tdist__error(TDIST_ERR_NO_MEMORY, "cpu sc: out of memory");
    goto done;
  }
  /* Its pages mapped now: the unchecked-op ring (ch->unverified, 24 bytes
   * an op) is written in order, and left to first use it cost a broadcast
   * root a page fault every 171 ops of its first 4096 (14-20 us each on
   * the 2-core PVM guest: a 2000-op 8-byte loop's mean 0.46 us for a
   * median of 0.24). */
  for (size_t o = 0; o < sizeof(*ch); o += 4096) /* inside it: a neighbour's page is not ours */
    ((volatile unsigned char *)ch)[o] = 0;
  sc_hello_t h = {.pid = (int32_t)getpid(), .seg_fd = -1};
  tdist__cpu_host_identity(h.host);
  tdist__cpu_cma_hello(&h.cma);
  h.want = tdist__param_CpuSc() && tdist__param_CpuShm() && ctx->bell_fd >= 0 && h.host[0];
  memcpy(h.bell, ctx->bell_name, sizeof(h.bell));
  h.bell_len = ctx->bell_len;
  if (me == 0 && h.want) {
    int64_t d = tdist__param_CpuScSlots(), f = tdist__param_CpuScSlotBytes();
    int64_t l = tdist__param_CpuScLines();
    /* Powers of two, rounded down (sc.h, sc_steps_of: masks, not divisions). */
    h.slots = pow2_floor((uint64_t)(d < 2 ? 2 : d > 64 ? 64 : d));
    h.lines = pow2_floor((uint64_t)(l < h.slots ? h.slots : l > 65536 ? 65536 : l));
    h.slot_bytes = tdist__cpu_shm_ring_bytes(f < 4096 ? 4096 : (size_t)f); /* a power of two */
    h.seg_bytes = region_bytes(h.slots, h.lines, h.slot_bytes) * (size_t)n;
    if (tdist__cpu_shm_mem_create(h.seg_bytes, &seg) != 0) {
      TDIST_INFO(CPU, "sc: group '%s': no segment (%s): collectives over messages", cg->name,
                 tdist_last_error());
      tdist__error_clear();
      h.want = 0;
    } else {
      h.seg_fd = seg.fd;
    }
  }
  if ((rc = exchange(p, "cpu/sc/1", &h, sizeof(h), vals, lens)) != 0) {
    if (rc > 0) rc = 0;
    goto done;
  }
  const sc_hello_t *h0 = vals[0];
  int all = 1;
  for (int r = 0; r < n && all; r++) {
    const sc_hello_t *o = vals[r];
    all = lens[r] == sizeof(*o) && o->want && memcmp(o->host, h.host, HOST_ID_LEN) == 0 &&
          o->bell_len > 0 && o->bell_len <= sizeof(struct sockaddr_un);
  }
  if (!all || h0->seg_fd < 0 || h0->slots < 2 || h0->lines < h0->slots || h0->slot_bytes < 4096 ||
      !is_pow2(h0->slots) || !is_pow2(h0->lines) || !is_pow2(h0->slot_bytes))
    goto done;
  /* From here every member maps, or says it could not. */
  ch->n = n;
  ch->me = me;
  ch->D = h0->slots;
  ch->L = h0->lines;
  ch->F = h0->slot_bytes;
  ch->region_bytes = region_bytes(ch->D, ch->L, ch->F);
  ch->bytes = h0->seg_bytes;
  int32_t ok = ch->bytes == ch->region_bytes * (size_t)n;
  if (ok && me == 0) {
    ch->base = seg.base;
    seg.base = NULL;
  } else if (ok && tdist__cpu_shm_seg_map(h0->pid, h0->seg_fd, ch->bytes, &ch->base) != 0) {
    TDIST_INFO(CPU, "sc: group '%s': cannot map member 0's segment (%s)", cg->name,
               tdist_last_error());
    tdist__error_clear();
    ok = 0;
  }
  ch->rg = tdist__calloc((size_t)n, sizeof(*ch->rg));
  ch->bell = tdist__calloc((size_t)n, sizeof(*ch->bell));
  ch->bell_len = tdist__calloc((size_t)n, sizeof(*ch->bell_len));
  ch->totals = tdist__calloc((size_t)n, sizeof(uint64_t));
  ch->lo = tdist__calloc((size_t)n, sizeof(uint64_t));
  ch->hi = tdist__calloc((size_t)n, sizeof(uint64_t));
  ch->warm = tdist__calloc((size_t)n, sizeof(size_t));
  ch->ovf = tdist__calloc((size_t)n, sizeof(*ch->ovf));
  ch->pid = tdist__calloc((size_t)n, sizeof(*ch->pid));
  ch->desc = tdist__calloc((size_t)n, sizeof(*ch->desc));
  ch->uid = cg->uid;
  if (!ch->rg || !ch->bell || !ch->bell_len || !ch->totals || !ch->lo || !ch->hi || !ch->warm ||
      !ch->ovf || !ch->pid || !ch->desc)
    ok = 0;
  /* Single copy for large all_to_all_v blocks: this member can read every
   * other's memory (the mapping above needed less: /proc/<pid>/fd). */
  int32_t cma = ok;
  for (int r = 0; ok && r < n; r++) {
    const sc_hello_t *o = vals[r];
    ch->bell[r].sun_family = AF_UNIX;
    memcpy(ch->bell[r].sun_path, o->bell, sizeof(ch->bell[r].sun_path));
    ch->bell_len[r] = o->bell_len;
    ch->pid[r] = o->pid;
    if (r != me && cma && !tdist__cpu_cma_probe(&o->cma)) cma = 0;
  }
  vals_free(vals, n);
  memset(vals, 0, sizeof(void *) * (size_t)n);
  sc_mapped_t mine = {.ok = ok, .cma = cma};
  if ((rc = exchange(p, "cpu/sc/2", &mine, sizeof(mine), vals, lens)) != 0) {
    if (rc > 0) rc = 0;
    goto done;
  }
  ch->cma = 1;
  cpu_set_t set;
  int cpus = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 0;
  ch->cpus = cpus;
  int64_t lend = tdist__param_CpuScCma();
  if (lend < 0) lend = cpus > 0 && n > 2 * cpus;
  ch->lend = lend > 0;
  for (int r = 0; r < n; r++) {
    const sc_mapped_t *o = vals[r];
    if (lens[r] != sizeof(*o) || !o->ok) ok = 0;
    if (lens[r] != sizeof(*o) || !o->cma) ch->cma = 0;
  }
  if (!ok) goto done;
  carve(ch);
  tdist__list_init(&ch->ops);
  cg->sc = ch;
  ch = NULL;
  TDIST_INFO(CPU,
             "sc: group '%s': rank %d/%d: collectives in shared memory (%u slots of %zu "
             "bytes, %u step lines per member; single copy %s)",
             cg->name, me, n, cg->sc->D, cg->sc->F, cg->sc->L,
             !cg->sc->cma   ? "off"
             : cg->sc->lend ? "on"
                            : "read only");
done:
  vals_free(vals, n);
  tdist__free(vals);
  tdist__free(lens);
  chan_free(ch);
  tdist__cpu_shm_seg_destroy(&seg); /* member 0's fd (and mapping if unused): mapped by all now */
  return rc;
}

void tdist__cpu_sc_free(cpu_group_t *cg) {
  chan_free(cg->sc);
  cg->sc = NULL;
}
