#!/usr/bin/env bash
# Regenerate capi/include/xce_receiver.h from the library's Rust source (capi/src) with
# cbindgen, configured by capi/cbindgen.toml.
#
#   scripts/regen-header.sh           regenerate and overwrite the committed header
#   scripts/regen-header.sh --check   generate into a temp file, diff against the committed
#                                     header, exit 1 if it is stale (CI runs this)
#
# Needs cbindgen at the version below (cargo install cbindgen --version $CBINDGEN_VERSION
# --locked); building the library or a C program against it does not: the header is
# committed. A different cbindgen may lay the same API out differently, so the version is
# pinned and checked.
set -euo pipefail

CBINDGEN_VERSION=0.29.4
root=$(cd "$(dirname "$0")/.." && pwd)
committed="$root/capi/include/xce_receiver.h"

check=0
case "${1:-}" in
  --check) check=1 ;;
  "") ;;
  *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

command -v cbindgen >/dev/null || {
  echo "regen-header: cbindgen is missing (cargo install cbindgen --version $CBINDGEN_VERSION --locked)" >&2
  exit 2
}
have=$(cbindgen --version | awk '{print $2}')
if [ "$have" != "$CBINDGEN_VERSION" ]; then
  echo "regen-header: cbindgen $have, need $CBINDGEN_VERSION (cargo install cbindgen --version $CBINDGEN_VERSION --locked --force)" >&2
  exit 2
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cbindgen --quiet --config "$root/capi/cbindgen.toml" --crate xce-receiver \
  --output "$work/xce_receiver.h" "$root/capi"

if [ "$check" = 1 ]; then
  if diff -u "$committed" "$work/xce_receiver.h"; then
    echo "regen-header: $committed is up to date"
  else
    echo "regen-header: $committed is stale; run scripts/regen-header.sh and commit" >&2
    exit 1
  fi
else
  mkdir -p "$(dirname "$committed")"
  cp "$work/xce_receiver.h" "$committed"
  echo "regen-header: wrote $committed"
fi
