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
  docker rm -f "$name" "$name-token" "$name-durable" >/dev/null 2>&1 || true
  docker volume rm -f "$name-data" >/dev/null 2>&1 || true
  docker rmi -f "$tag" >/dev/null 2>&1 || true
}
trap cleanup EXIT

docker run -d --name "$name" -p 127.0.0.1::9092 -e BROKER_CAPACITY=10 "$tag" >/dev/null
port="$(docker port "$name" 9092/tcp | head -n 1 | sed 's/.*://')"
export BROKER_ADDR="127.0.0.1:$port"

# Ready when the server has printed its address (bounded wait, no fixed sleep).
wait_ready() {
  for _ in $(seq 1 100); do
    docker logs "$1" 2>/dev/null | grep '^listening on ' >/dev/null && break
    sleep 0.1
  done
  docker logs "$1" 2>/dev/null | grep '^listening on 0.0.0.0:9092$' >/dev/null || {
    echo "FAILED: $1 did not print 'listening on 0.0.0.0:9092'"; docker logs "$1"; exit 1; }
}
wait_ready "$name"

fail() { echo "FAILED: $*"; docker logs "$name"; exit 1; }
"$broker" create orders --partitions 2 | grep 'created topic orders' >/dev/null || fail "create"
"$broker" publish orders a b c --partition 0 >/dev/null || fail "publish"
out="$("$broker" consume orders --group billing --member m1)"
[ "$out" = "$(printf '[0@0] a\n[0@1] b\n[0@2] c')" ] || fail "consume printed: $out"
"$broker" describe orders --json | grep '"end_offset": 3' >/dev/null || fail "describe"
user="$(docker inspect -f '{{.Config.User}}' "$name")"
[ "$user" = "65534:65534" ] || fail "the container runs as '$user', not as nobody"

# Open on every interface without a token: the server says so at start-up.
docker logs "$name" 2>&1 | grep 'no auth token' >/dev/null || fail "no start-up warning without a token"

# A token from the environment: refused without it (one line, exit 1), served with it.
docker run -d --name "$name-token" -p 127.0.0.1::9092 -e BROKER_AUTH_TOKEN=docker-secret \
  "$tag" >/dev/null
wait_ready "$name-token"
token_addr="127.0.0.1:$(docker port "$name-token" 9092/tcp | head -n 1 | sed 's/.*://')"
if "$broker" --addr "$token_addr" describe 2>/dev/null; then fail "served without the token"; fi
BROKER_AUTH_TOKEN=docker-secret "$broker" --addr "$token_addr" describe >/dev/null \
  || fail "refused with the token"
docker logs "$name-token" 2>&1 | grep 'docker-secret' >/dev/null && fail "the token is in the logs"
docker rm -f "$name-token" >/dev/null

# A data directory on a named volume survives the container: publish, stop, start a new
# container on the same volume, and the records are still there.
durable() {
  docker run -d --name "$name-durable" -p 127.0.0.1::9092 -v "$name-data:/data" \
    -e BROKER_DATA_DIR=/data "$tag" >/dev/null
  wait_ready "$name-durable"
  echo "127.0.0.1:$(docker port "$name-durable" 9092/tcp | head -n 1 | sed 's/.*://')"
}
durable_addr="$(durable)"
"$broker" --addr "$durable_addr" create kept >/dev/null || fail "create on a volume"
"$broker" --addr "$durable_addr" publish kept one two >/dev/null || fail "publish on a volume"
docker stop -t 10 "$name-durable" >/dev/null
docker rm "$name-durable" >/dev/null
durable_addr="$(durable)"
"$broker" --addr "$durable_addr" describe kept --json | grep '"end_offset": 2' >/dev/null \
  || fail "the records did not survive a new container on the same volume"
docker rm -f "$name-durable" >/dev/null

docker stop -t 10 "$name" >/dev/null
status="$(docker inspect -f '{{.State.ExitCode}}' "$name")"
[ "$status" = "0" ] || fail "exit status after docker stop was $status, not 0"
size="$(docker image inspect -f '{{.Size}}' "$tag")"
echo "docker image test OK (image $((size / 1024 / 1024)) MiB, clean exit on docker stop)"
