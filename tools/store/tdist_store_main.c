/*
 * tdist-store - run a standalone store server until SIGINT/SIGTERM.
 *
 *   tdist-store [--host ADDR] [--port P] [--backlog N]
 *               [--job-size N --parent PID [--detach]]
 *
 * The token comes from $TDIST_STORE_TOKEN. Prints "listening on HOST:PORT"
 * once clients may connect (useful with --port 0), and the key count on exit.
 *
 * --job-size/--parent: the store rank 0 of an N-rank job started for itself
 * (src/store/spawn.c). Rank 0 stops it once every rank left. Should rank 0
 * be gone first (killed: this process was re-parented; stopped or hung: the
 * store declared it dead, "tdist/dead/0"), the store serves the survivors
 * and ends by itself when nobody can need it any more:
 *   - every rank left ("tdist/rdzv/left") or was declared dead
 *     ("tdist/dead/<r>"), or
 *   - rank 0 was killed before the rendezvous completed ("tdist/rdzv/arrived"
 *     < N): the job cannot start.
 * It checks through a connection of its own: every 250 ms while rank 0
 * lives, every 20 ms once rank 0 is gone or dead (nobody else will stop it,
 * and it must not linger after its job). --detach: after
 * the "listening" line, stdout and stderr go to $TDIST_STORE_LOG (appended)
 * or /dev/null, so that no reader of rank 0's output waits for the store.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tdist/errors.h"
#include "tdist/store.h"

static void usage(void) {
  fprintf(stderr, "usage: tdist-store [--host ADDR] [--port P] [--backlog N]\n"
                  "                   [--job-size N --parent PID [--detach]]\n"
                  "  serves the tdist key-value store; token from $TDIST_STORE_TOKEN\n");
}

static int key_exists(tdist_store_t *c, const char *key) {
  const char *keys[1] = {key};
  int exists = 0;
  return tdist_store_check(c, keys, 1, &exists) == 0 && exists;
}

/* 1 when the job no longer needs this store (see the header). *alone: 1
 * once rank 0 is gone or declared dead, so that nobody will stop this store
 * and it must notice the end of the job by itself. */
static int job_over(tdist_store_t *c, int size, pid_t parent, int *alone) {
  int parent_gone = getppid() != parent;
  if (!parent_gone && !key_exists(c, "tdist/dead/0")) return 0; /* rank 0 will stop us */
  *alone = 1;
  int64_t left = 0, arrived = 0, records = 0;
  if (tdist_store_add(c, "tdist/rdzv/arrived", 0, &arrived) != 0) return 0;
  if (parent_gone && arrived < size) return 1;
  if (tdist_store_add(c, "tdist/rdzv/left", 0, &left) != 0) return 0;
  /* Every death is also an abort record: while left plus the records fall
   * short of the job, the dead set (one request per rank) cannot fill it. */
  if (key_exists(c, "tdist/aborts/count") &&
      tdist_store_add(c, "tdist/aborts/count", 0, &records) != 0)
    return 0;
  if (left + records < size) return 0;
  int dead = 0;
  for (int r = 0; r < size; r++) {
    char key[48];
    snprintf(key, sizeof(key), "tdist/dead/%d", r);
    dead += key_exists(c, key);
  }
  return left + dead >= size;
}

static void redirect_output(void) {
  const char *log = getenv("TDIST_STORE_LOG");
  int fd = log && *log ? open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644) : -1;
  if (fd < 0) fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
  if (fd < 0) return;
  dup2(fd, 1);
  dup2(fd, 2);
  close(fd);
}

int main(int argc, char **argv) {
  tdist_store_server_opts_t o = {0};
  int job_size = 0, detach = 0;
  pid_t parent = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage();
      return 0;
    }
    if (!strcmp(a, "--detach")) {
      detach = 1;
      continue;
    }
    if (i + 1 >= argc) {
      usage();
      return 2;
    }
    if (!strcmp(a, "--port")) {
      o.mask |= TDIST_STORE_SERVER_FIELD_PORT;
      o.port = atoi(argv[++i]);
    } else if (!strcmp(a, "--host")) {
      o.mask |= TDIST_STORE_SERVER_FIELD_HOST;
      o.host = argv[++i];
    } else if (!strcmp(a, "--backlog")) {
      o.mask |= TDIST_STORE_SERVER_FIELD_BACKLOG;
      o.backlog = atoi(argv[++i]);
    } else if (!strcmp(a, "--job-size")) {
      job_size = atoi(argv[++i]);
    } else if (!strcmp(a, "--parent")) {
      parent = (pid_t)atoi(argv[++i]);
    } else {
      usage();
      return 2;
    }
  }
  if ((job_size > 0) != (parent > 0)) {
    usage();
    return 2;
  }
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  /* Block the signals in the server thread; this thread waits for them. */
  pthread_sigmask(SIG_BLOCK, &set, NULL);
  tdist_store_server_t *srv;
  int rc = tdist_store_server_start(&o, &srv);
  if (rc) {
    fprintf(stderr, "tdist-store: %s\n", tdist_last_error());
    return 1;
  }
  int port = tdist_store_server_port(srv);
  printf("tdist-store: listening on %s:%d\n",
         (o.mask & TDIST_STORE_SERVER_FIELD_HOST) ? o.host : "0.0.0.0", port);
  fflush(stdout);
  if (detach) redirect_output();
  int sig = 0;
  tdist_store_t *c = NULL;
  if (job_size > 0) {
    tdist_store_opts_t co = {.mask = TDIST_STORE_FIELD_TIMEOUT, .timeout_ms = 5000};
    if (tdist_store_connect("127.0.0.1", port, &co, &c) != 0)
      fprintf(stderr, "tdist-store: cannot watch the job: %s\n", tdist_last_error());
  }
  int alone = 0;
  for (;;) {
    if (!c) {
      sigwait(&set, &sig);
      break;
    }
    /* While rank 0 lives it stops this store (and reaps it): a slow check
     * for its death is enough. Once rank 0 is gone, the end of the job is
     * seen within 20 ms, so the store does not linger after its last rank
     * left (its new parent, PID 1 or a subreaper, then reaps it). */
    struct timespec ts = {0, (alone ? 20 : 250) * 1000 * 1000};
    sig = sigtimedwait(&set, NULL, &ts);
    if (sig > 0) break;
    if (sig < 0 && errno != EAGAIN && errno != EINTR) break;
    if (job_over(c, job_size, parent, &alone)) {
      sig = 0;
      break;
    }
  }
  tdist_store_release(c);
  if (sig > 0)
    printf("tdist-store: signal %d, stopping with %lld keys\n", sig,
           (long long)tdist_store_server_num_keys(srv));
  else
    printf("tdist-store: every rank of the job left or died, stopping with %lld keys\n",
           (long long)tdist_store_server_num_keys(srv));
  tdist_store_server_stop(srv);
  return 0;
}
