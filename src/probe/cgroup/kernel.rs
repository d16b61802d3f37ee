//! The three things cgroupfs does that a plain directory does not: `mkdir` makes a cgroup
//! with its interface files, `rmdir` removes one with them (refused while it has children
//! or processes), and a write to `cgroup.subtree_control` adds or removes one controller.
//! The manager does those through a [`Kernel`]; every other read and write is a plain file
//! operation. So its whole lifecycle runs against a temp-dir tree in the unit tests
//! (`fake`), without root and without the real kernel.

use std::fs;
use std::io;
use std::path::Path;

/// The cgroupfs operations that differ from a plain directory's.
#[derive(Debug, Clone, Copy)]
pub struct Kernel {
    pub mkdir: fn(&Path) -> io::Result<()>,
    pub rmdir: fn(&Path) -> io::Result<()>,
    /// Write one `+controller` (or `-controller`) to a `cgroup.subtree_control`.
    pub subtree_control: fn(&Path, &str) -> io::Result<()>,
}

impl Kernel {
    /// The real cgroup v2 filesystem: the kernel makes and removes the interface files.
    pub const CGROUPFS: Kernel = Kernel {
        mkdir: |p| fs::create_dir(p),
        rmdir: |p| fs::remove_dir(p),
        subtree_control: |p, change| fs::write(p, change),
    };
}

/// A cgroupfs stand-in on a plain directory, for tests: what the kernel would do, done to
/// files a test can read and write (`populated 1` in `cgroup.events` is a process there).
#[cfg(test)]
pub mod fake {
    use super::*;

    pub const KERNEL: Kernel = Kernel {
        mkdir,
        rmdir,
        subtree_control,
    };

    /// The interface files the manager reads or writes, as a new cgroup has them; its
    /// `cgroup.controllers` are what its parent enabled.
    pub fn mkdir(path: &Path) -> io::Result<()> {
        fs::create_dir(path)?;
        let offered = path
            .parent()
            .and_then(|p| fs::read_to_string(p.join("cgroup.subtree_control")).ok())
            .unwrap_or_default();
        for (file, text) in [
            ("cgroup.controllers", offered.as_str()),
            ("cgroup.subtree_control", ""),
            ("cgroup.procs", ""),
            ("cgroup.events", "populated 0\nfrozen 0\n"),
            ("cgroup.kill", ""),
            ("cpu.stat", "usage_usec 0\n"),
            ("memory.max", "max\n"),
            ("pids.max", "max\n"),
        ] {
            fs::write(path.join(file), text)?;
        }
        Ok(())
    }

    /// As the kernel: EBUSY while a child cgroup or a process is in it.
    pub fn rmdir(path: &Path) -> io::Result<()> {
        let mut files = Vec::new();
        for e in fs::read_dir(path)? {
            let e = e?;
            if e.file_type()?.is_dir() {
                return Err(io::Error::from_raw_os_error(libc::EBUSY));
            }
            files.push(e.path());
        }
        let events = fs::read_to_string(path.join("cgroup.events")).unwrap_or_default();
        if events.lines().any(|l| l == "populated 1") {
            return Err(io::Error::from_raw_os_error(libc::EBUSY));
        }
        for f in files {
            fs::remove_file(f)?;
        }
        fs::remove_dir(path)
    }

    /// `+c` adds `c` where the cgroup is offered it (else ENOENT, as the kernel), `-c`
    /// removes it. Offered: what its parent enabled now (the kernel's `cgroup.controllers`
    /// follows the parent), or for the test's top cgroup its own `cgroup.controllers`.
    pub fn subtree_control(path: &Path, change: &str) -> io::Result<()> {
        let dir = path.parent().unwrap_or(Path::new("/"));
        let words = |f: &Path| -> Vec<String> {
            fs::read_to_string(f)
                .unwrap_or_default()
                .split_whitespace()
                .map(str::to_owned)
                .collect()
        };
        let parents = dir.parent().map(|p| p.join("cgroup.subtree_control"));
        let offered = match parents.filter(|p| p.is_file()) {
            Some(parents) => words(&parents),
            None => words(&dir.join("cgroup.controllers")),
        };
        let mut enabled = words(path);
        if let Some(c) = change.strip_prefix('+') {
            if !offered.iter().any(|o| o == c) {
                return Err(io::ErrorKind::NotFound.into());
            }
            if !enabled.iter().any(|e| e == c) {
                enabled.push(c.to_owned());
            }
        } else if let Some(c) = change.strip_prefix('-') {
            enabled.retain(|e| e != c);
        }
        fs::write(path, enabled.join(" "))
    }
}
