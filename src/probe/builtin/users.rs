//! `ls`: distinct users logged in.
//!
//! With systemd-logind (`<run>/systemd/sessions` exists): each session file (`KEY=VALUE`
//! lines) whose CLASS starts with `user` (not greeter, lock-screen, background cron/at jobs
//! or the per-user manager) and whose STATE is not `closing`; users told apart by USER, or
//! UID where USER is missing. Without logind: the `USER_PROCESS` records of utmp (what `who`
//! lists), told apart by `ut_user`. With neither, nobody can be logged in through login or
//! sshd (both record there): 0.

use std::collections::HashSet;
use std::io::ErrorKind;

use super::{read_file, Ix, ReadError, Roots, Slots};

pub(crate) fn sample(roots: &Roots, buf: &mut Vec<u8>, slots: &mut Slots) {
    let sessions = roots.run.join("systemd/sessions");
    let users = if sessions.is_dir() {
        logind_users(roots, buf)
    } else {
        match read_file(&roots.utmp, buf) {
            Ok(()) => Ok(utmp_users(buf)),
            Err(e) if e.is_not_found() => Ok(0),
            Err(e) => Err(e.to_string()),
        }
    };
    match users {
        Ok(n) => slots.ok(Ix::Ls, n as f64),
        Err(e) => slots.fail(&[Ix::Ls], &e),
    }
}

fn logind_users(roots: &Roots, buf: &mut Vec<u8>) -> Result<usize, String> {
    let dir = roots.run.join("systemd/sessions");
    let entries =
        std::fs::read_dir(&dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
    let mut users = HashSet::new();
    for entry in entries {
        let entry = entry.map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
        let name = entry.file_name();
        // `<id>.ref` are logind's FIFOs, not session records.
        if name.to_string_lossy().contains('.') {
            continue;
        }
        match read_file(&entry.path(), buf) {
            Ok(()) => {}
            // The session ended between listing and reading.
            Err(ReadError::Io { source, .. }) if source.kind() == ErrorKind::NotFound => continue,
            Err(e) => return Err(e.to_string()),
        }
        if let Some(user) = session_user(&String::from_utf8_lossy(buf)) {
            users.insert(user);
        }
    }
    Ok(users.len())
}

/// The user of a logind session file, if it is a live interactive session.
fn session_user(text: &str) -> Option<String> {
    let (mut user, mut uid, mut class, mut state) = (None, None, None, None);
    for line in text.lines() {
        match line.split_once('=') {
            Some(("USER", v)) => user = Some(v),
            Some(("UID", v)) => uid = Some(v),
            Some(("CLASS", v)) => class = Some(v),
            Some(("STATE", v)) => state = Some(v),
            _ => {}
        }
    }
    if class.is_some_and(|c| !c.starts_with("user")) || state == Some("closing") {
        return None;
    }
    user.map(|u| format!("user:{u}"))
        .or_else(|| uid.map(|u| format!("uid:{u}")))
}

/// glibc's `struct utmp` on Linux (x86-64, aarch64, ...): 384 bytes.
const UTMP_SIZE: usize = 384;
const UT_USER: std::ops::Range<usize> = 44..76;
const USER_PROCESS: i16 = 7;

fn utmp_users(data: &[u8]) -> usize {
    let mut users = HashSet::new();
    // A trailing partial record is a writer mid-append: ignored.
    for rec in data.chunks_exact(UTMP_SIZE) {
        let ut_type = i16::from_ne_bytes([rec[0], rec[1]]);
        if ut_type != USER_PROCESS {
            continue;
        }
        let field = &rec[UT_USER];
        let name = &field[..field.iter().position(|&b| b == 0).unwrap_or(field.len())];
        if !name.is_empty() {
            users.insert(name.to_vec());
        }
    }
    users.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_filter() {
        assert_eq!(
            session_user("UID=1000\nUSER=ann\nCLASS=user\nSTATE=active\n"),
            Some("user:ann".into())
        );
        assert_eq!(
            session_user("UID=1000\nSTATE=online\n"),
            Some("uid:1000".into())
        );
        assert_eq!(session_user("USER=gdm\nCLASS=greeter\n"), None);
        assert_eq!(session_user("USER=ann\nCLASS=background\n"), None);
        assert_eq!(session_user("USER=ann\nSTATE=closing\n"), None);
    }
}
