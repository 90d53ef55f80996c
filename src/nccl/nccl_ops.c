/*
 * nccl_ops.c - launching ops on the NCCL backend (caller thread).
 *
 * submit (tdist/backend.h) runs on the thread that called the op, after the
 * core validated it against the capabilities, holding the group's `call`
 * lock for every CUDA/NCCL call (nccl_backend.h):
 *
 *   caller stream:   ... user work ... [start_ev]
 *   internal stream:  wait(start_ev) -> NCCL kernel(s) -> [end event]
 *
 * so data produced on the caller's stream before the call is honoured, and
 * the end event marks completion. The end event comes from the group's pool
 * and is kept in op->scratch; the op goes on the state's FIFO (`inflight`,
 * under mu) in launch order, where the progress thread's poll finds it
 * (nccl_progress.c). post, on the progress thread, only marks it posted.
 *
 * Non-blocking communicators answer every enqueue with ncclInProgress (NCCL
 * 2.28 launches a non-blocking group from a job thread: group.cc); the op is
 * then being enqueued in the background -- the first op, or the first with a
 * new peer, also connects and waits for the peers -- and no other NCCL call
 * may be made on the communicator until ncclCommGetAsyncError says
 * ncclSuccess. The end event is recorded only after that, so it follows the
 * kernels. submit does not wait for it: the op is `launching` and whoever
 * holds `call` next records its end event (nccl_progress.c launch_done:
 * poll, a waiter's test, the next submit, wait_stream). So no submit sleeps,
 * and an enqueue that waits for a peer that never comes is an op in flight
 * like any other: its timeout's diagnosis names the rank, and the abort
 * (ncclCommAbort joins NCCL's job) stops it.
 *
 * The caller's current device is the group's only within submit
 * (tdist__nccl_dev_enter/leave), and every buffer must be memory of that
 * device. Float8 reductions below sm_90 are refused here, before NCCL
 * could make them the communicator's permanent error. An op on a stream
 * under CUDA graph capture is captured instead (nccl_capture.c): its NCCL
 * calls go into the caller's graph, and it never goes on the FIFO.
 */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "util/alloc.h"
#include "nccl/nccl_backend.h"
#include "util/clock.h"
#include "util/memkind.h"

int tdist__nccl_dtype(tdist_dtype_t dt, ncclDataType_t *out) {
  switch (dt) {
  case TDIST_INT8: *out = ncclInt8; return 0;
  case TDIST_UINT8: *out = ncclUint8; return 0;
  case TDIST_INT32: *out = ncclInt32; return 0;
  case TDIST_INT64: *out = ncclInt64; return 0;
  case TDIST_FLOAT16: *out = ncclFloat16; return 0;
  case TDIST_BFLOAT16: *out = ncclBfloat16; return 0;
  case TDIST_FLOAT32: *out = ncclFloat32; return 0;
  case TDIST_FLOAT64: *out = ncclFloat64; return 0;
  case TDIST_UINT32: *out = ncclUint32; return 0;
  case TDIST_UINT64: *out = ncclUint64; return 0;
  case TDIST_FLOAT8_E4M3: *out = ncclFloat8e4m3; return 0;
  case TDIST_FLOAT8_E5M2: *out = ncclFloat8e5m2; return 0;
  default: return -1; /* bool, int16, uint16: not in NCCL (caps refuse them) */
  }
}

int tdist__nccl_redop(tdist_redop_t op, ncclRedOp_t *out) {
  switch (op) {
  case TDIST_SUM: *out = ncclSum; return 0;
  case TDIST_PROD: *out = ncclProd; return 0;
  case TDIST_MIN: *out = ncclMin; return 0;
  case TDIST_MAX: *out = ncclMax; return 0;
  case TDIST_AVG: *out = ncclAvg; return 0;
  default: return -1; /* PREMUL_SUM is created per op; BAND/BOR/BXOR: none in NCCL */
  }
}

/* IEEE half and bfloat16 bits of a double, rounded to nearest even. */
static uint16_t to_half(double d) {
  float f = (float)d;
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  int32_t exp = (int32_t)((x >> 23) & 0xff) - 127 + 15;
  uint32_t man = x & 0x7fffffu;
  if (((x >> 23) & 0xff) == 0xff) return (uint16_t)(sign | 0x7c00u | (man ? 0x200u : 0));
  if (exp >= 31) return (uint16_t)(sign | 0x7c00u);
  if (exp <= 0) {
    if (exp < -10) return (uint16_t)sign;
    man |= 0x800000u;
    uint32_t shift = (uint32_t)(14 - exp);
    uint32_t h = man >> shift, rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1))) h++;
    return (uint16_t)(sign | h);
  }
  uint32_t h = ((uint32_t)exp << 10) | (man >> 13), rem = man & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) h++;
  return (uint16_t)(sign | h);
}

static uint16_t to_bf16(double d) {
  float f = (float)d;
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* NaN */
  x += 0x7fffu + ((x >> 16) & 1u);
  return (uint16_t)(x >> 16);
}

/* OCP float8 bits of a double, rounded to nearest even (the CPU backend's
 * src/cpu/fp8.c, which a backend may not call): E4M3 (3 mantissa bits, bias
 * 7) saturates at +-448 and has one NaN, 0x7f; E5M2 (2 bits, bias 15)
 * overflows to infinity, 0x7c. */
static uint8_t to_fp8(double d, int e4m3) {
  float f = (float)d;
  uint32_t x;
  memcpy(&x, &f, 4);
  int mb = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15;
  uint32_t sign = (x >> 24) & 0x80u, ax = x & 0x7fffffffu, top = e4m3 ? 0x7eu : 0x7cu, r;
  if (ax > 0x7f800000u) return (uint8_t)(sign | (e4m3 ? 0x7fu : 0x7eu)); /* NaN */
  int e = (int)(ax >> 23) - 127;
  if (ax >= 0x7f800000u) {
    r = top; /* infinity: E4M3 saturates, E5M2 keeps it */
  } else if ((ax >> 23) == 0) {
    r = 0;
  } else if (e >= 1 - bias) {
    int sh = 23 - mb;
    r = ((ax + (1u << (sh - 1)) - 1 + ((ax >> sh) & 1)) >> sh) - ((uint32_t)(127 - bias) << mb);
  } else {
    int sh = 24 - bias - mb - e; /* subnormal: m * 2^(1 - bias - mb) */
    uint32_t mf = (ax & 0x7fffffu) | 0x800000u;
    r = sh > 25 ? 0 : mf >> sh;
    if (sh <= 25) {
      uint32_t rem = mf & ((1u << sh) - 1), half = 1u << (sh - 1);
      if (rem > half || (rem == half && (r & 1))) r++;
    }
  }
  return (uint8_t)(sign | (r > top ? top : r));
}

/* s in [lo, hi] (NaN: 0), so the cast to an integer type is defined. */
static double clampd(double s, double lo, double hi) {
  return s != s ? 0 : s < lo ? lo : s > hi ? hi : s;
}

/* The PREMUL_SUM factor in the op's own type (NCCL reads it as datatype).
 * Integer types truncate and saturate. */
void tdist__nccl_premul_scalar(tdist_dtype_t dt, double s, void *out) {
  switch (dt) {
  case TDIST_INT8: *(int8_t *)out = (int8_t)clampd(s, INT8_MIN, INT8_MAX); break;
  case TDIST_UINT8: *(uint8_t *)out = (uint8_t)clampd(s, 0, UINT8_MAX); break;
  case TDIST_INT32: *(int32_t *)out = (int32_t)clampd(s, INT32_MIN, INT32_MAX); break;
  case TDIST_UINT32: *(uint32_t *)out = (uint32_t)clampd(s, 0, UINT32_MAX); break;
  /* 2^63 and 2^64 are not in range: the largest doubles below them are */
  case TDIST_INT64: *(int64_t *)out = (int64_t)clampd(s, -0x1p63, 0x1.fffffffffffffp62); break;
  case TDIST_UINT64: *(uint64_t *)out = (uint64_t)clampd(s, 0, 0x1.fffffffffffffp63); break;
  case TDIST_FLOAT8_E4M3: *(uint8_t *)out = to_fp8(s, 1); break;
  case TDIST_FLOAT8_E5M2: *(uint8_t *)out = to_fp8(s, 0); break;
  case TDIST_FLOAT16: *(uint16_t *)out = to_half(s); break;
  case TDIST_BFLOAT16: *(uint16_t *)out = to_bf16(s); break;
  case TDIST_FLOAT32: *(float *)out = (float)s; break;
  default: *(double *)out = s; break;
  }
}

/* The NCCL call(s) of one op on stream s (nc->stream, or a capture's fork
 * of the caller's stream: nccl_capture.c); `call` held. */
static ncclResult_t launch_calls(tdist__nccl_t *nc, const tdist_backend_args_t *a,
                                 ncclDataType_t dt, ncclRedOp_t op, cudaStream_t s) {
  ncclComm_t c = nc->comm;
  switch (a->type) {
  case TDIST_OP_ALL_REDUCE: return ncclAllReduce(a->sendbuf, a->recvbuf, a->count, dt, op, c, s);
  case TDIST_OP_BROADCAST:
    return ncclBroadcast(a->sendbuf, a->recvbuf, a->count, dt, a->root, c, s);
  case TDIST_OP_REDUCE: return ncclReduce(a->sendbuf, a->recvbuf, a->count, dt, op, a->root, c, s);
  case TDIST_OP_ALL_GATHER: return ncclAllGather(a->sendbuf, a->recvbuf, a->count, dt, c, s);
  case TDIST_OP_GATHER: return ncclGather(a->sendbuf, a->recvbuf, a->count, dt, a->root, c, s);
  case TDIST_OP_SCATTER: return ncclScatter(a->sendbuf, a->recvbuf, a->count, dt, a->root, c, s);
  case TDIST_OP_REDUCE_SCATTER:
    return ncclReduceScatter(a->sendbuf, a->recvbuf, a->count, dt, op, c, s);
  case TDIST_OP_ALL_TO_ALL: return ncclAlltoAll(a->sendbuf, a->recvbuf, a->count, dt, c, s);
  case TDIST_OP_BARRIER:
    /* A one-element all_reduce: completes only once every rank entered. */
    return ncclAllReduce(nc->scratch, nc->scratch, 1, ncclFloat32, ncclSum, c, s);
  /* On a pair's communicator (nccl_p2p.c) the peer is the pair's other rank. */
  case TDIST_OP_SEND:
    return ncclSend(a->sendbuf, a->count, dt, nc->owner ? 1 - nc->rank : a->root, c, s);
  case TDIST_OP_RECV:
    return ncclRecv(a->recvbuf, a->count, dt, nc->owner ? 1 - nc->rank : a->root, c, s);
  case TDIST_OP_BATCH_P2P: {
    /* One group: sends and receives of the batch progress together. */
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) return r;
    for (int i = 0; i < a->np2p && r == ncclSuccess; i++) {
      const tdist_p2p_op_t *p = &a->p2p[i];
      ncclDataType_t pdt = ncclFloat32;
      tdist__nccl_dtype(p->dtype, &pdt);
      r = p->kind == TDIST_P2P_SEND ? ncclSend(p->buf, p->count, pdt, p->peer, c, s)
                                    : ncclRecv(p->buf, p->count, pdt, p->peer, c, s);
    }
    ncclResult_t e = ncclGroupEnd(); /* always closes the group, even after an error */
    return r != ncclSuccess ? r : e;
  }
  default:
    /* the variable-size collectives: grouped calls (nccl_ops_v.c) */
    if (tdist_backend_op_is_v(a->type)) return tdist__nccl_launch_v(nc, a, dt, op, s);
    return ncclInvalidArgument;
  }
}

/* launch_calls inside an NCCL group of our own, even for a single call: the
 * group end then says what happened (in_callers_group below). A single
 * call's own answer cannot: on a non-blocking communicator NCCL replaces it
 * with ncclCommGetAsyncError's (enqueue.cc ncclEnqueueCheck), which is
 * ncclSuccess whenever the launch job already ended. */
ncclResult_t tdist__nccl_launch_on(tdist__nccl_t *nc, const tdist_backend_args_t *a,
                                   ncclDataType_t dt, ncclRedOp_t op, cudaStream_t s) {
  if (a->type == TDIST_OP_BATCH_P2P || tdist_backend_op_is_v(a->type))
    return launch_calls(nc, a, dt, op, s); /* grouped already */
  ncclResult_t r = ncclGroupStart();
  if (r != ncclSuccess) return r;
  r = launch_calls(nc, a, dt, op, s);
  ncclResult_t e = ncclGroupEnd(); /* always closes the group, even after an error */
  return r != ncclSuccess ? r : e;
}

/* The newer NCCL calls an op needs: 0, or the error naming the versions. */
static int check_available(tdist_optype_t t) {
  switch (t) {
  case TDIST_OP_GATHER: return TDIST__NCCL_NEED("gather", ncclGather, 2, 28);
  case TDIST_OP_SCATTER: return TDIST__NCCL_NEED("scatter", ncclScatter, 2, 28);
  case TDIST_OP_ALL_TO_ALL: return TDIST__NCCL_NEED("all_to_all", ncclAlltoAll, 2, 28);
  default: return 0;
  }
}

/* The classifier util/memkind.h asks (registered once CUDA is loaded): device
 * memory, as opposed to memory a CPU group can read directly. It runs on the
 * caller threads of CPU groups, so it makes no CUDA call: one would create a
 * context on the thread's current device (0 unless set: about 0.5 GiB on an
 * H100). Device memory is never readable by the CPU -- unified addressing
 * reserves its range without host access -- while managed and page-locked
 * host memory are; so one byte read from ourselves with process_vm_readv
 * tells them apart (EFAULT: not CPU memory). */
int tdist__nccl_memkind(const void *ptr) {
  char b;
  struct iovec l = {&b, 1}, r = {(void *)(uintptr_t)ptr, 1};
  if (process_vm_readv(getpid(), &l, 1, &r, 1, 0) == 1) return TDIST__MEMKIND_HOST;
  return errno == EFAULT ? TDIST__MEMKIND_DEVICE : TDIST__MEMKIND_HOST;
}

/* An NCCL group moves device memory: refuse a plain host pointer here, with
 * a message, rather than let the kernel fault. Managed and page-locked host
 * memory are device-accessible and pass. NULL (nothing to move) passes. */
static int check_device_ptr(const tdist__nccl_t *nc, const void *ptr, const char *what,
                            tdist_optype_t t) {
  struct cudaPointerAttributes at;
  if (!ptr) return 0;
  memset(&at, 0, sizeof(at));
  cudaError_t e = cudaPointerGetAttributes(&at, ptr);
  if (e != cudaSuccess) {
    /* Older runtimes answer cudaErrorInvalidValue for host memory. */
    cudaGetLastError();
    if (e != cudaErrorInvalidValue) return tdist__cuda_err(e, "cudaPointerGetAttributes");
    at.type = cudaMemoryTypeUnregistered;
  }
  if (at.type == cudaMemoryTypeUnregistered)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                        "backend 'nccl': %s of %s on group '%s' is host memory (%p); an NCCL "
                        "group needs CUDA device memory (use a CPU group for host buffers)",
                        what, tdist_op_name(t), nc->name, ptr);
  /* Another GPU's memory would fault in the kernel (no peer access) or
   * silently cross the bus: refuse it, as the group's device is fixed. */
  if (at.type == cudaMemoryTypeDevice && at.device != nc->device)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                        "backend 'nccl': %s of %s on group '%s' is memory of device %d (%p); the "
                        "group's communicator is on device %d",
                        what, tdist_op_name(t), nc->name, at.device, ptr, nc->device);
  return 0;
}

int tdist__nccl_check_ptr(const tdist__nccl_t *nc, const void *ptr, const char *what,
                          tdist_optype_t t) {
  return check_device_ptr(nc, ptr, what, t);
}

static int check_buffers(const tdist__nccl_t *nc, const tdist_backend_args_t *a) {
  if (a->type == TDIST_OP_BARRIER) return 0;
  if (tdist_backend_op_is_v(a->type)) return tdist__nccl_check_v(nc, a); /* nccl_ops_v.c */
  if (a->type == TDIST_OP_BATCH_P2P) {
    for (int i = 0; i < a->np2p; i++)
      if (a->p2p[i].count > 0)
        TDIST_CHECK(check_device_ptr(nc, a->p2p[i].buf, "a buffer", a->type));
    return 0;
  }
  if (a->count == 0) return 0;
  if (a->type != TDIST_OP_RECV) TDIST_CHECK(check_device_ptr(nc, a->sendbuf, "sendbuf", a->type));
  if (a->type != TDIST_OP_SEND && a->recvbuf != a->sendbuf)
    TDIST_CHECK(check_device_ptr(nc, a->recvbuf, "recvbuf", a->type));
  return 0;
}

/* The float8 types came with NCCL 2.24: with an older library, refuse them
 * here rather than let NCCL answer "invalid argument" (which would also put
 * a non-blocking communicator in error). NCCL itself still refuses float8
 * reductions on devices before sm_90, at the enqueue. */
static int check_fp8(const tdist_backend_args_t *a) {
  int n = a->type == TDIST_OP_BATCH_P2P ? a->np2p : 1;
  for (int i = 0; i < n; i++) {
    tdist_dtype_t dt = a->type == TDIST_OP_BATCH_P2P ? a->p2p[i].dtype : a->dtype;
    if (a->type == TDIST_OP_BARRIER || (dt != TDIST_FLOAT8_E4M3 && dt != TDIST_FLOAT8_E5M2) ||
        NC.version >= TDIST__NCCL_VERSION(2, 24, 0))
      continue;
    return tdist__error(TDIST_ERR_NOT_SUPPORTED,
                        "backend 'nccl': %s needs NCCL 2.24 or later; the library loaded is "
                        "NCCL %s",
                        tdist_dtype_name(dt), NC.version_str);
  }
  return 0;
}

/* NCCL refuses float8 reductions when any rank's device is older than
 * sm_90 (enqueue.cc taskAppend, comm->minCompCap), and on a non-blocking
 * communicator that refusal becomes its permanent error: the whole group
 * would be lost to one bad call. So refuse it here, from the smallest
 * compute capability of the group's devices (gathered at init). */
static int check_fp8_cc(const tdist__nccl_t *nc, const tdist_backend_args_t *a) {
  if (!tdist_backend_op_is_reducing(a->type) ||
      (a->dtype != TDIST_FLOAT8_E4M3 && a->dtype != TDIST_FLOAT8_E5M2))
    return 0;
  if (nc->min_cc >= 90) return 0;
  return tdist__error(TDIST_ERR_NOT_SUPPORTED,
                      "backend 'nccl': %s of %s on group '%s' needs compute capability 9.0 on "
                      "every rank's device (NCCL reduces float8 from sm_90 on); the oldest "
                      "device of the group is %d.%d",
                      tdist_op_name(a->type), tdist_dtype_name(a->dtype), nc->name, nc->min_cc / 10,
                      nc->min_cc % 10);
}

/* No lock held (the progress thread's abort and the abort thread take them):
 * fail the group for a doomed enqueue, and return once the group reads as
 * aborted, so the caller never sees its failed submit on a live group. */
static void fail_and_await(tdist__nccl_t *nc, int rc, const char *msg) {
  if (rc == TDIST_ERR_REMOTE_FAILED) {
    /* A peer gone, as NCCL saw it: the monitor usually names it within
     * milliseconds (its death record aborts the group with the name);
     * report it unnamed only after the grace, as poll does. */
    int64_t until = tdist__now_ns() + tdist__param_NcclRemoteGraceMs() * 1000000;
    while (!tdist_backend_aborted(nc->group) && tdist__now_ns() < until) {
      struct timespec ts = {0, 1000000};
      nanosleep(&ts, NULL);
    }
  }
  tdist__nccl_fail_group(nc, rc, "%s", msg);
  for (int i = 0; i < 20000 && !tdist_backend_aborted(nc->group); i++) {
    struct timespec ts = {0, 100000};
    nanosleep(&ts, NULL);
  }
}

/* Map the op's dtype and reduction (the core checked the capabilities;
 * these guard the mapping itself) and check what this NCCL can run. */
static int map_op(const tdist__nccl_t *nc, const tdist_backend_args_t *a, ncclDataType_t *dt,
                  ncclRedOp_t *rop) {
  if (a->type != TDIST_OP_BARRIER && a->type != TDIST_OP_BATCH_P2P &&
      tdist__nccl_dtype(a->dtype, dt) != 0)
    return tdist__error(TDIST_ERR_NOT_SUPPORTED, "nccl: dtype %s", tdist_dtype_name(a->dtype));
  if (tdist_backend_op_is_reducing(a->type) && a->redop != TDIST_PREMUL_SUM &&
      tdist__nccl_redop(a->redop, rop) != 0)
    return tdist__error(TDIST_ERR_NOT_SUPPORTED, "nccl: reduction %s", tdist_redop_name(a->redop));
  TDIST_CHECK(check_fp8(a));
  TDIST_CHECK(check_fp8_cc(nc, a));
  return check_available(a->type);
}

/* Does the op hand NCCL any work? (Empty collectives and blocks are
 * discarded by NCCL's taskAppend, so their enqueue launches nothing.) */
static int moves_data(const tdist__nccl_t *nc, const tdist_backend_args_t *a) {
  if (a->type == TDIST_OP_BARRIER || a->count > 0) return 1;
  if (a->type == TDIST_OP_BATCH_P2P) {
    for (int i = 0; i < a->np2p; i++)
      if (a->p2p[i].count > 0) return 1;
    return 0;
  }
  for (int j = 0; tdist_backend_op_is_v(a->type) && j < nc->size; j++)
    if ((a->scounts && a->scounts[j] > 0) || (a->rcounts && a->rcounts[j] > 0)) return 1;
  return 0;
}

/* ncclSuccess from our group end (launch) on a non-blocking communicator of
 * several ranks, for an op with work, means NCCL only queued it in an NCCL
 * group the calling thread has open (ncclGroupStart without its
 * ncclGroupEnd): from 2.28 on, a group end that launches work on such a
 * communicator always answers ncclInProgress (group.cc ncclGroupEndInternal:
 * the job thread), and one nested in an open group returns ncclSuccess
 * launching nothing. The op would then launch at the caller's ncclGroupEnd,
 * which tdist cannot see, and its end event would complete at once over
 * data never reduced. NCCL can neither take the op back nor say whether a
 * group is open, and refusing the op would leave it queued to run on the
 * caller's buffers later; so the caller's group is closed here (launching
 * what it held with our op), as torch's coalescing ends its own groups. */
static int in_callers_group(const tdist__nccl_t *nc, const tdist_backend_args_t *a) {
  return NC.version >= TDIST__NCCL_VERSION(2, 28, 0) && nc->size > 1 && moves_data(nc, a);
}

/* `call` held, the device current, no enqueue in progress: order the op
 * after the caller's stream, enqueue it on nc->stream and put it on the
 * FIFO; record its end event now if NCCL launched it inside the call, else
 * leave it `launching`. *doomed: the enqueue failed after it began (the
 * communicator may hold the error): the caller fails the group. */
static int enqueue_locked(tdist__nccl_t *nc, tdist_backend_op_t *op, ncclDataType_t dt,
                          ncclRedOp_t rop, int *doomed) {
  int rc = 0, premul = 0;
  tdist__nccl_op_t *no = tdist__nccl_op(op);
  const tdist_backend_args_t *a = op->args;
  cudaEvent_t end = NULL;
  pthread_mutex_lock(&nc->mu);
  rc = tdist__nccl_event_get(nc, &end);
  pthread_mutex_unlock(&nc->mu);
  if (rc != 0) return rc;
  if (no->start) {
    /* A pair's op that waited for its communicator (nccl_p2p.c): ordered
     * after what the caller's stream held at submit, recorded then. Once
     * the wait is enqueued the event may be recorded again (CUDA:
     * cudaStreamWaitEvent waits for the record current at the call). */
    cudaError_t e = cudaStreamWaitEvent(nc->stream, no->start, 0);
    pthread_mutex_lock(&nc->mu);
    tdist__nccl_event_put(nc, no->start);
    no->start = NULL;
    pthread_mutex_unlock(&nc->mu);
    CUDACHECKGOTO(e, rc, fail);
  } else {
    CUDACHECKGOTO(cudaEventRecord(nc->start_ev, (cudaStream_t)a->stream), rc, fail);
    CUDACHECKGOTO(cudaStreamWaitEvent(nc->stream, nc->start_ev, 0), rc, fail);
  }
  if (tdist_backend_op_is_reducing(a->type) && a->redop == TDIST_PREMUL_SUM) {
    /* Host-immediate scalar: read before the call returns. The handle may be
     * destroyed once the last call using it has returned and, on a
     * non-blocking communicator, its enqueue finished (launch_done). */
    _Alignas(8) unsigned char scalar[8] = {0};
    tdist__nccl_premul_scalar(a->dtype, a->scalar, scalar);
    NCCLCHECKGOTO(ncclRedOpCreatePreMulSum(&rop, scalar, dt, ncclScalarHostImmediate, nc->comm),
                  nc->comm, rc, fail);
    premul = 1;
  }
  ncclResult_t r = tdist__nccl_launch_on(nc, a, dt, rop, nc->stream);
  if (r != ncclSuccess && r != ncclInProgress) {
    rc = tdist__nccl_err(nc->comm, r, tdist_op_name(a->type));
    *doomed = 1; /* a non-blocking communicator keeps the error */
    premul = 0;  /* the communicator goes with it */
    goto fail;
  }
  if (r == ncclSuccess && in_callers_group(nc, a)) {
    int levels = 0;
    while (r == ncclSuccess && levels < 64) {
      r = ncclGroupEnd();
      levels++;
    }
    TDIST_WARN(NCCL,
               "%s on group '%s': the calling thread had an NCCL group open (ncclGroupStart "
               "without its ncclGroupEnd), in which NCCL only queued the op; tdist closed %d "
               "level%s of it to launch the op (with what the group held): your own "
               "ncclGroupEnd will now answer ncclInvalidUsage",
               tdist_op_name(a->type), nc->name, levels, levels > 1 ? "s" : "");
    if (r != ncclSuccess && r != ncclInProgress) {
      rc = tdist__nccl_err(nc->comm, r, "ncclGroupEnd (closing the caller's group)");
      *doomed = 1;
      premul = 0;
      goto fail;
    }
  }
  /* Launched or launching: on the FIFO in launch order, which is stream
   * order. */
  pthread_mutex_lock(&nc->mu);
  no->end = end;
  no->recorded = 0;
  tdist__list_push_back(&nc->inflight, &op->link);
  nc->launching = op;
  nc->launch_deadline_ns =
      tdist__now_ns() + (op->timeout_ms > 0 ? op->timeout_ms : 600000) * 1000000;
  pthread_mutex_unlock(&nc->mu);
  end = NULL;
  nc->premul = rop;
  nc->has_premul = premul;
  premul = 0;
  if (r == ncclInProgress) {
    /* NCCL's job thread launches it: usually within tens of µs. Poll for
     * that a little (yields, no sleep), so the common op leaves submit with
     * its end event recorded; past the spin it stays `launching`. */
    int64_t until = tdist__now_ns() + tdist__param_NcclLaunchSpinUs() * 1000;
    for (;;) {
      ncclResult_t st = ncclInProgress;
      if (ncclCommGetAsyncError(nc->comm, &st) != ncclSuccess || st != ncclInProgress) {
        if (st == ncclSuccess) r = ncclSuccess;
        break; /* an error: poll reports it, as for any op in flight */
      }
      if (tdist__now_ns() >= until) break;
      sched_yield();
    }
  }
  if (r == ncclSuccess) {
    /* Launched: inside the call (a blocking communicator, an NCCL that
     * launches inline) or by NCCL's job within the spin. Record the end
     * event now. */
    rc = tdist__nccl_launch_done(nc);
    if (rc != 0) {
      pthread_mutex_lock(&nc->mu);
      tdist__list_remove(&op->link);
      end = no->end;
      no->end = NULL;
      pthread_mutex_unlock(&nc->mu);
      *doomed = 1; /* the kernels are queued: only an abort stops them */
    }
  }
fail:
  if (premul) ncclRedOpDestroy(rop, nc->comm);
  if (end) {
    pthread_mutex_lock(&nc->mu);
    tdist__nccl_event_put(nc, end);
    pthread_mutex_unlock(&nc->mu);
  }
  return rc;
}

int tdist__nccl_is_pair_op(const tdist__nccl_t *nc, const tdist_backend_args_t *a) {
  return (a->type == TDIST_OP_SEND || a->type == TDIST_OP_RECV) && nc->owner == NULL &&
         nc->size > 1 && a->root != nc->rank;
}

int tdist__nccl_launch_pending(tdist__nccl_t *pc, tdist_backend_op_t *op, int *doomed) {
  ncclDataType_t dt = ncclFloat32;
  ncclRedOp_t rop = ncclSum;
  int rc = map_op(pc, op->args, &dt, &rop); /* checked at submit: cannot fail now */
  if (rc == 0) rc = tdist__nccl_settle_launch(pc);
  if (rc != 0 && rc != TDIST_ERR_ABORTED) *doomed = 1;
  if (rc == 0) rc = enqueue_locked(pc, op, dt, rop, doomed);
  return rc;
}

/* `call` of the pair pc held, the group's device current: if pc's
 * communicator is not made yet, queue op on pc's `pending` (launched by the
 * setup thread, in submit order) with a start event recorded on the
 * caller's stream now, and return 1; 0 when pc is ready (launch it now).
 * The caller never waits here for the peer (nccl_p2p.c). */
static int park_if_not_ready(tdist__nccl_t *pc, tdist_backend_op_t *op, int *rc) {
  tdist__nccl_op_t *no = tdist__nccl_op(op);
  cudaEvent_t ev = NULL;
  pthread_mutex_lock(&pc->mu);
  int ready = pc->ready;
  if (!ready) *rc = tdist__nccl_event_get(pc, &ev);
  pthread_mutex_unlock(&pc->mu);
  if (ready) return 0;
  if (*rc != 0) return 1;
  cudaError_t e = cudaEventRecord(ev, (cudaStream_t)op->args->stream);
  pthread_mutex_lock(&pc->mu);
  if (e != cudaSuccess || pc->dead) {
    /* Recording failed, or an abort came meanwhile: nobody would launch it. */
    *rc = e != cudaSuccess
              ? tdist__cuda_err(e, "cudaEventRecord")
              : tdist__error(TDIST_ERR_ABORTED, "nccl: %s: the group's communicators were aborted",
                             pc->name);
    tdist__nccl_event_put(pc, ev);
  } else {
    no->start = ev;
    no->pending = 1;
    tdist__list_push_back(&pc->pending, &op->link);
  }
  pthread_mutex_unlock(&pc->mu);
  return 1;
}

int tdist__nccl_submit(void *state, tdist_backend_op_t *op) {
  int rc = 0, doomed = 0;
  tdist__nccl_t *nc = state;
  tdist__nccl_op_t *no = tdist__nccl_op(op);
  const tdist_backend_args_t *a = op->args;
  ncclDataType_t dt = ncclFloat32;
  ncclRedOp_t rop = ncclSum;
  char msg[300];
  TDIST_CHECK(map_op(nc, a, &dt, &rop));

  tdist__nccl_dev_t dev;
  int capturing = 0; /* the caller's stream is capturing: nccl_capture.c */
  TDIST_CHECK(tdist__nccl_dev_enter(nc->device, &dev));
  rc = tdist__nccl_capture_check(nc, a, &capturing);
  if (rc == 0) rc = check_buffers(nc, a);
  if (rc != 0) {
    tdist__nccl_dev_leave(&dev);
    return rc;
  }
  /* Ours from here (backend.h: left as the handle's previous use had them). */
  tdist__list_init(&op->link);
  op->priv = NULL;
  no->end = NULL;
  no->posted = 0;
  no->completed = 0;
  no->recorded = 0;
  no->pending = 0;
  no->start = NULL;
  if (tdist__nccl_is_pair_op(nc, a)) {
    /* A send/recv to another rank: on the communicator of this direction
     * (this rank -> peer, or peer -> this rank: nccl_p2p.c), with its own
     * stream and FIFO, so separate isend and irecv to any peers in any
     * order cannot hold each other. */
    tdist__nccl_t *pc = NULL;
    rc = tdist__nccl_pair_get(nc, a->root, a->type == TDIST_OP_SEND, &pc);
    if (rc != 0) {
      tdist__nccl_dev_leave(&dev);
      return rc;
    }
    nc = pc;
    op->priv = pc;
  }
  rc = tdist__nccl_call_enter(nc, tdist_op_name(a->type));
  if (rc != 0) {
    tdist__nccl_dev_leave(&dev);
    return rc;
  }
  if (nc->owner && park_if_not_ready(nc, op, &rc)) {
    pthread_mutex_unlock(&nc->call);
    tdist__nccl_dev_leave(&dev);
    return rc;
  }
  /* The previous op's enqueue first: NCCL takes no call on a communicator
   * in progress. */
  rc = tdist__nccl_settle_launch(nc);
  if (rc != 0 && rc != TDIST_ERR_ABORTED) doomed = 1;
  if (rc == 0 && capturing)
    rc = tdist__nccl_capture_locked(nc, op, dt, rop, &doomed);
  else if (rc == 0)
    rc = enqueue_locked(nc, op, dt, rop, &doomed);
  pthread_mutex_unlock(&nc->call);
  tdist__nccl_dev_leave(&dev);
  if (doomed) {
    snprintf(msg, sizeof(msg), "%s on group '%s' could not be enqueued: %s", tdist_op_name(a->type),
             nc->name, tdist_last_error());
    TDIST_WARN(NCCL, "%s; aborting the communicator", msg);
    fail_and_await(nc, rc, msg);
    tdist__error(rc, "%s", msg); /* the message the caller reads */
  }
  return rc;
}
