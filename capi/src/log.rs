//! The receiver's log for the C controller (`xce_receiver_config_set_log`), in safe Rust.
//!
//! The receiver core logs through `tracing` (evictions, a host cut off over its memory share,
//! TLS refusals, revocations, a low open-file limit). A C program installs no subscriber, and
//! tracing's global default can be set once per process while a controller may start several
//! receivers: so each receiver gets a dispatcher of its own, made the default on the
//! library's threads of that receiver (the runtime's `on_thread_start`) and around the calls
//! that run the core on the caller's thread (`xce_receiver_start`, `xce_receiver_reload_tls`).
//!
//! What one receiver's log can cost its controller is bounded whatever its peers send: a
//! line is at most [`LINE_MAX`] bytes, one line (every field through
//! `xce_agent::text::sanitize`), and a token bucket lets at most [`BURST`] lines through at
//! once and [`PER_SECOND`] a second after that; the lines it drops are counted and the next
//! line that passes says how many (` suppressed=N`). Calls are serialised per receiver, and
//! none comes once the receiver is stopped.

#![allow(non_camel_case_types)]

use std::cell::RefCell;
use std::ffi::{CStr, CString};
use std::fmt::{self, Write as _};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tracing::dispatcher::DefaultGuard;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Dispatch, Event, Level, Metadata, Subscriber};

/// The longest line handed to the callback, in bytes (without its NUL).
pub const LINE_MAX: usize = 1024;
/// Lines one receiver may log at once before the rate limit holds it to [`PER_SECOND`].
pub const BURST: u32 = 100;
/// Lines a second one receiver may log, on average, after its burst.
pub const PER_SECOND: u32 = 10;

/// How much a log line matters (the tracing levels).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum xce_log_level {
    /// Something failed: a connection dropped for a fault, an accept failure.
    XCE_LOG_ERROR = 1,
    /// Worth an operator's look: an eviction, a host connecting again, a low fd limit.
    XCE_LOG_WARN = 2,
    /// The ordinary life of connections: an agent connected or disconnected.
    XCE_LOG_INFO = 3,
    XCE_LOG_DEBUG = 4,
    XCE_LOG_TRACE = 5,
}

impl xce_log_level {
    /// The level for a C `int`; `None` outside 1..=5.
    pub fn from_code(code: i32) -> Option<Self> {
        use xce_log_level::*;
        [
            XCE_LOG_ERROR,
            XCE_LOG_WARN,
            XCE_LOG_INFO,
            XCE_LOG_DEBUG,
            XCE_LOG_TRACE,
        ]
        .into_iter()
        .find(|l| *l as i32 == code)
    }

    fn of(level: &Level) -> Self {
        match *level {
            Level::ERROR => Self::XCE_LOG_ERROR,
            Level::WARN => Self::XCE_LOG_WARN,
            Level::INFO => Self::XCE_LOG_INFO,
            Level::DEBUG => Self::XCE_LOG_DEBUG,
            Level::TRACE => Self::XCE_LOG_TRACE,
        }
    }
}

/// Where one receiver's lines go: the C callback behind a safe closure (ffi.rs makes it).
pub type LineSink = Arc<dyn Fn(xce_log_level, &CStr) + Send + Sync>;

/// The log a configuration asks for.
#[derive(Clone)]
pub struct LogConfig {
    pub sink: LineSink,
    /// Lines at this level or more severe are passed.
    pub min_level: xce_log_level,
}

impl fmt::Debug for LogConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LogConfig")
            .field("min_level", &self.min_level)
            .finish_non_exhaustive()
    }
}

/// A token bucket in lines: [`BURST`] at once, [`PER_SECOND`] a second after that.
#[derive(Debug)]
pub struct Limiter {
    /// Tokens in thousandths of a line (integers: no rounding drift).
    milli_tokens: u64,
    last: Instant,
    suppressed: u64,
}

/// What the limiter says of one line.
#[derive(Debug, PartialEq, Eq)]
pub enum Admit {
    /// Pass it, saying how many lines were dropped since the last one passed.
    Pass {
        suppressed: u64,
    },
    Drop,
}

impl Limiter {
    pub fn new(now: Instant) -> Self {
        Self {
            milli_tokens: u64::from(BURST) * 1000,
            last: now,
            suppressed: 0,
        }
    }

    pub fn admit(&mut self, now: Instant) -> Admit {
        let elapsed = now.saturating_duration_since(self.last);
        let refill = elapsed
            .as_millis()
            .saturating_mul(u128::from(PER_SECOND))
            .min(u128::from(u64::MAX)) as u64;
        if refill > 0 {
            self.milli_tokens = self
                .milli_tokens
                .saturating_add(refill)
                .min(u64::from(BURST) * 1000);
            self.last = now;
        }
        if self.milli_tokens < 1000 {
            self.suppressed = self.suppressed.saturating_add(1);
            return Admit::Drop;
        }
        self.milli_tokens -= 1000;
        Admit::Pass {
            suppressed: std::mem::take(&mut self.suppressed),
        }
    }
}

/// A `fmt::Write` that keeps at most `cap` bytes and then refuses more, so that formatting a
/// huge value stops early rather than being built in full and then cut.
struct Capped {
    text: String,
    cap: usize,
}

impl fmt::Write for Capped {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let room = self.cap.saturating_sub(self.text.len());
        if s.len() <= room {
            self.text.push_str(s);
            return Ok(());
        }
        self.text.push_str(&s[..floor_char_boundary(s, room)]);
        Err(fmt::Error)
    }
}

fn floor_char_boundary(s: &str, at: usize) -> usize {
    let mut i = at.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// One event's fields: the message, then `name=value` for each other field in order.
#[derive(Default)]
struct Fields {
    message: String,
    rest: String,
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        // A value longer than a whole line cannot show more than a line's worth.
        let mut raw = Capped {
            text: String::new(),
            cap: LINE_MAX,
        };
        let _ = write!(raw, "{value:?}");
        let text = xce_agent::text::sanitize(&raw.text);
        if field.name() == "message" {
            self.message.push_str(&text);
        } else if self.rest.len() < LINE_MAX {
            let _ = write!(self.rest, " {}={text}", field.name());
        }
    }
}

/// The line for an event: `message key=value ...`, cut to fit [`LINE_MAX`] with the
/// ` suppressed=N` note (when lines were dropped before it) always kept whole.
fn render(event: &Event<'_>, suppressed: u64) -> String {
    let mut fields = Fields::default();
    event.record(&mut fields);
    let note = if suppressed > 0 {
        format!(" suppressed={suppressed}")
    } else {
        String::new()
    };
    let mut line = fields.message;
    line.push_str(&fields.rest);
    clip(&mut line, LINE_MAX - note.len());
    line.push_str(&note);
    line
}

/// Cut `line` to at most `max` bytes on a character boundary, ending in "..." if cut.
fn clip(line: &mut String, max: usize) {
    if line.len() <= max {
        return;
    }
    let keep = floor_char_boundary(line, max.saturating_sub(3));
    line.truncate(keep);
    line.push_str("...");
}

/// What one receiver's dispatcher and the receiver share.
struct LogShared {
    sink: LineSink,
    state: Mutex<LogState>,
}

struct LogState {
    limiter: Limiter,
    /// Set by `ReceiverLog::close`: no callback after the receiver stopped.
    closed: bool,
}

impl LogShared {
    fn state(&self) -> MutexGuard<'_, LogState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The tracing subscriber of one receiver: events at `min_level` or above become lines.
/// Spans carry nothing the receiver logs, so they are accepted and forgotten.
struct LineSubscriber {
    shared: Arc<LogShared>,
    min_level: Level,
}

impl Subscriber for LineSubscriber {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        // tracing orders levels by verbosity: ERROR is the least.
        *metadata.level() <= self.min_level
    }

    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(tracing::level_filters::LevelFilter::from_level(
            self.min_level,
        ))
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let level = xce_log_level::of(event.metadata().level());
        // Held through the callback: one call at a time per receiver, and `close` waits for
        // a call in progress.
        let mut state = self.shared.state();
        if state.closed {
            return;
        }
        let Admit::Pass { suppressed } = state.limiter.admit(Instant::now()) else {
            return;
        };
        let line = render(event, suppressed);
        // `sanitize` wrote every control character (NUL included) out as text.
        let line = CString::new(line).unwrap_or_default();
        (self.shared.sink)(level, &line);
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

/// One receiver's log: its dispatcher, to make the default where the receiver runs.
pub struct ReceiverLog {
    dispatch: Dispatch,
    shared: Arc<LogShared>,
}

impl ReceiverLog {
    pub fn new(cfg: &LogConfig) -> Self {
        let shared = Arc::new(LogShared {
            sink: Arc::clone(&cfg.sink),
            state: Mutex::new(LogState {
                limiter: Limiter::new(Instant::now()),
                closed: false,
            }),
        });
        let min_level = match cfg.min_level {
            xce_log_level::XCE_LOG_ERROR => Level::ERROR,
            xce_log_level::XCE_LOG_WARN => Level::WARN,
            xce_log_level::XCE_LOG_INFO => Level::INFO,
            xce_log_level::XCE_LOG_DEBUG => Level::DEBUG,
            xce_log_level::XCE_LOG_TRACE => Level::TRACE,
        };
        let subscriber = LineSubscriber {
            shared: Arc::clone(&shared),
            min_level,
        };
        Self {
            dispatch: Dispatch::new(subscriber),
            shared,
        }
    }

    pub fn dispatch(&self) -> &Dispatch {
        &self.dispatch
    }

    /// No line from now on; waits for a callback in progress to return.
    pub fn close(&self) {
        self.shared.state().closed = true;
    }
}

/// Run `f` with `log` (if any) as the thread's default dispatcher.
pub fn with_log<T>(log: Option<&ReceiverLog>, f: impl FnOnce() -> T) -> T {
    match log {
        Some(l) => tracing::dispatcher::with_default(&l.dispatch, f),
        None => f(),
    }
}

thread_local! {
    /// On a library thread: its receiver's dispatcher, the default until the thread stops.
    static THREAD_LOG: RefCell<Option<DefaultGuard>> = const { RefCell::new(None) };
}

/// Called as a library thread starts: its events go to `dispatch` from now on.
pub fn enter_thread(dispatch: &Dispatch) {
    let guard = tracing::dispatcher::set_default(dispatch);
    let _ = THREAD_LOG.try_with(|g| *g.borrow_mut() = Some(guard));
}

/// Called as a library thread stops: the dispatcher is let go.
pub fn leave_thread() {
    let _ = THREAD_LOG.try_with(|g| g.borrow_mut().take());
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    /// How long the limiter takes to earn one line back.
    fn refill_one() -> Duration {
        Duration::from_millis(1000 / u64::from(PER_SECOND))
    }

    #[test]
    fn the_limiter_passes_a_burst_then_counts_what_it_drops_into_the_next_line() {
        let t0 = Instant::now();
        let mut l = Limiter::new(t0);
        for _ in 0..BURST {
            assert_eq!(l.admit(t0), Admit::Pass { suppressed: 0 });
        }
        for _ in 0..7 {
            assert_eq!(l.admit(t0), Admit::Drop);
        }
        // One line's worth of time earns exactly one line, which reports the seven.
        let t1 = t0 + refill_one();
        assert_eq!(l.admit(t1), Admit::Pass { suppressed: 7 });
        assert_eq!(l.admit(t1), Admit::Drop);
        // A long quiet refills the burst and no more.
        let t2 = t1 + Duration::from_secs(3600);
        for _ in 0..BURST {
            assert!(matches!(l.admit(t2), Admit::Pass { .. }));
        }
        assert_eq!(l.admit(t2), Admit::Drop);
    }

    #[test]
    fn a_clock_that_goes_back_earns_nothing() {
        let t0 = Instant::now() + Duration::from_secs(10);
        let mut l = Limiter::new(t0);
        for _ in 0..BURST {
            l.admit(t0);
        }
        assert_eq!(l.admit(t0 - Duration::from_secs(5)), Admit::Drop);
    }

    /// A receiver's log with a channel for a sink, as the default on this thread.
    fn logged(min: xce_log_level, f: impl FnOnce()) -> Vec<(xce_log_level, String)> {
        let (tx, rx) = mpsc::channel();
        let tx = Mutex::new(tx);
        let log = ReceiverLog::new(&LogConfig {
            sink: Arc::new(move |level, line: &CStr| {
                let _ = tx
                    .lock()
                    .unwrap()
                    .send((level, line.to_string_lossy().into_owned()));
            }),
            min_level: min,
        });
        with_log(Some(&log), f);
        log.close();
        rx.try_iter().collect()
    }

    #[test]
    fn a_line_is_the_message_then_its_fields_sanitised_and_filtered_by_level() {
        let lines = logged(xce_log_level::XCE_LOG_WARN, || {
            tracing::info!("not passed: below the level");
            tracing::warn!(peer = "10.0.0.1:5", used = 7, "host\ncut off");
            tracing::error!(error = %"bad\u{1b}[31m", "dropping agent connection");
        });
        assert_eq!(
            lines,
            vec![
                (
                    xce_log_level::XCE_LOG_WARN,
                    "host\\ncut off peer=\"10.0.0.1:5\" used=7".to_owned()
                ),
                (
                    xce_log_level::XCE_LOG_ERROR,
                    "dropping agent connection error=bad\\u{1b}[31m".to_owned()
                ),
            ]
        );
    }

    #[test]
    fn a_huge_field_is_clipped_to_one_line_of_line_max_bytes() {
        let huge = "é".repeat(100_000);
        let lines = logged(xce_log_level::XCE_LOG_ERROR, || {
            tracing::error!(text = %huge, "first {}", "x".repeat(3000));
        });
        let (_, line) = &lines[0];
        assert!(line.len() <= LINE_MAX, "{} bytes", line.len());
        assert!(
            line.starts_with("first xxx") && line.ends_with("..."),
            "{line}"
        );
    }

    #[test]
    fn after_close_no_line_is_delivered() {
        let (tx, rx) = mpsc::channel::<String>();
        let tx = Mutex::new(tx);
        let log = ReceiverLog::new(&LogConfig {
            sink: Arc::new(move |_, line: &CStr| {
                let _ = tx.lock().unwrap().send(line.to_string_lossy().into_owned());
            }),
            min_level: xce_log_level::XCE_LOG_TRACE,
        });
        log.close();
        with_log(Some(&log), || tracing::error!("after the stop"));
        assert!(rx.try_iter().next().is_none());
    }
}
