#!/usr/bin/env bash
# Writes docs/reference.md, the reference of every flag of broker-server and broker (each
# subcommand too), from the binaries' own --help, so that the book cannot drift from them:
#
#   docs/reference.sh            # writes docs/reference.md
#   docs/reference.sh --check    # fails if docs/reference.md is not what it would write
#
# Uses the debug binaries of target/ (BIN_DIR to use others), building them if missing. The help
# is taken with an empty environment, so that variables set here (BROKER_ADDR, ...) do not show
# as current values.
set -euo pipefail
cd "$(dirname "$0")/.."

BIN_DIR="${BIN_DIR:-target/debug}"
if [ ! -x "$BIN_DIR/broker-server" ] || [ ! -x "$BIN_DIR/broker" ]; then
  cargo build -q -p broker-server -p broker-cli
fi

help() { env -i PATH="$PATH" "$@" --help; }

# The subcommands a help text lists under "Commands:", but `help`.
subcommands() {
  awk '/^Commands:/ { listing = 1; next } listing && /^$/ { exit } listing { print $1 }' |
    grep -v '^help$' || true
}

section() {
  local title="$1"
  shift
  printf '\n## `%s`\n\n```text\n' "$title"
  help "$@"
  printf '```\n'
}

# Each command's section, then its subcommands', depth first.
walk() {
  section "$*" "$BIN_DIR/$1" "${@:2}"
  local sub
  for sub in $(help "$BIN_DIR/$1" "${@:2}" | subcommands); do
    walk "$@" "$sub"
  done
}

reference() {
  printf '# Reference of every flag\n\n'
  printf 'Every flag of `broker-server` and `broker` and of each `broker` subcommand, as their\n'
  printf '`--help` prints it. Written by `docs/reference.sh` from the binaries themselves (CI\n'
  printf 'checks that it is current); the [configuration](configuration.md) chapter explains\n'
  printf 'the settings that matter most.\n'
  walk broker-server
  walk broker
}

if [ "${1:-}" = "--check" ]; then
  if ! diff -u docs/reference.md <(reference) >/dev/null; then
    echo "docs/reference.md is not what docs/reference.sh writes: run it and commit the result" >&2
    diff -u docs/reference.md <(reference) | head -40 >&2 || true
    exit 1
  fi
else
  reference > docs/reference.md
fi
