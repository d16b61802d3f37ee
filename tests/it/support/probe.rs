//! Probes run in this process: a planned task and the context to run it in.

use std::path::Path;
use std::sync::Arc;

use xce_agent::plan::{make_plan, ProbeTask, Spread};
use xce_agent::probe::file_reader::FileReads;
use xce_agent::probe::supervisor::Supervisor;
use xce_agent::probe::{BuiltinSource, ProbeContext};
use xce_agent::store::{self, Store};
use xce_agent::value::Reading;

use super::site::Site;

/// A builtin source with no indices, for tests that run probes through the library.
pub struct NoBuiltins;

impl BuiltinSource for NoBuiltins {
    fn reading(&self, _index: &str) -> Option<Reading> {
        None
    }
}

fn context(plugin_dir: &Path, run_as: &str) -> ProbeContext {
    ProbeContext {
        host: "node001".into(),
        plugin_dir: plugin_dir.to_owned(),
        run_as: run_as.into(),
        builtin: Arc::new(NoBuiltins),
        files: FileReads::new(32),
        supervisor: Supervisor::uncontained(),
    }
}

/// Plan `resources_yaml` for node001 and return the task named `name`, with a probe context
/// whose plugin_dir is `plugin_dir`.
pub fn task_from_yaml(
    resources_yaml: &str,
    name: &str,
    plugin_dir: &Path,
) -> (ProbeTask, ProbeContext) {
    let r = xce_agent::config::resources::parse(Path::new("resources.yaml"), resources_yaml)
        .expect("resources.yaml valid");
    let plan = make_plan(&r, "node001", &Default::default(), Spread::Host);
    let task = plan
        .tasks
        .into_iter()
        .find(|t| t.name == name)
        .expect("task planned");
    // Tests may run as root (CI): run probes as root there so temp files stay readable.
    (task, context(plugin_dir, "root"))
}

/// Load the site's config and return the planned task of `name` with a probe context.
pub fn load_task(site: &Site, name: &str) -> (ProbeTask, ProbeContext) {
    let config = xce_agent::config::load(&site.agent_yaml(), None)
        .unwrap_or_else(|e| panic!("config invalid: {e}"));
    let plan = make_plan(
        &config.resources,
        "node001",
        &Default::default(),
        config.agent.spread,
    );
    let task = plan
        .tasks
        .iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("{name} not planned: {:?}", plan.skipped))
        .clone();
    let ctx = context(&config.agent.plugin_dir, &config.agent.run_as);
    (task, ctx)
}

/// Declare every feed of `task` in `store`.
pub fn declare(store: &Store, task: &ProbeTask) {
    store.declare(task.feeds.iter().map(|f| store::Declared {
        name: f.name.clone(),
        instance: task.instance.clone(),
        valtype: f.valtype,
        stale_after: task.stale_after,
    }));
}
