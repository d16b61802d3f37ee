#!/bin/bash
# Idle wake-ups, RSS and page faults of the daemon on the example config (issue 40), all threads:
# voluntary + involuntary context switches from /proc/PID/task/*/status, sampled every
# second so that short-lived threads (a file probe's reader, a blocking-pool thread) count
# from their first switch; threads that end between two samples lose their last second.
#
#   benches/idle-example.sh [SECS]          # default 60; SETTLE (10) seconds after start first
#   XCE_AGENT_BIN=path benches/idle-example.sh   # another build (default target/release)
#
# RSS is printed at both ends of the window, split by mapping (the binary, each library, the
# anonymous rest), with the page faults of the window per minute (/proc/PID/stat): the
# daemon pages its own binary out `release_code_after` (30 s) after its start, and what comes
# back is the code it keeps running. Run as root, as shipped: MADV_PAGEOUT of the binary's
# pages is done only for its owner (or a writer of the file).
#
# Run from the repository root, after `cargo build --release`.
set -euo pipefail
SECS=${1:-60}
BIN=${XCE_AGENT_BIN:-${CARGO_TARGET_DIR:-target}/release/xce-agent}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
RUST_LOG=warn "$BIN" --config configs/agent.yaml >"$WORK/log" 2>&1 &
PID=$!
START=$(date +%s)
# Whatever ends this script ends the daemon too (it holds the default status socket).
trap 'kill "$PID" 2>/dev/null || true; rm -rf "$WORK"' EXIT
sleep "${SETTLE:-10}"
snap() {
    for t in /proc/$PID/task/*; do
        c=$(awk '/ctxt_switches/{s+=$2} END{print s}' "$t/status" 2>/dev/null || true)
        if [ -n "$c" ]; then echo "$(basename "$t") $c"; fi
    done
}
rss() {
    echo "-- $1 ($(($(date +%s) - START)) s after the start)"
    grep -E 'VmRSS|RssAnon|RssFile|Threads' /proc/$PID/status | tr -s ' \t' ' ' | paste -sd' '
    awk '/^[0-9a-f]+-/{name=$6; if (name == "") name = "[anon]"} /^Rss:/{kb[name]+=$2}
         END{for (n in kb) if (kb[n] >= 64) printf "  %6d kB %s\n", kb[n], n}' \
        /proc/$PID/smaps | sort -rn
}
faults() { awk '{print $10, $12}' /proc/$PID/stat; }
rss "the window's start"
read -r MIN0 MAJ0 < <(faults)
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
read -r MIN1 MAJ1 < <(faults)
rss "the window's end"
echo "page faults: $(((MIN1 - MIN0) * 60 / SECS)) minor, $(((MAJ1 - MAJ0) * 60 / SECS)) major a minute over the window"
kill "$PID"
wait "$PID" 2>/dev/null || true
