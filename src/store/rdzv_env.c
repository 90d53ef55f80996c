/*
 * rdzv_env.c - where a rank meets the others (the part of
 * tdist__rendezvous_join that reads the environment): its rank and world
 * size from the options, RANK/WORLD_SIZE or a cluster launcher's variables
 * (Open MPI's, Slurm's), and the store's address from tcp://host:port,
 * MASTER_ADDR/MASTER_PORT or the cluster's (the first host of the
 * allocation, a port derived from the job id). docs/launcher.md lists the
 * variables. Threads: the caller's; no state.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/rendezvous.h"
#include "util/error.h"
#include "util/log.h"
#include "util/param.h"

/* Parse env `name` as an int >= min; 1 found, 0 unset, negative error. */
static int env_int(const char *name, int min, int *out) {
  const char *s = tdist__env_raw(name);
  if (!s) return 0;
  char *end;
  long v = strtol(s, &end, 10);
  if (*end || v < min || v > 1 << 30)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "%s='%s' is not an integer >= %d", name, s,
                        min);
  *out = (int)v;
  return 1;
}

/* The first of several variables that is set; `which` names it. */
static int env_first(const char *const *names, int min, int *out, const char **which) {
  for (; *names; names++) {
    int rc = env_int(*names, min, out);
    if (rc) {
      *which = *names;
      return rc;
    }
  }
  return 0;
}

/* Cluster launchers that start the ranks themselves, without tdistrun
 * (docs/launcher.md): where their rank and size are. Open MPI comes first:
 * inside a Slurm allocation mpirun's processes inherit SLURM_PROCID from the
 * step that started mpirun's daemons (the same value for every rank of a
 * node), while mpirun sets OMPI_COMM_WORLD_* for each process. Rank and size
 * come from one launcher, never one from each. */
typedef struct cluster {
  const char *name, *rank_var, *size_var;
} cluster_t;

static const cluster_t clusters[] = {
    {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
    {"Slurm", "SLURM_PROCID", "SLURM_NTASKS"},
};

/* The launcher that started this process, or NULL. */
static const cluster_t *cluster_env(void) {
  for (size_t i = 0; i < sizeof(clusters) / sizeof(clusters[0]); i++)
    if (tdist__env_raw(clusters[i].rank_var)) return &clusters[i];
  return NULL;
}

int tdist__rdzv_rank_size(const tdist_init_opts_t *o, int *rank, int *size) {
  const cluster_t *cl = cluster_env();
  const char *const rank_vars[] = {"RANK", cl ? cl->rank_var : NULL, NULL};
  const char *const size_vars[] = {"WORLD_SIZE", cl ? cl->size_var : NULL, NULL};
  const char *rname = "rank", *sname = "world_size";
  int rc;
  if (o && (o->mask & TDIST_INIT_FIELD_RANK)) {
    *rank = o->rank;
  } else if ((rc = env_first(rank_vars, 0, rank, &rname)) <= 0) {
    return rc < 0
               ? rc
               : tdist__error(TDIST_ERR_INVALID_ARGUMENT, "RANK is not set (nor SLURM_PROCID, "
                                                          "OMPI_COMM_WORLD_RANK, nor opts.rank)");
  }
  if (o && (o->mask & TDIST_INIT_FIELD_WORLD_SIZE)) {
    *size = o->world_size;
  } else if ((rc = env_first(size_vars, 1, size, &sname)) <= 0) {
    return rc < 0 ? rc
                  : tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                                 "WORLD_SIZE is not set (nor "
                                 "SLURM_NTASKS, OMPI_COMM_WORLD_SIZE, nor opts.world_size)");
  }
  if (*size < 1)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "%s=%d must be at least 1", sname, *size);
  if (*rank < 0 || *rank >= *size)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "%s=%d is not below %s=%d",
                        strcmp(rname, "rank") ? rname : "RANK", *rank,
                        strcmp(sname, "world_size") ? sname : "WORLD_SIZE", *size);
  /* LOCAL_RANK / LOCAL_WORLD_SIZE: only checked for consistency here, and
   * only against a world the environment describes: with rank and size both
   * in opts (a further world on the caller's store, as tdist.torch makes for
   * a subgroup) they are the launcher's, not this world's. */
  if (o && (o->mask & TDIST_INIT_FIELD_RANK) && (o->mask & TDIST_INIT_FIELD_WORLD_SIZE)) return 0;
  int lr = -1, lws = -1;
  if ((rc = env_int("LOCAL_RANK", 0, &lr)) < 0) return rc;
  if ((rc = env_int("LOCAL_WORLD_SIZE", 1, &lws)) < 0) return rc;
  if (lr >= 0 && lws > 0 && lr >= lws)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                        "LOCAL_RANK=%d is not below "
                        "LOCAL_WORLD_SIZE=%d",
                        lr, lws);
  if (lws > *size)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "LOCAL_WORLD_SIZE=%d exceeds WORLD_SIZE=%d",
                        lws, *size);
  return 0;
}

/* The first host name of a Slurm node list: "gpu[07-09,12],cpu01" ->
 * "gpu07" (every bracketed range contributes its first element, so
 * "r[1-2]n[3-4]" -> "r1n3"). 0, or -1 if it does not fit. */
static int first_host(const char *list, char *out, size_t ol) {
  size_t k = 0;
  for (const char *c = list; *c && *c != ','; c++) {
    if (*c == '[') {
      for (c++; *c && *c != '-' && *c != ',' && *c != ']'; c++)
        if (k + 1 < ol) out[k++] = *c;
      while (*c && *c != ']')
        c++;
      if (!*c) break;
      continue;
    }
    if (k + 1 >= ol) return -1;
    out[k++] = *c;
  }
  out[k] = '\0';
  return k ? 0 : -1;
}

/* No MASTER_ADDR under a cluster launcher: the host of rank 0, which hosts
 * the store. Loopback when the job runs on one node (Slurm:
 * SLURM_STEP_NUM_NODES, else SLURM_NNODES, is 1; Open MPI:
 * OMPI_COMM_WORLD_LOCAL_SIZE equals the world size). Across Slurm nodes, the
 * first node of the step (SLURM_STEP_NODELIST, else SLURM_JOB_NODELIST,
 * else SLURM_NODELIST): srun's block and cyclic distributions both put task
 * 0 there. Not SLURM_LAUNCH_NODE_IPADDR: srun may run on a login node that
 * runs no task. Across Open MPI nodes nothing says where rank 0 runs, so
 * MASTER_ADDR is required (mpirun -x MASTER_ADDR=...). */
static int cluster_addr(const cluster_t *cl, char *host, size_t hl) {
  int nodes = 0;
  if (cl->rank_var[0] == 'S') {
    if (env_int("SLURM_STEP_NUM_NODES", 1, &nodes) <= 0 && env_int("SLURM_NNODES", 1, &nodes) <= 0)
      nodes = 0;
    if (nodes != 1) {
      static const char *const lists[] = {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST",
                                          "SLURM_NODELIST"};
      for (size_t i = 0; i < 3; i++) {
        const char *l = tdist__env_raw(lists[i]);
        if (l && first_host(l, host, hl) == 0) return 0;
      }
      return tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                          "MASTER_ADDR is not set and Slurm's node list is missing or "
                          "unreadable: set MASTER_ADDR to the host of rank 0");
    }
  } else {
    int local = 0, world = 0;
    if (env_int("OMPI_COMM_WORLD_LOCAL_SIZE", 1, &local) > 0 &&
        env_int("OMPI_COMM_WORLD_SIZE", 1, &world) > 0 && local == world)
      nodes = 1;
    if (nodes != 1)
      return tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                          "MASTER_ADDR is not set and this Open MPI job spans several nodes: "
                          "pass the host of rank 0 (mpirun -x MASTER_ADDR=host -x MASTER_PORT=p)");
  }
  snprintf(host, hl, "127.0.0.1");
  return 0;
}

/* No MASTER_PORT under a cluster launcher: a port every rank of the job
 * derives alike and concurrent jobs on one node rarely share, in
 * [15000, 32000) (below Linux's ephemeral ports, 32768-60999). Slurm:
 * 15000 + (16 * SLURM_JOB_ID + SLURM_STEP_ID mod 16) mod 17000, so up to 16
 * concurrent steps of one job differ. Open MPI: 15000 + a hash of the job's
 * PMIx namespace (OMPI_MCA_ess_base_jobid if absent) mod 17000. A clash
 * shows as rank 0 failing to listen ("address in use"): set MASTER_PORT. */
static int cluster_port(const cluster_t *cl, int *port) {
  uint64_t h = 0;
  if (cl->rank_var[0] == 'S') {
    const char *job = tdist__env_raw("SLURM_JOB_ID");
    const char *step = tdist__env_raw("SLURM_STEP_ID");
    if (!job) job = tdist__env_raw("SLURM_JOBID");
    if (!step) step = tdist__env_raw("SLURM_STEPID");
    if (!job)
      return tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                          "MASTER_PORT is not set and neither is SLURM_JOB_ID");
    h = strtoull(job, NULL, 10) * 16 + (step ? strtoull(step, NULL, 10) % 16 : 0);
  } else {
    const char *ns = tdist__env_raw("PMIX_NAMESPACE");
    if (!ns) ns = tdist__env_raw("OMPI_MCA_ess_base_jobid");
    if (!ns)
      return tdist__error(TDIST_ERR_INVALID_ARGUMENT,
                          "MASTER_PORT is not set and Open MPI's job id is unknown");
    h = 1469598103934665603ULL; /* FNV-1a */
    for (const char *c = ns; *c; c++)
      h = (h ^ (uint8_t)*c) * 1099511628211ULL;
  }
  *port = 15000 + (int)(h % 17000);
  return 0;
}

/* host:port from "tcp://host:port" or from MASTER_ADDR/MASTER_PORT. */
int tdist__rdzv_store_addr(const char *method, char *host, size_t hl, int *port) {
  if (strncmp(method, "tcp://", 6) == 0) {
    const char *hp = method + 6, *colon = strrchr(hp, ':');
    if (!colon || colon == hp || (size_t)(colon - hp) >= hl)
      return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "init_method '%s' is not tcp://host:port",
                          method);
    memcpy(host, hp, (size_t)(colon - hp));
    host[colon - hp] = 0;
    if (host[0] == '[' && host[strlen(host) - 1] == ']') { /* [v6] */
      memmove(host, host + 1, strlen(host));
      host[strlen(host) - 1] = 0;
    }
    char *end;
    long p = strtol(colon + 1, &end, 10);
    if (*end || p < 1 || p > 65535)
      return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "init_method '%s': bad port", method);
    *port = (int)p;
    return 0;
  }
  /* Defaults only when the cluster launcher also gave the rank: a
   * torchrun-style RANK (tdistrun inside an allocation) comes with its own
   * MASTER_ADDR/MASTER_PORT, and Slurm's would name another job's store. */
  const cluster_t *cl = tdist__env_raw("RANK") ? NULL : cluster_env();
  const char *a = tdist__env_raw("MASTER_ADDR");
  if (a) {
    if (strlen(a) >= hl) return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "MASTER_ADDR is too long");
    snprintf(host, hl, "%s", a);
  } else if (!cl) {
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "MASTER_ADDR is not set (env://)");
  } else {
    TDIST_CHECK(cluster_addr(cl, host, hl));
  }
  int rc = env_int("MASTER_PORT", 1, port);
  if (rc < 0) return rc;
  if (rc == 0 && !cl)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "MASTER_PORT is not set (env://)");
  if (rc == 0) TDIST_CHECK(cluster_port(cl, port));
  if (*port > 65535)
    return tdist__error(TDIST_ERR_INVALID_ARGUMENT, "MASTER_PORT=%d is out of range", *port);
  if (!a || rc == 0)
    TDIST_INFO(INIT, "store at %s:%d (%s from %s's environment)", host, *port,
               !a && rc == 0 ? "address and port"
               : !a          ? "address"
                             : "port",
               cl->name);
  return 0;
}
