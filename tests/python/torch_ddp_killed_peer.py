"""tdist.torch failure path through DDP (run under tdistrun --no-fail-fast by run_expect.py):
after one training step the last rank os._exit(17)s; on each survivor the next step's
forward or backward (DDP's C++ reducer waits on tdist's works and futures) raises an error
whose text names the victim, instead of hanging. Exit 0 on survivors."""
import os
import sys

import torch
import torch.distributed as dist

import tdist.torch  # noqa: F401

dist.init_process_group("tdist")
rank, size = dist.get_rank(), dist.get_world_size()
victim = size - 1
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
model(torch.ones(2, 4)).sum().backward()
dist.barrier()
if rank == victim:
    sys.stdout.flush()
    os._exit(17)
try:
    model(torch.ones(2, 4)).sum().backward()
    raise SystemExit(f"rank {rank}: the step after the peer's death succeeded")
except RuntimeError as e:
    assert f"rank {victim}" in str(e), str(e)
    print(f"rank {rank}: survivor OK: {type(e).__name__}", flush=True)
os._exit(0)
