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

/* Element types. Values are part of the ABI: new types are appended.
 *
 * Backends differ in what they carry (a type a backend lacks is refused at
 * submit with TDIST_ERR_NOT_SUPPORTED, never reduced wrongly):
 *   cpu    every type;
 *   nccl   every type but BOOL, INT16 and UINT16 (NCCL has none of them);
 *          the float8 types need NCCL 2.24 or later, and NCCL reduces them
 *          only on devices of compute capability 9.0 (sm_90) or later.
 *
 * FLOAT8_E4M3 and FLOAT8_E5M2 are the OCP 8-bit floats (torch's
 * float8_e4m3fn and float8_e5m2). E4M3: 4 exponent bits (bias 7), 3 mantissa
 * bits, no infinities, NaN = 0x7f / 0xff, largest finite 448. E5M2: IEEE-like
 * (bias 15, 2 mantissa bits) with infinities, largest finite 57344. The CPU
 * backend reduces float16, bfloat16 and both float8 types in float32: each
 * combination of two partial results is computed in float32 and rounded once
 * to the element type (round to nearest even). Rounding to E4M3 saturates
 * (magnitudes past 448, infinities included, become +-448); E5M2 overflows to
 * infinity as IEEE formats do.
 *
 * BOOL is one byte; any non-zero byte is true, and reductions write 0 or 1. */
typedef enum tdist_dtype {
  TDIST_INT8 = 0,
  TDIST_UINT8,
  TDIST_INT32,
  TDIST_INT64,
  TDIST_FLOAT16,
  TDIST_BFLOAT16,
  TDIST_FLOAT32,
  TDIST_FLOAT64,
  TDIST_UINT32,
  TDIST_UINT64,
  TDIST_FLOAT8_E4M3,
  TDIST_FLOAT8_E5M2,
  TDIST_BOOL,
  TDIST_INT16,
  TDIST_UINT16,
  TDIST_DTYPE_COUNT /* not a type */
} tdist_dtype_t;

/* Reductions. Values are part of the ABI: new ones are appended.
 *
 * SUM, PROD     integers wrap around (two's complement); floats as IEEE.
 * MIN, MAX      floats: NaN if any input is NaN (as torch.minimum/maximum);
 *               -0 is below +0 (MIN of -0 and +0 is -0, MAX is +0), so the
 *               result's bits do not depend on the order of the inputs.
 * AVG           SUM divided by the group size; integer types divide in 64 bits
 *               and truncate toward zero (the sum itself wraps in the type).
 * PREMUL_SUM    every input multiplied by tdist_op_opts_t.premul_scalar, then
 *               summed (integers: multiplied in double, truncated, saturated).
 * BAND, BOR, BXOR  bitwise and, or, xor: integer types and BOOL only; a float
 *               type is refused at submit with TDIST_ERR_INVALID_ARGUMENT (on
 *               every backend). The NCCL backend has none of the three:
 *               TDIST_ERR_NOT_SUPPORTED.
 * BOOL          SUM, MAX and BOR are logical or; PROD, MIN and BAND logical
 *               and; BXOR logical xor (odd number of true inputs). AVG and
 *               PREMUL_SUM of BOOL are refused with TDIST_ERR_INVALID_ARGUMENT.
 *
 * Every rank of an all_reduce gets the same bits, whatever the inputs (NaN,
 * -0): the CPU backend combines partial results in one order on all ranks. */
typedef enum tdist_redop {
  TDIST_SUM = 0,
  TDIST_PROD,
  TDIST_MIN,
  TDIST_MAX,
  TDIST_AVG,
  TDIST_PREMUL_SUM,
  TDIST_BAND,
  TDIST_BOR,
  TDIST_BXOR,
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
  /* variable-size collectives (tdist/ops.h, "v" ops) */
  TDIST_OP_ALL_TO_ALL_V,
  TDIST_OP_ALL_GATHER_V,
  TDIST_OP_REDUCE_SCATTER_V,
  TDIST_OP_GATHER_V,
  TDIST_OP_SCATTER_V,
  TDIST_OPTYPE_COUNT /* not an op */
} tdist_optype_t;

/* Size in bytes of one element; 0 for an invalid type. Any thread. */
size_t tdist_dtype_size(tdist_dtype_t dtype);
/* "float32", "bfloat16", "float8_e4m3", "bool", ...; "invalid" when out of
 * range. Static string. */
const char *tdist_dtype_name(tdist_dtype_t dtype);
/* "sum", "avg", "premul_sum", "band", ...; "invalid" when out of range. */
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
  int64_t timeout_ms;   /* overrides the group's timeout for this op; > 0. Like the group's,
                         * its expiry aborts the group (the op TIMEOUT, the group's other
                         * ops the abort's status, later ops refused) - for a barrier
                         * too; to stop waiting only, tdist_work_wait's timeout_ms */
  double premul_scalar; /* factor for TDIST_PREMUL_SUM (default 1.0) */
  void *stream;         /* NCCL backend: the caller's cudaStream_t whose prior
                           work the op waits for (default: the legacy stream) */
  int tag;              /* send/recv: message tag, >= 0 (default 0) */
} tdist_op_opts_t;

#ifdef __cplusplus
}
#endif
#endif /* TDIST_TYPES_H */
