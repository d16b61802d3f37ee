//! A stream probe's ClassAd output (an HTCondor cron job that keeps running): its lines go
//! into [`AdStream`], the parser's one rule for `-` and `- NAME`, and each ad it ends is
//! applied as one update.

use std::time::SystemTime;

use super::{Line, MAX_LINE};
use crate::config::StreamSpec;
use crate::output::{self, AdLine, AdStream};
use crate::plan::ProbeTask;
use crate::probe::output_log::OutputLog;
use crate::store::Store;
use crate::value::Reading;

/// One stdout line into the ad being read; a line that is not text is a malformed line.
pub(super) fn push_line(ads: &mut AdStream, line: Line) -> AdLine {
    match line {
        Line::TooLong => ads.bad_line(&format!("longer than {MAX_LINE} bytes; skipped")),
        Line::Complete(bytes) => match std::str::from_utf8(&bytes) {
            Ok(text) => return ads.push(text),
            Err(_) => ads.bad_line("not valid UTF-8"),
        },
    }
    AdLine::Inside
}

pub(super) fn too_long() -> String {
    format!(
        "a ClassAd ran past {} bytes without a `-` line; a stream's ClassAd output ends each update with `-`",
        output::MAX_AD_BYTES
    )
}

/// Apply one ClassAd update, its values together and stamped now (at its `-`). A resource
/// the ad does not give a value keeps its last one, pending with the reason, until its
/// stale time fails it; one selected from another named ad (`ad="SQUID1"` while this is
/// SQUID0's) is not touched. Malformed lines are logged by number; the rest still applies.
pub(super) fn apply(
    task: &ProbeTask,
    spec: &StreamSpec,
    store: &Store,
    log: &mut OutputLog,
    tag: &str,
    ad: &output::Parsed,
) {
    let now = SystemTime::now();
    let format = spec.exec.format;
    for bad in &ad.bad_lines {
        log.malformed(
            &task.name,
            &format!("bad classad line: {bad}"),
            std::time::Instant::now(),
        );
    }
    for feed in &task.feeds {
        let pick = spec.exec.select.pick(&feed.name);
        if selects_another_ad(&pick, tag) {
            continue;
        }
        let reading = output::select::reading(format, &pick, ad, &feed.name, feed.valtype)
            .unwrap_or_else(|| {
                Reading::Pending(output::select::absent_reason(
                    format, &pick, ad, "", &feed.name,
                ))
            });
        store.record(&feed.name, &task.instance, reading, now);
    }
}

/// Whether `pick` selects an attribute of a named ad other than `tag`.
fn selects_another_ad(pick: &output::Pick, tag: &str) -> bool {
    pick.selector.as_ref().is_some_and(|sel| {
        sel.labels
            .iter()
            .any(|(k, v)| k == output::AD_LABEL && v != tag)
    })
}
