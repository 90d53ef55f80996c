/*
 * mesh.c - N-dimensional device meshes (TP x DP x CP ...) built from splits.
 *
 * Ranks are laid out row-major over the dims, the last dimension varying
 * fastest (as torch's init_device_mesh). For dimension d, the ranks that
 * share every other coordinate form one line; each line becomes a group. All
 * lines of one dimension come from a single split (colour = the line's
 * first rank), so a mesh costs one ncclCommSplit per dimension on NCCL.
 * Caller thread; collective over the parent.
 */
#include <stdio.h>

#include "core/group.h"
#include "util/alloc.h"
#include "util/error.h"
#include "util/inject.h"

#define TDIST_MESH_MAX_DIMS 8

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
    TDIST_CHECKGOTO(tdist__group_split(parent, first, members, dims[d], &o, &groups[d]), rc, fail);
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
