/*
 * analyze.c - merge the dumps of one group and name its first problem.
 *
 * Dumps are grouped by group uid. Within a group, sequence numbers are the
 * common clock: rank r's op number s is supposed to be the same collective as
 * every other rank's op number s. Walking the seqs that appear in any rank's
 * ring in ascending order, each rank is in one of these classes at seq s:
 *
 *   ENTRY       its ring has the op (any state);
 *   DROPPED     s is older than its ring (overwritten): unknown, not missing;
 *   QUEUED      submitted (s < next_seq) but never started (s >= recorded);
 *   NOT_REACHED s >= next_seq: the rank had not submitted it yet;
 *   SKIPPED     inside its ring's window but absent (the submit failed);
 *   UNKNOWN     after the last entry of a truncated dump: unknown too;
 *   UNREADABLE  where its file had a line the parser skipped: unknown too;
 *   MISSING     no dump from that rank at all.
 *
 * The first seq showing one of these is the group's problem, checked in this
 * order: a divergence (ranks that have the op disagree on op, dtype, count,
 * root or reduction), a stall (some ranks have it while others are QUEUED,
 * NOT_REACHED or SKIPPED: those are "behind"), a failure (failed, timed_out
 * or aborted somewhere), a partial completion (some still running, the
 * others completed). An op running on every rank is in flight, not a problem.
 *
 * Ranks in messages are global ranks. Point-to-point ops take a seq only on
 * the ranks that run them: at a seq where every rank that has an op ran a
 * p2p op, only send/recv pairing is checked; at a seq where some ran p2p and
 * others a collective, the seqs have drifted apart, so from there on only
 * failures are looked for (g->unaligned).
 */
#include <stdlib.h>
#include <string.h>

#include "trace_tool.h"

enum { C_MISSING, C_DROPPED, C_UNKNOWN, C_UNREADABLE, C_ENTRY, C_QUEUED, C_NOT_REACHED, C_SKIPPED };

typedef tt_group_t grp_t;

int tt_group_selected(const tt_dump_t *d, const char *only) {
  return !only || !strcmp(d->group_name, only) || !strcmp(d->uid, only);
}

static int in(const char *s, const char *const *set) {
  for (; *set; set++)
    if (!strcmp(s, *set)) return 1;
  return 0;
}
int tt_op_has_root(const char *op) {
  static const char *const s[] = {"broadcast", "reduce", "gather", "scatter", NULL};
  return in(op, s);
}
int tt_op_is_p2p(const char *op) {
  static const char *const s[] = {"send", "recv", "batch_p2p", NULL};
  return in(op, s);
}
int tt_op_has_redop(const char *op) {
  static const char *const s[] = {"all_reduce", "reduce", "reduce_scatter", NULL};
  return in(op, s);
}
int tt_state_failed(const char *st) {
  static const char *const s[] = {"failed", "timed_out", "aborted", NULL};
  return in(st, s);
}

/* ---- small helpers ------------------------------------------------------------- */

/* "all_reduce float32 x1024", "broadcast float32 x4 root 0", "send int32 x2 peer 1",
 * "all_reduce float32 x4 redop max" (the reduction only when not sum). */
static void describe(const tt_entry_t *e, char *buf, size_t len) {
  int n = snprintf(buf, len, "%s %s x%lld", e->op, e->dtype, (long long)e->count);
  if (n < 0 || (size_t)n >= len) return;
  if (tt_op_has_root(e->op))
    n += snprintf(buf + n, len - (size_t)n, " root %lld", (long long)e->root);
  else if (tt_op_is_p2p(e->op) && strcmp(e->op, "batch_p2p"))
    n += snprintf(buf + n, len - (size_t)n, " peer %lld", (long long)e->root);
  if (n >= 0 && (size_t)n < len && tt_op_has_redop(e->op) && strcmp(e->redop, "sum"))
    snprintf(buf + n, len - (size_t)n, " redop %s", e->redop);
}

static int same_op(const tt_entry_t *a, const tt_entry_t *b) {
  if (strcmp(a->op, b->op) || strcmp(a->dtype, b->dtype) || a->count != b->count) return 0;
  if (tt_op_has_root(a->op) && a->root != b->root) return 0;
  if (tt_op_has_redop(a->op) && strcmp(a->redop, b->redop)) return 0;
  return 1;
}

void tt_rank_list(const grp_t *g, const int *gr, int n, char *buf, size_t len) {
  size_t o = 0;
  buf[0] = '\0';
  for (int i = 0, shown = 0; i < n && o < len; shown++) {
    int j = i, a = g->ref->ranks[gr[i]];
    while (j + 1 < n && g->ref->ranks[gr[j + 1]] == g->ref->ranks[gr[j]] + 1)
      j++;
    if (shown == 40) {
      snprintf(buf + o, len - o, ",... (%d in all)", n);
      return;
    }
    int b = g->ref->ranks[gr[j]];
    int w = j - i >= 2 ? snprintf(buf + o, len - o, "%s%d-%d", o ? "," : "", a, b)
                       : snprintf(buf + o, len - o, "%s%d", o ? "," : "", a);
    if (w < 0) return;
    o += (size_t)w;
    i = j - i >= 2 ? j + 1 : i + 1;
  }
}

static const char *plural(int n) { return n == 1 ? "rank" : "ranks"; }

static const tt_entry_t *find(const tt_dump_t *d, int64_t seq) {
  int64_t lo = 0, hi = d->nentries;
  while (lo < hi) {
    int64_t mid = lo + (hi - lo) / 2;
    if (d->entries[mid].seq < seq)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < d->nentries && d->entries[lo].seq == seq ? &d->entries[lo] : NULL;
}

static int classify(const tt_dump_t *d, int64_t s, const tt_entry_t **e) {
  *e = NULL;
  if (!d) return C_MISSING;
  if ((*e = find(d, s))) return C_ENTRY;
  if (s < d->dropped) return C_DROPPED;
  for (int64_t i = 0; i < d->nholes; i++)
    if (s >= d->holes[i].lo && s < d->holes[i].hi) return C_UNREADABLE;
  if (d->truncated && (!d->nentries || s > d->entries[d->nentries - 1].seq)) return C_UNKNOWN;
  if (s >= d->next_seq) return C_NOT_REACHED;
  if (s >= d->recorded) return C_QUEUED;
  return C_SKIPPED;
}

/* The last entry of d before seq s, as "last op seq 11 completed". */
static void last_before(const tt_dump_t *d, int64_t s, char *buf, size_t len) {
  const tt_entry_t *last = NULL;
  for (int64_t i = 0; i < d->nentries && d->entries[i].seq < s; i++)
    last = &d->entries[i];
  if (last)
    snprintf(buf, len, "last op seq %lld %s", (long long)last->seq, last->state);
  else if (d->dropped)
    snprintf(buf, len, "no op left in its ring");
  else
    snprintf(buf, len, "no op recorded");
}

/* ---- the per-seq checks ---------------------------------------------------------- */

typedef struct seqview {
  int64_t seq;
  int *cls;                        /* [size] */
  const tt_entry_t **e;            /* [size] */
  int *tmp, *tmp2;                 /* [size] scratch lists of group ranks */
  int64_t inflight, inflight_last; /* ops in flight everywhere (only the first is shown) */
  int p2p_noted;
} seqview_t;

/* Only point-to-point ops at this seq: they need not involve every rank. */
static int all_p2p(const grp_t *g, const seqview_t *v) {
  for (int64_t r = 0; r < g->size; r++)
    if (v->e[r] && !tt_op_is_p2p(v->e[r]->op)) return 0;
  return 1;
}

static void set_problem(grp_t *g, const seqview_t *v, const char *fmt, const char *what,
                        const char *detail) {
  g->problem = 1;
  snprintf(g->verdict, sizeof(g->verdict), fmt, g->ref->group_name, (long long)v->seq, what,
           detail);
  g->problem_us = INT64_MAX;
  for (int64_t r = 0; r < g->size; r++)
    if (v->e[r] && v->e[r]->t_enqueue_us && v->e[r]->t_enqueue_us < g->problem_us)
      g->problem_us = v->e[r]->t_enqueue_us;
}

/* Divergence: ranks with the op disagree. Returns 1 if found. */
static int check_divergence(grp_t *g, seqview_t *v, FILE *out) {
  const tt_entry_t *first = NULL;
  int64_t nent = 0, np2p = 0;
  for (int64_t r = 0; r < g->size; r++) {
    if (!v->e[r]) continue;
    nent++;
    np2p += tt_op_is_p2p(v->e[r]->op);
    if (!first) first = v->e[r];
  }
  if (!first) return 0;
  char a[128], b[128], la[256], lb[256], detail[1024];
  if (np2p == nent) { /* send r->p must meet recv p<-r when p's op at this seq is p2p too */
    for (int64_t r = 0; r < g->size; r++) {
      const tt_entry_t *x = v->e[r];
      if (!x || strcmp(x->op, "send") || x->root < 0 || x->root >= g->size) continue;
      const tt_entry_t *y = v->e[x->root];
      if (!y || !strcmp(y->op, "batch_p2p")) continue;
      if (!strcmp(y->op, "recv") && y->root == r && !strcmp(x->dtype, y->dtype) &&
          x->count == y->count)
        continue;
      describe(x, a, sizeof(a));
      describe(y, b, sizeof(b));
      fprintf(out, "  divergence: seq %lld: rank %d ran %s, rank %d ran %s\n", (long long)v->seq,
              g->ref->ranks[r], a, g->ref->ranks[x->root], b);
      snprintf(detail, sizeof(detail), "rank %d ran %s against rank %d's %s",
               g->ref->ranks[x->root], b, g->ref->ranks[r], a);
      set_problem(g, v, "group '%s' seq %lld (%s): %s", x->op, detail);
      return 1;
    }
    if (nent < g->size && !v->p2p_noted++)
      fprintf(out,
              "  note: seq %lld is a point-to-point op that not every rank ran; seq numbers "
              "of later ops may not line up across ranks\n",
              (long long)v->seq);
    return 0;
  }
  if (np2p) { /* p2p ops took this seq on some ranks only: seqs no longer line up */
    fprintf(out,
            "  note: seq %lld is a point-to-point op on some ranks and a collective on "
            "others; seq numbers count p2p ops only on the ranks that run them, so later "
            "seqs are not compared (only failures are reported)\n",
            (long long)v->seq);
    g->unaligned = 1;
    return 0;
  }
  int64_t alike = 0; /* the common case, O(size): everyone agrees with the first */
  for (int64_t r = 0; r < g->size; r++)
    alike += v->e[r] && same_op(v->e[r], first);
  if (alike == nent) return 0;
  /* Majority = the largest set of ranks running the same op (O(size^2), once). */
  int nmaj = 0;
  const tt_entry_t *maj = NULL;
  for (int64_t r = 0; r < g->size; r++) {
    if (!v->e[r]) continue;
    int n = 0;
    for (int64_t q = 0; q < g->size; q++)
      n += v->e[q] && same_op(v->e[q], v->e[r]);
    if (n > nmaj) nmaj = n, maj = v->e[r];
  }
  if (nmaj == nent) return 0;
  int nm = 0, no = 0;
  for (int64_t r = 0; r < g->size; r++) {
    if (!v->e[r]) continue;
    if (same_op(v->e[r], maj))
      v->tmp[nm++] = (int)r;
    else
      v->tmp2[no++] = (int)r;
  }
  describe(maj, a, sizeof(a));
  tt_rank_list(g, v->tmp, nm, la, sizeof(la));
  fprintf(out, "  divergence: seq %lld: %s %s ran %s", (long long)v->seq, plural(nm), la, a);
  for (int i = 0; i < no; i++) { /* each other rank with what it ran */
    if (i == 8) {
      fprintf(out, ", ... (%d ranks differ)", no);
      break;
    }
    describe(v->e[v->tmp2[i]], b, sizeof(b));
    fprintf(out, ", rank %d ran %s", g->ref->ranks[v->tmp2[i]], b);
  }
  fprintf(out, "\n");
  tt_rank_list(g, v->tmp2, no, lb, sizeof(lb));
  describe(v->e[v->tmp2[0]], b, sizeof(b));
  snprintf(detail, sizeof(detail), "ranks [%s] diverge (ran %s%s where ranks [%s] ran %s)", lb, b,
           no > 1 ? ", ..." : "", la, a);
  set_problem(g, v, "group '%s' seq %lld (%s): %s", maj->op, detail);
  return 1;
}

/* The ranks holding an entry, grouped by state, e.g. "ranks 0,1,3 running
 * (for 1.20 s when dumped)". */
static void print_states(grp_t *g, seqview_t *v, FILE *out, const char *sep) {
  static const char *const order[] = {"running",   "queued", "completed",
                                      "timed_out", "failed", "aborted"};
  char list[512];
  for (size_t k = 0; k < sizeof(order) / sizeof(order[0]); k++) {
    int n = 0;
    int64_t longest = 0;
    const char *status = "";
    for (int64_t r = 0; r < g->size; r++) {
      const tt_entry_t *e = v->e[r];
      if (!e || strcmp(e->state, order[k])) continue;
      v->tmp[n++] = (int)r;
      int64_t from = e->t_start_us ? e->t_start_us : e->t_enqueue_us;
      int64_t to = e->t_end_us ? e->t_end_us : g->rank[r]->dumped_us;
      if (from && to - from > longest) longest = to - from;
      status = e->status;
    }
    if (!n) continue;
    tt_rank_list(g, v->tmp, n, list, sizeof(list));
    fprintf(out, "%s%s %s %s", sep, plural(n), list, order[k]);
    if (k == 0)
      fprintf(out, " (waiting; for %.3f s when dumped)", (double)longest / 1e6);
    else if (k >= 3)
      fprintf(out, " (%s after %.3f s)", status, (double)longest / 1e6);
    sep = ", ";
  }
}

/* Stall: some ranks have the op, others are behind. Returns 1 if found. */
static int check_stall(grp_t *g, seqview_t *v, FILE *out) {
  int nbehind = 0;
  for (int64_t r = 0; r < g->size; r++)
    if (v->cls[r] == C_QUEUED || v->cls[r] == C_NOT_REACHED || v->cls[r] == C_SKIPPED)
      v->tmp2[nbehind++] = (int)r;
  const tt_entry_t *any = NULL;
  for (int64_t r = 0; r < g->size && !any; r++)
    any = v->e[r];
  if (!any || !nbehind || all_p2p(g, v)) return 0;
  fprintf(out, "  stall: seq %lld %s:", (long long)v->seq, any->op);
  print_states(g, v, out, " ");
  char why[160], list[512];
  int64_t lo = INT64_MAX, hi = -1;
  for (int i = 0; i < nbehind; i++) {
    int r = v->tmp2[i];
    const tt_dump_t *d = g->rank[r];
    if (i < 8) {
      last_before(d, v->seq, why, sizeof(why));
      if (v->cls[r] == C_NOT_REACHED)
        fprintf(out, ", rank %d never started it: %s", g->ref->ranks[r], why);
      else if (v->cls[r] == C_QUEUED)
        fprintf(out, ", rank %d submitted it but never started it: %s", g->ref->ranks[r], why);
      else
        fprintf(out, ", rank %d has no record of it (its submit failed?)", g->ref->ranks[r]);
    } else if (i == 8) {
      fprintf(out, ", ... (%d ranks behind)", nbehind);
    }
    for (int64_t k = d->nentries - 1; k >= 0; k--)
      if (d->entries[k].seq < v->seq) {
        if (d->entries[k].seq < lo) lo = d->entries[k].seq;
        if (d->entries[k].seq > hi) hi = d->entries[k].seq;
        break;
      }
  }
  fprintf(out, "\n");
  tt_rank_list(g, v->tmp2, nbehind, list, sizeof(list));
  char detail[700];
  if (hi < 0)
    snprintf(detail, sizeof(detail), "ranks [%s] behind (no earlier op recorded)", list);
  else if (lo == hi)
    snprintf(detail, sizeof(detail), "ranks [%s] behind (last seq %lld)", list, (long long)hi);
  else
    snprintf(detail, sizeof(detail), "ranks [%s] behind (last seqs %lld..%lld)", list,
             (long long)lo, (long long)hi);
  set_problem(g, v, "group '%s' seq %lld (%s): %s", any->op, detail);
  return 1;
}

/* Failure, or some ranks still running it while others completed. */
static int check_outcome(grp_t *g, seqview_t *v, FILE *out) {
  int nfail = 0, nrun = 0, ndone = 0;
  const tt_entry_t *fail = NULL, *any = NULL;
  for (int64_t r = 0; r < g->size; r++) {
    const tt_entry_t *e = v->e[r];
    if (!e) continue;
    any = e;
    if (tt_state_failed(e->state)) {
      v->tmp2[nfail++] = (int)r;
      if (!fail) fail = e;
    }
    nrun += !strcmp(e->state, "running") || !strcmp(e->state, "queued");
    ndone += !strcmp(e->state, "completed");
  }
  if (!any) return 0;
  char list[512], detail[700];
  if (nfail) {
    fprintf(out, "  failure: seq %lld %s:", (long long)v->seq, any->op);
    print_states(g, v, out, " ");
    fprintf(out, "\n");
    tt_rank_list(g, v->tmp2, nfail, list, sizeof(list));
    snprintf(detail, sizeof(detail), "%s on ranks [%s] (%s)", fail->state, list, fail->status);
    set_problem(g, v, "group '%s' seq %lld (%s): %s", any->op, detail);
    return 1;
  }
  if (nrun && ndone && !all_p2p(g, v) && !g->unaligned) {
    fprintf(out, "  stall: seq %lld %s:", (long long)v->seq, any->op);
    print_states(g, v, out, " ");
    fprintf(out, "\n");
    int n = 0;
    for (int64_t r = 0; r < g->size; r++)
      if (v->e[r] && strcmp(v->e[r]->state, "completed")) v->tmp2[n++] = (int)r;
    tt_rank_list(g, v->tmp2, n, list, sizeof(list));
    snprintf(detail, sizeof(detail), "ranks [%s] still in it while the others completed it", list);
    set_problem(g, v, "group '%s' seq %lld (%s): %s", any->op, detail);
    return 1;
  }
  if (nrun && !v->inflight++) {
    fprintf(out, "  in flight: seq %lld %s:", (long long)v->seq, any->op);
    print_states(g, v, out, " ");
    fprintf(out, "\n");
  }
  if (nrun) v->inflight_last = v->seq;
  return 0;
}

/* Walk the union of all ranks' seqs in order; stop at the first problem. */
int tt_walk(grp_t *g, FILE *out) {
  int64_t n = g->size;
  int64_t *cur = calloc((size_t)n, sizeof(*cur));
  seqview_t v = {.cls = calloc((size_t)n, sizeof(int)),
                 .e = calloc((size_t)n, sizeof(void *)),
                 .tmp = calloc((size_t)n, sizeof(int)),
                 .tmp2 = calloc((size_t)n, sizeof(int))};
  int rc = -1;
  if (!cur || !v.cls || !v.e || !v.tmp || !v.tmp2) goto done;
  for (;;) {
    int64_t s = INT64_MAX;
    for (int64_t r = 0; r < n; r++) {
      const tt_dump_t *d = g->rank[r];
      if (d && cur[r] < d->nentries && d->entries[cur[r]].seq < s) s = d->entries[cur[r]].seq;
    }
    if (s == INT64_MAX) break;
    v.seq = s;
    for (int64_t r = 0; r < n; r++) {
      v.cls[r] = classify(g->rank[r], s, &v.e[r]);
      if (v.e[r]) cur[r]++;
    }
    int found = g->unaligned
                    ? check_outcome(g, &v, out)
                    : check_divergence(g, &v, out) || (!g->unaligned && check_stall(g, &v, out)) ||
                          check_outcome(g, &v, out);
    if (found) {
      for (int64_t r = 0; r < n; r++)
        if (v.cls[r] == C_DROPPED)
          fprintf(out, "  note: rank %d no longer has seq %lld (its ring starts at seq %lld)\n",
                  g->ref->ranks[r], (long long)s, (long long)g->rank[r]->dropped);
        else if (v.cls[r] == C_UNKNOWN)
          fprintf(out, "  note: rank %d's dump is truncated before seq %lld\n", g->ref->ranks[r],
                  (long long)s);
        else if (v.cls[r] == C_UNREADABLE)
          fprintf(out, "  note: rank %d's dump has an unreadable line where seq %lld would be\n",
                  g->ref->ranks[r], (long long)s);
      break;
    }
  }
  if (v.inflight > 1 && !g->problem)
    fprintf(out, "  in flight: %lld more ops, up to seq %lld\n", (long long)v.inflight - 1,
            (long long)v.inflight_last);
  rc = 0;
done:
  free(cur);
  free(v.cls);
  free(v.e);
  free(v.tmp);
  free(v.tmp2);
  return rc;
}
