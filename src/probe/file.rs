//! The file probe: a bounded read of one file (sysfs, or a file a cron job writes), an
//! optional regex capture, and `max_age` on its mtime so a dead writer shows up as stale.
//! The read runs on a blocking thread under a timeout: a hung NFS mount must not freeze the
//! agent, and while one read is stuck no second one is started on the same path.

use std::collections::HashSet;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use super::{Outcome, ProbeRun};
use crate::config::FileSpec;
use crate::plan::ProbeTask;
use crate::value::Reading;

/// Paths whose read outlived its timeout and is still blocked in the kernel. Only those:
/// two resources reading one path at the same moment is normal and both get their value.
fn stuck() -> &'static Mutex<HashSet<PathBuf>> {
    static STUCK: OnceLock<Mutex<HashSet<PathBuf>>> = OnceLock::new();
    STUCK.get_or_init(Default::default)
}

fn lock_stuck() -> std::sync::MutexGuard<'static, HashSet<PathBuf>> {
    stuck().lock().unwrap_or_else(|p| p.into_inner())
}

/// One read's state, decided under the `stuck` lock so that "finished" and "timed out"
/// cannot both miss each other: whichever comes second sees the other.
#[derive(Default)]
struct ReadState {
    finished: bool,
    timed_out: bool,
}

#[derive(Debug)]
enum ReadOutcome {
    Text(String),
    /// This file (the probe's path, or one `*.prom` file of its directory) is this old.
    TooOld(PathBuf, Duration),
}

fn read_bounded(
    path: &Path,
    max_bytes: u64,
    max_age: Option<Duration>,
) -> Result<ReadOutcome, String> {
    let f =
        std::fs::File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let meta = f
        .metadata()
        .map_err(|e| format!("cannot stat {}: {e}", path.display()))?;
    if meta.is_dir() {
        return Err(format!("{} is a directory", path.display()));
    }
    if let Some(max_age) = max_age {
        let mtime = meta
            .modified()
            .map_err(|e| format!("no mtime for {}: {e}", path.display()))?;
        // A future mtime (clock skew) counts as fresh.
        let age = SystemTime::now().duration_since(mtime).unwrap_or_default();
        if age > max_age {
            return Ok(ReadOutcome::TooOld(path.to_owned(), age));
        }
    }
    let mut buf = Vec::new();
    f.take(max_bytes + 1)
        .read_to_end(&mut buf)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if buf.len() as u64 > max_bytes {
        return Err(format!(
            "{} is larger than max_bytes ({max_bytes})",
            path.display()
        ));
    }
    if buf.contains(&0) {
        return Err(format!("{} contains NUL bytes", path.display()));
    }
    String::from_utf8(buf)
        .map(ReadOutcome::Text)
        .map_err(|_| format!("{} is not valid UTF-8", path.display()))
}

/// The value's text: the regex's first group (or whole match), else the first non-blank line.
fn extract(spec: &FileSpec, text: &str) -> Result<String, String> {
    match &spec.regex {
        Some(re) => {
            let caps = re.captures(text).ok_or_else(|| {
                format!(
                    "regex {:?} does not match {}",
                    re.as_str(),
                    spec.path.display()
                )
            })?;
            let m = caps
                .get(1)
                .or_else(|| caps.get(0))
                .map(|m| m.as_str())
                .unwrap_or("");
            Ok(m.trim().to_owned())
        }
        None => super::output::parse_value(text)
            .map_err(|_| format!("{} is empty", spec.path.display())),
    }
}

/// The files a node_exporter textfile collector reads: `*.prom` in `dir`, in name order,
/// joined; `max_bytes` bounds them all together, `max_age` each.
fn read_textfile_dir(
    dir: &Path,
    max_bytes: u64,
    max_age: Option<Duration>,
) -> Result<ReadOutcome, String> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "prom") && p.is_file())
        .collect();
    files.sort();
    let mut all = String::new();
    for f in files {
        let left = max_bytes.saturating_sub(all.len() as u64);
        match read_bounded(&f, left, max_age)? {
            old @ ReadOutcome::TooOld(..) => return Ok(old),
            ReadOutcome::Text(t) => {
                all.push_str(&t);
                if !all.ends_with('\n') {
                    all.push('\n');
                }
            }
        }
    }
    Ok(ReadOutcome::Text(all))
}

fn too_old(path: &Path, age: Duration, spec: &FileSpec) -> String {
    format!(
        "{} not modified for {} (max_age {})",
        path.display(),
        humantime::format_duration(Duration::from_secs(age.as_secs())),
        humantime::format_duration(spec.max_age.unwrap_or_default())
    )
}

/// A file in a probe output format: every fed resource from its samples, as an exec probe's.
fn in_format(
    task: &ProbeTask,
    spec: &FileSpec,
    format: super::output::Format,
    read: Result<ReadOutcome, String>,
    started: SystemTime,
    elapsed: Duration,
) -> ProbeRun {
    let text = match read {
        Err(e) => return ProbeRun::all_failed(task, started, elapsed, Outcome::Failed, e),
        Ok(ReadOutcome::TooOld(path, age)) => {
            let why = too_old(&path, age, spec);
            let mut run = ProbeRun::all_failed(task, started, elapsed, Outcome::Failed, why);
            for (_, r) in &mut run.readings {
                if let Reading::Failed(why) = r {
                    *r = Reading::Stale(std::mem::take(why));
                }
            }
            return run;
        }
        Ok(ReadOutcome::Text(t)) => t,
    };
    match super::output::parse(format, text.as_bytes(), None, &task.name) {
        Err(e) => ProbeRun::all_failed(
            task,
            started,
            elapsed,
            Outcome::Failed,
            format!("bad {} in {}: {e}", format.as_str(), spec.path.display()),
        ),
        Ok(parsed) => ProbeRun::from_output(
            task,
            started,
            elapsed,
            (format, &spec.select),
            &parsed,
            &text,
        ),
    }
}

pub async fn run(task: &ProbeTask, spec: &FileSpec, started: SystemTime) -> ProbeRun {
    let t0 = std::time::Instant::now();
    let fail =
        |why: String, outcome| ProbeRun::all_failed(task, started, t0.elapsed(), outcome, why);
    if lock_stuck().contains(&spec.path) {
        return fail(
            format!(
                "an earlier read of {} is still blocked (hung filesystem?)",
                spec.path.display()
            ),
            Outcome::TimedOut,
        );
    }
    let state = Arc::new(Mutex::new(ReadState::default()));
    let (path, max_bytes, max_age) = (spec.path.clone(), spec.max_bytes, spec.max_age);
    let textfiles = spec.format.is_some();
    let read_state = state.clone();
    let read = tokio::task::spawn_blocking(move || {
        let r = if textfiles && path.is_dir() {
            read_textfile_dir(&path, max_bytes, max_age)
        } else {
            read_bounded(&path, max_bytes, max_age)
        };
        let mut stuck = lock_stuck();
        let mut st = read_state.lock().unwrap_or_else(|p| p.into_inner());
        st.finished = true;
        if st.timed_out {
            stuck.remove(&path);
        }
        r
    });
    let result = match tokio::time::timeout(task.timeout, read).await {
        Err(_) => {
            {
                let mut stuck = lock_stuck();
                let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
                if !st.finished {
                    st.timed_out = true;
                    stuck.insert(spec.path.clone());
                }
            }
            return fail(
                format!(
                    "read of {} timed out after {}",
                    spec.path.display(),
                    humantime::format_duration(task.timeout)
                ),
                Outcome::TimedOut,
            );
        }
        Ok(Err(join)) => Err(format!("read task failed: {join}")),
        Ok(Ok(r)) => r,
    };
    if let Some(format) = spec.format {
        return in_format(task, spec, format, result, started, t0.elapsed());
    }
    let reading = match result {
        Err(e) => return fail(e, Outcome::Failed),
        Ok(ReadOutcome::TooOld(path, age)) => Reading::Stale(too_old(&path, age, spec)),
        Ok(ReadOutcome::Text(text)) => match extract(spec, &text) {
            Err(e) => return fail(e, Outcome::Failed),
            Ok(raw) => match task.feeds[0].valtype.parse(&raw) {
                Ok(v) => Reading::Ok(v),
                Err(e) => return fail(e.to_string(), Outcome::Failed),
            },
        },
    };
    ProbeRun::single(task, started, t0.elapsed(), reading)
}
