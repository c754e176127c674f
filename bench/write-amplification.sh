#!/usr/bin/env bash
# Bytes written to disk per byte of payload by a broker-server with --data-dir: RECORDS records
# of SIZE bytes published (PRODUCERS connections x DEPTH requests in flight, batches of BATCH)
# into a new topic of PARTITIONS partitions with limits retention (every record is kept), once
# per --fsync policy in FSYNCS, each on a fresh server and data directory. For each: the bytes
# the server process wrote (its write_bytes: what reached the block layer, checkpoints and
# their record segments included, read from wait4 once it stopped cleanly), the bytes left in
# the data directory, both per byte of payload, and the server's CPU time per record (user and
# system, from the same wait4: start and stop included). A broker that writes each record once
# writes about as much as it keeps. Below 64 MiB of log no checkpoint runs, and the log holds
# the records alone: take enough records to cross several (the default does).
#
#   bench/write-amplification.sh                  # RECORDS=2000000 SIZE=100 FSYNCS="batch always"
#   RECORDS=500000 FSYNCS=batch bench/write-amplification.sh
#   SERVERS="/tmp/old-target/release target/release" bench/write-amplification.sh
#
# SERVERS lists directories holding a broker-server binary each (default: this checkout's
# release build): each policy is measured with each, in that order, so that two builds are
# compared side by side in one run (build an older commit with `git worktree add /tmp/old
# COMMIT && cd /tmp/old && CARGO_TARGET_DIR=/tmp/old-target cargo build --release -p
# broker-server`).
#
# The data directory is under TMPDIR, which must be on a disk (a tmpfs counts no writes).
# Loopback only; a bounded amount of work; stops what it started.
set -euo pipefail
cd "$(dirname "$0")/.."

RECORDS="${RECORDS:-2000000}"
SIZE="${SIZE:-100}"
PRODUCERS="${PRODUCERS:-2}"
DEPTH="${DEPTH:-64}"
BATCH="${BATCH:-100}"
PARTITIONS="${PARTITIONS:-2}"
FSYNCS="${FSYNCS:-batch always}"
SERVERS="${SERVERS:-target/release}"

echo "building release binaries..." >&2
cargo build --release --locked -q -p broker-server -p broker-cli
broker=target/release/broker

# $workdir, removed at exit with the server ($server_pid) if it still runs.
source "$(dirname "$0")/server.sh"
if [ "$(stat -f -c %T "$workdir")" = tmpfs ]; then
  echo "TMPDIR is a tmpfs, which counts no bytes written: set TMPDIR to a directory on a disk" >&2
  exit 1
fi

mib() { python3 -c "print(f'{$1 / 1048576:,.1f}')"; }
ratio() { python3 -c "print(f'{$1 / $2:.2f}x')"; }

payload=$((RECORDS * SIZE))
printf '%s records of %s bytes (%s MiB of payload), %s partitions, batches of %s, %s x %s in flight\n\n' \
  "$RECORDS" "$SIZE" "$(mib "$payload")" "$PARTITIONS" "$BATCH" "$PRODUCERS" "$DEPTH"
printf '| `--fsync` | server | written MiB | written / payload | kept MiB | kept / payload | written / kept | records/s | server CPU ns/record |\n'
printf '|---|---|---:|---:|---:|---:|---:|---:|---:|\n'
for fsync in $FSYNCS; do
for server_dir in $SERVERS; do
  data="$workdir/data-$fsync"
  # Started by a small launcher that reads the server's exact count of bytes written from
  # wait4 when it exits (rusage's output blocks, 512 bytes each: its write_bytes).
  rm -f "$workdir/pid" "$workdir/written" "$workdir/cpu"
  python3 -c '
import os, subprocess, sys
written, cpu, pid_file, *command = sys.argv[1:]
server = subprocess.Popen(command)
with open(pid_file + ".tmp", "w") as out:
    out.write(str(server.pid))
os.rename(pid_file + ".tmp", pid_file)
_, _, usage = os.wait4(server.pid, 0)
with open(written, "w") as out:
    out.write(str(usage.ru_oublock * 512))
with open(cpu, "w") as out:
    out.write(str(usage.ru_utime + usage.ru_stime))
' "$workdir/written" "$workdir/cpu" "$workdir/pid" "$server_dir/broker-server" --listen 127.0.0.1:0 \
    --data-dir "$data" --fsync "$fsync" --capacity 2147483647 --log-level warn \
    >"$workdir/out" 2>"$workdir/err" &
  launcher=$!
  for _ in $(seq 1 6000); do grep -q '^listening on ' "$workdir/out" && break; sleep 0.01; done
  grep -q '^listening on ' "$workdir/out" || { cat "$workdir/err" >&2; exit 1; }
  server_pid="$(cat "$workdir/pid")"
  export BROKER_ADDR="$(sed -n 's/^listening on //p' "$workdir/out")"
  "$broker" bench publish --producers "$PRODUCERS" --depth "$DEPTH" --publish-batch "$BATCH" \
    --records "$RECORDS" --size "$SIZE" --partitions "$PARTITIONS" --retention limits --keep-topic \
    --json >"$workdir/bench.json"
  # A clean stop: the server writes what it still holds, then exits.
  kill -TERM "$server_pid"
  wait "$launcher"
  server_pid=""
  written="$(cat "$workdir/written")"
  kept="$(du -sb "$data" | cut -f1)"
  cpu_ns="$(python3 -c "print(f'{$(cat "$workdir/cpu") * 1e9 / $RECORDS:,.0f}')")"
  rate="$(python3 -c "import json; print(f\"{json.load(open('$workdir/bench.json'))['records_per_sec']:,.0f}\")")"
  printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$fsync" "$server_dir" "$(mib "$written")" \
    "$(ratio "$written" "$payload")" "$(mib "$kept")" "$(ratio "$kept" "$payload")" \
    "$(ratio "$written" "$kept")" "$rate" "$cpu_ns"
  rm -rf "$data"
done
done
