/*
 * test_gpusim_nccl.c - conformance: the simulated NCCL's communicators
 * behave as NCCL 2.28's do, across real processes. Each test names the NCCL
 * source it checks (NVIDIA/nccl v2.28: src/init.cc, src/group.cc,
 * src/enqueue.cc, the user guide's "Communicators" and "Fault Tolerance"
 * pages).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gpusim/nccl_sim.h" /* GS_WORK_FIFO_KERNELS */
#include "gpusim_test_util.h"

typedef struct arg {
  ncclUniqueId id;
  int hosts; /* killed_child: each rank its own NCCL_HOSTID */
} arg_t;

static int run(int n, tdist_mp_fn fn, int *codes) {
  arg_t a = {0};
  if (ncclGetUniqueId(&a.id) != ncclSuccess) return -1;
  if (codes) return tdist_mp_run_codes(n, fn, &a, 60, codes);
  return tdist_mp_run(n, fn, &a, 60);
}

static int init(int rank, int n, void *p, int blocking, ncclComm_t *c) {
  arg_t *a = p;
  ncclConfig_t cfg = gt_config(blocking);
  if (cudaSetDevice(rank) != cudaSuccess) return 1;
  ncclResult_t r = ncclCommInitRankConfig(c, n, a->id, rank, &cfg);
  if (!blocking && r == ncclInProgress) r = gt_wait_ready(*c, 10000);
  return r != ncclSuccess;
}

/* One all-reduce on every rank: the runtime connection is made (the first
 * collective connects with all ranks and waits for them: transport.cc). */
static int warm(ncclComm_t c) {
  void *d = gt_dev_from(NULL, 16);
  ncclResult_t r = ncclAllReduce(d, d, 1, ncclFloat32, ncclSum, c, NULL);
  if (r == ncclInProgress) r = gt_wait_ready(c, 10000);
  if (r == ncclSuccess && cudaDeviceSynchronize() != cudaSuccess) r = ncclUnhandledCudaError;
  cudaFree(d);
  return r != ncclSuccess;
}

/* ---- a missing rank hangs the stream until abort (kernel.c; init.cc
 * ncclCommAbort: setCommAbortFlags, then commReclaim waits for the kernels) */
static int hang_child(int rank, int n, void *p) {
  ncclComm_t c;
  MP_CHECK(init(rank, n, p, 1, &c) == 0);
  MP_CHECK(warm(c) == 0);
  if (rank == 1) { /* never calls the collective; stays alive */
    usleep(1500 * 1000);
    GT_NCCL(ncclCommAbort(c));
    return 0;
  }
  cudaStream_t s;
  cudaEvent_t ev;
  GT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  GT_CUDA(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  void *d = gt_dev_from(NULL, 64);
  GT_NCCL(ncclAllReduce(d, d, 16, ncclFloat32, ncclSum, c, s));
  GT_CUDA(cudaEventRecord(ev, s));
  usleep(400 * 1000);
  MP_CHECK(cudaEventQuery(ev) == cudaErrorNotReady); /* the stream is held */
  MP_CHECK(cudaStreamQuery(s) == cudaErrorNotReady);
  GT_NCCL(ncclCommAbort(c)); /* returns once the kernel stopped */
  MP_CHECK(cudaEventQuery(ev) == cudaSuccess);
  cudaFree(d);
  return 0;
}
static void missing_rank_hangs_until_abort(void **s) {
  (void)s;
  assert_int_equal(run(2, hang_child, NULL), 0);
}

/* ---- non-blocking init: ncclInProgress, *comm at once, ready when all
 * arrive (init.cc ncclCommInitRankConfig; user guide, non-blocking) ----- */
static int nbinit_child(int rank, int n, void *p) {
  arg_t *a = p;
  ncclConfig_t cfg = gt_config(0);
  GT_CUDA(cudaSetDevice(rank));
  if (rank == 1) usleep(300 * 1000);
  ncclComm_t c = NULL;
  ncclResult_t r = ncclCommInitRankConfig(&c, n, a->id, rank, &cfg);
  MP_CHECK(r == ncclInProgress && c != NULL);
  if (rank == 0) {
    ncclResult_t st;
    GT_NCCL(ncclCommGetAsyncError(c, &st));
    MP_CHECK(st == ncclInProgress); /* rank 1 has not arrived */
  }
  MP_CHECK(gt_wait_ready(c, 10000) == ncclSuccess);
  /* Every enqueue of a non-blocking communicator is a job (group.cc). */
  void *d = gt_dev_from(NULL, 64);
  r = ncclAllReduce(d, d, 16, ncclFloat32, ncclSum, c, NULL);
  MP_CHECK(r == ncclInProgress);
  MP_CHECK(gt_wait_ready(c, 10000) == ncclSuccess);
  GT_CUDA(cudaDeviceSynchronize());
  GT_NCCL(ncclCommDestroy(c));
  cudaFree(d);
  return 0;
}
static void nonblocking_init_and_enqueue(void **s) {
  (void)s;
  assert_int_equal(run(2, nbinit_child, NULL), 0);
}

/* ---- split: *newcomm NULL until the job ends; the parent in progress
 * (init.cc ncclCommInitChildComm: "*newcomm should be NCCL_COMM_NULL until
 * comm split fully complete") ------------------------------------------- */
static int split_child(int rank, int n, void *p) {
  ncclComm_t c, child = (ncclComm_t)(uintptr_t)0x1;
  MP_CHECK(init(rank, n, p, 0, &c) == 0);
  if (rank == 2) usleep(400 * 1000);
  int color = rank == 1 ? NCCL_SPLIT_NOCOLOR : 7;
  ncclResult_t r = ncclCommSplit(c, color, -rank, &child, NULL);
  MP_CHECK(r == ncclInProgress);
  if (rank == 0) {
    usleep(150 * 1000);
    ncclResult_t st;
    GT_NCCL(ncclCommGetAsyncError(c, &st));
    MP_CHECK(st == ncclInProgress);
    MP_CHECK(child == NULL); /* set to NULL at the call, written at the end */
  }
  MP_CHECK(gt_wait_ready(c, 10000) != ncclInProgress);
  if (rank == 1) {
    MP_CHECK(child == NULL); /* NCCL_SPLIT_NOCOLOR */
    GT_NCCL(ncclCommDestroy(c));
    return 0;
  }
  MP_CHECK(child != NULL);
  int cn, cr;
  GT_NCCL(ncclCommCount(child, &cn));
  GT_NCCL(ncclCommUserRank(child, &cr));
  MP_CHECK(cn == 2);
  MP_CHECK(cr == (rank == 2 ? 0 : 1)); /* ordered by key (-rank) */
  float h = (float)(rank + 1), out = 0;
  void *d = gt_dev_from(&h, sizeof(h));
  GT_CHECK_LAUNCHED(ncclAllReduce(d, d, 1, ncclFloat32, ncclSum, child, NULL));
  MP_CHECK(gt_wait_ready(child, 10000) == ncclSuccess);
  MP_CHECK(gt_to_host(&out, d, sizeof(out)) == 0);
  MP_CHECK(out == 4.0f);
  GT_NCCL(ncclCommDestroy(child));
  GT_NCCL(ncclCommDestroy(c));
  cudaFree(d);
  return 0;
}
static void split_writes_newcomm_late(void **s) {
  (void)s;
  assert_int_equal(run(3, split_child, NULL), 0);
}

/* ---- misuse becomes the async error (enqueue.cc ncclEnqueueCheck: fail
 * stores ret with ncclCommSetAsyncError; ncclCommEnsureReady returns it) */
static int misuse_child(int rank, int n, void *p) {
  ncclComm_t c;
  MP_CHECK(init(rank, n, p, 0, &c) == 0);
  void *d = gt_dev_from(NULL, 64);
  /* A call while the previous one is in progress: ncclInvalidArgument
   * (ncclCommEnsureReady), stored as the async error -- until the job still
   * running stores its own result (group.cc groupLaunch), as in NCCL.
   * Rank 0 comes late, so rank 1's first launch waits to connect. */
  if (rank == 0) usleep(300 * 1000);
  ncclResult_t first = ncclAllReduce(d, d, 4, ncclFloat32, ncclSum, c, NULL);
  MP_CHECK(rank == 1 ? first == ncclInProgress : GT_LAUNCHED(first)); /* 1 waits for 0 */
  if (rank == 1)
    MP_CHECK(ncclAllReduce(d, d, 4, ncclFloat32, ncclSum, c, NULL) == ncclInvalidArgument);
  long long t0 = gt_now_ms();
  ncclResult_t st = ncclInProgress;
  while (st != ncclSuccess && gt_now_ms() - t0 < 10000) {
    usleep(1000);
    GT_NCCL(ncclCommGetAsyncError(c, &st));
  }
  MP_CHECK(st == ncclSuccess);
  GT_CUDA(cudaDeviceSynchronize());
  /* An invalid argument on a ready communicator: its error for good. */
  MP_CHECK(ncclAllReduce(d, d, 4, (ncclDataType_t)99, ncclSum, c, NULL) == ncclInvalidArgument);
  GT_NCCL(ncclCommGetAsyncError(c, &st));
  MP_CHECK(st == ncclInvalidArgument);
  /* Every later call fails with it: the communicator is done for. */
  MP_CHECK(ncclAllReduce(d, d, 4, ncclFloat32, ncclSum, c, NULL) == ncclInvalidArgument);
  usleep(100 * 1000);
  GT_NCCL(ncclCommGetAsyncError(c, &st));
  MP_CHECK(st == ncclInvalidArgument);
  /* ncclCommDestroy returns the error and destroys nothing (init.cc:
   * NCCLCHECK(ncclCommEnsureReady(comm))); abort works. */
  MP_CHECK(ncclCommDestroy(c) == ncclInvalidArgument);
  GT_NCCL(ncclCommAbort(c));
  cudaFree(d);
  return 0;
}
static void misuse_is_permanent(void **s) {
  (void)s;
  assert_int_equal(run(2, misuse_child, NULL), 0);
}

/* ---- a killed peer (user guide, fault tolerance; init.cc ncclCommRevoke,
 * ncclCommShrink). Which transport sees it decides (misc/utils.cc
 * getHostHash: NCCL_HOSTID, else the host name):
 *   - on another host (network transport, with a proxy): the proxy stores
 *     ncclRemoteError (proxy.cc asyncResult) and nothing clears it: revoke
 *     answers ncclInProgress, the error stays, and a shrink fails with it
 *     (ncclCommInitChildComm -> ncclCommEnsureReady), no child;
 *   - on the same host (P2P/SHM, no proxy): nothing is reported, the kernel
 *     spins until revoke; revoke, then shrink excluding it, works. ------- */
static int killed_child(int rank, int n, void *p) {
  int hosts = ((arg_t *)p)->hosts;
  if (hosts) {
    char id[32];
    snprintf(id, sizeof(id), "killed-peer-host-%d", rank);
    setenv("NCCL_HOSTID", id, 1);
  } else {
    unsetenv("NCCL_HOSTID");
  }
  ncclComm_t c;
  MP_CHECK(init(rank, n, p, 0, &c) == 0);
  MP_CHECK(warm(c) == 0);
  if (rank == 2) raise(SIGKILL);
  float h = (float)rank;
  void *d = gt_dev_from(&h, sizeof(h));
  cudaEvent_t ev;
  GT_CUDA(cudaEventCreate(&ev));
  /* A nonblocking communicator answers InProgress, or Success when its job
   * already ended (as NCCL's ncclGroupEnd does: seen under TSan at idle). */
  ncclResult_t q = ncclAllReduce(d, d, 1, ncclFloat32, ncclSum, c, NULL);
  MP_CHECK(q == ncclInProgress || q == ncclSuccess);
  ncclResult_t st = gt_wait_ready(c, 10000); /* the launch ended */
  MP_CHECK(st == ncclSuccess || (hosts && st == ncclRemoteError));
  GT_CUDA(cudaEventRecord(ev, NULL));
  long long t0 = gt_now_ms();
  while (st != ncclRemoteError && gt_now_ms() - t0 < (hosts ? 5000 : 500)) {
    usleep(2000);
    GT_NCCL(ncclCommGetAsyncError(c, &st));
  }
  MP_CHECK(st == (hosts ? ncclRemoteError : ncclSuccess));
  MP_CHECK(cudaEventQuery(ev) == cudaErrorNotReady); /* the kernel still waits */
  MP_CHECK(ncclCommRevoke(c, NCCL_REVOKE_DEFAULT) == ncclInProgress);
  MP_CHECK(gt_wait_ready(c, 10000) == (hosts ? ncclRemoteError : ncclSuccess));
  GT_CUDA(cudaEventSynchronize(ev)); /* the kernel exited */
  /* A revoked communicator takes no new work. */
  MP_CHECK(ncclAllReduce(d, d, 1, ncclFloat32, ncclSum, c, NULL) == ncclInvalidUsage);
  int ex[1] = {2};
  ncclComm_t sh = NULL;
  if (hosts) {
    MP_CHECK(ncclCommShrink(c, ex, 1, &sh, NULL, NCCL_SHRINK_DEFAULT) == ncclRemoteError);
    MP_CHECK(sh == NULL);
    GT_NCCL(ncclCommAbort(c));
    cudaFree(d);
    return 0;
  }
  MP_CHECK(ncclCommShrink(c, ex, 1, &sh, NULL, NCCL_SHRINK_DEFAULT) == ncclInProgress);
  MP_CHECK(gt_wait_ready(c, 10000) == ncclSuccess);
  MP_CHECK(sh != NULL);
  h = (float)(rank + 1);
  GT_CUDA(cudaMemcpy(d, &h, sizeof(h), cudaMemcpyHostToDevice));
  GT_CHECK_LAUNCHED(ncclAllReduce(d, d, 1, ncclFloat32, ncclSum, sh, NULL));
  MP_CHECK(gt_wait_ready(sh, 10000) == ncclSuccess);
  MP_CHECK(gt_to_host(&h, d, sizeof(h)) == 0);
  MP_CHECK(h == 3.0f);
  GT_NCCL(ncclCommAbort(c));
  GT_NCCL(ncclCommDestroy(sh));
  cudaFree(d);
  return 0;
}
static void killed_peer_run(int hosts) {
  arg_t a = {.hosts = hosts};
  int codes[3];
  assert_int_equal(ncclGetUniqueId(&a.id), ncclSuccess);
  tdist_mp_run_codes(3, killed_child, &a, 60, codes);
  assert_int_equal(codes[0], 0);
  assert_int_equal(codes[1], 0);
  assert_int_equal(codes[2], 128 + SIGKILL);
}
static void killed_peer_same_host_silent_then_shrink(void **s) {
  (void)s;
  killed_peer_run(0);
}
static void killed_peer_other_host_remote_error_stays(void **s) {
  (void)s;
  killed_peer_run(1);
}

/* ---- shrink with NCCL_SHRINK_ABORT on a live parent: in-flight kernels
 * exit early and their events complete (init.cc ncclCommShrink) --------- */
static int shrink_abort_child(int rank, int n, void *p) {
  ncclComm_t c;
  MP_CHECK(init(rank, n, p, 1, &c) == 0);
  MP_CHECK(warm(c) == 0);
  if (rank == 2) { /* alive, but never joins the collective */
    usleep(2000 * 1000);
    return 0;
  }
  float h[4] = {1, 2, 3, 4}, out[4];
  void *d = gt_dev_from(h, sizeof(h));
  cudaStream_t s;
  cudaEvent_t ev;
  GT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  GT_CUDA(cudaEventCreate(&ev));
  GT_NCCL(ncclAllReduce(d, d, 4, ncclFloat32, ncclSum, c, s));
  GT_CUDA(cudaEventRecord(ev, s));
  usleep(200 * 1000);
  MP_CHECK(cudaEventQuery(ev) == cudaErrorNotReady);
  int ex[1] = {2};
  ncclComm_t sh = NULL;
  GT_NCCL(ncclCommShrink(c, ex, 1, &sh, NULL, NCCL_SHRINK_ABORT));
  /* The event completed, yet the all-reduce never happened. */
  MP_CHECK(cudaEventQuery(ev) == cudaSuccess);
  MP_CHECK(gt_to_host(out, d, sizeof(out)) == 0);
  MP_CHECK(out[0] == 1.0f); /* untouched: the kernel exited before any round */
  GT_NCCL(ncclAllReduce(d, d, 4, ncclFloat32, ncclSum, sh, s));
  GT_CUDA(cudaStreamSynchronize(s));
  MP_CHECK(gt_to_host(out, d, sizeof(out)) == 0);
  MP_CHECK(out[3] == 8.0f);
  GT_NCCL(ncclCommDestroy(sh));
  GT_NCCL(ncclCommAbort(c));
  cudaFree(d);
  return 0;
}
static void shrink_abort_completes_events(void **s) {
  (void)s;
  assert_int_equal(run(3, shrink_abort_child, NULL), 0);
}

/* ---- NCCL_SHRINK_ABORT synchronises the parent's stream on the caller's
 * thread (init.cc ncclCommShrink: setCommAbortFlags, then
 * ncclStrongStreamSynchronize before ncclCommInitChildComm): a collective
 * stuck behind a user kernel that the abort flag cannot stop holds the
 * caller, even on a non-blocking communicator. ------------------------ */
static void spin_ms(void *arg) { usleep((useconds_t)(uintptr_t)arg * 1000); }
static int shrink_stuck_child(int rank, int n, void *p) {
  ncclComm_t c;
  MP_CHECK(init(rank, n, p, 0, &c) == 0);
  MP_CHECK(warm(c) == 0);
  if (rank == 2) { /* alive, never joins the collective */
    usleep(3000 * 1000);
    return 0;
  }
  void *d = gt_dev_from(NULL, 64);
  cudaStream_t s;
  GT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  long long t_launch = gt_now_ms();
  GT_CUDA((cudaError_t)tdist_gpusim_launch_kernel(s, spin_ms, (void *)(uintptr_t)1200));
  ncclResult_t r = ncclAllReduce(d, d, 4, ncclFloat32, ncclSum, c, s);
  MP_CHECK(r == ncclInProgress || r == ncclSuccess); /* the launch job may be done already */
  MP_CHECK(gt_wait_ready(c, 10000) == ncclSuccess);
  int ex[1] = {2};
  ncclComm_t sh = NULL;
  MP_CHECK(cudaStreamQuery(s) == cudaErrorNotReady); /* the user kernel still runs */
  r = ncclCommShrink(c, ex, 1, &sh, NULL, NCCL_SHRINK_ABORT);
  MP_CHECK(r == ncclInProgress || r == ncclSuccess);
  /* The call itself waited for the user kernel: its 1.2 s are over and the
   * stream is idle as soon as the call returns. */
  MP_CHECK(gt_now_ms() - t_launch >= 1150);
  MP_CHECK(cudaStreamQuery(s) == cudaSuccess);
  MP_CHECK(gt_wait_ready(c, 10000) == ncclSuccess);
  MP_CHECK(sh != NULL);
  GT_NCCL(ncclCommAbort(c));
  MP_CHECK(gt_wait_ready(sh, 10000) == ncclSuccess);
  GT_NCCL(ncclCommDestroy(sh));
  cudaFree(d);
  return 0;
}
static void shrink_abort_waits_on_caller_thread(void **s) {
  (void)s;
  assert_int_equal(run(3, shrink_stuck_child, NULL), 0);
}

/* ---- grouped send/recv: a ring both ways and a send to self in one group
 * (user guide, "Group Calls": point-to-point in a group progress together) */
static int p2p_child(int rank, int n, void *p) {
  ncclComm_t c;
  MP_CHECK(init(rank, n, p, 1, &c) == 0);
  enum { N = 100000 }; /* 400 KB: more than a ring holds */
  int *h = malloc(N * sizeof(int)), *o = malloc(N * sizeof(int));
  for (int i = 0; i < N; i++)
    h[i] = rank * 1000000 + i;
  void *src = gt_dev_from(h, N * sizeof(int)), *l = gt_dev_from(NULL, N * sizeof(int));
  void *r = gt_dev_from(NULL, N * sizeof(int)), *self = gt_dev_from(NULL, N * sizeof(int));
  int right = (rank + 1) % n, left = (rank + n - 1) % n;
  GT_NCCL(ncclGroupStart());
  GT_NCCL(ncclSend(src, N, ncclInt32, right, c, NULL));
  GT_NCCL(ncclSend(src, N, ncclInt32, left, c, NULL));
  GT_NCCL(ncclRecv(l, N, ncclInt32, left, c, NULL));
  GT_NCCL(ncclRecv(r, N, ncclInt32, right, c, NULL));
  GT_NCCL(ncclSend(src, N, ncclInt32, rank, c, NULL));
  GT_NCCL(ncclRecv(self, N, ncclInt32, rank, c, NULL));
  GT_NCCL(ncclGroupEnd());
  GT_CUDA(cudaDeviceSynchronize());
  MP_CHECK(gt_to_host(o, l, N * sizeof(int)) == 0);
  MP_CHECK(o[0] == left * 1000000 && o[N - 1] == left * 1000000 + N - 1);
  MP_CHECK(gt_to_host(o, r, N * sizeof(int)) == 0);
  MP_CHECK(o[5] == right * 1000000 + 5);
  MP_CHECK(gt_to_host(o, self, N * sizeof(int)) == 0);
  MP_CHECK(o[7] == rank * 1000000 + 7);
  MP_CHECK(ncclGroupEnd() == ncclInvalidUsage); /* group.cc: not in a group call */
  GT_NCCL(ncclCommDestroy(c));
  free(h);
  free(o);
  return 0;
}
static void grouped_send_recv(void **s) {
  (void)s;
  assert_int_equal(run(3, p2p_child, NULL), 0);
}

/* ---- abort waits for a kernel queued behind a spinning user kernel
 * (init.cc ncclCommAbort -> commReclaim waits for the comm's kernels) --- */
static void spin(void *arg) { usleep((useconds_t)(uintptr_t)arg); }
static int abort_wait_child(int rank, int n, void *p) {
  ncclComm_t c;
  MP_CHECK(init(rank, n, p, 1, &c) == 0);
  MP_CHECK(warm(c) == 0);
  if (rank == 1) {
    usleep(1500 * 1000);
    GT_NCCL(ncclCommAbort(c));
    return 0;
  }
  cudaStream_t s;
  GT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  GT_CUDA((cudaError_t)tdist_gpusim_launch_kernel(s, spin, (void *)(uintptr_t)(600 * 1000)));
  void *d = gt_dev_from(NULL, 64);
  GT_NCCL(ncclAllReduce(d, d, 4, ncclFloat32, ncclSum, c, s));
  long long t0 = gt_now_ms();
  GT_NCCL(ncclCommAbort(c));
  MP_CHECK(gt_now_ms() - t0 >= 400); /* blocked until the host function ended */
  cudaFree(d);
  return 0;
}
static void abort_waits_for_queued_kernel(void **s) {
  (void)s;
  assert_int_equal(run(2, abort_wait_child, NULL), 0);
}

/* ---- two threads in one communicator are counted (NCCL forbids it) ---- */
typedef struct two {
  ncclComm_t c;
  void *d;
  ncclResult_t r;
} two_t;
static void *second(void *p) {
  two_t *t = p;
  t->r = ncclAllReduce(t->d, t->d, 4, ncclFloat32, ncclSum, t->c, NULL);
  return NULL;
}
static int threads_child(int rank, int n, void *p) {
  ncclComm_t c;
  MP_CHECK(init(rank, n, p, 1, &c) == 0);
  void *d = gt_dev_from(NULL, 64);
  if (rank == 1) usleep(500 * 1000); /* rank 0's first collective waits to connect */
  long before = tdist_gpusim_comm_violations();
  two_t t = {c, d, ncclSuccess};
  pthread_t th;
  if (rank == 0) {
    pthread_create(&th, NULL, second, &t);
    usleep(100 * 1000);
  }
  ncclResult_t r = ncclAllReduce(d, d, 4, ncclFloat32, ncclSum, c, NULL);
  if (rank == 0) {
    pthread_join(th, NULL);
    MP_CHECK(tdist_gpusim_comm_violations() > before);
  } else {
    MP_CHECK(r == ncclSuccess);
    GT_NCCL(ncclAllReduce(d, d, 4, ncclFloat32, ncclSum, c, NULL)); /* rank 0 ran two */
  }
  /* Abort, not synchronize and destroy: what two threads did to one
   * communicator is undefined (NCCL forbids it; the simulation may pair the
   * two calls' steps differently under load), so their kernels may never
   * finish; the abort stops them either way. The point was the count. */
  GT_NCCL(ncclCommAbort(c));
  cudaFree(d);
  return 0;
}
static void concurrent_calls_counted(void **s) {
  (void)s;
  assert_int_equal(run(2, threads_child, NULL), 0);
}

/* ---- fp8 reductions need sm_90 (enqueue.cc taskAppend: "FP8 reduction
 * support begins with sm90 capable devices", from comm->minCompCap); fp8
 * data movement does not. Run with TDIST_GPUSIM_CC=8.0 and with the
 * default 9.0 (CMakeLists.txt registers both). */
static int fp8_child(int rank, int n, void *p) {
  int major = 0;
  GT_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  ncclComm_t c;
  MP_CHECK(init(rank, n, p, 0, &c) == 0);
  unsigned char h[4] = {0x38, 0x38, 0x40, 0x40}, o[8]; /* e4m3: 1, 1, 2, 2 */
  void *d = gt_dev_from(h, 4), *g = gt_dev_from(NULL, 8);
  MP_CHECK(d && g);
  GT_CHECK_LAUNCHED(ncclAllGather(d, g, 4, ncclFloat8e4m3, c, NULL));
  MP_CHECK(gt_wait_ready(c, 10000) == ncclSuccess);
  GT_CUDA(cudaDeviceSynchronize());
  MP_CHECK(gt_to_host(o, g, 8) == 0 && o[4] == 0x38 && o[7] == 0x40);
  ncclResult_t r = ncclAllReduce(d, d, 4, ncclFloat8e4m3, ncclSum, c, NULL);
  if (major >= 9) {
    MP_CHECK(GT_LAUNCHED(r) && gt_wait_ready(c, 10000) == ncclSuccess);
    GT_CUDA(cudaDeviceSynchronize());
    MP_CHECK(gt_to_host(o, d, 4) == 0 && o[0] == 0x40 && o[2] == 0x48); /* 2, 4 */
    GT_NCCL(ncclCommDestroy(c));
  } else {
    MP_CHECK(r == ncclInvalidArgument); /* refused, and the communicator's error */
    ncclResult_t st;
    GT_NCCL(ncclCommGetAsyncError(c, &st));
    MP_CHECK(st == ncclInvalidArgument);
    GT_NCCL(ncclCommAbort(c));
  }
  cudaFree(d);
  cudaFree(g);
  return 0;
}
static void fp8_reduction_needs_sm90(void **s) {
  (void)s;
  assert_int_equal(run(2, fp8_child, NULL), 0);
}

/* ---- a kernel that touches freed memory faults: cudaErrorIllegalAddress,
 * sticky for the process (CUDA Runtime API, "Error Handling": a sticky
 * error leaves the context unusable); NCCL does not check pointers by
 * default (misc/argcheck.cc: only with NCCL_CHECK_POINTERS) ---------------- */
static int fault_child(int rank, int n, void *p) {
  ncclComm_t c;
  MP_CHECK(init(rank, n, p, 1, &c) == 0);
  void *d = gt_dev_from(NULL, 64);
  GT_CUDA(cudaFree(d));
  GT_NCCL(ncclAllReduce(d, d, 16, ncclFloat32, ncclSum, c, NULL)); /* enqueued */
  MP_CHECK(cudaDeviceSynchronize() == cudaErrorIllegalAddress);
  void *e = NULL;
  MP_CHECK(cudaMalloc(&e, 16) == cudaErrorIllegalAddress); /* sticky */
  MP_CHECK(cudaGetLastError() == cudaErrorIllegalAddress);
  MP_CHECK(cudaGetLastError() == cudaErrorIllegalAddress); /* not cleared */
  return 0;
}
static void freed_buffer_faults_sticky(void **s) {
  (void)s;
  assert_int_equal(run(1, fault_child, NULL), 0);
}

/* ---- revoke while a non-blocking enqueue's group job is linked, then
 * ncclCommGetAsyncError: NCCL 2.28 frees the job in revoke
 * (ncclCommEnsureReady -> group.cc ncclGroupJobAbort) and leaves
 * comm->groupJob pointing at it; ncclCommGetAsyncError reading ncclSuccess
 * then completes the freed job (init.cc). Detected, not crashed. ------- */
static int uaf_child(int rank, int n, void *p) {
  ncclComm_t c;
  MP_CHECK(init(rank, n, p, 0, &c) == 0);
  if (rank == 1) { /* late for the first collective: the enqueue stays in flight */
    usleep(1000 * 1000);
    GT_NCCL(ncclCommAbort(c));
    return 0;
  }
  void *d = gt_dev_from(NULL, 64);
  long before = tdist_gpusim_use_after_free();
  MP_CHECK(ncclAllReduce(d, d, 4, ncclFloat32, ncclSum, c, NULL) == ncclInProgress);
  usleep(100 * 1000);
  ncclResult_t st;
  GT_NCCL(ncclCommGetAsyncError(c, &st));
  MP_CHECK(st == ncclInProgress); /* waiting to connect with rank 1 */
  MP_CHECK(ncclCommRevoke(c, NCCL_REVOKE_DEFAULT) == ncclInProgress);
  MP_CHECK(tdist_gpusim_use_after_free() == before); /* freed, not yet used */
  MP_CHECK(gt_wait_ready(c, 10000) == ncclSuccess);  /* this call uses it */
  MP_CHECK(tdist_gpusim_use_after_free() == before + 1);
  GT_NCCL(ncclCommGetAsyncError(c, &st)); /* unlinked now: once */
  MP_CHECK(tdist_gpusim_use_after_free() == before + 1);
  GT_NCCL(ncclCommAbort(c));
  cudaFree(d);
  return 0;
}
static void revoke_in_flight_use_after_free(void **s) {
  (void)s;
  assert_int_equal(run(2, uaf_child, NULL), 0);
}

/* ---- ncclCommGetAsyncError writes the communicator (it completes the
 * group job: init.cc): a watchdog thread polling it while another thread is
 * inside a call on the communicator is counted. ------------------------ */
static void *poll_async(void *p) {
  ncclResult_t st;
  usleep(100 * 1000); /* the main thread is inside its all_reduce by now */
  (void)ncclCommGetAsyncError((ncclComm_t)p, &st);
  return NULL;
}
static int poll_child(int rank, int n, void *p) {
  ncclComm_t c;
  MP_CHECK(init(rank, n, p, 1, &c) == 0);
  void *d = gt_dev_from(NULL, 64);
  if (rank == 1) usleep(500 * 1000); /* rank 0's first collective waits to connect */
  long before = tdist_gpusim_comm_violations();
  pthread_t th;
  if (rank == 0) pthread_create(&th, NULL, poll_async, c);
  GT_NCCL(ncclAllReduce(d, d, 4, ncclFloat32, ncclSum, c, NULL));
  if (rank == 0) {
    pthread_join(th, NULL);
    MP_CHECK(tdist_gpusim_comm_violations() == before + 1);
  }
  GT_CUDA(cudaDeviceSynchronize());
  GT_NCCL(ncclCommDestroy(c));
  cudaFree(d);
  return 0;
}
static void get_async_error_counted(void **s) {
  (void)s;
  assert_int_equal(run(2, poll_child, NULL), 0);
}

/* ---- runtime connection of a second algorithm (transport.cc, measured on
 * an H200 with NCCL 2.28.9): after an 8-float all_reduce, with one rank
 * 1.5 s late, the first all_reduce above 64 KiB stays ncclInProgress in the
 * enqueue until the late rank arrives at 3 ranks; a 64-float one does not
 * wait; at 2 ranks none waits. ---------------------------------------- */
static int late_child(int rank, int n, void *p) {
  ncclComm_t c;
  MP_CHECK(init(rank, n, p, 0, &c) == 0);
  MP_CHECK(warm(c) == 0);
  enum { BIG = 256 * 1024 };
  void *small = gt_dev_from(NULL, 64 * sizeof(float));
  void *big = gt_dev_from(NULL, BIG * sizeof(float));
  MP_CHECK(small && big);
  if (rank == n - 1) usleep(1500 * 1000);
  long long t0 = gt_now_ms();
  ncclResult_t r = ncclAllReduce(small, small, 64, ncclFloat32, ncclSum, c, NULL);
  MP_CHECK(r == ncclInProgress || r == ncclSuccess);
  MP_CHECK(gt_wait_ready(c, 10000) == ncclSuccess);
  long long t_small = gt_now_ms() - t0;
  t0 = gt_now_ms();
  r = ncclAllReduce(big, big, BIG, ncclFloat32, ncclSum, c, NULL);
  MP_CHECK(r == ncclInProgress || r == ncclSuccess);
  MP_CHECK(gt_wait_ready(c, 10000) == ncclSuccess);
  long long t_big = gt_now_ms() - t0;
  GT_CUDA(cudaDeviceSynchronize());
  if (rank != n - 1) {
    MP_CHECK(t_small < 500);
    if (n >= 3)
      MP_CHECK(t_big >= 1000); /* waited for the late rank's first use */
    else
      MP_CHECK(t_big < 500);
  }
  GT_NCCL(ncclCommDestroy(c));
  cudaFree(small);
  cudaFree(big);
  return 0;
}
static void first_large_collective_waits_at_three_ranks(void **s) {
  (void)s;
  assert_int_equal(run(3, late_child, NULL), 0);
}
static void first_large_collective_no_wait_at_two_ranks(void **s) {
  (void)s;
  assert_int_equal(run(2, late_child, NULL), 0);
}

/* ---- the work FIFO full (enqueue.cc waitWorkFifoAvailable): with the peer
 * absent, every kernel waits and consumes nothing; past the FIFO's
 * GS_WORK_FIFO_KERNELS launches the next enqueue stays ncclInProgress until
 * the peer comes and kernels finish (checked for 1 s before rank 1 is let
 * in). ----------------------------------------------------------------- */
static int fifo_child(int rank, int n, void *p) {
  ncclComm_t c;
  MP_CHECK(init(rank, n, p, 0, &c) == 0);
  MP_CHECK(warm(c) == 0);
  float one = 1.0f;
  float *d = gt_dev_from(&one, sizeof(one));
  MP_CHECK(d != NULL);
  /* Rank 1 comes only when rank 0 says so (a file named after the test
   * process), so the FIFO fills however slow the host is. */
  char flag[64];
  snprintf(flag, sizeof(flag), "/tmp/gpusim-fifo-%d", (int)getppid());
  if (rank == 1) {
    for (int i = 0; i < 30000 && access(flag, F_OK) != 0; i++)
      usleep(1000);
    MP_CHECK(access(flag, F_OK) == 0);
  }
  for (int i = 0; i < GS_WORK_FIFO_KERNELS + 1; i++) {
    ncclResult_t r = ncclAllReduce(d, d, 1, ncclFloat32, ncclMax, c, NULL);
    MP_CHECK(r == ncclInProgress || r == ncclSuccess);
    if (rank == 0 && i == GS_WORK_FIFO_KERNELS) {
      /* The FIFO is full of kernels waiting for rank 1: this launch waits. */
      long long t0 = gt_now_ms();
      while (gt_now_ms() - t0 < 1000) {
        ncclResult_t st = ncclSuccess;
        MP_CHECK(ncclCommGetAsyncError(c, &st) == ncclSuccess);
        MP_CHECK(st == ncclInProgress);
        usleep(10000);
      }
      FILE *f = fopen(flag, "w");
      MP_CHECK(f != NULL);
      fclose(f);
    }
    MP_CHECK(gt_wait_ready(c, 30000) == ncclSuccess);
  }
  GT_CUDA(cudaDeviceSynchronize());
  float h = 0;
  GT_CUDA(cudaMemcpy(&h, d, sizeof(h), cudaMemcpyDeviceToHost));
  MP_CHECK(h == 1.0f);
  if (rank == 0) unlink(flag);
  GT_NCCL(ncclCommDestroy(c));
  cudaFree(d);
  return 0;
}
static void work_fifo_full_waits(void **s) {
  (void)s;
  assert_int_equal(run(2, fifo_child, NULL), 0);
}

/* On a blocking communicator the same wait is inside the call; an abort
 * from another thread ends it (NCCL's abortFlag ends connection waits). */
typedef struct aborter {
  ncclComm_t c;
} aborter_t;
static void *abort_later(void *p) {
  usleep(500 * 1000);
  (void)ncclCommAbort(((aborter_t *)p)->c);
  return NULL;
}
static int blocking_wait_child(int rank, int n, void *p) {
  ncclComm_t c;
  MP_CHECK(init(rank, n, p, 1, &c) == 0);
  MP_CHECK(warm(c) == 0);
  if (rank == n - 1) { /* never makes the large collective */
    usleep(2500 * 1000);
    GT_NCCL(ncclCommAbort(c));
    return 0;
  }
  enum { BIG = 256 * 1024 };
  void *big = gt_dev_from(NULL, BIG * sizeof(float));
  aborter_t a = {c};
  pthread_t th;
  pthread_create(&th, NULL, abort_later, &a);
  long long t0 = gt_now_ms();
  ncclResult_t r = ncclAllReduce(big, big, BIG, ncclFloat32, ncclSum, c, NULL);
  long long dt = gt_now_ms() - t0;
  pthread_join(th, NULL);
  MP_CHECK(r != ncclSuccess);       /* ended by the abort, not completed */
  MP_CHECK(dt >= 400 && dt < 2000); /* inside the call until the abort */
  cudaFree(big);
  return 0;
}
static void blocking_connect_wait_ends_at_abort(void **s) {
  (void)s;
  assert_int_equal(run(3, blocking_wait_child, NULL), 0);
}

int main(int argc, char **argv) {
  if (argc > 1) cmocka_set_test_filter(argv[1]);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(fp8_reduction_needs_sm90),
      cmocka_unit_test(freed_buffer_faults_sticky),
      cmocka_unit_test(missing_rank_hangs_until_abort),
      cmocka_unit_test(nonblocking_init_and_enqueue),
      cmocka_unit_test(split_writes_newcomm_late),
      cmocka_unit_test(misuse_is_permanent),
      cmocka_unit_test(killed_peer_same_host_silent_then_shrink),
      cmocka_unit_test(killed_peer_other_host_remote_error_stays),
      cmocka_unit_test(shrink_abort_completes_events),
      cmocka_unit_test(shrink_abort_waits_on_caller_thread),
      cmocka_unit_test(grouped_send_recv),
      cmocka_unit_test(abort_waits_for_queued_kernel),
      cmocka_unit_test(concurrent_calls_counted),
      cmocka_unit_test(revoke_in_flight_use_after_free),
      cmocka_unit_test(get_async_error_counted),
      cmocka_unit_test(first_large_collective_waits_at_three_ranks),
      cmocka_unit_test(first_large_collective_no_wait_at_two_ranks),
      cmocka_unit_test(blocking_connect_wait_ends_at_abort),
      cmocka_unit_test(work_fifo_full_waits),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
