/*
 * test_nccl_ops.c - what the NCCL backend enqueues for each op, with NCCL and
 * CUDA replaced by the scripted fake (fake_nccl.c, loaded as libfake_nccl.so):
 *   - stream order: start event recorded on the caller's stream, waited by the
 *     internal stream, then the NCCL call on the internal stream, then the end
 *     event recorded there;
 *   - every op maps to the right NCCL call with the right count, root, dtype
 *     and reduction (AVG -> ncclAvg, PREMUL_SUM created and destroyed);
 *   - batches are one ncclGroupStart/End; barrier is a 1-element all_reduce;
 *   - tdist_work_wait_stream enqueues cudaStreamWaitEvent on the given stream;
 *   - ncclInProgress on enqueue is polled to success before the end event;
 *   - end events are recycled (no event creation in steady state).
 * One rank (world size 1) over a real TCP store.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "nccl_test_util.h"

static tdist_group_t *world;
static void *internal;
static char hostbuf[4096];
#define CALLER_STREAM ((void *)(uintptr_t)0x5100)
#define OTHER_STREAM ((void *)(uintptr_t)0x5200)

static int setup(void **state) {
  fake_reset();
  int rc = nt_world(0, 1, tdist_mp_free_port(), 10000, &world);
  if (rc) fprintf(stderr, "init: %s\n", tdist_last_error());
  internal = nt_internal_stream(0);
  return rc || !internal;
}

static int teardown(void **state) {
  int rc = tdist_group_destroy(world);
  world = NULL;
  return rc || fake_violations();
}

/* The op's NCCL call `name` after log index `from` is preceded by the start
 * event on `caller` and the internal stream's wait on it, and followed by the
 * end event on the internal stream. Returns the call's index. */
static int check_order(const char *name, int from, void *caller) {
  int k = fake_find(name, from);
  assert_true(k > from);
  fake_call_t c = fake_log_get(k);
  assert_ptr_equal(c.stream, internal);
  int i = fake_find("cudaEventRecord", from);
  int j = fake_find("cudaStreamWaitEvent", from);
  assert_true(i >= 0 && i < j && j < k);
  fake_call_t rec = fake_log_get(i), wt = fake_log_get(j);
  assert_ptr_equal(rec.stream, caller);
  assert_ptr_equal(wt.stream, internal);
  assert_ptr_equal(wt.event, rec.event);
  int l = fake_find("cudaEventRecord", k);
  assert_true(l > k);
  fake_call_t end = fake_log_get(l);
  assert_ptr_equal(end.stream, internal);
  assert_ptr_not_equal(end.event, rec.event);
  return k;
}

static void test_stream_order(void **state) {
  tdist_op_opts_t o = {.mask = TDIST_OP_FIELD_STREAM, .stream = CALLER_STREAM};
  int from = fake_log_size();
  assert_int_equal(tdist_all_reduce(world, hostbuf, hostbuf, 7, TDIST_FLOAT32, TDIST_SUM, &o, NULL),
                   0);
  int k = check_order("ncclAllReduce", from, CALLER_STREAM);
  fake_call_t c = fake_log_get(k);
  assert_int_equal(c.a, 7);
  assert_int_equal(c.b, ncclFloat32);
  assert_int_equal((int)c.scalar, ncclSum);
  /* Default stream: NULL (the legacy stream). */
  from = fake_log_size();
  assert_int_equal(tdist_all_reduce(world, hostbuf, hostbuf, 1, TDIST_INT32, TDIST_MAX, NULL, NULL),
                   0);
  check_order("ncclAllReduce", from, NULL);
}

/* The fake reports NCCL 2.23 (nccl_ops_2_23): no float8 types. */
static int before_fp8(void) {
  const char *v = getenv("FAKE_NCCL_VERSION");
  return v && atoi(v) < 22400;
}
static int is_fp8(int dt) { return dt == TDIST_FLOAT8_E4M3 || dt == TDIST_FLOAT8_E5M2; }

static void test_dtypes_and_redops(void **state) {
  /* 0: NCCL has no such type; the core refuses it from the capabilities. */
  static const int want_dt[TDIST_DTYPE_COUNT] = {[TDIST_INT8] = ncclInt8,
                                                 [TDIST_UINT8] = ncclUint8,
                                                 [TDIST_INT32] = ncclInt32,
                                                 [TDIST_INT64] = ncclInt64,
                                                 [TDIST_FLOAT16] = ncclFloat16,
                                                 [TDIST_BFLOAT16] = ncclBfloat16,
                                                 [TDIST_FLOAT32] = ncclFloat32,
                                                 [TDIST_FLOAT64] = ncclFloat64,
                                                 [TDIST_UINT32] = ncclUint32,
                                                 [TDIST_UINT64] = ncclUint64,
                                                 [TDIST_FLOAT8_E4M3] = ncclFloat8e4m3,
                                                 [TDIST_FLOAT8_E5M2] = ncclFloat8e5m2,
                                                 [TDIST_BOOL] = -1,
                                                 [TDIST_INT16] = -1,
                                                 [TDIST_UINT16] = -1};
  for (int dt = 0; dt < TDIST_DTYPE_COUNT; dt++) {
    int from = fake_log_size();
    int rc = tdist_all_reduce(world, hostbuf, hostbuf, 3, (tdist_dtype_t)dt, TDIST_SUM, NULL, NULL);
    if (is_fp8(dt) && before_fp8()) {
      assert_int_equal(rc, TDIST_ERR_NOT_SUPPORTED);
      continue;
    }
    if (want_dt[dt] < 0) {
      /* Refused at submit, before any NCCL or CUDA call, with the type named. */
      assert_int_equal(rc, TDIST_ERR_NOT_SUPPORTED);
      assert_non_null(strstr(tdist_last_error(), tdist_dtype_name((tdist_dtype_t)dt)));
      assert_int_equal(fake_log_size(), from);
      continue;
    }
    assert_int_equal(rc, 0);
    fake_call_t c = fake_log_get(fake_find("ncclAllReduce", from));
    assert_int_equal(c.b, want_dt[dt]);
  }
  static const int want_op[] = {[TDIST_SUM] = ncclSum,
                                [TDIST_PROD] = ncclProd,
                                [TDIST_MIN] = ncclMin,
                                [TDIST_MAX] = ncclMax,
                                [TDIST_AVG] = ncclAvg};
  for (int op = 0; op <= TDIST_AVG; op++) {
    int from = fake_log_size();
    assert_int_equal(
        tdist_all_reduce(world, hostbuf, hostbuf, 3, TDIST_FLOAT32, (tdist_redop_t)op, NULL, NULL),
        0);
    fake_call_t c = fake_log_get(fake_find("ncclAllReduce", from));
    assert_int_equal((int)c.scalar, want_op[op]);
  }
}

/* What NCCL cannot do is refused at submit (TDIST_ERR_NOT_SUPPORTED, from
 * the capabilities), never handed to NCCL: bool/int16/uint16 in every op
 * that carries a type, the bitwise reductions on integers. A bitwise op on a
 * float is meaningless everywhere: TDIST_ERR_INVALID_ARGUMENT. */
static void test_refused_at_submit(void **state) {
  int from = fake_log_size();
  tdist_work_t *w = NULL;
  static const tdist_dtype_t no_type[] = {TDIST_BOOL, TDIST_INT16, TDIST_UINT16};
  for (size_t i = 0; i < sizeof(no_type) / sizeof(no_type[0]); i++) {
    tdist_dtype_t dt = no_type[i];
    assert_int_equal(tdist_broadcast(world, hostbuf, 4, dt, 0, NULL, NULL),
                     TDIST_ERR_NOT_SUPPORTED);
    assert_non_null(strstr(tdist_last_error(), "has no"));
    assert_int_equal(tdist_all_gather(world, hostbuf, hostbuf, 4, dt, NULL, NULL),
                     TDIST_ERR_NOT_SUPPORTED);
    assert_int_equal(tdist_isend(world, hostbuf, 4, dt, 0, NULL, &w), TDIST_ERR_NOT_SUPPORTED);
    assert_int_equal(tdist_reduce(world, hostbuf, hostbuf, 4, dt, TDIST_MAX, 0, NULL, NULL),
                     TDIST_ERR_NOT_SUPPORTED);
  }
  for (int op = TDIST_BAND; op <= TDIST_BXOR; op++) {
    assert_int_equal(
        tdist_all_reduce(world, hostbuf, hostbuf, 4, TDIST_INT32, (tdist_redop_t)op, NULL, NULL),
        TDIST_ERR_NOT_SUPPORTED);
    assert_non_null(strstr(tdist_last_error(), tdist_redop_name((tdist_redop_t)op)));
    assert_int_equal(tdist_reduce_scatter(world, hostbuf, hostbuf, 4, TDIST_UINT64,
                                          (tdist_redop_t)op, NULL, NULL),
                     TDIST_ERR_NOT_SUPPORTED);
    assert_int_equal(
        tdist_all_reduce(world, hostbuf, hostbuf, 4, TDIST_FLOAT32, (tdist_redop_t)op, NULL, NULL),
        TDIST_ERR_INVALID_ARGUMENT);
  }
  assert_int_equal(tdist_all_reduce(world, hostbuf, hostbuf, 4, TDIST_BOOL, TDIST_BOR, NULL, NULL),
                   TDIST_ERR_NOT_SUPPORTED);
  assert_null(w);
  assert_int_equal(fake_log_size(), from); /* NCCL and CUDA never called */
  /* The group is still usable. */
  assert_int_equal(
      tdist_all_reduce(world, hostbuf, hostbuf, 4, TDIST_UINT32, TDIST_MIN, NULL, NULL), 0);
}

/* The float8 types need NCCL 2.24: ctest runs this program again with the
 * fake reporting 2.23 (nccl_ops_2_23), where they are refused at submit. */
static void test_fp8_version(void **state) {
  int old = before_fp8();
  for (int dt = TDIST_FLOAT8_E4M3; dt <= TDIST_FLOAT8_E5M2; dt++) {
    int from = fake_log_size();
    int rc = tdist_all_gather(world, hostbuf, hostbuf, 5, (tdist_dtype_t)dt, NULL, NULL);
    if (old) {
      assert_int_equal(rc, TDIST_ERR_NOT_SUPPORTED);
      assert_non_null(strstr(tdist_last_error(), "NCCL 2.24"));
      assert_int_equal(fake_find("ncclAllGather", from), -1);
    } else {
      assert_int_equal(rc, 0);
      assert_int_equal(fake_log_get(fake_find("ncclAllGather", from)).b,
                       dt == TDIST_FLOAT8_E4M3 ? ncclFloat8e4m3 : ncclFloat8e5m2);
    }
  }
}

/* PREMUL_SUM: created with the host scalar in the op's type, used by the
 * call, destroyed after it. */
static void premul_case(tdist_dtype_t dt, double s, double want_logged, int want_nccl_dt) {
  tdist_op_opts_t o = {.mask = TDIST_OP_FIELD_SCALAR, .premul_scalar = s};
  int from = fake_log_size();
  assert_int_equal(tdist_reduce_scatter(world, hostbuf, hostbuf, 2, dt, TDIST_PREMUL_SUM, &o, NULL),
                   0);
  int cr = fake_find("ncclRedOpCreatePreMulSum", from);
  int k = fake_find("ncclReduceScatter", from);
  int de = fake_find("ncclRedOpDestroy", from);
  assert_true(cr >= 0 && cr < k && k < de);
  fake_call_t c = fake_log_get(cr), call = fake_log_get(k), d = fake_log_get(de);
  assert_int_equal(c.b, want_nccl_dt);
  assert_true(c.scalar == want_logged);
  assert_int_equal((long)call.scalar, c.a); /* the created handle is the op used */
  assert_int_equal(d.a, c.a);
}

static void test_premul_sum(void **state) {
  premul_case(TDIST_FLOAT32, 0.25, 0.25, ncclFloat32);
  premul_case(TDIST_FLOAT64, -3.5, -3.5, ncclFloat64);
  premul_case(TDIST_INT32, 3, 3, ncclInt32);
  premul_case(TDIST_FLOAT16, 0.5, 0x3800, ncclFloat16); /* raw IEEE half bits */
  premul_case(TDIST_BFLOAT16, 0.5, 0x3f00, ncclBfloat16);
  premul_case(TDIST_FLOAT16, 1.0 / 3.0, 0x3555, ncclFloat16);
  if (!before_fp8()) {
    premul_case(TDIST_FLOAT8_E4M3, 0.5, 0x30, ncclFloat8e4m3); /* raw float8 bits */
    premul_case(TDIST_FLOAT8_E5M2, -3.0, 0xc2, ncclFloat8e5m2);
    premul_case(TDIST_FLOAT8_E4M3, 1e9, 0x7e, ncclFloat8e4m3); /* saturates at 448 */
  }
  premul_case(TDIST_UINT64, 7.9, 7, ncclUint64);
  assert_int_equal(fake_count("ncclRedOpCreatePreMulSum"), fake_count("ncclRedOpDestroy"));
}

static void test_every_op(void **state) {
  struct {
    const char *nccl;
    long count, extra;
  } want[] = {
      {"ncclBroadcast", 5, 0}, {"ncclReduce", 6, ncclMin}, {"ncclAllGather", 7, 0},
      {"ncclGather", 8, 0},    {"ncclScatter", 9, 0},      {"ncclReduceScatter", 10, ncclProd},
      {"ncclAlltoAll", 11, 0},
  };
  for (int i = 0; i < 7; i++) {
    int from = fake_log_size(), rc = -1;
    switch (i) {
    case 0: rc = tdist_broadcast(world, hostbuf, 5, TDIST_INT64, 0, NULL, NULL); break;
    case 1:
      rc = tdist_reduce(world, hostbuf, hostbuf, 6, TDIST_INT64, TDIST_MIN, 0, NULL, NULL);
      break;
    case 2: rc = tdist_all_gather(world, hostbuf, hostbuf, 7, TDIST_INT64, NULL, NULL); break;
    case 3: rc = tdist_gather(world, hostbuf, hostbuf, 8, TDIST_INT64, 0, NULL, NULL); break;
    case 4: rc = tdist_scatter(world, hostbuf, hostbuf, 9, TDIST_INT64, 0, NULL, NULL); break;
    case 5:
      rc = tdist_reduce_scatter(world, hostbuf, hostbuf, 10, TDIST_INT64, TDIST_PROD, NULL, NULL);
      break;
    default: rc = tdist_all_to_all(world, hostbuf, hostbuf + 2048, 11, TDIST_INT64, NULL, NULL);
    }
    assert_int_equal(rc, 0);
    fake_call_t c = fake_log_get(check_order(want[i].nccl, from, NULL));
    assert_int_equal(c.a, want[i].count); /* per-rank count, as NCCL defines it */
    assert_int_equal(c.b, ncclInt64);
    assert_int_equal((long)c.scalar, want[i].extra); /* root 0 or the reduction */
  }
  /* barrier: a one-element float all_reduce */
  int from = fake_log_size();
  assert_int_equal(tdist_barrier(world, NULL, NULL), 0);
  fake_call_t c = fake_log_get(check_order("ncclAllReduce", from, NULL));
  assert_int_equal(c.a, 1);
  assert_int_equal(c.b, ncclFloat32);
  /* self send/recv as one batch: Start, Send, Recv, End between wait and end event */
  tdist_p2p_op_t ops[2] = {
      {.kind = TDIST_P2P_SEND, .buf = hostbuf, .count = 4, .dtype = TDIST_UINT8, .peer = 0},
      {.kind = TDIST_P2P_RECV, .buf = hostbuf + 64, .count = 4, .dtype = TDIST_UINT8, .peer = 0}};
  from = fake_log_size();
  assert_int_equal(tdist_batch_isend_irecv(world, ops, 2, NULL, NULL), 0);
  int gs = fake_find("ncclGroupStart", from);
  int s = check_order("ncclSend", from, NULL);
  int r = fake_find("ncclRecv", from);
  int ge = fake_find("ncclGroupEnd", from);
  assert_true(fake_find("cudaStreamWaitEvent", from) < gs);
  assert_true(gs < s && s < r && r < ge);
  assert_true(ge < fake_find("cudaEventRecord", s));
  assert_int_equal(fake_log_get(s).b, ncclUint8);
}

static void test_wait_stream(void **state) {
  fake_script_t sc = {.ev_mode = FAKE_EV_MANUAL};
  fake_set_script(&sc);
  tdist_work_t *w = NULL;
  int from = fake_log_size();
  assert_int_equal(tdist_all_reduce(world, hostbuf, hostbuf, 4, TDIST_FLOAT32, TDIST_SUM, NULL, &w),
                   0);
  int k = check_order("ncclAllReduce", from, NULL);
  void *end = fake_log_get(fake_find("cudaEventRecord", k)).event;
  assert_int_equal(tdist_work_is_completed(w), 0);
  from = fake_log_size();
  assert_int_equal(tdist_work_wait_stream(w, OTHER_STREAM), 0);
  int j = fake_find("cudaStreamWaitEvent", from);
  assert_true(j >= 0);
  assert_ptr_equal(fake_log_get(j).stream, OTHER_STREAM);
  assert_ptr_equal(fake_log_get(j).event, end);
  /* The host-blocking wait times out while the event is pending. */
  assert_int_equal(tdist_work_wait(w, 50), TDIST_ERR_IN_PROGRESS);
  fake_complete_events(-1);
  assert_int_equal(tdist_work_wait(w, 5000), 0);
  /* Complete: nothing left to wait for, nothing enqueued. */
  from = fake_log_size();
  assert_int_equal(tdist_work_wait_stream(w, OTHER_STREAM), 0);
  assert_int_equal(fake_find("cudaStreamWaitEvent", from), -1);
  tdist_work_release(w);
  sc.ev_mode = FAKE_EV_AUTO;
  fake_set_script(&sc);
}

static void test_enqueue_in_progress(void **state) {
  fake_script_t sc = {.enqueue_returns_inprogress = 1, .enqueue_busy = 3};
  fake_set_script(&sc);
  int from = fake_log_size();
  assert_int_equal(
      tdist_all_reduce(world, hostbuf, hostbuf, 4, TDIST_FLOAT32, TDIST_SUM, NULL, NULL), 0);
  int k = check_order("ncclAllReduce", from, NULL);
  int end = fake_find("cudaEventRecord", k);
  int polls = 0;
  for (int i = k; i < end; i++)
    polls += strcmp(fake_log_get(i).name, "ncclCommGetAsyncError") == 0;
  assert_true(polls >= 4); /* 3 x InProgress, then success, before the end event */
  /* A batch's ncclGroupEnd in progress is waited for the same way. */
  tdist_p2p_op_t ops[1] = {
      {.kind = TDIST_P2P_SEND, .buf = hostbuf, .count = 4, .dtype = TDIST_UINT8, .peer = 0}};
  from = fake_log_size();
  assert_int_equal(tdist_batch_isend_irecv(world, ops, 1, NULL, NULL), 0);
  int ge = fake_find("ncclGroupEnd", from);
  end = fake_find("cudaEventRecord", ge);
  polls = 0;
  for (int i = ge; i < end; i++)
    polls += strcmp(fake_log_get(i).name, "ncclCommGetAsyncError") == 0;
  assert_true(polls >= 4);
  fake_script_t none = {0};
  fake_set_script(&none);
}

static void test_events_recycled(void **state) {
  tdist_work_t *w[64];
  int ops = 0;
  for (int round = 0; round < 10; round++) {
    for (int i = 0; i < 64; i++, ops++)
      assert_int_equal(
          tdist_all_reduce(world, hostbuf, hostbuf, 1, TDIST_FLOAT32, TDIST_SUM, NULL, &w[i]), 0);
    assert_int_equal(tdist_wait_all(w, 64, 5000), 0);
    for (int i = 0; i < 64; i++)
      tdist_work_release(w[i]);
  }
  /* Events are recycled: the pool is bounded by the ops in flight (64, plus
   * those whose event is returned just after their waiter woke), not by the
   * 640 ops issued. */
  int created = fake_count("cudaEventCreateWithFlags");
  assert_true(created <= 2 * 64 + 2);
  assert_true(ops == 640);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_stream_order, setup, teardown),
      cmocka_unit_test_setup_teardown(test_dtypes_and_redops, setup, teardown),
      cmocka_unit_test_setup_teardown(test_refused_at_submit, setup, teardown),
      cmocka_unit_test_setup_teardown(test_fp8_version, setup, teardown),
      cmocka_unit_test_setup_teardown(test_premul_sum, setup, teardown),
      cmocka_unit_test_setup_teardown(test_every_op, setup, teardown),
      cmocka_unit_test_setup_teardown(test_wait_stream, setup, teardown),
      cmocka_unit_test_setup_teardown(test_enqueue_in_progress, setup, teardown),
      cmocka_unit_test_setup_teardown(test_events_recycled, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
