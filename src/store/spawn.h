/*
 * spawn.h - rank 0 hosts the store as a process of its own (internal; the
 * store layer). Started at rendezvous, stopped at cleanup; it outlives a
 * killed or stopped rank 0, so the survivors can still agree and shrink.
 * With $TDIST_STORE_IN_PROCESS=1 (or tdist_init_opts_t.host_store =
 * TDIST_HOST_STORE_THREAD) rank 0 serves it from a thread instead
 * (rendezvous.c), as before; so it does when no tdist-store program exists.
 * Thread: the caller's.
 */
#ifndef TDIST_STORE_SPAWN_H
#define TDIST_STORE_SPAWN_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct tdist__store_proc {
  pid_t pid; /* the store process, or -1 */
} tdist__store_proc_t;

/*
 * tdist__store_proc_start - start `tdist-store --port port --job-size
 * world_size` and wait until it listens.
 * @return 0 (out->pid set); TDIST_ERR_NOT_SUPPORTED when no tdist-store
 *         program is found; TDIST_ERR_IO when it cannot be started or did
 *         not listen (the message carries what it printed, e.g. a port in
 *         use).
 */
int tdist__store_proc_start(int port, int world_size, tdist__store_proc_t *out);

/* Stop (SIGTERM, then SIGKILL after 5 s) and reap it; pid -1 is ignored. */
void tdist__store_proc_stop(tdist__store_proc_t *p);

/* 1 when the store process has ended, within wait_ms (reaped here, p->pid
 * set to -1), with how in why ("exited with code 1", "was killed by signal
 * 9 (Killed)"); 0 while it runs or for pid -1. Rank 0 names it when its own
 * store failed under it: a rendezvous that only said "the server closed
 * the connection" could not tell a store that crashed or was killed from
 * a network fault. */
int tdist__store_proc_ended(tdist__store_proc_t *p, char *why, size_t cap, int64_t wait_ms);

#endif
