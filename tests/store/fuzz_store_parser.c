/*
 * fuzz_store_parser.c - libFuzzer target over the store server's message
 * handling: the input is a byte stream cut into frames exactly as the server
 * does ([u32 len][body], len bounded), and every body runs through
 * tdist__kv_exec against one table that persists across frames, with waiter
 * registration, a resumed re-run and timeout re-runs exercised as on the
 * server. Built with
 * -DTDIST_BUILD_FUZZ=ON and clang.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "util/alloc.h"
#include "store/kv.h"

typedef struct {
  tdist__kv_entry_t *e[64];
  int n;
} waits_t;

static int on_missing(void *ctx, tdist__kv_entry_t *e) {
  waits_t *w = ctx;
  if (w->n == 64) return -1;
  /* a marker in e->waiters keeps the placeholder alive, as a server waiter does */
  e->waiters = w;
  w->e[w->n++] = e;
  return 0;
}

static void unwait(tdist__kv_t *kv, waits_t *w) {
  for (int i = 0; i < w->n; i++)
    w->e[i]->waiters = NULL;
  for (int i = 0; i < w->n; i++) {
    /* an entry may appear twice (duplicate keys): drop each once */
    int seen = 0;
    for (int j = 0; j < i; j++)
      seen |= w->e[j] == w->e[i];
    if (!seen) tdist__kv_drop_if_unused(kv, w->e[i]);
  }
  w->n = 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  tdist__kv_t kv;
  tdist__buf_t out = {0};
  if (tdist__kv_init(&kv)) return 0;
  size_t off = 0;
  while (size - off >= 4) {
    uint32_t len;
    memcpy(&len, data + off, 4);
    if (len == 0 || len > TDIST__STORE_MAX_FRAME) break; /* the server closes here */
    if (size - off - 4 < len) break;                     /* half message: wait for more */
    const uint8_t *body = data + off + 4;
    waits_t w = {.n = 0};
    tdist__exec_t x = {.on_missing = on_missing, .ctx = &w};
    out.len = 0;
    int rc = tdist__kv_exec(&kv, body, len, &out, &x);
    if (rc == TDIST__EXEC_BLOCKED) {
      /* one waiter per parked request (kv.c exec_waiting) */
      if (w.n != 1 || !x.resume) __builtin_trap();
      unwait(&kv, &w);
      /* a spurious wake-up: re-run from the resume position; nothing was
       * written, so it parks again */
      rc = tdist__kv_exec(&kv, body, len, &out, &x);
      if (rc != TDIST__EXEC_BLOCKED || w.n != 1) __builtin_trap();
      unwait(&kv, &w); /* the timer fires: re-run with final set */
      x.final = 1;
      rc = tdist__kv_exec(&kv, body, len, &out, &x);
      if (rc == TDIST__EXEC_BLOCKED) __builtin_trap();
    }
    unwait(&kv, &w);
    if (rc == TDIST__EXEC_BAD || rc == TDIST__EXEC_NOMEM) break;
    /* the reply is one well-formed frame */
    uint32_t rl;
    memcpy(&rl, out.p, 4);
    if (out.len < 5 || rl != out.len - 4) __builtin_trap();
    off += 4 + (size_t)len;
  }
  tdist__buf_free(&out);
  tdist__kv_destroy(&kv);
  return 0;
}
