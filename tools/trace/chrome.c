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
#include <stdlib.h>
#include <string.h>

#include "trace_tool.h"

static void jstr(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\')
      fprintf(f, "\\%c", c);
    else if (c < 0x20 || c >= 0x7f)
      fprintf(f, "\\u%04x", c < 0x20 ? c : '?');
    else
      fputc(c, f);
  }
  fputc('"', f);
}

/* Start an event: a separator before all but the first. */
static void ev(FILE *f, int *nev) {
  if ((*nev)++) fputs(",\n", f);
}

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

static void op_event(FILE *f, int *nev, const tt_dump_t *d, int tid, const tt_entry_t *e,
                     int64_t base) {
  int64_t from = e->t_start_us ? e->t_start_us : e->t_enqueue_us;
  int64_t to = e->t_end_us ? e->t_end_us : d->dumped_us;
  if (to < from) to = from;
  ev(f, nev);
  fprintf(f, "{\"name\": \"%s seq %lld\", \"cat\": ", e->op, (long long)e->seq);
  jstr(f, d->group_name);
  fprintf(f,
          ", \"ph\": \"X\", \"pid\": %lld, \"tid\": %d, \"ts\": %lld, \"dur\": %lld, "
          "\"args\": {\"seq\": %lld, \"dtype\": \"%s\", \"count\": %lld, \"root\": %lld, ",
          (long long)d->global_rank, tid, (long long)(from - base), (long long)(to - from),
          (long long)e->seq, e->dtype, (long long)e->count, (long long)e->root);
  if (tt_op_has_redop(e->op)) fprintf(f, "\"redop\": \"%s\", ", e->redop);
  fprintf(f, "\"state\": \"%s\", \"status\": \"%s\", \"queued_us\": %lld%s}}", e->state, e->status,
          (long long)(e->t_start_us ? e->t_start_us - e->t_enqueue_us : 0),
          e->t_end_us ? "" : ", \"ended\": false");
  if (tt_state_failed(e->state)) {
    ev(f, nev);
    fprintf(f, "{\"name\": \"%s seq %lld %s\", \"cat\": ", e->state, (long long)e->seq, e->op);
    jstr(f, d->group_name);
    fprintf(f,
            ", \"ph\": \"i\", \"s\": \"t\", \"pid\": %lld, \"tid\": %d, \"ts\": %lld, "
            "\"args\": {\"status\": \"%s\"}}",
            (long long)d->global_rank, tid, (long long)(to - base), e->status);
  }
}

int tt_write_chrome(tt_dump_t **dumps, int n, const char *only, const char *path) {
  int rc = -1;
  const char **uids = calloc((size_t)(n ? n : 1), sizeof(*uids));
  int64_t *named = calloc((size_t)(n ? n : 1), sizeof(*named));
  int nuids = 0, nnamed = 0, nev = 0;
  FILE *f = fopen(path, "w");
  if (!uids || !named || !f) {
    fprintf(stderr, "tdist-trace: cannot write %s\n", path);
    goto done;
  }
  int64_t base = base_time(dumps, n, only);
  fprintf(f,
          "{\"displayTimeUnit\": \"ms\", \"otherData\": {\"tool\": \"tdist-trace\", "
          "\"base_us\": %lld},\n\"traceEvents\": [\n",
          (long long)base);
  for (int i = 0; i < n; i++) {
    const tt_dump_t *d = dumps[i];
    if (!tt_group_selected(d, only)) continue;
    int tid = 0, seen = 0;
    for (int k = 0; k < nuids && !tid; k++)
      if (!strcmp(uids[k], d->uid)) tid = k + 1;
    if (!tid) {
      uids[nuids++] = d->uid;
      tid = nuids;
    }
    for (int k = 0; k < nnamed && !seen; k++)
      seen = named[k] == d->global_rank;
    if (!seen) { /* one process per rank, named once */
      named[nnamed++] = d->global_rank;
      char name[200];
      snprintf(name, sizeof(name), "rank %lld (%s:%lld)", (long long)d->global_rank, d->host,
               (long long)d->pid);
      ev(f, &nev);
      fprintf(f,
              "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %lld, \"tid\": 0, "
              "\"args\": {\"name\": ",
              (long long)d->global_rank);
      jstr(f, name);
      fprintf(f,
              "}},\n{\"name\": \"process_sort_index\", \"ph\": \"M\", \"pid\": %lld, "
              "\"tid\": 0, \"args\": {\"sort_index\": %lld}}",
              (long long)d->global_rank, (long long)d->global_rank);
    }
    ev(f, &nev);
    fprintf(f,
            "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %lld, \"tid\": %d, "
            "\"args\": {\"name\": ",
            (long long)d->global_rank, tid);
    char tname[320];
    snprintf(tname, sizeof(tname), "group %s (%s)", d->group_name, d->uid);
    jstr(f, tname);
    fprintf(f, "}}");
    for (int64_t k = 0; k < d->nentries; k++)
      op_event(f, &nev, d, tid, &d->entries[k], base);
  }
  fprintf(f, "\n]}\n");
  rc = ferror(f) ? -1 : 0;
  if (fclose(f) != 0) rc = -1;
  f = NULL;
  if (rc) fprintf(stderr, "tdist-trace: error writing %s\n", path);
done:
  if (f) fclose(f);
  free(uids);
  free(named);
  return rc;
}
