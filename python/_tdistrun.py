"""The ``tdistrun`` console script of a pip-installed tdist: execs the launcher bundled in
the wheel (tdist/_native/bin/tdistrun) with the same arguments.

A top-level module of its own, not in the tdist package: importing anything under tdist
runs tdist/__init__.py, which loads libtdist.so and its types - work a launcher that
only execs another program has no use for. The package's directory is found without
running it (importlib's find_spec of a top-level package does not import it)."""
import importlib.util
import os
import sys


def main():
    spec = importlib.util.find_spec("tdist")
    locs = list(spec.submodule_search_locations or []) if spec else []
    here = locs[0] if locs else ""
    exe = os.path.join(here, "_native", "bin", "tdistrun")
    if not os.access(exe, os.X_OK):
        sys.exit(f"tdistrun: this tdist package has no bundled launcher ({exe}); "
                 "use the tdistrun of your tdist installation")
    # The bundled tdist-store sits beside it: the store spawner finds it there too.
    os.environ.setdefault("TDIST_STORE_BIN", os.path.join(here, "_native", "bin", "tdist-store"))
    os.execv(exe, [exe] + sys.argv[1:])


if __name__ == "__main__":
    main()
