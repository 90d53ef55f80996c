/*
 * bootstrap.h - an all-gather over the store, for the collective set-up
 * steps of backends (internal): the CPU backend's addresses, the NCCL unique
 * id. Uses only the public store API.
 */
#ifndef TDIST_STORE_BOOTSTRAP_H
#define TDIST_STORE_BOOTSTRAP_H

#include <stddef.h>
#include <stdint.h>

#include "tdist/store.h"

/*
 * Caller thread, collective over `size` ranks sharing store view `s`: rank
 * `rank` contributes `len` bytes of `mine` under "<tag>/<rank>"; on success
 * vals[i], lens[i] hold rank i's contribution (free each with
 * tdist_store_free). Only ranks listed in `from` (n_from of them; NULL: all)
 * are waited for and returned (e.g. the NCCL id comes from rank 0 alone);
 * the others' vals[i] are NULL.
 * @return 0; TDIST_ERR_TIMEOUT naming the tag and a missing rank; store errors.
 */
int tdist__store_allgather(tdist_store_t *s, const char *tag, int rank, int size,
                           const void *mine, size_t len, const int *from, int n_from,
                           void **vals, size_t *lens, int64_t timeout_ms);

#endif
