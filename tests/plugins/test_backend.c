/*
 * test_backend.c - see test_backend.h. post/poll/abort run on the progress
 * thread; a group's list of ops in flight (op->link) is the progress
 * thread's. Only the installed headers are included (a plug-in sees
 * nothing of src/).
 */
#define _DEFAULT_SOURCE /* usleep */
#include "test_backend.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Built twice: as "test", and as "testabi" with another ABI version (the
 * registry must refuse that one, naming both versions). */
#ifndef TB_NAME
#define TB_NAME "test"
#endif
#ifndef TB_ABI
#define TB_ABI TDIST_BACKEND_ABI_VERSION
#endif

typedef struct tb_state {
  tdist_backend_group_t *group;
  tdist_backend_progress_t *progress;
  tdist_list_t ops;  /* (progress) ops posted and not finished */
  tdist_list_t live; /* on `states` (states_mu) */
} tb_state_t;

/* Every live state, so tb_release_held finds a group's (the core's group
 * handle is the tdist_backend_group_t the backend was given). */
static pthread_mutex_t states_mu = PTHREAD_MUTEX_INITIALIZER;
static tdist_list_t states = {&states, &states};

/* A circular list with a head node (the core's convention). */
static void list_init(tdist_list_t *h) { h->next = h->prev = h; }
static int list_empty(const tdist_list_t *h) { return h->next == h; }
static void list_push_back(tdist_list_t *h, tdist_list_t *n) {
  n->next = h;
  n->prev = h->prev;
  h->prev->next = n;
  h->prev = n;
}
static void list_remove(tdist_list_t *n) {
  n->prev->next = n->next;
  n->next->prev = n->prev;
  n->next = n->prev = n;
}
#define op_of(l) ((tdist_backend_op_t *)(void *)((char *)(l)-offsetof(tdist_backend_op_t, link)))
#define state_of(l) ((tb_state_t *)(void *)((char *)(l)-offsetof(tb_state_t, live)))

static atomic_int mode = TB_COMPLETE;
static atomic_int fail_code = TDIST_ERR_INTERNAL;
static atomic_int aborts, posts, destroys, inits;
/* TB_CALLER (testcaller): tests an op needs, the release, what test saw. */
static atomic_int caller_tests = 1, caller_released, tests, breaches, runs_open;
static _Thread_local int tl_in_run; /* this thread is in a SPIN run */

void tb_set_caller_tests(int k) {
  atomic_store(&caller_tests, k);
  atomic_store(&caller_released, 0);
}
void tb_caller_release(void) { atomic_store(&caller_released, 1); }
int tb_test_count(void) { return atomic_load(&tests); }
int tb_test_breaches(void) { return atomic_load(&breaches); }
int tb_runs_open(void) { return atomic_load(&runs_open); }

/* The op's words in its scratch: the mode at submit, then (TB_CALLER) the
 * tests it needs, the tests made, posted. */
typedef struct tb_op {
  int mode;
  int need;
  atomic_int made;
  atomic_int posted;
} tb_op_t;
static tb_op_t *tbop(tdist_backend_op_t *op) { return (tb_op_t *)(void *)op->scratch; }

void tb_set_mode(tb_mode_t m) { atomic_store(&mode, (int)m); }
void tb_set_fail_code(int code) { atomic_store(&fail_code, code); }
int tb_abort_count(void) { return atomic_load(&aborts); }
int tb_post_count(void) { return atomic_load(&posts); }
int tb_destroy_count(void) { return atomic_load(&destroys); }
int tb_init_count(void) { return atomic_load(&inits); }

static void fail_task(void *arg) {
  tdist_backend_fail(arg, TDIST_ERR_REMOTE_FAILED, "test backend: a peer failed during init");
}

static int make(const tdist_backend_params_t *p, tdist_backend_out_t *out) {
  if (p->color == TDIST_BACKEND_NOCOLOR) return 0;
  tb_state_t *s = calloc(1, sizeof(*s));
  if (!s) return TDIST_ERR_NO_MEMORY;
  s->group = p->group;
  s->progress = p->progress;
  list_init(&s->ops);
  pthread_mutex_lock(&states_mu);
  list_push_back(&states, &s->live);
  pthread_mutex_unlock(&states_mu);
  out->state = s;
  out->needs_poll = 1; /* poll is only called while work is in flight */
  atomic_fetch_add(&inits, 1);
  /* Synchronous: the failure is queued (and its deferred delivery may run)
   * while the caller has not adopted the state yet. */
  if (atomic_load(&mode) == TB_FAIL_AT_INIT) {
    tdist_backend_call(p->progress, fail_task, p->group);
    /* Give the loop time to deliver it now, before init returns (a core
     * that acts on it at once marks the half-built group aborted). */
    for (int i = 0; i < 100 && !tdist_group_is_aborted((tdist_group_t *)p->group); i++)
      usleep(2000);
  }
  return 0;
}

static int tb_submit(void *state, tdist_backend_op_t *op) {
  tb_op_t *t = tbop(op);
  t->mode = atomic_load(&mode);
  t->need = atomic_load(&caller_tests);
  atomic_init(&t->made, 0);
  atomic_init(&t->posted, 0);
  return 0;
}

static int op_mode(tdist_backend_op_t *op) { return tbop(op)->mode; }

static int caller_done(tdist_backend_op_t *op) {
  tb_op_t *t = tbop(op);
  return atomic_load(&caller_released) || atomic_load(&t->made) >= t->need;
}

/* Any caller thread: TB_CALLER ops are done from their need-th test on;
 * the run protocol of backend.h is checked on every call. */
static int tb_test(void *state, tdist_backend_op_t *op, unsigned flags) {
  (void)state;
  atomic_fetch_add(&tests, 1);
  int spin = (flags & TDIST_BACKEND_TEST_SPIN) != 0, last = (flags & TDIST_BACKEND_TEST_LAST) != 0;
  if (spin && last) atomic_fetch_add(&breaches, 1);
  if (!spin && !last && tl_in_run) atomic_fetch_add(&breaches, 1); /* a single look mid-run */
  if (spin && !tl_in_run) {
    tl_in_run = 1;
    atomic_fetch_add(&runs_open, 1);
  }
  int r = 0;
  if (op_mode(op) == TB_CALLER) {
    atomic_fetch_add(&tbop(op)->made, 1);
    r = caller_done(op);
  }
  if (tl_in_run && (last || r == 1)) { /* the run ends */
    tl_in_run = 0;
    atomic_fetch_sub(&runs_open, 1);
  }
  return r;
}

static int tb_post(void *state, tdist_backend_op_t *op) {
  tb_state_t *s = state;
  atomic_fetch_add(&posts, 1);
  switch (op_mode(op)) {
  case TB_COMPLETE: tdist_backend_complete(op, 0, "ok"); return 0;
  case TB_CALLER:
    atomic_store(&tbop(op)->posted, 1);
    if (caller_done(op)) {
      tdist_backend_complete(op, 0, "ok");
      return 0;
    }
    list_push_back(&s->ops, &op->link);
    return 0;
  case TB_FAIL: {
    int code = atomic_load(&fail_code);
    tdist_backend_complete(op, code, "test backend failed the op as told (%s)",
                           tdist_err_name(code));
    return 0;
  }
  default: /* POLL, STALL and HELD stay in flight */ list_push_back(&s->ops, &op->link); return 0;
  }
}

/* Complete every op of s in `which` mode (TB_CALLER: every done one). */
static int complete_mode(tb_state_t *s, int which) {
  int n = 0;
  for (tdist_list_t *it = s->ops.next, *next; it != &s->ops; it = next) {
    next = it->next;
    tdist_backend_op_t *op = op_of(it);
    if (op_mode(op) != which || (which == TB_CALLER && !caller_done(op))) continue;
    list_remove(&op->link);
    tdist_backend_complete(op, 0, "ok");
    n++;
  }
  return n;
}

static int tb_poll(void *state) {
  return complete_mode(state, TB_POLL) + complete_mode(state, TB_CALLER);
}

static void tb_abort(void *state, int status, const char *reason, int local) {
  tb_state_t *s = state;
  atomic_fetch_add(&aborts, 1);
  while (!list_empty(&s->ops))
    list_remove(s->ops.next); /* forgotten: the core finishes them */
}

static int tb_destroy(void *state) {
  tb_state_t *s = state;
  atomic_fetch_add(&destroys, 1);
  pthread_mutex_lock(&states_mu);
  list_remove(&s->live);
  pthread_mutex_unlock(&states_mu);
  free(s);
  return 0;
}

/* The two vtables differ in test alone ("testcaller" has one). */
#define TB_OPS_COMMON                                                                \
  .init = make, .split = make, .shrink = make, .submit = tb_submit, .post = tb_post, \
  .poll = tb_poll, .abort = tb_abort, .destroy = tb_destroy
static const tdist_backend_ops_t tb_ops = {TB_OPS_COMMON};
static const tdist_backend_ops_t tbc_ops = {TB_OPS_COMMON, .test = tb_test};

/* ... and their capabilities are the same. */
#define TB_CAPS                                                                          \
  {                                                                                      \
    .mem = TDIST_BACKEND_MEM_HOST, .ops = TDIST_BACKEND_ALL_OPS,                         \
    .dtypes = TDIST_BACKEND_ALL_DTYPES, .redops = TDIST_BACKEND_ALL_REDOPS, .shrink = 1, \
    .stream_wait = 0                                                                     \
  }

const tdist_backend_t tb_backend = {
    .abi_version = TB_ABI, .name = TB_NAME, .ops = &tb_ops, .caps = TB_CAPS};

const tdist_backend_t tbc_backend = {
    .abi_version = TB_ABI, .name = TB_NAME "caller", .ops = &tbc_ops, .caps = TB_CAPS};

/* The plug-in's entry (tdist/backend.h): the library calls it when a
 * program names the backend. */
const tdist_backend_t *tdist_backend_plugin(void) { return &tb_backend; }

static pthread_once_t reg_once = PTHREAD_ONCE_INIT;
static void do_register(void) {
  tdist_backend_register(&tb_backend);
  tdist_backend_register(&tbc_backend);
}
void tb_register(void) { pthread_once(&reg_once, do_register); }

struct release_req {
  tb_state_t *s;
};

static void release_task(void *arg) {
  struct release_req *r = arg;
  complete_mode(r->s, TB_HELD);
}

void tb_release_held(tdist_group_t *g) {
  struct release_req r = {NULL};
  pthread_mutex_lock(&states_mu);
  for (tdist_list_t *it = states.next; it != &states && !r.s; it = it->next)
    if ((void *)state_of(it)->group == (void *)g) r.s = state_of(it);
  pthread_mutex_unlock(&states_mu);
  if (r.s) tdist_backend_call(r.s->progress, release_task, &r);
}
