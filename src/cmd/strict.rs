//! The one-shot commands (`--once`, `probe NAME`) are strict where the daemon is patient. The
//! daemon lets a run leave a resource out (an ELIM line may carry a subset; the last value
//! stands until it goes stale); an admin trying a port once must instead hear that a
//! resource got nothing — empty output, no sample matching its selector, a protocol the
//! format does not read — with what the output did hold, nearest first. And a failed run
//! whose cause `check` can name (a shell's script with CRLF line endings) says it.

use std::path::Path;
use std::sync::Arc;

use crate::config::{near_miss, nearest, ProbeKind};
use crate::output::{self, Format, Parsed, Pick, Sample};
use crate::plan::ProbeTask;
use crate::probe::child::Exit;
use crate::probe::{resolve, security, Outcome, ProbeRun};
use crate::value::{Failure, Reading};

/// Samples listed as the nearest to what a resource asked for.
const LISTED: usize = 5;

/// Samples compared with what a resource asked for at most (an output may hold thousands),
/// and characters of each compared: the edit distance costs their product per sample (835
/// samples of 80 characters, a 64 KiB output, cost 0.5 s in a debug build), and an exec
/// probe's output is capped at 64 KiB anyway.
const COMPARED: usize = 2_000;
const COMPARED_CHARS: usize = 128;

/// Make every resource a successful run left unreported a failure of the run, saying why
/// and what the output held. Builtin probes are left alone: a rate's first sample is
/// pending by nature, not a broken port.
pub fn unreported_fails(task: &ProbeTask, run: &mut ProbeRun) {
    if matches!(task.kind, ProbeKind::Builtin { .. }) {
        return;
    }
    if !run
        .readings
        .iter()
        .any(|(_, r)| matches!(r, Reading::Pending(_)))
    {
        return;
    }
    let output = what_it_printed(task, run);
    let hints: Vec<String> = run
        .readings
        .iter()
        .map(|(name, reading)| match (&output, reading) {
            (Some((format, select, stdout, parsed)), Reading::Pending(_)) => {
                let shared = task.feed(name).is_some_and(|f| f.is_shared());
                let pick = select.pick_for(name, shared);
                held(*format, &pick, stdout, parsed.as_ref(), name)
            }
            _ => String::new(),
        })
        .collect();
    for ((_, reading), hint) in run.readings.iter_mut().zip(hints) {
        if let Reading::Pending(why) = reading {
            *reading = Reading::Failed(format!("{why}{hint}").into());
        }
    }
    run.outcome = Outcome::Failed;
}

/// A failed run of a shell's script saved with CRLF line endings gets the cause added, as
/// `check` names it: the shell's own words (`$'\r': command not found`, a syntax error at a
/// `fi`) do not. The script is read only for a failed one-shot run.
pub fn explain_failure(task: &ProbeTask, run: &mut ProbeRun, plugin_dir: &Path) {
    if run.succeeded() {
        return;
    }
    let Some(why) = task
        .kind
        .exec_spec()
        .and_then(|spec| resolve::command(plugin_dir, &spec.command).ok())
        .and_then(|r| security::shell_script_problem(&r.program, &r.args))
    else {
        return;
    };
    let why = Arc::new(why);
    for (_, reading) in &mut run.readings {
        if let Reading::Failed(e) = reading {
            *e = Failure::new(ScriptProblem {
                failure: e.clone(),
                problem: why.clone(),
            });
        }
    }
}

/// A failed run's error with what is wrong with its script added, the problem as source.
#[derive(Debug, thiserror::Error)]
#[error("{failure} ({problem})")]
struct ScriptProblem {
    failure: Failure,
    #[source]
    problem: Arc<security::NotRunnable>,
}

type Printed<'a> = (Format, &'a output::Selection, &'a [u8], Option<Parsed>);

/// The format, `select:`, stdout and its samples of a run that kept its output (exec and
/// stream probes).
fn what_it_printed<'a>(task: &'a ProbeTask, run: &'a ProbeRun) -> Option<Printed<'a>> {
    let spec = task.kind.exec_spec()?;
    let detail = run.exec.as_ref()?;
    let code = match detail.exit {
        Some(Exit::Code(c)) => Some(c),
        _ => None,
    };
    let parsed = output::parse(spec.format, &detail.stdout, code, &task.name).ok();
    Some((spec.format, &spec.select, &detail.stdout, parsed))
}

/// `; the probe printed nothing`, or the samples the output held, nearest to what `pick`
/// asks for first, with a did-you-mean when one is a near miss.
fn held(
    format: Format,
    pick: &Pick,
    stdout: &[u8],
    parsed: Option<&Parsed>,
    resource: &str,
) -> String {
    if stdout.iter().all(u8::is_ascii_whitespace) {
        return "; the probe printed nothing".to_owned();
    }
    let Some(parsed) = parsed.filter(|p| !p.samples.is_empty()) else {
        return "; its output held no samples".to_owned();
    };
    // With a selector, samples are compared as selectors (`name{label="v"}`); without one,
    // by name, as a resource's name is matched.
    let (target, as_text): (String, fn(&Sample) -> String) = match &pick.selector {
        Some(sel) => (sel.to_string(), Sample::key),
        None => (resource.to_owned(), |s| s.name.clone()),
    };
    let mut seen = std::collections::BTreeSet::new();
    let candidates: Vec<String> = parsed
        .samples
        .iter()
        .map(as_text)
        .filter(|c| seen.insert(c.clone()))
        .take(COMPARED)
        .collect();
    // Compared by their first characters, shown whole: a clipped candidate is a prefix of
    // its own string, found again by where it starts.
    let clipped: Vec<&str> = candidates.iter().map(|c| clip(c)).collect();
    let whole = |c: &str| {
        candidates
            .iter()
            .find(|w| w.as_ptr() == c.as_ptr())
            .map_or_else(|| c.to_owned(), String::clone)
    };
    let listed: Vec<String> = nearest(clip(&target), &clipped, LISTED)
        .iter()
        .map(|c| format!("`{}`", whole(c)))
        .collect();
    let what = match format.selectable() {
        true => "selectors",
        false => "names",
    };
    let mut out = format!(
        "; the output held {} sample(s); the nearest {what}: {}",
        parsed.samples.len(),
        listed.join(", ")
    );
    if let Some(near) = near_miss(clip(&target), &clipped) {
        out.push_str(&format!("; did you mean `{}`?", whole(near)));
    }
    out
}

/// The first [`COMPARED_CHARS`] characters.
fn clip(s: &str) -> &str {
    s.char_indices()
        .nth(COMPARED_CHARS)
        .map_or(s, |(i, _)| &s[..i])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_samples_are_compared_by_their_start_and_listed_whole() {
        let long = |n: u32| format!("m{{path=\"/{}{n}\"}}", "x".repeat(200));
        let text = format!("{} 1\n{} 2\nshort 3\n", long(1), long(2));
        let parsed = output::parse(Format::Prometheus, text.as_bytes(), Some(0), "r").unwrap();
        let pick = Pick {
            selector: Some(output::parse_selector("short_one").unwrap()),
            ..Pick::default()
        };
        let hint = held(
            Format::Prometheus,
            &pick,
            text.as_bytes(),
            Some(&parsed),
            "r",
        );
        let listed = format!("`short`, `{}`, `{}`", long(1), long(2));
        assert!(hint.contains(&listed), "{hint}");
        assert!(hint.starts_with("; the output held 3 sample(s)"), "{hint}");
        assert_eq!(
            held(Format::Prometheus, &pick, b" \n", None, "r"),
            "; the probe printed nothing"
        );
    }
}
