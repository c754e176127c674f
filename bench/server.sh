# Sourced by the bench scripts that start one broker-server at a time on loopback:
#
#   source "$(dirname "$0")/server.sh"
#   start_server target/release/broker-server --data-dir "$workdir/data"   # sets server_addr
#   ...                                                                      # (and metrics_addr)
#   stop_server
#
# Makes a work directory ($workdir, removed at exit), and stops the server it started (by its
# PID) at exit too.

workdir="$(mktemp -d)"
server_pid=""
server_addr=""
metrics_addr=""

# Stops the server started last, if it runs.
stop_server() {
  if [ -n "$server_pid" ]; then
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
    server_pid=""
  fi
}

cleanup() {
  stop_server
  rm -rf "$workdir"
}
trap cleanup EXIT

# Starts the server binary $1 with the other arguments, on 127.0.0.1 on a free port, its
# warnings in $workdir/err; waits until it announces its address (and its metrics address,
# when given --metrics-listen) and sets server_addr (and metrics_addr).
start_server() {
  local binary="$1"
  shift
  "$binary" --listen 127.0.0.1:0 --log-level warn "$@" >"$workdir/out" 2>"$workdir/err" &
  server_pid=$!
  local announced='^listening on '
  case " $* " in *" --metrics-listen "*) announced='^metrics on ' ;; esac
  for _ in $(seq 1 500); do grep -q "$announced" "$workdir/out" && break; sleep 0.01; done
  grep -q "$announced" "$workdir/out" || { cat "$workdir/err" >&2; exit 1; }
  server_addr="$(sed -n 's/^listening on //p' "$workdir/out")"
  metrics_addr="$(sed -n 's/^metrics on //p' "$workdir/out")"
}

# For the scripts that compare two builds side by side: calls the script's `run LABEL DIR` for
# build A (in $A_DIR) and build B (in $B_DIR) in each of $ROUNDS rounds, A first in odd rounds
# and B first in even ones. Each run appends a row `LABEL value value...` to $workdir/rows.
alternate_builds() {
  local round
  for round in $(seq 1 "$ROUNDS"); do
    if [ $((round % 2)) -eq 1 ]; then
      run A "$A_DIR"; run B "$B_DIR"
    else
      run B "$B_DIR"; run A "$A_DIR"
    fi
  done
}

# Prints, for each column of $workdir/rows after the label (named by the arguments, in order),
# the medians of A's and B's runs and B / A.
print_medians() {
  python3 - "$workdir/rows" "$@" <<'PYTHON'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
for column, name in enumerate(sys.argv[2:], start=1):
    a, b = (statistics.median(float(row[column]) for row in rows if row[0] == label)
            for label in "AB")
    shown = lambda value: f"{value:,.0f}" if value >= 100 else f"{value:.3f}"
    print(f"median {name}: A {shown(a)}, B {shown(b)}, B / A {b / a:.2f}x")
PYTHON
}
