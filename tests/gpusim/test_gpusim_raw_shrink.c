/*
 * test_gpusim_raw_shrink.c - a program that calls NCCL directly (the names
 * libtdist_gpusim.so exports, no tdist) and must get from the simulated GPU
 * the answers NCCL 2.28.9 gave on an H200 (issue 39):
 *
 *   hosts   three ranks, each its own NCCL_HOSTID (misc/utils.cc
 *           getHostHash: three hosts, network transport with a proxy); rank
 *           2 exits. The survivors: ncclCommGetAsyncError -> ncclRemoteError
 *           (proxy.cc asyncResult); shrink with NCCL_SHRINK_ABORT without a
 *           revoke -> ncclRemoteError, no child; ncclCommRevoke ->
 *           ncclInProgress and the error stays; shrink NCCL_SHRINK_DEFAULT
 *           and NCCL_SHRINK_ABORT after the revoke -> ncclRemoteError, no
 *           child (init.cc ncclCommInitChildComm -> ncclCommEnsureReady).
 *   onehost the same three ranks on one host (no NCCL_HOSTID: P2P/SHM, no
 *           proxy); rank 2 exits: nothing is reported, the collective's
 *           stream stays held until the abort.
 *   stopped one host; rank 2 is stopped (SIGSTOP: alive, its files open):
 *           nothing reported; revoke, then shrink NCCL_SHRINK_DEFAULT
 *           excluding it gives a working two-rank communicator.
 *
 * The parent forks the ranks before any NCCL or CUDA call, then makes the
 * unique id and hands it to each rank through a pipe (as a launcher would
 * through a file or a store). Usage: test_gpusim_raw_shrink hosts|onehost|stopped
 */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gpusim/api.h"
#include "tdist/gpusim.h"

#define NRANKS 3
#define LEAVER 2 /* the rank that exits or stops */

#define CHECK(cond)                                                                             \
  do {                                                                                          \
    if (!(cond)) {                                                                              \
      fprintf(stderr, "[rank %d pid %d] %s:%d: check failed: %s (last NCCL error: %s)\n", rank, \
              (int)getpid(), __FILE__, __LINE__, #cond, ncclGetLastError(NULL));                \
      return 1;                                                                                 \
    }                                                                                           \
  } while (0)

enum { MODE_HOSTS, MODE_ONEHOST, MODE_STOPPED };

static long long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Poll ncclCommGetAsyncError until it leaves ncclInProgress (or timeout). */
static ncclResult_t wait_ready(ncclComm_t c, int timeout_ms) {
  long long end = now_ms() + timeout_ms;
  ncclResult_t st = ncclInProgress;
  while (ncclCommGetAsyncError(c, &st) == ncclSuccess && st == ncclInProgress && now_ms() < end)
    usleep(1000);
  return st;
}

/* Poll for up to ms: the first state that is neither success nor in
 * progress, or ncclSuccess if none came. */
static ncclResult_t watch_error(ncclComm_t c, int ms) {
  long long end = now_ms() + ms;
  ncclResult_t st = ncclSuccess;
  while (now_ms() < end) {
    if (ncclCommGetAsyncError(c, &st) != ncclSuccess) return ncclInvalidArgument;
    if (st != ncclSuccess && st != ncclInProgress) return st;
    usleep(2000);
  }
  return ncclSuccess;
}

static int read_full(int fd, void *p, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t k = read(fd, (char *)p + got, n - got);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return -1;
    got += (size_t)k;
  }
  return 0;
}

static int rank_main(int rank, int mode, int idfd) {
  char hostid[32];
  if (mode == MODE_HOSTS) {
    snprintf(hostid, sizeof(hostid), "raw-shrink-host-%d", rank);
    setenv("NCCL_HOSTID", hostid, 1);
  } else {
    unsetenv("NCCL_HOSTID");
  }
  ncclUniqueId id;
  CHECK(read_full(idfd, &id, sizeof(id)) == 0);
  close(idfd);

  CHECK(cudaSetDevice(rank) == cudaSuccess);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclComm_t c = NULL;
  ncclResult_t r = ncclCommInitRankConfig(&c, NRANKS, id, rank, &cfg);
  CHECK(r == ncclSuccess || r == ncclInProgress);
  CHECK(wait_ready(c, 20000) == ncclSuccess);
  float h[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  void *d = NULL;
  CHECK(cudaMalloc(&d, sizeof(h)) == cudaSuccess);
  CHECK(cudaMemcpy(d, h, sizeof(h), cudaMemcpyHostToDevice) == cudaSuccess);
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  /* An 8-float all_reduce: every rank connected. */
  r = ncclAllReduce(d, d, 8, ncclFloat32, ncclSum, c, s);
  CHECK(r == ncclSuccess || r == ncclInProgress);
  CHECK(wait_ready(c, 20000) == ncclSuccess);
  CHECK(cudaStreamSynchronize(s) == cudaSuccess);

  if (rank == LEAVER) {
    if (mode == MODE_STOPPED) raise(SIGSTOP); /* the parent kills it at the end */
    _exit(0);                                 /* gone: its sockets close */
  }

  /* The survivors' next all_reduce waits for the leaver in the kernel. */
  r = ncclAllReduce(d, d, 8, ncclFloat32, ncclSum, c, s);
  CHECK(r == ncclSuccess || r == ncclInProgress);
  /* The launch (a group job) ends before the event is recorded behind it;
   * the proxy may already have seen the exit. */
  r = wait_ready(c, 10000);
  CHECK(r == ncclSuccess || (mode == MODE_HOSTS && r == ncclRemoteError));
  cudaEvent_t ev;
  CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) == cudaSuccess);
  CHECK(cudaEventRecord(ev, s) == cudaSuccess);
  int ex[1] = {LEAVER};
  ncclComm_t sh = NULL;

  if (mode == MODE_HOSTS) {
    /* proxy.cc: the network proxy sees the closed connection. */
    CHECK(watch_error(c, 10000) == ncclRemoteError);
    /* NCCL_SHRINK_ABORT without a revoke: the kernel is stopped, then
     * ncclCommEnsureReady answers the proxy's error. */
    CHECK(ncclCommShrink(c, ex, 1, &sh, NULL, NCCL_SHRINK_ABORT) == ncclRemoteError);
    CHECK(sh == NULL);
    CHECK(ncclCommRevoke(c, NCCL_REVOKE_DEFAULT) == ncclInProgress);
    CHECK(wait_ready(c, 10000) == ncclRemoteError); /* stays after the revoke */
    CHECK(wait_ready(c, 100) == ncclRemoteError);
    ex[0] = LEAVER;
    CHECK(ncclCommShrink(c, ex, 1, &sh, NULL, NCCL_SHRINK_DEFAULT) == ncclRemoteError);
    CHECK(sh == NULL);
    ex[0] = LEAVER;
    CHECK(ncclCommShrink(c, ex, 1, &sh, NULL, NCCL_SHRINK_ABORT) == ncclRemoteError);
    CHECK(sh == NULL);
    CHECK(wait_ready(c, 100) == ncclRemoteError);
    CHECK(ncclCommAbort(c) == ncclSuccess);
  } else if (mode == MODE_ONEHOST) {
    /* P2P/SHM have no proxy: nothing reported; the kernel spins. */
    CHECK(watch_error(c, 1000) == ncclSuccess);
    CHECK(cudaEventQuery(ev) == cudaErrorNotReady);
    CHECK(ncclCommAbort(c) == ncclSuccess);
    CHECK(cudaEventQuery(ev) == cudaSuccess);
  } else {
    CHECK(watch_error(c, 1000) == ncclSuccess);
    CHECK(cudaEventQuery(ev) == cudaErrorNotReady);
    CHECK(ncclCommRevoke(c, NCCL_REVOKE_DEFAULT) == ncclInProgress);
    CHECK(wait_ready(c, 10000) == ncclSuccess);
    CHECK(cudaEventSynchronize(ev) == cudaSuccess); /* the revoke stopped the kernel */
    r = ncclCommShrink(c, ex, 1, &sh, NULL, NCCL_SHRINK_DEFAULT);
    CHECK(r == ncclInProgress || r == ncclSuccess);
    CHECK(wait_ready(c, 20000) == ncclSuccess);
    CHECK(sh != NULL);
    int n = 0;
    CHECK(ncclCommCount(sh, &n) == ncclSuccess && n == 2);
    float v = (float)(rank + 1);
    CHECK(cudaMemcpy(d, &v, sizeof(v), cudaMemcpyHostToDevice) == cudaSuccess);
    r = ncclAllReduce(d, d, 1, ncclFloat32, ncclSum, sh, s);
    CHECK(r == ncclSuccess || r == ncclInProgress);
    CHECK(wait_ready(sh, 20000) == ncclSuccess);
    CHECK(cudaStreamSynchronize(s) == cudaSuccess);
    CHECK(cudaMemcpy(&v, d, sizeof(v), cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(v == 3.0f);
    CHECK(ncclCommDestroy(sh) == ncclSuccess);
    CHECK(ncclCommAbort(c) == ncclSuccess);
  }
  cudaFree(d);
  return 0;
}

int main(int argc, char **argv) {
  int mode = -1;
  if (argc == 2 && strcmp(argv[1], "hosts") == 0) mode = MODE_HOSTS;
  if (argc == 2 && strcmp(argv[1], "onehost") == 0) mode = MODE_ONEHOST;
  if (argc == 2 && strcmp(argv[1], "stopped") == 0) mode = MODE_STOPPED;
  if (mode < 0) {
    fprintf(stderr, "usage: %s hosts|onehost|stopped\n", argv[0]);
    return 2;
  }
  pid_t pid[NRANKS];
  int wfd[NRANKS];
  for (int i = 0; i < NRANKS; i++) {
    int p[2];
    if (pipe(p) != 0) return 2;
    pid[i] = fork();
    if (pid[i] < 0) return 2;
    if (pid[i] == 0) {
      close(p[1]);
      for (int j = 0; j < i; j++)
        close(wfd[j]);
      alarm(60); /* a hang fails this rank */
      _exit(rank_main(i, mode, p[0]));
    }
    close(p[0]);
    wfd[i] = p[1];
  }
  ncclUniqueId id;
  int fail = ncclGetUniqueId(&id) != ncclSuccess;
  for (int i = 0; i < NRANKS; i++) {
    if (!fail && write(wfd[i], &id, sizeof(id)) != (ssize_t)sizeof(id)) fail = 1;
    close(wfd[i]);
  }
  for (int i = 0; i < NRANKS; i++) {
    int st = 0;
    if (i == LEAVER) continue;
    while (waitpid(pid[i], &st, 0) < 0 && errno == EINTR) {
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      fprintf(stderr, "rank %d failed (status 0x%x)\n", i, st);
      fail = 1;
    }
  }
  /* The leaver exited on its own, or is stopped until the survivors are done. */
  int st = 0;
  if (mode == MODE_STOPPED) kill(pid[LEAVER], SIGKILL);
  while (waitpid(pid[LEAVER], &st, 0) < 0 && errno == EINTR) {
  }
  if (mode != MODE_STOPPED && (!WIFEXITED(st) || WEXITSTATUS(st) != 0)) {
    fprintf(stderr, "rank %d failed (status 0x%x)\n", LEAVER, st);
    fail = 1;
  }
  if (!fail) printf("raw NCCL %s: OK\n", argv[1]);
  return fail;
}
