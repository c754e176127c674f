#!/usr/bin/env bash
# Builds the image broker-server:latest (or the tag given as $1) from static binaries.
# There is no registry here, so nothing is pulled: the image is FROM scratch and the binaries
# are linked statically against glibc (-C target-feature=+crt-static).
set -euo pipefail
cd "$(dirname "$0")/.."
tag="${1:-broker-server:latest}"
target="$(rustc -vV | sed -n 's/^host: //p')"

target_dir="${CARGO_TARGET_DIR:-target}"

echo "building static binaries for $target..." >&2
# Stripped (no debug info or symbols): the image holds nothing but the two binaries.
RUSTFLAGS="-C target-feature=+crt-static" \
  CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_PROFILE_RELEASE_STRIP=symbols \
  cargo build --release --locked --target "$target" -p broker-server -p broker-cli >&2

context="$(mktemp -d)"
trap 'rm -rf "$context"' EXIT
cp "$target_dir/$target/release/broker-server" "$target_dir/$target/release/broker" "$context/"
cp docker/Dockerfile "$context/"
mkdir "$context/data"
docker build --quiet -t "$tag" "$context" >&2
echo "$tag"
