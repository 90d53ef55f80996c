/*
 * kv.h - the store's data and the meaning of every request (internal).
 *
 * tdist__kv_t is a chained hash table of keys. tdist__kv_exec() runs one
 * request body (docs/store-protocol.md) against it and appends the reply
 * frame. The TCP server (server.c) and the file store (file.c) both use it,
 * so the two stores cannot drift apart in semantics.
 *
 * Waiting: a get/wait/multi_get whose keys are missing returns
 * TDIST__EXEC_BLOCKED. If the caller gave an on_missing hook, a placeholder
 * entry (present = 0) is made for the first missing key and handed to the
 * hook, which links a waiter to it; kv->on_write later reports each write so
 * the server can wake exactly that waiter. The caller re-runs the request
 * when woken, passing back the resume position the blocked run left in the
 * tdist__exec_t (the request goes on from the key it waited on, so waiting
 * costs O(keys) in all: exec_waiting in kv.c), and once more with `final`
 * set at its deadline, which answers TDIST__ST_TIMEOUT instead of blocking.
 *
 * Thread safety: none; one thread owns a table (the server's loop thread, or
 * a file-store call holding the file lock).
 */
#ifndef TDIST_STORE_KV_H
#define TDIST_STORE_KV_H

#include "store/proto.h"

struct tdist__kv_entry;

/* A value block that replies in flight hold (zero-copy GET, tdist__kv_ref_t):
 * while it is pinned the table never writes into it nor frees it. A write
 * to its key puts the new value in a fresh block and lets go of this one
 * (e = NULL, its bytes move from kv->bytes to kv->held); the last unpin
 * frees it then. Owned by the table's thread. */
typedef struct tdist__kv_pin {
  struct tdist__kv_entry *e; /* the entry whose value it is; NULL once it let go */
  uint8_t *base;             /* the allocation (val - voff) */
  uint64_t bytes;            /* what it costs the budget (vcap + voff) */
  uint32_t refs;             /* replies holding it */
} tdist__kv_pin_t;

/* The value of a zero-copy reply (tdist__exec_t.ref): the reply frame's head
 * ends at byte `at` of the caller's out buffer, and the frame goes on with
 * len bytes at p, which stay valid and unchanged until tdist__kv_unpin(pin). */
typedef struct tdist__kv_ref {
  tdist__kv_pin_t *pin; /* NULL: no zero-copy reply in this buffer */
  const uint8_t *p;
  uint32_t len;
  size_t at;
} tdist__kv_ref_t;

typedef struct tdist__kv_entry {
  struct tdist__kv_entry *next; /* hash chain */
  uint64_t hash;
  uint8_t *val; /* owned; NULL while empty */
  uint32_t vlen, vcap;
  /* val's offset in its allocation (whose base, val - voff, is what is
   * freed): 0, except for a value taken over with the request's read buffer
   * (tdist__exec_t.take), which starts past the frame's head. The entry's
   * value costs vcap + voff bytes (kv->bytes). */
  uint32_t voff;
  tdist__kv_pin_t *pin; /* non-NULL while replies in flight hold the value */
  int present;          /* 0: placeholder kept alive by waiters */
  void *waiters;        /* server: head of this key's waiter list */
  uint32_t klen;
  char key[]; /* klen bytes + NUL */
} tdist__kv_entry_t;

/* Spare blocks kept at most, and the least size kept (kv->spare). */
#define TDIST__KV_SPARES 2
#define TDIST__KV_SPARE_MIN ((uint64_t)1 << 20)

typedef struct tdist__kv {
  tdist__kv_entry_t **buckets;
  size_t mask;      /* number of buckets - 1 */
  size_t nentries;  /* including placeholders */
  int64_t npresent; /* keys that exist */
  uint64_t version; /* bumped by every write (the file store's dirty check) */
  uint64_t bytes;   /* allocated for entries, keys, values and buckets (the budget) */
  uint64_t held;    /* values the table let go that replies still hold (the budget) */
  /* Spare blocks (the server's, keep_spares): large value blocks the table
   * let go, kept for the next frame of the same size (tdist__kv_spare_take)
   * so that its pages need not be faulted in again; counted in the budget
   * (spare_bytes) and given back when idle or when the budget needs them. */
  int keep_spares;
  struct {
    uint8_t *base;
    uint64_t bytes;
  } spare[TDIST__KV_SPARES];
  uint64_t spare_bytes;
  int spare_taken; /* a spare was taken since the last trim */
  void (*on_write)(void *ctx, tdist__kv_entry_t *e);
  void *ctx;
} tdist__kv_t;

enum {
  TDIST__EXEC_DONE = 0,
  TDIST__EXEC_BLOCKED = 1,
  TDIST__EXEC_BAD = -1,
  TDIST__EXEC_NOMEM = -2
};

typedef struct tdist__exec {
  /* in */
  int final; /* the deadline passed: reply TIMEOUT rather than block */
  int (*on_missing)(void *ctx, tdist__kv_entry_t *e); /* 0 or -1 (no memory) */
  /* Optional memory budget (the server's): asked before a request adds
   * `store` bytes to the table (kv->bytes) or appends a `reply`-byte frame;
   * NULL admits it, a message refuses it: the request is answered
   * TDIST__ST_FULL with that message and changes nothing. */
  const char *(*admit)(void *ctx, uint64_t store, uint64_t reply);
  void *ctx;
  /* Optional: the body is the whole tail of a heap block of take_cap bytes
   * (tdist__malloc) at *take, which the caller gives up for a SET of at
   * least TDIST__KV_TAKE_MIN bytes: the value stays where it arrived and the
   * entry owns the block (no copy of a large value). kv sets *take to NULL
   * when it took it. */
  uint8_t **take;
  size_t take_cap;
  /* Optional zero-copy reply: when ref is given and ref->pin is NULL, a GET
   * (or a multi_get of one key) of a value of at least TDIST__KV_REF_MIN
   * bytes appends only its frame's head to out and pins the value into *ref
   * (tdist__kv_ref_t); the caller sends the value after that head and
   * unpins it once the kernel took it. Otherwise values are copied. */
  tdist__kv_ref_t *ref;
  /* in/out: where a blocked get/wait/multi_get goes on. A BLOCKED run with
   * on_missing sets them (resume = 1, the index of the key it waits on and
   * its byte offset in the body); the caller passes them back unchanged
   * when it re-runs the same body, and zeroes them for another request.
   * Ignored with `final`. */
  int resume;
  uint32_t resume_idx;
  size_t resume_off;
  /* out */
  uint64_t timeout_ms; /* of a blocked request */
  const char *why;     /* what was malformed (TDIST__EXEC_BAD) */
} tdist__exec_t;

/* A SET value at least this large is taken over rather than copied (take). */
#define TDIST__KV_TAKE_MIN (64u * 1024)
/* A GET value at least this large is sent from where it is stored (ref). */
#define TDIST__KV_REF_MIN (64u * 1024)

int tdist__kv_init(tdist__kv_t *kv);
void tdist__kv_destroy(tdist__kv_t *kv);
tdist__kv_entry_t *tdist__kv_find(tdist__kv_t *kv, const void *key, uint32_t klen);
/* Store a present key with a value (file-store loading). 0 or -1. */
int tdist__kv_load(tdist__kv_t *kv, const void *key, uint32_t klen, const void *v, uint32_t vlen);
/* A reply let go of the value it pinned (tdist__exec_t.ref): the last one
 * frees a block that the table no longer holds. */
void tdist__kv_unpin(tdist__kv_t *kv, tdist__kv_pin_t *pin);
/* A spare block of exactly `bytes` bytes (the caller owns it), or NULL. */
uint8_t *tdist__kv_spare_take(tdist__kv_t *kv, uint64_t bytes);
/* Free every spare block (idle, or the budget needs the room); when
 * `if_unused`, only if none was taken since the last call. */
void tdist__kv_spare_trim(tdist__kv_t *kv, int if_unused);
/* Free a placeholder that nobody waits on any more. */
void tdist__kv_drop_if_unused(tdist__kv_t *kv, tdist__kv_entry_t *e);

/* Run one request body (op byte + payload, not HELLO); append the reply frame
 * to `out` unless BLOCKED or BAD. */
int tdist__kv_exec(tdist__kv_t *kv, const uint8_t *body, size_t n, tdist__buf_t *out,
                   tdist__exec_t *x);

#endif
