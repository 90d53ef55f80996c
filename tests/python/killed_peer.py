"""A rank leaves mid-job with os._exit (run under tdistrun --no-fail-fast by
run_expect.py): every survivor learns it from the world group's on_abort callback (rank 1
with no op in flight), rank 0 also from its pending Work, and a later blocking op fails at
once; each names the victim with tdist.RemoteFailure. Exit 0 on survivors."""
import os
import sys
import threading
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
world = tdist.GroupMember.WORLD
told = threading.Event()
seen = []
world.on_abort(lambda g, exc: (seen.append((g, exc)), told.set()))
try:
    world.on_abort(lambda g, exc: None)
    raise SystemExit("a second on_abort was accepted")
except tdist.TdistError as e:
    assert e.name == "TDIST_ERR_INVALID_STATE", e.name
tdist.barrier()
# The victim leaves only once every survivor is past the barrier: a rank's
# barrier can complete before another's has (each completes locally), and a
# survivor still inside it would fail the barrier itself instead of learning
# of the death as this test means. Each survivor tells it with a message sent
# after its barrier returned (not waited for: the victim may be gone by then).
ack = np.zeros(1, np.float32)
if rank == victim:
    for r in range(size - 1):
        tdist.recv(ack, src=r)
    sys.stdout.flush()
    os._exit(17)  # mid-job: no goodbye, no destroy
told_victim = tdist.isend(ack, dst=victim)
# Rank 0 has an op in flight when the victim leaves; rank 1 has none and
# learns it from the abort callback alone.
w = None
if rank == 0:
    try:
        w = tdist.all_reduce(x, async_op=True)
    except tdist.RemoteFailure:  # the death was already known (a slow scheduler): refused
        pass
assert told.wait(30), f"rank {rank}: on_abort was not called within 30 s"
g, exc = seen[0]
assert g is world and isinstance(exc, tdist.RemoteFailure), (g, type(exc), str(exc))
assert exc.rank == victim and exc.world_rank == victim, (exc.rank, exc.world_rank, str(exc))
print(f"rank {rank}: on_abort: RemoteFailure(rank={exc.rank}): {exc}")
if w is not None:
    try:
        w.wait()
        raise SystemExit(f"rank {rank}: the all_reduce succeeded without rank {victim}")
    except tdist.RemoteFailure as e:
        assert e.rank == victim and e.world_rank == victim, (e.rank, e.world_rank, str(e))
        assert isinstance(w.exception(), tdist.RemoteFailure)
        print(f"rank {rank}: pending op: RemoteFailure(rank={e.rank}): {e}")
t0 = time.monotonic()
try:
    tdist.all_reduce(x)  # the group is aborted: fails at once with the same cause
    raise SystemExit("a later op succeeded")
except tdist.RemoteFailure as e:
    assert time.monotonic() - t0 < 5
    print(f"rank {rank}: later op: RemoteFailure(rank={e.rank})")
tdist.destroy_process_group()
print(f"rank {rank}: survivor OK")
