//! `xce_receiver_version()`: which library a program loaded and which protocol versions it
//! speaks, for a controller's log line and for refusing a library older than it needs (the
//! soname says only the ABI's major).
//!
//! Its own module so the one exported function stays out of the receiver's code: it reads
//! constants and cannot fail or panic.

use std::ffi::{c_char, CStr};

use xce_agent::link::wire::{MIN_PROTOCOL_VERSION, PROTOCOL_VERSION};

/// The library's version and the agent protocol versions it speaks.
/// Returned by value by `xce_receiver_version`; adding a field is an ABI change (a new
/// soname, docs/controller.md "ABI").
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(non_camel_case_types)] // the C name
pub struct xce_version {
    /// "MAJOR.MINOR.PATCH", the package's version. Static: never freed.
    pub library: *const c_char,
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
    /// The oldest agent protocol version the library accepts in a hello.
    pub protocol_min: u32,
    /// The newest agent protocol version the library speaks (what it answers with).
    pub protocol_max: u32,
}

/// The crate's version as a static C string, checked at compile time.
const LIBRARY: &CStr =
    match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
        Ok(s) => s,
        Err(_) => panic!("the package version contains a NUL"),
    };

/// A version component from Cargo's environment, parsed at compile time.
const fn component(text: &str) -> u32 {
    let bytes = text.as_bytes();
    let mut value: u32 = 0;
    let mut i = 0;
    while i < bytes.len() {
        let digit = bytes[i];
        assert!(
            digit.is_ascii_digit(),
            "a version component that is not a number"
        );
        value = value * 10 + (digit - b'0') as u32;
        i += 1;
    }
    value
}

/// The library's version (that of the loaded .so, which may be newer than the header the
/// program was compiled with) and the agent protocol versions it speaks. Any thread, any
/// time, before or without a receiver; never fails.
// `no_mangle` is what the lint calls unsafe: the name is the ABI. No unsafe code here.
#[allow(unsafe_code)]
#[no_mangle]
pub extern "C" fn xce_receiver_version() -> xce_version {
    xce_version {
        library: LIBRARY.as_ptr(),
        major: component(env!("CARGO_PKG_VERSION_MAJOR")),
        minor: component(env!("CARGO_PKG_VERSION_MINOR")),
        patch: component(env!("CARGO_PKG_VERSION_PATCH")),
        protocol_min: u32::from(MIN_PROTOCOL_VERSION),
        protocol_max: u32::from(PROTOCOL_VERSION),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_is_the_packages_and_the_protocols() {
        let v = xce_receiver_version();
        let text = LIBRARY.to_str().expect("utf-8");
        assert_eq!(text, env!("CARGO_PKG_VERSION"));
        assert_eq!(v.library, LIBRARY.as_ptr());
        assert_eq!(format!("{}.{}.{}", v.major, v.minor, v.patch), text);
        assert_eq!(v.protocol_min, u32::from(MIN_PROTOCOL_VERSION));
        assert_eq!(v.protocol_max, u32::from(PROTOCOL_VERSION));
        assert!(v.protocol_min <= v.protocol_max);
    }
}
