#!/usr/bin/env bash
# The Kafka listener against the broker's own protocol, side by side in one run on loopback:
# the same records (count and size) produced through confluent-kafka (librdkafka) and through
# `broker bench publish` (the native client, batched as librdkafka batches), then consumed
# through confluent-kafka, with the server's CPU time per record on each listener (user plus
# system time of the broker-server process, from /proc). Installs confluent-kafka if missing.
# Stops by itself and stops what it started.
#
#   bench/kafka.sh                   # RECORDS=500000 SIZE=100 PARTITIONS=8 by default
#   RECORDS=100000 bench/kafka.sh
set -euo pipefail
cd "$(dirname "$0")/.."

RECORDS="${RECORDS:-500000}"
SIZE="${SIZE:-100}"
PARTITIONS="${PARTITIONS:-8}"

python3 -c 'import confluent_kafka' 2>/dev/null || python3 -m pip install -q -r tests/kafka/requirements.txt
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

target/release/broker-server --listen 127.0.0.1:0 --kafka-listen 127.0.0.1:0 --log-level warn \
  >"$workdir/server.out" 2>"$workdir/server.err" &
server_pid=$!
for _ in $(seq 1 100); do grep -q '^kafka on ' "$workdir/server.out" && break; sleep 0.05; done
export BROKER_ADDR="$(sed -n 's/^listening on //p' "$workdir/server.out")"
kafka="$(sed -n 's/^kafka on //p' "$workdir/server.out")"

# The server's CPU time so far, in seconds (utime + stime, in clock ticks).
cpu() { awk -v hz="$(getconf CLK_TCK)" '{ print ($14 + $15) / hz }' "/proc/$server_pid/stat"; }
per_record_us() { python3 -c "print(round(($2 - $1) * 1e6 / $RECORDS, 2))"; }
topic() {
  $broker delete "$1" >/dev/null 2>&1 || true
  $broker create "$1" --partitions "$PARTITIONS" --retention limits >/dev/null
}
rate() { python3 -c "import json,sys; print(round(json.load(sys.stdin)['$1']))"; }

echo "records: $RECORDS of $SIZE bytes over $PARTITIONS partitions" >&2

topic kafka-produce
before="$(cpu)"
kafka_produce="$(python3 bench/kafka.py produce "$kafka" kafka-produce "$RECORDS" "$SIZE" | rate per_second)"
kafka_produce_cpu="$(per_record_us "$before" "$(cpu)")"

before="$(cpu)"
kafka_consume="$(python3 bench/kafka.py consume "$kafka" kafka-produce "$RECORDS" "$PARTITIONS" | rate per_second)"
kafka_consume_cpu="$(per_record_us "$before" "$(cpu)")"

before="$(cpu)"
native_produce="$($broker bench publish --records "$RECORDS" --size "$SIZE" --partitions "$PARTITIONS" \
  --publish-batch 1000 --depth 8 --retention limits --json | rate records_per_sec)"
native_produce_cpu="$(per_record_us "$before" "$(cpu)")"

printf '\n%-28s %14s %16s\n' "workload" "records/s" "server CPU/record"
printf '%-28s %14s %14s us\n' "produce, confluent-kafka" "$kafka_produce" "$kafka_produce_cpu"
printf '%-28s %14s %14s us\n' "produce, native (batched)" "$native_produce" "$native_produce_cpu"
printf '%-28s %14s %14s us\n' "consume, confluent-kafka" "$kafka_consume" "$kafka_consume_cpu"
python3 -c "print(f'\nconfluent-kafka produce / native produce: {$kafka_produce / $native_produce:.2f}x')"
