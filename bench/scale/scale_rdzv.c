/*
 * scale_rdzv.c - tdist_bench_scale --hosts-rdzv: the world rendezvous per
 * host (tools/launcher/agent_rdzv.c, store/rdzv_host.c; issue 30).
 * RDZV_DRIVERS threads per client process run their ranks' real side
 * (tdist__rdzv_agent_ask/_answer, the halves of tdist__rdzv_via_agent: one
 * line to the host agent's abstract unix socket, one line back); per client
 * process one agent thread stands for tdistrun's agent: it accepts its
 * local ranks' connections, reads their "rdzv" lines and, once all are in,
 * counts them into the world with the real tdist_store_rendezvous_host on a
 * store connection of its own, then answers each "go <job>". (The real
 * agent forms a batch also when no rank came for 200 ms; here all local
 * ranks come, so one batch per host, as in a tdistrun job.) The ranks need
 * no store connection for this (-c 0 works), so 100k ranks fit in the
 * descriptor limit: the store sees P connections and ~5 requests per host.
 *
 * Phase 2 (unless --no-group) is then the world group's creation as a rank
 * under tdistrun does it on the store (world_create): through the agent's
 * store proxy, the real tools/launcher/agent_proxy.c compiled in, which
 * forwards on a few connections of its own.
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "agent_proxy.h"
#include "store/rendezvous.h"
#include "store/store_impl.h"
#include "tdist/errors.h"
#include "tdist/store.h"

#include "scale_internal.h"

/* (client main thread, before the rank threads) The agent's socket. */
int hosts_rdzv_listen(int idx) {
  snprintf(g_p.agent_name, sizeof(g_p.agent_name), "tdist-scale-%d-%d", (int)getppid(), idx);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  size_t nl = strlen(g_p.agent_name);
  memcpy(sa.sun_path + 1, g_p.agent_name, nl);
  g_p.agent_lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (g_p.agent_lfd < 0 ||
      bind(g_p.agent_lfd, (struct sockaddr *)&sa,
           (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + nl)) != 0 ||
      listen(g_p.agent_lfd, 4096) != 0)
    return -1;
  return 0;
}

/* (driver thread) What the world group's creation does on the store for
 * rank r under tdistrun (store through the agent): its root store opened
 * through the agent (tdist__store_connect_agent), the monitor's first
 * record read on it (add "tdist/aborts/count" 0: the monitor's own
 * connection is opened only when it first publishes, monitor.c), the CPU
 * backend's lazy address (cpu/conn/lazy.c: set "cpu/addr/<r>" under the group's
 * prefix); the job id came with the rendezvous (core/group/context.c asks
 * the store only without one). The monitor's hello to the agent is
 * --hosts-agg's. The handle stays open, as a rank keeps it. 0, or -1
 * (failure counted). */
static int world_create(int r) {
  tdist_store_opts_t o = {.mask = TDIST_STORE_FIELD_TIMEOUT,
                          .timeout_ms = (int64_t)(g_cfg.phase_timeout_s * 1000)};
  char addr[64], key[64], val[64];
  tdist_store_t **root = &g_p.wroot[r - g_p.lo];
  int64_t count = 0;
  snprintf(addr, sizeof(addr), "127.0.0.1:%d", atomic_load(&g_shm->port));
  if (tdist__store_connect_agent(g_p.agent_name, addr, &o, root)) goto fail;
  if (tdist_store_add(*root, "tdist/aborts/count", 0, &count)) goto fail;
  snprintf(key, sizeof(key), "tdist/g/0/cpu/addr/%d", r);
  int vl = snprintf(val, sizeof(val), "127.0.%d.%d:%d", (r >> 8) & 255, r & 255, 20000 + r % 30000);
  if (tdist_store_set(*root, key, val, (size_t)vl)) goto fail;
  atomic_fetch_add(&g_shm->ops, 2);
  g_shm->r[r].t_group = now_s();
  atomic_fetch_add(&g_shm->group_done, 1);
  return 0;
fail:
  fail_msg(r, "world creation through the host agent");
  return -1;
}

/* (driver thread) The rank's side for ranks lo, lo + step, ... below hi,
 * as tdist__rendezvous_join runs it for one (tdist__rdzv_via_agent is
 * these two halves): every line sent first, then every answer read, so a
 * few threads stand for a host's ranks (100k threads are more than this
 * machine's pid_max). */
static void *driver_main(void *arg) {
  int first = (int)(intptr_t)arg, step = RDZV_DRIVERS, n = 0;
  int64_t timeout = (int64_t)(g_cfg.phase_timeout_s * 1000);
  int *fds = calloc((size_t)((g_p.hi - g_p.lo) / step + 1), sizeof(int));
  char job[64];
  if (!fds || wait_phase(PH_RDZV)) goto done;
  for (int r = g_p.lo + first; r < g_p.hi; r += step, n++)
    if (tdist__rdzv_agent_ask(g_p.agent_name, r, g_cfg.n, timeout, &fds[n]) != 1) {
      fail_msg(r, "rendezvous: asking the host agent");
      goto done;
    }
  n = 0;
  for (int r = g_p.lo + first; r < g_p.hi; r += step, n++) {
    int rc = tdist__rdzv_agent_answer(fds[n], g_p.agent_name, timeout, job, sizeof(job));
    fds[n] = -1;
    if (rc != 1) {
      fail_msg(r, "rendezvous through the host agent");
      goto done;
    }
    g_shm->r[r].t_rdzv = now_s();
    atomic_fetch_add(&g_shm->rdzv_done, 1);
  }
  if (!g_cfg.group || wait_phase(PH_GROUP)) goto done;
  for (int r = g_p.lo + first; r < g_p.hi; r += step)
    if (world_create(r)) goto done;
done:
  free(fds); /* (a failed run's descriptors close with the process) */
  return NULL;
}

int hosts_rdzv_start_drivers(pthread_t *th, const pthread_attr_t *at) {
  int started = 0;
  for (int i = 0; i < RDZV_DRIVERS; i++)
    started += pthread_create(&th[i], at, driver_main, (void *)(intptr_t)i) == 0;
  return started;
}

/* (agent thread) Read up to a whole first line from a new connection:
 * the bytes read (the line, its newline, and what followed), or -1. */
static ssize_t read_line(int fd, char *buf, size_t cap) {
  size_t len = 0;
  while (len + 1 < cap) {
    ssize_t n = recv(fd, buf + len, cap - 1 - len, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return -1;
    len += (size_t)n;
    buf[len] = '\0';
    if (memchr(buf, '\n', len)) return (ssize_t)len;
  }
  return -1;
}

/* (agent thread) Count the local ranks in, answer them. */
static void count_in(int idx, int *fds, int got) {
  char line[512], job[64] = "";
  int rc = tdist_store_rendezvous_host(g_p.agent_rdzv, idx, got, g_cfg.n,
                                       (int64_t)(g_cfg.phase_timeout_s * 1000), job, sizeof(job));
  atomic_fetch_add(&g_shm->ops, 5);
  int len = rc ? snprintf(line, sizeof(line), "err %d %.400s\n", rc, tdist_last_error())
               : snprintf(line, sizeof(line), "go %s\n", job);
  for (int i = 0; i < got; i++) {
    if (send(fds[i], line, (size_t)len, MSG_NOSIGNAL) < 0) {
    }
    close(fds[i]);
  }
  if (rc) fail_msg(g_p.lo, "host rendezvous");
}

/* (agent thread) What agent.c's loop does with its ranks' connections, for
 * the two kinds this mode uses: "rdzv" lines, counted in once every local
 * rank's came; "store", handed to the store proxy (the real one,
 * tools/launcher/agent_proxy.c) with the bytes that followed. */
void *hosts_rdzv_agent(void *arg) {
  int idx = (int)(intptr_t)arg, nl = g_p.hi - g_p.lo, got = 0;
  int *fds = calloc((size_t)nl, sizeof(int));
  char line[8192];
  if (!fds || wait_phase(PH_RDZV)) goto done;
  while (phase_now() != PH_STOP) {
    struct pollfd p = {.fd = g_p.agent_lfd, .events = POLLIN};
    if (poll(&p, 1, 100) <= 0) continue;
    int fd = accept4(g_p.agent_lfd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) continue;
    ssize_t len = read_line(fd, line, sizeof(line));
    char *nl_at = len > 0 ? memchr(line, '\n', (size_t)len) : NULL;
    int rank = -1, size = -1;
    if (nl_at && !strncmp(line, "store\n", 6)) {
      trun_proxy_adopt(g_p.proxy, fd, nl_at + 1, (size_t)(line + len - (nl_at + 1)));
      continue;
    }
    if (!nl_at || sscanf(line, "rdzv %d %d", &rank, &size) != 2 || rank < g_p.lo ||
        rank >= g_p.hi || size != g_cfg.n || got == nl) {
      fail_msg(g_p.lo, "host agent: bad line");
      close(fd);
      goto done;
    }
    fds[got++] = fd;
    if (got == nl) count_in(idx, fds, got);
  }
done:
  for (int i = 0; fds && got < nl && i < got; i++)
    close(fds[i]);
  free(fds);
  return NULL;
}
