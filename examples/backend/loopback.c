/*
 * loopback.c - a complete tdist backend in one file: "loopback", for a
 * world of one process (a laptop, a unit test, a rank-0-only tool), where
 * every collective is a local copy. It shows a third party what a backend
 * is: a descriptor with an ABI version, a vtable, capabilities, and the
 * services of tdist/backend.h. It includes the installed headers only.
 *
 * Build it as libtdist-backend-loopback.so, linked without libtdist (the
 * program that loads it provides the services), and put its folder on
 * TDIST_BACKEND_PATH; then name it like any backend:
 *
 *   cc -shared -fPIC -o libtdist-backend-loopback.so loopback.c $(pkg-config --cflags tdist)
 *   TDIST_BACKEND_PATH=$PWD TDIST_BACKEND=loopback ./my_program
 *
 * What the core does for it: validation (only the ops, types and reductions
 * the capabilities below name reach it), work handles, waits, callbacks,
 * timeouts, the flight recorder. What it does: post runs the op at once on
 * the progress thread and completes it (tdist_backend_complete: the core
 * delivers the completion after post returns, never inside it).
 */
#include <string.h>

#include "tdist/backend.h"

typedef struct lb_state {
  int size; /* always 1 (init refuses more) */
} lb_state_t;

static lb_state_t the_state = {1};

/* Caller thread: a new world group. A world of more than one process needs
 * a backend that moves data between them. */
static int lb_init(const tdist_backend_params_t *p, tdist_backend_out_t *out) {
  if (p->size != 1)
    return tdist_backend_error(TDIST_ERR_NOT_SUPPORTED,
                               "loopback backend: a world of %d ranks (it runs only one)", p->size);
  out->state = &the_state;
  out->needs_poll = 0; /* every op completes in post */
  out->device = -1;
  tdist_backend_log(1, "loopback: group '%s' made", p->name);
  return 0;
}

/* A split or shrink of a one-rank world is that rank again (or nothing). */
static int lb_split(const tdist_backend_params_t *p, tdist_backend_out_t *out) {
  if (p->color == TDIST_BACKEND_NOCOLOR) return 0;
  return lb_init(p, out);
}

/* Progress thread: with one rank every collective leaves the send buffer's
 * elements in the receive buffer (a sum, a max or a gather of one block is
 * that block); broadcast and barrier have nothing to do. */
static int lb_post(void *state, tdist_backend_op_t *op) {
  (void)state;
  const tdist_backend_args_t *a = op->args;
  size_t bytes = a->count * tdist_dtype_size(a->dtype);
  switch (a->type) {
  case TDIST_OP_ALL_REDUCE:
  case TDIST_OP_REDUCE:
  case TDIST_OP_ALL_GATHER:
  case TDIST_OP_GATHER:
  case TDIST_OP_SCATTER:
  case TDIST_OP_REDUCE_SCATTER:
  case TDIST_OP_ALL_TO_ALL:
    if (a->recvbuf && a->sendbuf && a->recvbuf != a->sendbuf && bytes)
      memmove(a->recvbuf, a->sendbuf, bytes);
    break;
  case TDIST_OP_BROADCAST:
  case TDIST_OP_BARRIER: break;
  default: /* the capabilities keep other ops away */
    tdist_backend_complete(op, TDIST_ERR_NOT_SUPPORTED, "loopback backend: op %d", (int)a->type);
    return 0;
  }
  tdist_backend_complete(op, 0, "ok");
  return 0;
}

/* Progress thread: nothing is ever in flight after post. */
static void lb_abort(void *state, int status, const char *reason, int local) {
  (void)state, (void)status, (void)reason, (void)local;
}

static int lb_destroy(void *state) {
  (void)state;
  return 0;
}

static const tdist_backend_ops_t lb_ops = {
    .init = lb_init,
    .split = lb_split,
    .shrink = lb_split,
    .post = lb_post,
    .abort = lb_abort,
    .destroy = lb_destroy,
};

#define OP(x) (1u << (x))

static const tdist_backend_t lb_backend = {
    .abi_version = TDIST_BACKEND_ABI_VERSION,
    .name = "loopback",
    .ops = &lb_ops,
    .caps =
        {
            .mem = TDIST_BACKEND_MEM_HOST,
            .ops = OP(TDIST_OP_ALL_REDUCE) | OP(TDIST_OP_BROADCAST) | OP(TDIST_OP_REDUCE) |
                   OP(TDIST_OP_ALL_GATHER) | OP(TDIST_OP_GATHER) | OP(TDIST_OP_SCATTER) |
                   OP(TDIST_OP_REDUCE_SCATTER) | OP(TDIST_OP_ALL_TO_ALL) | OP(TDIST_OP_BARRIER),
            .dtypes = TDIST_BACKEND_ALL_DTYPES,
            /* With one rank every reduction but a premultiplied sum is the
             * identity. */
            .redops = TDIST_BACKEND_ALL_REDOPS & ~(1u << TDIST_PREMUL_SUM),
            .shrink = 1,
        },
};

/* The entry the library looks up after loading the object. */
const tdist_backend_t *tdist_backend_plugin(void) { return &lb_backend; }
