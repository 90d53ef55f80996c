/*
 * tdistrun.h - internal interface of the tdistrun launcher (tools/launcher).
 *
 * The launcher is one single-threaded process (plus the store server thread
 * when it hosts the store). Its files:
 *   main.c   command line, the environment given to ranks, hosting the store,
 *            coordination between the launchers of a multi-node job;
 *   ranks.c  starting the ranks (fork/exec), relaying their output with a
 *            "[rank r] " prefix, forwarding signals, fail-fast supervision;
 *   agent.c  the host agent: the ranks' heartbeats aggregated into one per
 *            host, the store's records relayed to them (two threads).
 *
 * Threads: everything here runs on the launcher's main thread, except the
 * host agent's two threads (agent.c). The signals
 * the launcher handles are blocked in every thread and read from a signalfd
 * by the supervision loop, so no code runs in a signal handler.
 */
#ifndef TDIST_TOOLS_TDISTRUN_H
#define TDIST_TOOLS_TDISTRUN_H

#include <stddef.h>
#include <sys/types.h>

/* One output stream of a rank (its stdout or stderr): the read end of the
 * pipe the rank writes to and the partial line not yet printed. */
typedef struct trun_stream {
  int fd;     /* read end, non-blocking; -1 once closed */
  int out_fd; /* where prefixed lines go: 1 or 2 */
  char *buf;  /* partial line, TRUN_LINE_MAX bytes */
  size_t len;
} trun_stream_t;

#define TRUN_LINE_MAX 65536 /* longer lines are split (a newline is inserted) */

typedef struct trun_rank {
  int global_rank;
  pid_t pid;          /* also its process group id; 0 once reaped */
  int status;         /* waitpid status once reaped */
  int stopped;        /* 1 if the launcher sent it a stop signal */
  int dead;           /* the store declared it dead: ticks since that was seen (0: not) */
  char dead_why[160]; /* the store's reason ("no heartbeat for ...") */
  trun_stream_t out, err;
} trun_rank_t;

/* Called by the supervision loop about every 250 ms while ranks run (NULL for
 * none). Returns 1 and fills msg when the job must stop because of something
 * outside this node (another node's rank failed), else 0. */
typedef int (*trun_tick_fn)(void *arg, char *msg, size_t msglen);

typedef struct trun_job trun_job_t;

/* Called by the supervision loop about every 250 ms while ranks run (NULL for
 * none): sets dead = 1 and dead_why for each running rank (pid > 0, dead == 0)
 * that the store has declared dead ("tdist/dead/<rank>"). The loop kills a
 * rank still running one tick later (so that a rank whose exit caused the
 * record is reaped and reported as the exit it was). */
typedef void (*trun_scan_fn)(void *arg, trun_job_t *job);

/* Called by the supervision loop once for each rank it reaps (NULL for
 * none), with the rank's waitpid status: main.c tells the store, so that
 * the others' rendezvous does not wait its whole timeout for a rank that
 * will never come (store/rendezvous.c "exit/<round>"). */
typedef void (*trun_exited_fn)(void *arg, int rank, int status);

struct trun_job {
  /* set by the caller */
  int nlocal; /* ranks started by this launcher */
  trun_rank_t *ranks;
  double grace_s;      /* time between SIGTERM and SIGKILL when stopping */
  double dump_grace_s; /* after a failure, time the other ranks get to exit on
                          their own (writing their flight-recorder dumps)
                          before SIGTERM; 0 = SIGTERM at once */
  int prefix;          /* 1: prefix every output line with "[rank r] " */
  int keep_going;      /* --no-fail-fast: a failed rank (here or on another node)
                          does not stop the others; the first is reported at the end */
  trun_tick_fn tick;
  void *tick_arg;
  trun_scan_fn scan; /* the store's death records (main.c), or NULL */
  void *scan_arg;
  trun_exited_fn exited; /* a rank was reaped (main.c), or NULL */
  void *exited_arg;
  int sigfd; /* signalfd of the handled signals (trun_signals_block) */
  /* set by trun_supervise: what ended the job */
  int fail_rank;        /* first rank that failed, -1 if none */
  int fail_status;      /* its waitpid status */
  int fail_dead;        /* 1: that rank was declared dead by the store and killed */
  char fail_why[160];   /* then the store's reason */
  int interrupt_sig;    /* signal the launcher received, 0 if none */
  char remote_msg[256]; /* tick's message, "" if none */
};

/* Block the handled signals (SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1,
 * SIGUSR2, SIGCHLD) in the calling thread, and hence in threads it starts
 * later, ignore SIGPIPE, and return a signalfd reading them (-1 on error).
 * Call before starting the store server. */
int trun_signals_block(void);

/* Start every rank of the job: argv[0] is looked up in PATH, envs[i] is the
 * environment of local rank i (NULL-terminated). Each rank runs in its own
 * process group with stdin from /dev/null, its stdout and stderr on pipes,
 * default signal handling, and dies with the launcher (PR_SET_PDEATHSIG).
 * On failure stops what was started and returns -1 with a message printed. */
int trun_spawn(trun_job_t *job, char *const *argv, char **const *envs);

/* Relay output and wait for every rank. The first rank to exit non-zero or by
 * a signal, a signal received by the launcher, or a tick that reports a
 * remote failure stops the others: the signal (SIGTERM for a failure) goes
 * to every running rank, and after grace_s seconds SIGKILL. A failure (local
 * or remote) first leaves the others dump_grace_s seconds to exit on their
 * own - they notice it too and write their flight-recorder dumps - before
 * the SIGTERM; a signal to the launcher ends that wait. With keep_going
 * only the launcher's signals stop ranks; failures are printed as they
 * happen and the first one decides the exit code once all ranks ended. Returns the
 * launcher's exit code: 0 if every rank exited 0, the failed rank's code (or
 * 128 + signal), 128 + the signal the launcher got, or 1 (remote failure).
 * A rank the store declared dead (scan) is a failure too: it is killed
 * (SIGKILL, it may be stopped or hung) at once, with keep_going as well, and
 * counts as killed by SIGKILL (128 + 9), the message naming the death.
 * Prints the final "tdistrun: rank r ..." message on stderr. */
int trun_supervise(trun_job_t *job);

/* "SIGKILL" for 9; "signal 77" for unknown numbers (static or buf). */
const char *trun_signame(int sig, char *buf, size_t len);

/* Describe a waitpid status: "exited with code 3" / "was killed by signal 9
 * (SIGKILL)". */
void trun_describe_status(int status, char *buf, size_t len);

/* ---- the host agent (agent.c) ------------------------------------------------ */

typedef struct trun_agent trun_agent_t;

/* Start the host agent of host `host` (the node rank) for the store at
 * addr:port: two store connections, an abstract unix socket for the local
 * ranks (its name: trun_agent_name, given to them as TDIST_HOST_AGENT) and
 * two threads (the only threads of the launcher besides the store server's
 * and the rendezvous batches'; they inherit the blocked signals). Its ranks
 * are first .. first + nlocal - 1 of world: it counts them into the world
 * rendezvous (agent_rdzv.c). 0, or -1 with a message printed: the ranks
 * then beat to the store and join it themselves. Main thread. */
int trun_agent_start(const char *addr, int port, int host, int first, int nlocal, int world,
                     trun_agent_t **out);
const char *trun_agent_name(const trun_agent_t *a);
/* Last beat (ranks that left or died since), "bye", stop and free. Main
 * thread, after every local rank ended; NULL is ignored. */
void trun_agent_stop(trun_agent_t *a);

#endif /* TDIST_TOOLS_TDISTRUN_H */
