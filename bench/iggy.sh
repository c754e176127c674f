#!/usr/bin/env bash
# Side by side with Apache Iggy, on disk, on this machine: one producer alone, and one producer
# with a consumer group of two, 100-byte messages in batches of 1,000 over 2 partitions. Iggy
# runs with its own defaults (no fsync); ours with --data-dir and --fsync batch (and, for
# reference, --fsync never). Rounds alternate the servers; each round starts every server on a
# fresh data directory. Besides throughput, each run's server CPU time (user and system, from
# /proc, since it started) per message.
#
#   IGGY_SRC=/path/to/iggy ROUNDS=3 MESSAGES=4000000 bench/iggy.sh
#
# IGGY_SRC is a checkout of https://github.com/apache/iggy. Unless it holds release builds of
# iggy-server and iggy-bench already (target/release), this builds them there: without its
# rust-toolchain.toml (moved aside for the build and put back), with Debian's libhwloc-dev,
# pkg-config and libudev-dev installed, as
#   cargo build --release -p server --no-default-features --features mimalloc -p iggy-bench
# Everything listens on 127.0.0.1; each server is stopped by its PID.
set -euo pipefail
cd "$(dirname "$0")/.."

: "${IGGY_SRC:?set IGGY_SRC to a checkout of https://github.com/apache/iggy}"
ROUNDS="${ROUNDS:-3}"
MESSAGES="${MESSAGES:-4000000}"
BATCH=1000
SIZE=100
IGGY_PORT="${IGGY_PORT:-8090}"

cargo build --release -q -p broker-server -p broker-cli --bins
ours="$PWD/target/release"

iggy="$IGGY_SRC/target/release"
if [ ! -x "$iggy/iggy-server" ] || [ ! -x "$iggy/iggy-bench" ]; then
  for package in libhwloc-dev pkg-config libudev-dev; do
    dpkg -s "$package" >/dev/null 2>&1 || { echo "install $package first (apt-get install $package)"; exit 1; }
  done
  toolchain="$IGGY_SRC/rust-toolchain.toml"
  if [ -f "$toolchain" ]; then
    mv "$toolchain" "$toolchain.aside"
    trap 'mv "$toolchain.aside" "$toolchain"' EXIT
  fi
  (cd "$IGGY_SRC" && cargo build --release -p server --no-default-features --features mimalloc -p iggy-bench)
  if [ -f "$toolchain.aside" ]; then
    mv "$toolchain.aside" "$toolchain"
    trap - EXIT
  fi
fi

work="$(mktemp -d)"
server_pid=""
stop_server() {
  if [ -n "$server_pid" ]; then
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
    server_pid=""
  fi
}
trap 'stop_server; rm -rf "$work"' EXIT

# Starts Iggy's server on a fresh data directory, its TCP transport on 127.0.0.1:IGGY_PORT
# (the others off), and waits until it accepts connections.
start_iggy() {
  rm -rf "$work/iggy" && mkdir -p "$work/iggy"
  (cd "$IGGY_SRC" && IGGY_ROOT_USERNAME=iggy IGGY_ROOT_PASSWORD=iggy \
    IGGY_SYSTEM_PATH="$work/iggy/data" IGGY_TCP_ADDRESS="127.0.0.1:$IGGY_PORT" \
    IGGY_HTTP_ENABLED=false IGGY_QUIC_ENABLED=false IGGY_WEBSOCKET_ENABLED=false \
    exec "$iggy/iggy-server") >"$work/iggy/log" 2>&1 &
  server_pid=$!
  for _ in $(seq 300); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$IGGY_PORT") 2>/dev/null; then return 0; fi
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "iggy-server did not start:"; tail -20 "$work/iggy/log"; exit 1
}

# Starts ours on a fresh data directory with `--fsync $1`; sets $addr.
start_ours() {
  rm -rf "$work/ours" && mkdir -p "$work/ours"
  "$ours/broker-server" --listen 127.0.0.1:0 --data-dir "$work/ours/data" --fsync "$1" \
    >"$work/ours/out" 2>"$work/ours/log" &
  server_pid=$!
  for _ in $(seq 300); do
    addr="$(sed -n 's/^listening on //p' "$work/ours/out")"
    [ -n "$addr" ] && return 0
    sleep 0.1
  done
  echo "broker-server did not start:"; tail -20 "$work/ours/log"; exit 1
}

# Iggy's messages per second for "$1" (Producers or Consumers) in iggy-bench's output "$2".
iggy_rate() {
  sed 's/\x1b\[[0-9;]*m//g' <<<"$2" |
    sed -n "s/.*$1 Results: Total throughput: [0-9.]* MB\/s, \([0-9]*\) messages\/s.*/\1/p" | head -1
}

# The Python expression "$1" over `broker bench --json`'s report `r`, rounded. Its
# records_per_sec is over the whole run, until the group consumed the last record.
json_field() { python3 -c "import json,sys; r=json.load(sys.stdin); print(round($1))"; }

declare -A results
record() { results["$1"]+="$2 "; }

# The CPU time the running server has spent since it started (user and system), in
# nanoseconds per message of a run of MESSAGES.
ticks="$(getconf CLK_TCK)"
server_cpu_per_message() {
  awk -v ticks="$ticks" -v messages="$MESSAGES" '{ printf "%d", ($14 + $15) / ticks * 1e9 / messages }' \
    "/proc/$server_pid/stat"
}

for round in $(seq "$ROUNDS"); do
  echo "round $round of $ROUNDS"

  start_iggy
  out="$("$iggy/iggy-bench" -m "$SIZE" -P "$BATCH" -b "$((MESSAGES / BATCH))" \
    pinned-producer --producers 1 --streams 1 tcp --server-address "127.0.0.1:$IGGY_PORT" 2>&1)"
  record "iggy producer" "$(iggy_rate Producers "$out")"
  record "iggy producer: server ns/message" "$(server_cpu_per_message)"
  stop_server
  start_iggy
  out="$("$iggy/iggy-bench" -m "$SIZE" -P "$BATCH" -b "$((MESSAGES / BATCH))" \
    balanced-producer-and-consumer-group --partitions 2 --producers 1 --consumers 2 \
    tcp --server-address "127.0.0.1:$IGGY_PORT" 2>&1)"
  record "iggy producer+group (produced)" "$(iggy_rate Producers "$out")"
  record "iggy producer+group (consumed)" "$(iggy_rate Consumers "$out")"
  record "iggy producer+group: server ns/message" "$(server_cpu_per_message)"
  stop_server

  for fsync in batch never; do
    start_ours "$fsync"
    json="$("$ours/broker" bench publish --addr "$addr" --producers 1 --partitions 2 --size "$SIZE" \
      --publish-batch "$BATCH" --depth 8 --records "$MESSAGES" --retention limits --json)"
    record "ours --fsync $fsync producer" "$(json_field "r['records_per_sec']" <<<"$json")"
    record "ours --fsync $fsync producer: server ns/record" "$(server_cpu_per_message)"
    stop_server
  done
  start_ours batch
  json="$("$ours/broker" bench fetch --addr "$addr" --producers 1 --consumers 2 --partitions 2 \
    --size "$SIZE" --publish-batch "$BATCH" --batch "$BATCH" --depth 8 --records "$MESSAGES" \
    --retention limits --json)"
  record "ours --fsync batch producer+group (produced)" "$(json_field "r['records_per_sec']" <<<"$json")"
  record "ours --fsync batch producer+group (consumed)" \
    "$(json_field "r['groups'][0]['consumed'] / r['elapsed_secs']" <<<"$json")"
  record "ours --fsync batch producer+group: server ns/record" "$(server_cpu_per_message)"
  stop_server
done

echo
echo "| workload | per round (messages or records/s; server CPU in ns) | median |"
echo "|---|---|---:|"
for key in "iggy producer" "ours --fsync batch producer" "ours --fsync never producer" \
  "iggy producer+group (produced)" "ours --fsync batch producer+group (produced)" \
  "iggy producer+group (consumed)" "ours --fsync batch producer+group (consumed)" \
  "iggy producer: server ns/message" "ours --fsync batch producer: server ns/record" \
  "ours --fsync never producer: server ns/record" \
  "iggy producer+group: server ns/message" "ours --fsync batch producer+group: server ns/record"; do
  values="${results[$key]}"
  median="$(tr ' ' '\n' <<<"$values" | grep . | sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}')"
  echo "| $key | $values | $median |"
done
