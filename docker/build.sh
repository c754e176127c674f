#!/usr/bin/env bash
# Builds the image broker-server:latest (or the tag given as $1) from static binaries.
# There is no registry here, so nothing is pulled: the image is FROM scratch and the binaries
# are linked statically against glibc (-C target-feature=+crt-static).
#
#   docker/build.sh [TAG]            # the binaries, then the image
#   docker/build.sh --binaries-only  # the binaries alone (CI builds them ahead, in the background)
set -euo pipefail
cd "$(dirname "$0")/.."
tag="${1:-broker-server:latest}"
target="$(rustc -vV | sed -n 's/^host: //p')"
# The Cargo profile of the binaries: release, or the quicker to build image-test that the
# image tests of CI use (BROKER_IMAGE_PROFILE=image-test; see Cargo.toml).
profile="${BROKER_IMAGE_PROFILE:-release}"

target_dir="${CARGO_TARGET_DIR:-target}"

echo "building static binaries for $target (profile $profile)..." >&2
# Stripped (no debug info or symbols): the image holds nothing but the two binaries.
RUSTFLAGS="-C target-feature=+crt-static" \
  CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_PROFILE_RELEASE_STRIP=symbols \
  cargo build --profile "$profile" --locked --target "$target" -p broker-server -p broker-cli >&2
[ "$tag" = "--binaries-only" ] && exit 0

context="$(mktemp -d)"
trap 'rm -rf "$context"' EXIT
cp "$target_dir/$target/$profile/broker-server" "$target_dir/$target/$profile/broker" "$context/"
cp docker/Dockerfile "$context/"
mkdir "$context/data"
docker build --quiet -t "$tag" "$context" >&2
echo "$tag"
