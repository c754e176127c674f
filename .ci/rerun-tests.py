#!/usr/bin/env python3
"""Runs again test binaries that `cargo test --workspace` built, without building anything.

    .ci/rerun-tests.py TEST... [-- ARG...]

Each TEST names a test target (tests/TEST.rs of any package of the workspace); its binary runs
from its package's directory, as `cargo test` runs it, with the ARGs (a filter, say) and the
environment of this script. Selecting the targets with `cargo test --test TEST` instead would
resolve the dev-dependencies' features anew for that selection and build much of the workspace
again (a minute and a half on two cores). Stops at the first binary that fails, with its status.
"""
import json
import os
import subprocess
import sys


def executables():
    """Each test target's name, with its binary and its package's directory."""
    listed = subprocess.run(
        ["cargo", "test", "--workspace", "--locked", "--no-run", "--message-format=json"],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    ).stdout
    found = {}
    for line in listed.splitlines():
        message = json.loads(line)
        target = message.get("target", {})
        if message.get("reason") == "compiler-artifact" and target.get("kind") == ["test"]:
            package_dir = os.path.dirname(message["manifest_path"])
            found.setdefault(target["name"], []).append((message["executable"], package_dir))
    return found


def main(argv):
    names, args = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    if not names:
        sys.exit(__doc__)
    found = executables()
    missing = [name for name in names if name not in found]
    if missing:
        sys.exit(f"no test target named {', '.join(missing)} (known: {', '.join(sorted(found))})")
    for name in names:
        for executable, package_dir in found[name]:
            print(f"     Running {name} ({executable})", flush=True)
            status = subprocess.run([executable, *args], cwd=package_dir).returncode
            if status != 0:
                print(f"FAILED: test target {name} exited with status {status}", flush=True)
                sys.exit(status)


if __name__ == "__main__":
    main(sys.argv[1:])
