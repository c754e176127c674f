#!/usr/bin/env bash
# Side by side: broker-server, Redis Streams and NATS JetStream on loopback, the same workloads
# one after the other in one run (same record size, connections, pipeline depth and record
# count), then one table: workload, ours, Redis, ratio, NATS, ratio. Installs redis-server,
# redis-tools and nats-server if missing, and builds bench/peers (the compiled Redis and NATS
# clients of the end-to-end rows). Loopback only; stops by itself and stops what it started.
#
# Redis serves from one thread and redis-benchmark loads it from one, so our server runs with
# --worker-threads 1, `broker bench` with --threads 1, NATS with GOMAXPROCS=1 and bench/peers on
# one thread: the comparison is thread for thread (THREADS=2 gives ours and NATS two).
#
#   bench/compare.sh                 # RECORDS=1000000 SIZE=100 THREADS=1 by default
#   RECORDS=200000 bench/compare.sh
set -euo pipefail
cd "$(dirname "$0")/.."

RECORDS="${RECORDS:-1000000}"
THREADS="${THREADS:-1}"
SIZE="${SIZE:-100}"
LATENCY_REQUESTS="${LATENCY_REQUESTS:-20000}"

if ! command -v redis-server >/dev/null || ! command -v redis-benchmark >/dev/null; then
  echo "installing redis-server and redis-tools..." >&2
  apt-get update -qq && apt-get install -y -qq redis-server redis-tools >/dev/null
fi
if ! command -v nats-server >/dev/null; then
  echo "installing nats-server..." >&2
  apt-get update -qq && apt-get install -y -qq nats-server >/dev/null
fi

echo "building release binaries..." >&2
cargo build --release --locked -q -p broker-server -p broker-cli
cargo build --release --locked -q --manifest-path bench/peers/Cargo.toml
broker=target/release/broker
peers=bench/peers/target/release/peers

workdir="$(mktemp -d)"
server_pid=""
redis_port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
nats_port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
nats_pid=""
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null || true
  [ -n "$nats_pid" ] && kill "$nats_pid" 2>/dev/null || true
  redis-cli -p "$redis_port" shutdown nosave >/dev/null 2>&1 || true
  rm -rf "$workdir"
}
trap cleanup EXIT

target/release/broker-server --listen 127.0.0.1:0 --capacity 1000 --log-level warn \
  --worker-threads "$THREADS" \
  >"$workdir/server.out" 2>"$workdir/server.err" &
server_pid=$!
for _ in $(seq 1 100); do grep -q '^listening on ' "$workdir/server.out" && break; sleep 0.05; done
export BROKER_ADDR="$(sed -n 's/^listening on //p' "$workdir/server.out")"
bench() { $broker bench "$@" --threads "$THREADS" --size "$SIZE" --json; }
redis-server --bind 127.0.0.1 --port "$redis_port" --save '' --appendonly no \
  --daemonize yes --logfile "$workdir/redis.log" --dir "$workdir"
for _ in $(seq 1 100); do redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break; sleep 0.05; done
# NATS JetStream, in memory, on one thread (GOMAXPROCS=1) like the others.
GOMAXPROCS="$THREADS" nats-server -js -a 127.0.0.1 -p "$nats_port" -sd "$workdir/nats" \
  >"$workdir/nats.log" 2>&1 &
nats_pid=$!
for _ in $(seq 1 100); do grep -q 'Server is ready' "$workdir/nats.log" && break; sleep 0.05; done

json() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }
value="$(head -c "$SIZE" /dev/zero | tr '\0' x)"
# redis-benchmark's "latency summary" line: avg min p50 p95 p99 max (msec).
redis_xadd() { # clients pipeline requests -> "rps p50_us p99_us"
  redis-benchmark -p "$redis_port" -n "$3" -c "$1" -P "$2" XADD "bench-$1-$2" '*' f "$value" 2>/dev/null \
    | tr '\r' '\n' | awk '
      /requests per second/ && /throughput summary/ { rps=$3 }
      /throughput summary/ { rps=$3 }
      /avg *min *p50/ { getline; p50=$3*1000; p99=$5*1000 }
      END { printf "%s %s %s\n", rps, p50, p99 }'
}

rows=()
# label ours redis ratio [nats nats-ratio]
row() { rows+=("$(printf '%-60s %12s %12s %8s %12s %8s' "$1" "$2" "$3" "$4" "${5:-}" "${6:-}")"); }
ratio() { python3 -c "print(f'{$1/$2:.2f}x')"; }

# End to end: records/s counts records published AND acknowledged or committed. Redis and
# NATS are driven by compiled clients on one thread (bench/peers): Redis's producers pipeline
# 64 XADDs (or 1000, beside our batches of 1000), its consumers XREADGROUP a batch and XACK it
# with the next read; NATS's producers keep 64 async publishes in flight, its durable pull
# consumers fetch a batch and ack each message.
peer_e2e() { # server port records producers consumers batch depth
  "$peers" "$1" --port "$2" --records "$3" --size "$SIZE" --producers "$4" --consumers "$5" \
    --batch "$6" --depth "$7" | json 'int(d["records_per_sec"])'
}
redis_e2e() { peer_e2e redis "$redis_port" "$@"; }
nats_e2e() { peer_e2e nats "$nats_port" "$@"; }

echo "measuring..." >&2
# Memory per retained record: RSS growth while one topic fills 64 partitions x 1000 records.
rss() { awk '/^VmRSS/ { print $2 * 1024 }' "/proc/$server_pid/status"; }
before="$(rss)"
bench publish --producers 1 --depth 64 --records 64000 --keep-topic >/dev/null
after="$(rss)"
overhead="$(python3 -c "print(round(($after - $before) / 64000 - $SIZE))")"

ping_p50="$($broker bench ping --records "$LATENCY_REQUESTS" --json | json 'd["round_trip"]["p50_us"]')"

ours="$(bench publish --producers 1 --depth 1 --records "$LATENCY_REQUESTS")"
ours_p50="$(echo "$ours" | json 'd["publish_latency"]["p50_us"]')"
ours_p99="$(echo "$ours" | json 'd["publish_latency"]["p99_us"]')"
read -r redis_rps redis_p50 redis_p99 <<<"$(redis_xadd 1 1 "$LATENCY_REQUESTS")"
row "single publish, 1 conn, no pipelining: p50 (µs)" "$ours_p50" "$redis_p50" "$(ratio "$ours_p50" "$redis_p50")"
row "single publish, 1 conn, no pipelining: p99 (µs)" "$ours_p99" "$redis_p99" "$(ratio "$ours_p99" "$redis_p99")"
row "raw loopback ping-pong p50 (µs), ours / raw" "$ours_p50" "$ping_p50 (raw)" "$(ratio "$ours_p50" "$ping_p50")"
handle="$(bench publish --handles --retention limits --producers 1 --depth 1 --records "$LATENCY_REQUESTS")"
handle_p50="$(echo "$handle" | json 'd["publish_latency"]["p50_us"]')"
row "  ... one send through the Producer handle: p50 (µs)" "$handle_p50" "$redis_p50" "$(ratio "$handle_p50" "$redis_p50")"
row "  ... Producer handle p50 / raw ping-pong p50" "$handle_p50" "$ping_p50 (raw)" "$(ratio "$handle_p50" "$ping_p50")"

# Limits retention: every publish is stored (the oldest records leave past --capacity), as
# every XADD is.
for conns in 1 8; do
  ours="$(bench publish --retention limits --producers "$conns" --depth 64 --records "$RECORDS")"
  ours_rps="$(echo "$ours" | json 'int(d["requests_per_sec"])')"
  read -r redis_rps _ _ <<<"$(redis_xadd "$conns" 64 "$RECORDS")"
  row "publish, $conns conn x depth 64: requests/s" "$ours_rps" "${redis_rps%.*}" "$(ratio "$ours_rps" "$redis_rps")"
  # The server alone: frames written straight to the socket, as redis-benchmark loads Redis.
  wire="$(bench publish --wire --retention limits --producers "$conns" --depth 64 --records "$RECORDS")"
  wire_rps="$(echo "$wire" | json 'int(d["requests_per_sec"])')"
  row "  ... server alone (broker bench --wire)" "$wire_rps" "${redis_rps%.*}" "$(ratio "$wire_rps" "$redis_rps")"
  # What a service gets: one Producer per task, 64 sends in flight each, batched by the handle.
  handle="$(bench publish --handles --retention limits --producers "$conns" --depth 64 --records "$RECORDS")"
  handle_rps="$(echo "$handle" | json 'int(d["records_per_sec"])')"
  row "  ... Producer handle, $conns task(s) x 64 sends: records/s" "$handle_rps" "${redis_rps%.*}" "$(ratio "$handle_rps" "$redis_rps")"
  row "  ... Producer handle / server alone" "$handle_rps" "$wire_rps (wire)" "$(ratio "$handle_rps" "$wire_rps")"
  nats_rps="$(nats_e2e "$RECORDS" "$conns" 0 1 64)"
  row "  ... beside NATS JetStream async publish, $conns conn(s) x 64 acks" "$handle_rps" "" "" "$nats_rps" "$(ratio "$handle_rps" "$nats_rps")"
done

# End to end: records/s counts records published AND acknowledged or committed.
e2e_row() { # label records redis_rps nats_rps bench-args...
  local label="$1" records="$2" redis_rps="$3" nats_rps="$4"; shift 4
  local ours ours_rps refused
  ours="$(bench "$@" --records "$records")"
  ours_rps="$(echo "$ours" | json 'int(d["records_per_sec"])')"
  refused="$(echo "$ours" | json 'd["publish_refused_full"]')"
  row "$label ($refused full)" "$ours_rps" "$redis_rps" "$(ratio "$ours_rps" "$redis_rps")" \
    "$nats_rps" "$([ -n "$nats_rps" ] && ratio "$ours_rps" "$nats_rps")"
}
redis_rps="$(redis_e2e "$RECORDS" 2 2 100 64)"
nats_rps="$(nats_e2e "$RECORDS" 2 2 100 64)"
e2e_row "ack mode, 64 partitions, 2+2 conns: records/s" "$RECORDS" "$redis_rps" "$nats_rps" \
  ack --producers 2 --consumers 2 --depth 64
e2e_row "  ... ours publishing batches of 64" "$RECORDS" "$redis_rps" "$nats_rps" \
  ack --producers 1 --consumers 2 --depth 1 --publish-batch 64
e2e_row "  ... through the Producer and Consumer handles" "$RECORDS" "$redis_rps" "$nats_rps" \
  ack --handles --producers 2 --consumers 2 --depth 64
redis_rps="$(redis_e2e "$RECORDS" 2 1 1000 64)"
nats_rps="$(nats_e2e "$RECORDS" 2 1 1000 64)"
e2e_row "fetch/commit (batches of 1000), 2+1 conns: records/s" "$RECORDS" "$redis_rps" "$nats_rps" \
  fetch --producers 2 --consumers 1 --depth 64 --batch 1000
e2e_row "  ... through the Producer and Consumer handles" "$RECORDS" "$redis_rps" "$nats_rps" \
  fetch --handles --producers 2 --consumers 1 --depth 64 --batch 1000
# Four times the records, on both sides: at 3 M records/s a million take a third of a second,
# mostly starting and draining.
redis_rps="$(redis_e2e $((RECORDS * 4)) 1 2 1000 1000)"
e2e_row "  ... batches of 1000 both ways, 1+2 conns, 4x records" $((RECORDS * 4)) "$redis_rps" "" \
  fetch --producers 1 --consumers 2 --depth 2 --publish-batch 1000 --batch 1000

printf '\n%-60s %12s %12s %8s %12s %8s\n' "workload ($SIZE-byte records, $RECORDS records, $THREADS thread)" "ours" "Redis 7" "ratio" "NATS JS" "ratio"
printf '%s\n' "${rows[@]}"
echo
echo "server memory per retained record beyond its $SIZE-byte payload: about $overhead bytes (RSS growth / 64,000 records)"
echo "(latency rows: lower is better; throughput rows: higher is better. Redis and NATS end-to-end clients are compiled Rust (bench/peers: the redis and async-nats crates) on one thread; ours are broker bench tasks.)"
echo "(\"full\": publishes answered -1 because a partition was at capacity; end-to-end producers retry them after a back-off. Publish rows use limits retention, so every record is stored. Handle rows count records, which the Producer batches into requests by itself.)"
