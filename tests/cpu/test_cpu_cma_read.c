/*
 * test_cpu_cma_read.c - what a failed single-copy read names
 * (tdist__cpu_cma_read, src/cpu/engine/cma.c). A child process plays the sender:
 * it maps a payload and holds a live word, and the parent reads it across
 * processes as a receiver would. Cases, each with a fresh child:
 *
 *   intact      word and payload intact: the bytes arrive, no error.
 *   reused      the sender aborted (word changed) but its buffer is still
 *               mapped: the read fails as "aborted", never with the bytes.
 *   unmapped    the sender aborted and unmapped its buffer: the read gets
 *               EFAULT, and still fails as "aborted" (the sender's own
 *               cause is on its way), not as a fault of the sender. A fault
 *               soak (tests/failures/soak.c) once had a survivor named for
 *               "its memory could not be read (Bad address)" this way.
 *   bad_addr    word intact but the buffer unmapped: that is the sender's
 *               fault, named as unreadable memory (not "aborted").
 *   gone        the sender exited: named as unreadable memory (No such
 *               process), not "aborted".
 *
 * One process and its children; no sockets.
 */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cpu/base/base.h"
#include "cpu/transport/transport.h"
#include "cpu/engine/engine.h"
#include "cpu/segment/sc.h"

#define LEN (256u * 1024u)
#define TOKEN 0x1234567887654321ULL

enum step { ST_READY = 1, ST_ABORT = 2, ST_UNMAP = 3, ST_ABORT_UNMAP = 4, ST_EXIT = 5 };

struct shared {
  volatile int ask;  /* parent -> child: the step to take (enum step) */
  volatile int done; /* child -> parent: the step taken */
  uint64_t addr, word;
};

static int fails;

#define CHECK(c)                                                            \
  do {                                                                      \
    if (!(c)) {                                                             \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #c); \
      fails++;                                                              \
    }                                                                       \
  } while (0)

static void wait_done(struct shared *sh, int step) {
  for (int i = 0; i < 60000 && sh->done != step; i++) /* 60 s at most */
    usleep(1000);
  if (sh->done != step) {
    fprintf(stderr, "child did not reach step %d\n", step);
    exit(2);
  }
}

static void child(struct shared *sh) {
  uint8_t *buf = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  static volatile uint64_t live = TOKEN;
  if (buf == MAP_FAILED) _exit(3);
  for (size_t i = 0; i < LEN; i++)
    buf[i] = (uint8_t)(i * 7);
  sh->addr = (uint64_t)(uintptr_t)buf;
  sh->word = (uint64_t)(uintptr_t)&live;
  __atomic_store_n(&sh->done, ST_READY, __ATOMIC_SEQ_CST);
  for (int i = 0; i < 60000; i++) {
    int ask = __atomic_load_n(&sh->ask, __ATOMIC_SEQ_CST);
    if (ask == ST_ABORT || ask == ST_ABORT_UNMAP) live = 2; /* what an abort writes */
    if (ask == ST_UNMAP || ask == ST_ABORT_UNMAP) munmap(buf, LEN);
    if (ask == ST_EXIT) _exit(0);
    if (ask) {
      __atomic_store_n(&sh->done, ask, __ATOMIC_SEQ_CST);
      pause(); /* until the parent kills us */
    }
    usleep(1000);
  }
  _exit(4);
}

/* Fork a sender, have it take `step`, read once. Returns the read's rc. */
static int read_after(struct shared *sh, int step, char *why, size_t wl, int *aborted,
                      uint8_t *dst) {
  memset(sh, 0, sizeof(*sh));
  pid_t pid = fork();
  if (pid < 0) exit(2);
  if (pid == 0) child(sh);
  wait_done(sh, ST_READY);
  if (step) {
    __atomic_store_n(&sh->ask, step, __ATOMIC_SEQ_CST);
    if (step == ST_EXIT) {
      waitpid(pid, NULL, 0);
    } else {
      wait_done(sh, step);
    }
  }
  cpu_rma_desc_t d = {.kind = CPU_MSG_P2P,
                      .addr = sh->addr,
                      .len = LEN,
                      .word = sh->word,
                      .token = TOKEN,
                      .cookie = 1};
  why[0] = 0;
  int rc = tdist__cpu_cma_read((int)pid, dst, &d, why, wl, aborted);
  if (step != ST_EXIT) {
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
  }
  return rc;
}

int main(void) {
  struct shared *sh =
      mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  uint8_t *dst = malloc(LEN);
  if (sh == MAP_FAILED || !dst) return 2;
  char why[160];
  int aborted, rc;

  rc = read_after(sh, 0, why, sizeof(why), &aborted, dst);
  if (rc != 0 && errno == EPERM) { /* a ptrace policy forbids it: the backend uses TCP */
    printf("cpu_cma_read: process_vm_readv not permitted here (%s); skipped\n", why);
    return 0;
  }
  CHECK(rc == 0);
  int same = 1;
  for (size_t i = 0; i < LEN; i++)
    same &= dst[i] == (uint8_t)(i * 7);
  CHECK(same);
  printf("cpu_cma_read intact: rc %d\n", rc);

  rc = read_after(sh, ST_ABORT, why, sizeof(why), &aborted, dst);
  printf("cpu_cma_read reused: rc %d aborted %d: %s\n", rc, aborted, why);
  CHECK(rc != 0 && aborted);

  rc = read_after(sh, ST_ABORT_UNMAP, why, sizeof(why), &aborted, dst);
  printf("cpu_cma_read unmapped: rc %d aborted %d: %s\n", rc, aborted, why);
  CHECK(rc != 0 && aborted);
  CHECK(strstr(why, "could not be read") == NULL);

  rc = read_after(sh, ST_UNMAP, why, sizeof(why), &aborted, dst);
  printf("cpu_cma_read bad_addr: rc %d aborted %d: %s\n", rc, aborted, why);
  CHECK(rc != 0 && !aborted && strstr(why, strerror(EFAULT)) != NULL);

  rc = read_after(sh, ST_EXIT, why, sizeof(why), &aborted, dst);
  printf("cpu_cma_read gone: rc %d aborted %d: %s\n", rc, aborted, why);
  CHECK(rc != 0 && !aborted && strstr(why, strerror(ESRCH)) != NULL);

  free(dst);
  printf("cpu_cma_read: %s\n", fails ? "FAILED" : "ok");
  return fails != 0;
}
