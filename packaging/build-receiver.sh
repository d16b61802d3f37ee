#!/bin/sh
# Build the C library's packages for the controller host: libxce-receiver (.deb) and
# xce-receiver (.rpm), each with the shared library (soname libxce_receiver.so.0, and the
# .so.0 / .so links), the static library, the header and the pkg-config file, laid out by
# scripts/install-capi.sh as distributions lay out a C library.
#   packaging/build-receiver.sh [--profile release|dev] [-o DIR]   # -> DIR/*.deb, DIR/*.rpm
# One package, not a runtime/-dev pair: its one consumer is xce's controller, built and run
# on the controller host (a pair is the split to make once a second program links it). Not
# in the agent's packages: 5,000 nodes need no C receiver.
set -eu
cd "$(dirname "$0")/.."
profile=release
out=target/receiver-packages
while [ $# -gt 0 ]; do
    case "$1" in
        --profile) profile=$2; shift 2 ;;
        -o) out=$2; shift 2 ;;
        *) echo "usage: $0 [--profile release|dev] [-o DIR]" >&2; exit 2 ;;
    esac
done
for tool in dpkg-deb rpmbuild; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "build-receiver.sh: $tool is not installed; install it with: apt-get install dpkg-dev rpm" >&2
        exit 1
    fi
done
case $profile in dev) built=debug ;; *) built=$profile ;; esac
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' capi/Cargo.toml | head -n 1)
arch=$(dpkg --print-architecture)
multiarch=$(gcc -print-multiarch 2>/dev/null || echo "$(uname -m)-linux-gnu")
mkdir -p "$out"
out=$(cd "$out" && pwd)
stage=$(mktemp -d "${TMPDIR:-/tmp}/xce-receiver-pkg.XXXXXX")
trap 'rm -rf "$stage"' EXIT

# The .deb: Debian's multiarch library directory.
deb=$stage/deb
scripts/install-capi.sh --prefix /usr --libdir "lib/$multiarch" --destdir "$deb" --profile "$built"
install -d "$deb/usr/share/doc/libxce-receiver/examples" "$deb/DEBIAN"
install -m 644 docs/controller.md "$deb/usr/share/doc/libxce-receiver/"
install -m 644 examples/c/xce-controller-example.c examples/c/Makefile \
    "$deb/usr/share/doc/libxce-receiver/examples/"
cat > "$deb/DEBIAN/control" <<CONTROL
Package: libxce-receiver
Version: $version
Architecture: $arch
Section: libdevel
Priority: optional
Maintainer: xce maintainers <xce-maintainers@example.org>
Depends: libc6
Description: receive what xce agents send, from C
 The receiver core of \`xce-agent listen\` behind a C ABI, for xce's controller: mutual TLS,
 exact host identity, frame and connection limits, newest-connection-wins per host and
 staleness, delivered as events on a pollable file descriptor. Shared and static library,
 header (xce_receiver.h) and pkg-config file (xce_receiver), with an example controller.
CONTROL
# ldconfig keeps the loader's cache in step with the .so.0 this package adds or removes.
cat > "$deb/DEBIAN/postinst" <<'SCRIPT'
#!/bin/sh
set -e
if [ "$1" = configure ]; then ldconfig; fi
SCRIPT
cat > "$deb/DEBIAN/postrm" <<'SCRIPT'
#!/bin/sh
set -e
if [ "$1" = remove ]; then ldconfig; fi
SCRIPT
chmod 755 "$deb/DEBIAN/postinst" "$deb/DEBIAN/postrm"
dpkg-deb --root-owner-group --build "$deb" "$out/libxce-receiver_${version}_$arch.deb" >/dev/null

# The .rpm: /usr/lib64, as RPM distributions keep 64-bit libraries.
rpmroot=$stage/rpm
scripts/install-capi.sh --prefix /usr --libdir lib64 --destdir "$rpmroot" --profile "$built"
rpmbuild -bb --quiet \
    --define "_topdir $stage/rpmbuild" \
    --define "_rpmdir $out" \
    --define "staged $rpmroot" \
    --define "checkout $PWD" \
    --define "pkg_version $version" \
    packaging/rpm/xce-receiver.spec
find "$out" -name '*.deb' -o -name '*.rpm'
