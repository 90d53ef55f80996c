/*
 * progress.c - the progress thread and its libuv loop (it calls
 * only util; see progress.h for what it offers).
 *
 * Submission: producers push onto a lock-free LIFO (one CAS); the progress
 * thread takes the whole list with one exchange and reverses it, so nodes of
 * one submitting thread keep their order. A producer calls uv_async_send
 * only when the loop may be about to block (the `sleeping` flag, set by the
 * prepare callback right before the loop polls with a timeout); while the
 * loop spins, submission is a CAS and nothing else. The flag and the queue
 * form a Dekker pair (both seq_cst): either the producer sees sleeping == 1
 * and wakes the loop, or the loop sees the new node before it blocks. (A
 * synchronous op its caller drives to the end is never pushed at all:
 * ops.c.)
 *
 * Deferred nodes: a FIFO owned by the progress thread. Queuing one makes
 * sure the loop will not block in this iteration (the idle handle forces a
 * zero poll timeout), and the check callback, which libuv runs right after
 * the I/O step, runs them until the FIFO is empty. So what a backend
 * completes inside a socket callback is delivered after that callback
 * returned, in the same loop iteration. Where the progress layer itself
 * called into a backend (a post from the submission queue, a poller), it
 * delivers as soon as that call returned.
 *
 * Tickers: one timer, every TDIST_WATCHDOG_MS while a ticker is armed and
 * says it is still busy (the group layer's op deadlines).
 *
 * Polling: after any activity the loop spins (the idle handle keeps the poll
 * timeout at 0) for TDIST_SPIN_US, or TDIST_POLL_SPIN_US while a poller is
 * busy (both 0 when the host's cores are oversubscribed: util/param.h); then
 * it backs off to a timer (1 ms, doubling up to TDIST_POLL_MAX_MS) while a
 * poller is busy, and to a plain blocking epoll_wait otherwise.
 *
 * Everything in struct tdist_progress below `queue`/`sleeping` is owned by
 * the progress thread; `refs` by global_mu.
 */
#include "core/progress/progress.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "util/alloc.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/param.h"

TDIST_PARAM(SpinUs, "TDIST_SPIN_US", TDIST_SPIN_DEFAULT(100))
TDIST_PARAM(PollSpinUs, "TDIST_POLL_SPIN_US", TDIST_SPIN_DEFAULT(2000))
TDIST_PARAM(PollMaxMs, "TDIST_POLL_MAX_MS", 4)
TDIST_PARAM(WatchdogMs, "TDIST_WATCHDOG_MS", 50)

struct tdist_progress {
  /* shared */
  _Atomic(tdist__qnode_t *) queue;
  atomic_int sleeping;
  atomic_int woken; /* tdist__progress_wake_any: poll now */
  int refs;         /* guarded by global_mu */

  /* progress thread */
  uv_loop_t loop;
  uv_async_t async;
  uv_prepare_t prepare;
  uv_check_t check;
  uv_idle_t idle;
  uv_timer_t poll_timer;
  uv_timer_t tick_timer; /* runs the tickers while one is armed */
  pthread_t thread;
  int64_t last_activity_ns;
  uint64_t poll_interval_ms;
  tdist__list_t pollers;
  tdist__list_t tickers;
  tdist__qnode_t *defer_head, *defer_tail;
  int stopping; /* handles are closing: start nothing */
};

static pthread_mutex_t global_mu = PTHREAD_MUTEX_INITIALIZER;
static tdist_progress_t *global;
static _Thread_local tdist_progress_t *current; /* set on the progress thread */

/* ---- the queues ------------------------------------------------------------- */

void tdist__progress_push(tdist_progress_t *p, tdist__qnode_t *node) {
  tdist__qnode_t *head = atomic_load(&p->queue);
  do {
    node->next = head;
  } while (!atomic_compare_exchange_weak(&p->queue, &head, node));
  if (atomic_load(&p->sleeping)) uv_async_send(&p->async);
}

/* Run everything submitted, oldest first. Returns the number of nodes run. */
static int drain(tdist_progress_t *p) {
  tdist__qnode_t *list = atomic_exchange(&p->queue, NULL);
  if (!list) return 0;
  tdist__qnode_t *rev = NULL;
  while (list) {
    tdist__qnode_t *next = list->next;
    list->next = rev;
    rev = list;
    list = next;
  }
  int n = 0;
  while (rev) {
    tdist__qnode_t *next = rev->next;
    rev->run(rev); /* may free or reuse the node */
    rev = next;
    n++;
  }
  return n;
}

static void on_idle(uv_idle_t *h);

void tdist__progress_wake_any(void) {
  /* Callers blocked on an op they test themselves first (wakeup.c): they
   * are the ones waiting on the critical path. */
  tdist__wakeup_all();
  /* global_mu: the thread cannot be stopped and freed meanwhile (release
   * clears `global` under it before stopping the loop). */
  pthread_mutex_lock(&global_mu);
  tdist_progress_t *p = global;
  if (p) {
    atomic_store(&p->woken, 1);
    if (atomic_load(&p->sleeping)) uv_async_send(&p->async);
  }
  pthread_mutex_unlock(&global_mu);
}

void tdist__progress_defer(tdist_progress_t *p, tdist__qnode_t *node) {
  node->next = NULL;
  if (p->defer_tail)
    p->defer_tail->next = node;
  else
    p->defer_head = node;
  p->defer_tail = node;
  /* Never block before the check phase has run it. */
  if (!p->stopping && !uv_is_active((uv_handle_t *)&p->idle)) uv_idle_start(&p->idle, on_idle);
}

void tdist__progress_undefer(tdist_progress_t *p, tdist__qnode_t *node) {
  tdist__qnode_t *prev = NULL;
  for (tdist__qnode_t *n = p->defer_head; n; prev = n, n = n->next) {
    if (n != node) continue;
    if (prev)
      prev->next = n->next;
    else
      p->defer_head = n->next;
    if (p->defer_tail == n) p->defer_tail = prev;
    return;
  }
}

/* Run the deferred nodes, including those they queue. Returns how many. */
static int run_deferred(tdist_progress_t *p) {
  int n = 0;
  while (p->defer_head) {
    tdist__qnode_t *node = p->defer_head;
    p->defer_head = node->next;
    if (!p->defer_head) p->defer_tail = NULL;
    node->run(node); /* may free or reuse the node */
    n++;
  }
  return n;
}

/* ---- pollers and back-off ----------------------------------------------------- */

void tdist__progress_poller_add(tdist_progress_t *p, tdist__poller_t *poller) {
  tdist__list_push_back(&p->pollers, &poller->link);
}

void tdist__progress_poller_remove(tdist_progress_t *p, tdist__poller_t *poller) {
  (void)p;
  if (tdist__list_linked(&poller->link)) tdist__list_remove(&poller->link);
}

/* Call every poller; *busy = some poller still has work in flight. Returns
 * what pollers nothing wakes finished; *woken_n what the woken ones did. */
static int poll_all(tdist_progress_t *p, int *busy, int *woken_n) {
  int n = 0;
  *busy = 0;
  *woken_n = 0;
  tdist__list_t *it, *tmp;
  tdist__list_foreach_safe(it, tmp, &p->pollers) {
    tdist__poller_t *pl = tdist__list_entry(it, tdist__poller_t, link);
    int b = 0;
    int k = pl->fn(pl, &b);
    if (b == TDIST__POLL_BUSY_WOKEN)
      *woken_n += k;
    else
      n += k;
    if (b == TDIST__POLL_BUSY || (b && !*busy)) *busy = b;
  }
  return n;
}

static void on_poll_timer(uv_timer_t *t);

/* One round of work; decides whether to keep spinning. */
static void progress_round(tdist_progress_t *p) {
  int busy = 0, woken_n = 0;
  int64_t now = tdist__now_ns();
  int n = drain(p);
  if (p->stopping) return;
  n += poll_all(p, &busy, &woken_n);
  /* The posts and polls above have returned: what they completed can be
   * delivered now, without waiting for the check phase (and the epoll call
   * before it) to come round. Completions of woken pollers do not make the
   * loop spin: the next one wakes it again, and on a small machine the spin
   * would take the CPU from the threads that run (and wait for) the ops. */
  int delivered = run_deferred(p);
  if (delivered > woken_n) n += delivered - woken_n;
  if (n) p->last_activity_ns = now;
  /* Spin long only for pollers nothing wakes (a woken one is polled at
   * once when its work completes; spinning would take the CPU from the
   * threads that wait for it, on a small machine). */
  int64_t spin_ns =
      (busy == TDIST__POLL_BUSY ? tdist__param_PollSpinUs() : tdist__param_SpinUs()) * 1000;
  if (now - p->last_activity_ns < spin_ns || p->defer_head) {
    if (!uv_is_active((uv_handle_t *)&p->idle)) uv_idle_start(&p->idle, on_idle);
    return;
  }
  /* Cold: stop spinning; busy pollers go on at a backed-off interval. */
  uv_idle_stop(&p->idle);
  if (busy) {
    if (n || p->poll_interval_ms == 0)
      p->poll_interval_ms = 1;
    else if (p->poll_interval_ms < (uint64_t)tdist__param_PollMaxMs())
      p->poll_interval_ms *= 2;
    if (!uv_is_active((uv_handle_t *)&p->poll_timer))
      uv_timer_start(&p->poll_timer, on_poll_timer, p->poll_interval_ms, 0);
  } else {
    p->poll_interval_ms = 0;
  }
}

static void on_idle(uv_idle_t *h) { progress_round(h->data); }

static void on_poll_timer(uv_timer_t *t) { progress_round(t->data); }

/* A wake (tdist__progress_wake_any): one round now, but no spin after it
 * (unlike a kick, it is not activity of its own). */
static void poke(tdist_progress_t *p) {
  if (p->stopping) return;
  p->poll_interval_ms = 0;
  if (!uv_is_active((uv_handle_t *)&p->idle)) uv_idle_start(&p->idle, on_idle);
}

void tdist__progress_kick(tdist_progress_t *p) {
  if (p->stopping) return;
  p->last_activity_ns = tdist__now_ns();
  p->poll_interval_ms = 0;
  if (!uv_is_active((uv_handle_t *)&p->idle)) uv_idle_start(&p->idle, on_idle);
}

/* Right before the loop blocks: announce sleep, then make sure nothing was
 * pushed in the meantime (see the Dekker note at the top). */
static void on_prepare(uv_prepare_t *h) {
  tdist_progress_t *p = h->data;
  if (uv_is_active((uv_handle_t *)&p->idle)) return; /* will not block */
  for (;;) {
    atomic_store(&p->sleeping, 1);
    if (!atomic_load(&p->queue) && !atomic_load(&p->woken)) return;
    atomic_store(&p->sleeping, 0);
    if (atomic_exchange(&p->woken, 0)) poke(p);
    if (drain(p)) tdist__progress_kick(p);
    if (uv_is_active((uv_handle_t *)&p->idle)) return; /* a round runs before any block */
  }
}

/* After the I/O step: deliver what it queued. */
static void on_check(uv_check_t *h) {
  tdist_progress_t *p = h->data;
  atomic_store(&p->sleeping, 0);
  if (run_deferred(p)) p->last_activity_ns = tdist__now_ns();
}

static void on_async(uv_async_t *h) {
  tdist_progress_t *p = h->data;
  if (atomic_exchange(&p->woken, 0)) poke(p);
  if (drain(p)) {
    run_deferred(p); /* the posts returned: deliver what they completed */
    tdist__progress_kick(p);
  }
}

/* ---- tickers ----------------------------------------------------------------- */

void tdist__progress_ticker_add(tdist_progress_t *p, tdist__ticker_t *t) {
  tdist__list_push_back(&p->tickers, &t->link);
}

void tdist__progress_ticker_remove(tdist_progress_t *p, tdist__ticker_t *t) {
  (void)p;
  if (tdist__list_linked(&t->link)) tdist__list_remove(&t->link);
}

static void on_tick(uv_timer_t *h) {
  tdist_progress_t *p = h->data;
  int busy = 0;
  tdist__list_t *it, *tmp;
  tdist__list_foreach_safe(it, tmp, &p->tickers) {
    tdist__ticker_t *t = tdist__list_entry(it, tdist__ticker_t, link);
    if (t->fn(t)) busy = 1;
  }
  if (!busy) uv_timer_stop(&p->tick_timer);
}

void tdist__progress_ticker_arm(tdist_progress_t *p) {
  if (p->stopping || uv_is_active((uv_handle_t *)&p->tick_timer)) return;
  uint64_t ms = (uint64_t)tdist__param_WatchdogMs();
  uv_timer_start(&p->tick_timer, on_tick, ms ? ms : 1, ms ? ms : 1);
}

/* ---- synchronous calls -------------------------------------------------------- */

struct task {
  tdist__qnode_t node; /* first member */
  void (*fn)(void *arg);
  void *arg;
  int done;
  pthread_mutex_t mu;
  pthread_cond_t cv;
};

static void run_task(tdist__qnode_t *node) {
  struct task *t = (struct task *)node;
  t->fn(t->arg);
  pthread_mutex_lock(&t->mu);
  t->done = 1;
  pthread_cond_signal(&t->cv);
  pthread_mutex_unlock(&t->mu);
}

void tdist__progress_call(tdist_progress_t *p, void (*fn)(void *arg), void *arg) {
  if (current == p) {
    fn(arg);
    return;
  }
  struct task t = {.node = {.next = NULL, .run = run_task}, .fn = fn, .arg = arg, .done = 0};
  pthread_mutex_init(&t.mu, NULL);
  pthread_cond_init(&t.cv, NULL);
  tdist__progress_push(p, &t.node);
  pthread_mutex_lock(&t.mu);
  while (!t.done)
    pthread_cond_wait(&t.cv, &t.mu);
  pthread_mutex_unlock(&t.mu);
  pthread_mutex_destroy(&t.mu);
  pthread_cond_destroy(&t.cv);
}

uv_loop_t *tdist__progress_loop(tdist_progress_t *p) { return &p->loop; }
int tdist__progress_on_thread(void) { return current != NULL; }

/* ---- the thread ---------------------------------------------------------------- */

static void *thread_main(void *arg) {
  tdist_progress_t *p = arg;
  current = p;
  TDIST_INFO(CORE, "progress thread started");
  uv_run(&p->loop, UV_RUN_DEFAULT);
  TDIST_INFO(CORE, "progress thread stopped");
  return NULL;
}

static void close_all(uv_handle_t *h, void *arg) {
  (void)arg;
  if (!uv_is_closing(h)) uv_close(h, NULL);
}

/* Runs on the progress thread: close every handle so uv_run returns. */
static void stop_loop(void *arg) {
  tdist_progress_t *p = arg;
  run_deferred(p); /* nothing queued may be lost */
  p->stopping = 1;
  uv_walk(&p->loop, close_all, NULL);
}

int tdist__progress_acquire(tdist_progress_t **out) {
  int rc = 0;
  pthread_mutex_lock(&global_mu);
  if (global) {
    global->refs++;
    *out = global;
    goto done;
  }
  tdist_progress_t *p = tdist__calloc(1, sizeof(*p));
  if (!p) {
    rc = tdist__error(TDIST_ERR_NO_MEMORY, "cannot allocate the progress thread");
    goto done;
  }
  int uvrc = uv_loop_init(&p->loop);
  if (uvrc) {
    tdist__free(p);
    rc = tdist__error(TDIST_ERR_INTERNAL, "uv_loop_init: %s", uv_strerror(uvrc));
    goto done;
  }
  uv_async_init(&p->loop, &p->async, on_async);
  uv_prepare_init(&p->loop, &p->prepare);
  uv_check_init(&p->loop, &p->check);
  uv_idle_init(&p->loop, &p->idle);
  uv_timer_init(&p->loop, &p->poll_timer);
  uv_timer_init(&p->loop, &p->tick_timer);
  p->async.data = p->prepare.data = p->check.data = p->idle.data = p;
  p->poll_timer.data = p->tick_timer.data = p;
  tdist__list_init(&p->pollers);
  tdist__list_init(&p->tickers);
  uv_prepare_start(&p->prepare, on_prepare);
  uv_check_start(&p->check, on_check);
  /* The helper handles must not keep the loop alive on their own... except
   * async, which is what keeps the thread waiting for work. */
  uv_unref((uv_handle_t *)&p->prepare);
  uv_unref((uv_handle_t *)&p->check);
  p->refs = 1;
  if (pthread_create(&p->thread, NULL, thread_main, p) != 0) {
    uv_walk(&p->loop, close_all, NULL);
    uv_run(&p->loop, UV_RUN_DEFAULT);
    uv_loop_close(&p->loop);
    tdist__free(p);
    rc = tdist__error(TDIST_ERR_INTERNAL, "cannot start the progress thread");
    goto done;
  }
  global = p;
  *out = p;
done:
  pthread_mutex_unlock(&global_mu);
  return rc;
}

int tdist__progress_acquire_existing(tdist_progress_t **out) {
  pthread_mutex_lock(&global_mu);
  tdist_progress_t *p = global;
  if (p) p->refs++;
  pthread_mutex_unlock(&global_mu);
  *out = p;
  return p ? 0 : TDIST_ERR_INVALID_STATE;
}

void tdist__progress_release(tdist_progress_t *p) {
  pthread_mutex_lock(&global_mu);
  int last = (--p->refs == 0);
  if (last) global = NULL;
  pthread_mutex_unlock(&global_mu);
  if (!last) return;
  tdist__progress_call(p, stop_loop, p);
  pthread_join(p->thread, NULL);
  /* Tasks pushed after the loop stopped cannot exist: the last group is gone. */
  int rc = uv_loop_close(&p->loop);
  if (rc) TDIST_WARN(CORE, "uv_loop_close: %s (a backend left a handle open)", uv_strerror(rc));
  tdist__free(p);
}
