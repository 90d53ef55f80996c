/*
 * tdist-store - run a standalone store server until SIGINT/SIGTERM.
 *
 *   tdist-store [--host ADDR] [--port P] [--backlog N]
 *
 * The token comes from $TDIST_STORE_TOKEN. Prints "listening on HOST:PORT"
 * once clients may connect (useful with --port 0), and the key count on exit.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tdist/errors.h"
#include "tdist/store.h"

static void usage(void) {
  fprintf(stderr, "usage: tdist-store [--host ADDR] [--port P] [--backlog N]\n"
                  "  serves the tdist key-value store; token from $TDIST_STORE_TOKEN\n");
}

int main(int argc, char **argv) {
  tdist_store_server_opts_t o = {0};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage();
      return 0;
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
    } else {
      usage();
      return 2;
    }
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
  printf("tdist-store: listening on %s:%d\n",
         (o.mask & TDIST_STORE_SERVER_FIELD_HOST) ? o.host : "0.0.0.0",
         tdist_store_server_port(srv));
  fflush(stdout);
  int sig = 0;
  sigwait(&set, &sig);
  printf("tdist-store: signal %d, stopping with %lld keys\n", sig,
         (long long)tdist_store_server_num_keys(srv));
  tdist_store_server_stop(srv);
  return 0;
}
