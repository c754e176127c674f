#!/usr/bin/env python3
"""Fails when the top-level modules of a crate import each other in a cycle.

For each crate under crates/, reads every `crate::` path in the source of each top-level module
(a file `src/<module>.rs`, or everything under `src/<module>/`) and checks that the graph of
top-level modules has no cycle: each crate's modules can be read in one direction, from the
layers at the top to those at the bottom. A path into a module (`crate::dispatch::apply_batch`)
is an edge to it; a name the crate root re-exports (`crate::Config`, from `pub use
config::Config`) is an edge to the module that defines it.
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def modules(src):
    """Top-level module name -> the files that make it up."""
    found = {}
    for path in src.iterdir():
        if path.is_file() and path.suffix == ".rs" and path.stem not in ("lib", "main"):
            found.setdefault(path.stem, []).append(path)
        elif path.is_dir():
            found.setdefault(path.name, []).extend(sorted(path.rglob("*.rs")))
    return found


def paths_after(text, prefix):
    """Every path that follows `prefix` in `text`, with `{a, b::{c, d}}` groups expanded:
    `crate::{x::y, z}` gives ["x::y", "z"]."""
    found = []
    for match in re.finditer(re.escape(prefix), text):
        found.extend(expand(text, match.end()))
    return found


def expand(text, at):
    """The paths of the use-tree starting at `text[at]`."""
    if text[at:at + 1] == "{":
        depth, end = 0, at
        while end < len(text):
            depth += {"{": 1, "}": -1}.get(text[end], 0)
            if depth == 0:
                break
            end += 1
        inner, items, depth, start = text[at + 1:end], [], 0, 0
        for i, char in enumerate(inner):
            depth += {"{": 1, "}": -1}.get(char, 0)
            if char == "," and depth == 0:
                items.append(inner[start:i])
                start = i + 1
        items.append(inner[start:])
        paths = []
        for item in (item.strip() for item in items):
            if item:
                paths.extend(expand(item, 0))
        return paths
    match = IDENT.match(text, at)
    if not match:
        return []
    head = match.group(0)
    rest = text[match.end():]
    if rest.startswith("::"):
        return [head + "::" + path for path in expand(text, match.end() + 2)]
    return [head]


def code(text):
    """`text` without its comments (doc links name items without depending on them)."""
    return re.sub(r"//[^\n]*", "", text)


def reexports(root_file, names):
    """Names the crate root re-exports -> the module they come from."""
    origin = {}
    text = code(root_file.read_text())
    for statement in re.findall(r"pub use\s+([^;]*);", text):
        for path in expand(statement.strip(), 0):
            parts = path.split("::")
            if parts[0] in names and len(parts) > 1:
                origin[parts[-1]] = parts[0]
    return origin


def cycle(graph):
    """One cycle of `graph` as a list of nodes, or None."""
    state, stack = {}, []

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
        roots = [f for f in (src / "lib.rs", src / "main.rs") if f.exists()]
        origin = {}
        for root in roots:
            origin.update(reexports(root, mods))
        graph = {name: set() for name in mods}
        for name, files in mods.items():
            for file in files:
                for path in paths_after(code(file.read_text()), "crate::"):
                    head = path.split("::")[0]
                    target = head if head in mods else origin.get(head)
                    if target and target != name:
                        graph[name].add(target)
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
