/* alloc_check.c - tdist's allocator stays its own (tests/install/run.sh).
 *
 * Runs a store server (its own thread) and a client against it: set, get,
 * free; every buffer tdist makes comes from its private jemalloc when the
 * build has one. The program also calls malloc itself, so that
 * LD_DEBUG=bindings shows where its malloc binds.
 *
 * Two builds of this one file:
 *   linked with libtdist.a (or .so):  ./alloc_check
 *   -DUSE_DLOPEN, linked with nothing of tdist: ./alloc_check_dlopen LIBTDIST.so
 *     opens the library with dlopen(RTLD_NOW | RTLD_LOCAL) into the running
 *     process, as Python's ctypes does: no static TLS left to ask for, no
 *     GLIBC_TUNABLES needed.
 * Prints "alloc_check: OK" and exits 0 when every call succeeded.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tdist/tdist.h>
#ifdef USE_DLOPEN
#include <dlfcn.h>
#endif

#ifdef USE_DLOPEN
/* Each API function as a pointer of its own declared type, from dlsym. */
#define API(name) static __typeof__(name) *p_##name;
#define CALL(name) p_##name
#else
#define API(name)
#define CALL(name) name
#endif
API(tdist_version_string)
API(tdist_last_error)
API(tdist_store_server_start)
API(tdist_store_server_port)
API(tdist_store_server_stop)
API(tdist_store_connect)
API(tdist_store_set)
API(tdist_store_get)
API(tdist_store_free)
API(tdist_store_release)

static int fail(const char *what, int rc) {
  fprintf(stderr, "alloc_check: %s failed (%d): %s\n", what, rc, CALL(tdist_last_error)());
  return 1;
}

int main(int argc, char **argv) {
#ifdef USE_DLOPEN
  if (argc != 2) {
    fprintf(stderr, "usage: %s LIBTDIST.so\n", argv[0]);
    return 2;
  }
  void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "alloc_check: dlopen: %s\n", dlerror());
    return 1;
  }
#define LOAD(name)                                                     \
  if (!(p_##name = (__typeof__(name) *)dlsym(lib, #name))) {           \
    fprintf(stderr, "alloc_check: dlsym(%s): %s\n", #name, dlerror()); \
    return 1;                                                          \
  }
  LOAD(tdist_version_string)
  LOAD(tdist_last_error)
  LOAD(tdist_store_server_start) LOAD(tdist_store_server_port) LOAD(tdist_store_server_stop)
      LOAD(tdist_store_connect) LOAD(tdist_store_set) LOAD(tdist_store_get) LOAD(tdist_store_free)
          LOAD(tdist_store_release)
#else
  (void)argc;
  (void)argv;
#endif
              char *mine = malloc(64); /* the program's own malloc, next to tdist's */
  if (!mine) return 1;
  snprintf(mine, 64, "value from %s", CALL(tdist_version_string)());

  tdist_store_server_opts_t sopts = {.mask = TDIST_STORE_SERVER_FIELD_HOST, .host = "127.0.0.1"};
  tdist_store_server_t *srv;
  int rc = CALL(tdist_store_server_start)(&sopts, &srv);
  if (rc) return fail("tdist_store_server_start", rc);
  tdist_store_t *s;
  rc = CALL(tdist_store_connect)("127.0.0.1", CALL(tdist_store_server_port)(srv), NULL, &s);
  if (rc) return fail("tdist_store_connect", rc);
  for (int i = 0; i < 100; i++) {
    char key[32];
    snprintf(key, sizeof(key), "k%d", i);
    if ((rc = CALL(tdist_store_set)(s, key, mine, strlen(mine) + 1))) return fail("set", rc);
    void *v;
    size_t n;
    if ((rc = CALL(tdist_store_get)(s, key, &v, &n, 10000))) return fail("get", rc);
    int same = n == strlen(mine) + 1 && memcmp(v, mine, n) == 0;
    CALL(tdist_store_free)(v);
    if (!same) {
      fprintf(stderr, "alloc_check: %s: wrong value\n", key);
      return 1;
    }
  }
  CALL(tdist_store_release)(s);
  CALL(tdist_store_server_stop)(srv);
  free(mine);
  printf("alloc_check: OK\n");
  return 0;
}
