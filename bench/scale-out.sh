#!/usr/bin/env bash
# Scaling out, side by side in one run: a single broker, a three-node cluster of one group, a
# three-node cluster of three groups whose leaders spread over the nodes (--cluster-data-groups
# 3), and, with LAYOUTS naming it, a five-node cluster of five groups of three replicas each
# (--cluster-data-groups 5 --cluster-replicas 3: each node applies three fifths of the
# records). Every node runs in a container of the image (docker/build.sh) with
# the same CPU quota (NODE_CPUS, `docker run --cpus`), as if each had a host of its own; the
# load generator (`broker bench` from the image) runs in a container of its own (BENCH_CPUS) on
# the same Docker network, which the script creates as internal (nothing in it reaches out;
# Docker publishes no port of a container attached only to an internal network, so the load
# generator runs on it too). Each round runs every layout in turn (ROUNDS rounds); the table
# gives medians of records per second and of the p50 and p99 of one publish, and each layout's
# ratio to the one-group cluster and to the single broker.
#
# The workload: TOPICS topics (default 3), one producer connection each (it follows NotLeader
# to its topic's leader), DEPTH requests in flight, batches of BATCH records of SIZE bytes,
# RECORDS records in all, --fsync batch. Bounded work; stops and removes what it started.
# On a 2-core host, three nodes at 0.5 CPU and the load generator share the cores: quote the
# ratios, measured side by side, not the absolute figures.
#
#   bench/scale-out.sh   # RECORDS=1000000 ROUNDS=3 NODE_CPUS=0.5 BENCH_CPUS=0.5 TOPICS=3 DEPTH=16 BATCH=100 SIZE=100
#   LAYOUTS="single one-group spread five" NODE_CPUS=0.2 BENCH_CPUS=0.8 TOPICS=5 bench/scale-out.sh
set -euo pipefail
cd "$(dirname "$0")/.."

RECORDS="${RECORDS:-1000000}"
ROUNDS="${ROUNDS:-3}"
NODE_CPUS="${NODE_CPUS:-0.5}"
BENCH_CPUS="${BENCH_CPUS:-0.5}"
TOPICS="${TOPICS:-3}"
DEPTH="${DEPTH:-16}"
BATCH="${BATCH:-100}"
SIZE="${SIZE:-100}"
LAYOUTS="${LAYOUTS:-single one-group spread}"

if ! docker info >/dev/null 2>&1; then
  echo "no Docker engine answers (docker info failed)" >&2
  exit 1
fi

tag="broker-server:scale-out-$$"
prefix="broker-scale-out-$$"
net="$prefix-net"
workdir="$(mktemp -d)"
containers=()
cleanup() {
  docker rm -f "${containers[@]}" >/dev/null 2>&1 || true
  docker network rm "$net" >/dev/null 2>&1 || true
  docker rmi -f "$tag" >/dev/null 2>&1 || true
  rm -rf "$workdir"
}
trap cleanup EXIT

echo "building the image..." >&2
docker/build.sh "$tag" >/dev/null
docker network create --internal "$net" >/dev/null

stop_nodes() {
  docker rm -f "${containers[@]}" >/dev/null 2>&1 || true
  containers=()
}

# Starts a layout's nodes (recorded in `containers`: not in a subshell); sets `addresses` to
# what a client is given.
start_layout() { # single | one-group | spread | five
  local layout=$1
  local common=(-e BROKER_CAPACITY=2147483647 -e BROKER_MAX_MEMORY=2147483648
    -e BROKER_FSYNC=batch -e BROKER_LOG_LEVEL=info -e BROKER_DATA_DIR=/data)
  if [ "$layout" = single ]; then
    local name="$prefix-single"
    docker run -d --name "$name" --network "$net" --network-alias node1 --cpus "$NODE_CPUS" \
      "${common[@]}" "$tag" >/dev/null
    containers+=("$name")
    addresses="node1:9092"
    return
  fi
  local groups=1 count=3
  [ "$layout" = spread ] && groups=3
  [ "$layout" = five ] && groups=5 && count=5
  local members="" ids_list
  ids_list="$(seq 1 "$count")"
  addresses=""
  for id in $ids_list; do
    members+="${members:+,}$id=node$id:9093/node$id:9092"
    addresses+="${addresses:+,}node$id:9092"
  done
  for id in $ids_list; do
    local name="$prefix-$layout-$id"
    docker run -d --name "$name" --network "$net" --network-alias "node$id" --cpus "$NODE_CPUS" \
      "${common[@]}" -e BROKER_NODE_ID="$id" -e BROKER_CLUSTER_MEMBERS="$members" \
      -e BROKER_CLUSTER_DATA_GROUPS="$groups" -e BROKER_CLUSTER_REPLICAS=3 "$tag" >/dev/null
    containers+=("$name")
  done
}

broker() { # addresses, args...
  local addresses=$1
  shift
  docker run --rm --network "$net" --cpus "$BENCH_CPUS" --entrypoint /usr/local/bin/broker \
    -e BROKER_ADDR="$addresses" "$tag" "$@"
}

# Waits until the layout serves; for the spread and five layouts, also until each node leads
# one group (from the nodes' logs: the lines `this node leads ...` less `this node no longer
# leads ...`).
wait_ready() { # layout, addresses
  local count=3
  [ "$1" = five ] && count=5
  for _ in $(seq 1 120); do
    if broker "$2" describe >/dev/null 2>&1; then
      case "$1" in spread | five) ;; *) return 0 ;; esac
      local balanced=1
      for id in $(seq 1 "$count"); do
        local log
        log="$(docker logs "$prefix-$1-$id" 2>&1)"
        local won lost
        won="$(grep -c 'this node leads' <<<"$log" || true)"
        lost="$(grep -c 'this node no longer leads' <<<"$log" || true)"
        [ $((won - lost)) = 1 ] || balanced=0
      done
      [ "$balanced" = 1 ] && return 0
    fi
    sleep 1
  done
  echo "the $1 layout did not become ready" >&2
  exit 1
}

results="$workdir/results"
: >"$results"
for round in $(seq 1 "$ROUNDS"); do
  for layout in $LAYOUTS; do
    start_layout "$layout"
    wait_ready "$layout" "$addresses"
    broker "$addresses" bench publish --producers "$TOPICS" --topics "$TOPICS" \
      --partitions 4 --depth "$DEPTH" --publish-batch "$BATCH" --size "$SIZE" \
      --records "$RECORDS" --retention limits --json >"$workdir/report"
    python3 - "$layout" "$workdir/report" >>"$results" <<'EOF'
import json, sys
report = json.load(open(sys.argv[2]))
assert report["check_passed"], report
latency = report["publish_latency"]
print(json.dumps({"layout": sys.argv[1], "rate": report["records_per_sec"],
                  "p50": latency["p50_us"], "p99": latency["p99_us"]}))
EOF
    echo "round $round, $layout: $(tail -1 "$results")" >&2
    stop_nodes
  done
done

python3 - "$results" "$NODE_CPUS" "$ROUNDS" $LAYOUTS <<'EOF'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
layouts = sys.argv[4:]
print(f"each node --cpus {sys.argv[2]}; medians of {sys.argv[3]} rounds")
print(f"{'layout':<10} {'records/s':>12} {'p50 µs':>10} {'p99 µs':>10} {'vs one group':>13} {'vs single':>10}")
median = lambda layout, key: statistics.median(r[key] for r in rows if r["layout"] == layout)
for layout in layouts:
    rate = median(layout, "rate")
    print(f"{layout:<10} {rate:>12,.0f} {median(layout, 'p50'):>10,.0f} {median(layout, 'p99'):>10,.0f}"
          f" {rate / median('one-group', 'rate'):>12.2f}x {rate / median('single', 'rate'):>9.2f}x")
EOF
