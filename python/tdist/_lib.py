"""Finding and loading libtdist.so, the ctypes prototypes of the C API, and the check of
the mirrored structs against the loaded library.

Search order for the library (the first that exists wins):

1. ``$TDIST_LIBRARY``: a path to ``libtdist.so`` (or a directory holding it);
2. next to an installed package: ``_install.py`` (written by ``cmake --install``, or by
   the wheel build with the library bundled in ``tdist/_native``) names the library
   directory relative to the package directory;
3. only in a source checkout (``<repo>/python/tdist`` with ``<repo>/include/tdist``
   beside it), never in an installed package: ``<repo>/build/release``, then
   ``<repo>/build/test``, then the newest other ``<repo>/build/*/libtdist.so`` that is
   not a sanitizer build (ASan/TSan libraries cannot be loaded into a plain interpreter);
4. the dynamic loader's own search (``LD_LIBRARY_PATH``, ``ld.so.cache``):
   ``libtdist.so.0``.

Every C function is declared once in ``_FUNCS`` below: binding a new C entry
point is one line there. Every struct mirrored here is compared at import with
the layout the library reports (``tdist_abi_field``, ``tdist_abi_constant``): a
difference is an ImportError naming the field, never a corrupted call.
"""
import ctypes
import glob
import os
from ctypes import (POINTER, Structure, c_char_p, c_double, c_int, c_int64, c_size_t,
                    c_uint64, c_void_p)

_SONAME = "libtdist.so.0"
_PKG_DIR = os.path.dirname(os.path.abspath(__file__))


# ---- option structs (tdist/types.h, group.h, store.h, ops.h) ------------------------------
class OpOpts(Structure):
    _fields_ = [("mask", c_uint64), ("timeout_ms", c_int64), ("premul_scalar", c_double),
                ("stream", c_void_p), ("tag", c_int)]


OP_FIELD_TIMEOUT, OP_FIELD_SCALAR, OP_FIELD_STREAM, OP_FIELD_TAG = 1, 2, 4, 8


class InitOpts(Structure):
    _fields_ = [("mask", c_uint64), ("backend", c_char_p), ("init_method", c_char_p),
                ("rank", c_int), ("world_size", c_int), ("store", c_void_p),
                ("timeout_ms", c_int64), ("device", c_int), ("name", c_char_p),
                ("host_store", c_int)]


(INIT_FIELD_BACKEND, INIT_FIELD_INIT_METHOD, INIT_FIELD_RANK, INIT_FIELD_WORLD_SIZE,
 INIT_FIELD_STORE, INIT_FIELD_TIMEOUT, INIT_FIELD_DEVICE, INIT_FIELD_NAME,
 INIT_FIELD_HOST_STORE) = (1 << i for i in range(9))


class GroupOpts(Structure):
    _fields_ = [("mask", c_uint64), ("timeout_ms", c_int64), ("name", c_char_p),
                ("device", c_int)]


GROUP_FIELD_TIMEOUT, GROUP_FIELD_NAME, GROUP_FIELD_DEVICE = 1, 2, 4


class StoreServerOpts(Structure):
    _fields_ = [("mask", c_uint64), ("host", c_char_p), ("port", c_int), ("token", c_char_p),
                ("backlog", c_int)]


SERVER_FIELD_HOST, SERVER_FIELD_PORT, SERVER_FIELD_TOKEN, SERVER_FIELD_BACKLOG = 1, 2, 4, 8


class StoreOpts(Structure):
    _fields_ = [("mask", c_uint64), ("timeout_ms", c_int64), ("token", c_char_p)]


STORE_FIELD_TIMEOUT, STORE_FIELD_TOKEN = 1, 2


class P2POp(Structure):
    _fields_ = [("kind", c_int), ("buf", c_void_p), ("count", c_size_t), ("dtype", c_int),
                ("peer", c_int), ("tag", c_int)]


P2P_SEND, P2P_RECV = 0, 1
ANY_SOURCE, ANY_TAG = -1, -1


class NotifyEvent(Structure):  # tdist/notify.h
    _fields_ = [("token", c_uint64), ("kind", c_int), ("status", c_int),
                ("reason_len", c_size_t)]


NOTIFY_WORK, NOTIFY_ABORT, NOTIFY_POST = 0, 1, 2

# No CFUNCTYPE callback is ever handed to the library: C calling into Python takes the
# GIL on tdist's progress thread. Completions come through a notification queue instead
# (tdist/notify.h, _work.py).

# The structs and constants checked against the library at import: (Structure, C typedef
# name, field names that map to other C names).
_ABI_STRUCTS = [(OpOpts, "tdist_op_opts_t"), (InitOpts, "tdist_init_opts_t"),
                (GroupOpts, "tdist_group_opts_t"), (StoreServerOpts, "tdist_store_server_opts_t"),
                (StoreOpts, "tdist_store_opts_t"), (P2POp, "tdist_p2p_op_t"),
                (NotifyEvent, "tdist_notify_event_t")]
_ABI_CONSTANTS = {
    "TDIST_OP_FIELD_TIMEOUT": OP_FIELD_TIMEOUT, "TDIST_OP_FIELD_SCALAR": OP_FIELD_SCALAR,
    "TDIST_OP_FIELD_STREAM": OP_FIELD_STREAM, "TDIST_OP_FIELD_TAG": OP_FIELD_TAG,
    "TDIST_INIT_FIELD_BACKEND": INIT_FIELD_BACKEND,
    "TDIST_INIT_FIELD_INIT_METHOD": INIT_FIELD_INIT_METHOD,
    "TDIST_INIT_FIELD_RANK": INIT_FIELD_RANK, "TDIST_INIT_FIELD_WORLD_SIZE": INIT_FIELD_WORLD_SIZE,
    "TDIST_INIT_FIELD_STORE": INIT_FIELD_STORE, "TDIST_INIT_FIELD_TIMEOUT": INIT_FIELD_TIMEOUT,
    "TDIST_INIT_FIELD_DEVICE": INIT_FIELD_DEVICE, "TDIST_INIT_FIELD_NAME": INIT_FIELD_NAME,
    "TDIST_INIT_FIELD_HOST_STORE": INIT_FIELD_HOST_STORE,
    "TDIST_GROUP_FIELD_TIMEOUT": GROUP_FIELD_TIMEOUT, "TDIST_GROUP_FIELD_NAME": GROUP_FIELD_NAME,
    "TDIST_GROUP_FIELD_DEVICE": GROUP_FIELD_DEVICE,
    "TDIST_STORE_SERVER_FIELD_HOST": SERVER_FIELD_HOST,
    "TDIST_STORE_SERVER_FIELD_PORT": SERVER_FIELD_PORT,
    "TDIST_STORE_SERVER_FIELD_TOKEN": SERVER_FIELD_TOKEN,
    "TDIST_STORE_SERVER_FIELD_BACKLOG": SERVER_FIELD_BACKLOG,
    "TDIST_STORE_FIELD_TIMEOUT": STORE_FIELD_TIMEOUT, "TDIST_STORE_FIELD_TOKEN": STORE_FIELD_TOKEN,
    "TDIST_P2P_SEND": P2P_SEND, "TDIST_P2P_RECV": P2P_RECV,
    "TDIST_ANY_SOURCE": ANY_SOURCE, "TDIST_ANY_TAG": ANY_TAG,
    "TDIST_NOTIFY_WORK": NOTIFY_WORK, "TDIST_NOTIFY_ABORT": NOTIFY_ABORT,
    "TDIST_NOTIFY_POST": NOTIFY_POST,
}

# ---- prototypes: name -> (restype, argtypes) ---------------------------------------------
P, I, Z, I64, S = c_void_p, c_int, c_size_t, c_int64, c_char_p
PP = POINTER(c_void_p)  # out-param for a handle
OPTS = POINTER(OpOpts)
_FUNCS = {
    # errors.h, version.h, types.h
    "tdist_strerror": (S, [I]),
    "tdist_err_name": (S, [I]),
    "tdist_last_error": (S, []),
    "tdist_version": (I, [POINTER(c_int), POINTER(c_int), POINTER(c_int)]),
    "tdist_version_string": (S, []),
    "tdist_dtype_size": (Z, [I]),
    "tdist_dtype_name": (S, [I]),
    "tdist_redop_name": (S, [I]),
    "tdist_op_name": (S, [I]),
    # work.h
    "tdist_work_is_completed": (I, [P]),
    "tdist_work_wait": (I, [P, I64]),
    "tdist_work_wait_stream": (I, [P, P]),
    "tdist_work_status": (I, [P]),
    "tdist_work_state": (I, [P]),
    "tdist_work_error_message": (S, [P]),
    "tdist_work_optype": (I, [P]),
    "tdist_work_seq": (c_uint64, [P]),
    "tdist_work_is_captured": (I, [P]),
    "tdist_work_status_info": (I, [P, POINTER(c_int), POINTER(c_int), POINTER(c_size_t)]),
    "tdist_work_release": (I, [P]),
    "tdist_wait_all": (I, [PP, Z, I64]),
    "tdist_wait_any": (I, [PP, Z, I64, POINTER(c_size_t)]),
    # group.h
    "tdist_init_process_group": (I, [POINTER(InitOpts), PP]),
    "tdist_new_group": (I, [P, POINTER(c_int), I, POINTER(GroupOpts), PP]),
    "tdist_mesh_create": (I, [P, POINTER(c_int), I, POINTER(GroupOpts), PP, POINTER(c_int)]),
    "tdist_group_rank": (I, [P]),
    "tdist_group_size": (I, [P]),
    "tdist_group_global_rank": (I, [P, I]),
    "tdist_group_name": (S, [P]),
    "tdist_group_backend": (S, [P]),
    "tdist_group_device_memory": (I, [P]),
    "tdist_group_timeout": (I64, [P]),
    "tdist_group_set_timeout": (I, [P, I64]),
    "tdist_group_abort": (I, [P, S]),
    "tdist_group_shrink": (I, [P, POINTER(GroupOpts), PP]),
    "tdist_group_is_aborted": (I, [P]),
    "tdist_group_destroy": (I, [P]),
    # ops.h (group, buffers..., opts, work)
    "tdist_all_reduce": (I, [P, P, P, Z, I, I, OPTS, PP]),
    "tdist_broadcast": (I, [P, P, Z, I, I, OPTS, PP]),
    "tdist_reduce": (I, [P, P, P, Z, I, I, I, OPTS, PP]),
    "tdist_all_gather": (I, [P, P, P, Z, I, OPTS, PP]),
    "tdist_gather": (I, [P, P, P, Z, I, I, OPTS, PP]),
    "tdist_scatter": (I, [P, P, P, Z, I, I, OPTS, PP]),
    "tdist_reduce_scatter": (I, [P, P, P, Z, I, I, OPTS, PP]),
    "tdist_all_to_all": (I, [P, P, P, Z, I, OPTS, PP]),
    "tdist_barrier": (I, [P, OPTS, PP]),
    "tdist_isend": (I, [P, P, Z, I, I, OPTS, PP]),
    "tdist_irecv": (I, [P, P, Z, I, I, OPTS, PP]),
    "tdist_send": (I, [P, P, Z, I, I, OPTS]),
    "tdist_recv": (I, [P, P, Z, I, I, OPTS]),
    "tdist_batch_isend_irecv": (I, [P, POINTER(P2POp), I, OPTS, PP]),
    "tdist_all_to_all_v": (I, [P, P, POINTER(c_size_t), POINTER(c_size_t), P, POINTER(c_size_t),
                               POINTER(c_size_t), I, OPTS, PP]),
    # notify.h
    "tdist_notify_queue_create": (I, [PP]),
    "tdist_notify_queue_fd": (I, [P]),
    "tdist_work_notify": (I, [P, P, c_uint64]),
    "tdist_group_notify_abort": (I, [P, P, c_uint64]),
    "tdist_notify_post": (I, [P, c_uint64, I]),
    "tdist_notify_queue_pop": (I, [P, POINTER(NotifyEvent), Z, P, Z, I64]),
    "tdist_notify_queue_close": (I, [P]),
    "tdist_notify_queue_destroy": (I, [P]),
    # abi.h
    "tdist_abi_field": (I, [S, S, POINTER(c_size_t), POINTER(c_size_t)]),
    "tdist_abi_constant": (I, [S, POINTER(c_int64)]),
    # store.h
    "tdist_store_server_start": (I, [POINTER(StoreServerOpts), PP]),
    "tdist_store_server_port": (I, [P]),
    "tdist_store_server_num_keys": (I64, [P]),
    "tdist_store_server_stop": (I, [P]),
    "tdist_store_connect": (I, [S, I, POINTER(StoreOpts), PP]),
    "tdist_store_open_file": (I, [S, POINTER(StoreOpts), PP]),
    "tdist_store_prefix": (I, [P, S, PP]),
    "tdist_store_release": (I, [P]),
    "tdist_store_free": (None, [P]),
    "tdist_store_set": (I, [P, S, P, Z]),
    "tdist_store_get": (I, [P, S, PP, POINTER(c_size_t), I64]),
    "tdist_store_add": (I, [P, S, I64, POINTER(c_int64)]),
    "tdist_store_compare_set": (I, [P, S, P, Z, P, Z, PP, POINTER(c_size_t)]),
    "tdist_store_wait": (I, [P, POINTER(c_char_p), Z, I64]),
    "tdist_store_check": (I, [P, POINTER(c_char_p), Z, POINTER(c_int)]),
    "tdist_store_delete": (I, [P, S, POINTER(c_int)]),
    "tdist_store_num_keys": (I, [P, POINTER(c_int64)]),
    "tdist_store_multi_get": (I, [P, POINTER(c_char_p), Z, PP, POINTER(c_size_t), I64]),
    "tdist_store_multi_set": (I, [P, POINTER(c_char_p), PP, POINTER(c_size_t), Z]),
    "tdist_store_append": (I, [P, S, P, Z]),
    "tdist_store_address": (S, [P]),
    # debug.h
    "tdist_dump_trace": (I, [P, S]),
}


def _candidates():
    env = os.environ.get("TDIST_LIBRARY")
    if env:
        yield os.path.join(env, _SONAME) if os.path.isdir(env) else env
        return  # an explicit choice is not second-guessed
    try:
        from . import _install  # written at install time
    except ImportError:
        _install = None
    if _install is not None:
        yield os.path.normpath(os.path.join(_PKG_DIR, _install.LIBDIR_REL, _SONAME))
    if _install is not None or not _in_source_checkout():
        yield _SONAME  # an installed package: never a build folder it happens to sit near
        return
    repo_build = os.path.normpath(os.path.join(_PKG_DIR, "..", "..", "build"))
    seen = set()
    for d in ("release", "test"):
        p = os.path.join(repo_build, d, _SONAME)
        seen.add(p)
        yield p
    others = [p for p in glob.glob(os.path.join(repo_build, "*", _SONAME)) if p not in seen]
    others = [p for p in others if not _is_sanitizer_build(os.path.dirname(p))]
    for p in sorted(others, key=os.path.getmtime, reverse=True):
        yield p
    yield _SONAME  # the dynamic loader's search path


def _in_source_checkout():
    """<repo>/python/tdist, with <repo>/include/tdist/tdist.h and <repo>/CMakeLists.txt."""
    repo = os.path.normpath(os.path.join(_PKG_DIR, "..", ".."))
    return (os.path.basename(os.path.dirname(_PKG_DIR)) == "python"
            and os.path.isfile(os.path.join(repo, "include", "tdist", "tdist.h"))
            and os.path.isfile(os.path.join(repo, "CMakeLists.txt")))


def _is_sanitizer_build(build_dir):
    try:
        with open(os.path.join(build_dir, "CMakeCache.txt")) as f:
            text = f.read()
    except OSError:
        return False
    return ("TDIST_ENABLE_ASAN:BOOL=ON" in text) or ("TDIST_ENABLE_TSAN:BOOL=ON" in text)


def _load():
    # libtdist.so allocates from a jemalloc of its own (static, hidden, not initial-exec TLS:
    # docs/python.md), so it loads into the running interpreter like any library.
    tried, found = [], []
    for path in _candidates():
        if os.sep in path and not os.path.exists(path):
            tried.append(path)
            continue
        try:
            return ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL), path
        except OSError as e:
            if os.sep in path or "cannot open shared object file" not in str(e):
                found.append(f"{path}: {e}")
            else:
                tried.append(f"{path} (the dynamic loader's search path)")
    if found:  # a library is there but does not load: pointing elsewhere would not help
        raise ImportError("tdist: libtdist.so was found but cannot be loaded:\n  "
                          + "\n  ".join(found))
    hint = ("TDIST_LIBRARY names no such file" if os.environ.get("TDIST_LIBRARY") else
            "build it (README.md: cmake --build) or install it (cmake --install), or set "
            "TDIST_LIBRARY to its path")
    raise ImportError(f"tdist: libtdist.so not found; {hint}. Looked for:\n  "
                      + "\n  ".join(tried))


lib, path = _load()


def _missing(name):
    def f(*args, **kwargs):
        from ._errors import NotSupportedError
        raise NotSupportedError(f"{name} is not in the loaded library {path}", -10,
                                "TDIST_ERR_NOT_SUPPORTED")
    return f


class _Funcs:
    """The C functions, as attributes named without the tdist_ prefix."""


C = _Funcs()
for _name, (_res, _args) in _FUNCS.items():
    try:
        _f = getattr(lib, _name)
    except AttributeError:
        setattr(C, _name[len("tdist_"):], _missing(_name))
        continue
    _f.restype = _res
    _f.argtypes = _args
    setattr(C, _name[len("tdist_"):], _f)


def _check_abi():
    """Compare every mirrored struct and constant with the loaded library's own."""
    f, k = getattr(lib, "tdist_abi_field", None), getattr(lib, "tdist_abi_constant", None)
    if f is None or k is None:
        raise ImportError(f"tdist: the library {path} has no tdist_abi_field (it is older than "
                          "this package): its structs cannot be checked; use the library "
                          "built with this package (TDIST_LIBRARY)")
    bad = []
    off, size = c_size_t(), c_size_t()
    for cls, cname in _ABI_STRUCTS:
        if C.abi_field(cname.encode(), None, ctypes.byref(off), ctypes.byref(size)) != 0:
            bad.append(f"{cname}: unknown to the library")
            continue
        c_size = size.value
        for name, _ in cls._fields_:
            mine = getattr(cls, name)
            if C.abi_field(cname.encode(), name.encode(), ctypes.byref(off),
                           ctypes.byref(size)) != 0:
                bad.append(f"{cname}.{name}: not in the library's struct")
            elif (off.value, size.value) != (mine.offset, mine.size):
                bad.append(f"{cname}.{name}: offset {off.value} size {size.value} in the "
                           f"library, offset {mine.offset} size {mine.size} here")
        if ctypes.sizeof(cls) > c_size:  # option structs may grow at the end: larger is fine
            bad.append(f"{cname}: {c_size} bytes in the library, {ctypes.sizeof(cls)} here")
    v = c_int64()
    for name, mine in _ABI_CONSTANTS.items():
        if C.abi_constant(name.encode(), ctypes.byref(v)) != 0:
            bad.append(f"{name}: unknown to the library")
        elif v.value != mine:
            bad.append(f"{name} = {v.value} in the library, {mine} here")
    if bad:
        raise ImportError(f"tdist: the library {path} does not match this package's view of "
                          "its structs (a different version?):\n  " + "\n  ".join(bad))


_check_abi()


def last_error():
    return C.last_error().decode("utf-8", "replace")
