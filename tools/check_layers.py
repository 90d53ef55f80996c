#!/usr/bin/env python3
"""check_layers.py - fail when a lower layer of libtdist calls a higher one.

The layers are read off the tree, not listed here: every folder of src/ that
starts a layer holds a file LAYER with one line

    <rank> <name> [isolated] [sees=<name>,...] [separate] [may-include=<header>,...]

and each source or header belongs to the layer of the nearest LAYER file
above it. A layer may call and include its own rank and lower ranks:

    isolated      folders of this layer may not call or include each other
                  (two backends);
    sees=a,b      it may include only the headers of the layers named (and its
                  own folder's and the public tdist/ ones), and call into other
                  layers only their public tdist_* functions, unless the layer
                  is named (a backend sees the bottom layer and the services
                  of tdist/backend.h);
    separate      not part of libtdist (its own library): it may include only
                  its own headers and those in may-include=, and nothing of
                  libtdist may include it.

So a new layer folder, or a third backend, is a folder with a LAYER file;
this script does not change (docs/architecture.md has the tree).

Sub-layers: a LAYER file in a folder below another layer's folder (src/cpu/
engine/LAYER inside src/cpu/LAYER's backend) makes a sub-layer of it. Seen
from outside, a sub-layer is its enclosing layer (the rules above apply to
that one). Inside, its rank orders it against its siblings only: a sub-layer
may call and include its own folder and lower-ranked siblings, never a
higher or equal-ranked sibling nor the files directly in the enclosing folder
(the layer's entry, which sits above all its sub-layers and may use them
all). One level of nesting.

Three checks:
  0. every global symbol the library defines starts with tdist_ (public) or
     tdist__ (internal), so a static link cannot collide with user code;
  1. symbols: every undefined symbol of an object that another object of the
     library defines must come from the same layer or a lower one (nm), and
     obey isolated and sees=;
  2. includes: a file may include only headers of its layer or lower ones,
     and obeys isolated, sees= and separate.

Usage: check_layers.py --src DIR OBJECT...   (exit 0 clean, 1 violations)
CMake passes the library's objects ($<TARGET_OBJECTS:tdist_obj>), so stale
objects left in a build tree are never read.
"""
import argparse
import os
import re
import subprocess
import sys


class Layer:
    def __init__(self, folder, line):
        f = line.split()
        self.folder, self.rank, self.name = folder, int(f[0]), f[1]
        flags = dict((x.split("=", 1) + [""])[:2] for x in f[2:])
        self.isolated = "isolated" in flags
        self.separate = "separate" in flags
        self.sees = set(filter(None, flags.get("sees", "").split(","))) if "sees" in flags else None
        self.may_include = set(filter(None, flags.get("may-include", "").split(",")))
        self.parent = None  # the enclosing layer of a sub-layer (read_layers)

    def __repr__(self):
        return f"{self.name} ({self.folder}/)"


def read_layers(srcdir):
    """{folder relative to src/: Layer} for every LAYER file."""
    layers = {}
    for root, _, files in os.walk(srcdir):
        if "LAYER" in files:
            rel = os.path.relpath(root, srcdir).replace("\\", "/")
            with open(os.path.join(root, "LAYER"), encoding="utf-8") as f:
                lines = [x for x in f.read().splitlines() if x.strip() and not x.startswith("#")]
            if len(lines) != 1:
                raise SystemExit(f"{rel}/LAYER: one line expected")
            layers[rel] = Layer(rel, lines[0])
    for rel, l in layers.items():
        d = os.path.dirname(rel)
        while d and d not in layers:
            d = os.path.dirname(d)
        if d:
            l.parent = layers[d]
            if l.parent.parent is not None:
                raise SystemExit(f"{rel}/LAYER: sub-layers nest one level deep")
    return layers


def top(layer):
    return layer.parent or layer


def check_sub(me, them, what):
    """me and them share an enclosing layer: the violation of me using them, or None."""
    if me is them or me is top(me):
        return None  # its own folder, or the entry, which uses every sub-layer
    if them is top(them):
        return f"{what} of the entry of {them.folder}/, above its sub-layer {me.name}"
    if them.rank >= me.rank:
        return (f"{what} ({them.name}, sub-layer {them.rank}) from sub-layer {me.name} "
                f"({me.rank}): only lower sub-layers, else a hook the higher one registered")
    return None


def layer_of(layers, path):
    """The Layer of a path relative to src/ (a/b/file.c), or None."""
    d = os.path.dirname(path.replace("\\", "/"))
    while True:
        if d in layers:
            return layers[d]
        if not d:
            return None
        d = os.path.dirname(d)


def nm_symbols_all(objects):
    """{object: (defined, undefined) global symbols}, from one run of nm for
    all of them: one process per object cost the layering tests most of
    their time (23 runs of nm, 0.1 s each on a loaded 2-core machine, four
    times over in layers_inject.py, whose 60 s it reached under stress-ng)."""
    res = {o: (set(), set()) for o in objects}
    if not objects:
        return res
    out = subprocess.run(["nm", "--print-file-name"] + list(objects), capture_output=True,
                         text=True, check=True).stdout
    cur = None
    for line in out.splitlines():
        # "path:value T name" or "path:                 U name", in the
        # order of the arguments.
        if cur is None or not line.startswith(cur + ":"):
            cur = next((o for o in objects if line.startswith(o + ":")), None)
            if cur is None:
                continue
        f = line[len(cur) + 1:].split()
        defined, undefined = res[cur]
        if len(f) == 2 and f[0] == "U":
            undefined.add(f[1])
        elif len(f) == 3 and f[1] in "TDBRCVW" and f[1].isupper():
            defined.add(f[2])
    return res


def is_public(sym):
    return sym.startswith("tdist_") and not sym.startswith("tdist__")


def check_call(me, them, rel, other, sym):
    """The violation of `rel` (layer me) calling `sym` of `other` (them), or None."""
    if top(me) is top(them):
        v = check_sub(me, them, f"calls {sym} of {other}")
        return f"{rel} {v}" if v else None
    me, them = top(me), top(them)
    if them.rank > me.rank:
        return f"{rel} ({me.name}) calls {sym} of {other} ({them.name}), a higher layer"
    if them is me:
        return None
    if me.isolated and them.name == me.name:
        return f"{rel} calls {sym} of {other}: {me.name} folders may not call each other"
    if me.sees is not None and them.name not in me.sees and not is_public(sym):
        return (f"{rel} calls {sym} of {other} ({them.name}): {me.name} may call only "
                f"{', '.join(sorted(me.sees))} and the public tdist_* functions")
    return None


def check_symbols(layers, objects):
    objs = {}
    for full in objects:
        rel = full.replace("\\", "/")
        rel = rel[rel.rindex("/src/") + 5:] if "/src/" in rel else os.path.basename(rel)
        objs[rel] = full
    if not objs:
        return ["no objects given"]
    owner, info, bad = {}, {}, []
    syms = nm_symbols_all(list(objs.values()))
    for rel, full in objs.items():
        d, u = syms[full]
        info[rel] = (d, u)
        for s in d:
            owner[s] = rel
    # Hygiene: a static link must not collide with the user's symbols.
    for rel, (defined, _) in sorted(info.items()):
        bad += [f"{rel} defines global symbol {s}: internal ones start with tdist__"
                for s in sorted(defined) if not s.startswith("tdist_")]
    for rel, (_, undef) in sorted(info.items()):
        me = layer_of(layers, re.sub(r"\.o$", "", rel))
        if me is None:
            bad.append(f"{rel}: not in any layer (no LAYER file above it)")
            continue
        for s in sorted(undef):
            other = owner.get(s)
            them = layer_of(layers, re.sub(r"\.o$", "", other)) if other else None
            if them is not None:
                v = check_call(me, them, rel, other, s)
                if v:
                    bad.append(v)
    return bad


INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def check_include(layers, srcdir, rel, me, inc):
    """The violation of file `rel` (layer me) including "inc", or None."""
    if inc.startswith("tdist/") and not me.separate:
        return None  # the public API: anyone
    if not os.path.exists(os.path.join(srcdir, inc)):
        return None  # a system or build-tree header
    them = layer_of(layers, inc)
    if them is None:
        return f"{rel} includes {inc}, which is in no layer"
    if top(me) is top(them) and not me.separate:
        v = check_sub(me, them, f"includes {inc}")
        return f"{rel} {v}" if v else None
    me, them = top(me), top(them)
    if me.separate:
        if them is me or inc in me.may_include:
            return None
        return (f"{rel} includes {inc}: {me.folder}/ may include only its own headers and "
                f"{', '.join(sorted(me.may_include))}")
    if them.separate:
        return f"{rel} includes {inc}: {them.folder}/ is not part of libtdist"
    if them.rank > me.rank:
        return f"{rel} ({me.name}) includes {inc} ({them.name}), a higher layer"
    if them is me:
        return None
    if me.isolated and them.name == me.name:
        return f"{rel} includes {inc}: {me.name} folders may not include each other"
    if me.sees is not None and them.name not in me.sees:
        return (f"{rel} includes {inc}: {me.name} sees only "
                f"{', '.join(sorted(me.sees))} and the public tdist/ headers")
    return None


def check_includes(layers, srcdir):
    bad = []
    for root, _, files in os.walk(srcdir):
        for name in sorted(files):
            if not name.endswith((".c", ".h")):
                continue
            full = os.path.join(root, name)
            rel = os.path.relpath(full, srcdir).replace("\\", "/")
            me = layer_of(layers, rel)
            if me is None:
                bad.append(f"{rel}: not in any layer (no LAYER file above it)")
                continue
            text = open(full, encoding="utf-8", errors="replace").read()
            for inc in INCLUDE.findall(text):
                # the public headers live in include/, next to src/
                if inc.startswith("tdist/") and me.separate and inc in me.may_include:
                    continue
                v = check_include(layers, srcdir, rel, me, inc)
                if v:
                    bad.append(v)
    return bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", required=True, help="the src/ directory")
    ap.add_argument("objects", nargs="+", help="the library's object files")
    a = ap.parse_args()
    layers = read_layers(a.src)
    bad = check_symbols(layers, a.objects) + check_includes(layers, a.src)
    for b in bad:
        print("layering violation:", b)
    print(f"check_layers: {len(layers)} layer folders, {len(bad)} violation(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
