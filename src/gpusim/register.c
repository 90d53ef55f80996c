/*
 * register.c - user buffer registration of the simulated NCCL:
 * ncclCommRegister / ncclCommDeregister (NCCL 2.19, src/register/register.cc)
 * and the symmetric windows ncclCommWindowRegister /
 * ncclCommWindowDeregister (2.27, src/dev_runtime.cc). The simulation's
 * collectives copy through shared memory whatever the registration, so
 * what is modelled is NCCL's bookkeeping and rules, which a caller can
 * observe:
 *   - ncclCommRegister is local and keeps a cache of page-aligned ranges
 *     (ncclRegister): a range inside one already registered takes another
 *     reference and returns the same handle; NCCL does not check the
 *     pointer unless NCCL_CHECK_POINTERS=1 (CudaPtrCheck: ncclInvalidArgument
 *     for memory that is not the communicator's device's);
 *   - ncclCommDeregister: a NULL handle is success; a handle not in the
 *     cache is ncclInvalidUsage ("Deregister: Could not find handle"); the
 *     range goes when its last reference does;
 *   - ncclCommWindowRegister: NULL or 0 bytes is success with no window;
 *     otherwise ncclCommEnsureReady, then a group task run at
 *     ncclGroupEnd -- on a non-blocking communicator the call itself
 *     returns ncclSuccess while its job runs (it returns its own result,
 *     not the group end's ncclInProgress: seen on the H200, NCCL 2.28.9);
 *     ncclCommGetAsyncError says ncclInProgress until the job wrote *win
 *     and ended, and a call that needs a ready communicator meanwhile is
 *     ncclInvalidArgument (ncclCommEnsureReady). The task
 *     (ncclDevrWindowRegisterInGroup) registers locally, finds the
 *     allocation (cuMemGetAddressRange: memory that is no device allocation
 *     is a CUDA error, ncclUnhandledCudaError), refuses a buffer whose offset
 *     in its allocation is not a multiple of NCCL_WIN_REQUIRED_ALIGNMENT
 *     (4096: "Window address must be suitably aligned.", ncclInvalidArgument)
 *     and ends with a bootstrap barrier over every rank: collective, so a
 *     rank that never registers leaves the others waiting until the
 *     communicator is aborted. Ranks registering windows of different sizes
 *     are counted as a mismatch (tdist_gpusim_mismatches): NCCL's symmetric
 *     offsets then disagree, which it does not check;
 *   - ncclCommWindowDeregister: NULL is success. An unknown window is
 *     ncclInvalidUsage here (NCCL would read through the bad pointer).
 * The window's memory must come from NCCL's cuMem allocator, ncclMemAlloc
 * (memory.c): cuMemRetainAllocationHandle fails for cudaMalloc memory, a
 * CUDA error (ncclUnhandledCudaError). Registrations are freed with the
 * communicator (commReclaim). Threads: caller threads and the job thread;
 * the list is guarded by the communicator's mu.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpusim/nccl_sim.h"

struct gs_reg {
  gs_reg_t *next;
  uintptr_t beg, end; /* page-aligned range (ncclReg begAddr/endAddr) */
  int refs;           /* localRefs */
  int window;         /* a window's own local registration */
  size_t size;        /* window: the user's size */
};

static uintptr_t page_size(void) {
  long p = sysconf(_SC_PAGESIZE);
  return p > 0 ? (uintptr_t)p : 4096;
}

/* ncclRegister: a covering range takes a reference, else a new one. */
static ncclResult_t do_register(ncclComm_t c, void *buff, size_t size, int window, gs_reg_t **out) {
  uintptr_t ps = page_size();
  uintptr_t beg = (uintptr_t)buff & ~(ps - 1);
  uintptr_t end = ((uintptr_t)buff + size + ps - 1) & ~(ps - 1);
  const char *check = getenv("NCCL_CHECK_POINTERS");
  if (check && atoi(check) == 1 && gs_ptr_device(buff) != c->dev)
    return gs_fail(ncclInvalidArgument,
                   "ncclCommRegister : buff argument %p is not a valid "
                   "device pointer of device %d",
                   buff, c->dev);
  pthread_mutex_lock(&c->mu);
  for (gs_reg_t *r = c->regs; r && !window; r = r->next)
    if (!r->window && r->beg <= beg && r->end >= end) {
      r->refs++;
      *out = r;
      pthread_mutex_unlock(&c->mu);
      return ncclSuccess;
    }
  gs_reg_t *r = calloc(1, sizeof(*r));
  if (r) {
    r->beg = beg;
    r->end = end;
    r->refs = 1;
    r->window = window;
    r->size = size;
    r->next = c->regs;
    c->regs = r;
  }
  pthread_mutex_unlock(&c->mu);
  if (!r) return gs_fail(ncclSystemError, "out of host memory for a registration");
  *out = r;
  return ncclSuccess;
}

/* Unlink and free r when its last reference goes; ncclInvalidUsage when r
 * is not one of c's (of that kind). */
static ncclResult_t do_deregister(ncclComm_t c, gs_reg_t *h, int window) {
  pthread_mutex_lock(&c->mu);
  gs_reg_t **pp = &c->regs;
  while (*pp && (*pp != h || (*pp)->window != window))
    pp = &(*pp)->next;
  if (!*pp) {
    pthread_mutex_unlock(&c->mu);
    return gs_fail(ncclInvalidUsage,
                   window ? "WindowDeregister: Could not find window %p"
                          : "Deregister: Could not find handle",
                   (void *)h);
  }
  if (--h->refs == 0) {
    *pp = h->next;
    free(h);
  }
  pthread_mutex_unlock(&c->mu);
  return ncclSuccess;
}

void gs_reg_free_all(ncclComm_t c) {
  pthread_mutex_lock(&c->mu);
  gs_reg_t *r = c->regs;
  c->regs = NULL;
  pthread_mutex_unlock(&c->mu);
  while (r) {
    gs_reg_t *n = r->next;
    free(r);
    r = n;
  }
}

GS_API ncclResult_t ncclCommRegister(const ncclComm_t comm, void *buff, size_t size,
                                     void **handle) {
  if (!gs_comm_acquire(comm))
    return gs_fail(ncclInvalidArgument, "ncclCommRegister : comm is not valid");
  ncclResult_t r = ncclInvalidArgument;
  if (handle) {
    gs_comm_enter(comm);
    gs_reg_t *h = NULL;
    r = do_register(comm, buff, size, 0, &h);
    if (r == ncclSuccess) *handle = h;
    gs_comm_leave(comm);
  }
  gs_comm_release(comm);
  return r;
}

GS_API ncclResult_t ncclCommDeregister(const ncclComm_t comm, void *handle) {
  if (!gs_comm_acquire(comm))
    return gs_fail(ncclInvalidArgument, "ncclCommRegister : comm is not valid");
  ncclResult_t r = ncclSuccess;
  if (handle) {
    gs_comm_enter(comm);
    r = do_deregister(comm, handle, 0);
    gs_comm_leave(comm);
  }
  gs_comm_release(comm);
  return r;
}

typedef struct win_job {
  void *ptr;
  size_t size;
  int flags;
  ncclWindow_t *out;
} win_job_t;

typedef struct win_boot {
  uint64_t size;
  int32_t flags;
} win_boot_t;

/* The group task (ncclDevrWindowRegisterInGroup), on the job thread of a
 * non-blocking communicator or the caller's. */
static ncclResult_t window_job(ncclComm_t c, void *arg) {
  win_job_t j = *(win_job_t *)arg;
  free(arg);
  uintptr_t base = 0;
  size_t asize = 0;
  int adev = -1, cumem = 0;
  if (gs_dev_alloc_range(j.ptr, &base, &asize, &adev, &cumem) != 0 || adev != c->dev)
    return gs_fail(ncclUnhandledCudaError,
                   "Cuda failure 'invalid argument' (cuMemGetAddressRange of %p: no allocation "
                   "of device %d)",
                   j.ptr, c->dev);
  if (((uintptr_t)j.ptr - base) % NCCL_WIN_REQUIRED_ALIGNMENT != 0)
    return gs_fail(ncclInvalidArgument, "Window address must be suitably aligned.");
  if (!cumem)
    return gs_fail(ncclUnhandledCudaError,
                   "Cuda failure 'invalid argument' (cuMemRetainAllocationHandle of %p: not a "
                   "cuMem allocation; allocate window memory with ncclMemAlloc)",
                   j.ptr);
  gs_reg_t *h = NULL;
  ncclResult_t r = do_register(c, j.ptr, j.size, 1, &h);
  if (r != ncclSuccess) return r;
  /* bootstrapBarrier(comm->bootstrap, ...): every rank registers. */
  unsigned char mine[GS_BOOT_BYTES] = {0};
  win_boot_t me = {j.size, j.flags};
  memcpy(mine, &me, sizeof(me));
  unsigned char *all = calloc((size_t)c->nranks, GS_BOOT_BYTES);
  if (!all) r = gs_fail(ncclSystemError, "out of host memory");
  if (r == ncclSuccess) r = gs_comm_allgather(c, mine, all);
  for (int i = 0; r == ncclSuccess && i < c->nranks; i++) {
    win_boot_t o;
    memcpy(&o, all + (size_t)i * GS_BOOT_BYTES, sizeof(o));
    if (o.size != me.size || o.flags != me.flags) {
      atomic_fetch_add(&gs_mismatches, 1);
      gs_warn("comm %p rank %d: window of %llu bytes (flags %d), rank %d's of %llu (flags %d): "
              "the symmetric windows disagree",
              (void *)c, c->rank, (unsigned long long)me.size, me.flags, i,
              (unsigned long long)o.size, o.flags);
      break;
    }
  }
  free(all);
  if (r != ncclSuccess) {
    do_deregister(c, h, 1);
    return r;
  }
  *j.out = (ncclWindow_t)h; /* the late write of *win */
  return ncclSuccess;
}

GS_API ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void *buff, size_t size,
                                           ncclWindow_t *win, int winFlags) {
  if (buff == NULL || size == 0) return ncclSuccess; /* dev_runtime.cc: goto exit */
  if (!gs_comm_valid(comm))
    return gs_fail(ncclInvalidArgument, "CommWindowRegister : comm is not valid");
  if (!win) return gs_fail(ncclInvalidArgument, "CommWindowRegister : win argument is NULL");
  gs_comm_enter(comm);
  ncclResult_t r = gs_comm_ensure_ready(comm);
  if (r == ncclSuccess) {
    win_job_t *j = malloc(sizeof(*j));
    if (!j) {
      r = gs_fail(ncclSystemError, "out of host memory");
    } else {
      j->ptr = buff;
      j->size = size;
      j->flags = winFlags;
      j->out = win;
      r = gs_comm_job(comm, window_job, j);
      if (r == ncclInProgress) r = ncclSuccess; /* dev_runtime.cc: `return ret` */
    }
  }
  gs_comm_leave(comm);
  return r;
}

GS_API ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  if (win == NULL) return ncclSuccess;
  if (!gs_comm_acquire(comm))
    return gs_fail(ncclInvalidArgument, "CommWindowDeregister : comm is not valid");
  gs_comm_enter(comm);
  ncclResult_t r = do_deregister(comm, (gs_reg_t *)win, 1);
  gs_comm_leave(comm);
  gs_comm_release(comm);
  return r;
}

long gs_reg_count(ncclComm_t c, int windows) {
  long n = 0;
  pthread_mutex_lock(&c->mu);
  for (gs_reg_t *r = c->regs; r; r = r->next)
    if (r->window == (windows != 0)) n += r->refs;
  pthread_mutex_unlock(&c->mu);
  return n;
}
