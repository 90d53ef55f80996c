/*
 * store_test_util.h - helpers shared by the store tests: a started server
 * in a child, connect with a short budget, small sleeps.
 */
#ifndef TDIST_STORE_TEST_UTIL_H
#define TDIST_STORE_TEST_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "mp.h"
#include "store/proto.h"
#include "tdist/errors.h"
#include "tdist/store.h"

/* A HELLO frame without a token appended to *b, for tests that speak the raw
 * protocol: 0, or -1 without memory. */
static inline int st_hello_frame(tdist__buf_t *b) {
  if (tdist__buf_reserve(b, 64) != 0) return -1;
  size_t f = tdist__frame_begin(b, TDIST__OP_HELLO);
  tdist__put_u32(b, TDIST__STORE_MAGIC);
  tdist__put_u32(b, TDIST__STORE_VERSION);
  tdist__put_bytes(b, NULL, 0);
  tdist__frame_end(b, f);
  return 0;
}

static inline void st_sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
  nanosleep(&ts, NULL);
}

static inline int64_t st_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline int st_connect(int port, int64_t timeout_ms, tdist_store_t **s) {
  tdist_store_opts_t o = {.mask = TDIST_STORE_FIELD_TIMEOUT, .timeout_ms = timeout_ms};
  return tdist_store_connect("127.0.0.1", port, &o, s);
}

static inline int st_start_server(int port, const char *token, tdist_store_server_t **srv) {
  tdist_store_server_opts_t o = {.mask = TDIST_STORE_SERVER_FIELD_HOST |
                                         TDIST_STORE_SERVER_FIELD_PORT |
                                         TDIST_STORE_SERVER_FIELD_TOKEN,
                                 .host = "127.0.0.1",
                                 .port = port,
                                 .token = token};
  return tdist_store_server_start(&o, srv);
}

static inline void st_raise_nofile(void) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
}

#endif
