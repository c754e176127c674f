#!/usr/bin/env bash
# What many producers of large records cost the server's memory, for each --max-request-memory
# given: PRODUCERS connections each keep DEPTH publishes of SIZE-byte records in flight into a
# broker-server with --data-dir (--fsync batch, --max-memory 128 MiB, so that records waiting
# for a checkpoint are bounded the same way in every row); one fresh server per row. Prints,
# per budget, the server's peak RSS, the records and megabytes per second, and how many frames
# waited for room. Rows run in the order given, ROUNDS times over, so that they sit side by
# side:
#
#   bench/request-memory.sh                          # 16 MiB, 256 MiB (the default), 4 GiB
#   BUDGETS="16777216 4294967296" ROUNDS=3 bench/request-memory.sh
#
# Loopback only; a bounded amount of work; stops what it started.
set -euo pipefail
cd "$(dirname "$0")/.."

BUDGETS="${BUDGETS:-16777216 268435456 4294967296}"
ROUNDS="${ROUNDS:-1}"
PRODUCERS="${PRODUCERS:-64}"
DEPTH="${DEPTH:-8}"
SIZE="${SIZE:-900000}"
RECORDS="${RECORDS:-6000}"
cargo build --release --locked -q -p broker-server -p broker-cli

source "$(dirname "$0")/server.sh"

run() {
  local budget="$1"
  rm -rf "$workdir/data"
  start_server target/release/broker-server --metrics-listen 127.0.0.1:0 \
    --data-dir "$workdir/data" --fsync batch --max-memory 134217728 \
    --max-request-memory "$budget"
  local rates
  rates="$(BROKER_ADDR="$server_addr" target/release/broker bench publish --producers "$PRODUCERS" \
    --depth "$DEPTH" --size "$SIZE" --records "$RECORDS" --partitions 16 --retention limits \
    --duration 120s --json 2>/dev/null |
    python3 -c 'import json, sys; r = json.load(sys.stdin); print(round(r["records_per_sec"]), round(r["records_per_sec"] * '"$SIZE"' / 1e6))')"
  local waits
  waits="$(curl -s "$metrics_addr" | awk '/^broker_request_memory_waits_total / { print $2 }')"
  local peak
  peak="$(awk '/^VmHWM/ { printf "%.0f", $2 / 1024 }' "/proc/$server_pid/status")"
  stop_server
  set -- $rates
  echo "--max-request-memory $budget: peak RSS ${peak} MiB, $1 records/s, $2 MB/s, ${waits} waits for room"
}

for round in $(seq 1 "$ROUNDS"); do
  echo "round $round: $PRODUCERS producers x $DEPTH in flight, $SIZE-byte records, $RECORDS in all"
  for budget in $BUDGETS; do
    run "$budget"
  done
done
