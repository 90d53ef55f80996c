#!/usr/bin/env python3
"""check_layers.py - fail when a lower layer of libtdist calls a higher one.

The layers (docs/architecture.md), bottom first; each may call only its own
layer and the ones below it:

    util      src/util/                 allocation, logging, settings, errors, lists, worker
    store     src/store/                TCP/file store, prefix views, liveness, rendezvous
    progress  src/core/{progress,wakeup}.c  the loop, the queues, pollers, tickers,
                                        the wake-up of callers driving their ops
    work      src/core/work.c           the pool, the states, waiting
    trace     src/core/trace.c          the flight recorder's ring
    group     src/core/{context,group,inflight,monitor,services}.c
    backend   src/cpu/, src/nccl/       through tdist/backend.h (and util/) only
    ops       src/core/{opcheck,ops,ops_v,mesh,shrink,notify,abi}.c
    init      src/core/{init,registry}.c  init_process_group, the backends by name

Three checks:
  0. every global symbol the library defines starts with tdist_ (public) or
     tdist__ (internal), so a static link cannot collide with user code;
  1. symbols: every undefined symbol of an object that another object of the
     library defines must come from the same layer or a lower one (nm);
     a backend may not call another backend, and calls the core only
     through the services of tdist/backend.h (tdist_backend_*) and the
     public API;
  2. includes: a file may include only headers of its layer or lower ones;
     backends include no core/ or store/ header (tdist/backend.h and util/).

Not part of libtdist: src/gpusim/ (libtdist_gpusim.so, the simulated GPU)
is a library of its own. It may include only its own headers, the CUDA/NCCL
ABI declarations it shares with the backend (nccl/nccl_api.h) and its public
header; nothing of libtdist may include it.

Usage: check_layers.py --src DIR OBJECT...   (exit 0 clean, 1 violations)
CMake passes the library's objects ($<TARGET_OBJECTS:tdist_obj>), so stale
objects left in a build tree are never read.
"""
import argparse
import os
import re
import subprocess
import sys

ORDER = ["util", "store", "progress", "work", "trace", "group", "backend", "ops", "init"]
RANK = {name: i for i, name in enumerate(ORDER)}

CORE_FILES = {
    "progress": "progress", "wakeup": "progress", "work": "work", "trace": "trace",
    "context": "group", "group": "group", "inflight": "group", "monitor": "group",
    "ops": "ops", "ops_v": "ops", "opcheck": "ops", "mesh": "ops", "shrink": "ops", "init": "init",
    "ops_int": "ops", "notify": "ops", "abi": "ops", "services": "group", "registry": "init",
    # headers
    "backend": "init",  # the registry (the contract itself is tdist/backend.h)
}


def layer_of(path):
    """Layer of a source or header path relative to src/ (e.g. core/group.c)."""
    parts = path.replace("\\", "/").split("/")
    folder, base = parts[0], os.path.splitext(os.path.splitext(parts[-1])[0])[0]
    if folder == "util":
        return "util"
    if folder == "store":
        return "store"
    if folder in ("cpu", "nccl"):
        return "backend"
    if folder == "core":
        return CORE_FILES.get(base)
    return None


def nm_symbols(obj):
    out = subprocess.run(["nm", obj], capture_output=True, text=True, check=True).stdout
    defined, undefined = set(), set()
    for line in out.splitlines():
        f = line.split()
        if len(f) == 2 and f[0] == "U":
            undefined.add(f[1])
        elif len(f) == 3 and f[1] in "TDBRCVW" and f[1].isupper():
            defined.add(f[2])
    return defined, undefined


def check_symbols(objects):
    objs = {}
    for full in objects:
        rel = full.replace("\\", "/")
        rel = rel[rel.rindex("/src/") + 5:] if "/src/" in rel else os.path.basename(rel)
        objs[rel] = full
    if not objs:
        return ["no objects given"]
    owner = {}
    info = {}
    for rel, full in objs.items():
        d, u = nm_symbols(full)
        info[rel] = (d, u)
        for s in d:
            owner[s] = rel
    bad = []
    # Hygiene: a static link must not collide with the user's symbols.
    for rel, (defined, _) in sorted(info.items()):
        for s in sorted(defined):
            if not s.startswith("tdist_"):
                bad.append(f"{rel} defines global symbol {s}: internal ones start with tdist__")
    for rel, (_, undef) in sorted(info.items()):
        me = layer_of(rel)
        if me is None:
            bad.append(f"{rel}: not assigned to a layer")
            continue
        for s in sorted(undef):
            if s not in owner:
                continue
            other = owner[s]
            them = layer_of(other)
            if them is None:
                continue
            if RANK[them] > RANK[me]:
                bad.append(f"{rel} ({me}) calls {s} of {other} ({them}), a higher layer")
            elif me == "backend" and them not in ("util", "backend") and not s.startswith(
                    "tdist_backend_") and not (s.startswith("tdist_") and not s.startswith("tdist__")):
                bad.append(f"{rel} calls {s} of {other} ({them}): a backend uses the core only "
                           f"through the services of tdist/backend.h (tdist_backend_*) and the "
                           f"public API")
            elif me == "backend" and them == "backend" and other.split("/")[0] != rel.split("/")[0]:
                bad.append(f"{rel} calls {s} of another backend ({other})")
    return bad


INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
# A backend sees the core only through the public, versioned interface
# (include/tdist/backend.h) and util/: no core/ or store/ header at all.
BACKEND_MAY_SEE = set()


def check_separate(full, rel, folder, allowed):
    """A separate library in src/<folder>: its own headers and `allowed` only."""
    text = open(full, encoding="utf-8", errors="replace").read()
    return [f"{rel} includes {inc}: {folder}/ may include only its own headers and "
            f"{', '.join(sorted(allowed))}"
            for inc in INCLUDE.findall(text)
            if "/" in inc and not inc.startswith(folder + "/") and inc not in allowed
            and os.path.exists(os.path.join(os.path.dirname(os.path.dirname(full)), inc))]


def check_includes(srcdir):
    bad = []
    for root, _, files in os.walk(srcdir):
        for name in files:
            if not name.endswith((".c", ".h")):
                continue
            full = os.path.join(root, name)
            rel = os.path.relpath(full, srcdir)
            if rel.startswith("gpusim" + os.sep):
                bad += check_separate(full, rel, "gpusim", {"nccl/nccl_api.h", "tdist/gpusim.h"})
                continue
            me = layer_of(rel)
            if me is None:
                bad.append(f"{rel}: not assigned to a layer")
                continue
            text = open(full, encoding="utf-8", errors="replace").read()
            for inc in INCLUDE.findall(text):
                if inc.startswith("gpusim/"):
                    bad.append(f"{rel} includes {inc}: the simulated GPU is not part of libtdist")
                    continue
                if inc.startswith("tdist/"):
                    continue  # the public API: anyone
                them = layer_of(inc)
                if them is None:
                    continue  # a file-local header (e.g. cpu/cpu.h is "backend")
                if me == "backend" and inc.split("/")[0] in ("core", "store"):
                    bad.append(f"{rel} includes {inc}: backends see the core only through "
                               f"tdist/backend.h (and util/)")
                elif RANK[them] > RANK[me]:
                    bad.append(f"{rel} ({me}) includes {inc} ({them}), a higher layer")
    return bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", required=True, help="the src/ directory")
    ap.add_argument("objects", nargs="+", help="the library's object files")
    a = ap.parse_args()
    bad = check_symbols(a.objects) + check_includes(a.src)
    for b in bad:
        print("layering violation:", b)
    print(f"check_layers: {len(bad)} violation(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
