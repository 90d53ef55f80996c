/*
 * nccl_api.h - the part of the NCCL and CUDA runtime interfaces the NCCL
 * backend uses, declared by the project itself (internal to src/nccl/).
 *
 * libtdist has no link-time dependency on NCCL or the CUDA runtime: the
 * backend opens them with dlopen the first time a group asks for "nccl"
 * (nccl_lib.c) and calls them through the function table below. So neither
 * nccl.h nor cuda_runtime_api.h is needed to build the library; these
 * declarations follow the documented ABI of NCCL 2.28 and the CUDA runtime
 * (opaque handle types, enum values, the ncclConfig_t layout and what
 * NCCL_CONFIG_INITIALIZER puts in it). Only values the backend, its
 * tests' fake (tests/nccl/fake_nccl.c) and the simulated device
 * (src/gpusim/, which exports these names itself) need are listed.
 *
 * Version codes are NCCL's: major * 10000 + minor * 100 + patch for 2.9 and
 * later (ncclGetVersion returns 22809 for 2.28.9).
 */
#ifndef TDIST_NCCL_API_H
#define TDIST_NCCL_API_H

#include <limits.h>
#include <stddef.h>

/* ---- CUDA runtime ---------------------------------------------------------------- */

typedef struct CUstream_st *cudaStream_t; /* opaque */
typedef struct CUevent_st *cudaEvent_t;   /* opaque */

typedef enum cudaError_enum_tdist {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInitializationError = 3,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorInvalidMemcpyDirection = 21,
  cudaErrorInsufficientDriver = 35,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorIllegalState = 401,
  cudaErrorNotReady = 600,
  cudaErrorIllegalAddress = 700,
  cudaErrorLaunchFailure = 719,
  cudaErrorNotPermitted = 800,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
  cudaErrorStreamCaptureMerge = 902,
  cudaErrorStreamCaptureUnmatched = 903,
  cudaErrorStreamCaptureUnjoined = 904,
  cudaErrorStreamCaptureIsolation = 905,
  cudaErrorStreamCaptureImplicit = 906,
  cudaErrorCapturedEvent = 907,
  cudaErrorStreamCaptureWrongThread = 908,
  cudaErrorUnknown = 999,
} cudaError_t;

/* Special stream handles (driver_types.h). */
#define cudaStreamLegacy ((cudaStream_t)0x1)
#define cudaStreamPerThread ((cudaStream_t)0x2)

enum cudaStreamCaptureStatus {
  cudaStreamCaptureStatusNone = 0,
  cudaStreamCaptureStatusActive = 1,
  cudaStreamCaptureStatusInvalidated = 2
};
enum cudaStreamCaptureMode {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2
};
enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4
};
enum cudaDeviceAttr {
  cudaDevAttrMultiProcessorCount = 16,
  cudaDevAttrComputeCapabilityMajor = 75,
  cudaDevAttrComputeCapabilityMinor = 76
};
typedef struct CUgraph_st *cudaGraph_t;         /* opaque */
typedef struct CUgraphExec_st *cudaGraphExec_t; /* opaque */
typedef void (*cudaHostFn_t)(void *userData);
/* Graph user objects (CUDA 11.3+): a reference-counted destructor that a
 * graph can own (cudaUserObjectCreate, cudaGraphRetainUserObject). */
typedef struct CUuserObject_st *cudaUserObject_t; /* opaque */
typedef struct CUgraphNode_st *cudaGraphNode_t;   /* opaque */
enum cudaUserObjectFlags { cudaUserObjectNoDestructorSync = 0x1 };
enum cudaUserObjectRetainFlags { cudaGraphUserObjectMove = 0x1 };

enum {
  cudaStreamDefault = 0x00, /* cudaStreamCreateWithFlags */
  cudaStreamNonBlocking = 0x01,
  cudaEventDefault = 0x00, /* cudaEventCreateWithFlags */
  cudaEventBlockingSync = 0x01,
  cudaEventDisableTiming = 0x02,
  cudaEventInterprocess = 0x04
};

enum cudaMemoryType {
  cudaMemoryTypeUnregistered = 0, /* plain host memory */
  cudaMemoryTypeHost = 1,         /* page-locked host memory */
  cudaMemoryTypeDevice = 2,
  cudaMemoryTypeManaged = 3
};

/* cudaPointerGetAttributes' answer, as CUDA 11 and later lay it out. */
struct cudaPointerAttributes {
  enum cudaMemoryType type;
  int device;
  void *devicePointer;
  void *hostPointer;
  long reserved[8];
};

typedef const char *(*tdist__cudaGetErrorString_fn)(cudaError_t);
typedef const char *(*tdist__cudaGetErrorName_fn)(cudaError_t);
typedef cudaError_t (*tdist__cudaGetLastError_fn)(void);
typedef cudaError_t (*tdist__cudaGetDeviceCount_fn)(int *count);
typedef cudaError_t (*tdist__cudaSetDevice_fn)(int device);
typedef cudaError_t (*tdist__cudaPointerGetAttributes_fn)(struct cudaPointerAttributes *attr,
                                                          const void *ptr);
typedef cudaError_t (*tdist__cudaStreamCreateWithFlags_fn)(cudaStream_t *s, unsigned int flags);
typedef cudaError_t (*tdist__cudaStreamDestroy_fn)(cudaStream_t s);
typedef cudaError_t (*tdist__cudaEventCreateWithFlags_fn)(cudaEvent_t *ev, unsigned int flags);
typedef cudaError_t (*tdist__cudaEventDestroy_fn)(cudaEvent_t ev);
typedef cudaError_t (*tdist__cudaEventRecord_fn)(cudaEvent_t ev, cudaStream_t s);
typedef cudaError_t (*tdist__cudaEventQuery_fn)(cudaEvent_t ev);
typedef cudaError_t (*tdist__cudaStreamWaitEvent_fn)(cudaStream_t s, cudaEvent_t ev,
                                                     unsigned int flags);
typedef cudaError_t (*tdist__cudaMallocAsync_fn)(void **p, size_t n, cudaStream_t s);
typedef cudaError_t (*tdist__cudaFreeAsync_fn)(void *p, cudaStream_t s);
typedef cudaError_t (*tdist__cudaMemsetAsync_fn)(void *p, int v, size_t n, cudaStream_t s);
typedef cudaError_t (*tdist__cudaGetDevice_fn)(int *device);
typedef cudaError_t (*tdist__cudaLaunchHostFunc_fn)(cudaStream_t s, cudaHostFn_t fn, void *arg);
typedef cudaError_t (*tdist__cudaDeviceGetAttribute_fn)(int *value, enum cudaDeviceAttr attr,
                                                        int device);
typedef cudaError_t (*tdist__cudaStreamIsCapturing_fn)(cudaStream_t s,
                                                       enum cudaStreamCaptureStatus *status);
typedef cudaError_t (*tdist__cudaThreadExchangeStreamCaptureMode_fn)(
    enum cudaStreamCaptureMode *mode);
/* Stream priorities (CUDA 5.5 and later): lower numbers are greater
 * priorities; the range is [greatest, least], e.g. [-5, 0] on an H100. */
typedef cudaError_t (*tdist__cudaDeviceGetStreamPriorityRange_fn)(int *least, int *greatest);
typedef cudaError_t (*tdist__cudaStreamCreateWithPriority_fn)(cudaStream_t *s, unsigned int flags,
                                                              int priority);
/* Capture support (optional in the backend: nccl_capture.c). The CUDA 12
 * signature of cudaStreamGetCaptureInfo (also exported as
 * cudaStreamGetCaptureInfo_v2 from 11.3 to 12.x); CUDA 12.3 added _v3,
 * whose extra edgeData_out comes before numDependencies_out, and CUDA 13's
 * plain cudaStreamGetCaptureInfo is that one. */
typedef cudaError_t (*tdist__cudaStreamGetCaptureInfo_fn)(
    cudaStream_t s, enum cudaStreamCaptureStatus *status, unsigned long long *id,
    cudaGraph_t *graph, const cudaGraphNode_t **deps, size_t *ndeps);
typedef cudaError_t (*tdist__cudaStreamGetCaptureInfo_v3_fn)(
    cudaStream_t s, enum cudaStreamCaptureStatus *status, unsigned long long *id,
    cudaGraph_t *graph, const cudaGraphNode_t **deps, const void **edges, size_t *ndeps);
/* The runtime's version, 1000 * major + 10 * minor (13000 for 13.0). */
typedef cudaError_t (*tdist__cudaRuntimeGetVersion_fn)(int *version);
typedef cudaError_t (*tdist__cudaUserObjectCreate_fn)(cudaUserObject_t *obj, void *ptr,
                                                      cudaHostFn_t destroy, unsigned int refs,
                                                      unsigned int flags);
typedef cudaError_t (*tdist__cudaUserObjectRelease_fn)(cudaUserObject_t obj, unsigned int count);
typedef cudaError_t (*tdist__cudaGraphRetainUserObject_fn)(cudaGraph_t g, cudaUserObject_t obj,
                                                           unsigned int count, unsigned int flags);

/* ---- CUDA driver (libcuda.so.1): one optional call ---------------------------------- */
/* CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active):
 * whether the primary context of a device is active, without creating it
 * (what PyTorch's c10::cuda::hasPrimaryContext asks). CUdevice is the
 * ordinal; 0 is CUDA_SUCCESS. */
typedef int (*tdist__cuDevicePrimaryCtxGetState_fn)(int dev, unsigned int *flags, int *active);

/* ---- NCCL ------------------------------------------------------------------------ */

typedef struct ncclComm *ncclComm_t; /* opaque */

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
} ncclResult_t;

typedef enum {
  ncclInt8 = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclFloat32 = 7,
  ncclFloat64 = 8,
  ncclBfloat16 = 9,
  ncclFloat8e4m3 = 10, /* NCCL 2.24 and later; reductions need sm_90 */
  ncclFloat8e5m2 = 11,
} ncclDataType_t;

/* Built-in reductions; ncclRedOpCreatePreMulSum hands out other values. The
 * enum is int-sized, as NCCL's (its maximum is 0x7fffffff). */
typedef enum {
  ncclSum = 0,
  ncclProd = 1,
  ncclMax = 2,
  ncclMin = 3,
  ncclAvg = 4,
  ncclMaxRedOp_tdist = 0x7fffffff,
} ncclRedOp_t;

typedef enum { ncclScalarDevice = 0, ncclScalarHostImmediate = 1 } ncclScalarResidence_t;

#define NCCL_SPLIT_NOCOLOR (-1)
#define NCCL_SHRINK_DEFAULT 0x00 /* shrink a quiescent (e.g. revoked) parent */
#define NCCL_SHRINK_ABORT 0x01   /* terminate the parent's ongoing work first */
#define NCCL_REVOKE_DEFAULT 0x00

/* ncclConfig_t as NCCL 2.28 lays it out. NCCL reads `size`, `magic` and
 * `version` to know which layout the caller has; the fields the backend sets
 * (blocking, commName) sit where every release since 2.18 has them. Passing
 * this 2.28 layout to a 2.18-2.27 library is not tested on hardware yet. */
#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL
#define TDIST__NCCL_CONFIG_MAGIC 0xcafebeefu
#define TDIST__NCCL_VERSION(x, y, z) ((x)*10000 + (y)*100 + (z))

/* Field by field against NCCL 2.28.9's nccl.h.in (ncclConfig_v22800 order);
 * the release that added each, as parseCommConfig's version checks (init.cc)
 * and the headers' history tell: */
typedef struct {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;            /* 2.14 */
  int cgaClusterSize;      /* 2.17 (reset to the default for an older layout) */
  int minCTAs;             /* 2.17 */
  int maxCTAs;             /* 2.17 */
  const char *netName;     /* 2.17 */
  int splitShare;          /* 2.18 */
  int trafficClass;        /* 2.25 */
  const char *commName;    /* 2.27 (ignored by older releases) */
  int collnetEnable;       /* 2.27 */
  int CTAPolicy;           /* 2.27 */
  int shrinkShare;         /* 2.27 */
  int nvlsCTAs;            /* 2.27 */
  int nChannelsPerNetPeer; /* 2.28 */
  int nvlinkCentricSched;  /* 2.28 */
} ncclConfig_t;

/* What NCCL_CONFIG_INITIALIZER of NCCL 2.28 gives: the layout's size, the
 * magic, the layout's version, and every field undefined (NCCL's default). */
#define NCCL_CONFIG_INITIALIZER                                                    \
  {                                                                                \
    sizeof(ncclConfig_t), TDIST__NCCL_CONFIG_MAGIC, TDIST__NCCL_VERSION(2, 28, 0), \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,       \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_PTR, NCCL_CONFIG_UNDEF_INT,       \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_PTR, NCCL_CONFIG_UNDEF_INT,       \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,       \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT                               \
  }

typedef ncclResult_t (*tdist__ncclGetVersion_fn)(int *version);
typedef const char *(*tdist__ncclGetErrorString_fn)(ncclResult_t r);
typedef const char *(*tdist__ncclGetLastError_fn)(ncclComm_t comm);
typedef ncclResult_t (*tdist__ncclGetUniqueId_fn)(ncclUniqueId *id);
typedef ncclResult_t (*tdist__ncclCommInitRankConfig_fn)(ncclComm_t *comm, int nranks,
                                                         ncclUniqueId id, int rank,
                                                         ncclConfig_t *cfg);
typedef ncclResult_t (*tdist__ncclCommSplit_fn)(ncclComm_t comm, int color, int key,
                                                ncclComm_t *newcomm, ncclConfig_t *cfg);
typedef ncclResult_t (*tdist__ncclCommShrink_fn)(ncclComm_t comm, int *exclude, int nexclude,
                                                 ncclComm_t *newcomm, ncclConfig_t *cfg, int flags);
typedef ncclResult_t (*tdist__ncclCommRevoke_fn)(ncclComm_t comm, int flags);
typedef ncclResult_t (*tdist__ncclCommGetAsyncError_fn)(ncclComm_t comm, ncclResult_t *st);
typedef ncclResult_t (*tdist__ncclCommFinalize_fn)(ncclComm_t comm);
typedef ncclResult_t (*tdist__ncclCommDestroy_fn)(ncclComm_t comm);
typedef ncclResult_t (*tdist__ncclCommAbort_fn)(ncclComm_t comm);
typedef ncclResult_t (*tdist__ncclRedOpCreatePreMulSum_fn)(ncclRedOp_t *op, void *scalar,
                                                           ncclDataType_t dt,
                                                           ncclScalarResidence_t res,
                                                           ncclComm_t comm);
typedef ncclResult_t (*tdist__ncclRedOpDestroy_fn)(ncclRedOp_t op, ncclComm_t comm);
typedef ncclResult_t (*tdist__ncclGroupStart_fn)(void);
typedef ncclResult_t (*tdist__ncclGroupEnd_fn)(void);
typedef ncclResult_t (*tdist__ncclAllReduce_fn)(const void *sb, void *rb, size_t n,
                                                ncclDataType_t dt, ncclRedOp_t op, ncclComm_t c,
                                                cudaStream_t s);
typedef ncclResult_t (*tdist__ncclBroadcast_fn)(const void *sb, void *rb, size_t n,
                                                ncclDataType_t dt, int root, ncclComm_t c,
                                                cudaStream_t s);
typedef ncclResult_t (*tdist__ncclReduce_fn)(const void *sb, void *rb, size_t n, ncclDataType_t dt,
                                             ncclRedOp_t op, int root, ncclComm_t c,
                                             cudaStream_t s);
typedef ncclResult_t (*tdist__ncclAllGather_fn)(const void *sb, void *rb, size_t n,
                                                ncclDataType_t dt, ncclComm_t c, cudaStream_t s);
typedef ncclResult_t (*tdist__ncclReduceScatter_fn)(const void *sb, void *rb, size_t n,
                                                    ncclDataType_t dt, ncclRedOp_t op, ncclComm_t c,
                                                    cudaStream_t s);
typedef ncclResult_t (*tdist__ncclAlltoAll_fn)(const void *sb, void *rb, size_t n,
                                               ncclDataType_t dt, ncclComm_t c, cudaStream_t s);
typedef ncclResult_t (*tdist__ncclGather_fn)(const void *sb, void *rb, size_t n, ncclDataType_t dt,
                                             int root, ncclComm_t c, cudaStream_t s);
typedef ncclResult_t (*tdist__ncclScatter_fn)(const void *sb, void *rb, size_t n, ncclDataType_t dt,
                                              int root, ncclComm_t c, cudaStream_t s);
/* Scalable init (NCCL 2.23): nId unique ids, one per bootstrap root. */
typedef ncclResult_t (*tdist__ncclCommInitRankScalable_fn)(ncclComm_t *comm, int nranks, int rank,
                                                           int nId, ncclUniqueId *ids,
                                                           ncclConfig_t *cfg);
/* User buffer registration (2.19) and symmetric windows (2.27). */
typedef struct ncclWindow_vidmem *ncclWindow_t; /* opaque */
#define NCCL_WIN_DEFAULT 0x00
#define NCCL_WIN_COLL_SYMMETRIC 0x01
#define NCCL_WIN_REQUIRED_ALIGNMENT 4096
typedef ncclResult_t (*tdist__ncclCommRegister_fn)(const ncclComm_t comm, void *buff, size_t size,
                                                   void **handle);
typedef ncclResult_t (*tdist__ncclCommDeregister_fn)(const ncclComm_t comm, void *handle);
typedef ncclResult_t (*tdist__ncclCommWindowRegister_fn)(ncclComm_t comm, void *buff, size_t size,
                                                         ncclWindow_t *win, int winFlags);
typedef ncclResult_t (*tdist__ncclCommWindowDeregister_fn)(ncclComm_t comm, ncclWindow_t win);
/* NCCL's cuMem allocator (2.19): the memory windows need. */
typedef ncclResult_t (*tdist__ncclMemAlloc_fn)(void **ptr, size_t size);
typedef ncclResult_t (*tdist__ncclMemFree_fn)(void *ptr);
typedef ncclResult_t (*tdist__ncclSend_fn)(const void *b, size_t n, ncclDataType_t dt, int peer,
                                           ncclComm_t c, cudaStream_t s);
typedef ncclResult_t (*tdist__ncclRecv_fn)(void *b, size_t n, ncclDataType_t dt, int peer,
                                           ncclComm_t c, cudaStream_t s);

#endif
