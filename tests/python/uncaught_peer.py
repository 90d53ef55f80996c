"""A rank dies of an uncaught Python exception (run under tdistrun --no-fail-fast by
run_expect.py): the package's exit hook aborts its groups with the exception's type and
message as the reason, so every survivor's failed op says which exception ended which
rank, and its exception's .rank/.world_rank name that rank. Exit 0 on survivors."""
import sys

import numpy as np

import tdist

tdist.init_process_group(timeout=60)
rank, size = tdist.get_rank(), tdist.get_world_size()
victim = size - 1
x = np.ones(1024, np.float32)
tdist.all_reduce(x)  # the job is running
tdist.barrier()
if rank == victim:
    sys.stdout.flush()
    raise ValueError("bad input\nin batch 7")  # the message goes on one line
try:
    tdist.all_reduce(x)  # the victim never joins: the abort ends it
    raise SystemExit(f"rank {rank}: all_reduce succeeded without rank {victim}")
except (tdist.AbortedError, tdist.RemoteFailure) as e:
    msg = str(e)
    assert "uncaught ValueError: bad input in batch 7" in msg, msg
    assert e.rank == victim and e.world_rank == victim, (type(e), e.rank, e.world_rank, msg)
    print(f"rank {rank}: {type(e).__name__}(rank={e.rank}, world_rank={e.world_rank}): {msg}")
print(f"rank {rank}: survivor OK")
