#!/usr/bin/env bash
# Regenerates every figure of BENCHMARKS.md in one run, on this machine:
#   scripts/bench.sh                # everything (about 8 minutes on 2 cores)
#   SECS=10 SETTLE=16 scripts/bench.sh   # shorter collectd comparison and idle waits
#   ONLY="3 5" scripts/bench.sh          # only some sections (numbers as in BENCHMARKS.md)
#   ONLY=23 scripts/bench.sh             # issue 40's floor figures in one run (as root)
# Needs: a Rust toolchain; for the collectd comparison, Debian's collectd-core
# (apt-get install -y collectd-core) and root (collectd's exec plugin refuses to run scripts
# as root, so both sides run the probes as `nobody`). Sections print Markdown tables.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
SECS=${SECS:-60}          # length of the collectd vs xce-agent comparison
SETTLE=${SETTLE:-20}      # wait for the first full round (startup spread is 15 s)
WORK=$ROOT/target/bench-work
BIN=$ROOT/target/release/xce-agent
HZ=$(getconf CLK_TCK)
ONLY=${ONLY:-1 2 3 4 5 6 metrics}  # sections to run, e.g. ONLY="3 5"
want() { [[ " $ONLY " == *" $1 "* ]]; }

rm -rf "$WORK" && mkdir -p "$WORK" && chmod 755 "$WORK"

echo "# xce-agent benchmarks — $(date -u +%FT%TZ)"
echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(uname -sr), $(rustc --version)"
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
echo

cargo build --release --quiet

# ---- 1. exec probe: agent CPU vs bare spawn --------------------------------------------
if want 1; then
echo "## 21 (was 1). the daemon's CPU per exec probe run vs C floors in a process of their own"
cargo bench --quiet --bench exec_cpu
echo
fi

# ---- 2. builtin sampler tick vs raw read -----------------------------------------------
if want 2; then
echo "## 2. builtin sampler tick vs raw read"
cargo bench --quiet --bench sampler -- --sample-count 300
echo
fi

# ---- helpers ------------------------------------------------------------------------------
# "utime stime cutime cstime" of a process, in clock ticks.
cpu_ticks() { awk '{ sub(/^.*\) /, ""); print $12, $13, $14, $15 }' "/proc/$1/stat"; }
status_kib() { awk -v f="$2:" '$1 == f { print $2 }' "/proc/$1/status"; }

# Start the daemon on an agent.yaml, wait for its first full round, print a table row.
idle_rss() {
    local label=$1 agent=$2 log
    log=$(dirname "$agent")/daemon.log
    "$BIN" --config "$agent" --log-level warn 2>"$log" &
    local pid=$!
    sleep "$SETTLE"
    if ! kill -0 "$pid" 2>/dev/null; then
        echo "| $label | daemon exited: $(tail -3 "$log" | tr '\n' ' ') |"
        return
    fi
    local rss hwm
    rss=$(status_kib "$pid" VmRSS)
    hwm=$(status_kib "$pid" VmHWM)
    kill -TERM "$pid"
    wait "$pid" || true
    printf '| %s | %.1f | %.1f |\n' "$label" "$(echo "$rss/1024" | bc -l)" "$(echo "$hwm/1024" | bc -l)"
}

agent_yaml() { # dir resources_file [extra lines]
    printf 'host: node001\ncontrollers: []\nresources: %s\nplugin_dir: %s\nrun_as: nobody\nmax_parallel: 8\n%s' \
        "$2" "$1" "${3:-}" >"$1/agent.yaml"
}

# N resources, each its own file probe (interval 1h: idle after its first run), with or
# without a regex capture.
gen_file_probes() {
    local n=$1 out=$2 regex=${3:-}
    {
        echo "resources:"
        for ((i = 0; i < n; i++)); do
            printf '  - name: f%05d\n    valtype: numeric\n    interval: 1h\n    resourcemap: [{location: [default]}]\n    probe: {kind: file, path: /proc/loadavg%s}\n' "$i" "$regex"
        done
    } >"$out"
}

# N resources fed by P kv exec probes (each prints N/P `name = value` lines).
gen_kv_probes() {
    local n=$1 p=$2 dir=$3 per=$(($1 / $2))
    {
        echo "resources:"
        for ((j = 0; j < p; j++)); do
            local names=()
            for ((k = 1; k < per; k++)); do names+=("$(printf 'k%02d_%05d' "$j" "$k")"); done
            printf '  - name: k%02d_00000\n    valtype: numeric\n    interval: 1h\n    resourcemap: [{location: [default]}]\n' "$j"
            printf '    probe: {kind: exec, command: [%s/kv.sh, %s/kv%02d.txt], format: kv, provides: [%s]}\n' \
                "$dir" "$dir" "$j" "$(IFS=,; echo "${names[*]}")"
            for nm in "${names[@]}"; do
                printf '  - name: %s\n    valtype: numeric\n    interval: 1h\n    resourcemap: [{location: [default]}]\n' "$nm"
            done
            for ((k = 0; k < per; k++)); do printf 'k%02d_%05d = %d.5\n' "$j" "$k" "$k"; done >"$dir/kv$(printf %02d "$j").txt"
        done
    } >"$dir/resources.yaml"
    printf '#!/bin/sh\nexec cat "$1"\n' >"$dir/kv.sh"
    chmod 755 "$dir/kv.sh"
    chmod 644 "$dir"/kv*.txt
}

# ---- 3. idle RSS ------------------------------------------------------------------------
if want 3; then
echo "## 3. idle RSS of the daemon after its first full round (${SETTLE} s)"
echo
echo "| configuration | VmRSS MiB | VmHWM MiB |"
echo "|---|---|---|"
d=$WORK/example && mkdir -p "$d"
agent_yaml "$d" "$ROOT/configs/resources.yaml"
sed -i "s|^plugin_dir: .*|plugin_dir: $ROOT/plugins|" "$d/agent.yaml"
idle_rss "example config (configs/resources.yaml)" "$d/agent.yaml"
for n in 1000 10000; do
    d=$WORK/file$n && mkdir -p "$d" && chmod 755 "$d"
    gen_file_probes "$n" "$d/resources.yaml"
    agent_yaml "$d" "$d/resources.yaml"
    idle_rss "$n resources, one file probe each" "$d/agent.yaml"
    d=$WORK/regex$n && mkdir -p "$d" && chmod 755 "$d"
    gen_file_probes "$n" "$d/resources.yaml" ", regex: '^(\\S+)'"
    agent_yaml "$d" "$d/resources.yaml"
    idle_rss "$n resources, one file probe each with regex ^(\\S+)" "$d/agent.yaml"
    d=$WORK/kv$n && mkdir -p "$d" && chmod 755 "$d"
    gen_kv_probes "$n" 10 "$d"
    agent_yaml "$d" "$d/resources.yaml"
    idle_rss "$n resources fed by 10 kv exec probes" "$d/agent.yaml"
done
echo
fi

# ---- metrics: /metrics beside 500 idle connections ----------------------------------------
if want metrics; then
echo "## /metrics: scrape cost, and 500 idle connections beside it"
echo
d=$WORK/metrics && mkdir -p "$d" && chmod 755 "$d"
gen_file_probes 100 "$d/resources.yaml"
agent_yaml "$d" "$d/resources.yaml" "metrics: 127.0.0.1:0
"
"$BIN" --config "$d/agent.yaml" --log-level info 2>"$d/daemon.log" &
pid=$!
sleep "$SETTLE"
addr=$(grep -o 'metrics endpoint listening addr=[^ ]*' "$d/daemon.log" | head -1 | cut -d= -f2)
# One Python process: N scrapes alone, then 500 half-sent request heads held open and N
# scrapes beside them; prints the agent's CPU ticks and RSS at each step (read from /proc).
python3 - "$pid" "$addr" <<'PY'
import socket, sys, time
pid, addr = int(sys.argv[1]), sys.argv[2]
host, port = addr.rsplit(":", 1)
hz = 100
def cpu():
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(f[11]) + int(f[12])
def rss():
    for l in open(f"/proc/{pid}/status"):
        if l.startswith("VmRSS:"):
            return int(l.split()[1]) / 1024
def scrape():
    s = socket.create_connection((host, int(port)))
    s.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
    n = 0
    while True:
        b = s.recv(65536)
        if not b:
            break
        n += len(b)
    s.close()
    return n
def run(n):
    c0, t0 = cpu(), time.monotonic()
    size = 0
    for _ in range(n):
        size = scrape()
    return (cpu() - c0) / hz / n * 1e6, (time.monotonic() - t0) / n * 1e3, size
N = 500
print("| step | agent CPU per scrape (us) | wall per scrape (ms) | VmRSS MiB | body bytes |")
print("|---|---|---|---|---|")
r0 = rss()
cpu_us, wall_ms, size = run(N)
print(f"| {N} scrapes, nothing else open | {cpu_us:.0f} | {wall_ms:.2f} | {rss():.1f} (idle {r0:.1f}) | {size} |")
idle = []
for _ in range(500):
    s = socket.create_connection((host, int(port)))
    s.sendall(b"GET /metrics HTTP/1.1\r\n")
    idle.append(s)
time.sleep(0.5)
r1 = rss()
cpu_us, wall_ms, size = run(N)
print(f"| {N} scrapes beside 500 idle connections | {cpu_us:.0f} | {wall_ms:.2f} | {r1:.1f} with them open | {size} |")
PY
kill -TERM "$pid"; wait "$pid" || true
echo
fi

# ---- 4. scheduling lateness ---------------------------------------------------------------
if want 4; then
echo "## 4. scheduling lateness"
cargo bench --quiet --bench lateness
echo
fi

# ---- 5. 50 scripts every second: collectd exec vs xce-agent ------------------------------
if want 5; then
echo "## 5. 50 probe scripts every second for ${SECS} s: collectd exec plugin vs xce-agent"
echo
d=$WORK/fifty && mkdir -p "$d" && chmod 755 "$d"
# One script for both: a plain value for xce-agent, PUTVAL for collectd (same work otherwise).
cat >"$d/probe.sh" <<'SH'
#!/bin/sh
read a b c rest < /proc/loadavg
if [ "$1" = putval ]; then
  echo "PUTVAL \"${COLLECTD_HOSTNAME:-bench}/exec-$2/gauge-load\" interval=1 N:$a"
else
  echo "$a"
fi
SH
chmod 755 "$d/probe.sh"
{
    echo "resources:"
    for ((i = 0; i < 50; i++)); do
        printf '  - name: p%02d\n    interval: 1s\n    probe: {kind: exec, command: [%s/probe.sh], format: value}\n' "$i" "$d"
    done
} >"$d/resources.yaml"
agent_yaml "$d" "$d/resources.yaml"
{
    printf 'Hostname "bench"\nFQDNLookup false\nInterval 1\nPIDFile "%s/collectd.pid"\nBaseDir "%s"\n' "$d" "$d"
    printf 'LoadPlugin logfile\n<Plugin logfile>\n  LogLevel "warning"\n  File "%s/collectd.log"\n</Plugin>\n' "$d"
    printf 'LoadPlugin exec\n<Plugin exec>\n'
    for ((i = 0; i < 50; i++)); do printf '  Exec "nobody" "%s/probe.sh" "putval" "p%02d"\n' "$d" "$i"; done
    printf '</Plugin>\n'
} >"$d/collectd.conf"

# Run a daemon for 5 s warm-up + SECS, print "| name | own CPU | children CPU | RSS | peak |".
side() {
    local label=$1
    shift
    "$@" >"$d/$label.out" 2>"$d/$label.err" &
    local pid=$!
    sleep 5
    local a b
    a=$(cpu_ticks "$pid")
    sleep "$SECS"
    b=$(cpu_ticks "$pid")
    local rss hwm
    rss=$(status_kib "$pid" VmRSS)
    hwm=$(status_kib "$pid" VmHWM)
    kill -TERM "$pid"
    wait "$pid" || true
    echo "$a $b" | awk -v l="$label" -v hz="$HZ" -v s="$SECS" -v r="$rss" -v h="$hwm" '{
        own = ($5 + $6 - $1 - $2) / hz; kids = ($7 + $8 - $3 - $4) / hz;
        printf "| %s | %.2f s (%.2f %%) | %.2f s (%.1f %%) | %.1f | %.1f |\n", l, own, own / s * 100, kids, kids / s * 100, r / 1024, h / 1024 }'
}
echo "| daemon | own CPU (children excluded) | children CPU | VmRSS MiB | VmHWM MiB |"
echo "|---|---|---|---|---|"
if command -v collectd >/dev/null; then
    side collectd collectd -f -C "$d/collectd.conf"
else
    echo "| collectd | not installed (apt-get install -y collectd-core) | | | |"
fi
side xce-agent "$BIN" --config "$d/agent.yaml" --log-level warn
echo
fi

# ---- 6. wire -------------------------------------------------------------------------------
if want 6; then
echo "## 6. wire"
ulimit -n 20000 2>/dev/null || true
cargo bench --quiet --bench wire
fi

# ---- 7. TLS --------------------------------------------------------------------------------
if want 7; then
echo "## 7. TLS on the link"
ulimit -n 20000 2>/dev/null || true
cargo bench --quiet --bench tls
fi

# ---- 23. the floor (issue 40): one run of every figure it asks for, on the same host ----
# Not in the default set (about 6 minutes): ONLY=23 scripts/bench.sh, as root, nothing else
# running. Exec cost at 50/s and 500/s against the C loops (paced and back to back) in a
# process of their own; idle wake-ups and RSS with the example config after the code release
# (release_code_after: 30s, so SETTLE 40); the latency from print to receiver over TLS.
if want 23; then
echo "## 23. at the floor: exec cost, idle wake-ups, RSS, freshness"
echo "### exec cost, 50/s"
PROBES=50 SECS=${FLOOR_SECS:-60} IDLE_SECS=30 cargo bench --quiet --bench exec_cpu
echo "### exec cost, 500/s"
PROBES=500 SECS=$(( ${FLOOR_SECS:-60} / 2 )) IDLE_SECS=0 cargo bench --quiet --bench exec_cpu
echo "### idle, the example config"
SETTLE=40 benches/idle-example.sh 60
echo "### freshness"
PROBES=20 SECS=60 cargo bench --quiet --bench freshness
fi
