/*
 * test_store_scale.c - 1024 concurrent client connections performing a
 * rendezvous (each sets its address, all read all, a barrier via add/wait),
 * from 8 processes of 128 connections each, against a server in a 9th; and
 * the file store under concurrent processes.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "store_test_util.h"

#define NCLIENT_PROCS 8
#define PER_PROC 128
#define NCONN (NCLIENT_PROCS * PER_PROC)

static int g_port;

static int scale_child(int rank, int n, void *arg) {
  st_raise_nofile();
  if (rank == 0) {
    tdist_store_server_t *srv;
    tdist_store_t *s;
    MP_CHECK_RC(st_start_server(g_port, NULL, &srv));
    MP_CHECK_RC(st_connect(g_port, 10000, &s));
    const char *k = "all/done";
    MP_CHECK_RC(tdist_store_wait(s, &k, 1, 90000));
    MP_CHECK(tdist_store_server_num_keys(srv) >= NCONN);
    tdist_store_release(s);
    tdist_store_server_stop(srv);
    return 0;
  }
  int base = (rank - 1) * PER_PROC;
  tdist_store_t *c[PER_PROC];
  char key[64], val[64];
  for (int i = 0; i < PER_PROC; i++)
    MP_CHECK_RC(st_connect(g_port, 30000, &c[i]));
  for (int i = 0; i < PER_PROC; i++) {
    snprintf(key, sizeof(key), "addr/%d", base + i);
    snprintf(val, sizeof(val), "10.0.%d.%d:%d", (base + i) / 256, (base + i) % 256, base + i);
    MP_CHECK_RC(tdist_store_set(c[i], key, val, strlen(val)));
  }
  static char kbuf[NCONN][24];
  static const char *keys[NCONN];
  static void *vals[NCONN];
  static size_t lens[NCONN];
  for (int j = 0; j < NCONN; j++) {
    snprintf(kbuf[j], sizeof(kbuf[j]), "addr/%d", j);
    keys[j] = kbuf[j];
  }
  for (int i = 0; i < PER_PROC; i++) {
    MP_CHECK_RC(tdist_store_multi_get(c[i], keys, NCONN, vals, lens, 60000));
    for (int j = 0; j < NCONN; j++) {
      snprintf(val, sizeof(val), "10.0.%d.%d:%d", j / 256, j % 256, j);
      MP_CHECK(lens[j] == strlen(val) && memcmp(vals[j], val, lens[j]) == 0);
      tdist_store_free(vals[j]);
    }
  }
  for (int i = 0; i < PER_PROC; i++) {
    int64_t v;
    MP_CHECK_RC(tdist_store_add(c[i], "arrived", 1, &v));
    if (v == NCONN) MP_CHECK_RC(tdist_store_set(c[i], "go", "", 0));
  }
  const char *go = "go";
  for (int i = 0; i < PER_PROC; i++)
    MP_CHECK_RC(tdist_store_wait(c[i], &go, 1, 60000));
  int64_t left;
  MP_CHECK_RC(tdist_store_add(c[0], "left", 1, &left));
  if (left == NCLIENT_PROCS) MP_CHECK_RC(tdist_store_set(c[0], "all/done", "", 0));
  for (int i = 0; i < PER_PROC; i++)
    tdist_store_release(c[i]);
  return 0;
}

static void test_rendezvous_1024_connections(void **state) {
  g_port = tdist_mp_free_port();
  assert_int_equal(tdist_mp_run(NCLIENT_PROCS + 1, scale_child, NULL, 100), 0);
}

/* ---- file store ------------------------------------------------------------------------ */

static char g_path[256];
#define FILE_PROCS 4
#define FILE_ADDS 100

static int file_child(int rank, int n, void *arg) {
  tdist_store_t *s, *v;
  tdist_store_opts_t o = {.mask = TDIST_STORE_FIELD_TIMEOUT, .timeout_ms = 20000};
  MP_CHECK_RC(tdist_store_open_file(g_path, &o, &s));
  MP_CHECK_RC(tdist_store_prefix(s, "p/", &v));
  char key[32];
  /* concurrent counters: no lost updates */
  for (int i = 0; i < FILE_ADDS; i++)
    MP_CHECK_RC(tdist_store_add(v, "ctr", 1, NULL));
  snprintf(key, sizeof(key), "r/%d", rank);
  MP_CHECK_RC(tdist_store_set(v, key, &rank, sizeof(rank)));
  /* get waits for another process's write */
  snprintf(key, sizeof(key), "r/%d", (rank + 1) % n);
  void *val;
  size_t l;
  MP_CHECK_RC(tdist_store_get(v, key, &val, &l, 20000));
  MP_CHECK(l == sizeof(int) && *(int *)val == (rank + 1) % n);
  tdist_store_free(val);
  char c = (char)('a' + rank);
  MP_CHECK_RC(tdist_store_append(v, "log", &c, 1));
  int64_t a;
  MP_CHECK_RC(tdist_store_add(v, "arrived", 1, &a));
  if (a == n) MP_CHECK_RC(tdist_store_set(v, "go", "", 0));
  const char *go = "go";
  MP_CHECK_RC(tdist_store_wait(v, &go, 1, 20000));
  MP_CHECK_RC(tdist_store_add(v, "ctr", 0, &a));
  MP_CHECK(a == (int64_t)n * FILE_ADDS);
  MP_CHECK_RC(tdist_store_get(s, "p/log", &val, &l, 1000));
  MP_CHECK(l == (size_t)n);
  tdist_store_free(val);
  /* compare_set: one winner */
  void *cur;
  MP_CHECK_RC(tdist_store_compare_set(v, "owner", NULL, 0, &rank, sizeof(rank), &cur, &l));
  tdist_store_free(cur);
  int all;
  const char *ck[] = {"ctr", "log"};
  MP_CHECK_RC(tdist_store_check(v, ck, 2, &all));
  MP_CHECK(all);
  /* timeout */
  MP_CHECK(tdist_store_get(v, "nope", &val, &l, 50) == TDIST_ERR_TIMEOUT);
  MP_CHECK(strstr(tdist_last_error(), "nope") && strstr(tdist_last_error(), g_path));
  tdist_store_release(v);
  tdist_store_release(s);
  return 0;
}

static void test_file_store_concurrency(void **state) {
  snprintf(g_path, sizeof(g_path), "/tmp/tdist-store-test-%d", (int)getpid());
  unlink(g_path);
  assert_int_equal(tdist_mp_run(FILE_PROCS, file_child, NULL, 60), 0);
  tdist_store_t *s;
  assert_int_equal(tdist_store_open_file(g_path, NULL, &s), 0);
  int64_t nk;
  assert_int_equal(tdist_store_num_keys(s, &nk), 0);
  assert_int_equal(nk, FILE_PROCS + 5);
  int del;
  assert_int_equal(tdist_store_delete(s, "p/go", &del), 0);
  assert_int_equal(del, 1);
  const char *mk[] = {"a", "b"};
  const void *mv[] = {"1", "22"};
  size_t ml[] = {1, 2};
  assert_int_equal(tdist_store_multi_set(s, mk, mv, ml, 2), 0);
  void *gv[2];
  size_t gl[2];
  assert_int_equal(tdist_store_multi_get(s, mk, 2, gv, gl, 1000), 0);
  assert_int_equal(gl[1], 2);
  tdist_store_free(gv[0]);
  tdist_store_free(gv[1]);
  tdist_store_release(s);
  unlink(g_path);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rendezvous_1024_connections),
      cmocka_unit_test(test_file_store_concurrency),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
