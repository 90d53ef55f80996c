/*
 * ranks.c - start the ranks, relay their output, forward signals, fail fast
 * (or, with --no-fail-fast, let the others go on and report at the end).
 *
 * Fail fast: after the first failure the other ranks get a dump grace to exit
 * by themselves (a tdist rank notices a peer's failure within milliseconds,
 * writes its flight-recorder dump and usually exits with an error); killing
 * them at once lost those dumps. Then SIGTERM, then SIGKILL after grace_s.
 *
 * Ownership: the job (trun_job_t) and its ranks belong to main.c; this file
 * fills in pids, pipes and the outcome. All of it runs on the launcher's main
 * thread; between fork and exec the child only calls async-signal-safe
 * functions, because the store server thread may hold locks at fork time.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tdistrun.h"

static const int handled_sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGCHLD};
#define NSIGS (int)(sizeof(handled_sigs) / sizeof(handled_sigs[0]))

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

const char *trun_signame(int sig, char *buf, size_t len) {
  const char *abbrev = sigabbrev_np(sig);
  if (abbrev)
    snprintf(buf, len, "SIG%s", abbrev);
  else
    snprintf(buf, len, "signal %d", sig);
  return buf;
}

void trun_describe_status(int status, char *buf, size_t len) {
  char name[32];
  if (WIFEXITED(status))
    snprintf(buf, len, "exited with code %d", WEXITSTATUS(status));
  else if (WIFSIGNALED(status))
    snprintf(buf, len, "was killed by signal %d (%s)", WTERMSIG(status),
             trun_signame(WTERMSIG(status), name, sizeof(name)));
  else
    snprintf(buf, len, "ended with status 0x%x", status);
}

int trun_signals_block(void) {
  sigset_t set;
  sigemptyset(&set);
  for (int i = 0; i < NSIGS; i++)
    sigaddset(&set, handled_sigs[i]);
  if (pthread_sigmask(SIG_BLOCK, &set, NULL) != 0) return -1;
  /* A closed stdout must not kill the launcher (and orphan the ranks). */
  signal(SIGPIPE, SIG_IGN);
  return signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
}

/* Write all of buf to fd (a full line at once, so lines never interleave). */
static void write_all(int fd, const char *buf, size_t len) {
  while (len > 0) {
    ssize_t w = write(fd, buf, len);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return; /* stdout gone: drop the output, keep supervising */
    buf += w;
    len -= (size_t)w;
  }
}

/* Print buf[0..len) as one line of `rank`, adding the prefix and a newline. */
static void emit_line(const trun_job_t *job, const trun_rank_t *r, const trun_stream_t *s,
                      const char *line, size_t len) {
  char stackbuf[512], *out = stackbuf;
  char prefix[32] = "";
  if (job->prefix) snprintf(prefix, sizeof(prefix), "[rank %d] ", r->global_rank);
  size_t pl = strlen(prefix), total = pl + len + 1;
  if (total > sizeof(stackbuf) && !(out = malloc(total))) return;
  memcpy(out, prefix, pl);
  memcpy(out + pl, line, len);
  out[pl + len] = '\n';
  write_all(s->out_fd, out, total);
  if (out != stackbuf) free(out);
}

/* Read what is available on one stream and print its complete lines. At EOF
 * (or when `final`, after the rank exited) the partial line is printed too. */
static void pump(const trun_job_t *job, const trun_rank_t *r, trun_stream_t *s) {
  for (;;) {
    if (s->len == TRUN_LINE_MAX) { /* overlong line: split it */
      emit_line(job, r, s, s->buf, s->len);
      s->len = 0;
    }
    ssize_t n = read(s->fd, s->buf + s->len, TRUN_LINE_MAX - s->len);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n <= 0) { /* EOF or error: flush and close */
      if (s->len) emit_line(job, r, s, s->buf, s->len);
      s->len = 0;
      close(s->fd);
      s->fd = -1;
      return;
    }
    size_t start = 0, end = s->len + (size_t)n;
    for (size_t i = s->len; i < end; i++) {
      if (s->buf[i] != '\n') continue;
      emit_line(job, r, s, s->buf + start, i - start);
      start = i + 1;
    }
    memmove(s->buf, s->buf + start, end - start);
    s->len = end - start;
  }
}

/* Send sig to a rank's process group (so helpers it started get it too). */
static void signal_rank(trun_rank_t *r, int sig) {
  if (r->pid <= 0) return;
  if (kill(-r->pid, sig) != 0) kill(r->pid, sig);
  if (sig == SIGTERM || sig == SIGKILL || sig == SIGINT || sig == SIGHUP || sig == SIGQUIT)
    r->stopped = 1;
}

int trun_spawn(trun_job_t *job, char *const *argv, char **const *envs) {
  /* Resolve the program in the parent: execve is async-signal-safe, execvp
   * is not guaranteed to be. */
  char path[4096];
  if (strchr(argv[0], '/')) {
    snprintf(path, sizeof(path), "%s", argv[0]);
  } else {
    const char *p = getenv("PATH");
    int found = 0;
    for (p = p ? p : "/usr/bin:/bin"; *p && !found;) {
      size_t dl = strcspn(p, ":");
      snprintf(path, sizeof(path), "%.*s/%s", (int)(dl ? dl : 1), dl ? p : ".", argv[0]);
      found = access(path, X_OK) == 0;
      p += dl + (p[dl] == ':');
    }
    if (!found) {
      fprintf(stderr, "tdistrun: %s: command not found\n", argv[0]);
      return -1;
    }
  }
  if (access(path, X_OK) != 0) {
    fprintf(stderr, "tdistrun: %s: %s\n", path, strerror(errno));
    return -1;
  }
  int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
  sigset_t empty;
  sigemptyset(&empty);
  pid_t launcher = getpid();
  fflush(NULL);
  for (int i = 0; i < job->nlocal; i++) {
    trun_rank_t *r = &job->ranks[i];
    int po[2] = {-1, -1}, pe[2] = {-1, -1};
    r->out.buf = malloc(TRUN_LINE_MAX);
    r->err.buf = malloc(TRUN_LINE_MAX);
    if (!r->out.buf || !r->err.buf || pipe2(po, O_CLOEXEC) || pipe2(pe, O_CLOEXEC)) {
      fprintf(stderr, "tdistrun: cannot create pipes for rank %d: %s\n", r->global_rank,
              strerror(errno));
      goto fail;
    }
    pid_t pid = fork();
    if (pid < 0) {
      fprintf(stderr, "tdistrun: fork: %s\n", strerror(errno));
      goto fail;
    }
    if (pid == 0) {
      /* Child: own process group, so the launcher decides who gets signals;
       * die with the launcher; default signal dispositions and mask. */
      setpgid(0, 0);
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != launcher) _exit(127);
      for (int k = 0; k < NSIGS; k++)
        signal(handled_sigs[k], SIG_DFL);
      signal(SIGPIPE, SIG_DFL);
      sigprocmask(SIG_SETMASK, &empty, NULL);
      if (devnull >= 0) dup2(devnull, 0);
      dup2(po[1], 1);
      dup2(pe[1], 2);
      execve(path, argv, envs[i]);
      static const char msg[] = "tdistrun: exec failed\n";
      write(2, msg, sizeof(msg) - 1);
      _exit(127);
    }
    /* Parent: set the group here too, so a signal sent right away reaches it. */
    setpgid(pid, pid);
    r->pid = pid;
    close(po[1]);
    close(pe[1]);
    r->out.fd = po[0];
    r->out.out_fd = 1;
    r->err.fd = pe[0];
    r->err.out_fd = 2;
    fcntl(po[0], F_SETFL, O_NONBLOCK);
    fcntl(pe[0], F_SETFL, O_NONBLOCK);
    continue;
  fail:
    for (int k = 0; k < 2; k++) {
      if (po[k] >= 0) close(po[k]);
      if (pe[k] >= 0) close(pe[k]);
    }
    for (int k = 0; k < i; k++)
      signal_rank(&job->ranks[k], SIGKILL);
    for (int k = 0; k < i; k++)
      waitpid(job->ranks[k].pid, NULL, 0);
    if (devnull >= 0) close(devnull);
    return -1;
  }
  if (devnull >= 0) close(devnull);
  return 0;
}

/* The deadlines of a job being stopped (0 = none). */
typedef struct deadlines {
  double term_at; /* end of the dump grace: SIGTERM the ranks still running */
  double kill_at; /* SIGKILL the ranks still running */
} deadlines_t;

/* Begin stopping every running rank with `sig`; SIGKILL follows at deadline. */
static void stop_all(trun_job_t *job, int sig, deadlines_t *dl) {
  for (int i = 0; i < job->nlocal; i++)
    signal_rank(&job->ranks[i], sig);
  dl->term_at = 0; /* the dump grace, if any, is over */
  if (dl->kill_at == 0) dl->kill_at = now_s() + job->grace_s;
}

/* A rank failed (here or on another node; `what` says which): stop `whom`,
 * the others. They usually notice the failure within milliseconds, write their
 * flight-recorder dumps from a background thread and exit by themselves, so
 * they first get the dump grace to do so; SIGTERM then goes to those still
 * running. */
static void fail_stop(trun_job_t *job, const char *what, const char *whom, deadlines_t *dl) {
  if (job->dump_grace_s > 0) {
    fprintf(stderr,
            "tdistrun: %s; stopping %s (%g s to exit on their own and write their dumps, "
            "then SIGTERM, SIGKILL after %g s)\n",
            what, whom, job->dump_grace_s, job->grace_s);
    dl->term_at = now_s() + job->dump_grace_s;
    return;
  }
  fprintf(stderr, "tdistrun: %s; stopping %s (SIGTERM, SIGKILL after %g s)\n", what, whom,
          job->grace_s);
  stop_all(job, SIGTERM, dl);
}

/* 1 once the job is being stopped (a second stop signal then kills at once). */
static int stopping(const trun_job_t *job) {
  return job->interrupt_sig || (!job->keep_going && (job->fail_rank >= 0 || job->remote_msg[0]));
}

/* Reap exited ranks; the first failure (not one we caused) stops the rest,
 * unless keep_going: then each failure is only reported. */
static int reap(trun_job_t *job, deadlines_t *dl) {
  int running = 0;
  for (int i = 0; i < job->nlocal; i++) {
    trun_rank_t *r = &job->ranks[i];
    if (r->pid <= 0) continue;
    int st;
    pid_t p = waitpid(r->pid, &st, WNOHANG);
    if (p == 0) {
      running++;
      continue;
    }
    if (p < 0 && errno == EINTR) {
      running++;
      continue;
    }
    r->status = st;
    r->pid = 0;
    if (job->exited) job->exited(job->exited_arg, r->global_rank, st);
    int failed = !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    if (!failed || r->stopped || stopping(job)) continue;
    char why[96], what[160];
    trun_describe_status(st, why, sizeof(why));
    if (job->fail_rank < 0) {
      job->fail_rank = r->global_rank;
      job->fail_status = st;
    }
    if (job->keep_going) {
      fprintf(stderr, "tdistrun: rank %d %s; the other ranks go on (--no-fail-fast)\n",
              r->global_rank, why);
      continue;
    }
    snprintf(what, sizeof(what), "rank %d %s", r->global_rank, why);
    fail_stop(job, what, "the other ranks", dl);
  }
  return running;
}

/* Once per tick: ask the store which running ranks it declared dead, and
 * kill those seen on the previous tick that are still running. A stopped
 * (SIGSTOP) or hung rank never exits by itself, and with --no-fail-fast
 * nothing else would stop it: the launcher would wait forever. The tick of
 * delay lets a rank whose own exit made the store declare it dead (its
 * connection closed) be reaped first, and reported as the exit it was. */
static void check_dead(trun_job_t *job, deadlines_t *dl) {
  for (int i = 0; i < job->nlocal; i++)
    if (job->ranks[i].pid > 0 && job->ranks[i].dead) job->ranks[i].dead++;
  job->scan(job->scan_arg, job);
  for (int i = 0; i < job->nlocal; i++) {
    trun_rank_t *r = &job->ranks[i];
    if (r->pid <= 0 || r->dead != 2) continue;
    r->dead = 3; /* acted upon */
    int already = stopping(job);
    signal_rank(r, SIGKILL); /* reaped by reap() like any rank */
    if (already) continue;   /* the job is being stopped: not the first failure */
    if (job->fail_rank < 0) {
      job->fail_rank = r->global_rank;
      job->fail_status = SIGKILL; /* a waitpid status: killed by SIGKILL */
      job->fail_dead = 1;
      snprintf(job->fail_why, sizeof(job->fail_why), "%s", r->dead_why);
    }
    if (job->keep_going) {
      fprintf(stderr,
              "tdistrun: rank %d was declared dead by the store (%s): killed it (SIGKILL); "
              "the other ranks go on (--no-fail-fast)\n",
              r->global_rank, r->dead_why);
      continue;
    }
    int others = 0;
    for (int k = 0; k < job->nlocal; k++)
      others += k != i && job->ranks[k].pid > 0;
    char what[256];
    snprintf(what, sizeof(what), "rank %d was declared dead by the store (%s): killed it",
             r->global_rank, r->dead_why);
    if (others)
      fail_stop(job, what, "the other ranks", dl);
    else
      fprintf(stderr, "tdistrun: %s\n", what);
  }
}

int trun_supervise(trun_job_t *job) {
  int n = job->nlocal;
  struct pollfd *pfd = calloc((size_t)(2 * n + 1), sizeof(*pfd));
  trun_stream_t **who = calloc((size_t)(2 * n + 1), sizeof(*who));
  trun_rank_t **owner = calloc((size_t)(2 * n + 1), sizeof(*owner));
  deadlines_t dl = {0, 0};
  double next_tick = now_s() + 0.25;
  int running = n, killed = 0;
  job->fail_rank = -1;
  if (!pfd || !who || !owner) {
    fprintf(stderr, "tdistrun: out of memory\n");
    stop_all(job, SIGKILL, &dl);
    job->interrupt_sig = SIGKILL;
  }
  while (pfd && who && owner && running > 0) {
    int np = 0;
    pfd[np++] = (struct pollfd){.fd = job->sigfd, .events = POLLIN};
    for (int i = 0; i < n; i++) {
      trun_stream_t *ss[2] = {&job->ranks[i].out, &job->ranks[i].err};
      for (int k = 0; k < 2; k++) {
        if (ss[k]->fd < 0) continue;
        who[np] = ss[k];
        owner[np] = &job->ranks[i];
        pfd[np++] = (struct pollfd){.fd = ss[k]->fd, .events = POLLIN};
      }
    }
    /* SIGCHLD wakes us for exits; the short timeout covers ticks, the
     * deadlines, and a SIGCHLD coalesced with one already handled. */
    double wait_s = 0.25, t0 = now_s();
    if (dl.term_at > 0 && dl.term_at - t0 < wait_s) wait_s = dl.term_at - t0;
    if (dl.kill_at > 0 && !killed && dl.kill_at - t0 < wait_s) wait_s = dl.kill_at - t0;
    int rc = poll(pfd, (nfds_t)np, wait_s > 0 ? (int)(wait_s * 1000) + 1 : 0);
    if (rc < 0 && errno != EINTR) break;
    for (int k = 1; k < np; k++)
      if (pfd[k].revents) pump(job, owner[k], who[k]);
    struct signalfd_siginfo si;
    while (read(job->sigfd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
      int sig = (int)si.ssi_signo;
      if (sig == SIGCHLD) continue;
      if (sig == SIGUSR1 || sig == SIGUSR2) { /* forwarded, not a stop */
        for (int i = 0; i < n; i++)
          if (job->ranks[i].pid > 0) kill(-job->ranks[i].pid, sig);
        continue;
      }
      char name[32];
      if (dl.term_at > 0) {
        /* In the dump grace nothing was sent yet: forward this one now. */
        fprintf(stderr,
                "tdistrun: got %s during the dump grace: forwarding it to the ranks "
                "(SIGKILL after %g s)\n",
                trun_signame(sig, name, sizeof(name)), job->grace_s);
        if (!job->interrupt_sig) job->interrupt_sig = sig;
        stop_all(job, sig, &dl);
        continue;
      }
      if (stopping(job)) {
        /* Already stopping: a second signal kills at once. */
        fprintf(stderr, "tdistrun: %s while stopping: killing the ranks\n",
                trun_signame(sig, name, sizeof(name)));
        if (!job->interrupt_sig) job->interrupt_sig = sig;
        stop_all(job, SIGKILL, &dl);
        killed = 1;
        continue;
      }
      job->interrupt_sig = sig;
      fprintf(stderr, "tdistrun: got %s: forwarding it to the ranks (SIGKILL after %g s)\n",
              trun_signame(sig, name, sizeof(name)), job->grace_s);
      stop_all(job, sig, &dl);
    }
    running = reap(job, &dl);
    double t = now_s();
    if (running > 0 && dl.term_at > 0 && t >= dl.term_at) {
      fprintf(stderr,
              "tdistrun: %d rank%s still running after the %g s dump grace: sending SIGTERM\n",
              running, running == 1 ? "" : "s", job->dump_grace_s);
      stop_all(job, SIGTERM, &dl);
    }
    if (running > 0 && dl.kill_at > 0 && t >= dl.kill_at && !killed) {
      fprintf(stderr, "tdistrun: ranks still running after %g s: sending SIGKILL\n", job->grace_s);
      stop_all(job, SIGKILL, &dl);
      killed = 1;
    }
    if (running > 0 && t >= next_tick) {
      next_tick = t + 0.25;
      if (job->scan) check_dead(job, &dl);
      if (job->tick && !job->remote_msg[0] && !stopping(job) &&
          job->tick(job->tick_arg, job->remote_msg, sizeof(job->remote_msg))) {
        if (job->keep_going) {
          fprintf(stderr, "tdistrun: %s; this node's ranks go on (--no-fail-fast)\n",
                  job->remote_msg);
        } else {
          fail_stop(job, job->remote_msg, "this node's ranks", &dl);
        }
      }
    }
  }
  /* Every rank is gone: print what is still in the pipes (helpers that keep
   * a pipe open do not hold the launcher: reads are non-blocking). */
  for (int i = 0; i < n; i++) {
    trun_stream_t *ss[2] = {&job->ranks[i].out, &job->ranks[i].err};
    for (int k = 0; k < 2; k++) {
      if (ss[k]->fd >= 0) pump(job, &job->ranks[i], ss[k]);
      if (ss[k]->fd >= 0 && ss[k]->len)
        emit_line(job, &job->ranks[i], ss[k], ss[k]->buf, ss[k]->len);
      if (ss[k]->fd >= 0) close(ss[k]->fd);
      ss[k]->fd = -1;
      free(ss[k]->buf);
      ss[k]->buf = NULL;
    }
  }
  free(pfd);
  free(who);
  free(owner);

  char why[96], name[32];
  if (job->fail_rank >= 0 && job->fail_dead) {
    fprintf(stderr, "tdistrun: rank %d was declared dead by the store (%s) and killed (SIGKILL)\n",
            job->fail_rank, job->fail_why);
    return 128 + SIGKILL;
  }
  if (job->fail_rank >= 0) {
    trun_describe_status(job->fail_status, why, sizeof(why));
    fprintf(stderr, "tdistrun: rank %d %s\n", job->fail_rank, why);
    return WIFEXITED(job->fail_status) ? WEXITSTATUS(job->fail_status)
                                       : 128 + WTERMSIG(job->fail_status);
  }
  if (job->remote_msg[0]) {
    fprintf(stderr, "tdistrun: job failed: %s\n", job->remote_msg);
    return 1;
  }
  if (job->interrupt_sig) {
    fprintf(stderr, "tdistrun: stopped by %s\n",
            trun_signame(job->interrupt_sig, name, sizeof(name)));
    return 128 + job->interrupt_sig;
  }
  return 0;
}
