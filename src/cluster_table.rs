//! `listen --format table`: the cluster as `lsload` shows it, one row per host and one
//! column per resource, with each host's age since its last message. Redrawn in place on
//! a terminal, printed as successive frames otherwise (a log, a pipe).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime};

use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::receiver::budget::{Budget, DEFAULT_HOST_SHARE, DEFAULT_TOTAL};
use crate::receiver::hosts::{grace, unknown, HostState, HostTable, DEFAULT_HEARTBEAT};
use crate::receiver::session::{serve_doors, Control, Event, ListenOpts, UnixDoor};
use crate::render::status::age;
use crate::render::{columns, format_time, human_value};
use crate::value::{Resval, Status, Value};

/// How the table is shown.
#[derive(Debug, Clone)]
pub struct TableView {
    /// Only these resources' columns, in this order; empty = every resource seen.
    pub only: Vec<String>,
    pub refresh: Duration,
    /// Clear the screen before each frame (stdout is a terminal).
    pub in_place: bool,
}

impl TableView {
    /// Redrawn in place every second on a terminal; a frame every 10 s into a log or pipe.
    pub fn for_stdout(only: &[String], refresh: Option<Duration>) -> Self {
        let in_place = std::io::IsTerminal::is_terminal(&std::io::stdout());
        let default = Duration::from_secs(if in_place { 1 } else { 10 });
        Self {
            only: only.to_vec(),
            refresh: refresh.unwrap_or(default),
            in_place,
        }
    }
}

/// The cluster as the receiver has heard it: the receiver core's host table (the same fold
/// the C library reads), shown.
pub struct Cluster {
    hosts: HostTable,
}

impl Default for Cluster {
    fn default() -> Self {
        Self::new(Budget::new(DEFAULT_TOTAL, DEFAULT_HOST_SHARE))
    }
}

impl Cluster {
    /// A table whose hosts' state is charged to `budget` (the receiver's).
    pub fn new(budget: std::sync::Arc<Budget>) -> Self {
        Self {
            hosts: HostTable::new(grace(DEFAULT_HEARTBEAT), budget),
        }
    }
}

/// `name`, or `name@instance` for a shared instance.
fn label(name: &str, instance: &str) -> String {
    if instance.is_empty() {
        name.to_owned()
    } else {
        format!("{name}@{instance}")
    }
}

fn pending(name: &str, instance: &str) -> Resval {
    Resval {
        name: name.to_owned(),
        instance: instance.to_owned(),
        value: Value::Unknown,
        status: Status::Pending,
        last_report_ms: None,
        error: None,
    }
}

/// A host's row: every resource its hello declared (pending until a value came), by label.
fn row_values(st: &HostState) -> BTreeMap<String, Resval> {
    let mut row: BTreeMap<String, Resval> = st
        .accepted
        .hello
        .resources
        .iter()
        .map(|d| (label(&d.name, &d.instance), pending(&d.name, &d.instance)))
        .collect();
    for r in st.values() {
        let shown = if st.stale {
            unknown(&r, Duration::ZERO)
        } else {
            r.clone()
        };
        row.insert(label(&r.name, &r.instance), shown);
    }
    row
}

impl Cluster {
    pub fn apply(&mut self, ev: Event, now: Instant) {
        let _ = self.hosts.apply(ev, now);
        let _ = self.hosts.expire(now);
    }

    /// One frame of output: the screen cleared first on a terminal, a dated separator
    /// line otherwise.
    fn frame(&self, view: &TableView, now: Instant) -> String {
        let table = self.render(&view.only, now);
        if view.in_place {
            format!("\x1b[H\x1b[2J{table}")
        } else {
            let at = format_time(crate::value::unix_ms(SystemTime::now()));
            format!("--- {at}: {} hosts\n{table}", self.hosts.len())
        }
    }

    /// The table at `now`.
    pub fn render(&self, only: &[String], now: Instant) -> String {
        let mut hosts: Vec<(&HostState, BTreeMap<String, Resval>)> =
            self.hosts.hosts().map(|st| (st, row_values(st))).collect();
        hosts.sort_by(|a, b| a.0.host.cmp(&b.0.host));
        let resources: Vec<String> = if only.is_empty() {
            let all: BTreeSet<&String> = hosts.iter().flat_map(|(_, v)| v.keys()).collect();
            all.into_iter().cloned().collect()
        } else {
            only.to_vec()
        };
        let mut header = vec!["HOST".to_owned(), "LINK".to_owned(), "AGE".to_owned()];
        header.extend(resources.iter().cloned());
        let mut rows = vec![header];
        for (st, values) in &hosts {
            let link = match (st.connected(), st.stale) {
                (true, false) => "up",
                (true, true) => "stale",
                (false, _) => "down",
            };
            let mut cells = vec![
                st.host.to_string(),
                link.to_owned(),
                age(now.saturating_duration_since(st.last_heard).as_millis() as u64),
            ];
            cells.extend(resources.iter().map(|r| cell(values.get(r))));
            rows.push(cells);
        }
        let mut out = columns(&rows);
        out.push_str("(! failed: last good value; ? pending; - unknown or not reported)\n");
        out
    }
}

fn cell(rv: Option<&Resval>) -> String {
    let Some(rv) = rv else { return "-".into() };
    match (rv.status, &rv.value) {
        (Status::Pending, _) => "?".into(),
        (_, Value::Unknown) => "-".into(),
        (Status::Failed, v) => format!("{}!", human_value(&rv.name, v)),
        (_, v) => human_value(&rv.name, v),
    }
}

/// Serve agents and show them as a table on `out` every `view.refresh` until `shutdown`
/// (or until `out` is gone).
pub async fn serve_table<W: AsyncWrite + Unpin>(
    listeners: Vec<TcpListener>,
    unix: Vec<UnixDoor>,
    opts: ListenOpts,
    view: TableView,
    mut out: W,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let (tx, mut rx) = mpsc::channel(1024);
    let mut cluster = match &opts.budget {
        Some(b) => Cluster::new(std::sync::Arc::clone(b)),
        None => Cluster::default(),
    };
    let control = std::sync::Arc::new(Control::new(opts.domains.clone()));
    let server = tokio::spawn(serve_doors(
        listeners,
        unix,
        opts,
        tx,
        control,
        shutdown.clone(),
    ));
    let mut tick = tokio::time::interval(view.refresh.max(Duration::from_millis(10)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let ended = loop {
        tokio::select! {
            ev = rx.recv() => match ev {
                Some(ev) => cluster.apply(ev, Instant::now()),
                None => break Ok(()),
            },
            _ = tick.tick() => {
                let frame = cluster.frame(&view, Instant::now());
                if let Err(e) = write_frame(&mut out, &frame).await {
                    // stdout gone (e.g. `listen | head`): stop serving.
                    shutdown.cancel();
                    break Err(e);
                }
            }
        }
    };
    drop(rx);
    let _ = server.await;
    ended
}

async fn write_frame<W: AsyncWrite + Unpin>(out: &mut W, frame: &str) -> std::io::Result<()> {
    out.write_all(frame.as_bytes()).await?;
    out.flush().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::link::wire::{Batch, Declared, Hello};
    use crate::receiver::session::EventKind;
    use crate::value::Valtype;
    use std::net::SocketAddr;

    fn event(peer: u16, host: &str, kind: EventKind) -> Event {
        Event {
            peer: SocketAddr::from(([127, 0, 0, 1], peer)).into(),
            host: Some(host.to_owned()),
            session: u64::from(peer),
            kind,
            identity: None,
            reason: None,
        }
    }

    fn hello(host: &str, names: &[&str]) -> EventKind {
        let resources = names
            .iter()
            .map(|n| Declared {
                name: (*n).to_owned(),
                instance: String::new(),
                valtype: Valtype::Numeric,
                interval_ms: 1000,
                shared: false,
            })
            .collect();
        EventKind::Hello(std::sync::Arc::new(Hello::new(
            host.to_owned(),
            "boot",
            "digest",
            resources,
        )))
    }

    fn batch(values: &[(&str, Value, Status)]) -> EventKind {
        EventKind::Batch {
            batch: Batch {
                seq: 1,
                full: true,
                sent_at_ms: 0,
                resvals: values
                    .iter()
                    .map(|(n, v, s)| Resval {
                        name: (*n).to_owned(),
                        instance: String::new(),
                        value: v.clone(),
                        status: *s,
                        last_report_ms: None,
                        error: None,
                    })
                    .collect(),
            },
            rejected: Vec::new(),
        }
    }

    #[test]
    fn one_row_per_host_one_column_per_resource() {
        let t0 = Instant::now();
        let mut c = Cluster::default();
        c.apply(
            event(1, "node002", hello("node002", &["mem", "scratch"])),
            t0,
        );
        c.apply(event(2, "node001", hello("node001", &["mem"])), t0);
        c.apply(
            event(
                1,
                "node002",
                batch(&[
                    ("mem", Value::Numeric(5.0), Status::Ok),
                    ("scratch", Value::Numeric(7.5), Status::Failed),
                ]),
            ),
            t0,
        );
        let text = c.render(&[], t0 + Duration::from_secs(3));
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0].split_whitespace().collect::<Vec<_>>(),
            ["HOST", "LINK", "AGE", "mem", "scratch"]
        );
        assert_eq!(
            lines[1].split_whitespace().collect::<Vec<_>>(),
            ["node001", "up", "3s", "?", "-"]
        );
        assert_eq!(
            lines[2].split_whitespace().collect::<Vec<_>>(),
            ["node002", "up", "3s", "5M", "7.5!"]
        );
        let view = |in_place| TableView {
            only: Vec::new(),
            refresh: Duration::from_secs(1),
            in_place,
        };
        assert!(c.frame(&view(true), t0).starts_with("\x1b[H\x1b[2JHOST"));
        assert!(c.frame(&view(false), t0).starts_with("--- "));
        c.apply(event(1, "node002", EventKind::Closed(None)), t0);
        let only = c.render(&["scratch".to_owned()], t0);
        assert!(
            only.lines()
                .nth(2)
                .is_some_and(|l| l.split_whitespace().collect::<Vec<_>>()
                    == ["node002", "down", "0s", "7.5!"]),
            "{only}"
        );
    }
}
