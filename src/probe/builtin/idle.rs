//! `it`: idle time in whole minutes (LSF shows whole minutes too).
//!
//! `it = floor((now - newest atime) / 60 s)` over the terminals `<dev>/pts/*` (not `ptmx`),
//! the consoles `<dev>/tty<N>` and the input devices `<dev>/input/*`: reading a keystroke
//! from any of them updates its atime. A host with none of them (a container, a headless
//! node without consoles) has been idle since boot: `/proc/uptime` minutes.
//! An atime in the future (clock stepped back) reads as 0.

use std::path::Path;
use std::time::SystemTime;

use super::{read_file, Ix, ReadError, Roots, Slots};

pub(crate) fn sample(roots: &Roots, buf: &mut Vec<u8>, wall_now: SystemTime, slots: &mut Slots) {
    let mut newest: Option<SystemTime> = None;
    let mut see = |entry: &std::fs::DirEntry| {
        // Stat relative to the open directory (no path walk: this runs for each of the
        // 64 consoles every tick). A terminal that closed since the listing is simply gone;
        // directories (`/dev/input/by-id`) are not devices.
        if let Ok(meta) = entry.metadata() {
            if let (false, Ok(at)) = (meta.is_dir(), meta.accessed()) {
                newest = Some(newest.map_or(at, |n| n.max(at)));
            }
        }
    };
    for_each_entry(&roots.dev.join("pts"), |name| name != "ptmx", &mut see);
    for_each_entry(&roots.dev, is_console, &mut see);
    for_each_entry(&roots.dev.join("input"), |_| true, &mut see);
    let minutes = match newest {
        Some(at) => Ok(wall_now.duration_since(at).map_or(0.0, |d| d.as_secs_f64())),
        None => uptime_secs(roots, buf),
    }
    .map(|secs| (secs / 60.0).floor());
    match minutes {
        Ok(m) => slots.ok(Ix::It, m),
        Err(e) => slots.fail(&[Ix::It], &e.to_string()),
    }
}

fn is_console(name: &str) -> bool {
    name.strip_prefix("tty")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

fn for_each_entry(
    dir: &Path,
    keep: impl Fn(&str) -> bool,
    see: &mut impl FnMut(&std::fs::DirEntry),
) {
    // A missing directory (no /dev/input in a container) just has no devices.
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_name().to_str().is_some_and(&keep) {
            see(&entry);
        }
    }
}

fn uptime_secs(roots: &Roots, buf: &mut Vec<u8>) -> Result<f64, ReadError> {
    let path = roots.proc.join("uptime");
    read_file(&path, buf)?;
    let text = String::from_utf8_lossy(buf);
    text.split_whitespace()
        .next()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .ok_or_else(|| ReadError::parse(&path, format!("not an uptime: {:?}", text.trim())))
}

#[cfg(test)]
mod tests {
    #[test]
    fn consoles() {
        assert!(super::is_console("tty1"));
        assert!(super::is_console("tty63"));
        assert!(!super::is_console("tty"));
        assert!(!super::is_console("ttyS0"));
        assert!(!super::is_console("ttyUSB0"));
    }
}
