/*
 * mesh.c - splits: tdist_new_group and N-dimensional device meshes
 * (TP x DP x CP ...) built from them.
 *
 * A split is collective over the parent: every parent rank publishes the
 * member list it passed and waits for every other rank's (so ranks that
 * disagree fail with MISMATCH, and a rank that never comes is named, before
 * any backend can hang in its split), then the backend splits.
 *
 * Mesh ranks are laid out row-major over the dims, the last dimension varying
 * fastest (as torch's init_device_mesh). For dimension d, the ranks that
 * share every other coordinate form one line; each line becomes a group. All
 * lines of one dimension come from a single split (colour = the line's
 * first rank), so a mesh costs one ncclCommSplit per dimension on NCCL.
 * Caller thread; collective over the parent.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/group/group.h"
#include "core/ops/ops_int.h"
#include "util/alloc.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/inject.h"

#define TDIST_MESH_MAX_DIMS 8

/* ---- waiting for every parent rank ---------------------------------------------- */

/* How long one store wait lasts before the waiter looks for dead ranks and
 * an aborted parent (caller thread). */
#define ARRIVE_SLICE_MS 200

/* Append to buf (cap bytes, *len used so far); output is cut, never overrun. */
static void append(char *buf, size_t cap, size_t *len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void append(char *buf, size_t cap, size_t *len, const char *fmt, ...) {
  if (*len >= cap) return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf + *len, cap - *len, fmt, ap);
  va_end(ap);
  if (n > 0) *len = *len + (size_t)n < cap ? *len + (size_t)n : cap - 1;
}

/* "rank 3 of 'world' (world rank 3)", "ranks 1, 3 of 'tp' (world ranks 5, 7)":
 * parent ranks r[0..n), at most 8 named. */
static void name_ranks(char *buf, size_t cap, const tdist_group_t *parent, const int *r, int n) {
  size_t len = 0;
  buf[0] = '\0';
  for (int pass = 0; pass < 2; pass++) {
    if (pass) append(buf, cap, &len, " of '%s' (world ", parent->name);
    append(buf, cap, &len, "rank%s ", n > 1 ? "s" : "");
    for (int i = 0; i < n && i < 8; i++)
      append(buf, cap, &len, "%s%d", i ? ", " : "", pass ? parent->global_ranks[r[i]] : r[i]);
    if (n > 8) append(buf, cap, &len, ", ... (%d in all)", n);
  }
  append(buf, cap, &len, ")");
}

/* The call and the group in words, for every error of a split:
 * "tdist_new_group 'tp' (ranks 0,1,2,3 of 'world')". */
static void describe(char *buf, size_t cap, const tdist_group_t *parent, const char *call,
                     const tdist_group_opts_t *opts, const char *default_name, const int *members,
                     int n) {
  size_t len = 0;
  const char *name =
      (opts && (opts->mask & TDIST_GROUP_FIELD_NAME) && opts->name) ? opts->name : default_name;
  append(buf, cap, &len, "%s '%.95s' (rank%s ", call, name, n > 1 ? "s" : "");
  for (int i = 0; i < n && i < 16; i++)
    append(buf, cap, &len, "%s%d", i ? "," : "", members[i]);
  if (n > 16) append(buf, cap, &len, ",... (%d in all)", n);
  append(buf, cap, &len, " of '%s')", parent->name);
}

/* 1 if world rank `wr` will never join anything again: it is in the
 * store's dead set ("tdist/dead/<wr>", written by the server's liveness
 * detector), or (`or_left`) it left the job, its last heartbeat being the
 * monitor's "bye". Caller thread; ops_int.h (shrink uses it too). */
int tdist__ops_rank_gone(const tdist_group_t *g, int wr, int or_left) {
  if (!g->ctx->root) return 0;
  char key[48];
  snprintf(key, sizeof(key), "tdist/dead/%d", wr);
  const char *keys[1] = {key};
  int exists = 0;
  if (tdist_store_check(g->ctx->root, keys, 1, &exists) == 0 && exists) return 1;
  if (!or_left) return 0;
  snprintf(key, sizeof(key), "tdist/hb/%d", wr);
  void *v = NULL;
  size_t len = 0;
  if (tdist_store_get(g->ctx->root, key, &v, &len, 1) != 0) return 0; /* 1 ms: it exists */
  int left = len == 3 && memcmp(v, "bye", 3) == 0;
  tdist_store_free(v);
  return left;
}

/*
 * Caller thread. Publish `mine` under "<tag>/<rank>" and get every parent
 * rank's value into vals/lens (freed by the caller with tdist_store_free).
 * The wait goes in slices: after each, the ranks still missing are looked
 * up, so a rank the store declared dead (or a parent aborted meanwhile: a
 * death record) ends it at once with REMOTE_FAILED, and at the deadline the
 * error names the missing ranks and the group in words (`what`), not by
 * store key. Without a failure it costs one set and one multi_get.
 */
static int gather_lists(tdist_group_t *parent, const char *tag, const char *what, const char *mine,
                        int64_t timeout_ms, void **vals, size_t *lens) {
  int rc = 0, size = parent->size;
  char(*keys)[64] = tdist__calloc((size_t)size, sizeof(*keys));
  const char **kp = tdist__calloc((size_t)size, sizeof(*kp));
  char *seen = tdist__calloc((size_t)size, 1);
  int *miss = tdist__calloc((size_t)size, sizeof(int)),
      *dead = tdist__calloc((size_t)size, sizeof(int));
  char names[200];
  if (!keys || !kp || !seen || !miss || !dead) {
    rc = tdist__error(TDIST_ERR_NO_MEMORY, "%s: out of memory", what);
    goto out;
  }
  for (int r = 0; r < size; r++) {
    snprintf(keys[r], sizeof(keys[r]), "%s/%d", tag, r);
    kp[r] = keys[r];
  }
  TDIST_CHECKGOTO(tdist_store_set(parent->store, kp[parent->rank], mine, strlen(mine)), rc, out);
  seen[parent->rank] = 1;
  int64_t deadline = tdist__now_ms() + timeout_ms;
  for (;;) {
    int64_t left = deadline - tdist__now_ms();
    int64_t slice = left < 1 ? 1 : left < ARRIVE_SLICE_MS ? left : ARRIVE_SLICE_MS;
    rc = tdist_store_multi_get(parent->store, kp, (size_t)size, vals, lens, slice);
    if (rc != TDIST_ERR_TIMEOUT) break; /* all there, or the store failed */
    int nmiss = 0, ndead = 0;
    for (int r = 0; r < size; r++) {
      if (seen[r]) continue;
      int exists = 0;
      TDIST_CHECKGOTO(tdist_store_check(parent->store, &kp[r], 1, &exists), rc, out);
      if (exists) {
        seen[r] = 1;
        continue;
      }
      miss[nmiss++] = r;
      if (tdist__ops_rank_gone(parent, parent->global_ranks[r], 1)) dead[ndead++] = r;
    }
    if (atomic_load(&parent->aborted)) {
      rc = tdist__error(parent->abort_status, "%s: '%s' was aborted while its ranks joined: %s",
                        what, parent->name, parent->abort_reason);
      goto out;
    }
    if (ndead) {
      name_ranks(names, sizeof(names), parent, dead, ndead);
      rc = tdist__error(TDIST_ERR_REMOTE_FAILED,
                        "%s: %s failed or left the job before joining (the store declared %s "
                        "dead, or %s monitor said goodbye)",
                        what, names, ndead > 1 ? "them" : "it", ndead > 1 ? "their" : "its");
      goto out;
    }
    if (nmiss && deadline - tdist__now_ms() <= 0) {
      name_ranks(names, sizeof(names), parent, miss, nmiss);
      rc = tdist__error(TDIST_ERR_TIMEOUT,
                        "%s: %s never joined within %lld ms (every rank of '%s' makes the call, "
                        "members or not)",
                        what, names, (long long)timeout_ms, parent->name);
      goto out;
    }
  }
  if (rc == 0) tdist__error_clear(); /* an expired slice is no error */
out:
  tdist__free(keys);
  tdist__free(kp);
  tdist__free(seen);
  tdist__free(miss);
  tdist__free(dead);
  return rc;
}

/* ---- agreeing on the members ------------------------------------------------------ */

/* "c m0,m1,..." : a rank's colour and member list, as it passed them. */
static int list_text(char *buf, size_t cap, int color, int own_device, const int *members, int n) {
  size_t len = (size_t)snprintf(buf, cap, "%d%s ", color, own_device ? "d" : "");
  for (int i = 0; i < n && len < cap; i++)
    len += (size_t)snprintf(buf + len, cap - len, "%s%d", i ? "," : "", members[i]);
  return len < cap ? (int)len : -1;
}

/* Parse "c m0,..." into members (at most cap); returns the count, -1 if bad. */
static int list_parse(const char *v, size_t len, int *members, int cap) {
  char *text = tdist__malloc(len + 1);
  if (!text) return -1;
  memcpy(text, v, len);
  text[len] = '\0';
  char *p = strchr(text, ' ');
  int n = 0;
  while (p && *++p && n < cap) {
    members[n++] = (int)strtol(p, &p, 10);
    if (*p != ',') break;
  }
  tdist__free(text);
  return n;
}

static int contains(const int *list, int n, int r) {
  for (int i = 0; i < n; i++)
    if (list[i] == r) return 1;
  return 0;
}

/* The first token of a published list ends with 'd': a device was named. */
static int names_device(const void *v, size_t len) {
  const char *sp = memchr(v, ' ', len);
  return sp && sp > (const char *)v && sp[-1] == 'd';
}

/*
 * Every parent rank publishes the colour and member list it passed; two
 * ranks of which one lists the other must have passed the same list. So a
 * tdist_new_group called with different lists on different ranks fails
 * here, on every rank, with MISMATCH naming the ranks and both lists, before
 * any backend can hang in its split; a rank that never calls it fails the
 * others with TIMEOUT naming it (REMOTE_FAILED at once if it died). (Mesh
 * lines that do not overlap are not compared.) Skipped without a store
 * (then nothing can hang: no peer).
 */
static int agree_members(tdist_group_t *parent, unsigned idx, int color, int own_device,
                         const int *members, int n, const char *what, int64_t timeout_ms) {
  int rc = 0, size = parent->size;
  if (!parent->store || size < 2) return 0;
  char tag[48];
  snprintf(tag, sizeof(tag), "split%u/members", idx);
  size_t cap = (size_t)n * 12 + 32;
  char *mine = tdist__malloc(cap);
  void **vals = tdist__calloc((size_t)size, sizeof(void *));
  size_t *lens = tdist__calloc((size_t)size, sizeof(size_t));
  int *lists = tdist__calloc((size_t)size * (size_t)size, sizeof(int)),
      *cnt = tdist__calloc((size_t)size, sizeof(int));
  if (!mine || !vals || !lens || !lists || !cnt ||
      list_text(mine, cap, color, own_device, members, n) < 0) {
    rc = tdist__error(TDIST_ERR_NO_MEMORY, "new group of '%s': out of memory", parent->name);
    goto out;
  }
  rc = gather_lists(parent, tag, what, mine, timeout_ms, vals, lens);
  if (rc == TDIST_ERR_CLOSED || rc == TDIST_ERR_IO) {
    /* The store is gone (killed): the lists cannot be compared, and a split
     * of a backend that needs no store (CPU) still works. */
    TDIST_WARN(CORE, "new group of '%s': member lists not compared: %s", parent->name,
               tdist_last_error());
    rc = 0;
    goto out;
  }
  if (rc) goto out;
  for (int r = 0; r < size; r++) {
    cnt[r] = list_parse(vals[r], lens[r], lists + (size_t)r * size, size);
    if (!rc && names_device(vals[r], lens[r]) != own_device)
      rc = tdist__error(TDIST_ERR_MISMATCH,
                        "new group of '%s': rank %d (world rank %d) %s a device for it "
                        "(TDIST_GROUP_FIELD_DEVICE) but rank %d (world rank %d) %s",
                        parent->name, parent->rank, parent->global_ranks[parent->rank],
                        own_device ? "names" : "does not name", r, parent->global_ranks[r],
                        own_device ? "does not" : "does");
  }
  for (int a = 0; a < size && !rc; a++)
    for (int b = a + 1; b < size && !rc; b++) {
      const int *la = lists + (size_t)a * size, *lb = lists + (size_t)b * size;
      if (!contains(la, cnt[a], b) && !contains(lb, cnt[b], a)) continue;
      if (cnt[a] == cnt[b] && memcmp(la, lb, sizeof(int) * (size_t)cnt[a]) == 0) continue;
      const char *sa = memchr(vals[a], ' ', lens[a]), *sb = memchr(vals[b], ' ', lens[b]);
      sa = sa ? sa + 1 : vals[a];
      sb = sb ? sb + 1 : vals[b];
      rc = tdist__error(
          TDIST_ERR_MISMATCH,
          "new group of '%s': ranks disagree on its members: rank %d (world rank "
          "%d) passed [%.*s] but rank %d (world rank %d) passed [%.*s]",
          parent->name, a, parent->global_ranks[a], (int)(lens[a] - (size_t)(sa - (char *)vals[a])),
          sa, b, parent->global_ranks[b], (int)(lens[b] - (size_t)(sb - (char *)vals[b])), sb);
    }
out:
  for (int r = 0; vals && r < size; r++)
    tdist_store_free(vals[r]);
  tdist__free(mine);
  tdist__free(vals);
  tdist__free(lens);
  tdist__free(lists);
  tdist__free(cnt);
  return rc;
}

/* ---- split, new_group, mesh ------------------------------------------------------- */

/* Split (caller thread, collective over parent): ranks with the same colour
 * form a child; `members` lists the child's parent ranks in child-rank order.
 * *out = NULL for non-members (TDIST_BACKEND_NOCOLOR). `call` names the public call
 * in messages ("tdist_new_group"). */
static int split(tdist_group_t *parent, int color, const int *members, int n,
                 const tdist_group_opts_t *opts, const char *call, tdist_group_t **out) {
  int rc;
  tdist_group_t *child = NULL;
  *out = NULL;
  if (atomic_load(&parent->aborted))
    return tdist__error(parent->abort_status, "group '%s' was aborted: %s", parent->name,
                        parent->abort_reason);
  int own_device = opts && (opts->mask & TDIST_GROUP_FIELD_DEVICE);
  if (own_device && (!(parent->bk->caps.mem & TDIST_BACKEND_MEM_DEVICE) || opts->device < 0))
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                        "new group of '%s': a device (%d) is named, but %s", parent->name,
                        opts->device,
                        opts->device < 0 ? "it is negative" : "the backend has no devices");
  unsigned idx = atomic_fetch_add(&parent->split_count, 1);
  char name[96], what[256];
  if (color == 0 || color == TDIST_BACKEND_NOCOLOR)
    snprintf(name, sizeof(name), "%.60s/%u", parent->name, idx);
  else
    snprintf(name, sizeof(name), "%.60s/%u.%d", parent->name, idx, color);
  describe(what, sizeof(what), parent, call, opts, name, members, n);
  int64_t timeout = atomic_load(&parent->timeout_ms);
  if (opts && (opts->mask & TDIST_GROUP_FIELD_TIMEOUT) && opts->timeout_ms > 0)
    timeout = opts->timeout_ms; /* the new group's: it bounds its creation too */
  TDIST_CHECK(agree_members(parent, idx, color, own_device, members, n, what, timeout));
  tdist_backend_params_t p;
  tdist_backend_out_t bo = {NULL, 0, -1};
  if (color != TDIST_BACKEND_NOCOLOR) {
    char tag[48];
    snprintf(tag, sizeof(tag), "%u.%d/", idx, color);
    uint64_t uid = tdist__mix64(tdist__mix64(parent->uid, idx), (uint64_t)(unsigned)color);
    TDIST_CHECKGOTO(tdist__group_child_new(parent, members, n, opts, name, uid, tag, &child), rc,
                    fail);
    tdist__group_params(child, &p);
    p.color = color;
    p.own_device = own_device;
    if (own_device) p.device = opts->device;
    p.group_opts = opts;
  } else {
    memset(&p, 0, sizeof(p));
    p.progress = parent->ctx->progress;
    p.parent = parent->bstate;
    p.parent_rank = parent->rank;
    p.device = parent->device;
    p.timeout_ms = atomic_load(&parent->timeout_ms);
    p.color = TDIST_BACKEND_NOCOLOR;
    p.own_device = own_device;
    p.rank = -1;
    p.group_opts = opts;
  }
  TDIST_CHECKGOTO(tdist__inject("split.backend"), rc, fail);
  TDIST_CHECKGOTO(parent->bk->ops->split(&p, &bo), rc, fail);
  if (child) TDIST_CHECKGOTO(tdist__group_adopt(child, &bo), rc, fail);
  *out = child;
  return 0;
fail:
  if (child && !child->bstate && bo.state && parent->bk->ops->destroy)
    parent->bk->ops->destroy(bo.state); /* made, not adopted yet */
  tdist__group_free(child);
  return rc;
}

int tdist_new_group(tdist_group_t *parent, const int *ranks, int n, const tdist_group_opts_t *opts,
                    tdist_group_t **group) {
  tdist__error_clear();
  if (!group) return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "tdist_new_group: NULL out-param");
  *group = NULL;
  if (!parent || !ranks || n < 1)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "tdist_new_group: %s",
                        !parent ? "NULL parent" : "empty rank list");
  if (n > parent->size)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                        "tdist_new_group: %d ranks given, parent '%s' has %d", n, parent->name,
                        parent->size);
  int member = 0;
  for (int i = 0; i < n; i++) {
    if (ranks[i] < 0 || ranks[i] >= parent->size)
      return tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                          "tdist_new_group: ranks[%d] = %d is not in [0, %d)", i, ranks[i],
                          parent->size);
    for (int j = 0; j < i; j++)
      if (ranks[j] == ranks[i])
        return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "tdist_new_group: rank %d is listed twice",
                            ranks[i]);
    if (ranks[i] == parent->rank) member = 1;
  }
  return split(parent, member ? 0 : TDIST_BACKEND_NOCOLOR, ranks, n, opts, "tdist_new_group",
               group);
}

int tdist_mesh_create(tdist_group_t *parent, const int *dims, int ndims,
                      const tdist_group_opts_t *opts, tdist_group_t **groups, int *coords) {
  int rc = 0, made = 0;
  int *members = NULL;
  tdist__error_clear();
  if (!parent || !dims || !groups || ndims < 1 || ndims > TDIST_MESH_MAX_DIMS)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                        "tdist_mesh_create: need a parent, dims and groups, 1..%d dims",
                        TDIST_MESH_MAX_DIMS);
  long long product = 1;
  char shape[128] = "";
  for (int d = 0; d < ndims; d++) {
    if (dims[d] < 1)
      return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "tdist_mesh_create: dims[%d] = %d < 1", d,
                          dims[d]);
    product *= dims[d];
    size_t len = 0;
    while (shape[len])
      len++;
    snprintf(shape + len, sizeof(shape) - len, "%s%d", d ? "x" : "", dims[d]);
  }
  if (product != parent->size)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                        "tdist_mesh_create: mesh %s has %lld ranks but group '%s' has %d", shape,
                        product, parent->name, parent->size);

  int stride[TDIST_MESH_MAX_DIMS], my[TDIST_MESH_MAX_DIMS];
  stride[ndims - 1] = 1;
  for (int d = ndims - 2; d >= 0; d--)
    stride[d] = stride[d + 1] * dims[d + 1];
  for (int d = 0; d < ndims; d++) {
    my[d] = (parent->rank / stride[d]) % dims[d];
    groups[d] = NULL;
  }
  members = tdist__malloc(sizeof(int) * (size_t)parent->size);
  if (!members) return tdist__error(TDIST_ERR_NO_MEMORY, "tdist_mesh_create: out of memory");

  for (int d = 0; d < ndims; d++) {
    int first = parent->rank - my[d] * stride[d]; /* the line's rank with coord d = 0 */
    for (int i = 0; i < dims[d]; i++)
      members[i] = first + i * stride[d];
    tdist_group_opts_t o = {0};
    char name[256]; /* cut to a group name's 95 characters by the group */
    if (opts) o = *opts;
    snprintf(name, sizeof(name), "%.48s/mesh%.60s.d%d.%d",
             (opts && (opts->mask & TDIST_GROUP_FIELD_NAME) && opts->name) ? opts->name
                                                                           : parent->name,
             shape, d, first);
    o.mask |= TDIST_GROUP_FIELD_NAME;
    o.name = name;
    TDIST_CHECKGOTO(tdist__inject("mesh.dim"), rc, fail);
    char call[160];
    snprintf(call, sizeof(call), "tdist_mesh_create %s (dimension %d)", shape, d);
    TDIST_CHECKGOTO(split(parent, first, members, dims[d], &o, call, &groups[d]), rc, fail);
    made++;
  }
  if (coords)
    for (int d = 0; d < ndims; d++)
      coords[d] = my[d];
  tdist__free(members);
  return 0;
fail:
  for (int d = 0; d < made; d++) {
    tdist_group_destroy(groups[d]);
    groups[d] = NULL;
  }
  tdist__free(members);
  return rc;
}
