/*
 * worker.c - see worker.h. A mutex-protected FIFO of jobs and one thread that
 * runs them. Jobs are counted (given, done) so drain can wait for the ones
 * given before it without stopping the thread.
 */
#include "util/worker.h"

#include <pthread.h>
#include <stdint.h>

#include "util/alloc.h"
#include "util/error.h"
#include "util/list.h"

struct job {
  tdist__list_t link;
  tdist__job_fn fn;
  void *arg;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv_jobs = PTHREAD_COND_INITIALIZER; /* a job was queued */
static pthread_cond_t cv_done = PTHREAD_COND_INITIALIZER; /* a job finished */
static tdist__list_t jobs = {&jobs, &jobs};
static uint64_t given, done;
static int started;

static void *worker_main(void *unused) {
  (void)unused;
  pthread_mutex_lock(&mu);
  for (;;) {
    while (tdist__list_empty(&jobs))
      pthread_cond_wait(&cv_jobs, &mu);
    tdist__list_t *n = tdist__list_first(&jobs);
    tdist__list_remove(n);
    pthread_mutex_unlock(&mu);
    struct job *j = tdist__list_entry(n, struct job, link);
    j->fn(j->arg);
    tdist__free(j);
    pthread_mutex_lock(&mu);
    done++;
    pthread_cond_broadcast(&cv_done);
  }
  return NULL;
}

int tdist__worker_run(tdist__job_fn fn, void *arg) {
  struct job *j = tdist__malloc(sizeof(*j));
  if (!j) {
    fn(arg);
    return TDIST_ERR_NO_MEMORY;
  }
  j->fn = fn;
  j->arg = arg;
  pthread_mutex_lock(&mu);
  if (!started) {
    pthread_t t;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&t, &at, worker_main, NULL);
    pthread_attr_destroy(&at);
    if (rc != 0) {
      pthread_mutex_unlock(&mu);
      tdist__free(j);
      fn(arg);
      return TDIST_ERR_INTERNAL;
    }
    started = 1;
  }
  tdist__list_push_back(&jobs, &j->link);
  given++;
  pthread_cond_signal(&cv_jobs);
  pthread_mutex_unlock(&mu);
  return 0;
}

void tdist__worker_drain(void) {
  pthread_mutex_lock(&mu);
  uint64_t target = given;
  while (done < target)
    pthread_cond_wait(&cv_done, &mu);
  pthread_mutex_unlock(&mu);
}
