"""Element types and reductions, matched by name with the loaded library.

Enum values are read from the library (tdist_dtype_name / tdist_redop_name
for 0, 1, 2, ... until "invalid"), so nothing here repeats a C number.
Supporting a dtype or a reduction the C side adds is one line in a table
below; a line whose name the library lacks is ignored.
"""
import enum

from ._lib import C

# One line per element type: (tdist name, kind, bytes, other names of the same type).
# kind: "i" signed int, "u" unsigned int, "f" IEEE float, "bf" bfloat16, "b" bool,
# "f8e4m3"/"f8e5m2" float8. An array's type is found from (kind, bytes), from a
# NumPy-compatible dtype name (ml_dtypes' bfloat16...), or from DLPack's (code, bits).
DTYPES = [
    ("int8", "i", 1, ()),
    ("uint8", "u", 1, ()),
    ("int16", "i", 2, ()),
    ("uint16", "u", 2, ()),
    ("int32", "i", 4, ()),
    ("uint32", "u", 4, ()),
    ("int64", "i", 8, ()),
    ("uint64", "u", 8, ()),
    ("float16", "f", 2, ("half",)),
    ("bfloat16", "bf", 2, ()),
    ("float32", "f", 4, ("float",)),
    ("float64", "f", 8, ("double",)),
    ("bool", "b", 1, ()),
    ("float8_e4m3", "f8e4m3", 1, ("float8_e4m3fn",)),
    ("float8_e5m2", "f8e5m2", 1, ()),
]

# One line per reduction: (torch.distributed name, tdist name).
REDOPS = [
    ("SUM", "sum"),
    ("PRODUCT", "prod"),
    ("MIN", "min"),
    ("MAX", "max"),
    ("AVG", "avg"),
    ("PREMUL_SUM", "premul_sum"),
    ("BAND", "band"),
    ("BOR", "bor"),
    ("BXOR", "bxor"),
]

# DLPack type codes (dlpack.h DLDataTypeCode) -> kind: kDLInt 0, kDLUInt 1, kDLFloat 2,
# kDLBfloat 4, kDLBool 6, kDLFloat8_e4m3fn 10, kDLFloat8_e5m2 12. NCCL's e4m3 is the "fn"
# one (no infinities, max 448); kDLFloat8_e4m3 (8) and the fnuz codes are other formats.
DLPACK_KIND = {0: "i", 1: "u", 2: "f", 4: "bf", 6: "b", 10: "f8e4m3", 12: "f8e5m2"}

# Names array libraries give an element type that are not its tdist type: ml_dtypes (JAX,
# NumPy) calls the IEEE-like e4m3 with infinities "float8_e4m3", tdist's float8_e4m3 is
# its "float8_e4m3fn". Never matched as a library's dtype name.
_NOT_FOREIGN = {"float8_e4m3"}


def _enumerate(fn):
    out = {}
    for i in range(256):
        name = fn(i).decode()
        if name == "invalid":
            break
        out[name] = i
    return out


_lib_dtypes = _enumerate(C.dtype_name)
_lib_redops = _enumerate(C.redop_name)

# (kind, itemsize) -> tdist dtype value; name -> value; value -> name, itemsize
BY_KIND = {}
BY_NAME = {}
NAME_OF = {}
SIZE_OF = {}
for _name, _kind, _size, _aliases in DTYPES:
    if _name not in _lib_dtypes:
        continue
    _v = _lib_dtypes[_name]
    BY_KIND[(_kind, _size)] = _v
    NAME_OF[_v] = _name
    SIZE_OF[_v] = _size
    for _n in (_name,) + tuple(_aliases):
        BY_NAME[_n] = _v

# An array library's dtype name (NumPy / ml_dtypes / CuPy / JAX ``dtype.name``, torch's
# ``str(dtype)`` without "torch.") -> tdist dtype value.
FOREIGN_NAME = {_n: _v for _n, _v in BY_NAME.items() if _n not in _NOT_FOREIGN}


def dlpack_dtype(code, bits, lanes):
    """The tdist dtype value of a DLPack DLDataType, or None if tdist has none."""
    kind = DLPACK_KIND.get(code)
    if kind is None or lanes != 1 or bits % 8:
        return None
    v = BY_KIND.get((kind, bits // 8))
    return v if v is not None and SIZE_OF[v] * 8 == bits else None

ReduceOp = enum.IntEnum("ReduceOp", [(t, _lib_redops[c]) for t, c in REDOPS if c in _lib_redops],
                        module="tdist")
ReduceOp.__doc__ = ("Reductions, named as torch.distributed.ReduceOp; the values are the C "
                    "library's tdist_redop_t. PREMUL_SUM multiplies by a scalar first: pass "
                    "tdist.premul_sum(factor) as the op (ReduceOp.PREMUL_SUM alone uses 1.0).")


class _PremulSum:
    __slots__ = ("factor",)

    def __init__(self, factor):
        self.factor = float(factor)

    def __repr__(self):
        return f"tdist.premul_sum({self.factor!r})"


def premul_sum(factor):
    """The PREMUL_SUM reduction with its factor: every input is multiplied by `factor`,
    then summed (torch's ``_make_nccl_premul_sum``)."""
    if "premul_sum" not in _lib_redops:
        raise NotImplementedError("the loaded library has no premul_sum")
    return _PremulSum(factor)


def redop(op):
    """-> (C value, premul scalar or None)."""
    if type(op) is ReduceOp:
        return int(op), None
    if isinstance(op, _PremulSum):
        return int(ReduceOp.PREMUL_SUM), op.factor
    if isinstance(op, str):
        try:
            return int(ReduceOp[op.upper()]), None
        except KeyError:
            pass
    elif isinstance(op, int) and op in _lib_redops.values():
        return int(op), None
    raise ValueError(f"unknown reduction {op!r}; use tdist.ReduceOp "
                     f"({', '.join(m.name for m in ReduceOp)}) or tdist.premul_sum(factor)")
