#!/bin/sh
# Build the .rpm: release binary, generated man pages and completions, then
# cargo-generate-rpm (`cargo install cargo-generate-rpm --locked`) -> target/generate-rpm/.
set -eu
cd "$(dirname "$0")/.."
cargo build --locked --release --bin xce-agent
target/release/xce-agent generate-assets target/assets >/dev/null
exec cargo generate-rpm "$@"
