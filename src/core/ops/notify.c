/*
 * notify.c - notification queues for language bindings (tdist/notify.h;
 * layer "ops": it registers callbacks through the public work and group API
 * and calls only util below that).
 *
 * Why: a binding's completion callback that needs a global lock (Python's
 * GIL) must not run on the progress thread, which would then wait for that
 * lock for as long as any other thread holds it, and with it every
 * completion, heartbeat-driven failure and abort of the process. Here the
 * progress thread only appends a preallocated node to a mutex-protected list
 * and, when the list was empty, writes the eventfd; the binding's dispatcher
 * thread blocks in tdist_notify_queue_pop (a condition variable; ctypes
 * releases the GIL around the call) and runs the binding's code itself.
 *
 * Threads:
 *   - the progress thread (or a registering thread, when the work or group
 *     was already done) runs on_work / on_abort: append only, never blocks
 *     beyond the queue mutex, which no one holds across a wait or a callback;
 *   - any thread registers, posts, pops, closes.
 *
 * Lifetime: `refs` counts the creator (until destroy), every pending work
 * registration and every node in the list. Abort registrations are owned by
 * the queue (the `armed` list) and freed with it: a group destroyed without
 * aborting never calls back, so no count could ever be dropped for it.
 */
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "tdist/errors.h"
#include "tdist/group.h"
#include "tdist/notify.h"
#include "tdist/ops.h"
#include "tdist/store.h"
#include "tdist/work.h"
#include "util/alloc.h"
#include "util/error.h"

struct node {
  struct node *next;
  tdist_notify_queue_t *q;
  tdist_notify_event_t ev;
  char *reason; /* ABORT: the copy made by on_abort; else NULL */
};

struct tdist_notify_queue {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  struct node *head, *tail; /* events, oldest first */
  struct node *armed;       /* abort registrations that have not fired */
  int refs;
  int closed;
  int efd;
  int signalled; /* efd holds a count (readable) */
};

static void queue_free(tdist_notify_queue_t *q) {
  struct node *n, *next;
  for (n = q->head; n; n = next) {
    next = n->next;
    tdist__free(n->reason);
    tdist__free(n);
  }
  for (n = q->armed; n; n = next) {
    next = n->next;
    tdist__free(n);
  }
  pthread_cond_destroy(&q->cv);
  pthread_mutex_destroy(&q->mu);
  if (q->efd >= 0) close(q->efd);
  tdist__free(q);
}

static void signal_fd(tdist_notify_queue_t *q) {
  if (q->signalled) return;
  uint64_t one = 1;
  /* Non-blocking eventfd: a write fails only at a count of 2^64-2, which a
   * flag that allows one pending write never reaches. */
  if (write(q->efd, &one, sizeof(one)) == (ssize_t)sizeof(one)) q->signalled = 1;
}

static void drain_fd(tdist_notify_queue_t *q) {
  if (!q->signalled || q->closed) return; /* a closed queue stays readable */
  uint64_t v;
  if (read(q->efd, &v, sizeof(v)) == (ssize_t)sizeof(v)) q->signalled = 0;
}

/* Append under the lock; a closed queue drops the node. `counted`: the node's
 * reference is already in refs (a work registration); else take one.
 * Returns 1 when the caller must free the queue (last reference gone). */
static int append(tdist_notify_queue_t *q, struct node *n, int counted) {
  int free_q = 0;
  pthread_mutex_lock(&q->mu);
  if (q->closed) {
    if (counted) free_q = --q->refs == 0;
    pthread_mutex_unlock(&q->mu);
    tdist__free(n->reason);
    tdist__free(n);
    return free_q;
  }
  if (!counted) q->refs++;
  n->next = NULL;
  if (q->tail)
    q->tail->next = n;
  else
    q->head = n;
  q->tail = n;
  signal_fd(q);
  pthread_cond_signal(&q->cv);
  pthread_mutex_unlock(&q->mu);
  return 0;
}

/* Progress thread (or the registering thread): no allocation, no waiting. */
static void on_work(tdist_work_t *work, void *arg) {
  struct node *n = arg;
  tdist_notify_queue_t *q = n->q;
  n->ev.status = tdist_work_status(work);
  if (append(q, n, 1)) queue_free(q);
}

/* Progress thread (or the registering thread), inside the abort sequence:
 * tdist_group_on_abort waits for this to return before it fails the group's
 * ops, so the event is queued before any of them is seen failed. */
static void on_abort(tdist_group_t *group, int status, const char *reason, void *arg) {
  (void)group;
  struct node *n = arg, **pp;
  tdist_notify_queue_t *q = n->q;
  size_t len = reason ? strlen(reason) : 0;
  n->ev.status = status;
  n->ev.reason_len = len;
  n->reason = tdist__malloc(len + 1); /* the one allocation, at abort time only */
  if (n->reason) {
    memcpy(n->reason, reason ? reason : "", len);
    n->reason[len] = 0;
  } else {
    n->ev.reason_len = 0;
  }
  pthread_mutex_lock(&q->mu);
  for (pp = &q->armed; *pp; pp = &(*pp)->next)
    if (*pp == n) {
      *pp = n->next;
      break;
    }
  pthread_mutex_unlock(&q->mu);
  append(q, n, 0); /* never frees q: the creator's reference is still held (contract) */
}

int tdist_notify_queue_create(tdist_notify_queue_t **out) {
  if (!out) return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "tdist_notify_queue_create: NULL out");
  *out = NULL;
  tdist_notify_queue_t *q = tdist__calloc(1, sizeof(*q));
  if (!q) return tdist__error(TDIST_ERR_NO_MEMORY, "tdist_notify_queue_create: out of memory");
  q->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (q->efd < 0) {
    int e = errno;
    tdist__free(q);
    return tdist__error(TDIST_ERR_IO, "tdist_notify_queue_create: eventfd: %s", strerror(e));
  }
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&q->cv, &ca);
  pthread_condattr_destroy(&ca);
  pthread_mutex_init(&q->mu, NULL);
  q->refs = 1;
  *out = q;
  return 0;
}

int tdist_notify_queue_fd(const tdist_notify_queue_t *q) { return q ? q->efd : -1; }

static struct node *new_node(tdist_notify_queue_t *q, uint64_t token, int kind) {
  struct node *n = tdist__calloc(1, sizeof(*n));
  if (!n) return NULL;
  n->q = q;
  n->ev.token = token;
  n->ev.kind = kind;
  return n;
}

int tdist_work_notify(tdist_work_t *work, tdist_notify_queue_t *q, uint64_t token) {
  if (!work || !q)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "tdist_work_notify: NULL %s",
                        work ? "queue" : "work");
  /* Allocated here, on the caller's thread: the progress thread only links it. */
  struct node *n = new_node(q, token, TDIST_NOTIFY_WORK);
  if (!n) return tdist__error(TDIST_ERR_NO_MEMORY, "tdist_work_notify: out of memory");
  pthread_mutex_lock(&q->mu);
  q->refs++; /* held by the registration until its node is freed */
  pthread_mutex_unlock(&q->mu);
  int rc = tdist_work_on_complete(work, on_work, n); /* may run on_work here, now */
  if (rc != 0) {
    pthread_mutex_lock(&q->mu);
    int free_q = --q->refs == 0;
    pthread_mutex_unlock(&q->mu);
    tdist__free(n);
    if (free_q) queue_free(q);
  }
  return rc;
}

int tdist_group_notify_abort(tdist_group_t *group, tdist_notify_queue_t *q, uint64_t token) {
  if (!group || !q)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "tdist_group_notify_abort: NULL %s",
                        group ? "queue" : "group");
  struct node *n = new_node(q, token, TDIST_NOTIFY_ABORT);
  if (!n) return tdist__error(TDIST_ERR_NO_MEMORY, "tdist_group_notify_abort: out of memory");
  pthread_mutex_lock(&q->mu);
  n->next = q->armed;
  q->armed = n;
  pthread_mutex_unlock(&q->mu);
  int rc = tdist_group_on_abort(group, on_abort, n); /* may run on_abort here, now */
  if (rc != 0) {
    /* Refused: the callback never runs, so the node is still armed. */
    struct node **pp;
    pthread_mutex_lock(&q->mu);
    for (pp = &q->armed; *pp; pp = &(*pp)->next)
      if (*pp == n) {
        *pp = n->next;
        break;
      }
    pthread_mutex_unlock(&q->mu);
    tdist__free(n);
  }
  return rc;
}

int tdist_notify_post(tdist_notify_queue_t *q, uint64_t token, int status) {
  if (!q) return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "tdist_notify_post: NULL queue");
  struct node *n = new_node(q, token, TDIST_NOTIFY_POST);
  if (!n) return tdist__error(TDIST_ERR_NO_MEMORY, "tdist_notify_post: out of memory");
  n->ev.status = status;
  pthread_mutex_lock(&q->mu);
  int closed = q->closed;
  pthread_mutex_unlock(&q->mu);
  if (closed) {
    tdist__free(n);
    return tdist__error(TDIST_ERR_CLOSED, "tdist_notify_post: the queue is closed");
  }
  append(q, n, 0); /* a close in between drops it, as for any late event */
  return 0;
}

int tdist_notify_queue_pop(tdist_notify_queue_t *q, tdist_notify_event_t *events, size_t max,
                           char *reasons, size_t reason_cap, int64_t timeout_ms) {
  if (!q || !events || max == 0 || (reason_cap && !reasons))
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "tdist_notify_queue_pop: %s",
                        !q         ? "NULL queue"
                        : !events  ? "NULL events"
                        : max == 0 ? "max is 0"
                                   : "NULL reasons");
  struct timespec due;
  if (timeout_ms > 0) {
    clock_gettime(CLOCK_MONOTONIC, &due);
    due.tv_sec += timeout_ms / 1000;
    due.tv_nsec += (timeout_ms % 1000) * 1000000L;
    if (due.tv_nsec >= 1000000000L) {
      due.tv_sec++;
      due.tv_nsec -= 1000000000L;
    }
  }
  pthread_mutex_lock(&q->mu);
  while (!q->head && !q->closed && timeout_ms != 0) {
    if (timeout_ms < 0) {
      pthread_cond_wait(&q->cv, &q->mu);
    } else if (pthread_cond_timedwait(&q->cv, &q->mu, &due) == ETIMEDOUT) {
      break;
    }
  }
  if (!q->head) {
    int closed = q->closed;
    pthread_mutex_unlock(&q->mu);
    return closed ? TDIST_ERR_CLOSED : 0;
  }
  struct node *taken = q->head, *last = NULL;
  size_t k = 0;
  for (struct node *n = q->head; n && k < max; n = n->next, k++)
    last = n;
  q->head = last->next;
  if (!q->head) q->tail = NULL;
  last->next = NULL;
  if (!q->head) drain_fd(q);
  q->refs -= (int)k;
  int free_q = q->refs == 0; /* only if destroyed while popping (against the contract) */
  if (q->head) pthread_cond_signal(&q->cv); /* another popper may take the rest */
  pthread_mutex_unlock(&q->mu);

  /* Outside the lock: copy out and free. */
  size_t i = 0;
  for (struct node *n = taken, *next; n; n = next, i++) {
    next = n->next;
    events[i] = n->ev;
    if (reason_cap) {
      char *dst = reasons + i * reason_cap;
      size_t len = n->reason ? strlen(n->reason) : 0;
      if (len >= reason_cap) len = reason_cap - 1;
      if (len) memcpy(dst, n->reason, len);
      dst[len] = 0;
    }
    tdist__free(n->reason);
    tdist__free(n);
  }
  if (free_q) queue_free(q);
  return (int)k;
}

int tdist_notify_queue_close(tdist_notify_queue_t *q) {
  if (!q) return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "tdist_notify_queue_close: NULL queue");
  pthread_mutex_lock(&q->mu);
  if (!q->closed) {
    q->closed = 1;
    signal_fd(q); /* pollers wake up and find the queue closed */
    pthread_cond_broadcast(&q->cv);
  }
  pthread_mutex_unlock(&q->mu);
  return 0;
}

int tdist_notify_queue_destroy(tdist_notify_queue_t *q) {
  if (!q) return 0;
  tdist_notify_queue_close(q);
  pthread_mutex_lock(&q->mu);
  q->refs--; /* the creator's */
  /* Events still listed were never popped: drop them and their references
   * now, so only pending work registrations keep the queue. */
  struct node *n = q->head, *next;
  q->head = q->tail = NULL;
  for (; n; n = next) {
    next = n->next;
    q->refs--;
    tdist__free(n->reason);
    tdist__free(n);
  }
  int free_q = q->refs == 0;
  pthread_mutex_unlock(&q->mu);
  if (free_q) queue_free(q);
  return 0;
}
