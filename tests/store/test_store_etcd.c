/*
 * test_store_etcd.c - the etcd store against a real 3-member etcd cluster on
 * loopback (etcd_cluster.h):
 *   1. the store API's semantics across processes, as test_store_ops.c
 *      checks them on the TCP store (same calls, codes and messages);
 *   2. failover: an endpoint list whose first member is unreachable, and
 *      tdistrun --store etcd:// (twice on one URL);
 *   3. a job of 4 ranks (tdist_init_process_group with etcd://, CPU
 *      backend): checked all_reduces; the etcd leader is killed and the job
 *      goes on past two lease TTLs; then rank 0 - the rank that would host
 *      the TCP store - is killed: the survivors' all_reduce fails with
 *      REMOTE_FAILED naming rank 0, the lease detector records its death,
 *      and they shrink and run a checked all_reduce;
 *   4. the semantics again with that member still dead.
 * Without an etcd binary the test prints "SKIPPED: ..." and exits 0 (ctest
 * reports it skipped: SKIP_REGULAR_EXPRESSION in CMakeLists.txt).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "etcd_cluster.h"
#include "store/etcd.h"
#include "store_test_util.h"
#include "tdist/tdist.h"

#define NPROC 4
#define HB_TIMEOUT_MS 3000 /* the lease TTL: 3 s */

static char g_eps[512]; /* every member, member 0 first */
static char g_url[640];
static char g_dir[300]; /* flags between the job's ranks and the test */
static int g_run;

static void new_url(const char *what) {
  snprintf(g_url, sizeof(g_url), "etcd://%s/t%d-%s-%d", g_eps, (int)getpid(), what, g_run++);
}

static int open_store(tdist_store_t **s) {
  tdist_store_opts_t o = {.mask = TDIST_STORE_FIELD_TIMEOUT, .timeout_ms = 30000};
  return tdist_store_open_url(g_url, &o, s);
}

/* ---- 1. semantics -------------------------------------------------------------------- */

static int ops_child(int rank, int n, void *arg) {
  tdist_store_t *s = NULL;
  char key[64], val[64];
  MP_CHECK_RC(open_store(&s));
  snprintf(key, sizeof(key), "rank/%d", rank);
  snprintf(val, sizeof(val), "value-of-%d", rank);
  MP_CHECK_RC(tdist_store_set(s, key, val, strlen(val)));
  for (int r = 0; r < n; r++) { /* get waits for the other ranks' set */
    void *v;
    size_t len;
    snprintf(key, sizeof(key), "rank/%d", r);
    snprintf(val, sizeof(val), "value-of-%d", r);
    MP_CHECK_RC(tdist_store_get(s, key, &v, &len, 20000));
    MP_CHECK(len == strlen(val) && memcmp(v, val, len) == 0);
    tdist_store_free(v);
  }
  int64_t c, total;
  MP_CHECK_RC(tdist_store_add(s, "counter", 1, &c));
  MP_CHECK(c >= 1 && c <= n);
  if (c == n) MP_CHECK_RC(tdist_store_set(s, "barrier", "", 0));
  const char *bk[] = {"barrier"};
  MP_CHECK_RC(tdist_store_wait(s, bk, 1, 20000));
  MP_CHECK_RC(tdist_store_add(s, "counter", 0, &total));
  MP_CHECK(total == n);
  MP_CHECK(tdist_store_add(s, "rank/0", 1, NULL) == TDIST_ERR_INVALID_ARGUMENT);
  MP_CHECK(strstr(tdist_last_error(), "not an int64 counter") != NULL);
  MP_CHECK_RC(tdist_store_add(s, "neg", -5, &c)); /* every rank: -5 each */

  snprintf(val, sizeof(val), "%d", rank); /* one rank wins empty -> rank */
  void *cur;
  size_t cl;
  MP_CHECK_RC(tdist_store_compare_set(s, "leader", NULL, 0, val, strlen(val), &cur, &cl));
  int won = cl == strlen(val) && memcmp(cur, val, cl) == 0;
  tdist_store_free(cur);
  MP_CHECK_RC(tdist_store_add(s, "winners", won, NULL));
  char letter = (char)('a' + rank);
  MP_CHECK_RC(tdist_store_append(s, "letters", &letter, 1));

  char k1[32], k2[32];
  snprintf(k1, sizeof(k1), "m/%d/x", rank);
  snprintf(k2, sizeof(k2), "m/%d/y", rank);
  const char *mk[] = {k1, k2};
  const void *mv[] = {"xx", "yyy"};
  size_t ml[] = {2, 3};
  MP_CHECK_RC(tdist_store_multi_set(s, mk, mv, ml, 2));
  snprintf(k1, sizeof(k1), "m/%d/x", (rank + 1) % n);
  snprintf(k2, sizeof(k2), "m/%d/y", (rank + 1) % n);
  void *gv[2];
  size_t gl[2];
  MP_CHECK_RC(tdist_store_multi_get(s, mk, 2, gv, gl, 20000));
  MP_CHECK(gl[0] == 2 && memcmp(gv[0], "xx", 2) == 0 && gl[1] == 3 && memcmp(gv[1], "yyy", 3) == 0);
  tdist_store_free(gv[0]);
  tdist_store_free(gv[1]);

  MP_CHECK_RC(tdist_store_add(s, "counter2", 1, &c));
  if (c == n) MP_CHECK_RC(tdist_store_set(s, "barrier2", "", 0));
  const char *bk2[] = {"barrier2"};
  MP_CHECK_RC(tdist_store_wait(s, bk2, 1, 20000));
  MP_CHECK_RC(tdist_store_add(s, "winners", 0, &c));
  MP_CHECK(c == 1);
  MP_CHECK_RC(tdist_store_add(s, "neg", 0, &c));
  MP_CHECK(c == -5 * n);
  MP_CHECK_RC(tdist_store_get(s, "letters", &cur, &cl, 1000));
  MP_CHECK(cl == (size_t)n);
  for (int r = 0; r < n; r++)
    MP_CHECK(memchr(cur, 'a' + r, cl) != NULL);
  tdist_store_free(cur);

  int all = 0;
  const char *ck[] = {"rank/0", "rank/1"};
  MP_CHECK_RC(tdist_store_check(s, ck, 2, &all));
  MP_CHECK(all == 1);
  const char *ck2[] = {"rank/0", "nope"};
  MP_CHECK_RC(tdist_store_check(s, ck2, 2, &all));
  MP_CHECK(all == 0);
  if (rank == 1) {
    int del = 0;
    MP_CHECK_RC(tdist_store_delete(s, "leader", &del));
    MP_CHECK(del == 1);
    MP_CHECK_RC(tdist_store_delete(s, "leader", &del));
    MP_CHECK(del == 0);
  }
  int64_t nk;
  MP_CHECK_RC(tdist_store_num_keys(s, &nk));
  MP_CHECK(nk > n);

  int64_t t0 = st_now_ms(); /* timeouts name key, address and time */
  int rc = tdist_store_get(s, "never/there", &cur, &cl, 300);
  MP_CHECK(rc == TDIST_ERR_TIMEOUT);
  MP_CHECK(st_now_ms() - t0 >= 290);
  MP_CHECK(strstr(tdist_last_error(), "never/there") != NULL);
  MP_CHECK(strstr(tdist_last_error(), tdist_store_address(s)) != NULL);
  MP_CHECK(strstr(tdist_last_error(), " ms") != NULL);
  const char *wk[] = {"rank/0", "missing/wait"};
  MP_CHECK(tdist_store_wait(s, wk, 2, 100) == TDIST_ERR_TIMEOUT);
  MP_CHECK(strstr(tdist_last_error(), "missing/wait") != NULL);
  tdist_store_release(s);
  return 0;
}

/* A get in one process is woken by a set in another, well before its timeout;
 * prefix views do not clash and views of views concatenate. */
static int wake_child(int rank, int n, void *arg) {
  tdist_store_t *s = NULL, *a, *b, *ab;
  MP_CHECK_RC(open_store(&s));
  MP_CHECK_RC(tdist_store_prefix(s, "group/a/", &a));
  MP_CHECK_RC(tdist_store_prefix(s, "group/b/", &b));
  MP_CHECK_RC(tdist_store_prefix(a, "sub/", &ab));
  if (rank == 0) {
    int64_t t0 = st_now_ms();
    void *v;
    size_t l;
    MP_CHECK_RC(tdist_store_get(b, "k", &v, &l, 30000));
    MP_CHECK(st_now_ms() - t0 < 20000);
    MP_CHECK(l == 1 && ((char *)v)[0] == 'B');
    tdist_store_free(v);
    MP_CHECK_RC(tdist_store_get(s, "group/a/sub/k", &v, &l, 1000));
    MP_CHECK(l == 2 && memcmp(v, "AB", 2) == 0);
    tdist_store_free(v);
    int all = 1;
    const char *k = "k";
    MP_CHECK_RC(tdist_store_delete(a, "k", NULL));
    MP_CHECK_RC(tdist_store_check(a, &k, 1, &all));
    MP_CHECK(all == 0);
    MP_CHECK(strcmp(tdist_store_address(ab), tdist_store_address(s)) == 0);
  } else {
    st_sleep_ms(500); /* rank 0 is waiting by now */
    MP_CHECK_RC(tdist_store_set(a, "k", "A", 1));
    MP_CHECK_RC(tdist_store_set(ab, "k", "AB", 2));
    MP_CHECK_RC(tdist_store_set(b, "k", "B", 1));
  }
  tdist_store_release(ab);
  tdist_store_release(a);
  tdist_store_release(b);
  tdist_store_release(s);
  return 0;
}

static int args_child(int rank, int n, void *arg) {
  tdist_store_t *s;
  MP_CHECK_RC(open_store(&s));
  MP_CHECK(tdist_store_set(s, "", "v", 1) == TDIST_ERR_INVALID_ARGUMENT);
  char *big = malloc(TDIST_STORE_MAX_KEY + 2);
  memset(big, 'k', TDIST_STORE_MAX_KEY + 1);
  big[TDIST_STORE_MAX_KEY + 1] = 0;
  MP_CHECK(tdist_store_set(s, big, "v", 1) == TDIST_ERR_TOO_LARGE);
  big[TDIST_STORE_MAX_KEY] = 0;
  MP_CHECK_RC(tdist_store_set(s, big, "v", 1));
  free(big);
  size_t n8 = 8 << 20; /* a large value round-trips (base64 in JSON) */
  char *v = malloc(n8);
  for (size_t i = 0; i < n8; i++)
    v[i] = (char)(i * 7);
  MP_CHECK_RC(tdist_store_set(s, "big", v, n8));
  void *g;
  size_t gl;
  MP_CHECK_RC(tdist_store_get(s, "big", &g, &gl, 1000));
  MP_CHECK(gl == n8 && memcmp(g, v, n8) == 0);
  tdist_store_free(g);
  free(v);
  MP_CHECK_RC(tdist_store_set(s, "empty", NULL, 0)); /* zero length: non-NULL */
  MP_CHECK_RC(tdist_store_get(s, "empty", &g, &gl, 1000));
  MP_CHECK(g != NULL && gl == 0);
  tdist_store_free(g);
  void *cur;
  size_t cl; /* an empty value matches an empty expected, as a missing key does */
  MP_CHECK_RC(tdist_store_compare_set(s, "empty", NULL, 0, "x", 1, &cur, &cl));
  MP_CHECK(cl == 1 && memcmp(cur, "x", 1) == 0);
  tdist_store_free(cur);
  MP_CHECK(tdist_store_add(s, "empty2", 1, NULL) == 0);
  MP_CHECK_RC(tdist_store_set(s, "e3", NULL, 0));
  MP_CHECK(tdist_store_add(s, "e3", 1, NULL) == TDIST_ERR_INVALID_ARGUMENT);
  enum { NK = 300 }; /* more keys than one etcd txn takes (128) */
  char *keys[NK];
  const void *vals[NK];
  size_t lens[NK];
  void *got[NK];
  size_t gls[NK];
  for (int i = 0; i < NK; i++) {
    keys[i] = malloc(32);
    snprintf(keys[i], 32, "many/%d", i);
    vals[i] = keys[i];
    lens[i] = strlen(keys[i]);
  }
  MP_CHECK_RC(tdist_store_multi_set(s, (const char *const *)keys, vals, lens, NK));
  MP_CHECK_RC(tdist_store_multi_get(s, (const char *const *)keys, NK, got, gls, 1000));
  for (int i = 0; i < NK; i++) {
    MP_CHECK(gls[i] == lens[i] && memcmp(got[i], keys[i], lens[i]) == 0);
    tdist_store_free(got[i]);
    free(keys[i]);
  }
  tdist_store_release(s);
  /* malformed URLs and an unreachable cluster */
  tdist_store_opts_t o = {.mask = TDIST_STORE_FIELD_TIMEOUT, .timeout_ms = 400};
  MP_CHECK(tdist_store_open_url("etcd://", &o, &s) == TDIST_ERR_INVALID_ARGUMENT);
  MP_CHECK(tdist_store_open_url("etcd://host/x", &o, &s) == TDIST_ERR_INVALID_ARGUMENT);
  MP_CHECK(tdist_store_open_url("etcd://h:1,,h:2/x", &o, &s) == TDIST_ERR_INVALID_ARGUMENT);
  MP_CHECK(tdist_store_open_url("zk://h:1", &o, &s) == TDIST_ERR_INVALID_ARGUMENT);
  char dead[96];
  snprintf(dead, sizeof(dead), "etcd://127.0.0.1:%d/x", tdist_mp_free_port());
  int64_t t0 = st_now_ms();
  MP_CHECK(tdist_store_open_url(dead, &o, &s) == TDIST_ERR_TIMEOUT);
  MP_CHECK(st_now_ms() - t0 >= 390 && strstr(tdist_last_error(), dead) != NULL);
  return 0;
}

static void test_semantics(void **state) {
  new_url("ops");
  assert_int_equal(tdist_mp_run(NPROC, ops_child, NULL, 90), 0);
  new_url("wake");
  assert_int_equal(tdist_mp_run(2, wake_child, NULL, 60), 0);
  new_url("args");
  assert_int_equal(tdist_mp_run(1, args_child, NULL, 60), 0);
}

/* The client refuses what etcd would (TDIST_STORE_ETCD_MAX_REQUEST_BYTES,
 * here etcd's default, although this cluster takes 100 MiB): nothing is
 * sent, and the error names the setting. */
static int limit_child(int rank, int n, void *arg) {
  setenv("TDIST_STORE_ETCD_MAX_REQUEST_BYTES", "1572864", 1); /* read first here */
  tdist_store_t *s;
  MP_CHECK_RC(open_store(&s));
  size_t n2 = 2 << 20;
  char *v = calloc(1, n2);
  MP_CHECK(tdist_store_set(s, "limit/big", v, n2) == TDIST_ERR_TOO_LARGE);
  MP_CHECK(strstr(tdist_last_error(), "TDIST_STORE_ETCD_MAX_REQUEST_BYTES") != NULL);
  int all = 1;
  const char *k = "limit/big";
  MP_CHECK_RC(tdist_store_check(s, &k, 1, &all));
  MP_CHECK(all == 0); /* not written */
  MP_CHECK_RC(tdist_store_set(s, "limit/ok", v, 1 << 20));
  MP_CHECK(tdist_store_append(s, "limit/ok", v, 1 << 20) == TDIST_ERR_TOO_LARGE);
  void *g;
  size_t gl;
  MP_CHECK_RC(tdist_store_get(s, "limit/ok", &g, &gl, 1000));
  MP_CHECK(gl == 1 << 20);
  tdist_store_free(g);
  free(v);
  tdist_store_release(s);
  return 0;
}

static void test_request_limit(void **state) {
  new_url("limit");
  assert_int_equal(tdist_mp_run(1, limit_child, NULL, 60), 0);
}

/* ---- 2. failover ------------------------------------------------------------------------ */

static void test_failover_list(void **state) {
  char saved[512];
  snprintf(saved, sizeof(saved), "%s", g_eps); /* a dead endpoint first, then the cluster */
  snprintf(g_eps, sizeof(g_eps), "127.0.0.1:%d,%.480s", tdist_mp_free_port(), saved);
  new_url("failover");
  assert_int_equal(tdist_mp_run(NPROC, ops_child, NULL, 90), 0);
  snprintf(g_eps, sizeof(g_eps), "%s", saved);
}

/* ---- 3. a job that loses an etcd member, then rank 0 ------------------------------------ */

/* DIR/<name>.<rank>: a number one process writes (through a rename, never
 * seen half-written) and another polls; -1 when absent. */
static void job_put(const char *name, int rank, long v) {
  char path[400], tmp[420];
  snprintf(path, sizeof(path), "%s/%s.%d", g_dir, name, rank);
  snprintf(tmp, sizeof(tmp), "%s.tmp%d", path, (int)getpid());
  FILE *f = fopen(tmp, "w");
  if (!f) return;
  fprintf(f, "%ld\n", v);
  fclose(f);
  rename(tmp, path);
}

static long job_flag(int rank, const char *name) {
  char path[400];
  long v = -1;
  snprintf(path, sizeof(path), "%s/%s.%d", g_dir, name, rank);
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  if (fscanf(f, "%ld", &v) != 1) v = -1;
  fclose(f);
  return v;
}

/* Wait (bounded, generously) until flag `name` of `rank` is set. */
static int job_wait(int rank, const char *name, int64_t ms) {
  for (int64_t t0 = st_now_ms(); st_now_ms() - t0 < ms; st_sleep_ms(5))
    if (job_flag(rank, name) > 0) return 0;
  return -1;
}

/* Input element i of world rank r: small integers, exact float sums. */
static float gen(int r, size_t i, int salt) {
  unsigned h = (unsigned)r * 7u + (unsigned)(i % 1000003) * 13u + (unsigned)salt * 5u;
  return (float)((int)(h % 9u) - 4);
}

/* all_reduce SUM over g, checked against the inputs of g's world ranks. */
static int checked_all_reduce(tdist_group_t *g, int me, size_t count, int salt) {
  float *v = malloc(count * sizeof(float));
  MP_CHECK(v != NULL);
  int n = tdist_group_size(g), world[NPROC];
  for (int r = 0; r < n; r++)
    world[r] = tdist_group_global_rank(g, r);
  for (size_t i = 0; i < count; i++)
    v[i] = gen(me, i, salt);
  int rc = tdist_all_reduce(g, v, v, count, TDIST_FLOAT32, TDIST_SUM, NULL, NULL), bad = 0;
  for (size_t i = 0; rc == 0 && i < count && !bad; i++) {
    float want = 0;
    for (int r = 0; r < n; r++)
      want += gen(world[r], i, salt);
    bad = v[i] != want;
  }
  free(v);
  MP_CHECK_RC(rc);
  MP_CHECK(!bad);
  return 0;
}

static int job_child(int me, int n, void *arg) {
  tdist_init_opts_t o = {.mask = TDIST_INIT_FIELD_BACKEND | TDIST_INIT_FIELD_INIT_METHOD |
                                 TDIST_INIT_FIELD_RANK | TDIST_INIT_FIELD_WORLD_SIZE |
                                 TDIST_INIT_FIELD_TIMEOUT,
                         .backend = "cpu",
                         .init_method = g_url,
                         .rank = me,
                         .world_size = n,
                         .timeout_ms = 60000};
  tdist_group_t *g = NULL, *s = NULL;
  MP_CHECK_RC(tdist_init_process_group(&o, &g));
  for (int i = 0; i < 3; i++)
    MP_CHECK(checked_all_reduce(g, me, 4096, i) == 0);
  job_put("ready", me, 1);
  MP_CHECK(job_wait(0, "member_killed", 60000) == 0);
  /* Go on for two lease TTLs without that member: the heartbeats fail over, so
   * no lease expires and nobody is declared dead. Rank 0 decides the count. */
  int64_t t1 = st_now_ms();
  for (int32_t more = 1, round = 0; more; round++) {
    MP_CHECK(checked_all_reduce(g, me, 1000 + (size_t)round, 10 + round % 7) == 0);
    more = me == 0 ? st_now_ms() - t1 < 2 * HB_TIMEOUT_MS : 0;
    MP_CHECK_RC(tdist_broadcast(g, &more, 1, TDIST_INT32, 0, NULL, NULL));
  }
  MP_CHECK(!tdist_group_is_aborted(g));
  tdist_store_t *st = NULL;
  MP_CHECK_RC(open_store(&st));
  for (int r = 0; r < n; r++) { /* nobody dead; everybody's lease is alive */
    char key[48];
    int exists = 1;
    snprintf(key, sizeof(key), "tdist/dead/%d", r);
    const char *k = key;
    MP_CHECK_RC(tdist_store_check(st, &k, 1, &exists));
    MP_CHECK(exists == 0);
    snprintf(key, sizeof(key), "tdist/alive/%d", r);
    MP_CHECK_RC(tdist_store_check(st, &k, 1, &exists));
    MP_CHECK(exists == 1);
  }
  /* Rank 0 dies with the others' all_reduce in flight. */
  float v[1000];
  for (int i = 0; i < 1000; i++)
    v[i] = gen(me, (size_t)i, 3);
  if (me == 0) {
    for (int r = 1; r < n; r++)
      MP_CHECK(job_wait(r, "submitted", 30000) == 0);
    fflush(NULL);
    kill(getpid(), SIGKILL);
  }
  tdist_work_t *w = NULL;
  int rc = tdist_all_reduce(g, v, v, 1000, TDIST_FLOAT32, TDIST_SUM, NULL, &w);
  job_put("submitted", me, 1);
  const char *msg = tdist_last_error();
  if (rc == 0) {
    rc = tdist_work_wait(w, 0);
    msg = tdist_work_error_message(w);
  }
  if (rc != TDIST_ERR_REMOTE_FAILED || !strstr(msg, "rank 0 (world rank 0"))
    fprintf(stderr, "rank %d: all_reduce after rank 0 died: %s: %s\n", me, tdist_err_name(rc), msg);
  MP_CHECK(rc == TDIST_ERR_REMOTE_FAILED);
  MP_CHECK(strstr(msg, "rank 0 (world rank 0") != NULL);
  tdist_work_release(w);
  /* Shrink: waits for the lease detector's death record of rank 0. */
  MP_CHECK_RC(tdist_group_shrink(g, NULL, &s));
  MP_CHECK(tdist_group_size(s) == n - 1 && tdist_group_rank(s) == me - 1);
  for (int i = 0; i < n - 1; i++)
    MP_CHECK(tdist_group_global_rank(s, i) == i + 1);
  MP_CHECK(checked_all_reduce(s, me, (1u << 16) + 3, 11) == 0);
  void *why = NULL;
  size_t wl = 0;
  MP_CHECK_RC(tdist_store_get(st, "tdist/dead/0", &why, &wl, 1000));
  MP_CHECK(wl > 0 && memmem(why, wl, "etcd lease expired", 18) != NULL);
  tdist_store_free(why);
  for (int r = 1; r < n; r++) { /* the survivors were never declared dead */
    char key[48];
    int exists = 1;
    snprintf(key, sizeof(key), "tdist/dead/%d", r);
    const char *k = key;
    MP_CHECK_RC(tdist_store_check(st, &k, 1, &exists));
    MP_CHECK(exists == 0);
  }
  tdist_store_release(st);
  MP_CHECK_RC(tdist_group_destroy(s));
  tdist_group_destroy(g); /* aborted: its pending work was failed already */
  return 0;
}

/* The member that leads the cluster now (asked through etcd_http.c), or 0. */
static int find_leader(void) {
  for (int i = 0; i < ec.n; i++) {
    char ep[64], *eps[1] = {ep};
    snprintf(ep, sizeof(ep), "%s:%d", ec.m[i].ip, ec.m[i].client_port);
    tdist__etcd_http_t *h = NULL;
    json_object *rep = NULL, *hdr = NULL;
    if (ec.m[i].pid <= 0 || tdist__etcd_http_new(eps, 1, &h)) continue;
    if (tdist__etcd_post(h, "/v3/maintenance/status", json_object_new_object(), st_now_ms() + 5000,
                         &rep, NULL) == 0 &&
        json_object_object_get_ex(rep, "header", &hdr) &&
        tdist__etcd_i64(hdr, "member_id", 0) == tdist__etcd_i64(rep, "leader", -1)) {
      json_object_put(rep);
      tdist__etcd_http_free(h);
      return i;
    }
    json_object_put(rep);
    tdist__etcd_http_free(h);
  }
  return 0;
}

static void test_job_member_and_rank0_killed(void **state) {
  new_url("job");
  snprintf(g_dir, sizeof(g_dir), "%s/job%d", ec.dir, g_run);
  assert_int_equal(mkdir(g_dir, 0700), 0);
  int codes[NPROC];
  /* The member to kill: the leader, the harder case (an election follows,
   * during which no write or keep-alive succeeds). */
  int victim = find_leader();
  printf("killing etcd member %d (the leader) mid-job\n", victim);
  pid_t killer = fork(); /* kills it once every rank is warm */
  if (killer == 0) {
    for (int64_t t0 = st_now_ms(); st_now_ms() - t0 < 60000; st_sleep_ms(20)) {
      int ready = 0;
      for (int r = 0; r < NPROC; r++)
        ready += job_flag(r, "ready") > 0;
      if (ready < NPROC) continue;
      kill(ec.m[victim].pid, SIGKILL);
      st_sleep_ms(200); /* its port refuses connections by now */
      job_put("member_killed", 0, 1);
      _exit(0);
    }
    _exit(1);
  }
  int failed = tdist_mp_run_codes(NPROC, job_child, NULL, 150, codes);
  int st = 0;
  waitpid(killer, &st, 0);
  /* Reap the member the child killed. A child that gave up (the ranks never
   * got ready: their failure is reported below) killed nobody, and a wait
   * for that member would never return: the teardown stops it. */
  if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
    waitpid(ec.m[victim].pid, NULL, 0);
    ec.m[victim].pid = 0;
  }
  if (failed != 1 || codes[0] != 128 + SIGKILL) ec_dump_logs();
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  assert_int_equal(codes[0], 128 + SIGKILL); /* rank 0 killed itself */
  for (int r = 1; r < NPROC; r++)
    assert_int_equal(codes[r], 0);
}

/* ---- tdistrun --store etcd://: twice on one URL (each run its own sub-prefix) ---- */

static void test_launcher_store(void **state) {
  new_url("launcher");
  for (int run = 0; run < 2; run++) {
    char cmd[1200], line[256];
    snprintf(cmd, sizeof(cmd), "%s -n 4 --store %s %s rdzv 2>&1", TDISTRUN, g_url, PROBE);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    int seen = 0;
    while (fgets(line, sizeof(line), p)) {
      int r, n;
      fputs(line, stdout);
      if (sscanf(line, "[rank %*d] RDZV rank %d size %d", &r, &n) == 2 && n == 4) seen |= 1 << r;
    }
    int st = pclose(p);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_int_equal(seen, 0xf);
  }
}

/* ---- 4. semantics with a member gone --------------------------------------------------- */

static void test_semantics_member_down(void **state) {
  new_url("down");
  assert_int_equal(tdist_mp_run(NPROC, ops_child, NULL, 90), 0);
}

static int cluster_ready_child(int rank, int n, void *arg) {
  for (int i = 0; i < ec.n; i++) { /* every member answers, and a leader exists */
    char url[128];
    snprintf(url, sizeof(url), "etcd://%s:%d/ready", ec.m[i].ip, ec.m[i].client_port);
    tdist_store_t *s;
    tdist_store_opts_t o = {.mask = TDIST_STORE_FIELD_TIMEOUT, .timeout_ms = 30000};
    MP_CHECK_RC(tdist_store_open_url(url, &o, &s));
    MP_CHECK_RC(tdist_store_set(s, "up", "1", 1));
    tdist_store_release(s);
  }
  return 0;
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (ec_find_binary() != 0) {
    printf("SKIPPED: etcd not found (set TDIST_ETCD_BIN, or apt-get install etcd-server)\n");
    return 0;
  }
  if (ec_start(3) != 0) return 1;
  ec_endpoints(g_eps, sizeof(g_eps), 0);
  if (tdist_mp_run(1, cluster_ready_child, NULL, 60) != 0) {
    ec_dump_logs();
    return 1;
  }
  /* Every process of the job: leases of 3 s, heartbeats every 250 ms;
   * flight-recorder dumps in the cluster's temp dir. */
  char prefix[300];
  snprintf(prefix, sizeof(prefix), "%s/", ec.dir);
  setenv("TDIST_TRACE_PREFIX", prefix, 1);
  setenv("TDIST_HEARTBEAT_TIMEOUT_MS", "3000", 1);
  setenv("TDIST_HEARTBEAT_INTERVAL_MS", "250", 1);
  /* The cluster takes requests of 100 MiB (etcd_cluster.h): so may the client. */
  setenv("TDIST_STORE_ETCD_MAX_REQUEST_BYTES", "104857600", 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_semantics),
      cmocka_unit_test(test_request_limit),
      cmocka_unit_test(test_failover_list),
      cmocka_unit_test(test_launcher_store),
      cmocka_unit_test(test_job_member_and_rank0_killed),
      cmocka_unit_test(test_semantics_member_down),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
