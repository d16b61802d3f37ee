//! The agent's own pages: handing back, after the start-up, the code and read-only data it
//! ran once, so that only what the steady state runs comes back into its RSS.
//!
//! Why: an idle agent's resident memory is mostly file pages of its binary and its shared
//! libraries (BENCHMARKS.md section 23c): the start-up path (command line, YAML, config
//! checks, TLS set-up, user look-ups) leaves code resident that the steady state never runs
//! again, and each fault maps a 64 KiB neighbourhood of the page cache around it.
//!
//! Two advices, each over the mappings it is safe for:
//! - `MADV_PAGEOUT` of the binary's read-only mappings (`page_out`): unmaps the pages no
//!   other process maps and lets the kernel reclaim them (root, as shipped: the kernel does
//!   it only for the file's owner or a writer). Never for the libraries: their pages serve
//!   every process.
//! - `MADV_DONTNEED` of every never-written file mapping, the binary's and the libraries'
//!   (`drop_clean_mappings`): drops this process's page-table entries only; the pages stay in
//!   the page cache and the next touch is a minor fault. On a private mapping that holds a
//!   written (anonymous) page it would discard the write, so a mapping qualifies only when
//!   /proc/self/smaps says it holds no anonymous page and no swapped one (`is_clean`).

use std::io;

/// One mapping of this process, from /proc/self/maps or /proc/self/smaps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    pub start: usize,
    pub len: usize,
    pub writable: bool,
    pub executable: bool,
}

/// The mappings of the file that holds this function's code: the binary itself, whatever
/// its path (a renamed or deleted binary included).
pub fn own_mappings() -> io::Result<Vec<Mapping>> {
    let maps = std::fs::read_to_string("/proc/self/maps")?;
    let here = own_mappings as fn() -> io::Result<Vec<Mapping>> as usize;
    Ok(mappings_of_file_holding(&maps, here))
}

/// A file-backed mapping's header line (as in /proc/PID/maps, and the first line of each
/// mapping in smaps) with its path; None for any other line or mapping.
fn parse_line(line: &str) -> Option<(Mapping, &str)> {
    let mut fields = line.split_ascii_whitespace();
    let range = fields.next()?;
    let perms = fields.next()?;
    let (_offset, _dev, inode) = (fields.next()?, fields.next()?, fields.next()?);
    let path = fields.next().unwrap_or("");
    if inode == "0" || !path.starts_with('/') {
        return None;
    }
    let (lo, hi) = range.split_once('-')?;
    let start = usize::from_str_radix(lo, 16).ok()?;
    let end = usize::from_str_radix(hi, 16).ok()?;
    let mapping = Mapping {
        start,
        len: end.checked_sub(start)?,
        writable: perms.as_bytes().get(1) == Some(&b'w'),
        executable: perms.as_bytes().get(2) == Some(&b'x'),
    };
    Some((mapping, path))
}

/// The file-backed mappings of /proc/PID/maps text whose path is that of the mapping holding
/// `address`.
pub fn mappings_of_file_holding(maps: &str, address: usize) -> Vec<Mapping> {
    let parsed: Vec<(Mapping, &str)> = maps.lines().filter_map(parse_line).collect();
    let Some(path) = parsed
        .iter()
        .find(|(m, _)| (m.start..m.start + m.len).contains(&address))
        .map(|(_, path)| *path)
    else {
        return Vec::new();
    };
    parsed
        .into_iter()
        .filter(|(_, p)| *p == path)
        .map(|(m, _)| m)
        .collect()
}

/// One file-backed mapping of /proc/PID/smaps text, with what its counters say of the pages
/// this process has written (None: the field was missing, which `is_clean` never trusts).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmapsEntry {
    pub mapping: Mapping,
    pub anonymous_kib: Option<u64>,
    pub swap_kib: Option<u64>,
    pub locked: bool,
}

impl SmapsEntry {
    /// Whether `MADV_DONTNEED` leaves this mapping's contents as they are: a read-only file
    /// mapping none of whose pages was ever written. A written page of a private mapping is
    /// an anonymous copy (the loader's relocated RELRO data, a text relocation, a debugger's
    /// breakpoint), resident (`Anonymous`) or swapped out (`Swap`); dropping it would bring
    /// the file's bytes back in its place. A locked mapping refuses the advice (EINVAL).
    pub fn is_clean(&self) -> bool {
        !self.mapping.writable
            && !self.locked
            && self.anonymous_kib == Some(0)
            && self.swap_kib == Some(0)
    }
}

/// The file-backed mappings of /proc/PID/smaps text, in order; the anonymous ones and the
/// kernel's (`[vdso]`, `[heap]`, ...) are left out. Read a line at a time: the whole text is
/// some 100 KiB, which would grow the heap of the process it is trying to shrink.
pub fn parse_smaps(smaps: impl io::BufRead) -> io::Result<Vec<SmapsEntry>> {
    let mut entries = Vec::new();
    // The mapping whose fields the lines below its header belong to; None under a mapping
    // that is not file-backed.
    let mut current: Option<SmapsEntry> = None;
    // Bytes, not lines: a path need not be UTF-8, and only the counters' lines are read.
    for line in smaps.split(b'\n') {
        let line = line?;
        let line = String::from_utf8_lossy(&line);
        let line = line.as_ref();
        if let Some((key, value)) = field(line) {
            if let Some(entry) = current.as_mut() {
                match key {
                    "Anonymous" => entry.anonymous_kib = kib(value),
                    "Swap" => entry.swap_kib = kib(value),
                    "VmFlags" => entry.locked = value.split_ascii_whitespace().any(|f| f == "lo"),
                    _ => {}
                }
            }
            continue;
        }
        entries.extend(current.take());
        current = parse_line(line).map(|(mapping, _path)| SmapsEntry {
            mapping,
            anonymous_kib: None,
            swap_kib: None,
            locked: false,
        });
    }
    entries.extend(current);
    Ok(entries)
}

/// `Key: value` of a field line of smaps; None for a mapping's header line (whose first
/// field is its address range, with no colon).
fn field(line: &str) -> Option<(&str, &str)> {
    let (key, value) = line.split_once(':')?;
    let is_key = !key.is_empty() && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    is_key.then_some((key, value.trim()))
}

fn kib(value: &str) -> Option<u64> {
    value.strip_suffix("kB")?.trim().parse().ok()
}

fn advise(mapping: &Mapping, advice: libc::c_int) -> io::Result<()> {
    // SAFETY: the range is a whole mapping of this process, read from /proc/self; `advice`
    // is MADV_PAGEOUT (never changes the contents of memory) or MADV_DONTNEED over a mapping
    // `SmapsEntry::is_clean` found never written (its contents are the file's, and come
    // back from the page cache at the next touch). No pointer into the range is created or
    // used here.
    let rc = unsafe { libc::madvise(mapping.start as *mut libc::c_void, mapping.len, advice) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Page out this process's own binary: every mapping of it that is not writable (its code
/// and read-only data; the writable data is left alone), with MADV_PAGEOUT. The kernel
/// unmaps the pages no other process maps (a page another process maps is skipped, and the
/// shared libraries are not advised: they are not ours), and may drop them from the page
/// cache (on Linux 6.18 it kept them: BENCHMARKS.md 23c); the code the agent runs again
/// comes back at its next use. Returns how many mappings were advised.
///
/// MADV_PAGEOUT of file pages is done only for a process that owns the file or may write
/// it (root, as shipped); for another it succeeds and does nothing. The relocated read-only
/// data (RELRO: anonymous copies the loader wrote) goes to swap where there is swap, as any
/// idle anonymous page would, and stays where there is none.
pub fn page_out() -> io::Result<usize> {
    let mut advised = 0;
    for mapping in own_mappings()?.iter().filter(|m| !m.writable) {
        advise(mapping, libc::MADV_PAGEOUT)?;
        advised += 1;
    }
    Ok(advised)
}

/// Drop this process's page-table entries over every clean file mapping (`is_clean`): the
/// binary's and each shared library's code and never-written read-only data, whoever else
/// maps them. What the agent runs again faults back from the page cache (a minor fault,
/// with the kernel's fault-around). Returns how many mappings were advised.
///
/// The check and the advice are not atomic: a mapping found clean could be replaced before
/// it is advised only by an unmap and a new mapping at the same address, and the agent
/// unmaps no file mapping once started (glibc never unloads the NSS modules a user look-up
/// loads; a new library is mapped at a new address, which this read of smaps did not list).
pub fn drop_clean_mappings() -> io::Result<usize> {
    let smaps = std::io::BufReader::new(std::fs::File::open("/proc/self/smaps")?);
    let mut advised = 0;
    for entry in parse_smaps(smaps)?.iter().filter(|e| e.is_clean()) {
        advise(&entry.mapping, libc::MADV_DONTNEED)?;
        advised += 1;
    }
    Ok(advised)
}

/// What `release` advised: the binary's mappings paged out, the clean mappings dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Released {
    pub paged_out: usize,
    pub dropped: usize,
}

/// Hand back the start-up's pages: `page_out` the binary, then `drop_clean_mappings`.
pub fn release() -> io::Result<Released> {
    let paged_out = page_out()?;
    let dropped = drop_clean_mappings()?;
    Ok(Released { paged_out, dropped })
}

/// This process's file-backed resident memory in KiB (`RssFile` of /proc/self/status).
pub fn rss_file_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("RssFile:"))
        .and_then(|v| kib(v.trim()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
5600-5700 r--p 00000000 fe:00 42 /usr/bin/xce-agent
5700-5900 r-xp 00100000 fe:00 42 /usr/bin/xce-agent
5900-5a00 rw-p 00300000 fe:00 42 /usr/bin/xce-agent
5a00-5b00 rw-p 00000000 00:00 0 [heap]
7f00-7f80 r-xp 00000000 fe:00 77 /usr/lib/libc.so.6
7ffc-7ffd rw-p 00000000 00:00 0 [stack]
";

    #[test]
    fn the_mappings_of_the_file_holding_an_address_and_no_other() {
        let own = mappings_of_file_holding(MAPS, 0x5800);
        let starts: Vec<usize> = own.iter().map(|m| m.start).collect();
        assert_eq!(starts, [0x5600, 0x5700, 0x5900]);
        assert!(own[1].executable && !own[1].writable);
        assert!(own[2].writable);
    }

    #[test]
    fn an_address_in_no_file_mapping_names_nothing() {
        assert!(mappings_of_file_holding(MAPS, 0x5a80).is_empty());
        assert!(mappings_of_file_holding(MAPS, 0x1).is_empty());
    }

    /// Fields of one smaps mapping (most left out: the parser reads three).
    fn fields(anonymous: &str, swap: &str, flags: &str) -> String {
        format!("Size: 8 kB\nRss: 8 kB\nAnonymous: {anonymous}\nSwap: {swap}\nSwapPss: 0 kB\nVmFlags: {flags}\n")
    }

    fn smaps() -> String {
        let clean = fields("0 kB", "0 kB", "rd mr mw me");
        [
            format!("5600-5700 r--p 00000000 fe:00 42 /usr/bin/xce-agent\n{clean}"),
            format!("5700-5900 r-xp 00100000 fe:00 42 /usr/bin/xce-agent\n{}", fields("0 kB", "0 kB", "rd ex mr mw me")),
            // RELRO: the loader's relocated copies, resident.
            format!("5900-5940 r--p 00300000 fe:00 42 /usr/bin/xce-agent\n{}", fields("256 kB", "0 kB", "rd mr mw me ac")),
            format!("5940-5a00 rw-p 00340000 fe:00 42 /usr/bin/xce-agent\n{}", fields("12 kB", "0 kB", "rd wr mr mw me ac")),
            format!("5a00-5b00 rw-p 00000000 00:00 0 [heap]\n{}", fields("400 kB", "0 kB", "rd wr mr mw me ac")),
            format!("7f00-7f80 r-xp 00000000 fe:00 77 /usr/lib/libc.so.6\n{clean}"),
            // A library's RELRO whose written pages went to swap: no resident anonymous page left.
            format!("7f80-7f90 r--p 00080000 fe:00 77 /usr/lib/libc.so.6\n{}", fields("0 kB", "64 kB", "rd mr mw me ac")),
            format!("7f90-7fa0 r-xp 00000000 fe:00 78 /usr/lib/locked.so\n{}", fields("0 kB", "0 kB", "rd ex mr mw me lo")),
            "7fa0-7fb0 r--p 00000000 fe:00 79 /usr/lib/no-counters.so\nSize: 8 kB\nVmFlags: rd mr\n".to_owned(),
            format!("7fb0-7fc0 r--s 00000000 fe:00 80 /var/cache/a file with spaces\n{clean}"),
            format!("7fc0-7fd0 r--p 00000000 fe:00 81 /tmp/not-utf8-\u{fffd}\n{clean}"),
            format!("7ffc-7ffd r-xp 00000000 00:00 0 [vdso]\n{clean}"),
        ]
        .concat()
    }

    #[test]
    fn smaps_lists_the_file_mappings_with_their_counters() {
        let entries = parse_smaps(smaps().as_bytes()).expect("parse");
        let starts: Vec<usize> = entries.iter().map(|e| e.mapping.start).collect();
        assert_eq!(
            starts,
            [0x5600, 0x5700, 0x5900, 0x5940, 0x7f00, 0x7f80, 0x7f90, 0x7fa0, 0x7fb0, 0x7fc0]
        );
        assert_eq!(entries[2].anonymous_kib, Some(256));
        assert_eq!(entries[5].swap_kib, Some(64));
        assert!(entries[6].locked && !entries[0].locked);
        assert_eq!(
            (entries[7].anonymous_kib, entries[7].swap_kib),
            (None, None)
        );
    }

    #[test]
    fn only_never_written_read_only_file_mappings_are_clean() {
        let clean: Vec<usize> = parse_smaps(smaps().as_bytes())
            .expect("parse")
            .iter()
            .filter(|e| e.is_clean())
            .map(|e| e.mapping.start)
            .collect();
        // Not: the binary's RELRO (resident copies) and data, libc's swapped-out RELRO, the
        // locked library, the one whose counters are missing, the anonymous and kernel ones.
        assert_eq!(clean, [0x5600, 0x5700, 0x7f00, 0x7fb0, 0x7fc0]);
    }

    #[test]
    fn garbage_smaps_lists_nothing_clean() {
        let mut not_utf8 = smaps().into_bytes();
        not_utf8.extend_from_slice(
            b"7fd0-7fe0 r--p 0 fe:00 82 /tmp/\xff\xfe\nAnonymous: 0 kB\nSwap: 0 kB\n",
        );
        let entries = parse_smaps(&not_utf8[..]).expect("parse");
        assert_eq!(
            entries.last().map(|e| (e.mapping.start, e.is_clean())),
            Some((0x7fd0, true))
        );
        let garbage = "not smaps\nAnonymous: 0 kB\n: \n5600-zz r--p 0 fe:00 42 /x\nSwap: 0 kB\n";
        let entries = parse_smaps(garbage.as_bytes()).expect("parse");
        assert!(entries.iter().all(|e| !e.is_clean()), "{entries:?}");
        assert!(parse_smaps(&b""[..]).expect("parse").is_empty());
    }

    #[test]
    fn this_test_binary_drops_its_clean_mappings_and_keeps_working() {
        // A relocated static (a &str in a static: RELRO) read after the advice.
        static NAMES: [&str; 2] = ["before", "after"];
        let advised = drop_clean_mappings().expect("madvise");
        assert!(advised > 0);
        assert_eq!(NAMES.concat(), "beforeafter");
        assert_eq!(
            format!("{:?}", own_mappings().map(|m| m.is_empty())),
            "Ok(false)"
        );
    }

    #[test]
    fn this_test_binary_finds_its_own_code_and_pages_it_out() {
        let own = own_mappings().expect("/proc/self/maps");
        assert!(own.iter().any(|m| m.executable), "{own:?}");
        assert_eq!(
            page_out().expect("madvise"),
            own.iter().filter(|m| !m.writable).count()
        );
    }
}
