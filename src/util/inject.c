/* inject.c - see inject.h. */
#include "util/inject.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "util/error.h"

_Atomic int tdist__inject_armed_;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static char armed_site[64];
static int armed_rc;
static int fired;

int tdist__inject_slow(const char *site) {
  int rc = 0;
  pthread_mutex_lock(&mu);
  if (armed_rc && strcmp(site, armed_site) == 0) {
    rc = armed_rc;
    armed_rc = 0;
    fired++;
    atomic_store(&tdist__inject_armed_, 0);
  }
  pthread_mutex_unlock(&mu);
  if (rc > 0) { /* a delay, outside the lock */
    struct timespec ts = {rc / 1000, (long)(rc % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
    return 0;
  }
  if (rc) return tdist__error(rc, "failure injected at %s", site);
  return 0;
}

void tdist__inject_arm(const char *site, int rc) {
  pthread_mutex_lock(&mu);
  snprintf(armed_site, sizeof(armed_site), "%s", site ? site : "");
  armed_rc = site ? rc : 0;
  atomic_store(&tdist__inject_armed_, armed_rc != 0);
  pthread_mutex_unlock(&mu);
}

int tdist__inject_fired(void) {
  pthread_mutex_lock(&mu);
  int n = fired;
  pthread_mutex_unlock(&mu);
  return n;
}
