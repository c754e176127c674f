#!/usr/bin/env bash
# How much memory the server keeps once idle: RECORDS records published (the workload of
# BENCHMARKS.md's "Memory given back while idle") into a broker-server with --data-dir, then its
# RSS sampled 1, 2, 3, 5, 10 and 20 s later. Extra arguments are environment variables for the
# server, such as the allocator's options, to compare side by side:
#
#   bench/idle-memory.sh
#   bench/idle-memory.sh _RJEM_MALLOC_CONF=background_thread:false,dirty_decay_ms:10000
#
# Loopback only; a bounded amount of work; stops what it started.
set -euo pipefail
cd "$(dirname "$0")/.."

RECORDS="${RECORDS:-2000000}"
cargo build --release --locked -q -p broker-server -p broker-cli

workdir="$(mktemp -d)"
server_pid=""
cleanup() {
  if [ -n "$server_pid" ]; then
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$workdir"
}
trap cleanup EXIT

env "$@" target/release/broker-server --listen 127.0.0.1:0 --data-dir "$workdir/data" \
  --fsync batch --log-level warn >"$workdir/out" 2>"$workdir/err" &
server_pid=$!
for _ in $(seq 1 500); do grep -q '^listening on ' "$workdir/out" && break; sleep 0.01; done
grep -q '^listening on ' "$workdir/out" || { cat "$workdir/err" >&2; exit 1; }
export BROKER_ADDR="$(sed -n 's/^listening on //p' "$workdir/out")"

rss() { awk '/^VmRSS/ { printf "%.0f MiB", $2 / 1024 }' "/proc/$server_pid/status"; }
rate="$(target/release/broker bench publish --producers 2 --depth 64 --publish-batch 100 \
  --records "$RECORDS" --retention limits --json 2>/dev/null |
  python3 -c 'import json, sys; print(round(json.load(sys.stdin)["records_per_sec"]))')"
line="${*:-built-in options}: peak $(awk '/^VmHWM/ { printf "%.0f MiB", $2 / 1024 }' "/proc/$server_pid/status"), at the end $(rss)"
previous=0
for at in 1 2 3 5 10 20; do
  sleep $((at - previous))
  previous=$at
  line="$line, ${at} s $(rss)"
done
echo "$line; $rate records/s"
