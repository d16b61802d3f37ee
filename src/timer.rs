//! The daemon's long waits (a probe's next run, the store's next sweep, the sampler's next
//! tick, the reaper's delay) on one kernel timer.
//!
//! Why: tokio's timer wheel keeps a deadline more than 64 ms away in a coarser level, and
//! wakes the runtime at that level's slot boundary to move it down: a wait of 5 s costs
//! three wake-ups (at a 4.1 s boundary, at a 64 ms one, at the deadline), a wait of 1 s two.
//! Those were most of an idle agent's wake-ups (BENCHMARKS.md section 23). A timerfd armed
//! for the earliest deadline wakes the runtime once per deadline, and the waits that fall due
//! together (the runs of one slot of the run grid, `plan::RUN_GRID`) share that wake-up.
//!
//! Per process and opt-in ([`use_kernel_timer`], called once by the daemon inside its one
//! runtime): elsewhere, tests on tokio's paused clock included, [`sleep_until`] is tokio's.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use nix::sys::time::TimeSpec;
use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::time::Instant;

static KERNEL: OnceLock<Arc<Timer>> = OnceLock::new();

/// From now on this process's [`sleep_until`] waits on one timerfd, driven by a task of the
/// current runtime. Call it once, in the runtime that runs the daemon (the fd is registered
/// with that runtime's reactor); later calls do nothing.
pub fn use_kernel_timer() -> std::io::Result<()> {
    if KERNEL.get().is_some() {
        return Ok(());
    }
    let timer = Arc::new(Timer::new()?);
    if KERNEL.set(timer.clone()).is_ok() {
        tokio::spawn(drive(timer));
    }
    Ok(())
}

/// Wait until `at`: on the kernel timer where the process chose it, else on tokio's.
pub async fn sleep_until(at: Instant) {
    match KERNEL.get() {
        Some(timer) => Sleep::new(timer.clone(), at).await,
        None => tokio::time::sleep_until(at).await,
    }
}

/// Wait `d` (saturating a year out).
pub async fn sleep(d: Duration) {
    let now = Instant::now();
    let at = now
        .checked_add(d)
        .unwrap_or_else(|| now + Duration::from_secs(366 * 86_400));
    sleep_until(at).await
}

/// tokio's `AsyncFd` takes an `AsRawFd`; nix's `TimerFd` is `AsFd`.
struct Fd(TimerFd);

impl std::os::fd::AsRawFd for Fd {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsFd as _;
        self.0.as_fd().as_raw_fd()
    }
}

struct Timer {
    /// Deadlines are rounded up to whole milliseconds from here, as tokio's wheel rounds
    /// them: the runs of one grid slot, whose deadlines each loop computes a few µs apart,
    /// then fall due at one instant and share a wake-up (never earlier than asked).
    epoch: Instant,
    fd: AsyncFd<Fd>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Who waits for what; the id tells apart waits for the same instant.
    waiting: BTreeMap<(Instant, u64), Waker>,
    next_id: u64,
    /// What the timerfd is armed for.
    armed: Option<Instant>,
}

impl Timer {
    fn new() -> std::io::Result<Self> {
        let fd = TimerFd::new(
            ClockId::CLOCK_MONOTONIC,
            TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC,
        )?;
        // SAFETY: `Fd` owns the timerfd and is moved into the `AsyncFd`, so the descriptor
        // stays open and is the same one until the `AsyncFd` (which deregisters it first) is
        // dropped; `as_raw_fd` always returns it. (The one `unsafe` here: tokio's safe
        // constructor is deprecated for lack of that guarantee.)
        let fd = unsafe { AsyncFd::register_with_interest(Fd(fd), Interest::READABLE) }
            .map_err(std::io::Error::from)?;
        Ok(Self {
            epoch: Instant::now(),
            fd,
            state: Mutex::new(State::default()),
        })
    }

    /// `at` rounded up to the next whole millisecond since `epoch`.
    fn round_up(&self, at: Instant) -> Instant {
        let since = at.saturating_duration_since(self.epoch);
        let ms = since.as_nanos().div_ceil(1_000_000);
        let rounded = Duration::from_millis(u64::try_from(ms).unwrap_or(u64::MAX));
        self.epoch.checked_add(rounded).unwrap_or(at)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Nothing under the lock can panic half-way through an update.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Arm the timerfd for `at` (an instant already past fires at once: a zero expiration
    /// would disarm it).
    fn arm(&self, state: &mut State, at: Instant) {
        let after = at
            .saturating_duration_since(Instant::now())
            .max(Duration::from_nanos(1));
        let when = Expiration::OneShot(TimeSpec::from_duration(after));
        if let Err(e) = self.fd.get_ref().0.set(when, TimerSetTimeFlags::empty()) {
            // Only for arguments the kernel refuses, which these are not; the driver's next
            // wake-up re-arms.
            tracing::error!("the agent's timer could not be armed: {e}");
        }
        state.armed = Some(at);
    }
}

/// Wakes the waits that are due each time the timerfd fires, and arms it for the next.
async fn drive(timer: Arc<Timer>) {
    loop {
        let mut ready = match timer.fd.readable().await {
            Ok(r) => r,
            Err(e) => {
                tracing::error!("the agent's timer failed: {e}");
                return;
            }
        };
        // Cleared before the read: an expiry after the read is a new edge, seen next round.
        ready.clear_ready();
        let _ = nix::unistd::read(&timer.fd.get_ref().0, &mut [0u8; 8]);
        let due = {
            let mut state = timer.lock();
            let now = Instant::now();
            let later = state.waiting.split_off(&(now + Duration::from_nanos(1), 0));
            let due = std::mem::replace(&mut state.waiting, later);
            state.armed = None;
            if let Some(&(next, _)) = state.waiting.keys().next() {
                timer.arm(&mut state, next);
            }
            due
        };
        for waker in due.into_values() {
            waker.wake();
        }
    }
}

/// One wait on the kernel timer; dropping it withdraws it.
struct Sleep {
    timer: Arc<Timer>,
    at: Instant,
    key: Option<(Instant, u64)>,
}

impl Sleep {
    fn new(timer: Arc<Timer>, at: Instant) -> Self {
        let at = timer.round_up(at);
        Self {
            timer,
            at,
            key: None,
        }
    }

    fn withdraw(&mut self) {
        if let Some(key) = self.key.take() {
            self.timer.lock().waiting.remove(&key);
        }
    }
}

impl Future for Sleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if Instant::now() >= self.at {
            self.withdraw();
            return Poll::Ready(());
        }
        let this = &mut *self;
        let mut state = this.timer.lock();
        let key = *this.key.get_or_insert_with(|| {
            state.next_id += 1;
            (this.at, state.next_id)
        });
        state
            .waiting
            .entry(key)
            .and_modify(|w| {
                if !w.will_wake(cx.waker()) {
                    w.clone_from(cx.waker());
                }
            })
            .or_insert_with(|| cx.waker().clone());
        if state.armed.is_none_or(|armed| this.at < armed) {
            this.timer.arm(&mut state, this.at);
        }
        Poll::Pending
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        self.withdraw();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a real clock (the kernel timer does not follow tokio's paused one): waits end in
    /// deadline order, a withdrawn wait is forgotten, and each ends no earlier than its
    /// deadline.
    #[tokio::test]
    async fn waits_end_at_their_deadlines_in_order_and_a_dropped_one_is_withdrawn() {
        let timer = Arc::new(Timer::new().expect("timerfd"));
        tokio::spawn(drive(timer.clone()));
        let start = Instant::now();
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut waits = Vec::new();
        for (i, ms) in [30u64, 10, 20, 10].into_iter().enumerate() {
            let (timer, order) = (timer.clone(), order.clone());
            let at = start + Duration::from_millis(ms);
            waits.push(tokio::spawn(async move {
                Sleep::new(timer, at).await;
                assert!(Instant::now() >= at, "wait {i} ended before its deadline");
                order.lock().unwrap().push(ms);
            }));
        }
        // A wait armed first and then dropped: the others still end.
        let early = Sleep::new(timer.clone(), start + Duration::from_millis(1));
        let mut early = Box::pin(early);
        assert!(futures::poll!(early.as_mut()).is_pending() || Instant::now() >= start);
        drop(early);
        for w in waits {
            w.await.expect("a wait panicked");
        }
        assert_eq!(*order.lock().unwrap(), [10, 10, 20, 30]);
        // Deadlines within one millisecond fall due together; none is moved earlier.
        let a = timer.round_up(timer.epoch + Duration::from_micros(10_100));
        let b = timer.round_up(timer.epoch + Duration::from_micros(10_900));
        assert_eq!(a, b);
        assert_eq!(a, timer.epoch + Duration::from_millis(11));
        assert!(timer.lock().waiting.is_empty(), "every wait withdrawn");
    }
}
