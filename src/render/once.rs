//! What `--once` prints: a table like `lsload -l` for this host, or JSON.

use std::fmt::Write as _;

use serde::Serialize;

use super::{format_time, Table};
use crate::plan::ProbeTask;
use crate::probe::failure::last_line;
use crate::probe::ProbeRun;
use crate::store::Store;
use crate::text::escape;
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
            for (i, (name, _)) in run.readings.iter().enumerate() {
                let instance = task.instance_of(i, name);
                let Some(rv) = store.get(name, instance) else {
                    continue;
                };
                rows.push(Row {
                    name: name.clone(),
                    instance: instance.to_owned(),
                    probe: task.name.clone(),
                    kind: task.kind.name(),
                    value: rv.value,
                    status: rv.status,
                    last_report_ms: rv.last_report_ms,
                    duration_ms: run.duration.as_millis() as u64,
                    error: rv.error.as_ref().map(ToString::to_string),
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
        let mut table = Table::new(&[
            "RESOURCE",
            "INSTANCE",
            "VALUE",
            "STATUS",
            "LAST_REPORT",
            "DURATION",
            "KIND",
            "ERROR",
        ]);
        for r in &self.resources {
            let mut error = r.error.clone().unwrap_or_default();
            if !r.stderr.is_empty() && !error.contains(last_line(&r.stderr)) {
                let _ = write!(error, " [stderr: {}]", last_line(&r.stderr));
            }
            table.resource(
                &r.name,
                &r.instance,
                &r.value,
                r.status,
                [
                    r.last_report_ms.map_or_else(|| "-".into(), format_time),
                    format_ms(r.duration_ms),
                    r.kind.to_owned(),
                    error,
                ],
            );
        }
        let mut out = format!("HOST {}\n", escape(&self.host));
        out.push_str(&table.text_without_empty_instances());
        out
    }
}

fn format_ms(ms: u64) -> String {
    if ms >= 10_000 {
        format!("{:.1}s", ms as f64 / 1000.0)
    } else {
        format!("{ms}ms")
    }
}
