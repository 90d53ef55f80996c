/*
 * test_cpu_deferred.c - deferred reads of large payloads (docs/cpu-backend.md):
 * a payload for an op not posted yet stays in the kernel until the post, or
 * is staged after TDIST_CPU_DEFER_US; late receivers around that timeout, an
 * async broadcast followed by p2p, a receiver blocked on the store (the
 * timer path), a mismatch on a parked payload, and n=3 collectives with
 * random delays, each checked against a reference.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "mp.h"
#include "tdist/tdist.h"

static int g_port;
static char g_file[128];
static void msleep(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static int open_world(int rank, int n, tdist_group_t **g) {
  char method[64];
  snprintf(method, sizeof(method), "tcp://127.0.0.1:%d", g_port);
  tdist_init_opts_t o = {0};
  o.mask = TDIST_INIT_FIELD_BACKEND | TDIST_INIT_FIELD_INIT_METHOD | TDIST_INIT_FIELD_RANK |
           TDIST_INIT_FIELD_WORLD_SIZE | TDIST_INIT_FIELD_HOST_STORE;
  o.backend = "cpu";
  o.init_method = method;
  o.rank = rank;
  o.world_size = n;
  o.host_store = 1;
  return tdist_init_process_group(&o, g);
}

static int two(int rank, int n, void *arg) {
  tdist_group_t *g;
  MP_CHECK_RC(open_world(rank, n, &g));
  size_t cnt = 786433;
  float *a = malloc(cnt * 4), *b = malloc(cnt * 4);
  /* A: broadcast with delays around the defer timeout */
  for (int it = 0; it < 24; it++) {
    for (size_t i = 0; i < cnt; i++)
      a[i] = rank == 0 ? (float)(it * 1000 + i % 977) : -1.f;
    if (rank == 1) msleep((it % 4) * 3);
    MP_CHECK_RC(tdist_broadcast(g, a, cnt, TDIST_FLOAT32, 0, NULL, NULL));
    for (size_t i = 0; i < cnt; i++)
      MP_CHECK(a[i] == (float)(it * 1000 + i % 977));
  }
  /* B: all_reduce with the late rank alternating */
  for (int it = 0; it < 16; it++) {
    for (size_t i = 0; i < cnt; i++)
      a[i] = (float)(rank + 1) * (float)(i % 101) + it;
    if (rank == it % 2) msleep((it % 3) * 4);
    MP_CHECK_RC(tdist_all_reduce(g, a, a, cnt, TDIST_FLOAT32, TDIST_SUM, NULL, NULL));
    for (size_t i = 0; i < cnt; i++)
      MP_CHECK(a[i] == 3.f * (float)(i % 101) + 2 * it);
  }
  /* C: async broadcast then a p2p message behind it */
  for (int it = 0; it < 6; it++) {
    int32_t small[4] = {rank, it, 7, 9}, got[4] = {0};
    if (rank == 0) {
      for (size_t i = 0; i < cnt; i++)
        a[i] = (float)(i % 313 + it);
      tdist_work_t *w;
      MP_CHECK_RC(tdist_broadcast(g, a, cnt, TDIST_FLOAT32, 0, NULL, &w));
      MP_CHECK_RC(tdist_send(g, small, 4, TDIST_INT32, 1, NULL));
      MP_CHECK_RC(tdist_work_wait(w, -1));
      tdist_work_release(w);
    } else {
      msleep(2 + it);
      MP_CHECK_RC(tdist_recv(g, got, 4, TDIST_INT32, 0, NULL));
      MP_CHECK(got[0] == 0 && got[1] == it && got[3] == 9);
      MP_CHECK_RC(tdist_broadcast(g, a, cnt, TDIST_FLOAT32, 0, NULL, NULL));
      for (size_t i = 0; i < cnt; i++)
        MP_CHECK(a[i] == (float)(i % 313 + it));
    }
  }
  /* D: the receiver waits on a store for the end of a broadcast larger than
   * the socket buffers: only the defer timeout lets it finish */
  {
    size_t big = 6u << 20; /* 24 MiB */
    float *c = malloc(big * 4);
    tdist_store_t *st;
    MP_CHECK_RC(tdist_store_open_file(g_file, NULL, &st));
    for (size_t i = 0; i < big; i++)
      c[i] = rank == 0 ? (float)(i % 4099) : 0.f;
    if (rank == 0) {
      MP_CHECK_RC(tdist_broadcast(g, c, big, TDIST_FLOAT32, 0, NULL, NULL));
      MP_CHECK_RC(tdist_store_set(st, "bdone", "1", 1));
    } else {
      const char *k = "bdone";
      msleep(1);
      MP_CHECK_RC(tdist_store_wait(st, &k, 1, 20000));
      MP_CHECK_RC(tdist_broadcast(g, c, big, TDIST_FLOAT32, 0, NULL, NULL));
    }
    for (size_t i = 0; i < big; i++)
      MP_CHECK(c[i] == (float)(i % 4099));
    tdist_store_release(st);
    free(c);
  }
  /* E: mismatch found when the parked header is dispatched */
  {
    MP_CHECK_RC(tdist_barrier(g, NULL, NULL));
    if (rank == 1) msleep(2);
    int rc = tdist_broadcast(g, a, rank == 0 ? cnt : cnt - 1, TDIST_FLOAT32, 0, NULL, NULL);
    fprintf(stderr, "rank %d rc %s: %s\n", rank, tdist_err_name(rc), tdist_last_error());
    MP_CHECK(rc == TDIST_ERR_MISMATCH || (rank == 0 && rc == 0));
    fprintf(stderr, "rank %d rc %d mismatch: %s\n", rank, rc, tdist_last_error());
  }
  tdist_group_destroy(g);
  free(a);
  free(b);
  return 0;
}

static int three(int rank, int n, void *arg) {
  tdist_group_t *g;
  MP_CHECK_RC(open_world(rank, n, &g));
  size_t cnt = 400003;
  float *a = malloc(cnt * 4 * n), *b = malloc(cnt * 4 * n);
  srand(rank * 77 + 1);
  for (int it = 0; it < 12; it++) {
    for (size_t i = 0; i < cnt; i++)
      a[i] = (float)(rank * 10 + it + i % 7);
    msleep(rand() % 8);
    MP_CHECK_RC(tdist_all_gather(g, a, b, cnt, TDIST_FLOAT32, NULL, NULL));
    for (int r = 0; r < n; r++)
      for (size_t i = 0; i < cnt; i++)
        MP_CHECK(b[r * cnt + i] == (float)(r * 10 + it + i % 7));
    msleep(rand() % 8);
    MP_CHECK_RC(tdist_broadcast(g, a, cnt, TDIST_FLOAT32, it % n, NULL, NULL));
    for (size_t i = 0; i < cnt; i++)
      MP_CHECK(a[i] == (float)((it % n) * 10 + it + i % 7));
    for (size_t i = 0; i < cnt * n; i++)
      a[i] = (float)(rank + 1) * (float)(i % 31);
    msleep(rand() % 8);
    MP_CHECK_RC(tdist_reduce_scatter(g, a, b, cnt, TDIST_FLOAT32, TDIST_SUM, NULL, NULL));
    for (size_t i = 0; i < cnt; i++)
      MP_CHECK(b[i] == 6.f * (float)((rank * cnt + i) % 31));
    for (size_t i = 0; i < cnt; i++)
      a[i] = (float)(rank + it);
    msleep(rand() % 8);
    MP_CHECK_RC(tdist_all_reduce(g, a, a, cnt, TDIST_FLOAT32, TDIST_SUM, NULL, NULL));
    for (size_t i = 0; i < cnt; i++)
      MP_CHECK(a[i] == (float)(3 + 3 * it));
  }
  tdist_group_destroy(g);
  free(a);
  free(b);
  return 0;
}

int main(int argc, char **argv) {
  snprintf(g_file, sizeof(g_file), "/tmp/tdist_cpu_deferred.%d", (int)getpid());
  unlink(g_file);
  g_port = tdist_mp_free_port();
  int bad = tdist_mp_run(2, two, NULL, 120);
  g_port = tdist_mp_free_port();
  bad += tdist_mp_run(3, three, NULL, 120);
  unlink(g_file);
  printf("cpu_deferred: %s\n", bad ? "FAILED" : "ok");
  return bad != 0;
}
