/*
 * test_mutex.c - util/mutex.h, the CPU engine's lock: trylock answers 1
 * only while the lock is free; threads that contend (holders that sleep
 * while they hold it, so that the others sleep on the futex) never hold it
 * together and lose no update; a taker that finds it held sleeps until the
 * holder gives it back (the state then says "sleepers", 2) and gets it at
 * once after.
 */
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <unistd.h>

#include <cmocka.h>

#include "util/mutex.h"

static void trylock_answers(void **state) {
  (void)state;
  tdist__mutex_t m = TDIST__MUTEX_INIT;
  assert_int_equal(tdist__mutex_trylock(&m), 1);
  assert_int_equal(tdist__mutex_trylock(&m), 0); /* not recursive */
  tdist__mutex_unlock(&m);
  assert_int_equal(atomic_load(&m.v), 0);
  tdist__mutex_lock(&m);
  assert_int_equal(atomic_load(&m.v), 1); /* nobody waited: no wake owed */
  assert_int_equal(tdist__mutex_trylock(&m), 0);
  tdist__mutex_unlock(&m);
  assert_int_equal(tdist__mutex_trylock(&m), 1);
  tdist__mutex_unlock(&m);
}

#define THREADS 4
#define ROUNDS 20000

struct shared {
  tdist__mutex_t m;
  long counter;    /* plain: only the lock keeps updates whole */
  atomic_int in;   /* holders inside at once */
  atomic_int most; /* the most seen inside */
};

static void *contend(void *arg) {
  struct shared *s = arg;
  for (int i = 0; i < ROUNDS; i++) {
    if (i % 3 == 0) {
      while (!tdist__mutex_trylock(&s->m))
        sched_yield();
    } else {
      tdist__mutex_lock(&s->m);
    }
    int in = atomic_fetch_add(&s->in, 1) + 1;
    if (in > atomic_load(&s->most)) atomic_store(&s->most, in);
    long c = s->counter;
    if (i % 2000 == 0) usleep(200); /* held while asleep: the others sleep on it */
    s->counter = c + 1;
    atomic_fetch_sub(&s->in, 1);
    tdist__mutex_unlock(&s->m);
  }
  return NULL;
}

static void contention_loses_nothing(void **state) {
  (void)state;
  struct shared s = {.m = TDIST__MUTEX_INIT};
  pthread_t t[THREADS];
  for (int i = 0; i < THREADS; i++)
    assert_int_equal(pthread_create(&t[i], NULL, contend, &s), 0);
  for (int i = 0; i < THREADS; i++)
    assert_int_equal(pthread_join(t[i], NULL), 0);
  assert_int_equal(s.counter, (long)THREADS * ROUNDS);
  assert_int_equal(atomic_load(&s.most), 1);
  assert_int_equal(atomic_load(&s.m.v), 0);
}

struct waiter {
  tdist__mutex_t *m;
  atomic_int got;
};

static void *take(void *arg) {
  struct waiter *w = arg;
  tdist__mutex_lock(w->m);
  atomic_store(&w->got, 1);
  tdist__mutex_unlock(w->m);
  return NULL;
}

static void taker_sleeps_until_given_back(void **state) {
  (void)state;
  tdist__mutex_t m = TDIST__MUTEX_INIT;
  struct waiter w = {.m = &m};
  tdist__mutex_lock(&m);
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, take, &w), 0);
  /* The taker marks the lock contended before it sleeps (bounded: 30 s). */
  for (int i = 0; i < 300000 && atomic_load(&m.v) != 2; i++)
    usleep(100);
  assert_int_equal(atomic_load(&m.v), 2);
  usleep(20000);
  assert_int_equal(atomic_load(&w.got), 0); /* still held: it has not got it */
  tdist__mutex_unlock(&m);                  /* 2: wakes it */
  assert_int_equal(pthread_join(t, NULL), 0);
  assert_int_equal(atomic_load(&w.got), 1);
  /* It left holding in state 2, and its unlock gave it back free. */
  assert_int_equal(atomic_load(&m.v), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(trylock_answers),
                                     cmocka_unit_test(contention_loses_nothing),
                                     cmocka_unit_test(taker_sleeps_until_given_back)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
