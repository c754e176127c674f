#!/usr/bin/env python3
"""What a group commit's fsyncs cost on this disk: ROUNDS rounds of writing 4 KiB to each of N
files and calling fdatasync on each, for one file, three files one after the other, and three
files side by side (a thread each). Prints the milliseconds per round. The files are under
TMPDIR, which must be on the disk to measure (a tmpfs syncs nothing). Bounded; removes its files.

    python3 bench/fsync.py            # ROUNDS=200
"""
import os
import tempfile
import threading
import time

ROUNDS = int(os.environ.get("ROUNDS", "200"))


def per_round(files, side_by_side):
    with tempfile.TemporaryDirectory() as directory:
        fds = [os.open(os.path.join(directory, f"f{n}"), os.O_WRONLY | os.O_CREAT) for n in range(files)]
        try:
            started = time.monotonic()
            for _ in range(ROUNDS):
                for fd in fds:
                    os.write(fd, b"x" * 4096)
                if side_by_side:
                    threads = [threading.Thread(target=os.fdatasync, args=(fd,)) for fd in fds]
                    for thread in threads:
                        thread.start()
                    for thread in threads:
                        thread.join()
                else:
                    for fd in fds:
                        os.fdatasync(fd)
            return (time.monotonic() - started) / ROUNDS * 1000
        finally:
            for fd in fds:
                os.close(fd)


print(f"one file:                  {per_round(1, False):.2f} ms per round")
print(f"three files, in a row:     {per_round(3, False):.2f} ms per round")
print(f"three files, side by side: {per_round(3, True):.2f} ms per round")
