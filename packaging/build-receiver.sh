#!/bin/sh
# Build the C library's packages for the controller host, split as distributions ship a C
# library (docs/controller.md, "Packages"):
#
#   .deb  libxce-receiver0         libxce_receiver.so.0 (stripped), copyright, DEBIAN/symbols
#         libxce-receiver-dev      header, .pc, static library, the .so link, valgrind.supp,
#                                  the example controller and worker with a Makefile that
#                                  builds them there
#         libxce-receiver0-dbgsym  the .so's debug symbols (/usr/lib/debug/.build-id/...)
#   .rpm  xce-receiver, xce-receiver-devel, xce-receiver-debuginfo: the same split
#
#   packaging/build-receiver.sh [--profile release|dev] [-o DIR]   # -> DIR/*.deb, DIR/*.rpm
#
# The files come from scripts/install-capi.sh (the layout cargo-c's cinstall makes); this
# script strips them (the debug information into its own package, by build id), writes the
# control files and runs dpkg-deb and rpmbuild. `lintian DIR/*.deb` reports no errors
# (tests/it/packaging.rs checks it). Not in the agent's packages: 5,000 nodes need no C
# receiver.
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
for tool in dpkg-deb dpkg-shlibdeps rpmbuild objcopy strip; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "build-receiver.sh: $tool is not installed; install it with: apt-get install dpkg-dev rpm binutils" >&2
        exit 1
    fi
done
case $profile in dev) built=debug ;; *) built=$profile ;; esac
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' capi/Cargo.toml | head -n 1)
major=${version%%.*}
arch=$(dpkg --print-architecture)
multiarch=$(gcc -print-multiarch 2>/dev/null || echo "$(uname -m)-linux-gnu")
# The packages' timestamps (changelog) follow the last commit, so a rebuild is the same.
date=$(git log -1 --format=%cD 2>/dev/null || date -R)
mkdir -p "$out"
out=$(cd "$out" && pwd)
stage=$(mktemp -d "${TMPDIR:-/tmp}/xce-receiver-pkg.XXXXXX")
trap 'rm -rf "$stage"' EXIT
runtime=libxce-receiver$major
dev=libxce-receiver-dev
dbgsym=$runtime-dbgsym

# Install into one tree, then move each file to its package's tree.
tree=$stage/install
scripts/install-capi.sh --prefix /usr --libdir "lib/$multiarch" --destdir "$tree" --profile "$built"
lib=usr/lib/$multiarch
so=libxce_receiver.so.$version

# Strip as dh_strip does: the debug information into a file named by the build id (where
# gdb, debuginfod and systemd-coredump look), the library keeping a link to it.
build_id=$(readelf -n "$tree/$lib/$so" | sed -n 's/^ *Build ID: *//p')
if [ -z "$build_id" ]; then
    echo "build-receiver.sh: $so has no build id (the linker's --build-id)" >&2
    exit 1
fi
debug_file=usr/lib/debug/.build-id/$(echo "$build_id" | cut -c1-2)/$(echo "$build_id" | cut -c3-).debug
mkdir -p "$stage/debug/$(dirname "$debug_file")"
objcopy --only-keep-debug --compress-debug-sections "$tree/$lib/$so" "$stage/debug/$debug_file"
chmod 644 "$stage/debug/$debug_file"
strip --remove-section=.comment --remove-section=.note --strip-unneeded "$tree/$lib/$so"
objcopy --add-gnu-debuglink="$stage/debug/$debug_file" "$tree/$lib/$so"
chmod 644 "$tree/$lib/$so"
# The archive's objects keep their symbols (a program links them) but not their DWARF.
strip --strip-debug --remove-section=.comment --remove-section=.note \
    --enable-deterministic-archives "$tree/$lib/libxce_receiver.a"

# Documentation every package carries: the copyright and the changelog.
docs() { # package tree
    install -d "$2/usr/share/doc/$1"
    install -m 644 packaging/receiver/copyright "$2/usr/share/doc/$1/copyright"
    printf '%s (%s) unstable; urgency=medium\n\n  * Release %s of libxce_receiver (docs/controller.md).\n\n -- xce maintainers <xce-maintainers@example.org>  %s\n' \
        "$runtime" "$version" "$version" "$date" | gzip -9n > "$2/usr/share/doc/$1/changelog.gz"
}

# libxce-receiverN: what a program that links the library needs at run time.
rt=$stage/$runtime
install -d "$rt/$lib" "$rt/DEBIAN"
mv "$tree/$lib/$so" "$rt/$lib/"
mv "$tree/$lib/libxce_receiver.so.$major" "$rt/$lib/"
docs "$runtime" "$rt"
sed "1s/ libxce-receiver0 / $runtime /" capi/libxce_receiver.symbols > "$rt/DEBIAN/symbols"
echo "libxce_receiver $major $runtime (>= $version)" > "$rt/DEBIAN/shlibs"
# ldconfig runs through dpkg's trigger, not from maintainer scripts.
echo "activate-noawait ldconfig" > "$rt/DEBIAN/triggers"
# The library's own dependencies, from the ELF file, as dh_shlibdeps finds them.
mkdir -p "$stage/shlibdeps/debian"
printf 'Source: xce-receiver\n\nPackage: %s\nArchitecture: any\n' "$runtime" > "$stage/shlibdeps/debian/control"
depends=$(cd "$stage/shlibdeps" && dpkg-shlibdeps -O "$rt/$lib/$so" 2>/dev/null | sed -n 's/^shlibs:Depends=//p')
cat > "$rt/DEBIAN/control" <<CONTROL
Package: $runtime
Source: xce-receiver
Version: $version
Architecture: $arch
Multi-Arch: same
Section: libs
Priority: optional
Maintainer: xce maintainers <xce-maintainers@example.org>
Depends: $depends
Description: receive what xce agents send, from C (shared library)
 The receiver core of xce-agent listen behind a C ABI, for xce's controller:
 mutual TLS, exact host identity, frame and connection limits, newest connection
 wins per host and staleness, delivered as events on a pollable file descriptor.
 .
 This package holds the shared library.
CONTROL

# libxce-receiver-dev: what building a program against it needs.
dv=$stage/$dev
install -d "$dv/DEBIAN" "$dv/usr/share/doc/$dev/examples"
cp -a "$tree/usr/." "$dv/usr/"
docs "$dev" "$dv"
gzip -9n < docs/controller.md > "$dv/usr/share/doc/$dev/controller.md.gz"
install -m 644 examples/c/xce-controller-example.c examples/c/worker.c examples/c/Makefile \
    "$dv/usr/share/doc/$dev/examples/"
cat > "$dv/DEBIAN/control" <<CONTROL
Package: $dev
Source: xce-receiver
Version: $version
Architecture: $arch
Multi-Arch: same
Section: libdevel
Priority: optional
Maintainer: xce maintainers <xce-maintainers@example.org>
Depends: $runtime (= $version)
Description: receive what xce agents send, from C (development files)
 The receiver core of xce-agent listen behind a C ABI, for xce's controller:
 mutual TLS, exact host identity, frame and connection limits, newest connection
 wins per host and staleness, delivered as events on a pollable file descriptor.
 .
 This package holds the header (xce_receiver.h), the pkg-config file
 (xce_receiver), the static library, valgrind suppressions and an example
 controller whose Makefile builds it through pkg-config.
CONTROL

# libxce-receiverN-dbgsym: the debug symbols, as debhelper's automatic dbgsym package.
dg=$stage/$dbgsym
install -d "$dg/DEBIAN" "$dg/usr/share/doc"
cp -a "$stage/debug/usr/." "$dg/usr/"
ln -s "$runtime" "$dg/usr/share/doc/$dbgsym"
cat > "$dg/DEBIAN/control" <<CONTROL
Package: $dbgsym
Source: xce-receiver
Version: $version
Architecture: $arch
Multi-Arch: same
Section: debug
Priority: optional
Maintainer: xce maintainers <xce-maintainers@example.org>
Depends: $runtime (= $version)
Auto-Built-Package: debug-symbols
Build-Ids: $build_id
Description: debug symbols for $runtime
CONTROL

for p in "$rt" "$dv" "$dg"; do
    name=$(basename "$p")
    (cd "$p" && find usr -type f | LC_ALL=C sort | xargs md5sum > DEBIAN/md5sums)
    dpkg-deb --root-owner-group -Zxz --build "$p" "$out/${name}_${version}_$arch.deb" >/dev/null
done

# The .rpms: /usr/lib64, as RPM distributions keep 64-bit libraries; the same stripped
# files and debug file, split by packaging/rpm/xce-receiver.spec.
rpmroot=$stage/rpm
install -d "$rpmroot/usr/lib64" "$rpmroot/usr/share/doc/xce-receiver-devel/examples"
cp -a "$rt/$lib/." "$dv/$lib/." "$rpmroot/usr/lib64/"
rm -rf "$rpmroot/usr/lib64/pkgconfig"
install -d "$rpmroot/usr/lib64/pkgconfig"
sed "s|^libdir=.*|libdir=\${prefix}/lib64|" "$dv/$lib/pkgconfig/xce_receiver.pc" \
    > "$rpmroot/usr/lib64/pkgconfig/xce_receiver.pc"
cp -a "$dv/usr/include" "$dv/usr/share" "$rpmroot/usr/"
rm -rf "$rpmroot/usr/share/doc/$dev"
install -d "$rpmroot/usr/share/doc/xce-receiver-devel/examples" "$rpmroot/usr/share/licenses/xce-receiver"
install -m 644 packaging/receiver/copyright "$rpmroot/usr/share/licenses/xce-receiver/copyright"
install -m 644 docs/controller.md "$rpmroot/usr/share/doc/xce-receiver-devel/"
install -m 644 examples/c/xce-controller-example.c examples/c/worker.c examples/c/Makefile \
    "$rpmroot/usr/share/doc/xce-receiver-devel/examples/"
cp -a "$stage/debug/usr/." "$rpmroot/usr/"
rpmbuild -bb --quiet \
    --define "_topdir $stage/rpmbuild" \
    --define "_rpmdir $out" \
    --define "staged $rpmroot" \
    --define "pkg_version $version" \
    --define "debug_file /$debug_file" \
    packaging/rpm/xce-receiver.spec
find "$out" -name '*.deb' -o -name '*.rpm'
