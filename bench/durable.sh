#!/usr/bin/env bash
# Durable publishing and reading from disk, side by side with the broker in memory, in one run:
#  - pipelined publishes (PRODUCERS connections x DEPTH requests in flight, RECORDS records of
#    SIZE bytes, one record per request and batches of 100) against a server in memory, one
#    with --data-dir --fsync batch and one with --fsync always (group commit);
#  - then RECORDS records consumed from the start by a new group in fetch mode: from memory,
#    and from disk after a restart of the durable server (every record in segment files).
# Prints one table with the ratios to the in-memory figures. Loopback only; bounded work; stops
# what it started. The data directory is created under TMPDIR (a disk, not a tmpfs, for honest
# fsync figures).
#
#   bench/durable.sh                        # RECORDS=1000000 SIZE=100 PRODUCERS=4 DEPTH=64
set -euo pipefail
cd "$(dirname "$0")/.."

RECORDS="${RECORDS:-1000000}"
SIZE="${SIZE:-100}"
PRODUCERS="${PRODUCERS:-4}"
DEPTH="${DEPTH:-64}"

echo "building release binaries..." >&2
cargo build --release --locked -q -p broker-server -p broker-cli
broker=target/release/broker

workdir="$(mktemp -d)"
server_pid=""
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null || true
  rm -rf "$workdir"
}
trap cleanup EXIT

start() { # start [broker-server flags...]
  : >"$workdir/server.out"
  target/release/broker-server --listen 127.0.0.1:0 --capacity 2147483647 --max-memory 8589934592 \
    --log-level warn "$@" >"$workdir/server.out" 2>>"$workdir/server.err" &
  server_pid=$!
  for _ in $(seq 1 6000); do grep -q '^listening on ' "$workdir/server.out" && break; sleep 0.01; done
  grep -q '^listening on ' "$workdir/server.out" || { cat "$workdir/server.err" >&2; exit 1; }
  export BROKER_ADDR="$(sed -n 's/^listening on //p' "$workdir/server.out")"
}
stop() { kill "$server_pid"; wait "$server_pid" 2>/dev/null || true; server_pid=""; }
json() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }
publish() { # publish BATCH -> "records/s p50_us p99_us"
  $broker bench publish --records "$RECORDS" --size "$SIZE" --producers "$PRODUCERS" \
    --depth "$DEPTH" --publish-batch "$1" --json \
    | json '" ".join(str(x) for x in (round(d["records_per_sec"]), d["publish_latency"]["p50_us"], d["publish_latency"]["p99_us"]))'
}
drain() { # drain TOPIC -> records/s of a new group fetching everything from the start
  local began; began="$(date +%s.%N)"
  $broker consume "$1" --group "drain-$RANDOM" --member m --mode fetch --batch 10000 --stay \
    >/dev/null 2>"$workdir/consume.err"
  local consumed; consumed="$(sed -n 's/^consumed \([0-9]*\) records\?$/\1/p' "$workdir/consume.err")"
  [ "$consumed" = "$RECORDS" ] || { echo "consumed $consumed of $RECORDS" >&2; exit 1; }
  python3 -c "print(round($consumed / ($(date +%s.%N) - $began)))"
}
fill() { # fill -> the name of a topic of RECORDS records, kept
  $broker bench publish --records "$RECORDS" --size "$SIZE" --producers "$PRODUCERS" \
    --depth "$DEPTH" --publish-batch 100 --partitions 8 --keep-topic --json | json 'd["topic"]'
}

declare -A rate p50 p99
for mode in memory batch always; do
  echo "publishing, $mode..." >&2
  case "$mode" in
    memory) start ;;
    *) rm -rf "$workdir/data-$mode"; start --data-dir "$workdir/data-$mode" --fsync "$mode" ;;
  esac
  for batch in 1 100; do
    read -r r a b <<<"$(publish "$batch")"
    rate[$mode,$batch]=$r; p50[$mode,$batch]=$a; p99[$mode,$batch]=$b
  done
  stop
done

echo "reading from memory..." >&2
start
memory_topic="$(fill)"
from_memory="$(drain "$memory_topic")"
stop
echo "reading from disk..." >&2
rm -rf "$workdir/data-read"
start --data-dir "$workdir/data-read" --fsync batch
disk_topic="$(fill)"
stop
start --data-dir "$workdir/data-read" --fsync batch
from_disk="$(drain "$disk_topic")"
stop

ratio() { python3 -c "print(f'{$1/$2:.2f}x')"; }
printf '%-58s %14s %10s %10s %8s\n' "workload ($PRODUCERS connections x depth $DEPTH, $SIZE-byte records)" "records/s" "p50 us" "p99 us" "ratio"
for batch in 1 100; do
  for mode in memory batch always; do
    label="publish, $([ "$batch" = 1 ] && echo "one record per request" || echo "batches of $batch"), $mode"
    printf '%-58s %14s %10s %10s %8s\n' "$label" "${rate[$mode,$batch]}" "${p50[$mode,$batch]}" \
      "${p99[$mode,$batch]}" "$(ratio "${rate[$mode,$batch]}" "${rate[memory,$batch]}")"
  done
done
printf '%-58s %14s %10s %10s %8s\n' "fetch $RECORDS records from the start, from memory" "$from_memory" "" "" "1.00x"
printf '%-58s %14s %10s %10s %8s\n' "fetch $RECORDS records from the start, from disk" "$from_disk" "" "" "$(ratio "$from_disk" "$from_memory")"
