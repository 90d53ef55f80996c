/*
 * trace.c - the flight recorder: recording (progress thread) and JSON dumps.
 *
 * Slot of an op = seq % cap. Ops start in sequence order, so the ring holds
 * the last `cap` sequence numbers; an op finished without having started (it
 * was still queued when its group aborted) is recorded at its end.
 *
 * Dump format (docs/flight-recorder.md): one JSON object; its "entries"
 * array has one entry per line, oldest first, so tools can read it line by
 * line.
 */
#include "core/trace.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/group.h"
#include "core/param.h"
#include "core/progress.h"

TDIST_PARAM(TraceBufferSize, "TDIST_TRACE_BUFFER_SIZE", 1024)
TDIST_PARAM(TraceOnFailure, "TDIST_TRACE_ON_FAILURE", 1)

tdist__trace_t *tdist__trace_new(void) {
  int64_t cap = tdist__param_TraceBufferSize();
  if (cap <= 0) return NULL;
  if (cap > (1 << 20)) cap = 1 << 20;
  tdist__trace_t *t = tdist__calloc(1, sizeof(*t) + sizeof(tdist__trace_rec_t) * (size_t)cap);
  if (t) t->cap = (uint32_t)cap;
  return t;
}

static void fill(tdist__trace_rec_t *r, const tdist_work_t *w, int state) {
  r->seq = w->seq;
  r->op = (int16_t)w->args.type;
  r->dtype = (int16_t)w->args.dtype;
  r->redop = (int16_t)w->args.redop;
  r->count = w->args.type == TDIST_OP_BATCH_P2P ? (uint64_t)w->args.np2p : w->args.count;
  switch (w->args.type) {
  case TDIST_OP_BROADCAST:
  case TDIST_OP_REDUCE:
  case TDIST_OP_GATHER:
  case TDIST_OP_SCATTER:
  case TDIST_OP_SEND:
  case TDIST_OP_RECV: r->root = w->args.root; break;
  default: r->root = -1;
  }
  r->t_enqueue_ns = w->t_enqueue_ns;
  r->t_start_ns = w->t_start_ns;
  r->t_end_ns = w->t_end_ns;
  r->state = (int16_t)state;
  r->status = state >= TDIST_WORK_COMPLETED ? w->status : 0;
}

void tdist__trace_start(tdist_group_t *g, const tdist_work_t *w) {
  tdist__trace_t *t = g->trace;
  if (!t) return;
  fill(&t->recs[w->seq % t->cap], w, TDIST_WORK_RUNNING);
  if (w->seq + 1 > t->recorded) t->recorded = w->seq + 1;
}

void tdist__trace_end(tdist_group_t *g, const tdist_work_t *w, int final_state) {
  tdist__trace_t *t = g->trace;
  if (!t) return;
  tdist__trace_rec_t *r = &t->recs[w->seq % t->cap];
  if (r->seq != w->seq || r->t_enqueue_ns != w->t_enqueue_ns) {
    if (w->seq + t->cap < t->recorded) return; /* older than the ring */
    if (w->seq + 1 > t->recorded) t->recorded = w->seq + 1;
  }
  fill(r, w, final_state);
}

static const char *state_name(int s) {
  static const char *names[] = {"queued", "running", "completed", "failed", "timed_out", "aborted"};
  return (s >= 0 && s <= 5) ? names[s] : "unknown";
}

static void json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    if (*s == '"' || *s == '\\')
      fprintf(f, "\\%c", *s);
    else if ((unsigned char)*s < 0x20)
      fprintf(f, "\\u%04x", *s);
    else
      fputc(*s, f);
  }
  fputc('"', f);
}

static long long wall_us(int64_t mono_ns, int64_t offset_ns) {
  return mono_ns ? (long long)((mono_ns + offset_ns) / 1000) : 0;
}

/* Write a snapshot (taken on the progress thread) to `path`, through a
 * temporary file renamed into place: a reader never sees half a dump. */
static int write_dump(tdist_group_t *g, const tdist__trace_t *t, const char *path) {
  char tmp[600];
  snprintf(tmp, sizeof(tmp), "%s.tmp%d", path, (int)getpid());
  FILE *f = fopen(tmp, "w");
  if (!f) return tdist__error(TDIST_ERR_IO, "trace: cannot write '%s': %s", path, strerror(errno));
  struct timespec rt;
  clock_gettime(CLOCK_REALTIME, &rt);
  int64_t offset = (int64_t)rt.tv_sec * 1000000000 + rt.tv_nsec - tdist__now_ns();
  char host[64] = "";
  gethostname(host, sizeof(host) - 1);
  uint64_t dropped = t->recorded > t->cap ? t->recorded - t->cap : 0;
  fprintf(f, "{\"version\": 1, \"host\": ");
  json_str(f, host);
  fprintf(f, ", \"pid\": %d, \"global_rank\": %d, \"backend\": \"%s\",\n", (int)getpid(),
          g->global_ranks[g->rank], g->ops->name);
  fprintf(f, " \"group\": {\"name\": ");
  json_str(f, g->name);
  fprintf(f, ", \"uid\": \"%016llx\", \"rank\": %d, \"size\": %d, \"ranks\": [",
          (unsigned long long)g->uid, g->rank, g->size);
  for (int i = 0; i < g->size; i++)
    fprintf(f, "%s%d", i ? ", " : "", g->global_ranks[i]);
  fprintf(f,
          "]},\n \"next_seq\": %llu, \"recorded\": %llu, \"dropped\": %llu, \"aborted\": %s, "
          "\"abort_reason\": ",
          (unsigned long long)atomic_load(&g->next_seq), (unsigned long long)t->recorded,
          (unsigned long long)dropped, atomic_load(&g->aborted) ? "true" : "false");
  json_str(f, atomic_load(&g->aborted) ? g->abort_reason : "");
  fprintf(f, ",\n \"dumped_us\": %lld,\n \"entries\": [\n", wall_us(tdist__now_ns(), offset));
  uint64_t first = dropped;
  int n = 0;
  for (uint64_t s = first; s < t->recorded; s++) {
    const tdist__trace_rec_t *r = &t->recs[s % t->cap];
    if (r->seq != s || !r->t_enqueue_ns) continue; /* never started (submit failed) */
    fprintf(f,
            "%s  {\"seq\": %llu, \"op\": \"%s\", \"dtype\": \"%s\", \"redop\": \"%s\", "
            "\"count\": %llu, \"root\": %d, \"state\": \"%s\", \"status\": \"%s\", "
            "\"t_enqueue_us\": %lld, \"t_start_us\": %lld, \"t_end_us\": %lld}",
            n++ ? ",\n" : "", (unsigned long long)r->seq, tdist_op_name(r->op),
            tdist_dtype_name(r->dtype), tdist_redop_name(r->redop), (unsigned long long)r->count,
            r->root, state_name(r->state),
            r->state >= TDIST_WORK_COMPLETED ? tdist_err_name(r->status) : "",
            wall_us(r->t_enqueue_ns, offset), wall_us(r->t_start_ns, offset),
            wall_us(r->t_end_ns, offset));
  }
  fprintf(f, "\n ]}\n");
  int bad = ferror(f);
  if (fclose(f) != 0 || bad || rename(tmp, path) != 0) {
    unlink(tmp);
    return tdist__error(TDIST_ERR_IO, "trace: error writing '%s'", path);
  }
  TDIST_INFO(CORE, "flight recorder of group '%s' written to %s", g->name, path);
  return 0;
}

static void default_path(const tdist_group_t *g, char *path, size_t len) {
  const char *prefix = tdist__param_str("TDIST_TRACE_PREFIX", "/tmp/tdist_trace_");
  int n = snprintf(path, len, "%s", prefix);
  for (const char *c = g->name; *c && n < (int)len - 1; c++)
    path[n++] = (*c == '/' || *c == ' ') ? '_' : *c;
  snprintf(path + n, len - (size_t)n, ".rank%d.json", g->global_ranks[g->rank]);
}

void tdist__trace_dump_on_failure(tdist_group_t *g) {
  if (!g->trace || !tdist__param_TraceOnFailure()) return;
  char path[512];
  default_path(g, path, sizeof(path));
  if (write_dump(g, g->trace, path) != 0)
    TDIST_WARN(CORE, "flight recorder: %s", tdist_last_error());
  else
    TDIST_WARN(CORE, "group '%s' failed; flight recorder written to %s", g->name, path);
}

struct snap {
  tdist_group_t *g;
  tdist__trace_t *copy;
};

static void snapshot_task(void *arg) {
  struct snap *s = arg;
  tdist__trace_t *t = s->g->trace;
  memcpy(s->copy, t, sizeof(*t) + sizeof(tdist__trace_rec_t) * t->cap);
}

static int dump_one(tdist_group_t *g, const char *path) {
  if (!g->trace)
    return tdist__error(TDIST_ERR_INVALID_STATE,
                        "trace: the flight recorder is off (TDIST_TRACE_BUFFER_SIZE=0)");
  size_t bytes = sizeof(tdist__trace_t) + sizeof(tdist__trace_rec_t) * g->trace->cap;
  struct snap s = {g, tdist__malloc(bytes)};
  if (!s.copy) return tdist__error(TDIST_ERR_NO_MEMORY, "trace: out of memory");
  tdist__progress_call(g->progress, snapshot_task, &s);
  char def[512];
  if (!path) {
    default_path(g, def, sizeof(def));
    path = def;
  }
  int rc = write_dump(g, s.copy, path);
  tdist__free(s.copy);
  return rc;
}

struct all_req {
  tdist_progress_t *p;
  tdist_group_t *list[256];
  int n;
};

static void list_task(void *arg) {
  struct all_req *r = arg;
  for (tdist_group_t *g = tdist__progress_groups(r->p); g && r->n < 256; g = g->pnext)
    r->list[r->n++] = g;
}

int tdist_dump_trace(tdist_group_t *g, const char *path) {
  tdist__error_clear();
  if (g) return dump_one(g, path);
  if (path)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                        "tdist_dump_trace: a path needs a group (NULL dumps every group)");
  struct all_req r = {.p = NULL, .n = 0};
  if (tdist__progress_acquire_existing(&r.p) != 0) return 0; /* no group exists */
  tdist__progress_call(r.p, list_task, &r);
  int rc = 0;
  for (int i = 0; i < r.n; i++) {
    int one = dump_one(r.list[i], NULL);
    if (one != 0 && rc == 0) rc = one;
  }
  tdist__progress_release(r.p);
  return rc;
}
