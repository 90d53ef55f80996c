/*
 * test_cpu_anysource.c - wildcard receives on the CPU backend (argv[1] ranks,
 * default 4), over real sockets between forked ranks:
 *
 *   posted first   rank 0 posts every receive as TDIST_ANY_SOURCE +
 *                  TDIST_ANY_TAG before the others send; each sender sends K
 *                  messages of varying count and tag, carrying (sender, k):
 *                  every message arrives once, source/tag/count reported by
 *                  tdist_work_status_info match the payload, and the k of one
 *                  sender come in order (non-overtaking);
 *   sent first     the same with every message already waiting (unexpected)
 *                  when rank 0 posts; also blocking tdist_recv with wildcards;
 *   mixed          named and wildcard receives interleaved: a named receive
 *                  posted before a wildcard one gets the first message of its
 *                  peer; any-source with a fixed tag; named peer with any tag;
 *   shorter        a message shorter than the wildcard receive's count is
 *                  accepted, the count received reported;
 *   large          ~1 MiB messages (single-copy and direct placement paths);
 *   self           an any-source receive gets a send to self (source = own);
 *   status         a named receive reports its own peer/tag/count; a send is
 *                  refused (INVALID_ARGUMENT);
 *   too long       a message longer than the wildcard receive's count fails
 *                  MISMATCH on every rank, naming both counts (subgroup);
 *                  with 3 ranks or more the last one is slow to create the
 *                  subgroup (an injected delay before it registers), so the
 *                  cause reaches it before its copy of the group exists.
 */
#include "cpu_test_util.h"
#include "util/inject.h"

#define FAIL_AT(what, ...)                                      \
  do {                                                          \
    fprintf(stderr, "[rank %d] " what "\n", rank, __VA_ARGS__); \
    return 1;                                                   \
  } while (0)

#define K 12       /* messages per sender per phase */
#define MAXC 64    /* elements the wildcard receives post */
#define BIG 262147 /* int32 elements of a large message (~1 MiB, odd) */

static size_t cnt_of(int src, int k) { return (size_t)((src * 5 + k * 3) % (MAXC - 2)) + 2; }
static int tag_of(int src, int k, int phase) { return phase * 1000 + src * 10 + k % 3; }

/* Sender: K messages to rank 0; payload[0] = src, [1] = k, then k's. */
static int send_all(tdist_group_t *g, int rank, int phase) {
  tdist_work_t *w[K];
  int32_t *buf = malloc(sizeof(int32_t) * K * MAXC);
  for (int k = 0; k < K; k++) {
    int32_t *m = buf + k * MAXC;
    size_t c = cnt_of(rank, k);
    m[0] = rank;
    m[1] = k;
    for (size_t e = 2; e < c; e++)
      m[e] = k * 100 + (int32_t)e;
    tdist_op_opts_t o = {.mask = TDIST_OP_FIELD_TAG, .tag = tag_of(rank, k, phase)};
    MP_CHECK_RC(tdist_isend(g, m, c, TDIST_INT32, 0, &o, &w[k]));
  }
  MP_CHECK_RC(tdist_wait_all(w, K, 0));
  for (int k = 0; k < K; k++)
    tdist_work_release(w[k]);
  free(buf);
  return 0;
}

/* Receiver side of one message: its status agrees with its payload, and
 * sender src's k are consecutive. */
static int check_msg(int rank, tdist_work_t *w, const int32_t *m, int *next, int phase) {
  int src = -2, tag = -2;
  size_t c = 0;
  MP_CHECK_RC(tdist_work_status_info(w, &src, &tag, &c));
  if (src != m[0] || m[1] != next[src] || c != cnt_of(src, m[1]) || tag != tag_of(src, m[1], phase))
    FAIL_AT("phase %d: status src %d tag %d count %zu, payload src %d k %d (expected k %d)", phase,
            src, tag, c, m[0], m[1], next[src >= 0 ? src : 0]);
  for (size_t e = 2; e < c; e++)
    if (m[e] != m[1] * 100 + (int32_t)e) FAIL_AT("phase %d: payload [%zu] wrong", phase, e);
  next[src]++;
  return 0;
}

static int wildcard_phase(tdist_group_t *g, int rank, int n, int phase) {
  int total = (n - 1) * K;
  if (rank != 0) {
    if (phase == 1) MP_CHECK_RC(tdist_barrier(g, NULL, NULL)); /* receives are posted */
    if (send_all(g, rank, phase)) return 1;
    if (phase == 2) MP_CHECK_RC(tdist_barrier(g, NULL, NULL)); /* all sent before posting */
    return 0;
  }
  int32_t *buf = malloc(sizeof(int32_t) * MAXC * (size_t)(total + 1));
  tdist_work_t **w = calloc((size_t)total + 1, sizeof(*w));
  int next[8] = {0};
  tdist_op_opts_t any = {.mask = TDIST_OP_FIELD_TAG, .tag = TDIST_ANY_TAG};
  if (phase == 2) MP_CHECK_RC(tdist_barrier(g, NULL, NULL));
  for (int i = 0; i < total; i++) {
    if (phase == 2 && i % 3 == 2) { /* the blocking form too */
      MP_CHECK_RC(tdist_recv(g, buf + i * MAXC, MAXC, TDIST_INT32, TDIST_ANY_SOURCE, &any));
      continue;
    }
    MP_CHECK_RC(tdist_irecv(g, buf + i * MAXC, MAXC, TDIST_INT32, TDIST_ANY_SOURCE, &any, &w[i]));
  }
  if (phase == 1) MP_CHECK_RC(tdist_barrier(g, NULL, NULL));
  /* Completion order is matching order for receives of one sender only;
   * walk in post order, which is matching order overall. */
  for (int i = 0; i < total; i++) {
    if (!w[i]) { /* blocking: the payload says who; order is checked below */
      int32_t *m = buf + i * MAXC;
      if (m[0] < 1 || m[0] >= n || m[1] != next[m[0]])
        FAIL_AT("phase %d: blocking recv got src %d k %d", phase, m[0], m[1]);
      next[m[0]]++;
      continue;
    }
    MP_CHECK_RC(tdist_work_wait(w[i], 0));
    if (check_msg(rank, w[i], buf + i * MAXC, next, phase)) return 1;
    tdist_work_release(w[i]);
  }
  for (int s = 1; s < n; s++)
    if (next[s] != K) FAIL_AT("phase %d: %d messages from %d", phase, next[s], s);
  free(buf);
  free(w);
  return 0;
}

/* Named and wildcard receives interleaved, fixed-tag any-source, any-tag
 * named-peer, a shorter message, a large one, and a send to self. */
static int mixed(tdist_group_t *g, int rank, int n) {
  int32_t a[4] = {rank, 1, 0, 0}, b[4] = {rank, 2, 0, 0}, c3[2] = {rank, 3};
  if (rank == 1 || rank == 2) {
    tdist_op_opts_t t7 = {.mask = TDIST_OP_FIELD_TAG, .tag = 7};
    MP_CHECK_RC(tdist_barrier(g, NULL, NULL));
    MP_CHECK_RC(tdist_send(g, a, 4, TDIST_INT32, 0, &t7));
    MP_CHECK_RC(tdist_send(g, b, 4, TDIST_INT32, 0, &t7));
    MP_CHECK_RC(tdist_send(g, c3, 2, TDIST_INT32, 0, &t7)); /* shorter than posted */
    /* The large message only once rank 0 has matched all six: sent earlier,
     * it could arrive before one of the other sender's and be matched by an
     * any-tag receive of count 4 (MISMATCH), as MPI would match it too. */
    MP_CHECK_RC(tdist_barrier(g, NULL, NULL));
    if (rank == 1) {
      int32_t *big = malloc(sizeof(int32_t) * BIG);
      for (int i = 0; i < BIG; i++)
        big[i] = i ^ 0x5a5a;
      MP_CHECK_RC(tdist_send(g, big, BIG, TDIST_INT32, 0, NULL));
      free(big);
    }
    return 0;
  }
  if (rank != 0) {
    MP_CHECK_RC(tdist_barrier(g, NULL, NULL));
    MP_CHECK_RC(tdist_barrier(g, NULL, NULL));
    return 0;
  }
  /* rank 0 (n >= 3): rank 1 and 2 each send (1), (2), (3 short) with tag 7. */
  int32_t r[6][4];
  tdist_work_t *w[6];
  tdist_op_opts_t t7 = {.mask = TDIST_OP_FIELD_TAG, .tag = 7},
                  anyt = {.mask = TDIST_OP_FIELD_TAG, .tag = TDIST_ANY_TAG};
  MP_CHECK_RC(tdist_irecv(g, r[0], 4, TDIST_INT32, 1, &t7, &w[0]));
  MP_CHECK_RC(tdist_irecv(g, r[1], 4, TDIST_INT32, TDIST_ANY_SOURCE, &t7, &w[1]));
  MP_CHECK_RC(tdist_irecv(g, r[2], 4, TDIST_INT32, 2, &anyt, &w[2]));
  MP_CHECK_RC(tdist_irecv(g, r[3], 4, TDIST_INT32, TDIST_ANY_SOURCE, &anyt, &w[3]));
  MP_CHECK_RC(tdist_irecv(g, r[4], 4, TDIST_INT32, TDIST_ANY_SOURCE, &anyt, &w[4]));
  MP_CHECK_RC(tdist_irecv(g, r[5], 4, TDIST_INT32, TDIST_ANY_SOURCE, &anyt, &w[5]));
  MP_CHECK_RC(tdist_barrier(g, NULL, NULL));
  MP_CHECK_RC(tdist_wait_all(w, 6, 0));
  MP_CHECK_RC(tdist_barrier(g, NULL, NULL)); /* all six matched: rank 1 may send the large one */
  int seen[3][4] = {{0}};
  for (int i = 0; i < 6; i++) {
    int src, tag;
    size_t c;
    MP_CHECK_RC(tdist_work_status_info(w[i], &src, &tag, &c));
    MP_CHECK(tag == 7 && (src == 1 || src == 2) && r[i][0] == src);
    MP_CHECK(c == (r[i][1] == 3 ? 2u : 4u));
    seen[src][r[i][1]]++;
    tdist_work_release(w[i]);
  }
  MP_CHECK(r[0][0] == 1 && r[0][1] == 1); /* the earliest receive got 1's first */
  MP_CHECK(r[2][0] == 2);                 /* the named one got one of 2's */
  for (int s = 1; s <= 2; s++)
    for (int k = 1; k <= 3; k++)
      MP_CHECK(seen[s][k] == 1);
  /* non-overtaking: in post order (= matching order), each sender's k grow */
  int last[3] = {0, 0, 0};
  for (int i = 0; i < 6; i++) {
    int s = r[i][0];
    MP_CHECK(r[i][1] > last[s]);
    last[s] = r[i][1];
  }
  /* large, any source: direct placement or a single-copy read */
  int32_t *big = malloc(sizeof(int32_t) * (BIG + 5));
  tdist_work_t *bw;
  MP_CHECK_RC(tdist_irecv(g, big, BIG + 5, TDIST_INT32, TDIST_ANY_SOURCE, &anyt, &bw));
  MP_CHECK_RC(tdist_work_wait(bw, 0));
  int src, tag;
  size_t c;
  MP_CHECK_RC(tdist_work_status_info(bw, &src, &tag, &c));
  MP_CHECK(src == 1 && tag == 0 && c == BIG);
  for (int i = 0; i < BIG; i++)
    if (big[i] != (i ^ 0x5a5a)) FAIL_AT("large [%d] = %d", i, big[i]);
  tdist_work_release(bw);
  free(big);
  /* self */
  int32_t me[3] = {42, 43, 44}, got[8] = {0};
  tdist_work_t *sw, *rw;
  tdist_op_opts_t t9 = {.mask = TDIST_OP_FIELD_TAG, .tag = 9};
  MP_CHECK_RC(tdist_isend(g, me, 3, TDIST_INT32, 0, &t9, &sw));
  MP_CHECK_RC(tdist_irecv(g, got, 8, TDIST_INT32, TDIST_ANY_SOURCE, &anyt, &rw));
  MP_CHECK_RC(tdist_work_wait(sw, 0));
  MP_CHECK_RC(tdist_work_wait(rw, 0));
  MP_CHECK_RC(tdist_work_status_info(rw, &src, &tag, &c));
  MP_CHECK(src == 0 && tag == 9 && c == 3 && got[2] == 44);
  /* a send has no status info */
  MP_CHECK(tdist_work_status_info(sw, &src, &tag, &c) == TDIST_ERR_INVALID_ARGUMENT);
  tdist_work_release(sw);
  tdist_work_release(rw);
  return 0;
}

/* A named receive reports its own peer, tag and count. */
static int named_status(tdist_group_t *g, int rank, int n) {
  int32_t v[5] = {1, 2, 3, 4, 5};
  tdist_op_opts_t t3 = {.mask = TDIST_OP_FIELD_TAG, .tag = 3};
  if (rank == 1) MP_CHECK_RC(tdist_send(g, v, 5, TDIST_INT32, 0, &t3));
  if (rank != 0) return 0;
  tdist_work_t *w;
  MP_CHECK_RC(tdist_irecv(g, v, 5, TDIST_INT32, 1, &t3, &w));
  int src = -1, tag = -1;
  size_t c = 0;
  int rc = tdist_work_status_info(w, &src, &tag, &c);
  MP_CHECK(rc == 0 || rc == TDIST_ERR_IN_PROGRESS);
  MP_CHECK_RC(tdist_work_wait(w, 0));
  MP_CHECK_RC(tdist_work_status_info(w, &src, &tag, &c));
  MP_CHECK(src == 1 && tag == 3 && c == 5);
  MP_CHECK(tdist_work_status_info(NULL, &src, &tag, &c) == TDIST_ERR_INVALID_ARGUMENT);
  tdist_work_release(w);
  /* wildcards are for receives only */
  MP_CHECK(tdist_send(g, v, 1, TDIST_INT32, TDIST_ANY_SOURCE, NULL) == TDIST_ERR_INVALID_ARGUMENT);
  tdist_op_opts_t bad = {.mask = TDIST_OP_FIELD_TAG, .tag = TDIST_ANY_TAG};
  MP_CHECK(tdist_send(g, v, 1, TDIST_INT32, 0, &bad) == TDIST_ERR_INVALID_ARGUMENT);
  (void)n;
  return 0;
}

/* Longer than the wildcard receive takes: MISMATCH on every rank, naming
 * both counts. In a subgroup of all ranks, so the world goes on. The last
 * rank, not a party, registers its copy of the subgroup a second late: the
 * ERR message and the abort record come before it (once both were
 * dropped, and it waited out its 60 s timeout; CI, under ASan). */
static int too_long(tdist_group_t *world, int rank, int n) {
  int all[8];
  for (int i = 0; i < n; i++)
    all[i] = i;
  tdist_group_t *sub = NULL;
  if (n >= 3 && rank == n - 1) tdist__inject_arm("cpu.group.register", 1000);
  MP_CHECK_RC(tdist_new_group(world, all, n, NULL, &sub));
  int32_t v[16] = {0};
  int rc = 0;
  char msg[512] = "";
  if (rank == 1) rc = tdist_send(sub, v, 9, TDIST_INT32, 0, NULL);
  if (rank == 0) rc = tdist_recv(sub, v, 4, TDIST_INT32, TDIST_ANY_SOURCE, NULL);
  snprintf(msg, sizeof(msg), "%s", tdist_last_error());
  if (rc == 0) { /* not a party, or done before the cause came: the next op fails */
    rc = tdist_barrier(sub, NULL, NULL);
    snprintf(msg, sizeof(msg), "%s", tdist_last_error());
  }
  if (rc != TDIST_ERR_MISMATCH || !strstr(msg, "count 9") || !strstr(msg, "count 4"))
    FAIL_AT("too long: %s: %s", tdist_err_name(rc), msg);
  if (rank == 0) fprintf(stderr, "[rank 0] too long -> %s: %s\n", tdist_err_name(rc), msg);
  tdist_group_destroy(sub);
  MP_CHECK_RC(tdist_barrier(world, NULL, NULL));
  return 0;
}

static int child(int rank, int n, void *arg) {
  tdist_group_t *g = NULL;
  MP_CHECK_RC(cpu_test_init(*(int *)arg, rank, n, 60000, &g));
  for (int phase = 1; phase <= 2; phase++) {
    if (wildcard_phase(g, rank, n, phase)) return 1;
    MP_CHECK_RC(tdist_barrier(g, NULL, NULL));
  }
  if (n >= 3 && mixed(g, rank, n)) return 1;
  MP_CHECK_RC(tdist_barrier(g, NULL, NULL));
  if (named_status(g, rank, n)) return 1;
  MP_CHECK_RC(tdist_barrier(g, NULL, NULL));
  if (too_long(g, rank, n)) return 1;
  MP_CHECK_RC(tdist_group_destroy(g));
  return 0;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 4;
  if (n < 2 || n > 8) return 2;
  setenv("TDIST_TRACE_ON_FAILURE", "0", 1);
  int port = tdist_mp_free_port();
  int rc = tdist_mp_run(n, child, &port, 170);
  printf("cpu_anysource n=%d: %s\n", n, rc ? "FAILED" : "ok");
  return rc ? 1 : 0;
}
