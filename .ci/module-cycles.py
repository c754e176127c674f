#!/usr/bin/env python3
"""Fails when the top-level modules of a crate import each other in a cycle.

For each crate under crates/, reads every `crate::<module>` path in the source of each top-level
module (a file `src/<module>.rs`, or everything under `src/<module>/`) and checks that the graph
of top-level modules has no cycle: each crate's modules can be read in one direction, from the
layers at the top to those at the bottom. Names the crate root re-exports (`crate::Config`) are
not edges; paths into a module (`crate::dispatch::apply_batch`) are.
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
PATH = re.compile(r"\bcrate::(?:\{([^}]*)\}|([a-z_][a-z0-9_]*)::)")


def modules(src):
    """Top-level module name -> the files that make it up."""
    found = {}
    for path in src.iterdir():
        if path.is_file() and path.suffix == ".rs" and path.stem not in ("lib", "main"):
            found.setdefault(path.stem, []).append(path)
        elif path.is_dir():
            found.setdefault(path.name, []).extend(sorted(path.rglob("*.rs")))
    return found


def edges(text, names):
    """The top-level modules a source text names through `crate::`."""
    used = set()
    # `use crate::{a::x, b}` groups, and `crate::a::...` paths.
    for group, single in PATH.findall(text):
        parts = [single] if single else [p.strip().split("::")[0] for p in group.split(",")]
        used.update(part for part in parts if part in names)
    return used


def cycle(graph):
    """One cycle of `graph` as a list of nodes, or None."""
    state = {}
    stack = []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def main():
    failed = False
    for src in sorted(ROOT.glob("crates/*/src")):
        mods = modules(src)
        graph = {name: set() for name in mods}
        for name, files in mods.items():
            for file in files:
                graph[name] |= edges(file.read_text(), mods) - {name}
        found = cycle(graph)
        crate = src.parent.name
        if found:
            print(f"{crate}: modules import each other in a cycle: {' -> '.join(found)}")
            failed = True
        else:
            print(f"{crate}: {len(mods)} top-level modules, no cycle")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
