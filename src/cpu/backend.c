/*
 * backend.c - the CPU backend as the core sees it (tdist__cpu_backend, the
 * contract of tdist/backend.h): groups (init, split, shrink, destroy) over
 * the process's connections, posting an op to the engine (engine.c), and
 * abort.
 *
 * Threads: init/split/shrink/destroy run on the caller's thread and reach
 * the progress thread with tdist_backend_call; post and abort run on the
 * progress thread, called by the core at top level, so they may run the
 * engine (tdist__cpu_run_ready) before returning.
 *
 * Ownership: a cpu_group_t is the `state` the core holds for its group. It
 * is built here on the caller thread from the core's parameters (copies of
 * rank, size, uid, name, the rank map, and the core's handle for
 * tdist_backend_fail), handed to the progress thread by register_task, taken
 * back by unregister_task and freed by destroy. The core's op
 * (tdist_backend_op_t) is ours from post until we complete it or abort returns;
 * its engine state is a cpu_op_t from the group's pool, at op->priv.
 */
#include <stdio.h>
#include <string.h>

#include "util/alloc.h"
#include "util/error.h"
#include "util/inject.h"
#include "cpu/cpu.h"
#include "cpu/transport/transport.h"
#include "cpu/engine/engine.h"
#include "cpu/segment/sc.h"
#include "cpu/conn/conn.h"

/* ---- groups -------------------------------------------------------------------- */

/* Progress thread: cg joins its ctx's registry and claims the messages that
 * arrived before it existed here. */
static void register_task(void *arg) {
  cpu_group_t *cg = arg;
  cpu_ctx_t *ctx = cg->ctx;
  tdist__cpu_enter(ctx);
  tdist__list_push_back(&ctx->groups, &cg->link);
  tdist__list_t *n, *next;
  tdist__list_foreach_safe(n, next, &ctx->orphans) {
    cpu_ux_t *u = tdist__list_entry(n, cpu_ux_t, link);
    if (u->hdr.uid != cg->uid) continue;
    tdist__list_remove(n);
    if (u->hdr.kind == CPU_MSG_ERR)
      tdist__cpu_take_err(cg, u); /* a member failed it before it was here */
    else
      tdist__list_push_back(&cg->ux, n);
  }
  for (int i = 0; i < ctx->size; i++) {
    cpu_conn_t *c = ctx->conns[i];
    if (c && c->rx_body && c->rx_ux && !c->rx_g && c->rh.uid == cg->uid &&
        c->rh.kind != CPU_MSG_ERR)
      c->rx_g = cg; /* the orphan being read now is ours */
  }
  tdist__cpu_leave(ctx);
}

static void group_free(cpu_group_t *cg) {
  if (!cg) return;
  tdist__cpu_sc_free(cg);
  tdist__free(cg->conns);
  tdist__free(cg->global_ranks);
  tdist__free(cg->grank);
  tdist__free(cg);
}

/* Caller thread: a cpu_group_t for the group p describes, over ctx (whose
 * reference it takes over), registered on the progress thread. */
static int attach(const tdist_backend_params_t *p, cpu_ctx_t *ctx, tdist_backend_out_t *out) {
  cpu_group_t *cg = tdist__calloc(1, sizeof(*cg));
  if (cg) {
    cg->conns = tdist__calloc((size_t)p->size, sizeof(cpu_conn_t *));
    cg->global_ranks = tdist__calloc((size_t)p->size, sizeof(int));
    cg->grank = tdist__calloc((size_t)ctx->size, sizeof(int));
  }
  if (!cg || !cg->conns || !cg->global_ranks || !cg->grank) {
    group_free(cg);
    return tdist__error(TDIST_ERR_NO_MEMORY, "cpu: out of memory");
  }
  cg->ctx = ctx;
  cg->bk = p->group;
  cg->progress = p->progress;
  cg->rank = p->rank;
  cg->size = p->size;
  cg->uid = p->uid;
  snprintf(cg->name, sizeof(cg->name), "%s", p->name ? p->name : "");
  for (int w = 0; w < ctx->size; w++)
    cg->grank[w] = -1;
  for (int i = 0; i < p->size; i++) {
    int w = p->global_ranks[i];
    if (w < 0 || w >= ctx->size) {
      group_free(cg);
      return tdist__error(TDIST_ERR_INTERNAL, "cpu: group '%s': rank %d is world rank %d of %d",
                          p->name, i, w, ctx->size);
    }
    cg->global_ranks[i] = w;
    cg->grank[w] = i;
    cg->conns[i] = i == p->rank ? NULL : ctx->conns[w];
  }
  tdist__list_init(&cg->link);
  tdist__list_init(&cg->ops);
  tdist__list_init(&cg->free_ops);
  tdist__list_init(&cg->ux);
  tdist__list_init(&cg->precv);
  /* Collectives through one shared segment when every member is here
   * (sc_chan.c): a store exchange every member makes alike. */
  int rc = tdist__cpu_sc_setup(cg, p);
  if (rc) {
    group_free(cg);
    return rc;
  }
  /* A slow member (tests): the others may finish creating the group,
   * use it and fail before it registers here. */
  rc = tdist__inject("cpu.group.register");
  if (rc) {
    group_free(cg);
    return rc;
  }
  tdist__cpu_cma_group_init(cg);
  tdist_backend_call(cg->progress, register_task, cg);
  out->state = cg;
  /* Sockets and timers wake the loop; poll hands over what driving callers
   * left (drive.c), and they wake the loop for it. */
  out->needs_poll = 1;
  out->device = -1;
  return 0;
}

static int cpu_init(const tdist_backend_params_t *p, tdist_backend_out_t *out) {
  cpu_ctx_t *ctx = NULL;
  TDIST_CHECK(tdist__cpu_ctx_create(p, &tdist__cpu_engine_events, &tdist__cpu_hooks, &ctx));
  int rc = attach(p, ctx, out);
  if (rc) tdist__cpu_ctx_release(ctx);
  return rc;
}

static void ref_task(void *arg) {
  cpu_ctx_t *ctx = arg;
  tdist__cpu_enter(ctx);
  ctx->refs++;
  tdist__cpu_leave(ctx);
}

/* Members of the child only: it uses the parent's connections (no
 * communication, so non-members have nothing to do). */
static int cpu_split(const tdist_backend_params_t *p, tdist_backend_out_t *out) {
  if (p->color == TDIST_BACKEND_NOCOLOR || !p->group) return 0;
  cpu_ctx_t *ctx = ((cpu_group_t *)p->parent)->ctx;
  tdist_backend_call(p->progress, ref_task, ctx);
  int rc = attach(p, ctx, out);
  if (rc) tdist__cpu_ctx_release(ctx);
  return rc;
}

/* Survivors only: the child uses their existing connections; those to the
 * excluded (dead) ranks are simply never used by it. The parent may be
 * aborted: its connections stay open until its ctx goes. */
static int cpu_shrink(const tdist_backend_params_t *p, tdist_backend_out_t *out) {
  return cpu_split(p, out);
}

/* ---- post -------------------------------------------------------------------------- */

/* A collective over the group's shared segment (sc_op.c): signed and
 * queued; the channel moves it (tdist__cpu_sc_progress). Engine messages
 * that came for its number already were sent by a member that ran it over
 * messages: a disagreement. */
static int post_sc(cpu_group_t *cg, cpu_op_t *op) {
  /* No tdist__cpu_sig_posted: the engine fields a header is checked with
   * are zero from tdist__cpu_op_get, need_sigs too (the segment checks the
   * signatures), and the bitmap of who was heard is read and written only
   * while need_sigs is set (sigcheck.c). */
  op->posted_at = 0;         /* read by probes alone (a clock read saved per op) */
  op->probe_at = UINT64_MAX; /* probes are the engine's: signatures do their job here */
  int rc = tdist__cpu_sc_post(op);
  if (rc < 0) {
    tdist__cpu_fail(cg, 0, rc, "cpu: cannot start collective #%llu: %s",
                    (unsigned long long)op->cseq, tdist_strerror(rc));
    return 0;
  }
  tdist__list_t *n;
  tdist__list_foreach(n, &cg->ux) {
    cpu_ux_t *u = tdist__list_entry(n, cpu_ux_t, link);
    if ((u->hdr.kind == CPU_MSG_COLL || u->hdr.kind == CPU_MSG_SIG) && u->hdr.seq == op->cseq) {
      tdist__cpu_sc_engine_msg(cg, op, &u->hdr, tdist__cpu_grank_of(cg, u->src));
      break;
    }
  }
  return 0;
}

/* Start bop in the engine (engine lock held: the progress thread's post, or
 * a caller's submit, drive.c). */
int tdist__cpu_post_op(cpu_group_t *cg, tdist_backend_op_t *bop) {
  cpu_op_t *op = tdist__cpu_op_new(cg, bop);
  if (!op) return TDIST_ERR_NO_MEMORY;
  if (op->p2p) {
    int rc = tdist__cpu_post_p2p(cg, op);
    /* Some transfers may be queued: fail the group rather than leave them;
     * the op stays ours until the abort. */
    if (rc < 0) tdist__cpu_fail(cg, 0, rc, "cpu: cannot post the point-to-point op");
    return 0;
  }
  op->cseq = cg->next_cseq++;
  if (tdist__cpu_sc_takes(cg, op)) return post_sc(cg, op);
  tdist__cpu_probe_posted(op);
  int rc =
      tdist_backend_op_is_v(op->type) ? tdist__cpu_algo_setup_v(op) : tdist__cpu_algo_setup(op);
  if (rc < 0) {
    /* This rank cannot take part in collective #cseq, which the others run:
     * the group is broken (and no rank's numbering drifts). The op stays on
     * the list until the abort. */
    tdist__cpu_fail(cg, 0, rc, "cpu: cannot start collective #%llu: %s",
                    (unsigned long long)op->cseq, tdist_strerror(rc));
    return 0;
  }
  /* Peers that already sent this op: check they agree before starting. On
   * a mismatch (reported) the op waits for the abort. */
  tdist__list_t *n;
  tdist__list_foreach(n, &cg->ux) {
    cpu_ux_t *u = tdist__list_entry(n, cpu_ux_t, link);
    if (u->hdr.kind == CPU_MSG_COLL && u->hdr.seq == op->cseq &&
        tdist__cpu_check_coll(cg, op, &u->hdr, tdist__cpu_grank_of(cg, u->src)))
      return 0;
  }
  tdist__cpu_ready(op); /* round 0 starts in the engine */
  return 0;
}

static int cpu_post(void *state, tdist_backend_op_t *bop) {
  cpu_group_t *cg = state;
  tdist__cpu_enter(cg->ctx);
  if (tdist__cpu_post_early(cg, bop)) { /* submit started it (drive.c) */
    tdist__cpu_shm_drain(cg->ctx);      /* what a waiter that stopped left in the rings */
    tdist__cpu_sc_progress(cg->ctx);
    tdist__cpu_run_ready(cg->ctx);
    tdist__cpu_leave(cg->ctx);
    return 0;
  }
  /* Handed over after the abort (backend.h, post): it never started, and
   * the core fails it. */
  if (cg->aborted) {
    tdist__cpu_leave(cg->ctx);
    return 0;
  }
  int rc = tdist__cpu_post_op(cg, bop);
  /* Round 0 first: its receives are then posted for the parked messages. */
  tdist__cpu_run_ready(cg->ctx);
  tdist__cpu_shm_drain(cg->ctx); /* what came while we were idle */
  /* A parked message is for this op (its receive is posted now, so it is
   * read in place), or for a later one, or behind something this op needs:
   * in every case reading goes on (cpu.h, deferred reads). */
  tdist__cpu_ctx_unpark(cg->ctx);
  tdist__cpu_sc_progress(cg->ctx);
  tdist__cpu_run_ready(cg->ctx);
  tdist__cpu_leave(cg->ctx);
  return rc;
}

/* Progress thread, while the group has ops in flight, and when a driving
 * caller woke it: what that caller left (drive.c). */
static int cpu_poll(void *state) {
  cpu_group_t *cg = state;
  tdist__cpu_enter(cg->ctx);
  tdist__cpu_shm_drain(cg->ctx); /* bytes a waiter that stopped polling left */
  tdist__cpu_sc_progress(cg->ctx);
  tdist__cpu_run_ready(cg->ctx);
  tdist__cpu_leave(cg->ctx); /* delivers held completions and failures */
  return 0;
}

/* ---- abort and destroy ------------------------------------------------------------- */

/* Stop all of cg's traffic and forget its ops, receives and unexpected
 * messages (progress thread). The core finishes its ops; none of them, nor
 * their buffers, is touched after this. */
static void abort_group(cpu_group_t *cg) {
  tdist__list_t *n;
  cg->aborted = 1;
  cg->poisoned = 0;
  tdist__cpu_sc_abort(cg);        /* its ops go with the others below */
  cg->pf_set = 0;                 /* the core has its cause */
  tdist__cpu_drop_held(cg);       /* the core finishes those ops (a caller may have claimed them) */
  tdist__cpu_cma_group_abort(cg); /* first: before any buffer goes back to its owner */
  for (int i = 0; i < cg->size; i++)
    if (cg->conns[i] && !cg->conns[i]->dead) tdist__cpu_conn_forget(cg->conns[i], cg->uid);
  tdist__cpu_detach_rx(cg);
  while ((n = tdist__list_first(&cg->ops)))
    tdist__cpu_op_put(tdist__list_entry(n, cpu_op_t, link)); /* off the ready list too */
  while ((n = tdist__list_first(&cg->precv)))
    tdist__list_remove(n);
  while ((n = tdist__list_first(&cg->ux)))
    tdist__cpu_ux_free(cg->ctx, tdist__list_entry(n, cpu_ux_t, link));
}

/* ERR message with text to every other member of cg. It goes in the stream
 * ahead of anything this rank sends later (its goodbye included). */
static void tell_members(cpu_group_t *cg, int status, const char *text) {
  size_t len = strlen(text);
  for (int i = 0; i < cg->size; i++) {
    cpu_conn_t *c = cg->conns[i];
    if (!c || c->dead) continue;
    cpu_msg_t *m = tdist__cpu_msg_new();
    char *copy = tdist__malloc(len + 1);
    if (!m || !copy) {
      tdist__free(copy);
      continue;
    }
    memcpy(copy, text, len + 1);
    m->hdr = (cpu_hdr_t){
        .magic = CPU_MAGIC, .kind = CPU_MSG_ERR, .uid = cg->uid, .root = status, .len = len};
    m->data = (const uint8_t *)copy;
    m->owned = copy;
    tdist__cpu_send(c, m);
  }
}

static void cpu_abort(void *state, int status, const char *reason, int local) {
  cpu_group_t *cg = state;
  if (!cg) return;
  tdist__cpu_enter(cg->ctx);
  /* What already arrived is taken in first: an op whose messages are all
   * here completes (and keeps its success, backend.h), as it would have had
   * the transport been read a moment earlier. The cause may have come
   * first by another path (the monitor's death record) while the bytes
   * waited in a ring that no one read yet: the waiter polling it was
   * preempted, so the peer rang no doorbell (shm.h). */
  for (int i = 0; i < cg->size; i++)
    if (cg->conns[i]) tdist__cpu_conn_drive(cg->conns[i]);
  tdist__cpu_sc_progress(cg->ctx);
  tdist__cpu_run_ready(cg->ctx);
  abort_group(cg);
  /* A cause of our own (a mismatch, a timeout, an abort on demand, a lost
   * peer) goes to the other members in the stream, ahead of our goodbye if
   * we leave now: the monitor's abort record may arrive after that goodbye,
   * and a peer would then report only that we left. Same words as the
   * record (monitor.c), whichever arrives first. A cause another rank
   * reported is passed on in its own words, which name that rank: it told
   * only the members it was connected to (connections are lazy), and a
   * member it never reached would otherwise see only our goodbye and name
   * us ("left (destroyed its group)") instead of the cause. A member told
   * twice keeps the first (dispatch.c ignores an ERR for an aborted group). */
  if (local) {
    char text[320];
    snprintf(text, sizeof(text), "rank %d (world rank %d) aborted the group: %s", cg->rank,
             cg->global_ranks[cg->rank], reason);
    tell_members(cg, status, text);
  } else if (reason && *reason) {
    tell_members(cg, status, reason);
  }
  /* Writing those may have finished transfers of other groups' ops. */
  tdist__cpu_run_ready(cg->ctx);
  tdist__cpu_leave(cg->ctx);
}

/* Progress thread: cg leaves the registry; its pool is freed. */
static void unregister_task(void *arg) {
  cpu_group_t *cg = arg;
  tdist__list_t *n;
  tdist__cpu_enter(cg->ctx);
  abort_group(cg);
  tdist__list_remove(&cg->link);
  while ((n = tdist__list_first(&cg->free_ops))) {
    tdist__list_remove(n);
    cpu_op_t *op = tdist__list_entry(n, cpu_op_t, link);
    tdist__free(op->sends);
    tdist__free(op->recvs);
    tdist__free(op);
  }
  tdist__cpu_run_ready(cg->ctx);
  tdist__cpu_leave(cg->ctx);
}

static int cpu_destroy(void *state) {
  cpu_group_t *cg = state;
  if (!cg) return 0;
  tdist_backend_call(cg->progress, unregister_task, cg);
  cpu_ctx_t *ctx = cg->ctx;
  tdist__cpu_cma_group_free(cg);
  group_free(cg);
  tdist__cpu_ctx_release(ctx);
  return 0;
}

/* ---- the backend ---------------------------------------------------------------------- */

static const tdist_backend_ops_t cpu_ops = {
    .init = cpu_init,
    .split = cpu_split,
    .shrink = cpu_shrink,
    .submit = tdist__cpu_submit,
    .post = cpu_post,
    .poll = cpu_poll,
    .abort = cpu_abort,
    .destroy = cpu_destroy,
    .test = tdist__cpu_test,
};

const tdist_backend_t tdist__cpu_backend = {
    .abi_version = TDIST_BACKEND_ABI_VERSION,
    .name = "cpu",
    .ops = &cpu_ops,
    .caps =
        {
            .mem = TDIST_BACKEND_MEM_HOST,
            .ops = TDIST_BACKEND_ALL_OPS,
            .dtypes = TDIST_BACKEND_ALL_DTYPES,
            .redops = TDIST_BACKEND_ALL_REDOPS,
            .shrink = 1,
            .stream_wait = 0,
            .any_source = 1, /* engine.c: wildcard receives */
            .wakes = 1,      /* a driving caller wakes the loop for what it leaves (drive.c) */
        },
};

/* The entry the core's registry calls, as it calls a plug-in's
 * tdist_backend_plugin (tdist/backend.h). */
const tdist_backend_t *tdist__cpu_plugin(void) { return &tdist__cpu_backend; }
