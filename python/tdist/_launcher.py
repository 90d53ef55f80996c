"""The ``tdistrun`` console script of a pip-installed tdist: runs the launcher bundled in
the wheel (tdist/_native/bin/tdistrun), with the same arguments."""
import os
import sys


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    exe = os.path.join(here, "_native", "bin", "tdistrun")
    if not os.access(exe, os.X_OK):
        sys.exit(f"tdistrun: this tdist package has no bundled launcher ({exe}); "
                 "use the tdistrun of your tdist installation")
    # The bundled tdist-store sits beside it: the store spawner finds it there too.
    os.environ.setdefault("TDIST_STORE_BIN", os.path.join(here, "_native", "bin", "tdist-store"))
    os.execv(exe, [exe] + sys.argv[1:])


if __name__ == "__main__":
    main()
