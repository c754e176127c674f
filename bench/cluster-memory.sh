#!/usr/bin/env bash
# The memory of a three-node cluster's nodes while it ingests, against two builds of
# broker-server side by side. Each round, for each build (A first in odd rounds, B first in
# even ones): a fresh three-node cluster on loopback (--fsync batch, a snapshot every
# SNAPSHOT_ENTRIES entries) takes `broker bench publish` of RECORDS records of SIZE bytes in
# batches of BATCH; then each node's peak resident memory (VmHWM) and its resident memory
# once the publishing ended (VmRSS) are read. Prints per run the records per second, the
# largest peak and the largest resident memory of the three nodes (MiB), then the medians and
# B / A:
#
#   bench/cluster-memory.sh /tmp/old-target/release target/release
#   ROUNDS=3 RECORDS=2000000 bench/cluster-memory.sh A B
#
# A_DIR and B_DIR hold a broker-server binary each (build an older commit with
# `git worktree add /tmp/old COMMIT && cd /tmp/old && CARGO_TARGET_DIR=/tmp/old-target cargo
# build --release -p broker-server`). Loopback only; a bounded amount of work; stops what it
# started.
set -euo pipefail
cd "$(dirname "$0")/.."

A_DIR="${1:?usage: bench/cluster-memory.sh A_DIR B_DIR}"
B_DIR="${2:?usage: bench/cluster-memory.sh A_DIR B_DIR}"
ROUNDS="${ROUNDS:-2}"
RECORDS="${RECORDS:-1000000}"
SIZE="${SIZE:-1000}"
BATCH="${BATCH:-100}"
SNAPSHOT_ENTRIES="${SNAPSHOT_ENTRIES:-20000}"
cargo build --release --locked -q -p broker-cli
broker=target/release/broker

source "$(dirname "$0")/server.sh"
declare -A pids=()
stop_nodes() {
  for id in "${!pids[@]}"; do
    kill "${pids[$id]}" 2>/dev/null || true
    wait "${pids[$id]}" 2>/dev/null || true
    unset "pids[$id]"
  done
}
trap 'stop_nodes; cleanup' EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# Reads field $2 (VmHWM, VmRSS) of process $1 in MiB.
memory_of() { awk -v field="$2:" '$1 == field { printf "%.0f", $2 / 1024 }' "/proc/$1/status"; }

run() {
  local label="$1" dir="$2" members="" id
  rm -rf "$workdir"/node-*
  declare -A client_ports=()
  for id in 1 2 3; do
    client_ports[$id]=$(free_port)
    members+="${members:+,}$id=127.0.0.1:$(free_port)/127.0.0.1:${client_ports[$id]}"
  done
  for id in 1 2 3; do
    "$dir/broker-server" --node-id "$id" --listen "127.0.0.1:${client_ports[$id]}" \
      --data-dir "$workdir/node-$id" --cluster-members "$members" --fsync batch \
      --cluster-snapshot-entries "$SNAPSHOT_ENTRIES" --capacity 2147483647 \
      --max-memory 17179869184 --log-level warn \
      >"$workdir/node-$id.out" 2>"$workdir/node-$id.err" &
    pids[$id]=$!
  done
  BROKER_ADDR="127.0.0.1:${client_ports[1]},127.0.0.1:${client_ports[2]},127.0.0.1:${client_ports[3]}"
  export BROKER_ADDR
  local ready=""
  for _ in $(seq 1 600); do "$broker" describe >/dev/null 2>&1 && { ready=1; break; }; sleep 0.05; done
  [ -n "$ready" ] || { echo "the cluster elected no leader" >&2; exit 1; }
  "$broker" bench publish --records "$RECORDS" --size "$SIZE" --producers 2 --depth 8 \
    --publish-batch "$BATCH" --retention limits --json >"$workdir/json" 2>/dev/null
  local peak=0 resident=0 value
  for id in 1 2 3; do
    value=$(memory_of "${pids[$id]}" VmHWM); [ "$value" -gt "$peak" ] && peak=$value
    value=$(memory_of "${pids[$id]}" VmRSS); [ "$value" -gt "$resident" ] && resident=$value
  done
  stop_nodes
  python3 - "$workdir/json" "$label" "$peak" "$resident" <<'EOF' | tee -a "$workdir/rows"
import json, sys
result = json.load(open(sys.argv[1]))
print(f"{sys.argv[2]} {result['records_per_sec']:.0f} {sys.argv[3]} {sys.argv[4]}")
EOF
}

echo "build records/s peak-MiB resident-MiB (the largest of the three nodes)"
alternate_builds
print_medians "records/s" "peak MiB" "resident MiB"
