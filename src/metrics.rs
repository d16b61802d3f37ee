//! The optional Prometheus endpoint (`metrics: 127.0.0.1:9477` in agent.yaml): every
//! numeric resval, the probes' own counters and the link's. A tiny HTTP/1.1 server that
//! answers `GET /metrics` and nothing else: a scrape endpoint needs no HTTP library, and
//! the bounds (request size, read timeout, concurrent connections) are explicit here.
//!
//! The exposition is written by hand (text format 0.0.4): the values are a snapshot of the
//! store and the counters at scrape time, which fits a render function better than a
//! registry of long-lived metric objects.

use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::link::client::{LinkState, LinkStats};
use crate::stats::{DurationHistogram, Stats};
use crate::store::Store;
use crate::value::{Status, Value};

/// A request head longer than this is refused (431): a scraper's is a few hundred bytes.
pub const MAX_REQUEST_BYTES: usize = 8 * 1024;
/// A client that has not sent its request head by then is dropped.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Writing the answer is bounded too: a client that does not read must not pin a task.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// At most this many connections are served at once; others wait in the listen backlog.
pub const MAX_CONNECTIONS: usize = 16;

/// What the endpoint reads at each scrape.
#[derive(Clone)]
pub struct Sources {
    pub store: Arc<Store>,
    pub link: Arc<LinkStats>,
    /// Follows a scheduler rebuilt by a reload.
    pub probes: watch::Receiver<Arc<Stats>>,
    /// File reads, for the stuck-read gauge.
    pub files: Arc<crate::probe::file_reader::FileReads>,
}

/// Render the whole exposition.
pub fn render(src: &Sources) -> String {
    let mut out = String::with_capacity(4096);
    render_resources(&mut out, &src.store);
    let stats = src.probes.borrow().clone();
    render_probes(&mut out, &stats);
    render_link(&mut out, &src.link);
    render_file_reads(&mut out, &src.files);
    out
}

fn render_file_reads(out: &mut String, files: &crate::probe::file_reader::FileReads) {
    header(
        out,
        "xce_file_reads_stuck",
        "gauge",
        "File reads that outlived their timeout and are still blocked in the kernel (hung filesystem).",
    );
    let _ = writeln!(out, "xce_file_reads_stuck {}", files.stuck_count());
    header(
        out,
        "xce_file_reads_stuck_limit",
        "gauge",
        "max_stuck_reads: past it, reads of paths that never answered fail at once.",
    );
    let _ = writeln!(out, "xce_file_reads_stuck_limit {}", files.max_stuck());
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// Label values escaped as the text format requires.
fn esc(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

/// A float as the text format writes it (`+Inf`, `NaN` never happen: values are finite).
fn num(v: f64) -> String {
    if v.is_finite() {
        format!("{v}")
    } else if v.is_nan() {
        "NaN".into()
    } else if v > 0.0 {
        "+Inf".into()
    } else {
        "-Inf".into()
    }
}

fn render_resources(out: &mut String, store: &Store) {
    let (_, resvals) = store.snapshot();
    header(
        out,
        "xce_resource_value",
        "gauge",
        "Latest value of a numeric resource (booleans as 0/1); absent while unknown.",
    );
    for r in &resvals {
        let v = match r.value {
            Value::Numeric(v) => v,
            Value::Boolean(b) => f64::from(u8::from(b)),
            Value::String(_) | Value::Unknown => continue,
        };
        let _ = writeln!(
            out,
            "xce_resource_value{{name=\"{}\",instance=\"{}\"}} {}",
            esc(&r.name),
            esc(&r.instance),
            num(v)
        );
    }
    header(
        out,
        "xce_resource_status",
        "gauge",
        "1 for the resource's current status (ok, failed, stale, pending), 0 for the others.",
    );
    for r in &resvals {
        for s in [Status::Ok, Status::Failed, Status::Stale, Status::Pending] {
            let _ = writeln!(
                out,
                "xce_resource_status{{name=\"{}\",instance=\"{}\",status=\"{}\"}} {}",
                esc(&r.name),
                esc(&r.instance),
                s.as_str(),
                u8::from(r.status == s)
            );
        }
    }
    header(
        out,
        "xce_resource_last_report_seconds",
        "gauge",
        "Unix time of the resource's last good reading.",
    );
    for r in &resvals {
        if let Some(ms) = r.last_report_ms {
            let _ = writeln!(
                out,
                "xce_resource_last_report_seconds{{name=\"{}\",instance=\"{}\"}} {}",
                esc(&r.name),
                esc(&r.instance),
                num(ms as f64 / 1000.0)
            );
        }
    }
}

fn render_probes(out: &mut String, stats: &Stats) {
    let probes = stats.all();
    header(
        out,
        "xce_probe_runs_total",
        "counter",
        "Probe runs by outcome; skipped_overlap = a tick skipped because the last run was still going.",
    );
    for (name, p) in &probes {
        for (outcome, c) in [
            ("ok", &p.ok),
            ("failed", &p.failed),
            ("timeout", &p.timeout),
            ("skipped_overlap", &p.skipped_overlap),
        ] {
            let _ = writeln!(
                out,
                "xce_probe_runs_total{{probe=\"{}\",outcome=\"{outcome}\"}} {}",
                esc(name),
                c.load(Ordering::Relaxed)
            );
        }
    }
    header(
        out,
        "xce_probe_duration_seconds",
        "histogram",
        "How long probe runs took.",
    );
    for (name, p) in &probes {
        render_histogram(out, "xce_probe_duration_seconds", name, &p.duration);
    }
    header(
        out,
        "xce_probe_last_success_seconds",
        "gauge",
        "Unix time of the probe's last successful run.",
    );
    for (name, p) in &probes {
        let ms = p.last_success_ms.load(Ordering::Relaxed);
        if ms > 0 {
            let _ = writeln!(
                out,
                "xce_probe_last_success_seconds{{probe=\"{}\"}} {}",
                esc(name),
                num(ms as f64 / 1000.0)
            );
        }
    }
    header(
        out,
        "xce_probe_restarts_total",
        "counter",
        "Restarts of stream probes.",
    );
    for (name, p) in &probes {
        let _ = writeln!(
            out,
            "xce_probe_restarts_total{{probe=\"{}\"}} {}",
            esc(name),
            p.restarts.load(Ordering::Relaxed)
        );
    }
}

fn render_histogram(out: &mut String, metric: &str, probe: &str, h: &DurationHistogram) {
    let probe = esc(probe);
    // Read the buckets first and derive the count from them, so the +Inf bucket always
    // equals _count even while runs are being recorded.
    let buckets: Vec<u64> = h
        .buckets
        .iter()
        .map(|b| b.load(Ordering::Relaxed))
        .collect();
    let mut cumulative = 0;
    for (i, n) in buckets.iter().enumerate() {
        cumulative += n;
        let le = DurationHistogram::BOUNDS
            .get(i)
            .map_or_else(|| "+Inf".to_owned(), |b| num(*b));
        let _ = writeln!(
            out,
            "{metric}_bucket{{probe=\"{probe}\",le=\"{le}\"}} {cumulative}"
        );
    }
    let sum = h.sum_us.load(Ordering::Relaxed) as f64 / 1e6;
    let _ = writeln!(out, "{metric}_sum{{probe=\"{probe}\"}} {}", num(sum));
    let _ = writeln!(out, "{metric}_count{{probe=\"{probe}\"}} {cumulative}");
}

fn render_link(out: &mut String, link: &LinkStats) {
    let state = match link.state() {
        LinkState::Connecting => "connecting",
        LinkState::Connected { .. } => "connected",
        LinkState::Backoff => "backoff",
        LinkState::Stopped => "stopped",
    };
    header(
        out,
        "xce_link_state",
        "gauge",
        "1 for the controller link's current state, 0 for the others.",
    );
    for s in ["connecting", "connected", "backoff", "stopped"] {
        let _ = writeln!(
            out,
            "xce_link_state{{state=\"{s}\"}} {}",
            u8::from(s == state)
        );
    }
    let counters = [
        (
            "xce_link_connects_total",
            "Connections made to a controller.",
            &link.connects,
        ),
        (
            "xce_link_connect_failures_total",
            "Connection attempts that failed.",
            &link.connect_failures,
        ),
        (
            "xce_link_disconnects_total",
            "Established connections lost (each is followed by a reconnect).",
            &link.disconnects,
        ),
        (
            "xce_link_batches_total",
            "Batches of resvals sent.",
            &link.batches,
        ),
        (
            "xce_link_full_batches_total",
            "Full snapshots sent (on connect and reload).",
            &link.full_batches,
        ),
        (
            "xce_link_heartbeats_total",
            "Heartbeats sent.",
            &link.heartbeats,
        ),
        (
            "xce_link_resvals_sent_total",
            "Resvals sent.",
            &link.resvals_sent,
        ),
        (
            "xce_link_bytes_sent_total",
            "Bytes written to the controller.",
            &link.bytes_sent,
        ),
        (
            "xce_link_write_timeouts_total",
            "Writes abandoned because the controller did not read.",
            &link.write_timeouts,
        ),
        (
            "xce_link_acks_total",
            "Acks received from the controller.",
            &link.acks,
        ),
    ];
    for (name, help, c) in counters {
        header(out, name, "counter", help);
        let _ = writeln!(out, "{name} {}", c.load(Ordering::Relaxed));
    }
}

/// Serve `GET /metrics` on `listener` until `shutdown`.
pub async fn serve(listener: TcpListener, src: Sources, shutdown: CancellationToken) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = listener.accept() => r,
        };
        match accepted {
            Ok((stream, _)) => {
                let src = src.clone();
                tokio::spawn(async move {
                    let _permit = permit;
                    if let Err(e) = answer(stream, &src).await {
                        tracing::debug!(error = %e, "metrics request failed");
                    }
                });
            }
            Err(e) => {
                // Out of descriptors and the like: wait instead of spinning.
                tracing::warn!(error = %e, "metrics: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// What a request head asks for.
#[derive(Debug, PartialEq, Eq)]
enum Route {
    Metrics { head_only: bool },
    NotFound,
    BadMethod,
    Bad,
}

fn route(head: &[u8]) -> Route {
    let Ok(text) = std::str::from_utf8(head) else {
        return Route::Bad;
    };
    let line = text.lines().next().unwrap_or("");
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version)) = (parts.next(), parts.next(), parts.next())
    else {
        return Route::Bad;
    };
    if !version.starts_with("HTTP/1.") {
        return Route::Bad;
    }
    let path = target.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET", "/metrics") => Route::Metrics { head_only: false },
        ("HEAD", "/metrics") => Route::Metrics { head_only: true },
        ("GET" | "HEAD", _) => Route::NotFound,
        _ => Route::BadMethod,
    }
}

async fn answer(mut stream: TcpStream, src: &Sources) -> std::io::Result<()> {
    let head = match tokio::time::timeout(READ_TIMEOUT, read_head(&mut stream)).await {
        Err(_) => return Ok(()),
        Ok(r) => r?,
    };
    let (status, body, head_only) = match head {
        None => ("431 Request Header Fields Too Large", String::new(), false),
        Some(h) => match route(&h) {
            Route::Metrics { head_only } => ("200 OK", render(src), head_only),
            Route::NotFound => ("404 Not Found", "not found; try /metrics\n".into(), false),
            Route::BadMethod => ("405 Method Not Allowed", String::new(), false),
            Route::Bad => ("400 Bad Request", String::new(), false),
        },
    };
    let mut resp = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if !head_only {
        resp.push_str(&body);
    }
    match tokio::time::timeout(WRITE_TIMEOUT, async {
        stream.write_all(resp.as_bytes()).await?;
        stream.shutdown().await
    })
    .await
    {
        Ok(r) => r,
        Err(_) => Ok(()),
    }
}

/// Read up to the blank line ending the request head; `None` when it exceeds the limit.
async fn read_head(stream: &mut TcpStream) -> std::io::Result<Option<Vec<u8>>> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.windows(4).any(|w| w == b"\r\n\r\n") {
            return Ok(Some(buf));
        }
        if buf.len() > MAX_REQUEST_BYTES {
            return Ok(None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        assert_eq!(
            route(b"GET /metrics HTTP/1.1\r\n\r\n"),
            Route::Metrics { head_only: false }
        );
        assert_eq!(
            route(b"GET /metrics?x=1 HTTP/1.0\r\n\r\n"),
            Route::Metrics { head_only: false }
        );
        assert_eq!(
            route(b"HEAD /metrics HTTP/1.1\r\n\r\n"),
            Route::Metrics { head_only: true }
        );
        assert_eq!(route(b"GET / HTTP/1.1\r\n\r\n"), Route::NotFound);
        assert_eq!(route(b"POST /metrics HTTP/1.1\r\n\r\n"), Route::BadMethod);
        assert_eq!(route(b"garbage\r\n\r\n"), Route::Bad);
        assert_eq!(route(b"GET /metrics SPDY\r\n\r\n"), Route::Bad);
        assert_eq!(route(&[0xff, 0xfe, b'\r', b'\n']), Route::Bad);
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(esc("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
