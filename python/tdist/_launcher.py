"""Kept for ``tdist._launcher:main`` (the console script's entry before issue 41): the same
as the top-level ``_tdistrun`` module, which the console script now names so that it
does not import this package (and load libtdist.so) only to exec the launcher."""
import os
import sys


def main():
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from _tdistrun import main as run
    run()


if __name__ == "__main__":
    main()
