/*
 * test_log.c - logging settings read from the environment once: level,
 * subsystem filter, file with %h/%p, and the line format. Runs in a child
 * process so the settings are fresh.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "util/log.h"
#include "util/param.h"
#include "mp.h"

TDIST_PARAM(TestKnob, "TDIST_TEST_KNOB", 5)

static char path[256];

static int child(int rank, int n, void *arg) {
  (void)rank;
  (void)n;
  (void)arg;
  setenv("TDIST_DEBUG", "INFO", 1);
  setenv("TDIST_DEBUG_SUBSYS", "^STORE", 1);
  setenv("TDIST_DEBUG_FILE", "/tmp/tdist-log-test.%p.log", 1);
  setenv("TDIST_TEST_KNOB", "9", 1);
  snprintf(path, sizeof(path), "/tmp/tdist-log-test.%d.log", (int)getpid());
  unlink(path);
  TDIST_INFO(CORE, "hello %d", 42);
  TDIST_INFO(STORE, "hidden by the subsystem filter");
  TDIST_TRACE(CORE, "hidden by the level");
  MP_CHECK(tdist__param_TestKnob() == 9);
  setenv("TDIST_TEST_KNOB", "11", 1); /* read once: not seen */
  MP_CHECK(tdist__param_TestKnob() == 9);
  FILE *f = fopen(path, "r");
  MP_CHECK(f != NULL);
  char all[4096] = "";
  size_t got = fread(all, 1, sizeof(all) - 1, f);
  all[got] = '\0';
  fclose(f);
  unlink(path);
  char host[64];
  gethostname(host, sizeof(host));
  char expect[128];
  snprintf(expect, sizeof(expect), "%s:%d:", host, (int)getpid());
  MP_CHECK(strstr(all, expect) != NULL);
  MP_CHECK(strstr(all, "TDIST INFO [CORE] hello 42") != NULL);
  MP_CHECK(strstr(all, "TDIST_TEST_KNOB set by environment to 9") != NULL);
  MP_CHECK(strstr(all, "hidden") == NULL);
  return 0;
}

static void settings_and_format(void **state) {
  (void)state;
  assert_int_equal(tdist_mp_run(1, child, NULL, 20), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(settings_and_format)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
