#!/usr/bin/env bash
# Publishes on one topic while a consumer reads another topic of the same shard from disk,
# against two builds of broker-server side by side: whether a reader catching up from disk
# holds back the publishes of the shard's other topics. Each round, for each build (A first in
# odd rounds, B first in even ones): a fresh server with --data-dir fills a topic with HISTORY
# records of 1,000 bytes, restarts (the records are then on disk, read through the page cache),
# and runs `broker bench publish $PUBLISH` on a new topic while the reader reads the full topic
# from its start again and again (at most 100 times) until the publishing ends. READER says
# who reads: `kcat` (the default: a Kafka consumer, whose fetches are reads from an offset),
# `fetch` (`broker consume --mode fetch`, a new group each time: fetches of a group member) or
# `ack` (`broker consume --mode ack --batch 64`: polls and acknowledgements). Prints per run the
# publishes per second, their p50 and p99 latency and how many records were read meanwhile,
# then the medians and B / A:
#
#   bench/cold-reads.sh /tmp/old-target/release target/release
#   ROUNDS=5 HISTORY=500000 READER=fetch bench/cold-reads.sh A B
#
# A_DIR and B_DIR hold a broker-server binary each (build an older commit with
# `git worktree add /tmp/old COMMIT && cd /tmp/old && CARGO_TARGET_DIR=/tmp/old-target cargo
# build --release -p broker-server`). Needs kcat (`apt-get install kcat`). Loopback only; a
# bounded amount of work; stops what it started.
set -euo pipefail
cd "$(dirname "$0")/.."

A_DIR="${1:?usage: bench/cold-reads.sh A_DIR B_DIR}"
B_DIR="${2:?usage: bench/cold-reads.sh A_DIR B_DIR}"
ROUNDS="${ROUNDS:-3}"
HISTORY="${HISTORY:-300000}"
READER="${READER:-kcat}"
PUBLISH="${PUBLISH:---producers 1 --depth 1 --records 1000000 --duration 10s --retention limits}"
SERVER_ARGS="${SERVER_ARGS:---worker-threads 2 --fsync batch}"
case "$READER" in
  kcat) command -v kcat >/dev/null || { echo "bench/cold-reads.sh needs kcat (apt-get install kcat)" >&2; exit 1; } ;;
  fetch | ack) ;;
  *) echo "READER is kcat, fetch or ack, not $READER" >&2; exit 1 ;;
esac
cargo build --release --locked -q -p broker-cli

source "$(dirname "$0")/server.sh"
broker=target/release/broker

read_once() { # read_once KAFKA_ADDR TOPIC GROUP -> how many records the reader read
  case "$READER" in
    kcat)
      timeout 60 kcat -C -b "$1" -t "$2" -o beginning -e -q -f '\n' 2>/dev/null | wc -l ;;
    fetch | ack)
      local batch=1000
      [ "$READER" = ack ] && batch=64
      BROKER_ADDR="$server_addr" timeout 60 "$broker" consume "$2" --group "$3" --member m \
        --mode "$READER" --batch "$batch" --stay >/dev/null 2>"$workdir/consume.err" || true
      sed -n 's/^consumed \([0-9]*\) records\?$/\1/p' "$workdir/consume.err" | grep . || echo 0 ;;
  esac
}

run() {
  local label="$1" dir="$2" data="$workdir/data"
  rm -rf "$data"
  # shellcheck disable=SC2086
  start_server "$dir/broker-server" --data-dir "$data" $SERVER_ARGS
  BROKER_ADDR="$server_addr" "$broker" bench publish --records "$HISTORY" --size 1000 \
    --producers 2 --depth 8 --publish-batch 100 --retention limits --keep-topic --json \
    >"$workdir/history.json" 2>/dev/null
  local history
  history="$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['topic'])" \
    "$workdir/history.json")"
  stop_server
  # shellcheck disable=SC2086
  start_server "$dir/broker-server" --data-dir "$data" --kafka-listen 127.0.0.1:0 $SERVER_ARGS
  local kafka
  kafka="$(sed -n 's/^kafka on //p' "$workdir/out")"
  BROKER_ADDR="$server_addr" "$broker" bench publish $PUBLISH --json >"$workdir/json" 2>/dev/null &
  local bench=$!
  local read=0 passes=0
  while kill -0 "$bench" 2>/dev/null && [ "$passes" -lt 100 ]; do
    read=$((read + $(read_once "$kafka" "$history" "reader-$passes")))
    passes=$((passes + 1))
  done
  wait "$bench"
  stop_server
  python3 - "$workdir/json" "$label" "$read" <<'EOF' | tee -a "$workdir/rows"
import json, sys
result = json.load(open(sys.argv[1]))
latency = result["publish_latency"]
print(f"{sys.argv[2]} {result['records_per_sec']:.0f} {latency['p50_us']} {latency['p99_us']} {sys.argv[3]}")
EOF
}

echo "build records/s publish-p50-µs publish-p99-µs records-read-from-disk"
alternate_builds
print_medians "publishes/s" "p50 µs" "p99 µs" "records read"
