//! The agent's own pages: paging out the mappings of this process's own binary (never the
//! shared libraries: their pages serve every process).
//!
//! Why: an idle agent's resident memory is mostly file pages of its own binary (BENCHMARKS.md
//! section 23c): the start-up path (command line, YAML, config checks) leaves code resident
//! that the steady state never runs again.

use std::io;

/// One mapping of this process's binary, from /proc/self/maps.
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

/// MADV_PAGEOUT over one mapping.
fn page_out_mapping(mapping: &Mapping) -> io::Result<()> {
    // SAFETY: the range is a whole mapping of this process's binary, read from
    // /proc/self/maps, and MADV_PAGEOUT never changes the contents of memory: it asks the
    // kernel to reclaim the pages, and a page reclaimed is read back from the file (or
    // swap) when next touched. No pointer into the range is created or used here.
    let rc = unsafe {
        libc::madvise(
            mapping.start as *mut libc::c_void,
            mapping.len,
            libc::MADV_PAGEOUT,
        )
    };
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
        page_out_mapping(mapping)?;
        advised += 1;
    }
    Ok(advised)
}

/// This process's file-backed resident memory in KiB (`RssFile` of /proc/self/status).
pub fn rss_file_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("RssFile:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
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
