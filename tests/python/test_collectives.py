"""Every collective and dtype against a NumPy reference, sync and async (run at 1-4 ranks)."""
import os
import threading

import numpy as np
import pytest

import tdist
from conftest import numpy_dtypes

DTYPES = numpy_dtypes()
N = 7  # elements per rank: odd, so nothing lines up by accident


def value(r, dt, n=N, salt=0):
    """Rank r's input: small integers (exact in every dtype, sums fit int8 at 4 ranks)."""
    v = (np.arange(n) + 3 * r + salt) % 5 + 1
    if dt.kind == "b":
        return (v % 2).astype(dt)
    return v.astype(dt)


def ref_reduce(op, arrays, dt):
    a = np.stack([x.astype(np.float64) for x in arrays])
    if op == tdist.ReduceOp.SUM:
        r = a.sum(0)
    elif op == tdist.ReduceOp.PRODUCT:
        r = a.prod(0)
    elif op == tdist.ReduceOp.MIN:
        r = a.min(0)
    elif op == tdist.ReduceOp.MAX:
        r = a.max(0)
    elif op.name in ("BAND", "BOR", "BXOR"):
        f = {"BAND": np.bitwise_and, "BOR": np.bitwise_or, "BXOR": np.bitwise_xor}[op.name]
        return f.reduce(np.stack(arrays), axis=0).astype(dt)
    elif op == tdist.ReduceOp.AVG:
        r = a.sum(0) / len(arrays)
        if dt.kind in "iu":
            r = np.trunc(r)
    return r.astype(dt)


def check(got, want, dt):
    if dt.kind == "f":
        tol = 1e-2 if dt.itemsize <= 2 else 1e-6
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol)
    else:
        np.testing.assert_array_equal(got, want)


OPS = [tdist.ReduceOp.SUM, tdist.ReduceOp.PRODUCT, tdist.ReduceOp.MIN, tdist.ReduceOp.MAX,
       tdist.ReduceOp.AVG]


# bitwise reductions, where the library has them: integer types and bool
BITWISE = [op for op in tdist.ReduceOp if op.name in ("BAND", "BOR", "BXOR")]


def _ops_for(dt):
    ops = [op for op in OPS if not (dt.kind == "b" and op in (tdist.ReduceOp.AVG,))]
    return ops + (BITWISE if dt.kind in "iub" else [])


@pytest.mark.parametrize("async_op", [False, True])
@pytest.mark.parametrize("dt", DTYPES, ids=str)
def test_all_reduce(dt, async_op, rank, size):
    for op in _ops_for(dt):
        # products of 1s and 2s: exact and in range for int8 at 4 ranks
        inp = (lambda r: value(r, dt) % 2 + 1) if op == tdist.ReduceOp.PRODUCT and \
            dt.kind != "b" else \
            (lambda r: value(r, dt))
        x = inp(rank)
        w = tdist.all_reduce(x, op=op, async_op=async_op)
        if async_op:
            assert isinstance(w, tdist.Work)
            assert w.wait() is True
            assert w.is_completed() and w.exception() is None
        else:
            assert w is None
        check(x, ref_reduce(op, [inp(r) for r in range(size)], dt), dt)


def test_premul_sum(rank, size):
    x = value(rank, np.dtype(np.float32))
    tdist.all_reduce(x, op=tdist.premul_sum(0.5))
    check(x, sum(value(r, np.dtype(np.float32)) for r in range(size)) * 0.5,
          np.dtype(np.float32))


@pytest.mark.parametrize("dt", DTYPES, ids=str)
def test_broadcast_reduce(dt, rank, size):
    for root in range(size):
        x = value(rank, dt)
        tdist.broadcast(x, src=root, async_op=True).wait()
        check(x, value(root, dt), dt)
        x = value(rank, dt)
        tdist.reduce(x, dst=root, op=tdist.ReduceOp.MAX)
        if rank == root:
            check(x, ref_reduce(tdist.ReduceOp.MAX, [value(r, dt) for r in range(size)], dt), dt)
        else:
            check(x, value(rank, dt), dt)


@pytest.mark.parametrize("dt", DTYPES, ids=str)
def test_all_gather(dt, rank, size):
    x = value(rank, dt)
    # a list of separate arrays (staged), and one array (in place)
    out = [np.zeros(N, dt) for _ in range(size)]
    w = tdist.all_gather(out, x, async_op=True)
    w.wait()
    for r in range(size):
        check(out[r], value(r, dt), dt)
    big = np.zeros((size, N), dt)
    tdist.all_gather_into_tensor(big, x)
    check(big, np.stack([value(r, dt) for r in range(size)]), dt)
    # consecutive views of one buffer: used in place
    big2 = np.zeros((size, N), dt)
    tdist.all_gather(list(big2), x)
    check(big2, big, dt)


@pytest.mark.parametrize("dt", DTYPES, ids=str)
def test_gather_scatter(dt, rank, size):
    root = size - 1
    x = value(rank, dt)
    gl = [np.zeros(N, dt) for _ in range(size)] if rank == root else None
    tdist.gather(x, gl, dst=root)
    if rank == root:
        for r in range(size):
            check(gl[r], value(r, dt), dt)
    sl = [value(r, dt, salt=7) for r in range(size)] if rank == 0 else None
    y = np.zeros(N, dt)
    tdist.scatter(y, sl, src=0, async_op=True).wait()
    check(y, value(rank, dt, salt=7), dt)


@pytest.mark.parametrize("dt", DTYPES, ids=str)
def test_reduce_scatter(dt, rank, size):
    op = tdist.ReduceOp.SUM if dt.kind != "b" else tdist.ReduceOp.MAX
    inp = [value(rank, dt, salt=j) for j in range(size)]
    out = np.zeros(N, dt)
    tdist.reduce_scatter(out, inp, op=op)
    check(out, ref_reduce(op, [value(r, dt, salt=rank) for r in range(size)], dt), dt)
    out2 = np.zeros(N, dt)
    tdist.reduce_scatter_tensor(out2, np.concatenate(inp), op=op, async_op=True).wait()
    check(out2, out, dt)


@pytest.mark.parametrize("dt", DTYPES, ids=str)
def test_all_to_all(dt, rank, size):
    inp = [value(rank, dt, salt=10 * j) for j in range(size)]
    out = [np.zeros(N, dt) for _ in range(size)]
    tdist.all_to_all(out, inp, async_op=True).wait()
    for i in range(size):
        check(out[i], value(i, dt, salt=10 * rank), dt)
    out2 = np.zeros(size * N, dt)
    tdist.all_to_all_single(out2, np.concatenate(inp))
    check(out2, np.concatenate(out), dt)


def test_barrier_and_zero_count(rank, size):
    tdist.barrier()
    tdist.barrier(async_op=True).wait()
    e = np.zeros(0, np.float32)
    tdist.all_reduce(e)
    tdist.broadcast(e, src=0)


def test_send_recv(rank, size):
    if size < 2:
        pytest.skip("needs 2 ranks")
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    x = np.full(5, rank, np.int32)
    y = np.zeros(5, np.int32)
    # ring with isend/irecv, then blocking send/recv by parity, then a batch
    ws = [tdist.isend(x, dst=nxt, tag=3), tdist.irecv(y, src=prv, tag=3)]
    for w in ws:
        w.wait()
    assert (y == prv).all()
    z = np.zeros(5, np.int32)
    if rank % 2 == 0:
        tdist.send(x, dst=nxt)
        if not (size % 2 and rank == 0):
            assert tdist.recv(z, src=prv) == prv
    else:
        assert tdist.recv(z, src=prv) == prv
        tdist.send(x, dst=nxt)
    if size % 2 and rank == 0:  # odd ring: rank 0's receive from the last (even) rank
        assert tdist.recv(z, src=prv) == prv
    assert (z == prv).all()
    a, b = np.zeros(5, np.int32), np.zeros(5, np.int32)
    ops = [tdist.P2POp(tdist.isend, x, nxt), tdist.P2POp(tdist.irecv, a, prv),
           tdist.P2POp(tdist.isend, x, prv, tag=1), tdist.P2POp(tdist.irecv, b, nxt, tag=1)]
    works = tdist.batch_isend_irecv(ops)
    assert len(works) == 1
    tdist.wait_all(works)
    assert (a == prv).all() and (b == nxt).all()


def test_callbacks(rank, size):
    """add_done_callback runs on the tdist-callbacks thread, after completion, in order."""
    seen = []
    done = threading.Event()
    x = np.ones(1000, np.float64)
    w = tdist.all_reduce(x, async_op=True)

    def cb(work):
        seen.append((threading.current_thread().name, work.is_completed(), float(x[0])))

    w.add_done_callback(cb)
    w.add_done_callback(lambda work: done.set())
    assert done.wait(30)
    assert seen == [("tdist-callbacks", True, float(size))]
    # registered after completion: still runs, on the callback thread
    again = threading.Event()
    w.add_done_callback(lambda work: again.set())
    assert again.wait(30)
    fut = tdist.all_reduce(x, async_op=True).get_future()
    assert fut.result(30)[0] is x  # the output, as torch's future


def test_work_dropped_without_wait(rank, size):
    """A Work dropped while running keeps its array alive until the op is over."""
    for _ in range(20):
        tdist.all_reduce(np.ones(10000, np.float32), async_op=True)
    tdist.barrier()
    x = np.ones(3, np.float32)
    tdist.all_reduce(x)
    assert (x == size).all()


def test_other_array_kinds(rank, size):
    import array
    a = array.array("d", [rank + 1.0] * 4)
    tdist.all_reduce(a)
    assert list(a) == [size * (size + 1) / 2] * 4
    ba = bytearray([rank + 1] * 3)
    tdist.all_reduce(ba, op=tdist.ReduceOp.MAX)
    assert list(ba) == [size] * 3
    src = bytes([9, 8, 7]) if rank == 0 else None
    out = bytearray(3 * size)
    tdist.all_gather_into_tensor(out, bytes([rank] * 3))  # read-only input is fine
    assert list(out) == [r for r in range(size) for _ in range(3)]
    del src


def test_validation_before_send(rank, size):
    x = np.zeros((4, 4), np.float32)
    with pytest.raises(ValueError, match="not contiguous"):
        tdist.all_reduce(x[:, 1])
    ro = np.zeros(4, np.float32)
    ro.setflags(write=False)
    with pytest.raises(ValueError, match="read-only"):
        tdist.all_reduce(ro)
    with pytest.raises(ValueError, match="no tdist dtype"):
        tdist.all_reduce(np.zeros(4, np.complex64))
    with pytest.raises(ValueError, match="elements"):
        tdist.all_gather_into_tensor(np.zeros(size * 4 + 1, np.float32), np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="dtype"):
        tdist.all_gather_into_tensor(np.zeros(size * 4, np.float64), np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="not in group"):
        tdist.broadcast(np.zeros(1), src=size)
    with pytest.raises(ValueError, match="unknown reduction"):
        tdist.all_reduce(np.zeros(1), op="median")
    # nothing was sent: the group still works
    y = np.ones(2)
    tdist.all_reduce(y)
    assert (y == size).all()


def test_host_memory_on_device_group_refused(rank, size):
    """A fake device array (__cuda_array_interface__) on a CPU group: ValueError, not sent."""
    class FakeCuda:
        __cuda_array_interface__ = {"shape": (4,), "typestr": "<f4", "data": (4096, False),
                                    "version": 3, "strides": None}
    with pytest.raises(ValueError, match="device"):
        tdist.all_reduce(FakeCuda())


def test_store(rank, size, tmp_path_factory):
    from conftest import job_id
    w = tdist.GroupMember.WORLD
    # TCPStore: rank 0 hosts, the others learn the port through a broadcast
    port = np.zeros(1, np.int64)
    if rank == 0:
        st = tdist.TCPStore("127.0.0.1", 0, size, is_master=True, timeout=30)
        port[0] = st.port
    tdist.broadcast(port, src=0)
    if rank != 0:
        st = tdist.TCPStore("127.0.0.1", int(port[0]), size, timeout=30)
    fs = tdist.FileStore(f"/tmp/tdist_pytest_filestore_{job_id()}", size)
    for s in (st, fs, tdist.PrefixStore("pre/", st)):
        s.set(f"k{rank}", f"v{rank}")
        assert s.get(f"k{(rank + 1) % size}") == f"v{(rank + 1) % size}".encode()
        assert s.add("counter", 2) % 2 == 0
        s.wait([f"k{r}" for r in range(size)])
        assert s.check([f"k{r}" for r in range(size)])
        assert not s.check(["missing-key"])
        tdist.barrier()
        assert s.add("counter", 0) == 2 * size
        if rank == 0:
            assert s.compare_set("cas", "", "first") == b"first"
            assert s.compare_set("cas", "nope", "second") == b"first"
            assert s.delete_key("cas") and not s.delete_key("cas")
        s.multi_set([f"m{rank}a", f"m{rank}b"], [b"1", b"2"])
        assert s.multi_get([f"m{rank}a", f"m{rank}b"]) == [b"1", b"2"]
        with pytest.raises(tdist.TimeoutError):
            s.get("never-set", timeout=0.2)
        assert s.num_keys() > 0
        tdist.barrier()
    fs.close()
    tdist.barrier()
    if rank == 0:
        os.unlink(f"/tmp/tdist_pytest_filestore_{job_id()}")  # everyone is done with the server before rank 0 stops it
    st.close()


class _DLPackView:
    """A host array seen through __dlpack__ as another element type (DLPack code, bits):
    exercises the DLPack path, and bfloat16, which NumPy lacks."""

    def __init__(self, arr, code, bits):
        import ctypes
        from tdist import _buffers
        self.arr = arr
        self._shape = (ctypes.c_int64 * 1)(arr.size)

        class Managed(ctypes.Structure):
            _fields_ = [("t", _buffers._DLTensor), ("ctx", ctypes.c_void_p),
                        ("deleter", ctypes.c_void_p)]
        m = Managed()
        m.t.data = arr.ctypes.data
        m.t.device.device_type = 1  # kDLCPU
        m.t.ndim = 1
        m.t.dtype.code, m.t.dtype.bits, m.t.dtype.lanes = code, bits, 1
        m.t.shape = self._shape
        self._m = m
        new = ctypes.pythonapi.PyCapsule_New
        new.restype = ctypes.py_object
        new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        self._new = new

    def __dlpack_device__(self):
        return (1, 0)

    def __dlpack__(self, stream=None):
        import ctypes
        return self._new(ctypes.addressof(self._m), b"dltensor", None)


def _to_bf16(a):
    return (np.asarray(a, np.float32).view(np.uint32) >> 16).astype(np.uint16)


def _from_bf16(u):
    return (u.astype(np.uint32) << 16).view(np.float32)


def test_dlpack_bfloat16(rank, size):
    from tdist import _types
    if "bfloat16" not in _types.BY_NAME:
        pytest.skip("no bfloat16 in this library")
    bits = _to_bf16(np.arange(N) + rank + 1)
    tdist.all_reduce(_DLPackView(bits, 4, 16))  # kDLBfloat
    want = sum(np.arange(N) + r + 1 for r in range(size)).astype(np.float32)
    np.testing.assert_array_equal(_from_bf16(bits), want)
    # and a float32 array through DLPack (kDLFloat, 32 bits)
    f = np.full(3, rank + 1.0, np.float32)
    tdist.all_reduce(_DLPackView(f, 2, 32), op=tdist.ReduceOp.MAX)
    assert (f == size).all()
