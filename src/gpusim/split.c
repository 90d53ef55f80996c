/*
 * split.c - ncclCommSplit and ncclCommShrink, and the bootstrap all-gather
 * split uses over its parent.
 *
 * Both follow NCCL 2.28's src/init.cc ncclCommInitChildComm:
 *   - `*newcomm` is set to NULL at the call and written only when the
 *     child's init ends -- on a non-blocking parent that is from the job
 *     thread, after the call returned ncclInProgress ("*newcomm should be
 *     NCCL_COMM_NULL until comm split fully complete");
 *   - the parent answers ncclInProgress until that job ends, and a failed
 *     job leaves its error as the parent's async error;
 *   - an abort of the parent also stops its child's init (childAbortFlag);
 *   - split: every rank of the parent takes part (colors and keys are
 *     all-gathered over the parent's bootstrap); NCCL_SPLIT_NOCOLOR gets no
 *     communicator; child ranks are ordered by key, then parent rank;
 *   - shrink: the excluded ranks do not take part; the list is sorted in
 *     place (qsort on the caller's array, as NCCL does); an excluded rank
 *     calling it is ncclInvalidArgument; NCCL_SHRINK_ABORT first sets the
 *     parent's abort flag, waits for its kernels (which exit early, their
 *     work undone) and clears the flag (ncclCommShrink).
 * Children get a key derived from the parent's key, the number of children
 * the parent made so far and the color (or the excluded list), so that every
 * member derives the same segment name without talking.
 */
#include <stdlib.h>
#include <string.h>

#include "gpusim/nccl_sim.h"

/* Two FNV-1a 64-bit hashes with different offsets: 16 bytes of key. */
static void derive_key(const unsigned char parent[16], const void *data, size_t n,
                       unsigned char out[16]) {
  uint64_t h[2] = {0xcbf29ce484222325ull, 0x84222325cbf29ce4ull};
  for (int k = 0; k < 2; k++) {
    for (int i = 0; i < 16; i++)
      h[k] = (h[k] ^ parent[i]) * 0x100000001b3ull;
    for (size_t i = 0; i < n; i++)
      h[k] = (h[k] ^ ((const unsigned char *)data)[i]) * 0x100000001b3ull;
  }
  memcpy(out, h, 16);
}

ncclResult_t gs_comm_allgather(ncclComm_t c, const void *mine, void *all) {
  gs_slot_t *me = gs_slot(&c->seg, c->rank);
  uint64_t k = atomic_load(&me->bootseq) + 1;
  memcpy(me->boot[k & 1], mine, GS_BOOT_BYTES);
  atomic_store(&me->bootseq, k);
  gs_seg_wake(&c->seg);
  for (int j = 0; j < c->nranks; j++) {
    gs_slot_t *s = gs_slot(&c->seg, j);
    for (;;) {
      uint32_t w = gs_seg_word(&c->seg);
      if (atomic_load(&s->bootseq) >= k) break;
      if (atomic_load(&c->abort_flag)) return ncclInternalError;
      /* bootstrap.cc: a peer gone mid-exchange fails the socket exchange. */
      if (gs_peer_gone(&c->seg, j))
        return gs_fail(ncclRemoteError, "bootstrap: rank %d of %s is gone", j, c->name);
      gs_seg_sleep(&c->seg, w);
    }
    memcpy((unsigned char *)all + (size_t)j * GS_BOOT_BYTES, s->boot[k & 1], GS_BOOT_BYTES);
  }
  return ncclSuccess;
}

typedef struct child_job {
  int shrink;
  int color, key;
  int children; /* the parent's child count for this child */
  int *exclude; /* shrink: sorted copy */
  int nexclude;
  ncclComm_t *newcomm; /* the caller's slot, written at the end */
  int has_cfg;
  ncclConfig_t cfg;
} child_job_t;

typedef struct ck {
  int color, key;
} ck_t;

/* The job: members, then the child's init. Runs on the parent's job thread
 * (non-blocking) or the caller's (blocking). */
static ncclResult_t child_job(ncclComm_t p, void *arg) {
  child_job_t *j = arg;
  ncclResult_t r = ncclSuccess;
  int crank = 0, cn = 0;
  unsigned char key[16];
  ncclComm_t child = NULL;
  if (!j->shrink) {
    unsigned char mine[GS_BOOT_BYTES] = {0}, *all = malloc((size_t)p->nranks * GS_BOOT_BYTES);
    if (!all) {
      r = gs_fail(ncclSystemError, "out of host memory");
      goto out;
    }
    ck_t me = {j->color, j->key};
    memcpy(mine, &me, sizeof(me));
    r = gs_comm_allgather(p, mine, all);
    for (int i = 0; r == ncclSuccess && i < p->nranks; i++) {
      ck_t o;
      memcpy(&o, all + (size_t)i * GS_BOOT_BYTES, sizeof(o));
      if (o.color != j->color) continue;
      cn++;
      if (o.key < j->key || (o.key == j->key && i < p->rank)) crank++;
    }
    free(all);
    if (r != ncclSuccess) goto out;
    if (j->color == NCCL_SPLIT_NOCOLOR) goto out; /* no communicator for this rank */
    int tag[3] = {1, j->children, j->color};
    derive_key(p->key, tag, sizeof(tag), key);
  } else {
    int below = 0, valid = 0;
    for (int i = 0; i < j->nexclude; i++) {
      if (j->exclude[i] < 0 || j->exclude[i] >= p->nranks) continue;
      if (i > 0 && j->exclude[i] == j->exclude[i - 1]) continue;
      valid++;
      if (j->exclude[i] < p->rank) below++;
    }
    crank = p->rank - below;
    cn = p->nranks - valid;
    int tag[2] = {2, j->children};
    unsigned char tmp[16];
    derive_key(p->key, tag, sizeof(tag), tmp);
    derive_key(tmp, j->exclude, sizeof(int) * (size_t)j->nexclude, key);
  }
  r = gs_comm_create(&child, key, crank, cn, p->dev, j->has_cfg ? &j->cfg : NULL, p->blocking,
                     p->name, 0);
  if (r != ncclSuccess) goto out;
  if (!j->has_cfg) child->cfg = p->cfg; /* init.cc copyCommConfig: a NULL config inherits */
  child->init_parent = p;               /* the parent's abort stops this init */
  r = gs_comm_init_job(child, NULL);
  child->init_parent = NULL;
  if (r != ncclSuccess) {
    gs_comm_discard(child);
    goto out;
  }
  *j->newcomm = child; /* the late write of *newcomm */
out:
  free(j->exclude);
  free(j);
  return r;
}

static ncclResult_t start_child(ncclComm_t comm, child_job_t *j, ncclConfig_t *config) {
  if (config) {
    if (config->magic != 0xcafebeefu) {
      free(j->exclude);
      free(j);
      return gs_fail(ncclInvalidArgument,
                     "ncclConfig_t argument not initialized via NCCL_CONFIG_INITIALIZER");
    }
    j->has_cfg = 1;
    j->cfg = *config;
  }
  pthread_mutex_lock(&comm->mu);
  j->children = ++comm->children;
  pthread_mutex_unlock(&comm->mu);
  return gs_comm_job(comm, child_job, j);
}

static int cmp_int(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  return (x > y) - (x < y);
}

GS_API ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                                  ncclConfig_t *config) {
  if (!gs_comm_valid(comm)) return gs_fail(ncclInvalidArgument, "CommSplit : comm is not valid");
  if (!newcomm) return gs_fail(ncclInvalidArgument, "CommSplit : newcomm argument is NULL");
  if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
    return gs_fail(ncclInvalidArgument, "CommSplit : invalid color %d", color);
  gs_comm_enter(comm);
  ncclResult_t r = gs_comm_ensure_ready(comm);
  if (r != ncclSuccess) goto out;
  *newcomm = NULL;
  child_job_t *j = calloc(1, sizeof(*j));
  if (!j) {
    r = gs_fail(ncclSystemError, "out of host memory");
    goto out;
  }
  j->color = color;
  j->key = key;
  j->newcomm = newcomm;
  r = start_child(comm, j, config);
out:
  gs_comm_leave(comm);
  return r;
}

GS_API ncclResult_t ncclCommShrink(ncclComm_t comm, int *exclude, int nexclude, ncclComm_t *newcomm,
                                   ncclConfig_t *config, int flags) {
  if (!gs_comm_valid(comm)) return gs_fail(ncclInvalidArgument, "CommShrink : comm is not valid");
  if (!newcomm || !exclude || nexclude <= 0)
    return gs_fail(ncclInvalidArgument, "CommShrink : invalid arguments");
  gs_comm_enter(comm);
  ncclResult_t r = ncclSuccess;
  if (flags & NCCL_SHRINK_ABORT) {
    /* Kernels exit early; their end events then complete over data the
     * collective never finished (ncclCommShrink with NCCL_SHRINK_ABORT). */
    atomic_store(&comm->abort_flag, 1);
    gs_comm_wake(comm);
    gs_comm_drain(comm);
    atomic_store(&comm->abort_flag, 0);
  }
  qsort(exclude, (size_t)nexclude, sizeof(int), cmp_int);
  if (bsearch(&comm->rank, exclude, (size_t)nexclude, sizeof(int), cmp_int)) {
    r = gs_fail(ncclInvalidArgument, "CommShrink : rank %d is in its own exclude list", comm->rank);
    goto out;
  }
  r = gs_comm_ensure_ready(comm);
  if (r != ncclSuccess) goto out;
  *newcomm = NULL;
  child_job_t *j = calloc(1, sizeof(*j));
  int *ex = malloc(sizeof(int) * (size_t)nexclude);
  if (!j || !ex) {
    free(j);
    free(ex);
    r = gs_fail(ncclSystemError, "out of host memory");
    goto out;
  }
  memcpy(ex, exclude, sizeof(int) * (size_t)nexclude);
  j->shrink = 1;
  j->exclude = ex;
  j->nexclude = nexclude;
  j->newcomm = newcomm;
  r = start_child(comm, j, config);
out:
  gs_comm_leave(comm);
  return r;
}
