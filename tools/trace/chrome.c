/*
 * chrome.c - write the dumps as a Chrome trace-event file (the JSON object
 * form, {"traceEvents": [...]}) that Perfetto and chrome://tracing open.
 *
 * Layout: one process per rank (pid = global rank, named "rank N
 * (host:pid)"), one thread per group (tid = 1 + the group's index in the
 * order first seen, named "group NAME (uid)"). Each op is a complete event
 * ("ph": "X") from its start (or enqueue, if it never started) to its end,
 * or to the dump time if it never ended. Ops that failed, timed out or were
 * aborted also get an instant event at their end. Timestamps are
 * microseconds relative to the earliest time in the selected dumps.
 */
#include <json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trace_tool.h"

static int64_t base_time(tt_dump_t **dumps, int n, const char *only) {
  int64_t base = INT64_MAX;
  for (int i = 0; i < n; i++) {
    const tt_dump_t *d = dumps[i];
    if (!tt_group_selected(d, only)) continue;
    if (d->dumped_us && d->dumped_us < base) base = d->dumped_us;
    for (int64_t k = 0; k < d->nentries; k++) {
      const tt_entry_t *e = &d->entries[k];
      if (e->t_enqueue_us && e->t_enqueue_us < base) base = e->t_enqueue_us;
      if (e->t_start_us && e->t_start_us < base) base = e->t_start_us;
    }
  }
  return base == INT64_MAX ? 0 : base;
}

/* json-c builders: every string goes through json-c's escaping, so a dump's
 * text (a group's name, a host) cannot break the file. Each add takes the
 * new value's reference; the root's put at the end frees the whole tree. */
static void put_str(json_object *o, const char *k, const char *v) {
  json_object_object_add(o, k, json_object_new_string(v ? v : ""));
}
static void put_int(json_object *o, const char *k, int64_t v) {
  json_object_object_add(o, k, json_object_new_int64(v));
}

/* A new event {"name", "ph", "pid", "tid"} appended to `events`. */
static json_object *event(json_object *events, const char *name, const char *ph, int64_t pid,
                          int tid) {
  json_object *o = json_object_new_object();
  if (!o) return NULL;
  put_str(o, "name", name);
  put_str(o, "ph", ph);
  put_int(o, "pid", pid);
  put_int(o, "tid", tid);
  json_object_array_add(events, o);
  return o;
}

/* A metadata event naming a process or a thread ("process_name" ...). */
static void meta(json_object *events, const char *what, int64_t pid, int tid, const char *key,
                 json_object *val) {
  json_object *o = event(events, what, "M", pid, tid);
  json_object *args = json_object_new_object();
  json_object_object_add(args, key, val);
  if (o)
    json_object_object_add(o, "args", args);
  else
    json_object_put(args);
}

static void op_event(json_object *events, const tt_dump_t *d, int tid, const tt_entry_t *e,
                     int64_t base) {
  int64_t from = e->t_start_us ? e->t_start_us : e->t_enqueue_us;
  int64_t to = e->t_end_us ? e->t_end_us : d->dumped_us;
  if (to < from) to = from;
  char name[200];
  snprintf(name, sizeof(name), "%s seq %lld", e->op, (long long)e->seq);
  json_object *o = event(events, name, "X", d->global_rank, tid);
  if (!o) return;
  put_str(o, "cat", d->group_name);
  put_int(o, "ts", from - base);
  put_int(o, "dur", to - from);
  json_object *args = json_object_new_object();
  put_int(args, "seq", e->seq);
  put_str(args, "dtype", e->dtype);
  put_int(args, "count", e->count);
  put_int(args, "root", e->root);
  if (tt_op_has_redop(e->op)) put_str(args, "redop", e->redop);
  put_str(args, "state", e->state);
  put_str(args, "status", e->status);
  put_int(args, "queued_us", e->t_start_us ? e->t_start_us - e->t_enqueue_us : 0);
  if (!e->t_end_us) json_object_object_add(args, "ended", json_object_new_boolean(0));
  json_object_object_add(o, "args", args);
  if (!tt_state_failed(e->state)) return;
  snprintf(name, sizeof(name), "%s seq %lld %s", e->state, (long long)e->seq, e->op);
  o = event(events, name, "i", d->global_rank, tid);
  if (!o) return;
  put_str(o, "s", "t");
  put_str(o, "cat", d->group_name);
  put_int(o, "ts", to - base);
  args = json_object_new_object();
  put_str(args, "status", e->status);
  json_object_object_add(o, "args", args);
}

/* The process (one per rank, named once) and thread (one per group uid)
 * of dump d; returns the thread id. */
static int name_rank_and_group(json_object *events, const tt_dump_t *d, const char **uids,
                               int *nuids, int64_t *named, int *nnamed) {
  int tid = 0, seen = 0;
  for (int k = 0; k < *nuids && !tid; k++)
    if (!strcmp(uids[k], d->uid)) tid = k + 1;
  if (!tid) {
    uids[(*nuids)++] = d->uid;
    tid = *nuids;
  }
  for (int k = 0; k < *nnamed && !seen; k++)
    seen = named[k] == d->global_rank;
  if (!seen) {
    named[(*nnamed)++] = d->global_rank;
    char name[200];
    snprintf(name, sizeof(name), "rank %lld (%s:%lld)", (long long)d->global_rank, d->host,
             (long long)d->pid);
    meta(events, "process_name", d->global_rank, 0, "name", json_object_new_string(name));
    meta(events, "process_sort_index", d->global_rank, 0, "sort_index",
         json_object_new_int64(d->global_rank));
  }
  char tname[320];
  snprintf(tname, sizeof(tname), "group %s (%s)", d->group_name, d->uid);
  meta(events, "thread_name", d->global_rank, tid, "name", json_object_new_string(tname));
  return tid;
}

int tt_write_chrome(tt_dump_t **dumps, int n, const char *only, const char *path) {
  int rc = -1;
  const char **uids = calloc((size_t)(n ? n : 1), sizeof(*uids));
  int64_t *named = calloc((size_t)(n ? n : 1), sizeof(*named));
  int nuids = 0, nnamed = 0;
  json_object *root = json_object_new_object();
  json_object *events = json_object_new_array();
  json_object *other = json_object_new_object();
  if (!uids || !named || !root || !events || !other) {
    fprintf(stderr, "tdist-trace: out of memory writing %s\n", path);
    json_object_put(events);
    json_object_put(other);
    goto done;
  }
  int64_t base = base_time(dumps, n, only);
  put_str(root, "displayTimeUnit", "ms");
  put_str(other, "tool", "tdist-trace");
  put_int(other, "base_us", base);
  json_object_object_add(root, "otherData", other);
  json_object_object_add(root, "traceEvents", events);
  for (int i = 0; i < n; i++) {
    const tt_dump_t *d = dumps[i];
    if (!tt_group_selected(d, only)) continue;
    int tid = name_rank_and_group(events, d, uids, &nuids, named, &nnamed);
    for (int64_t k = 0; k < d->nentries; k++)
      op_event(events, d, tid, &d->entries[k], base);
  }
  /* Plain: no indentation, so a trace of many ops stays small. */
  if (json_object_to_file_ext(path, root,
                              JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE) != 0) {
    fprintf(stderr, "tdist-trace: error writing %s: %s\n", path, json_util_get_last_err());
    goto done;
  }
  rc = 0;
done:
  json_object_put(root);
  free(uids);
  free(named);
  return rc;
}
