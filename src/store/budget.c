/*
 * budget.c - the TCP store server's memory budget (see server_impl.h).
 *
 * What is charged: the key-value table (entries, keys, value buffers and the
 * bucket array: kv->bytes, kept by kv.c; value blocks it let go that replies
 * still send, kv->held; spare blocks kept for reuse, kv->spare_bytes, which
 * are freed before anything is refused) and every connection (its struct,
 * read buffer, queued and in-flight reply buffers, waiters: c->charged,
 * recomputed by tdist__srv_charge whenever they change). Capacities are
 * charged, not lengths, because they are what is allocated.
 *
 * Admission: before a request grows the table or appends a reply larger than
 * SRV_SMALL_REPLY, kv.c asks tdist__srv_admit; a request that would take the
 * charge past the limit changes nothing and is answered FULL with a message
 * naming the budget (the client returns TDIST_ERR_NO_MEMORY). A frame whose
 * bytes do not fit while it arrives is read and dropped, then answered FULL
 * the same way (server_conn.c), so the connection stays usable. Refusals are
 * logged at WARN, the first at once, then one line per FULL_WINDOW_MS
 * counting the others.
 *
 * The heap: freed memory stays with the allocator for reuse. jemalloc
 * (default build) returns its dirty pages only as it allocates and frees
 * again, so a server that went quiet after a burst kept them resident. When
 * the charge has fallen SRV_PURGE_MIN below its peak, the sweep timer hands
 * a purge to libuv's thread pool (a purge of hundreds of MiB takes long
 * enough to stall every client if the loop ran it): it asks the allocator
 * how much freed memory it holds (tdist__alloc_unused) and purges every
 * arena (tdist__alloc_purge: jemalloc's "arena.<ALL>.purge", or glibc's
 * malloc_trim) only when that is at least SRV_PURGE_MIN, and logs at INFO
 * only when the resident set fell (docs/store-protocol.md, "Limits").
 *
 * Thread: the server's loop thread, except purge_work (a thread of libuv's
 * pool, one purge at a time: srv->purging; it writes only the purge_*
 * fields, which the loop reads after purge_after).
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

#include "store/server_impl.h"
#include "util/alloc.h"
#include "util/error.h"
#include "util/param.h"

TDIST_PARAM(StoreMemoryBytes, "TDIST_STORE_MEMORY_BYTES", (int64_t)1 << 30)
TDIST_PARAM(StoreIoTimeoutMs, "TDIST_STORE_IO_TIMEOUT_MS", 30000)

#define FULL_WINDOW_MS 10000
#define SRV_PURGE_MIN ((uint64_t)4 << 20)
#define MIB(x) ((double)(x) / (1 << 20))

void tdist__srv_budget_init(struct tdist_store_server *srv) {
  int64_t lim = tdist__param_StoreMemoryBytes(), to = tdist__param_StoreIoTimeoutMs();
  srv->limit = lim > 0 ? (uint64_t)lim : 0;
  srv->io_timeout_ms = to > 0 ? (uint64_t)to : 0;
}

void tdist__srv_charge(tdist__srv_conn_t *c) {
  struct tdist_store_server *srv = c->srv;
  uint64_t now = c->closing ? 0
                            : sizeof(*c) + c->rcap + c->out.cap + c->wbuf.cap +
                                  c->nwaiters * sizeof(tdist__srv_waiter_t);
  srv->conn_bytes = srv->conn_bytes - c->charged + now;
  c->charged = now;
  uint64_t used = tdist__srv_used(srv);
  if (used > srv->peak) srv->peak = used;
}

int tdist__srv_fits(const struct tdist_store_server *srv, uint64_t bytes) {
  return !srv->limit || tdist__srv_used(srv) + bytes <= srv->limit;
}

/* The WARN line for a refusal: the first of a window at once, the others
 * counted and summed up by the first line of a later window. */
static void warn_full(struct tdist_store_server *srv, const char *peer) {
  uint64_t now = uv_now(&srv->loop);
  if (now - srv->full_window_start >= FULL_WINDOW_MS) {
    if (srv->full_held)
      TDIST_WARN(STORE, "store server: %d more requests refused by the memory budget in %d s",
                 srv->full_held, FULL_WINDOW_MS / 1000);
    srv->full_window_start = now;
    srv->full_warned = 0;
    srv->full_held = 0;
  }
  if (srv->full_warned) {
    srv->full_held++;
    return;
  }
  srv->full_warned = 1;
  TDIST_WARN(STORE, "store server: request from %s refused: %s (further refusals are counted)",
             peer, srv->full_msg);
}

/* Fill srv->full_msg for a request of `need` more bytes and warn. */
static const char *refuse(tdist__srv_conn_t *c, const char *what, uint64_t need) {
  struct tdist_store_server *srv = c->srv;
  snprintf(srv->full_msg, sizeof(srv->full_msg),
           "the store server's memory budget is exhausted: %s needs %.1f MiB more, "
           "%.1f MiB of TDIST_STORE_MEMORY_BYTES=%" PRIu64
           " are in use (values, queued replies, partial requests)",
           what, MIB(need), MIB(tdist__srv_used(srv)), srv->limit);
  warn_full(srv, c->peer);
  return srv->full_msg;
}

const char *tdist__srv_admit(void *ctx, uint64_t store, uint64_t reply) {
  tdist__srv_conn_t *c = ctx;
  uint64_t spare = c->out.cap - c->out.len;
  uint64_t need = store + (reply > SRV_SMALL_REPLY && reply > spare ? reply - spare : 0);
  if (need == 0 || tdist__srv_fits(c->srv, need)) return NULL;
  if (c->srv->kv.spare_bytes) { /* the spare blocks go before anything is refused */
    tdist__kv_spare_trim(&c->srv->kv, 0);
    if (tdist__srv_fits(c->srv, need)) return NULL;
  }
  return refuse(c, store ? "the write" : "the reply", need);
}

const char *tdist__srv_refuse_frame(tdist__srv_conn_t *c, uint32_t len) {
  return refuse(c, "the request's frame", len);
}

/* Resident set of this process in bytes (0 if unknown). */
static uint64_t rss_bytes(void) {
  unsigned long long size = 0, res = 0;
  FILE *f = fopen("/proc/self/statm", "r");
  if (!f) return 0;
  if (fscanf(f, "%llu %llu", &size, &res) != 2) res = 0;
  fclose(f);
  return res * (uint64_t)sysconf(_SC_PAGESIZE);
}

/* (libuv's thread pool) Purge only when the allocator holds at least
 * SRV_PURGE_MIN of freed pages: jemalloc gives the extents of large values
 * (its oversize arena) back as they are freed, so after a burst of large
 * SETs there is often nothing to purge, and a purge then only costs time.
 * The line is logged only when the resident set fell. */
static void purge_work(uv_work_t *w) {
  struct tdist_store_server *srv = w->data;
  srv->purge_unused = tdist__alloc_unused();
  if (srv->purge_unused < SRV_PURGE_MIN) return;
  uint64_t before = rss_bytes();
  size_t allocated = 0, resident = 0;
  tdist__alloc_purge(&allocated, &resident);
  uint64_t after = rss_bytes();
  if (after + (1 << 20) > before) return; /* less than 1 MiB came back: nothing to say */
  char heap[160] = "";
  if (resident)
    snprintf(heap, sizeof(heap), "; jemalloc: %.1f MiB allocated, %.1f MiB resident",
             MIB(allocated), MIB(resident));
  TDIST_INFO(STORE,
             "store server: charge fell from %.1f to %.1f MiB, heap purged (%.1f MiB unused): "
             "resident %.1f -> %.1f MiB%s",
             MIB(srv->purge_peak), MIB(srv->purge_used), MIB(srv->purge_unused), MIB(before),
             MIB(after), heap);
}

/* (loop) The purge ended; the next fall of the charge may start another. */
static void purge_after(uv_work_t *w, int status) {
  struct tdist_store_server *srv = w->data;
  (void)status;
  srv->purging = 0;
}

void tdist__srv_maybe_purge(struct tdist_store_server *srv) {
  uint64_t used = tdist__srv_used(srv);
  if (srv->purging || srv->stopping || used + SRV_PURGE_MIN > srv->peak) return;
  srv->purge_peak = srv->peak;
  srv->purge_used = used;
  srv->peak = used; /* this fall is handled, whether or not the purge finds anything */
  srv->purge_req.data = srv;
  if (uv_queue_work(&srv->loop, &srv->purge_req, purge_work, purge_after) == 0) srv->purging = 1;
}
