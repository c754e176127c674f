#!/usr/bin/env bash
# Bytes written to disk per byte of payload by a broker-server with --data-dir: RECORDS records
# of SIZE bytes published (PRODUCERS connections x DEPTH requests in flight, batches of BATCH)
# into a new topic of PARTITIONS partitions with limits retention (every record is kept), once
# per --fsync policy in FSYNCS, each on a fresh server and data directory. For each: the bytes
# the server process wrote (write_bytes of /proc/PID/io: what reached the block layer,
# checkpoints and their record segments included, counted after the server's clean stop), the
# bytes left in the data directory, and both per byte of payload. A broker that writes each
# record once writes about as much as it keeps.
#
#   bench/write-amplification.sh                  # RECORDS=2000000 SIZE=100 FSYNCS="batch always"
#   RECORDS=500000 FSYNCS=batch bench/write-amplification.sh
#
# The data directory is under TMPDIR (a disk, not a tmpfs: a tmpfs counts no write_bytes).
# Loopback only; a bounded amount of work; stops what it started.
set -euo pipefail
cd "$(dirname "$0")/.."

RECORDS="${RECORDS:-2000000}"
SIZE="${SIZE:-100}"
PRODUCERS="${PRODUCERS:-2}"
DEPTH="${DEPTH:-64}"
BATCH="${BATCH:-100}"
PARTITIONS="${PARTITIONS:-2}"
FSYNCS="${FSYNCS:-batch always}"

echo "building release binaries..." >&2
cargo build --release --locked -q -p broker-server -p broker-cli
broker=target/release/broker

workdir="$(mktemp -d)"
server_pid=""
cleanup() {
  if [ -n "$server_pid" ]; then
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$workdir"
}
trap cleanup EXIT

mib() { python3 -c "print(f'{$1 / 1048576:,.1f}')"; }
ratio() { python3 -c "print(f'{$1 / $2:.2f}x')"; }

payload=$((RECORDS * SIZE))
printf '%s records of %s bytes (%s MiB of payload), %s partitions, batches of %s, %s x %s in flight\n\n' \
  "$RECORDS" "$SIZE" "$(mib "$payload")" "$PARTITIONS" "$BATCH" "$PRODUCERS" "$DEPTH"
printf '| `--fsync` | written MiB | written / payload | kept MiB | kept / payload | written / kept | records/s |\n'
printf '|---|---:|---:|---:|---:|---:|---:|\n'
for fsync in $FSYNCS; do
  data="$workdir/data-$fsync"
  target/release/broker-server --listen 127.0.0.1:0 --data-dir "$data" --fsync "$fsync" \
    --capacity 2147483647 --log-level warn >"$workdir/out" 2>"$workdir/err" &
  server_pid=$!
  for _ in $(seq 1 6000); do grep -q '^listening on ' "$workdir/out" && break; sleep 0.01; done
  grep -q '^listening on ' "$workdir/out" || { cat "$workdir/err" >&2; exit 1; }
  export BROKER_ADDR="$(sed -n 's/^listening on //p' "$workdir/out")"
  "$broker" bench publish --producers "$PRODUCERS" --depth "$DEPTH" --publish-batch "$BATCH" \
    --records "$RECORDS" --size "$SIZE" --partitions "$PARTITIONS" --retention limits --keep-topic \
    --json >"$workdir/bench.json"
  # Read before the process ends (its /proc entry goes with it), after a clean stop's last
  # writes: SIGTERM, then the counter once the server has closed its listener.
  kill -TERM "$server_pid"
  written=0
  for _ in $(seq 1 3000); do
    read_now="$(sed -n 's/^write_bytes: //p' "/proc/$server_pid/io" 2>/dev/null || true)"
    # Gone, or a zombie whose counters read as nothing: the last reading stands.
    [[ "$read_now" =~ ^[0-9]+$ ]] && [ "$read_now" -gt 0 ] || break
    written="$read_now"
    sleep 0.01
  done
  wait "$server_pid" 2>/dev/null || true
  server_pid=""
  kept="$(du -sb "$data" | cut -f1)"
  rate="$(python3 -c "import json; print(f\"{json.load(open('$workdir/bench.json'))['records_per_sec']:,.0f}\")")"
  printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$fsync" "$(mib "$written")" \
    "$(ratio "$written" "$payload")" "$(mib "$kept")" "$(ratio "$kept" "$payload")" \
    "$(ratio "$written" "$kept")" "$rate"
  rm -rf "$data"
done
