//! The optional Prometheus endpoint (`metrics: 127.0.0.1:9477` in agent.yaml): every
//! numeric resval, the probes' own counters and the link's.
//!
//! hyper serves HTTP/1.1 and prometheus-client writes the exposition: the Prometheus text
//! format 0.0.4 by default, OpenMetrics text when the scraper's `Accept` asks for it. The
//! values are read from the store and the counters at scrape time by one [`Collector`], so
//! nothing is kept twice and a scrape always sees the current state.
//!
//! Bounds: a request head over [`MAX_REQUEST_BYTES`] is refused (431), a client that has not
//! sent its head within [`READ_TIMEOUT`] is dropped, a whole connection lives at most
//! [`CONNECTION_DEADLINE`] (a client that does not read cannot pin a task), and at most
//! [`MAX_CONNECTIONS`] are open at once. An idle connection is a parked task and a small
//! buffer, so the cap can be far above what scrapers use: hundreds of idle connections do
//! not delay a real scrape.

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::header::{HeaderValue, ACCEPT, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::config::Limits;
use crate::link::client::{LinkState, LinkStats};
use crate::stats::{DurationHistogram, Stats};
use crate::store::Store;
use crate::value::{Status, Value};

mod process;

/// A request head longer than this is refused (431): a scraper's is a few hundred bytes.
/// (hyper's smallest read buffer is 8 KiB, which is also its head limit.)
pub const MAX_REQUEST_BYTES: usize = 8 * 1024;
/// A client that has not sent its request head by then is dropped.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Everything a connection may take, head and answer together.
pub const CONNECTION_DEADLINE: Duration = Duration::from_secs(15);
/// Connections open at once; past it, new ones wait in the listen backlog until one ends
/// (each ends within [`CONNECTION_DEADLINE`]).
pub const MAX_CONNECTIONS: usize = 512;

const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";
const OPENMETRICS_TEXT: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What the endpoint reads at each scrape.
#[derive(Clone)]
pub struct Sources {
    pub store: Arc<Store>,
    pub link: Arc<LinkStats>,
    /// Follows a scheduler rebuilt by a reload.
    pub probes: watch::Receiver<Arc<Stats>>,
    /// File reads, for the stuck-read gauge.
    pub files: Arc<crate::probe::file_reader::FileReads>,
    /// The running configuration and the last reload's result.
    pub loaded: watch::Receiver<Arc<crate::status::Loaded>>,
    /// Where the probes' cgroups are, for their usage.
    pub supervisor: Arc<crate::probe::supervisor::Supervisor>,
}

impl fmt::Debug for Sources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sources").finish_non_exhaustive()
    }
}

/// The exposition formats a scraper may ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpositionFormat {
    /// Prometheus text 0.0.4, what every scraper reads.
    PrometheusText,
    /// OpenMetrics text 1.0.0, for scrapers that say they accept it.
    OpenMetrics,
}

impl ExpositionFormat {
    /// The format an `Accept` header asks for: OpenMetrics only when it is named.
    pub fn negotiate(accept: Option<&str>) -> ExpositionFormat {
        match accept {
            Some(a) if a.contains("application/openmetrics-text") => ExpositionFormat::OpenMetrics,
            _ => ExpositionFormat::PrometheusText,
        }
    }

    fn content_type(self) -> &'static str {
        match self {
            ExpositionFormat::PrometheusText => PROMETHEUS_TEXT,
            ExpositionFormat::OpenMetrics => OPENMETRICS_TEXT,
        }
    }
}

/// The registry the endpoint encodes: one collector that reads the sources at scrape time.
pub fn registry(src: Sources) -> Registry {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Exposition(src)));
    registry
}

/// Render the whole exposition.
pub fn render(registry: &Registry, format: ExpositionFormat) -> String {
    let mut out = String::with_capacity(4096);
    let written = match format {
        ExpositionFormat::PrometheusText => {
            prometheus_client::encoding::prometheus_text::encode(&mut out, registry)
        }
        ExpositionFormat::OpenMetrics => {
            prometheus_client::encoding::text::encode(&mut out, registry)
        }
    };
    // Writing into a String cannot fail; a collector error would be a bug here.
    if let Err(e) = written {
        tracing::error!(error = %e, "metrics: encoding the exposition failed");
    }
    out
}

#[derive(Debug)]
struct Exposition(Sources);

impl Collector for Exposition {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        encode_resources(&mut enc, &self.0.store)?;
        let stats = self.0.probes.borrow().clone();
        encode_probes(&mut enc, &stats)?;
        encode_schedule(&mut enc, &stats.schedule)?;
        encode_probe_usage(&mut enc, &self.0.supervisor.containment.usage_by_probe())?;
        encode_containment(
            &mut enc,
            &self.0.supervisor.containment,
            &self.0.loaded.borrow().plan,
        )?;
        encode_link(&mut enc, &self.0.link)?;
        encode_file_reads(&mut enc, &self.0.files)?;
        encode_config(&mut enc, &self.0.loaded.borrow())?;
        encode_build_info(&mut enc)?;
        process::encode(&mut enc)
    }
}

/// As Prometheus does for its own configuration: whether the last reload applied, and when
/// the running configuration was last loaded.
fn encode_config(enc: &mut DescriptorEncoder, loaded: &crate::status::Loaded) -> fmt::Result {
    let ok = loaded.last_reload.as_ref().is_none_or(|r| r.ok);
    family::<0>(
        enc,
        "xce_config_last_reload_successful",
        "Whether the last reload (SIGHUP) applied: 0 while the agent runs an older configuration than the files hold.",
        MetricType::Gauge,
        [([], Sample::Flag(ok))],
    )?;
    family::<0>(
        enc,
        "xce_config_last_reload_success_timestamp_seconds",
        "Unix time of the last successful load or reload of the configuration.",
        MetricType::Gauge,
        [([], Sample::Gauge(loaded.last_success_ms as f64 / 1000.0))],
    )?;
    family::<0>(
        enc,
        "xce_config_controllers",
        "Controllers the running configuration reports to (0: none, and the link stays down).",
        MetricType::Gauge,
        [([], Sample::Int(loaded.controllers.len() as i64))],
    )?;
    family::<0>(
        enc,
        "xce_config_generation",
        "1 for the configuration the agent started with, +1 for each reload that changed it.",
        MetricType::Gauge,
        [([], Sample::Int(loaded.generation as i64))],
    )
}

/// `xce_build_info{version="..."} 1`: which build runs, joinable onto every other series.
fn encode_build_info(enc: &mut DescriptorEncoder) -> fmt::Result {
    let protocol = crate::link::wire::PROTOCOL_VERSION.to_string();
    family(
        enc,
        "xce_build_info",
        "The agent's version and the link protocol it speaks; always 1.",
        MetricType::Gauge,
        [(
            [
                ("version", env!("CARGO_PKG_VERSION")),
                ("protocol", protocol.as_str()),
            ],
            Sample::Int(1),
        )],
    )
}

fn encode_file_reads(
    enc: &mut DescriptorEncoder,
    files: &crate::probe::file_reader::FileReads,
) -> fmt::Result {
    family::<0>(
        enc,
        "xce_file_reads_stuck",
        "File reads that outlived their timeout and are still blocked in the kernel (hung filesystem).",
        MetricType::Gauge,
        [([], Sample::Int(files.stuck_count() as i64))],
    )?;
    family::<0>(
        enc,
        "xce_file_reads_stuck_limit",
        "max_stuck_reads: past it, reads of paths that never answered fail at once.",
        MetricType::Gauge,
        [([], Sample::Int(files.max_stuck() as i64))],
    )
}

type Labels<'a, const N: usize> = [(&'static str, &'a str); N];

/// One metric family: its descriptor, then one sample per label set.
fn family<'a, const N: usize>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    samples: impl IntoIterator<Item = (Labels<'a, N>, Sample)>,
) -> fmt::Result {
    let mut metric = enc.encode_descriptor(name, help, None, kind)?;
    for (labels, sample) in samples {
        let mut m = metric.encode_family(&labels)?;
        match sample {
            Sample::Gauge(v) => m.encode_gauge(&v)?,
            Sample::Flag(b) => m.encode_gauge(&u32::from(b))?,
            Sample::Int(v) => m.encode_gauge(&v)?,
            Sample::Counter(v) => m.encode_counter::<NoLabelSet, _, u64>(&v, None)?,
            Sample::CounterF(v) => m.encode_counter::<NoLabelSet, _, u64>(&v, None)?,
        }
    }
    Ok(())
}

/// A sample's value, typed as its family.
enum Sample {
    Gauge(f64),
    /// A 0/1 state gauge, written as an integer.
    Flag(bool),
    /// A whole-number gauge (seconds, bytes), written as an integer.
    Int(i64),
    Counter(u64),
    /// A counter of a continuous quantity (seconds).
    CounterF(f64),
}

fn encode_resources(enc: &mut DescriptorEncoder, store: &Store) -> fmt::Result {
    let (_, resvals) = store.snapshot();
    family(
        enc,
        "xce_resource_value",
        "Latest value of a numeric resource (booleans as 0/1); absent while unknown.",
        MetricType::Gauge,
        resvals.iter().filter_map(|r| {
            let v = match r.value {
                Value::Numeric(v) => v,
                Value::Boolean(b) => f64::from(u8::from(b)),
                Value::String(_) | Value::Unknown => return None,
            };
            Some((
                [
                    ("name", r.name.as_str()),
                    ("resource_instance", r.instance.as_str()),
                ],
                Sample::Gauge(v),
            ))
        }),
    )?;
    family(
        enc,
        "xce_resource_status",
        "1 for the resource's current status (ok, failed, stale, pending), 0 for the others.",
        MetricType::Gauge,
        resvals.iter().flat_map(|r| {
            [Status::Ok, Status::Failed, Status::Stale, Status::Pending].map(|s| {
                (
                    [
                        ("name", r.name.as_str()),
                        ("resource_instance", r.instance.as_str()),
                        ("status", s.as_str()),
                    ],
                    Sample::Flag(r.status == s),
                )
            })
        }),
    )?;
    family(
        enc,
        "xce_resource_last_report_timestamp_seconds",
        "Unix time of the resource's last good reading.",
        MetricType::Gauge,
        resvals.iter().filter_map(|r| {
            r.last_report_ms.map(|ms| {
                (
                    [
                        ("name", r.name.as_str()),
                        ("resource_instance", r.instance.as_str()),
                    ],
                    Sample::Gauge(ms as f64 / 1000.0),
                )
            })
        }),
    )
}

fn encode_probes(enc: &mut DescriptorEncoder, stats: &Stats) -> fmt::Result {
    let probes = stats.all();
    family(
        enc,
        "xce_probe_runs",
        "Probe runs by outcome (a stream's runs are its updates: lines, blocks or ads); rejected = a stream update that did not parse; skipped_overlap = a tick skipped because the last run was still going.",
        MetricType::Counter,
        probes.iter().flat_map(|(name, p)| {
            [
                ("ok", &p.ok),
                ("failed", &p.failed),
                ("timeout", &p.timeout),
                ("rejected", &p.rejected),
                ("skipped_overlap", &p.skipped_overlap),
            ]
            .map(|(outcome, c)| {
                (
                    [("probe", name.as_str()), ("outcome", outcome)],
                    Sample::Counter(c.load(Ordering::Relaxed)),
                )
            })
        }),
    )?;
    let mut durations = enc.encode_descriptor(
        "xce_probe_duration_seconds",
        "How long probe runs took.",
        None,
        MetricType::Histogram,
    )?;
    for (name, p) in &probes {
        let labels = [("probe", name.as_str())];
        let (sum, count, buckets) = histogram(&p.duration);
        durations
            .encode_family(&labels)?
            .encode_histogram::<NoLabelSet>(sum, count, &buckets, None)?;
    }
    family(
        enc,
        "xce_probe_last_success_timestamp_seconds",
        "Unix time of the probe's last successful run.",
        MetricType::Gauge,
        probes.iter().filter_map(|(name, p)| {
            let ms = p.last_success_ms.load(Ordering::Relaxed);
            (ms > 0).then(|| {
                (
                    [("probe", name.as_str())],
                    Sample::Gauge(ms as f64 / 1000.0),
                )
            })
        }),
    )?;
    family(
        enc,
        "xce_probe_agent_cpu_seconds",
        "Agent CPU spent on the probe's output: a stream's lines read, parsed and applied, an exec or file run's output parsed (the probe's own CPU is xce_probe_cpu_seconds).",
        MetricType::Counter,
        probes.iter().map(|(name, p)| {
            (
                [("probe", name.as_str())],
                Sample::CounterF(p.agent_cpu_ns.load(Ordering::Relaxed) as f64 / 1e9),
            )
        }),
    )?;
    family(
        enc,
        "xce_probe_unexpected_names",
        "Names the probe's output gave that are not in its provides: (ignored; counted, only the first 64 remembered for the log).",
        MetricType::Counter,
        probes.iter().map(|(name, p)| {
            (
                [("probe", name.as_str())],
                Sample::Counter(p.unexpected_names.load(Ordering::Relaxed)),
            )
        }),
    )?;
    family(
        enc,
        "xce_probe_restarts",
        "Restarts of stream probes.",
        MetricType::Counter,
        probes.iter().map(|(name, p)| {
            (
                [("probe", name.as_str())],
                Sample::Counter(p.restarts.load(Ordering::Relaxed)),
            )
        }),
    )
}

/// How far behind their slots runs start: the run queue of `max_parallel`.
fn encode_schedule(
    enc: &mut DescriptorEncoder,
    schedule: &crate::stats::ScheduleStats,
) -> fmt::Result {
    family::<0>(
        enc,
        "xce_schedule_runs_waiting",
        "Runs past their slot waiting for a place under max_parallel.",
        MetricType::Gauge,
        [(
            [],
            Sample::Int(schedule.waiting.load(Ordering::Relaxed) as i64),
        )],
    )?;
    let (sum, count, buckets) = histogram(&schedule.start_delay);
    let no_labels: Labels<0> = [];
    enc.encode_descriptor(
        "xce_schedule_start_delay_seconds",
        "From each timed run's slot to its start: time spent waiting for a place under max_parallel (or for a starved agent).",
        None,
        MetricType::Histogram,
    )?
    .encode_family(&no_labels)?
    .encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
}

/// Whether probes run contained in cgroups, and which of their limits are not enforced for
/// want of a controller (or of cgroups): such limits are accepted and not set.
fn encode_containment(
    enc: &mut DescriptorEncoder,
    containment: &crate::probe::cgroup::Containment,
    plan: &crate::plan::Plan,
) -> fmt::Result {
    let tree = containment.tree();
    family::<0>(
        enc,
        "xce_containment_enforced",
        "1 when each probe runs in a cgroup of its own (each run ended with cgroup.kill, cgroup limits set); 0 when contained by process group only.",
        MetricType::Gauge,
        [([], Sample::Flag(tree.is_some()))],
    )?;
    // Per controller, the probes whose limits on it the host does not enforce, as `check`
    // says in its `limits NOT ENFORCED` note.
    let unenforced = Limits::CGROUP_CONTROLLERS.map(|(controller, _)| {
        let here = tree.is_some_and(|t| t.controllers.iter().any(|c| c == controller));
        let probes = plan
            .tasks
            .iter()
            .filter_map(|t| t.kind.exec_spec())
            .filter(|spec| !here && spec.limits.uses_controller(controller))
            .count();
        ([("controller", controller)], Sample::Int(probes as i64))
    });
    family(
        enc,
        "xce_probe_limits_unenforced",
        "Probes whose limits on a cgroup controller (memory, pids) are configured and not enforced: no cgroup containment, or the probes' cgroups lack the controller.",
        MetricType::Gauge,
        unenforced,
    )
}

/// CPU and peak memory of each probe's cgroup (only where probes are contained).
fn encode_probe_usage(
    enc: &mut DescriptorEncoder,
    usage: &[(String, crate::probe::cgroup::Usage)],
) -> fmt::Result {
    if usage.is_empty() {
        return Ok(());
    }
    family(
        enc,
        "xce_probe_cpu_seconds",
        "CPU time (user + system) used by the probe's runs and everything they started, from its cgroup.",
        MetricType::Counter,
        usage.iter().map(|(name, u)| {
            (
                [("probe", name.as_str())],
                Sample::CounterF(u.cpu.as_secs_f64()),
            )
        }),
    )?;
    if usage.iter().any(|(_, u)| u.peak_memory.is_some()) {
        family(
            enc,
            "xce_probe_memory_peak_bytes",
            "Peak memory of the probe's cgroup (memory.peak).",
            MetricType::Gauge,
            usage.iter().filter_map(|(name, u)| {
                u.peak_memory
                    .map(|peak| ([("probe", name.as_str())], Sample::Int(peak as i64)))
            }),
        )?;
    }
    Ok(())
}

/// A histogram's sum, count and per-bucket (not cumulative) counts, the last at +Inf.
/// The count is derived from the buckets read, so the +Inf bucket always equals `_count`
/// even while runs are being recorded.
fn histogram(h: &DurationHistogram) -> (f64, u64, Vec<(f64, u64)>) {
    let buckets: Vec<(f64, u64)> = h
        .buckets
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let le = DurationHistogram::BOUNDS
                .get(i)
                .copied()
                .unwrap_or(f64::INFINITY);
            (le, b.load(Ordering::Relaxed))
        })
        .collect();
    let count = buckets.iter().map(|(_, n)| n).sum();
    let sum = h.sum_us.load(Ordering::Relaxed) as f64 / 1e6;
    (sum, count, buckets)
}

fn encode_link(enc: &mut DescriptorEncoder, link: &LinkStats) -> fmt::Result {
    let state = match link.state() {
        LinkState::Connecting => "connecting",
        LinkState::Connected { .. } => "connected",
        LinkState::Backoff => "backoff",
        LinkState::Stopped => "stopped",
    };
    family(
        enc,
        "xce_link_state",
        "1 for the controller link's current state, 0 for the others.",
        MetricType::Gauge,
        ["connecting", "connected", "backoff", "stopped"]
            .map(|s| ([("state", s)], Sample::Flag(s == state))),
    )?;
    let counters = [
        (
            "xce_link_connects",
            "Connections made to a controller.",
            &link.connects,
        ),
        (
            "xce_link_connect_failures",
            "Connection attempts that failed.",
            &link.connect_failures,
        ),
        (
            "xce_link_disconnects",
            "Established connections lost (each is followed by a reconnect).",
            &link.disconnects,
        ),
        (
            "xce_link_batches",
            "Batches of resvals sent.",
            &link.batches,
        ),
        (
            "xce_link_full_batches",
            "Full snapshots sent (on connect and reload).",
            &link.full_batches,
        ),
        ("xce_link_heartbeats", "Heartbeats sent.", &link.heartbeats),
        ("xce_link_resvals_sent", "Resvals sent.", &link.resvals_sent),
        (
            "xce_link_bytes_sent",
            "Bytes written to the controller.",
            &link.bytes_sent,
        ),
        (
            "xce_link_write_timeouts",
            "Writes abandoned because the controller did not read.",
            &link.write_timeouts,
        ),
        (
            "xce_link_acks",
            "Acks received from the controller.",
            &link.acks,
        ),
        (
            "xce_link_welcomes_refused",
            "Welcomes refused because a name broke the resource-name rules.",
            &link.welcomes_refused,
        ),
    ];
    for (name, help, c) in counters {
        family::<0>(
            enc,
            name,
            help,
            MetricType::Counter,
            [([], Sample::Counter(c.load(Ordering::Relaxed)))],
        )?;
    }
    encode_link_health(enc, link)?;
    encode_tls(enc, link)
}

/// Since when the link is down, how often it was tried, and why it last failed.
fn encode_link_health(enc: &mut DescriptorEncoder, link: &LinkStats) -> fmt::Result {
    use crate::link::client::ErrorReason;
    let down_since = link.down_since_ms.load(Ordering::Relaxed);
    if down_since != 0 {
        // Absent while up: `time() - xce_link_down_since_timestamp_seconds > 600` alerts on
        // an outage of ten minutes, however many retries it took.
        family::<0>(
            enc,
            "xce_link_down_since_timestamp_seconds",
            "Unix time since which the controller link has been down (absent while up).",
            MetricType::Gauge,
            [([], Sample::Gauge(down_since as f64 / 1000.0))],
        )?;
    }
    family::<0>(
        enc,
        "xce_link_attempts_since_up",
        "Connection attempts since the controller link was last up.",
        MetricType::Gauge,
        [(
            [],
            Sample::Int(link.attempts.load(Ordering::Relaxed) as i64),
        )],
    )?;
    let last = link.last_error();
    family(
        enc,
        "xce_link_last_error",
        "1 for the reason of the controller link's last failure, 0 for the others.",
        MetricType::Gauge,
        ErrorReason::ALL.map(|r| {
            let on = last.as_ref().is_some_and(|e| e.reason == r);
            ([("reason", r.as_str())], Sample::Flag(on))
        }),
    )?;
    if let Some(e) = &last {
        family::<0>(
            enc,
            "xce_link_last_error_timestamp_seconds",
            "Unix time of the controller link's last failure.",
            MetricType::Gauge,
            [([], Sample::Gauge(e.at_ms as f64 / 1000.0))],
        )?;
    }
    Ok(())
}

fn encode_tls(enc: &mut DescriptorEncoder, link: &LinkStats) -> fmt::Result {
    use crate::link::tls::Failure;
    family(
        enc,
        "xce_link_tls_failures",
        "TLS handshakes or sessions with a controller that failed, by reason.",
        MetricType::Counter,
        Failure::ALL.map(|why| {
            (
                [("reason", why.as_str())],
                Sample::Counter(link.tls_failures(why)),
            )
        }),
    )?;
    let not_after = link.cert_not_after.load(Ordering::Relaxed);
    if not_after != 0 {
        // A timestamp, not a countdown: alert on `xce_tls_cert_not_after_timestamp_seconds
        // - time() < 14 * 86400`, as node_exporter's and blackbox_exporter's users do.
        family::<0>(
            enc,
            "xce_tls_cert_not_after_timestamp_seconds",
            "Unix time at which this host's TLS certificate expires.",
            MetricType::Gauge,
            [([], Sample::Int(not_after))],
        )?;
    }
    Ok(())
}

/// Serve `/metrics` on `listener` until `shutdown`.
pub async fn serve(listener: TcpListener, src: Sources, shutdown: CancellationToken) {
    let registry = Arc::new(registry(src));
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(READ_TIMEOUT)
        .max_buf_size(MAX_REQUEST_BYTES)
        // One request per connection, as scrapers do: an idle keep-alive connection
        // would hold a slot with no deadline of its own.
        .keep_alive(false);
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = listener.accept() => r,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of descriptors and the like: wait instead of spinning.
                tracing::warn!(error = %e, "metrics: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let registry = registry.clone();
        let conn = http.serve_connection(
            TokioIo::new(stream),
            hyper::service::service_fn(move |req| {
                let registry = registry.clone();
                async move { Ok::<_, std::convert::Infallible>(answer(&req, &registry)) }
            }),
        );
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let _permit = permit;
            tokio::select! {
                _ = shutdown.cancelled() => {}
                r = tokio::time::timeout(CONNECTION_DEADLINE, conn) => match r {
                    Ok(Err(e)) => tracing::debug!(error = %e, "metrics request failed"),
                    Err(_) => tracing::debug!("metrics connection dropped at its deadline"),
                    Ok(Ok(())) => {}
                },
            }
        });
    }
}

/// The answer to one request: the exposition for `GET`/`HEAD /metrics` (hyper leaves the
/// body out for `HEAD`), 404 elsewhere, 405 for other methods.
fn answer(req: &Request<Incoming>, registry: &Registry) -> Response<String> {
    let (status, content_type, body) = if req.uri().path() != "/metrics" {
        if matches!(*req.method(), Method::GET | Method::HEAD) {
            (
                StatusCode::NOT_FOUND,
                PROMETHEUS_TEXT,
                "not found; try /metrics\n".into(),
            )
        } else {
            (
                StatusCode::METHOD_NOT_ALLOWED,
                PROMETHEUS_TEXT,
                String::new(),
            )
        }
    } else if matches!(*req.method(), Method::GET | Method::HEAD) {
        let accept = req.headers().get(ACCEPT).and_then(|v| v.to_str().ok());
        let format = ExpositionFormat::negotiate(accept);
        (
            StatusCode::OK,
            format.content_type(),
            render(registry, format),
        )
    } else {
        (
            StatusCode::METHOD_NOT_ALLOWED,
            PROMETHEUS_TEXT,
            String::new(),
        )
    };
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openmetrics_only_when_asked_for() {
        assert_eq!(
            ExpositionFormat::negotiate(None),
            ExpositionFormat::PrometheusText
        );
        assert_eq!(
            ExpositionFormat::negotiate(Some("text/plain;version=0.0.4;q=0.5,*/*;q=0.1")),
            ExpositionFormat::PrometheusText
        );
        assert_eq!(
            ExpositionFormat::negotiate(Some(
                "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
            )),
            ExpositionFormat::OpenMetrics
        );
    }
}
