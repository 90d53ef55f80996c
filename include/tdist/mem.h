/*
 * tdist/mem.h - registering user buffers with a group's backend.
 *
 * NCCL copies through intermediate buffers unless a user buffer is
 * registered with the communicator: then some algorithms (NVLS, CollNet,
 * the P2P copy engines, and from NCCL 2.27 the symmetric kernels) read and
 * write it directly. tdist_mem_register wraps ncclCommRegister (local) and
 * ncclCommWindowRegister (collective: a symmetric window). The handle is
 * tdist's, opaque; the buffer itself is used by the ops as any other: pass
 * its pointer (or a pointer inside it) to the collectives.
 *
 * Backends: "nccl" as above; "cpu" and plug-ins without registration answer
 * TDIST_ERR_NOT_SUPPORTED (host memory needs none).
 */
#ifndef TDIST_MEM_H
#define TDIST_MEM_H

#include <stddef.h>

#include "tdist/types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tdist_mem tdist_mem_t; /* opaque */

/* tdist_mem_register flags. */
enum {
  /* ncclCommRegister (NCCL 2.19): local to this rank, no other rank waits. */
  TDIST_MEM_REGISTER_LOCAL = 0,
  /* ncclCommWindowRegister with NCCL_WIN_COLL_SYMMETRIC (NCCL 2.27): a
   * symmetric window. Collective: every rank of the group registers its own
   * buffer of the same size, in the same order of calls, and waits for the
   * others (within the group's timeout). The buffer must start 4096-byte
   * aligned within its allocation (NCCL_WIN_REQUIRED_ALIGNMENT) and come
   * from NCCL's cuMem allocator: tdist_mem_alloc. */
  TDIST_MEM_REGISTER_WINDOW = 1,
};

/*
 * tdist_mem_register - register [ptr, ptr + bytes), device memory of the
 * group's device, with the group's communicator.
 * @param group  a group on a backend with registration (NCCL).
 * @param flags  TDIST_MEM_REGISTER_LOCAL or TDIST_MEM_REGISTER_WINDOW.
 * @param mem    out: the handle, for tdist_mem_deregister.
 * Registering the same buffer twice gives two handles, each to deregister
 * (NCCL counts the references). Thread: any caller thread (not a completion
 * or abort callback); a window is collective over the group.
 * @return 0; TDIST_ERR_INVALID_ARGUMENT for NULL, 0 bytes, unknown flags, or
 *         a buffer that is not device memory of the group's device;
 *         TDIST_ERR_NOT_SUPPORTED when the backend has no registration, or
 *         the loaded NCCL is too old (the message names the version needed:
 *         2.19 for local, 2.27 for a window); TDIST_ERR_NCCL_ERROR with
 *         NCCL's reason (e.g. a window not aligned); TDIST_ERR_TIMEOUT when
 *         a rank never joined a window; the group's abort status.
 */
int tdist_mem_register(tdist_group_t *group, void *ptr, size_t bytes, unsigned flags,
                       tdist_mem_t **mem);

/*
 * tdist_mem_deregister - undo tdist_mem_register and free the handle
 * (NULL: nothing). Ops that use the buffer must have finished. A window's
 * deregistration is collective over the group, as its registration.
 * Deregister before destroying the group. Thread: any caller thread.
 * @return 0; TDIST_ERR_INVALID_ARGUMENT for a handle of another group or a
 *         NULL group (the handle is then left as it was);
 *         TDIST_ERR_NCCL_ERROR with NCCL's reason (the handle is freed all
 *         the same: NCCL keeps nothing for it that a retry could release).
 */
int tdist_mem_deregister(tdist_group_t *group, tdist_mem_t *mem);

/*
 * tdist_mem_alloc - `bytes` of device memory on the group's device from the
 * backend's own allocator: NCCL's ncclMemAlloc (NCCL 2.19; cuMem memory,
 * rounded up to the allocation granularity), which a symmetric window
 * needs (cudaMalloc memory is refused by NCCL). Free it with
 * tdist_mem_free on the same group. Thread: any caller thread.
 * @return 0; TDIST_ERR_INVALID_ARGUMENT for NULL or 0 bytes;
 *         TDIST_ERR_NOT_SUPPORTED for a backend without one (CPU) or an
 *         NCCL older than 2.19; TDIST_ERR_NCCL_ERROR when NCCL fails.
 */
int tdist_mem_alloc(tdist_group_t *group, size_t bytes, void **ptr);
/* tdist_mem_free - release tdist_mem_alloc's memory (NULL: nothing). */
int tdist_mem_free(tdist_group_t *group, void *ptr);

#ifdef __cplusplus
}
#endif
#endif /* TDIST_MEM_H */
