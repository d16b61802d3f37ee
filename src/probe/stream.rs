//! Stream probes: a long-running process read line by line (an unmodified LSF elim works).

use std::sync::Arc;
use std::time::SystemTime;

use tokio_util::sync::CancellationToken;

use super::{Outcome, ProbeContext, ProbeRun};
use crate::plan::ProbeTask;
use crate::schedule::Stats;
use crate::store::Store;
use crate::value::Reading;

/// Keep the stream process running and its values in the store until cancelled.
pub async fn supervise(
    task: Arc<ProbeTask>,
    _ctx: ProbeContext,
    store: Arc<Store>,
    _stats: Arc<Stats>,
    cancel: CancellationToken,
) {
    for feed in &task.feeds {
        store.record(
            &feed.name,
            &task.instance,
            Reading::Failed("stream probes are not supported yet".into()),
            SystemTime::now(),
        );
    }
    cancel.cancelled().await;
}

/// `--once`: start the stream, take its first complete set of values, stop it.
pub async fn first_values(task: &ProbeTask, _ctx: &ProbeContext) -> ProbeRun {
    ProbeRun::all_failed(
        task,
        SystemTime::now(),
        Default::default(),
        Outcome::Failed,
        "stream probes are not supported yet".into(),
    )
}
