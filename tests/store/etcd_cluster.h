/*
 * etcd_cluster.h - a throw-away etcd cluster for tests (test_store_etcd.c).
 *
 * ec_start(n) runs n etcd members on loopback addresses 127.0.0.x (x picked
 * at random, one per member; ports found free on that address), their data
 * dirs in a fresh temp dir. The members die with the test (PR_SET_PDEATHSIG),
 * are killed and their dir removed at exit (atexit, and on SIGINT/SIGTERM);
 * dirs left by a test that was SIGKILLed are removed by the next run.
 *
 * Not thread-safe; call from the test's main thread before starting threads
 * (the members are forked).
 */
#ifndef TDIST_TEST_ETCD_CLUSTER_H
#define TDIST_TEST_ETCD_CLUSTER_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define EC_MAX 5
#define EC_TMP_PREFIX "tdist-etcd-test-"

typedef struct ec_member {
  char ip[32];
  int client_port, peer_port;
  pid_t pid; /* 0 once killed */
} ec_member_t;

static struct {
  int n;
  ec_member_t m[EC_MAX];
  char dir[256];
  char bin[256];
  pid_t owner; /* only the process that started the cluster cleans up */
} ec;

/* The etcd binary: $TDIST_ETCD_BIN if set, else `etcd` in PATH (or
 * /usr/bin); 0 found, -1 not. */
static inline int ec_find_binary(void) {
  const char *env = getenv("TDIST_ETCD_BIN");
  if (env && *env) { /* given: that one or none */
    snprintf(ec.bin, sizeof(ec.bin), "%s", env);
    return access(env, X_OK) == 0 ? 0 : -1;
  }
  const char *path = getenv("PATH");
  char buf[4096];
  snprintf(buf, sizeof(buf), "%s", path ? path : "/usr/bin:/bin");
  for (char *save = NULL, *d = strtok_r(buf, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
    snprintf(ec.bin, sizeof(ec.bin), "%s/etcd", d);
    if (access(ec.bin, X_OK) == 0) return 0;
  }
  /* Debian's etcd-server also keeps it in /usr/bin; sbin paths are not always in PATH. */
  snprintf(ec.bin, sizeof(ec.bin), "/usr/bin/etcd");
  return access(ec.bin, X_OK) == 0 ? 0 : -1;
}

static inline void ec_rmrf(const char *path) {
  DIR *d = opendir(path);
  if (d) {
    for (struct dirent *de; (de = readdir(d));) {
      if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
      char sub[1024];
      snprintf(sub, sizeof(sub), "%.700s/%.255s", path, de->d_name);
      struct stat st;
      if (lstat(sub, &st) == 0 && S_ISDIR(st.st_mode))
        ec_rmrf(sub);
      else
        unlink(sub);
    }
    closedir(d);
  }
  rmdir(path);
}

static inline void ec_kill(int i) {
  if (ec.m[i].pid > 0) {
    kill(ec.m[i].pid, SIGKILL);
    waitpid(ec.m[i].pid, NULL, 0);
    ec.m[i].pid = 0;
  }
}

static inline void ec_cleanup(void) {
  if (ec.owner != getpid()) return; /* a forked test child exiting */
  for (int i = 0; i < ec.n; i++)
    ec_kill(i);
  if (ec.dir[0]) ec_rmrf(ec.dir);
  ec.dir[0] = 0;
}

static inline void ec_on_signal(int sig) {
  ec_cleanup();
  signal(sig, SIG_DFL);
  raise(sig);
}

/* Remove the dirs of earlier runs whose process is gone (SIGKILLed by a
 * ctest timeout, say). */
static inline void ec_sweep(void) {
  DIR *d = opendir("/tmp");
  if (!d) return;
  for (struct dirent *de; (de = readdir(d));) {
    if (strncmp(de->d_name, EC_TMP_PREFIX, strlen(EC_TMP_PREFIX))) continue;
    int pid = atoi(de->d_name + strlen(EC_TMP_PREFIX));
    if (pid > 0 && kill(pid, 0) != 0 && errno == ESRCH) {
      char p[300];
      snprintf(p, sizeof(p), "/tmp/%s", de->d_name);
      ec_rmrf(p);
    }
  }
  closedir(d);
}

/* A port nobody listens on at ip (bound, then released). */
static inline int ec_free_port(const char *ip) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET};
  inet_pton(AF_INET, ip, &a.sin_addr);
  socklen_t l = sizeof(a);
  int port = -1;
  if (bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
      getsockname(fd, (struct sockaddr *)&a, &l) == 0)
    port = ntohs(a.sin_port);
  close(fd);
  return port;
}

/* "ip:port,ip:port,..." of the members `first`..n-1, then 0..first-1. */
static inline void ec_endpoints(char *out, size_t ol, int first) {
  size_t k = 0;
  out[0] = 0;
  for (int j = 0; j < ec.n; j++) {
    int i = (first + j) % ec.n;
    int w = snprintf(out + k, ol - k, "%s%s:%d", j ? "," : "", ec.m[i].ip, ec.m[i].client_port);
    if (w > 0 && (size_t)w < ol - k) k += (size_t)w;
  }
}

static inline pid_t ec_spawn(int i, const char *cluster) {
  char name[16], data[300], curl[64], purl[64], log[300];
  snprintf(name, sizeof(name), "m%d", i);
  snprintf(data, sizeof(data), "%s/%s", ec.dir, name);
  snprintf(log, sizeof(log), "%s/%s.log", ec.dir, name);
  snprintf(curl, sizeof(curl), "http://%s:%d", ec.m[i].ip, ec.m[i].client_port);
  snprintf(purl, sizeof(purl), "http://%s:%d", ec.m[i].ip, ec.m[i].peer_port);
  pid_t pid = fork();
  if (pid != 0) return pid;
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0) {
    dup2(fd, 1);
    dup2(fd, 2);
    close(fd);
  }
  /* A loaded test machine: a generous election timeout avoids needless
   * elections; 64 MiB values need a request limit above 4/3 of that. */
  execl(ec.bin, ec.bin, "--name", name, "--data-dir", data, "--listen-client-urls", curl,
        "--advertise-client-urls", curl, "--listen-peer-urls", purl,
        "--initial-advertise-peer-urls", purl, "--initial-cluster", cluster,
        "--initial-cluster-state", "new", "--initial-cluster-token", ec.dir + 5,
        "--heartbeat-interval", "100", "--election-timeout", "1500", "--max-request-bytes",
        "104857600", "--log-level", "warn", (char *)NULL);
  _exit(127);
}

/* Start n members; 0, or -1 with a message on stderr. */
static inline int ec_start(int n) {
  if (n > EC_MAX) return -1;
  ec_sweep();
  ec.owner = getpid();
  snprintf(ec.dir, sizeof(ec.dir), "/tmp/" EC_TMP_PREFIX "%d", (int)getpid());
  ec_rmrf(ec.dir);
  if (mkdir(ec.dir, 0700) != 0) {
    fprintf(stderr, "etcd_cluster: cannot create %s: %s\n", ec.dir, strerror(errno));
    return -1;
  }
  atexit(ec_cleanup);
  signal(SIGINT, ec_on_signal);
  signal(SIGTERM, ec_on_signal);
  srand((unsigned)(getpid() ^ time(NULL)));
  int base = 2 + rand() % 200;
  char cluster[1024] = "";
  size_t k = 0;
  ec.n = n;
  for (int i = 0; i < n; i++) {
    snprintf(ec.m[i].ip, sizeof(ec.m[i].ip), "127.0.0.%d", base + i * 17 % 50);
    ec.m[i].client_port = ec_free_port(ec.m[i].ip);
    do
      ec.m[i].peer_port = ec_free_port(ec.m[i].ip);
    while (ec.m[i].peer_port == ec.m[i].client_port);
    if (ec.m[i].client_port <= 0 || ec.m[i].peer_port <= 0) {
      fprintf(stderr, "etcd_cluster: no free port on %s\n", ec.m[i].ip);
      return -1;
    }
    k += (size_t)snprintf(cluster + k, sizeof(cluster) - k, "%sm%d=http://%s:%d", i ? "," : "", i,
                          ec.m[i].ip, ec.m[i].peer_port);
  }
  for (int i = 0; i < n; i++)
    if ((ec.m[i].pid = ec_spawn(i, cluster)) < 0) {
      fprintf(stderr, "etcd_cluster: fork failed: %s\n", strerror(errno));
      return -1;
    }
  return 0;
}

/* Print the members' logs (after a failure). */
static inline void ec_dump_logs(void) {
  for (int i = 0; i < ec.n; i++) {
    char p[300], line[1024];
    snprintf(p, sizeof(p), "%s/m%d.log", ec.dir, i);
    FILE *f = fopen(p, "r");
    if (!f) continue;
    fprintf(stderr, "---- etcd member %d (%s) ----\n", i, p);
    for (int l = 0; l < 40 && fgets(line, sizeof(line), f); l++)
      fputs(line, stderr);
    fclose(f);
  }
}

#endif
