"""bool and complex tensors given to an op (issue 41). tdist has a BOOL type (one byte,
reductions logical), but torch's DLPack export refuses bool tensors: a torch bool tensor
is taken through a uint8 view, typed BOOL, so an all_reduce of masks is a logical or and
the result stays 0/1. tdist has no complex type: a complex tensor or NumPy array is refused
with a ValueError naming the way, the interleaved real and imaginary floats
(torch.view_as_real(t), a.view(a.real.dtype)), which SUM correctly. The torch tests skip
where torch is missing (Debian's python3-torch is for /usr/bin/python3)."""
import numpy as np
import pytest

import tdist


def test_numpy_complex_refused_naming_the_float_view(rank, size):
    a = np.ones(4, np.complex64)
    with pytest.raises(ValueError, match=r"complex64.*a\.view\(a\.real\.dtype\)"):
        tdist.all_reduce(a)
    b = np.full(4, complex(rank + 1, -(rank + 1)), np.complex128)
    tdist.all_reduce(b.view(b.real.dtype))  # the named way: interleaved float64
    s = size * (size + 1) / 2
    assert (b == complex(s, -s)).all()


def test_numpy_bool_is_logical(rank, size):
    m = np.array([rank == 0, True, False, rank == size - 1], bool)
    tdist.all_reduce(m)  # SUM of BOOL: or
    assert m.dtype == bool and list(m) == [True, True, False, True]


def test_torch_bool_all_reduce_is_logical(rank, size):
    torch = pytest.importorskip("torch")
    m = torch.tensor([rank == 0, True, False, rank == size - 1])
    tdist.all_reduce(m)  # or: 0/1, never a count (a uint8 SUM would give `size`)
    assert m.dtype == torch.bool and m.tolist() == [True, True, False, True]
    assert m.view(torch.uint8).max().item() == 1
    a = torch.tensor([True, rank == 0, True])
    tdist.all_reduce(a, op=tdist.ReduceOp.PRODUCT)  # and
    assert a.tolist() == [True, size == 1, True]
    out = torch.zeros(size * 2, dtype=torch.bool)
    tdist.all_gather_into_tensor(out, torch.tensor([rank % 2 == 0, True]))
    assert out.tolist() == sum(([r % 2 == 0, True] for r in range(size)), [])


@pytest.mark.parametrize("dt", ["complex64", "complex128"])
def test_torch_complex_refused_naming_view_as_real(rank, size, dt):
    torch = pytest.importorskip("torch")
    t = torch.full((3,), complex(rank + 1, 2.0 * (rank + 1)), dtype=getattr(torch, dt))
    with pytest.raises(ValueError, match=r"torch\.view_as_real\(t\)"):
        tdist.all_reduce(t)
    with pytest.raises(ValueError, match=r"view_as_real"):
        tdist.broadcast(t, src=0)
    tdist.all_reduce(torch.view_as_real(t))  # the named way, in place
    s = size * (size + 1) / 2
    assert (t == complex(s, 2 * s)).all()
