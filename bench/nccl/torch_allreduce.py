#!/usr/bin/env python3
"""torch.distributed's async all_reduce on one GPU (world size 1, NCCL), measured
like bench/nccl/nccl_overhead.cu: CPU time per call (call to return) with ops
issued back to back, and time from the call's return until work.is_completed()
is seen by a spinning host thread; plus work.wait() + a stream sync.

Usage: python3 torch_allreduce.py [PORT] [COUNT] [ITERS]
"""
import os
import sys
import time

import torch
import torch.distributed as dist


def stats(name, v):
    v = sorted(v)
    print(f"{name:<34} mean {sum(v) / len(v):8.2f} us  p50 {v[len(v) // 2]:8.2f}  "
          f"p99 {v[int(len(v) * 0.99)]:8.2f}  (n={len(v)})")


def main():
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 29544
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 256
    iters = int(sys.argv[3]) if len(sys.argv) > 3 else 20000
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                            world_size=1, device_id=torch.device("cuda:0"))
    t = torch.zeros(count, device="cuda")
    for _ in range(1000):
        dist.all_reduce(t)
    torch.cuda.synchronize()
    submit, lat, wait = [], [], []
    batch = 256
    ns = time.perf_counter_ns
    for _ in range(0, iters, batch):
        works = []
        for _ in range(batch):
            t0 = ns()
            works.append(dist.all_reduce(t, async_op=True))
            submit.append((ns() - t0) / 1e3)
        for w in works:
            w.wait()
        torch.cuda.synchronize()
    for _ in range(iters // 4):
        w = dist.all_reduce(t, async_op=True)
        t0 = ns()
        while not w.is_completed():
            pass
        lat.append((ns() - t0) / 1e3)
    for _ in range(iters // 4):
        w = dist.all_reduce(t, async_op=True)
        t0 = ns()
        w.wait()
        torch.cuda.current_stream().synchronize()
        wait.append((ns() - t0) / 1e3)
    print(f"torch {torch.__version__}, NCCL {torch.cuda.nccl.version()}; "
          f"all_reduce of {count} float32, {iters} iterations")
    stats("torch submit (async all_reduce)", submit)
    stats("torch completion seen (is_completed)", lat)
    stats("torch wait + stream sync", wait)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
