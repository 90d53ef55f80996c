/*
 * demo.c - a program that runs on a backend it does not know: it names one
 * (argv[1], default "loopback") and the library finds it, built in or as a
 * plug-in on TDIST_BACKEND_PATH (loopback.c next to this file). A world of
 * one process: every collective's result is checked against what one rank
 * must get, and the program prints "OK" or why not.
 *
 *   TDIST_BACKEND_PATH=build/examples/backend build/examples/backend/backend_demo loopback
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tdist/tdist.h"

#define CHECK(call)                                                                           \
  do {                                                                                        \
    int rc_ = (call);                                                                         \
    if (rc_ != 0) {                                                                           \
      fprintf(stderr, "%s failed: %s: %s\n", #call, tdist_err_name(rc_), tdist_last_error()); \
      return 1;                                                                               \
    }                                                                                         \
  } while (0)

static int check_equal(const char *what, const float *got, const float *want, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (got[i] != want[i]) {
      fprintf(stderr, "%s: element %zu is %g, expected %g\n", what, i, got[i], want[i]);
      return 1;
    }
  return 0;
}

int main(int argc, char **argv) {
  const char *backend = argc > 1 ? argv[1] : "loopback";
  /* A file store: one process needs no server and no port. */
  char method[96];
  snprintf(method, sizeof(method), "file:///tmp/tdist-backend-demo-%d", (int)getpid());
  tdist_init_opts_t o = {0};
  o.mask = TDIST_INIT_FIELD_BACKEND | TDIST_INIT_FIELD_INIT_METHOD | TDIST_INIT_FIELD_RANK |
           TDIST_INIT_FIELD_WORLD_SIZE;
  o.backend = backend;
  o.init_method = method;
  o.rank = 0;
  o.world_size = 1;
  tdist_group_t *g = NULL;
  CHECK(tdist_init_process_group(&o, &g));

  enum { N = 1024 };
  static float a[N], b[N], want[N];
  for (int i = 0; i < N; i++)
    a[i] = want[i] = (float)i * 0.5f;
  /* Asynchronous, as a training step would overlap it. */
  tdist_work_t *w = NULL;
  CHECK(tdist_all_reduce(g, a, b, N, TDIST_FLOAT32, TDIST_SUM, NULL, &w));
  CHECK(tdist_work_wait(w, 10000));
  tdist_work_release(w);
  if (check_equal("all_reduce", b, want, N)) return 1;
  memset(b, 0, sizeof(b));
  CHECK(tdist_all_gather(g, a, b, N, TDIST_FLOAT32, NULL, NULL));
  if (check_equal("all_gather", b, want, N)) return 1;
  memset(b, 0, sizeof(b));
  CHECK(tdist_all_to_all(g, a, b, N, TDIST_FLOAT32, NULL, NULL));
  if (check_equal("all_to_all", b, want, N)) return 1;
  CHECK(tdist_broadcast(g, a, N, TDIST_FLOAT32, 0, NULL, NULL));
  if (check_equal("broadcast", a, want, N)) return 1;
  CHECK(tdist_barrier(g, NULL, NULL));
  /* What the backend's capabilities leave out fails before it runs. */
  int rc = tdist_all_reduce(g, a, b, N, TDIST_FLOAT32, TDIST_PREMUL_SUM, NULL, NULL);
  if (rc != TDIST_ERR_NOT_SUPPORTED) {
    fprintf(stderr, "premul_sum: expected TDIST_ERR_NOT_SUPPORTED, got %s\n", tdist_err_name(rc));
    return 1;
  }
  CHECK(tdist_group_destroy(g));
  unlink(method + strlen("file://"));
  printf("OK: backend '%s' ran all_reduce, all_gather, all_to_all, broadcast, barrier\n", backend);
  return 0;
}
