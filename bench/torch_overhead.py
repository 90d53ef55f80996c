#!/usr/bin/env python3
"""torch_overhead.py - what a 1-float dist.all_reduce costs through tdist.torch, against
torch's own Gloo backend and tdist's Python binding, measured in the same run.

Run under tdistrun with the torch of /usr/bin/python3 (Debian's python3-torch):

    PYTHONPATH=python tdistrun -n 2 /usr/bin/python3 bench/torch_overhead.py [--ops 2000] [--reps 5]

Three ways, interleaved round by round (best round of each kept), blocking ops:

  tdist.torch  dist.all_reduce(t) on the default group of backend "tdist";
  gloo         dist.all_reduce(t, group=g) on a Gloo group over the same ranks;
  binding      tdist.all_reduce(t) on the tdist group behind the torch group
               (what tdist.torch adds is the difference).

Rank 0 prints ns/op, the ratios tdist.torch / gloo and tdist.torch / binding, and one line
"peer=torch op=all_reduce n=1 ranks=N ..." in the format of the other benches.
"""
import argparse
import time

import torch
import torch.distributed as dist

import tdist
import tdist.torch as tt


def best_of(fn, ops, reps):
    best = float("inf")
    for _ in range(reps):
        dist.barrier()
        t0 = time.perf_counter_ns()
        fn(ops)
        best = min(best, (time.perf_counter_ns() - t0) / ops)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    dist.init_process_group("tdist")
    gloo = dist.new_group(backend="gloo")
    pg = dist.distributed_c10d._get_default_group()
    tg = pg.tdist_group("cpu")
    x = torch.ones(1)

    def f_tt(n):
        for _ in range(n):
            dist.all_reduce(x)

    def f_gloo(n):
        for _ in range(n):
            dist.all_reduce(x, group=gloo)

    def f_bind(n):
        for _ in range(n):
            tdist.all_reduce(x, group=tg)

    fns = {"tdist.torch": f_tt, "gloo": f_gloo, "binding": f_bind}
    for f in fns.values():  # warm up
        f(100)
    res = {k: float("inf") for k in fns}
    for _ in range(a.reps):
        for k, f in fns.items():
            res[k] = min(res[k], best_of(f, a.ops, 1))
    n = dist.get_world_size()
    if dist.get_rank() == 0:
        print(f"blocking all_reduce of 1 float32, {n} ranks, CPU (best of {a.reps} "
              f"interleaved rounds of {a.ops} ops), ns/op:")
        print("| tdist.torch | gloo | tdist binding | tdist.torch / gloo | tdist.torch / binding |")
        print("|---|---|---|---|---|")
        t, g, b = res["tdist.torch"], res["gloo"], res["binding"]
        print(f"| {t:.0f} | {g:.0f} | {b:.0f} | {t / g:.2f} | {t / b:.2f} |")
        print(f"peer=torch op=all_reduce n=1 ranks={n} tdist_torch_ns_op={t:.0f} "
              f"gloo_ns_op={g:.0f} binding_ns_op={b:.0f} ratio_gloo={t / g:.2f} "
              f"ratio_binding={t / b:.2f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
