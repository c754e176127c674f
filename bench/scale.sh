#!/usr/bin/env bash
# The log at scale, on disk: RECORDS (10 million by default) records of SIZE bytes published
# into one partition of a broker-server with --data-dir, the server restarted, then everything
# consumed from the start by a new group (read from disk). Prints server memory (RSS) empty,
# after publishing, after the restart and after consuming, disk bytes per record, publish and
# cold-read throughput, and the restart time with every record retained. MAX_MEMORY, when set,
# is the server's --max-memory (with a data directory: the records held in memory, which
# leave it once written); the peak RSS while publishing is printed beside it.
# Loopback only; a bounded amount of work; stops what it started.
#
#   bench/scale.sh                       # RECORDS=10000000 SIZE=100 FSYNC=batch
#   RECORDS=1000000 FSYNC=always bench/scale.sh
#   MAX_MEMORY=134217728 bench/scale.sh  # a 128 MiB budget
set -euo pipefail
cd "$(dirname "$0")/.."

RECORDS="${RECORDS:-10000000}"
SIZE="${SIZE:-100}"
FSYNC="${FSYNC:-batch}"
BATCH="${BATCH:-100}"
MAX_MEMORY="${MAX_MEMORY:-}"
memory_flags=()
[ -n "$MAX_MEMORY" ] && memory_flags=(--max-memory "$MAX_MEMORY")

echo "building release binaries..." >&2
cargo build --release --locked -q -p broker-server -p broker-cli
broker=target/release/broker

workdir="$(mktemp -d)"
data="$workdir/data"
server_pid=""
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null || true
  rm -rf "$workdir"
}
trap cleanup EXIT

start() { # sets started_secs: the seconds from start to listening
  local began; began="$(date +%s.%N)"
  : >"$workdir/server.out"
  target/release/broker-server --listen 127.0.0.1:0 --data-dir "$data" --fsync "$FSYNC" \
    --capacity 2147483647 --log-level warn "${memory_flags[@]}" \
    >"$workdir/server.out" 2>>"$workdir/server.err" &
  server_pid=$!
  for _ in $(seq 1 6000); do grep -q '^listening on ' "$workdir/server.out" && break; sleep 0.01; done
  grep -q '^listening on ' "$workdir/server.out" || { cat "$workdir/server.err" >&2; exit 1; }
  export BROKER_ADDR="$(sed -n 's/^listening on //p' "$workdir/server.out")"
  started_secs="$(python3 -c "print(f'{$(date +%s.%N) - $began:.2f}')")"
}
stop() { kill "$server_pid"; wait "$server_pid" 2>/dev/null || true; server_pid=""; }
rss() { awk '/^VmRSS/ { print $2 * 1024 }' "/proc/$server_pid/status"; }
peak_rss() { awk '/^VmHWM/ { print $2 * 1024 }' "/proc/$server_pid/status"; }
json() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }
mib() { python3 -c "print(f'{$1 / 1048576:.1f} MiB')"; }

start
rss_empty="$(rss)"
echo "publishing $RECORDS records of $SIZE bytes (--fsync $FSYNC, batches of $BATCH)..." >&2
report="$($broker bench publish --records "$RECORDS" --size "$SIZE" --partitions 1 \
  --producers 2 --depth 16 --publish-batch "$BATCH" --keep-topic --json)"
topic="$(echo "$report" | json 'd["topic"]')"
publish_rate="$(echo "$report" | json 'round(d["records_per_sec"])')"
published="$(echo "$report" | json 'd["published"]')"
rss_published="$(rss)"
rss_peak="$(peak_rss)"
disk="$(du -sb "$data" | cut -f1)"
# Idle, the allocator's background thread hands the memory freed by the last checkpoint back
# to the system within a second or two.
sleep 5
rss_idle="$(rss)"

stop
start
restart_secs="$started_secs"
rss_restarted="$(rss)"
disk_restarted="$(du -sb "$data" | cut -f1)"
# The allocator hands freed memory back to the system after a few seconds.
sleep 15
rss_settled="$(rss)"
end="$($broker describe "$topic" --json | json 'd["topics"][0]["partitions"][0]["end_offset"]')"

echo "consuming them from the start with a new group (from disk)..." >&2
began="$(date +%s.%N)"
$broker consume "$topic" --group scale --member m --mode fetch --batch 10000 --stay \
  >/dev/null 2>"$workdir/consume.err"
consume_secs="$(python3 -c "print($(date +%s.%N) - $began)")"
consumed="$(sed -n 's/^consumed \([0-9]*\) records\?$/\1/p' "$workdir/consume.err")"
rss_consumed="$(rss)"

printf '%-44s %s\n' \
  "records published" "$published ($publish_rate records/s)" \
  "records consumed from the start" "$consumed ($(python3 -c "print(round($consumed / $consume_secs))") records/s)" \
  "data directory, after publishing" "$(mib "$disk") ($(python3 -c "print(f'{$disk / $published:.1f}')") bytes per record)" \
  "data directory, after the restart" "$(mib "$disk_restarted") ($(python3 -c "print(f'{$disk_restarted / $published:.1f}')") bytes per record)" \
  "server RSS, empty" "$(mib "$rss_empty")" \
  "server RSS, peak while publishing" "$(mib "$rss_peak") (--max-memory ${MAX_MEMORY:-default, 1 GiB})" \
  "server RSS, after publishing" "$(mib "$rss_published")" \
  "server RSS, 5 s later (idle)" "$(mib "$rss_idle")" \
  "restart (start to listening)" "${restart_secs} s" \
  "server RSS, after the restart" "$(mib "$rss_restarted")" \
  "server RSS, 15 s after the restart" "$(mib "$rss_settled")" \
  "end offset after the restart" "$end" \
  "server RSS, after consuming everything" "$(mib "$rss_consumed")"
[ "$consumed" = "$published" ] && [ "$end" = "$published" ] || { echo "records lost" >&2; exit 1; }
