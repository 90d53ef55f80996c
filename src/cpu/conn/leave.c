/*
 * leave.c - leaving a world's connections without losing what is owed.
 *
 * Why: a rank that aborts a group and leaves at once (destroy, exit) owes
 * its peers the ERR message naming its cause (backend.c, tell_members).
 * That message waits in the connection's queue behind whatever was queued
 * before it: the rest of a large payload a peer is not reading yet (its
 * socket is full; the abort copied the rest out of the caller's buffer,
 * io.c tdist__cpu_conn_forget). Dropping the queue on leaving, or closing
 * with the peer's bytes unread (the kernel then answers with a reset and
 * discards what it had not sent), lost the cause: the peer read part of
 * the payload, then an EOF without goodbye, and failed with "rank V closed
 * its connection" instead of V's words (tests/cpu/test_cpu_leave_cause.c:
 * 3 of 6 runs before this file).
 *
 * So leaving has two halves:
 *   detach   (progress thread, the world's last release): the connection
 *            leaves the loop; what its queue still owes (control messages
 *            and the copied rest of a partly written payload) moves to the
 *            caller with a goodbye appended;
 *   linger   (the caller's thread, after the loop let go of the fds): for
 *            at most TDIST_CPU_LINGER_MS over all connections, write what
 *            is owed, then shut writes, and read and discard until the
 *            peer's EOF (it left too: nothing of ours is unread there) or
 *            an error; then close. A peer that outlives us (it shrank and
 *            went on) costs the bound; a dead one costs nothing.
 * With TDIST_CPU_LINGER_MS=0, or when the last release runs on the
 * progress thread itself (it may not block), the goodbye is written only if
 * nothing is queued and the socket is closed at once, as before.
 *
 * Ownership: after detach the owed messages are the caller's (plain heap
 * memory: the message pool is the progress thread's, so the caller frees
 * them with tdist__free); the connection struct stays the loop's.
 */
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "util/alloc.h"
#include "util/clock.h"
#include "cpu/base/base.h"
#include "cpu/transport/transport.h"
#include "cpu/engine/engine.h"
#include "cpu/segment/sc.h"
#include "cpu/conn/conn.h"

static void owed_free(tdist__list_t *q) {
  tdist__list_t *n;
  while ((n = tdist__list_first(q))) {
    tdist__list_remove(n);
    cpu_msg_t *m = tdist__list_entry(n, cpu_msg_t, link);
    tdist__free(m->owned);
    tdist__free(m);
  }
}

/* (progress) Move what c's queue owes to `owed`, goodbye last. A message
 * still pointing into a caller's buffer (its op is gone by now: every group
 * was released) is dropped if none of it was written, and ends the stream
 * there otherwise (its bytes are no longer ours to read). */
static void take_owed(cpu_conn_t *c, tdist__list_t *owed) {
  tdist__list_t *n;
  int whole = 1;
  while ((n = tdist__list_first(&c->txq))) {
    tdist__list_remove(n);
    cpu_msg_t *m = tdist__list_entry(n, cpu_msg_t, link);
    if (whole && (!m->op || m->owned)) {
      m->op = NULL;
      tdist__list_push_back(owed, &m->link);
      continue;
    }
    if (m->off > 0) whole = 0;
    tdist__free(m->owned);
    tdist__free(m);
  }
  cpu_msg_t *bye = whole ? tdist__calloc(1, sizeof(*bye)) : NULL;
  if (!bye) return;
  tdist__list_init(&bye->link);
  bye->hdr = (cpu_hdr_t){.magic = CPU_MAGIC, .kind = CPU_MSG_BYE, .root = c->ctx->lost_peer};
  tdist__list_push_back(owed, &bye->link);
}

int tdist__cpu_conn_detach(cpu_conn_t *c, cpu_leaving_t *l) {
  int alive = !c->dead && !c->tx_err;
  if (alive && l) {
    take_owed(c, &l->owed);
    if (c->tx_ring) { /* the owed bytes go to the ring: its mapping is the caller's now */
      l->ring = c->tx_ring;
      l->map = c->tx_map;
      l->map_bytes = c->tx_map_bytes;
      c->tx_map = NULL;
    }
  } else if (alive) {
    /* Best effort goodbye: a peer that sees BYE before EOF knows this rank
     * left on purpose (it still fails ops it was running with us). */
    cpu_hdr_t bye = {.magic = CPU_MAGIC, .kind = CPU_MSG_BYE, .root = c->ctx->lost_peer};
    struct iovec iov = {&bye, sizeof(bye)};
    if (tdist__list_empty(&c->txq) && c->tx_ring)
      (void)tdist__cpu_shm_write(c, &iov, 1); /* whole or not at all: the header is small */
    else if (tdist__list_empty(&c->txq))
      (void)send(c->fd, &bye, sizeof(bye), MSG_NOSIGNAL | MSG_DONTWAIT);
    shutdown(c->fd, SHUT_WR);
  }
  if (c->parked) {
    c->parked = 0;
    if (--c->ctx->nparked == 0) uv_timer_stop(&c->ctx->park_timer);
  }
  c->dead = 1;
  uv_poll_stop(&c->poll);
  c->events = 0;
  tdist__cpu_conn_free_queues(c);
  int fd = c->fd;
  c->fd = -1;
  if (fd >= 0 && !alive) {
    close(fd); /* failed before: nothing to wait for */
    fd = -1;
  }
  return fd;
}

void tdist__cpu_conn_close(cpu_conn_t *c) {
  int fd = tdist__cpu_conn_detach(c, NULL);
  if (fd >= 0) close(fd);
}

/* (caller) Write what the socket takes of l's owed bytes; shut writes once
 * all are out. -1 on a write error (the peer is gone). */
static int write_owed(cpu_leaving_t *l) {
  while (!tdist__list_empty(&l->owed)) {
    ssize_t got;
    if (l->ring) {
      /* Into the peer's ring; when it is full the peer's bell (it made
       * room: the wwait flag) wakes the poll. */
      struct iovec iov[64];
      int cnt = tdist__cpu_msgs_iov(&l->owed, SIZE_MAX, iov, 64);
      size_t w = tdist__cpu_shm_put(l->ring, iov, cnt);
      if (!w) return 0;
      char bell = 0;
      (void)send(l->fd, &bell, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
      got = (ssize_t)w;
    } else {
      got = tdist__cpu_msgs_write(l->fd, &l->owed, SIZE_MAX, MSG_DONTWAIT);
    }
    if (got < 0) {
      if (errno == EINTR) continue;
      return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
    }
    size_t left = (size_t)got;
    cpu_msg_t *m;
    while ((m = tdist__cpu_msgs_written(&l->owed, &left))) {
      tdist__free(m->owned);
      tdist__free(m);
    }
  }
  shutdown(l->fd, SHUT_WR);
  return 0;
}

static void done(cpu_leaving_t *l) {
  owed_free(&l->owed);
  close(l->fd);
  l->fd = -1;
  if (l->map) tdist__cpu_shm_seg_unmap(l->map, l->map_bytes);
  l->map = NULL;
  l->ring = NULL;
}

void tdist__cpu_linger(cpu_leaving_t *ls, int n) {
  int64_t deadline = tdist__now_ns() + tdist__param_CpuLingerMs() * 1000000;
  struct pollfd pf[64];
  char sink[16384]; /* discarded bytes */
  int open = 0;
  for (int i = 0; i < n; i++)
    if (ls[i].fd >= 0) open++;
  while (open > 0) {
    int64_t left_ms = (deadline - tdist__now_ns()) / 1000000;
    if (left_ms <= 0) break;
    /* At most 64 polled per pass; the rest wait for the next pass. */
    int k = 0, idx[64], ring_owed = 0;
    for (int i = 0; i < n && k < 64; i++)
      if (ls[i].fd >= 0) {
        /* A ring is written before waiting: no event may come for it. */
        if (ls[i].ring && !tdist__list_empty(&ls[i].owed)) {
          (void)write_owed(&ls[i]);
          ring_owed |= !tdist__list_empty(&ls[i].owed);
        }
        /* A ring's room comes as a bell (POLLIN); its socket is always writable. */
        short ev = POLLIN | (tdist__list_empty(&ls[i].owed) || ls[i].ring ? 0 : POLLOUT);
        pf[k] = (struct pollfd){.fd = ls[i].fd, .events = ev};
        idx[k++] = i;
      }
    int wait_ms = ring_owed ? 1 : 100; /* a full ring is tried again soon */
    if (poll(pf, (nfds_t)k, (int)(left_ms < wait_ms ? left_ms : wait_ms)) < 0 && errno != EINTR)
      break;
    for (int j = 0; j < k; j++) {
      cpu_leaving_t *l = &ls[idx[j]];
      if (!pf[j].revents) continue;
      int gone = (pf[j].revents & (POLLOUT | POLLIN)) && write_owed(l) < 0;
      ssize_t got = -1;
      if (!gone)
        while ((got = recv(l->fd, sink, sizeof(sink), MSG_DONTWAIT)) > 0) {
        }
      /* EOF (the peer left too) or an error: nothing of ours is unread. */
      if (!gone && (got == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)))
        gone = 1;
      if (gone) {
        done(l);
        open--;
      }
    }
  }
  for (int i = 0; i < n; i++)
    if (ls[i].fd >= 0) done(&ls[i]);
}
