"""tdist.torch, the torch.distributed backend "tdist", under tdistrun (2 and 4 ranks): every
ProcessGroup method torch 1.13 calls, checked against torch's own gloo backend in the same
job (a gloo group over the same ranks) or against computed values; subgroups; futures;
refusals; init_device_mesh; DDP training equal to a single-process run (FSDP where torch has it). One pytest session per
world size (importing torch is slow)."""
import datetime
import os

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import tdist  # noqa: E402
import tdist.torch as tt  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def torch_world():
    dist.init_process_group("tdist", timeout=datetime.timedelta(seconds=60))
    gloo = dist.new_group(backend="gloo")
    yield gloo
    dist.destroy_process_group()


def rs():
    return dist.get_rank(), dist.get_world_size()


def test_backend_and_world(torch_world):
    r, n = rs()
    assert dist.get_backend() == "tdist"
    pg = dist.distributed_c10d._get_default_group()
    assert isinstance(pg, tt.ProcessGroupTdist) and pg.name() == "tdist"
    assert n == int(os.environ["WORLD_SIZE"]) and r == int(os.environ["RANK"])
    dist.barrier()  # the tdist group is made on the first op
    # under tdistrun the CPU world is tdist's own env:// world on the launcher's store
    assert tdist.is_initialized() and tdist.get_world_size() == n


DTYPES = [torch.float32, torch.float64, torch.int64, torch.int32, torch.bfloat16,
          torch.float16, torch.uint8]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"])
def test_all_reduce_vs_gloo(torch_world, dtype, op):
    r, n = rs()
    if op.startswith("B") and dtype.is_floating_point:
        pytest.skip("bitwise ops are for integers")
    g = torch.Generator().manual_seed(100 + r)
    if dtype.is_floating_point:
        x = (torch.rand(37, generator=g) * 3 + 0.5).to(dtype)
    else:
        x = torch.randint(1, 7, (37,), generator=g).to(dtype)
    a, b = x.clone(), x.clone()
    dist.all_reduce(a, op=getattr(dist.ReduceOp, op))
    if dtype in (torch.bfloat16, torch.float16) or op.startswith("B"):
        # computed reference (gloo's half types and bitwise ops vary by build)
        # every rank's input through gloo, as bytes (gloo has no half types)
        xb = x.view(torch.uint8)
        xs = [torch.empty_like(xb) for _ in range(n)]
        dist.all_gather(xs, xb, group=torch_world)
        xs = [t.view(dtype) for t in xs]
        st = torch.stack([t.double() if dtype.is_floating_point else t for t in xs])
        ref = {"SUM": lambda s: s.sum(0), "PRODUCT": lambda s: s.prod(0),
               "MIN": lambda s: s.min(0).values, "MAX": lambda s: s.max(0).values,
               "BAND": lambda s: _fold(s, torch.bitwise_and),
               "BOR": lambda s: _fold(s, torch.bitwise_or),
               "BXOR": lambda s: _fold(s, torch.bitwise_xor)}[op](st)
        tol = 0.05 if dtype in (torch.bfloat16, torch.float16) else 0
        assert torch.allclose(a.double(), ref.double(), rtol=tol, atol=tol), (a, ref)
    else:
        dist.all_reduce(b, op=getattr(dist.ReduceOp, op), group=torch_world)
        assert torch.allclose(a.double(), b.double(), rtol=1e-6), (a, b)


def _fold(s, f):
    out = s[0]
    for t in s[1:]:
        out = f(out, t)
    return out


def test_all_reduce_avg_async_future(torch_world):
    r, n = rs()
    x = torch.full((1000,), float(r), dtype=torch.float64)
    w = dist.all_reduce(x, op=dist.ReduceOp.AVG, async_op=True)
    assert isinstance(w, tt.TdistWork)
    fut = w.get_future()
    got = fut.then(lambda f: f.value()[0] * 2).wait()
    assert w.is_completed() and w.is_success() and w.exception() is None
    assert torch.all(x == (n - 1) / 2) and torch.all(got == n - 1)
    assert w.result()[0] is x
    w.wait()


def test_premul_complex_refused_bool_logical(torch_world):
    x = torch.ones(4)
    with pytest.raises(NotImplementedError, match="PREMUL_SUM"):
        dist.all_reduce(x, op=dist._make_nccl_premul_sum(2.0))
    # bool: tdist's logical reductions (gloo's result for bool: or / and), 0/1 kept
    r, n = rs()
    b = torch.tensor([r == 0, True, False, r == n - 1])
    dist.all_reduce(b)
    assert b.dtype == torch.bool and b.tolist() == [True, True, False, True]
    b = torch.tensor([r == 0, True, False, r == n - 1])
    dist.all_reduce(b, op=dist.ReduceOp.MIN)
    assert b.tolist() == [n == 1, True, False, n == 1]
    c = torch.ones(3, dtype=torch.complex64)  # torch itself passes view_as_real(c) for SUM
    dist.all_reduce(c)
    assert torch.all(c == dist.get_world_size())
    pg = dist.distributed_c10d._get_default_group()
    with pytest.raises(ValueError, match="view_as_real"):
        pg.allreduce([c], dist.AllreduceOptions())


def test_all_reduce_coalesced(torch_world):
    r, n = rs()
    ts = [torch.full((5,), float(r)), torch.full((3,), float(r + 1))]
    dist.all_reduce_coalesced(ts)
    assert torch.all(ts[0] == sum(range(n))) and torch.all(ts[1] == sum(range(1, n + 1)))


def test_broadcast_reduce(torch_world):
    r, n = rs()
    for root in range(n):
        x = torch.arange(10, dtype=torch.float32) + r
        dist.broadcast(x, src=root)
        assert torch.equal(x, torch.arange(10, dtype=torch.float32) + root)
        y = torch.arange(10, dtype=torch.int64) * (r + 1)
        y2 = y.clone()
        dist.reduce(y, dst=root, op=dist.ReduceOp.MAX)
        dist.reduce(y2, dst=root, op=dist.ReduceOp.MAX, group=torch_world)
        if r == root:
            assert torch.equal(y, y2)


def test_gathers_scatters(torch_world):
    r, n = rs()
    x = torch.arange(6, dtype=torch.float32) + 10 * r
    out = [torch.empty(6) for _ in range(n)]
    dist.all_gather(out, x)
    ref = [torch.empty(6) for _ in range(n)]
    dist.all_gather(ref, x, group=torch_world)
    assert all(torch.equal(a, b) for a, b in zip(out, ref))
    flat = torch.empty(6 * n)
    dist.all_gather_into_tensor(flat, x)
    assert torch.equal(flat, torch.cat(ref))
    flat2 = torch.empty(6 * n)
    dist._all_gather_base(flat2, x)
    assert torch.equal(flat2, torch.cat(ref))
    for root in (0, n - 1):
        gl = [torch.empty(6) for _ in range(n)] if r == root else None
        dist.gather(x, gl, dst=root)
        if r == root:
            assert all(torch.equal(a, b) for a, b in zip(gl, ref))
        sl = [torch.full((4,), float(i * 7 + root)) for i in range(n)] if r == root else None
        o = torch.empty(4)
        dist.scatter(o, sl, src=root)
        assert torch.all(o == r * 7 + root)
    ins = [torch.full((3,), float(r * n + i)) for i in range(n)]
    o = torch.empty(3)
    dist.reduce_scatter(o, ins)
    assert torch.all(o == sum(q * n + r for q in range(n)))
    big = torch.cat(ins)
    o2 = torch.empty(3)
    dist.reduce_scatter_tensor(o2, big)
    assert torch.equal(o, o2)
    o3 = torch.empty(3)
    dist._reduce_scatter_base(o3, big)
    assert torch.equal(o, o3)


def test_all_to_all(torch_world):
    r, n = rs()
    ins = [torch.full((2,), float(r * 100 + i)) for i in range(n)]
    outs = [torch.empty(2) for _ in range(n)]
    dist.all_to_all(outs, ins)
    assert all(torch.all(outs[i] == i * 100 + r) for i in range(n))
    x = torch.arange(4 * n, dtype=torch.float32) + 1000 * r
    y = torch.empty(4 * n)
    dist.all_to_all_single(y, x)
    assert torch.equal(y, torch.cat([torch.arange(4 * r, 4 * r + 4, dtype=torch.float32)
                                     + 1000 * i for i in range(n)]))
    # uneven: rank r sends j+1 elements to rank j, all of value r
    isz = [j + 1 for j in range(n)]
    osz = [r + 1] * n
    x = torch.full((sum(isz),), float(r))
    y = torch.empty(sum(osz))
    dist.all_to_all_single(y, x, osz, isz)
    assert torch.equal(y, torch.cat([torch.full((r + 1,), float(i)) for i in range(n)]))


def test_p2p(torch_world):
    r, n = rs()
    nxt, prv = (r + 1) % n, (r - 1) % n
    s = torch.full((8,), float(r), dtype=torch.bfloat16)
    o = torch.empty(8, dtype=torch.bfloat16)
    ws = dist.isend(s, nxt)
    wr = dist.irecv(o, prv)
    ws.wait()
    wr.wait()
    assert torch.all(o == prv)
    # any source: rank 0 receives from everyone else
    if r == 0:
        seen = set()
        for _ in range(n - 1):
            b = torch.empty(2, dtype=torch.int64)
            src = dist.recv(b)
            assert torch.all(b == src * 3)
            seen.add(src)
        assert seen == set(range(1, n))
    else:
        dist.send(torch.full((2,), r * 3, dtype=torch.int64), 0)
    dist.barrier()
    # torch 1.13's dist.monitored_barrier accepts gloo only: the method, called directly
    pg = dist.distributed_c10d._get_default_group()
    pg.monitored_barrier(datetime.timedelta(seconds=30), False)


def test_subgroups(torch_world):
    r, n = rs()
    members = [n - 1, 0]  # group rank 0 is world rank n-1
    sub = dist.new_group(members, backend="tdist")
    if r not in members:
        assert sub == dist.GroupMember.NON_GROUP_MEMBER
    else:
        x = torch.full((3,), float(r + 1))
        dist.all_reduce(x, group=sub)
        assert torch.all(x == n + 1)
        y = torch.full((2,), float(r))
        dist.broadcast(y, src=n - 1, group=sub)
        assert torch.all(y == n - 1)
        b = torch.empty(1)
        if r == 0:
            dist.send(torch.tensor([5.0]), n - 1, group=sub)
        else:
            dist.recv(b, 0, group=sub)
            assert b.item() == 5.0
    if n >= 4:
        evens = dist.new_group([0, 2], backend="tdist")
        odds = dist.new_group([1, 3], backend="tdist")
        mine = evens if r % 2 == 0 else odds
        x = torch.tensor([float(r)])
        dist.all_reduce(x, group=mine)
        assert x.item() == (2.0 if r % 2 == 0 else 4.0)
    dist.barrier()


def test_device_mesh(torch_world):
    """tdist.torch.init_device_mesh (torch 1.13 has none): row-major coordinates, and each
    dimension's group holds exactly the ranks that differ only there (checked by an
    all_gather of world ranks against the coordinates' arithmetic)."""
    r, n = rs()
    shape = (2, n // 2) if n % 2 == 0 and n > 2 else (n,)
    names = ("dp", "tp")[:len(shape)] if len(shape) == 2 else ("dp",)
    mesh = tt.init_device_mesh("cpu", shape, mesh_dim_names=names)
    assert mesh.size() == n and mesh.ndim == len(shape)
    stride = 1
    strides = []
    for d in reversed(shape):
        strides.insert(0, stride)
        stride *= d
    for d, name in enumerate(names):
        g = mesh.get_group(name)
        c = mesh.get_local_rank(d)
        assert c == (r // strides[d]) % shape[d] and dist.get_rank(g) == c
        want = [r + (k - c) * strides[d] for k in range(shape[d])]
        got = [torch.zeros(1, dtype=torch.int64) for _ in want]
        dist.all_gather(got, torch.tensor([r]), group=g)
        assert [int(t.item()) for t in got] == want
    with pytest.raises(ValueError, match="ranks, the world"):
        tt.init_device_mesh("cpu", (n + 1,))


# ---- training ------------------------------------------------------------------------------
def _data():
    g = torch.Generator().manual_seed(7)
    X = torch.randn(64, 8, generator=g, dtype=torch.float64)
    Y = X @ torch.randn(8, 1, generator=g, dtype=torch.float64) + 0.1
    return X, Y


def _model():
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 1)).double()


def _train(model, X, Y, steps=20):
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(X), Y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_ddp_matches_single_process(torch_world):
    r, n = rs()
    X, Y = _data()
    ref = _train(_model(), X, Y)
    shard = slice(r * 64 // n, (r + 1) * 64 // n)
    ddp = torch.nn.parallel.DistributedDataParallel(_model(), bucket_cap_mb=0.0001)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for step in range(20):
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(X[shard]), Y[shard]).backward()
        opt.step()
    final = torch.nn.functional.mse_loss(ddp.module(X), Y).item()
    exp = torch.nn.functional.mse_loss(_ref_model_after(X, Y), Y).item()
    assert abs(final - exp) <= 1e-9 * max(1.0, abs(exp)), (final, exp, ref[-1])


class _WithUnused(torch.nn.Module):
    """_model() and a branch forward never uses: DDP's find_unused_parameters path (its
    reducer all-reduces a used-parameters map and waits on that Work from C++)."""

    def __init__(self):
        super().__init__()
        self.net = _model()
        self.unused = torch.nn.Linear(8, 1).double()

    def forward(self, x):
        return self.net(x)


def test_ddp_unused_parameters_and_buffers(torch_world):
    """find_unused_parameters=True and a buffer DDP broadcasts from rank 0 every forward
    (_broadcast_coalesced from C++): the result still equals the single-process run, and
    the works C++ held are not kept once it let go."""
    r, n = rs()
    X, Y = _data()
    m = _WithUnused()
    m.register_buffer("step", torch.tensor([float(r)], dtype=torch.float64))
    ddp = torch.nn.parallel.DistributedDataParallel(m, find_unused_parameters=True,
                                                    bucket_cap_mb=0.0001)
    unused0 = m.unused.weight.detach().clone()
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    shard = slice(r * 64 // n, (r + 1) * 64 // n)
    for i in range(20):
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(X[shard]), Y[shard]).backward()
        opt.step()
        assert m.step.item() == i  # rank 0's buffer (0, 1, ...), broadcast at the forward
        m.step.add_(1 + r)  # the ranks' buffers differ until the next forward
    assert torch.equal(m.unused.weight, unused0) and m.unused.weight.grad is None
    final = torch.nn.functional.mse_loss(m.net(X), Y).item()
    exp = torch.nn.functional.mse_loss(_ref_model_after(X, Y), Y).item()
    assert abs(final - exp) <= 1e-9 * max(1.0, abs(exp)), (final, exp)
    del ddp, opt
    dist.barrier()
    dist.barrier()
    # every work of those 20 steps has completed and C++ holds none: at most the last
    # sweep's survivors and the works since are pinned, not one per op of the run
    assert len(tt._pinned) < 64, len(tt._pinned)


def _ref_model_after(X, Y):
    m = _model()
    _train(m, X, Y)
    return m(X)


def test_fsdp_cpu(torch_world):
    """torch's FSDP over tdist on CPU: its result must match the single-process run, or
    the test skips naming what refused. Debian's torch 1.13.1 on Python 3.11 cannot import
    torch.distributed.fsdp at all (a dataclass in torch.distributed._shard has a mutable
    default, which Python 3.11 refuses), and 1.13's FSDP makes CUDA streams when first run."""
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    except (ImportError, ValueError) as e:
        pytest.skip(f"torch {torch.__version__}: torch.distributed.fsdp does not import: {e}")
    r, n = rs()
    X, Y = _data()
    try:
        m = FSDP(_model())
    except (RuntimeError, ValueError, AssertionError) as e:
        pytest.skip(f"FSDP refuses CPU modules in torch {torch.__version__}: {e}")
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    shard = slice(r * 64 // n, (r + 1) * 64 // n)
    try:
        for _ in range(20):
            opt.zero_grad()
            torch.nn.functional.mse_loss(m(X[shard]), Y[shard]).backward()
            opt.step()
        final = torch.nn.functional.mse_loss(m(X), Y).item()
    except (RuntimeError, AssertionError) as e:
        if "cuda" in str(e).lower() or "CUDA" in str(e):
            pytest.skip(f"FSDP needs CUDA in torch {torch.__version__}: {e}")
        raise
    exp = torch.nn.functional.mse_loss(_ref_model_after(X, Y), Y).item()
    assert abs(final - exp) <= 1e-9 * max(1.0, abs(exp)), (final, exp)
