"""Device arrays whose __cuda_array_interface__ has no typestr for the element type.

torch gives bfloat16 and float8 CUDA tensors the typestr "<V2" / "|V1" (only a size); the
package takes the type from the object's ``dtype`` or its ``__dlpack__`` DLDataType. The
objects here are fakes with the interfaces torch, CuPy and JAX tensors have, over device
memory of the simulated GPU (libtdist_gpusim.so, loaded by ctypes from
TDIST_CUDART_LIBRARY: the same instance the NCCL backend opened). Run under
``tdistrun --backend nccl``; without the simulated GPU only the tests that look at the
element type alone (no memory, no op) run.
"""
import ctypes
import math
import os

import numpy as np
import pytest

import tdist
from tdist import _buffers, _types

_CUDART = os.environ.get("TDIST_CUDART_LIBRARY")
_on_gpusim = (os.environ.get("TDIST_BACKEND") == "nccl" and _CUDART is not None
              and "gpusim" in os.path.basename(_CUDART))
needs_gpusim = pytest.mark.skipif(not _on_gpusim, reason="needs the NCCL backend on the "
                                  "simulated GPU (TDIST_CUDART_LIBRARY=libtdist_gpusim.so)")

# DLPack (dlpack.h): DLDataTypeCode values and kDLCUDA.
KDL_BFLOAT, KDL_F8_E4M3, KDL_F8_E4M3FN, KDL_F8_E5M2, KDL_CUDA = 4, 8, 10, 12, 2


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _buffers._DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_DLTENSOR_NAME = ctypes.create_string_buffer(b"dltensor")  # outlives every capsule


class FakeDeviceArray:
    """A 1-d device array: ``__cuda_array_interface__`` saying `typestr`, and when asked
    ``__dlpack__`` (a real capsule whose DLDataType is `dl`: (code, bits)) and ``dtype``.
    The capsule has no destructor: the structs it points at live as long as this object,
    and no deleter is needed for memory the test owns."""

    def __init__(self, ptr, count, typestr, dl=None, dtype=None, cai=True):
        self._shape = (ctypes.c_int64 * 1)(count)
        self._cai = {"shape": (count,), "typestr": typestr, "data": (ptr, False),
                     "version": 3, "strides": None}
        self._dl = dl
        self._ptr = ptr
        self._has_cai = cai
        self._managed = []
        if dtype is not None:
            self.dtype = dtype

    @property
    def __cuda_array_interface__(self):
        if not self._has_cai:
            raise AttributeError("__cuda_array_interface__")
        return self._cai

    def __getattr__(self, name):
        # __dlpack__ / __dlpack_device__ only when a DLPack type was given
        if name in ("__dlpack__", "__dlpack_device__") and self.__dict__.get("_dl"):
            return getattr(self, "_" + name.strip("_"))
        raise AttributeError(name)

    def _dlpack(self, stream=None):
        m = _DLManagedTensor()
        t = m.dl_tensor
        t.data = self._ptr
        t.device.device_type, t.device.device_id = KDL_CUDA, 0
        t.ndim = 1
        t.dtype.code, t.dtype.bits, t.dtype.lanes = self._dl[0], self._dl[1], 1
        t.shape = self._shape
        self._managed.append(m)
        return _capsule_new(ctypes.addressof(m), _DLTENSOR_NAME, None)

    def _dlpack_device(self):
        return (KDL_CUDA, 0)


def _dtype_name(obj, writable=True):
    return _types.NAME_OF[_buffers.buf(obj, writable, "t").dtype]


# ---- the element type alone (no memory is touched) --------------------------------------
def test_void_typestr_type_from_dlpack():
    assert _dtype_name(FakeDeviceArray(4096, 4, "<V2", dl=(KDL_BFLOAT, 16))) == "bfloat16"
    assert _dtype_name(FakeDeviceArray(4096, 4, "|V1", dl=(KDL_F8_E4M3FN, 8))) == "float8_e4m3"
    assert _dtype_name(FakeDeviceArray(4096, 4, "|V1", dl=(KDL_F8_E5M2, 8))) == "float8_e5m2"


def test_void_typestr_type_from_dtype_attribute():
    class TorchLikeDtype:  # str(torch.bfloat16) == "torch.bfloat16"; no .name
        def __init__(self, s):
            self.s = s

        def __str__(self):
            return self.s
    for dt, want, ts in ((TorchLikeDtype("torch.bfloat16"), "bfloat16", "<V2"),
                         (TorchLikeDtype("torch.float8_e4m3fn"), "float8_e4m3", "|V1"),
                         (TorchLikeDtype("torch.float8_e5m2"), "float8_e5m2", "|V1"),
                         ("bfloat16", "bfloat16", "<V2"),
                         (np.dtype([("x", np.uint16)]), None, "<V2")):
        a = FakeDeviceArray(4096, 4, ts, dtype=dt)
        if want is None:  # a NumPy structured dtype: a size, no element type
            with pytest.raises(ValueError, match="no tdist dtype"):
                _buffers.buf(a, True, "t")
        else:
            assert _dtype_name(a) == want
    # the dtype attribute wins when it names a type; DLPack is asked only otherwise
    a = FakeDeviceArray(4096, 4, "<V2", dl=(KDL_BFLOAT, 16), dtype="not-a-type")
    assert _dtype_name(a) == "bfloat16"


def test_void_typestr_unknown_refused_naming_the_dtype():
    # torch's fnuz float8, and ml_dtypes' IEEE-like e4m3 (with infinities), are not NCCL's
    # e4m3fn even though tdist calls that one float8_e4m3
    for dt in ("torch.float8_e4m3fnuz", "float8_e4m3", "float8_e8m0fnu"):
        with pytest.raises(ValueError, match=r"all_reduce: tensor: element type '\|V1' "
                           rf"\(dtype {dt.rpartition('.')[2]}\) has no tdist dtype"):
            tdist.all_reduce(FakeDeviceArray(4096, 4, "|V1", dtype=dt))
    with pytest.raises(ValueError, match="DLPack type code 8, 8 bits"):
        tdist.all_reduce(FakeDeviceArray(4096, 4, "|V1", dl=(KDL_F8_E4M3, 8)))
    # a size that does not match the named type
    with pytest.raises(ValueError, match=r"'<V2' \(dtype float8_e5m2\)"):
        tdist.all_reduce(FakeDeviceArray(4096, 4, "<V2", dtype="float8_e5m2"))
    with pytest.raises(ValueError, match="no dtype attribute and no __dlpack__"):
        tdist.all_reduce(FakeDeviceArray(4096, 4, "<V2"))


def test_dlpack_only_device_array_float8():
    # no __cuda_array_interface__ (a JAX array): DLPack's float8 codes are known too
    a = FakeDeviceArray(4096, 4, "|V1", dl=(KDL_F8_E4M3FN, 8), cai=False)
    assert _dtype_name(a) == "float8_e4m3"
    with pytest.raises(ValueError, match="DLPack type code 8"):
        _buffers.buf(FakeDeviceArray(4096, 4, "|V1", dl=(KDL_F8_E4M3, 8), cai=False), True, "t")


# ---- all_reduce through the NCCL backend on the simulated GPU ---------------------------
class _Device:
    """cudaMalloc'd memory of the simulated GPU, filled and read back with cudaMemcpy."""

    def __init__(self):
        self.rt = ctypes.CDLL(_CUDART)
        self.rt.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
        self.rt.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                       ctypes.c_int]
        self.rt.cudaFree.argtypes = [ctypes.c_void_p]
        # this (the main) thread's current device: the one the backend uses for this rank
        assert self.rt.cudaSetDevice(int(os.environ.get("LOCAL_RANK", "0"))) == 0

    def upload(self, host):
        p = ctypes.c_void_p()
        assert self.rt.cudaMalloc(ctypes.byref(p), host.nbytes) == 0
        assert self.rt.cudaMemcpy(p, host.ctypes.data, host.nbytes, 1) == 0  # HostToDevice
        return p.value

    def download(self, ptr, like):
        out = np.empty_like(like)
        assert self.rt.cudaDeviceSynchronize() == 0
        assert self.rt.cudaMemcpy(out.ctypes.data, ptr, out.nbytes, 2) == 0  # DeviceToHost
        return out


def _bf16(values):
    # bfloat16 = the top half of a float32 (exact for these small integers)
    return (np.asarray(values, np.float32).view(np.uint32) >> 16).astype(np.uint16)


def _fp8(values, mant, bias):
    # small positive integers in e4m3fn (mant 3, bias 7) / e5m2 (mant 2, bias 15)
    out = []
    for v in values:
        e = int(math.floor(math.log2(v)))
        m = (v / 2 ** e - 1) * 2 ** mant
        assert m == int(m), v
        out.append(((e + bias) << mant) | int(m))
    return np.array(out, np.uint8)


@needs_gpusim
@pytest.mark.parametrize("case", ["bf16_dlpack", "bf16_dtype", "e4m3fn_dlpack",
                                  "e5m2_dtype", "e4m3fn_dlpack_only"])
def test_all_reduce_void_typestr(case, rank, size):
    enc = {"bf16": _bf16, "e4m3fn": lambda v: _fp8(v, 3, 7), "e5m2": lambda v: _fp8(v, 2, 15)}
    kind, how = case.split("_", 1)
    n = 6
    # rank r holds (r + 1) * [1, 2, 4, ...]: every value and the sum exact in every type
    # up to 3 ranks (e5m2 has 2 mantissa bits)
    base = [1 << (i % 3) for i in range(n)]
    mine = enc[kind]([(rank + 1) * b for b in base])
    want = enc[kind]([size * (size + 1) // 2 * b for b in base])
    dev = _Device()
    ptr = dev.upload(mine)
    ts = "<V2" if kind == "bf16" else "|V1"
    dl = {"bf16": (KDL_BFLOAT, 16), "e4m3fn": (KDL_F8_E4M3FN, 8), "e5m2": (KDL_F8_E5M2, 8)}
    names = {"bf16": "torch.bfloat16", "e4m3fn": "torch.float8_e4m3fn", "e5m2": "float8_e5m2"}
    if how == "dlpack":
        a = FakeDeviceArray(ptr, n, ts, dl=dl[kind])
    elif how == "dlpack_only":
        a = FakeDeviceArray(ptr, n, ts, dl=dl[kind], cai=False)
    else:
        a = FakeDeviceArray(ptr, n, ts, dtype=names[kind])
    try:
        tdist.all_reduce(a, async_op=True).wait()
        got = dev.download(ptr, mine)
    finally:
        dev.rt.cudaFree(ptr)
    assert (got == want).all(), (case, got, want)
