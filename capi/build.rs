//! The shared library's soname: `libxce_receiver.so.<major>`, as distributions ship C
//! libraries (the package installs the file under that name with the unversioned link in the
//! -dev files). The major follows the crate's version: 0 while the ABI is young.

fn main() {
    let major = std::env::var("CARGO_PKG_VERSION_MAJOR").unwrap_or_else(|_| "0".into());
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libxce_receiver.so.{major}");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
