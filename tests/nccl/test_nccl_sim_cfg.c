/*
 * test_nccl_sim_cfg.c - issue 42 items 3-5 on the simulated GPU
 * (libtdist_gpusim.so): scalable init, NCCL's configuration and the
 * high-priority stream, user buffer registration. Real processes over a
 * real TCP store, device buffers, results checked against a host
 * reference; what reached NCCL is read back through the simulation's
 * inspection calls (tdist/gpusim.h), never from tdist's own state.
 *
 *   scalable_n8        8 ranks, TDIST_NCCL_RANKS_PER_ROOT 3 -> 3 roots
 *                      (ncclCommInitRankScalable, uneven roots), then 128 ->
 *                      1 root (ncclCommInitRankConfig); all_reduce checked
 *   scalable_n64       64 ranks (8 per simulated device), 1 root then 4
 *                      roots (16 per root); all_reduce checked; each rank 0
 *                      prints how long its init took (measured, not asserted)
 *   scalable_sim_rules the simulated NCCL alone: nId out of 1..nranks and an
 *                      id not from ncclGetUniqueId refused; ranks given
 *                      different id arrays never finish init (NCCL's
 *                      bootstrap would wait forever), the mismatch counted;
 *                      ncclCommRegister's reference counts and unknown handles
 *   config             tdist_nccl_opts_t reaches NCCL's config (min/max CTAs,
 *                      cgaClusterSize, netName, trafficClass), high_priority
 *                      puts the kernels on a stream of the greatest priority;
 *                      a subgroup inherits, overrides, and gets splitShare;
 *                      a group without options has NCCL's defaults
 *   config_refused     out-of-range values refused with INVALID_ARGUMENT
 *                      naming the field; a CPU group ignores the options
 *   register           ncclCommRegister under tdist_mem_register: counted,
 *                      twice the same buffer twice counted, all_reduce on the
 *                      registered buffer checked, deregistered; misuse
 *                      (host memory, another device, 0 bytes, bad flags,
 *                      another group's handle, CPU group) refused
 *   window_n3          a window on cudaMalloc memory refused (NCCL needs its
 *                      cuMem allocator); a symmetric window on tdist_mem_alloc
 *                      memory registered by 3 ranks (collective), an
 *                      all_reduce in it checked, deregistered; a window not
 *                      4096-aligned in its allocation: NCCL_ERROR naming the
 *                      alignment
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "util/inject.h"

#include "nccl_sim_util.h"

static int port, port2;

static void run_n(int n, tdist_mp_fn fn, void *arg, int timeout_s) {
  port = tdist_mp_free_port();
  port2 = tdist_mp_free_port();
  assert_int_equal(tdist_mp_run(n, fn, arg, timeout_s), 0);
}

/* World of n ranks over nccl, rank r on device r % 8, with NCCL options. */
static int world_opts(int rank, int n, const tdist_nccl_opts_t *nccl, tdist_group_t **g) {
  char url[64];
  snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", port);
  tdist_init_opts_t o = {0};
  o.mask = TDIST_INIT_FIELD_BACKEND | TDIST_INIT_FIELD_INIT_METHOD | TDIST_INIT_FIELD_RANK |
           TDIST_INIT_FIELD_WORLD_SIZE | TDIST_INIT_FIELD_TIMEOUT | TDIST_INIT_FIELD_HOST_STORE |
           TDIST_INIT_FIELD_DEVICE;
  o.backend = "nccl";
  o.init_method = url;
  o.rank = rank;
  o.world_size = n;
  o.timeout_ms = 60000;
  o.host_store = 1;
  o.device = rank % 8;
  if (nccl) {
    o.mask |= TDIST_INIT_FIELD_NCCL;
    o.nccl = nccl;
  }
  return tdist_init_process_group(&o, g);
}

/* One all_reduce of int32 (rank + 1 + i) over g, checked. */
static int sum_check(tdist_group_t *g, void *dbuf) {
  int n = tdist_group_size(g), r = tdist_group_rank(g);
  int32_t h[4];
  for (int i = 0; i < 4; i++)
    h[i] = r + 1 + i;
  int32_t *d = dbuf ? dbuf : ns_dev(NULL, sizeof(h));
  if (!d || ns_put(d, h, sizeof(h))) return 1;
  MP_CHECK_RC(tdist_all_reduce(g, d, d, 4, TDIST_INT32, TDIST_SUM, NULL, NULL));
  MP_CHECK(ns_get(h, d, sizeof(h)) == 0);
  for (int i = 0; i < 4; i++)
    if (h[i] != n * (n + 1) / 2 + n * i) {
      fprintf(stderr, "[pid %d] element %d is %d, want %d\n", (int)getpid(), i, h[i],
              n * (n + 1) / 2 + n * i);
      return 1;
    }
  if (!dbuf) cudaFree(d);
  return 0;
}

/* ---- scalable init --------------------------------------------------------------------- */

typedef struct {
  const char *per_root; /* TDIST_NCCL_RANKS_PER_ROOT */
  int roots;            /* the ids NCCL must have been given */
} scal_t;

static int scalable_child(int rank, int n, void *arg) {
  const scal_t *sc = arg;
  setenv("TDIST_NCCL_RANKS_PER_ROOT", sc->per_root, 1); /* read at the first init */
  tdist_group_t *g = NULL;
  long long t0 = ns_now_ms();
  MP_CHECK_RC(world_opts(rank, n, NULL, &g));
  long long dt = ns_now_ms() - t0;
  int roots = tdist_gpusim_comm_roots("world");
  if (roots != sc->roots) {
    fprintf(stderr, "[pid %d] rank %d: NCCL got %d ids, want %d (ranks per root %s)\n",
            (int)getpid(), rank, roots, sc->roots, sc->per_root);
    return 1;
  }
  MP_CHECK(sum_check(g, NULL) == 0);
  if (rank == 0)
    printf("[measure] init of %d ranks, %d root%s: %lld ms on rank 0 (tdist_init_process_group, "
           "store rendezvous included)\n",
           n, roots, roots > 1 ? "s" : "", dt);
  MP_CHECK_RC(tdist_group_destroy(g));
  return 0;
}

static void scalable_n8(void **s) {
  (void)s;
  scal_t three = {"3", 3}, one = {"128", 1};
  run_n(8, scalable_child, &three, 120);
  run_n(8, scalable_child, &one, 120);
}

static void scalable_n64(void **s) {
  (void)s;
  scal_t one = {"128", 1}, four = {"16", 4};
  run_n(64, scalable_child, &one, 300);
  run_n(64, scalable_child, &four, 300);
}

/* The simulated NCCL alone (no tdist): its argument checks, and ranks that
 * pass different id arrays. ids[] made in the parent before the fork. */
static ncclUniqueId ids[3];

static int rules_child(int rank, int n, void *arg) {
  (void)arg;
  (void)n;
  NS_CUDA(cudaSetDevice(rank));
  ncclComm_t c = NULL;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  cfg.commName = "rules";
  MP_CHECK(ncclCommInitRankScalable(&c, 2, rank, 0, ids, &cfg) == ncclInvalidArgument);
  MP_CHECK(strstr(ncclGetLastError(NULL), "nId = 0"));
  MP_CHECK(ncclCommInitRankScalable(&c, 2, rank, 3, ids, &cfg) == ncclInvalidArgument);
  ncclUniqueId bad[2] = {ids[0], ids[1]};
  memset(bad[1].internal, 7, 8);
  MP_CHECK(ncclCommInitRankScalable(&c, 2, rank, 2, bad, &cfg) == ncclInvalidArgument);
  MP_CHECK(strstr(ncclGetLastError(NULL), "ncclGetUniqueId"));
  /* Rank 0 passes {0, 1}, rank 1 {0, 2}: the init never completes. */
  ncclUniqueId mine[2] = {ids[0], ids[rank == 0 ? 1 : 2]};
  MP_CHECK(ncclCommInitRankScalable(&c, 2, rank, 2, mine, &cfg) == ncclInProgress);
  NS_WAIT_FOR(tdist_gpusim_mismatches() > 0, 30000);
  MP_CHECK(tdist_gpusim_mismatches() > 0);
  ncclResult_t st = ncclSuccess;
  MP_CHECK(ncclCommGetAsyncError(c, &st) == ncclSuccess && st == ncclInProgress);
  MP_CHECK(ncclCommAbort(c) == ncclSuccess);
  /* The same arrays: it completes. */
  ncclUniqueId same[2] = {ids[1], ids[2]};
  MP_CHECK(ncclCommInitRankScalable(&c, 2, rank, 2, same, &cfg) == ncclInProgress);
  NS_WAIT_FOR(ncclCommGetAsyncError(c, &st) == ncclSuccess && st != ncclInProgress, 30000);
  MP_CHECK(st == ncclSuccess);
  MP_CHECK(tdist_gpusim_comm_roots("rules") == 2);
  /* ncclCommRegister's cache (register.cc): a range inside a registered one
   * is the same handle, one more reference; an unknown handle is
   * ncclInvalidUsage; NULL is success. */
  void *d = ns_dev(NULL, 1 << 16), *h1 = NULL, *h2 = NULL;
  MP_CHECK(ncclCommRegister(c, d, 1 << 16, &h1) == ncclSuccess && h1);
  MP_CHECK(ncclCommRegister(c, (char *)d + 128, 512, &h2) == ncclSuccess && h2 == h1);
  MP_CHECK(tdist_gpusim_registrations("rules", 0) == 2);
  int bogus;
  MP_CHECK(ncclCommDeregister(c, &bogus) == ncclInvalidUsage);
  MP_CHECK(strstr(ncclGetLastError(NULL), "Could not find handle"));
  MP_CHECK(ncclCommDeregister(c, NULL) == ncclSuccess);
  MP_CHECK(ncclCommDeregister(c, h1) == ncclSuccess && ncclCommDeregister(c, h2) == ncclSuccess);
  MP_CHECK(tdist_gpusim_registrations("rules", 0) == 0);
  MP_CHECK(ncclCommDeregister(c, h1) == ncclInvalidUsage); /* gone with its last reference */
  cudaFree(d);
  MP_CHECK(ncclCommDestroy(c) == ncclSuccess);
  return 0;
}

static void scalable_sim_rules(void **s) {
  (void)s;
  for (int i = 0; i < 3; i++)
    assert_int_equal(ncclGetUniqueId(&ids[i]), ncclSuccess);
  run_n(2, rules_child, NULL, 60);
}

/* ---- NCCL's configuration ---------------------------------------------------------------- */

typedef struct {
  int min_ctas, max_ctas, cga, split_share, tc, prio;
  char net[64];
} seen_t;

static int seen(const char *name, seen_t *s) {
  memset(s, 0, sizeof(*s));
  return tdist_gpusim_comm_config(name, &s->min_ctas, &s->max_ctas, &s->cga, &s->split_share,
                                  &s->tc, s->net, sizeof(s->net), &s->prio);
}

#define SEEN_IS(s, mi, ma, cg, sp, t, pr, nn)                                                  \
  do {                                                                                         \
    if ((s).min_ctas != (mi) || (s).max_ctas != (ma) || (s).cga != (cg) ||                     \
        (s).split_share != (sp) || (s).tc != (t) || (s).prio != (pr) || strcmp((s).net, nn)) { \
      fprintf(stderr,                                                                          \
              "[pid %d] line %d: NCCL got min %d max %d cga %d split %d tc %d prio %d net "    \
              "'%s'\n",                                                                        \
              (int)getpid(), __LINE__, (s).min_ctas, (s).max_ctas, (s).cga, (s).split_share,   \
              (s).tc, (s).prio, (s).net);                                                      \
      return 1;                                                                                \
    }                                                                                          \
  } while (0)

static int config_child(int rank, int n, void *arg) {
  (void)arg;
  tdist_nccl_opts_t k = {0};
  k.mask = TDIST_NCCL_FIELD_MIN_CTAS | TDIST_NCCL_FIELD_MAX_CTAS |
           TDIST_NCCL_FIELD_CGA_CLUSTER_SIZE | TDIST_NCCL_FIELD_NET_NAME |
           TDIST_NCCL_FIELD_TRAFFIC_CLASS | TDIST_NCCL_FIELD_HIGH_PRIORITY;
  k.min_ctas = 2;
  k.max_ctas = 8;
  k.cga_cluster_size = 2;
  k.net_name = "Socket";
  k.traffic_class = 3;
  k.high_priority = 1;
  tdist_group_t *g = NULL;
  MP_CHECK_RC(world_opts(rank, n, &k, &g));
  MP_CHECK(sum_check(g, NULL) == 0); /* a kernel launched: its stream's priority known */
  seen_t s;
  MP_CHECK(seen("world", &s) == 0);
  SEEN_IS(s, 2, 8, 2, 0, 3, -5, "Socket"); /* -5: the simulated H100's greatest */
  /* A subgroup: inherits the world's, overrides max_ctas, shares resources
   * with its own splits, and a default-priority stream. */
  tdist_nccl_opts_t k2 = {0};
  k2.mask =
      TDIST_NCCL_FIELD_MAX_CTAS | TDIST_NCCL_FIELD_SPLIT_SHARE | TDIST_NCCL_FIELD_HIGH_PRIORITY;
  k2.max_ctas = 4;
  k2.split_share = 1;
  k2.high_priority = 0;
  tdist_group_opts_t go = {0};
  go.mask = TDIST_GROUP_FIELD_NAME | TDIST_GROUP_FIELD_NCCL;
  go.name = "sub";
  go.nccl = &k2;
  int all[2] = {0, 1};
  tdist_group_t *sub = NULL, *sub2 = NULL;
  MP_CHECK_RC(tdist_new_group(g, all, n, &go, &sub));
  MP_CHECK(sum_check(sub, NULL) == 0);
  MP_CHECK(seen("sub", &s) == 0);
  SEEN_IS(s, 2, 4, 2, 1, 3, 0, "Socket");
  /* Its own split, no options: everything inherited. */
  tdist_group_opts_t go2 = {0};
  go2.mask = TDIST_GROUP_FIELD_NAME;
  go2.name = "sub2";
  MP_CHECK_RC(tdist_new_group(sub, all, n, &go2, &sub2));
  MP_CHECK(sum_check(sub2, NULL) == 0);
  MP_CHECK(seen("sub2", &s) == 0);
  SEEN_IS(s, 2, 4, 2, 1, 3, 0, "Socket");
  MP_CHECK_RC(tdist_group_destroy(sub2));
  MP_CHECK_RC(tdist_group_destroy(sub));
  MP_CHECK_RC(tdist_group_destroy(g));
  /* A world without options: NCCL's defaults. */
  port = port2; /* a store of its own (this child's copy of the variable) */
  MP_CHECK_RC(world_opts(rank, n, NULL, &g));
  MP_CHECK(sum_check(g, NULL) == 0);
  MP_CHECK(seen("world", &s) == 0);
  SEEN_IS(s, 1, 64, 4, 0, NCCL_CONFIG_UNDEF_INT, 0, "");
  MP_CHECK_RC(tdist_group_destroy(g));
  return 0;
}

static void config(void **s) {
  (void)s;
  run_n(2, config_child, NULL, 120);
}

static int refused_child(int rank, int n, void *arg) {
  (void)arg;
  static const struct {
    uint64_t mask;
    int min, max, cga, split, tc, prio;
    const char *net, *want;
  } bad[] = {
      {TDIST_NCCL_FIELD_MIN_CTAS | TDIST_NCCL_FIELD_MAX_CTAS, 0, 4, 0, 0, 0, 0, NULL,
       "min_ctas 0 out of range 1..64"},
      {TDIST_NCCL_FIELD_MAX_CTAS, 0, 65, 0, 0, 0, 0, NULL, "max_ctas 65 out of range"},
      {TDIST_NCCL_FIELD_MIN_CTAS, 4, 0, 0, 0, 0, 0, NULL, "min_ctas 4 needs max_ctas too"},
      {TDIST_NCCL_FIELD_MIN_CTAS | TDIST_NCCL_FIELD_MAX_CTAS, 8, 4, 0, 0, 0, 0, NULL,
       "min_ctas 8 above max_ctas 4"},
      {TDIST_NCCL_FIELD_CGA_CLUSTER_SIZE, 0, 0, 9, 0, 0, 0, NULL, "cga_cluster_size 9"},
      {TDIST_NCCL_FIELD_SPLIT_SHARE, 0, 0, 0, 2, 0, 0, NULL, "split_share 2"},
      {TDIST_NCCL_FIELD_TRAFFIC_CLASS, 0, 0, 0, 0, -1, 0, NULL, "traffic_class -1"},
      {TDIST_NCCL_FIELD_HIGH_PRIORITY, 0, 0, 0, 0, 0, 3, NULL, "high_priority 3"},
      {TDIST_NCCL_FIELD_NET_NAME, 0, 0, 0, 0, 0, 0, "", "net_name empty"},
      {1u << 20, 0, 0, 0, 0, 0, 0, NULL, "unknown bits 0x100000"},
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    tdist_nccl_opts_t k = {0};
    k.mask = bad[i].mask;
    k.min_ctas = bad[i].min;
    k.max_ctas = bad[i].max;
    k.cga_cluster_size = bad[i].cga;
    k.split_share = bad[i].split;
    k.traffic_class = bad[i].tc;
    k.high_priority = bad[i].prio;
    k.net_name = bad[i].net;
    tdist_group_t *g = NULL;
    NS_EXPECT(world_opts(rank, n, &k, &g), TDIST_ERR_INVALID_ARGUMENT);
    NS_HAS(tdist_last_error(), bad[i].want);
  }
  /* A CPU group takes the same options and ignores them. */
  char url[64];
  snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", port);
  tdist_nccl_opts_t k = {0};
  k.mask = TDIST_NCCL_FIELD_HIGH_PRIORITY | TDIST_NCCL_FIELD_MIN_CTAS;
  k.high_priority = 1;
  k.min_ctas = 1;
  tdist_init_opts_t o = {0};
  o.mask = TDIST_INIT_FIELD_BACKEND | TDIST_INIT_FIELD_INIT_METHOD | TDIST_INIT_FIELD_RANK |
           TDIST_INIT_FIELD_WORLD_SIZE | TDIST_INIT_FIELD_HOST_STORE | TDIST_INIT_FIELD_NCCL;
  o.backend = "cpu";
  o.init_method = url;
  o.rank = rank;
  o.world_size = n;
  o.host_store = 1;
  o.nccl = &k;
  tdist_group_t *g = NULL;
  MP_CHECK_RC(tdist_init_process_group(&o, &g));
  int64_t v = 1;
  MP_CHECK_RC(tdist_all_reduce(g, &v, &v, 1, TDIST_INT64, TDIST_SUM, NULL, NULL));
  MP_CHECK(v == 1);
  MP_CHECK_RC(tdist_group_destroy(g));
  return 0;
}

static void config_refused(void **s) {
  (void)s;
  run_n(1, refused_child, NULL, 60);
}

/* ---- registration ------------------------------------------------------------------------ */

static int register_child(int rank, int n, void *arg) {
  (void)arg;
  tdist_group_t *g = NULL;
  MP_CHECK_RC(world_opts(rank, n, NULL, &g));
  MP_CHECK(tdist_gpusim_registrations("world", 0) == 0);
  void *d = ns_dev(NULL, 1 << 16);
  MP_CHECK(d);
  tdist_mem_t *m1 = NULL, *m2 = NULL;
  MP_CHECK_RC(tdist_mem_register(g, d, 1 << 16, TDIST_MEM_REGISTER_LOCAL, &m1));
  MP_CHECK(tdist_gpusim_registrations("world", 0) == 1);
  /* The same buffer again: NCCL takes another reference (register.cc). */
  MP_CHECK_RC(tdist_mem_register(g, (char *)d + 64, 256, TDIST_MEM_REGISTER_LOCAL, &m2));
  MP_CHECK(tdist_gpusim_registrations("world", 0) == 2);
  MP_CHECK(sum_check(g, d) == 0);
  MP_CHECK(sum_check(g, (char *)d + 4096) == 0);
  /* Misuse. */
  char host[64];
  tdist_mem_t *x = NULL;
  NS_EXPECT(tdist_mem_register(g, host, sizeof(host), 0, &x), TDIST_ERR_INVALID_ARGUMENT);
  NS_HAS(tdist_last_error(), "host memory");
  NS_CUDA(cudaSetDevice(7 - rank));
  void *other = ns_dev(NULL, 4096);
  NS_CUDA(cudaSetDevice(rank));
  NS_EXPECT(tdist_mem_register(g, other, 4096, 0, &x), TDIST_ERR_INVALID_ARGUMENT);
  NS_HAS(tdist_last_error(), "is memory of device");
  NS_EXPECT(tdist_mem_register(g, d, 0, 0, &x), TDIST_ERR_INVALID_ARGUMENT);
  NS_EXPECT(tdist_mem_register(g, d, 64, 5, &x), TDIST_ERR_INVALID_ARGUMENT);
  NS_HAS(tdist_last_error(), "unknown flags 0x5");
  MP_CHECK(x == NULL);
  tdist_group_t *sub = NULL;
  int all[2] = {0, 1};
  tdist_group_opts_t go = {0};
  go.mask = TDIST_GROUP_FIELD_NAME;
  go.name = "regsub";
  MP_CHECK_RC(tdist_new_group(g, all, n, &go, &sub));
  NS_EXPECT(tdist_mem_deregister(sub, m1), TDIST_ERR_INVALID_ARGUMENT);
  NS_HAS(tdist_last_error(), "belongs to group 'world'");
  MP_CHECK_RC(tdist_mem_deregister(g, m1));
  MP_CHECK(tdist_gpusim_registrations("world", 0) == 1);
  MP_CHECK_RC(tdist_mem_deregister(g, m2));
  MP_CHECK(tdist_gpusim_registrations("world", 0) == 0);
  MP_CHECK_RC(tdist_mem_deregister(g, NULL));
  MP_CHECK_RC(tdist_group_destroy(sub));
  MP_CHECK_RC(tdist_group_destroy(g));
  cudaFree(other);
  cudaFree(d);
  return 0;
}

static void register_(void **s) {
  (void)s;
  run_n(2, register_child, NULL, 120);
}

static int cpu_register_child(int rank, int n, void *arg) {
  (void)arg;
  tdist_group_t *g = NULL;
  MP_CHECK_RC(ns_world_on("cpu", rank, n, port, 20000, -1, &g));
  char buf[64];
  tdist_mem_t *m = NULL;
  NS_EXPECT(tdist_mem_register(g, buf, sizeof(buf), 0, &m), TDIST_ERR_NOT_SUPPORTED);
  NS_HAS(tdist_last_error(), "backend 'cpu', which has no buffer registration");
  void *p = NULL;
  NS_EXPECT(tdist_mem_alloc(g, 64, &p), TDIST_ERR_NOT_SUPPORTED);
  MP_CHECK_RC(tdist_group_destroy(g));
  return 0;
}

static void register_cpu(void **s) {
  (void)s;
  run_n(1, cpu_register_child, NULL, 60);
}

static int window_child(int rank, int n, void *arg) {
  (void)arg;
  tdist_group_t *g = NULL;
  MP_CHECK_RC(world_opts(rank, n, NULL, &g));
  /* cudaMalloc memory: NCCL's cuMemRetainAllocationHandle refuses it, and
   * the communicator keeps the error: a group of its own for that. */
  tdist_group_t *side = NULL;
  int all[3] = {0, 1, 2};
  tdist_group_opts_t go = {0};
  go.mask = TDIST_GROUP_FIELD_NAME;
  go.name = "side";
  /* Rank 1 registers its copy late: the others' failure (below) may abort
   * it first, and then names their cause, with their code (mem.c). */
  if (rank == 1) tdist__inject_arm("group.register", 500);
  MP_CHECK_RC(tdist_new_group(g, all, n, &go, &side));
  void *plain = ns_dev(NULL, 1 << 16);
  tdist_mem_t *w = NULL;
  NS_EXPECT(tdist_mem_register(side, plain, 1 << 16, TDIST_MEM_REGISTER_WINDOW, &w),
            TDIST_ERR_NCCL_ERROR);
  /* Its own error ends with the hint (ncclMemAlloc); one learnt from a
   * faster member's abort names that member and the same cause. */
  NS_HAS(tdist_last_error(), "cuMemRetainAllocationHandle");
  if (strstr(tdist_last_error(), "aborted the group") == NULL)
    NS_HAS(tdist_last_error(), "ncclMemAlloc");
  tdist_group_destroy(side);
  cudaFree(plain);
  /* NCCL's allocator: a window. */
  void *d = NULL;
  MP_CHECK_RC(tdist_mem_alloc(g, 1 << 16, &d));
  MP_CHECK_RC(tdist_mem_register(g, d, 1 << 16, TDIST_MEM_REGISTER_WINDOW, &w));
  MP_CHECK(tdist_gpusim_registrations("world", 1) == 1);
  MP_CHECK(sum_check(g, d) == 0);
  MP_CHECK_RC(tdist_mem_deregister(g, w));
  MP_CHECK(tdist_gpusim_registrations("world", 1) == 0);
  MP_CHECK(tdist_gpusim_mismatches() == 0);
  /* Every rank past its all_reduce first: a member whose copy of it ended
   * sooner would otherwise abort the group below while another still waits
   * for its own, which then fails naming that abort (a stressed ASan run). */
  MP_CHECK_RC(ns_sync(g, "window/done", 20000));
  /* Not at a 4096-byte offset of its allocation: NCCL refuses it, and the
   * communicator keeps the error (every rank makes the same mistake). */
  NS_EXPECT(tdist_mem_register(g, (char *)d + 256, 4096, TDIST_MEM_REGISTER_WINDOW, &w),
            TDIST_ERR_NCCL_ERROR);
  NS_HAS(tdist_last_error(), "aligned");
  NS_WAIT_FOR(tdist_group_is_aborted(g), 20000); /* failed through the progress thread */
  MP_CHECK(tdist_group_is_aborted(g));
  MP_CHECK_RC(tdist_mem_free(g, d));
  tdist_group_destroy(g);
  return 0;
}

static void window_n3(void **s) {
  (void)s;
  run_n(3, window_child, NULL, 120);
}

/* No argument: every case but scalable_n64, which has a ctest of its own
 * (nccl_sim_cfg_n64); else a cmocka filter over all of them. */
int main(int argc, char **argv) {
  setenv("TDIST_TRACE_ON_FAILURE", "0", 1);
  const struct CMUnitTest big[] = {cmocka_unit_test(scalable_n64)};
  if (argc > 1 && strcmp(argv[1], "scalable_n64") == 0)
    return cmocka_run_group_tests(big, NULL, NULL);
  if (argc > 1) cmocka_set_test_filter(argv[1]);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(scalable_n8), cmocka_unit_test(scalable_sim_rules),
      cmocka_unit_test(config),      cmocka_unit_test(config_refused),
      cmocka_unit_test(register_),   cmocka_unit_test(register_cpu),
      cmocka_unit_test(window_n3),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
