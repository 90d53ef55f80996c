"""tdist.torch failure path (run under tdistrun --no-fail-fast by run_expect.py): the last
rank os._exit(17)s while the others have an all_reduce pending; each survivor's
Work.wait() raises torch's DistBackendError type (tdist.torch's stand-in on torch 1.13),
also a tdist.RemoteFailure whose .rank names the victim. Exit 0 on survivors."""
import os
import sys

import torch
import torch.distributed as dist

import tdist
import tdist.torch as tt

dist.init_process_group("tdist")
rank, size = dist.get_rank(), dist.get_world_size()
victim = size - 1
x = torch.ones(1 << 12)
dist.all_reduce(x)
assert x[0].item() == size
dist.barrier()
if rank == victim:
    sys.stdout.flush()
    os._exit(17)
w = dist.all_reduce(x, async_op=True)  # the victim never joins
try:
    w.wait()
    raise SystemExit(f"rank {rank}: the wait succeeded")
except tt.DistBackendError as e:
    assert isinstance(e, RuntimeError) and isinstance(e, tdist.RemoteFailure), type(e).__mro__
    assert e.rank == victim, (e.rank, str(e))
    assert f"rank {victim}" in str(e), str(e)
    print(f"rank {rank}: survivor OK: {type(e).__name__}: {e}", flush=True)
os._exit(0)
