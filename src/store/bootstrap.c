/*
 * bootstrap.c - see bootstrap.h. One set, one multi_get (woken by the writes
 * it waits for: nothing polls). Caller thread.
 */
#include "store/bootstrap.h"

#include <stdio.h>

#include "util/alloc.h"
#include "util/error.h"

int tdist__store_allgather(tdist_store_t *s, const char *tag, int rank, int size,
                           const void *mine, size_t len, const int *from, int n_from,
                           void **vals, size_t *lens, int64_t timeout_ms) {
  int rc = 0, n = from ? n_from : size;
  char key[160];
  char (*keys)[160] = NULL;
  const char **kp = NULL;
  void **got = NULL;
  size_t *glen = NULL;
  for (int i = 0; i < size; i++) {
    vals[i] = NULL;
    lens[i] = 0;
  }
  if (mine) {
    snprintf(key, sizeof(key), "%s/%d", tag, rank);
    TDIST_CHECK(tdist_store_set(s, key, mine, len));
  }
  if (n <= 0) return 0;
  keys = tdist__calloc((size_t)n, sizeof(*keys));
  kp = tdist__calloc((size_t)n, sizeof(*kp));
  got = tdist__calloc((size_t)n, sizeof(*got));
  glen = tdist__calloc((size_t)n, sizeof(*glen));
  if (!keys || !kp || !got || !glen) {
    rc = tdist__error(TDIST_ERR_NO_MEMORY, "store all-gather '%s': out of memory", tag);
    goto out;
  }
  for (int i = 0; i < n; i++) {
    int r = from ? from[i] : i;
    if (r < 0 || r >= size) {
      rc = tdist__error(TDIST_ERR_INVALID_ARGUMENT, "store all-gather '%s': rank %d of %d", tag, r,
                        size);
      goto out;
    }
    snprintf(keys[i], sizeof(keys[i]), "%s/%d", tag, r);
    kp[i] = keys[i];
  }
  TDIST_CHECKGOTO(tdist_store_multi_get(s, kp, (size_t)n, got, glen, timeout_ms), rc, out);
  for (int i = 0; i < n; i++) {
    int r = from ? from[i] : i;
    vals[r] = got[i];
    lens[r] = glen[i];
  }
out:
  tdist__free(keys);
  tdist__free(kp);
  tdist__free(got);
  tdist__free(glen);
  return rc;
}
