/*
 * test_cpu_async.c - asynchrony (also run under TSan: label "threads").
 * While a large all_reduce is in flight the caller's thread keeps computing:
 * right after submission the work is not complete, the caller's loop runs,
 * then wait returns the right result. Then: a train of small async ops with
 * completion callbacks (progress thread) and wait_all, while a second caller
 * thread drives p2p on a subgroup at the same time.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <sys/resource.h>
#include <unistd.h>

#include <json.h>

#include "cpu_test_util.h"

static atomic_int cb_count;
static void on_done(tdist_work_t *w, void *arg) {
  (void)arg;
  if (tdist_work_status(w) == 0) atomic_fetch_add(&cb_count, 1);
}

struct side {
  tdist_group_t *g;
  int rank, rc;
};

/* Second caller thread: ping-pong on its own group. */
static void *side_thread(void *arg) {
  struct side *s = arg;
  int64_t x[64];
  for (int it = 0; it < 50 && !s->rc; it++) {
    for (int i = 0; i < 64; i++)
      x[i] = s->rank == 0 ? it * 64 + i : -1;
    if (s->rank == 0) {
      s->rc |= tdist_send(s->g, x, 64, TDIST_INT64, 1, NULL);
      s->rc |= tdist_recv(s->g, x, 64, TDIST_INT64, 1, NULL);
      for (int i = 0; i < 64; i++)
        if (x[i] != it * 64 + i + 1) s->rc = 1;
    } else {
      s->rc |= tdist_recv(s->g, x, 64, TDIST_INT64, 0, NULL);
      for (int i = 0; i < 64; i++)
        x[i] += 1;
      s->rc |= tdist_send(s->g, x, 64, TDIST_INT64, 0, NULL);
    }
  }
  return NULL;
}

/* The dump's all_reduce records of the small-op train: how many, and how
 * many are not completed or end before they start (-1: unreadable). */
static int check_dump(const char *path, int *seen) {
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  char line[4096];
  int bad = 0, lineno = 0;
  *seen = 0;
  while (fgets(line, sizeof(line), f)) {
    if (lineno++ == 0) continue; /* the meta line */
    json_object *o = json_tokener_parse(line), *v;
    if (!o) {
      bad++;
      continue;
    }
    if (json_object_object_get_ex(o, "op", &v) &&
        !strcmp(json_object_get_string(v), "all_reduce") &&
        json_object_object_get_ex(o, "count", &v) && json_object_get_int64(v) == 1) {
      (*seen)++;
      json_object *st, *t0, *t1;
      if (!json_object_object_get_ex(o, "state", &st) ||
          strcmp(json_object_get_string(st), "completed") != 0 ||
          !json_object_object_get_ex(o, "t_start_us", &t0) ||
          !json_object_object_get_ex(o, "t_end_us", &t1) || json_object_get_int64(t0) <= 0 ||
          json_object_get_int64(t1) < json_object_get_int64(t0)) {
        fprintf(stderr, "dump record: %s", line);
        bad++;
      }
    }
    json_object_put(o);
  }
  fclose(f);
  return bad;
}

static int child(int rank, int n, void *arg) {
  tdist_group_t *g = NULL, *sub = NULL;
  MP_CHECK_RC(cpu_test_init(*(int *)arg, rank, n, 60000, &g));
  static const int both[] = {0, 1};
  MP_CHECK_RC(tdist_new_group(g, both, 2, NULL, &sub));

  /* overlap */
  size_t count = 8 << 20; /* 32 MiB of float32 */
  float *v = malloc(count * sizeof(float));
  for (size_t i = 0; i < count; i++)
    v[i] = (float)(rank + 1) * (float)(i % 1000);
  tdist_work_t *w = NULL;
  MP_CHECK_RC(tdist_all_reduce(g, v, v, count, TDIST_FLOAT32, TDIST_SUM, NULL, &w));
  MP_CHECK(!tdist_work_is_completed(w));
  volatile double acc = 0;
  long spins = 0;
  while (!tdist_work_is_completed(w)) {
    for (int i = 0; i < 1000; i++)
      acc += i * 0.5;
    spins++;
  }
  MP_CHECK_RC(tdist_work_wait(w, 0));
  tdist_work_release(w);
  fprintf(stderr, "[rank %d] computed %ld rounds (%g) while the all_reduce ran\n", rank, spins,
          (double)acc);
  MP_CHECK(spins > 0);
  float want_scale = (float)(n * (n + 1) / 2);
  for (size_t i = 0; i < count; i++)
    if (v[i] != want_scale * (float)(i % 1000)) {
      fprintf(stderr, "[rank %d] overlap all_reduce [%zu] = %g\n", rank, i, v[i]);
      return 1;
    }
  free(v);

  /* a train of small async ops with callbacks, a second thread on `sub` */
  struct side s = {sub, rank, 0};
  pthread_t th;
  pthread_create(&th, NULL, side_thread, &s);
  enum { K = 64 };
  tdist_work_t *ws[K];
  int32_t bufs[K][16];
  for (int k = 0; k < K; k++) {
    for (int i = 0; i < 16; i++)
      bufs[k][i] = k + i + rank;
    MP_CHECK_RC(tdist_all_reduce(g, bufs[k], bufs[k], 16, TDIST_INT32, TDIST_SUM, NULL, &ws[k]));
    MP_CHECK_RC(tdist_work_on_complete(ws[k], on_done, NULL));
  }
  MP_CHECK_RC(tdist_wait_all(ws, K, 0));
  for (int k = 0; k < K; k++) {
    tdist_work_release(ws[k]);
    for (int i = 0; i < 16; i++)
      MP_CHECK(bufs[k][i] == n * (k + i) + n * (n - 1) / 2);
  }
  pthread_join(th, NULL);
  MP_CHECK(s.rc == 0);
  /* A callback runs after its work is seen complete (tdist/work.h): the
   * waits above may return before the last ones ran. Each must run once, soon. */
  for (int ms = 0; ms < 10000 && atomic_load(&cb_count) < K; ms++)
    usleep(1000);
  MP_CHECK(atomic_load(&cb_count) == K);

  /* Quiet completions (docs/cpu-backend.md): the successes a caller claimed
   * on a train of synchronous ops may reach the progress thread later, but
   * a dump taken right after sees each of them completed, ending no earlier
   * than it started. */
  for (int k = 0; k < 300; k++) {
    int32_t x = k + rank;
    MP_CHECK_RC(tdist_all_reduce(g, &x, &x, 1, TDIST_INT32, TDIST_SUM, NULL, NULL));
    MP_CHECK(x == n * k + n * (n - 1) / 2);
  }
  char path[128];
  snprintf(path, sizeof(path), "/tmp/tdist_cpu_async_%d.json", (int)getpid());
  MP_CHECK_RC(tdist_dump_trace(g, path));
  int seen = 0, bad = check_dump(path, &seen);
  unlink(path);
  fprintf(stderr, "[rank %d] dump after 300 synchronous ops: %d of them recorded, %d not right\n",
          rank, seen, bad);
  MP_CHECK(bad == 0 && seen >= 64);

  /* Idle: with nothing in flight no thread of ours spins (the progress
   * thread sleeps in epoll, no caller drives, the rings are not polled).
   * A spinning thread would use the whole second; heartbeats use a few ms. */
  MP_CHECK_RC(tdist_barrier(g, NULL, NULL));
  struct rusage r0, r1;
  getrusage(RUSAGE_SELF, &r0);
  sleep(1);
  getrusage(RUSAGE_SELF, &r1);
  long us = (r1.ru_utime.tv_sec - r0.ru_utime.tv_sec) * 1000000L +
            (r1.ru_utime.tv_usec - r0.ru_utime.tv_usec) +
            (r1.ru_stime.tv_sec - r0.ru_stime.tv_sec) * 1000000L +
            (r1.ru_stime.tv_usec - r0.ru_stime.tv_usec);
  fprintf(stderr, "[rank %d] idle second: %ld us of CPU\n", rank, us);
  MP_CHECK(us < 200000);
  MP_CHECK_RC(tdist_group_destroy(sub));
  MP_CHECK_RC(tdist_group_destroy(g));
  return 0;
}

int main(void) {
  int port = tdist_mp_free_port();
  int rc = tdist_mp_run(2, child, &port, 100);
  printf("cpu_async: %s\n", rc ? "FAILED" : "ok");
  return rc ? 1 : 0;
}
