#!/usr/bin/env bash
# Side by side: broker-server, Redis Streams and NATS JetStream on loopback, the same workloads
# one after the other in one run (same record size, connections, pipeline depth and record
# count), then one table: workload, ours, Redis, ratio, NATS, ratio. Two more tables, row for
# row, give the CPU each phase cost per record (or request): the server's (user + system time of
# broker-server, redis-server or nats-server over the phase, from /proc/PID/stat) and the load
# generator's (`broker bench`'s own report; redis-benchmark's and bench/peers' from wait4).
# Installs redis-server, redis-tools and nats-server if missing, and builds bench/peers (the
# compiled Redis and NATS clients of the end-to-end rows). Loopback only; stops by itself and
# stops what it started.
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
redis_pid=""
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null || true
  [ -n "$nats_pid" ] && kill "$nats_pid" 2>/dev/null || true
  redis-cli -p "$redis_port" shutdown nosave >/dev/null 2>&1 || true
  [ -n "$redis_pid" ] && kill "$redis_pid" 2>/dev/null || true
  rm -rf "$workdir"
}
trap cleanup EXIT

target/release/broker-server --listen 127.0.0.1:0 --capacity 1000 --log-level warn \
  --worker-threads "$THREADS" \
  >"$workdir/server.out" 2>"$workdir/server.err" &
server_pid=$!
for _ in $(seq 1 100); do grep -q '^listening on ' "$workdir/server.out" && break; sleep 0.05; done
export BROKER_ADDR="$(sed -n 's/^listening on //p' "$workdir/server.out")"
bench() { timed "$broker" bench "$@" --threads "$THREADS" --size "$SIZE" --json; }
# In the foreground of its own background job, so that $! is its PID (for its CPU time).
redis-server --bind 127.0.0.1 --port "$redis_port" --save '' --appendonly no \
  --daemonize no --logfile "$workdir/redis.log" --dir "$workdir" >/dev/null 2>&1 &
redis_pid=$!
for _ in $(seq 1 100); do redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break; sleep 0.05; done
# NATS JetStream, in memory, on one thread (GOMAXPROCS=1) like the others.
GOMAXPROCS="$THREADS" nats-server -js -a 127.0.0.1 -p "$nats_port" -sd "$workdir/nats" \
  >"$workdir/nats.log" 2>&1 &
nats_pid=$!
for _ in $(seq 1 100); do grep -q 'Server is ready' "$workdir/nats.log" && break; sleep 0.05; done

json() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }

# CPU per record: user + system time over a phase, divided by its records or requests.
# A server's: the CPU clock of its process (clock_getcpuclockid: every thread, exited ones
# included), read before and after the phase. It is the utime + stime of /proc/PID/stat in
# nanoseconds: those fields are in clock ticks (1/CLK_TCK s, 10 ms at 100), a few ticks for a
# 200,000-record phase; they are the fallback where the clock cannot be read.
cpu_ns() { # pid -> CPU nanoseconds so far
  python3 -c '
import os, sys, time
pid = int(sys.argv[1])
try:
    print(time.clock_gettime_ns(((~pid) << 3) | 2))  # CPUCLOCK_SCHED of the whole process
except OSError:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    print((int(fields[11]) + int(fields[12])) * 10**9 // os.sysconf("SC_CLK_TCK"))
' "$1"
}
server_cpu() { # pid nanoseconds-before records -> µs per record
  python3 -c "print(f'{($(cpu_ns "$1") - $2) / 1e3 / $3:.2f}')"
}
# A load generator's: each one (broker bench, redis-benchmark, bench/peers) runs under timed,
# which writes the user and system seconds of the whole process (start-up included, and any
# children it waited for) from wait4 to $gen_cpu, in microseconds. (`broker bench --json` also
# reports its own over the run, cpu_user_s and cpu_system_s, but in 10 ms clock ticks.)
gen_cpu="$workdir/gen.cpu"
timed() { # command args...
  python3 -c '
import os, sys
pid = os.fork()
if pid == 0:
    try:
        os.execvp(sys.argv[2], sys.argv[2:])
    finally:
        os._exit(127)
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as out:
    out.write(f"{usage.ru_utime} {usage.ru_stime}\n")
sys.exit(os.waitstatus_to_exitcode(status))
' "$gen_cpu" "$@"
}
timed_cpu() { # records -> µs per record of the last timed command
  python3 -c "u, s = map(float, open('$gen_cpu').read().split()); print(f'{(u + s) * 1e6 / $1:.2f}')"
}
value="$(head -c "$SIZE" /dev/zero | tr '\0' x)"
# redis-benchmark's "latency summary" line: avg min p50 p95 p99 max (msec).
redis_xadd() { # clients pipeline requests -> "rps p50_us p99_us"
  timed redis-benchmark -p "$redis_port" -n "$3" -c "$1" -P "$2" XADD "bench-$1-$2" '*' f "$value" 2>/dev/null \
    | tr '\r' '\n' | awk '
      /requests per second/ && /throughput summary/ { rps=$3 }
      /throughput summary/ { rps=$3 }
      /avg *min *p50/ { getline; p50=$3*1000; p99=$5*1000 }
      END { printf "%s %s %s\n", rps, p50, p99 }'
}

rows=()
# label ours redis ratio [nats nats-ratio]
row() { rows+=("$(printf '%-60s %12s %12s %8s %12s %8s' "$1" "$2" "$3" "$4" "${5:-}" "${6:-}")"); }
ratio() { python3 -c "print(f'{$1/$2:.2f}x' if $2 else '-')"; }
# The CPU tables, a row for each row of the first (empty where a row has no phase of its own):
# cpu_row label server-ours server-redis server-nats gen-ours gen-redis gen-nats [redis-note].
# The Redis column of "Producer handle / server alone" holds ours through --wire, noted so.
server_rows=()
gen_rows=()
cpu_cells() { # ours redis nats note
  local r="" n=""
  [ -n "$1" ] && [ -n "$2" ] && r="$(ratio "$1" "$2")"
  [ -n "$1" ] && [ -n "$3" ] && n="$(ratio "$1" "$3")"
  printf '%12s %12s %8s %12s %8s' "$1" "${2:+$2$4}" "$r" "$3" "$n"
}
cpu_row() {
  server_rows+=("$(printf '%-60s ' "$1")$(cpu_cells "$2" "$3" "$4" "${8:-}")")
  gen_rows+=("$(printf '%-60s ' "$1")$(cpu_cells "$5" "$6" "$7" "${8:-}")")
}
no_cpu_row() { cpu_row "$1" "" "" "" "" "" ""; }

# End to end: records/s counts records published AND acknowledged or committed. Redis and
# NATS are driven by compiled clients on one thread (bench/peers): Redis's producers pipeline
# 64 XADDs (or 1000, beside our batches of 1000), its consumers XREADGROUP a batch and XACK it
# with the next read; NATS's producers keep 64 async publishes in flight, its durable pull
# consumers fetch a batch and ack each message.
peer_e2e() { # server port records producers consumers batch depth
  timed "$peers" "$1" --port "$2" --records "$3" --size "$SIZE" --producers "$4" --consumers "$5" \
    --batch "$6" --depth "$7" | json 'int(d["records_per_sec"])'
}
peer_run() { # redis|nats records producers consumers batch depth: sets <peer>_rps, _cpu, _gen
  local peer="$1" pid port before rps; shift
  pid="${peer}_pid" port="${peer}_port"
  pid="${!pid}" port="${!port}"
  before="$(cpu_ns "$pid")"
  rps="$(peer_e2e "$peer" "$port" "$@")"
  printf -v "${peer}_rps" '%s' "$rps"
  printf -v "${peer}_cpu" '%s' "$(server_cpu "$pid" "$before" "$1")"
  printf -v "${peer}_gen" '%s' "$(timed_cpu "$1")"
}

echo "measuring..." >&2
# Memory per retained record: RSS growth while one topic fills 64 partitions x 1000 records.
rss() { awk '/^VmRSS/ { print $2 * 1024 }' "/proc/$server_pid/status"; }
before="$(rss)"
bench publish --producers 1 --depth 64 --records 64000 --keep-topic >/dev/null
after="$(rss)"
overhead="$(python3 -c "print(round(($after - $before) / 64000 - $SIZE))")"

ping_p50="$($broker bench ping --records "$LATENCY_REQUESTS" --json | json 'd["round_trip"]["p50_us"]')"

before="$(cpu_ns "$server_pid")"
ours="$(bench publish --producers 1 --depth 1 --records "$LATENCY_REQUESTS")"
ours_cpu="$(server_cpu "$server_pid" "$before" "$LATENCY_REQUESTS")"
ours_gen="$(timed_cpu "$LATENCY_REQUESTS")"
ours_p50="$(echo "$ours" | json 'd["publish_latency"]["p50_us"]')"
ours_p99="$(echo "$ours" | json 'd["publish_latency"]["p99_us"]')"
before="$(cpu_ns "$redis_pid")"
read -r redis_rps redis_p50 redis_p99 <<<"$(redis_xadd 1 1 "$LATENCY_REQUESTS")"
redis_cpu="$(server_cpu "$redis_pid" "$before" "$LATENCY_REQUESTS")"
redis_gen="$(timed_cpu "$LATENCY_REQUESTS")"
row "single publish, 1 conn, no pipelining: p50 (µs)" "$ours_p50" "$redis_p50" "$(ratio "$ours_p50" "$redis_p50")"
cpu_row "single publish, 1 conn, no pipelining: p50 (µs)" "$ours_cpu" "$redis_cpu" "" "$ours_gen" "$redis_gen" ""
row "single publish, 1 conn, no pipelining: p99 (µs)" "$ours_p99" "$redis_p99" "$(ratio "$ours_p99" "$redis_p99")"
cpu_row "single publish, 1 conn, no pipelining: p99 (µs)" "$ours_cpu" "$redis_cpu" "" "$ours_gen" "$redis_gen" ""
row "raw loopback ping-pong p50 (µs), ours / raw" "$ours_p50" "$ping_p50 (raw)" "$(ratio "$ours_p50" "$ping_p50")"
no_cpu_row "raw loopback ping-pong p50 (µs), ours / raw"
before="$(cpu_ns "$server_pid")"
handle="$(bench publish --handles --retention limits --producers 1 --depth 1 --records "$LATENCY_REQUESTS")"
handle_cpu="$(server_cpu "$server_pid" "$before" "$LATENCY_REQUESTS")"
handle_gen="$(timed_cpu "$LATENCY_REQUESTS")"
handle_p50="$(echo "$handle" | json 'd["publish_latency"]["p50_us"]')"
row "  ... one send through the Producer handle: p50 (µs)" "$handle_p50" "$redis_p50" "$(ratio "$handle_p50" "$redis_p50")"
cpu_row "  ... one send through the Producer handle: p50 (µs)" "$handle_cpu" "$redis_cpu" "" "$handle_gen" "$redis_gen" ""
row "  ... Producer handle p50 / raw ping-pong p50" "$handle_p50" "$ping_p50 (raw)" "$(ratio "$handle_p50" "$ping_p50")"
no_cpu_row "  ... Producer handle p50 / raw ping-pong p50"

# Limits retention: every publish is stored (the oldest records leave past --capacity), as
# every XADD is.
for conns in 1 8; do
  before="$(cpu_ns "$server_pid")"
  ours="$(bench publish --retention limits --producers "$conns" --depth 64 --records "$RECORDS")"
  ours_cpu="$(server_cpu "$server_pid" "$before" "$RECORDS")"
  ours_gen="$(timed_cpu "$RECORDS")"
  ours_rps="$(echo "$ours" | json 'int(d["requests_per_sec"])')"
  before="$(cpu_ns "$redis_pid")"
  read -r redis_rps _ _ <<<"$(redis_xadd "$conns" 64 "$RECORDS")"
  redis_cpu="$(server_cpu "$redis_pid" "$before" "$RECORDS")"
  redis_gen="$(timed_cpu "$RECORDS")"
  label="publish, $conns conn x depth 64: requests/s"
  row "$label" "$ours_rps" "${redis_rps%.*}" "$(ratio "$ours_rps" "$redis_rps")"
  cpu_row "$label" "$ours_cpu" "$redis_cpu" "" "$ours_gen" "$redis_gen" ""
  # The server alone: frames written straight to the socket, as redis-benchmark loads Redis.
  before="$(cpu_ns "$server_pid")"
  wire="$(bench publish --wire --retention limits --producers "$conns" --depth 64 --records "$RECORDS")"
  wire_cpu="$(server_cpu "$server_pid" "$before" "$RECORDS")"
  wire_gen="$(timed_cpu "$RECORDS")"
  wire_rps="$(echo "$wire" | json 'int(d["requests_per_sec"])')"
  label="  ... server alone (broker bench --wire)"
  row "$label" "$wire_rps" "${redis_rps%.*}" "$(ratio "$wire_rps" "$redis_rps")"
  cpu_row "$label" "$wire_cpu" "$redis_cpu" "" "$wire_gen" "$redis_gen" ""
  # What a service gets: one Producer per task, 64 sends in flight each, batched by the handle.
  before="$(cpu_ns "$server_pid")"
  handle="$(bench publish --handles --retention limits --producers "$conns" --depth 64 --records "$RECORDS")"
  handle_cpu="$(server_cpu "$server_pid" "$before" "$RECORDS")"
  handle_gen="$(timed_cpu "$RECORDS")"
  handle_rps="$(echo "$handle" | json 'int(d["records_per_sec"])')"
  label="  ... Producer handle, $conns task(s) x 64 sends: records/s"
  row "$label" "$handle_rps" "${redis_rps%.*}" "$(ratio "$handle_rps" "$redis_rps")"
  cpu_row "$label" "$handle_cpu" "$redis_cpu" "" "$handle_gen" "$redis_gen" ""
  label="  ... Producer handle / server alone"
  row "$label" "$handle_rps" "$wire_rps (wire)" "$(ratio "$handle_rps" "$wire_rps")"
  cpu_row "$label" "$handle_cpu" "$wire_cpu" "" "$handle_gen" "$wire_gen" "" " (wire)"
  peer_run nats "$RECORDS" "$conns" 0 1 64
  label="  ... beside NATS JetStream async publish, $conns conn(s) x 64 acks"
  row "$label" "$handle_rps" "" "" "$nats_rps" "$(ratio "$handle_rps" "$nats_rps")"
  cpu_row "$label" "$handle_cpu" "" "$nats_cpu" "$handle_gen" "" "$nats_gen"
done

# End to end: records/s counts records published AND acknowledged or committed.
# Each peer_run sets the Redis or NATS figures (throughput and CPU) of the rows after it.
e2e_row() { # label records redis_rps nats_rps bench-args...
  local label="$1" records="$2" redis_rps="$3" nats_rps="$4"; shift 4
  local ours ours_rps refused before ours_cpu ours_gen
  before="$(cpu_ns "$server_pid")"
  ours="$(bench "$@" --records "$records")"
  ours_cpu="$(server_cpu "$server_pid" "$before" "$records")"
  ours_gen="$(timed_cpu "$records")"
  ours_rps="$(echo "$ours" | json 'int(d["records_per_sec"])')"
  refused="$(echo "$ours" | json 'd["publish_refused_full"]')"
  row "$label ($refused full)" "$ours_rps" "$redis_rps" "$(ratio "$ours_rps" "$redis_rps")" \
    "$nats_rps" "$([ -n "$nats_rps" ] && ratio "$ours_rps" "$nats_rps")"
  cpu_row "$label ($refused full)" "$ours_cpu" "$redis_cpu" "$nats_cpu" "$ours_gen" "$redis_gen" "$nats_gen"
}
peer_run redis "$RECORDS" 2 2 100 64
peer_run nats "$RECORDS" 2 2 100 64
e2e_row "ack mode, 64 partitions, 2+2 conns: records/s" "$RECORDS" "$redis_rps" "$nats_rps" \
  ack --producers 2 --consumers 2 --depth 64
e2e_row "  ... ours publishing batches of 64" "$RECORDS" "$redis_rps" "$nats_rps" \
  ack --producers 1 --consumers 2 --depth 1 --publish-batch 64
e2e_row "  ... through the Producer and Consumer handles" "$RECORDS" "$redis_rps" "$nats_rps" \
  ack --handles --producers 2 --consumers 2 --depth 64
peer_run redis "$RECORDS" 2 1 1000 64
peer_run nats "$RECORDS" 2 1 1000 64
e2e_row "fetch/commit (batches of 1000), 2+1 conns: records/s" "$RECORDS" "$redis_rps" "$nats_rps" \
  fetch --producers 2 --consumers 1 --depth 64 --batch 1000
e2e_row "  ... through the Producer and Consumer handles" "$RECORDS" "$redis_rps" "$nats_rps" \
  fetch --handles --producers 2 --consumers 1 --depth 64 --batch 1000
# Four times the records, on both sides: at 3 M records/s a million take a third of a second,
# mostly starting and draining.
peer_run redis $((RECORDS * 4)) 1 2 1000 1000
nats_rps="" nats_cpu="" nats_gen=""
e2e_row "  ... batches of 1000 both ways, 1+2 conns, 4x records" $((RECORDS * 4)) "$redis_rps" "" \
  fetch --producers 1 --consumers 2 --depth 2 --publish-batch 1000 --batch 1000

header() { printf '\n%-60s %12s %12s %8s %12s %8s\n' "$1" "ours" "Redis 7" "ratio" "NATS JS" "ratio"; }
header "workload ($SIZE-byte records, $RECORDS records, $THREADS thread)"
printf '%s\n' "${rows[@]}"
header "server CPU per record or request (µs)"
printf '%s\n' "${server_rows[@]}"
header "load generator CPU per record or request (µs)"
printf '%s\n' "${gen_rows[@]}"
echo
echo "server memory per retained record beyond its $SIZE-byte payload: about $overhead bytes (RSS growth / 64,000 records)"
echo "(latency rows: lower is better; throughput rows: higher is better. Redis and NATS end-to-end clients are compiled Rust (bench/peers: the redis and async-nats crates) on one thread; ours are broker bench tasks.)"
echo "(CPU per record: user + system time over the row's phase divided by its records, or requests on the publish and single-publish rows; lower is better. Server: broker-server, redis-server or nats-server, its process's CPU clock (/proc/PID/stat's utime + stime, to the nanosecond). Load generator: the whole broker bench, redis-benchmark or bench/peers process, from wait4. Rows of one phase repeat its figures.)"
echo "(\"full\": publishes answered -1 because a partition was at capacity; end-to-end producers retry them after a back-off. Publish rows use limits retention, so every record is stored. Handle rows count records, which the Producer batches into requests by itself.)"
