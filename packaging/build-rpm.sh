#!/bin/sh
# Build the .rpm: the release binary, the man pages and completions generated from it (clap
# definition in src/cli.rs), then rpmbuild with packaging/rpm/xce-agent.spec.
#   packaging/build-rpm.sh            # -> target/rpmbuild/RPMS/<arch>/xce-agent-<version>-1.<arch>.rpm
# rpmbuild comes with the `rpm` package on Debian/Ubuntu and `rpm-build` on RPM distributions.
set -eu
cd "$(dirname "$0")/.."
# Before a build that takes minutes: the last step needs rpmbuild.
if ! command -v rpmbuild >/dev/null 2>&1; then
    echo "build-rpm.sh: rpmbuild is not installed; install it with: apt-get install rpm (Debian/Ubuntu) or dnf install rpm-build" >&2
    exit 1
fi
cargo build --locked --release --bin xce-agent
target/release/xce-agent generate-assets target/assets >/dev/null
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
exec rpmbuild -bb --quiet \
    --define "_topdir $PWD/target/rpmbuild" \
    --define "checkout $PWD" \
    --define "pkg_version $version" \
    "$@" packaging/rpm/xce-agent.spec
