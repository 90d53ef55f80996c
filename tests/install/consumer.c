/* consumer.c - a program outside the tree: every rank all-reduces its rank
 * number and checks the sum. */
#include <stdio.h>
#include <tdist/tdist.h>

int main(void) {
  tdist_group_t *world;
  if (tdist_init_process_group(NULL, &world)) {
    fprintf(stderr, "init: %s\n", tdist_last_error());
    return 1;
  }
  int n = tdist_group_size(world);
  int64_t v = tdist_group_rank(world);
  if (tdist_all_reduce(world, &v, &v, 1, TDIST_INT64, TDIST_SUM, NULL, NULL)) {
    fprintf(stderr, "all_reduce: %s\n", tdist_last_error());
    return 1;
  }
  int ok = v == (int64_t)n * (n - 1) / 2;
  printf("consumer: %s (%s)\n", ok ? "OK" : "WRONG", tdist_version_string());
  return tdist_group_destroy(world) || !ok;
}
