/*
 * nccl_p2p.c - point-to-point on a communicator per direction of each pair
 * of peers (docs/nccl-backend.md, "Point-to-point on NCCL").
 *
 * A group's communicator has one internal stream, so separate sends and
 * receives on it are kernels in stream order: a ring in which every rank
 * first posts its isend and then its irecv deadlocks (each send waits for a
 * receive queued behind the peer's own send). PyTorch's ProcessGroupNCCL
 * avoids most of it with a 2-rank communicator per pair of peers, made on
 * the first send/recv between them, with a stream of its own
 * (pointToPoint/getNCCLComm, key "lowRank:highRank"). tdist differs twice:
 *
 *   - One communicator per DIRECTION (a -> b: a is its rank 0 and only
 *     sends, b only receives). On torch's one stream per pair, two ranks
 *     that both post a receive from each other before their sends still
 *     deadlock; per direction, sends and receives each run in posting order
 *     and never hold each other, as on the CPU backend.
 *   - The first call never waits for the peer. Torch makes the communicator
 *     inside the first send/recv, blocking the caller until the peer's own
 *     first call to it (broadcastUniqueNCCLID reads the store). That
 *     deadlocks a program that completes on the CPU backend: rank 0
 *     isend(1) then send(2); rank 1 recv(2) then recv(0); rank 2 recv(0)
 *     then send(1) -- 0 waits in isend(1) for 1, 1 in recv(2) for 2, 2 in
 *     recv(0) for 0.
 *
 * How (a direction's state is a tdist__nccl_t of its own: locks,
 * communicator, stream, event pool, FIFO; "pair" below means one direction):
 *   - tdist__nccl_pair_get (submit, caller thread) makes the pair's state
 *     and starts its setup thread, then returns.
 *   - Until the pair is `ready`, submit queues its ops on the pair's
 *     `pending` list, each with a start event recorded on the caller's
 *     stream at submit (so the launch orders after what the caller had
 *     queued then, and not after what it queues later), and returns. The
 *     core numbers and watches them like any op in flight.
 *   - The setup thread (pair_main, one per pair, never the progress thread:
 *     it does store I/O and NCCL calls that wait) gets the unique id through
 *     the group's store (the sender makes it and sets
 *     "nccl_p2p/<uid>/<src>><dst>"; the receiver reads it, then deletes it),
 *     makes the non-blocking 2-rank communicator, sets up its stream,
 *     connects it (a one-float send/recv: NCCL 2.22+ connects p2p at the
 *     first use, and that launch waits for the peer; made here, no later
 *     launch waits), then, holding the pair's `call`, launches the pending
 *     ops in submit order and marks the pair ready. Each wait is in slices
 *     that end on the group's abort or destroy, bounded by the group's
 *     timeout. A peer that never comes: our ops on the pair time out
 *     through the watchdog (its diagnosis names the ranks that never
 *     reached the op), or the setup thread, at the group's timeout, fails
 *     the group naming the peer.
 *
 * NCCL matches sends and receives per communicator in call order, so the
 * messages from one rank to another match in the order each side posted
 * them, whatever happens with other peers: tags are not matched (as
 * before). Batched p2p (tdist_batch_isend_irecv) stays one NCCL group on the
 * group's own communicator: a group over several communicators would need
 * every pair ready first.
 *
 * Threads and locks: a pair's `call` and `mu` as the main state's
 * (nccl_backend.h). The main state's `mu` guards its `pairs` array; the
 * order is main mu, then a pair's mu (abort only); no path holds a pair's
 * lock while taking main mu. poll (progress thread) polls every pair with
 * tdist__nccl_poll_one (trylock `call`); abort (progress thread) marks
 * every pair dead and forgets its ops under the pair's mu; the group's abort
 * thread aborts the pairs' communicators after the main one, so the group's
 * held failures are released once every kernel of it stopped. destroy stops
 * and joins each setup thread, then finalizes each pair like the group.
 */
#include <errno.h>
#include <inttypes.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "nccl/nccl_backend.h"
#include "util/alloc.h"
#include "util/clock.h"

/* How long one wait of the setup thread lasts before it checks for abort
 * and destroy again (ms). */
#define SLICE_MS 50

/* (pair mu) The setup thread should give up: destroy runs, or the pair (its
 * group) was aborted. */
static int gone(tdist__nccl_t *pc) {
  pthread_mutex_lock(&pc->mu);
  int g = pc->stop || pc->dead;
  pthread_mutex_unlock(&pc->mu);
  return g || tdist_backend_aborted(pc->group);
}

static int past(int64_t deadline_ns) { return deadline_ns > 0 && tdist__now_ns() >= deadline_ns; }

/* The unique id of the pair: the lower rank makes and publishes it, the
 * higher reads it, waiting for the peer's first send/recv to us. The wait
 * polls (tdist_store_check, then naps from 1 ms growing to SLICE_MS) rather
 * than making the store wait: a store call that times out on the client's
 * side closes its connection, and this is the group's own store view, so a
 * short server-side wait whose answer came late on a loaded machine broke
 * every later store call of the group ("closed by an earlier failure":
 * nccl_sim_p2p_tdistrun_n4 under stress-ng). Checks and reads here use the
 * view's own timeout, as the group's other store calls do. */
static int pair_id(tdist__nccl_t *pc, int64_t deadline_ns, ncclUniqueId *id) {
  tdist__nccl_t *nc = pc->owner;
  int rc = 0;
  char key[96];
  snprintf(key, sizeof(key), "nccl_p2p/%" PRIu64 "/%d>%d", nc->uid,
           pc->rank == 0 ? nc->rank : pc->peer, pc->rank == 0 ? pc->peer : nc->rank);
  if (pc->rank == 0) { /* the sender makes the id */
    NCCLCHECKGOTO(ncclGetUniqueId(id), NULL, rc, out);
    TDIST_CHECKGOTO(tdist_store_set(nc->store, key, id, sizeof(*id)), rc, out);
    return 0;
  }
  long nap_us = 1000;
  for (;;) {
    const char *k = key;
    int there = 0;
    TDIST_CHECKGOTO(tdist_store_check(nc->store, &k, 1, &there), rc, out);
    if (there) {
      void *val = NULL;
      size_t len = 0;
      TDIST_CHECKGOTO(tdist_store_get(nc->store, key, &val, &len, 0), rc, out);
      if (len != sizeof(*id))
        rc = tdist__error(TDIST_ERR_PROTOCOL, "%s: unique id of %zu bytes (want %zu)", pc->name,
                          len, sizeof(*id));
      else
        memcpy(id, val, sizeof(*id));
      tdist_store_free(val);
      int deleted = 0;
      if (rc == 0) tdist_store_delete(nc->store, key, &deleted); /* read once: leave no key */
      return rc;
    }
    if (gone(pc))
      return tdist__error(TDIST_ERR_ABORTED, "%s: group '%s' aborted", pc->name, nc->name);
    if (past(deadline_ns))
      return tdist__error(TDIST_ERR_TIMEOUT,
                          "point-to-point from rank %d of group '%s': rank %d never sent to rank "
                          "%d (its first send makes the pair's id) within %lld ms",
                          pc->peer, nc->name, pc->peer, nc->rank, (long long)nc->timeout_ms);
    struct timespec ts = {0, nap_us * 1000};
    nanosleep(&ts, NULL);
    if (nap_us < SLICE_MS * 1000L) nap_us *= 2;
  }
out:
  return rc;
}

/* ncclCommGetAsyncError until ready, in slices (abort, destroy, deadline). */
static int pair_ready(tdist__nccl_t *pc, ncclComm_t comm, int64_t deadline_ns, const char *what) {
  for (;;) {
    int rc = tdist__nccl_wait_ready(comm, NULL, pc->name, what, SLICE_MS);
    if (rc != TDIST_ERR_TIMEOUT) return rc;
    if (gone(pc))
      return tdist__error(TDIST_ERR_ABORTED, "%s: group '%s' aborted", pc->name, pc->owner->name);
    if (past(deadline_ns))
      return tdist__error(TDIST_ERR_TIMEOUT,
                          "point-to-point with rank %d of group '%s': %s did not finish within "
                          "%lld ms (rank %d never came)",
                          pc->peer, pc->owner->name, what, (long long)pc->owner->timeout_ms,
                          pc->peer);
  }
}

/* Setup thread of one pair (see the top of the file). */
static void *pair_main(void *arg) {
  tdist__nccl_t *pc = arg, *nc = pc->owner;
  int rc = 0, doomed = 0;
  ncclUniqueId id;
  ncclConfig_t cfg;
  ncclComm_t comm = NULL;
  int64_t deadline = nc->timeout_ms > 0 ? tdist__now_ns() + nc->timeout_ms * 1000000 : 0;
  TDIST_CHECKGOTO(tdist__nccl_dev_own(pc->device), rc, fail);
  TDIST_CHECKGOTO(pair_id(pc, deadline, &id), rc, fail);
  tdist__nccl_config(&cfg, pc->name);
  NCCLCHECKGOTO(ncclCommInitRankConfig(&comm, 2, id, pc->rank, &cfg), comm, rc, fail);
  TDIST_CHECKGOTO(pair_ready(pc, comm, deadline, "ncclCommInitRankConfig"), rc, fail);
  TDIST_CHECKGOTO(tdist__nccl_state_setup(pc), rc, fail);
  {
    /* Connect now (the peer does the matching half), so that no launch of
     * a user's op waits for the peer (see the top). */
    float *f = pc->scratch;
    ncclResult_t r = ncclGroupStart();
    if (r == ncclSuccess)
      r = pc->rank == 0 ? ncclSend(f, 1, ncclFloat32, 1, comm, pc->stream)
                        : ncclRecv(f + 1, 1, ncclFloat32, 0, comm, pc->stream);
    ncclResult_t e = ncclGroupEnd();
    if (r == ncclSuccess || r == ncclInProgress) r = e;
    if (r != ncclSuccess && r != ncclInProgress) {
      rc = tdist__nccl_err(comm, r, "connecting the pair (ncclSend/ncclRecv)");
      goto fail;
    }
    TDIST_CHECKGOTO(pair_ready(pc, comm, deadline, "connecting the pair"), rc, fail);
  }
  /* Publish the communicator and launch what waited for it, in order,
   * holding `call` (submit parks ops only while holding it). */
  pthread_mutex_lock(&pc->call);
  pthread_mutex_lock(&pc->mu);
  int quit = pc->dead || pc->stop;
  if (!quit) pc->comm = comm; /* both locks held */
  pthread_mutex_unlock(&pc->mu);
  if (quit) {
    pthread_mutex_unlock(&pc->call);
    rc = TDIST_ERR_ABORTED;
    goto fail;
  }
  comm = NULL; /* the pair's now: the abort thread or destroy ends it */
  for (;;) {
    pthread_mutex_lock(&pc->mu);
    tdist__list_t *l = pc->dead ? NULL : tdist__list_first(&pc->pending);
    if (!l) {
      if (!pc->dead) pc->ready = 1;
      pthread_mutex_unlock(&pc->mu);
      break;
    }
    tdist_backend_op_t *op = tdist__list_entry(l, tdist_backend_op_t, link);
    tdist__list_remove(l);
    tdist__nccl_op(op)->pending = 0;
    pthread_mutex_unlock(&pc->mu);
    rc = tdist__nccl_launch_pending(pc, op, &doomed);
    if (rc != 0) break;
  }
  pthread_mutex_unlock(&pc->call);
  if (rc == 0 || rc == TDIST_ERR_ABORTED) return NULL;
  if (doomed) {
    char msg[300];
    snprintf(msg, sizeof(msg), "%s", tdist_last_error());
    tdist__nccl_fail_group(nc, rc, "%s: an op could not be enqueued: %s", pc->name, msg);
  }
  return NULL;
fail:
  if (comm) ncclCommAbort(comm);
  if (rc != TDIST_ERR_ABORTED && !gone(pc)) {
    char msg[300];
    snprintf(msg, sizeof(msg), "%s", tdist_last_error());
    TDIST_WARN(NCCL, "%s", msg);
    tdist__nccl_fail_group(nc, rc, "%s", msg);
  }
  return NULL;
}

int tdist__nccl_pair_get(tdist__nccl_t *nc, int peer, int send, tdist__nccl_t **out) {
  int slot = 2 * peer + (send ? 0 : 1);
  int rc = 0;
  tdist__nccl_t *pc = NULL;
  if (!nc->store)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                        "nccl: point-to-point on group '%s' needs the group's store", nc->name);
  pthread_mutex_lock(&nc->mu);
  if (!nc->pairs) nc->pairs = tdist__calloc(2 * (size_t)nc->size, sizeof(*nc->pairs));
  if (!nc->pairs)
    rc = tdist__error(TDIST_ERR_NO_MEMORY, "nccl: group '%s': out of memory", nc->name);
  else if (nc->dead)
    rc = tdist__error(TDIST_ERR_ABORTED, "nccl: the communicator of group '%s' was aborted",
                      nc->name);
  else
    pc = nc->pairs[slot];
  pthread_mutex_unlock(&nc->mu);
  if (rc != 0 || pc) {
    *out = pc;
    return rc;
  }
  /* Only caller threads make pairs, but two of them may race for the same
   * peer: the state is made here, published under mu if still absent. */
  tdist_backend_params_t p;
  memset(&p, 0, sizeof(p));
  char name[64];
  snprintf(name, sizeof(name), "%.40s:p2p:%d>%d", nc->name, send ? nc->rank : peer,
           send ? peer : nc->rank);
  p.group = nc->group;
  p.progress = nc->progress;
  p.rank = send ? 0 : 1; /* the sender is rank 0 of the pair */
  p.size = 2;
  p.name = name;
  p.timeout_ms = nc->timeout_ms;
  TDIST_CHECK(tdist__nccl_state_new(nc->device, &p, &pc));
  pc->owner = nc;
  pc->peer = peer;
  pc->min_cc = nc->min_cc;
  pc->store = NULL; /* the main state's is used */
  pthread_mutex_lock(&nc->mu);
  tdist__nccl_t *won = nc->dead ? NULL : nc->pairs[slot];
  int dead = nc->dead;
  if (!dead && !won) nc->pairs[slot] = pc;
  pthread_mutex_unlock(&nc->mu);
  if (dead || won) {
    tdist__nccl_state_free(pc);
    *out = won;
    return dead ? tdist__error(TDIST_ERR_ABORTED,
                               "nccl: the communicator of group '%s' was aborted", nc->name)
                : 0;
  }
  /* Published: from here destroy joins the thread (has_setup) or finds none. */
  rc = pthread_create(&pc->setup, NULL, pair_main, pc);
  if (rc != 0) {
    pthread_mutex_lock(&pc->mu);
    pc->dead = 1; /* its ops fail with the group, which is failed now */
    pthread_mutex_unlock(&pc->mu);
    rc = tdist__error(TDIST_ERR_NO_MEMORY, "nccl: %s: no thread for its setup (%s)", pc->name,
                      strerror(rc));
    tdist__nccl_fail_group(nc, rc, "%s", tdist_last_error());
    return rc;
  }
  pthread_mutex_lock(&pc->mu);
  pc->has_setup = 1;
  pthread_mutex_unlock(&pc->mu);
  *out = pc;
  TDIST_INFO(NCCL, "%s: making the pair's communicator", pc->name);
  return 0;
}

/* The pairs made so far (main mu), into a new array; *n its length. */
static tdist__nccl_t **snapshot(tdist__nccl_t *nc, int *n) {
  *n = 0;
  pthread_mutex_lock(&nc->mu);
  tdist__nccl_t **v = nc->pairs ? tdist__calloc(2 * (size_t)nc->size, sizeof(*v)) : NULL;
  for (int i = 0; v && i < 2 * nc->size; i++)
    if (nc->pairs[i]) v[(*n)++] = nc->pairs[i];
  pthread_mutex_unlock(&nc->mu);
  return v;
}

int tdist__nccl_pairs_poll(tdist__nccl_t *nc) {
  int n = 0;
  /* The progress thread must not allocate per tick: read in place (entries
   * only go from NULL to a state while the group lives). */
  pthread_mutex_lock(&nc->mu);
  tdist__nccl_t **pairs = nc->pairs;
  int size = nc->size;
  pthread_mutex_unlock(&nc->mu);
  for (int i = 0; pairs && i < 2 * size; i++) {
    pthread_mutex_lock(&nc->mu);
    tdist__nccl_t *pc = pairs[i];
    pthread_mutex_unlock(&nc->mu);
    if (pc) n += tdist__nccl_poll_one(pc);
  }
  return n;
}

int tdist__nccl_pairs_forget(tdist__nccl_t *nc) {
  /* Progress thread, inside abort, main mu held by the caller: the array is
   * read in place (no allocation, no pair lock taken under main mu except
   * here, where the order is main mu then pair mu, and no path takes them
   * the other way). */
  int n = 0;
  for (int i = 0; nc->pairs && i < 2 * nc->size; i++) {
    tdist__nccl_t *pc = nc->pairs[i];
    if (!pc) continue;
    pthread_mutex_lock(&pc->mu);
    if (!pc->dead) tdist__nccl_forget_locked(pc);
    if (pc->comm) n++;
    pthread_mutex_unlock(&pc->mu);
  }
  return n;
}

void tdist__nccl_pairs_abort(tdist__nccl_t *nc) {
  int n = 0;
  tdist__nccl_t **v = snapshot(nc, &n);
  for (int i = 0; i < n; i++) {
    tdist__nccl_t *pc = v[i];
    /* A barrier on `call`, as for the group's own communicator. */
    pthread_mutex_lock(&pc->call);
    pthread_mutex_lock(&pc->mu);
    ncclComm_t comm = pc->comm;
    pthread_mutex_unlock(&pc->mu);
    pthread_mutex_unlock(&pc->call);
    if (!comm) continue;
    ncclResult_t r = ncclCommAbort(comm);
    if (r != ncclSuccess && r != ncclInProgress)
      TDIST_WARN(NCCL, "%s: ncclCommAbort: %s", pc->name, ncclGetErrorString(r));
    pthread_mutex_lock(&pc->call);
    pthread_mutex_lock(&pc->mu);
    if (pc->comm == comm) pc->comm = NULL;
    pc->has_premul = 0;
    pthread_mutex_unlock(&pc->mu);
    pthread_mutex_unlock(&pc->call);
  }
  tdist__free(v);
}

int tdist__nccl_pairs_destroy(tdist__nccl_t *nc) {
  int rc = 0;
  pthread_mutex_lock(&nc->mu);
  tdist__nccl_t **pairs = nc->pairs;
  int size = nc->size;
  pthread_mutex_unlock(&nc->mu);
  for (int i = 0; pairs && i < 2 * size; i++) {
    tdist__nccl_t *pc = pairs[i];
    if (!pc) continue;
    pthread_mutex_lock(&pc->mu);
    pc->stop = 1;
    int joinable = pc->has_setup;
    pthread_mutex_unlock(&pc->mu);
    /* Gives up within one slice (SLICE_MS) of a wait. */
    if (joinable) pthread_join(pc->setup, NULL);
    int r = tdist__nccl_destroy(pc); /* as the group's own: finalize, or abort */
    if (r != 0 && rc == 0) rc = r;
    pthread_mutex_lock(&nc->mu);
    pairs[i] = NULL;
    pthread_mutex_unlock(&nc->mu);
  }
  return rc;
}
