/*
 * proto.h - the store's wire protocol: constants, byte buffers and a bounds-
 * checked reader (internal). The format is documented in
 * docs/store-protocol.md; this header is its single source in code.
 *
 * Every message is a frame [u32 length][body]; `length` counts the body only.
 * A request body is [u8 op][payload], a reply body [u8 status][payload].
 * Integers are little-endian; "bytes" are [u32 n][n bytes].
 *
 * Thread safety: the helpers are pure; a buffer belongs to one thread at a time.
 */
#ifndef TDIST_STORE_PROTO_H
#define TDIST_STORE_PROTO_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "tdist/errors.h"
#include "tdist/store.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the store protocol code assumes a little-endian host"
#endif

#define TDIST__STORE_MAGIC 0x54445354u /* "TDST" */
#define TDIST__STORE_VERSION 1u
/* Largest frame body: one maximal value plus room for keys and headers. */
#define TDIST__STORE_MAX_FRAME (TDIST_STORE_MAX_VALUE + (1u << 20))
/* Most keys in one wait/check/multi_get/multi_set. */
#define TDIST__STORE_MAX_KEYS (1u << 16)
#define TDIST__STORE_MAX_TOKEN 1024
/* Largest frame before the handshake: a HELLO with a maximal token. */
#define TDIST__STORE_MAX_HELLO (1u + 4 + 4 + 4 + TDIST__STORE_MAX_TOKEN)

enum tdist__store_op {
  TDIST__OP_HELLO = 1,      /* u32 magic, u32 version, bytes token -> u32 version */
  TDIST__OP_SET = 2,        /* key, value -> - */
  TDIST__OP_GET = 3,        /* u64 timeout_ms, key -> value */
  TDIST__OP_ADD = 4,        /* key, i64 delta -> i64 */
  TDIST__OP_CAS = 5,        /* key, expected, desired -> current value */
  TDIST__OP_WAIT = 6,       /* u64 timeout_ms, u32 n, n keys -> - */
  TDIST__OP_CHECK = 7,      /* u32 n, n keys -> u8 all_exist */
  TDIST__OP_DELETE = 8,     /* key -> u8 deleted */
  TDIST__OP_NUM_KEYS = 9,   /* - -> i64 */
  TDIST__OP_MULTI_GET = 10, /* u64 timeout_ms, u32 n, n keys -> n values */
  TDIST__OP_MULTI_SET = 11, /* u32 n, n (key, value) -> - */
  TDIST__OP_APPEND = 12,    /* key, value -> - */
  TDIST__OP_MAX_
};

enum tdist__store_status {
  TDIST__ST_OK = 0,
  TDIST__ST_TIMEOUT = 1, /* u32 index of the first missing key */
  TDIST__ST_INVALID = 2, /* bytes message (e.g. add on a non-integer) */
  TDIST__ST_AUTH = 3,    /* token refused; the server closes */
  TDIST__ST_VERSION = 4, /* u32 server version; the server closes */
  TDIST__ST_FULL = 5,    /* bytes message: the server's memory budget refused it */
  TDIST__ST_BUSY = 6,    /* bytes message: no descriptor for this connection; sent
                            unasked as the first frame, then the server closes */
};

/* A growable byte buffer. Owner: whoever embeds it. */
typedef struct tdist__buf {
  uint8_t *p;
  size_t len, cap;
} tdist__buf_t;

int tdist__buf_reserve(tdist__buf_t *b, size_t extra); /* 0 or TDIST_ERR_NO_MEMORY */
void tdist__buf_free(tdist__buf_t *b);

/* Appenders: the caller reserved enough room (tdist__buf_reserve) first. */
static inline void tdist__put(tdist__buf_t *b, const void *p, size_t n) {
  if (n) memcpy(b->p + b->len, p, n);
  b->len += n;
}
static inline void tdist__put_u8(tdist__buf_t *b, uint8_t v) { b->p[b->len++] = v; }
static inline void tdist__put_u32(tdist__buf_t *b, uint32_t v) { tdist__put(b, &v, 4); }
static inline void tdist__put_u64(tdist__buf_t *b, uint64_t v) { tdist__put(b, &v, 8); }
static inline void tdist__put_bytes(tdist__buf_t *b, const void *p, uint32_t n) {
  tdist__put_u32(b, n);
  tdist__put(b, p, n);
}
/* Start a frame (length patched by tdist__frame_end); returns its offset. */
static inline size_t tdist__frame_begin(tdist__buf_t *b, uint8_t op_or_status) {
  size_t off = b->len;
  tdist__put_u32(b, 0);
  tdist__put_u8(b, op_or_status);
  return off;
}
static inline void tdist__frame_end(tdist__buf_t *b, size_t off) {
  uint32_t n = (uint32_t)(b->len - off - 4);
  memcpy(b->p + off, &n, 4);
}

/* A bounds-checked reader over one frame body. Every getter returns 0, or -1
 * (and leaves the reader unusable) when the body is too short. */
typedef struct tdist__rd {
  const uint8_t *p;
  size_t n, off;
} tdist__rd_t;

static inline int tdist__get(tdist__rd_t *r, void *out, size_t n) {
  if (r->n - r->off < n) {
    r->off = r->n;
    return -1;
  }
  memcpy(out, r->p + r->off, n);
  r->off += n;
  return 0;
}
static inline int tdist__get_u8(tdist__rd_t *r, uint8_t *v) { return tdist__get(r, v, 1); }
static inline int tdist__get_u32(tdist__rd_t *r, uint32_t *v) { return tdist__get(r, v, 4); }
static inline int tdist__get_u64(tdist__rd_t *r, uint64_t *v) { return tdist__get(r, v, 8); }
/* A length-prefixed byte string of at most `max` bytes, pointing into the body. */
static inline int tdist__get_bytes(tdist__rd_t *r, const uint8_t **p, uint32_t *n, uint32_t max) {
  uint32_t len;
  if (tdist__get_u32(r, &len) || len > max || r->n - r->off < len) {
    r->off = r->n;
    return -1;
  }
  *p = r->p + r->off;
  *n = len;
  r->off += len;
  return 0;
}
/* A key: 1..TDIST_STORE_MAX_KEY bytes. */
static inline int tdist__get_key(tdist__rd_t *r, const uint8_t **p, uint32_t *n) {
  if (tdist__get_bytes(r, p, n, TDIST_STORE_MAX_KEY) || *n == 0) return -1;
  return 0;
}

const char *tdist__store_op_name(int op);

#endif
