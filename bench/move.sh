#!/usr/bin/env bash
# Moving a topic to another Raft group (`broker cluster move`), by the topic's size, in one run
# on loopback: a three-node cluster spreading its topics over three groups
# (--cluster-data-groups 3, --fsync batch). For each size of SIZES_MIB, a topic of PARTITIONS
# partitions is filled with that many MiB of RECORD_SIZE-byte records (`broker bench publish
# --keep-topic`, limits retention), then moved ROUNDS times, each time to the next group, each
# move timed from the command's start to its answer (the topic served by its new group). While
# a topic moves its calls are answered NotLeader and clients ask again, so a move's time is also
# the longest pause its clients see. Every node runs on this machine: the figures say what the
# copy costs in CPU and loopback round trips. Bounded work; stops what it started.
#
#   bench/move.sh   # SIZES_MIB="1 16 64" ROUNDS=3 PARTITIONS=4 RECORD_SIZE=1000
set -euo pipefail
cd "$(dirname "$0")/.."

SIZES_MIB="${SIZES_MIB:-1 16 64}"
ROUNDS="${ROUNDS:-3}"
PARTITIONS="${PARTITIONS:-4}"
RECORD_SIZE="${RECORD_SIZE:-1000}"

echo "building release binaries..." >&2
cargo build --release --locked -q -p broker-server -p broker-cli
server=target/release/broker-server
broker=target/release/broker

workdir="$(mktemp -d)"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$workdir"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_listening() { # file
  for _ in $(seq 1 3000); do grep -q '^listening on ' "$1" && return 0; sleep 0.01; done
  echo "a server did not start: $1" >&2; exit 1
}

members=""
declare -a client_ports=()
for id in 1 2 3; do
  client_ports[$id]=$(free_port)
  members+="${members:+,}$id=127.0.0.1:$(free_port)/127.0.0.1:${client_ports[$id]}"
done
for id in 1 2 3; do
  "$server" --node-id "$id" --listen "127.0.0.1:${client_ports[$id]}" \
    --data-dir "$workdir/node-$id" --cluster-members "$members" --cluster-data-groups 3 \
    --fsync batch --max-memory 8589934592 --log-level warn \
    >"$workdir/node-$id.out" 2>"$workdir/node-$id.err" &
  pids+=($!)
  wait_listening "$workdir/node-$id.out"
done
BROKER_ADDR="127.0.0.1:${client_ports[1]},127.0.0.1:${client_ports[2]},127.0.0.1:${client_ports[3]}"
export BROKER_ADDR
# Until the three groups have leaders.
for _ in $(seq 1 600); do
  groups=$("$broker" cluster status --json 2>/dev/null |
    python3 -c 'import json,sys; print(sum(1 for g in json.load(sys.stdin).get("groups", []) if g["leader"]))' 2>/dev/null || echo 0)
  [ "$groups" = 3 ] && break
  sleep 0.1
done
[ "$groups" = 3 ] || { echo "the three groups did not elect leaders" >&2; exit 1; }

group_of() { # topic -> its group
  "$broker" cluster topics "$1" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["topics"][0]["group"])'
}

rows=()
for mib in $SIZES_MIB; do
  records=$((mib * 1024 * 1024 / RECORD_SIZE))
  echo "filling a topic with $mib MiB ($records records)..." >&2
  topic=$("$broker" bench publish --records "$records" --size "$RECORD_SIZE" --publish-batch 100 \
    --partitions "$PARTITIONS" --retention limits --keep-topic --json |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["topic"])')
  times=()
  for round in $(seq 1 "$ROUNDS"); do
    to=$(( $(group_of "$topic") % 3 + 1 ))
    start=$(date +%s.%N)
    "$broker" cluster move "$topic" --to "$to" >/dev/null 2>"$workdir/move.err" || {
      cat "$workdir/move.err" >&2
      for id in 1 2 3; do echo "node $id:" >&2; tail -5 "$workdir/node-$id.err" >&2; done
      exit 1
    }
    times+=("$(python3 -c "print($(date +%s.%N) - $start)")")
    echo "  move $round to group $to: ${times[-1]} s" >&2
  done
  # Nothing lost: the topic's partitions hold every record.
  held=$("$broker" describe "$topic" --json | python3 -c 'import json,sys; print(sum(p["records"] for p in json.load(sys.stdin)["topics"][0]["partitions"]))')
  [ "$held" = "$records" ] || { echo "$topic holds $held records of $records" >&2; exit 1; }
  rows+=("$(python3 -c "
import statistics
t = [$(IFS=,; echo "${times[*]}")]
print(f'{$mib:>8} {$records:>10} {statistics.median(t):>10.2f} {min(t):>8.2f} {max(t):>8.2f}')")")
done

echo
echo "moving a topic between groups: three nodes on loopback, --fsync batch, $PARTITIONS partitions, $RECORD_SIZE-byte records, $ROUNDS moves per size"
printf '%8s %10s %10s %8s %8s\n' "MiB" "records" "median s" "min s" "max s"
for row in "${rows[@]}"; do echo "$row"; done
