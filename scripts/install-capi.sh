#!/usr/bin/env bash
# Install libxce_receiver the way distributions lay out a C library (what cargo-c's
# `cargo cinstall` does; see docs/controller.md for why this script and not cargo-c):
#
#   DESTDIR/PREFIX/LIBDIR/libxce_receiver.so.VERSION   the shared library (soname .so.MAJOR)
#   DESTDIR/PREFIX/LIBDIR/libxce_receiver.so.MAJOR     -> .so.VERSION (what programs load)
#   DESTDIR/PREFIX/LIBDIR/libxce_receiver.so           -> .so.MAJOR (what -lxce_receiver finds)
#   DESTDIR/PREFIX/LIBDIR/libxce_receiver.a            the static library
#   DESTDIR/PREFIX/include/xce_receiver.h              the generated header
#   DESTDIR/PREFIX/LIBDIR/pkgconfig/xce_receiver.pc
#   DESTDIR/PREFIX/share/xce_receiver/valgrind.supp    memcheck suppressions (the .pc names it)
#
#   scripts/install-capi.sh [--prefix /usr] [--libdir lib] [--destdir DIR] [--profile release]
#
# Builds the library first (cargo build -p xce-receiver, in that profile).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
prefix=/usr/local
libdir=lib
destdir=
profile=release
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) prefix=$2; shift 2 ;;
    --libdir) libdir=$2; shift 2 ;;
    --destdir) destdir=$2; shift 2 ;;
    --profile) profile=$2; shift 2 ;;
    *) echo "usage: $0 [--prefix P] [--libdir L] [--destdir D] [--profile debug|release]" >&2; exit 2 ;;
  esac
done

cargo=${CARGO:-cargo}
if [ "$profile" = release ]; then
  "$cargo" build --quiet --release -p xce-receiver --manifest-path "$root/Cargo.toml"
else
  "$cargo" build --quiet -p xce-receiver --manifest-path "$root/Cargo.toml"
fi
target=${CARGO_TARGET_DIR:-$root/target}/$profile
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/capi/Cargo.toml" | head -1)
major=${version%%.*}

lib="$destdir$prefix/$libdir"
inc="$destdir$prefix/include"
install -d "$lib/pkgconfig" "$inc" "$destdir$prefix/share/xce_receiver"
install -m 755 "$target/libxce_receiver.so" "$lib/libxce_receiver.so.$version"
ln -sf "libxce_receiver.so.$version" "$lib/libxce_receiver.so.$major"
ln -sf "libxce_receiver.so.$major" "$lib/libxce_receiver.so"
install -m 644 "$target/libxce_receiver.a" "$lib/libxce_receiver.a"
install -m 644 "$root/capi/include/xce_receiver.h" "$inc/xce_receiver.h"
install -m 644 "$root/capi/valgrind.supp" "$destdir$prefix/share/xce_receiver/valgrind.supp"
sed -e "s|@PREFIX@|$prefix|" -e "s|@LIBDIR@|\${prefix}/$libdir|" -e "s|@VERSION@|$version|" \
  "$root/capi/xce_receiver.pc.in" > "$lib/pkgconfig/xce_receiver.pc"
echo "install-capi: libxce_receiver $version into $destdir$prefix"
