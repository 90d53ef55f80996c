/*
 * parse.c - a strict, line-oriented reader of flight-recorder dumps.
 *
 * The writer (write_dump() in src/core/trace.c) puts the header members on
 * the first lines, each line a run of complete `"key": value` members ended
 * by ',', then `"entries": [` alone at the end of a line, then one entry
 * object per line (',' after all but the last), then ` ]}`. Values never
 * span lines, so each line is parsed on its own, and an error names the file
 * and line. Unknown keys are skipped (any JSON value), known keys must have
 * the right type, the required ones must be there. "job" is optional (dumps
 * written before it existed; job "-"), but when present it must be a valid
 * job id.
 *
 * Truncation: a writer killed mid-dump leaves a prefix of the file. A bad or
 * cut last line, or a missing closing ` ]}`, is a warning: the entries read
 * so far are kept and the dump is marked truncated. A file cut inside the
 * header is rejected (there is no group to attach entries to).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "trace_tool.h"

typedef struct lx {
  const char *p, *end;
  char why[200];
  char *tmp; /* scratch for decoded strings */
  size_t tmp_cap;
} lx_t;

#define FAIL(lx, ...) (snprintf((lx)->why, sizeof((lx)->why), __VA_ARGS__), -1)

static void ws(lx_t *lx) {
  while (lx->p < lx->end && (*lx->p == ' ' || *lx->p == '\t' || *lx->p == '\r'))
    lx->p++;
}

static int eat(lx_t *lx, char c) {
  ws(lx);
  if (lx->p < lx->end && *lx->p == c) {
    lx->p++;
    return 1;
  }
  return 0;
}

static int at_eol(lx_t *lx) {
  ws(lx);
  return lx->p >= lx->end || *lx->p == '\n';
}

static int tmp_put(lx_t *lx, size_t n, char c) {
  if (n + 1 >= lx->tmp_cap) {
    size_t cap = lx->tmp_cap ? lx->tmp_cap * 2 : 256;
    char *t = realloc(lx->tmp, cap);
    if (!t) return FAIL(lx, "out of memory");
    lx->tmp = t;
    lx->tmp_cap = cap;
  }
  lx->tmp[n] = c;
  lx->tmp[n + 1] = '\0';
  return 0;
}

/* A JSON string into lx->tmp (escapes decoded; \u above 0x7f becomes '?'). */
static int str(lx_t *lx) {
  size_t n = 0;
  if (!eat(lx, '"')) return FAIL(lx, "expected a string");
  if (tmp_put(lx, 0, '\0')) return -1;
  for (;;) {
    if (lx->p >= lx->end || *lx->p == '\n') return FAIL(lx, "unterminated string");
    char c = *lx->p++;
    if (c == '"') return 0;
    if ((unsigned char)c < 0x20) return FAIL(lx, "control character in a string");
    if (c == '\\') {
      if (lx->p >= lx->end) return FAIL(lx, "unterminated string");
      char e = *lx->p++;
      switch (e) {
      case '"':
      case '\\':
      case '/': c = e; break;
      case 'b': c = '\b'; break;
      case 'f': c = '\f'; break;
      case 'n': c = '\n'; break;
      case 'r': c = '\r'; break;
      case 't': c = '\t'; break;
      case 'u': {
        unsigned v = 0;
        for (int i = 0; i < 4; i++, lx->p++) {
          if (lx->p >= lx->end) return FAIL(lx, "bad \\u escape");
          char h = *lx->p;
          int d = h >= '0' && h <= '9'   ? h - '0'
                  : h >= 'a' && h <= 'f' ? h - 'a' + 10
                  : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                         : -1;
          if (d < 0) return FAIL(lx, "bad \\u escape");
          v = v * 16 + (unsigned)d;
        }
        c = v && v < 0x80 ? (char)v : '?';
        break;
      }
      default: return FAIL(lx, "bad escape '\\%c' in a string", e);
      }
    }
    if (tmp_put(lx, n++, c)) return -1;
  }
}

static int str_into(lx_t *lx, const char *key, char *buf, size_t cap) {
  if (str(lx)) return -1;
  if (strlen(lx->tmp) >= cap) return FAIL(lx, "\"%s\" is too long", key);
  memcpy(buf, lx->tmp, strlen(lx->tmp) + 1);
  return 0;
}

static int str_dup(lx_t *lx, char **out) {
  if (str(lx)) return -1;
  free(*out);
  *out = strdup(lx->tmp);
  return *out ? 0 : FAIL(lx, "out of memory");
}

/* A JSON number; `integer` rejects fractions and exponents. */
static int num(lx_t *lx, const char *key, int integer, int64_t *out) {
  ws(lx);
  const char *s = lx->p;
  if (lx->p < lx->end && *lx->p == '-') lx->p++;
  const char *digits = lx->p;
  while (lx->p < lx->end && *lx->p >= '0' && *lx->p <= '9')
    lx->p++;
  if (lx->p == digits) return FAIL(lx, "\"%s\": expected a number", key);
  int frac = 0;
  if (lx->p < lx->end && *lx->p == '.') {
    frac = 1;
    lx->p++;
    while (lx->p < lx->end && *lx->p >= '0' && *lx->p <= '9')
      lx->p++;
  }
  if (lx->p < lx->end && (*lx->p == 'e' || *lx->p == 'E')) {
    frac = 1;
    lx->p++;
    if (lx->p < lx->end && (*lx->p == '+' || *lx->p == '-')) lx->p++;
    while (lx->p < lx->end && *lx->p >= '0' && *lx->p <= '9')
      lx->p++;
  }
  if (!integer) return 0;
  if (frac) return FAIL(lx, "\"%s\": expected an integer", key);
  char buf[32];
  size_t len = (size_t)(lx->p - s);
  if (len >= sizeof(buf)) return FAIL(lx, "\"%s\": number out of range", key);
  memcpy(buf, s, len);
  buf[len] = '\0';
  errno = 0;
  long long v = strtoll(buf, NULL, 10);
  if (errno) return FAIL(lx, "\"%s\": number out of range", key);
  *out = v;
  return 0;
}

static int word(lx_t *lx, const char *w) {
  size_t n = strlen(w);
  ws(lx);
  if ((size_t)(lx->end - lx->p) >= n && !memcmp(lx->p, w, n)) {
    lx->p += n;
    return 1;
  }
  return 0;
}

static int boolean(lx_t *lx, const char *key, int *out) {
  if (word(lx, "true"))
    *out = 1;
  else if (word(lx, "false"))
    *out = 0;
  else
    return FAIL(lx, "\"%s\": expected true or false", key);
  return 0;
}

/* Any JSON value on this line (an unknown key), nesting bounded. */
static int skip(lx_t *lx, int depth) {
  int64_t dummy;
  if (depth > 16) return FAIL(lx, "values nested too deeply");
  ws(lx);
  if (lx->p >= lx->end) return FAIL(lx, "expected a value");
  char c = *lx->p;
  if (c == '"') return str(lx);
  if (c == '{' || c == '[') {
    char close = c == '{' ? '}' : ']';
    lx->p++;
    if (eat(lx, close)) return 0;
    do {
      if (c == '{' && (str(lx) || !eat(lx, ':'))) return FAIL(lx, "bad object");
      if (skip(lx, depth + 1)) return -1;
    } while (eat(lx, ','));
    return eat(lx, close) ? 0 : FAIL(lx, "expected '%c'", close);
  }
  if (word(lx, "true") || word(lx, "false") || word(lx, "null")) return 0;
  return num(lx, "value", 0, &dummy);
}

/* Parse `{ members }` (the '{' already eaten when `opened`), calling
 * member(lx, key, obj) for each key; it must consume the value. */
typedef int (*member_fn)(lx_t *lx, const char *key, void *obj);

static int object(lx_t *lx, member_fn member, void *obj) {
  char key[64];
  if (!eat(lx, '{')) return FAIL(lx, "expected '{'");
  if (eat(lx, '}')) return 0;
  do {
    if (str_into(lx, "key", key, sizeof(key))) return -1;
    if (!eat(lx, ':')) return FAIL(lx, "expected ':' after \"%s\"", key);
    if (member(lx, key, obj)) return -1;
  } while (eat(lx, ','));
  return eat(lx, '}') ? 0 : FAIL(lx, "expected ',' or '}'");
}

/* ---- entries ------------------------------------------------------------------- */

enum {
  E_SEQ = 1,
  E_OP = 2,
  E_DTYPE = 4,
  E_REDOP = 8,
  E_COUNT = 16,
  E_ROOT = 32,
  E_STATE = 64,
  E_STATUS = 128,
  E_TENQ = 256,
  E_TSTART = 512,
  E_TEND = 1024,
  E_ALL = 2047
};

struct entry_ctx {
  tt_entry_t *e;
  int seen;
};

static int entry_member(lx_t *lx, const char *k, void *obj) {
  struct entry_ctx *c = obj;
  tt_entry_t *e = c->e;
#define INT_FIELD(name, bit, dst) \
  if (!strcmp(k, name)) return c->seen |= bit, num(lx, k, 1, &e->dst)
#define STR_FIELD(name, bit, dst) \
  if (!strcmp(k, name)) return c->seen |= bit, str_into(lx, k, e->dst, sizeof(e->dst))
  INT_FIELD("seq", E_SEQ, seq);
  STR_FIELD("op", E_OP, op);
  STR_FIELD("dtype", E_DTYPE, dtype);
  STR_FIELD("redop", E_REDOP, redop);
  INT_FIELD("count", E_COUNT, count);
  INT_FIELD("root", E_ROOT, root);
  STR_FIELD("state", E_STATE, state);
  STR_FIELD("status", E_STATUS, status);
  INT_FIELD("t_enqueue_us", E_TENQ, t_enqueue_us);
  INT_FIELD("t_start_us", E_TSTART, t_start_us);
  INT_FIELD("t_end_us", E_TEND, t_end_us);
#undef INT_FIELD
#undef STR_FIELD
  return skip(lx, 0);
}

static const char *const states[] = {"queued", "running",   "completed",
                                     "failed", "timed_out", "aborted"};

static int entry_line(lx_t *lx, tt_dump_t *d, int *comma) {
  tt_entry_t e;
  memset(&e, 0, sizeof(e));
  struct entry_ctx c = {&e, 0};
  if (object(lx, entry_member, &c)) return -1;
  *comma = eat(lx, ',');
  if (!at_eol(lx)) return FAIL(lx, "unexpected text after an entry");
  if (c.seen != E_ALL)
    return FAIL(lx, "entry lacks a required field (seq, op, dtype, redop, "
                    "count, root, state, status, t_*_us)");
  int known = 0;
  for (size_t i = 0; i < sizeof(states) / sizeof(states[0]); i++)
    known |= !strcmp(e.state, states[i]);
  if (!known) return FAIL(lx, "unknown state \"%s\"", e.state);
  if (e.seq < 0 || e.count < 0 || e.root < -1 || e.t_enqueue_us < 0 || e.t_start_us < 0 ||
      e.t_end_us < 0)
    return FAIL(lx, "negative seq, count or time");
  if (d->nentries && e.seq <= d->entries[d->nentries - 1].seq)
    return FAIL(lx, "entries out of order (seq %lld after seq %lld)", (long long)e.seq,
                (long long)d->entries[d->nentries - 1].seq);
  if (e.seq < d->dropped || e.seq >= d->recorded)
    return FAIL(lx, "entry seq %lld outside the ring's window [%lld, %lld)", (long long)e.seq,
                (long long)d->dropped, (long long)d->recorded);
  if (d->nentries == d->cap_entries) {
    int64_t cap = d->cap_entries ? d->cap_entries * 2 : 64;
    tt_entry_t *n = realloc(d->entries, sizeof(*n) * (size_t)cap);
    if (!n) return FAIL(lx, "out of memory");
    d->entries = n;
    d->cap_entries = cap;
  }
  d->entries[d->nentries++] = e;
  return 0;
}

/* ---- header -------------------------------------------------------------------- */

enum {
  H_VERSION = 1,
  H_PID = 2,
  H_GRANK = 4,
  H_GROUP = 8,
  H_NEXT = 16,
  H_REC = 32,
  H_DROP = 64,
  H_ABORTED = 128,
  H_DUMPED = 256,
  H_ALL = 511
};
enum { G_NAME = 1, G_UID = 2, G_RANK = 4, G_SIZE = 8, G_RANKS = 16, G_ALL = 31 };

struct hdr_ctx {
  tt_dump_t *d;
  int seen, gseen;
};

static int ranks_array(lx_t *lx, tt_dump_t *d) {
  int64_t cap = 0, v;
  if (!eat(lx, '[')) return FAIL(lx, "\"ranks\": expected an array");
  if (eat(lx, ']')) return 0;
  do {
    if (num(lx, "ranks", 1, &v)) return -1;
    if (v < 0 || v > INT32_MAX) return FAIL(lx, "\"ranks\": bad rank %lld", (long long)v);
    if (d->nranks >= TT_MAX_GROUP_SIZE) return FAIL(lx, "\"ranks\": too many ranks");
    if (d->nranks == cap) {
      cap = cap ? cap * 2 : 16;
      int *n = realloc(d->ranks, sizeof(int) * (size_t)cap);
      if (!n) return FAIL(lx, "out of memory");
      d->ranks = n;
    }
    d->ranks[d->nranks++] = (int)v;
  } while (eat(lx, ','));
  return eat(lx, ']') ? 0 : FAIL(lx, "\"ranks\": expected ',' or ']'");
}

static int group_member(lx_t *lx, const char *k, void *obj) {
  struct hdr_ctx *c = obj;
  tt_dump_t *d = c->d;
  if (!strcmp(k, "name")) return c->gseen |= G_NAME, str_dup(lx, &d->group_name);
  if (!strcmp(k, "uid")) return c->gseen |= G_UID, str_into(lx, k, d->uid, sizeof(d->uid));
  if (!strcmp(k, "rank")) return c->gseen |= G_RANK, num(lx, k, 1, &d->group_rank);
  if (!strcmp(k, "size")) return c->gseen |= G_SIZE, num(lx, k, 1, &d->group_size);
  if (!strcmp(k, "ranks")) {
    free(d->ranks);
    d->ranks = NULL;
    d->nranks = 0;
    return c->gseen |= G_RANKS, ranks_array(lx, d);
  }
  return skip(lx, 0);
}

/* "job": 1..TT_JOB_MAX printable ASCII characters, no '"' (it is part of the
 * default file name and of the tool's messages). */
static int job_id(lx_t *lx, tt_dump_t *d) {
  if (str_into(lx, "job", d->job, sizeof(d->job))) return -1;
  if (!d->job[0]) return FAIL(lx, "\"job\": empty job id");
  for (const char *c = d->job; *c; c++)
    if (*c < 0x20 || *c > 0x7e || *c == '"')
      return FAIL(lx, "\"job\": character 0x%02x in the job id", (unsigned char)*c);
  return 0;
}

static int header_member(lx_t *lx, const char *k, struct hdr_ctx *c) {
  tt_dump_t *d = c->d;
  if (!strcmp(k, "version")) return c->seen |= H_VERSION, num(lx, k, 1, &d->version);
  if (!strcmp(k, "job")) return job_id(lx, d);
  if (!strcmp(k, "host")) return str_into(lx, k, d->host, sizeof(d->host));
  if (!strcmp(k, "pid")) return c->seen |= H_PID, num(lx, k, 1, &d->pid);
  if (!strcmp(k, "global_rank")) return c->seen |= H_GRANK, num(lx, k, 1, &d->global_rank);
  if (!strcmp(k, "backend")) return str_into(lx, k, d->backend, sizeof(d->backend));
  if (!strcmp(k, "group")) return c->seen |= H_GROUP, object(lx, group_member, c);
  if (!strcmp(k, "next_seq")) return c->seen |= H_NEXT, num(lx, k, 1, &d->next_seq);
  if (!strcmp(k, "recorded")) return c->seen |= H_REC, num(lx, k, 1, &d->recorded);
  if (!strcmp(k, "dropped")) return c->seen |= H_DROP, num(lx, k, 1, &d->dropped);
  if (!strcmp(k, "aborted")) return c->seen |= H_ABORTED, boolean(lx, k, &d->aborted);
  if (!strcmp(k, "abort_reason")) return str_dup(lx, &d->abort_reason);
  if (!strcmp(k, "dumped_us")) return c->seen |= H_DUMPED, num(lx, k, 1, &d->dumped_us);
  return skip(lx, 0);
}

static int header_check(lx_t *lx, struct hdr_ctx *c) {
  tt_dump_t *d = c->d;
  if (c->seen != H_ALL || c->gseen != G_ALL)
    return FAIL(lx, "header lacks a required field (version, pid, global_rank, group {name, uid, "
                    "rank, size, ranks}, next_seq, recorded, dropped, aborted, dumped_us)");
  if (d->version != 1) return FAIL(lx, "unsupported version %lld", (long long)d->version);
  if (d->group_size < 1 || d->group_size > TT_MAX_GROUP_SIZE || d->nranks != d->group_size)
    return FAIL(lx, "group size %lld does not match its ranks list (%lld ranks)",
                (long long)d->group_size, (long long)d->nranks);
  if (d->group_rank < 0 || d->group_rank >= d->group_size)
    return FAIL(lx, "group rank %lld outside the group", (long long)d->group_rank);
  if (d->ranks[d->group_rank] != d->global_rank)
    return FAIL(lx, "ranks[%lld] is %d but global_rank is %lld", (long long)d->group_rank,
                d->ranks[d->group_rank], (long long)d->global_rank);
  if (!d->uid[0]) return FAIL(lx, "empty group uid");
  if (d->next_seq < 0 || d->recorded < 0 || d->dropped < 0 || d->dropped > d->recorded)
    return FAIL(lx, "inconsistent next_seq / recorded / dropped");
  if (!d->group_name) return FAIL(lx, "no group name");
  if (!d->job[0]) memcpy(d->job, "-", 2); /* dumps written before the member existed */
  if (!d->abort_reason && !(d->abort_reason = strdup(""))) return FAIL(lx, "out of memory");
  return 0;
}

/* One header line: members each followed by ','; "entries": [ ends the header. */
static int header_line(lx_t *lx, struct hdr_ctx *c, int first, int *in_entries) {
  char key[64];
  if (first && !eat(lx, '{')) return FAIL(lx, "not a flight-recorder dump (expected '{')");
  while (!at_eol(lx)) {
    if (str_into(lx, "key", key, sizeof(key))) return -1;
    if (!eat(lx, ':')) return FAIL(lx, "expected ':' after \"%s\"", key);
    if (!strcmp(key, "entries")) {
      if (!eat(lx, '[') || !at_eol(lx)) return FAIL(lx, "expected '[' at the end of the line");
      *in_entries = 1;
      return header_check(lx, c);
    }
    if (header_member(lx, key, c)) return -1;
    if (!eat(lx, ',')) return FAIL(lx, "expected ',' after \"%s\"", key);
  }
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
  free(d);
}

enum { S_HEADER, S_ENTRIES, S_LAST_ENTRY, S_DONE };

int tt_parse_file(const char *path, FILE *err, tt_dump_t **out) {
  lx_t lx = {0};
  char *cur = NULL, *next = NULL;
  size_t cur_cap = 0, next_cap = 0;
  ssize_t cur_len, next_len;
  int64_t line = 0;
  int rc = -1, state = S_HEADER;
  tt_dump_t *d = calloc(1, sizeof(*d));
  struct hdr_ctx hc = {d, 0, 0};
  FILE *f = fopen(path, "r");
  if (!d || !f) {
    fprintf(err, "tdist-trace: %s: %s\n", path, d ? strerror(errno) : "out of memory");
    goto done;
  }
  d->path = strdup(path);
  /* Read one line ahead, so that a bad last line can be told from a bad
   * line in the middle (which is not truncation but corruption). */
  cur_len = getline(&cur, &cur_cap, f);
  if (cur_len < 0) {
    fprintf(err, "tdist-trace: %s: empty file\n", path);
    goto done;
  }
  for (; cur_len >= 0; cur_len = next_len) {
    line++;
    next_len = getline(&next, &next_cap, f);
    int last = next_len < 0;
    lx.p = cur;
    lx.end = cur + cur_len;
    lx.why[0] = '\0';
    int bad = (size_t)cur_len != strlen(cur) ? FAIL(&lx, "NUL byte in the line") : 0;
    if (!bad && state == S_HEADER) {
      int in_entries = 0;
      bad = header_line(&lx, &hc, line == 1, &in_entries);
      if (!bad && in_entries) state = S_ENTRIES;
    } else if (!bad && state == S_DONE) {
      if (!at_eol(&lx)) bad = FAIL(&lx, "text after the end of the dump");
    } else if (!bad && !at_eol(&lx)) {
      if (*lx.p == ']') {
        lx.p++;
        bad = !eat(&lx, '}') || !at_eol(&lx) ? FAIL(&lx, "expected ' ]}' to end the dump") : 0;
        if (!bad) state = S_DONE;
      } else if (state == S_LAST_ENTRY) {
        bad = FAIL(&lx, "an entry after the last one (missing ',')");
      } else {
        int comma = 0;
        bad = entry_line(&lx, d, &comma);
        if (!bad && !comma) state = S_LAST_ENTRY;
      }
    }
    if (bad && state != S_HEADER && last) {
      fprintf(err, "tdist-trace: warning: %s:%lld: truncated last entry skipped (%s)\n", path,
              (long long)line, lx.why);
      d->truncated = 1;
      break;
    }
    if (bad) {
      fprintf(err, "tdist-trace: %s:%lld: %s%s\n", path, (long long)line, lx.why,
              last && state == S_HEADER && cur[cur_len - 1] != '\n'
                  ? " (the file ends inside the header: truncated?)"
                  : "");
      goto done;
    }
    char *t = cur;
    size_t tc = cur_cap;
    cur = next, cur_cap = next_cap;
    next = t, next_cap = tc;
  }
  if (state == S_HEADER) {
    fprintf(err, "tdist-trace: %s:%lld: file ends inside the header (truncated)\n", path,
            (long long)line);
    goto done;
  }
  if (state != S_DONE && !d->truncated) { /* cut between lines */
    fprintf(err,
            "tdist-trace: warning: %s:%lld: file ends without ' ]}' (truncated); "
            "%lld entries kept\n",
            path, (long long)line, (long long)d->nentries);
    d->truncated = 1;
  }
  rc = 0;
  *out = d;
  d = NULL;
done:
  if (f) fclose(f);
  free(cur);
  free(next);
  free(lx.tmp);
  tt_dump_free(d);
  return rc;
}
