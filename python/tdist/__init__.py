"""tdist for Python: process groups, collectives and point-to-point ops with async work
handles, over libtdist.so (ctypes; no compiled extension). The API mirrors
torch.distributed:

    import numpy as np, tdist
    tdist.init_process_group()                 # env:// - what tdistrun sets
    x = np.ones(1024, np.float32)
    w = tdist.all_reduce(x, async_op=True)     # returns at once
    ...                                        # compute
    w.wait()                                   # raises tdist.RemoteFailure, ... on failure
    tdist.destroy_process_group()

NumPy arrays and other buffer-protocol objects are host memory (CPU backend);
objects with __cuda_array_interface__ or a CUDA __dlpack__ (CuPy, PyTorch,
JAX) are device memory (NCCL backend). See docs/python.md.
"""
from . import _lib
from ._errors import _classes as _error_classes
from ._errors import TdistError, TimeoutError, InProgressError, RemoteFailure  # noqa: A004
from ._types import ReduceOp, premul_sum
from ._work import Future, Work
from ._group import (DeviceMesh, GroupMember, ProcessGroup, destroy_process_group,
                     get_backend, get_global_rank, get_group_rank, get_process_group_ranks,
                     get_rank, get_world_size, init_device_mesh, init_process_group,
                     is_initialized, new_group)
from ._ops import (P2POp, all_gather, all_gather_into_tensor, all_reduce, all_to_all,
                   all_to_all_single, barrier, batch_isend_irecv, broadcast, gather, irecv,
                   isend, recv, reduce, reduce_scatter, reduce_scatter_tensor, scatter, send,
                   wait_all)
from ._store import FileStore, PrefixStore, Store, TCPStore

# Every exception class of the error table: tdist.MismatchError, tdist.AbortedError, ...
globals().update(_error_classes)
# torch.distributed's names for the same errors (all RuntimeErrors, as torch's).
DistError = DistBackendError = TdistError
DistNetworkError = _error_classes["NetworkError"]
DistStoreError = _error_classes["StoreError"]

library_path = _lib.path


def version():
    """(major, minor, patch) of the loaded library."""
    import ctypes
    a, b, c = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    _lib.C.version(ctypes.byref(a), ctypes.byref(b), ctypes.byref(c))
    return a.value, b.value, c.value


def version_string():
    return _lib.C.version_string().decode()


__version__ = "%d.%d.%d" % version()

__all__ = ["init_process_group", "destroy_process_group", "is_initialized", "get_rank",
           "get_world_size", "get_backend", "get_global_rank", "get_group_rank",
           "get_process_group_ranks", "new_group", "init_device_mesh", "DeviceMesh",
           "ProcessGroup", "GroupMember", "ReduceOp", "premul_sum", "Work", "Future", "all_reduce",
           "broadcast", "reduce", "all_gather", "all_gather_into_tensor", "gather", "scatter",
           "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single",
           "barrier", "send", "recv", "isend", "irecv", "P2POp", "batch_isend_irecv",
           "wait_all", "Store", "TCPStore", "FileStore", "PrefixStore", "TdistError", "DistError",
           "DistBackendError", "DistNetworkError", "DistStoreError",
           "version", "version_string", "library_path"] + sorted(_error_classes)
