"""Process groups: init_process_group, new_group, init_device_mesh, destroy."""
import atexit
import ctypes
import os
import sys
import threading

from . import _errors, _work
from ._lib import C, GroupOpts, InitOpts
from . import _lib

_world = None
_groups = []  # every live ProcessGroup, creation order (world first)
_lock = threading.RLock()


class ProcessGroup:
    """A group of ranks (the world or a subgroup). ``rank()``, ``size()``, ``backend``,
    ``name``, ``ranks`` (the world ranks of its members, in group-rank order)."""

    def __init__(self, ptr):
        self._ptr = ptr
        self._rank = C.group_rank(ptr)
        self._size = C.group_size(ptr)
        self.backend = C.group_backend(ptr).decode()
        self.name = C.group_name(ptr).decode()
        self.ranks = tuple(C.group_global_rank(ptr, i) for i in range(self._size))
        self._of_world = {w: i for i, w in enumerate(self.ranks)}
        # device memory (NCCL) or host memory (CPU, a plug-in): the backend says
        self.device = C.group_device_memory(ptr) == 1

    def rank(self):
        return self._rank

    def size(self):
        return self._size

    def group_rank(self, global_rank):
        """This group's rank of world rank `global_rank` (ValueError if not a member)."""
        try:
            return self._of_world[global_rank]
        except KeyError:
            raise ValueError(f"world rank {global_rank} is not in group '{self.name}' "
                             f"(its world ranks: {list(self.ranks)})") from None

    def global_rank(self, group_rank):
        return self.ranks[group_rank]

    @property
    def timeout(self):
        """The default op timeout in seconds (settable)."""
        return C.group_timeout(self._handle()) / 1000.0

    @timeout.setter
    def timeout(self, seconds):
        _errors.check(C.group_set_timeout(self._handle(), _work.timeout_ms(seconds)))

    def abort(self, reason="aborted from Python"):
        """Abort the group on every rank: pending and later ops fail with AbortedError."""
        C.group_abort(self._handle(), reason.encode())

    def is_aborted(self):
        return bool(C.group_is_aborted(self._handle()))

    def on_abort(self, fn):
        """Call fn(group, exc) once when the group aborts, for any cause (a peer died, a
        timeout, abort() on any rank): `exc` is the exception its ops fail with (a
        RemoteFailure naming the dead rank, ...). Runs on the "tdist-callbacks" thread, so a
        rank busy computing learns of a failure without an op to wait on. One per group."""
        def run(status, reason):
            fn(self, _errors.error(status, reason.decode("utf-8", "replace")))
        _work.register_abort(run, self._handle())

    def shrink(self, timeout=None, name=None):
        """After a rank failed: a new group of the survivors (collective over them)."""
        out = ctypes.c_void_p()
        _errors.check(C.group_shrink(self._handle(), _group_opts(timeout, name),
                                     ctypes.byref(out)))
        return _adopt(out.value)

    def dump_trace(self, path=None):
        """Write the flight recorder as JSON Lines (default file name if path is None)."""
        _errors.check(C.dump_trace(self._handle(), path.encode() if path else None))

    def _handle(self):
        p = self._ptr
        if p is None:
            raise _errors._classes["InvalidStateError"](
                f"group '{self.name}' was destroyed", -14, "TDIST_ERR_INVALID_STATE")
        return p

    def __repr__(self):
        state = "destroyed" if self._ptr is None else f"rank {self._rank}/{self._size}"
        return f"<tdist.ProcessGroup '{self.name}' {self.backend} {state}>"


class _NonMember:
    """What new_group returns on ranks outside the group (torch's
    GroupMember.NON_GROUP_MEMBER): ops on it do nothing and return None."""

    def __repr__(self):
        return "tdist.GroupMember.NON_GROUP_MEMBER"

    def rank(self):
        return -1

    def size(self):
        return -1


class GroupMember:
    WORLD = None  # set by init_process_group
    NON_GROUP_MEMBER = _NonMember()


def _adopt(ptr):
    g = ProcessGroup(ptr)
    with _lock:
        _groups.append(g)
    return g


def _group_opts(timeout, name, device=None):
    if timeout is None and name is None and device is None:
        return None
    o = GroupOpts()
    if device is not None:
        o.mask |= _lib.GROUP_FIELD_DEVICE
        o.device = device
    if timeout is not None:
        o.mask |= _lib.GROUP_FIELD_TIMEOUT
        o.timeout_ms = _work.timeout_ms(timeout)
    if name is not None:
        o.mask |= _lib.GROUP_FIELD_NAME
        o.name = name.encode()
    return ctypes.byref(o)


def _backend_name(backend):
    b = str(backend).lower()
    return {"gloo": "cpu", "cuda": "nccl"}.get(b, b)


def init_process_group(backend=None, init_method=None, timeout=None, world_size=None, rank=None,
                       store=None, group_name=None, device_id=None):
    """Rendezvous with the other ranks and create the world group (collective).

    backend: "cpu" (alias "gloo") or "nccl"; default $TDIST_BACKEND, else "cpu".
    init_method: "env://" (default: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT as set by
    tdistrun), "tcp://host:port" or "file:///path". timeout: seconds or timedelta (the
    rendezvous timeout and the groups' default op timeout; default $TDIST_TIMEOUT_MS, else
    10 minutes). rank, world_size: override the environment. store: a tdist Store to meet
    on. device_id: NCCL's CUDA device (default LOCAL_RANK).
    """
    global _world
    with _lock:
        if _world is not None:
            raise _errors._classes["InvalidStateError"](
                "init_process_group: the default process group is already initialized", -14,
                "TDIST_ERR_INVALID_STATE")
        o = InitOpts()
        keep = []

        def s(v):
            b = v.encode()
            keep.append(b)
            return b
        if backend is not None:
            o.mask |= _lib.INIT_FIELD_BACKEND
            o.backend = s(_backend_name(backend))
        if init_method is not None:
            o.mask |= _lib.INIT_FIELD_INIT_METHOD
            o.init_method = s(init_method)
        if rank is not None and rank >= 0:
            o.mask |= _lib.INIT_FIELD_RANK
            o.rank = rank
        if world_size is not None and world_size >= 0:
            o.mask |= _lib.INIT_FIELD_WORLD_SIZE
            o.world_size = world_size
        if store is not None:
            o.mask |= _lib.INIT_FIELD_STORE
            o.store = store._handle()
        if timeout is not None:
            o.mask |= _lib.INIT_FIELD_TIMEOUT
            o.timeout_ms = _work.timeout_ms(timeout)
        if device_id is not None:
            o.mask |= _lib.INIT_FIELD_DEVICE
            o.device = int(getattr(device_id, "index", device_id) or 0)
        if group_name:
            o.mask |= _lib.INIT_FIELD_NAME
            o.name = s(group_name)
        out = ctypes.c_void_p()
        _errors.check(C.init_process_group(ctypes.byref(o), ctypes.byref(out)))
        _world = _adopt(out.value)
        GroupMember.WORLD = _world
        _install_excepthook()
        return _world


def is_initialized():
    return _world is not None


def world():
    if _world is None:
        raise _errors._classes["InvalidStateError"](
            "the default process group is not initialized: call tdist.init_process_group()",
            -14, "TDIST_ERR_INVALID_STATE")
    return _world


def resolve(group):
    """group=None -> the world; NON_GROUP_MEMBER -> None (ops do nothing)."""
    if group is None:
        return world()
    if group is GroupMember.NON_GROUP_MEMBER:
        return None
    return group


def get_rank(group=None):
    g = resolve(group)
    return -1 if g is None else g._rank


def get_world_size(group=None):
    g = resolve(group)
    return -1 if g is None else g._size


def get_backend(group=None):
    g = resolve(group)
    return None if g is None else g.backend


def get_global_rank(group, group_rank):
    return resolve(group).ranks[group_rank]


def get_group_rank(group, global_rank):
    return resolve(group).group_rank(global_rank)


def get_process_group_ranks(group):
    return list(resolve(group).ranks)


def new_group(ranks=None, timeout=None, backend=None, pg_options=None,
              use_local_synchronization=False, group_desc=None, device_id=None, *, name=None):
    """A subgroup of the world from its world ranks (collective over the world: every rank
    calls it with the same list). Members get a ProcessGroup whose rank i is ranks[i];
    the others get GroupMember.NON_GROUP_MEMBER. ranks=None: all ranks.

    torch's keywords: timeout (seconds or timedelta; default the world's); backend (must be
    the world's: "cpu"/"gloo" or "nccl"/"cuda"); group_desc (the group's name); device_id
    (NCCL: this rank's CUDA device for the group). Refused with NotSupportedError (a
    NotImplementedError): pg_options (backend option objects) and
    use_local_synchronization=True (tdist makes subgroups collectively over the world)."""
    w = world()
    not_supported = _errors._classes["NotSupportedError"]
    if backend is not None and _backend_name(backend) != w.backend:
        raise ValueError(f"new_group: backend {backend!r}: subgroups share the world's backend "
                         f"({w.backend})")
    if pg_options is not None:
        raise not_supported("new_group: pg_options is not supported: tdist groups take no "
                            "backend option objects (timeout= and device_id= are supported)",
                            -10, "TDIST_ERR_NOT_SUPPORTED")
    if use_local_synchronization:
        raise not_supported("new_group: use_local_synchronization=True is not supported: "
                            "tdist_new_group is collective over the whole world (every rank "
                            "calls it, non-members too)", -10, "TDIST_ERR_NOT_SUPPORTED")
    if name is not None and group_desc is not None and name != group_desc:
        raise ValueError("new_group: give name or group_desc, not both")
    ranks = list(range(w._size)) if ranks is None else [int(r) for r in ranks]
    arr = (ctypes.c_int * len(ranks))(*ranks)
    out = ctypes.c_void_p()
    device = None if device_id is None else int(getattr(device_id, "index", device_id) or 0)
    _errors.check(C.new_group(w._handle(), arr, len(ranks),
                              _group_opts(timeout, name or group_desc, device),
                              ctypes.byref(out)))
    if not out.value:
        return GroupMember.NON_GROUP_MEMBER
    return _adopt(out.value)


class DeviceMesh:
    """This rank's view of an N-dimensional mesh: ``groups[d]`` holds the ranks that differ
    from this one only in coordinate d, ``coords[d]`` is this rank's coordinate. Unpacks as
    ``groups, coords = mesh``."""

    def __init__(self, shape, groups, coords, names):
        self.shape = tuple(shape)
        self.groups = tuple(groups)
        self.coords = tuple(coords)
        self.mesh_dim_names = tuple(names) if names else None

    def _dim(self, dim):
        if isinstance(dim, str):
            if not self.mesh_dim_names or dim not in self.mesh_dim_names:
                raise KeyError(f"no mesh dimension named {dim!r}")
            return self.mesh_dim_names.index(dim)
        return dim

    def get_group(self, mesh_dim=0):
        return self.groups[self._dim(mesh_dim)]

    def get_local_rank(self, mesh_dim=0):
        return self.coords[self._dim(mesh_dim)]

    def size(self, mesh_dim=None):
        if mesh_dim is None:
            n = 1
            for d in self.shape:
                n *= d
            return n
        return self.shape[self._dim(mesh_dim)]

    @property
    def ndim(self):
        return len(self.shape)

    def __iter__(self):
        return iter((self.groups, self.coords))

    def __getitem__(self, dim):
        return self.groups[self._dim(dim)]

    def __repr__(self):
        return f"<tdist.DeviceMesh shape {self.shape} coords {self.coords}>"


def init_device_mesh(*args, mesh_dim_names=None, timeout=None):
    """``init_device_mesh((tp, dp, cp))`` (or torch's ``init_device_mesh("cuda", shape)``):
    a mesh over the world, the last dimension varying fastest over world ranks (row-major,
    as torch). Collective over the world. Returns a DeviceMesh."""
    if len(args) == 2 and isinstance(args[0], str):
        args = args[1:]
    if len(args) != 1:
        raise TypeError("init_device_mesh(mesh_shape, mesh_dim_names=None)")
    shape = [int(d) for d in args[0]]
    if mesh_dim_names is not None and len(mesh_dim_names) != len(shape):
        raise ValueError("init_device_mesh: mesh_dim_names must name every dimension")
    w = world()
    nd = len(shape)
    dims = (ctypes.c_int * nd)(*shape)
    groups = (ctypes.c_void_p * nd)()
    coords = (ctypes.c_int * nd)()
    _errors.check(C.mesh_create(w._handle(), dims, nd, _group_opts(timeout, None),
                                ctypes.cast(groups, ctypes.POINTER(ctypes.c_void_p)), coords))
    return DeviceMesh(shape, [_adopt(groups[i]) for i in range(nd)], list(coords),
                      mesh_dim_names)


def destroy_process_group(group=None):
    """Destroy `group`, or with None every group (subgroups first, then the world), waiting
    up to each group's timeout for its pending ops."""
    global _world
    with _lock:
        if group is None:
            todo = list(reversed(_groups))
        elif group is GroupMember.NON_GROUP_MEMBER:
            return
        else:
            todo = [group]
        first = None
        for g in todo:
            if g._ptr is None:
                continue
            ptr, g._ptr = g._ptr, None
            rc = C.group_destroy(ptr)
            if rc != 0 and first is None:
                first = _errors.error(rc, C.last_error().decode("utf-8", "replace"))
            if g in _groups:
                _groups.remove(g)
            if g is _world:
                _world = None
                GroupMember.WORLD = None
        if first is not None:
            raise first


# ---- exit ---------------------------------------------------------------------------------
_failing = None  # after an uncaught exception: "uncaught ValueError: bad input" (bounded)
_REASON_MAX = 160  # the C reason holds 256 bytes with the "rank G (world rank W) ..." prefix


def _install_excepthook():
    prev = sys.excepthook
    if getattr(prev, "_tdist", False):
        return

    def hook(tp, value, tb):
        global _failing
        # The peers' errors carry this: which exception, and its message on one line.
        text = " ".join(str(value).split()) if value is not None else ""
        reason = f"uncaught {tp.__name__}" + (f": {text}" if text else "")
        if len(reason.encode("utf-8", "replace")) > _REASON_MAX:
            reason = reason.encode("utf-8", "replace")[:_REASON_MAX - 3].decode(
                "utf-8", "ignore") + "..."
        _failing = reason
        prev(tp, value, tb)
    hook._tdist = True
    sys.excepthook = hook


def _at_exit():
    """Groups left at exit are destroyed (so peers see a clean goodbye and every C callback
    runs while Python still can); after an uncaught exception they are aborted first, so
    this rank's pending ops end now and the other ranks learn of it at once, with the
    exception's type and message in their error. The abort is this rank's own, which
    writes no flight-recorder dump, but the exception was not the program's choice: its
    dump is written first (unless TDIST_TRACE_ON_FAILURE=0)."""
    try:
        if _failing and os.environ.get("TDIST_PY_ABORT_ON_EXCEPTION", "1") != "0":
            dump = os.environ.get("TDIST_TRACE_ON_FAILURE", "1") != "0"
            for g in list(_groups):
                if g._ptr is not None:
                    if dump:
                        C.dump_trace(g._ptr, None)  # best effort: its error is not ours
                    C.group_abort(g._ptr, _failing.encode("utf-8", "replace"))
        destroy_process_group()
    except Exception as e:
        print(f"tdist: at exit: {e}", file=sys.stderr)
    _work.shutdown_callbacks()


atexit.register(_at_exit)
