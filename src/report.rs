//! What `--once` and `check` print: a table like `lsload -l` for this host, or JSON.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::config::{Config, ProbeKind};
use crate::plan::{Plan, ProbeTask};
use crate::probe::exec::last_line;
use crate::probe::ProbeRun;
use crate::store::Store;
use crate::value::{Status, Value};

/// One printed row: one resource instance.
#[derive(Debug, Serialize)]
pub struct Row {
    pub name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub instance: String,
    pub probe: String,
    pub kind: &'static str,
    pub value: Value,
    pub status: Status,
    pub last_report_ms: Option<u64>,
    pub duration_ms: u64,
    pub error: Option<String>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub stderr: String,
}

#[derive(Debug, Serialize)]
pub struct OnceReport {
    pub host: String,
    pub resources: Vec<Row>,
    /// Every run succeeded (`ProbeRun::succeeded`, the rule `probe NAME` exits by).
    #[serde(skip)]
    pub runs_ok: bool,
}

impl OnceReport {
    pub fn new(host: &str, runs: &[(ProbeTask, ProbeRun)], store: &Store) -> Self {
        let mut rows = Vec::new();
        for (task, run) in runs {
            for (name, _) in &run.readings {
                let Some(rv) = store.get(name, &task.instance) else {
                    continue;
                };
                rows.push(Row {
                    name: name.clone(),
                    instance: task.instance.clone(),
                    probe: task.name.clone(),
                    kind: task.kind.name(),
                    value: rv.value,
                    status: rv.status,
                    last_report_ms: rv.last_report_ms,
                    duration_ms: run.duration.as_millis() as u64,
                    error: rv.error,
                    stderr: run
                        .exec
                        .as_ref()
                        .map(|e| e.stderr.clone())
                        .unwrap_or_default(),
                });
            }
        }
        Self {
            host: host.to_owned(),
            resources: rows,
            runs_ok: runs.iter().all(|(_, run)| run.succeeded()),
        }
    }

    pub fn all_ok(&self) -> bool {
        self.runs_ok
            && !self
                .resources
                .iter()
                .any(|r| matches!(r.status, Status::Failed | Status::Stale))
    }

    pub fn table(&self) -> String {
        let with_instance = self.resources.iter().any(|r| !r.instance.is_empty());
        let mut cells: Vec<Vec<String>> = vec![[
            "RESOURCE",
            "INSTANCE",
            "VALUE",
            "STATUS",
            "LAST_REPORT",
            "DURATION",
            "KIND",
            "ERROR",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()];
        for r in &self.resources {
            let mut error = r.error.clone().unwrap_or_default();
            if !r.stderr.is_empty() && !error.contains(last_line(&r.stderr)) {
                let _ = write!(error, " [stderr: {}]", last_line(&r.stderr));
            }
            cells.push(vec![
                r.name.clone(),
                if r.instance.is_empty() {
                    "-".into()
                } else {
                    r.instance.clone()
                },
                r.value.to_string(),
                r.status.to_string(),
                r.last_report_ms.map_or_else(|| "-".into(), format_time),
                format_ms(r.duration_ms),
                r.kind.to_owned(),
                error,
            ]);
        }
        if !with_instance {
            for row in &mut cells {
                row.remove(1);
            }
        }
        let mut out = format!("HOST {}\n", self.host);
        out.push_str(&columns(&cells));
        out
    }
}

pub fn format_time(ms: u64) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(ms);
    humantime::format_rfc3339_seconds(t).to_string()
}

fn format_ms(ms: u64) -> String {
    if ms >= 10_000 {
        format!("{:.1}s", ms as f64 / 1000.0)
    } else {
        format!("{ms}ms")
    }
}

/// Left-aligned columns, the last one unpadded.
pub fn columns(rows: &[Vec<String>]) -> String {
    let n = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..n)
        .map(|i| {
            rows.iter()
                .filter_map(|r| r.get(i))
                .map(|c| c.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<w$}  ", w = widths[i]);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn secs(d: Duration) -> String {
    humantime::format_duration(Duration::from_millis(d.as_millis() as u64)).to_string()
}

/// `check`'s output: the files, the probes this host runs, and what it skips and why.
pub fn plan_text(
    config: &Config,
    plan: &Plan,
    problems: &[(String, String)],
    notes: &[(String, String)],
) -> String {
    let mut out = String::new();
    // Resources fed through `provides:` are listed under the probe that feeds them, so every
    // resource of the file appears once, under PROBES or under SKIPPED.
    let provided_by_skipped: Vec<(&str, &[String])> = plan
        .skipped
        .iter()
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
    let mut rows = vec![[
        "NAME", "INSTANCE", "INTERVAL", "TIMEOUT", "SPLAY", "FEEDS", "PROBE",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect::<Vec<_>>()];
    for t in &plan.tasks {
        rows.push(vec![
            t.name.clone(),
            if t.instance.is_empty() {
                "-".into()
            } else {
                t.instance.clone()
            },
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
        ]);
        for f in t.feeds.iter().skip(1) {
            let mut row = vec![String::new(); 7];
            row[0] = format!("  {}", f.name);
            row[6] = format!("fed by {} (provides:)", t.name);
            rows.push(row);
        }
    }
    out.push_str(&columns(&rows));
    let _ = writeln!(out, "\nSKIPPED ({skipped})");
    let mut rows = Vec::new();
    for s in &plan.skipped {
        rows.push(vec![s.name.clone(), s.reason.to_string()]);
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
                let _ = writeln!(out, "{name}: {text}");
            }
        }
    }
    out
}

pub fn now_ms() -> u64 {
    crate::value::unix_ms(SystemTime::now())
}
