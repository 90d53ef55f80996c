/*
 * trace.c - the flight recorder: recording (progress thread, or the caller
 * thread of a synchronous op it finished itself, under the ring's spinlock) and JSON dumps
 * (written on the caller's thread or the worker thread, never the progress
 * thread).
 *
 * Slot of an op = seq % cap. Ops start in sequence order, so the ring holds
 * the last `cap` sequence numbers; an op finished without having started (it
 * was still queued when its group aborted) is recorded at its end.
 *
 * Dump format (docs/flight-recorder.md): JSON Lines, each line one JSON
 * object written with json-c: a meta line (the group, this process, the
 * ring's window), then one line per record, oldest first. A reader of a cut
 * file loses only the line that was cut.
 */
#include "core/trace/trace.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <json.h>

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
  size_t bytes = sizeof(tdist__trace_t) + sizeof(tdist__trace_rec_t) * (size_t)cap;
  tdist__trace_t *t = tdist__malloc(bytes);
  if (!t) return NULL;
  /* Every page written now: a caller that records its own op (ops.c)
   * would otherwise take a page fault every 73 records of the first pass,
   * 10-15 us each on the CI VM, inside a 1 us op. */
  memset(t, 0, bytes);
  t->cap = (uint32_t)cap;
  return t;
}

void tdist__trace_free(tdist__trace_t *t) {
  if (!t) return;
  tdist__free(t);
}

/* The slot of op seq: a mask where cap is a power of two (the default
 * 1024), since a 64-bit division on every recorded op cost as much as
 * the record's stores. */
static inline uint32_t slot_of(const tdist__trace_t *t, uint64_t seq) {
  return (t->cap & (t->cap - 1)) ? (uint32_t)(seq % t->cap) : (uint32_t)seq & (t->cap - 1);
}

static void fill(tdist__trace_rec_t *r, const tdist_work_t *w, int state) {
  r->seq = w->bop.seq;
  r->op = (int16_t)w->args.type;
  r->dtype = (int16_t)w->args.dtype;
  r->redop = (int16_t)w->args.redop;
  r->count = w->args.type == TDIST_OP_BATCH_P2P ? (uint64_t)w->args.np2p : w->args.count;
  /* the root of a rooted collective, the peer of a send/recv (tdist/backend.h,
   * tdist_backend_op_props) */
  r->root =
      (tdist_backend_op_props(w->args.type) & (TDIST_BACKEND_OP_ROOTED | TDIST_BACKEND_OP_PEER))
          ? w->args.root
          : -1;
  r->t_enqueue_ns = w->t_enqueue_ns;
  r->t_start_ns = w->t_start_ns;
  r->t_end_ns = w->t_end_ns;
  r->state = (int16_t)state;
  r->status = state >= TDIST_WORK_COMPLETED ? w->status : 0;
}

static void start_locked(tdist__trace_t *t, const tdist_work_t *w) {
  uint64_t seq = w->bop.seq;
  fill(&t->recs[slot_of(t, seq)], w, TDIST_WORK_RUNNING);
  if (seq + 1 > t->recorded) t->recorded = seq + 1;
}

static void end_locked(tdist__trace_t *t, const tdist_work_t *w) {
  uint64_t seq = w->bop.seq;
  tdist__trace_rec_t *r = &t->recs[slot_of(t, seq)];
  if (r->seq != seq || r->t_enqueue_ns != w->t_enqueue_ns) {
    if (seq + t->cap < t->recorded) return; /* older than the ring */
    if (seq + 1 > t->recorded) t->recorded = seq + 1;
  }
  fill(r, w, tdist__work_state_for(w->status)); /* published after this */
}

void tdist__trace_start(tdist__trace_t *t, const tdist_work_t *w) {
  if (!t) return;
  tdist__spin_lock(&t->mu);
  start_locked(t, w);
  tdist__spin_unlock(&t->mu);
}

void tdist__trace_end(tdist__trace_t *t, const tdist_work_t *w) {
  if (!t) return;
  tdist__spin_lock(&t->mu);
  end_locked(t, w);
  tdist__spin_unlock(&t->mu);
}

void tdist__trace_whole(tdist__trace_t *t, const tdist_work_t *w) {
  if (!t) return;
  tdist__spin_lock(&t->mu);
  /* Later ops may have started meanwhile (other threads'): this one only
   * fills its own slot, and none at all once it is older than the ring. */
  uint64_t seq = w->bop.seq;
  if (seq + t->cap >= t->recorded) { /* start and end at once: one fill */
    fill(&t->recs[slot_of(t, seq)], w, tdist__work_state_for(w->status));
    if (seq + 1 > t->recorded) t->recorded = seq + 1;
  }
  tdist__spin_unlock(&t->mu);
}

static const char *state_name(int s) {
  static const char *names[] = {"queued", "running", "completed", "failed", "timed_out", "aborted"};
  return (s >= 0 && s <= 5) ? names[s] : "unknown";
}

static int64_t wall_us(int64_t mono_ns, int64_t offset_ns) {
  return mono_ns ? (mono_ns + offset_ns) / 1000 : 0;
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
  /* Not the lock word itself: a recorder exchanges it meanwhile. */
  memset(&d->t->mu, 0, sizeof(d->t->mu)); /* the copy's lock is never used */
  tdist__spin_lock((tdist__spin_t *)&t->mu);
  d->t->recorded = t->recorded;
  d->t->cap = t->cap;
  memcpy(d->t->recs, t->recs, sizeof(tdist__trace_rec_t) * t->cap);
  tdist__spin_unlock((tdist__spin_t *)&t->mu);
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

/* ---- the dump: JSON Lines written with json-c ---------------------------------- */

/* Add member `key` = v to o (v NULL: json-c ran out of memory). 0 or -1; v
 * is o's from then on, or freed. */
static int put(json_object *o, const char *key, json_object *v) {
  if (!v) return -1;
  if (json_object_object_add(o, key, v) != 0) {
    json_object_put(v);
    return -1;
  }
  return 0;
}

/* The meta line: the group and this process, what the ring's window is, and
 * how many entry lines follow (so a reader can tell a file cut between two
 * lines). NULL when out of memory. */
static json_object *meta_line(const tdist__trace_dump_t *d, int64_t dumped_us, int64_t nentries) {
  const tdist__trace_t *t = d->t;
  const tdist__trace_meta_t *g = &d->m;
  char host[64] = "", uid[24];
  gethostname(host, sizeof(host) - 1);
  snprintf(uid, sizeof(uid), "%016llx", (unsigned long long)g->uid);
  uint64_t dropped = t->recorded > t->cap ? t->recorded - t->cap : 0;
  json_object *o = json_object_new_object(), *grp = json_object_new_object();
  json_object *ranks = json_object_new_array();
  int bad = !o || !grp || !ranks;
  for (int i = 0; !bad && i < g->size; i++) {
    json_object *r = json_object_new_int(g->ranks[i]);
    if (!r || json_object_array_add(ranks, r) != 0) bad = 1, json_object_put(r);
  }
  if (bad) goto fail;
  bad |= put(grp, "name", json_object_new_string(g->name));
  bad |= put(grp, "uid", json_object_new_string(uid));
  bad |= put(grp, "rank", json_object_new_int(g->rank));
  bad |= put(grp, "size", json_object_new_int(g->size));
  bad |= put(grp, "ranks", ranks);
  ranks = NULL;
  bad |= put(o, "version", json_object_new_int(2));
  bad |= put(o, "job", json_object_new_string(g->job[0] ? g->job : "-"));
  bad |= put(o, "host", json_object_new_string(host));
  bad |= put(o, "pid", json_object_new_int((int)getpid()));
  bad |= put(o, "global_rank", json_object_new_int(g->ranks[g->rank]));
  bad |= put(o, "backend", json_object_new_string(g->backend));
  bad |= put(o, "group", grp);
  grp = NULL;
  bad |= put(o, "next_seq", json_object_new_int64((int64_t)g->next_seq));
  bad |= put(o, "recorded", json_object_new_int64((int64_t)t->recorded));
  bad |= put(o, "dropped", json_object_new_int64((int64_t)dropped));
  bad |= put(o, "aborted", json_object_new_boolean(g->aborted));
  bad |= put(o, "abort_reason", json_object_new_string(g->aborted ? g->abort_reason : ""));
  bad |= put(o, "dumped_us", json_object_new_int64(dumped_us));
  bad |= put(o, "nentries", json_object_new_int64(nentries));
  if (bad) goto fail;
  return o;
fail:
  json_object_put(ranks);
  json_object_put(grp);
  json_object_put(o);
  return NULL;
}

/* One record's line. NULL when out of memory. */
static json_object *entry_line(const tdist__trace_rec_t *r, int64_t offset) {
  json_object *o = json_object_new_object();
  if (!o) return NULL;
  int bad = 0;
  bad |= put(o, "seq", json_object_new_int64((int64_t)r->seq));
  bad |= put(o, "op", json_object_new_string(tdist_op_name(r->op)));
  bad |= put(o, "dtype", json_object_new_string(tdist_dtype_name(r->dtype)));
  bad |= put(o, "redop", json_object_new_string(tdist_redop_name(r->redop)));
  bad |= put(o, "count", json_object_new_int64((int64_t)r->count));
  bad |= put(o, "root", json_object_new_int(r->root));
  bad |= put(o, "state", json_object_new_string(state_name(r->state)));
  bad |= put(
      o, "status",
      json_object_new_string(r->state >= TDIST_WORK_COMPLETED ? tdist_err_name(r->status) : ""));
  bad |= put(o, "t_enqueue_us", json_object_new_int64(wall_us(r->t_enqueue_ns, offset)));
  bad |= put(o, "t_start_us", json_object_new_int64(wall_us(r->t_start_ns, offset)));
  bad |= put(o, "t_end_us", json_object_new_int64(wall_us(r->t_end_ns, offset)));
  if (!bad) return o;
  json_object_put(o);
  return NULL;
}

/* Write o (NULL: it could not be built) as one line and free it. 0, or -1:
 * out of memory (*oom set) or a write error. */
static int put_line(FILE *f, json_object *o, int *oom) {
  const char *s =
      o ? json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE)
        : NULL;
  int rc = s && fputs(s, f) != EOF && fputc('\n', f) != EOF ? 0 : -1;
  if (!s) *oom = 1;
  json_object_put(o);
  return rc;
}

/* A record that is in the dump: in the ring at its slot, and submitted (a
 * slot whose submit failed keeps an older seq, or none). */
static const tdist__trace_rec_t *kept(const tdist__trace_t *t, uint64_t s) {
  const tdist__trace_rec_t *r = &t->recs[slot_of(t, s)];
  return r->seq == s && r->t_enqueue_ns ? r : NULL;
}

/* Caller's thread (tdist_dump_trace) or worker thread (a failure dump),
 * never the progress thread: write a snapshot to `path`, through a
 * temporary file renamed into place, so a reader never sees half a dump.
 * One line is built at a time (json-c objects
 * of one record, freed once written), so the memory it takes does not grow
 * with the ring. */
static int write_dump(const tdist__trace_dump_t *d, const char *path) {
  const tdist__trace_t *t = d->t;
  /* Unique per write, not only per process: the worker thread's failure
   * dump and a caller's tdist_dump_trace may write the same path at once
   * (sharing one temporary name, one of them failed its rename with IO). */
  static _Atomic unsigned writes;
  char tmp[600];
  int oom = 0, rc;
  snprintf(tmp, sizeof(tmp), "%s.tmp%d.%u", path, (int)getpid(), atomic_fetch_add(&writes, 1));
  FILE *f = fopen(tmp, "w");
  if (!f) return tdist__error(TDIST_ERR_IO, "trace: cannot write '%s': %s", path, strerror(errno));
  struct timespec rt;
  clock_gettime(CLOCK_REALTIME, &rt);
  int64_t offset = (int64_t)rt.tv_sec * 1000000000 + rt.tv_nsec - tdist__now_ns();
  uint64_t first = t->recorded > t->cap ? t->recorded - t->cap : 0;
  int64_t n = 0;
  for (uint64_t s = first; s < t->recorded; s++)
    n += kept(t, s) != NULL;
  if (put_line(f, meta_line(d, wall_us(tdist__now_ns(), offset), n), &oom) != 0) goto fail;
  for (uint64_t s = first; s < t->recorded; s++) {
    const tdist__trace_rec_t *r = kept(t, s);
    if (r && put_line(f, entry_line(r, offset), &oom) != 0) goto fail;
  }
  int bad = ferror(f);
  rc = fclose(f);
  f = NULL;
  if (rc != 0 || bad || rename(tmp, path) != 0) goto fail;
  TDIST_INFO(CORE, "flight recorder of group '%s' written to %s", d->m.name, path);
  return 0;
fail:
  if (f) fclose(f);
  unlink(tmp);
  if (oom) return tdist__error(TDIST_ERR_NO_MEMORY, "trace: out of memory writing '%s'", path);
  return tdist__error(TDIST_ERR_IO, "trace: error writing '%s'", path);
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
