/* run_util.c - see run_util.h. */
#include "run_util.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return strdup("");
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = malloc((size_t)n + 1);
  size_t got = fread(s, 1, (size_t)n, f);
  s[got] = 0;
  fclose(f);
  return s;
}

int ru_start(ru_proc_t *p, char *const *argv, char *const *extra_env) {
  memset(p, 0, sizeof(*p));
  snprintf(p->out_path, sizeof(p->out_path), "/tmp/tdist-ru-out-XXXXXX");
  snprintf(p->err_path, sizeof(p->err_path), "/tmp/tdist-ru-err-XXXXXX");
  int fo = mkstemp(p->out_path), fe = mkstemp(p->err_path);
  if (fo < 0 || fe < 0) return -1;
  fflush(NULL);
  p->started = now_s();
  p->pid = fork();
  if (p->pid == 0) {
    for (char *const *e = extra_env; e && *e; e++)
      putenv(*e);
    dup2(fo, 1);
    dup2(fe, 2);
    execv(argv[0], argv);
    perror("execv");
    _exit(127);
  }
  close(fo);
  close(fe);
  return p->pid > 0 ? 0 : -1;
}

int ru_wait(ru_proc_t *p, int timeout_s) {
  double deadline = p->started + timeout_s;
  int st = 0;
  for (;;) {
    pid_t r = waitpid(p->pid, &st, WNOHANG);
    if (r == p->pid) break;
    if (now_s() > deadline) {
      fprintf(stderr, "run_util: %d still running after %d s: killed\n", (int)p->pid, timeout_s);
      kill(p->pid, SIGKILL);
      waitpid(p->pid, &st, 0);
      st = -1;
      break;
    }
    usleep(5000);
  }
  p->seconds = now_s() - p->started;
  p->code = st == -1 ? -1 : WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  p->out = slurp(p->out_path);
  p->err = slurp(p->err_path);
  unlink(p->out_path);
  unlink(p->err_path);
  return p->code;
}

int ru_run(ru_proc_t *p, char *const *argv, char *const *extra_env, int timeout_s) {
  if (ru_start(p, argv, extra_env)) return -1;
  return ru_wait(p, timeout_s);
}

char *ru_peek_out(const ru_proc_t *p) { return slurp(p->out_path); }

void ru_free(ru_proc_t *p) {
  free(p->out);
  free(p->err);
  p->out = p->err = NULL;
}

int ru_count_lines(const char *s, const char *prefix, const char *needle) {
  int n = 0;
  size_t pl = strlen(prefix);
  while (s && *s) {
    const char *nl = strchr(s, '\n');
    size_t len = nl ? (size_t)(nl - s) : strlen(s);
    if (len >= pl && !strncmp(s, prefix, pl)) {
      const char *hit = strstr(s, needle);
      if (hit && hit + strlen(needle) <= s + len) n++;
    }
    s = nl ? nl + 1 : s + len;
  }
  return n;
}

int ru_proc_stat(pid_t pid, char *comm, size_t commlen, char *state, pid_t *ppid,
                 unsigned long long *start) {
  char path[64], buf[1024];
  snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  buf[n] = 0;
  /* "pid (comm) S ppid ...": comm may hold spaces and parentheses, so it
   * ends at the last ')'. Field 22 is the start time. */
  char *open = strchr(buf, '('), *close = strrchr(buf, ')');
  if (!open || !close || close < open) return -1;
  snprintf(comm, commlen, "%.*s", (int)(close - open - 1), open + 1);
  char st = 0;
  int pp = 0;
  unsigned long long t = 0;
  if (sscanf(close + 2,
             "%c %d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d "
             "%*d %llu",
             &st, &pp, &t) != 3)
    return -1;
  *state = st;
  *ppid = (pid_t)pp;
  *start = t;
  return 0;
}
