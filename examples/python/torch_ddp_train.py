#!/usr/bin/env python3
"""torch_ddp_train.py - a plain torch DistributedDataParallel script on the "tdist" backend.

    tdistrun -n 4 python3 examples/python/torch_ddp_train.py            # tdist.torch
    tdistrun -n 4 python3 examples/python/torch_ddp_train.py --backend gloo
    torchrun --nproc_per_node 4 examples/python/torch_ddp_train.py      # torch's launcher

(python3: one with torch, e.g. Debian's /usr/bin/python3 with python3-torch; PYTHONPATH
naming tdist's python/ directory unless tdist is installed. Debian's torchrun of torch
1.13.1 fails on Python 3.11 before starting any rank; any launcher that sets RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT will do.)

Nothing here is tdist's but the line `import tdist.torch` and the backend's name: the
rest is what one writes for torch's own backends. A 2-layer MLP (float64) learns a
regression; each rank trains on its shard of every global batch (DistributedSampler's
split), DDP averages the gradients in buckets during backward, and SGD steps. The same
script first trains the same model on whole batches in this process alone, and compares
the loss curves step by step: they must agree to 1e-9 relative. Both runs compute the same
sums grouped differently (per shard, then across ranks), so they differ by float64
rounding (~1e-16 per operation), far below 1e-9, while a lost bucket, a wrong average or a
stale gradient changes the loss by far more. Exits 1 on every rank if the curves differ.
"""
import argparse
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import tdist.torch  # noqa: F401  (registers the backend "tdist")


def make_data(n=1024, d=16):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    w = torch.randn(d, 1, generator=g, dtype=torch.float64) / d ** 0.5
    y = torch.sin(x @ w) + 0.1 * torch.randn(n, 1, generator=g, dtype=torch.float64)
    return TensorDataset(x, y)


def make_model(d=16, h=32):
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(d, h), torch.nn.Tanh(),
                               torch.nn.Linear(h, 1)).double()


def global_loss(model, data):
    with torch.no_grad():
        x, y = data.tensors
        return torch.nn.functional.mse_loss(model(x), y).item()


def train(model, loader, data, steps, lr, sync=None):
    """SGD on `loader`'s batches; the loss of the whole data set after each step."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    curve, step = [], 0
    while step < steps:
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            curve.append(global_loss(sync or model, data))
            step += 1
            if step == steps:
                break
    return curve


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="tdist")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=256, help="global batch size")
    ap.add_argument("--lr", type=float, default=0.1)
    a = ap.parse_args()

    dist.init_process_group(a.backend)
    rank, size = dist.get_rank(), dist.get_world_size()
    data = make_data()
    if a.batch % size:
        sys.exit(f"--batch {a.batch} is not a multiple of the world size {size}")

    # The single-process reference: whole batches, in the same order.
    ref_loader = DataLoader(data, batch_size=a.batch, shuffle=False)
    ref = train(make_model(), ref_loader, data, a.steps, a.lr)

    # Data parallel: each rank a shard of every batch. DistributedSampler without shuffling
    # deals the samples round robin (rank r: r, r+size, ...), so the ranks' k-th batches of
    # batch/size samples make up the reference's k-th batch.
    sampler = DistributedSampler(data, num_replicas=size, rank=rank, shuffle=False)
    loader = DataLoader(data, batch_size=a.batch // size, sampler=sampler)
    model = DDP(make_model(), bucket_cap_mb=0.001)  # small buckets: several per backward
    got = train(model, loader, data, a.steps, a.lr, sync=model.module)

    worst = max(abs(g - r) / max(abs(r), 1e-300) for g, r in zip(got, ref))
    ok = len(got) == len(ref) and worst <= 1e-9
    flag = torch.tensor([0 if ok else 1])
    dist.all_reduce(flag)
    if rank == 0:
        print(f"backend={dist.get_backend()} ranks={size} steps={a.steps} "
              f"loss {ref[0]:.6f} -> {ref[-1]:.6f} (single process) vs {got[-1]:.6f} "
              f"(DDP); worst relative difference {worst:.2e}: "
              f"{'OK' if flag.item() == 0 else 'MISMATCH'}", flush=True)
    dist.destroy_process_group()
    sys.exit(0 if flag.item() == 0 else 1)


if __name__ == "__main__":
    main()
