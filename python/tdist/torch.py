"""tdist as a torch.distributed backend (torch 1.13's plug-in API).

    import torch.distributed as dist
    import tdist.torch                       # registers the backend "tdist"
    dist.init_process_group("tdist")         # under tdistrun, or torchrun-style env://

CPU tensors go to tdist's CPU backend, CUDA tensors to its NCCL backend: the
tensors' device picks, per op (torch 1.13 has no "cpu:tdist,cuda:tdist" form).
Each torch group is one tdist group per device type, made on first use of that
device type by the group's members only (torch 1.13 calls the backend's
creator on members only), each on a tdist store of its own. See the "torch
backend" section of docs/python.md for what maps where and the limits.
"""
import datetime
import os
import threading

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroup as _TorchPG
from torch._C._distributed_c10d import ReduceOp as _TorchReduceOp
from torch._C._distributed_c10d import Work as _TorchWork

import ctypes

from . import _errors, _group, _lib, _ops, _store
from ._lib import C, InitOpts
from ._types import ReduceOp

__all__ = ["ProcessGroupTdist", "TdistWork", "BACKEND", "create_backend", "DeviceMesh",
           "init_device_mesh",
           "DistError", "DistBackendError", "DistNetworkError", "DistStoreError"]

BACKEND = "tdist"

# ---- errors ------------------------------------------------------------------------------
# torch's exception types where the installed torch has them (1.13 has none), else
# RuntimeError subclasses of our own; every class below is also the tdist class of the
# failure (tdist.RemoteFailure with .rank / .world_rank, tdist.TimeoutError, ...).
DistError = getattr(dist, "DistError", None) or type(
    "DistError", (RuntimeError,), {"__doc__": "torch's DistError (absent in this torch)"})
DistBackendError = getattr(dist, "DistBackendError", None) or type(
    "DistBackendError", (DistError,), {"__doc__": "torch's DistBackendError (absent here)"})
DistNetworkError = getattr(dist, "DistNetworkError", None) or type(
    "DistNetworkError", (DistError,), {"__doc__": "torch's DistNetworkError (absent here)"})
DistStoreError = getattr(dist, "DistStoreError", None) or type(
    "DistStoreError", (DistError,), {"__doc__": "torch's DistStoreError (absent here)"})

_torch_classes = {}


def _torch_base(exc):
    if isinstance(exc, _errors._classes.get("NetworkError", ())):
        return DistNetworkError
    if isinstance(exc, _errors._classes.get("StoreError", ())):
        return DistStoreError
    return DistBackendError


def torch_error(exc):
    """`exc` (a tdist.TdistError) as an exception that is both torch's type (DistBackendError,
    DistNetworkError, DistStoreError, or our stand-ins) and exc's own tdist class, with the
    same message, .code, .name (and .rank / .world_rank for a RemoteFailure)."""
    if not isinstance(exc, _errors.TdistError):
        return exc
    cls = type(exc)
    base = _torch_base(exc)
    if isinstance(exc, base):
        return exc
    key = (cls, base)
    tc = _torch_classes.get(key)
    if tc is None:
        tc = type(cls.__name__, (base, cls), {"__module__": __name__})
        _torch_classes[key] = tc
    e = tc.__new__(tc)
    e.__dict__.update(exc.__dict__)
    e.args = exc.args
    e.__cause__ = exc.__cause__
    return e


# ---- tensors -----------------------------------------------------------------------------
def _check(t, what="tensor"):
    """`t` as tdist gets it: the tensor itself (DLPack / __cuda_array_interface__, zero copy)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"tdist.torch: {what}: expected a torch.Tensor, got {type(t).__name__}")
    # torch.bool goes to tdist's bool through a uint8 view (tdist._buffers: 1.13's DLPack
    # refuses bool): reductions are logical (SUM/MAX/BOR or, PRODUCT/MIN/BAND and).
    if t.is_complex():
        raise ValueError(f"tdist.torch: {what}: complex tensors ({t.dtype}) have no tdist "
                         "dtype: pass torch.view_as_real(t)")
    if t.is_sparse:
        raise ValueError(f"tdist.torch: {what}: sparse tensors are not supported")
    if not t.is_contiguous():
        raise ValueError(f"tdist.torch: {what}: the tensor is not contiguous (use "
                         ".contiguous() and copy back)")
    return t


def _one(tensors, what):
    if len(tensors) != 1:
        raise ValueError(f"tdist.torch: {what}: one tensor per rank (multi-device lists are "
                         f"not supported), got {len(tensors)}")
    return _check(tensors[0], what)


_REDOPS = {}
for _n in ("SUM", "PRODUCT", "MIN", "MAX", "AVG", "BAND", "BOR", "BXOR"):
    if hasattr(_TorchReduceOp, _n):
        _REDOPS[_n] = getattr(ReduceOp, _n)


def _redop(op):
    for n, v in _REDOPS.items():
        if op == getattr(_TorchReduceOp, n):
            return v
    if hasattr(_TorchReduceOp, "PREMUL_SUM") and op == _TorchReduceOp.PREMUL_SUM:
        raise NotImplementedError(
            "tdist.torch: ReduceOp.PREMUL_SUM: torch 1.13 does not expose its factor to "
            "Python backends; scale the tensor (t.mul_(factor)) and use SUM, or call "
            "tdist.all_reduce(t, op=tdist.premul_sum(factor)) directly")
    raise NotImplementedError(f"tdist.torch: reduction {op} is not supported")


# ---- Work --------------------------------------------------------------------------------
# A Work made in Python and handed to C++ (DDP's Reducer, dist._verify_params_across_processes,
# dist._broadcast_coalesced call the group's methods from C++ and keep only the C++ object)
# loses its Python half when Python's last reference goes: torch 1.13's pybind trampoline
# then finds no Python wait/get_future and runs c10d::Work's own, which waits, GIL held,
# for a completion flag that only C++ backends set: the job hangs. So each TdistWork is
# pinned here from birth until its op has completed and no C++ reference is left
# (c10::intrusive_ptr's count, read through the pybind instance once the object is known
# to be torch's PyWork, else: until its wait or get_future has been called).
_pinned = []
_pin_lock = threading.Lock()


def _cpp_refs_reader():
    """A function giving a TdistWork's C++ reference count (the pybind instance's holder is
    one), or None when this torch's layout cannot be confirmed (then pins go at wait)."""
    try:
        with open("/proc/self/maps") as maps:
            path = next(ln.split()[-1] for ln in maps
                        if "libtorch_python" in ln and ln.split()[-1].startswith("/"))
        lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_NOW)
        # the vtable pointer of a c10d::PyProcessGroup::PyWork (Itanium ABI: symbol + 16)
        vptr = ctypes.addressof(ctypes.c_char.in_dll(
            lib, "_ZTVN4c10d14PyProcessGroup6PyWorkE")) + 2 * ctypes.sizeof(ctypes.c_void_p)
    except (OSError, ValueError, StopIteration):
        return None
    head = 2 * ctypes.sizeof(ctypes.c_void_p)  # PyObject_HEAD; the C++ pointer follows

    def refs(obj):
        cpp = ctypes.c_void_p.from_address(id(obj) + head).value
        if not cpp or ctypes.c_void_p.from_address(cpp).value != vptr:
            return None
        # c10::intrusive_ptr_target: the vtable pointer, then refcount_
        return ctypes.c_size_t.from_address(cpp + ctypes.sizeof(ctypes.c_void_p)).value

    class _Probe(_TorchWork):
        pass
    return refs if refs(_Probe()) == 1 else None  # a fresh one: its pybind holder only


class TdistWork(_TorchWork):
    """torch's Work over a tdist Work (or a list of them, completed in order). Its future
    (get_future) is completed from tdist's completion callback with the op's output
    tensors, so DDP's reducer overlaps its bucket all-reduces with backward. Kept alive
    while C++ holds it (see _pinned)."""

    def __init__(self, works, outputs, recv=False):
        super().__init__()
        self._works = list(works)
        self._outputs = list(outputs)
        self._recv = recv
        self._future = None
        self._used = False  # wait or get_future called (the pin's end without _cpp_refs)
        _pin(self)

    def _releasable(self):
        if not self.is_completed():
            return False
        if _cpp_refs is None:
            return self._used
        n = _cpp_refs(self)
        return n is not None and n <= 1

    def is_completed(self):
        return all(w.is_completed() for w in self._works)

    def is_success(self):
        return self.is_completed() and all(w.exception() is None for w in self._works)

    def exception(self):
        for w in self._works:
            if w.is_completed() and w.exception() is not None:
                return torch_error(w.exception())
        return None

    def wait(self, timeout=datetime.timedelta(0)):
        """Block until the op completes; raise its error as torch's type (naming the failed
        rank for a peer's failure). timeout: a timedelta (0: the op's own deadline)."""
        self._used = True
        secs = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else timeout
        try:
            for w in self._works:
                w.wait(None if not secs or secs < 0 else secs)
        except _errors.TdistError as e:
            raise torch_error(e) from None
        return True

    def synchronize(self):
        self.wait()

    def result(self):
        return list(self._outputs)

    def source_rank(self):
        if not self._recv:
            raise RuntimeError("source_rank: only for recv work")
        return self._works[0].source_rank()

    _source_rank = source_rank

    def get_future(self):
        """A torch.futures.Future completed (on tdist's callback thread) with the list of
        output tensors. On the op's failure it completes with an error that C++ sees too
        (DDP's reducer raises it from backward): a RuntimeError whose text is the torch
        error's class and message (Work.wait() raises the typed error itself)."""
        self._used = True
        if self._future is not None:
            return self._future
        raw = torch.futures.Future()
        fut = raw.then(_unwrap)
        self._future = fut
        left = [len(self._works)]
        lock = threading.Lock()
        outputs = self._outputs
        works = self._works

        def done(w):
            with lock:
                left[0] -= 1
                last = left[0] == 0
            if not last:
                return
            exc = next((x.exception() for x in works if x.exception() is not None), None)
            raw.set_result(_Failed(torch_error(exc)) if exc is not None else outputs)
        if not works:
            raw.set_result(outputs)
        for w in works:
            w.add_done_callback(done)
        return fut


class _Failed:
    """A failed op's error, carried through the raw future to _unwrap."""

    def __init__(self, exc):
        self.exc = exc


def _unwrap(f):
    v = f.value()
    if isinstance(v, _Failed):
        raise v.exc
    return v


_sweep_at = [16]


def _pin(work):
    """Pin `work`; every so often release the pinned works nothing else needs (a sweep
    when the pins double since the last one left: O(1) per work, amortized)."""
    with _pin_lock:
        if len(_pinned) >= _sweep_at[0]:
            _pinned[:] = [w for w in _pinned if not w._releasable()]
            _sweep_at[0] = max(16, 2 * len(_pinned))
        _pinned.append(work)


_cpp_refs = _cpp_refs_reader()


class _DoneWork(TdistWork):
    def __init__(self, outputs):
        super().__init__([], outputs)


# ---- groups ------------------------------------------------------------------------------
_lock = threading.RLock()


def _master_addr():
    return os.environ.get("MASTER_ADDR") or "127.0.0.1"


def _init_group(store, rank, size, name, backend, timeout_ms):
    """One tdist world over `store` (a tdist Store): tdist_init_process_group with
    opts.store, rank, world_size, name."""
    o = InitOpts()
    o.mask |= (_lib.INIT_FIELD_STORE | _lib.INIT_FIELD_RANK | _lib.INIT_FIELD_WORLD_SIZE
               | _lib.INIT_FIELD_NAME | _lib.INIT_FIELD_BACKEND | _lib.INIT_FIELD_TIMEOUT)
    o.store = store._handle()
    o.rank, o.world_size = rank, size
    nb, bb = name.encode(), backend.encode()
    o.name, o.backend = nb, bb
    o.timeout_ms = timeout_ms
    out = ctypes.c_void_p()
    _errors.check(C.init_process_group(ctypes.byref(o), ctypes.byref(out)))
    return _group._adopt(out.value)


class ProcessGroupTdist(_TorchPG):
    """torch.distributed's ProcessGroup over tdist groups: one for CPU tensors (tdist's CPU
    backend) and one for CUDA tensors (NCCL), each made on the first op of its device type
    (collective over this group's members, as every op is)."""

    def __init__(self, store, rank, size, timeout, group_id="", global_ranks=None):
        super().__init__(rank, size)
        self._store = store           # torch's PrefixStore for this group
        self._rank, self._size = rank, size
        self._timeout = timeout
        self._timeout_ms = max(1, int(timeout.total_seconds() * 1000)) if timeout else 0
        self._group_id = str(group_id)
        self._global_ranks = list(global_ranks) if global_ranks else list(range(size))
        self._tg = {}                 # "cpu"/"nccl" -> tdist ProcessGroup
        self._servers = []            # tdist stores this rank serves for its groups

    # -- the tdist group of a device type --
    def tdist_group(self, device_type="cpu"):
        """The tdist.ProcessGroup this group uses for tensors of `device_type` ("cpu" or
        "cuda"), made on first use (collective over the members)."""
        kind = "nccl" if device_type == "cuda" else "cpu"
        with _lock:
            g = self._tg.get(kind)
            if g is None:
                g = self._tg[kind] = self._make(kind)
            return g

    def _make(self, kind):
        timeout_ms = self._timeout_ms or 600000
        world = os.environ.get("WORLD_SIZE")
        under_tdistrun = bool(os.environ.get("TDIST_STORE_URL"))
        first_world = (under_tdistrun and kind == "cpu" and not _group.is_initialized()
                       and world is not None and int(world) == self._size
                       and self._global_ranks == list(range(self._size)))
        if first_world:
            # The world under tdistrun: tdist's env:// on the launcher's store.
            g = _group.init_process_group(backend="cpu", timeout=timeout_ms / 1000.0,
                                          group_name=f"torch:{self._group_id}")
            return g
        # Its own tdist store, served by group rank 0, found through torch's store.
        key = f"tdist/{kind}/store"
        if self._rank == 0:
            srv = _store.TCPStore("0.0.0.0", 0, is_master=True,
                                  timeout=timeout_ms / 1000.0)
            self._servers.append(srv)
            self._store.set(key, f"{_master_addr()}:{srv.port}")
            st = srv
        else:
            addr = self._store.get(key).decode()
            host, port = addr.rsplit(":", 1)
            st = _store.TCPStore(host, int(port), timeout=timeout_ms / 1000.0)
        # A further world on our store: its monitor beats to this store, not to tdistrun's
        # host agent (which knows the launcher's world only), and LOCAL_WORLD_SIZE /
        # LOCAL_RANK (the launcher's) are not checked against it (tdist_init_process_group).
        g = _init_group(st, self._rank, self._size, f"torch:{self._group_id}:{kind}",
                        kind, timeout_ms)
        g._torch_store = st  # the group's store lives as long as the group
        return g

    def _g(self, tensors):
        dev = "cpu"
        for t in tensors:
            if isinstance(t, torch.Tensor):
                dev = t.device.type
                break
        if dev not in ("cpu", "cuda"):
            raise ValueError(f"tdist.torch: tensors on {dev} are not supported (cpu, cuda)")
        return self.tdist_group(dev)

    def _run(self, fn, outputs, recv=False):
        try:
            w = fn()
        except _errors.TdistError as e:
            raise torch_error(e) from None
        return TdistWork([w] if w is not None else [], outputs, recv)

    # -- names --
    def getBackendName(self):
        return BACKEND

    def name(self):
        return BACKEND

    def _get_backend_name(self):
        return BACKEND

    def __repr__(self):
        return f"<tdist.torch.ProcessGroupTdist {self._group_id!r} rank {self._rank}/{self._size}>"

    # -- collectives --
    def allreduce(self, tensors, opts=None):
        t = _one(tensors, "allreduce")
        op = _redop(opts.reduceOp) if opts is not None else ReduceOp.SUM
        g = self._g([t])
        return self._run(lambda: _ops.all_reduce(t, op, group=g, async_op=True), [t])

    def allreduce_coalesced(self, tensors, opts=None):
        op = _redop(opts.reduceOp) if opts is not None else ReduceOp.SUM
        ts = [_check(t, "allreduce_coalesced") for t in tensors]
        g = self._g(ts)
        try:
            works = [_ops.all_reduce(t, op, group=g, async_op=True) for t in ts]
        except _errors.TdistError as e:
            raise torch_error(e) from None
        return TdistWork(works, ts)

    def broadcast(self, tensors, opts=None):
        t = _one(tensors, "broadcast")
        root = opts.rootRank if opts is not None else 0
        g = self._g([t])
        return self._run(lambda: _ops.broadcast(t, group=g, async_op=True, group_src=root), [t])

    def reduce(self, tensors, opts=None):
        t = _one(tensors, "reduce")
        op = _redop(opts.reduceOp) if opts is not None else ReduceOp.SUM
        root = opts.rootRank if opts is not None else 0
        g = self._g([t])
        return self._run(lambda: _ops.reduce(t, op=op, group=g, async_op=True, group_dst=root),
                         [t])

    def allgather(self, output_lists, input_tensors, opts=None):
        t = _one(input_tensors, "allgather")
        if len(output_lists) != 1:
            raise ValueError("tdist.torch: allgather: one output list per rank")
        outs = [_check(o, "allgather output") for o in output_lists[0]]
        g = self._g([t])
        return self._run(lambda: _ops.all_gather(outs, t, group=g, async_op=True),
                         [outs])

    def _allgather_base(self, output, input, opts=None):
        _check(output, "_allgather_base output")
        _check(input, "_allgather_base input")
        g = self._g([input])
        return self._run(lambda: _ops.all_gather_into_tensor(output, input, group=g,
                                                             async_op=True), [output])

    def allgather_coalesced(self, output_lists, input_tensors, opts=None):
        works = []
        g = self._g(input_tensors)
        try:
            for outs, t in zip(output_lists, input_tensors):
                works.append(_ops.all_gather([_check(o) for o in outs], _check(t), group=g,
                                             async_op=True))
        except _errors.TdistError as e:
            raise torch_error(e) from None
        return TdistWork(works, output_lists)

    def gather(self, output_lists, input_tensors, opts=None):
        t = _one(input_tensors, "gather")
        root = opts.rootRank if opts is not None else 0
        outs = None
        if self._rank == root:
            if len(output_lists) != 1:
                raise ValueError("tdist.torch: gather: one output list on the root")
            outs = [_check(o, "gather output") for o in output_lists[0]]
        g = self._g([t])
        return self._run(lambda: _ops.gather(t, outs, group=g, async_op=True, group_dst=root),
                         [outs] if outs is not None else [])

    def scatter(self, output_tensors, input_lists, opts=None):
        t = _one(output_tensors, "scatter")
        root = opts.rootRank if opts is not None else 0
        ins = None
        if self._rank == root:
            if len(input_lists) != 1:
                raise ValueError("tdist.torch: scatter: one input list on the root")
            ins = [_check(i, "scatter input") for i in input_lists[0]]
        g = self._g([t])
        return self._run(lambda: _ops.scatter(t, ins, group=g, async_op=True, group_src=root),
                         [t])

    def reduce_scatter(self, output_tensors, input_lists, opts=None):
        t = _one(output_tensors, "reduce_scatter")
        op = _redop(opts.reduceOp) if opts is not None else ReduceOp.SUM
        if len(input_lists) != 1:
            raise ValueError("tdist.torch: reduce_scatter: one input list per rank")
        ins = [_check(i, "reduce_scatter input") for i in input_lists[0]]
        g = self._g([t])
        return self._run(lambda: _ops.reduce_scatter(t, ins, op=op, group=g, async_op=True),
                         [t])

    def _reduce_scatter_base(self, output, input, opts=None):
        op = _redop(opts.reduceOp) if opts is not None else ReduceOp.SUM
        _check(output, "_reduce_scatter_base output")
        _check(input, "_reduce_scatter_base input")
        g = self._g([input])
        return self._run(lambda: _ops.reduce_scatter_tensor(output, input, op=op, group=g,
                                                            async_op=True), [output])

    def alltoall(self, output_tensors, input_tensors, opts=None):
        outs = [_check(o, "alltoall output") for o in output_tensors]
        ins = [_check(i, "alltoall input") for i in input_tensors]
        g = self._g(ins)
        return self._run(lambda: _ops.all_to_all(outs, ins, group=g, async_op=True), outs)

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        _check(output, "alltoall_base output")
        _check(input, "alltoall_base input")
        g = self._g([input])
        osz = list(output_split_sizes) or None
        isz = list(input_split_sizes) or None
        return self._run(lambda: _ops.all_to_all_single(output, input, osz, isz, group=g,
                                                        async_op=True), [output])

    def barrier(self, opts=None):
        g = self.tdist_group("cpu")
        return self._run(lambda: _ops.barrier(group=g, async_op=True), [])

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        """A barrier bounded by `timeout` (a timedelta): a rank that does not arrive makes
        every rank's call raise (the barrier times out, or the peer's failure is named).
        wait_all_ranks is accepted; tdist names the failed rank when it knows it."""
        g = self.tdist_group("cpu")
        kw = {}
        if timeout is not None:
            kw["timeout"] = timeout
        try:
            _ops.barrier(group=g, **kw)
        except _errors.TdistError as e:
            raise torch_error(e) from None

    # -- point to point (peers are group ranks, as torch passes them) --
    def send(self, tensors, dst, tag=0):
        t = _one(tensors, "send")
        g = self._g([t])
        return self._run(lambda: _ops.isend(t, group=g, tag=tag, group_dst=dst), [t])

    def recv(self, tensors, src, tag=0):
        t = _one(tensors, "recv")
        g = self._g([t])
        return self._run(lambda: _ops.irecv(t, group=g, tag=tag, group_src=src), [t],
                         recv=True)

    def recv_anysource(self, tensors, tag=0):
        t = _one(tensors, "recv_anysource")
        g = self._g([t])
        w = self._run(lambda: _ops.irecv(t, group=g, tag=tag), [t], recv=True)
        w._group = g
        return _AnySourceWork(w, g)


class _AnySourceWork(TdistWork):
    """recv_anysource's work: source_rank() is the sender's rank in the torch group."""

    def __init__(self, w, g):
        super().__init__(w._works, w._outputs, recv=True)
        self._tdist_group = g

    def source_rank(self):
        src = self._works[0].source_rank()  # a world rank of tdist's world for the group
        return self._tdist_group.group_rank(src) if src >= 0 else src

    _source_rank = source_rank


def create_backend(opts, pg_options=None):
    """The creator torch calls (extended API): a ProcessGroupTdist for this group's members.
    opts: torch's _DistributedBackendOptions (store, group_rank, group_size, timeout,
    group_id, global_ranks_in_group)."""
    if pg_options is not None:
        raise NotImplementedError("tdist.torch: pg_options are not supported")
    return ProcessGroupTdist(opts.store, opts.group_rank, opts.group_size, opts.timeout,
                             opts.group_id, list(opts.global_ranks_in_group))


class DeviceMesh(_group.DeviceMesh):
    """tdist's DeviceMesh (get_group, get_local_rank, size, ndim, mesh["tp"]) whose groups
    are torch process groups of the "tdist" backend (torch 1.13 has no DeviceMesh of its
    own); ``mesh`` is the list of global ranks, row-major."""

    def __init__(self, shape, mesh, groups, coords, names):
        super().__init__(shape, groups, coords, names)
        self.mesh = list(mesh)

    def __repr__(self):
        return f"<tdist.torch.DeviceMesh shape {self.shape} coords {self.coords}>"


def init_device_mesh(device_type, mesh_shape, *, mesh_dim_names=None, timeout=None):
    """torch 2.2's ``init_device_mesh`` for torch 1.13 over the default group, which must be
    the "tdist" backend's (``dist.init_process_group("tdist")`` first): a mesh of shape
    ``mesh_shape`` over global ranks, the last dimension varying fastest (row-major, as
    torch). Every rank makes every group of every dimension with ``dist.new_group``, in the
    same order (torch's rule for new_group), and keeps its own. Collective over the world.

    device_type: "cpu" or "cuda" (the groups serve both; kept for torch's signature).
    Returns a DeviceMesh. Raises ValueError if the shape's product is not the world size
    or the names do not name every dimension."""
    if device_type not in ("cpu", "cuda"):
        raise ValueError(f"init_device_mesh: device_type {device_type!r}: 'cpu' or 'cuda'")
    shape = [int(d) for d in mesh_shape]
    n, r = dist.get_world_size(), dist.get_rank()
    total = 1
    for d in shape:
        if d < 1:
            raise ValueError(f"init_device_mesh: dimension {d} of {tuple(shape)} is below 1")
        total *= d
    if total != n:
        raise ValueError(f"init_device_mesh: {tuple(shape)} has {total} ranks, the world {n}")
    if mesh_dim_names is not None and len(mesh_dim_names) != len(shape):
        raise ValueError("init_device_mesh: mesh_dim_names must name every dimension")
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    coords = [(r // strides[i]) % shape[i] for i in range(len(shape))]
    kw = {} if timeout is None else {"timeout": timeout if isinstance(timeout, datetime.timedelta)
                                     else datetime.timedelta(seconds=timeout)}
    groups = []
    for d in range(len(shape)):
        mine = None
        # every line of dimension d: the ranks sharing all other coordinates, in order
        for base in range(n):
            if (base // strides[d]) % shape[d] != 0:
                continue
            ranks = [base + k * strides[d] for k in range(shape[d])]
            g = dist.new_group(ranks, backend=BACKEND, **kw)
            if r in ranks:
                mine = g
        groups.append(mine)
    return DeviceMesh(shape, range(n), groups, coords, mesh_dim_names)


if "TDIST" not in dist.Backend._plugins:
    dist.Backend.register_backend(BACKEND, create_backend, extended_api=True)
