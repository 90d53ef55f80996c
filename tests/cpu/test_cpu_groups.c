/*
 * test_cpu_groups.c - subgroups over the world's connections: two disjoint
 * groups running different collectives at the same time, a group with ranks
 * renumbered, a non-member passing through, 2x2 (n=4) and 2x3 (n=6) meshes,
 * a mesh whose product is not the world size being refused, and ranks that
 * disagree on a new group's members failing at once with MISMATCH, and a
 * subgroup aborted by one member: the others' errors and abort callbacks name
 * the aborting rank by group and world rank ("rank 0 (world rank 3)").
 */
#include <dirent.h>

#include "cpu_test_util.h"

#define N_ITER 20

/* Sum over group ranks of (world rank + 1) * (i + 1). */
static int check_sum(const float *v, size_t count, const int *world, int n) {
  for (size_t i = 0; i < count; i++) {
    float want = 0;
    for (int r = 0; r < n; r++)
      want += (float)((world[r] + 1) * (int)(i % 97 + 1));
    if (v[i] != want) return 1;
  }
  return 0;
}

static void fill_rank(float *v, size_t count, int world_rank) {
  for (size_t i = 0; i < count; i++)
    v[i] = (float)((world_rank + 1) * (int)(i % 97 + 1));
}

static int disjoint(tdist_group_t *w, int rank) {
  static const int a[] = {0, 1}, b[] = {2, 3};
  tdist_group_t *ga = NULL, *gb = NULL;
  MP_CHECK_RC(tdist_new_group(w, a, 2, NULL, &ga));
  MP_CHECK_RC(tdist_new_group(w, b, 2, NULL, &gb));
  MP_CHECK((ga != NULL) == (rank < 2) && (gb != NULL) == (rank >= 2));
  size_t count = 100003; /* above the ring threshold */
  float *v = malloc(count * sizeof(float) * 2);
  tdist_work_t *works[N_ITER];
  if (ga) {
    /* group A: a train of async all_reduces */
    for (int it = 0; it < N_ITER; it++) {
      fill_rank(v, count, rank);
      MP_CHECK_RC(tdist_all_reduce(ga, v, v, count, TDIST_FLOAT32, TDIST_SUM, NULL, &works[0]));
      MP_CHECK_RC(tdist_work_wait(works[0], 0));
      tdist_work_release(works[0]);
      MP_CHECK(check_sum(v, count, a, 2) == 0);
    }
  } else {
    /* group B at the same time: all_gathers */
    for (int it = 0; it < N_ITER; it++) {
      float mine[64], all[128];
      for (int i = 0; i < 64; i++)
        mine[i] = (float)(rank * 1000 + it * 64 + i);
      MP_CHECK_RC(tdist_all_gather(gb, mine, all, 64, TDIST_FLOAT32, NULL, NULL));
      for (int r = 0; r < 2; r++)
        for (int i = 0; i < 64; i++)
          MP_CHECK(all[r * 64 + i] == (float)(b[r] * 1000 + it * 64 + i));
    }
  }
  free(v);
  MP_CHECK_RC(tdist_group_destroy(ga));
  MP_CHECK_RC(tdist_group_destroy(gb));
  return 0;
}

static int renumbered_and_nonmember(tdist_group_t *w, int rank, int n) {
  /* ranks listed backwards, leaving rank 0 out: it passes through */
  int ranks[8], m = 0;
  for (int r = n - 1; r >= 1; r--)
    ranks[m++] = r;
  tdist_group_t *g = NULL;
  MP_CHECK_RC(tdist_new_group(w, ranks, m, NULL, &g));
  if (rank == 0) {
    MP_CHECK(g == NULL);
  } else {
    MP_CHECK(g != NULL && tdist_group_size(g) == m && tdist_group_rank(g) == n - 1 - rank);
    MP_CHECK(tdist_group_global_rank(g, 0) == n - 1);
    int32_t x[5];
    for (int i = 0; i < 5; i++)
      x[i] = tdist_group_rank(g) == 0 ? 42 + i : -1;
    MP_CHECK_RC(tdist_broadcast(g, x, 5, TDIST_INT32, 0, NULL, NULL)); /* root = world n-1 */
    for (int i = 0; i < 5; i++)
      MP_CHECK(x[i] == 42 + i);
    float v[33];
    fill_rank(v, 33, rank);
    MP_CHECK_RC(tdist_all_reduce(g, v, v, 33, TDIST_FLOAT32, TDIST_SUM, NULL, NULL));
    MP_CHECK(check_sum(v, 33, ranks, m) == 0);
  }
  MP_CHECK_RC(tdist_barrier(w, NULL, NULL)); /* the non-member meets the others here */
  MP_CHECK_RC(tdist_group_destroy(g));
  return 0;
}

static int mesh(tdist_group_t *w, int rank, int n, int d0, int d1) {
  int dims[2] = {d0, d1}, coords[2];
  tdist_group_t *gs[2] = {NULL, NULL};
  MP_CHECK_RC(tdist_mesh_create(w, dims, 2, NULL, gs, coords));
  MP_CHECK(coords[0] == rank / d1 && coords[1] == rank % d1);
  MP_CHECK(tdist_group_size(gs[0]) == d0 && tdist_group_size(gs[1]) == d1);
  for (int d = 0; d < 2; d++) {
    int members[8], sz = tdist_group_size(gs[d]);
    for (int r = 0; r < sz; r++)
      members[r] = tdist_group_global_rank(gs[d], r);
    float v[1000];
    fill_rank(v, 1000, rank);
    MP_CHECK_RC(tdist_all_reduce(gs[d], v, v, 1000, TDIST_FLOAT32, TDIST_SUM, NULL, NULL));
    MP_CHECK(check_sum(v, 1000, members, sz) == 0);
    for (int r = 0; r < sz; r++)
      MP_CHECK(d == 0 ? members[r] % d1 == rank % d1 : members[r] / d1 == rank / d1);
  }
  MP_CHECK_RC(tdist_group_destroy(gs[0]));
  MP_CHECK_RC(tdist_group_destroy(gs[1]));
  /* a mesh that does not cover the world is refused */
  int bad[2] = {n, 2};
  tdist_group_t *bg[2];
  int rc = tdist_mesh_create(w, bad, 2, NULL, bg, NULL);
  MP_CHECK(rc == TDIST_ERR_INVALID_ARGUMENT && strstr(tdist_last_error(), "ranks") != NULL);
  return 0;
}

/* Ranks that pass different member lists to tdist_new_group fail at once,
 * every one of them, with MISMATCH naming both lists; the parent goes on. */
static int disagree(tdist_group_t *w, int rank, int n) {
  static const int a[] = {0, 1}, b[] = {0, 1, 2};
  tdist_group_t *g = NULL;
  int rc = tdist_new_group(w, rank == 0 ? a : b, rank == 0 ? 2 : 3, NULL, &g);
  if (rc != TDIST_ERR_MISMATCH)
    fprintf(stderr, "rank %d: new_group -> %s: %s\n", rank, tdist_err_name(rc), tdist_last_error());
  MP_CHECK(rc == TDIST_ERR_MISMATCH && g == NULL);
  MP_CHECK(strstr(tdist_last_error(), "[0,1]") && strstr(tdist_last_error(), "[0,1,2]"));
  MP_CHECK(strstr(tdist_last_error(), "(world rank ") != NULL);
  float x[4];
  fill_rank(x, 4, rank);
  MP_CHECK_RC(tdist_all_reduce(w, x, x, 4, TDIST_FLOAT32, TDIST_SUM, NULL, NULL));
  int all[8];
  for (int i = 0; i < n; i++)
    all[i] = i;
  MP_CHECK(check_sum(x, 4, all, n) == 0);
  return 0;
}

static char abort_seen[256];
static char dump_dir[64]; /* TDIST_TRACE_PREFIX: the flight-recorder dumps */

/* 1 if dump_dir holds a dump of world rank wr ("...rank<wr>.json"). */
static int has_dump(int wr) {
  char tail[32];
  int found = 0;
  snprintf(tail, sizeof(tail), ".rank%d.json", wr);
  DIR *d = opendir(dump_dir);
  for (struct dirent *e; d && (e = readdir(d)) != NULL;) {
    size_t l = strlen(e->d_name), tl = strlen(tail);
    if (l > tl && strcmp(e->d_name + l - tl, tail) == 0) found = 1;
  }
  if (d) closedir(d);
  return found;
}

/* (progress thread) The abort callback's reason, for the test to read. */
static void on_abort(tdist_group_t *g, int status, const char *reason, void *arg) {
  (void)g;
  (void)status;
  (void)arg;
  snprintf(abort_seen, sizeof(abort_seen), "%s", reason);
}

/* World ranks 3 and 1 as group ranks 0 and 1: world rank 3 aborts it while
 * world rank 1 waits in a receive from it. On world rank 1 "rank 1 aborted
 * the group" read as its own doing (issue 41): the error and the abort
 * callback's reason name both numbers. The world goes on. */
static int abort_names(tdist_group_t *w, int rank) {
  static const int members[] = {3, 1};
  tdist_group_t *g = NULL;
  MP_CHECK_RC(tdist_new_group(w, members, 2, NULL, &g));
  if (rank == 1) {
    MP_CHECK_RC(tdist_group_on_abort(g, on_abort, NULL));
    float x = 0;
    tdist_work_t *wk = NULL;
    MP_CHECK_RC(tdist_irecv(g, &x, 1, TDIST_FLOAT32, 0, NULL, &wk));
    MP_CHECK_RC(tdist_barrier(w, NULL, NULL)); /* posted: now world rank 3 aborts */
    int rc = tdist_work_wait(wk, 30000);
    const char *msg = tdist_work_error_message(wk);
    if (rc != TDIST_ERR_ABORTED || !strstr(msg, "rank 0 (world rank 3) aborted the group"))
      fprintf(stderr, "rank 1: recv -> %s: %s\n", tdist_err_name(rc), msg);
    MP_CHECK(rc == TDIST_ERR_ABORTED);
    MP_CHECK(strstr(msg, "rank 0 (world rank 3) aborted the group: aborted on demand: by 3"));
    tdist_work_release(wk);
    MP_CHECK(strstr(abort_seen, "rank 0 (world rank 3) aborted the group") != NULL);
  } else {
    MP_CHECK_RC(tdist_barrier(w, NULL, NULL));
    if (rank == 3) MP_CHECK_RC(tdist_group_abort(g, "by 3"));
  }
  /* The flight recorder: world rank 1, whose group failed without its
   * asking, wrote a dump (from a worker thread, shortly after); world rank
   * 3, which aborted on demand, wrote none (docs/flight-recorder.md). */
  if (rank == 1) {
    for (int i = 0; i < 1000 && !has_dump(1); i++)
      usleep(10000);
    MP_CHECK(has_dump(1));
  }
  MP_CHECK_RC(tdist_barrier(w, NULL, NULL));
  if (rank == 3) MP_CHECK(!has_dump(3));
  if (g) MP_CHECK_RC(tdist_group_destroy(g));
  return 0;
}

static int child(int rank, int n, void *arg) {
  tdist_group_t *w = NULL;
  MP_CHECK_RC(cpu_test_init(*(int *)arg, rank, n, 60000, &w));
  if (n == 4) {
    if (disjoint(w, rank)) return 1;
    if (mesh(w, rank, n, 2, 2)) return 1;
  } else {
    if (mesh(w, rank, n, 2, 3)) return 1;
  }
  if (renumbered_and_nonmember(w, rank, n)) return 1;
  if (disagree(w, rank, n)) return 1;
  if (abort_names(w, rank)) return 1;
  MP_CHECK_RC(tdist_group_destroy(w));
  return 0;
}

int main(void) {
  int fails = 0;
  snprintf(dump_dir, sizeof(dump_dir), "/tmp/tdist_cpu_groups_XXXXXX");
  if (!mkdtemp(dump_dir)) return 1;
  char prefix[80];
  snprintf(prefix, sizeof(prefix), "%s/", dump_dir);
  setenv("TDIST_TRACE_PREFIX", prefix, 1);
  for (int n = 4; n <= 6; n += 2) {
    int port = tdist_mp_free_port();
    int rc = tdist_mp_run(n, child, &port, 100);
    printf("cpu_groups n=%d: %s\n", n, rc ? "FAILED" : "ok");
    fails += rc;
    /* this run's dumps go; the next run checks its own */
    DIR *d = opendir(dump_dir);
    for (struct dirent *e; d && (e = readdir(d)) != NULL;) {
      char f[400];
      snprintf(f, sizeof(f), "%s/%s", dump_dir, e->d_name);
      if (e->d_name[0] != '.') unlink(f);
    }
    if (d) closedir(d);
  }
  rmdir(dump_dir);
  return fails ? 1 : 0;
}
