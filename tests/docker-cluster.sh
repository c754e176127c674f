#!/usr/bin/env bash
# End-to-end test of a three-node cluster of the Docker image. The three nodes run on a Docker
# network this test creates as internal (nothing in it reaches out, and nothing outside but
# this machine's Docker engine reaches in). A producer and an ack-mode consumer (`broker bench
# ack --handles`: the Producer and Consumer handles, which check that every record is consumed
# once and in order) run in a fourth container on the same network; while they run, the
# leader's container is stopped (`docker stop`). The run must end with every record published
# consumed, none stored twice or out of order (records whose acknowledgement was lost with the
# leader are delivered again: at least once); the two nodes left elect a new leader; the
# stopped node, started again, catches up. The nodes run three Raft groups, as
# docker/compose-cluster.yaml does (each must end with a leader and every node caught up).
# Docker publishes no port of a container attached only to an internal network
# (moby/moby#36174), so every client runs on that network (`broker` from the image), none on the
# host. Also checks docker/compose-cluster.yaml. Skipped, saying so, without a Docker engine.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! docker info >/dev/null 2>&1; then
  echo "SKIPPED: no Docker engine answers (docker info failed); the cluster was not tested"
  exit 0
fi

tag="broker-server:cluster-test-$$"
prefix="broker-cluster-test-$$"
net="$prefix-net"
bench="$prefix-bench"
nodes=("$prefix-1" "$prefix-2" "$prefix-3")
cleanup() {
  docker rm -f "${nodes[@]}" "$bench" >/dev/null 2>&1 || true
  docker network rm "$net" >/dev/null 2>&1 || true
  docker rmi -f "$tag" >/dev/null 2>&1 || true
}
trap cleanup EXIT

fail() {
  echo "FAILED: $*"
  for container in "${nodes[@]}" "$bench"; do
    echo "--- docker logs $container (last 20 lines)"
    docker logs --tail 20 "$container" 2>&1 || true
  done
  exit 1
}

start="$(date +%s)"
docker/build.sh "$tag" >/dev/null
docker network create --internal "$net" >/dev/null

# Peers reach each other, and clients reach them, by the nodes' names on the network.
members="1=node1:9093/node1:9092,2=node2:9093/node2:9092,3=node3:9093/node3:9092"
addresses="node1:9092,node2:9092,node3:9092"
for id in 1 2 3; do
  docker run -d --name "${nodes[id - 1]}" --network "$net" --network-alias "node$id" \
    -e BROKER_NODE_ID="$id" -e BROKER_CLUSTER_MEMBERS="$members" -e BROKER_DATA_DIR=/data \
    -e BROKER_CAPACITY=100000 -e BROKER_CLUSTER_DATA_GROUPS=3 "$tag" >/dev/null
done

# `broker` from the image, in a container of its own on the network.
broker() {
  docker run --rm --network "$net" --entrypoint /usr/local/bin/broker \
    -e BROKER_ADDR="$addresses" "$tag" "$@"
}

# The node that leads, from `broker cluster status --json` (empty while there is none).
leader_of() {
  python3 -c 'import json, sys; leader = json.load(sys.stdin)["leader"]; print(leader or "")'
}

# Waits (bounded) until a node leads and every node of "$1" (ids) answers and lacks no entry
# of the leader's log; prints the leader's id.
caught_up='
import json, sys
wanted = {int(n) for n in sys.argv[1].split()}
nodes = {n["node_id"]: n for n in json.load(sys.stdin)["nodes"]}
sys.exit(0 if all(nodes.get(n, {}).get("status") and nodes[n]["behind"] == 0 for n in wanted) else 1)
'
wait_for_cluster() {
  local status="" leader=""
  for _ in $(seq 1 60); do
    if status="$(broker cluster status --json 2>/dev/null)"; then
      leader="$(leader_of <<<"$status")"
      if [ -n "$leader" ] && python3 -c "$caught_up" "$1" <<<"$status"; then
        echo "$leader"
        return 0
      fi
    fi
    sleep 1
  done
  echo "the cluster did not settle; last status: $status" >&2
  return 1
}

leader="$(wait_for_cluster "1 2 3")" || fail "no leader among the three nodes"
echo "node $leader leads"

# Producers and an ack-mode group through the handles, for 15 s of publishing; the leader's
# container is stopped once 1,000 records are stored.
docker run -d --name "$bench" --network "$net" --entrypoint /usr/local/bin/broker \
  -e BROKER_ADDR="$addresses" "$tag" bench ack --handles --producers 2 --consumers 2 \
  --partitions 8 --records 100000000 --duration 15s --json >/dev/null
stored=0
for _ in $(seq 1 30); do
  stored="$(broker describe --json 2>/dev/null | python3 -c '
import json, sys
print(sum(p["end_offset"] for t in json.load(sys.stdin)["topics"] for p in t["partitions"]))
' || echo 0)"
  [ "$stored" -ge 1000 ] && break
  sleep 0.5
done
[ "$stored" -ge 1000 ] || fail "the bench stored only $stored records in 15 s"
docker stop "${nodes[leader - 1]}" >/dev/null
echo "stopped node $leader (docker stop)"

code="$(timeout 300 docker wait "$bench")" || fail "the bench did not end within 300 s"
report="$(docker logs "$bench" 2>/dev/null)"
[ "$code" = 0 ] || fail "the bench exited with $code: $report"
python3 - "$report" <<'PY' || fail "the bench's check failed: $report"
import json, sys
report = json.loads(sys.argv[1])
groups = report["groups"]
print(f"published {report['published']} records; p99 publish latency "
      f"{report['publish_latency']['p99_us'] / 1000:.0f} ms, max "
      f"{report['publish_latency']['max_us'] / 1000:.0f} ms (the failover)")
assert report["published"] > 0, "nothing was published"
for group in groups:
    print(f"group {group['group']}: consumed {group['consumed']}, duplicates "
          f"{group['duplicates']}, redelivered {group['redelivered']} (at least once), missing "
          f"{group['missing']}, out of order {group['out_of_order']}")
    assert group["missing"] == 0 and group["duplicates"] == 0 and group["out_of_order"] == 0
assert report["check_passed"]
PY

left=()
for id in 1 2 3; do [ "$id" = "$leader" ] || left+=("$id"); done
new_leader="$(wait_for_cluster "${left[*]}")" || fail "the two nodes left did not settle"
[ "$new_leader" != "$leader" ] || fail "the stopped node $leader still leads"
echo "node $new_leader leads after the stop"

docker start "${nodes[leader - 1]}" >/dev/null
wait_for_cluster "1 2 3" >/dev/null || fail "node $leader did not catch up after its restart"
echo "node $leader is back and caught up"

# As docker/compose-cluster.yaml, the nodes run three Raft groups: each has a leader, every
# node in each, none behind (bounded wait: the node back takes its share of leaders again).
groups_settled='
import json, sys
groups = json.load(sys.stdin)["groups"]
ok = len(groups) == 3 and all(
    g["leader"] and len(g["behind"]) == 3 and all(m["behind"] == 0 for m in g["behind"])
    for g in groups)
sys.exit(0 if ok else 1)
'
settled=""
for _ in $(seq 1 60); do
  status="$(broker cluster status --json 2>/dev/null || true)"
  if python3 -c "$groups_settled" <<<"$status" 2>/dev/null; then
    settled=1
    break
  fi
  sleep 1
done
[ -n "$settled" ] || fail "the three groups did not settle: $status"
echo "three groups, each with a leader, every node caught up"

# docker/compose-cluster.yaml: three nodes, each on its own volume and published on 127.0.0.1
# only, with the members list the nodes agree on. Validated as tests/docker.sh validates
# compose.yaml.
compose=docker/compose-cluster.yaml
grep -x 'name: broker-cluster' "$compose" >/dev/null || fail "$compose: no top-level name"
for id in 1 2 3; do
  grep -E "^ *- \"127\\.0\\.0\\.1:910$id:910$id\"$" "$compose" >/dev/null \
    || fail "$compose: node $id is not published on 127.0.0.1:910$id"
  grep -E "^ *- node$id:/data$" "$compose" >/dev/null || fail "$compose: node $id has no volume"
done
grep -E '^ *- "?[0-9]*:?910[0-9](:910[0-9])?"?$' "$compose" >/dev/null \
  && fail "$compose: a port is published on every interface"
# The monitoring profile: Prometheus and Grafana on 127.0.0.1 only, over files that exist.
for port in 9090 3000; do
  grep -E "^ *- \"127\\.0\\.0\\.1:$port:$port\"$" "$compose" >/dev/null \
    || fail "$compose: the monitoring profile's port $port is not published on 127.0.0.1 only"
done
for mounted in monitoring/prometheus.yml monitoring/alerts.yml \
  monitoring/grafana/provisioning/datasources/prometheus.yml \
  monitoring/grafana/provisioning/dashboards/broker.yml monitoring/grafana/dashboards/broker.json; do
  [ -f "$mounted" ] || fail "$compose: the monitoring profile mounts $mounted, which is missing"
done
if docker compose version >/dev/null 2>&1; then
  config="$(docker compose -f "$compose" config)" || fail "docker compose config: $compose is invalid"
elif command -v docker-compose >/dev/null 2>&1; then
  config="$(sed '/^name: /d' "$compose" | docker-compose -p broker-cluster -f - config)" \
    || fail "docker-compose config: $compose is invalid"
else
  config=""
  echo "SKIPPED $compose config: neither docker compose nor docker-compose is installed"
fi
if [ -n "$config" ]; then
  [ "$(grep -c 'BROKER_CLUSTER_MEMBERS: 1=node1:9093/127.0.0.1:9101,2=node2:9093/127.0.0.1:9102,3=node3:9093/127.0.0.1:9103' <<<"$config")" = 3 ] \
    || fail "compose config: the nodes do not share one members list"
  [ "$(grep -cE "BROKER_CLUSTER_DATA_GROUPS: [\"']?3[\"']?\$" <<<"$config")" = 3 ] \
    || fail "compose config: the nodes do not all run three groups"
fi
if docker compose version >/dev/null 2>&1; then
  monitoring="$(docker compose -f "$compose" --profile monitoring config)" \
    || fail "docker compose config: $compose's monitoring profile is invalid"
  grep -q 'prom/prometheus' <<<"$monitoring" || fail "the monitoring profile has no Prometheus"
  grep -q 'grafana/grafana' <<<"$monitoring" || fail "the monitoring profile has no Grafana"
fi

echo "OK: docker cluster test passed in $(($(date +%s) - start)) s"
