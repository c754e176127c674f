#!/usr/bin/env bash
# A single broker with --shards 1 against --shards 2 (or SHARDS="1 2 4"), side by side in one
# run: the same workloads over several topics (TOPICS, default 4, one producer each), rounds
# alternating between the shard counts, then one table of medians: records per second, and the
# server's CPU per record (user + system time of broker-server over the phase, its CPU clock
# read before and after). With PERF=1, perf samples the server during one more publish phase of
# each shard count and reports the share of its CPU spent holding a shard's lock (applying a
# batch: `BrokerGuard::execute` and the checkpoint check, inclusive) and waiting for one
# (`std::sync::Mutex`'s contended path), to estimate what more cores would gain (installs
# Debian's linux-perf if perf is missing).
#
# The server runs with --worker-threads WORKERS (default 2) and the load generator with
# --threads LOAD_THREADS (default 1) on the same host: on this 2-core machine they share the
# cores, so the shards can gain little here; the lock's share says how much a bigger host can.
# DATA=1 gives the server a data directory (--fsync batch) in a temporary directory.
# Loopback only; stops by itself and stops what it started.
#
#   bench/shards.sh                          # RECORDS=2000000 ROUNDS=3 SHARDS="1 2" TOPICS=4
#   DATA=1 PERF=1 RECORDS=1000000 bench/shards.sh
set -euo pipefail
cd "$(dirname "$0")/.."

RECORDS="${RECORDS:-2000000}"
ROUNDS="${ROUNDS:-3}"
SHARDS="${SHARDS:-1 2}"
TOPICS="${TOPICS:-4}"
WORKERS="${WORKERS:-2}"
LOAD_THREADS="${LOAD_THREADS:-1}"
DATA="${DATA:-0}"
PERF="${PERF:-0}"

if [ "$PERF" = 1 ] && ! command -v perf >/dev/null; then
  echo "installing perf..." >&2
  apt-get update -qq && apt-get install -y -qq linux-perf >/dev/null
fi
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

cpu_ns() { # pid -> CPU nanoseconds of the whole process so far
  python3 -c '
import sys, time
print(time.clock_gettime_ns(((~int(sys.argv[1])) << 3) | 2))' "$1"
}

start_server() { # shards
  local flags=(--listen 127.0.0.1:0 --capacity 1000 --log-level warn
    --worker-threads "$WORKERS" --shards "$1")
  if [ "$DATA" = 1 ]; then
    rm -rf "$workdir/data"
    flags+=(--data-dir "$workdir/data" --fsync batch)
  fi
  target/release/broker-server "${flags[@]}" >"$workdir/server.out" 2>"$workdir/server.err" &
  server_pid=$!
  for _ in $(seq 1 100); do grep -q '^listening on ' "$workdir/server.out" && break; sleep 0.05; done
  BROKER_ADDR="$(sed -n 's/^listening on //p' "$workdir/server.out")"
  export BROKER_ADDR
}

stop_server() {
  kill "$server_pid"
  wait "$server_pid" 2>/dev/null || true
  server_pid=""
}

# The workloads: name, then `broker bench` arguments (records added per phase).
workloads=(
  "publish|publish --publish-batch 100 --depth 16 --retention limits"
  "publish-1|publish --depth 64 --retention limits"
  "fetch|fetch --publish-batch 100 --depth 16"
)
records_of() { # workload name -> records of its phase
  case "$1" in
    publish-1) echo $((RECORDS / 4)) ;;
    fetch) echo $((RECORDS / 2)) ;;
    *) echo "$RECORDS" ;;
  esac
}

results="$workdir/results"
: >"$results"
for round in $(seq 1 "$ROUNDS"); do
  for shards in $SHARDS; do
    start_server "$shards"
    for entry in "${workloads[@]}"; do
      name="${entry%%|*}"
      read -r -a args <<<"${entry#*|}"
      records="$(records_of "$name")"
      before="$(cpu_ns "$server_pid")"
      "$broker" bench "${args[@]}" --producers "$TOPICS" --topics "$TOPICS" \
        --partitions 16 --records "$records" --threads "$LOAD_THREADS" --json >"$workdir/report"
      after="$(cpu_ns "$server_pid")"
      python3 - "$name" "$shards" "$before" "$after" "$workdir/report" >>"$results" <<'EOF'
import json, sys
name, shards, before, after = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
report = json.load(open(sys.argv[5]))
assert report["check_passed"], report
rate = report["records_per_sec"]
cpu = (after - before) / 1e3 / max(report["published"], 1)
print(json.dumps({"workload": name, "shards": int(shards), "rate": rate, "cpu_us": cpu}))
EOF
      echo "round $round, --shards $shards, $name: $(tail -1 "$results")" >&2
    done
    stop_server
  done
done

python3 - "$results" "$SHARDS" <<'EOF'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
shards = [int(s) for s in sys.argv[2].split()]
base = shards[0]
names = list(dict.fromkeys(row["workload"] for row in rows))
def median(name, count, field):
    return statistics.median(r[field] for r in rows if r["workload"] == name and r["shards"] == count)
header = ["workload"] + [f"--shards {s} rec/s" for s in shards] + [f"ratio {s}/{base}" for s in shards[1:]] \
    + [f"--shards {s} server µs/rec" for s in shards]
print("| " + " | ".join(header) + " |")
print("|" + "---|" * len(header))
for name in names:
    rates = [median(name, s, "rate") for s in shards]
    cpus = [median(name, s, "cpu_us") for s in shards]
    cells = [name] + [f"{r:,.0f}" for r in rates] + [f"{r / rates[0]:.2f}x" for r in rates[1:]] \
        + [f"{c:.2f}" for c in cpus]
    print("| " + " | ".join(cells) + " |")
EOF

if [ "$PERF" = 1 ]; then
  echo
  echo "Where the server's CPU goes during a publish phase (perf, inclusive):"
  for shards in $SHARDS; do
    start_server "$shards"
    # DWARF call graphs: the release build keeps no frame pointers.
    perf record -q -F 499 --call-graph dwarf,16384 -p "$server_pid" -o "$workdir/perf.data" \
      2>/dev/null &
    perf_pid=$!
    sleep 0.5
    "$broker" bench publish --publish-batch 100 --depth 16 --retention limits \
      --producers "$TOPICS" --topics "$TOPICS" --partitions 16 --records "$RECORDS" \
      --threads "$LOAD_THREADS" --json >/dev/null
    kill -INT "$perf_pid"
    wait "$perf_pid" 2>/dev/null || true
    stop_server
    perf report -i "$workdir/perf.data" --children --stdio 2>/dev/null \
      | python3 -c '
import re, sys
shards = sys.argv[1]
held = waiting = 0.0
for line in sys.stdin:
    m = re.match(r"\s+([\d.]+)%\s+[\d.]+%\s+\S+\s+\S+\s+\[\.\]\s+(.+)$", line)
    if not m:
        continue
    share, symbol = float(m.group(1)), m.group(2)
    if symbol.startswith(("broker_server::broker::BrokerGuard::execute",
                          "broker_server::broker::BrokerGuard::maybe_checkpoint")):
        held += share
    if "Mutex>::lock_contended" in symbol:
        waiting = max(waiting, share)
print(f"--shards {shards}: {held:.1f}% of the server CPU holding a shard lock (applying), "
      f"{waiting:.1f}% waiting for a lock (std Mutex::lock_contended)")
' "$shards"
  done
fi
