/* tb_world.c - see tb_world.h. Runs in forked test children. White-box: it
 * builds groups with the core's constructor; the backend itself is the
 * test plug-in (tests/plugins). */
#include "tb_world.h"

#include <stdio.h>
#include <unistd.h>

#include "core/init/registry.h"
#include "core/group/group.h"
#include "mp.h"
#include "test_backend.h"

int tb_world_join(int rank, int size, int port, int64_t timeout_ms, tb_world_t *w) {
  w->srv = NULL;
  w->rank = rank;
  w->size = size;
  if (rank == 0) {
    tdist_store_server_opts_t so = {.mask = TDIST_STORE_SERVER_FIELD_HOST |
                                            TDIST_STORE_SERVER_FIELD_PORT,
                                    .host = "127.0.0.1",
                                    .port = port};
    MP_CHECK_RC(tdist_store_server_start(&so, &w->srv));
  }
  tdist_store_opts_t o = {.mask = TDIST_STORE_FIELD_TIMEOUT, .timeout_ms = 20000};
  MP_CHECK_RC(tdist_store_connect("127.0.0.1", port, &o, &w->st));
  tb_register();
  MP_CHECK_RC(tdist__group_create(tdist__backend_find("test"), rank, size, "world", w->st,
                                  timeout_ms, NULL, &w->g));
  return 0;
}

int tb_group_create(int rank, int size, int64_t timeout_ms, tdist_group_t **g) {
  tb_register();
  const tdist_backend_t *bk = tdist__backend_find("test");
  if (!bk) return TDIST_ERR_NOT_SUPPORTED;
  return tdist__group_create(bk, rank, size, "world", NULL, timeout_ms, NULL, g);
}

int tb_store_barrier(tdist_store_t *st, const char *key, int64_t n) {
  MP_CHECK_RC(tdist_store_add(st, key, 1, NULL));
  int64_t v = 0;
  for (int i = 0; i < 5000 && v < n; i++) {
    MP_CHECK_RC(tdist_store_add(st, key, 0, &v));
    if (v < n) usleep(2000);
  }
  MP_CHECK(v >= n);
  return 0;
}

int tb_world_leave(tb_world_t *w, int alive) {
  MP_CHECK_RC(tdist_store_add(w->st, "tb/left", 1, NULL));
  tdist_group_destroy(w->g);
  if (w->srv) { /* the others may still need the store */
    int64_t v = 0;
    for (int i = 0; i < 5000 && v < alive; i++) {
      tdist_store_add(w->st, "tb/left", 0, &v);
      usleep(2000);
    }
  }
  tdist_store_release(w->st);
  tdist_store_server_stop(w->srv);
  return 0;
}
