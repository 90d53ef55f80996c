"""From Python objects to (pointer, element count, dtype, host/device).

Accepted, in this order of preference:
  * ``numpy.ndarray`` (fast path), then any object with ``__cuda_array_interface__``
    (CuPy, PyTorch CUDA tensors, Numba) -> device memory;
  * ``__dlpack__`` whose ``__dlpack_device__`` is not the CPU (JAX, PyTorch, CuPy)
    -> device memory;
  * ``__array_interface__`` or the buffer protocol (NumPy, array.array,
    bytearray, memoryview) -> host memory;
  * ``__dlpack__`` on the CPU (a PyTorch CPU tensor) -> host memory.

Refused with ValueError before anything is sent: a non-contiguous array, a
read-only array where the op writes, an unknown element type.

An array interface whose typestr is only a size ("<V2", "|V1": what torch gives for
bfloat16 and float8, ml_dtypes for its types) gets its element type from the object's
``dtype`` attribute, else from its ``__dlpack__`` DLDataType.
"""
import ctypes

from . import _types

try:
    import numpy as _np
    _ndarray = _np.ndarray
except ImportError:  # NumPy is optional: other array kinds still work
    _np = None
    _ndarray = ()

_from_buffer = ctypes.c_char.from_buffer
_addressof = ctypes.addressof


class Buf:
    __slots__ = ("ptr", "count", "dtype", "device", "keep", "nbytes")

    def __init__(self, ptr, count, dtype, device, keep):
        self.ptr = ptr or None  # NULL for an empty buffer
        self.count = count
        self.dtype = dtype
        self.device = device
        self.keep = keep
        self.nbytes = count * _types.SIZE_OF[dtype]


_np_dtypes = {}  # numpy dtype -> tdist dtype (cache)
# Complex numbers: tdist has no complex type; a sum of complex values is the sum of their
# real and imaginary parts, so an op over the interleaved floats does it (not PROD, MIN,
# MAX, whose complex meaning differs).
_COMPLEX_HINT = ("; for complex values pass the interleaved (real, imag) floats: "
                 "torch.view_as_real(t), or a.view(a.real.dtype) for NumPy (SUM/AVG only)")
_COMPLEX_HINT_TORCH = ("; for complex values pass torch.view_as_real(t) (the interleaved "
                       "real and imaginary floats; SUM/AVG only)")
_COMPLEX_HINT_NUMPY = ("; for complex values pass a.view(a.real.dtype) (the interleaved "
                       "real and imaginary floats; SUM/AVG only)")


def _np_dtype(dt, what):
    v = _np_dtypes.get(dt)
    if v is None:
        v = _types.FOREIGN_NAME.get(dt.name)
        if v is None and dt.kind in "iufb" and dt.isnative and not dt.fields:
            v = _types.BY_KIND.get((dt.kind, dt.itemsize))
        if v is None:
            hint = _COMPLEX_HINT_NUMPY if dt.kind == "c" else ""
            raise ValueError(f"{what}: element type {dt} has no tdist dtype "
                             f"(supported: {', '.join(sorted(set(_types.NAME_OF.values())))})"
                             + hint)
        _np_dtypes[dt] = v
    return v


def _typestr_dtype(obj, typestr, what):
    # "<f4", "|u1", "<i8"...; only native byte order
    order, kind, size = typestr[0], typestr[1], int(typestr[2:])
    if kind == "V" and order != ">":
        return _void_dtype(obj, typestr, size, what)
    if order == ">" or (kind not in "iufb"):
        raise ValueError(f"{what}: element type {typestr!r} has no tdist dtype"
                         + (_COMPLEX_HINT if kind == "c" else ""))
    v = _types.BY_KIND.get((kind, size))
    if v is None:
        raise ValueError(f"{what}: element type {typestr!r} has no tdist dtype")
    return v


def _dtype_name(dt):
    # NumPy, ml_dtypes, CuPy and JAX dtypes have .name ("bfloat16"); torch's say
    # "torch.bfloat16"; a scalar type (ml_dtypes.bfloat16) has __name__; a string is as is.
    if isinstance(dt, str):
        name = dt
    else:
        name = getattr(dt, "name", None)
        if not isinstance(name, str):
            name = getattr(dt, "__name__", None)
        if not isinstance(name, str):
            name = str(dt)
    return name.rpartition(".")[2]


def _dlpack_code(obj):
    # (code, bits, lanes) of the object's DLPack capsule, None if it has none or cannot
    # export (an older torch refuses float8). The capsule is dropped unconsumed at once:
    # its destructor frees the export, and the memory is the array interface's anyway.
    if not hasattr(obj, "__dlpack__"):
        return None
    try:
        cap = obj.__dlpack__()
        t = _DLTensor.from_address(_capsule_ptr(cap, b"dltensor"))
        return t.dtype.code, t.dtype.bits, t.dtype.lanes
    except (BufferError, TypeError, ValueError, RuntimeError, NotImplementedError):
        return None


def _void_dtype(obj, typestr, size, what):
    """The tdist dtype of an array whose interface gives only the element size ("<V2"):
    the object's ``dtype`` (by name), else its DLPack DLDataType; ValueError naming what
    the object says otherwise."""
    dt = getattr(obj, "dtype", None)
    name = None
    if dt is not None:
        name = _dtype_name(dt)
        v = _types.FOREIGN_NAME.get(name)
        if v is not None and _types.SIZE_OF[v] == size:
            return v
    dl = _dlpack_code(obj)
    if dl is not None:
        v = _types.dlpack_dtype(*dl)
        if v is not None and _types.SIZE_OF[v] == size:
            return v
    said = []
    if dt is not None:
        said.append(f"dtype {name}")
    if dl is not None:
        said.append("DLPack type code %d, %d bits x%d" % dl)
    raise ValueError(f"{what}: element type {typestr!r} "
                     f"({', '.join(said) or 'no dtype attribute and no __dlpack__'}) has no "
                     f"tdist dtype (supported: {', '.join(sorted(set(_types.NAME_OF.values())))})")


def _c_contiguous(shape, strides, itemsize):
    if strides is None:
        return True
    expect = itemsize
    for n, s in zip(reversed(shape), reversed(strides)):
        if n != 1 and s != expect:
            return False
        expect *= n
    return True


def _prod(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def _numpy(a, writable, what):
    if not a.flags.c_contiguous:
        raise ValueError(f"{what}: the array is not contiguous (use numpy.ascontiguousarray)")
    dtype = _np_dtype(a.dtype, what)
    n = a.size
    if a.flags.writeable:
        if not n:
            return Buf(None, 0, dtype, False, a)
        c = _from_buffer(a)
        return Buf(_addressof(c), n, dtype, False, (a, c))
    if writable:
        raise ValueError(f"{what}: the array is read-only but this op writes into it")
    return Buf(a.__array_interface__["data"][0], n, dtype, False, a)


def _array_interface(obj, ai, device, writable, what):
    if ai.get("mask") is not None:
        raise ValueError(f"{what}: masked arrays are not supported")
    data = ai.get("data")
    if data is None or not isinstance(data, tuple):
        return None  # the data is behind the buffer protocol
    ptr, readonly = data
    shape = tuple(ai["shape"])
    dtype = _typestr_dtype(obj, ai["typestr"], what)
    if not _c_contiguous(shape, ai.get("strides"), _types.SIZE_OF[dtype]):
        raise ValueError(f"{what}: the array is not contiguous")
    if writable and readonly:
        raise ValueError(f"{what}: the array is read-only but this op writes into it")
    return Buf(ptr, _prod(shape), dtype, device, obj)


_FORMAT_KIND = {"b": ("i", 1), "B": ("u", 1), "h": ("i", 2), "H": ("u", 2), "i": ("i", 4),
                "I": ("u", 4), "l": ("i", 8), "L": ("u", 8), "q": ("i", 8), "Q": ("u", 8),
                "e": ("f", 2), "f": ("f", 4), "d": ("f", 8), "?": ("b", 1), "c": ("u", 1)}


def _buffer_protocol(obj, writable, what):
    try:
        m = memoryview(obj)
    except TypeError:
        return None
    if not m.c_contiguous:
        raise ValueError(f"{what}: the buffer is not contiguous")
    if writable and m.readonly:
        raise ValueError(f"{what}: the buffer is read-only but this op writes into it")
    fmt = m.format.lstrip("@=<")
    kind = _FORMAT_KIND.get(fmt)
    dtype = _types.BY_KIND.get(kind) if kind and kind[1] == m.itemsize else None
    if dtype is None:
        raise ValueError(f"{what}: buffer format {m.format!r} has no tdist dtype")
    n = m.nbytes // m.itemsize
    if not n:
        return Buf(None, 0, dtype, False, (obj, m))
    if not m.readonly:
        c = _from_buffer(m)
        return Buf(_addressof(c), n, dtype, False, (obj, m, c))
    # read-only (bytes, ...): only read by the op; address through the C API
    view = _PyBuffer.get(obj)
    return Buf(view.buf, n, dtype, False, (obj, view))


class _Py_buffer(ctypes.Structure):
    _fields_ = [("buf", ctypes.c_void_p), ("obj", ctypes.py_object), ("len", ctypes.c_ssize_t),
                ("itemsize", ctypes.c_ssize_t), ("readonly", ctypes.c_int),
                ("ndim", ctypes.c_int), ("format", ctypes.c_char_p),
                ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                ("suboffsets", ctypes.c_void_p), ("internal", ctypes.c_void_p)]


class _PyBuffer:
    """A Py_buffer held until this object is dropped (read-only buffers' address)."""
    __slots__ = ("view", "buf")
    _get = ctypes.pythonapi.PyObject_GetBuffer
    _get.argtypes = [ctypes.py_object, ctypes.POINTER(_Py_buffer), ctypes.c_int]
    _release = ctypes.pythonapi.PyBuffer_Release
    _release.argtypes = [ctypes.POINTER(_Py_buffer)]
    _release.restype = None

    @classmethod
    def get(cls, obj):
        self = cls()
        self.view = _Py_buffer()
        if cls._get(obj, ctypes.byref(self.view), 0x8 | 0x10 | 0x4) != 0:  # ND|STRIDES|FORMAT
            raise ValueError("cannot get the buffer")
        self.buf = self.view.buf
        return self

    def __del__(self):
        if self.view is not None and self.view.obj is not None:
            _PyBuffer._release(ctypes.byref(self.view))
            self.view = None


# ---- DLPack -----------------------------------------------------------------------------
class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_capsule_ptr = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_ptr.restype = ctypes.c_void_p
_capsule_ptr.argtypes = [ctypes.py_object, ctypes.c_char_p]
_DL_CPU, _DL_CUDA_HOST, _DL_CUDA, _DL_CUDA_MANAGED = 1, 3, 2, 13
_DL_HOST_TYPES = (_DL_CPU, _DL_CUDA_HOST)


_DL_COMPLEX = 5  # kDLComplex


def _torch_bool(obj, writable, what):
    """A torch bool tensor, which torch's DLPack export refuses ("Bool type is not
    supported by dlpack", torch < 2.2): its bytes through a uint8 view, typed tdist's BOOL
    (one byte, reductions logical: SUM/MAX/BOR are or), so the result is 0/1 as torch
    requires of a bool. None if `obj` is not one."""
    import sys
    torch = sys.modules.get("torch")
    if torch is None or getattr(obj, "dtype", None) is not torch.bool:
        return None
    b = buf(obj.view(torch.uint8), writable, what)
    b.dtype = _types.BY_NAME["bool"]
    b.keep = (obj, b.keep)
    return b


def _dlpack(obj, writable, what):
    # The capsule stays unconsumed (name "dltensor"), so its destructor frees the tensor when
    # the capsule is dropped with the rest of the keep-alive tuple after the op completes.
    try:
        cap = obj.__dlpack__()
    except (RuntimeError, TypeError, BufferError) as e:
        b = _torch_bool(obj, writable, what)
        if b is not None:
            return b
        raise ValueError(f"{what}: {type(obj).__name__} has no DLPack view ({e})") from e
    p = _capsule_ptr(cap, b"dltensor")  # DLManagedTensor* starts with its DLTensor
    t = _DLTensor.from_address(p)
    dtype = _types.dlpack_dtype(t.dtype.code, t.dtype.bits, t.dtype.lanes)
    if dtype is None:
        hint = ""
        if t.dtype.code == _DL_COMPLEX:
            hint = _COMPLEX_HINT_TORCH if "torch" in type(obj).__module__ else _COMPLEX_HINT
        raise ValueError(f"{what}: DLPack type code {t.dtype.code}, {t.dtype.bits} bits "
                         f"x{t.dtype.lanes} has no tdist dtype{hint}")
    shape = tuple(t.shape[i] for i in range(t.ndim))
    strides = None
    if t.strides:
        strides = tuple(t.strides[i] * _types.SIZE_OF[dtype] for i in range(t.ndim))
    if not _c_contiguous(shape, strides, _types.SIZE_OF[dtype]):
        raise ValueError(f"{what}: the tensor is not contiguous (call .contiguous())")
    device = t.device.device_type not in _DL_HOST_TYPES
    return Buf((t.data or 0) + t.byte_offset, _prod(shape), dtype, device, (obj, cap))


def buf(obj, writable, what):
    """The Buf of `obj`; `writable`: the op writes into it."""
    if type(obj) is _ndarray:
        return _numpy(obj, writable, what)
    try:
        cai = getattr(obj, "__cuda_array_interface__", None)
    except (KeyError, TypeError, ValueError, RuntimeError):
        cai = None  # a torch without a typestr for the dtype raises: DLPack says it below
    if cai is not None:
        b = _array_interface(obj, cai, True, writable, what)
        if b is not None:
            return b
    dl_dev = getattr(obj, "__dlpack_device__", None)
    if dl_dev is not None and hasattr(obj, "__dlpack__") and \
            dl_dev()[0] not in _DL_HOST_TYPES:
        return _dlpack(obj, writable, what)
    if _ndarray and isinstance(obj, _ndarray):
        return _numpy(obj, writable, what)
    ai = getattr(obj, "__array_interface__", None)
    if ai is not None:
        b = _array_interface(obj, ai, False, writable, what)
        if b is not None:
            return b
    b = _buffer_protocol(obj, writable, what)
    if b is not None:
        return b
    if hasattr(obj, "__dlpack__"):
        return _dlpack(obj, writable, what)
    raise ValueError(f"{what}: {type(obj).__name__} is not an array (expected the buffer "
                     "protocol, __array_interface__, __cuda_array_interface__ or __dlpack__)")
