//! `xce-agent status` as people read it: the link on top, then one row per resource
//! instance like `lsload -l` (value, status, age, next run, error), then the probes'
//! counters.

use std::fmt::Write as _;

use super::{format_time, Table};
use crate::status::{LinkInfo, StatusReport};
use crate::text::escape;

/// A short age like `4s`, `3m12s`, `2h5m`, `3d4h`.
pub fn age(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{}s", s / 60, s % 60),
        3600..86400 => format!("{}h{}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{}h", s / 86400, s % 86400 / 3600),
    }
}

fn ago(now_ms: u64, at_ms: u64) -> String {
    format!("{} ago", age(now_ms.saturating_sub(at_ms)))
}

/// The last reload: `RELOAD  ok 5m ago`, or refused with the first line of why.
fn reload_line(r: &crate::status::ReloadResult, now_ms: u64) -> String {
    if r.ok {
        return format!(
            "RELOAD  ok {} ({})\n",
            format_time(r.at_ms),
            ago(now_ms, r.at_ms)
        );
    }
    let why = r.error.as_deref().unwrap_or("");
    let lines = why.lines().count();
    let first = why.lines().next().unwrap_or("");
    format!(
        "RELOAD  FAILED {} ({}): {}{}; still running the configuration above (the log has every line)\n",
        format_time(r.at_ms),
        ago(now_ms, r.at_ms),
        escape(first),
        if lines > 1 { format!(" (+{} more)", lines - 1) } else { String::new() }
    )
}

fn link_line(link: &LinkInfo, now_ms: u64) -> String {
    let mut line = match (link.state.as_str(), &link.controller) {
        ("none", _) => "LINK  no controllers configured: values are not sent".to_owned(),
        ("connected", Some(c)) => format!(
            "LINK  connected to {} since {} ({})",
            escape(c),
            format_time(link.since_ms),
            ago(now_ms, link.since_ms)
        ),
        (state, _) => {
            // Down since the outage began, not since this retry.
            let since = link.down_since_ms.unwrap_or(link.since_ms);
            let mut l = format!(
                "LINK  down since {} ({}), {} attempt{} ({state} now); controllers {}",
                format_time(since),
                ago(now_ms, since),
                link.attempts,
                if link.attempts == 1 { "" } else { "s" },
                escape(&link.controllers.join(", ")),
            );
            if let Some(e) = &link.last_error {
                let _ = write!(
                    l,
                    "\n      last error {}: {}",
                    ago(now_ms, e.at_ms),
                    escape(&e.message)
                );
            }
            l
        }
    };
    if link.state != "none" {
        let ack = match link.last_ack_ms {
            Some(at) => format!("last ack {} (seq {})", ago(now_ms, at), link.last_ack_seq),
            None => "no ack yet".to_owned(),
        };
        let _ = write!(
            line,
            "\n      {ack}; {} resvals waiting; {} batches sent",
            link.resvals_waiting, link.batches
        );
    }
    line
}

/// The whole table.
pub fn render(report: &StatusReport) -> String {
    let now = report.now_ms;
    let a = &report.agent;
    let c = &report.config;
    let mut out = format!(
        "HOST  {}  (xce-agent {}, pid {}, up {})\nCONF  generation {}, loaded {} ({}), digest {}; {} probes, {} skipped\n",
        escape(&a.host),
        a.version,
        a.pid,
        age(a.uptime_s * 1000),
        c.generation,
        format_time(c.loaded_ms),
        ago(now, c.loaded_ms),
        c.digest,
        c.probes,
        c.skipped
    );
    if let Some(r) = &c.last_reload {
        out.push_str(&reload_line(r, now));
    }
    out.push_str(&link_line(&report.link, now));
    out.push_str("\n\n");
    let mut table = Table::new(&[
        "RESOURCE", "INSTANCE", "VALUE", "STATUS", "AGE", "NEXT", "PROBE", "ERROR",
    ]);
    for r in &report.resources {
        table.resource(
            &r.name,
            &r.instance,
            &r.value,
            r.status,
            [
                r.last_report_ms
                    .map_or_else(|| "-".into(), |t| age(now.saturating_sub(t))),
                r.next_run_ms.map_or_else(
                    || "-".into(),
                    |t| format!("in {}", age(t.saturating_sub(now))),
                ),
                format!("{} ({})", r.probe, r.kind),
                r.error.clone().unwrap_or_default(),
            ],
        );
    }
    out.push_str(&table.text_without_empty_instances());
    if !report.probes.is_empty() {
        out.push('\n');
        let mut table = Table::new(&[
            "PROBE",
            "OK",
            "FAILED",
            "TIMEOUT",
            "REJECTED",
            "OVERLAP",
            "RESTARTS",
            "AGENT_CPU",
            "LAST_RUN",
            "LAST_OK",
        ]);
        for p in &report.probes {
            table.push(vec![
                p.name.clone(),
                p.runs_ok.to_string(),
                p.runs_failed.to_string(),
                p.runs_timeout.to_string(),
                p.runs_rejected.to_string(),
                p.skipped_overlap.to_string(),
                p.restarts.to_string(),
                format!("{:.1}ms", p.agent_cpu_ms),
                p.last_duration_ms
                    .map_or_else(|| "-".into(), |ms| format!("{ms:.1}ms")),
                p.last_success_ms
                    .map_or_else(|| "-".into(), |t| ago(now, t)),
            ]);
        }
        out.push_str(&table.text());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_are_short() {
        assert_eq!(age(999), "0s");
        assert_eq!(age(59_000), "59s");
        assert_eq!(age(192_000), "3m12s");
        assert_eq!(age(7_500_000), "2h5m");
        assert_eq!(age(3 * 86_400_000 + 4 * 3_600_000), "3d4h");
    }
}
