/*
 * log.c - the logger. Settings come from the environment once (first call);
 * lines are formatted into a stack buffer and written with one write(2) so
 * lines of different threads and processes do not interleave.
 */
#include "util/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "util/param.h"

_Atomic int tdist__log_level_ = -1;
unsigned tdist__log_subsys_ = TDIST_SUB_ALL;

static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static int log_fd = 2;
static char host[64] = "?";

static const struct {
  const char *name;
  unsigned bit;
} subsys_names[] = {{"CORE", TDIST_SUB_CORE},       {"STORE", TDIST_SUB_STORE},
                    {"CPU", TDIST_SUB_CPU},         {"NCCL", TDIST_SUB_NCCL},
                    {"INIT", TDIST_SUB_INIT},       {"TOOL", TDIST_SUB_TOOL},
                    {"BACKEND", TDIST_SUB_BACKEND}, {"ALL", TDIST_SUB_ALL}};

static unsigned parse_subsys(const char *s) {
  int exclude = (*s == '^');
  unsigned mask = 0;
  char buf[256];
  snprintf(buf, sizeof(buf), "%s", s + exclude);
  char *save = NULL;
  for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
    for (size_t i = 0; i < sizeof(subsys_names) / sizeof(subsys_names[0]); i++)
      if (strcasecmp(tok, subsys_names[i].name) == 0) mask |= subsys_names[i].bit;
  return exclude ? (TDIST_SUB_ALL & ~mask) : mask;
}

/* Expand %h and %p in TDIST_DEBUG_FILE. */
static void open_file(const char *pattern) {
  char path[512];
  size_t o = 0;
  for (const char *p = pattern; *p && o < sizeof(path) - 32; p++) {
    if (p[0] == '%' && p[1] == 'h') {
      o += (size_t)snprintf(path + o, sizeof(path) - o, "%s", host);
      p++;
    } else if (p[0] == '%' && p[1] == 'p') {
      o += (size_t)snprintf(path + o, sizeof(path) - o, "%d", (int)getpid());
      p++;
    } else {
      path[o++] = *p;
    }
  }
  path[o] = '\0';
  FILE *f = fopen(path, "a");
  if (f) log_fd = fileno(f); /* kept open for the life of the process */
}

static void do_init(void) {
  gethostname(host, sizeof(host) - 1);
  int level = TDIST_LOG_NONE;
  const char *lv = tdist__param_str("TDIST_DEBUG", NULL);
  if (lv) {
    if (strcasecmp(lv, "WARN") == 0)
      level = TDIST_LOG_WARN;
    else if (strcasecmp(lv, "INFO") == 0)
      level = TDIST_LOG_INFO;
    else if (strcasecmp(lv, "TRACE") == 0)
      level = TDIST_LOG_TRACE;
  }
  const char *sub = tdist__param_str("TDIST_DEBUG_SUBSYS", NULL);
  if (sub) tdist__log_subsys_ = parse_subsys(sub);
  const char *file = tdist__param_str("TDIST_DEBUG_FILE", NULL);
  if (file) open_file(file);
  atomic_store(&tdist__log_level_, level);
}

void tdist__log_init(void) { pthread_once(&log_once, do_init); }

static const char *subsys_name(unsigned sub) {
  for (size_t i = 0; i < sizeof(subsys_names) / sizeof(subsys_names[0]); i++)
    if (subsys_names[i].bit == sub) return subsys_names[i].name;
  return "?";
}

void tdist__log(int level, unsigned subsys, const char *file, int line, const char *fmt, ...) {
  static const char *lvl[] = {"NONE", "WARN", "INFO", "TRACE"};
  char buf[1024];
  int n = snprintf(buf, sizeof(buf), "%s:%d:%ld TDIST %s [%s] ", host, (int)getpid(),
                   (long)syscall(SYS_gettid), lvl[level], subsys_name(subsys));
  if (level == TDIST_LOG_TRACE) {
    const char *base = strrchr(file, '/');
    n += snprintf(buf + n, sizeof(buf) - (size_t)n, "%s:%d ", base ? base + 1 : file, line);
  }
  va_list ap;
  va_start(ap, fmt);
  n += vsnprintf(buf + n, sizeof(buf) - (size_t)n, fmt, ap);
  va_end(ap);
  if (n > (int)sizeof(buf) - 2) n = (int)sizeof(buf) - 2;
  buf[n++] = '\n';
  ssize_t w = write(log_fd, buf, (size_t)n);
  (void)w;
}
