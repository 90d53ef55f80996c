/*
 * test_backend.c - see test_backend.h. post/poll/abort run on the progress
 * thread; the held list is the progress thread's.
 */
#include "test_backend.h"

#include <stdatomic.h>
#include <string.h>

#include "core/group.h"
#include "core/progress.h"

static atomic_int mode = TB_COMPLETE;
static atomic_int fail_code = TDIST_ERR_INTERNAL;
static atomic_int aborts, posts;

void tb_set_mode(tb_mode_t m) { atomic_store(&mode, (int)m); }
void tb_set_fail_code(int code) { atomic_store(&fail_code, code); }
int tb_abort_count(void) { return atomic_load(&aborts); }
int tb_post_count(void) { return atomic_load(&posts); }

static int tb_init(tdist_group_t *g, const void *arg) {
  (void)arg;
  g->needs_poll = 1; /* poll is only called while work is in flight */
  return 0;
}

static int tb_split(tdist_group_t *parent, int color, tdist_group_t *child) {
  if (child) child->needs_poll = 1;
  return 0;
}

static int tb_shrink(tdist_group_t *parent, const int *exclude, int n, tdist_group_t *child) {
  child->needs_poll = 1;
  return 0;
}

static int tb_submit(tdist_group_t *g, tdist_work_t *w) {
  int m = atomic_load(&mode);
  memcpy(w->bk_inline, &m, sizeof(m));
  return 0;
}

static int work_mode(const tdist_work_t *w) {
  int m;
  memcpy(&m, w->bk_inline, sizeof(m));
  return m;
}

static int tb_post(tdist_group_t *g, tdist_work_t *w) {
  atomic_fetch_add(&posts, 1);
  switch (work_mode(w)) {
  case TB_COMPLETE: tdist__work_finish(w, 0, "ok"); return 0;
  case TB_FAIL: {
    int code = atomic_load(&fail_code);
    tdist__work_finish(w, code, "test backend failed the op as told (%s)", tdist_err_name(code));
    return 0;
  }
  default: return 0; /* POLL, STALL and HELD stay in flight */
  }
}

static int tb_poll(tdist_group_t *g) {
  int n = 0;
  tdist_work_t *w = g->inflight_head;
  while (w) {
    tdist_work_t *next = w->next;
    if (work_mode(w) == TB_POLL) {
      tdist__work_finish(w, 0, "ok");
      n++;
    }
    w = next;
  }
  return n;
}

static void tb_abort(tdist_group_t *g, int status, const char *reason) {
  atomic_fetch_add(&aborts, 1);
}

static int tb_destroy(tdist_group_t *g) { return 0; }

const tdist__backend_ops_t tb_backend = {
    .name = "test",
    .init = tb_init,
    .split = tb_split,
    .submit = tb_submit,
    .post = tb_post,
    .poll = tb_poll,
    .abort = tb_abort,
    .destroy = tb_destroy,
    .shrink = tb_shrink,
};

static void release_task(void *arg) {
  tdist_group_t *g = arg;
  tdist_work_t *w = g->inflight_head;
  while (w) {
    tdist_work_t *next = w->next;
    if (work_mode(w) == TB_HELD) tdist__work_finish(w, 0, "ok");
    w = next;
  }
}

void tb_release_held(tdist_group_t *g) { tdist__progress_call(g->progress, release_task, g); }

int tb_group_create(int rank, int size, int64_t timeout_ms, tdist_group_t **g) {
  return tdist__group_create(&tb_backend, rank, size, "world", NULL, timeout_ms, NULL, g);
}
