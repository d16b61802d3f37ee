#!/bin/sh
# `xce-agent check` on resources.yaml files of 10,000 / 50,000 / 100,000 honest resources
# (name, desc, valtype, interval, resourcemap, file probe: the shape tests/it/config_limits.rs
# loads): wall time, CPU (user+sys) and peak RSS, against the floor of reading the same file
# (`cat`). Run as root, as nodes run the agent. Usage: scripts/bench-config-size.sh [BIN]
set -eu
bin=${1:-target/release/xce-agent}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
printf 'host: node001\nresources: resources.yaml\nrun_as: nobody\n' > "$dir/agent.yaml"
printf '%-8s %-9s %-9s %-9s %-10s %-9s %-9s\n' resources bytes wall_s cpu_s peak_rss cat_cpu_s cat_rss
for n in 10000 50000 100000; do
    python3 - "$n" > "$dir/resources.yaml" <<'EOF'
import sys
n = int(sys.argv[1])
out = ["resources:"]
for i in range(n):
    out.append(f"""  - name: res_{i}
    desc: resource number {i}
    valtype: numeric
    interval: 60s
    resourcemap:
      - location: [default]
    probe:
      kind: file
      path: /sys/class/x/{i}""")
print("\n".join(out))
EOF
    size=$(stat -c %s "$dir/resources.yaml")
    best=""
    for _ in 1 2 3; do
        /usr/bin/time -f '%e %U %S %M' -o "$dir/t" "$bin" --config "$dir/agent.yaml" check > /dev/null
        line=$(awk '{printf "%s %.2f %d", $1, $2 + $3, $4}' "$dir/t")
        best=$(printf '%s\n%s\n' "$best" "$line" | awk 'NF' | sort -n | head -1)
    done
    /usr/bin/time -f '%U %S %M' -o "$dir/c" cat "$dir/resources.yaml" > /dev/null
    floor=$(awk '{printf "%.2f %d", $1 + $2, $3}' "$dir/c")
    set -- $best $floor
    printf '%-8s %-9s %-9s %-9s %-10s %-9s %-9s\n' "$n" "$size" "$1" "$2" "${3}KiB" "$4" "${5}KiB"
done
