#!/usr/bin/env bash
# End-to-end test of the Docker image: build it, run it, talk to it with the `broker` CLI over
# the published port, stop it with `docker stop`, and check that it exited cleanly (status 0).
# Also: the health check (`broker ping`) turns healthy, with a token and with TLS; a bind-mounted
# data directory nobody may write stops the server with a clear error, and works once it belongs
# to nobody (or the container runs as its owner); TLS from the host with a CA made here by
# openssl; docker/compose.yaml is valid, keeps its data on a volume and publishes on 127.0.0.1
# only. Every port is published on 127.0.0.1 only. Runs as root in CI (the ownership checks need
# root and are skipped, saying so, otherwise). Skipped, saying so, when no Docker engine answers.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! docker info >/dev/null 2>&1; then
  echo "SKIPPED: no Docker engine answers (docker info failed); the image was not tested"
  exit 0
fi

if ! command -v openssl >/dev/null 2>&1; then
  echo "FAILED: openssl is not installed (apt-get install openssl); the TLS test makes its CA with it"
  exit 1
fi
# The host's own settings must not leak into the `broker` commands below.
unset BROKER_AUTH_TOKEN BROKER_AUTH_TOKEN_FILE BROKER_TLS_CA BROKER_TLS_SERVER_NAME

tag="broker-server:test-$$"
name="broker-test-$$"
containers=("$name" "$name-token" "$name-durable" "$name-perm" "$name-user" "$name-tls"
  "$name-tls-noca")
work="$(mktemp -d)"
cleanup() {
  docker rm -f "${containers[@]}" >/dev/null 2>&1 || true
  docker volume rm -f "$name-data" >/dev/null 2>&1 || true
  docker rmi -f "$tag" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
# Readable by nobody (65534), who runs the server and reads the TLS files mounted from here.
chmod 755 "$work"

start="$(date +%s)"
docker/build.sh "$tag" >/dev/null
built="$(date +%s)"
target="$(rustc -vV | sed -n 's/^host: //p')"
broker="${CARGO_TARGET_DIR:-target}/$target/${BROKER_IMAGE_PROFILE:-release}/broker"

# The image's health check is the cheap `broker ping`.
check="$(docker image inspect -f '{{json .Config.Healthcheck.Test}}' "$tag")"
[ "$check" = '["CMD","/usr/local/bin/broker","ping"]' ] || {
  echo "FAILED: the image's health check is $check, not broker ping"; exit 1; }
# The containers run the image's health check every second instead of every 10 s, so that the
# waits below are short; the command is the image's.
health=(--health-interval 1s)

docker run -d --name "$name" -p 127.0.0.1::9092 "${health[@]}" -e BROKER_CAPACITY=10 "$tag" \
  >/dev/null
port="$(docker port "$name" 9092/tcp | head -n 1 | sed 's/.*://')"
export BROKER_ADDR="127.0.0.1:$port"

# Ready when the server has printed its address (bounded wait, no fixed sleep).
wait_ready() {
  for _ in $(seq 1 100); do
    docker logs "$1" 2>/dev/null | grep '^listening on ' >/dev/null && break
    sleep 0.1
  done
  # On standard error: durable() runs this inside $(...).
  docker logs "$1" 2>/dev/null | grep '^listening on 0.0.0.0:9092$' >/dev/null || {
    echo "FAILED: $1 did not print 'listening on 0.0.0.0:9092'"; docker logs "$1"; exit 1; } >&2
}
wait_ready "$name"

# Healthy when the image's health check has passed (bounded; a container that stopped or
# turned unhealthy fails at once).
wait_healthy() {
  local status=""
  for _ in $(seq 1 100); do
    status="$(docker inspect -f '{{.State.Status}} {{.State.Health.Status}}' "$1")"
    case "$status" in
      "running healthy") return 0 ;;
      "running starting") sleep 0.2 ;;
      *) break ;;
    esac
  done
  echo "FAILED: $1 is '$status', not running and healthy"
  docker inspect -f '{{json .State.Health}}' "$1"; docker logs "$1"; exit 1
}
# Exited within 10 s; prints the exit status (and a failure on standard error).
wait_exited() {
  for _ in $(seq 1 50); do
    [ "$(docker inspect -f '{{.State.Status}}' "$1")" = exited ] && break
    sleep 0.2
  done
  [ "$(docker inspect -f '{{.State.Status}}' "$1")" = exited ] || {
    echo "FAILED: $1 is still running"; docker logs "$1"; exit 1; } >&2
  docker inspect -f '{{.State.ExitCode}}' "$1"
}
published() { echo "127.0.0.1:$(docker port "$1" 9092/tcp | head -n 1 | sed 's/.*://')"; }

fail() { echo "FAILED: $*"; docker logs "$name"; exit 1; }
# The same, showing another container's log.
fail_in() { local c="$1"; shift; echo "FAILED: $*"; docker logs "$c"; exit 1; }
wait_healthy "$name"
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
# Healthy: the health check presents the token from the same environment.
docker run -d --name "$name-token" -p 127.0.0.1::9092 "${health[@]}" \
  -e BROKER_AUTH_TOKEN=docker-secret "$tag" >/dev/null
wait_ready "$name-token"
wait_healthy "$name-token"
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

# A data directory bind-mounted from the host keeps the host's owner and mode. Owned by root
# with mode 0755, nobody cannot write it: the server exits non-zero and says why. Given to
# nobody (chown 65534:65534), it starts and is healthy; so it does, owned by another user, when
# the container runs as that user (--user).
bind_run() { # NAME DIR [docker run options...]
  local c="$1" dir="$2"; shift 2
  docker run -d --name "$c" -p 127.0.0.1::9092 "${health[@]}" -v "$dir:/data" \
    -e BROKER_DATA_DIR=/data "$@" "$tag" >/dev/null
}
if [ "$(id -u)" = 0 ]; then
  mkdir "$work/data"
  chmod 755 "$work/data"
  bind_run "$name-perm" "$work/data"
  status="$(wait_exited "$name-perm")"
  [ "$status" != 0 ] || fail_in "$name-perm" "exit status 0 on a data directory it cannot write"
  docker logs "$name-perm" 2>&1 | grep -E 'Permission denied|not writable' >/dev/null \
    || fail_in "$name-perm" "no 'Permission denied' or 'not writable' in the log"
  docker rm -f "$name-perm" >/dev/null

  chown 65534:65534 "$work/data"
  bind_run "$name-perm" "$work/data"
  wait_healthy "$name-perm"
  "$broker" --addr "$(published "$name-perm")" create bound >/dev/null \
    || fail_in "$name-perm" "create on a directory given to nobody"
  docker rm -f "$name-perm" >/dev/null

  mkdir "$work/data-user"
  chmod 755 "$work/data-user"
  chown 4321:4321 "$work/data-user"
  bind_run "$name-user" "$work/data-user" --user 4321:4321
  wait_healthy "$name-user"
  "$broker" --addr "$(published "$name-user")" create bound >/dev/null \
    || fail_in "$name-user" "create on a directory of the container's --user"
  docker rm -f "$name-user" >/dev/null
else
  echo "SKIPPED: the bind-mounted data directory checks (they chown, and need root)"
fi

# TLS: a CA and a server certificate for broker.test, made here, mounted read-only. The health
# check speaks TLS (it reads BROKER_TLS_CA and BROKER_TLS_SERVER_NAME too), so the container
# turns healthy; the host's `broker` publishes and consumes with the CA; a client without TLS is
# refused (exit 1). A container without BROKER_TLS_CA turns unhealthy: its health check does
# not speak TLS.
tls="$work/tls"
mkdir "$tls"
(
  cd "$tls"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
    -subj /CN=broker-test-ca -keyout ca.key -out ca.pem \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=broker.test \
    -keyout server.key -out server.csr
  printf '%s\n' basicConstraints=critical,CA:FALSE keyUsage=critical,digitalSignature \
    extendedKeyUsage=serverAuth subjectAltName=DNS:broker.test >server.ext
  openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -set_serial 1 -days 2 \
    -extfile server.ext -out server.pem
) >"$work/openssl.log" 2>&1 || { echo "FAILED: openssl"; cat "$work/openssl.log"; exit 1; }
# A throwaway key: readable by nobody through the read-only mount.
chmod 755 "$tls"
chmod 644 "$tls"/*
tls_env=(-e BROKER_TLS_CERT=/tls/server.pem -e BROKER_TLS_KEY=/tls/server.key)
docker run -d --name "$name-tls" -p 127.0.0.1::9092 "${health[@]}" -v "$tls:/tls:ro" \
  "${tls_env[@]}" -e BROKER_TLS_CA=/tls/ca.pem -e BROKER_TLS_SERVER_NAME=broker.test \
  "$tag" >/dev/null
docker run -d --name "$name-tls-noca" -p 127.0.0.1::9092 "${health[@]}" -v "$tls:/tls:ro" \
  "${tls_env[@]}" "$tag" >/dev/null
wait_ready "$name-tls"
wait_healthy "$name-tls"
tls_addr="$(published "$name-tls")"
tls_broker=("$broker" --addr "$tls_addr" --tls-ca "$tls/ca.pem" --tls-server-name broker.test)
"${tls_broker[@]}" create secure | grep 'created topic secure' >/dev/null \
  || fail_in "$name-tls" "create over TLS"
"${tls_broker[@]}" publish secure 'over tls' >/dev/null || fail_in "$name-tls" "publish over TLS"
out="$("${tls_broker[@]}" consume secure --group g --member m1)"
[ "$out" = '[0@0] over tls' ] || fail_in "$name-tls" "consume over TLS printed: $out"
status=0
timeout 20 "$broker" --addr "$tls_addr" ping >/dev/null 2>&1 || status=$?
[ "$status" = 1 ] || fail_in "$name-tls" "ping without TLS exited $status, not 1"
for _ in $(seq 1 100); do
  [ "$(docker inspect -f '{{.State.Health.Status}}' "$name-tls-noca")" = unhealthy ] && break
  sleep 0.2
done
[ "$(docker inspect -f '{{.State.Health.Status}}' "$name-tls-noca")" = unhealthy ] \
  || fail_in "$name-tls-noca" "not unhealthy without BROKER_TLS_CA"
docker rm -f "$name-tls" "$name-tls-noca" >/dev/null

# docker/compose.yaml: project "broker", the data on a named volume at /data, published on
# 127.0.0.1 only. Validated by Compose v2 (`docker compose config`) when installed; the Python
# docker-compose 1.x knows no top-level name, so it validates the rest with `-p broker`.
compose=docker/compose.yaml
grep -x 'name: broker' "$compose" >/dev/null || fail "$compose: no top-level 'name: broker'"
grep -E '^ *- "?127\.0\.0\.1:9092:9092"?$' "$compose" >/dev/null \
  || fail "$compose: port 9092 is not published on 127.0.0.1"
grep -E '^ *- "?[0-9]*:?9092(:9092)?"?$' "$compose" >/dev/null \
  && fail "$compose: port 9092 is published on every interface"
grep -E '^ *BROKER_DATA_DIR: "?/data"?( +#.*)?$' "$compose" >/dev/null \
  || fail "$compose: no BROKER_DATA_DIR=/data"
grep -E '^ *- data:/data$' "$compose" >/dev/null || fail "$compose: no volume at /data"
sed -n '/^volumes:/,$p' "$compose" | grep -x '  data:' >/dev/null \
  || fail "$compose: no top-level volume 'data'"
if docker compose version >/dev/null 2>&1; then
  config="$(docker compose -f "$compose" config)" || fail "docker compose config: $compose is invalid"
  grep -x 'name: broker' <<<"$config" >/dev/null || fail "compose config: project is not 'broker'"
  compose_checked="docker compose config"
elif command -v docker-compose >/dev/null 2>&1; then
  config="$(sed '/^name: /d' "$compose" | docker-compose -p broker -f - config)" \
    || fail "docker-compose config: $compose is invalid"
  compose_checked="docker-compose 1.x config, without its name line"
else
  config=""
fi
if [ -n "$config" ]; then
  grep '127\.0\.0\.1' <<<"$config" >/dev/null || fail "compose config: not published on 127.0.0.1"
  grep '/data' <<<"$config" >/dev/null || fail "compose config: no volume at /data"
else
  compose_checked="SKIPPED config: neither docker compose nor docker-compose is installed"
fi

docker stop -t 10 "$name" >/dev/null
status="$(docker inspect -f '{{.State.ExitCode}}' "$name")"
[ "$status" = "0" ] || fail "exit status after docker stop was $status, not 0"
size="$(docker image inspect -f '{{.Size}}' "$tag")"
echo "docker image test OK (image $((size / 1024 / 1024)) MiB, clean exit on docker stop;" \
  "compose file: $compose_checked; build $((built - start)) s, tests $(($(date +%s) - built)) s)"
