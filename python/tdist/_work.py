"""Work handles and futures: Python's view of tdist_work_t.

Completion callbacks never enter Python on tdist's progress thread, because
there C code calling a ctypes callback would first take the GIL, and a thread
holding the GIL for seconds would then stall every completion, heartbeat and
abort of the process. Instead a work with Python callbacks (or dropped before
completing) is registered with ``tdist_work_notify`` on one process-wide C
notification queue (tdist/notify.h): the progress thread only appends the
work's token there, without Python. A daemon "tdist-callbacks" thread blocks
in ``tdist_notify_queue_pop`` (ctypes releases the GIL around it), then takes
the GIL itself and runs the Python callbacks. A group's abort callback
(ProcessGroup.on_abort) takes the same road (``tdist_group_notify_abort``: the
C side copies the status and reason). No CFUNCTYPE is ever given to the library.

Buffers: a Work keeps the arrays of its op alive until it has completed (a
wait returned, is_completed() saw it, or the callback thread ran). A Work
dropped before completion hands its arrays to the callback thread, which
lets go of them when the op completes.
"""
import ctypes
import datetime
import itertools
import sys
import threading
import time
import traceback

from . import _errors
from ._lib import C, NOTIFY_ABORT, NotifyEvent

_IN_PROGRESS = -13
_CLOSED = -18
_wait = C.work_wait
_is_completed = C.work_is_completed
_status = C.work_status
_release = C.work_release

# Signals (Ctrl-C's SIGINT) reach Python only on the main thread, and only between
# bytecodes: a C wait blocked for the op's whole deadline would hold a KeyboardInterrupt
# back until then. So the main thread waits in slices of _SLICE_MS and runs the pending
# signal handlers between them (PyErr_CheckSignals, which raises what a handler raised);
# an op done within the first slice costs the one C call it always did. Other threads
# wait in one call: no signal handler runs there.
_SLICE_MS = 100
_MAIN = threading.main_thread().ident
_check_signals = ctypes.pythonapi.PyErr_CheckSignals
_check_signals.argtypes = []
_check_signals.restype = ctypes.c_int


def wait_ptr(ptr, ms):
    """tdist_work_wait(ptr, ms) (0: until the op's own deadline) that, on the main thread,
    lets signal handlers run every _SLICE_MS: a KeyboardInterrupt (or whatever a handler
    raises) propagates from here within about that long, and the op goes on (the work
    is untouched: wait again). Returns the C wait's status."""
    if threading.get_ident() != _MAIN:
        return _wait(ptr, ms)
    rc = _wait(ptr, ms if 0 < ms <= _SLICE_MS else _SLICE_MS)
    if rc != _IN_PROGRESS or 0 < ms <= _SLICE_MS:
        return rc
    end = None if ms == 0 else time.monotonic() + (ms - _SLICE_MS) / 1000.0
    while True:
        _check_signals()  # raises the handler's exception (ctypes.pythonapi checks)
        step = _SLICE_MS
        if end is not None:
            left = int((end - time.monotonic()) * 1000 + 0.999)
            if left <= 0:
                return rc
            step = min(step, left)
        rc = _wait(ptr, step)
        if rc != _IN_PROGRESS:
            return rc

# ---- the notification queue and the callback thread ---------------------------------------
_BATCH = 64        # events taken per pop
_REASON_CAP = 2048  # bytes of an abort reason kept (the C copy is whole; this one may be cut)
_registry = {}  # token -> Work (or _Orphan, or an abort function) whose event has not come
_keys = itertools.count(1)
_queue = None   # the C tdist_notify_queue_t * (an int), made on first use
_thread = None
_thread_lock = threading.Lock()
_complete_lock = threading.RLock()


def _dispatcher(q):
    """The "tdist-callbacks" thread: wait in C without the GIL, then run Python."""
    events = (NotifyEvent * _BATCH)()
    reasons = ctypes.create_string_buffer(_BATCH * _REASON_CAP)
    pop, take = C.notify_queue_pop, _registry.pop
    while True:
        n = pop(q, events, _BATCH, reasons, _REASON_CAP, -1)
        if n < 0:  # closed (at exit) and drained
            return
        for i in range(n):
            e = events[i]
            obj = take(e.token, None)
            if obj is None:
                continue
            try:
                if e.kind == NOTIFY_ABORT:
                    at = i * _REASON_CAP
                    obj(e.status, reasons.raw[at:at + _REASON_CAP].split(b"\0", 1)[0])
                else:
                    obj._on_c_callback()
            except Exception:  # a user callback's error must not end the thread
                traceback.print_exc()


def _ensure_queue():
    global _queue, _thread
    q = _queue
    if q is None:
        with _thread_lock:
            q = _queue
            if q is None:
                out = ctypes.c_void_p()
                _errors.check(C.notify_queue_create(ctypes.byref(out)))
                q = out.value
                t = threading.Thread(target=_dispatcher, args=(q,), name="tdist-callbacks",
                                     daemon=True)
                t.start()
                _queue, _thread = q, t
    return q


def _register_with(obj, c_register):
    """Put `obj` under a new token, then have C register it on the queue
    (c_register(queue, token) -> rc); undone if C refuses."""
    q = _ensure_queue()
    key = next(_keys)
    _registry[key] = obj
    rc = c_register(q, key)
    if rc != 0:
        _registry.pop(key, None)
        _errors.check(rc)


def _register(obj, ptr):
    """Queue the completion of work `ptr`; `obj._on_c_callback()` runs on the callback thread."""
    _register_with(obj, lambda q, key: C.work_notify(ptr, q, key))


def _post(obj):
    """Run `obj._on_c_callback()` on the callback thread soon (a work already complete)."""
    _register_with(obj, lambda q, key: C.notify_post(q, key, 0))


def register_abort(fn, ptr):
    """Have fn(status, reason_bytes) run on the callback thread when group `ptr` aborts."""
    _register_with(fn, lambda q, key: C.group_notify_abort(ptr, q, key))


def queue_fd():
    """The notification queue's eventfd (readable while events are queued), for tests and
    event loops that want to watch it; makes the queue if needed."""
    return C.notify_queue_fd(_ensure_queue())


def shutdown_callbacks(timeout=10.0):
    """Run the callbacks still queued and stop the callback thread (at exit, after the
    groups were destroyed, so every registered completion has been queued)."""
    global _thread, _queue
    t, q = _thread, _queue
    if t is not None:
        C.notify_queue_close(q)  # the thread drains what is queued, then returns
        t.join(timeout)
        if not t.is_alive():
            C.notify_queue_destroy(q)
        _thread = _queue = None


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
    CUDA stream wait for the op without blocking the host; ``get_future()`` (a
    tdist.Future whose value is the op's output, as torch's); ``result()``;
    ``source_rank()`` after a receive (the sender's world rank).
    """
    __slots__ = ("_ptr", "_keep", "_finish", "_done", "_exc", "_callbacks", "_registered",
                 "_result", "_recv_group", "_source", "__weakref__")

    def __init__(self, ptr, keep, finish=None, result=None, recv_group=None):
        self._ptr = ptr
        self._keep = keep
        self._finish = finish
        self._done = False
        self._exc = None
        self._callbacks = None
        self._registered = False
        self._result = result
        self._recv_group = recv_group

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
            else:
                if self._recv_group is not None:  # a receive: who sent it (any source)
                    src = ctypes.c_int(-1)
                    if C.work_status_info(self._ptr, ctypes.byref(src), None, None) == 0 \
                            and src.value >= 0:
                        self._source = self._recv_group.ranks[src.value]
            if st >= 0 and self._finish is not None:
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
        On the main thread a signal handler's exception (KeyboardInterrupt for Ctrl-C)
        propagates within about 0.1 s; the op goes on and the Work stays valid (wait
        again). Thread: any.
        """
        if not self._done:
            rc = wait_ptr(self._ptr, 0 if timeout is None else timeout_ms(timeout))
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
            if self._registered == "ran":  # the event already came: post one more
                _post(self)
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
        """A tdist.Future (torch.futures.Future's API) completed when the op completes:
        ``wait()`` returns the op's output (a list, as torch: ``[tensor]`` for
        all_reduce) or raises its error; ``then(fn)``; ``add_done_callback(fn)``."""
        fut = Future(self)
        self.add_done_callback(fut._from_work)
        return fut

    def result(self):
        """The op's output as a list (torch's Work.result()), after completion."""
        r = self._result
        if r is None:
            return []
        return list(r) if isinstance(r, (list, tuple)) else [r]

    def source_rank(self):
        """After a receive completed: the sender's world rank (any-source receives
        included); -1 before completion or for other ops."""
        if not self.is_completed():
            return -1
        return getattr(self, "_source", -1) if self._recv_group is not None else -1

    _source_rank = source_rank  # torch's private name

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


class Future:
    """A value that becomes available later, with torch.futures.Future's API: ``done()``,
    ``wait()`` (the value, or raises the error), ``value()``, ``then(fn)`` (a new Future
    holding ``fn(this_future)``), ``add_done_callback(fn)`` (``fn(this_future)``),
    ``set_result(v)``, ``set_exception(e)``; and concurrent.futures' ``result(timeout)``
    and ``exception()``. A Future from ``Work.get_future()`` waits for its op without the
    GIL. Callbacks run on the thread that completes the future: the "tdist-callbacks"
    thread, or one whose ``wait()`` saw the op complete first; added to a completed
    future, they run at once on the caller's thread (as torch's)."""
    __slots__ = ("_cond", "_done", "_value", "_exc", "_callbacks", "_work")

    def __init__(self, work=None):
        self._cond = threading.Condition(threading.Lock())
        self._done = False
        self._value = None
        self._exc = None
        self._callbacks = []
        self._work = work

    def _from_work(self, w=None):
        w = w or self._work
        if w._exc is not None:
            self._finish(None, w._exc)
        else:
            self._finish(w.result(), None)

    def _finish(self, value, exc):
        with self._cond:
            if self._done:
                return False
            self._value, self._exc, self._done = value, exc, True
            cbs, self._callbacks = self._callbacks, []
            self._cond.notify_all()
        for fn in cbs:
            try:
                fn(self)
            except Exception:
                print("tdist: exception in a Future callback:", file=sys.stderr)
                traceback.print_exc()
        return True

    def done(self):
        if not self._done and self._work is not None and self._work.is_completed():
            self._from_work()
        return self._done

    def wait(self, timeout=None):
        """Block until done (the op's wait, without the GIL); return the value or raise."""
        if not self._done:
            w = self._work
            if w is not None:
                try:
                    w.wait(timeout)
                except BaseException:
                    if not w._done:  # InProgressError, or a KeyboardInterrupt: op goes on
                        raise
                    # else the op's error: raised below, from the future
                self._from_work()
            else:
                with self._cond:
                    if not self._cond.wait_for(lambda: self._done, timeout):
                        raise _errors.InProgressError(
                            "Future.wait: not done yet", _IN_PROGRESS, "TDIST_ERR_IN_PROGRESS")
        if self._exc is not None:
            raise self._exc
        return self._value

    def value(self):
        """The value of a completed future (raises its error); RuntimeError if not done."""
        if not self.done():
            raise RuntimeError("Future.value(): the future is not completed yet; use wait()")
        return self.wait()

    def result(self, timeout=None):
        return self.wait(timeout)

    def exception(self, timeout=None):
        try:
            self.wait(timeout)
        except _errors.InProgressError:
            raise
        except BaseException as e:
            return e
        return None

    def set_result(self, value):
        if not self._finish(value, None):
            raise RuntimeError("Future.set_result: the future is already completed")

    def set_exception(self, exc):
        if not self._finish(None, exc):
            raise RuntimeError("Future.set_exception: the future is already completed")

    def add_done_callback(self, fn):
        with self._cond:
            if not self._done:
                self._callbacks.append(fn)
                return
        fn(self)

    def then(self, fn):
        """A new Future whose value is ``fn(self)`` once this one is done (its error if fn
        raises)."""
        nxt = Future()

        def run(f):
            try:
                nxt._finish(fn(f), None)
            except BaseException as e:
                nxt._finish(None, e)
        self.add_done_callback(run)
        return nxt

    def __repr__(self):
        return f"<tdist.Future {'done' if self._done else 'pending'}>"
