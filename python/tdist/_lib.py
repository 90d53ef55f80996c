"""Finding and loading libtdist.so, and the ctypes prototypes of the C API.

Search order for the library (the first that exists wins):

1. ``$TDIST_LIBRARY``: a path to ``libtdist.so`` (or a directory holding it);
2. next to an installed package: ``_install.py`` (written by ``cmake --install``)
   names the library directory relative to the package directory
   (``<prefix>/lib/python3.X/site-packages/tdist`` -> ``<prefix>/lib``);
3. the build tree of a source checkout: ``<repo>/build/release``, then
   ``<repo>/build/test``, then the newest other ``<repo>/build/*/libtdist.so``
   that is not a sanitizer build (ASan/TSan libraries cannot be loaded into a
   plain interpreter);
4. the dynamic loader's own search (``LD_LIBRARY_PATH``, ``ld.so.cache``):
   ``libtdist.so.0``.

Every C function is declared once in ``_FUNCS`` below: binding a new C entry
point is one line there.
"""
import ctypes
import glob
import os
import sys
from ctypes import (CFUNCTYPE, POINTER, Structure, c_char_p, c_double, c_int, c_int64, c_size_t,
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
    _fields_ = [("mask", c_uint64), ("timeout_ms", c_int64), ("name", c_char_p)]


GROUP_FIELD_TIMEOUT, GROUP_FIELD_NAME = 1, 2


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

# void (*)(tdist_work_t *, void *)
WORK_CB = CFUNCTYPE(None, c_void_p, c_void_p)
# tdist_group_abort_cb_t: (group, status, reason, arg)
GROUP_ABORT_CB = CFUNCTYPE(None, c_void_p, c_int, c_char_p, c_void_p)

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
    "tdist_work_on_complete": (I, [P, WORK_CB, P]),
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
    "tdist_group_timeout": (I64, [P]),
    "tdist_group_set_timeout": (I, [P, I64]),
    "tdist_group_abort": (I, [P, S]),
    "tdist_group_shrink": (I, [P, POINTER(GroupOpts), PP]),
    "tdist_group_is_aborted": (I, [P]),
    "tdist_group_on_abort": (I, [P, GROUP_ABORT_CB, P]),
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
        yield os.path.normpath(os.path.join(_PKG_DIR, _install.LIBDIR_REL, _SONAME))
    except ImportError:
        pass
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


def _is_sanitizer_build(build_dir):
    try:
        with open(os.path.join(build_dir, "CMakeCache.txt")) as f:
            text = f.read()
    except OSError:
        return False
    return ("TDIST_ENABLE_ASAN:BOOL=ON" in text) or ("TDIST_ENABLE_TSAN:BOOL=ON" in text)


# Debian's libjemalloc (which libtdist.so links) uses initial-exec TLS: dlopen into a running
# interpreter fails with "cannot allocate memory in static TLS block" unless glibc reserved more
# optional static TLS at process start. The fix must be in the environment before the process
# starts, so the interpreter is started again with it (same pid, same argv), once.
_TUNABLE = "glibc.rtld.optional_static_tls=16384"
_REEXEC_MARK = "TDIST_PY_REEXEC"


def _reexec_for_static_tls(err):
    if os.environ.get(_REEXEC_MARK) or os.environ.get("TDIST_PY_NO_REEXEC") == "1":
        return
    if "_pytest" in sys.modules:  # pytest has redirected fds 1 and 2: a restart would lose them
        return
    argv = getattr(sys, "orig_argv", None)
    if not argv or sys.flags.interactive or not sys.executable or \
            (len(argv) == 1 and sys.stdin is not None and sys.stdin.isatty()):
        return  # an interactive session cannot be restarted transparently
    env = dict(os.environ)
    t = env.get("GLIBC_TUNABLES")
    env["GLIBC_TUNABLES"] = f"{t}:{_TUNABLE}" if t else _TUNABLE
    env[_REEXEC_MARK] = "1"
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:
        pass
    os.execve(sys.executable, argv, env)


def _load():
    errors = []
    for path in _candidates():
        if os.sep in path and not os.path.exists(path):
            continue
        try:
            return ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL), path
        except OSError as e:
            if "static TLS" in str(e):
                _reexec_for_static_tls(e)
                errors.append(f"{path}: {e} (start the interpreter with "
                              f"GLIBC_TUNABLES={_TUNABLE} in its environment)")
            else:
                errors.append(f"{path}: {e}")
    raise ImportError("tdist: cannot load libtdist.so; set TDIST_LIBRARY to its path. Tried:\n  "
                      + "\n  ".join(errors or ["(no candidate found)"]))


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


def last_error():
    return C.last_error().decode("utf-8", "replace")
