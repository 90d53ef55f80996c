/*
 * cma.c - single-copy transfers between ranks on one host (cross-memory
 * attach, process_vm_readv), the way Open MPI's shared-memory transport
 * moves large messages.
 *
 * Why: over loopback TCP a payload is copied twice (sender -> kernel ->
 * receiver) and pays the TCP stack on both sides; with 4 ranks on 2 cores
 * those copies are most of the CPU a large collective uses. Here the sender
 * sends only a descriptor (where its bytes are) on the connection, the
 * receiver copies them straight from the sender's memory into the
 * destination (or the staging buffer of a reducing receive), then sends an
 * ACK; the sender's transfer completes on the ACK, not when the descriptor
 * is written, so its buffer stays untouched until the peer has read it.
 *
 * Which peers: at setup (conn.c, caller thread) every pair of ranks trades
 * (pid, address of a random probe word); each side reads the other's probe
 * word with process_vm_readv and tells the peer whether that worked. Ranks
 * on other hosts, in other pid namespaces, under a seccomp profile or a
 * ptrace policy that forbids it, or with TDIST_CPU_CMA=0, keep plain TCP.
 * The probe alone would succeed between network namespaces of one kernel
 * that share the pid namespace (containers, tests/multihost's netns hosts),
 * whose ranks reach each other only over a network: so the setup exchange
 * (tdist__cpu_cma_exchange) also trades a host identity (boot id + network namespace) and probes
 * only peers whose identity equals ours; single copy is never used between such "hosts".
 *
 * Buffer lifetime after an abort: a descriptor may be read after its sender
 * gave up on the op (timeout, mismatch, a lost peer) and handed the buffer
 * back to its caller. So each group owns a "live word" in a static table
 * (never unmapped) holding a token; the backend's abort overwrites it first
 * thing, and the core calls abort before it finishes any of the group's ops
 * (inflight.c: mark_aborted), and the receiver reads the word after the
 * payload (a fence between the two reads). A changed word fails the
 * receiver's group with REMOTE_FAILED instead of accepting bytes the sender
 * may have reused. (An op the engine completed is not at risk: its RMA
 * sends were all ACKed, i.e. read, before it completed.)
 *
 * Unexpected descriptors (the receive is not posted yet) wait in the
 * group's unexpected list without being read; posting the receive reads
 * them in place. After TDIST_CPU_DEFER_US an unclaimed one is copied into a
 * staging buffer and ACKed, so a send never waits on its receiver for long
 * (no rendezvous deadlock in send-then-receive patterns).
 *
 * Threads: tdist__cpu_cma_hello/probe/exchange and the live-word table run on caller
 * threads (setup, group creation and destruction); everything else on the
 * progress thread. Reads and ACKs are part of the transport (cpu.h): they
 * record finished transfers and report failures (deferred), and never run
 * the engine; the timer callback is a top-level point that does.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "util/alloc.h"
#include "util/error.h"
#include "util/log.h"
#include "cpu/base/base.h"
#include "cpu/transport/transport.h"
#include "cpu/engine/engine.h"

/* ---- the probe word and the live words (any thread) ---------------------------- */

static _Atomic uint64_t probe_word;
#define LIVE_SLOTS 1024
#define LIVE_DEAD 2u /* even: a slot in use by an aborted group; tokens are odd */
static _Atomic uint64_t live_words[LIVE_SLOTS];
static _Atomic uint64_t live_next;
_Atomic uint64_t tdist__cpu_cma_reads; /* payloads read across processes (tests, docs) */

static uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  return x ^ (x >> 33);
}

static uint64_t seed(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return mix((uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 32) ^ (uint64_t)getpid() << 16);
}

int tdist__cpu_cma_enabled(void) { return tdist__param_CpuCma() != 0; }

void tdist__cpu_cma_hello(cpu_cma_hello_t *me) {
  uint64_t expect = 0;
  atomic_compare_exchange_strong(&probe_word, &expect, seed() | 1);
  *me = (cpu_cma_hello_t){.pid = (int32_t)getpid(),
                          .enabled = tdist__cpu_cma_enabled(),
                          .probe = (uint64_t)(uintptr_t)&probe_word,
                          .token = atomic_load(&probe_word)};
}

int tdist__cpu_cma_probe(const cpu_cma_hello_t *peer) {
  if (!tdist__cpu_cma_enabled() || !peer->enabled || peer->pid <= 0) return 0;
  if (peer->pid == (int32_t)getpid()) return 0; /* ranks in one process: not a case we copy */
  uint64_t v = 0;
  struct iovec l = {&v, sizeof(v)}, r = {(void *)(uintptr_t)peer->probe, sizeof(v)};
  ssize_t n = process_vm_readv((pid_t)peer->pid, &l, 1, &r, 1, 0);
  if (n != (ssize_t)sizeof(v) || v != peer->token) {
    TDIST_INFO(CPU, "cma: cannot read pid %d (%s): TCP for its payloads", (int)peer->pid,
               n < 0 ? strerror(errno) : "different host or namespace");
    return 0;
  }
  return 1;
}

/* ---- the setup exchange (caller thread) ---------------------------------------- */

/* This process's host identity for single copy: the kernel's boot id and
 * the network namespace ("<boot_id>/net:<dev>:<inode>"), "" if unknown.
 *
 * Why not the probe alone: process_vm_readv reaches any process of this
 * kernel that shares our pid namespace, including one in another network
 * namespace (a container, or the netns "hosts" of tests/multihost), and the
 * probe would succeed there. Ranks that reach each other only over a network
 * are on different hosts as far as the job is concerned (that is what a test
 * bed of network namespaces stands for), so single copy must stay off
 * between them: only ranks with equal identities probe. The boot id tells
 * machines apart (every machine's initial netns has the same inode number);
 * the netns inode tells namespaces of one kernel apart. An unknown identity
 * (no /proc) on either side leaves the decision to the probe, as before. */
void tdist__cpu_host_identity(char *id) {
  char boot[64] = "";
  struct stat st;
  memset(id, 0, HOST_ID_LEN);
  FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");
  if (f) {
    if (!fgets(boot, sizeof(boot), f)) boot[0] = '\0';
    fclose(f);
  }
  boot[strcspn(boot, "\n")] = '\0';
  if (!boot[0] || stat("/proc/self/ns/net", &st) != 0) return;
  snprintf(id, HOST_ID_LEN, "%s/net:%llu:%llu", boot, (unsigned long long)st.st_dev,
           (unsigned long long)st.st_ino);
}

/* (caller, setup: tdist__cpu_ctx_create) Every pair trades (pid, probe, host
 * identity), each side tries to read the other's probe word if their host
 * identities match (above) and says whether it could. Small blocking writes
 * that fit the socket buffers, all sent before any is read: no ordering
 * between ranks is needed. On return out[j] holds the peer's pid and, in
 * `enabled`, whether the peer can read this process. */
int tdist__cpu_cma_exchange(int me, int n, const int *fds, const int *names, int64_t deadline,
                            cpu_cma_hello_t *out, int *local) {
  cpu_cma_hello_t mine;
  char my_host[HOST_ID_LEN], peer_host[HOST_ID_LEN];
  tdist__cpu_cma_hello(&mine);
  tdist__cpu_host_identity(my_host);
  for (int j = 0; j < n; j++)
    if (j != me && (tdist__cpu_io_full(fds[j], &mine, sizeof(mine), 1, deadline) != 0 ||
                    tdist__cpu_io_full(fds[j], my_host, sizeof(my_host), 1, deadline) != 0))
      goto fail;
  for (int j = 0; j < n; j++) {
    if (j == me) continue;
    if (tdist__cpu_io_full(fds[j], &out[j], sizeof(out[j]), 0, deadline) != 0 ||
        tdist__cpu_io_full(fds[j], peer_host, sizeof(peer_host), 0, deadline) != 0)
      goto fail;
    peer_host[HOST_ID_LEN - 1] = '\0';
    /* Shared memory needs a known identity on both sides (shm_conn.c). */
    local[j] = my_host[0] && peer_host[0] && strcmp(my_host, peer_host) == 0;
    if (my_host[0] && peer_host[0] && strcmp(my_host, peer_host) != 0) {
      TDIST_INFO(CPU, "cma: rank %d is on another host (%s; here %s): TCP for its payloads",
                 names ? names[j] : j, peer_host, my_host);
      out[j].enabled = 0; /* tdist__cpu_cma_probe then says no without reading */
    }
  }
  for (int j = 0; j < n; j++) {
    if (j == me) continue;
    int32_t ok = tdist__cpu_cma_probe(&out[j]);
    if (tdist__cpu_io_full(fds[j], &ok, sizeof(ok), 1, deadline) != 0) goto fail;
  }
  for (int j = 0; j < n; j++) {
    if (j == me) continue;
    int32_t ok = 0;
    if (tdist__cpu_io_full(fds[j], &ok, sizeof(ok), 0, deadline) != 0) goto fail;
    out[j].enabled = ok == 1;
  }
  return 0;
fail:
  return tdist__error(TDIST_ERR_IO, "cpu: setup exchange with a peer failed");
}

void tdist__cpu_cma_group_init(cpu_group_t *cg) {
  cg->live = NULL;
  if (!tdist__cpu_cma_enabled()) return;
  uint64_t token = (mix(atomic_fetch_add(&live_next, 1) + seed()) << 2) | 1;
  for (int i = 0; i < LIVE_SLOTS; i++) {
    uint64_t expect = 0;
    if (atomic_compare_exchange_strong(&live_words[i], &expect, token)) {
      cg->live = &live_words[i];
      cg->live_token = token;
      return;
    }
  }
  TDIST_INFO(CPU, "cma: %d groups alive, group '%s' (%016" PRIx64 ") sends over TCP", LIVE_SLOTS,
             cg->name, cg->uid);
}

/* Progress thread, first thing in abort: before the core hands any of the
 * group's buffers back to the caller. */
void tdist__cpu_cma_group_abort(cpu_group_t *cg) {
  if (cg->live) atomic_store(cg->live, LIVE_DEAD);
}

void tdist__cpu_cma_group_free(cpu_group_t *cg) {
  if (cg->live) atomic_store(cg->live, 0);
  cg->live = NULL;
}

/* ---- sending (progress thread) ----------------------------------------------------- */

static size_t cma_min(void) {
  int64_t v = tdist__param_CpuCmaBytes();
  return v < 1 ? 1 : (size_t)v;
}

void tdist__cpu_msg_payload(cpu_conn_t *c, cpu_group_t *cg, cpu_msg_t *m, const void *ptr,
                            size_t len) {
  m->data = ptr;
  if (!c->cma_tx || !cg->live || len < cma_min()) return;
  m->desc = (cpu_rma_desc_t){.kind = m->hdr.kind,
                             .addr = (uint64_t)(uintptr_t)ptr,
                             .len = len,
                             .word = (uint64_t)(uintptr_t)cg->live,
                             .token = cg->live_token,
                             .cookie = ++c->cookie_next};
  m->cookie = m->desc.cookie;
  m->hdr.kind = CPU_MSG_RMA;
  m->hdr.len = sizeof(m->desc);
  m->data = (const uint8_t *)&m->desc;
}

/* ---- receiving (progress thread) ---------------------------------------------------- */

static void send_ack(cpu_conn_t *c, uint64_t cookie) {
  if (!c || c->dead) return;
  cpu_msg_t *m = tdist__cpu_msg_new();
  if (!m) {
    tdist__cpu_on_conn_lost(c, "out of memory for an ACK");
    return;
  }
  m->hdr = (cpu_hdr_t){.magic = CPU_MAGIC, .kind = CPU_MSG_ACK, .seq = cookie};
  tdist__cpu_send(c, m);
}

void tdist__cpu_cma_ack(cpu_ctx_t *ctx, int src_world, uint64_t cookie) {
  send_ack(ctx->conns ? ctx->conns[src_world] : NULL, cookie);
}

/* 1 when the sender's live word still holds d's token (it has not aborted
 * the group), 0 when it changed, -1 when it cannot be read (errno set). */
static int live_intact(int pid, const cpu_rma_desc_t *d) {
  uint64_t w = 0;
  struct iovec l = {&w, sizeof(w)}, r = {(void *)(uintptr_t)d->word, sizeof(w)};
  if (process_vm_readv((pid_t)pid, &l, 1, &r, 1, 0) != (ssize_t)sizeof(w)) return -1;
  return w == d->token;
}

int tdist__cpu_cma_read_range(int pid, void *dst, const cpu_rma_desc_t *d, size_t off, size_t len,
                              char *why, size_t wl, int *aborted) {
  *aborted = 0;
  size_t done = off, end = off + len;
  while (done < end) {
    struct iovec l = {(uint8_t *)dst + done, end - done};
    struct iovec r = {(void *)(uintptr_t)(d->addr + done), end - done};
    ssize_t n = process_vm_readv((pid_t)pid, &l, 1, &r, 1, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = n < 0 ? errno : 0;
      /* A sender that aborted may already have freed (unmapped) the
       * buffer: EFAULT then says nothing about the sender itself, whose
       * own cause is on its way. Only a sender whose live word is intact
       * (or unreadable: it is gone) is named for the failed read. */
      if (err != ESRCH && live_intact(pid, d) == 0) {
        snprintf(why, wl, "it aborted the op while its buffer was being read");
        *aborted = 1;
        return -1;
      }
      snprintf(why, wl, "its memory could not be read (%s)", err ? strerror(err) : "EOF");
      return -1;
    }
    done += (size_t)n;
  }
  return 0;
}

int tdist__cpu_cma_read_end(int pid, const cpu_rma_desc_t *d, char *why, size_t wl, int *aborted) {
  /* The payload's loads before the live word's: a word still holding the
   * token means the sender had not aborted (and so not handed the buffer
   * back) when the last payload byte was read. */
  atomic_thread_fence(memory_order_seq_cst);
  if (live_intact(pid, d) != 1) {
    snprintf(why, wl, "it aborted the op while its buffer was being read");
    *aborted = 1;
    return -1;
  }
  atomic_fetch_add_explicit(&tdist__cpu_cma_reads, 1, memory_order_relaxed);
  return 0;
}

int tdist__cpu_cma_read(int pid, void *dst, const cpu_rma_desc_t *d, char *why, size_t wl,
                        int *aborted) {
  if (tdist__cpu_cma_read_range(pid, dst, d, 0, d->len, why, wl, aborted) != 0) return -1;
  return tdist__cpu_cma_read_end(pid, d, why, wl, aborted);
}

static void arm(cpu_ctx_t *ctx, uint64_t ms);

/* A read failed. A sender that is gone fails the group (-1; reported, the
 * core aborts it after this I/O step). A sender that aborted (the live word
 * changed: -2) is failing for a reason of its own, which its ERR message or
 * abort record is about to bring: the transfer is dropped unfinished and
 * the group waits up to CAUSE_MS for that cause before failing with this
 * one (on_timer), so every rank's error names the root cause rather than
 * the rank that gave up first. */
#define CAUSE_MS 1000
int tdist__cpu_cma_failed(cpu_group_t *cg, int src_world, int aborted, const char *why) {
  if (!cg || cg->aborted) return -1;
  char text[200];
  snprintf(text, sizeof(text), "rank %d (world rank %d): %s", tdist__cpu_grank_of(cg, src_world),
           src_world, why);
  if (!aborted) {
    tdist__cpu_fail(cg, 0, TDIST_ERR_REMOTE_FAILED, "%s", text);
    return -1;
  }
  tdist__cpu_fail_later(cg, text);
  return -2;
}

void tdist__cpu_fail_later(cpu_group_t *cg, const char *text) {
  if (cg->aborted) return;
  if (!cg->poisoned) {
    cpu_ctx_t *ctx = cg->ctx;
    /* A flag, and the time as is: on_timer compares now >= poison_at +
     * CAUSE_MS, which cannot wrap (the monotonic clock never goes back). */
    cg->poisoned = 1;
    cg->poison_at = tdist__cpu_now_ms();
    snprintf(cg->poison_why, sizeof(cg->poison_why), "%s", text);
    TDIST_INFO(CPU, "%s; waiting for its cause", text);
    /* A running timer is due sooner (pending descriptors) and on_timer
     * re-arms for the poison: moving it to CAUSE_MS would delay those. */
    if (ctx->rma_timer_on && !cpu_off_loop(ctx) && !uv_is_active((uv_handle_t *)&ctx->rma_timer))
      arm(ctx, CAUSE_MS);
  }
}

static void pending_add(cpu_ctx_t *ctx, cpu_ux_t *u);

void tdist__cpu_cma_on_desc(cpu_conn_t *c) {
  cpu_ctx_t *ctx = c->ctx;
  cpu_rma_desc_t d = c->rdesc;
  if (d.kind != CPU_MSG_COLL && d.kind != CPU_MSG_P2P) {
    tdist__cpu_on_conn_lost(c, "sent a malformed descriptor");
    return;
  }
  /* Dispatch it as the message it stands for (same matching as over TCP),
   * with rx_rma set: no parking, and an unexpected entry without data. */
  c->rh.kind = d.kind;
  c->rh.len = d.len;
  cpu_rx_clear(c);
  c->rx_rma = 1;
  tdist__cpu_on_header(c);
  c->rx_rma = 0;
  if (c->dead) return;
  if (c->rx_x) {
    char why[120];
    int aborted;
    /* Large: read in steps (copy_steps.c, which ACKs and finishes the
     * transfer); the connection reads on meanwhile. */
    if (tdist__cpu_copy_read(c->rx_g, c->rx_op, c->rx_x, c->peer, c->pid, &d, c->rx_dst)) {
      cpu_rx_clear(c);
      return;
    }
    if (tdist__cpu_cma_read(c->pid, c->rx_dst, &d, why, sizeof(why), &aborted) != 0) {
      cpu_group_t *cg = c->rx_g;
      if (c->rx_x->reduce) tdist__cpu_buf_put(ctx, c->rx_dst);
      cpu_rx_clear(c);
      tdist__cpu_cma_failed(cg, c->peer, aborted, why); /* the transfer stays undone */
      return;
    }
    send_ack(c, d.cookie);
    if (c->dead) return;
    tdist__cpu_on_payload(c);
  } else if (c->rx_ux) {
    cpu_ux_t *u = c->rx_ux;
    u->rma = 1;
    u->desc = d;
    pending_add(ctx, u);
    tdist__cpu_on_payload(c); /* complete as a descriptor: a posted receive claims it */
  } else {
    /* Discarded (aborted group, or a mismatch reported): nothing will read
     * it. */
    c->rx_g = NULL;
    send_ack(c, d.cookie);
  }
}

void tdist__cpu_cma_take(cpu_ctx_t *ctx, cpu_ux_t *u) {
  if (!u->rma) return;
  u->rma = 0;
  ctx->rma_pending--;
}

int tdist__cpu_cma_fetch(cpu_ctx_t *ctx, cpu_group_t *cg, cpu_ux_t *u, void *dst) {
  cpu_conn_t *c = ctx->conns[u->src];
  char why[120];
  int aborted;
  tdist__cpu_cma_take(ctx, u);
  if (!c || c->dead) return tdist__cpu_cma_failed(cg, u->src, 0, "it is gone");
  if (tdist__cpu_cma_read(c->pid, dst, &u->desc, why, sizeof(why), &aborted) != 0)
    return tdist__cpu_cma_failed(cg, u->src, aborted, why);
  send_ack(c, u->desc.cookie);
  return 0;
}

void tdist__cpu_cma_drop(cpu_ctx_t *ctx, cpu_ux_t *u) {
  if (!u->rma) return;
  u->rma = 0;
  ctx->rma_pending--;
  /* Nothing will read it: let the sender move on. */
  send_ack(ctx->conns ? ctx->conns[u->src] : NULL, u->desc.cookie);
}

/* ---- unclaimed descriptors: staged after TDIST_CPU_DEFER_US ------------------------ */

static uint64_t defer_ms(void) {
  int64_t us = tdist__param_CpuDeferUs();
  return us <= 0 ? 0 : (uint64_t)(us + 999) / 1000;
}

static void on_timer(uv_timer_t *t);

static void arm(cpu_ctx_t *ctx, uint64_t ms) {
  if (ctx->rma_timer_on && !cpu_off_loop(ctx)) uv_timer_start(&ctx->rma_timer, on_timer, ms, 0);
}

static void pending_add(cpu_ctx_t *ctx, cpu_ux_t *u) {
  u->since = tdist__cpu_now_ms();
  if (ctx->rma_pending++ == 0) arm(ctx, defer_ms());
}

/* Stage u (a pending descriptor): read it into a buffer of ours, ACK.
 * 1: no memory now (tried again later); <0: the read failed (see
 * tdist__cpu_cma_fetch), u is no longer pending. */
static int stage(cpu_ctx_t *ctx, cpu_group_t *cg, cpu_ux_t *u) {
  uint8_t *buf = tdist__cpu_buf_get(ctx, u->desc.len);
  if (!buf) return 1;
  cpu_conn_t *c = ctx->conns[u->src];
  if (c && !c->dead && tdist__cpu_copy_stage(ctx, cg, u, c->pid, buf)) {
    tdist__cpu_cma_take(ctx, u); /* the job reads, ACKs and sets u->data */
    return 0;
  }
  int rc = tdist__cpu_cma_fetch(ctx, cg, u, buf);
  if (rc != 0) {
    tdist__cpu_buf_put(ctx, buf);
    return rc;
  }
  u->data = buf;
  return 0;
}

/* Stage the old pending descriptors of list head (group cg, or the orphans
 * when cg is NULL); the earliest deadline of the others in *wait. */
static void sweep(cpu_ctx_t *ctx, cpu_group_t *cg, tdist__list_t *head, uint64_t now,
                  uint64_t *wait) {
  tdist__list_t *n, *next;
  tdist__list_foreach_safe(n, next, head) {
    cpu_ux_t *u = tdist__list_entry(n, cpu_ux_t, link);
    if (!u->rma) continue;
    if (now - u->since < defer_ms()) {
      uint64_t left = u->since + defer_ms() - now;
      if (!*wait || left < *wait) *wait = left;
      continue;
    }
    TDIST_TRACE(CPU, "cma: staging an unclaimed %" PRIu64 "-byte message from world rank %d",
                u->desc.len, u->src);
    int rc = stage(ctx, cg, u);
    if (rc > 0) {
      *wait = 1;
    } else if (rc < 0) {
      /* Read failed: the group's failure is reported or it waits for the
       * cause (-2); for an orphan, its sender failed (its group will hear).
       * The message has no bytes: it must never be delivered. */
      tdist__cpu_ux_free(ctx, u);
    }
  }
}

/* Timer callback (progress thread, top level). */
static void on_timer(uv_timer_t *t) {
  cpu_ctx_t *ctx = t->data;
  tdist__cpu_enter(ctx);
  uint64_t now = tdist__cpu_now_ms(), wait = 0;
  int poisoned = 0;
  tdist__list_t *n;
  sweep(ctx, NULL, &ctx->orphans, now, &wait);
  tdist__list_foreach(n, &ctx->groups) {
    cpu_group_t *cg = tdist__list_entry(n, cpu_group_t, link);
    if (!ctx->rma_pending) break;
    if (!cg->aborted) sweep(ctx, cg, &cg->ux, now, &wait);
  }
  tdist__list_foreach(n, &ctx->groups) {
    cpu_group_t *cg = tdist__list_entry(n, cpu_group_t, link);
    if (cg->aborted || !cg->poisoned) continue;
    if (now >= cg->poison_at + CAUSE_MS) {
      cg->poisoned = 0; /* reported once; the core aborts the group */
      tdist__cpu_fail(cg, 0, TDIST_ERR_REMOTE_FAILED, "%s", cg->poison_why);
      continue;
    }
    poisoned = 1;
    uint64_t left = cg->poison_at + CAUSE_MS - now;
    if (!wait || left < wait) wait = left;
  }
  if (ctx->rma_pending || poisoned) arm(ctx, wait ? wait : 1);
  tdist__cpu_run_ready(ctx); /* what the ACKs written here finished */
  tdist__cpu_leave(ctx);
}

void tdist__cpu_cma_sync(cpu_ctx_t *ctx) {
  if (!ctx->rma_timer_on || uv_is_active((uv_handle_t *)&ctx->rma_timer)) return;
  int poisoned = 0;
  tdist__list_t *n;
  tdist__list_foreach(n, &ctx->groups) {
    cpu_group_t *cg = tdist__list_entry(n, cpu_group_t, link);
    poisoned |= !cg->aborted && cg->poisoned;
  }
  if (ctx->rma_pending || poisoned) arm(ctx, 1); /* on_timer re-arms for the rest */
}

void tdist__cpu_cma_start_timer(cpu_ctx_t *ctx) {
  uv_timer_init(tdist_backend_loop(ctx->progress), &ctx->rma_timer);
  ctx->rma_timer.data = ctx;
  ctx->rma_timer_on = 1;
}
