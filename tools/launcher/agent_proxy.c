/*
 * agent_proxy.c - the host agent's store proxy (issue 30, docs/scale.md
 * "The store through the agent"): a rank whose store is the launcher's
 * talks to the agent's unix socket instead of opening TCP connections to
 * the store (store/tcp.c tdist__store_connect_agent), and the agent
 * forwards its requests on a few connections of its own, so the store
 * holds O(hosts) connections, not O(ranks) (at 100k ranks one store cannot
 * hold a connection per rank on most hosts: here the limit is 20 000).
 *
 * It speaks the store's wire protocol (docs/store-protocol.md) on both
 * sides and never looks inside a request beyond its op and, for the three
 * waiting ops, its timeout:
 *   - a rank's connection starts with the line "store" (agent.c hands it
 *     over with the bytes that followed), then its HELLO, answered here
 *     (the token checked against the agent's own), then one request at a
 *     time (the client serialises its calls);
 *   - the io thread reads the requests and forwards them itself on one
 *     connection of its own: every request read in a round goes out in
 *     one write (up to BATCH_MAX), the replies come back in order (the
 *     store runs a connection's requests in order), and each goes back to
 *     its rank. A host's ranks creating their group together cost a few
 *     round trips, and a request no thread hand-off;
 *   - a request that may wait (GET, WAIT, MULTI_GET with a timeout) goes in
 *     the batch with timeout 0: when its keys exist (the common case: an
 *     address read after it was published) that is its answer; when they
 *     do not, a thread of its own re-sends it with its own timeout on a
 *     connection of its own (taken from a pool of idle ones), so a wait
 *     never holds the io thread: ranks that wait for each other's keys
 *     cannot starve the ranks that would write them.
 *
 * Threads: the io thread owns the clients; each is in its epoll one-shot:
 * a client that has a request out (busy) is not armed, and the thread that
 * answers it hands it back (the done list, under mu) for the io thread to
 * re-arm. Workers and waiters own their
 * store connections. A store connection that fails is closed; the rank's
 * connection is closed with it (its call fails with TDIST_ERR_CLOSED, and
 * the library reconnects, to this proxy).
 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "agent_proxy.h"

/* docs/store-protocol.md: ops, statuses, the HELLO's magic and version. */
enum { OP_HELLO = 1, OP_GET = 3, OP_WAIT = 6, OP_MULTI_GET = 10 };
enum { ST_OK = 0, ST_TIMEOUT = 1, ST_AUTH = 3, ST_VERSION = 4 };
#define MAGIC 0x54445354u
#define VERSION 1u
#define MAX_FRAME ((64u << 20) + (1u << 20) + 64u) /* the largest value and room */
#define IDLE_WAITERS 16        /* idle waiting connections kept for the next wait */
#define BATCH_MAX 64           /* requests sent in one write */
#define BATCH_BYTES (64 << 10) /* and their bytes */

typedef struct pclient {
  struct trun_proxy *proxy;
  struct pclient *next; /* adopted (mu), then the io thread's list */
  struct pclient *prev; /* the io thread's list */
  int fd;
  int busy;                  /* a request is out (io thread only) */
  struct pclient *done_next; /* answered, for the io thread to re-arm (mu) */
  uint8_t *in;
  size_t len, cap;
} pclient_t;

typedef struct job {
  struct job *next; /* queue (mu); a waiter's: the active list (mu) */
  struct job *prev; /* a waiter's: the active list (mu) */
  int wfd;          /* a waiter's store connection, for stop to shut down (mu) */
  pclient_t *c;
  uint8_t *frame; /* [u32 len][body] */
  size_t flen;
} job_t;

struct trun_proxy {
  char host[256], token[1040];
  int port, wake[2];
  atomic_int stop;
  pthread_t io;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  job_t *head, *tail;            /* requests read, to forward (io) */
  int upfd;                      /* the io thread's store connection, or -1 (io) */
  job_t *active;                 /* waiters out (mu) */
  int nwaiters;                  /* (mu) */
  pclient_t *adopted;            /* handed over, not yet the io thread's (mu) */
  pclient_t *done;               /* answered, not yet re-armed (mu) */
  pclient_t *all;                /* every client the io thread has (io; at stop, stop's) */
  int ep;                        /* epoll: the wake pipe and the idle clients (one-shot) */
  int idle[IDLE_WAITERS], nidle; /* idle waiting connections (mu) */
};

static void wake_io(trun_proxy_t *p) {
  if (write(p->wake[1], "x", 1) < 0) { /* full: a wake-up is pending anyway */
  }
}

/* (any) Whole writes and reads on a blocking or non-blocking socket. */
static int write_all(int fd, const uint8_t *b, size_t n) {
  while (n) {
    ssize_t w = send(fd, b, n, MSG_NOSIGNAL);
    if (w > 0) {
      b += w, n -= (size_t)w;
    } else if (w < 0 && (errno == EAGAIN || errno == EINTR)) {
      struct pollfd q = {.fd = fd, .events = POLLOUT};
      if (poll(&q, 1, 5000) == 0) return -1; /* a rank that does not read */
    } else {
      return -1;
    }
  }
  return 0;
}

static int read_all(int fd, uint8_t *b, size_t n) {
  while (n) {
    ssize_t r = recv(fd, b, n, 0);
    if (r > 0) {
      b += r, n -= (size_t)r;
    } else if (r < 0 && errno == EINTR) {
      continue;
    } else {
      return -1;
    }
  }
  return 0;
}

/* (io or waiter) One reply frame from the store: malloc'd [u32][body]. */
static uint8_t *read_frame(int fd, size_t *flen) {
  uint32_t len;
  if (read_all(fd, (uint8_t *)&len, 4) || len == 0 || len > MAX_FRAME) return NULL;
  uint8_t *f = malloc(4 + (size_t)len);
  if (!f) return NULL;
  memcpy(f, &len, 4);
  if (read_all(fd, f + 4, len)) {
    free(f);
    return NULL;
  }
  *flen = 4 + (size_t)len;
  return f;
}

/* (io or waiter) A store connection: connect and HELLO with the token. */
static int store_open(trun_proxy_t *p) {
  char ps[16];
  snprintf(ps, sizeof(ps), "%d", p->port);
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
  if (getaddrinfo(p->host, ps, &hints, &res) != 0) return -1;
  int fd = -1;
  for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) close(fd), fd = -1;
  }
  freeaddrinfo(res);
  if (fd < 0) return -1;
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  uint32_t tl = (uint32_t)strlen(p->token), body = 1 + 4 + 4 + 4 + tl, magic = MAGIC, v = VERSION;
  uint8_t h[4 + 13 + 1024];
  memcpy(h, &body, 4);
  h[4] = OP_HELLO;
  memcpy(h + 5, &magic, 4);
  memcpy(h + 9, &v, 4);
  memcpy(h + 13, &tl, 4);
  memcpy(h + 17, p->token, tl);
  size_t rl = 0;
  uint8_t *rep = NULL;
  if (write_all(fd, h, 4 + body) || !(rep = read_frame(fd, &rl)) || rep[4] != ST_OK) {
    free(rep);
    close(fd);
    return -1;
  }
  free(rep);
  return fd;
}

/* (waiter) Send req on *fd (opened when -1), read the reply:
 * malloc'd, or NULL with *fd closed (-1). */
static uint8_t *exchange(trun_proxy_t *p, int *fd, const uint8_t *req, size_t rlen, size_t *flen) {
  if (*fd < 0 && (*fd = store_open(p)) < 0) return NULL;
  uint8_t *rep = NULL;
  if (write_all(*fd, req, rlen) == 0) rep = read_frame(*fd, flen);
  if (!rep) close(*fd), *fd = -1;
  return rep;
}

/* (waiter) The reply (or, on NULL, the end of the rank's
 * connection) to the client; then it may send its next request. */
static void answer(trun_proxy_t *p, pclient_t *c, const uint8_t *rep, size_t flen) {
  if (!rep || write_all(c->fd, rep, flen) != 0) shutdown(c->fd, SHUT_RDWR); /* io closes it */
  /* Back to the io thread, which re-arms it (one-shot: nothing came while
   * it was busy); one wake-up for a run of answers. */
  pthread_mutex_lock(&p->mu);
  int first = p->done == NULL;
  c->done_next = p->done;
  p->done = c;
  pthread_mutex_unlock(&p->mu);
  if (first) wake_io(p);
}

/* A waiting op with a timeout (its u64 right after the op byte). */
static int may_wait(const job_t *j) {
  uint8_t op = j->frame[4];
  uint64_t t = 0;
  if ((op != OP_GET && op != OP_WAIT && op != OP_MULTI_GET) || j->flen < 13) return 0;
  memcpy(&t, j->frame + 5, 8);
  return t > 0;
}

/* (waiter thread) The whole wait on a connection of its own. */
static void *waiter_main(void *arg) {
  job_t *j = arg;
  trun_proxy_t *p = j->c->proxy;
  pthread_mutex_lock(&p->mu);
  int fd = p->nidle ? p->idle[--p->nidle] : -1;
  pthread_mutex_unlock(&p->mu);
  if (fd < 0) fd = store_open(p);
  pthread_mutex_lock(&p->mu);
  j->wfd = fd; /* stop shuts it down: the wait ends at once */
  if (p->stop && fd >= 0) shutdown(fd, SHUT_RDWR);
  pthread_mutex_unlock(&p->mu);
  size_t rl = 0;
  uint8_t *rep = exchange(p, &fd, j->frame, j->flen, &rl);
  answer(p, j->c, rep, rl);
  free(rep);
  pthread_mutex_lock(&p->mu);
  if (fd >= 0 && p->nidle < IDLE_WAITERS && !p->stop) p->idle[p->nidle++] = fd, fd = -1;
  if (j->prev)
    j->prev->next = j->next;
  else
    p->active = j->next;
  if (j->next) j->next->prev = j->prev;
  p->nwaiters--;
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
  if (fd >= 0) close(fd);
  free(j->frame);
  free(j);
  return NULL;
}

/* (io) Hand j to a waiter thread; 0, or -1 (no thread). */
static int start_waiter(trun_proxy_t *p, job_t *j) {
  pthread_t t;
  pthread_attr_t at;
  pthread_attr_init(&at);
  pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
  pthread_attr_setstacksize(&at, 128 << 10);
  pthread_mutex_lock(&p->mu);
  j->wfd = -1;
  j->prev = NULL;
  j->next = p->active;
  if (p->active) p->active->prev = j;
  p->active = j;
  p->nwaiters++;
  int rc = pthread_create(&t, &at, waiter_main, j);
  if (rc) { /* undo */
    p->active = j->next;
    if (j->next) j->next->prev = NULL;
    p->nwaiters--;
  }
  pthread_mutex_unlock(&p->mu);
  pthread_attr_destroy(&at);
  return rc ? -1 : 0;
}

static void serve(trun_proxy_t *p, pclient_t *c, int readable);

/* (io) The reply (NULL: the end of its connection) to a client the io
 * thread answers itself; then its next request, or armed for it. */
static void answer_io(trun_proxy_t *p, pclient_t *c, const uint8_t *rep, size_t flen) {
  if (!rep || write_all(c->fd, rep, flen) != 0) shutdown(c->fd, SHUT_RDWR);
  c->busy = 0;
  serve(p, c, 0);
}

/* (io) Send up to BATCH_MAX requests of the batch in one write on the io
 * thread's store connection and answer them in order (the store runs a
 * connection's requests in order): a burst of a host's ranks costs a few
 * round trips, not one each. One that may wait goes with timeout 0; if its
 * keys are missing a waiter thread takes it with its own timeout. The bound
 * on bytes keeps a write from filling both ways' buffers while the store
 * stops reading (its replies here are small). */
static void run_batch(trun_proxy_t *p) {
  job_t *js[BATCH_MAX];
  int n = 0, i = 0;
  size_t total = 0, at = 0;
  while (p->head && n < BATCH_MAX && (n == 0 || total + p->head->flen <= BATCH_BYTES)) {
    job_t *j = p->head;
    if (!(p->head = j->next)) p->tail = NULL;
    js[n++] = j;
    total += j->flen;
  }
  uint8_t *buf = malloc(total);
  int ok = buf != NULL;
  if (ok && p->upfd < 0 && (p->upfd = store_open(p)) >= 0) {
    /* Nothing sent here waits: a store that does not answer for the
     * store's own I/O timeout is gone (the ranks' calls fail, not hang). */
    struct timeval tv = {30, 0};
    setsockopt(p->upfd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  }
  ok = ok && p->upfd >= 0;
  for (int k = 0; ok && k < n; k++) {
    memcpy(buf + at, js[k]->frame, js[k]->flen);
    if (may_wait(js[k])) memset(buf + at + 5, 0, 8); /* first without waiting */
    at += js[k]->flen;
  }
  if (ok && write_all(p->upfd, buf, total) != 0) ok = 0;
  free(buf);
  uint8_t *reps[BATCH_MAX];
  size_t rls[BATCH_MAX];
  for (; ok && i < n; i++) /* every reply first: answering may add to the queue */
    if (!(reps[i] = read_frame(p->upfd, &rls[i]))) break;
  if (i < n && p->upfd >= 0) close(p->upfd), p->upfd = -1; /* out of step */
  for (int k = 0; k < n; k++) {
    job_t *j = js[k];
    uint8_t *rep = k < i ? reps[k] : NULL;
    if (rep && rep[4] == ST_TIMEOUT && may_wait(j)) { /* its keys are missing */
      free(rep);
      rep = NULL;
      if (start_waiter(p, j) == 0) continue; /* it answers and frees j */
    }
    answer_io(p, j->c, rep, rep ? rls[k] : 0); /* (no waiter thread: the call fails) */
    free(rep);
    free(j->frame);
    free(j);
  }
}

/* (io) The HELLO answered here: OK, or AUTH for a token other than ours. */
static int hello(trun_proxy_t *p, pclient_t *c, const uint8_t *f, size_t flen) {
  uint32_t magic = 0, v = 0, tl = 0, sv = VERSION;
  if (flen >= 17) memcpy(&magic, f + 5, 4), memcpy(&v, f + 9, 4), memcpy(&tl, f + 13, 4);
  int ok = flen >= 17 && magic == MAGIC && (size_t)tl == flen - 17;
  int auth = ok && tl == strlen(p->token) && memcmp(f + 17, p->token, tl) == 0;
  uint8_t rep[9];
  uint32_t body = 5;
  memcpy(rep, &body, 4);
  rep[4] = !ok || v != VERSION ? ST_VERSION : auth ? ST_OK : ST_AUTH;
  memcpy(rep + 5, &sv, 4);
  return write_all(c->fd, rep, 9) == 0 && rep[4] == ST_OK ? 0 : -1;
}

/* (io) A whole frame at the head of c->in: the HELLO, or a queued job. */
static int take_frame(trun_proxy_t *p, pclient_t *c, size_t flen) {
  if (c->in[4] == OP_HELLO) {
    if (hello(p, c, c->in, flen)) return -1;
  } else {
    job_t *j = calloc(1, sizeof(*j));
    if (!j || !(j->frame = malloc(flen))) {
      free(j);
      return -1;
    }
    memcpy(j->frame, c->in, flen);
    j->flen = flen;
    j->c = c;
    c->busy = 1;
    if (p->tail)
      p->tail->next = j;
    else
      p->head = j;
    p->tail = j;
  }
  memmove(c->in, c->in + flen, c->len - flen);
  c->len -= flen;
  return 0;
}

/* (io) Read what c sent; take its next frame if it is not busy. -1: close. */
static int on_client(trun_proxy_t *p, pclient_t *c, int readable) {
  for (; readable;) {
    if (c->cap - c->len < 4096) {
      size_t cap = c->cap ? c->cap * 2 : 8192;
      uint8_t *in = realloc(c->in, cap);
      if (!in) return -1;
      c->in = in, c->cap = cap;
    }
    ssize_t r = recv(c->fd, c->in + c->len, c->cap - c->len, MSG_DONTWAIT);
    if (r > 0) {
      c->len += (size_t)r;
      continue;
    }
    if (r < 0 && (errno == EAGAIN || errno == EINTR)) break;
    return -1; /* the rank closed (it had nothing out: busy ones are not polled) */
  }
  uint32_t len = 0;
  if (c->len >= 4) memcpy(&len, c->in, 4);
  if (c->len >= 4 && (len == 0 || len > MAX_FRAME)) return -1;
  if (c->len >= 4 && c->len >= 4 + (size_t)len) return take_frame(p, c, 4 + (size_t)len);
  return 0;
}

/* (io) Forget a client (not busy: it has nothing out). */
static void drop(trun_proxy_t *p, pclient_t *c) {
  epoll_ctl(p->ep, EPOLL_CTL_DEL, c->fd, NULL);
  close(c->fd);
  if (c->prev)
    c->prev->next = c->next;
  else
    p->all = c->next;
  if (c->next) c->next->prev = c->prev;
  free(c->in);
  free(c);
}

/* (io) Read from c (when readable), take a whole request; re-arm c unless
 * a request went out (its answerer re-arms it). */
static void serve(trun_proxy_t *p, pclient_t *c, int readable) {
  if (on_client(p, c, readable) != 0) {
    drop(p, c);
    return;
  }
  if (c->busy) return;
  struct epoll_event ev = {.events = EPOLLIN | EPOLLONESHOT, .data.ptr = c};
  epoll_ctl(p->ep, EPOLL_CTL_MOD, c->fd, &ev);
}

static void *io_main(void *arg) {
  trun_proxy_t *p = arg;
  struct epoll_event evs[64];
  while (!p->stop) {
    while (p->head) /* what the last round read, in batches */
      run_batch(p);
    int n = epoll_wait(p->ep, evs, 64, 1000);
    for (int k = 0; k < n; k++) {
      if (evs[k].data.ptr) {
        serve(p, evs[k].data.ptr, 1);
        continue;
      }
      char b[256]; /* the wake pipe: clients handed over */
      while (read(p->wake[0], b, sizeof(b)) > 0) {
      }
      pthread_mutex_lock(&p->mu);
      pclient_t *c = p->adopted, *done = p->done;
      p->adopted = p->done = NULL;
      pthread_mutex_unlock(&p->mu);
      while (done) { /* answered: its next request, or armed for it */
        pclient_t *next = done->done_next;
        done->busy = 0;
        serve(p, done, 0);
        done = next;
      }
      while (c) {
        pclient_t *next = c->next;
        c->prev = NULL;
        c->next = p->all;
        if (p->all) p->all->prev = c;
        p->all = c;
        struct epoll_event ev = {.events = EPOLLIN | EPOLLONESHOT, .data.ptr = c};
        if (epoll_ctl(p->ep, EPOLL_CTL_ADD, c->fd, &ev) != 0)
          drop(p, c);
        else
          serve(p, c, 0); /* its HELLO may have come with the "store" line */
        c = next;
      }
    }
  }
  return NULL;
}

int trun_proxy_start(const char *host, int port, trun_proxy_t **out) {
  trun_proxy_t *p = calloc(1, sizeof(*p));
  *out = NULL;
  if (!p) return -1;
  snprintf(p->host, sizeof(p->host), "%s", host);
  const char *tok = getenv("TDIST_STORE_TOKEN");
  snprintf(p->token, sizeof(p->token), "%.1024s", tok ? tok : "");
  p->port = port;
  p->upfd = -1;
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cv, NULL);
  if (pipe2(p->wake, O_CLOEXEC | O_NONBLOCK) != 0) goto fail;
  struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
  if ((p->ep = epoll_create1(EPOLL_CLOEXEC)) < 0) goto fail_pipe;
  if (epoll_ctl(p->ep, EPOLL_CTL_ADD, p->wake[0], &ev) != 0) goto fail_ep;
  if (pthread_create(&p->io, NULL, io_main, p) != 0) goto fail_ep;
  *out = p;
  return 0;
fail_ep:
  close(p->ep);
fail_pipe:
  close(p->wake[0]);
  close(p->wake[1]);
fail:
  free(p);
  return -1;
}

int trun_proxy_adopt(trun_proxy_t *p, int fd, const void *pending, size_t n) {
  pclient_t *c = calloc(1, sizeof(*c));
  if (!c || !(c->in = malloc(n + 8192))) {
    if (c) free(c->in);
    free(c);
    close(fd);
    return -1;
  }
  c->cap = n + 8192;
  memcpy(c->in, pending, n);
  c->len = n;
  c->fd = fd;
  c->proxy = p;
  pthread_mutex_lock(&p->mu);
  c->next = p->adopted;
  p->adopted = c;
  pthread_mutex_unlock(&p->mu);
  wake_io(p);
  return 0;
}

void trun_proxy_stop(trun_proxy_t *p) {
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  p->stop = 1;
  for (job_t *j = p->active; j; j = j->next) /* their waits end now */
    if (j->wfd >= 0) shutdown(j->wfd, SHUT_RDWR);
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
  wake_io(p);
  pthread_join(p->io, NULL);
  if (p->upfd >= 0) close(p->upfd);
  pthread_mutex_lock(&p->mu);
  while (p->nwaiters > 0) /* each ends within its exchange's failure */
    pthread_cond_wait(&p->cv, &p->mu);
  pthread_mutex_unlock(&p->mu);
  while (p->all) {
    pclient_t *c = p->all;
    p->all = c->next;
    close(c->fd);
    free(c->in);
    free(c);
  }
  while (p->adopted) {
    pclient_t *c = p->adopted;
    p->adopted = c->next;
    close(c->fd);
    free(c->in);
    free(c);
  }
  for (int i = 0; i < p->nidle; i++)
    close(p->idle[i]);
  close(p->ep);
  close(p->wake[0]);
  close(p->wake[1]);
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->cv);
  free(p);
}
