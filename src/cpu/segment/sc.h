/*
 * sc.h - shared-memory collectives ("sc"): the collectives of a group whose
 * members all share one host, run through one shared segment instead of
 * messages (CPU backend, internal; docs/cpu-backend.md "Collectives in
 * shared memory").
 *
 * Why: over the rings (shm_conn.c) a collective is still a series of
 * messages, each with a 48-byte header, matching, a receive posted per
 * peer and, for a reduction, log2(n) rounds that each wait for a peer; a
 * small op crossed 6-8 cache-line transfers per rank and cost 1.9 us at
 * n = 2 where the line latency is 0.35. Here every member writes its part
 * of the op once, into its own region of a segment all members map, and
 * reads what it needs from the others' regions directly: a reduction reads
 * every member's data where it lies and computes the result itself (Open
 * MPI's coll/sm and UCC's tl/shm work the same way).
 *
 * Segment (one memfd per group, made by member 0 at the group's creation,
 * mapped by every member: sc_chan.c). Member r's region:
 *   ctl        done: the steps r has consumed (below); red: the steps of a
 *              large all_reduce whose part r has reduced (sc_op.c);
 *              vseq: r reads no signature of a collective below it any
 *              more; want_bell: r's progress thread sleeps with sc ops of
 *              this group in flight, so a member that writes something r
 *              waits for rings r's bell (a datagram to r's process);
 *   sig[H]     one entry per collective (index cseq % H), written when r
 *              posts it, or later if entry cseq - H is still read by a
 *              member (its vseq): the op's signature (op, dtype, count,
 *              root, reduction), r's stream length and the op's first step;
 *   step[L]    one line per step (index step % L): r's data of that step
 *              is in; its length, and the bytes themselves when they fit
 *              in the line (SC_INLINE);
 *   data[D][F] the slots (index step % D), for steps that do not fit.
 * Streams and steps. In each op every member has a stream: the bytes it
 * gives (an all_reduce's input, a broadcast root's buffer, an all_to_all's
 * n blocks, an all_to_all_v's counts then blocks...); it may be empty. The
 * group has one step clock: an op takes steps s0 .. s0 + nsteps - 1, where
 * nsteps = ceil(longest stream / F), and in its step j every member whose
 * stream is longer than j*F writes its bytes [jF, jF + F) into line
 * (s0 + j) % L, or slot (s0 + j) % D when they do not fit the line. A
 * member consumes step s (reads what it needs of the others' lines and
 * slots of s, in rank order for a reduction) and then publishes
 * done = s + 1. A member writes step s only once every member's done is at
 * least s - L + 1 (inline) or s - D + 1 (a slot): the line's or slot's
 * previous contents were read by everyone. L is much larger than D (1024
 * against 16 by default): a broadcast root of small messages runs up to
 * L ops (and SC_LAG, below) ahead of its readers, as an eager send does,
 * where 16 slots held it to the pace of its slowest reader.
 * Steps and ops are taken in order on every member, so the clock agrees
 * everywhere while the members agree on every op.
 *
 * Agreement (docs/cpu-backend.md "Mismatch", the same promise as the
 * engine's): a member that receives anything in an op checks every
 * member's signature of that op before it consumes anything, except a
 * broadcast receiver, which checks the root's (its data is the root's);
 * a member that only gives (a broadcast or scatter root, a reduce or
 * gather non-root) completes as soon as its stream is written and checks
 * the others' signatures later: before it completes an op in which it
 * receives, before any of its point-to-point ops completes, and before it
 * has more than SC_LAG ops unchecked. A disagreement fails the group
 * with MISMATCH naming both sides (tdist__cpu_mismatch).
 *
 * Which ops: every collective of an sc group but gather_v and scatter_v
 * (their streams' lengths are known to the root alone) and, where
 * TDIST_CPU_SC_MAX_BYTES is set, a fixed-size one of that many bytes a
 * member and up (tdist__cpu_sc_takes, which the now lane asks too). The
 * choice depends only on the op, so every member that agrees on it
 * chooses alike; one
 * that does not is caught either way (an engine message or probe for an sc
 * op is checked against it: dispatch.c, probe.c).
 *
 * A giver never waits for its receivers for long (the engine's deferred
 * reads promise the same: test_cpu_deferred.c): a giver whose stream does
 * not fit the free slots and that found no room for TDIST_CPU_DEFER_US
 * puts the rest of its stream in a sealed memfd, sends it to the members
 * that read it over their bells (SCM_RIGHTS: it outlives the giver), marks
 * its signature, and completes (sc_ovf.c).
 *
 * Waking. A member whose caller waits drives its op itself (drive.c) and
 * needs no bell. A member whose ops are left to its progress thread (an
 * async op while the caller computes, a wait that outlasted its spin) has
 * want_bell set while that thread sleeps (tdist__cpu_sc_sleep, a Dekker
 * pair with the writers' check after every pass that wrote). The writer
 * that rings takes the flag, and the sleeper sets it again before it
 * sleeps again: one bell per sleep, however many write meanwhile.
 *
 * Failures: a member that dies is named by the monitor or its connection's
 * end (dispatch.c: an sc op needs every member that has not written all it
 * owes); the core's abort drops the group's sc ops and the channel takes
 * no more (tdist__cpu_sc_abort). A stopped member stops consuming: the
 * others wait, and the op's timeout names it. Nothing of a user buffer is
 * read by another process but what is lent (a large all_to_all_v block, a
 * large all_gather block, a large all_reduce's input and result: sc_data.c),
 * read in place with the giver's live word checked after each piece, as the
 * engine's single copy does (cma.c): the abort changes the word before any
 * buffer goes back to the caller, so an aborted op's buffer is never taken
 * as data.
 *
 * Threads: setup and teardown on the caller thread (group creation and
 * destroy); everything else under the engine lock (base/lock.c), on the
 * progress thread or a caller that drives.
 */
#ifndef TDIST_CPU_SC_H
#define TDIST_CPU_SC_H

#include <stdatomic.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sched.h> /* cpu_set_t (sc_spread.c) */

#include "cpu/base/base.h"

/* Signature entries per member. An entry is rewritten (op cseq + SC_H)
 * only once every member's vseq says it no longer reads it (sign_ready in
 * sc_op.c), so any number of ops may be posted at once. */
#define SC_H 8192u
/* Ops a giver may complete before every member's signature of them is
 * checked (sc.h, Agreement): the depth a small broadcast root runs ahead
 * of its slowest reader, as an eager send does (each such op also takes
 * one of the L step lines). Below SC_H, so the lag never waits on a
 * signature entry. */
#define SC_LAG 4096
_Static_assert(SC_LAG + 256 + 2 < SC_H, "a head op is always signable (sc_op.c, publish_vseq)");
#define SC_INLINE 40u /* step data that fits in the step line */
/* The largest stream of an op the now lane takes (sc_op.c): one step, in
 * its line or in one slot (4 KiB: a slot is larger unless set smaller). */
#define SC_NOW_BYTES 4096u
/* all_to_all_v: bytes of a block read in place (single copy) per step:
 * SC_CMA_STEP over the n - 1 givers a reader reads, within [256 KiB,
 * 4 MiB] (sc_data.c, cma_piece). Few steps: at n = 4 (four ranks on two
 * cores) each step is a turn every member must take, and 4 MiB pieces
 * against 1 MiB took 16 MiB Zipf from 12.7 to 8.9 ms (median of 4, Open
 * MPI 8.8 in the same runs); the bound keeps what a reader copies in one
 * step (under the engine lock) to about 12 MiB, 2-3 ms here. */
#define SC_CMA_STEP (12u << 20)
#define SC_MAX_RANKS 64 /* larger groups keep the engine */
/* How many steps a member that reduces writes ahead of what it consumed
 * (the others write as far as the slots go: sc_op.c, advance). */
TDIST_PARAM(CpuScLead, "TDIST_CPU_SC_LEAD", 2)
/* 0: a small op alone in its group takes the slow lane too (sc_op.c, tdist__cpu_sc_now) */
TDIST_PARAM(CpuScNow, "TDIST_CPU_SC_NOW", 1)
/* Looks a writer of the now lane makes at the others' steps after writing
 * its own, before its op takes the slow lane (sc_op.c); 0 where the
 * group's ranks outnumber the CPUs (the others are seldom running). */
TDIST_PARAM(CpuScNowLooks, "TDIST_CPU_SC_NOW_LOOKS", tdist__ranks_exceed_cpus() ? 0 : 128)
/* An all_to_all_v block of this many bytes and up is read in place from
 * its giver where blocks are lent (ch->lend, sc_data.c). Above the
 * engine's single-copy threshold (TDIST_CPU_CMA_BYTES, 256 KiB): with 4
 * ranks on 2 cores lending (2026-11-29; TDIST_CPU_SC_CMA=1 there now),
 * 1 MiB Zipf took 240-300 us with blocks from 256 KiB
 * read in place against 140-240 through the slots, and 16 MiB the same
 * either way (8.6-9.5 ms; 4 MiB here made it 11.5-13.5). */
TDIST_PARAM(CpuScCmaBytes, "TDIST_CPU_SC_CMA_BYTES", 1 << 20)
/* An all_gather block of this many bytes and up is read in place from its
 * giver's buffer (process_vm_readv) a piece at a time instead of passing
 * through the giver's slots, where every member can read every other's
 * memory (ch->cma): sc_data.c, "lend". 0: never. */
TDIST_PARAM(CpuScLendBytes, "TDIST_CPU_SC_LEND_BYTES", 32 << 10)
/* The same for an all_reduce (two phases: each member reads its share of
 * the others' inputs, then the others' shares of the result, from their
 * buffers): above its two system calls a step per member. At n = 2,
 * alternated with the slots: 1 MiB 250-340 us against 341-446 (Open MPI
 * 167-191), 64 MiB 26-30 ms against 30-34; 64 KiB 24-46 us against 6.6-7.9. */
TDIST_PARAM(CpuScLendReduceBytes, "TDIST_CPU_SC_LEND_REDUCE_BYTES", 512 << 10)
/* Whether such an op lends is measured (sc_data.c, lend_now): per kind
 * (all_gather, all_reduce) and size class (a power of two), SC_TUNE_LOOK
 * ops of every SC_TUNE_EVERY (after TDIST_CPU_SC_TUNE_SKIP) look: half
 * through the slots, then half lent (cut short where far slower), the
 * first of each half untimed; the others take the lane whose fastest
 * timed op was faster. 1: always lend where the sizes allow, 0: never. */
TDIST_PARAM(CpuScLend, "TDIST_CPU_SC_LEND", -1)
/* The look waits for a class's 256th op, and a lent half whose first timed
 * op took more than SC_TUNE_CUT times the slots' best ends there: a look
 * costs its slower lane's ops, and where that lane was 2-4x slower (the
 * 2026-12-01 22:00 machine: a 16 MiB all_reduce at n = 2 lent 4.5-5.9 ms,
 * through the slots 1.7-2.1), four of them in a loop of 20 ops put its
 * mean 40-70 % above the slots' alone. The first lent op of a buffer
 * also pays the first read of its pages from another process: on the
 * 2026-12-02 machine process_vm_readv of 1 MiB took 3.7 ms the first time
 * and 0.07-0.14 ms after (a 1 MiB all_gather's look op 2.2-2.7 ms against
 * 80 us), so a look at the 64th op put that class's mean over 200 ops
 * 10-15 % up; a class of fewer ops is not worth it. */
TDIST_PARAM(CpuScTuneSkip, "TDIST_CPU_SC_TUNE_SKIP", 256)
#define SC_TUNE_CUT 2
#define SC_TUNE_LOOK 8u
#define SC_TUNE_EVERY 512u
#define SC_TUNE_CLASSES 12 /* 32 KiB (or less) .. 64 MiB (or more) */
/* Bytes of a lent block a reader reads with one system call, at the first
 * of the steps they span: under the engine lock, about 0.2 ms here. */
#define SC_LEND_PIECE (1u << 20)
/* An all_reduce of this many bytes and up runs in two phases (sc_op.c). */
TDIST_PARAM(CpuScTwoBytes, "TDIST_CPU_SC_TWO_BYTES", 32 << 10)
/* A fixed-size collective of this many bytes a member and up (count times
 * the element size) runs on the engine, where a receiver reads the giver's
 * buffer by single copy, not through the slots; 0: no limit. Where the
 * host keeps the two processes' caches apart, a reader of the slots
 * copies at a third of memcpy's speed: a 64 MiB broadcast at n = 2 took
 * 35-40 ms over the slots and 24 over the engine (Open MPI 19); on the
 * machine before, the slots took 4.5 ms, half of Open MPI's time
 * (bench/cpu/RESULTS.md, 2026-11-30). The size decides, so members that
 * agree on the op choose alike ("Which ops"). */
TDIST_PARAM(CpuScMaxBytes, "TDIST_CPU_SC_MAX_BYTES", 0)

/* An op whose output on a member (what the member's consumed steps write
 * into its receive buffer) is this many bytes and up copies its data into
 * it with streaming stores (copy.h, tdist__cpu_copy_stream): larger than
 * what the cache keeps for it, the destination would otherwise be read
 * from memory only to be overwritten. Not an all_reduce (sc_data.c,
 * tdist__cpu_sc_plan): a 16 MiB one at n = 2 took 1563-2042 us (p50)
 * streaming the others' shares against 1437-1713 plainly, six alternated
 * launches (2026-12-02), and 7bb5725, which never streamed, had been faster
 * than the streaming tree in all four peers runs since. 0: never. */
TDIST_PARAM(CpuScStreamBytes, "TDIST_CPU_SC_STREAM_BYTES", 8 << 20)

/* One op's signature in its member's sig ring (64 bytes). */
typedef struct sc_sig {
  _Atomic uint64_t seq; /* cseq + 1 once the rest is written (release) */
  uint64_t count;       /* the op's count (v-ops: this member's own count) */
  uint64_t total;       /* bytes of this member's stream */
  uint64_t s0;          /* the op's first step */
  int32_t root;
  uint8_t optype, dtype, redop, pad0;
  /* A giver's stream from relative step ovf - 1 on is not in its slots but
   * in a memfd it sent the op's readers (sc_ovf.c); 0: none. Written after
   * the rest (release), read on its own (acquire). */
  _Atomic uint64_t ovf;
  uint8_t pad[16];
} sc_sig_t;

/* One step's line in its writer's step ring (64 bytes). */
typedef struct sc_step {
  _Atomic uint64_t step; /* step + 1 once the data is in (release) */
  uint32_t len;          /* bytes of this step in the slot (or inline) */
  /* The op's first step, when its data leaves room (len <= SC_SIG_INLINE,
   * fixed-size ops, or data in the slot, any op not lent):
   * SC_STEP_SIG | optype << 8 | dtype << 16 | redop << 24, with the count
   * and root in the line's last 12 bytes and, for data in the slot, the
   * stream's length in its first 8 -- the signature again, where a reader
   * finds it with the data (one line from this member per small op, not
   * two: sc_op.c, step_sig). 0 otherwise. */
  uint32_t sig;
  uint64_t cseq;
  unsigned char inl[SC_INLINE];
} sc_step_t;
#define SC_STEP_SIG 1u
/* A step line's len with this bit: the step's bytes (len without it) are
 * not in the segment but in the writer's buffer, read in place; the line
 * holds where (sc_lent_t). */
#define SC_LEN_LENT 0x80000000u
typedef struct sc_lent {
  uint64_t addr;  /* the step's first byte in the writer's address space */
  uint64_t out;   /* all_reduce: the step's first byte of the writer's output */
  uint64_t word;  /* the writer group's live word (cma.c) ... */
  uint64_t token; /* ... and what it holds while the group is alive */
} sc_lent_t;
_Static_assert(sizeof(sc_lent_t) <= SC_INLINE, "a lent step's place fits its line");
#define SC_SIG_INLINE (SC_INLINE - 12u) /* data bytes that leave room for count and root */

/* A member's control lines. */
typedef struct sc_ctl {
  _Atomic uint64_t done; /* steps consumed */
  _Atomic uint64_t red;  /* steps whose part this member reduced (two-phase all_reduce) */
  /* This member reads no signature of a collective below vseq any more
   * (its oldest op not yet complete and checked): the others may reuse
   * those entries (sc_op.c, sign_ready). */
  _Atomic uint64_t vseq;
  /* The CPU this member's caller last waited on, plus one (0: not yet);
   * written by that caller only (sc_spread.c). */
  _Atomic int32_t cpu;
  char pad0[36];
  _Atomic uint32_t want_bell; /* its progress thread sleeps with ops in flight */
  char pad1[60];
} sc_ctl_t;

_Static_assert(sizeof(sc_sig_t) == 64, "sc_sig_t is a line");
_Static_assert(sizeof(sc_step_t) == 64, "sc_step_t is a line");
_Static_assert(sizeof(sc_ctl_t) == 128, "sc_ctl_t is two lines");

/* A member's region, as this process sees it. */
typedef struct sc_region {
  sc_ctl_t *ctl;
  sc_sig_t *sig;       /* [SC_H] */
  sc_step_t *step;     /* [L] */
  unsigned char *data; /* [D][F] */
} sc_region_t;

/* A group's channel (cpu_group_t.sc). Built on the caller thread at the
 * group's creation, then engine lock. */
typedef struct cpu_sc {
  void *base;
  size_t bytes;        /* the mapping */
  size_t region_bytes; /* per member */
  unsigned D;          /* slots (a power of two, as L and F: sc_steps_of) */
  unsigned L;          /* step lines (>= D): a step whose data fits inline needs a line only */
  size_t F;            /* slot bytes */
  int n, me;
  sc_region_t *rg;          /* [n] */
  struct sockaddr_un *bell; /* [n] members' bell addresses */
  socklen_t *bell_len;      /* [n] */
  int32_t *pid;             /* [n] members' process ids: an overflow memfd is taken only
                               from its giver's process (sc_ovf.c, SCM_CREDENTIALS) */
  uint64_t next_step;       /* the clock: the first step of the next op posted */
  uint64_t done;            /* my done (mirrors rg[me].ctl->done) */
  uint64_t room_min;        /* the lowest done seen among members, cached */
  uint64_t vmin;            /* the lowest vseq seen among members, cached */
  uint64_t vseq;            /* mine as last published */
  tdist__list_t ops;        /* cpu_op_t.sc.link: posted sc ops, in order */
  /* The first op of ops not signed yet (it and those after it wait for
   * their signature entries: sign_ready), NULL: all signed. */
  cpu_op_t *unsigned_op;
  /* Ops this member completed before every member's signature was
   * checked (it only gave), oldest first (a ring from uv_head), with
   * what they must agree on. */
  struct sc_unverified {
    uint64_t cseq, count;
    int32_t root;
    uint8_t optype, dtype, redop;
  } unverified[SC_LAG];
  int uv_head, nunverified;
  /* Every member can read every other's memory (process_vm_readv, probed
   * at setup): an all_to_all_v block of TDIST_CPU_SC_CMA_BYTES and up is read
   * from its giver's buffer instead of passing through its slots... */
  int cma;
  /* ... when this member lends its blocks so (TDIST_CPU_SC_CMA; by default
   * when the group's members are more than twice this process's CPUs).
   * Read in place, one copy in all, but the kernel's: on the CI's AMD
   * guests it ran at about half a vector loop's speed per byte, page
   * pinning included, and the hottest receiver of a skewed split makes
   * all of it alone. Through the slots giver and reader copy with vector
   * loops, at once where each has a CPU or shares one with one other: with
   * 3 and 4 ranks on 2 cores the slots won (64 MiB Zipf at n = 4: faster
   * in 26 of 28 alternated pairs, median ratio 0.81). With 3 or 4 ranks a
   * CPU, every slot's turn waits for the members' turns on the CPUs, and
   * pieces of 256 KiB and up read in place won (n = 8, 64 MiB: 100-128 ms
   * against 140-192). Decided by the giver alone: its count prefix tells
   * the readers. */
  int lend;
  /* This process's CPUs (its affinity mask at setup; 0: not known):
   * where the members outnumber them (sc_crowded) an all_gather or
   * all_reduce does not lend by measure (sc_data.c, lend_now), and the
   * waiting callers spread over them (sc_spread.c). */
  int cpus;
  /* Lending by measure (sc_data.c, lend_now), [all_reduce?][size class]:
   * ops seen, the fastest of the current look in each lane (ns, [lent?]),
   * and the lane taken between looks. */
  struct sc_tune {
    uint32_t seen;
    int64_t best[2];
    int lend;
    int cut; /* this look's lent half ended early (SC_TUNE_CUT) */
  } tune[2][SC_TUNE_CLASSES];
  /* The head all_to_all_v's blocks for this member, per giver (from the
   * givers' count prefixes): where each lies in its giver (addr 0: in the
   * giver's slots) and the giver group's live word (cma.c). */
  cpu_rma_desc_t *desc;
  /* [n] Bytes at the start of every slot of member m's region this process
   * has touched once (sc_slot_data, tdist__cpu_sc_warm): page-aligned,
   * SIZE_MAX once the whole region is. Per member: a broadcast receiver
   * maps only its root's slots. */
  size_t *warm;
  int wrote;  /* a pass wrote something members may wait for: ring who sleeps */
  int broken; /* aborted: no more sc ops */
  /* The head op's plan (sc_data.c), n entries each: member m's stream
   * length, and the range [lo, hi) of it this member reads (lo == hi:
   * nothing; v-ops read the counts at the stream's start first). */
  uint64_t *totals, *lo, *hi;
  /* sc_ovf.c: the head op's overflows being read, per member (base NULL:
   * none) */
  struct sc_ovf_map {
    uint8_t *base;
    size_t bytes;
    uint64_t from; /* the relative step its first byte belongs to */
  } * ovf;
  int novf;     /* entries of ovf mapped (0: ovf_done has nothing to unmap) */
  uint64_t uid; /* the group's (overflow messages name it) */
} cpu_sc_t;

/* What a member checks and reads in an op (sc_data.c). */
enum {
  SC_ROLE_ALL = 0,  /* reads data: checks every member's signature first */
  SC_ROLE_ROOT = 1, /* a broadcast receiver: checks the root's */
  SC_ROLE_GIVE = 2  /* only gives: completes once written, checked later */
};

/* Steps of op's stream of `bytes` bytes. D, L and F are powers of two
 * (sc_chan.c): a small op maps steps to lines and slots a dozen times, and
 * as divisions those took about as long as its reduction. */
static inline uint64_t sc_steps_of(const cpu_sc_t *ch, uint64_t bytes) {
  return (bytes + ch->F - 1) >> __builtin_ctzll(ch->F);
}
/* Member m's line of step st, and the slot of step st. */
static inline sc_step_t *sc_line(const cpu_sc_t *ch, int m, uint64_t st) {
  return &ch->rg[m].step[st & (ch->L - 1)];
}
static inline unsigned sc_slot(const cpu_sc_t *ch, uint64_t st) {
  return (unsigned)(st & (ch->D - 1));
}

/* Ask for the line at p for writing, without waiting for it. A member's
 * next step line was last read by the others' cores (L steps ago); written
 * cold, its store waited in the store buffer for that line, and the engine
 * lock's release (a locked instruction, which drains the buffer) waited
 * with it: a line's crossing on every op of a broadcast root. */
static inline void sc_prefetch_w(const void *p) {
#if defined(__x86_64__)
  __asm__ volatile("prefetchw %0" : : "m"(*(const char *)p));
#else
  __builtin_prefetch(p, 1, 3);
#endif
}

/* A copy of an op's data into its receive buffer (sc_data.c, sc_op.c). */
static inline void sc_out_copy(const cpu_op_t *op, void *dst, const void *src, size_t n) {
  if (op->sc.stream)
    tdist__cpu_copy_stream(dst, src, n);
  else
    tdist__cpu_copy(dst, src, n);
}

/* (engine lock) Touch the first `len` bytes (rounded up, and at least four
 * times what was warm) of member m's every slot once (sc_chan.c). */
void tdist__cpu_sc_warm(cpu_sc_t *ch, int m, size_t len);
/* Member m's slot `slot`, about to be written or read for `len` bytes: m's
 * slots' pages are touched once, all at once, before their first use
 * (tdist__cpu_sc_warm). Left to each step, a fresh group's first 1 MiB
 * all_to_all_v ops took 2-6 ms each for eight ops (their pages faulted one
 * step at a time, 15 us a fault in this VM's slow state), against 0.06. */
static inline uint8_t *sc_slot_data(cpu_sc_t *ch, int m, unsigned slot, size_t len) {
  if (__builtin_expect(len > ch->warm[m], 0)) tdist__cpu_sc_warm(ch, m, len);
  return ch->rg[m].data + (size_t)slot * ch->F;
}

/* ---- sc_chan.c: the channel -------------------------------------------------- */
/* (caller, group creation) Build cg's channel when every member shares this
 * host and shared memory is on: a store exchange among the members (two
 * rounds, over p->store), which every member does alike and which decides
 * alike everywhere. 0 (cg->sc may stay NULL: the engine runs everything),
 * or an error of the exchange (the group's creation fails). */
int tdist__cpu_sc_setup(cpu_group_t *cg, const tdist_backend_params_t *p);
/* (caller, destroy; the group is unregistered) Unmap and free. */
void tdist__cpu_sc_free(cpu_group_t *cg);
/* (caller, ctx creation) The process's bell: an abstract unix datagram
 * socket the progress thread watches. 0 or -1 (no bell: sc is off). */
int tdist__cpu_sc_bell_open(cpu_ctx_t *ctx);
void tdist__cpu_sc_bell_start(cpu_ctx_t *ctx); /* (progress, start_all) watch it */
void tdist__cpu_sc_bell_close(cpu_ctx_t *ctx); /* (progress, last release) */
/* (engine lock) Ring member m's bell (best effort: a full queue means one
 * is pending already). */
void tdist__cpu_sc_ring(cpu_sc_t *ch, cpu_ctx_t *ctx, int m);
/* (engine lock) Every member that sleeps waiting gets a bell, if a pass
 * wrote anything (ch->wrote). */
void tdist__cpu_sc_bells(cpu_sc_t *ch, cpu_ctx_t *ctx);
/* Bells rung for want_bell, and want_bell flags set (tests): over a group,
 * no more bells than flags set, each taken by one ringer. */
extern _Atomic uint64_t tdist__cpu_sc_rings, tdist__cpu_sc_arms;
/* (progress thread, leaving the engine) Set or clear want_bell for every
 * channel, as its ops need; 1 when setting one showed that work is
 * waiting (the caller passes again before it sleeps). */
int tdist__cpu_sc_sleep(cpu_ctx_t *ctx);
/* (any thread) The group's members outnumber this process's CPUs. */
static inline int sc_crowded(const cpu_sc_t *ch) { return ch->cpus > 0 && ch->n > ch->cpus; }
/* (caller, no lock) A crowded group's (sc_crowded) waiting caller spreads
 * the members' callers over the CPUs (sc_spread.c): called by
 * tdist__cpu_test on each spin test of a shared-memory op in such a group;
 * looks every SC_SPREAD_EVERY calls. */
void tdist__cpu_sc_spread(cpu_sc_t *ch);
/* (any thread; pure) Where member me's caller moves, from every member's
 * CPU (cpu[m], -1: not known), the CPUs of this process (cpus) and the
 * caller's mask: a CPU of the mask, or -1 to stay (sc_spread.c). */
int tdist__cpu_sc_spread_pick(const int *cpu, int n, int me, int cpus, const cpu_set_t *mask);

/* ---- sc_data.c: each op's streams ------------------------------------------- */
/* (engine lock, post) The op's role, this member's stream length, a
 * private copy of an input its output overlaps, and the local part of the
 * result (a member's own block, copied now): the three below. */
int tdist__cpu_sc_plan_post(cpu_op_t *op);
/* (engine lock) The plan's part that changes nothing but op: its role,
 * this member's stream length, whether its output streams. The now lane
 * decides with it, and copies the local part (plan_local) only once it
 * takes the op: one it refused after a copy was copied twice (64 KiB
 * all_gather at n = 2: p50 8.9-13.9 us against 7.0-7.6 with the lane off). */
void tdist__cpu_sc_plan(cpu_op_t *op);
/* Bytes of op's input to copy aside first (its output overlaps it), 0. */
size_t tdist__cpu_sc_tmp_bytes(const cpu_op_t *op);
/* (engine lock) The local part of the result: a member's own block copied
 * now (to its place in the output), or left to copy a slot at a time while
 * the op waits (a large all_to_all(_v) block: sc.lc_*). */
void tdist__cpu_sc_plan_local(cpu_op_t *op);
/* (engine lock, the op at the head) Fill ch->lo/hi: what this member reads
 * of each stream, and for a fixed-size op ch->totals first (a v-op's come
 * with the signatures: called once they are in, below). Returns the
 * longest stream. */
uint64_t tdist__cpu_sc_ranges(cpu_sc_t *ch, const cpu_op_t *op);
/* all_to_all_v: the bytes of each destination's chunk in a slot. */
size_t tdist__cpu_sc_a2av_chunk(const cpu_op_t *op);
/* all_to_all_v: the bytes of member m's block for this member taken per
 * step (a chunk from m's slot, or a piece read in place); the head
 * op's prefixes read. */
size_t tdist__cpu_sc_a2av_piece(const cpu_sc_t *ch, const cpu_op_t *op, int m);
/* all_to_all_v: this member lends a block to a reader (it is read in
 * place): the op completes only once every member consumed every step. */
int tdist__cpu_sc_a2av_lends(const cpu_op_t *op);
/* (engine lock) all_to_all_v: the now lane's plainest (sc_op.c, now_a2av):
 * one step (each block for another member within its chunk), none lent,
 * this member's own block within a slot. 1 with op->sc planned as
 * tdist__cpu_sc_plan would (role, stream length, streaming), else 0. */
int tdist__cpu_sc_a2av_plain(cpu_op_t *op);
/* (engine lock) now_a2av's step st, every member's line of it in and its
 * stream one step (all_in): each other member's count for this member
 * checked against recv_counts, then its block copied from its slot (or
 * read in place where it lent it), as tdist__cpu_sc_prefixes and
 * tdist__cpu_sc_consume would. 0, or -1 (a mismatch or a failed read,
 * reported). */
int tdist__cpu_sc_a2av_take(cpu_sc_t *ch, cpu_op_t *op, uint64_t st);
/* 1 when the op's streams start with each member's count array (v-ops). */
static inline int tdist__cpu_sc_has_prefix(const cpu_op_t *op) {
  return op->type == TDIST_OP_ALL_TO_ALL_V || op->type == TDIST_OP_REDUCE_SCATTER_V;
}
/* (engine lock) Bytes [off, off + len) of this member's stream into dst. */
void tdist__cpu_sc_produce(const cpu_op_t *op, uint64_t off, uint8_t *dst, size_t len);
/* (engine lock) The members' count arrays are at the start of their step-0
 * pieces (pcs[m], NULL for a member not read): check them against this
 * member's arrays (MISMATCH reported: -1) and set the ranges. 0 on success. */
int tdist__cpu_sc_prefixes(cpu_sc_t *ch, cpu_op_t *op, const uint8_t *const *pcs);
/* (engine lock) out[0, len) = the members' pieces pcs[m] + at reduced in
 * rank order (AVG divided), a few KiB at a time. */
void tdist__cpu_sc_reduce(const cpu_op_t *op, uint8_t *out, const uint8_t *const *pcs, size_t at,
                          size_t len);
/* (engine lock) out[0, len) = this member's own input `mine` (which may be
 * out itself) combined with every other member's piece at offset `at`:
 * one member's share of a two-phase all_reduce, which no other member
 * computes, so the order of the operands need not be the ranks'. */
void tdist__cpu_sc_reduce_share(const cpu_op_t *op, uint8_t *out, const uint8_t *mine,
                                const uint8_t *const *pcs, size_t at, size_t len);
/* The op's input is scaled as it is given (PREMUL_SUM's factor, bool's 0/1). */
static inline int tdist__cpu_sc_scales(const cpu_op_t *op) {
  return tdist_backend_op_is_reducing(op->type) &&
         (op->redop == TDIST_PREMUL_SUM || op->dtype == TDIST_BOOL);
}
/* (engine lock) Copy a slot's worth of the op's deferred local part (all:
 * the rest); 1 if anything was copied. */
int tdist__cpu_sc_local_step(cpu_op_t *op, int all);
/* (engine lock) Step j's share of the local part of an all_gather larger
 * than a slot (its own block), copied from `given`, the step's piece this
 * member just wrote to its slot (in cache): before any piece of the step
 * is consumed, which may overwrite the input (an input over another
 * member's block). */
void tdist__cpu_sc_own_step(cpu_sc_t *ch, const cpu_op_t *op, uint64_t j, const uint8_t *given);
/* Does this member lend its stream of op (read in place)? Decided by the
 * giver alone, when the op starts (measured: lend_now); its lines tell the
 * readers. */
int tdist__cpu_sc_lends(cpu_op_t *op);
/* (engine lock) op, which looked at a lane for the tuner (sc.tune), took
 * ns from its start to its completion. */
void tdist__cpu_sc_tune_took(cpu_op_t *op, int64_t ns);
/* Where bytes [off, off + len) of this member's lent stream lie. */
void tdist__cpu_sc_lent_at(const cpu_op_t *op, uint64_t off, sc_lent_t *out);
/* (engine lock) Copy len bytes at addr in member m's memory (lent: its
 * live word) into dst: 0, or -1 with the group's failure reported. */
int tdist__cpu_sc_lent_read(cpu_sc_t *ch, cpu_op_t *op, int m, const sc_lent_t *lent, uint64_t addr,
                            uint8_t *dst, size_t len);
/* (engine lock) Consume step j: pcs[m] is member m's piece of the step
 * (covering its stream bytes [jF, jF + lens[m])), NULL where not read, or
 * where bit m of lent is set, an sc_lent_t saying where it lies in m. 0,
 * or -1 when a single-copy read failed (the group's failure reported). */
int tdist__cpu_sc_consume(cpu_sc_t *ch, cpu_op_t *op, uint64_t j, const uint8_t *const *pcs,
                          uint64_t lent);

/* ---- sc_ovf.c: a giver's overflow ------------------------------------------------ */
/* (engine lock) The giver op is blocked on room: after TDIST_CPU_DEFER_US
 * of it, the rest of its stream goes to its readers in a memfd. 1 when it
 * did (the op's stream is all given), 0 not (yet). */
int tdist__cpu_sc_overflow(cpu_sc_t *ch, cpu_op_t *op);
/* (engine lock) Member m's piece of step j of op when m overflowed there:
 * a pointer into the mapping of its memfd (mapped on first use), or NULL
 * (not here yet: its message has not arrived). */
const uint8_t *tdist__cpu_sc_ovf_piece(cpu_sc_t *ch, cpu_op_t *op, int m, uint64_t j);
/* (engine lock) The op's overflow mappings are no longer read. */
void tdist__cpu_sc_ovf_done(cpu_sc_t *ch);
/* (engine lock) Take the datagrams waiting on this process's bell: bells,
 * and overflow memfds (kept for their op). */
void tdist__cpu_sc_bell_drain(cpu_ctx_t *ctx);
/* (engine lock) Forget what came for group uid (abort, destroy), or for
 * every group (uid 0: the ctx ends): close the fds. */
void tdist__cpu_sc_ovf_forget(cpu_ctx_t *ctx, uint64_t uid);

/* ---- sc_op.c: the ops -------------------------------------------------------- */
/* This collective of cg runs over the channel (see "Which ops" above).
 * Inline: the now lane asks it on every small op. */
static inline int tdist__cpu_sc_takes(const cpu_group_t *cg, const cpu_op_t *op) {
  const cpu_sc_t *ch = cg->sc;
  if (!ch || ch->broken) return 0;
  switch (op->type) {
  case TDIST_OP_GATHER_V:
  case TDIST_OP_SCATTER_V: return 0; /* stream lengths known to the root alone */
  default: {
    if (tdist_backend_op_is_v(op->type)) return 1;
    int64_t max = tdist__param_CpuScMaxBytes(); /* fixed size: below the limit? */
    return max <= 0 || (unsigned __int128)op->count * op->es < (uint64_t)max;
  }
  }
}
/* (engine lock) Post op (on cg->ops already, its cseq set): sign it and
 * queue it. 0, or an error (reported as the group's failure by the caller). */
int tdist__cpu_sc_post(cpu_op_t *op);
/* (engine lock, a caller's submit) The now lane: a fixed-size collective
 * of at most SC_NOW_BYTES a member (one step), alone in its group, is started in
 * the submit with no engine op, and done there when it can be (the slow
 * lane's post, passes and completion were a third of a small op's
 * instructions): a giver (a broadcast or scatter root, a reduce or gather
 * member off root) signs it, writes its one step and leaves it to be
 * checked later; a member that only reads (a broadcast receiver) when
 * every other member's signature and step are in already; any other (an
 * all_reduce, a barrier) signs and writes its step, and is done if the
 * others' are in, else it goes on as an engine op whose post and first
 * pass are done. An all_to_all_v of one step, SC_NOW_BYTES given in all,
 * is such a writer; its length is every member's longest stream, which
 * their signatures tell: one longer than a step goes on as the slow lane's
 * own would. Nothing before it may be left unchecked, except before a
 * giver. 1 done (not posted, never completed: the core claims it), 2
 * started (bop->priv is its engine op, on the channel; also an op whose
 * group failed in the lane, which that failure fails), 0 not taken
 * (nothing changed: post it), or TDIST_ERR_NO_MEMORY (reported for the
 * group too). */
int tdist__cpu_sc_now(cpu_group_t *cg, tdist_backend_op_t *bop);
/* (engine lock, a waiter's test) An op the now lane started (2 above),
 * alone on its channel: done at once if the others' steps are in (1),
 * with none of a pass's other work; 0 not yet; -1 not such an op, or
 * anything else to do first (a signature that disagrees: the pass reports
 * it): a pass decides. */
int tdist__cpu_sc_now_test(cpu_group_t *cg, tdist_backend_op_t *bop);
/* (engine lock) Advance every sc op of the ctx's groups; ops that finish
 * are completed (tdist__cpu_op_done). Returns 1 if anything moved. */
int tdist__cpu_sc_progress(cpu_ctx_t *ctx);
/* (engine lock) The group aborted: its sc ops are forgotten (the engine's
 * abort puts them) and the channel takes no more. */
void tdist__cpu_sc_abort(cpu_group_t *cg);
/* (engine lock) op leaves its channel (op_put). */
void tdist__cpu_sc_forget(cpu_op_t *op);
/* (engine lock) An engine message (data, SIG) came for collective op, which
 * runs over the shared segment here: its sender ran it over messages, so
 * it disagrees (MISMATCH, naming both sides when the signatures differ). */
void tdist__cpu_sc_engine_msg(cpu_group_t *cg, cpu_op_t *op, const cpu_hdr_t *h, int src);
/* (engine lock) An sc op of cg still needs something from member r
 * (dispatch.c: a lost connection fails the group then). */
int tdist__cpu_sc_needs(const cpu_group_t *cg, int r);

#endif
