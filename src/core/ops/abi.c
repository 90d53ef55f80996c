/*
 * abi.c - the layout of the public structs and the values of the public
 * constants, as this library was compiled (tdist/abi.h), for bindings that
 * mirror them without a compiler (python/tdist/_lib.py checks every one at
 * import). Layer "ops" like the other public entry points; it reads only
 * the public headers and util's error reporting.
 *
 * Threads: any; the tables are constant.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "tdist/tdist.h"
#include "util/error.h"

struct field {
  const char *type, *name;
  size_t offset, size;
};

#define STRUCT(T) \
  { #T, NULL, 0, sizeof(T) }
#define FIELD(T, f) \
  { #T, #f, offsetof(T, f), sizeof(((T *)0)->f) }

static const struct field fields[] = {
    STRUCT(tdist_op_opts_t),
    FIELD(tdist_op_opts_t, mask),
    FIELD(tdist_op_opts_t, timeout_ms),
    FIELD(tdist_op_opts_t, premul_scalar),
    FIELD(tdist_op_opts_t, stream),
    FIELD(tdist_op_opts_t, tag),
    STRUCT(tdist_init_opts_t),
    FIELD(tdist_init_opts_t, mask),
    FIELD(tdist_init_opts_t, backend),
    FIELD(tdist_init_opts_t, init_method),
    FIELD(tdist_init_opts_t, rank),
    FIELD(tdist_init_opts_t, world_size),
    FIELD(tdist_init_opts_t, store),
    FIELD(tdist_init_opts_t, timeout_ms),
    FIELD(tdist_init_opts_t, device),
    FIELD(tdist_init_opts_t, name),
    FIELD(tdist_init_opts_t, host_store),
    FIELD(tdist_init_opts_t, nccl),
    STRUCT(tdist_group_opts_t),
    FIELD(tdist_group_opts_t, mask),
    FIELD(tdist_group_opts_t, timeout_ms),
    FIELD(tdist_group_opts_t, name),
    FIELD(tdist_group_opts_t, device),
    FIELD(tdist_group_opts_t, nccl),
    STRUCT(tdist_nccl_opts_t),
    FIELD(tdist_nccl_opts_t, mask),
    FIELD(tdist_nccl_opts_t, min_ctas),
    FIELD(tdist_nccl_opts_t, max_ctas),
    FIELD(tdist_nccl_opts_t, cga_cluster_size),
    FIELD(tdist_nccl_opts_t, net_name),
    FIELD(tdist_nccl_opts_t, split_share),
    FIELD(tdist_nccl_opts_t, traffic_class),
    FIELD(tdist_nccl_opts_t, high_priority),
    STRUCT(tdist_store_opts_t),
    FIELD(tdist_store_opts_t, mask),
    FIELD(tdist_store_opts_t, timeout_ms),
    FIELD(tdist_store_opts_t, token),
    STRUCT(tdist_store_server_opts_t),
    FIELD(tdist_store_server_opts_t, mask),
    FIELD(tdist_store_server_opts_t, host),
    FIELD(tdist_store_server_opts_t, port),
    FIELD(tdist_store_server_opts_t, token),
    FIELD(tdist_store_server_opts_t, backlog),
    STRUCT(tdist_p2p_op_t),
    FIELD(tdist_p2p_op_t, kind),
    FIELD(tdist_p2p_op_t, buf),
    FIELD(tdist_p2p_op_t, count),
    FIELD(tdist_p2p_op_t, dtype),
    FIELD(tdist_p2p_op_t, peer),
    FIELD(tdist_p2p_op_t, tag),
    STRUCT(tdist_notify_event_t),
    FIELD(tdist_notify_event_t, token),
    FIELD(tdist_notify_event_t, kind),
    FIELD(tdist_notify_event_t, status),
    FIELD(tdist_notify_event_t, reason_len),
};

int tdist_abi_field(const char *type, const char *field, size_t *offset, size_t *size) {
  if (!type) return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "tdist_abi_field: NULL type");
  for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
    const struct field *f = &fields[i];
    if (strcmp(f->type, type) != 0) continue;
    if (field ? (f->name && strcmp(f->name, field) == 0) : !f->name) {
      if (offset) *offset = f->offset;
      if (size) *size = f->size;
      return 0;
    }
  }
  return tdist__error(TDIST_ERR_NOT_FOUND, "tdist_abi_field: no %s%s%s in this library", type,
                      field ? "." : "", field ? field : "");
}

#define CONST(c) \
  { #c, (int64_t)(c) }
static const struct {
  const char *name;
  int64_t value;
} constants[] = {
    CONST(TDIST_OP_FIELD_TIMEOUT),
    CONST(TDIST_OP_FIELD_SCALAR),
    CONST(TDIST_OP_FIELD_STREAM),
    CONST(TDIST_OP_FIELD_TAG),
    CONST(TDIST_INIT_FIELD_BACKEND),
    CONST(TDIST_INIT_FIELD_INIT_METHOD),
    CONST(TDIST_INIT_FIELD_RANK),
    CONST(TDIST_INIT_FIELD_WORLD_SIZE),
    CONST(TDIST_INIT_FIELD_STORE),
    CONST(TDIST_INIT_FIELD_TIMEOUT),
    CONST(TDIST_INIT_FIELD_DEVICE),
    CONST(TDIST_INIT_FIELD_NAME),
    CONST(TDIST_INIT_FIELD_HOST_STORE),
    CONST(TDIST_INIT_FIELD_NCCL),
    CONST(TDIST_GROUP_FIELD_TIMEOUT),
    CONST(TDIST_GROUP_FIELD_NAME),
    CONST(TDIST_GROUP_FIELD_DEVICE),
    CONST(TDIST_GROUP_FIELD_NCCL),
    CONST(TDIST_NCCL_FIELD_MIN_CTAS),
    CONST(TDIST_NCCL_FIELD_MAX_CTAS),
    CONST(TDIST_NCCL_FIELD_CGA_CLUSTER_SIZE),
    CONST(TDIST_NCCL_FIELD_NET_NAME),
    CONST(TDIST_NCCL_FIELD_SPLIT_SHARE),
    CONST(TDIST_NCCL_FIELD_TRAFFIC_CLASS),
    CONST(TDIST_NCCL_FIELD_HIGH_PRIORITY),
    CONST(TDIST_MEM_REGISTER_LOCAL),
    CONST(TDIST_MEM_REGISTER_WINDOW),
    CONST(TDIST_STORE_SERVER_FIELD_HOST),
    CONST(TDIST_STORE_SERVER_FIELD_PORT),
    CONST(TDIST_STORE_SERVER_FIELD_TOKEN),
    CONST(TDIST_STORE_SERVER_FIELD_BACKLOG),
    CONST(TDIST_STORE_FIELD_TIMEOUT),
    CONST(TDIST_STORE_FIELD_TOKEN),
    CONST(TDIST_P2P_SEND),
    CONST(TDIST_P2P_RECV),
    CONST(TDIST_ANY_SOURCE),
    CONST(TDIST_ANY_TAG),
    CONST(TDIST_NOTIFY_WORK),
    CONST(TDIST_NOTIFY_ABORT),
    CONST(TDIST_NOTIFY_POST),
};

int tdist_abi_constant(const char *name, int64_t *value) {
  if (!name || !value)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "tdist_abi_constant: NULL %s",
                        name ? "value" : "name");
  for (size_t i = 0; i < sizeof(constants) / sizeof(constants[0]); i++)
    if (strcmp(constants[i].name, name) == 0) {
      *value = constants[i].value;
      return 0;
    }
  return tdist__error(TDIST_ERR_NOT_FOUND, "tdist_abi_constant: no %s in this library", name);
}
