/*
 * shrink.c - tdist_group_shrink: a group of the survivors after a failure.
 *
 * Agreement through the store (caller thread, survivors only):
 *   1. each survivor writes "<group>/shrink<e>/in/<rank>" (e counts the
 *      shrinks of this group, the same on every survivor);
 *   2. it waits until every rank of the group has either written its key or
 *      been declared dead by the store ("tdist/dead/<world rank>", written by
 *      the server's liveness detector: at once for a vanished process, after
 *      TDIST_HEARTBEAT_TIMEOUT_MS for a silent one);
 *   3. the first survivor to get there stores the member list with
 *      compare_set on "<group>/shrink<e>/members"; everyone uses the stored
 *      list, so all survivors build the same group even if a death is learnt
 *      at slightly different times.
 * The backend then builds the child without the excluded ranks (ops->shrink).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/group/group.h"
#include "core/ops/ops_int.h"
#include "util/alloc.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/inject.h"

/* Steps 1 and 2: wait until every rank came or died. in[r] = 1 if r came. */
static int gather_survivors(tdist_group_t *g, unsigned e, char *in, int64_t deadline_ms) {
  int rc;
  char key[64];
  snprintf(key, sizeof(key), "shrink%u/in/%d", e, g->rank);
  TDIST_CHECK(tdist_store_set(g->store, key, "1", 1));
  for (;;) {
    if (tdist__ops_rank_gone(g, g->global_ranks[g->rank], 0))
      return tdist__error(TDIST_ERR_REMOTE_FAILED,
                          "tdist_group_shrink: this rank (%d of '%s') was declared dead", g->rank,
                          g->name);
    int missing = -1, nmissing = 0;
    char names[160];
    size_t nlen = 0;
    names[0] = '\0';
    for (int r = 0; r < g->size; r++) {
      if (in[r]) continue;
      snprintf(key, sizeof(key), "shrink%u/in/%d", e, r);
      const char *keys[1] = {key};
      int exists = 0;
      TDIST_CHECK(tdist_store_check(g->store, keys, 1, &exists));
      if (exists)
        in[r] = 1;
      else if (!tdist__ops_rank_gone(g, g->global_ranks[r], 1)) {
        if (missing < 0) missing = r;
        /* "rank 2 (world rank 5), rank 3 (world rank 6)", the first few */
        if (nmissing < 6 && nlen < sizeof(names))
          nlen += (size_t)snprintf(names + nlen, sizeof(names) - nlen, "%srank %d (world rank %d)",
                                   nmissing ? ", " : "", r, g->global_ranks[r]);
        nmissing++;
      }
    }
    if (nmissing == 0) return 0;
    int64_t left = deadline_ms - tdist__now_ms();
    if (left <= 0)
      return tdist__error(TDIST_ERR_TIMEOUT,
                          "tdist_group_shrink of '%s': %s%s neither joined nor were declared dead "
                          "nor left within the group's timeout",
                          g->name, names, nmissing > 6 ? " and others" : "");
    /* Woken by that rank's arrival; a death is seen on the next round. */
    snprintf(key, sizeof(key), "shrink%u/in/%d", e, missing);
    const char *keys[1] = {key};
    rc = tdist_store_wait(g->store, keys, 1, left < 100 ? left : 100);
    if (rc != 0 && rc != TDIST_ERR_TIMEOUT) return rc;
  }
}

/* Step 3: the agreed member list ("r,r,r"), parsed into members[]. */
static int agree(tdist_group_t *g, unsigned e, const char *in, int *members, int *n) {
  size_t cap = (size_t)g->size * 12 + 1, len = 0;
  char *list = tdist__malloc(cap);
  if (!list) return tdist__error(TDIST_ERR_NO_MEMORY, "tdist_group_shrink: out of memory");
  for (int r = 0; r < g->size; r++)
    if (in[r]) len += (size_t)snprintf(list + len, cap - len, "%s%d", len ? "," : "", r);
  char key[48];
  snprintf(key, sizeof(key), "shrink%u/members", e);
  void *cur = NULL;
  size_t curlen = 0;
  int rc = tdist_store_compare_set(g->store, key, "", 0, list, len, &cur, &curlen);
  tdist__free(list);
  if (rc != 0) return rc;
  *n = 0;
  char *text = tdist__malloc(curlen + 1);
  if (!text) {
    tdist_store_free(cur);
    return tdist__error(TDIST_ERR_NO_MEMORY, "tdist_group_shrink: out of memory");
  }
  memcpy(text, cur, curlen);
  text[curlen] = '\0';
  tdist_store_free(cur);
  for (char *p = text; *p;) {
    long r = strtol(p, &p, 10);
    if (r >= 0 && r < g->size && *n < g->size) members[(*n)++] = (int)r;
    if (*p == ',')
      p++;
    else
      break;
  }
  tdist__free(text);
  return 0;
}

int tdist_group_shrink(tdist_group_t *g, const tdist_group_opts_t *opts, tdist_group_t **out) {
  int rc, n = 0, nexcl = 0;
  tdist_group_t *child = NULL;
  char *in = NULL;
  int *members = NULL, *excl = NULL;
  tdist__error_clear();
  if (!out) return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "tdist_group_shrink: NULL out-param");
  *out = NULL;
  if (!g) return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "tdist_group_shrink: NULL group");
  if (!g->ctx->root || !g->bk->caps.shrink || !g->bk->ops->shrink)
    return tdist__error(TDIST_ERR_NOT_SUPPORTED, "tdist_group_shrink: group '%s' %s", g->name,
                        g->ctx->root ? "has a backend that cannot shrink" : "has no store");
  unsigned e = atomic_fetch_add(&g->shrink_count, 1);
  in = tdist__calloc((size_t)g->size, 1);
  members = tdist__calloc((size_t)g->size, sizeof(int));
  excl = tdist__calloc((size_t)g->size, sizeof(int));
  if (!in || !members || !excl) {
    rc = tdist__error(TDIST_ERR_NO_MEMORY, "tdist_group_shrink: out of memory");
    goto fail;
  }
  int64_t deadline = tdist__now_ms() + atomic_load(&g->timeout_ms);
  TDIST_CHECKGOTO(tdist__inject("shrink.gather"), rc, fail);
  TDIST_CHECKGOTO(gather_survivors(g, e, in, deadline), rc, fail);
  TDIST_CHECKGOTO(agree(g, e, in, members, &n), rc, fail);
  for (int r = 0, i = 0; r < g->size; r++) {
    if (i < n && members[i] == r)
      i++;
    else
      excl[nexcl++] = r;
  }
  char name[96], tag[48];
  snprintf(name, sizeof(name), "%.60s/shrink%u", g->name, e);
  snprintf(tag, sizeof(tag), "shrink%u/g/", e);
  uint64_t uid = tdist__mix64(tdist__mix64(g->uid, 0x5348524bu), e);
  rc = tdist__group_child_new(g, members, n, opts, name, uid, tag, &child);
  if (rc == TDIST_ERR_INTERNAL) /* not in the agreed list */
    rc = tdist__error(TDIST_ERR_REMOTE_FAILED,
                      "tdist_group_shrink: rank %d of '%s' was left out by the survivors", g->rank,
                      g->name);
  if (rc) goto fail;
  tdist_backend_params_t p;
  tdist_backend_out_t bo = {NULL, 0, -1};
  tdist__group_params(child, &p);
  p.exclude = excl;
  p.nexclude = nexcl;
  p.group_opts = opts;
  TDIST_CHECKGOTO(tdist__inject("shrink.backend"), rc, fail);
  TDIST_CHECKGOTO(g->bk->ops->shrink(&p, &bo), rc, fail);
  TDIST_CHECKGOTO(tdist__group_adopt(child, &bo), rc, fail);
  TDIST_WARN(CORE, "group '%s' shrunk to '%s': %d of %d ranks left, now rank %d", g->name,
             child->name, n, g->size, child->rank);
  *out = child;
  child = NULL;
fail:
  tdist__group_free(child);
  tdist__free(in);
  tdist__free(members);
  tdist__free(excl);
  return rc;
}
