/*
 * sc_ovf.c - a shared-memory giver that must not wait for its readers
 * (sc.h, "A giver never waits"): its overflow.
 *
 * Why: a broadcast root, a scatter root, a reduce or gather non-root only
 * gives; programs may have it finish before its readers post the op (the
 * root then sets a store key they wait for: test_cpu_deferred.c), and the
 * engine allows that through deferred reads. Over the group's segment a
 * giver's stream goes through D slots, and a stream longer than the free
 * slots waits for readers that are not there.
 *
 * How: a giver that found no room for TDIST_CPU_DEFER_US (a reader that
 * merely runs behind frees a slot sooner, and the op streams on) copies the
 * rest of its stream into a sealed memfd and sends it to every member that
 * reads its stream: one datagram to the member's bell with the memfd as
 * SCM_RIGHTS, naming the group, the op and the first step it holds. It then
 * marks its signature (ovf) and is done giving: the op completes as any
 * giver's does, and the process may even exit: the descriptors in the
 * readers' socket queues keep the memory. A reader that finds a step of
 * that giver missing from the slots looks at the signature, takes the
 * message from its bell (the progress thread takes it too, whenever the
 * bell rings), maps the memfd (checked: sealed, large enough) and reads the
 * rest there. A send that finds a full queue is tried again after another
 * DEFER; a reader gone (its socket closed) needs nothing.
 *
 * Threads: engine lock (the progress thread or a driving caller).
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/alloc.h"
#include "util/error.h"
#include "cpu/base/base.h"
#include "cpu/transport/transport.h"
#include "cpu/engine/engine.h"
#include "cpu/segment/sc.h"

#define OVF_MAGIC 0x4f465354u /* "TSFO" */

/* The datagram that carries an overflow memfd. */
typedef struct ovf_msg {
  uint32_t magic;
  int32_t giver;      /* its group rank */
  uint64_t uid, cseq; /* the group and the op */
  uint64_t from;      /* the op's relative step the memfd starts at */
  uint64_t bytes;     /* its size */
} ovf_msg_t;

typedef struct ovf_rec {
  tdist__list_t link; /* ctx->ovfs */
  ovf_msg_t m;
  int fd;
  pid_t pid; /* the sender's, as the kernel says (SCM_CREDENTIALS) */
} ovf_rec_t;

/* Does member r read the giver's stream in op (the giver's readers)? */
static int reader(const cpu_op_t *op, int r) {
  if (op->type == TDIST_OP_BROADCAST || op->type == TDIST_OP_SCATTER) return r != op->root;
  return r == op->root; /* reduce, gather: the root reads every giver */
}

/* 0 sent (or the member is gone: it needs nothing), -1 not now. */
static int send_fd(cpu_ctx_t *ctx, const cpu_sc_t *ch, int m, const ovf_msg_t *msg, int fd) {
  struct iovec iov = {(void *)msg, sizeof(*msg)};
  union {
    char buf[CMSG_SPACE(sizeof(int))];
    struct cmsghdr align;
  } u;
  memset(&u, 0, sizeof(u));
  struct msghdr mh = {.msg_name = (void *)&ch->bell[m],
                      .msg_namelen = ch->bell_len[m],
                      .msg_iov = &iov,
                      .msg_iovlen = 1,
                      .msg_control = u.buf,
                      .msg_controllen = sizeof(u.buf)};
  struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(c), &fd, sizeof(int));
  if (sendmsg(ctx->bell_tx, &mh, MSG_DONTWAIT | MSG_NOSIGNAL) == (ssize_t)sizeof(*msg)) return 0;
  return errno == ECONNREFUSED || errno == ENOENT ? 0 : -1;
}

int tdist__cpu_sc_overflow(cpu_sc_t *ch, cpu_op_t *op) {
  struct cpu_sc_opst *s = &op->sc;
  cpu_ctx_t *ctx = op->cg->ctx;
  uint64_t now = tdist__cpu_now_ms();
  int64_t defer_us = tdist__param_CpuDeferUs();
  if (!s->blocked_at) {
    s->blocked_at = now;
    return 0;
  }
  if (defer_us < 0 || (int64_t)(now - s->blocked_at) * 1000 < defer_us || ctx->bell_tx < 0)
    return 0;
  uint64_t off = s->wstep * ch->F, rest = s->total - off;
  tdist__cpu_shm_seg_t seg;
  if (tdist__cpu_shm_mem_create(rest, &seg) != 0) {
    TDIST_INFO(CPU, "sc: no overflow segment now (%s): collective #%llu waits for its readers",
               tdist_last_error(), (unsigned long long)op->cseq);
    tdist__error_clear();
    s->blocked_at = now; /* again after another DEFER */
    return 0;
  }
  tdist__cpu_sc_produce(op, off, seg.base, rest);
  ovf_msg_t msg = {.magic = OVF_MAGIC,
                   .giver = ch->me,
                   .uid = ch->uid,
                   .cseq = op->cseq,
                   .from = s->wstep,
                   .bytes = rest};
  int ok = 1;
  for (int m = 0; m < ch->n && ok; m++)
    if (m != ch->me && reader(op, m) && send_fd(ctx, ch, m, &msg, seg.fd) != 0) ok = 0;
  tdist__cpu_shm_seg_destroy(&seg); /* the readers hold it now */
  if (!ok) {
    s->blocked_at = now; /* a full bell queue: again after another DEFER (duplicates are dropped) */
    return 0;
  }
  atomic_store_explicit(&ch->rg[ch->me].sig[op->cseq % SC_H].ovf, s->wstep + 1,
                        memory_order_release);
  ch->wrote = 1;
  TDIST_INFO(CPU,
             "sc: group rank %d: collective #%llu: %llu bytes its readers did not take in "
             "%lld us go to them in a memfd",
             ch->me, (unsigned long long)op->cseq, (unsigned long long)rest, (long long)defer_us);
  s->wstep = sc_steps_of(ch, s->total);
  return 1;
}

void tdist__cpu_sc_bell_drain(cpu_ctx_t *ctx) {
  if (ctx->bell_fd < 0) return;
  for (;;) {
    ovf_msg_t msg;
    struct iovec iov = {&msg, sizeof(msg)};
    union {
      char buf[CMSG_SPACE(4 * sizeof(int)) + CMSG_SPACE(sizeof(struct ucred))];
      struct cmsghdr align;
    } u;
    struct msghdr mh = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof(u.buf)};
    ssize_t r = recvmsg(ctx->bell_fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return;
    int fd = -1;
    pid_t pid = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS &&
          c->cmsg_len >= CMSG_LEN(sizeof(struct ucred))) {
        struct ucred cr;
        memcpy(&cr, CMSG_DATA(c), sizeof(cr));
        pid = cr.pid;
        continue;
      }
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      size_t nfd = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < nfd; i++) {
        int f;
        memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        if (fd < 0)
          fd = f;
        else
          close(f); /* one per message */
      }
    }
    if (fd < 0) continue; /* a bell */
    ovf_rec_t *rec =
        r == (ssize_t)sizeof(msg) && msg.magic == OVF_MAGIC && !(mh.msg_flags & MSG_TRUNC)
            ? tdist__calloc(1, sizeof(*rec))
            : NULL;
    if (!rec) {
      close(fd);
      continue;
    }
    rec->m = msg;
    rec->fd = fd;
    rec->pid = pid;
    tdist__list_push_back(&ctx->ovfs, &rec->link);
  }
}

static void rec_free(ovf_rec_t *r) {
  tdist__list_remove(&r->link);
  if (r->fd >= 0) close(r->fd);
  tdist__free(r);
}

/* The message from member `giver` (its process, pid) about op cseq of
 * group uid; one that names the giver but came from another process is
 * dropped. */
static ovf_rec_t *find(cpu_ctx_t *ctx, uint64_t uid, uint64_t cseq, int giver, pid_t pid) {
  tdist__list_t *n, *next;
  tdist__list_foreach_safe(n, next, &ctx->ovfs) {
    ovf_rec_t *r = tdist__list_entry(n, ovf_rec_t, link);
    if (r->m.uid != uid || r->m.cseq != cseq || r->m.giver != giver) continue;
    if (r->pid == pid) return r;
    TDIST_WARN(CPU, "sc: dropped an overflow message for rank %d from pid %d (rank %d is pid %d)",
               giver, (int)r->pid, giver, (int)pid);
    rec_free(r);
  }
  return NULL;
}

/* Map what rec carries: a sealed memfd of at least its bytes, else NULL. */
static uint8_t *map_rec(const ovf_rec_t *r) {
  struct stat st;
  int seals = fcntl(r->fd, F_GET_SEALS);
  if (fstat(r->fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < (off_t)r->m.bytes ||
      seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW) ||
      r->m.bytes == 0)
    return NULL;
  void *p = mmap(NULL, r->m.bytes, PROT_READ, MAP_SHARED, r->fd, 0);
  return p == MAP_FAILED ? NULL : p;
}

const uint8_t *tdist__cpu_sc_ovf_piece(cpu_sc_t *ch, cpu_op_t *op, int m, uint64_t j) {
  struct sc_ovf_map *o = &ch->ovf[m];
  cpu_ctx_t *ctx = op->cg->ctx;
  if (!o->base) {
    sc_sig_t *g = &ch->rg[m].sig[op->cseq % SC_H];
    uint64_t ovf = atomic_load_explicit(&g->ovf, memory_order_acquire);
    if (atomic_load_explicit(&g->seq, memory_order_acquire) != op->cseq + 1 || !ovf || j + 1 < ovf)
      return NULL;
    ovf_rec_t *r = find(ctx, ch->uid, op->cseq, m, ch->pid[m]);
    if (!r) {
      tdist__cpu_sc_bell_drain(ctx);
      if (!(r = find(ctx, ch->uid, op->cseq, m, ch->pid[m]))) return NULL;
    }
    uint8_t *p = map_rec(r);
    if (!p) {
      tdist__cpu_fail(op->cg, 0, TDIST_ERR_PROTOCOL,
                      "cpu sc: rank %d sent collective #%llu's overflow in a file that cannot be "
                      "mapped",
                      m, (unsigned long long)op->cseq);
      rec_free(r);
      return NULL;
    }
    o->base = p;
    ch->novf++;
    o->bytes = r->m.bytes;
    o->from = r->m.from;
    rec_free(r);    /* the mapping keeps the memory */
    ovf_rec_t *dup; /* a send tried twice */
    while ((dup = find(ctx, ch->uid, op->cseq, m, ch->pid[m])))
      rec_free(dup);
  }
  if (j < o->from || (j - o->from) * ch->F >= o->bytes) return NULL;
  return o->base + (j - o->from) * ch->F;
}

void tdist__cpu_sc_ovf_done(cpu_sc_t *ch) {
  for (int m = 0; ch->novf && m < ch->n; m++) {
    struct sc_ovf_map *o = &ch->ovf[m];
    if (o->base) {
      munmap(o->base, o->bytes);
      ch->novf--;
    }
    *o = (struct sc_ovf_map){0};
  }
}

void tdist__cpu_sc_ovf_forget(cpu_ctx_t *ctx, uint64_t uid) {
  tdist__list_t *n, *next;
  if (!ctx->ovfs.next) return; /* never initialised */
  tdist__list_foreach_safe(n, next, &ctx->ovfs) {
    ovf_rec_t *r = tdist__list_entry(n, ovf_rec_t, link);
    if (!uid || r->m.uid == uid) rec_free(r);
  }
}
