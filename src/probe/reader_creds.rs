//! The rights a file probe reads with: a root agent's reader thread takes the probe user's
//! file-system identity (fsuid, fsgid, supplementary groups) for itself alone, so the kernel
//! checks the open as it would for that user — a file `nobody` cannot read fails, as it would
//! for the probe's exec sibling.
//!
//! Raw per-thread syscalls, on purpose: glibc's `setgroups(3)` (and so nix's) changes every
//! thread of the process, which would drop the whole agent's groups. The kernel keeps
//! credentials per task (thread), and the `setfs*` / `setgroups` syscalls change only the
//! caller's. The thread that calls [`become_reader`] does one read and exits, so nothing else
//! ever runs with the lowered rights, and the agent's other threads never see them.
//!
//! When fsuid changes from 0 to another id the kernel also clears the file-system
//! capabilities (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, ...) from the thread's effective set
//! (capabilities(7), "Effect of user ID changes on capabilities"): root's override goes away
//! with the id.

use std::io;

use super::child::Credentials;

/// The value that makes `setfsuid`/`setfsgid` change nothing and return the current id.
const QUERY: libc::c_long = -1;

/// Switch the calling thread (only) to `creds` for file access. Call it only on a thread
/// that exits after its read.
pub fn become_reader(creds: &Credentials) -> io::Result<()> {
    let groups = creds.raw_groups();
    // SAFETY: SYS_setgroups reads exactly `groups.len()` gid_t values from `groups.as_ptr()`,
    // which points into a live slice of that length for the whole call; it writes no memory
    // of ours. As a raw syscall it changes only this thread's credentials (see module docs).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_setgroups,
            groups.len() as libc::c_long,
            groups.as_ptr(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let gid = libc::c_long::from(creds.gid.as_raw());
    let uid = libc::c_long::from(creds.uid.as_raw());
    // Group first: once fsuid is not 0 the thread may lose the right to change fsgid.
    // SAFETY: setfsgid/setfsuid take one integer and touch no memory of ours; they change
    // only this thread's file-system ids. They report no error, so each is checked by
    // querying the id back (QUERY changes nothing and returns the current value).
    let (fsgid, fsuid) = unsafe {
        libc::syscall(libc::SYS_setfsgid, gid);
        let fsgid = libc::syscall(libc::SYS_setfsgid, QUERY);
        libc::syscall(libc::SYS_setfsuid, uid);
        let fsuid = libc::syscall(libc::SYS_setfsuid, QUERY);
        (fsgid, fsuid)
    };
    if fsgid != gid || fsuid != uid {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "cannot take the file-system identity of {} (fsuid {fsuid}, fsgid {fsgid})",
                creds.user
            ),
        ));
    }
    Ok(())
}
