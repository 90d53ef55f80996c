/*
 * worker.h - one process-wide thread for blocking jobs (internal).
 *
 * The progress thread must never block, yet some consequences of what it
 * decides do: writing a flight-recorder file after a failure, ncclCommAbort
 * of a broken communicator. Those are handed to this thread as jobs and run
 * in the order given. The thread starts with the first job and lives as long
 * as the process (detached, idle in a condition wait); the process's last
 * context drains it (waits for every job given so far) before it goes.
 *
 * Thread safety: tdist__worker_run and tdist__worker_drain from any thread
 * (run never blocks; drain must not be called from a job).
 */
#ifndef TDIST_UTIL_WORKER_H
#define TDIST_UTIL_WORKER_H

typedef void (*tdist__job_fn)(void *arg);

/* Run fn(arg) on the worker thread, later. 0, or TDIST_ERR_NO_MEMORY /
 * TDIST_ERR_INTERNAL (then fn is run here and now, as a last resort). */
int tdist__worker_run(tdist__job_fn fn, void *arg);

/* Wait until every job given before this call has run. */
void tdist__worker_drain(void);

#endif
