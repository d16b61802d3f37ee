#!/bin/sh
# Build the .deb: the binary, then the man pages and completions generated from it (clap
# definition in src/cli.rs), then cargo-deb (`cargo install cargo-deb --locked`).
#   packaging/build-deb.sh                       # release build -> target/debian/*.deb
#   packaging/build-deb.sh --profile dev -o DIR  # quick package of a debug build (tests)
# Other arguments go to `cargo deb`.
set -eu
cd "$(dirname "$0")/.."
# Before a build that takes minutes: the last step needs cargo-deb.
if ! cargo deb --version >/dev/null 2>&1; then
    echo "build-deb.sh: cargo-deb is not installed; install it with: cargo install cargo-deb --locked" >&2
    exit 1
fi
profile=release
if [ "${1:-}" = "--profile" ]; then
    profile=$2
    shift 2
fi
case $profile in
    dev) out=debug ;;
    *) out=$profile ;;
esac
cargo build --locked --profile "$profile" --bin xce-agent
"target/$out/xce-agent" generate-assets target/assets >/dev/null
exec cargo deb --no-build --profile "$profile" "$@"
