//! The one supervision loop of a started child, for an exec run, a stream's long life and
//! a stream's first values alike: read both pipes, notice the exit, send `stdin: signal`
//! ticks, bound a stream's read rate, watch for silence, and end at the deadline, a
//! cancellation, the stdout cap, or when the caller has what it wants. However it ends,
//! the one termination routine ([`Child::terminate`]: SIGTERM to the group, output still
//! read during the grace, SIGKILL and `cgroup.kill`) and [`Child::end_rest`] finish it, so
//! no caller can leave a process behind or wait on a pipe past the grace and a short drain.

use std::time::Duration;

use tokio::time::{sleep_until, Instant};
use tokio_util::sync::CancellationToken;

use super::{Child, Got, Reader, Tick, AFTER_KILL_DRAIN};

/// How a child is watched (see the module's text).
pub struct Watch<'a> {
    /// When the run ends, exited or not (an exec run's timeout, a first-values wait).
    pub deadline: Option<Instant>,
    pub cancel: Option<&'a CancellationToken>,
    pub ticks: Ticks,
    /// Most stdout read per second: past it reading pauses until the second is over.
    pub bytes_per_sec: Option<usize>,
    /// Silent (no [`Flow::Heard`]) this long: the caller hears [`Event::Silent`].
    pub silence: Option<Duration>,
    pub after_exit: AfterExit,
    /// More stdout than the reader keeps ends the run (an exec run's output cap).
    pub cap_ends_it: bool,
    /// SIGTERM to SIGKILL.
    pub grace: Duration,
    /// Written to stdin before SIGTERM, and the child given the grace to exit by itself
    /// (a Grid Engine load sensor's `quit`).
    pub goodbye: Option<&'a [u8]>,
    /// First wait this long for the exit alone: a short run's output is then whole in its
    /// pipes, read without registering them with the reactor (an exec run).
    pub quick_exit: Option<Duration>,
}

/// How long an exec run's exit is waited for before its pipes are watched too: most
/// scripts that print a line are done within it; one that writes more than a pipe holds
/// waits at most this long for its first read.
pub const QUICK_EXIT: Duration = Duration::from_millis(10);

impl Watch<'_> {
    /// An exec run: read to the end or to `deadline`, ending at the stdout cap.
    pub fn run_until(deadline: Instant, grace: Duration) -> Self {
        Self {
            deadline: Some(deadline),
            cancel: None,
            ticks: Ticks::None,
            bytes_per_sec: None,
            silence: None,
            after_exit: AfterExit::ReadToDeadline,
            cap_ends_it: true,
            grace,
            goodbye: None,
            quick_exit: Some(QUICK_EXIT),
        }
    }
}

/// `stdin: signal` ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ticks {
    None,
    /// One when the child starts (a stream's first values).
    Once,
    /// One when the child starts and one every interval after.
    Every(Duration),
}

/// What the leader's exit means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterExit {
    /// An exec run: its output is read until the pipes close or the deadline (a background
    /// process that keeps them open makes it a timeout).
    ReadToDeadline,
    /// A stream: the rest of the group and cgroup goes with the leader; what they wrote is
    /// still read for [`AFTER_KILL_DRAIN`], never waited on.
    EndTheRest,
}

/// What the driver tells the caller.
#[derive(Debug)]
pub enum Event<'a> {
    Stdout(&'a [u8]),
    Stderr(&'a [u8]),
    /// A tick the child had not read room for was dropped (never waited on).
    TickDropped,
    /// Silent for the watch's `silence`; the caller says whether that ends the run.
    Silent,
}

/// The caller's answer to an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Continue,
    /// The child said something that counts (silence is measured from here).
    Heard,
    /// The caller has what it wants (or a silent child is to be restarted): end the run.
    Stop,
}

/// Why the run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// The leader exited and its output was read.
    Exited,
    Deadline,
    /// More stdout than the cap.
    Overflow,
    Cancelled,
    /// The caller said [`Flow::Stop`].
    Stopped,
}

/// How a driven run ended, once the child and the rest of its group are gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Driven {
    pub ended: Ended,
    /// The leader exited before the run ended (an exec run's timeout then says a
    /// background process kept its output open).
    pub exited_before_end: bool,
    /// SIGTERM's grace passed and SIGKILL was needed.
    pub killed: bool,
}

/// Watch `child` until its run ends (see the module's text), telling `on_event` what it
/// says.
pub async fn drive(
    child: &mut Child,
    reader: &mut Reader,
    watch: &Watch<'_>,
    mut on_event: impl FnMut(Event<'_>) -> Flow,
) -> Driven {
    let far = || Instant::now() + Duration::from_secs(366 * 86_400);
    let deadline = watch.deadline.unwrap_or_else(far);
    let mut ticks = match watch.ticks {
        Ticks::Every(every) => {
            let mut t = tokio::time::interval(every);
            t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            Some(t)
        }
        Ticks::Once => {
            // A child that exited at once is found by the loop.
            if child.tick() == Tick::Dropped {
                on_event(Event::TickDropped);
            }
            None
        }
        Ticks::None => None,
    };
    let silence = watch.silence;
    let mut silent_until = silence.map_or_else(far, |s| Instant::now() + s);
    let mut rate = Rate::new(watch.bytes_per_sec);
    // Set when the leader exits and the rest is ended: its last output is read until then.
    let mut drain_until: Option<Instant> = None;
    let mut exited_before_end = false;
    if let Some(quick) = watch.quick_exit {
        let until = (Instant::now() + quick).min(deadline);
        tokio::select! {
            _ = child.wait() => {
                exited_before_end = true;
                drain_until = after_exit(child, watch);
            }
            _ = sleep_until(until) => {}
        }
    }
    let ended = loop {
        child.let_go_if_exec();
        if child.exited() && !reader.open() {
            break Ended::Exited;
        }
        // What is already in a pipe not yet registered is read first, without the reactor.
        let ready = match rate.paused_until {
            None => reader.read_ready(),
            Some(_) => None,
        };
        if let Some(got) = ready {
            match took(got, reader, watch, &mut rate, &mut on_event) {
                Ok(Flow::Continue) => continue,
                Ok(Flow::Heard) => {
                    silent_until = silence.map_or_else(far, |s| Instant::now() + s);
                    continue;
                }
                Ok(Flow::Stop) => break Ended::Stopped,
                Err(ended) => break ended,
            }
        }
        let cancelled = async {
            match watch.cancel {
                Some(c) => c.cancelled().await,
                None => std::future::pending().await,
            }
        };
        let tick = async {
            match &mut ticks {
                Some(t) => t.tick().await,
                None => std::future::pending().await,
            }
        };
        let flow = tokio::select! {
            _ = cancelled => break Ended::Cancelled,
            _ = sleep_until(deadline) => break Ended::Deadline,
            _ = sleep_until(rate.paused_until.unwrap_or(deadline)), if rate.paused_until.is_some() => {
                rate.resume();
                Flow::Continue
            }
            got = reader.next(), if reader.open() && rate.paused_until.is_none() => {
                match took(got, reader, watch, &mut rate, &mut on_event) {
                    Ok(flow) => flow,
                    Err(ended) => break ended,
                }
            }
            _ = child.wait(), if !child.exited() => {
                exited_before_end = true;
                drain_until = after_exit(child, watch);
                Flow::Continue
            }
            _ = sleep_until(drain_until.unwrap_or(deadline)), if drain_until.is_some() => break Ended::Exited,
            _ = tick => {
                if child.tick() == Tick::Dropped {
                    on_event(Event::TickDropped)
                } else {
                    Flow::Continue
                }
            }
            _ = sleep_until(silent_until), if silence.is_some() => {
                silent_until = silence.map_or_else(far, |s| Instant::now() + s);
                on_event(Event::Silent)
            }
        };
        match flow {
            Flow::Continue => {}
            Flow::Heard => silent_until = silence.map_or_else(far, |s| Instant::now() + s),
            Flow::Stop => break Ended::Stopped,
        }
    };
    // The pipes stay open while the child is stopped: closing them first would turn a
    // clean TERM exit into SIGPIPE.
    let killed = match ended {
        Ended::Exited => false,
        // The leader exited and the rest of its group went with it then.
        _ if drain_until.is_some() => false,
        _ => stop(child, reader, watch).await,
    };
    child.end_rest();
    Driven {
        ended,
        exited_before_end,
        killed,
    }
}

/// The leader exited: a stream's rest of the group goes with it, its last output read
/// until the returned time; an exec run reads on (see [`AfterExit`]).
fn after_exit(child: &mut Child, watch: &Watch<'_>) -> Option<Instant> {
    match watch.after_exit {
        AfterExit::EndTheRest => {
            child.end_rest();
            Some(Instant::now() + AFTER_KILL_DRAIN)
        }
        AfterExit::ReadToDeadline => None,
    }
}

/// A chunk read: the stdout cap, the read rate, and what the caller makes of it.
fn took(
    got: Got,
    reader: &Reader,
    watch: &Watch<'_>,
    rate: &mut Rate,
    on_event: &mut impl FnMut(Event<'_>) -> Flow,
) -> Result<Flow, Ended> {
    Ok(match got {
        Got::Stdout(n) => {
            if watch.cap_ends_it && reader.overflow {
                return Err(Ended::Overflow);
            }
            rate.count(n);
            on_event(Event::Stdout(reader.stdout_chunk(n)))
        }
        Got::Stderr(n) => on_event(Event::Stderr(reader.stderr_chunk(n))),
        Got::Closed => Flow::Continue,
    })
}

/// A stream's read rate: bytes this second, and when reading resumes once past the bound.
struct Rate {
    bound: Option<usize>,
    second: Instant,
    bytes: usize,
    paused_until: Option<Instant>,
}

impl Rate {
    fn new(bound: Option<usize>) -> Self {
        Self {
            bound,
            second: Instant::now(),
            bytes: 0,
            paused_until: None,
        }
    }

    fn count(&mut self, n: usize) {
        let Some(bound) = self.bound else { return };
        let now = Instant::now();
        if now.duration_since(self.second) >= Duration::from_secs(1) {
            (self.second, self.bytes) = (now, 0);
        }
        self.bytes += n;
        if self.bytes >= bound {
            self.paused_until = Some(self.second + Duration::from_secs(1));
        }
    }

    fn resume(&mut self) {
        self.paused_until = None;
        (self.second, self.bytes) = (Instant::now(), 0);
    }
}

/// End a run that is still going: the goodbye and its grace where the format has one,
/// then the one termination routine. Whether SIGKILL was needed.
async fn stop(child: &mut Child, reader: &mut Reader, watch: &Watch<'_>) -> bool {
    if let Some(goodbye) = watch.goodbye {
        if child.say(goodbye) == Tick::Sent && child.settle(reader, watch.grace).await {
            return false;
        }
    }
    child.terminate(reader, watch.grace).await
}
