#!/usr/bin/env bash
# A three-node cluster against a single broker, in one run, on loopback:
#  - pipelined publishes (PRODUCERS connections x DEPTH requests in flight, RECORDS records of
#    SIZE bytes, one record per request) through the typed client: a single broker with
#    --data-dir, then a three-node cluster, each with --fsync always and with --fsync batch;
#    throughput and p50/p99 of one publish, and the cluster's ratio to the single broker;
#  - then KILLS failovers: the leader is killed with kill -9 and the time until a publish
#    through a client given every node's address is stored again is measured (then the killed
#    node is started again from its directory and the next round waits until it is back);
#  - then TRANSFERS hand-overs: `broker cluster transfer` to the next node, and the time until
#    it answered and a publish is stored through the new leader;
#  - then the catch-up of a new node: a cluster (--fsync batch, a snapshot every
#    CATCHUP_SNAPSHOT_ENTRIES entries, so that the log before the last one is gone) holding
#    CATCHUP_RECORDS records of SIZE bytes gets a fourth node, started with --cluster-join,
#    through `broker cluster add`, which answers once the node holds the whole state (the
#    leader's snapshot, its record segment files streamed along, then the log after it) and
#    votes; its time is measured.
# Every node runs on this machine, so the figures say what replication costs in CPU and in
# loopback round trips, not what a network between hosts adds. Bounded work; stops what it
# started. Directories under TMPDIR (a disk, not a tmpfs, for honest fsync figures).
#
#   bench/cluster.sh   # RECORDS=200000 SIZE=100 PRODUCERS=4 DEPTH=64 KILLS=20 TRANSFERS=20 CATCHUP_RECORDS=1000000 CATCHUP_SNAPSHOT_ENTRIES=1000
set -euo pipefail
cd "$(dirname "$0")/.."

RECORDS="${RECORDS:-200000}"
SIZE="${SIZE:-100}"
PRODUCERS="${PRODUCERS:-4}"
DEPTH="${DEPTH:-64}"
KILLS="${KILLS:-20}"
TRANSFERS="${TRANSFERS:-20}"
CATCHUP_RECORDS="${CATCHUP_RECORDS:-1000000}"
CATCHUP_SNAPSHOT_ENTRIES="${CATCHUP_SNAPSHOT_ENTRIES:-1000}"

echo "building release binaries..." >&2
cargo build --release --locked -q -p broker-server -p broker-cli
server=target/release/broker-server
broker=target/release/broker

workdir="$(mktemp -d)"
declare -A pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  rm -rf "$workdir"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_listening() { # file
  for _ in $(seq 1 3000); do grep -q '^listening on ' "$1" && return 0; sleep 0.01; done
  echo "a server did not start: $1" >&2; exit 1
}
stop_all() {
  for key in "${!pids[@]}"; do kill "${pids[$key]}" 2>/dev/null || true; wait "${pids[$key]}" 2>/dev/null || true; unset "pids[$key]"; done
}

common=(--capacity 2147483647 --max-memory 8589934592 --log-level warn)

single() { # fsync
  rm -rf "$workdir/single"
  "$server" --listen 127.0.0.1:0 --data-dir "$workdir/single" --fsync "$1" "${common[@]}" \
    >"$workdir/single.out" 2>"$workdir/single.err" &
  pids[single]=$!
  wait_listening "$workdir/single.out"
  BROKER_ADDR="$(sed -n 's/^listening on //p' "$workdir/single.out")"
  export BROKER_ADDR
}

declare -a client_ports=()
members=""
start_node() { # id fsync [flags...]
  local id=$1 fsync=$2
  shift 2
  "$server" --node-id "$id" --listen "127.0.0.1:${client_ports[$id]}" --data-dir "$workdir/node-$id" \
    --cluster-members "$members" --fsync "$fsync" "${common[@]}" "$@" \
    >"$workdir/node-$id.out" 2>>"$workdir/node-$id.err" &
  pids[node-$id]=$!
  wait_listening "$workdir/node-$id.out"
}
cluster() { # fsync [flags of every node...]
  local fsync=$1
  shift
  rm -rf "$workdir"/node-*
  members=""
  for id in 1 2 3; do
    client_ports[$id]=$(free_port)
    members+="${members:+,}$id=127.0.0.1:$(free_port)/127.0.0.1:${client_ports[$id]}"
  done
  for id in 1 2 3; do start_node "$id" "$fsync" "$@"; done
  BROKER_ADDR="127.0.0.1:${client_ports[1]},127.0.0.1:${client_ports[2]},127.0.0.1:${client_ports[3]}"
  export BROKER_ADDR
  # Until a leader answers.
  for _ in $(seq 1 300); do "$broker" describe >/dev/null 2>&1 && return 0; sleep 0.05; done
  echo "the cluster elected no leader" >&2; exit 1
}

publish() { # -> "requests_per_sec p50_us p99_us"
  "$broker" bench publish --producers "$PRODUCERS" --depth "$DEPTH" --records "$RECORDS" \
    --size "$SIZE" --retention limits --json |
    python3 -c 'import json,sys; d=json.load(sys.stdin); l=d["publish_latency"]; print(round(d["requests_per_sec"]), l["p50_us"], l["p99_us"])'
}

rows=()
for fsync in always batch; do
  echo "publishing to a single broker, --fsync $fsync..." >&2
  single "$fsync"; read -r s_rps s_p50 s_p99 < <(publish); stop_all
  echo "publishing to a three-node cluster, --fsync $fsync..." >&2
  cluster "$fsync"; read -r c_rps c_p50 c_p99 < <(publish); stop_all
  ratio=$(python3 -c "print(f'{$c_rps/$s_rps:.2f}x')")
  rows+=("$(printf '%-8s %14s %14s %8s   %10s %10s   %10s %10s' "$fsync" "$s_rps" "$c_rps" "$ratio" "$s_p50" "$c_p50" "$s_p99" "$c_p99")")
done

echo "failing over $KILLS times..." >&2
cluster always
"$broker" create failover --partitions 1 >/dev/null
leader_of() { # -> id of the node that leads, as the nodes tell (empty during an election)
  "$broker" cluster status --json 2>/dev/null |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["leader"] or "")' 2>/dev/null || true
}
times=()
for round in $(seq 1 "$KILLS"); do
  leader=""
  for _ in $(seq 1 300); do leader=$(leader_of); [ -n "$leader" ] && break; sleep 0.05; done
  [ -n "$leader" ] || { echo "no leader in round $round" >&2; exit 1; }
  kill -9 "${pids[node-$leader]}"; wait "${pids[node-$leader]}" 2>/dev/null || true
  unset "pids[node-$leader]"
  start=$(date +%s.%N)
  stored=""
  for _ in $(seq 1 600); do
    "$broker" publish failover "round-$round" >/dev/null 2>&1 && { stored=1; break; }
    sleep 0.01
  done
  [ -n "$stored" ] || { echo "no publish was stored after round $round's kill" >&2; exit 1; }
  end=$(date +%s.%N)
  times+=("$(python3 -c "print(round(($end-$start)*1000))")")
  start_node "$leader" always
  sleep 1
done

echo "handing the leadership over $TRANSFERS times..." >&2
handovers=()
for round in $(seq 1 "$TRANSFERS"); do
  leader=""
  for _ in $(seq 1 300); do leader=$(leader_of); [ -n "$leader" ] && break; sleep 0.05; done
  [ -n "$leader" ] || { echo "no leader before hand-over $round" >&2; exit 1; }
  next=$((leader % 3 + 1))
  start=$(date +%s.%N)
  "$broker" cluster transfer "$next" >/dev/null 2>"$workdir/transfer.err" ||
    { echo "hand-over $round to node $next failed: $(cat "$workdir/transfer.err")" >&2; exit 1; }
  "$broker" publish failover "handover-$round" >/dev/null
  end=$(date +%s.%N)
  handovers+=("$(python3 -c "print(round(($end-$start)*1000))")")
done
stop_all

echo "adding a fourth node to a cluster holding $CATCHUP_RECORDS records..." >&2
snapshots=(--cluster-snapshot-entries "$CATCHUP_SNAPSHOT_ENTRIES")
cluster batch "${snapshots[@]}"
"$broker" bench publish --producers "$PRODUCERS" --depth "$DEPTH" --records "$CATCHUP_RECORDS" \
  --size "$SIZE" --retention limits --keep-topic --json >/dev/null
retained=$("$broker" describe --json | python3 -c 'import json,sys; print(sum(t["retained_bytes"] for t in json.load(sys.stdin)["topics"]))')
client_ports[4]=$(free_port)
new_node="4=127.0.0.1:$(free_port)/127.0.0.1:${client_ports[4]}"
members+=",$new_node"
start_node 4 batch --cluster-join "${snapshots[@]}"
start=$(date +%s.%N)
added=""
# The leader gives up after 20 s when the node has not caught up yet; it goes on catching up,
# and adding it again finishes once it has.
for _ in $(seq 1 30); do
  "$broker" cluster add "$new_node" >/dev/null 2>"$workdir/add.err" && { added=1; break; }
done
[ -n "$added" ] || { echo "node 4 was not added: $(cat "$workdir/add.err")" >&2; exit 1; }
end=$(date +%s.%N)
# A snapshot from the leader is installed in store-1 (the node's own would be in store-0).
segment_files=$( (find "$workdir/node-4/raft/store-1" -type f 2>/dev/null || true) | wc -l)
stop_all

echo
echo "publish: $PRODUCERS connections x depth $DEPTH, $RECORDS records of $SIZE bytes, one per request"
printf '%-8s %14s %14s %8s   %10s %10s   %10s %10s\n' "--fsync" "single req/s" "cluster req/s" "ratio" "single p50" "cluster p50" "single p99" "cluster p99"
for row in "${rows[@]}"; do echo "$row"; done
echo
python3 - "${times[@]}" <<'EOF'
import statistics, sys
ms = sorted(int(t) for t in sys.argv[1:])
print(f"failover over {len(ms)} kill -9 of the leader: time until a publish is stored again, ms: "
      f"min {ms[0]}, median {statistics.median(ms):.0f}, max {ms[-1]}")
EOF
python3 - "${handovers[@]}" <<'EOF'
import statistics, sys
ms = sorted(int(t) for t in sys.argv[1:])
print(f"hand-over over {len(ms)} `broker cluster transfer`: time until it answered and a publish "
      f"is stored through the new leader, ms: min {ms[0]}, median {statistics.median(ms):.0f}, "
      f"max {ms[-1]}")
EOF
python3 - "$start" "$end" "$CATCHUP_RECORDS" "$retained" "$segment_files" <<'EOF'
import sys
start, end, records, retained = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
files = int(sys.argv[5])
seconds = end - start
how = (f"from the leader's snapshot with {files} segment files, then the log"
       if files else "from the log alone (no snapshot was sent)")
print(f"catch-up of a new node: {records} records ({retained / 1e6:.0f} MB of payload) in "
      f"{seconds:.1f} s until it votes, {how}: {records / seconds:,.0f} records/s, "
      f"{retained / 1e6 / seconds:.0f} MB/s")
EOF
