//! `it`: idle time in whole minutes (LSF shows whole minutes too).
//!
//! `it = floor((now - newest atime) / 60 s)` over
//! - the login terminals: the ttys of the current login sessions (logind `TTY=`, else utmp
//!   `ut_line` of `USER_PROCESS` records; see `users.rs`, whose one read per tick gives them),
//!   as `<dev>/<tty>`, names restricted to `[A-Za-z0-9/]` so nothing outside `<dev>` is
//!   stat'ed; a terminal that no longer exists (stale utmp record) is skipped;
//! - the entries of `<dev>/input` (console keyboards and mice; no recursion into `by-id/`).
//!
//! Reading a keystroke from any of them updates its atime. An atime in the future (clock
//! stepped back) reads as 0.
//!
//! This is LSF's `it` (`idletime()` in lim's `lim.rload.c`, as published in openlava):
//! the minimum over the utmp users' `/dev/<ut_line>` atimes (X displays `:N` skipped)
//! and `/dev/kbd`, `/dev/mouse` — not every terminal on the host: a pty nobody logged in
//! on (a job's `script`, an editor's terminal) is not interactive use of the host.
//!
//! No login terminal and no input device (a headless node nobody is logged in on, a
//! container): idle since boot, `/proc/uptime` minutes. LSF instead counts from lim's
//! start and remembers the last activity it saw across logouts; we keep no state between
//! ticks, so after the last user logs out `it` jumps from their idle time to the uptime.
//! Both say "nobody is using this host interactively", which is what `it` thresholds test.
//!
//! When the sessions cannot be read, `it` fails with that reason: a value without the
//! terminals could claim idle while someone types.

use std::path::Path;
use std::time::SystemTime;

use super::users::LoginTtys;
use super::{read_file, Ix, ReadError, Roots, Slots};

pub(crate) fn sample(
    roots: &Roots,
    login_ttys: &LoginTtys,
    buf: &mut Vec<u8>,
    wall_now: SystemTime,
    slots: &mut Slots,
) {
    let ttys = match login_ttys {
        Ok(ttys) => ttys,
        Err(e) => return slots.fail(&[Ix::It], format!("login terminals unknown: {e}")),
    };
    let mut newest: Option<SystemTime> = None;
    let mut see = |meta: std::fs::Metadata| {
        // Directories (`<dev>/input/by-id`) are not devices.
        if let (false, Ok(at)) = (meta.is_dir(), meta.accessed()) {
            newest = Some(newest.map_or(at, |n| n.max(at)));
        }
    };
    for tty in ttys {
        // A session whose terminal is gone (stale utmp record) has no input to show.
        if let Ok(meta) = std::fs::metadata(roots.dev.join(tty)) {
            see(meta);
        }
    }
    for_each_input(&roots.dev.join("input"), &mut see);
    let minutes = match newest {
        Some(at) => Ok(wall_now.duration_since(at).map_or(0.0, |d| d.as_secs_f64())),
        None => uptime_secs(roots, buf),
    }
    .map(|secs| (secs / 60.0).floor());
    match minutes {
        Ok(m) => slots.ok(Ix::It, m),
        Err(e) => slots.fail(&[Ix::It], crate::value::Failure::new(e)),
    }
}

fn for_each_input(dir: &Path, see: &mut impl FnMut(std::fs::Metadata)) {
    // A missing directory (no /dev/input in a container) just has no devices.
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    // Stat relative to the open directory (no path walk per device); a device unplugged
    // since the listing is simply gone.
    for meta in entries.flatten().filter_map(|e| e.metadata().ok()) {
        see(meta);
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
