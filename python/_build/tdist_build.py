"""tdist_build - the PEP 517 build backend of the tdist Python package (in-tree, no
dependencies: pip needs neither a network nor setuptools/wheel to install tdist).

``pip install ./python`` builds a wheel that carries the C library and its two
programs, built through CMake, in ``tdist/_native`` (``lib/libtdist.so.0``,
``bin/tdist-store``, ``bin/tdistrun``), with ``tdist/_install.py`` pointing the
loader there and a ``tdistrun`` console script. Where the library comes from,
first match wins (environment variable or ``--config-settings key=value``):

  TDIST_BUILD_DIR / build-dir=DIR   an existing CMake build tree of tdist: its
                                    library and programs are bundled as they are;
  TDIST_WHEEL_LIBRARY=system /      nothing is bundled: the package finds an
  library=system                    installed libtdist.so.0 (TDIST_LIBRARY, or the
                                    dynamic loader's search);
  otherwise                         CMake builds the library from the C sources next
                                    to the package (a checkout's repository root, or
                                    the sdist's csrc/) into <root>/build/pip
                                    (TDIST_CMAKE_ARGS adds configure arguments)
                                    with the private jemalloc: its source is
                                    fetched if missing (scripts/fetch-jemalloc.sh,
                                    apt-get source; apt's sources left as they
                                    are), and the build fails if it cannot be,
                                    unless jemalloc=off / TDIST_WHEEL_JEMALLOC=off;
                                    without those sources or without cmake, as
                                    "system" above, with a note.

The sdist holds the package and the C sources (csrc/), so a wheel built from it
builds the library the same way.
"""
import base64
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
PKG_ROOT = os.path.dirname(HERE)  # python/ (or the unpacked sdist)
NAME = "tdist"
# What the sdist carries of the C project: enough for CMake to build the library and
# the programs with tests, benchmarks, examples and the Python install switched off.
CSRC = ["CMakeLists.txt", "cmake", "include", "src", "tools", "scripts/fetch-jemalloc.sh"]
CMAKE_OFF = ["-DTDIST_BUILD_TESTS=OFF", "-DTDIST_BUILD_BENCH=OFF", "-DTDIST_BUILD_EXAMPLES=OFF",
             "-DTDIST_BUILD_PYTHON=OFF", "-DTDIST_BUILD_GPUSIM=OFF", "-DTDIST_BUILD_FUZZ=OFF"]


def _c_root():
    """The C project's root: the sdist's csrc/, else the checkout around python/."""
    for root in (os.path.join(PKG_ROOT, "csrc"), os.path.dirname(PKG_ROOT)):
        if os.path.isfile(os.path.join(root, "CMakeLists.txt")) and \
                os.path.isfile(os.path.join(root, "include", "tdist", "tdist.h")):
            return root
    return None


def _version():
    root = _c_root()
    path = os.path.join(root, "include", "tdist", "version.h") if root else None
    if path and os.path.isfile(path):
        text = open(path).read()
        parts = [re.search(rf"#define TDIST_VERSION_{k}\s+(\d+)", text) for k in
                 ("MAJOR", "MINOR", "PATCH")]
        if all(parts):
            return ".".join(m.group(1) for m in parts)
    pkg_info = os.path.join(PKG_ROOT, "PKG-INFO")
    if os.path.isfile(pkg_info):
        m = re.search(r"^Version: (\S+)", open(pkg_info).read(), re.M)
        if m:
            return m.group(1)
    return "0.0.0"


def _setting(config_settings, key, env):
    v = (config_settings or {}).get(key)
    return v if v not in (None, "") else os.environ.get(env) or None


def _log(msg):
    print(f"tdist_build: {msg}", file=sys.stderr, flush=True)


def _from_build_tree(build):
    """The three files of a CMake build tree (or an install prefix), or an error."""
    cands = {
        "lib": [os.path.join(build, "libtdist.so.0"), os.path.join(build, "lib", "libtdist.so.0")],
        "tdist-store": [os.path.join(build, "tools", "store", "tdist-store"),
                        os.path.join(build, "bin", "tdist-store")],
        "tdistrun": [os.path.join(build, "tools", "launcher", "tdistrun"),
                     os.path.join(build, "bin", "tdistrun")],
    }
    out = {}
    for k, paths in cands.items():
        hit = next((p for p in paths if os.path.exists(p)), None)
        if hit is None:
            raise RuntimeError(f"tdist_build: {build} has no {k} (looked for "
                               f"{', '.join(paths)}): build it first (cmake --build {build})")
        out[k] = os.path.realpath(hit)
    return out


JEMALLOC_OFF_HINT = ("or build without it (the runtime then allocates with malloc): "
                     "pip install --config-settings jemalloc=off ./python, or "
                     "TDIST_WHEEL_JEMALLOC=off")


def _jemalloc_args(root, config_settings, run=subprocess.run):
    """The CMake switch for the private jemalloc of a library built here, fetching its
    source first if it is missing. pip shows a build's output only with -v or when the
    build fails, so a library quietly built without it (CMake's AUTO) would go unnoticed:
    here it is either in (-DTDIST_WITH_JEMALLOC=ON) or left out because the user said so
    (jemalloc=off / TDIST_WHEEL_JEMALLOC=off, or TDIST_CMAKE_ARGS naming
    TDIST_WITH_JEMALLOC); otherwise the build fails saying why and what to do."""
    want = (_setting(config_settings, "jemalloc", "TDIST_WHEEL_JEMALLOC") or "on").lower()
    if want in ("off", "0", "no", "false"):
        _log("jemalloc=off: the library's runtime allocates with malloc")
        return ["-DTDIST_WITH_JEMALLOC=OFF"]
    cmake_args = os.environ.get("TDIST_CMAKE_ARGS") or ""
    if "TDIST_WITH_JEMALLOC" in cmake_args:
        return []  # the user's own choice, as CMake takes it
    if "TDIST_JEMALLOC_SOURCE_DIR" in cmake_args:
        return ["-DTDIST_WITH_JEMALLOC=ON"]  # the user's source: CMake fails if it is not
    src = os.path.join(root, "third_party", "jemalloc", "src", "configure")
    fetch = os.path.join(root, "scripts", "fetch-jemalloc.sh")
    why = ""
    if not os.path.isfile(src) and os.path.isfile(fetch):
        # scripts/deps.sh's fetch (apt-get source jemalloc), without editing apt's sources
        _log("fetching jemalloc's source: scripts/fetch-jemalloc.sh --no-apt-config")
        r = run(["bash", fetch, "--no-apt-config"], stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, text=True)
        sys.stderr.write(r.stdout or "")
        why = (r.stdout or "").strip().splitlines()[-1:] if r.returncode else ""
        why = f" ({why[0]})" if why else ""
    if not os.path.isfile(src):
        raise RuntimeError(
            f"tdist_build: jemalloc's source is not in {os.path.dirname(src)} and could not "
            f"be fetched{why}. libtdist's runtime allocates from a private jemalloc: fetch "
            f"its source with `sudo bash scripts/deps.sh` in the tdist checkout, "
            + JEMALLOC_OFF_HINT)
    return ["-DTDIST_WITH_JEMALLOC=ON"]


def _cmake_build(root, config_settings=None):
    cmake = shutil.which("cmake")
    if cmake is None:
        return None
    build = os.path.join(root, "build", "pip")
    args = [cmake, "-S", root, "-B", build, "-DCMAKE_BUILD_TYPE=Release"] + CMAKE_OFF
    args += _jemalloc_args(root, config_settings)
    if shutil.which("ninja"):
        args += ["-G", "Ninja"] if not os.path.exists(os.path.join(build, "CMakeCache.txt")) \
            else []
    args += (os.environ.get("TDIST_CMAKE_ARGS") or "").split()
    jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 2)
    _log(f"building libtdist with CMake in {build}")
    for cmd in (args, [cmake, "--build", build, "-j", jobs, "--target", "tdist", "tdist-store",
                       "tdistrun"]):
        r = subprocess.run(cmd, stdout=sys.stderr, stderr=sys.stderr)
        if r.returncode != 0:
            raise RuntimeError(f"tdist_build: {' '.join(cmd)} failed (exit {r.returncode}); "
                               "install the build dependencies (scripts/deps.sh), or use an "
                               "installed library: TDIST_WHEEL_LIBRARY=system")
    return _from_build_tree(build)


def _native(config_settings):
    """{"lib", "tdist-store", "tdistrun"} -> paths to bundle, or None (use an installed
    library)."""
    build = _setting(config_settings, "build-dir", "TDIST_BUILD_DIR")
    if build:
        return _from_build_tree(os.path.abspath(build))
    if (_setting(config_settings, "library", "TDIST_WHEEL_LIBRARY") or "") == "system":
        return None
    root = _c_root()
    if root is None:
        _log("no C sources here: the wheel finds an installed libtdist.so.0")
        return None
    files = _cmake_build(root, config_settings)
    if files is None:
        _log("no cmake: the wheel finds an installed libtdist.so.0")
    return files


def _metadata(version):
    readme = ""
    for p in (os.path.join(PKG_ROOT, "README.md"),):
        if os.path.isfile(p):
            readme = open(p).read()
    return (f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {version}\n"
            "Summary: torch.distributed-like process groups and collectives over libtdist "
            "(ctypes)\nRequires-Python: >=3.8\nLicense: see the tdist repository\n"
            "Provides-Extra: numpy\nRequires-Dist: numpy; extra == \"numpy\"\n"
            "Description-Content-Type: text/markdown\n\n" + readme)


def _tag(native):
    if native is None:
        return "py3-none-any", "true"
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return f"py3-none-{plat}", "false"


class _Wheel:
    def __init__(self, path):
        self.zf = zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED)
        self.records = []

    def add(self, arcname, data, mode=0o644):
        if isinstance(data, str):
            data = data.encode()
        zi = zipfile.ZipInfo(arcname, date_time=(2020, 1, 1, 0, 0, 0))
        zi.external_attr = (0o100000 | mode) << 16
        zi.compress_type = zipfile.ZIP_DEFLATED
        self.zf.writestr(zi, data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        self.records.append(f"{arcname},sha256={digest},{len(data)}")

    def close(self, dist_info):
        self.records.append(f"{dist_info}/RECORD,,")
        self.zf.writestr(zipfile.ZipInfo(f"{dist_info}/RECORD", date_time=(2020, 1, 1, 0, 0, 0)),
                         "\n".join(self.records) + "\n")
        self.zf.close()


# The console script's module: top-level, so that running it imports nothing of the
# package (python/_tdistrun.py says why).
SCRIPT_MODULE = "_tdistrun"


def _package_files():
    src = os.path.join(PKG_ROOT, NAME)
    for name in sorted(os.listdir(src)):
        if name.endswith(".py") and name != "_install.py":
            yield name, open(os.path.join(src, name), "rb").read()


def _write_wheel(wheel_directory, native, editable_path=None):
    version = _version()
    tag, pure = _tag(native)
    dist_info = f"{NAME}-{version}.dist-info"
    fname = f"{NAME}-{version}-{tag}.whl"
    w = _Wheel(os.path.join(wheel_directory, fname))
    if editable_path is not None:
        w.add(f"__editable__.{NAME}.pth", editable_path + "\n")
    else:
        for name, data in _package_files():
            w.add(f"{NAME}/{name}", data)
        if native is not None:
            w.add(f"{SCRIPT_MODULE}.py",
                  open(os.path.join(PKG_ROOT, f"{SCRIPT_MODULE}.py"), "rb").read())
            w.add(f"{NAME}/_native/lib/libtdist.so.0", open(native["lib"], "rb").read(), 0o755)
            for prog in ("tdist-store", "tdistrun"):
                w.add(f"{NAME}/_native/bin/{prog}", open(native[prog], "rb").read(), 0o755)
            w.add(f"{NAME}/_install.py",
                  "# Written by the wheel build (python/_build/tdist_build.py): the bundled "
                  "library's directory, relative to this package.\nLIBDIR_REL = \"_native/lib\"\n")
    w.add(f"{dist_info}/METADATA", _metadata(version))
    w.add(f"{dist_info}/WHEEL", f"Wheel-Version: 1.0\nGenerator: tdist_build\n"
                                f"Root-Is-Purelib: {pure}\nTag: {tag}\n")
    if native is not None and editable_path is None:
        w.add(f"{dist_info}/entry_points.txt",
              f"[console_scripts]\ntdistrun = {SCRIPT_MODULE}:main\n")
    top = f"{NAME}\n{SCRIPT_MODULE}\n" if native is not None and editable_path is None \
        else f"{NAME}\n"
    w.add(f"{dist_info}/top_level.txt", top)
    w.close(dist_info)
    return fname


# ---- PEP 517 / 660 hooks --------------------------------------------------------------------
def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _write_wheel(wheel_directory, _native(config_settings))


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    """``pip install -e ./python``: a .pth naming python/; the package then loads the
    library as a source checkout does (TDIST_LIBRARY, else the build tree)."""
    return _write_wheel(wheel_directory, None, editable_path=PKG_ROOT)


def build_sdist(sdist_directory, config_settings=None):
    version = _version()
    base = f"{NAME}-{version}"
    fname = f"{base}.tar.gz"
    root = _c_root()

    def skip(ti):
        n = os.path.basename(ti.name)
        return None if n == "__pycache__" or n.endswith(".pyc") or n == "_install.py" else ti
    with tarfile.open(os.path.join(sdist_directory, fname), "w:gz") as tf:
        for name in ("pyproject.toml", "README.md", "_build", NAME, f"{SCRIPT_MODULE}.py"):
            p = os.path.join(PKG_ROOT, name)
            if os.path.exists(p):
                tf.add(p, f"{base}/{name}", filter=skip)
        if root is not None:
            for name in CSRC:
                tf.add(os.path.join(root, name), f"{base}/csrc/{name}", filter=skip)
        info = _metadata(version).encode()
        ti = tarfile.TarInfo(f"{base}/PKG-INFO")
        ti.size, ti.mtime = len(info), int(time.time())
        tf.addfile(ti, io.BytesIO(info))
    return fname


if __name__ == "__main__":  # python3 _build/tdist_build.py DIR: build a wheel by hand
    out = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()
    print(os.path.join(out, build_wheel(out)))
