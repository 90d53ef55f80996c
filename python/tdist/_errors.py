"""Exceptions mapped from include/tdist/errors.h's X-macro table.

The codes and their names come from the loaded library (tdist_err_name), so
numbers are never copied here. ``_TABLE`` only gives each code a Python class
name and, where one fits, a builtin base class: a code added to errors.h and
missing here still raises a ``TdistError`` subclass named after it (e.g.
``TDIST_ERR_FOO_BAR`` -> ``FooBarError``); giving it a nicer name is one line.
"""
import builtins
import re

from ._lib import C


class TdistError(RuntimeError):
    """Base of every tdist exception: a RuntimeError, as torch's DistError and
    DistBackendError (``except RuntimeError`` written for torch.distributed catches it).

    Attributes: ``code`` (the negative C return code), ``name``
    ("TDIST_ERR_TIMEOUT"...), ``message`` (the C library's sentence).
    """

    def __init__(self, message, code=None, name=None):
        super().__init__(message)
        self.message = message
        self.code = code
        self.name = name

    def __str__(self):
        return self.message

    def __reduce__(self):
        return (type(self), (self.message, self.code, self.name))


_RANK_RX = re.compile(r"\brank (\d+) \(world rank (\d+)")
_ABORTED_RX = re.compile(r"\brank (\d+) \(world rank (\d+)\) aborted the group: ")


def _who(message):
    """(rank, world_rank) of the rank a C message blames, or (None, None). A member that
    relays another's failure prefixes it: "rank 0 (world rank 0) aborted the group: rank 2
    (world rank 2, addr) closed its connection" blames rank 2; a cause that names no rank
    ("... aborted the group: aborted on demand: ...") blames the rank that aborted."""
    message = message or ""
    last = None
    for last in _ABORTED_RX.finditer(message):
        pass
    m = _RANK_RX.search(message, last.end()) if last else _RANK_RX.search(message)
    m = m or last
    return (int(m.group(1)), int(m.group(2))) if m else (None, None)


class RemoteFailure(TdistError):
    """A peer failed (died, stopped, lost its connection) - TDIST_ERR_REMOTE_FAILED.

    ``rank`` is the failed peer's rank in the group of the op and
    ``world_rank`` its world rank, parsed from the C message ("rank 2 (world
    rank 5, ...)"); None when the message names none.
    """

    _RX = _RANK_RX

    def __init__(self, message, code=None, name=None):
        super().__init__(message, code, name)
        self.rank, self.world_rank = _who(message)


class AbortedError(TdistError):
    """TDIST_ERR_ABORTED: the group was aborted (on demand here or on another rank, or
    because of an earlier failure).

    When another rank aborted it, ``rank`` and ``world_rank`` name that rank, parsed
    from the C message ("rank 1 (world rank 3) aborted the group: ..."); else None.
    """

    def __init__(self, message, code=None, name=None):
        super().__init__(message, code, name)
        self.rank, self.world_rank = _who(message)


class TimeoutError(TdistError, builtins.TimeoutError):  # noqa: A001 - the C name
    """TDIST_ERR_TIMEOUT: the op passed its deadline (its group is aborted). Also a builtin
    TimeoutError (as torch's DistTimeoutError is a RuntimeError caught by both)."""

    def __init__(self, message, code=None, name=None):
        TdistError.__init__(self, message, code, name)
        self.args = (message,)


class InProgressError(TimeoutError):
    """TDIST_ERR_IN_PROGRESS: ``Work.wait(timeout)`` ran out of time; the op goes on."""


# One line per code: (errors.h NAME, Python class name, extra builtin bases).
# Classes defined above are used as they are.
_TABLE = [
    ("INVALID_ARGUMENT", "InvalidArgumentError", (ValueError,)),
    ("NO_MEMORY", "NoMemoryError", (MemoryError,)),
    ("TIMEOUT", "TimeoutError", ()),
    ("ABORTED", "AbortedError", ()),
    ("REMOTE_FAILED", "RemoteFailure", ()),
    ("MISMATCH", "MismatchError", ()),
    ("CUDA_ERROR", "CudaError", ()),
    ("NCCL_ERROR", "NcclError", ()),
    ("STORE_ERROR", "StoreError", ()),
    ("NOT_SUPPORTED", "NotSupportedError", (NotImplementedError,)),
    ("INTERNAL", "InternalError", ()),
    ("IO", "NetworkError", (ConnectionError,)),
    ("IN_PROGRESS", "InProgressError", ()),
    ("INVALID_STATE", "InvalidStateError", ()),
    ("PROTOCOL", "ProtocolError", ()),
    ("AUTH", "AuthError", (PermissionError,)),
    ("NOT_FOUND", "NotFoundError", (LookupError,)),
    ("CLOSED", "ClosedError", ()),
    ("TOO_LARGE", "TooLargeError", ()),
]

_by_code = {}  # negative code -> class
_classes = {}  # class name -> class (exported by the package)


def _camel(name):
    return "".join(p.capitalize() for p in name.lower().split("_")) + "Error"


def _make_class(cls_name, bases, doc):
    existing = globals().get(cls_name)
    if isinstance(existing, type) and issubclass(existing, TdistError):
        return existing
    return type(cls_name, (TdistError,) + tuple(bases), {"__doc__": doc, "__module__": "tdist"})


def _build():
    table = {n: (c, b) for n, c, b in _TABLE}
    rc = -1
    while True:
        full = C.err_name(rc).decode()
        if full == "TDIST_ERR_UNKNOWN" or rc < -1000:
            break
        short = full[len("TDIST_ERR_"):]
        cls_name, bases = table.get(short, (_camel(short), ()))
        cls = _make_class(cls_name, bases, f"{full}: {C.strerror(rc).decode()}.")
        _by_code[rc] = cls
        _classes[cls_name] = cls
        rc -= 1
    for cls in (TdistError, TimeoutError, InProgressError, RemoteFailure, AbortedError):
        _classes[cls.__name__] = cls
        cls.__module__ = "tdist"


_build()


def error(rc, message=None):
    """The exception for return code `rc`, with the C message (or the code's text)."""
    cls = _by_code.get(rc, TdistError)
    if not message:
        message = C.strerror(rc).decode()
    return cls(message, rc, C.err_name(rc).decode())


def check(rc):
    """Raise the exception of a failed synchronous call (message from tdist_last_error)."""
    if rc != 0:
        raise error(rc, C.last_error().decode("utf-8", "replace"))
    return rc
