/*
 * agent_proxy.h - the host agent's store proxy (agent_proxy.c): the store's
 * wire protocol forwarded for the local ranks on a few connections of the
 * agent's own. Self-contained (libc and pthreads), so bench/scale runs the
 * same code for its simulated hosts.
 */
#ifndef TDIST_TRUN_AGENT_PROXY_H
#define TDIST_TRUN_AGENT_PROXY_H

#include <stddef.h>

typedef struct trun_proxy trun_proxy_t;

/* Start the proxy for the store at host:port (TDIST_STORE_TOKEN, if set,
 * is its token and the one ranks must present). Its io thread and workers
 * start now; store connections open on first use. 0, or -1 (no memory or
 * threads). Any thread. */
int trun_proxy_start(const char *host, int port, trun_proxy_t **out);

/* Hand over a rank's connection that said "store": fd (taken in all
 * cases) and the n bytes already read after that line. 0, or -1 (closed).
 * Any thread. */
int trun_proxy_adopt(trun_proxy_t *p, int fd, const void *pending, size_t n);

/* Stop: ends every wait in flight (their ranks' calls fail), joins the
 * threads, closes every connection and frees. The thread that started it. */
void trun_proxy_stop(trun_proxy_t *p);

#endif
