/*
 * test_store_etcd_scale.c - the etcd store's paths that keep it working at
 * many ranks (docs/scale.md, "The etcd store at scale"), against a real
 * one-member etcd on loopback (etcd_cluster.h), with processes:
 *   1. the rendezvous counts arrivals with one key per rank and a count,
 *      not a shared counter: NPROC ranks meet twice (two rounds, as a
 *      process that joins again), agree on one job id per round, and no
 *      "arrived" counter is ever written;
 *   2. a duplicate rank is still refused, and ranks that time out still
 *      name how many arrived;
 *   3. a waiting multi_get of NKEYS keys (three txns of reads) while the
 *      other processes put them one at a time, one key deleted and put
 *      again, one key asked for twice: the values are the last ones put,
 *      and etcd's own count of ranges read (its /metrics) shows the keys
 *      were read O(once), not once per put; a multi_get that times out
 *      names its first missing key;
 *   4. add 0 on a counter that exists is a read: etcd's revision does not
 *      move (no write), while add 0 on a missing key creates it as the TCP
 *      store does.
 * Without an etcd binary the test prints "SKIPPED: ..." and exits 0.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "etcd_cluster.h"
#include "store/rendezvous.h"
#include "store/store_impl.h"
#include "store_test_util.h"
#include "tdist/tdist.h"

#define NPROC 6
#define NKEYS 300 /* more than two txns of 128 ranges */

static char g_url[640];
static int g_run;

static void new_url(const char *what) {
  snprintf(g_url, sizeof(g_url), "etcd://%s:%d/t%d-%s-%d", ec.m[0].ip, ec.m[0].client_port,
           (int)getpid(), what, g_run++);
}

static int open_view(const char *prefix, tdist_store_t **root, tdist_store_t **view) {
  tdist_store_opts_t o = {.mask = TDIST_STORE_FIELD_TIMEOUT, .timeout_ms = 30000};
  int rc = tdist_store_open_url(g_url, &o, root);
  if (rc == 0 && prefix) rc = tdist_store_prefix(*root, prefix, view);
  return rc;
}

/* A counter from etcd's /metrics (plain HTTP on the client port); -1 on
 * failure. */
static long long etcd_metric(const char *name) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(ec.m[0].client_port)};
  inet_pton(AF_INET, ec.m[0].ip, &a.sin_addr);
  if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
    if (fd >= 0) close(fd);
    return -1;
  }
  const char req[] = "GET /metrics HTTP/1.0\r\n\r\n";
  if (write(fd, req, sizeof(req) - 1) != (ssize_t)(sizeof(req) - 1)) {
    close(fd);
    return -1;
  }
  size_t cap = 1 << 20, len = 0;
  char *buf = malloc(cap + 1);
  for (ssize_t r; buf && len < cap && (r = read(fd, buf + len, cap - len)) > 0;)
    len += (size_t)r;
  close(fd);
  if (!buf) return -1;
  buf[len] = 0;
  long long v = -1;
  size_t nl = strlen(name);
  for (char *p = buf; (p = strstr(p, name)); p += nl)
    if ((p == buf || p[-1] == '\n') && p[nl] == ' ') {
      v = strtoll(p + nl + 1, NULL, 10);
      break;
    }
  free(buf);
  return v;
}

/* ---- 1. the rendezvous: one key per rank ------------------------------------------------ */

static int rdzv_child(int rank, int n, void *arg) {
  tdist_store_t *root = NULL, *v = NULL;
  char job[64], key[64], mine[80];
  MP_CHECK_RC(open_view("tdist/rdzv/", &root, &v));
  MP_CHECK(tdist__store_counts_prefixes(v));
  for (int round = 0; round < 2; round++) {
    MP_CHECK_RC(tdist__rendezvous_round(v, rank, n, 60000, job, sizeof(job)));
    snprintf(key, sizeof(key), "in/%d/%d", round, rank);
    const char *k = key;
    int exists = 0;
    MP_CHECK_RC(tdist_store_check(v, &k, 1, &exists));
    MP_CHECK(exists);
    /* Every rank of the round has the job id rank 0 has. */
    snprintf(key, sizeof(key), "test/job/%d/%d", round, rank);
    MP_CHECK_RC(tdist_store_set(root, key, job, strlen(job)));
    snprintf(key, sizeof(key), "test/job/%d/0", round);
    void *j0 = NULL;
    size_t jl = 0;
    MP_CHECK_RC(tdist_store_get(root, key, &j0, &jl, 30000));
    snprintf(mine, sizeof(mine), "%.*s", (int)jl, (char *)j0);
    tdist_store_free(j0);
    MP_CHECK(strcmp(mine, job) == 0);
  }
  /* The round count was this rank's own: nobody added to "arrived". */
  const char *k = "arrived";
  int exists = 1;
  MP_CHECK_RC(tdist_store_check(v, &k, 1, &exists));
  MP_CHECK(!exists);
  int64_t count = 0;
  MP_CHECK_RC(tdist__store_count_prefix(v, "in/1/", &count));
  MP_CHECK(count == n);
  tdist_store_release(v);
  tdist_store_release(root);
  return 0;
}

static void test_rendezvous_by_keys(void **state) {
  new_url("rdzv");
  assert_int_equal(tdist_mp_run(NPROC, rdzv_child, NULL, 120), 0);
}

/* ---- 2. a duplicate is refused; a timeout names the arrivals ---------------------------- */

#define DUP_SIZE 5 /* ranks 0..2 arrive, and a second rank 1: 3 of 5 */

static int dup_child(int who, int n, void *arg) {
  tdist_store_t *root = NULL, *v = NULL;
  char job[64];
  MP_CHECK_RC(open_view("tdist/rdzv/", &root, &v));
  if (who < 3) { /* ranks 0, 1, 2: time out naming 3 of 5 */
    int rc = tdist__rendezvous_round(v, who, DUP_SIZE, 4000, job, sizeof(job));
    MP_CHECK(rc == TDIST_ERR_TIMEOUT);
    MP_CHECK(strstr(tdist_last_error(), "3 of WORLD_SIZE=5 ranks arrived") != NULL);
  } else { /* a second rank 1, once the first claimed it */
    const char *k = "in/0/1";
    MP_CHECK_RC(tdist_store_wait(v, &k, 1, 30000));
    int rc = tdist__rendezvous_round(v, 1, DUP_SIZE, 4000, job, sizeof(job));
    MP_CHECK(rc == TDIST_ERR_INVALID_ARGUMENT);
    MP_CHECK(strstr(tdist_last_error(), "RANK=1 is claimed by two processes") != NULL);
  }
  tdist_store_release(v);
  tdist_store_release(root);
  return 0;
}

static void test_rendezvous_dup_and_timeout(void **state) {
  new_url("dup");
  assert_int_equal(tdist_mp_run(4, dup_child, NULL, 120), 0);
}

/* ---- 3. the waiting multi_get ----------------------------------------------------------- */

static void key_of(int i, char *k, size_t kl) { snprintf(k, kl, "addr/%05d", i); }

static int mget_child(int rank, int n, void *arg) {
  tdist_store_t *root = NULL;
  char key[32], val[48];
  MP_CHECK_RC(open_view(NULL, &root, NULL));
  if (rank == 0) { /* the reader: NKEYS + 1 keys (key 7 twice) */
    const char *keys[NKEYS + 1];
    char names[NKEYS][32];
    for (int i = 0; i < NKEYS; i++) {
      key_of(i, names[i], sizeof(names[i]));
      keys[i] = names[i];
    }
    keys[NKEYS] = names[7];
    MP_CHECK_RC(tdist_store_set(root, "reader/started", "", 0));
    void *vals[NKEYS + 1];
    size_t lens[NKEYS + 1];
    MP_CHECK_RC(tdist_store_multi_get(root, keys, NKEYS + 1, vals, lens, 60000));
    for (int i = 0; i <= NKEYS; i++) {
      int k = i < NKEYS ? i : 7;
      snprintf(val, sizeof(val), "%s-v%d", keys[i], k == 3 ? 2 : 1); /* key 3: its second value */
      MP_CHECK(lens[i] == strlen(val) && memcmp(vals[i], val, lens[i]) == 0);
    }
    for (int i = 0; i <= NKEYS; i++)
      tdist_store_free(vals[i]);
    return 0;
  }
  /* The writers: keys rank-1, rank-1 + (n-1), ... one put each, after the
   * reader started; key 3 is put, deleted and put again. */
  const char *sk = "reader/started";
  MP_CHECK_RC(tdist_store_wait(root, &sk, 1, 30000));
  st_sleep_ms(300); /* mostly after its read: the watch delivers them */
  for (int i = rank - 1; i < NKEYS; i += n - 1) {
    key_of(i, key, sizeof(key));
    snprintf(val, sizeof(val), "%s-v1", key);
    if (i == 3) {
      MP_CHECK_RC(tdist_store_set(root, key, "early", 5));
      int deleted = 0;
      MP_CHECK_RC(tdist_store_delete(root, key, &deleted));
      MP_CHECK(deleted);
      snprintf(val, sizeof(val), "%s-v2", key);
    }
    MP_CHECK_RC(tdist_store_set(root, key, val, strlen(val)));
  }
  tdist_store_release(root);
  return 0;
}

static void test_waiting_multi_get(void **state) {
  new_url("mget");
  long long before = etcd_metric("etcd_mvcc_range_total");
  assert_true(before >= 0);
  assert_int_equal(tdist_mp_run(4, mget_child, NULL, 120), 0);
  long long ranges = etcd_metric("etcd_mvcc_range_total") - before;
  /* One read of the NKEYS + 1 keys, a few small ones (the writers' waits,
   * opening handles); re-reading all keys after each of the NKEYS puts,
   * as before, would be ~NKEYS^2. */
  printf("waiting multi_get of %d keys: %lld ranges read by etcd\n", NKEYS + 1, ranges);
  assert_true(ranges < 4 * (NKEYS + 1));
}

static int mget_timeout_child(int rank, int n, void *arg) {
  tdist_store_t *root = NULL;
  MP_CHECK_RC(open_view(NULL, &root, NULL));
  MP_CHECK_RC(tdist_store_set(root, "here/a", "1", 1));
  const char *keys[] = {"here/a", "never/b", "never/c"};
  void *vals[3];
  size_t lens[3];
  int rc = tdist_store_multi_get(root, keys, 3, vals, lens, 1500);
  MP_CHECK(rc == TDIST_ERR_TIMEOUT);
  MP_CHECK(strstr(tdist_last_error(), "never/b") != NULL);
  tdist_store_release(root);
  return 0;
}

static void test_waiting_multi_get_timeout(void **state) {
  new_url("mget-to");
  assert_int_equal(tdist_mp_run(1, mget_timeout_child, NULL, 60), 0);
}

/* ---- 4. add 0 reads --------------------------------------------------------------------- */

static int add0_child(int rank, int n, void *arg) {
  tdist_store_t *root = NULL;
  int64_t v = -1;
  MP_CHECK_RC(open_view(NULL, &root, NULL));
  MP_CHECK_RC(tdist_store_add(root, "count", 5, &v));
  MP_CHECK(v == 5);
  long long rev = etcd_metric("etcd_debugging_mvcc_current_revision");
  for (int i = 0; i < 20; i++) {
    MP_CHECK_RC(tdist_store_add(root, "count", 0, &v));
    MP_CHECK(v == 5);
  }
  MP_CHECK(rev > 0 && etcd_metric("etcd_debugging_mvcc_current_revision") == rev);
  MP_CHECK_RC(tdist_store_add(root, "fresh", 0, &v)); /* missing: created, as on TCP */
  MP_CHECK(v == 0);
  const char *k = "fresh";
  int exists = 0;
  MP_CHECK_RC(tdist_store_check(root, &k, 1, &exists));
  MP_CHECK(exists);
  tdist_store_release(root);
  return 0;
}

static void test_add_zero_is_a_read(void **state) {
  new_url("add0");
  assert_int_equal(tdist_mp_run(1, add0_child, NULL, 60), 0);
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (ec_find_binary() != 0) {
    printf("SKIPPED: etcd not found (set TDIST_ETCD_BIN, or apt-get install etcd-server)\n");
    return 0;
  }
  if (ec_start(1) != 0) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rendezvous_by_keys), cmocka_unit_test(test_rendezvous_dup_and_timeout),
      cmocka_unit_test(test_waiting_multi_get),  cmocka_unit_test(test_waiting_multi_get_timeout),
      cmocka_unit_test(test_add_zero_is_a_read),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  if (rc) ec_dump_logs();
  return rc;
}
