#!/usr/bin/env bash
# What the metrics endpoint costs: the same workloads against broker-server without and with
# --metrics-listen, alternating, ROUNDS rounds (3 by default), each run bounded by a timeout.
# Prints each run as a JSON line on standard error and a table of medians on standard output.
#
# Usage: bench/metrics-overhead.sh [ROUNDS]   (after `cargo build --release --bins`)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
bin=target/release
work=$(mktemp -d)
trap 'kill $pid 2>/dev/null || true; rm -rf "$work"' EXIT
pid=
start() {
  "$bin/broker-server" --listen 127.0.0.1:0 --capacity 1000 --log-level warn "$@" \
    >"$work/out" 2>"$work/err" &
  pid=$!
  for _ in $(seq 100); do grep -q listening "$work/out" && break; sleep 0.05; done
  addr=$(sed -n 's/^listening on //p' "$work/out")
}
workloads=(
  "publish --producers 8 --depth 64 --records 400000 --retention limits"
  "ack --producers 4 --consumers 4 --records 200000"
  "publish --producers 1 --depth 1 --records 20000"
)
for round in $(seq "$rounds"); do
  for metrics in off on; do
    if [ "$metrics" = on ]; then start --metrics-listen 127.0.0.1:0; else start; fi
    for workload in "${workloads[@]}"; do
      # shellcheck disable=SC2086 # the workload is its words
      result=$(timeout 120 "$bin/broker" --addr "$addr" bench $workload --json | tr -d '\n')
      printf '{"round":%s,"metrics":"%s","workload":"%s","result":%s}\n' \
        "$round" "$metrics" "$workload" "$result" | tee -a "$work/runs.jsonl" >&2
    done
    kill -TERM "$pid"
    wait "$pid" || true
  done
done
python3 - "$work/runs.jsonl" <<'PY'
import json, statistics, sys
runs = [json.loads(line) for line in open(sys.argv[1])]
print("| workload | records/s without | records/s with | ratio | p50 without | p50 with |")
print("|----------|------------------:|---------------:|------:|------------:|---------:|")
for workload in dict.fromkeys(run["workload"] for run in runs):
    def median(metrics, pick):
        return statistics.median(pick(run["result"]) for run in runs
                                 if run["workload"] == workload and run["metrics"] == metrics)
    rate = lambda result: result["records_per_sec"]
    p50 = lambda result: result["publish_latency"]["p50_us"]
    off, on = median("off", rate), median("on", rate)
    print(f"| `{workload}` | {off:,.0f} | {on:,.0f} | {on / off:.2f} | "
          f"{median('off', p50):.1f} µs | {median('on', p50):.1f} µs |")
PY
