/* mp.c - see mp.h. Runs in the test's main thread only. */
#include "mp.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int tdist_mp_run_codes(int n, tdist_mp_fn fn, void *arg, int timeout_s, int *codes) {
  pid_t *pids = calloc((size_t)n, sizeof(pid_t));
  int failed = 0;
  fflush(stdout);
  fflush(stderr);
  for (int r = 0; r < n; r++) {
    pid_t pid = fork();
    if (pid == 0) {
      int rc = fn(r, n, arg);
      fflush(stdout);
      fflush(stderr);
      _exit(rc == 0 ? 0 : (rc & 0x7f) ? (rc & 0x7f) : 1);
    }
    pids[r] = pid;
    codes[r] = -1;
  }
  double deadline = now_s() + timeout_s;
  int left = n;
  while (left > 0) {
    int status;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      for (int r = 0; r < n; r++) {
        if (pids[r] != pid) continue;
        codes[r] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        pids[r] = 0;
        left--;
      }
      continue;
    }
    if (now_s() > deadline) {
      for (int r = 0; r < n; r++)
        if (pids[r] > 0) {
          fprintf(stderr, "mp: rank %d still running after %d s: killed\n", r, timeout_s);
          kill(pids[r], SIGKILL);
        }
      deadline = now_s() + 1e9;
    }
    usleep(2000);
  }
  for (int r = 0; r < n; r++)
    if (codes[r] != 0) {
      fprintf(stderr, "mp: rank %d failed (%s %d)\n", r, codes[r] >= 128 ? "signal" : "exit",
              codes[r] >= 128 ? codes[r] - 128 : codes[r]);
      failed++;
    }
  free(pids);
  return failed;
}

int tdist_mp_run(int n, tdist_mp_fn fn, void *arg, int timeout_s) {
  int codes[1024];
  if (n > 1024) return n;
  return tdist_mp_run_codes(n, fn, arg, timeout_s, codes);
}

int tdist_mp_free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a;
  memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
      getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
    close(fd);
    return -1;
  }
  close(fd);
  return ntohs(a.sin_port);
}
