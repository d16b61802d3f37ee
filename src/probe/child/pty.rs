//! A pseudo-terminal for a child's stdout (`stdout: pty`): a program whose C stdio (or Perl,
//! or Python) block-buffers a pipe line-buffers a terminal, so each line it prints arrives
//! when printed instead of when 4-8 KiB have piled up or it exits.
//!
//! The pair is made in the parent with nix's safe calls (`posix_openpt`, `grantpt`,
//! `unlockpt`, `ptsname_r`, `open`), both ends close-on-exec from the start: `openpty(3)`
//! would leave them inheritable until a later `fcntl`, a window in which another thread's
//! spawn could leak them. Both ends are opened `O_NOCTTY`: a root agent started by systemd is
//! a session leader without a terminal, and opening a tty without it would make the probe's
//! pty the agent's controlling terminal.
//!
//! The slave is the child's fd 1 only, never its controlling terminal: the child starts a
//! session of its own (`setsid`, as every probe does) and nothing calls `TIOCSCTTY`; the slave
//! was opened `O_NOCTTY` in the agent and is inherited, not opened by the session leader.
//! `isatty(1)` is all stdio looks at; a controlling terminal would add job control and
//! SIGHUP on the master's close, and let a program that prompts (`ssh`, `sudo`) open
//! `/dev/tty` and wait forever for a reply nobody types.
//!
//! Output processing (`OPOST`) is off, so a `\n` arrives as `\n`, not the terminal's
//! `\r\n`. When the child and every process holding the slave have exited, reading the
//! master gives what they wrote and then `EIO`: the reader treats that as the end of stdout.
//! The window size is left at 0x0: a program that formats for a terminal (`ls` columns,
//! colours) does so, which is why a pipe stays the default.

use std::io;
use std::os::fd::OwnedFd;

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;
use nix::sys::termios::{self, OutputFlags, SetArg};

use crate::probe::fd::above_stdio;

/// `(master, slave)`: the agent reads the master; the slave becomes the child's stdout.
pub fn open() -> io::Result<(OwnedFd, OwnedFd)> {
    let flags = OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC;
    let master = nix::pty::posix_openpt(flags)?;
    nix::pty::grantpt(&master)?;
    nix::pty::unlockpt(&master)?;
    let slave_path = nix::pty::ptsname_r(&master)?;
    let slave = nix::fcntl::open(slave_path.as_str(), flags, Mode::empty())?;
    let mut settings = termios::tcgetattr(&slave)?;
    settings.output_flags.remove(OutputFlags::OPOST);
    termios::tcsetattr(&slave, SetArg::TCSANOW, &settings)?;
    Ok((above_stdio(master.into())?, above_stdio(slave)?))
}
