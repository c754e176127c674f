#!/usr/bin/env bash
# Failover isolation in a cluster that spreads its topics over groups: three nodes with
# --cluster-data-groups 3 (each node leading one group), three `broker bench publish` runs at
# once, each on a topic of its own in a group of its own, for DURATION. A third of the way
# through, the first bench stops: in the "kill" round because the leader of its group is killed
# (kill -9; the bench stops at the first answer lost), in the "calm" round because it is
# stopped itself, so that both rounds leave the other two benches the same machine. Prints each
# bench's throughput and publish latency (p50, p99, max) per round: the benches whose groups
# kept their leader should not see the failover of another group. ROUNDS pairs of rounds,
# alternating, each on a fresh cluster.
# Every node runs on this machine (no CPU quota per node). Bounded work; stops what it started.
#
#   bench/failover-isolation.sh   # ROUNDS=3 DURATION=15 PRODUCERS=2 DEPTH=16 PARTITIONS=4
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS="${ROUNDS:-3}"
DURATION="${DURATION:-15}"
PRODUCERS="${PRODUCERS:-2}"
DEPTH="${DEPTH:-16}"
PARTITIONS="${PARTITIONS:-4}"

echo "building release binaries..." >&2
cargo build --release --locked -q -p broker-server -p broker-cli
server=target/release/broker-server
broker=target/release/broker

workdir="$(mktemp -d)"
declare -A pids=()
bench_pids=()
cleanup() {
  for pid in "${pids[@]}" "${bench_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}" "${bench_pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$workdir"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
json() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }

start_cluster() {
  local ids=(1 2 3) members="" id
  declare -gA client_ports=()
  for id in "${ids[@]}"; do
    client_ports[$id]="$(free_port)"
    members+="${members:+,}$id=127.0.0.1:$(free_port)/127.0.0.1:${client_ports[$id]}"
  done
  for id in "${ids[@]}"; do
    rm -rf "$workdir/node-$id"
    "$server" --node-id "$id" --listen "127.0.0.1:${client_ports[$id]}" \
      --data-dir "$workdir/node-$id" --cluster-members "$members" --cluster-data-groups 3 \
      --fsync batch --capacity 2147483647 --max-memory 8589934592 --log-level warn \
      >"$workdir/node-$id.out" 2>>"$workdir/node-$id.err" &
    pids[$id]=$!
  done
  BROKER_ADDR="127.0.0.1:${client_ports[1]},127.0.0.1:${client_ports[2]},127.0.0.1:${client_ports[3]}"
  export BROKER_ADDR
  # Until every group has a leader and the three leaders are three nodes.
  for _ in $(seq 1 600); do
    if $broker cluster status --json 2>/dev/null | python3 -c '
import json, sys
groups = json.load(sys.stdin).get("groups") or []
leaders = [g["leader"] for g in groups]
sys.exit(0 if len(groups) == 3 and None not in leaders and len(set(leaders)) == 3 else 1)'; then
      return 0
    fi
    sleep 0.1
  done
  echo "the groups' leaders did not spread" >&2
  exit 1
}

stop_cluster() {
  for id in "${!pids[@]}"; do kill "${pids[$id]}" 2>/dev/null || true; wait "${pids[$id]}" 2>/dev/null || true; unset "pids[$id]"; done
}

bench_topics() { # the benchmark topics, oldest first (their names end in a time)
  $broker cluster topics --json | json '"\n".join(sorted((t["topic"] for t in d["topics"] if t["topic"].startswith("bench-")), key=lambda n: int(n.split("-")[1])))'
}

round() { # kill|calm
  start_cluster
  bench_pids=()
  local index
  for index in 0 1 2; do
    $broker bench publish --producers "$PRODUCERS" --depth "$DEPTH" --partitions "$PARTITIONS" \
      --retention limits --records 1000000000 --duration "${DURATION}s" --json \
      >"$workdir/bench-$index.json" 2>"$workdir/bench-$index.err" &
    bench_pids+=($!)
    # Each bench's topic is created before the next starts, so that they spread over the groups.
    for _ in $(seq 1 100); do
      [ "$(bench_topics | grep -c .)" -gt "$index" ] && break
      sleep 0.1
    done
  done
  local first groups victim
  first="$(bench_topics | sed -n 1p)"
  groups="$($broker cluster topics --json | json '" ".join(str(t["group"]) for t in sorted(d["topics"], key=lambda t: int(t["topic"].split("-")[1])))')"
  # The comparison holds only if each bench has a group of its own, led by a node of its own.
  if [ "$(echo "$groups" | tr ' ' '\n' | sort -u | grep -c .)" != 3 ]; then
    echo "the benches' topics did not land in three groups ($groups): run again" >&2
    exit 1
  fi
  victim="$($broker cluster topics "$first" --json | json 'd["topics"][0]["leader"] or ""')"
  if [ -z "$victim" ] || [ -z "${pids[$victim]:-}" ]; then
    echo "the first bench's group has no leader known: run again" >&2
    exit 1
  fi
  sleep "$((DURATION / 3))"
  if [ "$1" = kill ]; then
    kill -9 "${pids[$victim]}" 2>/dev/null || true
    wait "${pids[$victim]}" 2>/dev/null || true
    unset "pids[$victim]"
  else
    kill "${bench_pids[0]}" 2>/dev/null || true
  fi
  for pid in "${bench_pids[@]}"; do wait "$pid" || true; done
  bench_pids=()
  for index in 0 1 2; do
    local label="bench $((index + 1))"
    [ "$index" = 0 ] && [ "$1" = kill ] && label="$label (its leader, node $victim, killed)"
    [ "$index" = 0 ] && [ "$1" = calm ] && label="$label (stopped)"
    if [ "$index" = 0 ] && [ "$1" = calm ]; then
      printf '%-7s %s\n' "$1" "$label"
    elif [ -s "$workdir/bench-$index.json" ]; then
      printf '%-7s %-44s %s\n' "$1" "$label" "$(json '"%9d records/s  p50 %7.0f us  p99 %8.0f us  max %9.0f us" % (d["records_per_sec"], d["publish_latency"]["p50_us"], d["publish_latency"]["p99_us"], d["publish_latency"]["max_us"])' <"$workdir/bench-$index.json")"
    else
      printf '%-7s %-44s %s\n' "$1" "$label" "failed: $(tail -1 "$workdir/bench-$index.err")"
    fi
  done
  echo "        (the benches' topics in groups: $groups)"
  stop_cluster
}

for _ in $(seq 1 "$ROUNDS"); do
  round calm
  round kill
done
