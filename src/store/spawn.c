/*
 * spawn.c - rank 0's store as a process of its own (see spawn.h).
 *
 * Why a process: a store served by a thread of rank 0 dies or stops with
 * rank 0, and then nothing can be agreed any more; the survivors cannot
 * shrink. A `tdist-store` started by rank 0 outlives it, exactly as the
 * store of tdistrun does: a killed rank 0 closes its heartbeat connection
 * and is declared dead at once, a stopped one after the heartbeat timeout,
 * and the survivors shrink through the store as with any other victim.
 *
 * The child: its own session (signals for rank 0's process group do not
 * reach it), stdin from /dev/null, stdout and stderr into a pipe until it
 * prints its "listening on" line (rank 0 reads it, or the reason it could
 * not start), then to /dev/null or $TDIST_STORE_LOG; no other inherited
 * descriptor (a test harness waiting for its pipes to close must not wait
 * for the store). It ends when rank 0 stops it (tdist__store_proc_stop, once
 * every rank left), which also reaps it, so that nothing of the store is left
 * when rank 0 returns; or by itself, within 20 ms, once rank 0 is gone and
 * every rank left or died (tools/store/tdist_store_main.c, --job-size). It
 * is then reaped by the process that adopted it: PID 1, or the nearest
 * ancestor that is a child subreaper (PR_SET_CHILD_SUBREAPER), as a launcher
 * that must leave nothing behind should be. Not PR_SET_PDEATHSIG: the store
 * must outlive a killed rank 0, or the survivors could agree on nothing.
 *
 * Thread: the caller's (rank 0 in init and cleanup). posix_spawn, not fork:
 * the process has other threads.
 */
#include "store/spawn.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "util/clock.h"
#include "util/error.h"
#include "util/log.h"
#include "util/param.h"

extern char **environ;

/* How long rank 0 waits for the child to listen (it only binds a socket). */
#define READY_MS 20000
/* How long a stopped store may take to exit before it is killed. */
#define STOP_MS 5000

static int executable(const char *p) { return *p && access(p, X_OK) == 0; }

/* The tdist-store next to this library (build tree: <build>/libtdist.so and
 * <build>/tools/store/tdist-store; installed: <prefix>/lib/libtdist.so and
 * <prefix>/bin/tdist-store), else the paths this build was configured with.
 * 0 and the path in out, or -1. */
static int find_binary(char *out, size_t ol) {
  const char *env = tdist__env_raw("TDIST_STORE_BIN");
  if (env && *env) {
    snprintf(out, ol, "%s", env);
    return executable(out) ? 0 : -1;
  }
  Dl_info info;
  if (dladdr((void *)find_binary, &info) && info.dli_fname) {
    char dir[4096];
    snprintf(dir, sizeof(dir), "%s", info.dli_fname);
    const char *d = dirname(dir);
    snprintf(out, ol, "%s/tools/store/tdist-store", d);
    if (executable(out)) return 0;
    snprintf(out, ol, "%s/../bin/tdist-store", d);
    if (executable(out)) return 0;
  }
#ifdef TDIST_STORE_BIN_INSTALL
  snprintf(out, ol, "%s", TDIST_STORE_BIN_INSTALL);
  if (executable(out)) return 0;
#endif
#ifdef TDIST_STORE_BIN_BUILD
  snprintf(out, ol, "%s", TDIST_STORE_BIN_BUILD);
  if (executable(out)) return 0;
#endif
  return -1;
}

/* Read the child's first output until its "listening on" line, EOF or the
 * deadline. 1 ready, 0 not; what it said in text. */
static int await_ready(int fd, char *text, size_t tl) {
  size_t len = 0;
  int64_t deadline = tdist__now_ms() + READY_MS;
  text[0] = '\0';
  for (;;) {
    if (strstr(text, "listening on") && strchr(strstr(text, "listening on"), '\n')) return 1;
    int64_t left = deadline - tdist__now_ms();
    if (left <= 0 || len + 1 >= tl) return 0;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int n = poll(&p, 1, (int)left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return 0;
    ssize_t r = read(fd, text + len, tl - 1 - len);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return 0; /* EOF: the child exited (or closed its output) */
    len += (size_t)r;
    text[len] = '\0';
  }
}

/* Reap pid within ms: 1 reaped (*status set), -1 not our child (gone, no
 * status), 0 still running after ms. */
static int reap(pid_t pid, int64_t ms, int *status) {
  int64_t deadline = tdist__now_ms() + ms;
  for (;;) {
    pid_t r = waitpid(pid, status, WNOHANG);
    if (r == pid) return 1;
    if (r < 0 && errno == ECHILD) return -1;
    if (tdist__now_ms() >= deadline) return 0;
    usleep(2000);
  }
}

int tdist__store_proc_start(int port, int world_size, tdist__store_proc_t *out) {
  int rc = 0, pipefd[2] = {-1, -1}, fa_init = 0, at_init = 0;
  char bin[4096], text[2048], a_port[16], a_size[16], a_parent[24];
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t at;
  pid_t pid = -1;
  out->pid = -1;
  if (find_binary(bin, sizeof(bin)) != 0)
    return tdist__error(TDIST_ERR_NOT_SUPPORTED,
                        "no tdist-store program found (next to libtdist, in the install or "
                        "build tree, or $TDIST_STORE_BIN)");
  if (pipe2(pipefd, O_CLOEXEC) != 0) {
    rc = tdist__error(TDIST_ERR_IO, "store: pipe: %s", strerror(errno));
    goto out;
  }
  snprintf(a_port, sizeof(a_port), "%d", port);
  snprintf(a_size, sizeof(a_size), "%d", world_size);
  snprintf(a_parent, sizeof(a_parent), "%d", (int)getpid());
  char *argv[] = {bin,        "--port", a_port,     "--job-size", a_size,
                  "--parent", a_parent, "--detach", NULL};
  if (posix_spawn_file_actions_init(&fa) != 0) goto spawn_fail;
  fa_init = 1;
  if (posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0) != 0 ||
      posix_spawn_file_actions_adddup2(&fa, pipefd[1], 1) != 0 ||
      posix_spawn_file_actions_adddup2(&fa, pipefd[1], 2) != 0 ||
      posix_spawn_file_actions_addclosefrom_np(&fa, 3) != 0)
    goto spawn_fail;
  if (posix_spawnattr_init(&at) != 0) goto spawn_fail;
  at_init = 1;
  sigset_t none, dflt;
  sigemptyset(&none);
  sigemptyset(&dflt);
  sigaddset(&dflt, SIGINT);
  sigaddset(&dflt, SIGTERM);
  sigaddset(&dflt, SIGPIPE);
  sigaddset(&dflt, SIGCHLD);
  if (posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK |
                                        POSIX_SPAWN_SETSIGDEF) != 0 ||
      posix_spawnattr_setsigmask(&at, &none) != 0 || posix_spawnattr_setsigdefault(&at, &dflt) != 0)
    goto spawn_fail;
  int e = posix_spawn(&pid, bin, &fa, &at, argv, environ);
  if (e != 0) {
    errno = e;
    goto spawn_fail;
  }
  close(pipefd[1]);
  pipefd[1] = -1;
  if (!await_ready(pipefd[0], text, sizeof(text))) {
    /* No ready line: EOF (the child ended, or is ending) or READY_MS
     * passed. A child that ended is named as a failure after the start
     * names it (tdist__store_proc_ended), so that a store killed while it
     * starts reads the same as one killed later; one still running is
     * killed. */
    tdist__store_proc_t early = {.pid = pid};
    char why[96], ended[160] = "";
    if (tdist__store_proc_ended(&early, why, sizeof(why), 500)) {
      snprintf(ended, sizeof(ended), "; the store process %d this rank started %s", (int)pid, why);
    } else {
      int st = 0;
      kill(pid, SIGKILL);
      reap(pid, STOP_MS, &st);
    }
    char *nl = strrchr(text, '\n');
    if (nl && nl[1] == '\0') *nl = '\0';
    rc = tdist__error(TDIST_ERR_IO, "the store (%s --port %d) did not start: %s%s", bin, port,
                      text[0] ? text : "no answer", ended);
    goto out;
  }
  TDIST_INFO(STORE, "store process %d serves port %d for %d ranks (%s)", (int)pid, port, world_size,
             bin);
  out->pid = pid;
  goto out;
spawn_fail:
  rc = tdist__error(TDIST_ERR_IO, "store: cannot start %s: %s", bin, strerror(errno));
out:
  if (fa_init) posix_spawn_file_actions_destroy(&fa);
  if (at_init) posix_spawnattr_destroy(&at);
  if (pipefd[0] >= 0) close(pipefd[0]);
  if (pipefd[1] >= 0) close(pipefd[1]);
  return rc;
}

int tdist__store_proc_ended(tdist__store_proc_t *p, char *why, size_t cap, int64_t wait_ms) {
  int st = 0;
  /* A killed process closes its sockets before it can be reaped: a client
   * sees the connection close a moment before waitpid finds it. */
  if (!p || p->pid <= 0 || reap(p->pid, wait_ms, &st) != 1) return 0;
  if (WIFSIGNALED(st))
    snprintf(why, cap, "was killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
  else
    snprintf(why, cap, "exited with code %d", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
  p->pid = -1;
  return 1;
}

void tdist__store_proc_stop(tdist__store_proc_t *p) {
  if (!p || p->pid <= 0) return;
  int st = 0;
  /* It may have ended by itself (rank 0 was declared dead and everyone
   * left); then this only reaps it. */
  kill(p->pid, SIGTERM);
  if (!reap(p->pid, STOP_MS, &st)) {
    TDIST_WARN(STORE, "store process %d did not stop in %d ms: killed", (int)p->pid, STOP_MS);
    kill(p->pid, SIGKILL);
    reap(p->pid, STOP_MS, &st);
  }
  p->pid = -1;
}
