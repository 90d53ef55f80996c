/*
 * tdist-trace - merge the flight-recorder dumps of all ranks, name the first
 * op on which they diverge, stall or fail, and write a Chrome trace-event
 * file for Perfetto (docs/flight-recorder.md).
 *
 *   tdist-trace [-o chrome.json] [--group NAME|UID] [--job ID] dump.json ...
 *   tdist-trace [-o chrome.json] [--group NAME|UID] [--job ID] --prefix /tmp/tdist_trace_
 *
 * A directory argument (or --prefix naming one) stands for its *.rank*.json
 * files; a prefix for PREFIX*.rank*.json. The dumps analysed together must be
 * of one job (the "job" header member): group uids repeat from job to job
 * (the world group's is always the same), so dumps of an earlier job would
 * be taken for ranks of this one. Inputs holding several jobs are refused
 * unless --job picks one; the others are then skipped. Exit status: 0 no
 * problem found, 1 a problem was found (the report says which), 2 bad input
 * or usage (a rejected file, no dumps, several jobs, an unwritable output) -
 * the report of the files that could be read is still printed, except when
 * the jobs are mixed.
 *
 * Threads: main thread only. Memory: the dump list below owns every dump.
 */
#include <glob.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "trace_tool.h"

typedef struct inputs {
  char **paths;
  int n, cap;
} inputs_t;

static void usage(FILE *f) {
  fprintf(f, "usage: tdist-trace [-o chrome.json] [--group NAME|UID] [--job ID] [--prefix P]\n"
             "                   [dump.json|dir ...]\n"
             "  -o, --output FILE  write a Chrome trace-event file (open it in Perfetto)\n"
             "  --group NAME|UID   only the group with this name or uid\n"
             "  --job ID           only the dumps of this job (needed when the inputs hold\n"
             "                     dumps of several jobs; '-': dumps without a job id)\n"
             "  --prefix P         read P*.rank*.json (P/*.rank*.json for a directory);\n"
             "                     TDIST_TRACE_PREFIX's default is /tmp/tdist_trace_\n"
             "exit status: 0 no problem found, 1 problem found, 2 bad input (or several jobs)\n");
}

static int add_path(inputs_t *in, const char *p) {
  if (in->n == in->cap) {
    int cap = in->cap ? in->cap * 2 : 16;
    char **n = realloc(in->paths, sizeof(*n) * (size_t)cap);
    if (!n) return -1;
    in->paths = n;
    in->cap = cap;
  }
  if (!(in->paths[in->n] = strdup(p))) return -1;
  in->n++;
  return 0;
}

/* Add the dumps under prefix (or directory) `p`; 0 when some were found. */
static int add_prefix(inputs_t *in, const char *p) {
  struct stat st;
  int dir = stat(p, &st) == 0 && S_ISDIR(st.st_mode);
  size_t len = strlen(p) + 32;
  char *pat = malloc(len);
  glob_t gl;
  int rc = -1;
  if (!pat) return -1;
  snprintf(pat, len, "%s%s*.rank*.json", p, dir && p[strlen(p) - 1] != '/' ? "/" : "");
  int g = glob(pat, 0, NULL, &gl);
  if (g == 0) {
    rc = 0;
    for (size_t i = 0; i < gl.gl_pathc && rc == 0; i++)
      rc = add_path(in, gl.gl_pathv[i]);
    globfree(&gl);
  } else {
    fprintf(stderr, "tdist-trace: no dump matches %s\n", pat);
    if (g == GLOB_NOMATCH) globfree(&gl);
  }
  free(pat);
  return rc;
}

/* The distinct jobs of the dumps, with how many dumps each, newest first. */
typedef struct job_count {
  const char *job; /* points into a dump */
  int n;
  int64_t newest_us;   /* latest dumped_us of its dumps */
  const char *example; /* path of its first dump */
} job_count_t;

static int newest_first(const void *a, const void *b) {
  const job_count_t *x = a, *y = b;
  return x->newest_us < y->newest_us   ? 1
         : x->newest_us > y->newest_us ? -1
                                       : strcmp(x->job, y->job);
}

static int count_jobs(tt_dump_t **dumps, int n, job_count_t *jobs) {
  int nj = 0;
  for (int i = 0; i < n; i++) {
    int k = 0;
    while (k < nj && strcmp(jobs[k].job, dumps[i]->job))
      k++;
    if (k == nj) jobs[nj++] = (job_count_t){dumps[i]->job, 0, INT64_MIN, dumps[i]->path};
    jobs[k].n++;
    if (dumps[i]->dumped_us > jobs[k].newest_us) jobs[k].newest_us = dumps[i]->dumped_us;
  }
  qsort(jobs, (size_t)nj, sizeof(*jobs), newest_first);
  return nj;
}

/* "A (4 files), B (3 files)" for the jobs other than `except` (NULL: all),
 * at most 8 named. */
static void job_list(const job_count_t *jobs, int nj, const char *except, char *buf, size_t len) {
  size_t off = 0;
  int shown = 0, left = 0;
  buf[0] = '\0';
  for (int k = 0; k < nj; k++) {
    if (except && !strcmp(jobs[k].job, except)) continue;
    if (shown == 8) {
      left++;
      continue;
    }
    int w = snprintf(buf + off, len - off, "%s%s (%d file%s)", shown ? ", " : "", jobs[k].job,
                     jobs[k].n, jobs[k].n == 1 ? "" : "s");
    if (w < 0 || (size_t)w >= len - off) return;
    off += (size_t)w;
    shown++;
  }
  if (left) snprintf(buf + off, len - off, " and %d more job%s", left, left == 1 ? "" : "s");
}

/* Keep only one job's dumps: those of `want`, or when it is NULL the only job
 * there is. Returns the number kept (the others are freed), or -1 after
 * printing why (several jobs without --job, or none of `want`). */
static int select_job(tt_dump_t **dumps, int n, const char *want) {
  job_count_t *jobs = calloc((size_t)n, sizeof(*jobs));
  char list[1024];
  int kept = -1;
  if (!jobs) {
    fprintf(stderr, "tdist-trace: out of memory\n");
    return -1;
  }
  int nj = count_jobs(dumps, n, jobs);
  if (!want && nj > 1) {
    fprintf(stderr,
            "tdist-trace: the dumps are of %d jobs, which cannot be analysed together "
            "(group uids repeat from job to job):\n",
            nj);
    for (int k = 0; k < nj && k < 20; k++) {
      char when[64] = "?";
      time_t t = (time_t)(jobs[k].newest_us / 1000000);
      struct tm tm;
      if (localtime_r(&t, &tm)) strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", &tm);
      fprintf(stderr, "  job %s: %d file%s, last dumped %s (%s%s)\n", jobs[k].job, jobs[k].n,
              jobs[k].n == 1 ? "" : "s", when, jobs[k].example, jobs[k].n > 1 ? ", ..." : "");
    }
    if (nj > 20) fprintf(stderr, "  ... and %d older jobs\n", nj - 20);
    fprintf(stderr, "tdist-trace: pick one with --job ID (newest first above)\n");
    goto done;
  }
  if (want) {
    int k = 0;
    while (k < nj && strcmp(jobs[k].job, want))
      k++;
    if (k == nj) {
      job_list(jobs, nj, NULL, list, sizeof(list));
      fprintf(stderr, "tdist-trace: no dump of job '%s' (found: %s)\n", want, list);
      goto done;
    }
    if (nj > 1) {
      job_list(jobs, nj, want, list, sizeof(list));
      fprintf(stderr, "tdist-trace: note: --job %s: skipping %d dump%s of other jobs: %s\n", want,
              n - jobs[k].n, n - jobs[k].n == 1 ? "" : "s", list);
    }
  }
  kept = 0;
  for (int i = 0; i < n; i++) {
    if (!want || !strcmp(dumps[i]->job, want))
      dumps[kept++] = dumps[i];
    else
      tt_dump_free(dumps[i]);
  }
done:
  free(jobs);
  return kept;
}

int main(int argc, char **argv) {
  inputs_t in = {0};
  const char *output = NULL, *group = NULL, *job = NULL;
  tt_dump_t **dumps = NULL;
  int ndumps = 0, bad = 0, rc = TT_EXIT_BAD_INPUT;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    int has_val = i + 1 < argc;
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      rc = TT_EXIT_OK;
      goto done;
    } else if ((!strcmp(a, "-o") || !strcmp(a, "--output")) && has_val) {
      output = argv[++i];
    } else if (!strcmp(a, "--group") && has_val) {
      group = argv[++i];
    } else if (!strcmp(a, "--job") && has_val) {
      job = argv[++i];
    } else if (!strcmp(a, "--prefix") && has_val) {
      if (add_prefix(&in, argv[++i])) bad++;
    } else if (a[0] == '-' && a[1]) {
      fprintf(stderr, "tdist-trace: unknown option or missing value: %s\n", a);
      usage(stderr);
      goto done;
    } else {
      struct stat st;
      int r = stat(a, &st) == 0 && S_ISDIR(st.st_mode) ? add_prefix(&in, a) : add_path(&in, a);
      if (r) bad++;
    }
  }
  if (!in.n) {
    if (!bad) usage(stderr);
    goto done;
  }
  dumps = calloc((size_t)in.n, sizeof(*dumps));
  if (!dumps) goto done;
  for (int i = 0; i < in.n; i++) {
    if (tt_parse_file(in.paths[i], stderr, &dumps[ndumps]) == 0)
      ndumps++;
    else
      bad++;
  }
  if (!ndumps) {
    fprintf(stderr, "tdist-trace: no readable dump\n");
    goto done;
  }
  int kept = select_job(dumps, ndumps, job);
  if (kept < 0) goto done; /* every dump is still owned by the list */
  ndumps = kept;
  fflush(stderr);
  rc = tt_analyze(dumps, ndumps, group, stdout);
  if (output && rc != TT_EXIT_BAD_INPUT) {
    if (tt_write_chrome(dumps, ndumps, group, output) == 0)
      printf("chrome trace: %s (open it in https://ui.perfetto.dev)\n", output);
    else
      bad++;
  }
  if (bad) {
    fprintf(stderr, "tdist-trace: %d input%s rejected or unreadable\n", bad, bad == 1 ? "" : "s");
    rc = TT_EXIT_BAD_INPUT;
  }
done:
  for (int i = 0; i < ndumps; i++)
    tt_dump_free(dumps[i]);
  free(dumps);
  for (int i = 0; i < in.n; i++)
    free(in.paths[i]);
  free(in.paths);
  return rc;
}
