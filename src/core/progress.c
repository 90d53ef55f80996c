/*
 * progress.c - the progress thread and its libuv loop.
 *
 * Submission: producers push onto a lock-free LIFO (one CAS); the progress
 * thread takes the whole list with one exchange and reverses it, so works of
 * one submitting thread keep their order. A producer calls uv_async_send only
 * when the loop may be about to block (the `sleeping` flag, set by the
 * prepare callback right before the loop polls with a timeout); while the
 * loop spins, submission is a CAS and nothing else. The flag and the queue
 * form a Dekker pair (both seq_cst): either the producer sees sleeping == 1
 * and wakes the loop, or the loop sees the new node before it blocks.
 *
 * Polling: after any activity the loop spins (a uv_idle handle keeps the
 * poll timeout at 0) for TDIST_SPIN_US, or TDIST_POLL_SPIN_US while a backend
 * that needs polling (NCCL) has work in flight (both default to 0 when the
 * host's cores are oversubscribed: param.h); then it backs off to a timer
 * (1 ms, doubling up to TDIST_POLL_MAX_MS) for polled work, and to a plain
 * blocking epoll_wait otherwise. Socket I/O of the CPU backend wakes the loop
 * through epoll as usual.
 *
 * Everything in struct tdist_progress below `queue`/`sleeping` is owned by
 * the progress thread.
 */
#include "core/progress.h"

#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/group.h"
#include "core/monitor.h"
#include "core/param.h"
#include "core/trace.h"

TDIST_PARAM(SpinUs, "TDIST_SPIN_US", TDIST_SPIN_DEFAULT(100))
TDIST_PARAM(PollSpinUs, "TDIST_POLL_SPIN_US", TDIST_SPIN_DEFAULT(2000))
TDIST_PARAM(PollMaxMs, "TDIST_POLL_MAX_MS", 4)
TDIST_PARAM(WatchdogMs, "TDIST_WATCHDOG_MS", 50)
TDIST_PARAM(DiagGraceMs, "TDIST_TIMEOUT_DIAG_MS", 2000)

struct tdist_progress {
  /* shared */
  _Atomic(tdist__qnode_t *) queue;
  atomic_int sleeping;
  int refs; /* guarded by global_mu */

  /* progress thread */
  uv_loop_t loop;
  uv_async_t async;
  uv_prepare_t prepare;
  uv_check_t check;
  uv_idle_t idle;
  uv_timer_t poll_timer;
  uv_timer_t watchdog;
  pthread_t thread;
  int64_t last_activity_ns;
  uint64_t poll_interval_ms;
  tdist_group_t *groups;
  int stopping; /* handles are closing: start nothing */
};

static pthread_mutex_t global_mu = PTHREAD_MUTEX_INITIALIZER;
static tdist_progress_t *global;
static _Thread_local tdist_progress_t *current; /* set on the progress thread */

/* ---- the queue ------------------------------------------------------------- */

void tdist__progress_push(tdist_progress_t *p, tdist__qnode_t *node) {
  tdist__qnode_t *head = atomic_load(&p->queue);
  do {
    node->next = head;
  } while (!atomic_compare_exchange_weak(&p->queue, &head, node));
  if (atomic_load(&p->sleeping)) uv_async_send(&p->async);
}

/* Run everything queued, oldest first. Returns the number of nodes run. */
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

/* ---- polling and back-off ------------------------------------------------ */

/* Poll every group that asked for it; *polled_inflight = some polled group
 * still has work. Returns the number of works the backends finished. */
static int poll_groups(tdist_progress_t *p, int *polled_inflight) {
  int n = 0;
  *polled_inflight = 0;
  for (tdist_group_t *g = p->groups; g; g = g->pnext) {
    if (!g->needs_poll || !g->inflight_head || atomic_load(&g->aborted)) continue;
    n += g->ops->poll(g);
    if (g->inflight_head) *polled_inflight = 1;
  }
  return n;
}

static void on_poll_timer(uv_timer_t *t);
static void on_idle(uv_idle_t *h);

/* One round of work; decides whether to keep spinning. */
static void progress_round(tdist_progress_t *p) {
  int polled_inflight = 0;
  int64_t now = tdist__now_ns();
  int n = drain(p);
  if (p->stopping) return;
  n += poll_groups(p, &polled_inflight);
  if (n) p->last_activity_ns = now;
  int64_t spin_ns = (polled_inflight ? tdist__param_PollSpinUs() : tdist__param_SpinUs()) * 1000;
  if (now - p->last_activity_ns < spin_ns) {
    if (!uv_is_active((uv_handle_t *)&p->idle)) uv_idle_start(&p->idle, on_idle);
    return;
  }
  /* Cold: stop spinning; polled work goes on at a backed-off interval. */
  uv_idle_stop(&p->idle);
  if (polled_inflight) {
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

static void on_poll_timer(uv_timer_t *t) {
  tdist_progress_t *p = t->data;
  progress_round(p);
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
    if (!atomic_load(&p->queue)) return;
    atomic_store(&p->sleeping, 0);
    if (drain(p)) tdist__progress_kick(p);
  }
}

static void on_check(uv_check_t *h) {
  tdist_progress_t *p = h->data;
  atomic_store(&p->sleeping, 0);
}

static void on_async(uv_async_t *h) {
  tdist_progress_t *p = h->data;
  if (drain(p)) tdist__progress_kick(p);
}

/* ---- timeouts ------------------------------------------------------------------ */

static void on_watchdog(uv_timer_t *t) {
  tdist_progress_t *p = t->data;
  int64_t now = tdist__now_ns();
  int any = 0;
  for (tdist_group_t *g = p->groups; g; g = g->pnext) {
    for (tdist_work_t *w = g->inflight_head; w; w = w->next) {
      if (!w->deadline_ns || now < w->deadline_ns) continue;
      /* Before failing, let the monitor learn from the store which ranks
       * never reached this op (bounded: past the grace, fail without it). */
      int in_grace = now < w->deadline_ns + tdist__param_DiagGraceMs() * 1000000;
      if (g->size > 1 && g->store && in_grace &&
          (g->diag_pending || tdist__monitor_diagnose(g->uid, w->seq))) {
        g->diag_pending = 1;
        break;
      }
      tdist__group_timeout(g, w, NULL);
      break; /* the group's list was emptied by the abort */
    }
    if (g->inflight_head) any = 1;
  }
  if (!any) uv_timer_stop(&p->watchdog);
}

/* Queue node run for a submitted work: start it on its backend. */
void tdist__progress_start_work(tdist__qnode_t *node) {
  tdist_work_t *w = (tdist_work_t *)node; /* qnode is the first member */
  tdist_group_t *g = w->group;
  tdist_progress_t *p = g->progress;
  if (atomic_load(&g->aborted)) {
    tdist__work_finish(w, g->abort_status, "group was aborted before the op started: %s",
                       g->abort_reason);
    return;
  }
  w->t_start_ns = tdist__now_ns();
  atomic_store_explicit(&w->state, TDIST_WORK_RUNNING, memory_order_release);
  tdist__group_inflight_add(g, w);
  tdist__trace_start(g, w);
  if (!uv_is_active((uv_handle_t *)&p->watchdog)) {
    uint64_t ms = (uint64_t)tdist__param_WatchdogMs();
    uv_timer_start(&p->watchdog, on_watchdog, ms, ms);
  }
  int rc = g->ops->post(g, w);
  if (rc < 0 && !tdist__work_done(w))
    tdist__work_finish(w, rc, "backend '%s' could not start the op: %s", g->ops->name,
                       tdist_strerror(rc));
}

/* ---- control tasks ------------------------------------------------------------- */

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
int tdist__progress_is_current(const tdist_progress_t *p) { return current == p; }

void tdist__progress_add_group(tdist_progress_t *p, tdist_group_t *g) {
  g->pprev = NULL;
  g->pnext = p->groups;
  if (p->groups) p->groups->pprev = g;
  p->groups = g;
  g->registered = 1;
}

tdist_group_t *tdist__progress_groups(tdist_progress_t *p) { return p->groups; }

void tdist__progress_remove_group(tdist_progress_t *p, tdist_group_t *g) {
  if (!g->registered) return;
  if (g->pprev)
    g->pprev->pnext = g->pnext;
  else
    p->groups = g->pnext;
  if (g->pnext) g->pnext->pprev = g->pprev;
  g->pnext = g->pprev = NULL;
  g->registered = 0;
}

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
  uv_timer_init(&p->loop, &p->watchdog);
  p->async.data = p->prepare.data = p->check.data = p->idle.data = p;
  p->poll_timer.data = p->watchdog.data = p;
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
