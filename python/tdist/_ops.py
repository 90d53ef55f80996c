"""Collectives and point-to-point ops, with torch.distributed's signatures.

Every op checks its arrays (contiguous, writable where written, same dtype,
sizes that fit the group, host memory on CPU groups and device memory on NCCL
groups) and raises ValueError before anything is sent. ``async_op=True``
returns a Work; otherwise the call blocks (without the GIL) and returns None.
src/dst are world ranks as in torch; group_src/group_dst give group ranks.

List arguments (all_gather's tensor_list, gather_list, scatter_list,
input_list, all_to_all's lists) may also be one array of size * count
elements. A list of arrays that are consecutive views of one buffer is used
in place; other lists of host arrays go through a staging buffer (copied in
before the op, out when it completes); device arrays must be consecutive.

Binding a new C op: one line in _lib._FUNCS, then a function here built on
``_submit``.
"""
import ctypes
import threading

from . import _buffers, _errors, _group, _types
from ._lib import C, OpOpts, P2POp as _P2POpStruct
from . import _lib
from ._types import ReduceOp
from ._work import Work, timeout_ms
from ._work import _MAIN

_buf = _buffers.buf
_byref = ctypes.byref
_c_void_p = ctypes.c_void_p
_resolve = _group.resolve


def stream_ptr(stream):
    """A cudaStream_t from an int, a PyTorch/CuPy stream, or __cuda_stream__."""
    if stream is None:
        return None
    if isinstance(stream, int):
        return stream
    f = getattr(stream, "__cuda_stream__", None)
    if f is not None:
        return f()[1]
    for attr in ("cuda_stream", "ptr", "handle"):
        v = getattr(stream, attr, None)
        if isinstance(v, int):
            return v
    raise ValueError(f"not a CUDA stream: {stream!r}")


def _opts(scalar=None, stream=None, tag=None, timeout=None):
    o = OpOpts()
    if scalar is not None:
        o.mask |= _lib.OP_FIELD_SCALAR
        o.premul_scalar = scalar
    if stream is not None:
        o.mask |= _lib.OP_FIELD_STREAM
        o.stream = stream_ptr(stream)
    if tag:
        if tag < 0:
            raise ValueError(f"tag must be >= 0, not {tag}")
        o.mask |= _lib.OP_FIELD_TAG
        o.tag = tag
    if timeout is not None:
        o.mask |= _lib.OP_FIELD_TIMEOUT
        o.timeout_ms = timeout_ms(timeout)
    return _byref(o) if o.mask else None


def _submit(fn, args, keep, async_op, finish=None, result=None):
    """Call C op `fn(*args, work)`: async -> Work, else blocking (GIL released) -> None.
    `result`: the op's output, the value of the Work's future (torch's Work.result()).
    A blocking op on the main thread is submitted async and waited for by Work.wait,
    so that Ctrl-C interrupts it (KeyboardInterrupt; the op goes on, its arrays kept
    alive until it ends); elsewhere the C call blocks (no signal is handled there)."""
    if async_op or threading.get_ident() == _MAIN:
        w = _c_void_p()
        rc = fn(*args, _byref(w))
        if rc:
            raise _errors.error(rc, C.last_error().decode("utf-8", "replace"))
        work = Work(w.value, keep, finish, result)
        if async_op:
            return work
        work.wait()
        return None
    rc = fn(*args, None)
    if rc:
        raise _errors.error(rc, C.last_error().decode("utf-8", "replace"))
    if finish is not None:
        finish()
    return None


def _where(g, b, what):
    if b.device != g.device:
        kind = "device (CUDA)" if b.device else "host"
        raise ValueError(f"{what} is {kind} memory, but group '{g.name}' runs on backend "
                         f"'{g.backend}', which takes {'device' if g.device else 'host'} memory")


def _one(g, obj, writable, what):
    b = _buf(obj, writable, what)
    if b.device != g.device:
        _where(g, b, what)
    return b


def _same(a, b, what):
    if a.dtype != b.dtype:
        raise ValueError(f"{what}: dtypes differ ({_types.NAME_OF[a.dtype]} and "
                         f"{_types.NAME_OF[b.dtype]})")


def _peer(g, global_rank, group_rank, what):
    if group_rank is not None:
        if global_rank is not None:
            raise ValueError(f"{what}: give either {what} or group_{what}, not both")
        r = int(group_rank)
    elif global_rank is None:
        raise ValueError(f"{what}: a rank is required")
    else:
        r = g.group_rank(int(global_rank))
    if not 0 <= r < g._size:
        raise ValueError(f"{what}: group rank {r} out of range for group '{g.name}' of size "
                         f"{g._size}")
    return r


class _Blocks:
    """`size` blocks of `count` elements: one array, consecutive views, or staged copies."""

    def __init__(self, g, objs, count, dtype, writable, what):
        self.n = g._size
        self.staged = None
        if not isinstance(objs, (list, tuple)):
            b = _one(g, objs, writable, what)
            if count is not None and b.count != self.n * count:
                raise ValueError(f"{what}: {b.count} elements, expected {self.n} x {count}")
            self.buf, self.keep = b, b.keep
            self.count = b.count // self.n if count is None else count
        else:
            if len(objs) != self.n:
                raise ValueError(f"{what}: {len(objs)} arrays for a group of {self.n}")
            bs = [_one(g, o, writable, f"{what}[{i}]") for i, o in enumerate(objs)]
            c = bs[0].count if count is None else count
            for i, b in enumerate(bs):
                if b.count != c:
                    raise ValueError(f"{what}[{i}]: {b.count} elements, expected {c}")
                if b.dtype != bs[0].dtype:
                    _same(bs[0], b, what)
            self.count = c
            step = bs[0].nbytes
            base = bs[0].ptr or 0
            if all((b.ptr or 0) == base + i * step for i, b in enumerate(bs)):
                self.keep = [b.keep for b in bs]
                self.buf = _buffers.Buf(bs[0].ptr, c * self.n, bs[0].dtype, bs[0].device, None)
            elif bs[0].device:
                raise ValueError(f"{what}: device arrays must be consecutive views of one "
                                 "buffer (or pass one array of size * count elements)")
            else:
                stage = (ctypes.c_char * max(1, step * self.n))()
                sp = ctypes.addressof(stage)
                self.buf = _buffers.Buf(sp, c * self.n, bs[0].dtype, False, None)
                self.staged = [(b.ptr, sp + i * step, step) for i, b in enumerate(bs)]
                self.keep = ([b.keep for b in bs], stage)
        if dtype is not None and self.buf.dtype != dtype:
            raise ValueError(f"{what}: dtype {_types.NAME_OF[self.buf.dtype]}, expected "
                             f"{_types.NAME_OF[dtype]}")

    def copy_in(self):
        for user, st, n in self.staged or ():
            if n:
                ctypes.memmove(st, user, n)

    def copy_out(self):
        for user, st, n in self.staged or ():
            if n:
                ctypes.memmove(user, st, n)


# ---- collectives -------------------------------------------------------------------------
_SIMPLE_OPS = {op: int(op) for op in ReduceOp if op.name != "PREMUL_SUM"}
_c_all_reduce = C.all_reduce


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False, *, stream=None):
    """In place: tensor = op over ranks of tensor, on every rank."""
    g = _group._world if group is None else _resolve(group)
    if g is None:
        if group is None:
            _group.world()  # raises: not initialized
        return None
    b = _one(g, tensor, True, "all_reduce: tensor")
    o = _SIMPLE_OPS.get(op) if stream is None else None
    if o is not None:
        opts = None
    else:
        o, scalar = _types.redop(op)
        opts = _opts(scalar, stream)
    if async_op:  # the common case, inlined
        w = _c_void_p()
        rc = _c_all_reduce(g._ptr or g._handle(), b.ptr, b.ptr, b.count, b.dtype, o, opts,
                           _byref(w))
        if rc:
            raise _errors.error(rc, C.last_error().decode("utf-8", "replace"))
        return Work(w.value, b.keep, None, tensor)
    return _submit(_c_all_reduce, (g._handle(), b.ptr, b.ptr, b.count, b.dtype, o, opts),
                   b.keep, False)


def broadcast(tensor, src=None, group=None, async_op=False, *, group_src=None, stream=None):
    """tensor on every rank receives src's tensor (src: world rank)."""
    g = _resolve(group)
    if g is None:
        return None
    root = _peer(g, src, group_src, "src")
    b = _one(g, tensor, g._rank != root, "broadcast: tensor")
    return _submit(C.broadcast, (g._handle(), b.ptr, b.count, b.dtype, root, _opts(stream=stream)),
                   b.keep, async_op, None, tensor)


def reduce(tensor, dst=None, op=ReduceOp.SUM, group=None, async_op=False, *, group_dst=None,
           stream=None):
    """dst's tensor = op over ranks of tensor (in place on dst; other ranks' unchanged)."""
    g = _resolve(group)
    if g is None:
        return None
    root = _peer(g, dst, group_dst, "dst")
    b = _one(g, tensor, g._rank == root, "reduce: tensor")
    o, scalar = _types.redop(op)
    return _submit(C.reduce, (g._handle(), b.ptr, b.ptr, b.count, b.dtype, o, root,
                              _opts(scalar, stream)), b.keep, async_op, None, tensor)


def all_gather(tensor_list, tensor, group=None, async_op=False, *, stream=None):
    """tensor_list[i] = rank i's tensor, on every rank."""
    g = _resolve(group)
    if g is None:
        return None
    b = _one(g, tensor, False, "all_gather: tensor")
    out = _Blocks(g, tensor_list, b.count, b.dtype, True, "all_gather: tensor_list")
    return _submit(C.all_gather, (g._handle(), b.ptr, out.buf.ptr, b.count, b.dtype,
                                  _opts(stream=stream)), (b.keep, out.keep), async_op,
                   out.copy_out if out.staged else None, [tensor_list])


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False, *,
                           stream=None):
    """output_tensor (size x count elements) = every rank's input_tensor in rank order."""
    return all_gather(output_tensor, input_tensor, group, async_op, stream=stream)


def gather(tensor, gather_list=None, dst=None, group=None, async_op=False, *, group_dst=None,
           stream=None):
    """dst's gather_list[i] = rank i's tensor (gather_list only on dst)."""
    g = _resolve(group)
    if g is None:
        return None
    root = _peer(g, dst, group_dst, "dst")
    b = _one(g, tensor, False, "gather: tensor")
    out = None
    if g._rank == root:
        if gather_list is None:
            raise ValueError("gather: gather_list is required on dst")
        out = _Blocks(g, gather_list, b.count, b.dtype, True, "gather: gather_list")
    elif gather_list:
        raise ValueError("gather: gather_list must be None/empty on ranks other than dst")
    return _submit(C.gather, (g._handle(), b.ptr, out.buf.ptr if out else None, b.count, b.dtype,
                              root, _opts(stream=stream)),
                   (b.keep, out.keep if out else None), async_op,
                   out.copy_out if out is not None and out.staged else None,
                   [gather_list] if gather_list is not None else [])


def scatter(tensor, scatter_list=None, src=None, group=None, async_op=False, *, group_src=None,
            stream=None):
    """Rank i's tensor = src's scatter_list[i] (scatter_list only on src)."""
    g = _resolve(group)
    if g is None:
        return None
    root = _peer(g, src, group_src, "src")
    b = _one(g, tensor, True, "scatter: tensor")
    inp = None
    if g._rank == root:
        if scatter_list is None:
            raise ValueError("scatter: scatter_list is required on src")
        inp = _Blocks(g, scatter_list, b.count, b.dtype, False, "scatter: scatter_list")
        inp.copy_in()
    elif scatter_list:
        raise ValueError("scatter: scatter_list must be None/empty on ranks other than src")
    return _submit(C.scatter, (g._handle(), inp.buf.ptr if inp else None, b.ptr, b.count, b.dtype,
                               root, _opts(stream=stream)),
                   (b.keep, inp.keep if inp else None), async_op, None, tensor)


def reduce_scatter(output, input_list, op=ReduceOp.SUM, group=None, async_op=False, *,
                   stream=None):
    """Rank i's output = op over ranks of their input_list[i]."""
    g = _resolve(group)
    if g is None:
        return None
    b = _one(g, output, True, "reduce_scatter: output")
    inp = _Blocks(g, input_list, b.count, b.dtype, False, "reduce_scatter: input_list")
    inp.copy_in()
    o, scalar = _types.redop(op)
    return _submit(C.reduce_scatter, (g._handle(), inp.buf.ptr, b.ptr, b.count, b.dtype, o,
                                      _opts(scalar, stream)), (b.keep, inp.keep), async_op,
                   None, output)


def reduce_scatter_tensor(output, input, op=ReduceOp.SUM, group=None, async_op=False, *,
                          stream=None):
    """output (count elements) = op over ranks of block `rank` of input (size x count)."""
    return reduce_scatter(output, input, op, group, async_op, stream=stream)


def all_to_all(output_tensor_list, input_tensor_list, group=None, async_op=False, *,
               stream=None):
    """Rank j's output_tensor_list[i] = rank i's input_tensor_list[j]."""
    g = _resolve(group)
    if g is None:
        return None
    inp = _Blocks(g, input_tensor_list, None, None, False, "all_to_all: input")
    out = _Blocks(g, output_tensor_list, inp.count, inp.buf.dtype, True, "all_to_all: output")
    inp.copy_in()
    return _submit(C.all_to_all, (g._handle(), inp.buf.ptr, out.buf.ptr, inp.count,
                                  inp.buf.dtype, _opts(stream=stream)), (inp.keep, out.keep),
                   async_op, out.copy_out if out.staged else None, [output_tensor_list])


def _rows(obj, count, what):
    """(rows along dim 0, elements per row) of an array; 1-D for objects without a shape."""
    shape = getattr(obj, "shape", None)
    if not shape:
        return count, 1
    rows = int(shape[0])
    if rows == 0:
        return 0, 0
    return rows, count // rows


def _splits(sizes, rows, n, what):
    if sizes is None:
        if rows % n:
            raise ValueError(f"all_to_all_single: {what} has {rows} rows, not a multiple of the "
                             f"group size {n} (give {what}_split_sizes)")
        return [rows // n] * n
    sizes = [int(x) for x in sizes]
    if len(sizes) != n or any(x < 0 for x in sizes):
        raise ValueError(f"all_to_all_single: {what}_split_sizes must be {n} sizes >= 0, not "
                         f"{sizes}")
    if sum(sizes) != rows:
        raise ValueError(f"all_to_all_single: {what}_split_sizes sum to {sum(sizes)}, but "
                         f"{what} has {rows} rows")
    return sizes


def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None,
                      group=None, async_op=False, *, stream=None):
    """Rank j's output block i = rank i's input block j. Blocks are along dimension 0 (rows,
    as torch): equal without split sizes; with them, block j of the input has
    input_split_sizes[j] rows and block i of the output output_split_sizes[i] rows
    (tdist_all_to_all_v). What rank i sends rank j must be what j expects from i
    (tdist.MismatchError on every rank otherwise)."""
    g = _resolve(group)
    if g is None:
        return None
    if output_split_sizes is None and input_split_sizes is None:
        return _submit_all_to_all(g, output, input, async_op, stream)
    n = g._size
    bi = _one(g, input, False, "all_to_all_single: input")
    bo = _one(g, output, True, "all_to_all_single: output")
    _same(bi, bo, "all_to_all_single")
    rows_i, row_i = _rows(input, bi.count, "input")
    rows_o, row_o = _rows(output, bo.count, "output")
    si = _splits(input_split_sizes, rows_i, n, "input")
    so = _splits(output_split_sizes, rows_o, n, "output")
    if rows_i and rows_o and row_i != row_o:
        raise ValueError(f"all_to_all_single: input rows have {row_i} elements, output rows "
                         f"{row_o}")
    row = row_i or row_o
    if bi.ptr is not None and bi.ptr == bo.ptr:
        raise ValueError("all_to_all_single: input and output must not be the same memory")
    send_counts = (ctypes.c_size_t * n)(*[x * row for x in si])
    recv_counts = (ctypes.c_size_t * n)(*[x * row for x in so])
    # the count arrays belong to tdist until the op completes: kept with the buffers
    return _submit(C.all_to_all_v, (g._handle(), bi.ptr, send_counts, None, bo.ptr, recv_counts,
                                    None, bi.dtype, _opts(stream=stream)),
                   (bi.keep, bo.keep, send_counts, recv_counts), async_op, None, output)


def _submit_all_to_all(g, output, input, async_op, stream):
    inp = _Blocks(g, input, None, None, False, "all_to_all_single: input")
    out = _Blocks(g, output, inp.count, inp.buf.dtype, True, "all_to_all_single: output")
    inp.copy_in()
    return _submit(C.all_to_all, (g._handle(), inp.buf.ptr, out.buf.ptr, inp.count,
                                  inp.buf.dtype, _opts(stream=stream)), (inp.keep, out.keep),
                   async_op, out.copy_out if out.staged else None, output)


def barrier(group=None, async_op=False, device_ids=None, *, timeout=None):
    """Completes once every rank of the group entered it.

    timeout (seconds or a timedelta; None: the group's timeout): the barrier op's own
    deadline, as for any op, not a timeout of this wait alone: when it expires the op
    fails with tdist.TimeoutError AND THE GROUP IS ABORTED, on every rank (tdist's
    watchdog aborts a group whose op is past its deadline: the ranks cannot tell a late
    peer from a lost one, and the group's op sequence must stay the same on all ranks).
    Every later op on the group raises the abort (tdist.AbortedError); make a new group
    to go on. To give up waiting while the barrier goes on, use
    ``barrier(async_op=True).wait(timeout)`` (tdist.InProgressError; wait again).
    Returns None, or a Work with async_op=True. Thread: any."""
    g = _resolve(group)
    if g is None:
        return None
    return _submit(C.barrier, (g._handle(), _opts(timeout=timeout)), None, async_op)


# ---- point to point -----------------------------------------------------------------------
def isend(tensor, dst=None, group=None, tag=0, *, group_dst=None, stream=None):
    """Send tensor to dst (world rank); returns a Work."""
    g = _resolve(group)
    if g is None:
        return None
    peer = _peer(g, dst, group_dst, "dst")
    b = _one(g, tensor, False, "isend: tensor")
    return _submit(C.isend, (g._handle(), b.ptr, b.count, b.dtype, peer,
                             _opts(stream=stream, tag=tag)), b.keep, True, None, tensor)


def irecv(tensor, src=None, group=None, tag=0, *, group_src=None, stream=None):
    """Receive into tensor from src (world rank), or from any rank with src=None (CPU
    backend: up to tensor's size; Work.source_rank() then names the sender); a Work."""
    g = _resolve(group)
    if g is None:
        return None
    if src is None and group_src is None:
        peer = _lib.ANY_SOURCE
    else:
        peer = _peer(g, src, group_src, "src")
    b = _one(g, tensor, True, "irecv: tensor")
    return _submit_recv(g, b, peer, tag, stream, tensor)


def _submit_recv(g, b, peer, tag, stream, tensor):
    w = _c_void_p()
    rc = C.irecv(g._handle(), b.ptr, b.count, b.dtype, peer, _opts(stream=stream, tag=tag),
                 _byref(w))
    if rc:
        raise _errors.error(rc, C.last_error().decode("utf-8", "replace"))
    return Work(w.value, b.keep, None, tensor, g)


def send(tensor, dst=None, group=None, tag=0, *, group_dst=None, stream=None):
    """Blocking send (the GIL is released while it waits; Ctrl-C interrupts it on the
    main thread, the send going on)."""
    g = _resolve(group)
    if g is None:
        return None
    peer = _peer(g, dst, group_dst, "dst")
    b = _one(g, tensor, False, "send: tensor")
    if threading.get_ident() == _MAIN:
        _submit(C.isend, (g._handle(), b.ptr, b.count, b.dtype, peer,
                          _opts(stream=stream, tag=tag)), b.keep, True).wait()
        return None
    _errors.check(C.send(g._handle(), b.ptr, b.count, b.dtype, peer,
                         _opts(stream=stream, tag=tag)))


def recv(tensor, src=None, group=None, tag=0, *, group_src=None, stream=None):
    """Blocking receive (the GIL is released; Ctrl-C interrupts it on the main thread,
    as send); returns the sender's world rank as torch
    does. src=None receives from any rank (CPU backend)."""
    g = _resolve(group)
    if g is None:
        return -1
    b = _one(g, tensor, True, "recv: tensor")
    if src is None and group_src is None:
        w = _submit_recv(g, b, _lib.ANY_SOURCE, tag, stream, tensor)
        w.wait()
        return w.source_rank()
    peer = _peer(g, src, group_src, "src")
    if threading.get_ident() == _MAIN:  # interruptible (as send)
        _submit_recv(g, b, peer, tag, stream, tensor).wait()
        return g.ranks[peer]
    _errors.check(C.recv(g._handle(), b.ptr, b.count, b.dtype, peer,
                         _opts(stream=stream, tag=tag)))
    return g.ranks[peer]


class P2POp:
    """One op of batch_isend_irecv: ``P2POp(tdist.isend, tensor, peer)`` or with
    tdist.irecv; peer is a world rank (group_peer: a group rank)."""

    def __init__(self, op, tensor, peer=None, group=None, tag=0, group_peer=None):
        if op not in (isend, irecv):
            raise ValueError("P2POp: op must be tdist.isend or tdist.irecv")
        self.op, self.tensor, self.peer, self.group = op, tensor, peer, group
        self.tag, self.group_peer = tag, group_peer

    def __repr__(self):
        return f"P2POp({self.op.__name__}, peer={self.peer}, tag={self.tag})"


def batch_isend_irecv(p2p_op_list, *, stream=None):
    """Post every op of the list as one work (sends and receives of one batch never
    deadlock against each other). Returns a list holding that one Work, as torch returns a
    list of works."""
    if not p2p_op_list:
        raise ValueError("batch_isend_irecv: empty list")
    group = p2p_op_list[0].group
    if any(p.group is not group for p in p2p_op_list):
        raise ValueError("batch_isend_irecv: every op must use the same group")
    g = _resolve(group)
    if g is None:
        return []
    n = len(p2p_op_list)
    ops = (_P2POpStruct * n)()
    keep = []
    for i, p in enumerate(p2p_op_list):
        recv_ = p.op is irecv
        b = _one(g, p.tensor, recv_, f"batch_isend_irecv: op {i} tensor")
        if p.tag < 0:
            raise ValueError(f"batch_isend_irecv: op {i}: tag must be >= 0")
        ops[i].kind = _lib.P2P_RECV if recv_ else _lib.P2P_SEND
        ops[i].buf, ops[i].count, ops[i].dtype = b.ptr, b.count, b.dtype
        ops[i].peer = _peer(g, p.peer, p.group_peer, "peer")
        ops[i].tag = p.tag
        keep.append(b.keep)
    return [_submit(C.batch_isend_irecv, (g._handle(), ops, n, _opts(stream=stream)), keep, True)]


def wait_all(works, timeout=None):
    """Wait for every Work; raise the first failed one's error (in list order)."""
    for w in works:
        if w is not None:
            w.wait(timeout)
