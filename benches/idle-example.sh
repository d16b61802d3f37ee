#!/bin/bash
# Idle wake-ups and RSS of the daemon on the example config (issue 40), all threads:
# voluntary + involuntary context switches from /proc/PID/task/*/status, sampled every
# second so that short-lived threads (a file probe's reader, a blocking-pool thread) count
# from their first switch; threads that end between two samples lose their last second.
#
#   benches/idle-example.sh [SECS]          # default 60; SETTLE (10) seconds after start first
#   XCE_AGENT_BIN=path benches/idle-example.sh   # another build (default target/release)
#
# Run from the repository root, after `cargo build --release`.
set -euo pipefail
SECS=${1:-60}
BIN=${XCE_AGENT_BIN:-${CARGO_TARGET_DIR:-target}/release/xce-agent}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
RUST_LOG=warn "$BIN" --config configs/agent.yaml >"$WORK/log" 2>&1 &
PID=$!
# Whatever ends this script ends the daemon too (it holds the default status socket).
trap 'kill "$PID" 2>/dev/null || true; rm -rf "$WORK"' EXIT
sleep "${SETTLE:-10}"
snap() {
    for t in /proc/$PID/task/*; do
        c=$(awk '/ctxt_switches/{s+=$2} END{print s}' "$t/status" 2>/dev/null || true)
        if [ -n "$c" ]; then echo "$(basename "$t") $c"; fi
    done
}
snap >"$WORK/first"
for _ in $(seq "$SECS"); do
    sleep 1
    snap >>"$WORK/samples"
done
python3 - "$SECS" "$WORK" <<'P'
import sys
secs, work = int(sys.argv[1]), sys.argv[2]
first = dict(l.split() for l in open(f"{work}/first"))
last = {}
for l in open(f"{work}/samples"):
    t, c = l.split()
    last[t] = int(c)
total = sum(c - int(first.get(t, 0)) for t, c in last.items())
print(f"context switches: {total / secs:.2f}/s over {secs} s (all threads; {len(last)} seen)")
P
grep -E 'VmRSS|RssAnon|RssFile|Threads' /proc/$PID/status
kill "$PID"
wait "$PID" 2>/dev/null || true
