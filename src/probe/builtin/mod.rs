//! Built-in load indices (LSF's 11 plus modern extras), computed by one shared sampler.
//!
//! Every builtin resource reads the same [`Snapshot`]: N resources on built-ins cost one read
//! of each /proc file per tick. The run queue (`r15s r1m r15m`) is sampled every 5 s
//! ([`Sampler::fast_tick`]); everything else every 15 s ([`Sampler::slow_tick`]). The
//! [`Sampler`] itself is pure: it is given the roots to read and the time, so tests drive it
//! over fixture trees; [`spawn`] runs it on the real host.
//!
//! One file per index family; each documents its formula.

mod cpu;
mod disk_io;
mod gpu;
mod idle;
mod loadavg;
mod paging;
mod psi;
pub mod smoothing;
mod space;
mod users;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::value::{Failure, Reading, Value};

/// Run-queue sampling period (LSF's 5 s).
pub const FAST_TICK: Duration = Duration::from_secs(5);
/// Every other index is sampled every `SLOW_EVERY` fast ticks (15 s).
pub const SLOW_EVERY: u64 = 3;

/// Where the sampler reads. Tests point these at fixture trees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Roots {
    pub proc: PathBuf,
    pub sys: PathBuf,
    pub dev: PathBuf,
    pub run: PathBuf,
    /// The file system `tmp`/`maxtmp` measure.
    pub tmp: PathBuf,
    pub utmp: PathBuf,
    /// The NVML library to `dlopen` (a bare name is searched the usual way).
    pub nvml: PathBuf,
}

impl Roots {
    pub fn host() -> Self {
        Self {
            proc: "/proc".into(),
            sys: "/sys".into(),
            dev: "/dev".into(),
            run: "/run".into(),
            tmp: "/tmp".into(),
            utmp: "/var/run/utmp".into(),
            nvml: "libnvidia-ml.so.1".into(),
        }
    }
}

/// One index this module can serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexInfo {
    pub name: &'static str,
    pub desc: &'static str,
    pub unit: &'static str,
    /// LSF ordtype: `true` = increasing (more is more loaded), `false` = decreasing (more is
    /// better, e.g. free space).
    pub increasing: bool,
}

/// LSF ordtype `increasing`: more is more loaded (the run queue).
const INCREASING: bool = true;
/// LSF ordtype `decreasing`: more is better (free space).
const DECREASING: bool = false;

/// Declares the indices, one line each: `Variant => name, unit, ordtype, description`, and
/// for an index read straight from /proc/meminfo `, meminfo: its field` (bytes).
/// Generates `Ix` (a collector's handle on its slot), `COUNT`, [`CATALOGUE`] and
/// [`MEMINFO`] in one order, so they cannot drift apart. A new index is one line here plus
/// the collector that fills its slot (`slots.ok(Ix::Variant, value)`); a new meminfo index
/// is the line alone.
macro_rules! indices {
    ($($variant:ident => $name:literal, $unit:literal, $increasing:expr, $desc:literal
        $(, meminfo: $meminfo:expr)?;)*) => {
        /// Positions in [`CATALOGUE`]; the sampler keeps one slot per index in this order.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub(crate) enum Ix {
            $($variant,)*
        }

        const COUNT: usize = [$(Ix::$variant),*].len();

        static CATALOGUE: [IndexInfo; COUNT] = [
            $(IndexInfo {
                name: $name,
                desc: $desc,
                unit: $unit,
                increasing: $increasing,
            },)*
        ];

        /// The indices read straight from /proc/meminfo, each with the field it reports.
        const MEMINFO: &[(Ix, fn(&procfs::Meminfo) -> u64)] = &[
            $($((Ix::$variant, $meminfo),)?)*
        ];
    };
}

indices! {
    R15s => "r15s", "tasks", INCREASING, "Run queue length, 15 s exponential average";
    R1m => "r1m", "tasks", INCREASING, "Run queue length, 1 min exponential average";
    R15m => "r15m", "tasks", INCREASING, "Run queue length, 15 min exponential average";
    Ut => "ut", "%", INCREASING, "CPU utilisation, 1 min exponential average";
    Pg => "pg", "pages/s", INCREASING, "Pages swapped in + out per second, 1 min exponential average";
    Io => "io", "KB/s", INCREASING, "Disk I/O of whole disks, 1 min exponential average";
    Ls => "ls", "users", INCREASING, "Distinct users logged in";
    It => "it", "minutes", DECREASING, "Idle time of the keyboards, mice and terminals";
    Tmp => "tmp", "MB", DECREASING, "Space available in /tmp";
    Swp => "swp", "MB", DECREASING, "Free swap space", meminfo: |m| m.swap_free;
    Mem => "mem", "MB", DECREASING, "Available memory (MemAvailable)", meminfo: space::available;
    Ncpus => "ncpus", "cpus", DECREASING, "Online CPUs";
    Maxmem => "maxmem", "MB", DECREASING, "Total memory", meminfo: |m| m.mem_total;
    Maxswp => "maxswp", "MB", DECREASING, "Total swap space", meminfo: |m| m.swap_total;
    Maxtmp => "maxtmp", "MB", DECREASING, "Size of the /tmp file system";
    CpuPsi => "cpu_psi", "%", INCREASING, "CPU pressure stall, some avg10";
    MemPsi => "mem_psi", "%", INCREASING, "Memory pressure stall, some avg10";
    IoPsi => "io_psi", "%", INCREASING, "I/O pressure stall, some avg10";
    Ngpus => "ngpus", "gpus", DECREASING, "NVIDIA GPUs";
    NgpusFree => "ngpus_free", "gpus", DECREASING, "NVIDIA GPUs with no compute process";
    GpuUt => "gpu_ut", "%", INCREASING, "Mean GPU utilisation";
    GpuMemFree => "gpu_mem_free", "MB", DECREASING, "Free GPU memory, all GPUs together";
}

/// Every index this module can serve, GPU and PSI ones included.
pub fn catalogue() -> &'static [IndexInfo] {
    &CATALOGUE
}

fn position(index: &str) -> Option<usize> {
    CATALOGUE.iter().position(|i| i.name == index)
}

/// Bytes per LSF "MB".
pub(crate) const MIB: f64 = 1024.0 * 1024.0;

/// The state of one index.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Slot {
    /// This host has no such index, and why.
    Absent(String),
    Have(Reading),
}

/// The latest reading of every index.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Slots(Vec<Slot>);

impl Slots {
    fn new() -> Self {
        Self(vec![
            Slot::Have(Reading::Pending("no sample yet".into()));
            COUNT
        ])
    }

    pub(crate) fn ok(&mut self, ix: Ix, v: f64) {
        self.0[ix as usize] = Slot::Have(Reading::Ok(Value::Numeric(v)));
    }

    pub(crate) fn pending(&mut self, ix: Ix, why: &str) {
        self.0[ix as usize] = Slot::Have(Reading::Pending(why.to_owned()));
    }

    /// An interval that gave no rate (counter reset): the average stands if there is one.
    pub(crate) fn hold(&mut self, ix: Ix, average: Option<f64>, why: &str) {
        match average {
            Some(v) => self.ok(ix, v),
            None => self.pending(ix, why),
        }
    }

    /// Every index in `ixs` fails with the one shared `reason` (typed where the collector's
    /// error is at hand).
    pub(crate) fn fail(&mut self, ixs: &[Ix], reason: impl Into<Failure>) {
        let reason = reason.into();
        for &ix in ixs {
            self.0[ix as usize] = Slot::Have(Reading::Failed(reason.clone()));
        }
    }

    pub(crate) fn absent(&mut self, ixs: &[Ix], reason: &str) {
        for &ix in ixs {
            self.0[ix as usize] = Slot::Absent(reason.to_owned());
        }
    }

    /// Back from absent (e.g. the fixture root changed) to pending.
    pub(crate) fn present(&mut self, ixs: &[Ix]) {
        for &ix in ixs {
            if matches!(self.0[ix as usize], Slot::Absent(_)) {
                self.0[ix as usize] = Slot::Have(Reading::Pending("no sample yet".into()));
            }
        }
    }

    fn reading(&self, index: &str) -> Option<Reading> {
        match &self.0[position(index)?] {
            Slot::Have(r) => Some(r.clone()),
            Slot::Absent(_) => None,
        }
    }

    fn absent_reason(&self, index: &str) -> Option<String> {
        match &self.0[position(index)?] {
            Slot::Absent(why) => Some(why.clone()),
            Slot::Have(_) => None,
        }
    }
}

/// One tick of a source's sampling: where its files are, the buffer they are read into, the
/// tick's time, and the slots its values go to. Every `/proc` source starts the same way,
/// [`Tick::proc`].
pub(crate) struct Tick<'a> {
    pub(crate) roots: &'a Roots,
    pub(crate) buf: &'a mut Vec<u8>,
    pub(crate) now: Instant,
    pub(crate) slots: &'a mut Slots,
}

impl Tick<'_> {
    /// `/proc/<file>` read into the buffer and given to `parse` with its path (for its errors).
    pub(crate) fn proc<T>(
        &mut self,
        file: &str,
        parse: impl FnOnce(&Path, &[u8]) -> Result<T, ReadError>,
    ) -> Result<T, ReadError> {
        let path = self.roots.proc.join(file);
        read_file(&path, self.buf)?;
        parse(&path, self.buf)
    }

    /// `/proc/<file>` as procfs parses it.
    pub(crate) fn procfs<T: procfs::FromRead>(&mut self, file: &str) -> Result<T, ReadError> {
        self.proc(file, |path, bytes| {
            T::from_read(bytes).map_err(|e| ReadError::parse(path, e))
        })
    }
}

/// Reads a whole file into a reused buffer; the error names the file.
pub(crate) fn read_file(path: &Path, buf: &mut Vec<u8>) -> Result<(), ReadError> {
    use std::io::Read;
    buf.clear();
    std::fs::File::open(path)
        .and_then(|mut f| f.read_to_end(buf))
        .map(drop)
        .map_err(|source| ReadError::Io {
            path: path.to_owned(),
            source,
        })
}

/// Why a source file gave no data.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReadError {
    #[error("cannot read {}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot parse {}: {what}", path.display())]
    Parse { path: PathBuf, what: String },
}

impl ReadError {
    pub(crate) fn parse(path: &Path, what: impl fmt::Display) -> Self {
        ReadError::Parse {
            path: path.to_owned(),
            what: what.to_string(),
        }
    }

    pub(crate) fn is_not_found(&self) -> bool {
        matches!(self, ReadError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
    }
}

/// Wall-clock time for `it` (atimes are wall-clock). Tests pin it to an `Instant`.
#[derive(Debug, Clone, Copy)]
enum Clock {
    Real,
    Pinned { at: Instant, wall: SystemTime },
}

impl Clock {
    fn wall(self, now: Instant) -> SystemTime {
        match self {
            Clock::Real => SystemTime::now(),
            Clock::Pinned { at, wall } => {
                if now >= at {
                    wall + (now - at)
                } else {
                    wall - (at - now)
                }
            }
        }
    }
}

/// The shared sampler: all builtin indices from one read of each source per tick.
pub struct Sampler {
    roots: Roots,
    clock: Clock,
    slots: Slots,
    buf: Vec<u8>,
    runqueue: loadavg::RunQueue,
    cpu: cpu::Cpu,
    paging: paging::Paging,
    disk_io: disk_io::DiskIo,
    psi: psi::Psi,
    gpu: gpu::Gpu,
}

impl Sampler {
    pub fn new(roots: Roots) -> Self {
        Self::with_clock(roots, Clock::Real)
    }

    /// A sampler whose wall clock reads `wall` at `at` (for `it` in tests).
    pub fn new_pinned(roots: Roots, at: Instant, wall: SystemTime) -> Self {
        Self::with_clock(roots, Clock::Pinned { at, wall })
    }

    fn with_clock(roots: Roots, clock: Clock) -> Self {
        let mut slots = Slots::new();
        let psi = psi::Psi::new(&roots, &mut slots);
        let gpu = gpu::Gpu::load(&roots.nvml, &mut slots);
        Self {
            roots,
            clock,
            slots,
            buf: Vec::with_capacity(16 * 1024),
            runqueue: loadavg::RunQueue::new(),
            cpu: cpu::Cpu::new(),
            paging: paging::Paging::new(),
            disk_io: disk_io::DiskIo::new(),
            psi,
            gpu,
        }
    }

    /// The 5 s work: the run queue.
    pub fn fast_tick(&mut self, now: Instant) {
        self.runqueue.sample(&mut Tick {
            roots: &self.roots,
            buf: &mut self.buf,
            now,
            slots: &mut self.slots,
        });
    }

    /// The 15 s work: everything but the run queue.
    pub fn slow_tick(&mut self, now: Instant) {
        let mut tick = Tick {
            roots: &self.roots,
            buf: &mut self.buf,
            now,
            slots: &mut self.slots,
        };
        self.cpu.sample(&mut tick);
        self.paging.sample(&mut tick);
        self.disk_io.sample(&mut tick);
        space::sample_memory(&mut tick);
        space::sample_tmp(tick.roots, tick.slots);
        // One read of logind/utmp: `ls` and the login terminals `it` stats.
        let login_ttys = users::sample(tick.roots, tick.buf, tick.slots);
        idle::sample(
            tick.roots,
            &login_ttys,
            tick.buf,
            self.clock.wall(now),
            tick.slots,
        );
        self.psi.sample(&mut tick);
        self.gpu.sample(tick.slots);
    }

    /// `None`: no such index on this host (or not an index at all).
    pub fn reading(&self, index: &str) -> Option<Reading> {
        self.slots.reading(index)
    }

    /// Why `index` is not on this host; `None` when it is (or is not an index at all).
    pub fn absent_reason(&self, index: &str) -> Option<String> {
        self.slots.absent_reason(index)
    }

    /// Read from other roots from now on (tests step fixture snapshots t0 -> t1). The
    /// series keep their history, as they would across ticks on a live host.
    pub fn set_roots(&mut self, roots: Roots) {
        self.psi = psi::Psi::new(&roots, &mut self.slots);
        self.disk_io.forget_disk_kinds();
        self.roots = roots;
    }

    pub fn snapshot(&self, taken_at: SystemTime) -> Snapshot {
        Snapshot {
            taken_at,
            slots: self.slots.clone(),
        }
    }
}

/// Every index's reading at one moment, shared by all builtin probes.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    pub taken_at: SystemTime,
    slots: Slots,
}

impl Snapshot {
    /// Every index in the same state (before the first tick, or after a crashed one).
    fn uniform(reading: Reading) -> Self {
        Snapshot {
            taken_at: SystemTime::now(),
            slots: Slots(vec![Slot::Have(reading); COUNT]),
        }
    }

    /// `None`: no such index on this host (see [`Snapshot::absent_reason`]).
    pub fn reading(&self, index: &str) -> Option<Reading> {
        self.slots.reading(index)
    }

    pub fn absent_reason(&self, index: &str) -> Option<String> {
        self.slots.absent_reason(index)
    }
}

/// Runs one tick off the async runtime: a hung NFS /tmp or a slow GPU driver must not block it.
async fn tick_blocking(mut sampler: Sampler, now: Instant, slow: bool) -> Result<Sampler, String> {
    tokio::task::spawn_blocking(move || {
        sampler.fast_tick(now);
        if slow {
            sampler.slow_tick(now);
        }
        sampler
    })
    .await
    .map_err(|e| e.to_string())
}

/// The fast tick (the run queue, from /proc/loadavg: procfs, which no hung mount can block)
/// where the sampler's task runs: two of every three ticks then cost one wake-up of the
/// runtime instead of three (a blocking-pool thread woken, and the runtime woken back by it;
/// BENCHMARKS.md section 23). A panic is reported as the blocking pool reports one.
fn fast_tick_here(mut sampler: Sampler, now: Instant) -> Result<Sampler, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        sampler.fast_tick(now);
        sampler
    }))
    .map_err(|panic| {
        let text = panic.downcast_ref::<&str>().map(|s| s.to_string());
        text.or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic".into())
    })
}

/// The shared sampler as a tokio task: one read of /proc per tick for all builtin resources.
/// The first snapshot says `pending` until the first tick is done.
pub fn spawn(roots: Roots, shutdown: CancellationToken) -> watch::Receiver<Arc<Snapshot>> {
    let (tx, rx) = watch::channel(Arc::new(Snapshot::uniform(Reading::Pending(
        "sampler starting".into(),
    ))));
    tokio::spawn(async move {
        let make = || {
            let roots = roots.clone();
            tokio::task::spawn_blocking(move || Sampler::new(roots))
        };
        let Ok(mut sampler) = make().await else {
            tracing::error!("builtin sampler failed to start");
            return;
        };
        // Ticks FAST_TICK apart, the first at once; a late tick moves the later ones.
        let mut next = tokio::time::Instant::now();
        for n in 0u64.. {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = crate::timer::sleep_until(next) => {}
            }
            next = (next + FAST_TICK).max(tokio::time::Instant::now());
            let ticked = if n % SLOW_EVERY == 0 {
                tick_blocking(sampler, Instant::now(), true).await
            } else {
                fast_tick_here(sampler, Instant::now())
            };
            sampler = match ticked {
                Ok(s) => s,
                Err(e) => {
                    // A panic in one tick loses the series history, not the sampler.
                    tracing::error!("builtin sampler tick failed: {e}; restarting the sampler");
                    match make().await {
                        Ok(s) => s,
                        Err(_) => return,
                    }
                }
            };
            tx.send_replace(Arc::new(sampler.snapshot(SystemTime::now())));
        }
    });
    rx
}

/// For `xce-agent --once`: sample, wait `window`, sample again, so rates have a value.
/// The averages are seeded from their first sample, as LSF's are: after a 1 s window the
/// rates (`ut pg io`) are the rate over that second, and `r15s r1m r15m` are barely more
/// than the instantaneous run queue. A zero window leaves the rates `pending`.
pub async fn sample_once(roots: Roots, window: Duration) -> Snapshot {
    let first = tokio::task::spawn_blocking(move || {
        let mut s = Sampler::new(roots);
        let now = Instant::now();
        s.fast_tick(now);
        s.slow_tick(now);
        s
    })
    .await;
    let Ok(sampler) = first else {
        return Snapshot::uniform(Reading::Failed("builtin sampler crashed".into()));
    };
    if window.is_zero() {
        return sampler.snapshot(SystemTime::now());
    }
    tokio::time::sleep(window).await;
    match tick_blocking(sampler, Instant::now(), true).await {
        Ok(s) => s.snapshot(SystemTime::now()),
        Err(_) => Snapshot::uniform(Reading::Failed("builtin sampler crashed".into())),
    }
}

impl crate::probe::BuiltinSource for Snapshot {
    fn reading(&self, index: &str) -> Option<Reading> {
        Snapshot::reading(self, index)
    }
}

/// The daemon's source: whatever the shared sampler published last.
pub struct Live(pub watch::Receiver<Arc<Snapshot>>);

impl crate::probe::BuiltinSource for Live {
    fn reading(&self, index: &str) -> Option<Reading> {
        self.0.borrow().reading(index)
    }
}

/// Every index name this module can serve (for config validation).
pub fn index_names() -> Vec<&'static str> {
    catalogue().iter().map(|i| i.name).collect()
}
