"""dlopen_check.py LIBTDIST.so - load libtdist.so into this running interpreter with
ctypes (dlopen, RTLD_LOCAL) and use it: a store server on its own thread, a client,
100 set/get round trips. tests/install/run.sh starts it with GLIBC_TUNABLES unset:
the library's jemalloc is private and not initial-exec TLS, so nothing has to be
reserved before the process starts (the re-exec python/tdist/_lib.py once did).
Prints "dlopen_check: OK".
"""
import ctypes
import os
import sys
from ctypes import POINTER, Structure, byref, c_char_p, c_int, c_size_t, c_uint64, c_void_p

assert "GLIBC_TUNABLES" not in os.environ, "must run without GLIBC_TUNABLES"
lib = ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_LOCAL)


class ServerOpts(Structure):  # tdist_store_server_opts_t
    _fields_ = [("mask", c_uint64), ("host", c_char_p), ("port", c_int), ("token", c_char_p),
                ("backlog", c_int)]


lib.tdist_version_string.restype = c_char_p
lib.tdist_last_error.restype = c_char_p
lib.tdist_store_server_start.argtypes = [POINTER(ServerOpts), POINTER(c_void_p)]
lib.tdist_store_server_port.argtypes = [c_void_p]
lib.tdist_store_server_stop.argtypes = [c_void_p]
lib.tdist_store_connect.argtypes = [c_char_p, c_int, c_void_p, POINTER(c_void_p)]
lib.tdist_store_set.argtypes = [c_void_p, c_char_p, c_void_p, c_size_t]
lib.tdist_store_get.argtypes = [c_void_p, c_char_p, POINTER(c_void_p), POINTER(c_size_t),
                                ctypes.c_int64]
lib.tdist_store_free.argtypes = [c_void_p]
lib.tdist_store_free.restype = None
lib.tdist_store_release.argtypes = [c_void_p]


def check(rc, what):
    if rc:
        sys.exit(f"dlopen_check: {what} failed ({rc}): {lib.tdist_last_error().decode()}")


srv, store = c_void_p(), c_void_p()
check(lib.tdist_store_server_start(byref(ServerOpts(mask=1, host=b"127.0.0.1")), byref(srv)),
      "tdist_store_server_start")
check(lib.tdist_store_connect(b"127.0.0.1", lib.tdist_store_server_port(srv), None, byref(store)),
      "tdist_store_connect")
value = b"from python, " + lib.tdist_version_string()
for i in range(100):
    key = b"k%d" % i
    check(lib.tdist_store_set(store, key, value, len(value)), "set")
    out, n = c_void_p(), c_size_t()
    check(lib.tdist_store_get(store, key, byref(out), byref(n), 10000), "get")
    got = ctypes.string_at(out, n.value)
    lib.tdist_store_free(out)
    if got != value:
        sys.exit(f"dlopen_check: {key}: wrong value {got!r}")
lib.tdist_store_release(store)
lib.tdist_store_server_stop(srv)
print("dlopen_check: OK")
