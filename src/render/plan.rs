//! What `check` prints: the files, the probes this host runs, what it skips and why, the
//! problems and notes, and the link's certificates.

use std::fmt::Write as _;
use std::time::Duration;

use super::{columns, Table};
use crate::config::{Config, ProbeKind};
use crate::link::tls;
use crate::plan::{Plan, Spread};
use crate::text::escape;

fn secs(d: Duration) -> String {
    humantime::format_duration(Duration::from_millis(d.as_millis() as u64)).to_string()
}

/// `check`'s output: the files, the probes this host runs, and what it skips and why.
/// What the SPLAY column means: nobody guessed it.
/// What SPLAY means under the plan's `spread`.
fn splay_legend(spread: Spread) -> String {
    let how = match spread {
        Spread::Host => "With `spread: host` (agent.yaml's default) it is this host's one offset, from a hash of its name, modulo INTERVAL: the probes whose intervals divide one another's run together, in one wake-up of the agent and one interruption of the node's jobs (runs beyond max_parallel wait their turn).",
        Spread::Probes => "With `spread: probes` (agent.yaml) it comes from a hash of host and resource name (a host's builtin probes share one), so a host's probes run apart.",
    };
    format!("SPLAY: where in each interval the probe runs (a run falls due when the wall clock minus SPLAY is a multiple of INTERVAL). {how} The same after every restart, and different across hosts, so 5,000 nodes do not run a probe in the same second.\n")
}

pub fn plan_text(
    config: &Config,
    plan: &Plan,
    problems: &[(String, String)],
    notes: &[(String, String)],
) -> String {
    let mut out = String::new();
    // Resources fed through `provides:` are listed under the probe that feeds them, so every
    // resource of the file appears once, under PROBES or under SKIPPED (a resource whose
    // probe runs here for the others it feeds is under SKIPPED, and they under PROBES).
    let provided_by_skipped: Vec<(&str, &[String])> = plan
        .skipped
        .iter()
        .filter(|s| !plan.tasks.iter().any(|t| t.name == s.name))
        .filter_map(|s| {
            let probe = config.resources.get(&s.name)?.probe.as_ref()?;
            Some((s.name.as_str(), probe.provides.get(1..).unwrap_or_default()))
        })
        .collect();
    let probed: usize = plan.tasks.iter().map(|t| t.feeds.len()).sum();
    let skipped: usize = plan.skipped.len()
        + provided_by_skipped
            .iter()
            .map(|(_, p)| p.len())
            .sum::<usize>();
    let _ = writeln!(out, "agent.yaml      {}", config.agent.path.display());
    let _ = writeln!(
        out,
        "resources.yaml  {} ({} resources: {probed} probed here, {skipped} skipped)",
        config.resources.path.display(),
        config.resources.resources.len()
    );
    let _ = writeln!(out, "host            {}", plan.host);
    let _ = writeln!(
        out,
        "controllers     {}",
        if config.agent.controllers.is_empty() {
            "(none: values are not sent anywhere)".to_owned()
        } else {
            config.agent.controllers.join(", ")
        }
    );
    let _ = writeln!(out, "config digest   {}", config.digest);
    let _ = writeln!(
        out,
        "\nPROBES ({}, feeding {probed} resources)",
        plan.tasks.len()
    );
    let mut table = Table::new(&[
        "NAME", "INSTANCE", "INTERVAL", "TIMEOUT", "SPLAY", "FEEDS", "PROBE",
    ]);
    for t in &plan.tasks {
        table.row(
            t.name.clone(),
            &t.instance,
            [
                secs(t.interval),
                match t.kind {
                    ProbeKind::Builtin { .. } => "-".into(),
                    // A stream runs on; its timeout bounds the wait for its first values.
                    ProbeKind::Stream(_) => format!("{} (first values)", secs(t.timeout)),
                    _ => secs(t.timeout),
                },
                secs(t.splay),
                t.feeds
                    .iter()
                    .map(|f| f.name.as_str())
                    .collect::<Vec<_>>()
                    .join(","),
                t.kind.summary(),
            ],
        );
        for f in t.feeds.iter().filter(|f| f.name != t.name) {
            let mut row = vec![String::new(); 7];
            row[0] = format!("  {}", f.name);
            if f.instance != t.instance {
                row[1] = if f.is_shared() {
                    f.instance.clone()
                } else {
                    "-".into()
                };
            }
            row[6] = format!("fed by {} (provides:)", t.name);
            table.push(row);
        }
    }
    out.push_str(&table.text());
    if !plan.tasks.is_empty() {
        out.push_str(&splay_legend(config.agent.spread));
    }
    let _ = writeln!(out, "\nSKIPPED ({skipped})");
    let mut rows = Vec::new();
    for s in &plan.skipped {
        let hint = match s.reason {
            crate::plan::SkipReason::NotHere => {
                crate::plan::near_hosts_hint(&config.resources, &s.name, &plan.host)
            }
            _ => String::new(),
        };
        rows.push(vec![s.name.clone(), format!("{}{hint}", s.reason)]);
        let provides = provided_by_skipped.iter().find(|(n, _)| *n == s.name);
        for p in provides.map(|(_, p)| *p).unwrap_or_default() {
            rows.push(vec![
                format!("  {p}"),
                format!("fed by {} (provides:), skipped with it", s.name),
            ]);
        }
    }
    out.push_str(&columns(&rows));
    for (title, list) in [("PROBLEMS", problems), ("NOTES", notes)] {
        if !list.is_empty() {
            let _ = writeln!(out, "\n{title} ({})", list.len());
            for (name, text) in list {
                let text: Vec<_> = crate::text::escape_lines(text).collect();
                let _ = writeln!(out, "{}: {}", escape(name), text.join("\n"));
            }
        }
    }
    out
}

/// `check`'s part about the link: each certificate (`report`, when agent.yaml has a `tls:`
/// section), what is wrong or close to it, and a warning every time the link is plaintext.
/// Which name the controller will see for this host (receiver::identity): lower case, and
/// the short name where the controller is configured with the host's domain.
pub fn controller_name_text(host: &str) -> String {
    let lower = host.to_ascii_lowercase();
    match lower.split_once('.') {
        Some((short, domain)) if !short.is_empty() && !domain.is_empty() => format!(
            "\nthe controller sees this host as {lower:?}, or as {short:?} where it is configured with the cluster domain {domain:?} (listen --domain, xce_receiver_config_add_domain)\n"
        ),
        _ => format!("\nthe controller sees this host as {lower:?}\n"),
    }
}

pub fn tls_text(config: &Config, report: Option<&tls::Report>) -> String {
    let mut out = String::new();
    let Some(report) = report else {
        if config.agent.insecure_plaintext && !config.agent.controllers.is_empty() {
            out.push_str("\nWARNING: insecure_plaintext: true: values go to the controllers unauthenticated and readable by anyone on the network; add a tls: section\n");
        }
        return out;
    };
    out.push_str("\ntls:\n");
    for line in &report.lines {
        let _ = writeln!(out, "  {line}");
    }
    for w in &report.warnings {
        let _ = writeln!(out, "  WARNING: {w}");
    }
    for p in &report.problems {
        let _ = writeln!(out, "  PROBLEM: {p}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_says_which_name_the_controller_sees() {
        assert!(controller_name_text("NODE001").contains("as \"node001\"\n"));
        let fq = controller_name_text("Node001.Cluster.Example");
        assert!(
            fq.contains("as \"node001.cluster.example\", or as \"node001\""),
            "{fq}"
        );
    }
}
