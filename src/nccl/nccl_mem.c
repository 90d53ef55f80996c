/*
 * nccl_mem.c - user buffer registration on an NCCL group (tdist/mem.h):
 * ncclCommRegister / ncclCommDeregister (NCCL 2.19, local to the rank) and
 * ncclCommWindowRegister / ncclCommWindowDeregister (2.27, collective: a
 * symmetric window, NCCL_WIN_COLL_SYMMETRIC).
 *
 * Threads: caller threads only (the core's tdist_mem_register refuses the
 * progress thread). Every NCCL call here holds `call` (NCCL is not
 * thread-safe per communicator) with the group's device current. A window
 * is an NCCL group operation: on a non-blocking communicator it answers
 * ncclInProgress and finishes on NCCL's job thread, after a bootstrap
 * barrier with every rank (dev_runtime.cc ncclDevrWindowRegisterInGroup),
 * so it is waited for with tdist__nccl_wait_ready under the group's timeout,
 * giving up when the group is aborted. An NCCL failure there is the
 * communicator's error for good (ncclCommSetAsyncError): the group is failed
 * as a failed enqueue fails it, once `call` is released.
 *
 * Bookkeeping: each registration is a tdist__nccl_reg on nc->regs (`call`),
 * so destroy can release what the user left before ncclCommFinalize (NCCL
 * would free it in commReclaim; a window must be deregistered collectively
 * while every rank still runs) and the core's handle is this node.
 */
#include <stdio.h>
#include <string.h>

#include "nccl/nccl_backend.h"
#include "tdist/mem.h"
#include "util/alloc.h"

typedef struct tdist__nccl_reg {
  struct tdist__nccl_reg *next; /* (call) on nc->regs */
  void *handle;                 /* NCCL's: ncclCommRegister's handle or the ncclWindow_t */
  int window;
} tdist__nccl_reg_t;

/* The buffer must be device memory of the group's device (NCCL checks it
 * only with NCCL_CHECK_POINTERS=1, and then fails the call; a host pointer
 * registered unchecked fails later, inside a kernel). */
static int check_buffer(const tdist__nccl_t *nc, const void *ptr) {
  struct cudaPointerAttributes at;
  memset(&at, 0, sizeof(at));
  cudaError_t e = cudaPointerGetAttributes(&at, ptr);
  if (e != cudaSuccess) {
    cudaGetLastError(); /* older runtimes: cudaErrorInvalidValue for host memory */
    if (e != cudaErrorInvalidValue) return tdist__cuda_err(e, "cudaPointerGetAttributes");
    at.type = cudaMemoryTypeUnregistered;
  }
  if (at.type != cudaMemoryTypeDevice && at.type != cudaMemoryTypeManaged)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                        "tdist_mem_register on group '%s': %p is host memory; NCCL registers "
                        "CUDA device memory only",
                        nc->name, ptr);
  if (at.type == cudaMemoryTypeDevice && at.device != nc->device)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                        "tdist_mem_register on group '%s': %p is memory of device %d; the "
                        "group's communicator is on device %d",
                        nc->name, ptr, at.device, nc->device);
  return 0;
}

/* `call` held, device current: `r` (the registration call's answer), then
 * the communicator waited for until NCCL's job ended, whatever `r` said.
 * ncclSuccess does not mean done: 2.28's ncclCommWindowRegister queues its
 * task, runs ncclGroupEndInternal and returns its own ncclSuccess, not the
 * group end's ncclInProgress (dev_runtime.cc; the enqueue calls, unlike it,
 * return ncclCommGetAsyncError). On the H200 the next all_reduce then found
 * the job running ("Attempt to use communicator before the previous
 * operation returned ncclSuccess"). On a ready communicator the wait is one
 * ncclCommGetAsyncError. */
static int finish(tdist__nccl_t *nc, ncclResult_t r, const char *what) {
  if (r != ncclSuccess && r != ncclInProgress) return tdist__nccl_err(nc->comm, r, what);
  return tdist__nccl_wait_ready(nc->comm, nc->group, nc->name, what, nc->timeout_ms);
}

/* Fail the group with the message of rc (no lock held): NCCL's error on a
 * non-blocking communicator stays (its async error), so the group cannot
 * go on. */
static void fail_after(tdist__nccl_t *nc, int rc) {
  char msg[300];
  snprintf(msg, sizeof(msg), "%s", tdist_last_error());
  tdist__nccl_fail_group(nc, rc, "%s", msg);
  tdist__error(rc, "%s", msg);
}

int tdist__nccl_mem_register(void *state, void *ptr, size_t bytes, unsigned flags, void **handle) {
  tdist__nccl_t *nc = state;
  int window = flags == TDIST_MEM_REGISTER_WINDOW, rc = 0, failed = 0;
  tdist__nccl_reg_t *reg = NULL;
  tdist__nccl_dev_t dev = {0, 0};
  *handle = NULL;
  if (window) {
    TDIST_CHECK(
        TDIST__NCCL_NEED("tdist_mem_register (a symmetric window)", ncclCommWindowRegister, 2, 27));
    TDIST_CHECK(TDIST__NCCL_NEED("tdist_mem_register (a symmetric window)",
                                 ncclCommWindowDeregister, 2, 27));
  } else {
    TDIST_CHECK(TDIST__NCCL_NEED("tdist_mem_register", ncclCommRegister, 2, 19));
    TDIST_CHECK(TDIST__NCCL_NEED("tdist_mem_register", ncclCommDeregister, 2, 19));
  }
  TDIST_CHECK(check_buffer(nc, ptr));
  reg = tdist__calloc(1, sizeof(*reg));
  if (!reg) return tdist__error(TDIST_ERR_NO_MEMORY, "tdist_mem_register: out of memory");
  reg->window = window;
  TDIST_CHECKGOTO(tdist__nccl_dev_enter(nc->device, &dev), rc, out);
  if (tdist__nccl_call_enter(nc, "tdist_mem_register") != 0) {
    rc = tdist__error(TDIST_ERR_ABORTED, "tdist_mem_register: group '%s' was aborted", nc->name);
    goto out;
  }
  rc = tdist__nccl_settle_launch(nc);
  if (rc != 0 && rc != TDIST_ERR_ABORTED) failed = 1;
  if (rc == 0) {
    if (window) {
      ncclWindow_t win = NULL;
      ncclResult_t r = ncclCommWindowRegister(nc->comm, ptr, bytes, &win, NCCL_WIN_COLL_SYMMETRIC);
      rc = finish(nc, r, "ncclCommWindowRegister");
      reg->handle = win; /* written by NCCL's job, which wait_ready saw end */
    } else {
      ncclResult_t r = ncclCommRegister(nc->comm, ptr, bytes, &reg->handle);
      rc = finish(nc, r, "ncclCommRegister");
    }
    if (rc != 0 && rc != TDIST_ERR_ABORTED) failed = 1;
    if (rc == 0) {
      reg->next = nc->regs;
      nc->regs = reg;
    }
  }
  pthread_mutex_unlock(&nc->call);
  if (failed) fail_after(nc, rc);
out:
  tdist__nccl_dev_leave(&dev);
  if (rc != 0) {
    tdist__free(reg);
    return rc;
  }
  *handle = reg;
  return 0;
}

/* `call` held, device current: undo one registration (unlinked already). */
static int undo(tdist__nccl_t *nc, tdist__nccl_reg_t *reg) {
  if (reg->window)
    return finish(nc, ncclCommWindowDeregister(nc->comm, (ncclWindow_t)reg->handle),
                  "ncclCommWindowDeregister");
  return finish(nc, ncclCommDeregister(nc->comm, reg->handle), "ncclCommDeregister");
}

int tdist__nccl_mem_deregister(void *state, void *handle) {
  tdist__nccl_t *nc = state;
  tdist__nccl_reg_t *reg = handle, **pp;
  int rc = 0, failed = 0;
  tdist__nccl_dev_t dev = {0, 0};
  TDIST_CHECK(tdist__nccl_dev_enter(nc->device, &dev));
  if (tdist__nccl_call_enter(nc, "tdist_mem_deregister") != 0) {
    /* Aborted: ncclCommAbort released NCCL's side; only ours is left. */
    pthread_mutex_lock(&nc->call);
    for (pp = &nc->regs; *pp && *pp != reg; pp = &(*pp)->next)
      ;
    if (*pp) *pp = reg->next;
    pthread_mutex_unlock(&nc->call);
    tdist__free(reg);
    goto out;
  }
  for (pp = &nc->regs; *pp && *pp != reg; pp = &(*pp)->next)
    ;
  if (!*pp) {
    rc = tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                      "tdist_mem_deregister: the handle is not registered with group '%s'",
                      nc->name);
  } else {
    *pp = reg->next;
    rc = tdist__nccl_settle_launch(nc);
    if (rc == 0) rc = undo(nc, reg);
    if (rc != 0 && rc != TDIST_ERR_ABORTED) failed = 1;
    if (rc == TDIST_ERR_ABORTED) rc = 0; /* the abort released it */
    tdist__free(reg);
  }
  pthread_mutex_unlock(&nc->call);
  if (failed) fail_after(nc, rc);
out:
  tdist__nccl_dev_leave(&dev);
  return rc;
}

void tdist__nccl_mem_release_all(tdist__nccl_t *nc) {
  /* destroy holds `call` with the device current (comm live), or
   * state_free runs with comm gone: then only our nodes are left. */
  while (nc->regs) {
    tdist__nccl_reg_t *reg = nc->regs;
    nc->regs = reg->next;
    if (nc->comm) {
      TDIST_WARN(NCCL, "group '%s' destroyed with a %s still registered: deregistering it",
                 nc->name, reg->window ? "window" : "buffer");
      if (undo(nc, reg) != 0) TDIST_WARN(NCCL, "group '%s': %s", nc->name, tdist_last_error());
    }
    tdist__free(reg);
  }
}

/* ncclMemAlloc on the group's device (it allocates on the current one),
 * no `call` needed: it does not touch the communicator. */
int tdist__nccl_mem_alloc(void *state, size_t bytes, void **ptr) {
  tdist__nccl_t *nc = state;
  int rc = 0;
  tdist__nccl_dev_t dev = {0, 0};
  TDIST_CHECK(TDIST__NCCL_NEED("tdist_mem_alloc", ncclMemAlloc, 2, 19));
  TDIST_CHECK(TDIST__NCCL_NEED("tdist_mem_alloc", ncclMemFree, 2, 19));
  TDIST_CHECK(tdist__nccl_dev_enter(nc->device, &dev));
  NCCLCHECKGOTO(ncclMemAlloc(ptr, bytes), NULL, rc, out);
out:
  tdist__nccl_dev_leave(&dev);
  return rc;
}

int tdist__nccl_mem_free(void *state, void *ptr) {
  tdist__nccl_t *nc = state;
  int rc = 0;
  tdist__nccl_dev_t dev = {0, 0};
  TDIST_CHECK(TDIST__NCCL_NEED("tdist_mem_free", ncclMemFree, 2, 19));
  TDIST_CHECK(tdist__nccl_dev_enter(nc->device, &dev));
  NCCLCHECKGOTO(ncclMemFree(ptr), NULL, rc, out);
out:
  tdist__nccl_dev_leave(&dev);
  return rc;
}
