/*
 * tdist-trace - merge the flight-recorder dumps of all ranks, name the first
 * op on which they diverge, stall or fail, and write a Chrome trace-event
 * file for Perfetto (docs/flight-recorder.md).
 *
 *   tdist-trace [-o chrome.json] [--group NAME|UID] dump.json ...
 *   tdist-trace [-o chrome.json] [--group NAME|UID] --prefix /tmp/tdist_trace_
 *
 * A directory argument (or --prefix naming one) stands for its *.rank*.json
 * files; a prefix for PREFIX*.rank*.json. Exit status: 0 no problem found,
 * 1 a problem was found (the report says which), 2 bad input or usage (a
 * rejected file, no dumps, an unwritable output) - the report of the files
 * that could be read is still printed.
 *
 * Threads: main thread only. Memory: the dump list below owns every dump.
 */
#include <glob.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "trace_tool.h"

typedef struct inputs {
  char **paths;
  int n, cap;
} inputs_t;

static void usage(FILE *f) {
  fprintf(
      f, "usage: tdist-trace [-o chrome.json] [--group NAME|UID] [--prefix P] [dump.json|dir ...]\n"
         "  -o, --output FILE  write a Chrome trace-event file (open it in Perfetto)\n"
         "  --group NAME|UID   only the group with this name or uid\n"
         "  --prefix P         read P*.rank*.json (P/*.rank*.json for a directory);\n"
         "                     TDIST_TRACE_PREFIX's default is /tmp/tdist_trace_\n"
         "exit status: 0 no problem found, 1 problem found, 2 bad input\n");
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

int main(int argc, char **argv) {
  inputs_t in = {0};
  const char *output = NULL, *group = NULL;
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
