/*
 * test_backend.c - see test_backend.h. post/poll/abort run on the progress
 * thread; a group's list of ops in flight (op->link) is the progress
 * thread's.
 */
#include "test_backend.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/group.h"
#include "core/progress.h"

typedef struct tb_state {
  tdist__bk_group_t *group;
  tdist__list_t ops; /* (progress) ops posted and not finished */
} tb_state_t;

static atomic_int mode = TB_COMPLETE;
static atomic_int fail_code = TDIST_ERR_INTERNAL;
static atomic_int aborts, posts, destroys, inits;

void tb_set_mode(tb_mode_t m) { atomic_store(&mode, (int)m); }
void tb_set_fail_code(int code) { atomic_store(&fail_code, code); }
int tb_abort_count(void) { return atomic_load(&aborts); }
int tb_post_count(void) { return atomic_load(&posts); }
int tb_destroy_count(void) { return atomic_load(&destroys); }
int tb_init_count(void) { return atomic_load(&inits); }

static void fail_task(void *arg) {
  tdist__bk_fail(arg, TDIST_ERR_REMOTE_FAILED, "test backend: a peer failed during init");
}

static int make(const tdist__bk_params_t *p, tdist__bk_out_t *out) {
  if (p->color == TDIST__NOCOLOR) return 0;
  tb_state_t *s = calloc(1, sizeof(*s));
  if (!s) return TDIST_ERR_NO_MEMORY;
  s->group = p->group;
  tdist__list_init(&s->ops);
  out->state = s;
  out->needs_poll = 1; /* poll is only called while work is in flight */
  atomic_fetch_add(&inits, 1);
  /* Synchronous: the failure is queued (and its deferred delivery may run)
   * while the caller has not adopted the state yet. */
  if (atomic_load(&mode) == TB_FAIL_AT_INIT) {
    tdist__progress_call(p->progress, fail_task, p->group);
    /* Give the loop time to deliver it now, before init returns (a core
     * that acts on it at once marks the half-built group aborted). */
    for (int i = 0; i < 100 && !tdist_group_is_aborted((tdist_group_t *)p->group); i++)
      usleep(2000);
  }
  return 0;
}

static int tb_submit(void *state, tdist__bk_op_t *op) {
  int m = atomic_load(&mode);
  memcpy(op->scratch, &m, sizeof(m));
  return 0;
}

static int op_mode(const tdist__bk_op_t *op) {
  int m;
  memcpy(&m, op->scratch, sizeof(m));
  return m;
}

static int tb_post(void *state, tdist__bk_op_t *op) {
  tb_state_t *s = state;
  atomic_fetch_add(&posts, 1);
  switch (op_mode(op)) {
  case TB_COMPLETE: tdist__bk_complete(op, 0, "ok"); return 0;
  case TB_FAIL: {
    int code = atomic_load(&fail_code);
    tdist__bk_complete(op, code, "test backend failed the op as told (%s)", tdist_err_name(code));
    return 0;
  }
  default: /* POLL, STALL and HELD stay in flight */
    tdist__list_push_back(&s->ops, &op->link);
    return 0;
  }
}

/* Complete every op of s in `which` mode. */
static int complete_mode(tb_state_t *s, int which) {
  int n = 0;
  tdist__list_t *it, *tmp;
  tdist__list_foreach_safe(it, tmp, &s->ops) {
    tdist__bk_op_t *op = tdist__list_entry(it, tdist__bk_op_t, link);
    if (op_mode(op) != which) continue;
    tdist__list_remove(&op->link);
    tdist__bk_complete(op, 0, "ok");
    n++;
  }
  return n;
}

static int tb_poll(void *state) { return complete_mode(state, TB_POLL); }

static void tb_abort(void *state, int status, const char *reason, int local) {
  tb_state_t *s = state;
  atomic_fetch_add(&aborts, 1);
  while (!tdist__list_empty(&s->ops))
    tdist__list_remove(tdist__list_first(&s->ops)); /* forgotten: the core finishes them */
}

static int tb_destroy(void *state) {
  atomic_fetch_add(&destroys, 1);
  free(state);
  return 0;
}

static const tdist__backend_ops_t tb_ops = {
    .init = make,
    .split = make,
    .shrink = make,
    .submit = tb_submit,
    .post = tb_post,
    .poll = tb_poll,
    .abort = tb_abort,
    .destroy = tb_destroy,
};

const tdist__backend_t tb_backend = {
    .name = "test",
    .ops = &tb_ops,
    .caps = {.mem = TDIST__MEM_HOST,
             .ops = TDIST__ALL_OPS,
             .dtypes = TDIST__ALL_DTYPES,
             .redops = TDIST__ALL_REDOPS,
             .shrink = 1,
             .stream_wait = 0},
};

static pthread_once_t reg_once = PTHREAD_ONCE_INIT;
static void do_register(void) { tdist__backend_register(&tb_backend); }
void tb_register(void) { pthread_once(&reg_once, do_register); }

struct release_req {
  tb_state_t *s;
};

static void release_task(void *arg) {
  struct release_req *r = arg;
  complete_mode(r->s, TB_HELD);
}

void tb_release_held(tdist_group_t *g) {
  struct release_req r = {g->bstate};
  tdist__progress_call(g->ctx->progress, release_task, &r);
}

int tb_group_create(int rank, int size, int64_t timeout_ms, tdist_group_t **g) {
  tb_register();
  return tdist__group_create(&tb_backend, rank, size, "world", NULL, timeout_ms, NULL, g);
}
