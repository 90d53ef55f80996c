#!/usr/bin/env python3
"""layers_inject.py - tools/check_layers.py catches a sub-layer going up.

The layering test runs check_layers.py on the real tree and expects it clean;
this one proves the sub-layer rule can fail: on a copy of src/ it injects, one
at a time, uses of a higher sub-layer of the CPU backend and expects
check_layers.py to refuse each, naming the file:
  1. a transport file (src/cpu/transport/io.c) includes the engine's header;
  2. an engine file (src/cpu/engine/engine.c) includes the shared segment's;
  3. a base file (src/cpu/base/lock.c) includes the entry's cpu.h.
It also checks the unmodified copy passes, so a failure is the injection's.

Usage: layers_inject.py CHECK_LAYERS SRC_DIR OBJECT...
"""
import os
import shutil
import subprocess
import sys
import tempfile

CASES = [
    ("cpu/transport/io.c", "cpu/engine/engine.h"),
    ("cpu/engine/engine.c", "cpu/segment/sc.h"),
    ("cpu/base/lock.c", "cpu/cpu.h"),
]


def run(check, src, objs):
    p = subprocess.run([sys.executable, check, "--src", src] + objs, capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def main():
    check, src, objs = sys.argv[1], sys.argv[2], sys.argv[3:]
    # The injections are includes of src/cpu: its objects suffice for the
    # symbol half of the check, and keep each run short.
    objs = [o for o in objs if "/src/cpu/" in o.replace("\\", "/")] or objs
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        copy = os.path.join(tmp, "src")
        shutil.copytree(src, copy)
        rc, out = run(check, copy, objs)
        if rc != 0:
            print("FAIL: the unmodified copy does not pass:\n" + out)
            return 1
        for path, inc in CASES:
            f = os.path.join(copy, path)
            orig = open(f, encoding="utf-8").read()
            open(f, "w", encoding="utf-8").write(f'#include "{inc}"\n' + orig)
            rc, out = run(check, copy, objs)
            open(f, "w", encoding="utf-8").write(orig)
            want = f"{path} includes {inc}"
            if rc == 1 and want in out:
                print(f"ok: {path} including {inc} refused")
            else:
                print(f"FAIL: {path} including {inc}: rc {rc}, no '{want}' in:\n{out}")
                bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
