/*
 * tdist/types.h - handles, data types, reductions and option structs shared
 * by the whole API.
 *
 * Option structs grow: each starts with a `mask` of TDIST_*_FIELD_* bits that
 * says which fields the caller filled in. Fields whose bit is clear take their
 * default, so a program built against an older header keeps working when
 * fields are appended. Zero-initialise the struct ({0}) and set the bits of the
 * fields you fill in. A NULL options pointer means "all defaults".
 */
#ifndef TDIST_TYPES_H
#define TDIST_TYPES_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A process group: the world or a subgroup. Opaque; see tdist/group.h. */
typedef struct tdist_group tdist_group_t;
/* An asynchronous operation. Opaque; see tdist/work.h. */
typedef struct tdist_work tdist_work_t;
/* A key-value store client or prefix view. Opaque; see tdist/store.h. */
typedef struct tdist_store tdist_store_t;
/* A key-value store server. Opaque; see tdist/store.h. */
typedef struct tdist_store_server tdist_store_server_t;

/* Element types. float16 and bfloat16 are reduced in float32 by the CPU backend. */
typedef enum tdist_dtype {
  TDIST_INT8 = 0,
  TDIST_UINT8,
  TDIST_INT32,
  TDIST_INT64,
  TDIST_FLOAT16,
  TDIST_BFLOAT16,
  TDIST_FLOAT32,
  TDIST_FLOAT64,
  TDIST_DTYPE_COUNT /* not a type */
} tdist_dtype_t;

/* Reductions. AVG divides the sum by the group size (integer types truncate).
 * PREMUL_SUM multiplies every input by tdist_op_opts_t.premul_scalar, then sums. */
typedef enum tdist_redop {
  TDIST_SUM = 0,
  TDIST_PROD,
  TDIST_MIN,
  TDIST_MAX,
  TDIST_AVG,
  TDIST_PREMUL_SUM,
  TDIST_REDOP_COUNT /* not an op */
} tdist_redop_t;

/* Operation kinds, as recorded in work handles and traces. */
typedef enum tdist_optype {
  TDIST_OP_ALL_REDUCE = 0,
  TDIST_OP_BROADCAST,
  TDIST_OP_REDUCE,
  TDIST_OP_ALL_GATHER,
  TDIST_OP_GATHER,
  TDIST_OP_SCATTER,
  TDIST_OP_REDUCE_SCATTER,
  TDIST_OP_ALL_TO_ALL,
  TDIST_OP_BARRIER,
  TDIST_OP_SEND,
  TDIST_OP_RECV,
  TDIST_OP_BATCH_P2P,
  TDIST_OPTYPE_COUNT /* not an op */
} tdist_optype_t;

/* Size in bytes of one element; 0 for an invalid type. Any thread. */
size_t tdist_dtype_size(tdist_dtype_t dtype);
/* "float32", "bfloat16", ...; "invalid" when out of range. Static string. */
const char *tdist_dtype_name(tdist_dtype_t dtype);
/* "sum", "avg", "premul_sum", ...; "invalid" when out of range. */
const char *tdist_redop_name(tdist_redop_t op);
/* "all_reduce", "broadcast", ...; "invalid" when out of range. */
const char *tdist_op_name(tdist_optype_t op);

/* Per-operation options (all collectives and point-to-point calls). */
enum {
  TDIST_OP_FIELD_TIMEOUT = 1u << 0, /* timeout_ms */
  TDIST_OP_FIELD_SCALAR = 1u << 1,  /* premul_scalar */
  TDIST_OP_FIELD_STREAM = 1u << 2,  /* stream */
  TDIST_OP_FIELD_TAG = 1u << 3,     /* tag */
};
typedef struct tdist_op_opts {
  uint64_t mask;        /* TDIST_OP_FIELD_* bits of the fields set below */
  int64_t timeout_ms;   /* overrides the group's timeout for this op; > 0 */
  double premul_scalar; /* factor for TDIST_PREMUL_SUM (default 1.0) */
  void *stream;         /* NCCL backend: the caller's cudaStream_t whose prior
                           work the op waits for (default: the legacy stream) */
  int tag;              /* send/recv: message tag, >= 0 (default 0) */
} tdist_op_opts_t;

#ifdef __cplusplus
}
#endif
#endif /* TDIST_TYPES_H */
