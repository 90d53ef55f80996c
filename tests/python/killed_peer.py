"""A rank leaves mid-job with os._exit (run under tdistrun --no-fail-fast by
run_expect.py): every survivor gets tdist.RemoteFailure naming it, from a pending Work and
from the blocking form, and the store's liveness check agrees. Exit 0 on survivors."""
import os
import sys
import time

import numpy as np

import tdist

tdist.init_process_group(timeout=30)
rank, size = tdist.get_rank(), tdist.get_world_size()
victim = size - 1
x = np.ones(1 << 16, np.float32)
for _ in range(3):  # the job is running
    tdist.all_reduce(x)
assert x[0] == size ** 3
if rank == victim:
    sys.stdout.flush()
    os._exit(17)  # mid-job: no goodbye, no destroy
w = tdist.all_reduce(x, async_op=True)
try:
    w.wait()
    raise SystemExit(f"rank {rank}: the all_reduce succeeded without rank {victim}")
except tdist.RemoteFailure as e:
    assert e.rank == victim and e.world_rank == victim, (e.rank, e.world_rank, str(e))
    assert isinstance(w.exception(), tdist.RemoteFailure)
    print(f"rank {rank}: RemoteFailure(rank={e.rank}): {e}")
t0 = time.monotonic()
try:
    tdist.all_reduce(x)  # the group is aborted: fails at once with the same cause
    raise SystemExit("a later op succeeded")
except tdist.RemoteFailure as e:
    assert time.monotonic() - t0 < 5
    print(f"rank {rank}: later op: RemoteFailure(rank={e.rank})")
tdist.destroy_process_group()
print(f"rank {rank}: survivor OK")
