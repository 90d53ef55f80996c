/*
 * test_cpu_shm_sizes.c - collectives through the shared-memory rings at
 * sizes around the transport's thresholds (docs/cpu-backend.md, "Transports"),
 * at world size argv[1] (default 2), checked byte by byte against a
 * reference computed locally.
 *
 * What it covers: a ring's receiver stages a header, then reads a payload of
 * DIRECT_MIN (4096) bytes and up straight into its destination and a shorter
 * one through the staging buffer (io.c, stage_len); sizes just below, at and
 * above 4096, the staging buffer (64 KiB), single copy (256 KiB) and the
 * ring's capacity (512 KiB by default, 4 KiB in the ctest variant, where every
 * message wraps and fills the ring), odd sizes, rotating (non-zero) roots.
 * Every size runs a burst of back-to-back broadcasts, in which the root runs
 * ahead until the ring is full, so its waiting caller polls for room
 * (wpolling, shm.h) while the receivers make it. Each rank checks at the end
 * that its messages went through rings at all.
 *
 * The same sizes run a second time over the group's shared segment (the
 * collectives' own path between ranks of one host, sc_*.c: TDIST_CPU_SC),
 * whose slot, inline and overflow thresholds differ; the first pass turns
 * it off, so that the rings carry the collectives.
 */
#include "cpu_test_util.h"

#define FAIL_AT(what, ...)                                      \
  do {                                                          \
    fprintf(stderr, "[rank %d] " what "\n", rank, __VA_ARGS__); \
    return 1;                                                   \
  } while (0)

static int g_port;

/* Payload bytes per rank: around 4096 (direct read), 65536 (the staging
 * buffer), 262144 (single copy) and 524288 (a ring), and odd ones. */
static const size_t sizes[] = {1,     7,     4093,  4095,   4096,   4097,   8191,  65535,
                               65536, 65537, 69633, 131071, 262143, 262144, 524289};
enum { NSIZES = sizeof(sizes) / sizeof(sizes[0]), BURST = 6 };

static uint8_t byte_at(int rank, size_t i, int salt) {
  return (uint8_t)(rank * 29 + salt * 7 + i * 131 + (i >> 9));
}

/* BURST broadcasts back to back from root (each its own buffer, so a root
 * that runs ahead never overwrites what a receiver still reads). */
static int bursts(tdist_group_t *g, int rank, int n, size_t len, int root, int salt) {
  uint8_t *b[BURST];
  for (int k = 0; k < BURST; k++) {
    b[k] = malloc(len);
    for (size_t i = 0; i < len; i++)
      b[k][i] = rank == root ? byte_at(root, i, salt + k) : 0xee;
  }
  for (int k = 0; k < BURST; k++)
    MP_CHECK_RC(tdist_broadcast(g, b[k], len, TDIST_UINT8, root, NULL, NULL));
  for (int k = 0; k < BURST; k++) {
    for (size_t i = 0; i < len; i++)
      if (b[k][i] != byte_at(root, i, salt + k))
        FAIL_AT("broadcast %zu B root %d burst %d: [%zu] = %u, want %u", len, root, k, i, b[k][i],
                byte_at(root, i, salt + k));
    free(b[k]);
  }
  return 0;
}

static int gather(tdist_group_t *g, int rank, int n, size_t len, int salt) {
  uint8_t *in = malloc(len), *out = malloc(len * (size_t)n);
  for (size_t i = 0; i < len; i++)
    in[i] = byte_at(rank, i, salt);
  memset(out, 0xee, len * (size_t)n);
  MP_CHECK_RC(tdist_all_gather(g, in, out, len, TDIST_UINT8, NULL, NULL));
  for (int r = 0; r < n; r++)
    for (size_t i = 0; i < len; i++)
      if (out[(size_t)r * len + i] != byte_at(r, i, salt))
        FAIL_AT("all_gather %zu B: block %d [%zu] = %u, want %u", len, r, i,
                out[(size_t)r * len + i], byte_at(r, i, salt));
  free(in);
  free(out);
  return 0;
}

/* int32 sums of small values: exact whatever the order. */
static int sum(tdist_group_t *g, int rank, int n, size_t len, int salt) {
  size_t cnt = len / 4 ? len / 4 : 1;
  int32_t *a = malloc(cnt * 4);
  for (size_t i = 0; i < cnt; i++)
    a[i] = (int32_t)byte_at(rank, i, salt);
  MP_CHECK_RC(tdist_all_reduce(g, a, a, cnt, TDIST_INT32, TDIST_SUM, NULL, NULL));
  for (size_t i = 0; i < cnt; i++) {
    int32_t want = 0;
    for (int r = 0; r < n; r++)
      want += byte_at(r, i, salt);
    if (a[i] != want) FAIL_AT("all_reduce %zu elements: [%zu] = %d, want %d", cnt, i, a[i], want);
  }
  free(a);
  return 0;
}

static int body(int rank, int n, void *arg) {
  (void)arg;
  tdist_group_t *g;
  MP_CHECK_RC(cpu_test_init(g_port, rank, n, 60000, &g));
  for (int s = 0; s < NSIZES; s++) {
    size_t len = sizes[s];
    if (bursts(g, rank, n, len, s % n, s)) return 1;
    if (bursts(g, rank, n, len, (s + 1) % n, s + 100)) return 1;
    if (gather(g, rank, n, len, s)) return 1;
    if (sum(g, rank, n, len, s)) return 1;
  }
  MP_CHECK_RC(tdist_barrier(g, NULL, NULL));
  /* The rings carried the traffic (all ranks are on this host), or the
   * group's segment did. */
  const char *sc = getenv("TDIST_CPU_SC");
  if (sc && strcmp(sc, "0") == 0)
    MP_CHECK(n == 1 || atomic_load(&tdist__cpu_shm_writes) > 0);
  else
    MP_CHECK(n == 1 || atomic_load(&tdist__cpu_sc_ops) > 0);
  MP_CHECK_RC(tdist_group_destroy(g));
  return 0;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 2;
  setenv("TDIST_CPU_SC", "0", 1);
  g_port = tdist_mp_free_port();
  int bad = tdist_mp_run(n, body, NULL, 150);
  printf("cpu_shm_sizes n=%d (rings): %s\n", n, bad ? "FAILED" : "ok");
  unsetenv("TDIST_CPU_SC");
  g_port = tdist_mp_free_port();
  int bad2 = tdist_mp_run(n, body, NULL, 150);
  printf("cpu_shm_sizes n=%d (shared segment): %s\n", n, bad2 ? "FAILED" : "ok");
  return bad || bad2;
}
