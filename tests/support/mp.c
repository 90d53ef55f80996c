/* mp.c - see mp.h. Runs in the test's main thread only. */
#include "mp.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
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
  /* The parent sleeps until a child ends (SIGCHLD, blocked here and taken
   * by sigtimedwait) rather than polling: a poll every 2 ms woke on one of
   * the ranks' CPUs and preempted its caller, a stall of tens of us inside
   * a benchmark's timed loop. */
  sigset_t chld, old;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  sigprocmask(SIG_BLOCK, &chld, &old);
  fflush(stdout);
  fflush(stderr);
  for (int r = 0; r < n; r++) {
    pid_t pid = fork();
    if (pid == 0) {
      sigprocmask(SIG_SETMASK, &old, NULL);
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
    /* Only its own children: a helper the test forked before (a killer, a
     * server) is the test's to reap, with its status. */
    int reaped = 0;
    for (int r = 0; r < n; r++) {
      int status;
      if (pids[r] <= 0 || waitpid(pids[r], &status, WNOHANG) != pids[r]) continue;
      codes[r] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      pids[r] = 0;
      left--;
      reaped = 1;
    }
    if (reaped) continue;
    if (now_s() > deadline) {
      for (int r = 0; r < n; r++)
        if (pids[r] > 0) {
          fprintf(stderr, "mp: rank %d still running after %d s: killed\n", r, timeout_s);
          kill(pids[r], SIGKILL);
        }
      deadline = now_s() + 1e9;
    }
    /* A child that ended since waitpid left SIGCHLD pending: no wait. */
    double left_s = deadline - now_s();
    if (left_s > 1) left_s = 1;
    if (left_s < 0.001) left_s = 0.001;
    struct timespec ts = {(time_t)left_s, (long)((left_s - (double)(time_t)left_s) * 1e9)};
    (void)sigtimedwait(&chld, NULL, &ts);
  }
  sigprocmask(SIG_SETMASK, &old, NULL);
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

/* 1 if `port` can be listened on now (as the servers do: any address,
 * SO_REUSEADDR, so a TIME_WAIT left by an earlier test does not count). */
static int port_free(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1, ok = 0;
  if (fd < 0) return 0;
  struct sockaddr_in a;
  memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons((uint16_t)port);
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  ok = bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
  close(fd);
  return ok;
}

/* Reserve `port` among the tests of this host: a lock on a file named
 * after it, held (the fd left open) until this process and the ranks it
 * forks end. Two tests beside each other (ctest -j) could both find the
 * same port free before either listened: a rehearsal under stress-ng had
 * cpu_sc's ranks register in cpu_failures' store ("closed by an earlier
 * failure") and cpu_failures' diagnosis go unnamed. 1, or 0 when another
 * process holds it. Where the lock cannot be made at all, the port is
 * taken as before. */
static int port_reserve(int port) {
  char path[64];
  snprintf(path, sizeof(path), "/tmp/tdist-test-port-%d.lock", port);
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (fd < 0) return 1;
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    int held = errno == EWOULDBLOCK;
    close(fd);
    return !held;
  }
  return 1; /* fd stays open: the reservation */
}

/* Why not bind(port 0): the kernel hands out such ports from its ephemeral
 * range, the same range every outgoing connect() draws from. Between this
 * check and the test's server listening, a connection of any test running
 * beside it (ctest -j) could take the port ("address already in use",
 * seen under stress-ng). Ports below the ephemeral range are never given to
 * a connect(), so only another test's pick can collide: the start is random
 * per process and call, over ~16k ports. */
int tdist_mp_free_port(void) {
  static unsigned seed;
  int lo = 32768, hi = 60999;
  FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
  if (f) {
    if (fscanf(f, "%d %d", &lo, &hi) != 2) lo = 32768;
    fclose(f);
  }
  int base = 12000, top = lo - 1; /* below the ephemeral range */
  if (top - base >= 1000) {
    if (!seed) seed = (unsigned)getpid() * 2654435761u ^ (unsigned)((uint64_t)(now_s() * 1e6));
    int span = top - base + 1;
    for (int i = 0; i < 256; i++) {
      int port = base + (int)(rand_r(&seed) % (unsigned)span);
      if (port_free(port) && port_reserve(port)) return port;
    }
  }
  /* No room below the range (a tuned kernel): the kernel's pick. */
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a;
  memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (fd < 0) return -1;
  if (bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
      getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
    close(fd);
    return -1;
  }
  close(fd);
  return ntohs(a.sin_port);
}

pid_t tdist_mp_store_of(pid_t parent, int port) {
  char want[32], wport[16];
  snprintf(want, sizeof(want), "%d", (int)parent);
  snprintf(wport, sizeof(wport), "%d", port);
  DIR *d = opendir("/proc");
  struct dirent *e;
  pid_t found = 0;
  while (d && !found && (e = readdir(d))) {
    char path[300], cmd[1024];
    snprintf(path, sizeof(path), "/proc/%s/cmdline", e->d_name);
    FILE *f = fopen(path, "r");
    if (!f) continue;
    size_t len = fread(cmd, 1, sizeof(cmd) - 1, f);
    fclose(f);
    cmd[len] = 0;
    /* NUL-separated: "--parent" and "--port", each followed by its value */
    int has_parent = 0, has_port = 0;
    for (size_t i = 0; i < len; i += strlen(cmd + i) + 1) {
      size_t next = i + strlen(cmd + i) + 1;
      const char *v = next < len ? cmd + next : "";
      has_parent |= !strcmp(cmd + i, "--parent") && !strcmp(v, want);
      has_port |= !strcmp(cmd + i, "--port") && !strcmp(v, wport);
    }
    if (strstr(cmd, "tdist-store") && has_parent && has_port) found = (pid_t)atoi(e->d_name);
  }
  if (d) closedir(d);
  return found;
}
