/*
 * unixsock.h - the rank's end of a host agent's abstract unix socket
 * (TDIST_HOST_AGENT, tools/launcher/agent.c): connect, and write a whole
 * line. Used by the monitor's heartbeats (core/group/heartbeat.c) and the
 * rendezvous through the agent (store/rdzv_host.c). Any thread; no state.
 */
#ifndef TDIST_UTIL_UNIXSOCK_H
#define TDIST_UTIL_UNIXSOCK_H

#include <stddef.h>
#include <stdint.h>

/* Connect to the abstract unix socket `name` (no leading NUL in `name`);
 * writes on it give up after send_timeout_ms (0: never). Returns the
 * descriptor (SOCK_CLOEXEC, blocking) or -1 with errno set (ENAMETOOLONG
 * for a name that does not fit). */
int tdist__unix_connect(const char *name, int64_t send_timeout_ms);

/* Write all `len` bytes (retries short writes and EINTR; never SIGPIPE).
 * 0, or -1 with errno set. */
int tdist__send_all(int fd, const void *p, size_t len);

#endif
