/*
 * trace_tool.h - internals of tdist-trace, the flight-recorder merge tool
 * (docs/flight-recorder.md).
 *
 * The tool is a plain single-threaded program that does not link the tdist
 * library: it must run wherever the dump files were copied to.
 *
 *   parse.c    reads one dump file (JSON Lines written by src/core/trace/trace.c)
 *              into a tt_dump_t with json-c, line by line.
 *   analyze.c  groups dumps by group uid, checks membership, finds the first
 *              divergence / stall / failure of each group, prints the report.
 *   chrome.c   writes the Chrome trace-event JSON file.
 *   tdist_trace.c  command line, file discovery, one job at a time, exit codes.
 *
 * Ownership: every tt_dump_t and what it points to is heap memory owned by
 * the dump list in main(); tt_dump_free releases one dump.
 */
#ifndef TDIST_TRACE_TOOL_H
#define TDIST_TRACE_TOOL_H

#include <stdint.h>
#include <stdio.h>

/* Exit codes of the tool. */
enum { TT_EXIT_OK = 0, TT_EXIT_PROBLEM = 1, TT_EXIT_BAD_INPUT = 2 };

/* Longest accepted ranks list (group size) in a dump. */
#define TT_MAX_GROUP_SIZE (1 << 20)

/* Longest job id ("job" header member): printable ASCII without '"'. */
#define TT_JOB_MAX 63

/* One record of the ring, as written on an entry line. */
typedef struct tt_entry {
  int64_t seq;
  char op[24];
  char dtype[16];
  char redop[16];
  char state[16];
  char status[48]; /* "" while the op has not finished */
  int64_t count;
  int64_t root;                               /* root or peer; -1 for ops without one */
  int64_t t_enqueue_us, t_start_us, t_end_us; /* wall clock; 0 = not reached */
} tt_entry_t;

/* Seqs [lo, hi) of a dump that no readable line covers: an unreadable entry
 * line was skipped there (unknown for that rank, not missing). */
typedef struct tt_hole {
  int64_t lo, hi;
} tt_hole_t;

/* One dump file: one group as seen by one rank. */
typedef struct tt_dump {
  char *path;
  int64_t version, pid, global_rank;
  char job[TT_JOB_MAX + 1]; /* the job's id; "-" when unknown or not in the file */
  char host[128];
  char backend[32];
  char *group_name;
  char uid[24];
  int64_t group_rank, group_size;
  int *ranks; /* group_size global ranks */
  int64_t nranks;
  int64_t next_seq, recorded, dropped;
  int aborted;
  char *abort_reason;
  int64_t dumped_us;
  tt_entry_t *entries; /* ascending seq */
  int64_t nentries, cap_entries;
  int truncated;    /* the file ends early (a killed writer); entries so far kept */
  int64_t skipped;  /* unreadable entry lines skipped (with a warning) */
  tt_hole_t *holes; /* where they were, ascending */
  int64_t nholes, cap_holes;
} tt_dump_t;

/* parse.c: read `path`. Returns 0 and a new dump in *out, or -1 after
 * printing "tdist-trace: <path>:<line>: <why>" to `err`. Warnings (a
 * truncated file, a skipped unreadable line) also go to `err`. */
int tt_parse_file(const char *path, FILE *err, tt_dump_t **out);
void tt_dump_free(tt_dump_t *d);

/* Op classes, used by the analysis and the Chrome output. */
int tt_op_has_root(const char *op);     /* broadcast, reduce, gather, scatter */
int tt_op_is_p2p(const char *op);       /* send, recv, batch_p2p */
int tt_op_has_redop(const char *op);    /* all_reduce, reduce, reduce_scatter */
int tt_state_failed(const char *state); /* failed, timed_out, aborted */

/* The dumps of one group, by group rank (report.c builds it, analyze.c
 * fills in the problem). */
typedef struct tt_group {
  tt_dump_t *ref;   /* the first dump seen: the membership reference */
  tt_dump_t **rank; /* [size]: each group rank's dump, NULL = missing */
  int64_t size;
  int bad_membership; /* some dump disagreed with ref (and was left out) */
  int unaligned;      /* p2p ops shifted the seqs of some ranks: compare no more */
  int problem;        /* a problem was found; verdict says which */
  char verdict[1536]; /* name + seq + op + a detail of up to 1023 bytes */
  int64_t problem_us; /* enqueue time of the problem op, to order groups */
} tt_group_t;

/* analyze.c: walk g's seqs in order, print the first problem (and notes),
 * fill g->problem/verdict/problem_us. Returns 0, or -1 when out of memory. */
int tt_walk(tt_group_t *g, FILE *out);
/* The global ranks of group ranks gr[0..n) as "0,1,3" (runs of three or
 * more as "4-9"; at most 40 shown), into buf. */
void tt_rank_list(const tt_group_t *g, const int *gr, int n, char *buf, size_t len);

/* report.c: analyse the dumps (only groups named or with uid `only_group`
 * when not NULL), print the report to `out`. The dumps must all be of one
 * job (main() sees to it); the report's first line names it. Returns TT_EXIT_OK when no
 * problem was found, TT_EXIT_PROBLEM otherwise, or TT_EXIT_BAD_INPUT when
 * no dump matched `only_group`. */
int tt_analyze(tt_dump_t **dumps, int n, const char *only_group, FILE *out);

/* chrome.c: write the Chrome trace-event file of the dumps (same filter).
 * Returns 0, or -1 after printing why to stderr. */
int tt_write_chrome(tt_dump_t **dumps, int n, const char *only_group, const char *path);

/* Does dump `d` belong to the group selected by `only_group` (NULL = all)? */
int tt_group_selected(const tt_dump_t *d, const char *only_group);

#endif
