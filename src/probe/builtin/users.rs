//! `ls`: distinct users logged in, and the terminals they are logged in on (for `it`).
//!
//! With systemd-logind (`<run>/systemd/sessions` exists): each session file (`KEY=VALUE`
//! lines) whose CLASS starts with `user` (not greeter, lock-screen, background cron/at jobs
//! or the per-user manager) and whose STATE is not `closing`; users told apart by USER, or
//! UID where USER is missing; their terminals from TTY. Without logind: the `USER_PROCESS`
//! records of utmp (what `who` lists), told apart by `ut_user`; their terminals from
//! `ut_line`. With neither, nobody can be logged in through login or sshd (both record
//! there): 0 users, no terminals.
//!
//! One read of logind or utmp per slow tick serves both `ls` and `it`.

use std::collections::HashSet;
use std::io::ErrorKind;

use super::{read_file, Ix, ReadError, Roots, Slots};

/// The login terminals, relative to `<dev>` ("pts/3", "tty1"), sorted and without
/// duplicates; or why the sessions could not be read.
pub(crate) type LoginTtys = Result<Vec<String>, String>;

/// Sets `ls`; returns the login terminals for `it`.
pub(crate) fn sample(roots: &Roots, buf: &mut Vec<u8>, slots: &mut Slots) -> LoginTtys {
    let sessions = roots.run.join("systemd/sessions");
    let logins = if sessions.is_dir() {
        logind_logins(roots, buf)
    } else {
        match read_file(&roots.utmp, buf) {
            Ok(()) => Ok(utmp_logins(buf)),
            Err(e) if e.is_not_found() => Ok(Logins::default()),
            Err(e) => Err(e.to_string()),
        }
    };
    match logins {
        Ok(l) => {
            slots.ok(Ix::Ls, l.users.len() as f64);
            let mut ttys: Vec<String> = l.ttys.into_iter().collect();
            ttys.sort_unstable();
            Ok(ttys)
        }
        Err(e) => {
            slots.fail(&[Ix::Ls], e.as_str());
            Err(e)
        }
    }
}

#[derive(Default)]
struct Logins {
    users: HashSet<Vec<u8>>,
    ttys: HashSet<String>,
}

impl Logins {
    fn add(&mut self, user: Vec<u8>, tty: Option<&[u8]>) {
        self.users.insert(user);
        if let Some(tty) = tty.and_then(login_tty) {
            self.ttys.insert(tty.to_owned());
        }
    }
}

/// A terminal name safe to join under `<dev>`: letters, digits and inner single `/` only
/// ("pts/3", "tty1"). utmp is writable by any setgid-utmp program and holds whatever it
/// was given; "../../etc/passwd", "/etc/passwd" or "pts//3" must not make us stat a file
/// outside `<dev>`. X displays (":0") are not terminals: their input is `<dev>/input`.
fn login_tty(line: &[u8]) -> Option<&str> {
    let ok = !line.is_empty()
        && line.iter().all(|&b| b.is_ascii_alphanumeric() || b == b'/')
        && line.split(|&b| b == b'/').all(|part| !part.is_empty());
    // All ASCII by the check above.
    ok.then(|| std::str::from_utf8(line).ok()).flatten()
}

fn logind_logins(roots: &Roots, buf: &mut Vec<u8>) -> Result<Logins, String> {
    let dir = roots.run.join("systemd/sessions");
    let entries =
        std::fs::read_dir(&dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
    let mut logins = Logins::default();
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
        if let Some(s) = login_session(&String::from_utf8_lossy(buf)) {
            logins.add(s.user.into_bytes(), s.tty.as_deref().map(str::as_bytes));
        }
    }
    Ok(logins)
}

#[derive(Debug, PartialEq)]
struct Session {
    user: String,
    tty: Option<String>,
}

/// The user and terminal of a logind session file, if it is a live interactive session.
fn login_session(text: &str) -> Option<Session> {
    let (mut user, mut uid, mut class, mut state, mut tty) = (None, None, None, None, None);
    for line in text.lines() {
        match line.split_once('=') {
            Some(("USER", v)) => user = Some(v),
            Some(("UID", v)) => uid = Some(v),
            Some(("CLASS", v)) => class = Some(v),
            Some(("STATE", v)) => state = Some(v),
            Some(("TTY", v)) => tty = Some(v),
            _ => {}
        }
    }
    if class.is_some_and(|c| !c.starts_with("user")) || state == Some("closing") {
        return None;
    }
    let user = user
        .map(|u| format!("user:{u}"))
        .or_else(|| uid.map(|u| format!("uid:{u}")))?;
    Some(Session {
        user,
        tty: tty.map(str::to_owned),
    })
}

/// glibc's `struct utmp` on Linux (x86-64, aarch64, ...): 384 bytes.
const UTMP_SIZE: usize = 384;
const UT_LINE: std::ops::Range<usize> = 8..40;
const UT_USER: std::ops::Range<usize> = 44..76;
const USER_PROCESS: i16 = 7;

fn utmp_logins(data: &[u8]) -> Logins {
    let mut logins = Logins::default();
    // A trailing partial record is a writer mid-append: ignored.
    for rec in data.chunks_exact(UTMP_SIZE) {
        let ut_type = i16::from_ne_bytes([rec[0], rec[1]]);
        if ut_type != USER_PROCESS {
            continue;
        }
        let name = c_string(&rec[UT_USER]);
        if !name.is_empty() {
            logins.add(name.to_vec(), Some(c_string(&rec[UT_LINE])));
        }
    }
    logins
}

/// A fixed-size, NUL-padded (not necessarily NUL-terminated) utmp field.
fn c_string(field: &[u8]) -> &[u8] {
    &field[..field.iter().position(|&b| b == 0).unwrap_or(field.len())]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(text: &str) -> Option<String> {
        login_session(text).map(|s| s.user)
    }

    #[test]
    fn session_filter() {
        assert_eq!(
            login_session("UID=1000\nUSER=ann\nCLASS=user\nSTATE=active\nTTY=pts/2\n"),
            Some(Session {
                user: "user:ann".into(),
                tty: Some("pts/2".into())
            })
        );
        assert_eq!(user("UID=1000\nSTATE=online\n"), Some("uid:1000".into()));
        assert_eq!(user("USER=gdm\nCLASS=greeter\nTTY=tty1\n"), None);
        assert_eq!(user("USER=ann\nCLASS=background\n"), None);
        assert_eq!(user("USER=ann\nSTATE=closing\nTTY=tty2\n"), None);
    }

    #[test]
    fn login_tty_names() {
        for good in ["pts/3", "tty1", "ttyS0", "pts/10"] {
            assert_eq!(login_tty(good.as_bytes()), Some(good));
        }
        for bad in [
            "",
            "../../etc/passwd",
            "/etc/passwd",
            "pts/../../etc",
            "pts//3",
            "pts/",
            ":0",
            "tty 1",
            "pts/3\n",
            "tty\u{e9}",
        ] {
            assert_eq!(login_tty(bad.as_bytes()), None, "{bad:?}");
        }
    }
}
