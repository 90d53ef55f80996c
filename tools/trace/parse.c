/*
 * parse.c - reads one flight-recorder dump with json-c.
 *
 * A dump is JSON Lines (write_dump() in src/core/trace/trace.c): line 1 is the
 * meta line (the group, the writing process, the ring's window, how many
 * entry lines follow), then one entry object per line, oldest first. Each
 * line is parsed on its own by a strict json-c tokener, so an error names
 * the file and line and a bad line costs only itself. Unknown keys are
 * ignored; known keys must have the right type, and the required ones must
 * be there. "job" is optional (job "-"), but when present it must be a valid
 * job id.
 *
 * What is rejected and what is skipped:
 *   - a bad meta line rejects the file (there is no group to attach entries
 *     to), a cut one too;
 *   - an entry line that is not one JSON object, or not a valid entry (a
 *     missing field, a value of the wrong type, out of order, outside the
 *     ring's window), is skipped with a warning; the seqs between the entries
 *     around it are unknown for this rank (a hole), not missing;
 *   - a last line without its '\n' that does not parse was cut by a killed
 *     writer or a short copy: skipped with a warning, the dump marked truncated;
 *   - fewer entry lines than the meta line announced: the file was cut
 *     between lines, marked truncated.
 * A truncated dump's seqs after its last entry count as unknown.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <json.h>

#include "trace_tool.h"

typedef struct ck {
  char why[200];
} ck_t;

#define FAIL(ck, ...) (snprintf((ck)->why, sizeof((ck)->why), __VA_ARGS__), -1)
#define FAIL_NULL(ck, ...) (snprintf((ck)->why, sizeof((ck)->why), __VA_ARGS__), NULL)

#if JSON_C_VERSION_NUM >= ((0 << 16) | (15 << 8))
#define PARSE_END(tok) json_tokener_get_parse_end(tok)
#else
#define PARSE_END(tok) ((size_t)(tok)->char_offset)
#endif

/* ---- values -------------------------------------------------------------------- */

/* Member `key` of o, of json type `type`; NULL (why set) when absent or of
 * another type. */
static json_object *get(json_object *o, const char *key, json_type type, const char *what,
                        ck_t *ck) {
  json_object *v;
  if (!json_object_object_get_ex(o, key, &v) || !v) return FAIL_NULL(ck, "no \"%s\"", key);
  if (!json_object_is_type(v, type)) return FAIL_NULL(ck, "\"%s\": expected %s", key, what);
  return v;
}

static int get_int(json_object *o, const char *key, int64_t *out, ck_t *ck) {
  json_object *v = get(o, key, json_type_int, "an integer", ck);
  if (!v) return -1;
  *out = json_object_get_int64(v);
  return 0;
}

/* A string member: NULL when absent, of another type or holding a NUL. */
static const char *get_str(json_object *o, const char *key, ck_t *ck) {
  json_object *v = get(o, key, json_type_string, "a string", ck);
  if (!v) return NULL;
  const char *s = json_object_get_string(v);
  if (strlen(s) != (size_t)json_object_get_string_len(v))
    return FAIL_NULL(ck, "\"%s\": NUL character in the string", key);
  return s;
}

static int str_into(json_object *o, const char *key, char *buf, size_t cap, ck_t *ck) {
  const char *s = get_str(o, key, ck);
  if (!s) return -1;
  if (strlen(s) >= cap) return FAIL(ck, "\"%s\" is too long", key);
  memcpy(buf, s, strlen(s) + 1);
  return 0;
}

static int str_dup(json_object *o, const char *key, char **out, ck_t *ck) {
  const char *s = get_str(o, key, ck);
  if (!s) return -1;
  free(*out);
  *out = strdup(s);
  return *out ? 0 : FAIL(ck, "out of memory");
}

/* One line (its '\n' already removed) as one JSON object, or NULL with
 * why set. */
static json_object *parse_line(json_tokener *tok, const char *s, size_t len, ck_t *ck) {
  if (strlen(s) != len) return FAIL_NULL(ck, "NUL byte in the line");
  if (len == 0) return FAIL_NULL(ck, "empty line");
  if (len > (size_t)INT32_MAX) return FAIL_NULL(ck, "line too long");
  json_tokener_reset(tok);
  json_object *o = json_tokener_parse_ex(tok, s, (int)len);
  enum json_tokener_error e = json_tokener_get_error(tok);
  if (e == json_tokener_continue) {
    json_object_put(o);
    return FAIL_NULL(ck, "the line ends inside a JSON value");
  }
  if (!o || e != json_tokener_success) {
    json_object_put(o);
    return FAIL_NULL(ck, "not JSON (json-c: %s at byte %zu)", json_tokener_error_desc(e),
                     PARSE_END(tok));
  }
  for (size_t i = PARSE_END(tok); i < len; i++)
    if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r') {
      json_object_put(o);
      return FAIL_NULL(ck, "text after the JSON object (byte %zu)", i);
    }
  if (!json_object_is_type(o, json_type_object)) {
    json_object_put(o);
    return FAIL_NULL(ck, "not a JSON object");
  }
  return o;
}

/* ---- entries ------------------------------------------------------------------- */

static const char *const states[] = {"queued", "running",   "completed",
                                     "failed", "timed_out", "aborted"};

/* An entry line's object into e, checked against the dump so far. */
static int entry(json_object *o, const tt_dump_t *d, tt_entry_t *e, ck_t *ck) {
  memset(e, 0, sizeof(*e));
  if (get_int(o, "seq", &e->seq, ck) || str_into(o, "op", e->op, sizeof(e->op), ck) ||
      str_into(o, "dtype", e->dtype, sizeof(e->dtype), ck) ||
      str_into(o, "redop", e->redop, sizeof(e->redop), ck) || get_int(o, "count", &e->count, ck) ||
      get_int(o, "root", &e->root, ck) || str_into(o, "state", e->state, sizeof(e->state), ck) ||
      str_into(o, "status", e->status, sizeof(e->status), ck) ||
      get_int(o, "t_enqueue_us", &e->t_enqueue_us, ck) ||
      get_int(o, "t_start_us", &e->t_start_us, ck) || get_int(o, "t_end_us", &e->t_end_us, ck))
    return -1;
  int known = 0;
  for (size_t i = 0; i < sizeof(states) / sizeof(states[0]); i++)
    known |= !strcmp(e->state, states[i]);
  if (!known) return FAIL(ck, "unknown state \"%s\"", e->state);
  if (e->seq < 0 || e->count < 0 || e->root < -1 || e->t_enqueue_us < 0 || e->t_start_us < 0 ||
      e->t_end_us < 0)
    return FAIL(ck, "negative seq, count or time");
  if (d->nentries && e->seq <= d->entries[d->nentries - 1].seq)
    return FAIL(ck, "entries out of order (seq %lld after seq %lld)", (long long)e->seq,
                (long long)d->entries[d->nentries - 1].seq);
  if (e->seq < d->dropped || e->seq >= d->recorded)
    return FAIL(ck, "entry seq %lld outside the ring's window [%lld, %lld)", (long long)e->seq,
                (long long)d->dropped, (long long)d->recorded);
  return 0;
}

static int push_entry(tt_dump_t *d, const tt_entry_t *e) {
  if (d->nentries == d->cap_entries) {
    int64_t cap = d->cap_entries ? d->cap_entries * 2 : 64;
    tt_entry_t *n = realloc(d->entries, sizeof(*n) * (size_t)cap);
    if (!n) return -1;
    d->entries = n;
    d->cap_entries = cap;
  }
  d->entries[d->nentries++] = *e;
  return 0;
}

static int push_hole(tt_dump_t *d, int64_t lo, int64_t hi) {
  if (d->nholes == d->cap_holes) {
    int64_t cap = d->cap_holes ? d->cap_holes * 2 : 8;
    tt_hole_t *n = realloc(d->holes, sizeof(*n) * (size_t)cap);
    if (!n) return -1;
    d->holes = n;
    d->cap_holes = cap;
  }
  d->holes[d->nholes++] = (tt_hole_t){lo, hi};
  return 0;
}

/* ---- the meta line ------------------------------------------------------------- */

static int ranks_array(json_object *grp, tt_dump_t *d, ck_t *ck) {
  json_object *a = get(grp, "ranks", json_type_array, "an array", ck);
  if (!a) return -1;
  size_t n = json_object_array_length(a);
  if (n > TT_MAX_GROUP_SIZE) return FAIL(ck, "\"ranks\": too many ranks");
  d->ranks = malloc(sizeof(int) * (n ? n : 1));
  if (!d->ranks) return FAIL(ck, "out of memory");
  for (size_t i = 0; i < n; i++) {
    json_object *v = json_object_array_get_idx(a, i);
    if (!json_object_is_type(v, json_type_int)) return FAIL(ck, "\"ranks\": expected integers");
    int64_t r = json_object_get_int64(v);
    if (r < 0 || r > INT32_MAX) return FAIL(ck, "\"ranks\": bad rank %lld", (long long)r);
    d->ranks[d->nranks++] = (int)r;
  }
  return 0;
}

/* "job": 1..TT_JOB_MAX printable ASCII characters, no '"' (it is part of the
 * default file name and of the tool's messages). Absent: "-". */
static int job_id(json_object *o, tt_dump_t *d, ck_t *ck) {
  if (!json_object_object_get_ex(o, "job", NULL)) {
    memcpy(d->job, "-", 2);
    return 0;
  }
  if (str_into(o, "job", d->job, sizeof(d->job), ck)) return -1;
  if (!d->job[0]) return FAIL(ck, "\"job\": empty job id");
  for (const char *c = d->job; *c; c++)
    if (*c < 0x20 || *c > 0x7e || *c == '"')
      return FAIL(ck, "\"job\": character 0x%02x in the job id", (unsigned char)*c);
  return 0;
}

static int meta(json_object *o, tt_dump_t *d, int64_t *nentries, ck_t *ck) {
  json_object *grp, *v;
  if (get_int(o, "version", &d->version, ck)) return -1;
  if (d->version != 2) return FAIL(ck, "unsupported version %lld", (long long)d->version);
  if (job_id(o, d, ck)) return -1;
  if (json_object_object_get_ex(o, "host", NULL) &&
      str_into(o, "host", d->host, sizeof(d->host), ck))
    return -1;
  if (json_object_object_get_ex(o, "backend", NULL) &&
      str_into(o, "backend", d->backend, sizeof(d->backend), ck))
    return -1;
  if (get_int(o, "pid", &d->pid, ck) || get_int(o, "global_rank", &d->global_rank, ck) ||
      !(grp = get(o, "group", json_type_object, "an object", ck)) ||
      str_dup(grp, "name", &d->group_name, ck) ||
      str_into(grp, "uid", d->uid, sizeof(d->uid), ck) ||
      get_int(grp, "rank", &d->group_rank, ck) || get_int(grp, "size", &d->group_size, ck) ||
      ranks_array(grp, d, ck) || get_int(o, "next_seq", &d->next_seq, ck) ||
      get_int(o, "recorded", &d->recorded, ck) || get_int(o, "dropped", &d->dropped, ck) ||
      !(v = get(o, "aborted", json_type_boolean, "true or false", ck)) ||
      get_int(o, "dumped_us", &d->dumped_us, ck) || get_int(o, "nentries", nentries, ck))
    return -1;
  d->aborted = json_object_get_boolean(v);
  if (json_object_object_get_ex(o, "abort_reason", NULL) &&
      str_dup(o, "abort_reason", &d->abort_reason, ck))
    return -1;
  if (d->group_size < 1 || d->group_size > TT_MAX_GROUP_SIZE || d->nranks != d->group_size)
    return FAIL(ck, "group size %lld does not match its ranks list (%lld ranks)",
                (long long)d->group_size, (long long)d->nranks);
  if (d->group_rank < 0 || d->group_rank >= d->group_size)
    return FAIL(ck, "group rank %lld outside the group", (long long)d->group_rank);
  if (d->ranks[d->group_rank] != d->global_rank)
    return FAIL(ck, "ranks[%lld] is %d but global_rank is %lld", (long long)d->group_rank,
                d->ranks[d->group_rank], (long long)d->global_rank);
  if (!d->uid[0]) return FAIL(ck, "empty group uid");
  if (d->next_seq < 0 || d->recorded < 0 || d->dropped < 0 || d->dropped > d->recorded ||
      *nentries < 0 || *nentries > d->recorded - d->dropped)
    return FAIL(ck, "inconsistent next_seq / recorded / dropped / nentries");
  if (!d->abort_reason && !(d->abort_reason = strdup(""))) return FAIL(ck, "out of memory");
  return 0;
}

/* ---- file ---------------------------------------------------------------------- */

void tt_dump_free(tt_dump_t *d) {
  if (!d) return;
  free(d->path);
  free(d->group_name);
  free(d->ranks);
  free(d->abort_reason);
  free(d->entries);
  free(d->holes);
  free(d);
}

int tt_parse_file(const char *path, FILE *err, tt_dump_t **out) {
  ck_t ck = {{0}};
  char *buf = NULL;
  size_t cap = 0;
  ssize_t len;
  int64_t line = 0, nentries = 0, hole_lo = -1;
  int rc = -1;
  tt_dump_t *d = calloc(1, sizeof(*d));
  json_tokener *tok = json_tokener_new();
  json_object *o = NULL;
  FILE *f = fopen(path, "r");
  if (!d || !tok || !f) {
    fprintf(err, "tdist-trace: %s: %s\n", path, d && tok ? strerror(errno) : "out of memory");
    goto done;
  }
  json_tokener_set_flags(tok, JSON_TOKENER_STRICT);
  if (!(d->path = strdup(path))) goto oom;
  while ((len = getline(&buf, &cap, f)) >= 0) {
    line++;
    int nl = len > 0 && buf[len - 1] == '\n';
    if (nl) buf[--len] = '\0';
    o = parse_line(tok, buf, (size_t)len, &ck);
    if (line == 1) { /* the meta line: the file is nothing without it */
      if (!o || meta(o, d, &nentries, &ck)) {
        if (!strncmp(buf, "{\"version\": 1,", 14))
          fprintf(err,
                  "tdist-trace: %s:1: a version 1 dump (one JSON object over several "
                  "lines, written by an older tdist); this tdist-trace reads version 2\n",
                  path);
        else
          fprintf(err, "tdist-trace: %s:1: %s%s%s\n", path,
                  !o && buf[0] != '{' ? "not a flight-recorder dump: " : "", ck.why,
                  !o && !nl ? " (the file ends inside the meta line: truncated?)" : "");
        goto done;
      }
    } else {
      tt_entry_t e;
      if (o && entry(o, d, &e, &ck) == 0) {
        if (hole_lo >= 0 && push_hole(d, hole_lo, e.seq)) goto oom;
        if (push_entry(d, &e)) goto oom;
        hole_lo = -1;
      } else if (!o && !nl) { /* the writer ends every line: cut (a killed copy) */
        fprintf(err,
                "tdist-trace: warning: %s:%lld: incomplete last line skipped (the file is "
                "truncated); %lld entries kept\n",
                path, (long long)line, (long long)d->nentries);
        d->truncated = 1;
      } else {
        fprintf(err, "tdist-trace: warning: %s:%lld: unreadable line skipped: %s\n", path,
                (long long)line, ck.why);
        d->skipped++;
        if (hole_lo < 0) hole_lo = d->nentries ? d->entries[d->nentries - 1].seq + 1 : d->dropped;
      }
    }
    json_object_put(o);
    o = NULL;
  }
  if (line == 0) {
    fprintf(err, "tdist-trace: %s: empty file\n", path);
    goto done;
  }
  if (hole_lo >= 0) d->truncated = 1;         /* nothing readable after the hole */
  if (!d->truncated && line - 1 < nentries) { /* cut between two lines */
    fprintf(err,
            "tdist-trace: warning: %s:%lld: the file ends after %lld of %lld entry lines "
            "(truncated); %lld entries kept\n",
            path, (long long)line, (long long)line - 1, (long long)nentries,
            (long long)d->nentries);
    d->truncated = 1;
  } else if (line - 1 > nentries) {
    fprintf(err, "tdist-trace: warning: %s: %lld entry lines, but the meta line announced %lld\n",
            path, (long long)line - 1, (long long)nentries);
  }
  rc = 0;
  *out = d;
  d = NULL;
  goto done;
oom:
  fprintf(err, "tdist-trace: %s: out of memory\n", path);
done:
  if (f) fclose(f);
  json_object_put(o);
  if (tok) json_tokener_free(tok);
  free(buf);
  tt_dump_free(d);
  return rc;
}
