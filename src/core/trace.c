/*
 * trace.c - the flight recorder: recording (progress thread) and JSON dumps
 * (written on the caller's thread or the worker thread, never the progress
 * thread).
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
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "util/alloc.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/param.h"
#include "util/worker.h"

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
  r->seq = w->bop.seq;
  r->op = (int16_t)w->args.type;
  r->dtype = (int16_t)w->args.dtype;
  r->redop = (int16_t)w->args.redop;
  r->count = w->args.type == TDIST_OP_BATCH_P2P ? (uint64_t)w->args.np2p : w->args.count;
  /* the root of a rooted collective, the peer of a send/recv (opprops.h) */
  r->root =
      (tdist__op_props(w->args.type) & (TDIST__OP_ROOTED | TDIST__OP_PEER)) ? w->args.root : -1;
  r->t_enqueue_ns = w->t_enqueue_ns;
  r->t_start_ns = w->t_start_ns;
  r->t_end_ns = w->t_end_ns;
  r->state = (int16_t)state;
  r->status = state >= TDIST_WORK_COMPLETED ? w->status : 0;
}

void tdist__trace_start(tdist__trace_t *t, const tdist_work_t *w) {
  if (!t) return;
  uint64_t seq = w->bop.seq;
  fill(&t->recs[seq % t->cap], w, TDIST_WORK_RUNNING);
  if (seq + 1 > t->recorded) t->recorded = seq + 1;
}

void tdist__trace_end(tdist__trace_t *t, const tdist_work_t *w) {
  if (!t) return;
  uint64_t seq = w->bop.seq;
  tdist__trace_rec_t *r = &t->recs[seq % t->cap];
  if (r->seq != seq || r->t_enqueue_ns != w->t_enqueue_ns) {
    if (seq + t->cap < t->recorded) return; /* older than the ring */
    if (seq + 1 > t->recorded) t->recorded = seq + 1;
  }
  fill(r, w, tdist__work_state_for(w->status)); /* published after this */
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

struct tdist__trace_dump {
  tdist__trace_meta_t m;
  int *ranks;
  tdist__trace_t *t; /* copy of the ring */
};

tdist__trace_dump_t *tdist__trace_snapshot(const tdist__trace_t *t, const tdist__trace_meta_t *m) {
  if (!t) return NULL;
  size_t bytes = sizeof(*t) + sizeof(tdist__trace_rec_t) * t->cap;
  tdist__trace_dump_t *d = tdist__calloc(1, sizeof(*d));
  if (!d) return NULL;
  d->t = tdist__malloc(bytes);
  d->ranks = tdist__malloc(sizeof(int) * (size_t)(m->size > 0 ? m->size : 1));
  if (!d->t || !d->ranks) {
    tdist__free(d->t);
    tdist__free(d->ranks);
    tdist__free(d);
    return NULL;
  }
  memcpy(d->t, t, bytes);
  memcpy(d->ranks, m->ranks, sizeof(int) * (size_t)m->size);
  d->m = *m;
  d->m.ranks = d->ranks;
  return d;
}

static void dump_free(tdist__trace_dump_t *d) {
  tdist__free(d->t);
  tdist__free(d->ranks);
  tdist__free(d);
}

/* Write a snapshot to `path`, through a temporary file renamed into place: a
 * reader never sees half a dump. */
static int write_dump(const tdist__trace_dump_t *d, const char *path) {
  const tdist__trace_t *t = d->t;
  const tdist__trace_meta_t *g = &d->m;
  /* Unique per write, not only per process: the worker thread's failure
   * dump and a caller's tdist_dump_trace may write the same path at once
   * (sharing one temporary name, one of them failed its rename with IO). */
  static _Atomic unsigned writes;
  char tmp[600];
  snprintf(tmp, sizeof(tmp), "%s.tmp%d.%u", path, (int)getpid(), atomic_fetch_add(&writes, 1));
  FILE *f = fopen(tmp, "w");
  if (!f) return tdist__error(TDIST_ERR_IO, "trace: cannot write '%s': %s", path, strerror(errno));
  struct timespec rt;
  clock_gettime(CLOCK_REALTIME, &rt);
  int64_t offset = (int64_t)rt.tv_sec * 1000000000 + rt.tv_nsec - tdist__now_ns();
  char host[64] = "";
  gethostname(host, sizeof(host) - 1);
  uint64_t dropped = t->recorded > t->cap ? t->recorded - t->cap : 0;
  fprintf(f, "{\"version\": 1, \"job\": ");
  json_str(f, g->job[0] ? g->job : "-");
  fprintf(f, ", \"host\": ");
  json_str(f, host);
  fprintf(f, ", \"pid\": %d, \"global_rank\": %d, \"backend\": \"%s\",\n", (int)getpid(),
          g->ranks[g->rank], g->backend);
  fprintf(f, " \"group\": {\"name\": ");
  json_str(f, g->name);
  fprintf(f, ", \"uid\": \"%016llx\", \"rank\": %d, \"size\": %d, \"ranks\": [",
          (unsigned long long)g->uid, g->rank, g->size);
  for (int i = 0; i < g->size; i++)
    fprintf(f, "%s%d", i ? ", " : "", g->ranks[i]);
  fprintf(f,
          "]},\n \"next_seq\": %llu, \"recorded\": %llu, \"dropped\": %llu, \"aborted\": %s, "
          "\"abort_reason\": ",
          (unsigned long long)g->next_seq, (unsigned long long)t->recorded,
          (unsigned long long)dropped, g->aborted ? "true" : "false");
  json_str(f, g->aborted ? g->abort_reason : "");
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

static void default_path(const tdist__trace_meta_t *g, char *path, size_t len) {
  const char *prefix = tdist__param_str("TDIST_TRACE_PREFIX", "/tmp/tdist_trace_");
  int n = snprintf(path, len, "%s", prefix);
  if (g->job[0] && strcmp(g->job, "-") != 0) /* <prefix><job>.<name>.rank<r>.json */
    n += snprintf(path + n, len - (size_t)n, "%s.", g->job);
  if (n >= (int)len) n = (int)len - 1;
  for (const char *c = g->name; *c && n < (int)len - 1; c++)
    path[n++] = (*c == '/' || *c == ' ') ? '_' : *c;
  snprintf(path + n, len - (size_t)n, ".rank%d.json", g->ranks[g->rank]);
}

int tdist__trace_write(tdist__trace_dump_t *d, const char *path) {
  char def[512];
  if (!path) {
    default_path(&d->m, def, sizeof(def));
    path = def;
  }
  int rc = write_dump(d, path);
  dump_free(d);
  return rc;
}

/* Worker thread: write a failure dump and say so on stderr, one line,
 * whatever TDIST_DEBUG says (a person looks for it after a failure). */
static void write_job(void *arg) {
  tdist__trace_dump_t *d = arg;
  char path[512], line[700];
  default_path(&d->m, path, sizeof(path));
  int rank = d->m.ranks[d->m.rank];
  int n;
  if (tdist__trace_write(d, path) != 0)
    n = snprintf(line, sizeof(line), "tdist: rank %d: flight recorder not written: %s\n", rank,
                 tdist_last_error());
  else
    n = snprintf(line, sizeof(line), "tdist: rank %d: flight recorder written to %s\n", rank, path);
  if (n > (int)sizeof(line) - 1) n = (int)sizeof(line) - 1;
  ssize_t w = write(2, line, (size_t)n);
  (void)w;
}

void tdist__trace_dump_on_failure(const tdist__trace_t *t, const tdist__trace_meta_t *m) {
  if (!t || !tdist__param_TraceOnFailure()) return;
  tdist__trace_dump_t *d = tdist__trace_snapshot(t, m);
  if (d) tdist__worker_run(write_job, d);
}
