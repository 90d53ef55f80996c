/*
 * report.c - group the dumps by group uid, check membership, print the
 * per-group report and the final verdict (tt_analyze).
 *
 * The dumps are all of one job (tdist_trace.c leaves the others out); the
 * report's first line names it.
 *
 * Membership: the first dump of a uid is the reference; a dump whose group
 * name, size or ranks list differs is reported and left out (two dumps that
 * disagree about who is in the group cannot be compared op by op). Two dumps
 * of the same group rank (a stale file from an earlier run): the newer one
 * (dumped_us) is kept.
 */
#include <stdlib.h>
#include <string.h>

#include "trace_tool.h"

static int same_members(const tt_dump_t *a, const tt_dump_t *b) {
  if (strcmp(a->group_name, b->group_name) || a->group_size != b->group_size) return 0;
  return !memcmp(a->ranks, b->ranks, sizeof(int) * (size_t)a->group_size);
}

static void print_ranks_of(FILE *out, const tt_dump_t *d) {
  fprintf(out, "size %lld, ranks [", (long long)d->group_size);
  for (int64_t i = 0; i < d->group_size && i < 16; i++)
    fprintf(out, "%s%d", i ? "," : "", d->ranks[i]);
  fprintf(out, "%s]", d->group_size > 16 ? ",..." : "");
}

/* Add d to its group (creating it); 0, or -1 when out of memory. */
static int add_dump(tt_group_t *groups, int *ngroups, tt_dump_t *d, FILE *out) {
  tt_group_t *g = NULL;
  for (int i = 0; i < *ngroups && !g; i++)
    if (!strcmp(groups[i].ref->uid, d->uid)) g = &groups[i];
  if (!g) {
    g = &groups[(*ngroups)++];
    memset(g, 0, sizeof(*g));
    g->ref = d;
    g->size = d->group_size;
    g->rank = calloc((size_t)g->size, sizeof(*g->rank));
    if (!g->rank) return -1;
  } else if (!same_members(g->ref, d)) {
    fprintf(out, "membership: %s (group '%s' uid %s, rank %lld) says ", d->path, d->group_name,
            d->uid, (long long)d->global_rank);
    print_ranks_of(out, d);
    fprintf(out, " but %s says '%s' ", g->ref->path, g->ref->group_name);
    print_ranks_of(out, g->ref);
    fprintf(out, "; %s left out\n", d->path);
    g->bad_membership = 1;
    return 0;
  }
  tt_dump_t **slot = &g->rank[d->group_rank];
  if (*slot) {
    tt_dump_t *keep = (*slot)->dumped_us >= d->dumped_us ? *slot : d;
    fprintf(out, "warning: two dumps of group '%s' rank %lld: %s and %s; keeping the newer %s\n",
            d->group_name, (long long)d->global_rank, (*slot)->path, d->path, keep->path);
    *slot = keep;
  } else {
    *slot = d;
  }
  return 0;
}

static int64_t last_completed(const tt_dump_t *d) {
  for (int64_t i = d->nentries - 1; i >= 0; i--)
    if (!strcmp(d->entries[i].state, "completed")) return d->entries[i].seq;
  return -1;
}

static void rank_line(FILE *out, const tt_dump_t *d) {
  fprintf(out, "  rank %lld (group rank %lld, %s:%lld): ", (long long)d->global_rank,
          (long long)d->group_rank, d->host[0] ? d->host : "?", (long long)d->pid);
  if (d->nentries)
    fprintf(out, "seqs %lld..%lld in its ring", (long long)d->entries[0].seq,
            (long long)d->entries[d->nentries - 1].seq);
  else
    fprintf(out, "no op in its ring");
  if (d->dropped) fprintf(out, " (%lld older dropped)", (long long)d->dropped);
  int64_t lc = last_completed(d);
  if (lc >= 0)
    fprintf(out, ", last completed seq %lld", (long long)lc);
  else
    fprintf(out, ", none completed");
  fprintf(out, ", next seq %lld", (long long)d->next_seq);
  if (d->truncated) fprintf(out, ", file truncated");
  if (d->skipped)
    fprintf(out, ", %lld unreadable line%s skipped", (long long)d->skipped,
            d->skipped == 1 ? "" : "s");
  if (d->aborted) fprintf(out, ", aborted: %s", d->abort_reason);
  fprintf(out, "\n");
}

/* Per-rank lines: all of them for small groups; for big ones the first four
 * and those that differ from group rank 0's (others are counted). */
static void rank_table(FILE *out, const tt_group_t *g) {
  const tt_dump_t *base = NULL;
  int64_t hidden = 0;
  for (int64_t r = 0; r < g->size; r++) {
    const tt_dump_t *d = g->rank[r];
    if (!d) continue;
    if (!base) base = d;
    int alike = d->next_seq == base->next_seq && last_completed(d) == last_completed(base) &&
                d->aborted == base->aborted && !d->truncated && !d->skipped;
    if (g->size <= 16 || r < 4 || !alike)
      rank_line(out, d);
    else
      hidden++;
  }
  if (hidden) fprintf(out, "  (%lld more ranks like the first)\n", (long long)hidden);
}

static int report_group(FILE *out, tt_group_t *g) {
  tt_dump_t *ref = g->ref;
  int *tmp = calloc((size_t)g->size, sizeof(int));
  if (!tmp) return -1;
  char list[512], missing[512];
  fprintf(out, "group '%s' (uid %s, %s backend, size %lld)\n", ref->group_name, ref->uid,
          ref->backend[0] ? ref->backend : "?", (long long)g->size);
  rank_table(out, g);
  int nmiss = 0, nabort = 0;
  for (int64_t r = 0; r < g->size; r++)
    if (!g->rank[r]) tmp[nmiss++] = (int)r;
  tt_rank_list(g, tmp, nmiss, missing, sizeof(missing));
  if (nmiss)
    fprintf(out, "  missing: no dump from %s [%s] (killed before writing one, or elsewhere)\n",
            nmiss == 1 ? "rank" : "ranks", missing);
  int rc = tt_walk(g, out);
  if (!g->problem && g->bad_membership) {
    g->problem = 1;
    snprintf(g->verdict, sizeof(g->verdict), "group '%s': ranks disagree on its membership",
             ref->group_name);
  }
  const tt_dump_t *aborted = NULL;
  for (int64_t r = 0; r < g->size; r++)
    if (g->rank[r] && g->rank[r]->aborted) {
      tmp[nabort++] = (int)r;
      if (!aborted) aborted = g->rank[r];
    }
  if (!g->problem && nmiss) {
    g->problem = 1;
    snprintf(g->verdict, sizeof(g->verdict), "group '%s': no dump from ranks [%s]", ref->group_name,
             missing);
  }
  if (!g->problem && aborted) {
    g->problem = 1;
    tt_rank_list(g, tmp, nabort, list, sizeof(list));
    snprintf(g->verdict, sizeof(g->verdict), "group '%s' aborted on ranks [%s]: %s",
             ref->group_name, list, aborted->abort_reason);
  }
  if (!g->problem_us) g->problem_us = INT64_MAX;
  if (g->problem)
    fprintf(out, "  verdict: %s\n", g->verdict);
  else
    fprintf(out, "  verdict: no problem found%s\n",
            g->unaligned ? " (ops after the p2p seq drift checked for failures only)" : "");
  free(tmp);
  return rc;
}

int tt_analyze(tt_dump_t **dumps, int n, const char *only, FILE *out) {
  tt_group_t *groups = calloc((size_t)(n ? n : 1), sizeof(*groups));
  int ngroups = 0, nsel = 0, rc = TT_EXIT_BAD_INPUT;
  if (!groups) goto fail;
  for (int i = 0; i < n; i++)
    nsel += tt_group_selected(dumps[i], only);
  if (nsel) { /* all dumps are of one job (tdist_trace.c) */
    const char *job = dumps[0]->job;
    fprintf(out, "job %s%s: %d dump%s\n\n", job, strcmp(job, "-") ? "" : " (unknown)", nsel,
            nsel == 1 ? "" : "s");
  }
  for (int i = 0; i < n; i++) {
    if (!tt_group_selected(dumps[i], only)) continue;
    if (add_dump(groups, &ngroups, dumps[i], out)) goto fail;
  }
  if (!nsel) {
    if (only)
      fprintf(stderr, "tdist-trace: no dump of group '%s'\n", only);
    else
      fprintf(stderr, "tdist-trace: no dump to analyse\n");
    goto done;
  }
  const tt_group_t *first = NULL;
  for (int i = 0; i < ngroups; i++) {
    if (i) fprintf(out, "\n");
    if (report_group(out, &groups[i])) goto fail;
    if (groups[i].problem && (!first || groups[i].problem_us < first->problem_us))
      first = &groups[i];
  }
  fprintf(out, "\n");
  if (first)
    fprintf(out, "first problem: %s\n", first->verdict);
  else
    fprintf(out, "no problem found (%d group%s, %d dump%s)\n", ngroups, ngroups == 1 ? "" : "s",
            nsel, nsel == 1 ? "" : "s");
  rc = first ? TT_EXIT_PROBLEM : TT_EXIT_OK;
  goto done;
fail:
  fprintf(stderr, "tdist-trace: out of memory\n");
  rc = TT_EXIT_BAD_INPUT;
done:
  for (int i = 0; groups && i < ngroups; i++)
    free(groups[i].rank);
  free(groups);
  return rc;
}
