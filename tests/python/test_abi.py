"""The mirrored C structs are checked against the library at import, and an installed
package never looks in build folders."""
import ctypes
import os

import pytest

from tdist import _lib


def test_layout_matches_the_library():
    _lib._check_abi()  # what import did: passes
    off, size = ctypes.c_size_t(), ctypes.c_size_t()
    assert _lib.C.abi_field(b"tdist_op_opts_t", b"tag", ctypes.byref(off),
                            ctypes.byref(size)) == 0
    assert (off.value, size.value) == (_lib.OpOpts.tag.offset, _lib.OpOpts.tag.size)
    assert _lib.C.abi_field(b"tdist_op_opts_t", b"nope", None, None) == -17


def test_a_mismatch_is_an_import_error(monkeypatch):
    class Wrong(ctypes.Structure):  # tag and stream swapped
        _fields_ = [("mask", ctypes.c_uint64), ("timeout_ms", ctypes.c_int64),
                    ("premul_scalar", ctypes.c_double), ("tag", ctypes.c_int),
                    ("stream", ctypes.c_void_p)]
    monkeypatch.setattr(_lib, "_ABI_STRUCTS", [(Wrong, "tdist_op_opts_t")])
    with pytest.raises(ImportError, match=r"tdist_op_opts_t\.(stream|tag): offset"):
        _lib._check_abi()
    monkeypatch.setattr(_lib, "_ABI_STRUCTS", [])
    monkeypatch.setattr(_lib, "_ABI_CONSTANTS", {"TDIST_OP_FIELD_TAG": 16})
    with pytest.raises(ImportError, match="TDIST_OP_FIELD_TAG = 8 in the library, 16 here"):
        _lib._check_abi()


def test_installed_package_does_not_scan_build_folders(monkeypatch, tmp_path):
    monkeypatch.delenv("TDIST_LIBRARY", raising=False)
    # a package directory outside a checkout (site-packages-like), with a build/ beside it
    pkg = tmp_path / "lib" / "site-packages" / "tdist"
    pkg.mkdir(parents=True)
    (tmp_path / "lib" / "build" / "release").mkdir(parents=True)
    monkeypatch.setattr(_lib, "_PKG_DIR", str(pkg))
    assert list(_lib._candidates()) == [_lib._SONAME]
    # a source checkout does scan its build tree
    monkeypatch.setattr(_lib, "_PKG_DIR", os.path.dirname(os.path.abspath(_lib.__file__)))
    if _lib._in_source_checkout():
        assert any("build" in c for c in _lib._candidates())
