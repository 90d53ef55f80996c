/*
 * test_nccl_load.c - how the NCCL backend opens NCCL and the CUDA runtime
 * (src/nccl/nccl_lib.c) and the checks it makes for the user, one case per
 * process (the load outcome is kept for the life of the process), chosen by
 * argv[1]; CMakeLists.txt sets TDIST_NCCL_LIBRARY/TDIST_CUDART_LIBRARY:
 *   checks   (the fake, 2.28.9) no CUDA device: the driver's words; a device
 *            index out of range; a host pointer refused by submit, nothing
 *            enqueued; ops on device memory still run;
 *   old      (libfake_nccl_old.so, 2.27.0) all_reduce runs; gather, scatter
 *            and all_to_all fail with NOT_SUPPORTED naming the call, the
 *            version that added it and the version found;
 *   tooold   (FAKE_NCCL_VERSION=21703) init refused: 2.17.3 < 2.18.0;
 *   cfgold   (FAKE_NCCL_VERSION=22300) tdist_nccl_opts_t.traffic_class refused
 *            naming 2.25, high_priority without the runtime's priority calls,
 *            a window refused naming 2.27; the 2.17 fields accepted;
 *   missing  (TDIST_NCCL_LIBRARY names no file) init fails with the clear
 *            message; a CPU group in the same process still works;
 *   cudaver  (FAKE_CUDA_VERSION=13000 or 12080) the fake exports the capture
 *            query under its plain name only, as libcudart.so.13 does: a
 *            13 runtime's is taken with CUDA 13's seven arguments (_v3's),
 *            a 12 runtime's with 12's six. On the H200 the plain name was
 *            taken for 12's and the graph step died of SIGSEGV.
 */
#include <dlfcn.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "nccl/nccl_backend.h"
#include "nccl_test_util.h"

static char buf[1024];
static char hostbuf[256];

static void has(const char *msg, const char *want) {
  if (!strstr(msg, want)) fprintf(stderr, "message \"%s\" lacks \"%s\"\n", msg, want);
  assert_non_null(strstr(msg, want));
}

static int world(const char *backend, int device, tdist_group_t **g) {
  char url[64];
  snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", tdist_mp_free_port());
  tdist_init_opts_t o = {0};
  o.mask = TDIST_INIT_FIELD_BACKEND | TDIST_INIT_FIELD_INIT_METHOD | TDIST_INIT_FIELD_RANK |
           TDIST_INIT_FIELD_WORLD_SIZE | TDIST_INIT_FIELD_TIMEOUT | TDIST_INIT_FIELD_HOST_STORE |
           TDIST_INIT_FIELD_DEVICE;
  o.backend = backend;
  o.init_method = url;
  o.rank = 0;
  o.world_size = 1;
  o.timeout_ms = 10000;
  o.host_store = 1;
  o.device = device;
  return tdist_init_process_group(&o, g);
}

/* ---- checks ------------------------------------------------------------------------ */

static void test_no_device(void **state) {
  fake_reset();
  fake_set_devices(0, cudaErrorNoDevice);
  tdist_group_t *g = NULL;
  assert_int_equal(world("nccl", 0, &g), TDIST_ERR_CUDA_ERROR);
  has(tdist_last_error(), "backend 'nccl': no CUDA device: no CUDA-capable device is detected");
  fake_set_devices(0, cudaErrorInsufficientDriver);
  assert_int_equal(world("nccl", 0, &g), TDIST_ERR_CUDA_ERROR);
  has(tdist_last_error(), "no CUDA device: CUDA driver version is insufficient");
  assert_int_equal(fake_count("ncclCommInitRankConfig"), 0);
}

static void test_device_out_of_range(void **state) {
  fake_reset();
  fake_set_devices(2, cudaSuccess);
  tdist_group_t *g = NULL;
  assert_int_equal(world("nccl", 3, &g), TDIST_ERR_INVALID_ARGUMENT);
  has(tdist_last_error(), "backend 'nccl': CUDA device 3 out of range: this machine has 2");
  assert_int_equal(fake_count("ncclCommInitRankConfig"), 0);
}

static void test_host_pointer_refused(void **state) {
  fake_reset();
  tdist_group_t *g = NULL;
  assert_int_equal(world("nccl", 0, &g), 0);
  fake_mark_host(hostbuf, sizeof(hostbuf));
  tdist_work_t *w = NULL;
  assert_int_equal(tdist_all_reduce(g, hostbuf, buf, 8, TDIST_FLOAT32, TDIST_SUM, NULL, &w),
                   TDIST_ERR_INVALID_ARGUMENT);
  has(tdist_last_error(), "sendbuf of all_reduce");
  has(tdist_last_error(), "is host memory");
  has(tdist_last_error(), "needs CUDA device memory");
  assert_int_equal(tdist_all_reduce(g, buf, hostbuf + 16, 8, TDIST_FLOAT32, TDIST_SUM, NULL, &w),
                   TDIST_ERR_INVALID_ARGUMENT);
  has(tdist_last_error(), "recvbuf");
  assert_int_equal(fake_count("ncclAllReduce"), 0);
  /* Device memory (anything not marked host) still runs. */
  assert_int_equal(tdist_all_reduce(g, buf, buf, 8, TDIST_FLOAT32, TDIST_SUM, NULL, &w), 0);
  assert_int_equal(tdist_work_wait(w, 5000), 0);
  tdist_work_release(w);
  assert_int_equal(fake_count("ncclAllReduce"), 1);
  assert_int_equal(tdist_group_destroy(g), 0);
  assert_int_equal(fake_violations(), 0);
}

/* Once CUDA is loaded in the process, a device pointer given to a CPU group
 * is refused up front (the CPU backend would read it as host memory). */
static void test_device_pointer_on_cpu_group(void **state) {
  fake_reset();
  tdist_group_t *g = NULL;
  assert_int_equal(world("nccl", 0, &g), 0); /* loads the (fake) runtime */
  assert_int_equal(tdist_group_destroy(g), 0);
  assert_int_equal(world("cpu", -1, &g), 0);
  fake_mark_host(hostbuf, sizeof(hostbuf));
  assert_int_equal(tdist_all_reduce(g, buf, buf, 8, TDIST_FLOAT32, TDIST_SUM, NULL, NULL),
                   TDIST_ERR_INVALID_ARGUMENT);
  has(tdist_last_error(), "is CUDA device memory");
  has(tdist_last_error(), "backend 'cpu'");
  assert_int_equal(tdist_all_reduce(g, hostbuf, hostbuf, 8, TDIST_FLOAT32, TDIST_SUM, NULL, NULL),
                   0);
  assert_int_equal(tdist_group_destroy(g), 0);
}

/* ---- old ------------------------------------------------------------------------------ */

static void test_old_nccl(void **state) {
  fake_reset();
  tdist_group_t *g = NULL;
  assert_int_equal(world("nccl", 0, &g), 0);
  tdist_work_t *w = NULL;
  assert_int_equal(tdist_all_reduce(g, buf, buf, 8, TDIST_FLOAT32, TDIST_SUM, NULL, &w), 0);
  assert_int_equal(tdist_work_wait(w, 5000), 0);
  tdist_work_release(w);
  assert_int_equal(tdist_gather(g, buf, buf + 64, 4, TDIST_FLOAT32, 0, NULL, &w),
                   TDIST_ERR_NOT_SUPPORTED);
  has(tdist_last_error(), "backend 'nccl': gather needs ncclGather, which NCCL 2.28.0 added; the "
                          "loaded NCCL is 2.27.0");
  assert_int_equal(tdist_all_to_all(g, buf, buf + 64, 4, TDIST_FLOAT32, NULL, &w),
                   TDIST_ERR_NOT_SUPPORTED);
  has(tdist_last_error(), "ncclAlltoAll");
  /* The group is not harmed: later ops still run. */
  assert_int_equal(tdist_all_reduce(g, buf, buf, 8, TDIST_FLOAT32, TDIST_SUM, NULL, &w), 0);
  assert_int_equal(tdist_work_wait(w, 5000), 0);
  tdist_work_release(w);
  assert_int_equal(tdist_group_destroy(g), 0);
  assert_int_equal(fake_violations(), 0);
}

/* ---- cfgold: issue 42's options on NCCL 2.23 ------------------------------------------ */

static int world_knobs(const tdist_nccl_opts_t *k, tdist_group_t **g) {
  char url[64];
  snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", tdist_mp_free_port());
  tdist_init_opts_t o = {0};
  o.mask = TDIST_INIT_FIELD_BACKEND | TDIST_INIT_FIELD_INIT_METHOD | TDIST_INIT_FIELD_RANK |
           TDIST_INIT_FIELD_WORLD_SIZE | TDIST_INIT_FIELD_HOST_STORE | TDIST_INIT_FIELD_NCCL;
  o.backend = "nccl";
  o.init_method = url;
  o.world_size = 1;
  o.host_store = 1;
  o.nccl = k;
  return tdist_init_process_group(&o, g);
}

static void test_cfg_old(void **state) {
  fake_reset();
  tdist_group_t *g = NULL;
  tdist_nccl_opts_t k = {0};
  k.mask = TDIST_NCCL_FIELD_TRAFFIC_CLASS;
  k.traffic_class = 1;
  assert_int_equal(world_knobs(&k, &g), TDIST_ERR_NOT_SUPPORTED);
  has(tdist_last_error(), "traffic_class needs NCCL 2.25.0");
  has(tdist_last_error(), "the loaded NCCL is 2.23.0");
  k.mask = TDIST_NCCL_FIELD_HIGH_PRIORITY;
  k.high_priority = 1;
  assert_int_equal(world_knobs(&k, &g), TDIST_ERR_NOT_SUPPORTED);
  has(tdist_last_error(), "cudaStreamCreateWithPriority");
  k.mask = TDIST_NCCL_FIELD_MIN_CTAS | TDIST_NCCL_FIELD_MAX_CTAS | TDIST_NCCL_FIELD_NET_NAME;
  k.min_ctas = 2;
  k.max_ctas = 4;
  k.net_name = "IB";
  assert_int_equal(world_knobs(&k, &g), 0);
  tdist_mem_t *m = NULL;
  assert_int_equal(tdist_mem_register(g, buf, 256, TDIST_MEM_REGISTER_WINDOW, &m),
                   TDIST_ERR_NOT_SUPPORTED);
  has(tdist_last_error(), "needs ncclCommWindowRegister, which NCCL 2.27.0 added; the loaded "
                          "NCCL is 2.23.0");
  assert_null(m);
  assert_int_equal(tdist_group_destroy(g), 0);
}

/* ---- tooold, missing ------------------------------------------------------------------- */

static void test_too_old(void **state) {
  tdist_group_t *g = NULL;
  assert_int_equal(world("nccl", 0, &g), TDIST_ERR_NOT_SUPPORTED);
  has(tdist_last_error(), "is NCCL 2.17.3; tdist needs NCCL 2.18.0 or newer");
  /* The outcome is kept: the same message the second time. */
  assert_int_equal(world("nccl", 0, &g), TDIST_ERR_NOT_SUPPORTED);
  has(tdist_last_error(), "2.17.3");
}

static void test_missing(void **state) {
  tdist_group_t *g = NULL;
  assert_int_equal(world("nccl", 0, &g), TDIST_ERR_NOT_SUPPORTED);
  has(tdist_last_error(), "backend 'nccl': ");
  has(tdist_last_error(), "no-such-libnccl.so.2");
  has(tdist_last_error(), "TDIST_NCCL_LIBRARY");
  has(tdist_last_error(), "use --backend cpu");
  /* A CPU group runs in the same process. */
  assert_int_equal(world("cpu", -1, &g), 0);
  int64_t v = 5;
  assert_int_equal(tdist_all_reduce(g, &v, &v, 1, TDIST_INT64, TDIST_SUM, NULL, NULL), 0);
  assert_int_equal(v, 5);
  assert_int_equal(tdist_group_destroy(g), 0);
}

/* ---- cudaver -------------------------------------------------------------------- */

static void test_cuda_version(void **state) {
  (void)state;
  const char *v = getenv("FAKE_CUDA_VERSION");
  assert_non_null(v);
  fake_reset();
  tdist_group_t *g = NULL;
  assert_int_equal(world("nccl", 0, &g), 0);
  void *plain = dlsym(RTLD_DEFAULT, "cudaStreamGetCaptureInfo");
  assert_non_null(plain);
  if (atoi(v) >= 13000) {
    assert_ptr_equal((void *)tdist__nccl_fn.cudaStreamGetCaptureInfo_v3, plain);
    assert_null((void *)tdist__nccl_fn.cudaStreamGetCaptureInfo);
  } else {
    assert_null((void *)tdist__nccl_fn.cudaStreamGetCaptureInfo_v3);
    assert_ptr_equal((void *)tdist__nccl_fn.cudaStreamGetCaptureInfo, plain);
  }
  assert_int_equal(tdist_group_destroy(g), 0);
}

int main(int argc, char **argv) {
  const char *c = argc > 1 ? argv[1] : "";
  if (!strcmp(c, "checks")) {
    const struct CMUnitTest t[] = {
        cmocka_unit_test(test_no_device),
        cmocka_unit_test(test_device_out_of_range),
        cmocka_unit_test(test_host_pointer_refused),
        cmocka_unit_test(test_device_pointer_on_cpu_group),
    };
    return cmocka_run_group_tests(t, NULL, NULL);
  }
  if (!strcmp(c, "old")) {
    const struct CMUnitTest t[] = {cmocka_unit_test(test_old_nccl)};
    return cmocka_run_group_tests(t, NULL, NULL);
  }
  if (!strcmp(c, "cfgold")) {
    const struct CMUnitTest t[] = {cmocka_unit_test(test_cfg_old)};
    return cmocka_run_group_tests(t, NULL, NULL);
  }
  if (!strcmp(c, "tooold")) {
    const struct CMUnitTest t[] = {cmocka_unit_test(test_too_old)};
    return cmocka_run_group_tests(t, NULL, NULL);
  }
  if (!strcmp(c, "missing")) {
    const struct CMUnitTest t[] = {cmocka_unit_test(test_missing)};
    return cmocka_run_group_tests(t, NULL, NULL);
  }
  if (!strcmp(c, "cudaver")) {
    const struct CMUnitTest t[] = {cmocka_unit_test(test_cuda_version)};
    return cmocka_run_group_tests(t, NULL, NULL);
  }
  fprintf(stderr, "usage: %s checks|old|cfgold|tooold|missing|cudaver\n", argv[0]);
  return 2;
}
