/*
 * heartbeat.c - the heartbeat thread and the rank's side of the host
 * agent's line protocol (TDIST_HOST_AGENT); the monitor object is in
 * monitor_impl.h, the monitor thread in monitor.c.
 *
 * Threads:
 *   - the heartbeat thread (tdist__mon_heartbeat_main) only writes
 *     "tdist/hb/<rank>" (or "hb <value>" to the agent): the value the
 *     monitor thread just refreshed (every TDIST_HEARTBEAT_INTERVAL_MS),
 *     or, when none came for an interval plus one monitor round, the last
 *     one; and "bye" when it stops. It calls no handler and waits on
 *     nothing but its timer and the store, so how long one data-path step
 *     takes (a 400 MB copy on a loaded host: seconds) never delays a
 *     heartbeat: a process whose threads run is never declared dead;
 *   - the monitor thread reads what the agent relays (tdist__mon_agent_poll:
 *     a socket may be written and read by two threads at once);
 *   - the caller, in tdist__monitor_start/stop: the agent's hello, the
 *     first heartbeat, and a "bye" when start fails.
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/group/monitor_impl.h"
#include "store/store_impl.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/unixsock.h"

/* ---- the host agent (monitor.h): the rank's side of its line protocol -------------- */

/* (heartbeat) "hb <value>" (newlines in the value become spaces) or "bye". */
static void agent_beat(tdist__monitor_t *m, const char *val, size_t len, int bye) {
  char line[sizeof(m->snap) + 8];
  size_t n = 0;
  if (bye) {
    n = (size_t)snprintf(line, sizeof(line), "bye\n");
  } else {
    memcpy(line, "hb ", 3);
    for (size_t i = 0; i < len; i++)
      line[3 + i] = val[i] == '\n' ? ' ' : val[i];
    n = 3 + len;
    line[n++] = '\n';
  }
  if (tdist__send_all(m->agent_fd, line, n) != 0)
    TDIST_INFO(CORE, "monitor: heartbeat to the host agent failed: %s", strerror(errno));
}

/* (monitor) Wait up to `ms` for what the agent relays: "rec <n> <record>"
 * (applied as a record read from the store) and "ok" (its heartbeat reached
 * the store: the store answers). */
void tdist__mon_agent_poll(tdist__monitor_t *m, int64_t ms, tdist__mon_record_fn apply) {
  struct pollfd p = {.fd = m->agent_fd, .events = POLLIN};
  if (m->agent_gone || poll(&p, 1, (int)ms) <= 0) {
    if (m->agent_gone) {
      struct timespec ts = {0, (long)ms * 1000000};
      nanosleep(&ts, NULL);
    }
    return;
  }
  ssize_t n = recv(m->agent_fd, m->abuf + m->alen, sizeof(m->abuf) - m->alen, MSG_DONTWAIT);
  if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
    /* The agent is gone: with it the store declared this host's ranks dead
     * (its connection closed), and a launcher's death kills its ranks. */
    m->agent_gone = 1;
    TDIST_WARN(CORE, "monitor: the host agent '%s' closed its connection", m->agent_name);
    return;
  }
  if (n < 0) return;
  m->alen += (size_t)n;
  char *p0 = m->abuf, *end = m->abuf + m->alen, *nl;
  while ((nl = memchr(p0, '\n', (size_t)(end - p0)))) {
    *nl = '\0';
    if (!strcmp(p0, "ok")) {
      m->last_ok_ms = tdist__now_ms();
    } else if (!strncmp(p0, "rec ", 4)) {
      char *rec = strchr(p0 + 4, ' ');
      if (rec) apply(m, rec + 1, strlen(rec + 1));
    }
    p0 = nl + 1;
  }
  m->alen = (size_t)(end - p0);
  memmove(m->abuf, p0, m->alen);
  if (m->alen == sizeof(m->abuf)) m->alen = 0; /* a line too long: dropped */
}

/* ---- heartbeats (heartbeat thread; the value from the monitor thread) ---------- */

/* (heartbeat, or the caller in start) One heartbeat on hb_conn: the value
 * the monitor thread left, or "bye". A broken connection is reopened
 * first (the store came back). */
void tdist__mon_heartbeat(tdist__monitor_t *m, int bye) {
  char key[48], buf[sizeof(m->snap)];
  size_t len;
  snprintf(key, sizeof(key), "tdist/hb/%d", m->world_rank);
  if (bye) {
    len = (size_t)snprintf(buf, sizeof(buf), "bye");
  } else {
    pthread_mutex_lock(&m->mu);
    len = m->snap_len;
    memcpy(buf, m->snap, len);
    pthread_mutex_unlock(&m->mu);
  }
  if (m->agent_fd >= 0) {
    agent_beat(m, buf, len, bye);
    return;
  }
  if (!tdist__store_alive(m->hb_conn)) {
    tdist_store_t *fresh = NULL;
    if (tdist__store_reconnect(m->hb_conn, STORE_CALL_MS, &fresh) != 0) {
      TDIST_INFO(CORE, "monitor: heartbeat connection: %s", tdist_last_error());
      return;
    }
    fresh->timeout_ms = m->hb_conn->timeout_ms;
    tdist_store_release(m->hb_conn);
    m->hb_conn = fresh;
  }
  if (tdist_store_set(m->hb_conn, key, buf, len) != 0)
    TDIST_INFO(CORE, "monitor: heartbeat failed: %s", tdist_last_error());
}

/* (heartbeat) Beat as soon as the monitor thread left a fresh value, so a
 * heartbeat is as recent as it was when one thread did both; and on its own
 * when none came for an interval plus one monitor round (the monitor
 * thread is waiting for a busy progress thread): the last value then, but
 * the beat is never late. */
void *tdist__mon_heartbeat_main(void *arg) {
  tdist__monitor_t *m = arg;
  int64_t period = tdist__param_HeartbeatIntervalMs() + tdist__param_MonitorIntervalMs();
  if (period < 1) period = 1;
  pthread_mutex_lock(&m->mu);
  for (;;) {
    struct timespec due;
    clock_gettime(CLOCK_MONOTONIC, &due);
    due.tv_sec += period / 1000;
    due.tv_nsec += (period % 1000) * 1000000;
    if (due.tv_nsec >= 1000000000) {
      due.tv_sec++;
      due.tv_nsec -= 1000000000;
    }
    while (!m->hb_stop && !m->snap_fresh && pthread_cond_timedwait(&m->cv, &m->mu, &due) == 0) {
    }
    if (m->hb_stop) break;
    m->snap_fresh = 0;
    pthread_mutex_unlock(&m->mu);
    tdist__mon_heartbeat(m, 0);
    pthread_mutex_lock(&m->mu);
  }
  pthread_mutex_unlock(&m->mu);
  if (m->hb_conn) m->hb_conn->timeout_ms = STORE_CALL_MS; /* leaving: do not wait long */
  tdist__mon_heartbeat(m, 1);                             /* leaving cleanly: not a death */
  return NULL;
}

/* ---- the agent's hello (caller, in start) ---------------------------------------- */

void tdist__mon_agent_open(tdist__monitor_t *m) {
  const char *agent = getenv("TDIST_HOST_AGENT");
  if (agent && *agent && (m->agent_fd = tdist__unix_connect(agent, STORE_CALL_MS)) >= 0) {
    /* The agent relays records from m->next on; its next beat (at once)
     * registers this rank with the store's detector. */
    char hello[64];
    int hl = snprintf(hello, sizeof(hello), "hello %d %" PRId64 "\n", m->world_rank, m->next);
    if (tdist__send_all(m->agent_fd, hello, (size_t)hl) != 0) {
      close(m->agent_fd);
      m->agent_fd = -1;
    }
  }
  if (agent && *agent && m->agent_fd < 0)
    TDIST_INFO(CORE, "monitor: no host agent at '%s': heartbeats go to the store", agent);
  if (m->agent_fd >= 0) snprintf(m->agent_name, sizeof(m->agent_name), "%s", agent);
}
