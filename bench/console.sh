#!/usr/bin/env bash
# How fast the web console answers on a broker with many topics: starts a release
# broker-server with --console-listen on loopback, creates TOPICS topics (one group on every
# tenth), and times each API call the pages make (median and slowest of ROUNDS calls, with
# curl), and the server's resident memory before and after the console's history has sampled
# them.
#
#   TOPICS=10000 ROUNDS=20 bench/console.sh
#
# Everything stays on 127.0.0.1; the server is stopped by its PID at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

TOPICS="${TOPICS:-10000}"
ROUNDS="${ROUNDS:-20}"
PARALLEL="${PARALLEL:-4}"

cargo build --release -q -p broker-server -p broker-cli --bins
bin="$PWD/target/release"
work="$(mktemp -d)"
server_pid=""
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

"$bin/broker-server" --listen 127.0.0.1:0 --console-listen 127.0.0.1:0 \
  --max-topics "$((TOPICS + 10))" >"$work/out" 2>"$work/log" &
server_pid=$!
for _ in $(seq 100); do
  [ "$(wc -l <"$work/out")" -ge 2 ] && break
  sleep 0.1
done
addr="$(sed -n 's/^listening on //p' "$work/out")"
console="$(sed -n 's/^console on //p' "$work/out")"
[ -n "$addr" ] && [ -n "$console" ] || { echo "the server did not start:"; cat "$work/log"; exit 1; }

echo "creating $TOPICS topics (a group on every tenth) ..."
export ADDR="$addr"
start=$SECONDS
seq -f "topic-%05g" 0 $((TOPICS - 1)) |
  xargs -P "$PARALLEL" -n 50 sh -c 'shift; for t; do "$0" --addr "$ADDR" create "$t" --partitions 1 >/dev/null || exit 255; done' \
    "$bin/broker" -
seq -f "topic-%05g" 0 10 $((TOPICS - 1)) |
  xargs -P "$PARALLEL" -n 50 sh -c 'shift; for t; do "$0" --addr "$ADDR" join "$t" --group g --member m >/dev/null || exit 255; done' \
    "$bin/broker" -
echo "created in $((SECONDS - start)) s"

rss() { awk '/^VmRSS/ {print $2 / 1024 " MiB"}' "/proc/$server_pid/status"; }
echo "server RSS before the history samples them: $(rss)"
sleep 6
echo "server RSS after a sample of every topic: $(rss)"

# Median and slowest of ROUNDS calls of $1, in milliseconds, and the answer's size.
time_call() {
  local path="$1" times=() bytes=0
  for _ in $(seq "$ROUNDS"); do
    read -r seconds size < <(curl -s -o /dev/null -w '%{time_total} %{size_download}\n' "$console${path#/}")
    times+=("$seconds")
    bytes="$size"
  done
  printf '%s\n' "${times[@]}" | sort -n | awk -v path="$path" -v bytes="$bytes" '
    { t[NR] = $1 * 1000 }
    END { printf "| `%s` | %.1f | %.1f | %d |\n", path, t[int((NR + 1) / 2)], t[NR], bytes }'
}

echo
echo "| call | median ms | slowest ms | bytes |"
echo "|---|---:|---:|---:|"
time_call "/"
time_call "/api/overview"
time_call "/api/topics?page=1"
time_call "/api/topics?page=$((TOPICS / 50))"
time_call "/api/topics?q=topic-0999"
time_call "/api/groups?page=1"
time_call "/api/topic?name=topic-05000"
time_call "/api/records?topic=topic-05000&partition=0"
time_call "/api/dead-letters"
echo
echo "server RSS at the end: $(rss)"
