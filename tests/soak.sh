#!/usr/bin/env bash
# A bounded load and soak run on loopback: builds release binaries, then runs tests/soak.rs
# against a fresh broker-server for SOAK_SECS seconds with SOAK_CONNECTIONS connections mixing
# every call, under a SOAK_MAX_MEMORY-byte budget. It stops by itself, prints throughput, calls
# by kind, the error count (must be 0) and the server's peak memory, and fails if there was an
# error or the peak passed the budget plus the allowed overhead (see BENCHMARKS.md).
#
#   tests/soak.sh                                  # 60 s, 300 connections, 64 MiB budget
#   SOAK_SECS=600 SOAK_CONNECTIONS=500 tests/soak.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export SOAK_SECS="${SOAK_SECS:-60}"
export SOAK_CONNECTIONS="${SOAK_CONNECTIONS:-300}"
export SOAK_MAX_MEMORY="${SOAK_MAX_MEMORY:-67108864}"
# Each connection is a file descriptor on both ends.
ulimit -n "$(( SOAK_CONNECTIONS * 2 + 256 ))" 2>/dev/null || true
cargo build --release -p broker-server
cargo test --release -p broker-server --test soak -- --nocapture
