/*
 * scale_server.c - the server process of tdist_bench_scale: the real store
 * server (tdist_store_server_start) in a process of its own, or with --etcd
 * one etcd member exec'd in its place. See scale_bench.c.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tdist/errors.h"
#include "tdist/store.h"

#include "scale_internal.h"

/* (server process main thread) Start the server, publish its port and key
 * count until told to stop. */
int server_proc(void) {
  tdist_store_server_t *srv = NULL;
  tdist_store_server_opts_t so = {.mask = TDIST_STORE_SERVER_FIELD_HOST, .host = "0.0.0.0"};
  if (tdist_store_server_start(&so, &srv)) {
    snprintf(g_shm->err, sizeof(g_shm->err), "server: %s", tdist_last_error());
    atomic_store(&g_shm->server_up, -1);
    return 1;
  }
  atomic_store(&g_shm->port, tdist_store_server_port(srv));
  atomic_store(&g_shm->server_up, 1);
  while (!atomic_load(&g_shm->server_stop)) {
    atomic_store(&g_shm->keys, tdist_store_server_num_keys(srv));
    sleep_s(0.1);
  }
  tdist_store_server_stop(srv);
  return 0;
}

/* A free TCP port on 127.0.0.1 (bound, read, closed: etcd binds it next). */
int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0), port = -1;
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof(a);
  if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
      getsockname(fd, (struct sockaddr *)&a, &al) == 0)
    port = ntohs(a.sin_port);
  if (fd >= 0) close(fd);
  return port;
}

/* (--etcd, the server process) exec one etcd member on 127.0.0.1 with its
 * data in `dir` ($TDIST_ETCD_BIN, else etcd in PATH); the clients wait for
 * it as they wait for a store server (tdist_store_open_url). Its settings
 * are etcd's defaults (--max-txn-ops 128, --quota-backend-bytes 2 GiB,
 * --max-request-bytes 1.5 MiB), as a user's cluster would have them. */
int etcd_proc(const char *dir, int port, int peer_port) {
  const char *bin = getenv("TDIST_ETCD_BIN");
  char client[64], peer[64], cluster[96];
  snprintf(client, sizeof(client), "http://127.0.0.1:%d", port);
  snprintf(peer, sizeof(peer), "http://127.0.0.1:%d", peer_port);
  snprintf(cluster, sizeof(cluster), "scale=%s", peer);
  if (!freopen("/dev/null", "w", stdout) || !freopen("/dev/null", "w", stderr)) return 1;
  execlp(bin && *bin ? bin : "etcd", "etcd", "--name", "scale", "--data-dir", dir,
         "--listen-client-urls", client, "--advertise-client-urls", client, "--listen-peer-urls",
         peer, "--initial-advertise-peer-urls", peer, "--initial-cluster", cluster, "--log-level",
         "error", (char *)NULL);
  return 127;
}
