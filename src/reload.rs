//! What moving to a new configuration or assignment changes, as data. [`diff`] is a pure
//! function of what runs and what the new files (or the controller's new assignment) say, in
//! the way of rathole's `calculate_events`: every rule of a reload is a row of a table test,
//! and the daemon and the scheduler only execute the [`Changes`] it returns.

use std::collections::{HashMap, HashSet};
use std::fmt;

use crate::config::AgentConfig;
use crate::plan::{Plan, ProbeTask};

/// One side of a change: agent.yaml's settings, the plan, and the link's key material as
/// loaded (compared by content: a certificate rotated under the same path is a change).
/// Generic over the material, so this layer needs nothing from the link's.
#[derive(Debug, Clone, Copy)]
pub struct State<'a, Keys> {
    pub agent: &'a AgentConfig,
    pub plan: &'a Plan,
    pub keys: Option<&'a Keys>,
}

/// A probe of a plan: its resource and instance (empty: this host's own).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ProbeKey {
    pub name: String,
    pub instance: String,
}

impl ProbeKey {
    pub fn of(task: &ProbeTask) -> Self {
        Self {
            name: task.name.clone(),
            instance: task.instance.clone(),
        }
    }
}

impl fmt::Display for ProbeKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.instance.as_str() {
            "" => f.write_str(&self.name),
            instance => write!(f, "{}[{instance}]", self.name),
        }
    }
}

/// A part of a probe's task. A change to any of them restarts the probe: each is part of
/// what it runs, when, or what its values mean.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskField {
    /// builtin, exec, file or stream.
    Kind,
    /// What the kind runs or reads (command, path, regex, format, env, limits, ...).
    Spec,
    Interval,
    Timeout,
    /// The offset within the interval (it follows the interval).
    Splay,
    StaleAfter,
    /// The resources its output feeds (`provides:`) and their valtypes.
    Feeds,
}

impl TaskField {
    pub fn as_str(self) -> &'static str {
        match self {
            TaskField::Kind => "kind",
            TaskField::Spec => "probe settings",
            TaskField::Interval => "interval",
            TaskField::Timeout => "timeout",
            TaskField::Splay => "splay",
            TaskField::StaleAfter => "stale_after",
            TaskField::Feeds => "feeds",
        }
    }
}

/// The fields of `new` that differ from `old` (empty: the same task). Name and instance are
/// the probe's identity, not fields.
pub fn changed_fields(old: &ProbeTask, new: &ProbeTask) -> Vec<TaskField> {
    // Destructured, so that a field added to `ProbeTask` does not compile until it is here.
    let ProbeTask {
        name: _,
        instance: _,
        kind,
        interval,
        timeout,
        splay,
        stale_after,
        feeds,
        dropped,
    } = new;
    let same_kind = old.kind.name() == kind.name();
    [
        (!same_kind, TaskField::Kind),
        (same_kind && old.kind != *kind, TaskField::Spec),
        (old.interval != *interval, TaskField::Interval),
        (old.timeout != *timeout, TaskField::Timeout),
        (old.splay != *splay, TaskField::Splay),
        (old.stale_after != *stale_after, TaskField::StaleAfter),
        (
            old.feeds != *feeds || old.dropped != *dropped,
            TaskField::Feeds,
        ),
    ]
    .into_iter()
    .filter_map(|(changed, field)| changed.then_some(field))
    .collect()
}

/// A field of agent.yaml that a reload can see change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setting {
    Controllers,
    Resources,
    PluginDir,
    RunAs,
    MaxParallel,
    /// Where the probes fall in their intervals: the plan is made with it.
    Spread,
    Metrics,
    StatusSocket,
    StatusGroup,
    /// The `tls:` paths or the key material they hold.
    Tls,
    InsecurePlaintext,
    MaxStuckReads,
    MaxInterval,
    TrustConfigFiles,
    ProbePidsMax,
    TlsExpiryWarning,
    Coalesce,
    ReleaseCodeAfter,
}

/// What a changed setting takes to be in effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// Every probe runs with it: every probe restarts, with fresh counters.
    RestartProbes,
    /// The link reconnects with it (and the controller re-sends its assignment).
    Reconnect,
    /// Already used when the files were loaded (resources.yaml's path, its bounds).
    Loaded,
    /// Only a restart of the agent applies it; the reload says so.
    AgentRestart,
}

impl Setting {
    /// Its name in agent.yaml.
    pub fn name(self) -> &'static str {
        match self {
            Setting::Controllers => "controllers",
            Setting::Resources => "resources",
            Setting::PluginDir => "plugin_dir",
            Setting::RunAs => "run_as",
            Setting::MaxParallel => "max_parallel",
            Setting::Spread => "spread",
            Setting::Metrics => "metrics",
            Setting::StatusSocket => "status_socket",
            Setting::StatusGroup => "status_group",
            Setting::Tls => "tls",
            Setting::InsecurePlaintext => "insecure_plaintext",
            Setting::MaxStuckReads => "max_stuck_reads",
            Setting::MaxInterval => "max_interval",
            Setting::TrustConfigFiles => "trust_config_files_of_any_owner",
            Setting::ProbePidsMax => "probe_pids_max",
            Setting::TlsExpiryWarning => "tls.expiry_warning",
            Setting::Coalesce => "coalesce",
            Setting::ReleaseCodeAfter => "release_code_after",
        }
    }

    pub fn effect(self) -> Effect {
        match self {
            Setting::PluginDir | Setting::RunAs | Setting::MaxParallel => Effect::RestartProbes,
            Setting::Controllers
            | Setting::Tls
            | Setting::InsecurePlaintext
            | Setting::Coalesce => Effect::Reconnect,
            // Bounds resources.yaml is loaded with: a probe whose limits change restarts.
            Setting::Resources
            | Setting::MaxInterval
            | Setting::ProbePidsMax
            | Setting::TrustConfigFiles
            | Setting::TlsExpiryWarning
            // The new plan is made with it: each probe whose splay moves restarts (its
            // task's `Splay` changed), the others keep running.
            | Setting::Spread
            // The next page-out is timed from the reload that read it.
            | Setting::ReleaseCodeAfter => Effect::Loaded,
            // The listeners are bound, and the stuck-read budget sized, once at start.
            Setting::Metrics
            | Setting::StatusSocket
            | Setting::StatusGroup
            | Setting::MaxStuckReads => Effect::AgentRestart,
        }
    }
}

/// The settings of `new` that differ from `old`, in agent.yaml's field order.
pub fn changed_settings<Keys: PartialEq>(old: &State<Keys>, new: &State<Keys>) -> Vec<Setting> {
    // Destructured, so that a field added to `AgentConfig` does not compile until it is here.
    let AgentConfig {
        // The same file is read again.
        path: _,
        // A different host is refused before any diff (`ReloadError::HostChanged`).
        host: _,
        controllers,
        resources,
        plugin_dir,
        run_as,
        max_parallel,
        spread,
        metrics,
        status_socket,
        status_group,
        tls,
        insecure_plaintext,
        max_stuck_reads,
        max_interval,
        trust_config_files_of_any_owner,
        probe_pids_max,
        tls_expiry_warning,
        coalesce,
        release_code_after,
    } = new.agent;
    let was = old.agent;
    [
        (was.controllers != *controllers, Setting::Controllers),
        (was.resources != *resources, Setting::Resources),
        (was.plugin_dir != *plugin_dir, Setting::PluginDir),
        (was.run_as != *run_as, Setting::RunAs),
        (was.max_parallel != *max_parallel, Setting::MaxParallel),
        (was.spread != *spread, Setting::Spread),
        (was.metrics != *metrics, Setting::Metrics),
        (was.status_socket != *status_socket, Setting::StatusSocket),
        (was.status_group != *status_group, Setting::StatusGroup),
        (was.tls != *tls || old.keys != new.keys, Setting::Tls),
        (
            was.insecure_plaintext != *insecure_plaintext,
            Setting::InsecurePlaintext,
        ),
        (
            was.max_stuck_reads != *max_stuck_reads,
            Setting::MaxStuckReads,
        ),
        (was.max_interval != *max_interval, Setting::MaxInterval),
        (
            was.trust_config_files_of_any_owner != *trust_config_files_of_any_owner,
            Setting::TrustConfigFiles,
        ),
        (was.probe_pids_max != *probe_pids_max, Setting::ProbePidsMax),
        (
            was.tls_expiry_warning != *tls_expiry_warning,
            Setting::TlsExpiryWarning,
        ),
        (was.coalesce != *coalesce, Setting::Coalesce),
        (
            was.release_code_after != *release_code_after,
            Setting::ReleaseCodeAfter,
        ),
    ]
    .into_iter()
    .filter_map(|(changed, setting)| changed.then_some(setting))
    .collect()
}

/// A probe in both plans that is stopped and started again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restart {
    pub probe: ProbeKey,
    /// What changed in its task; empty when it restarts only because a setting every probe
    /// runs with changed (see [`Changes::restarts_every_probe`]).
    pub fields: Vec<TaskField>,
}

/// Everything a move from one state to another changes. Probe lists are in plan order (the
/// new plan's; `stop` in the old one's).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    /// In both plans, unchanged: they keep their timers and running children.
    pub keep: Vec<ProbeKey>,
    /// Only in the new plan.
    pub start: Vec<ProbeKey>,
    /// Only in the old plan: stopped, their process groups killed.
    pub stop: Vec<ProbeKey>,
    pub restart: Vec<Restart>,
    /// agent.yaml settings that changed, in the file's field order.
    pub settings: Vec<Setting>,
}

impl Changes {
    /// A setting every probe runs with changed: every probe restarts.
    pub fn restarts_every_probe(&self) -> bool {
        self.with_effect(Effect::RestartProbes).next().is_some()
    }

    pub fn reconnects(&self) -> bool {
        self.with_effect(Effect::Reconnect).next().is_some()
    }

    /// The changed settings that take `effect`.
    pub fn with_effect(&self, effect: Effect) -> impl Iterator<Item = Setting> + '_ {
        self.settings
            .iter()
            .copied()
            .filter(move |s| s.effect() == effect)
    }

    /// The probes to stop: removed and restarted ones.
    pub fn to_stop(&self) -> impl Iterator<Item = &ProbeKey> {
        self.stop
            .iter()
            .chain(self.restart.iter().map(|r| &r.probe))
    }

    /// The probes to start: new and restarted ones.
    pub fn to_start(&self) -> impl Iterator<Item = &ProbeKey> {
        self.start
            .iter()
            .chain(self.restart.iter().map(|r| &r.probe))
    }
}

/// From `old` to `new`: which probes start, stop, restart (and why) or keep their timers,
/// and which settings changed.
pub fn diff<Keys: PartialEq>(old: &State<Keys>, new: &State<Keys>) -> Changes {
    let settings = changed_settings(old, new);
    let restart_all = settings.iter().any(|s| s.effect() == Effect::RestartProbes);
    Changes {
        settings,
        ..probe_changes(&old.plan.tasks, &new.plan.tasks, restart_all)
    }
}

/// The probes' part of [`diff`]: from tasks `old` to tasks `new`; with `restart_all`, no
/// probe keeps running (the settings every probe runs with changed).
pub fn probe_changes(old: &[ProbeTask], new: &[ProbeTask], restart_all: bool) -> Changes {
    // Keyed: a reload of 100,000 resources must not compare every pair.
    let running: HashMap<ProbeKey, &ProbeTask> = old.iter().map(|t| (ProbeKey::of(t), t)).collect();
    let mut changes = Changes::default();
    for task in new {
        let probe = ProbeKey::of(task);
        match running.get(&probe) {
            None => changes.start.push(probe),
            Some(was) => {
                let fields = changed_fields(was, task);
                if fields.is_empty() && !restart_all {
                    changes.keep.push(probe);
                } else {
                    changes.restart.push(Restart { probe, fields });
                }
            }
        }
    }
    let wanted: HashSet<ProbeKey> = new.iter().map(ProbeKey::of).collect();
    changes.stop = old
        .iter()
        .map(ProbeKey::of)
        .filter(|probe| !wanted.contains(probe))
        .collect();
    changes
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::Path;

    use super::*;
    use crate::config::resources;
    use crate::plan::{make_plan, Assignment};

    const AGENT: &str = "host: node001\nrun_as: nobody\n";
    const RESOURCES: &str = "resources:
  - {name: load, interval: 15s, probe: {kind: builtin, index: r1m}}
  - {name: temp, interval: 30s, probe: {kind: exec, command: [temp.sh]}}
  - {name: ver, interval: 1m, probe: {kind: file, path: /etc/ver, regex: 'v(\\d+)'}}
";

    /// Both files' text and what the side runs with.
    #[derive(Clone, Copy)]
    struct Side {
        agent: &'static str,
        resources: &'static str,
        /// Stands for the key material's content.
        keys: Option<u8>,
        assigned: &'static [(&'static str, &'static str)],
    }

    const BASE: Side = Side {
        agent: AGENT,
        resources: RESOURCES,
        keys: None,
        assigned: &[],
    };

    struct Row {
        what: &'static str,
        old: Side,
        new: Side,
        keep: &'static [&'static str],
        start: &'static [&'static str],
        stop: &'static [&'static str],
        restart: &'static [(&'static str, &'static [TaskField])],
        settings: &'static [Setting],
    }

    fn loaded(side: &Side) -> (AgentConfig, Plan) {
        let agent = crate::config::agent::parse(Path::new("/etc/xce/agent.yaml"), side.agent)
            .expect("agent.yaml parses");
        let res = resources::parse(Path::new("/etc/xce/resources.yaml"), side.resources)
            .expect("resources.yaml parses");
        let assigned: BTreeSet<Assignment> = side
            .assigned
            .iter()
            .map(|(n, i)| ((*n).to_owned(), (*i).to_owned()))
            .collect();
        let plan = make_plan(&res, "node001", &assigned, agent.spread);
        (agent, plan)
    }

    fn names(keys: &[ProbeKey]) -> Vec<String> {
        keys.iter().map(ProbeKey::to_string).collect()
    }

    fn run(rows: &[Row]) {
        for row in rows {
            let (old_agent, old_plan) = loaded(&row.old);
            let (new_agent, new_plan) = loaded(&row.new);
            let changes = diff(
                &State {
                    agent: &old_agent,
                    plan: &old_plan,
                    keys: row.old.keys.as_ref(),
                },
                &State {
                    agent: &new_agent,
                    plan: &new_plan,
                    keys: row.new.keys.as_ref(),
                },
            );
            let what = row.what;
            assert_eq!(names(&changes.keep), row.keep, "{what}: keep");
            assert_eq!(names(&changes.start), row.start, "{what}: start");
            assert_eq!(names(&changes.stop), row.stop, "{what}: stop");
            let restart: Vec<(String, Vec<TaskField>)> = changes
                .restart
                .iter()
                .map(|r| (r.probe.to_string(), r.fields.clone()))
                .collect();
            let expected: Vec<(String, Vec<TaskField>)> = row
                .restart
                .iter()
                .map(|(n, f)| ((*n).to_owned(), f.to_vec()))
                .collect();
            assert_eq!(restart, expected, "{what}: restart");
            assert_eq!(changes.settings, row.settings, "{what}: settings");
        }
    }

    const ALL: &[&str] = &["load", "temp", "ver"];

    #[test]
    fn probes_start_stop_restart_or_keep_by_what_changed_in_their_task() {
        use TaskField::*;
        run(&[
            Row {
                what: "the same files",
                old: BASE,
                new: BASE,
                keep: ALL,
                start: &[],
                stop: &[],
                restart: &[],
                settings: &[],
            },
            Row {
                what: "a new resource",
                old: BASE,
                new: Side {
                    resources: "resources:
  - {name: load, interval: 15s, probe: {kind: builtin, index: r1m}}
  - {name: temp, interval: 30s, probe: {kind: exec, command: [temp.sh]}}
  - {name: ver, interval: 1m, probe: {kind: file, path: /etc/ver, regex: 'v(\\d+)'}}
  - {name: fan, interval: 30s, probe: {kind: exec, command: [fan.sh]}}
",
                    ..BASE
                },
                keep: ALL,
                start: &["fan"],
                stop: &[],
                restart: &[],
                settings: &[],
            },
            Row {
                what: "a removed resource, the others reordered",
                old: BASE,
                new: Side {
                    resources: "resources:
  - {name: ver, interval: 1m, probe: {kind: file, path: /etc/ver, regex: 'v(\\d+)'}}
  - {name: load, interval: 15s, probe: {kind: builtin, index: r1m}}
",
                    ..BASE
                },
                keep: &["ver", "load"],
                start: &[],
                stop: &["temp"],
                restart: &[],
                settings: &[],
            },
            Row {
                what: "a longer interval moves the slot and the stale time too",
                old: BASE,
                new: Side {
                    resources: "resources:
  - {name: load, interval: 15s, probe: {kind: builtin, index: r1m}}
  - {name: temp, interval: 40s, probe: {kind: exec, command: [temp.sh]}}
  - {name: ver, interval: 1m, probe: {kind: file, path: /etc/ver, regex: 'v(\\d+)'}}
",
                    ..BASE
                },
                keep: &["load", "ver"],
                start: &[],
                stop: &[],
                restart: &[("temp", &[Interval, Splay, StaleAfter])],
                settings: &[],
            },
            Row {
                what: "a timeout (the default stale time follows it)",
                old: BASE,
                new: Side {
                    resources: "resources:
  - {name: load, interval: 15s, probe: {kind: builtin, index: r1m}}
  - {name: temp, interval: 30s, probe: {kind: exec, command: [temp.sh], timeout: 5s}}
  - {name: ver, interval: 1m, probe: {kind: file, path: /etc/ver, regex: 'v(\\d+)'}}
",
                    ..BASE
                },
                keep: &["load", "ver"],
                start: &[],
                stop: &[],
                restart: &[("temp", &[Timeout, StaleAfter])],
                settings: &[],
            },
            Row {
                what: "a command's argument, a regex and a builtin's index",
                old: BASE,
                new: Side {
                    resources: "resources:
  - {name: load, interval: 15s, probe: {kind: builtin, index: r15m}}
  - {name: temp, interval: 30s, probe: {kind: exec, command: [temp.sh, -c]}}
  - {name: ver, interval: 1m, probe: {kind: file, path: /etc/ver, regex: 'V(\\d+)'}}
",
                    ..BASE
                },
                keep: &[],
                start: &[],
                stop: &[],
                restart: &[("load", &[Spec]), ("temp", &[Spec]), ("ver", &[Spec])],
                settings: &[],
            },
            Row {
                what: "another kind of probe",
                old: BASE,
                new: Side {
                    resources: "resources:
  - {name: load, interval: 15s, probe: {kind: builtin, index: r1m}}
  - {name: temp, interval: 30s, probe: {kind: file, path: /sys/temp}}
  - {name: ver, interval: 1m, probe: {kind: file, path: /etc/ver, regex: 'v(\\d+)'}}
",
                    ..BASE
                },
                keep: &["load", "ver"],
                start: &[],
                stop: &[],
                restart: &[("temp", &[Kind])],
                settings: &[],
            },
            Row {
                what: "a valtype: what the values mean",
                old: BASE,
                new: Side {
                    resources: "resources:
  - {name: load, interval: 15s, probe: {kind: builtin, index: r1m}}
  - {name: temp, valtype: string, interval: 30s, probe: {kind: exec, command: [temp.sh]}}
  - {name: ver, interval: 1m, probe: {kind: file, path: /etc/ver, regex: 'v(\\d+)'}}
",
                    ..BASE
                },
                keep: &["load", "ver"],
                start: &[],
                stop: &[],
                restart: &[("temp", &[Feeds])],
                settings: &[],
            },
            Row {
                what: "a field the agent does not use, and a comment",
                old: BASE,
                new: Side {
                    resources: "resources:
  - {name: load, interval: 15s, desc: run queue, probe: {kind: builtin, index: r1m}}
  # the exec probe
  - {name: temp, interval: 30s, probe: {kind: exec, command: [temp.sh]}}
  - {name: ver, interval: 1m, probe: {kind: file, path: /etc/ver, regex: 'v(\\d+)'}}
",
                    ..BASE
                },
                keep: ALL,
                start: &[],
                stop: &[],
                restart: &[],
                settings: &[],
            },
        ]);
    }

    const SHARED: &str = "resources:
  - {name: load, interval: 15s, probe: {kind: builtin, index: r1m}}
  - name: pool
    interval: 30s
    probe: {kind: exec, command: [pool.sh]}
    resourcemap: [{location: [all]}]
";

    #[test]
    fn a_new_assignment_starts_or_stops_only_the_shared_instance() {
        let unassigned = Side {
            resources: SHARED,
            ..BASE
        };
        let assigned = Side {
            assigned: &[("pool", "all")],
            ..unassigned
        };
        run(&[
            Row {
                what: "assigned",
                old: unassigned,
                new: assigned,
                keep: &["load"],
                start: &["pool[all]"],
                stop: &[],
                restart: &[],
                settings: &[],
            },
            Row {
                what: "withdrawn",
                old: assigned,
                new: unassigned,
                keep: &["load"],
                start: &[],
                stop: &["pool[all]"],
                restart: &[],
                settings: &[],
            },
        ]);
    }

    #[test]
    fn settings_say_what_they_change_and_only_probe_wide_ones_restart_probes() {
        use Setting::*;
        let agent = |text: &'static str| Side {
            agent: text,
            ..BASE
        };
        let restart_all: &[(&str, &[TaskField])] = &[("load", &[]), ("temp", &[]), ("ver", &[])];
        let plaintext = "host: node001\nrun_as: nobody\ncontrollers: [ctl1]\n\
                         insecure_plaintext: true\n";
        run(&[
            Row {
                what: "run_as",
                old: BASE,
                new: agent("host: node001\nrun_as: daemon\n"),
                keep: &[],
                start: &[],
                stop: &[],
                restart: restart_all,
                settings: &[RunAs],
            },
            Row {
                what: "plugin_dir and max_parallel",
                old: BASE,
                new: agent("host: node001\nrun_as: nobody\nplugin_dir: /opt/p\nmax_parallel: 2\n"),
                keep: &[],
                start: &[],
                stop: &[],
                restart: restart_all,
                settings: &[PluginDir, MaxParallel],
            },
            Row {
                what: "run_as and a probe's command: the probe says what changed in it",
                old: BASE,
                new: Side {
                    agent: "host: node001\nrun_as: daemon\n",
                    resources: "resources:
  - {name: load, interval: 15s, probe: {kind: builtin, index: r1m}}
  - {name: temp, interval: 30s, probe: {kind: exec, command: [temp2.sh]}}
",
                    ..BASE
                },
                keep: &[],
                start: &[],
                stop: &["ver"],
                restart: &[("load", &[]), ("temp", &[TaskField::Spec])],
                settings: &[RunAs],
            },
            Row {
                what: "controllers",
                old: agent(plaintext),
                new: agent(
                    "host: node001\nrun_as: nobody\ncontrollers: [ctl1, 'ctl2:7000']\n\
                     insecure_plaintext: true\n",
                ),
                keep: ALL,
                start: &[],
                stop: &[],
                restart: &[],
                settings: &[Controllers],
            },
            Row {
                what: "key material rotated under the same paths",
                old: Side {
                    keys: Some(1),
                    ..agent("host: node001\ncontrollers: [ctl1]\nrun_as: nobody\ntls: {ca: ca.pem, cert: c.pem, key: k.pem}\n")
                },
                new: Side {
                    keys: Some(2),
                    ..agent("host: node001\ncontrollers: [ctl1]\nrun_as: nobody\ntls: {ca: ca.pem, cert: c.pem, key: k.pem}\n")
                },
                keep: ALL,
                start: &[],
                stop: &[],
                restart: &[],
                settings: &[Tls],
            },
            Row {
                what: "from plaintext to TLS",
                old: agent(plaintext),
                new: Side {
                    keys: Some(1),
                    ..agent("host: node001\ncontrollers: [ctl1]\nrun_as: nobody\ntls: {ca: ca.pem, cert: c.pem, key: k.pem}\n")
                },
                keep: ALL,
                start: &[],
                stop: &[],
                restart: &[],
                settings: &[Tls, InsecurePlaintext],
            },
            Row {
                what: "the listeners and the stuck-read budget (at the next restart)",
                old: BASE,
                new: agent(
                    "host: node001\nrun_as: nobody\nmetrics: 127.0.0.1:9477\n\
                     status_socket: /run/x.sock\nstatus_group: adm\nmax_stuck_reads: 4\n",
                ),
                keep: ALL,
                start: &[],
                stop: &[],
                restart: &[],
                settings: &[Metrics, StatusSocket, StatusGroup, MaxStuckReads],
            },
            Row {
                what: "what was used at load time",
                old: BASE,
                new: agent(
                    "host: node001\nrun_as: nobody\nresources: /srv/r.yaml\nmax_interval: 2d\n\
                     trust_config_files_of_any_owner: true\n",
                ),
                keep: ALL,
                start: &[],
                stop: &[],
                restart: &[],
                settings: &[Resources, MaxInterval, TrustConfigFiles],
            },
            Row {
                what: "spread: the plan is made with it, and each probe whose slot moves restarts",
                old: BASE,
                new: agent("host: node001\nrun_as: nobody\nspread: probes\n"),
                keep: &[],
                start: &[],
                stop: &[],
                restart: &[
                    ("load", &[TaskField::Splay]),
                    ("temp", &[TaskField::Splay]),
                    ("ver", &[TaskField::Splay]),
                ],
                settings: &[Spread],
            },
            Row {
                what: "the host override (refused before a diff when it resolves elsewhere)",
                old: BASE,
                new: agent("run_as: nobody\n"),
                keep: ALL,
                start: &[],
                stop: &[],
                restart: &[],
                settings: &[],
            },
        ]);
    }

    #[test]
    fn each_setting_takes_the_effect_the_log_promises() {
        let effect = |s: Setting| (s.name(), s.effect());
        assert_eq!(effect(Setting::RunAs), ("run_as", Effect::RestartProbes));
        assert_eq!(effect(Setting::Tls), ("tls", Effect::Reconnect));
        assert_eq!(effect(Setting::Metrics), ("metrics", Effect::AgentRestart));
        assert_eq!(
            effect(Setting::MaxInterval),
            ("max_interval", Effect::Loaded)
        );
        let changes = Changes {
            settings: vec![Setting::Metrics, Setting::MaxParallel],
            ..Changes::default()
        };
        assert!(changes.restarts_every_probe());
        assert!(!changes.reconnects());
        assert_eq!(
            changes
                .with_effect(Effect::AgentRestart)
                .collect::<Vec<_>>(),
            [Setting::Metrics]
        );
    }

    #[test]
    fn restarted_probes_are_both_stopped_and_started() {
        let probe = |n: &str| ProbeKey {
            name: n.into(),
            instance: String::new(),
        };
        let changes = Changes {
            keep: vec![probe("k")],
            start: vec![probe("new")],
            stop: vec![probe("gone")],
            restart: vec![Restart {
                probe: probe("changed"),
                fields: vec![TaskField::Interval],
            }],
            settings: vec![],
        };
        assert_eq!(
            names(&changes.to_stop().cloned().collect::<Vec<_>>()),
            ["gone", "changed"]
        );
        assert_eq!(
            names(&changes.to_start().cloned().collect::<Vec<_>>()),
            ["new", "changed"]
        );
    }
}
