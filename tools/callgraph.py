#!/usr/bin/env python3
"""callgraph.py - the cross-file call graph of a folder of libtdist, and its loops.

Read off the objects' symbol tables (nm), like tools/check_layers.py: file A
calls file B when an undefined symbol of A.o is defined by B.o. That is every
call by name and every address taken by name (a function put in a hook table
counts for the file that names it); a call through a hook a higher file
registered is not one, which is the point: a lower file that calls up through
a hook does not make a loop.

It prints, for the files under --prefix (default cpu/, i.e. src/cpu):
  - the edges between folders (folder -> folder: calls);
  - every loop: a strongly connected component of more than one file, with
    its files;
  - a summary line: files in loops, of all files.
and exits 1 if any loop holds files of two folders (a loop that crosses the
layers of src/cpu/*/LAYER), else 0. --edges also prints every file edge.

Usage: callgraph.py [--prefix cpu/] [--edges] OBJECT...
CMake passes $<TARGET_OBJECTS:tdist_obj> (tests/CMakeLists.txt: callgraph).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_layers import nm_symbols_all  # noqa: E402  (one reading of nm for both tools)


def rel_of(path):
    """src-relative path of an object: .../src/cpu/engine/engine.c.o -> cpu/engine/engine.c"""
    p = path.replace("\\", "/")
    p = p[p.rindex("/src/") + 5:] if "/src/" in p else os.path.basename(p)
    return p[:-2] if p.endswith(".o") else p


def sccs(nodes, edges):
    """Tarjan's strongly connected components (iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                    advanced = True
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                out.append(sorted(comp))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prefix", default="cpu/", help="files under src/<prefix> (default cpu/)")
    ap.add_argument("--edges", action="store_true", help="print every file edge")
    ap.add_argument("objects", nargs="+")
    a = ap.parse_args()
    mine = {rel_of(o): o for o in a.objects if rel_of(o).startswith(a.prefix)}
    syms = nm_symbols_all(list(mine.values()))
    files = {r: syms[o] for r, o in mine.items()}
    if not files:
        print(f"callgraph: no object under src/{a.prefix}")
        return 1
    owner = {s: f for f, (d, _) in files.items() for s in d}
    edges = {}
    for f, (_, u) in files.items():
        for s in u:
            g = owner.get(s)
            if g and g != f:
                edges.setdefault(f, {}).setdefault(g, set()).add(s)

    def folder(f):
        return os.path.dirname(f[len(a.prefix):]) or "."

    if a.edges:
        for f in sorted(edges):
            for g in sorted(edges[f]):
                print(f"  {f} -> {g}: {', '.join(sorted(edges[f][g]))}")
    fe = {}
    for f in edges:
        for g, syms in edges[f].items():
            if folder(f) != folder(g):
                fe[(folder(f), folder(g))] = fe.get((folder(f), folder(g)), 0) + len(syms)
    print(f"folders of src/{a.prefix} (calls by name between them):")
    for (x, y), n in sorted(fe.items()):
        print(f"  {x} -> {y}: {n}")
    loops = [c for c in sccs(files, edges) if len(c) > 1]
    crossing = 0
    for c in loops:
        fs = sorted({folder(f) for f in c})
        tag = "CROSSES FOLDERS " + ",".join(fs) if len(fs) > 1 else "inside " + fs[0]
        crossing += len(fs) > 1
        print(f"loop of {len(c)} files ({tag}): {' '.join(c)}")
    inloops = sum(len(c) for c in loops)
    print(f"callgraph: {inloops} of {len(files)} files of src/{a.prefix} in call loops, "
          f"{len(loops)} loop(s), {crossing} crossing folders")
    return 1 if crossing else 0


if __name__ == "__main__":
    sys.exit(main())
