#!/usr/bin/env bash
# End-to-end test of the Docker image: build it, run it, talk to it with the `broker` CLI over
# the published port, stop it with `docker stop`, and check that it exited cleanly (status 0).
# Skipped, saying so, when no Docker engine answers.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! docker info >/dev/null 2>&1; then
  echo "SKIPPED: no Docker engine answers (docker info failed); the image was not tested"
  exit 0
fi

tag="broker-server:test-$$"
name="broker-test-$$"
docker/build.sh "$tag" >/dev/null
target="$(rustc -vV | sed -n 's/^host: //p')"
broker="${CARGO_TARGET_DIR:-target}/$target/release/broker"

cleanup() {
  docker rm -f "$name" "$name-token" >/dev/null 2>&1 || true
  docker rmi -f "$tag" >/dev/null 2>&1 || true
}
trap cleanup EXIT

docker run -d --name "$name" -p 127.0.0.1::9092 -e BROKER_CAPACITY=10 "$tag" >/dev/null
port="$(docker port "$name" 9092/tcp | head -n 1 | sed 's/.*://')"
export BROKER_ADDR="127.0.0.1:$port"

# Ready when the server has printed its address (bounded wait, no fixed sleep).
wait_ready() {
  for _ in $(seq 1 100); do
    docker logs "$1" 2>/dev/null | grep -q '^listening on ' && break
    sleep 0.1
  done
  docker logs "$1" 2>/dev/null | grep -q '^listening on 0.0.0.0:9092$' || {
    echo "FAILED: $1 did not print 'listening on 0.0.0.0:9092'"; docker logs "$1"; exit 1; }
}
wait_ready "$name"

fail() { echo "FAILED: $*"; docker logs "$name"; exit 1; }
"$broker" create orders --partitions 2 | grep -q 'created topic orders' || fail "create"
"$broker" publish orders a b c --partition 0 >/dev/null || fail "publish"
out="$("$broker" consume orders --group billing --member m1)"
[ "$out" = "$(printf '[0@0] a\n[0@1] b\n[0@2] c')" ] || fail "consume printed: $out"
"$broker" describe orders --json | grep -q '"end_offset": 3' || fail "describe"
user="$(docker inspect -f '{{.Config.User}}' "$name")"
[ "$user" = "65534:65534" ] || fail "the container runs as '$user', not as nobody"

# Open on every interface without a token: the server says so at start-up.
docker logs "$name" 2>&1 | grep -q 'no auth token' || fail "no start-up warning without a token"

# A token from the environment: refused without it (one line, exit 1), served with it.
docker run -d --name "$name-token" -p 127.0.0.1::9092 -e BROKER_AUTH_TOKEN=docker-secret \
  "$tag" >/dev/null
wait_ready "$name-token"
token_addr="127.0.0.1:$(docker port "$name-token" 9092/tcp | head -n 1 | sed 's/.*://')"
if "$broker" --addr "$token_addr" describe 2>/dev/null; then fail "served without the token"; fi
BROKER_AUTH_TOKEN=docker-secret "$broker" --addr "$token_addr" describe >/dev/null \
  || fail "refused with the token"
docker logs "$name-token" 2>&1 | grep -q 'docker-secret' && fail "the token is in the logs"
docker rm -f "$name-token" >/dev/null

docker stop -t 10 "$name" >/dev/null
status="$(docker inspect -f '{{.State.ExitCode}}' "$name")"
[ "$status" = "0" ] || fail "exit status after docker stop was $status, not 0"
size="$(docker image inspect -f '{{.Size}}' "$tag")"
echo "docker image test OK (image $((size / 1024 / 1024)) MiB, clean exit on docker stop)"
