/*
 * rdzv_host.c - the world rendezvous per host (issue 30, docs/scale.md
 * "Rendezvous per host"): a host agent counts its ranks in with one request
 * instead of each rank doing three or four, so the store serves O(hosts)
 * rendezvous requests, not O(ranks).
 *
 *   - tdist_store_rendezvous_host (the agent's side, any thread): claim
 *     "host/<h>" (compare_set: a second agent claiming the index sees the
 *     first's value and fails naming both; the same agent may call again
 *     for ranks that came later), add nranks to "arrived", agree
 *     on the job id of the round, set "go/<round>" when this completes the
 *     round, wait for it. The keys and the counting are rendezvous.c's, so
 *     ranks that join on their own ("rank/<r>", add 1) and hosts that join
 *     through an agent (add k) meet in one world.
 *   - tdist__rdzv_via_agent (the rank's side, in tdist__rendezvous_join):
 *     one line to the agent's unix socket, one line back.
 *
 * The agent's side of the line protocol, which waits for all of its local
 * ranks before calling tdist_store_rendezvous_host, is in
 * tools/launcher/agent_rdzv.c.
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "store/rendezvous.h"
#include "store/store_impl.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/param.h"
#include "util/unixsock.h"

/* TDIST_RDZV_AGENT=0: a rank with a host agent still does its rendezvous on
 * the store itself (the agent then waits in vain: set it for the whole job). */
TDIST_PARAM(RdzvAgent, "TDIST_RDZV_AGENT", 1)

/* How long past its own timeout a rank waits for the agent's answer: the
 * agent times out first and says how many arrived. */
#define AGENT_GRACE_MS 5000

int tdist_store_rendezvous_host(tdist_store_t *store, int host, int nranks, int world_size,
                                int64_t timeout_ms, char *job, size_t job_len) {
  tdist_store_t *v = NULL;
  void *cur = NULL;
  size_t cl = 0;
  char key[64], me[160], name[64] = "?";
  int rc = 0;
  if (!store || !job || job_len == 0 || host < 0 || nranks < 1 || world_size < 1 ||
      nranks > world_size || timeout_ms <= 0)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                        "tdist_store_rendezvous_host: bad arguments (host %d, %d of %d ranks, "
                        "timeout %" PRId64 " ms)",
                        host, nranks, world_size, timeout_ms);
  /* etcd counts arrivals with a key per rank (rendezvous.c arrive_by_keys),
   * where an add per host would not meet them. */
  if (tdist__store_counts_prefixes(store))
    return tdist__error(TDIST_ERR_NOT_SUPPORTED,
                        "tdist_store_rendezvous_host: the store at %s counts arrivals per rank "
                        "(etcd); the rendezvous per host needs a TCP or file store",
                        tdist_store_address(store));
  TDIST_CHECK(tdist_store_prefix(store, "tdist/rdzv/", &v));
  gethostname(name, sizeof(name) - 1);
  snprintf(me, sizeof(me), "the agent %s:%d", name, (int)getpid());
  snprintf(key, sizeof(key), "host/%d", host);
  TDIST_CHECKGOTO(tdist_store_compare_set(v, key, NULL, 0, me, strlen(me), &cur, &cl), rc, fail);
  if (cl != strlen(me) || memcmp(cur, me, cl) != 0) {
    rc = tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                      "host %d is claimed by two agents: %.*s and %s (this one)", host, (int)cl,
                      (char *)cur, me);
    goto fail;
  }
  int64_t arrived = 0;
  TDIST_CHECKGOTO(tdist_store_add(v, "arrived", nranks, &arrived), rc, fail);
  int64_t round = (arrived - 1) / world_size;
  TDIST_CHECKGOTO(tdist__rdzv_agree_job(v, round, job, job_len), rc, fail);
  snprintf(key, sizeof(key), "go/%" PRId64, round);
  if (arrived == (round + 1) * world_size)
    TDIST_CHECKGOTO(tdist_store_set(v, key, "", 0), rc, fail);
  char why[256] = "", names[256] = "";
  rc = tdist__rdzv_wait_go(v, round, timeout_ms, why, sizeof(why));
  if (rc == TDIST_ERR_TIMEOUT || rc == TDIST_ERR_REMOTE_FAILED) {
    int64_t now = 0;
    tdist_store_add(v, "arrived", 0, &now);
    now -= round * world_size;
    tdist__rdzv_missing(v, round, world_size, now, names, sizeof(names));
    if (rc == TDIST_ERR_REMOTE_FAILED)
      rc = tdist__error(rc,
                        "rendezvous of host %d on %s failed: %s before joining (%" PRId64
                        " of WORLD_SIZE=%d ranks arrived%s)",
                        host, tdist_store_address(v), why, now, world_size, names);
    else
      rc = tdist__error(rc,
                        "rendezvous of host %d on %s timed out after %" PRId64 " ms: %" PRId64
                        " of WORLD_SIZE=%d ranks arrived%s",
                        host, tdist_store_address(v), timeout_ms, now, world_size, names);
  }
fail:
  tdist_store_free(cur);
  tdist_store_release(v);
  return rc;
}

/* (caller) Read one line from fd into buf (NUL-terminated, without the
 * newline) by deadline_ns; 0, or a TDIST_ERR_* with the error set. */
static int read_line(int fd, char *buf, size_t cap, int64_t deadline_ns, const char *agent) {
  size_t len = 0;
  for (;;) {
    int64_t left_ms = (deadline_ns - tdist__now_ns()) / 1000000;
    if (left_ms <= 0)
      return tdist__error(TDIST_ERR_TIMEOUT, "rendezvous: the host agent %s did not answer in time",
                          agent);
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int n = poll(&p, 1, left_ms > 1000 ? 1000 : (int)left_ms);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) continue;
    ssize_t got = recv(fd, buf + len, cap - 1 - len, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0)
      return tdist__error(TDIST_ERR_CLOSED,
                          "rendezvous: the host agent %s closed the connection before the "
                          "world was complete (tdistrun gone?)",
                          agent);
    len += (size_t)got;
    buf[len] = '\0';
    char *nl = strchr(buf, '\n');
    if (nl) {
      *nl = '\0';
      return 0;
    }
    if (len == cap - 1)
      return tdist__error(TDIST_ERR_PROTOCOL, "rendezvous: the host agent's answer is too long");
  }
}

int tdist__rdzv_agent_ask(const char *agent, int rank, int size, int64_t timeout_ms, int *fd) {
  *fd = -1;
  if (!agent || !*agent || !tdist__param_RdzvAgent()) return 0;
  int s = tdist__unix_connect(agent, 5000);
  if (s < 0) {
    TDIST_WARN(INIT, "rendezvous: host agent %s not reachable (%s): joining the store directly",
               agent, strerror(errno));
    return 0;
  }
  char line[256], name[64] = "?";
  gethostname(name, sizeof(name) - 1);
  int n = snprintf(line, sizeof(line), "rdzv %d %d %" PRId64 " %s:%d\n", rank, size, timeout_ms,
                   name, (int)getpid());
  if (tdist__send_all(s, line, (size_t)n) != 0) {
    int rc = tdist__error(TDIST_ERR_CLOSED, "rendezvous: writing to the host agent %s failed: %s",
                          agent, strerror(errno));
    close(s);
    return rc;
  }
  *fd = s;
  return 1;
}

int tdist__rdzv_agent_answer(int fd, const char *agent, int64_t timeout_ms, char *job, size_t jl) {
  char line[768];
  int rc = 0, code = 0, off = 0;
  int64_t deadline = tdist__now_ns() + (timeout_ms + AGENT_GRACE_MS) * 1000000;
  TDIST_CHECKGOTO(read_line(fd, line, sizeof(line), deadline, agent), rc, done);
  if (!strncmp(line, "go ", 3)) {
    snprintf(job, jl, "%s", line + 3);
    rc = 1;
  } else if (sscanf(line, "err %d %n", &code, &off) == 1 && code < 0 && code > TDIST_ERR_MIN_ &&
             off > 0) {
    rc = tdist__error(code, "%s", line + off);
  } else {
    rc = tdist__error(TDIST_ERR_PROTOCOL, "rendezvous: the host agent %s answered '%.200s'", agent,
                      line);
  }
done:
  close(fd);
  return rc;
}

int tdist__rdzv_via_agent(const char *agent, int rank, int size, int64_t timeout_ms, char *job,
                          size_t jl) {
  int fd = -1, rc = tdist__rdzv_agent_ask(agent, rank, size, timeout_ms, &fd);
  if (rc != 1) return rc;
  return tdist__rdzv_agent_answer(fd, agent, timeout_ms, job, jl);
}
