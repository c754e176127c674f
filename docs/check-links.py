#!/usr/bin/env python3
"""Fails on a broken link in the project's Markdown: README.md, CONTRIBUTING.md, proto.md,
BENCHMARKS.md and the book under docs/. Checks every relative link (the file exists; its
#anchor is a heading of that file, as GitHub and mdBook name headings) and every mdBook
`{{#include}}` (the file exists; its anchor is marked in it). Links to web addresses are not
followed.

    python3 docs/check-links.py
"""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
INCLUDE = re.compile(r"\{\{#include ([^}:]+)(?::([A-Za-z0-9_]+))?\}\}")


def prose(path):
    """The lines of `path` outside code fences, with inline code removed."""
    fenced = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            yield re.sub(r"`[^`]*`", "", line)


def slug(heading):
    """The anchor GitHub and mdBook give a heading."""
    text = re.sub(r"`", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path, seen=None):
    """The anchors of `path`'s headings, those of the files it includes too."""
    seen = seen or set()
    if path in seen:
        return set()
    seen.add(path)
    found = set()
    for line in prose(path):
        heading = re.match(r"^#{1,6} (.*)$", line)
        if heading:
            found.add(slug(heading.group(1)))
        for include in INCLUDE.finditer(line):
            target = (path.parent / include.group(1)).resolve()
            if target.exists():
                found |= anchors(target, seen)
    return found


def check_links(path, lines, base):
    """The broken links of `lines` (of `path`), resolved from the file `base`."""
    errors = []
    for line in lines:
        for link in LINK.finditer(line):
            target = link.group(1)
            if re.match(r"^[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            resolved = (base.parent / file).resolve() if file else base
            where = f"{path}" if base == path else f"{path}, as included in {base}"
            if not resolved.exists():
                errors.append(f"{where}: links to {target}, which does not exist")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                errors.append(f"{where}: links to {target}, a heading {resolved.name} lacks")
    return errors


def region(path, anchor):
    """The prose lines of `path` between its ANCHOR and ANCHOR_END markers named `anchor`."""
    inside = False
    for line in prose(path):
        if f"ANCHOR_END: {anchor}" in line:
            inside = False
        elif f"ANCHOR: {anchor}" in line:
            inside = True
        elif inside:
            yield line


def check(path):
    lines = list(prose(path))
    errors = check_links(path, lines, path)
    for line in lines:
        for include in INCLUDE.finditer(line):
            target = (path.parent / include.group(1)).resolve()
            anchor = include.group(2)
            if not target.exists():
                errors.append(f"{path}: includes {include.group(1)}, which does not exist")
            elif anchor and f"ANCHOR: {anchor}" not in target.read_text():
                errors.append(f"{path}: includes anchor {anchor} that {target} lacks")
            else:
                # Included text is read from the including page: its links must resolve there.
                included = region(target, anchor) if anchor else prose(target)
                errors += check_links(target, list(included), path)
    return errors


def main():
    files = [ROOT / name for name in ("README.md", "CONTRIBUTING.md", "proto.md", "BENCHMARKS.md")]
    files += sorted((ROOT / "docs").rglob("*.md"))
    errors = [error for path in files for error in check(path)]
    for error in errors:
        print(error, file=sys.stderr)
    if errors:
        sys.exit(f"{len(errors)} broken links")
    print(f"links checked in {len(files)} files")


if __name__ == "__main__":
    main()
