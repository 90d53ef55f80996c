/*
 * file.c - the file store: the whole table lives in one file, read, changed
 * and rewritten under an exclusive open-file-description lock (fcntl
 * F_OFD_SETLKW) for every call, so processes sharing a filesystem see atomic
 * operations. Requests are the same frames the TCP client sends, executed
 * locally by kv.c, so both stores have one set of semantics.
 *
 * File format: a sequence of records [u32 klen][key][u32 vlen][value]
 * (little-endian), nothing else; an empty file is an empty store.
 *
 * Waits (get, wait, multi_get) release the lock and poll the file every
 * POLL_MS until the keys appear or the deadline passes: the one place in the
 * store where polling is accepted (store.h), since a file has no wake-ups.
 *
 * Threads: any. OFD locks exclude other handles and processes; `mu`
 * serialises the threads sharing one handle.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "util/alloc.h"
#include "util/clock.h"
#include "util/error.h"
#include "store/kv.h"
#include "store/store_impl.h"

#define POLL_MS 5

typedef struct file_store {
  struct tdist_store base; /* first */
  pthread_mutex_t mu;
  int fd;
} file_store_t;

static int lock_file(int fd, short type) {
  struct flock fl = {.l_type = type, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0};
  while (fcntl(fd, F_OFD_SETLKW, &fl) != 0)
    if (errno != EINTR) return -1;
  return 0;
}

/* Read the whole file into kv. 0, TDIST_ERR_IO or TDIST_ERR_PROTOCOL (corrupt). */
static int load(int fd, tdist__kv_t *kv, tdist__buf_t *tmp) {
  struct stat st;
  if (fstat(fd, &st) != 0) return TDIST_ERR_IO;
  tmp->len = 0;
  if (tdist__buf_reserve(tmp, (size_t)st.st_size + 1)) return TDIST_ERR_NO_MEMORY;
  size_t got = 0;
  while (got < (size_t)st.st_size) {
    ssize_t r = pread(fd, tmp->p + got, (size_t)st.st_size - got, (off_t)got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return TDIST_ERR_IO;
    got += (size_t)r;
  }
  tdist__rd_t r = {tmp->p, got, 0};
  while (r.off < r.n) {
    const uint8_t *k, *v;
    uint32_t kl, vl;
    if (tdist__get_key(&r, &k, &kl) || tdist__get_bytes(&r, &v, &vl, TDIST_STORE_MAX_VALUE))
      return TDIST_ERR_PROTOCOL;
    if (tdist__kv_load(kv, k, kl, v, vl)) return TDIST_ERR_NO_MEMORY;
  }
  return 0;
}

static int save(int fd, tdist__kv_t *kv, tdist__buf_t *tmp) {
  tmp->len = 0;
  for (size_t i = 0; i <= kv->mask; i++)
    for (tdist__kv_entry_t *e = kv->buckets[i]; e; e = e->next) {
      if (!e->present) continue;
      if (tdist__buf_reserve(tmp, 8 + e->klen + e->vlen)) return TDIST_ERR_NO_MEMORY;
      tdist__put_bytes(tmp, e->key, e->klen);
      tdist__put_bytes(tmp, e->val, e->vlen);
    }
  size_t done = 0;
  while (done < tmp->len) {
    ssize_t w = pwrite(fd, tmp->p + done, tmp->len - done, (off_t)done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return TDIST_ERR_IO;
    done += (size_t)w;
  }
  return ftruncate(fd, (off_t)tmp->len) == 0 ? 0 : TDIST_ERR_IO;
}

/* One locked attempt at the request. */
static int attempt(file_store_t *f, const uint8_t *body, size_t n, int final, tdist__buf_t *out,
                   tdist__buf_t *tmp, int *blocked) {
  tdist__kv_t kv;
  int rc = tdist__kv_init(&kv);
  if (rc) return rc;
  if (lock_file(f->fd, F_WRLCK) != 0) {
    tdist__kv_destroy(&kv);
    return TDIST_ERR_IO;
  }
  rc = load(f->fd, &kv, tmp);
  if (rc == 0) {
    uint64_t v0 = kv.version;
    tdist__exec_t x = {.final = final};
    out->len = 0;
    int er = tdist__kv_exec(&kv, body, n, out, &x);
    *blocked = er == TDIST__EXEC_BLOCKED;
    if (er == TDIST__EXEC_NOMEM)
      rc = TDIST_ERR_NO_MEMORY;
    else if (er == TDIST__EXEC_BAD)
      rc = TDIST_ERR_PROTOCOL;
    else if (er == TDIST__EXEC_DONE && kv.version != v0)
      rc = save(f->fd, &kv, tmp);
  }
  lock_file(f->fd, F_UNLCK);
  tdist__kv_destroy(&kv);
  return rc;
}

static int file_call(tdist_store_t *s, const tdist__buf_t *req, tdist__buf_t *rep, int64_t wait_ms,
                     const char *what, const char *key) {
  file_store_t *f = (file_store_t *)s;
  int64_t t0 = tdist__now_ms(), deadline = t0 + wait_ms;
  tdist__buf_t tmp = {0};
  int rc, blocked = 0;
  pthread_mutex_lock(&f->mu);
  for (;;) {
    rc = attempt(f, req->p + 4, req->len - 4, tdist__now_ms() >= deadline, rep, &tmp, &blocked);
    if (rc || !blocked) break;
    pthread_mutex_unlock(&f->mu); /* let this handle's other threads write meanwhile */
    struct timespec ts = {0, POLL_MS * 1000000};
    nanosleep(&ts, NULL);
    pthread_mutex_lock(&f->mu);
  }
  pthread_mutex_unlock(&f->mu);
  tdist__buf_free(&tmp);
  if (rc == 0) {
    /* kv_exec wrote a whole frame; the vtable returns its body. */
    memmove(rep->p, rep->p + 4, rep->len - 4);
    rep->len -= 4;
    return 0;
  }
  return tdist__error(rc, "store %s '%s' on %s: %s (%s)", what, key, s->address,
                      rc == TDIST_ERR_PROTOCOL ? "the file is corrupt" : tdist_strerror(rc),
                      strerror(errno));
}

static void file_close(tdist_store_t *s) {
  file_store_t *f = (file_store_t *)s;
  close(f->fd);
  pthread_mutex_destroy(&f->mu);
  tdist__free(f);
}

static const tdist__store_vt_t file_vt = {file_call, file_close, NULL}; /* add is one op */

int tdist_store_open_file(const char *path, const tdist_store_opts_t *opts, tdist_store_t **store) {
  if (!path || !*path || !store)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "store open_file: empty path");
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0)
    return tdist__error(TDIST_ERR_IO, "store open_file: cannot open '%s': %s", path,
                        strerror(errno));
  file_store_t *f = tdist__calloc(1, sizeof(*f));
  if (!f) {
    close(fd);
    return tdist__error(TDIST_ERR_NO_MEMORY, "store open_file: out of memory");
  }
  tdist__store_init_root(&f->base, &file_vt, tdist__store_opts_timeout(opts));
  snprintf(f->base.address, sizeof(f->base.address), "file:%s", path);
  pthread_mutex_init(&f->mu, NULL);
  f->fd = fd;
  *store = &f->base;
  return 0;
}
