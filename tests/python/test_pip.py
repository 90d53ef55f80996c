"""pip install of the package into a fresh venv, offline, then a 4-rank NumPy program under
the venv's tdistrun, from outside the source tree: the installed package must find its own
library (bundled in the wheel), not the checkout's. The wheel bundles the library of this
build tree (TDIST_BUILD_DIR), so no CMake build runs here; the backend's other two modes
(CMake, an installed library) and the sdist are checked through the backend directly."""
import os
import subprocess
import sys
import tarfile
import zipfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
PKG = os.path.join(REPO, "python")

PROG = r'''
import os, sys
import numpy as np
import tdist
lib = os.path.realpath(tdist.library_path)
assert lib.startswith(os.path.realpath(sys.prefix)), f"library outside the venv: {lib}"
assert os.path.realpath(os.path.dirname(tdist.__file__)).startswith(os.path.realpath(sys.prefix))
tdist.init_process_group()
r, n = tdist.get_rank(), tdist.get_world_size()
x = np.full(1000, r + 1.0)
tdist.all_reduce(x)
assert (x == n * (n + 1) / 2).all()
out = np.zeros(n, np.int64)
tdist.all_gather_into_tensor(out, np.array([r * r], np.int64))
assert list(out) == [i * i for i in range(n)]
fut = tdist.all_reduce(np.ones(4, np.float32), async_op=True).get_future()
assert (fut.wait()[0] == n).all()
tdist.destroy_process_group()
print(f"rank {r} of {n}: OK", flush=True)
'''


# The tdistrun console script's entry (from the wheel's entry_points.txt), with os.execv
# replaced: what it would exec, which tdist modules it imported, whether libtdist is mapped.
SCRIPT_PROBE = r'''
import importlib, os, sys
dist = [p for p in sys.path if p.endswith("site-packages") and
        os.path.isdir(os.path.join(p, "tdist"))][0]
ep = [d for d in os.listdir(dist) if d.startswith("tdist-") and d.endswith(".dist-info")][0]
text = open(os.path.join(dist, ep, "entry_points.txt")).read()
mod, fn = text.split("tdistrun = ", 1)[1].split()[0].split(":")
def fake_execv(path, argv):
    print("exec", os.path.basename(path))
    print("modules:", *sorted(m for m in sys.modules if m == "tdist" or m.startswith("tdist.")))
    maps = open("/proc/self/maps").read()
    print("libtdist:", "yes" if "libtdist" in maps else "no")
    sys.exit(0)
os.execv = fake_execv
getattr(importlib.import_module(mod), fn)()
'''


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "TDIST_LIBRARY", "GLIBC_TUNABLES", "TDIST_PY_REEXEC",
                        "VIRTUAL_ENV", "TDIST_PYTEST_WORLD", "TDIST_BUILD_DIR")
           and not k.startswith(("PIP_", "PYTEST"))}
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INDEX="1", PIP_NO_CACHE_DIR="1")
    env.update(extra)
    return env


def test_pip_install_in_a_fresh_venv_then_tdistrun_4_ranks(tmp_path):
    build = os.environ.get("TDIST_BUILD_DIR")
    if not build:
        pytest.skip("TDIST_BUILD_DIR (the CMake build tree to bundle) is not set")
    venv = tmp_path / "venv"
    # --system-site-packages: NumPy comes from the system (there is no index to get it from)
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True, timeout=120)
    py, tdistrun = str(venv / "bin" / "python"), str(venv / "bin" / "tdistrun")
    # Plain pip: build isolation on, no index: the backend needs nothing to be downloaded.
    r = subprocess.run([py, "-m", "pip", "install", "--no-index", PKG],
                       env=clean_env(TDIST_BUILD_DIR=build), cwd=str(tmp_path),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    # The console script imports nothing of the package (no libtdist.so loaded) before it
    # execs the bundled launcher: run its entry with execv replaced by a report.
    r = subprocess.run([py, "-c", SCRIPT_PROBE], env=clean_env(), cwd=str(tmp_path),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.split() == ["exec", "tdistrun", "modules:", "libtdist:", "no"], r.stdout
    (tmp_path / "prog.py").write_text(PROG)
    r = subprocess.run([tdistrun, "-n", "4", "--backend", "cpu", py, "prog.py"],
                       env=clean_env(TDIST_TIMEOUT_MS="60000"), cwd=str(tmp_path),
                       capture_output=True, text=True, timeout=180)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    for i in range(4):
        assert f"rank {i} of 4: OK" in out, out


def _backend():
    sys.path.insert(0, os.path.join(PKG, "_build"))
    try:
        import tdist_build
    finally:
        sys.path.pop(0)
    return tdist_build


def test_wheel_for_an_installed_library_and_the_sdist(tmp_path, monkeypatch):
    b = _backend()
    monkeypatch.delenv("TDIST_BUILD_DIR", raising=False)
    name = b.build_wheel(str(tmp_path), {"library": "system"})
    assert name.endswith("-py3-none-any.whl")
    with zipfile.ZipFile(tmp_path / name) as z:
        names = z.namelist()
    assert "tdist/__init__.py" in names and not any("_native" in n for n in names)
    assert not any(n.endswith("_install.py") for n in names)  # finds an installed library
    sd = b.build_sdist(str(tmp_path))
    with tarfile.open(tmp_path / sd) as t:
        names = t.getnames()
    base = sd[:-len(".tar.gz")]
    for need in ("pyproject.toml", "_build/tdist_build.py", "tdist/_lib.py", "PKG-INFO",
                 "_tdistrun.py", "csrc/scripts/fetch-jemalloc.sh",
                 "csrc/CMakeLists.txt", "csrc/include/tdist/tdist.h", "csrc/src/core/ops/notify.c",
                 "csrc/tools/launcher/main.c"):
        assert f"{base}/{need}" in names, need


def test_jemalloc_fetched_or_the_build_fails_saying_so(tmp_path, monkeypatch, capfd):
    """pip hides a successful build's output: a library built without its jemalloc must not
    pass unnoticed. The backend runs scripts/fetch-jemalloc.sh --no-apt-config when the
    source is missing (here a stand-in script: no network), and fails naming the ways out
    when that does not bring it; jemalloc=off builds without, on purpose."""
    b = _backend()
    monkeypatch.delenv("TDIST_CMAKE_ARGS", raising=False)
    monkeypatch.delenv("TDIST_WHEEL_JEMALLOC", raising=False)

    def root_with(script):
        root = tmp_path / f"root{len(list(tmp_path.iterdir()))}"
        (root / "scripts").mkdir(parents=True)
        (root / "scripts" / "fetch-jemalloc.sh").write_text(script)
        return root

    # A fetch that works: called with --no-apt-config, then the source is there.
    ok = root_with('cd "$(dirname "$0")/.." && echo "$@" > fetch-args && '
                   'mkdir -p third_party/jemalloc/src && touch third_party/jemalloc/src/configure\n')
    assert b._jemalloc_args(str(ok), {}) == ["-DTDIST_WITH_JEMALLOC=ON"]
    assert (ok / "fetch-args").read_text().split() == ["--no-apt-config"]
    assert b._jemalloc_args(str(ok), {}) == ["-DTDIST_WITH_JEMALLOC=ON"]  # fetched before

    # A fetch that fails (no deb-src entry, offline...): the build fails, saying why and how.
    bad = root_with('echo "tdist: apt has no deb-src entry" >&2; exit 1\n')
    with pytest.raises(RuntimeError) as e:
        b._jemalloc_args(str(bad), {})
    msg = str(e.value)
    for need in ("apt has no deb-src entry", "scripts/deps.sh", "jemalloc=off",
                 "TDIST_WHEEL_JEMALLOC=off"):
        assert need in msg, msg
    # No fetch script at all (an unpacked wheel source without it): the same failure.
    with pytest.raises(RuntimeError, match="jemalloc=off"):
        b._jemalloc_args(str(tmp_path / "nothing"), {})

    # Said off: built without, on purpose (config setting or environment), no fetch.
    assert b._jemalloc_args(str(bad), {"jemalloc": "off"}) == ["-DTDIST_WITH_JEMALLOC=OFF"]
    monkeypatch.setenv("TDIST_WHEEL_JEMALLOC", "off")
    assert b._jemalloc_args(str(bad), {}) == ["-DTDIST_WITH_JEMALLOC=OFF"]
    monkeypatch.delenv("TDIST_WHEEL_JEMALLOC")
    # The user's own CMake switch is left to CMake.
    monkeypatch.setenv("TDIST_CMAKE_ARGS", "-DTDIST_WITH_JEMALLOC=AUTO")
    assert b._jemalloc_args(str(bad), {}) == []
