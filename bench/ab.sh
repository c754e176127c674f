#!/usr/bin/env bash
# Two builds of broker-server side by side on one workload: ROUNDS rounds, each running the
# workload once against a fresh server of each build (A first in odd rounds, B first in even
# ones), with the load generator of this checkout's build. Prints per run the records or
# requests per second and the server's CPU per request (user + system time of the process over
# the run, from /proc), then the medians and B / A:
#
#   bench/ab.sh /tmp/old-target/release target/release
#   ROUNDS=7 BENCH="--producers 2 --depth 64 --publish-batch 100 --retention limits" bench/ab.sh A B
#   WORKLOAD=fetch BENCH="--producers 2 --consumers 2 --records 1000000" bench/ab.sh A B
#
# A_DIR and B_DIR hold a broker-server binary each (build an older commit with
# `git worktree add /tmp/old COMMIT && cd /tmp/old && CARGO_TARGET_DIR=/tmp/old-target cargo
# build --release -p broker-server`). SERVER_ARGS are given to both servers; with DATA=1 each
# server also gets a fresh `--data-dir` (under TMPDIR: a disk, not a tmpfs). The last column
# is the server's peak resident memory (VmHWM). Loopback only; a bounded amount of work;
# stops what it started.
#
#   DATA=1 SERVER_ARGS="--fsync batch --max-memory 16777216" \
#     BENCH="--producers 2 --publish-batch 100 --records 2000000 --retention limits" bench/ab.sh A B
set -euo pipefail
cd "$(dirname "$0")/.."

A_DIR="${1:?usage: bench/ab.sh A_DIR B_DIR}"
B_DIR="${2:?usage: bench/ab.sh A_DIR B_DIR}"
ROUNDS="${ROUNDS:-5}"
WORKLOAD="${WORKLOAD:-publish}"  # a workload of `broker bench`: publish, ack, fetch or mixed
BENCH="${BENCH:---producers 8 --depth 64 --records 1000000 --retention limits --wire}"
SERVER_ARGS="${SERVER_ARGS:---worker-threads 1}"
DATA="${DATA:-0}"
cargo build --release --locked -q -p broker-cli

source "$(dirname "$0")/server.sh"

# The CPU time of process $1 in clock ticks (user + system).
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }

run() {
  local label="$1" dir="$2" data=()
  if [ "$DATA" = 1 ]; then
    rm -rf "$workdir/data"
    data=(--data-dir "$workdir/data")
  fi
  # shellcheck disable=SC2086
  start_server "$dir/broker-server" "${data[@]}" $SERVER_ARGS
  local before after peak
  before="$(ticks "$server_pid")"
  # shellcheck disable=SC2086
  BROKER_ADDR="$server_addr" target/release/broker bench "$WORKLOAD" $BENCH --json \
    >"$workdir/json" 2>/dev/null
  after="$(ticks "$server_pid")"
  peak="$(awk '/^VmHWM/ { print $2 }' "/proc/$server_pid/status")"
  stop_server
  python3 - "$workdir/json" "$label" "$before" "$after" "$(getconf CLK_TCK)" "$peak" <<'EOF' | tee -a "$workdir/rows"
import json, sys
result = json.load(open(sys.argv[1]))
label, before, after, hz = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
rate = result["records_per_sec"]
requests = result["publish_requests"]
cpu_us = (after - before) / hz * 1e6 / requests if requests else float("nan")
print(f"{label} {rate:.0f} {cpu_us:.3f} {int(sys.argv[6]) / 1024:.1f}")
EOF
}

echo "build records/s server-CPU-µs-a-request peak-RSS-MiB"
alternate_builds
print_medians "records/s" "server CPU µs a request" "peak RSS MiB"
