"""Key-value stores: TCPStore, FileStore, PrefixStore (tdist/store.h).

Values are bytes (str values are UTF-8 encoded). Calls that wait (get, wait,
multi_get) release the GIL while they wait.
"""
import ctypes
import datetime

from . import _errors, _lib
from ._lib import C, StoreOpts, StoreServerOpts
from ._work import timeout_ms

_DEFAULT_TIMEOUT = datetime.timedelta(seconds=300)


def _b(v):
    if isinstance(v, str):
        return v.encode()
    return bytes(v)


def _keys(keys):
    if isinstance(keys, (str, bytes)):
        keys = [keys]
    bs = [_b(k) for k in keys]
    return (ctypes.c_char_p * max(1, len(bs)))(*bs), len(bs), bs


def _take(ptr, n):
    try:
        return ctypes.string_at(ptr, n) if n else b""
    finally:
        C.store_free(ptr)


def _store_opts(timeout, token):
    o = StoreOpts()
    if timeout is not None:
        o.mask |= _lib.STORE_FIELD_TIMEOUT
        o.timeout_ms = timeout_ms(timeout)
    if token is not None:
        o.mask |= _lib.STORE_FIELD_TOKEN
        o.token = _b(token)
    return o


class Store:
    """A store client (base of TCPStore, FileStore, PrefixStore)."""

    def __init__(self, ptr, timeout):
        self._ptr = ptr
        self._timeout = timeout

    def _handle(self):
        if self._ptr is None:
            raise _errors._classes["InvalidStateError"]("the store was closed", -14,
                                                        "TDIST_ERR_INVALID_STATE")
        return self._ptr

    def _ms(self, timeout):
        return timeout_ms(timeout if timeout is not None else self._timeout)

    @property
    def timeout(self):
        return self._timeout

    def set_timeout(self, timeout):
        """The default timeout of this handle's waiting calls (seconds or timedelta)."""
        self._timeout = timeout

    @property
    def address(self):
        """"host:port" or "file:path"."""
        return C.store_address(self._handle()).decode()

    def set(self, key, value):
        v = _b(value)
        _errors.check(C.store_set(self._handle(), _b(key), v, len(v)))

    def get(self, key, timeout=None):
        """Wait until the key exists, return its value (bytes)."""
        p, n = ctypes.c_void_p(), ctypes.c_size_t()
        _errors.check(C.store_get(self._handle(), _b(key), ctypes.byref(p), ctypes.byref(n),
                                  self._ms(timeout)))
        return _take(p, n.value)

    def add(self, key, amount):
        """Atomically add `amount` to the integer at key (created at 0); the new value."""
        r = ctypes.c_int64()
        _errors.check(C.store_add(self._handle(), _b(key), int(amount), ctypes.byref(r)))
        return r.value

    def compare_set(self, key, expected_value, desired_value):
        """Set key to desired_value if it holds expected_value (or is missing and
        expected_value is empty); return the value now stored."""
        e, d = _b(expected_value), _b(desired_value)
        p, n = ctypes.c_void_p(), ctypes.c_size_t()
        _errors.check(C.store_compare_set(self._handle(), _b(key), e, len(e), d, len(d),
                                          ctypes.byref(p), ctypes.byref(n)))
        return _take(p, n.value)

    def wait(self, keys, timeout=None):
        """Block until every key exists (tdist.TimeoutError names a missing one)."""
        arr, n, _keep = _keys(keys)
        _errors.check(C.store_wait(self._handle(), arr, n, self._ms(timeout)))

    def check(self, keys):
        """True if every key exists now. Does not wait."""
        arr, n, _keep = _keys(keys)
        r = ctypes.c_int()
        _errors.check(C.store_check(self._handle(), arr, n, ctypes.byref(r)))
        return bool(r.value)

    def delete_key(self, key):
        """Remove the key; True if it existed."""
        r = ctypes.c_int()
        _errors.check(C.store_delete(self._handle(), _b(key), ctypes.byref(r)))
        return bool(r.value)

    def num_keys(self):
        """Keys in the whole store (prefix views count all keys)."""
        r = ctypes.c_int64()
        _errors.check(C.store_num_keys(self._handle(), ctypes.byref(r)))
        return r.value

    def multi_get(self, keys, timeout=None):
        arr, n, _keep = _keys(keys)
        vals = (ctypes.c_void_p * max(1, n))()
        lens = (ctypes.c_size_t * max(1, n))()
        _errors.check(C.store_multi_get(self._handle(), arr, n,
                                        ctypes.cast(vals, ctypes.POINTER(ctypes.c_void_p)),
                                        lens, self._ms(timeout)))
        return [_take(vals[i], lens[i]) for i in range(n)]

    def multi_set(self, keys, values):
        arr, n, _keep = _keys(keys)
        vs = [_b(v) for v in values]
        if len(vs) != n:
            raise ValueError("multi_set: as many values as keys")
        ptrs = (ctypes.c_void_p * max(1, n))(*[ctypes.cast(ctypes.c_char_p(v), ctypes.c_void_p)
                                               .value for v in vs])
        lens = (ctypes.c_size_t * max(1, n))(*[len(v) for v in vs])
        _errors.check(C.store_multi_set(self._handle(), arr,
                                        ctypes.cast(ptrs, ctypes.POINTER(ctypes.c_void_p)),
                                        lens, n))

    def append(self, key, value):
        v = _b(value)
        _errors.check(C.store_append(self._handle(), _b(key), v, len(v)))

    def close(self):
        p, self._ptr = self._ptr, None
        if p:
            C.store_release(p)

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class TCPStore(Store):
    """A client of a TCP store server at host_name:port; with is_master=True this process
    also starts the server (port 0: a free port, see .port). Connecting retries until
    `timeout`. token: shared secret (default $TDIST_STORE_TOKEN)."""

    def __init__(self, host_name="127.0.0.1", port=0, world_size=None, is_master=False,
                 timeout=_DEFAULT_TIMEOUT, wait_for_workers=True, token=None):
        self._server = None
        self._ptr = None
        if is_master:
            so = StoreServerOpts()
            so.mask |= _lib.SERVER_FIELD_PORT
            so.port = int(port)
            if token is not None:
                so.mask |= _lib.SERVER_FIELD_TOKEN
                so.token = _b(token)
            srv = ctypes.c_void_p()
            _errors.check(C.store_server_start(ctypes.byref(so), ctypes.byref(srv)))
            self._server = srv.value
            port = C.store_server_port(self._server)
            if host_name in ("", "0.0.0.0", "::"):
                host_name = "127.0.0.1"
        o = _store_opts(timeout, token)
        out = ctypes.c_void_p()
        try:
            _errors.check(C.store_connect(_b(host_name), int(port), ctypes.byref(o),
                                          ctypes.byref(out)))
        except BaseException:
            self._stop_server()
            raise
        super().__init__(out.value, timeout)
        self.host = host_name
        self.port = int(port)

    def _stop_server(self):
        s, self._server = self._server, None
        if s:
            C.store_server_stop(s)

    def close(self):
        super().close()
        self._stop_server()


class FileStore(Store):
    """A store kept in one file, shared by processes on one filesystem."""

    def __init__(self, file_name, world_size=-1, timeout=_DEFAULT_TIMEOUT):
        o = _store_opts(timeout, None)
        out = ctypes.c_void_p()
        _errors.check(C.store_open_file(_b(file_name), ctypes.byref(o), ctypes.byref(out)))
        super().__init__(out.value, timeout)
        self.path = file_name


class PrefixStore(Store):
    """A view of `store` whose keys are prefix + key (shares its connection)."""

    def __init__(self, prefix, store):
        out = ctypes.c_void_p()
        _errors.check(C.store_prefix(store._handle(), _b(prefix), ctypes.byref(out)))
        super().__init__(out.value, store.timeout)
        self.underlying_store = store
