#!/usr/bin/env bash
# What a probe's bytes cost the agent (issue 26, item 5), for one build of xce-agent:
#   scripts/bench-bytes.sh [BIN]        # BIN defaults to target/release/xce-agent
#   ONLY="rss" scripts/bench-bytes.sh   # sections: rss status log
# 1. rss: peak RSS (VmHWM) of the daemon once a file probe has read and parsed 16 MiB of each format
#    (max_bytes: 16MiB), and how long its first run took to show in `status`;
# 2. status: the slowest of 20 `xce-agent status` answers while the daemon parses two 2 MB
#    kv files of distinct names every second;
# 3. log: a kv stream printing malformed lines as fast as it can (`yes garbage`) for SECS
#    (10) seconds: the daemon's log bytes and its CPU (utime + stime).
# Needs python3 (to write the files) and GNU time. Prints Markdown tables.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=$(realpath "${1:-target/release/xce-agent}")
ONLY=${ONLY:-rss status log}
SECS=${SECS:-10}
CAP=${CAP:-300}   # seconds one parse may take before it is reported as "> CAP s"
HZ=$(getconf CLK_TCK)
want() { [[ " $ONLY " == *" $1 "* ]]; }
WORK=$(mktemp -d /tmp/xce-bench-bytes.XXXXXX)
chmod 755 "$WORK"
trap 'rm -rf "$WORK"' EXIT

echo "binary: $BIN"
echo "machine: $(nproc) CPUs, $(uname -sr); load at start: $(cut -d' ' -f1-3 /proc/loadavg)"
echo

gen() { # gen FORMAT FILE: 16 MiB of FORMAT that also gives `a` a value
  python3 - "$1" "$2" <<'EOF'
import sys
fmt, path = sys.argv[1], sys.argv[2]
SIZE = 16 * 1024 * 1024 - 4096
out, n, i = [], 0, 0
def line(i):
    return {
        "value": "1\n",
        "kv": f"n{i} = {i}\n",
        "elim": f"3 x{i} 1 y{i} 2 z{i} 3\n",
        "prometheus": f'node_dir_bytes{{dir="/data/p{i}",fs="xfs"}} {i}.5\n',
        "influx": f"disk,path=/data/p{i},fs=xfs used={i}.5,inodes={i}i\n",
        "classad": f"Attr{i} = {i}\n" + ("-\n" if i % 1000 == 999 else ""),
    }[fmt]
if fmt == "json-objects":
    parts, n = [], 20
    while True:
        o = f'{{"temp":{i % 90},"ok":true,"name":"gpu{i}"}},'
        if n + len(o) > SIZE: break
        parts.append(o); n += len(o); i += 1
    text = '{"a": 1, "gpus": [' + "".join(parts).rstrip(",") + "]}\n"
elif fmt == "json-dense":
    text = '{"a": 1, "m": [' + ",".join(["0"] * (SIZE // 2)) + "]}\n"
else:
    head = {"kv": "a = 1\n", "elim": "1 a 1\n", "prometheus": "a 1\n",
            "influx": "a v=1\n", "classad": "a = 1\n-\n", "value": ""}[fmt]
    out.append(head); n = len(head)
    while True:
        l = line(i)
        if n + len(l) > SIZE: break
        out.append(l); n += len(l); i += 1
    text = "".join(out)
open(path, "w").write(text)
EOF
}

site() { # site DIR RESOURCES_YAML [AGENT_EXTRA]
  mkdir -p "$1"; chmod 755 "$1"
  printf 'host: node001\nresources: %s/resources.yaml\nplugin_dir: %s\ncontrollers: []\n%s' "$1" "$1" "${3:-}" > "$1/agent.yaml"
  printf '%s' "$2" > "$1/resources.yaml"
}

rss_of() { grep VmHWM "/proc/$1/status" | awk '{print $2}'; }

if want rss; then
  echo "## peak RSS of the daemon after one run of a file probe reading 16 MiB of each format"
  echo
  echo "| format | peak RSS (MiB) | first run (s) | status |"
  echo "|---|---|---|---|"
  for fmt in value kv elim prometheus influx classad json-objects json-dense; do
    d=$WORK/rss-$fmt
    f=${fmt%-*}
    res=a; [ "$f" = influx ] && res=a_v
    mkdir -p "$d"; chmod 755 "$d"
    gen "$fmt" "$d/out.txt"; chmod 644 "$d/out.txt"
    site "$d" "resources:
  - name: $res
    interval: 1h
    resourcemap: [{location: [default]}]
    probe: {kind: file, path: $d/out.txt, format: $f, max_bytes: 16MiB, timeout: 10m}
" "status_socket: $d/status.sock
"
    XCE_LOG=warn "$BIN" --config "$d/agent.yaml" 2> "$d/log" &
    agent=$!
    start=$(date +%s.%N)
    state=pending
    while [ "$state" = pending ] || [ -z "$state" ]; do
      sleep 0.2
      state=$(timeout 60 "$BIN" --config "$d/agent.yaml" status --format json 2>/dev/null \
        | python3 -c 'import json,sys; print(json.load(sys.stdin)["resources"][0]["status"])' 2>/dev/null || true)
      if [ "$(echo "$(date +%s.%N) - $start > $CAP" | bc)" = 1 ]; then state="> $CAP s"; fi
    done
    wall=$(echo "$(date +%s.%N) - $start" | bc)
    rss=$(rss_of "$agent")
    kill "$agent"; wait "$agent" 2>/dev/null || true
    printf '| %s | %.0f | %.1f | %s |\n' "$fmt" "$(echo "$rss / 1024" | bc -l)" "$wall" "$state"
  done
  echo
fi

if want status; then
  echo "## \`xce-agent status\` while the daemon parses two 2 MB kv files every second"
  echo
  d=$WORK/status
  mkdir -p "$d"; chmod 755 "$d"
  for k in 1 2; do
    python3 -c "import sys; sys.stdout.write('a${k} = 1\n' + ''.join(f'n${k}_{i} = {i}\n' for i in range(2_000_000 // 16)))" > "$d/kv$k.txt"
    chmod 644 "$d/kv$k.txt"
  done
  site "$d" "resources:
  - name: a1
    interval: 1s
    resourcemap: [{location: [default]}]
    probe: {kind: file, path: $d/kv1.txt, format: kv, max_bytes: 16MiB, timeout: 10m}
  - name: a2
    interval: 1s
    resourcemap: [{location: [default]}]
    probe: {kind: file, path: $d/kv2.txt, format: kv, max_bytes: 16MiB, timeout: 10m}
" "status_socket: $d/status.sock
"
  XCE_LOG=warn "$BIN" --config "$d/agent.yaml" 2> "$d/log" &
  agent=$!
  for _ in $(seq 100); do [ -S "$d/status.sock" ] && break; sleep 0.1; done
  sleep 3
  worst=0; total=0
  for _ in $(seq 20); do
    t0=$(date +%s%N)
    timeout 120 "$BIN" --config "$d/agent.yaml" status --format json > /dev/null 2>&1 || true
    ms=$(( ($(date +%s%N) - t0) / 1000000 ))
    total=$((total + ms)); [ "$ms" -gt "$worst" ] && worst=$ms
    sleep 0.2
  done
  kill "$agent"; wait "$agent" 2>/dev/null || true
  echo "| answers | mean (ms) | slowest (ms) |"
  echo "|---|---|---|"
  echo "| 20 | $((total / 20)) | $worst |"
  echo
fi

if want log; then
  echo "## a kv stream printing malformed lines at full speed for $SECS s"
  echo
  d=$WORK/log
  site "$d" "resources:
  - name: a
    interval: 60s
    resourcemap: [{location: [default]}]
    probe: {kind: stream, command: [/usr/bin/yes, garbage], format: kv}
"
  XCE_LOG=info "$BIN" --config "$d/agent.yaml" 2> >(wc -c > "$d/bytes") &
  agent=$!
  sleep "$SECS"
  read -r -a st < "/proc/$agent/stat"
  cpu=$(( st[13] + st[14] ))
  kill "$agent"; wait "$agent" 2>/dev/null || true
  sleep 1
  bytes=$(cat "$d/bytes")
  echo "| log bytes | log bytes/s | agent CPU (s) over $SECS s |"
  echo "|---|---|---|"
  printf '| %s | %s | %.2f |\n' "$bytes" "$((bytes / SECS))" "$(echo "$cpu / $HZ" | bc -l)"
  echo
fi
