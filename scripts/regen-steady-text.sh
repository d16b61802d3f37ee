#!/usr/bin/env bash
# Regenerate link/steady-text.ld: the functions an idle daemon runs once its start-up is over,
# which the link (build.rs) places together at the head of the text, so that the pages the
# steady state faults back after `release_code_after` are a few dozen instead of every 64 KiB
# window of the text (BENCHMARKS.md section 23c).
#
#   scripts/regen-steady-text.sh           run the example config under callgrind, rewrite the file
#   scripts/regen-steady-text.sh --check   how many of the file's patterns still name a function
#                                          of the release build; exit 1 under 80% (CI runs this)
#
# The list is a layout hint only: a stale or missing name costs memory (the function is
# linked where it would have been), never correctness. Names are the legacy-mangled symbols
# without their hash (`17h*`), so that a function keeps its place while its crate's hash
# changes; every instance of a generic function with that path matches. Regenerate after a
# dependency or toolchain bump or a change to the run path (the check says when).
#
# Needs valgrind and nm; run as root, as shipped (run_as, containment). Takes COLLECT (240)
# seconds after a SETTLE (40) of start-up.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out="$root/link/steady-text.ld"
bin="${CARGO_TARGET_DIR:-$root/target}/release/xce-agent"

patterns() { sed -n 's/^    \*(\.text\.\(.*\))$/\1/p' "$out"; }

if [ "${1:-}" = --check ]; then
  (cd "$root" && cargo build --release --quiet)
  nm --defined-only "$bin" | awk '{print $3}' | sort -u >"${TMPDIR:-/tmp}/steady-syms.$$"
  trap 'rm -f "${TMPDIR:-/tmp}/steady-syms.$$"' EXIT
  total=0 found=0
  while read -r p; do
    total=$((total + 1))
    case "$p" in
      *'*') grep -qF -- "${p%\*}" "${TMPDIR:-/tmp}/steady-syms.$$" && found=$((found + 1)) ;;
      *) grep -qxF -- "$p" "${TMPDIR:-/tmp}/steady-syms.$$" && found=$((found + 1)) ;;
    esac
  done < <(patterns)
  echo "steady-text: $found of $total patterns name a function of $bin"
  if ((found * 100 < total * 80)); then
    echo "steady-text: stale; run scripts/regen-steady-text.sh as root" >&2
    exit 1
  fi
  exit 0
elif [ -n "${1:-}" ]; then
  echo "usage: $0 [--check]" >&2
  exit 2
fi

work=$(mktemp -d)
trap 'kill "$vg" 2>/dev/null || true; rm -rf "$work"' EXIT
(cd "$root" && cargo build --release --quiet)
cp "$bin" "$work/xce-agent"
sed -e "s#^resources: .*#resources: $root/configs/resources.yaml#" \
    -e "s#^plugin_dir: .*#plugin_dir: $root/plugins#" \
    -e "s#^\# status_socket: .*#status_socket: $work/status.sock#" \
    "$root/configs/agent.yaml" >"$work/agent.yaml"
echo "release_code_after: 0" >>"$work/agent.yaml"
valgrind --tool=callgrind --demangle=no --callgrind-out-file="$work/cg.out" \
  "$work/xce-agent" --config "$work/agent.yaml" >"$work/log" 2>&1 &
vg=$!
sleep "${SETTLE:-40}"
callgrind_control -z "$vg" >/dev/null   # count from here: the start-up is over
sleep "${COLLECT:-240}"
callgrind_control -d "$vg" >/dev/null
sleep 2
python3 - "$work/xce-agent" "$out" "$work"/cg.out.* <<'PY'
import re, subprocess, sys
binary, out, dumps = sys.argv[1], sys.argv[2], sys.argv[3:]
ran = set()
for path in dumps:
    for line in open(path, errors="replace"):
        m = re.match(r"c?fn=\(\d+\) (.+)", line.rstrip("\n"))
        if m:
            ran.add(m.group(1))
text = {}
for line in subprocess.run(["nm", "--defined-only", binary], capture_output=True, text=True).stdout.splitlines():
    f = line.split()
    if len(f) == 3 and f[1] in "tTwW":
        text[f[2]] = int(f[0], 16)
patterns = []
for name in sorted((n for n in ran if n in text), key=text.get):
    m = re.fullmatch(r"(_ZN.*17h)[0-9a-f]{16}E", name)
    p = m.group(1) + "*" if m else name
    if p not in patterns:
        patterns.append(p)
with open(out, "w") as f:
    f.write("/* The steady state's code, together: written by scripts/regen-steady-text.sh. */\n")
    f.write("SECTIONS {\n  .text.steady : {\n")
    f.writelines(f"    *(.text.{p})\n" for p in patterns)
    f.write("  }\n}\nINSERT BEFORE .text;\n")
print(f"steady-text: {len(patterns)} patterns from {len(ran)} functions run", file=sys.stderr)
PY
