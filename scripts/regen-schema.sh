#!/usr/bin/env bash
# Regenerate src/link/agent_capnp.rs from schema/agent.capnp.
#
#   scripts/regen-schema.sh           regenerate and overwrite the committed file
#   scripts/regen-schema.sh --check   regenerate into a temp dir, diff against the committed
#                                     file, exit 1 if it is stale (CI runs this)
#
# Needs the C++ `capnp` tool (Debian: apt-get install capnproto libcapnp-dev) and cargo.
# The normal build does not: the generated code is committed.
#
# Why a tiny build instead of `capnp compile -orust`: the stock capnpc-rust plugin writes
# paths as `crate::agent_capnp::...`, but the module lives at `crate::link::agent_capnp`.
# The capnpc library's `default_parent_module` fixes that without annotating the schema
# with rust.capnp (which would make it less readable from C/C++).
set -euo pipefail

CAPNPC_VERSION=0.27.0
root=$(cd "$(dirname "$0")/.." && pwd)
schema="$root/schema/agent.capnp"
committed="$root/src/link/agent_capnp.rs"

check=0
case "${1:-}" in
  --check) check=1 ;;
  "") ;;
  *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

command -v capnp >/dev/null || {
  echo "regen-schema: the capnp tool is missing (apt-get install capnproto libcapnp-dev)" >&2
  exit 2
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The generator: a few lines on top of the capnpc crate, pinned to the capnp runtime version.
mkdir -p "$work/gen/src"
cat > "$work/gen/Cargo.toml" <<TOML
[package]
name = "xce-regen-schema"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
capnpc = "=$CAPNPC_VERSION"

[workspace]
TOML
cat > "$work/gen/src/main.rs" <<'RS'
fn main() {
    let mut args = std::env::args().skip(1);
    let (schema_dir, schema, out) = match (args.next(), args.next(), args.next()) {
        (Some(d), Some(s), Some(o)) => (d, s, o),
        _ => {
            eprintln!("usage: gen SCHEMA_DIR SCHEMA OUT_DIR");
            std::process::exit(2);
        }
    };
    if let Err(e) = capnpc::CompilerCommand::new()
        .src_prefix(&schema_dir)
        .file(&schema)
        .output_path(&out)
        .default_parent_module(vec!["link".into()])
        .run()
    {
        eprintln!("capnp compile failed: {e}");
        std::process::exit(1);
    }
}
RS

# Reuse one build directory so the generator is compiled once per checkout.
export CARGO_TARGET_DIR="$root/target/regen-schema"
cargo build --quiet --manifest-path "$work/gen/Cargo.toml"
mkdir -p "$work/out"
"$CARGO_TARGET_DIR/debug/xce-regen-schema" "$root/schema" "$schema" "$work/out"

generated="$work/out/agent_capnp.rs"
[ -f "$generated" ] || { echo "regen-schema: no agent_capnp.rs produced" >&2; exit 1; }

if [ "$check" = 1 ]; then
  # The header names the capnp tool's version, which does not change the code.
  if diff -u -I "^// capnp binary version:" "$committed" "$generated"; then
    echo "regen-schema: $committed is up to date"
  else
    echo "regen-schema: $committed is stale; run scripts/regen-schema.sh and commit" >&2
    exit 1
  fi
else
  cp "$generated" "$committed"
  echo "regen-schema: wrote $committed"
fi
