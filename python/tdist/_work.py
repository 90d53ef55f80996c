"""Work handles: Python's view of tdist_work_t.

Completion callbacks: the C library runs a completion callback on its progress
thread. A Python function there would hold up progress for every group
whenever it waits for the GIL, so the C callback registered here (one
CFUNCTYPE for the whole process) only puts the work's key on a queue; a
daemon "tdist-callbacks" thread takes it off and runs the Python callbacks.
The C callback is registered only for works that have Python callbacks (or
were dropped before completing), so plain submit + wait never enters Python
from the progress thread. A group's abort callback (ProcessGroup.on_abort)
takes the same road: its C side copies the status and reason, then queues.

Buffers: a Work keeps the arrays of its op alive until it has completed (a
wait returned, is_completed() saw it, or the callback thread ran). A Work
dropped before completion hands its arrays to the callback thread, which
lets go of them when the op completes.
"""
import datetime
import itertools
import queue
import sys
import threading
import traceback

from . import _errors
from ._lib import C, GROUP_ABORT_CB, WORK_CB

_IN_PROGRESS = -13
_wait = C.work_wait
_is_completed = C.work_is_completed
_status = C.work_status
_release = C.work_release

# ---- the callback thread ------------------------------------------------------------------
_queue = queue.SimpleQueue()
_registry = {}  # key -> Work (or _Orphan) whose C callback is registered and has not run
_keys = itertools.count(1)
_thread = None
_thread_lock = threading.Lock()
_complete_lock = threading.RLock()


def _c_callback(work, arg):  # runs on the progress thread: enqueue only
    _queue.put(arg)


_C_CALLBACK = WORK_CB(_c_callback)
_aborts = {}  # key -> (status, reason) of a group abort, until the callback thread takes it


def _c_abort_callback(group, status, reason, arg):  # progress thread: copy and enqueue only
    _aborts[arg] = (status, reason)  # ctypes made `reason` a bytes copy
    _queue.put(arg)


_C_ABORT_CALLBACK = GROUP_ABORT_CB(_c_abort_callback)


def _dispatcher():
    while True:
        key = _queue.get()
        if key is None:
            return
        w = _registry.pop(key, None)
        if w is not None:
            try:
                if key in _aborts:
                    w(*_aborts.pop(key))
                else:
                    w._on_c_callback()
            except Exception:  # a user callback's error must not end the thread
                traceback.print_exc()


def _ensure_thread():
    global _thread
    if _thread is None:
        with _thread_lock:
            if _thread is None:
                t = threading.Thread(target=_dispatcher, name="tdist-callbacks", daemon=True)
                t.start()
                _thread = t


def _register_with(obj, c_register):
    """Put `obj` under a new key, then have C register its callback with that key
    (c_register(key) -> rc); undone if C refuses."""
    _ensure_thread()
    key = next(_keys)
    _registry[key] = obj
    rc = c_register(key)
    if rc != 0:
        _registry.pop(key, None)
        _errors.check(rc)


def _register(obj, ptr):
    """Register the C callback for `ptr`; `obj._on_c_callback()` runs on the callback thread."""
    _register_with(obj, lambda key: C.work_on_complete(ptr, _C_CALLBACK, key))


def register_abort(fn, ptr):
    """Have fn(status, reason_bytes) run on the callback thread when group `ptr` aborts."""
    _register_with(fn, lambda key: C.group_on_abort(ptr, _C_ABORT_CALLBACK, key))


def shutdown_callbacks(timeout=10.0):
    """Run the callbacks still queued and stop the callback thread (at exit, after the
    groups were destroyed, so every registered C callback has run)."""
    global _thread
    t = _thread
    if t is not None:
        _queue.put(None)
        t.join(timeout)
        _thread = None


def _seconds(timeout):
    if isinstance(timeout, datetime.timedelta):
        return timeout.total_seconds()
    return float(timeout)


def timeout_ms(timeout):
    """None -> 0 (the op's own timeout); seconds or timedelta -> >= 1 ms."""
    if timeout is None:
        return 0
    ms = int(_seconds(timeout) * 1000 + 0.999)
    return ms if ms > 0 else 1


class _Orphan:
    """What a Work dropped before completion leaves to the callback thread."""
    __slots__ = ("keep", "finish")

    def __init__(self, keep, finish):
        self.keep, self.finish = keep, finish

    def _on_c_callback(self):
        self.keep = None  # the op is over: the arrays may go


class Work:
    """An asynchronous op, as torch.distributed's Work.

    ``wait(timeout=None)`` blocks (without the GIL) until the op completes and
    raises its error; ``is_completed()``; ``exception()``;
    ``add_done_callback(fn)``: ``fn(work)`` runs on the "tdist-callbacks" thread
    once the op completed (success or not); ``wait_stream(stream)`` (NCCL): make a
    CUDA stream wait for the op without blocking the host; ``get_future()``.
    """
    __slots__ = ("_ptr", "_keep", "_finish", "_done", "_exc", "_callbacks", "_registered",
                 "__weakref__")

    def __init__(self, ptr, keep, finish=None):
        self._ptr = ptr
        self._keep = keep
        self._finish = finish
        self._done = False
        self._exc = None
        self._callbacks = None
        self._registered = False

    # -- completion (runs once, on the first thread that sees the op complete) --
    def _complete(self, st=None):
        with _complete_lock:
            if self._done:
                return
            if st is None:
                st = _status(self._ptr)
            if st < 0:
                msg = C.work_error_message(self._ptr).decode("utf-8", "replace")
                self._exc = _errors.error(st, msg)
            elif self._finish is not None:
                try:
                    self._finish()
                except BaseException as e:  # a copy-out failed: report it as the op's error
                    self._exc = e
            self._finish = None
            self._keep = None
            self._done = True

    def is_completed(self):
        """True once the op reached a terminal state (success or failure). Never blocks."""
        if self._done:
            return True
        if _is_completed(self._ptr):
            self._complete()
            return True
        return False

    def wait(self, timeout=None):
        """Block until the op completes, without holding the GIL.

        timeout: None waits for the op (bounded by its own deadline, after which it fails
        with tdist.TimeoutError); seconds or a timedelta: raise tdist.InProgressError (a
        tdist.TimeoutError) if the op is still running then - it goes on, wait again.
        Returns True; raises the op's error (tdist.RemoteFailure, MismatchError...).
        """
        if not self._done:
            rc = _wait(self._ptr, 0 if timeout is None else timeout_ms(timeout))
            if rc == _IN_PROGRESS and timeout is not None:
                raise _errors.InProgressError(
                    f"wait: the op is still running after {_seconds(timeout):g} s "
                    "(it goes on; wait again)", rc, "TDIST_ERR_IN_PROGRESS")
            self._complete(rc)
        if self._exc is not None:
            raise self._exc
        return True

    def exception(self):
        """The op's error as an exception, None while running or after success."""
        return self._exc if self.is_completed() else None

    def succeeded(self):
        return self.is_completed() and self._exc is None

    def add_done_callback(self, fn):
        """Call ``fn(self)`` once the op completed, on the "tdist-callbacks" thread (never on
        tdist's progress thread). Callbacks run in registration order; an exception in one
        is printed and ignored."""
        with _complete_lock:
            if self._callbacks is None:
                self._callbacks = []
            self._callbacks.append(fn)
            if self._registered == "ran":  # the C callback already came: run from the queue
                key = next(_keys)
                _registry[key] = self
                _ensure_thread()
                _queue.put(key)
                return
            if self._registered:
                return
            self._registered = True
        _register(self, self._ptr)

    def _on_c_callback(self):
        self._complete()
        with _complete_lock:
            cbs, self._callbacks = self._callbacks or [], None
            self._registered = "ran"
        for fn in cbs:
            try:
                fn(self)
            except Exception:
                print("tdist: exception in a Work callback:", file=sys.stderr)
                traceback.print_exc()

    def get_future(self):
        """A concurrent.futures.Future completed (result None, or the op's exception) when
        the op completes."""
        import concurrent.futures
        fut = concurrent.futures.Future()

        def done(w):
            if w._exc is not None:
                fut.set_exception(w._exc)
            else:
                fut.set_result(None)
        self.add_done_callback(done)
        return fut

    def wait_stream(self, stream):
        """NCCL: make CUDA `stream` wait for the op (the host does not block). `stream`: a
        cudaStream_t as an int, or an object with .cuda_stream (PyTorch), .ptr (CuPy) or
        __cuda_stream__(). Raises tdist.NotSupportedError for CPU work."""
        from ._ops import stream_ptr
        _errors.check(C.work_wait_stream(self._ptr, stream_ptr(stream)))

    @property
    def seq(self):
        """The op's sequence number in its group (the same on every rank)."""
        return C.work_seq(self._ptr)

    @property
    def op(self):
        """The op's name ("all_reduce", ...)."""
        return C.op_name(C.work_optype(self._ptr)).decode()

    def __repr__(self):
        state = "running" if not self.is_completed() else (
            "failed" if self._exc is not None else "completed")
        return f"<tdist.Work {self.op} seq {self.seq} {state}>"

    def __del__(self):
        ptr = self._ptr
        if not ptr:
            return
        self._ptr = None
        if self._done:
            _release(ptr)
            return
        try:
            if not _is_completed(ptr):
                if not self._registered:
                    # dropped while running: the callback thread holds the arrays until the
                    # op is over
                    _register(_Orphan(self._keep, None), ptr)
            _release(ptr)
        except Exception:  # interpreter shutdown
            pass
