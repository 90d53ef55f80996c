/*
 * registry.c - the backends, found by name: the built-in ones, those a
 * program registered (tdist_backend_register), and plug-ins loaded from
 * libtdist-backend-NAME.so (tdist/backend.h says where they are looked
 * for), as UCC discovers its TLs and NCCL its net plug-ins.
 *
 * Every backend joins the table the same way: a descriptor
 * (tdist_backend_t) whose ABI version and fields are checked (check_desc).
 * The built-ins hand theirs over through the same entry function a
 * plug-in exports; the references are strong, so a static link pulls their
 * objects out of the archive.
 *
 * A plug-in stays loaded for the life of the process (its descriptor and
 * code are in the table). Layer: init. Threads: any caller thread; the
 * table is guarded by a mutex, and loading runs outside it (a plug-in's
 * constructors may call back into the library).
 */
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "core/init/registry.h"
#include "util/error.h"
#include "util/log.h"
#include "util/param.h"

/* The built-ins' entries (cpu/backend.c, nccl/nccl_progress.c). */
const tdist_backend_t *tdist__cpu_plugin(void);
const tdist_backend_t *tdist__nccl_plugin(void);
static const tdist_backend_t *(*const builtin[])(void) = {tdist__cpu_plugin, tdist__nccl_plugin};

#define MAX_BACKENDS 16

static pthread_mutex_t table_mu = PTHREAD_MUTEX_INITIALIZER;
static const tdist_backend_t *table[MAX_BACKENDS];
static int ntable, builtins_in;

/* A descriptor the core can use, or the error saying what is wrong with it. */
static int check_desc(const tdist_backend_t *b, const char *from) {
  if (!b || !b->name || !b->name[0] || !b->ops)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "backend %s: incomplete descriptor", from);
  if (b->abi_version != TDIST_BACKEND_ABI_VERSION)
    return tdist__error(TDIST_ERR_NOT_SUPPORTED,
                        "backend '%s' (%s) was built for backend ABI version %u; this libtdist "
                        "has version %u (rebuild it against this tdist/backend.h)",
                        b->name, from, (unsigned)b->abi_version, TDIST_BACKEND_ABI_VERSION);
  if (!b->ops->init || !b->ops->post || !b->ops->abort || !b->ops->destroy)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                        "backend '%s' (%s): init, post, abort and destroy are required", b->name,
                        from);
  return 0;
}

/* table_mu held. */
static const tdist_backend_t *lookup(const char *name) {
  for (int i = 0; i < ntable; i++)
    if (strcasecmp(table[i]->name, name) == 0) return table[i];
  return NULL;
}

/* table_mu held. */
static int add(const tdist_backend_t *b) {
  if (lookup(b->name))
    return tdist__error(TDIST_ERR_INVALID_STATE, "backend register: the name '%s' is taken",
                        b->name);
  if (ntable == MAX_BACKENDS)
    return tdist__error(TDIST_ERR_INVALID_STATE, "backend register: the table is full (%d)",
                        MAX_BACKENDS);
  table[ntable++] = b;
  return 0;
}

/* table_mu held: the built-ins first, once. */
static void builtins(void) {
  if (builtins_in) return;
  builtins_in = 1;
  for (size_t i = 0; i < sizeof(builtin) / sizeof(builtin[0]); i++) {
    const tdist_backend_t *b = builtin[i]();
    if (check_desc(b, "built in") == 0) (void)add(b);
  }
}

int tdist_backend_register(const tdist_backend_t *b) {
  TDIST_CHECK(check_desc(b, "registered"));
  pthread_mutex_lock(&table_mu);
  builtins();
  int rc = add(b);
  pthread_mutex_unlock(&table_mu);
  return rc;
}

/* ---- plug-ins ----------------------------------------------------------------------- */

/* A name that can be part of a file name: letters, digits, '_' and '-'. */
static int plain_name(const char *name) {
  if (!name[0] || strlen(name) > 64) return 0;
  for (const char *c = name; *c; c++)
    if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
          *c == '_' || *c == '-'))
      return 0;
  return 1;
}

/* The folder "tdist-backends" next to the object this code is in
 * (libtdist.so, or the program a static libtdist is linked into). */
static int default_dir(char *out, size_t cap) {
  Dl_info info;
  if (!dladdr((void *)default_dir, &info) || !info.dli_fname) return 0;
  const char *slash = strrchr(info.dli_fname, '/');
  if (!slash) return snprintf(out, cap, "tdist-backends") < (int)cap;
  int n = snprintf(out, cap, "%.*s/tdist-backends", (int)(slash - info.dli_fname), info.dli_fname);
  return n > 0 && (size_t)n < cap;
}

/* The services a plug-in calls resolve in the process's global scope. A
 * libtdist.so that was opened RTLD_LOCAL (Python's ctypes does) is not in
 * it: put the copy already loaded there (RTLD_NOLOAD loads nothing; the
 * extra reference is dropped again). A program linked with the static
 * library exports them itself (tdist/backend.h). */
static void services_global(void) {
  Dl_info info;
  if (!dladdr((void *)services_global, &info) || !info.dli_fname) return;
  void *self = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_GLOBAL);
  if (self) dlclose(self);
}

/* Load `file` as the plug-in for `name`: 0 with *out set, or an error
 * naming the file. */
static int load_one(const char *file, const char *name, const tdist_backend_t **out) {
  services_global();
  void *h = dlopen(file, RTLD_NOW | RTLD_LOCAL);
  if (!h) return tdist__error(TDIST_ERR_NOT_SUPPORTED, "backend plug-in %s: %s", file, dlerror());
  const tdist_backend_t *(*entry)(void) = NULL;
  *(void **)&entry = dlsym(h, TDIST_BACKEND_PLUGIN_SYMBOL);
  if (!entry)
    return tdist__error(TDIST_ERR_NOT_SUPPORTED, "backend plug-in %s exports no %s()", file,
                        TDIST_BACKEND_PLUGIN_SYMBOL);
  const tdist_backend_t *b = entry();
  TDIST_CHECK(check_desc(b, file));
  if (strcasecmp(b->name, name) != 0)
    return tdist__error(TDIST_ERR_NOT_SUPPORTED, "backend plug-in %s is named '%s', not '%s'", file,
                        b->name, name);
  TDIST_INFO(INIT, "backend '%s' loaded from %s", b->name, file);
  *out = b; /* never unloaded: the table keeps pointers into it */
  return 0;
}

/* Look for libtdist-backend-<name>.so in TDIST_BACKEND_PATH's folders, then
 * next to the library. 0 and *out, 1 when no such file exists, or the error
 * of the first file that exists but does not load. */
static int find_plugin(const char *name, const tdist_backend_t **out) {
  char dirs[4096], file[PATH_MAX];
  const char *path = tdist__env_raw("TDIST_BACKEND_PATH");
  int n = snprintf(dirs, sizeof(dirs), "%s", path ? path : "");
  if (n < 0 || (size_t)n >= sizeof(dirs)) n = 0, dirs[0] = '\0';
  char here[PATH_MAX];
  if (default_dir(here, sizeof(here)) && (size_t)n + strlen(here) + 2 < sizeof(dirs))
    snprintf(dirs + n, sizeof(dirs) - (size_t)n, "%s%s", n ? ":" : "", here);
  char *save = NULL;
  for (char *d = strtok_r(dirs, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
    int len = snprintf(file, sizeof(file), "%s/libtdist-backend-%s.so", d, name);
    if (len < 0 || (size_t)len >= sizeof(file) || access(file, F_OK) != 0) continue;
    return load_one(file, name, out);
  }
  return 1;
}

/* The error for a name no backend answers to, saying what is known and
 * where plug-ins were looked for. */
static int unknown_backend(const char *name) {
  char names[256], here[PATH_MAX] = "";
  tdist__backend_names(names, sizeof(names));
  (void)default_dir(here, sizeof(here));
  const char *path = tdist__env_raw("TDIST_BACKEND_PATH");
  return tdist__error(TDIST_ERR_NOT_SUPPORTED,
                      "unknown backend '%s'; known: %s (gloo = cpu); no "
                      "libtdist-backend-%s.so in TDIST_BACKEND_PATH (%s) or %s",
                      name, names, plain_name(name) ? name : "NAME", path ? path : "unset", here);
}

/* Backend names are matched without regard to case ("CPU", "NCCL", "Gloo"),
 * as torch does. */
int tdist__backend_get(const char *name, const tdist_backend_t **out) {
  *out = NULL;
  if (!name) return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "backend: NULL name");
  if (strcasecmp(name, "gloo") == 0) name = "cpu"; /* torch's name for the CPU backend */
  pthread_mutex_lock(&table_mu);
  builtins();
  *out = lookup(name);
  pthread_mutex_unlock(&table_mu);
  if (*out) return 0;
  if (!plain_name(name)) return unknown_backend(name);
  const tdist_backend_t *b = NULL;
  int rc = find_plugin(name, &b);
  if (rc == 1) return unknown_backend(name);
  TDIST_CHECK(rc);
  pthread_mutex_lock(&table_mu);
  *out = lookup(b->name); /* another thread may have loaded it meanwhile */
  if (!*out && (rc = add(b)) == 0) *out = b;
  pthread_mutex_unlock(&table_mu);
  return rc;
}

const tdist_backend_t *tdist__backend_find(const char *name) {
  const tdist_backend_t *b = NULL;
  (void)tdist__backend_get(name, &b);
  return b;
}

size_t tdist__backend_names(char *buf, size_t cap) {
  size_t len = 0;
  if (cap) buf[0] = '\0';
  pthread_mutex_lock(&table_mu);
  builtins();
  for (int i = 0; i < ntable && len < cap; i++)
    len += (size_t)snprintf(buf + len, cap - len, "%s%s", i ? ", " : "", table[i]->name);
  pthread_mutex_unlock(&table_mu);
  return len;
}
