/*
 * tb_world.h - a world group of the test backend over a real TCP store, for
 * multi-process tests of the core (monitor, liveness, shrink). Rank 0 hosts
 * the store on 127.0.0.1:port. Child-process code: returns 0 or 1 like
 * MP_CHECK.
 */
#ifndef TDIST_TEST_TB_WORLD_H
#define TDIST_TEST_TB_WORLD_H

#include "tdist/tdist.h"

typedef struct tb_world {
  tdist_store_server_t *srv; /* rank 0 only */
  tdist_store_t *st;         /* this rank's client */
  tdist_group_t *g;          /* the world group (test backend) */
  int rank, size;
} tb_world_t;

/* A world group of the test backend with `size` ranks (this process is
 * `rank`) and no store: white-box (the core's own group constructor). */
int tb_group_create(int rank, int size, int64_t timeout_ms, tdist_group_t **g);
/* Start the store (rank 0), connect, create the world group. */
int tb_world_join(int rank, int size, int port, int64_t timeout_ms, tb_world_t *w);
/* Add 1 to `key` and wait (up to 10 s) until it reaches n. */
int tb_store_barrier(tdist_store_t *st, const char *key, int64_t n);
/* Destroy the group; rank 0 keeps the store up until `alive` ranks got here
 * (the others were killed by the test). */
int tb_world_leave(tb_world_t *w, int alive);

#endif
