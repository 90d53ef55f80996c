/*
 * tdist/abi.h - the layout of the public structs, for bindings.
 *
 * A binding that mirrors tdist's option structs through an FFI without a
 * compiler (ctypes, cffi in ABI mode, another language's FFI) asks the
 * library it loaded how those structs are laid out and what the constants
 * are, and refuses to run on any difference instead of corrupting memory.
 */
#ifndef TDIST_ABI_H
#define TDIST_ABI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * tdist_abi_field - the layout of a public struct or one of its fields.
 * @param type   the typedef name: "tdist_op_opts_t", "tdist_init_opts_t",
 *               "tdist_group_opts_t", "tdist_store_opts_t",
 *               "tdist_store_server_opts_t", "tdist_p2p_op_t",
 *               "tdist_notify_event_t";
 * @param field  a member name, or NULL for the whole struct;
 * @param offset out (may be NULL): offsetof, 0 for the whole struct;
 * @param size   out (may be NULL): sizeof the member or the struct.
 * @return 0; TDIST_ERR_NOT_FOUND for an unknown type or field;
 *         TDIST_ERR_INVALID_ARGUMENT for a NULL type. Any thread.
 */
int tdist_abi_field(const char *type, const char *field, size_t *offset, size_t *size);

/*
 * tdist_abi_constant - the value of a public constant by its C name
 * ("TDIST_OP_FIELD_TAG", "TDIST_ANY_SOURCE", "TDIST_P2P_RECV", ...: the
 * TDIST_*_FIELD_* bits, TDIST_P2P_*, TDIST_ANY_*, TDIST_NOTIFY_*).
 * @param name  the constant's C name;
 * @param value out: its value.
 * @return 0; TDIST_ERR_NOT_FOUND; TDIST_ERR_INVALID_ARGUMENT for NULL. Any
 *         thread.
 */
int tdist_abi_constant(const char *name, int64_t *value);

#ifdef __cplusplus
}
#endif
#endif /* TDIST_ABI_H */
