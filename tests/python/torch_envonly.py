"""tdist.torch without tdistrun, torchrun-style: started by test_torch_env.py with RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT only (rank 0 binds torch's TCPStore on MASTER_PORT;
tdist's own store is served by rank 0 on a free port, found through torch's store)."""
import torch
import torch.distributed as dist

import tdist.torch  # noqa: F401

dist.init_process_group("tdist")
r, n = dist.get_rank(), dist.get_world_size()
x = torch.full((100,), float(r + 1), dtype=torch.float64)
dist.all_reduce(x)
assert torch.all(x == n * (n + 1) / 2), x
sub = dist.new_group([0, n - 1], backend="tdist")
if r in (0, n - 1):
    y = torch.tensor([float(r)])
    dist.all_reduce(y, group=sub)
    assert y.item() == n - 1
out = [torch.empty(1) for _ in range(n)]
dist.all_gather(out, torch.tensor([float(r)]))
assert [o.item() for o in out] == list(range(n))
dist.barrier()
dist.destroy_process_group()
print(f"rank {r} OK", flush=True)
