//! The controller's `welcome` moves a shared instance to this host (failover): the agent
//! re-plans, starts probing it, announces it in a new hello and reports its value.

use crate::support as common;

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use xce_agent::config;
use xce_agent::daemon::Agent;
use xce_agent::link::client::LinkConfig;
use xce_agent::receiver::session::{self, EventKind, ListenOpts};
use xce_agent::value::{Resval, Status, Value};

/// A hang guard, not a timing assertion.
const GUARD: Duration = Duration::from_secs(60);

/// An agent on node001 whose `resources` run `seven.sh` (prints 7) and `elim.sh` (an ELIM
/// line of a host and a shared value), linked to an in-process receiver that assigns
/// `assign` in its welcome: the site, the agent, the receiver's events and its stop.
async fn start(
    resources: &str,
    assign: &[(&str, &str)],
) -> (
    common::Setup,
    Agent,
    mpsc::Receiver<session::Event>,
    CancellationToken,
) {
    let s = common::Setup::new(resources);
    s.script("seven.sh", "#!/bin/sh\necho 7\n");
    s.script("elim.sh", "#!/bin/sh\necho '2 own 5 pool 12'\n");
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::fs::write(
        s.agent_yaml(),
        format!(
            "host: node001\nresources: resources.yaml\nplugin_dir: {}\nrun_as: root\ncontrollers: [\"{addr}\"]\ninsecure_plaintext: true\n",
            s.path().display()
        ),
    )
    .unwrap();
    let (tx, events) = mpsc::channel(1024);
    let stop = CancellationToken::new();
    let opts = ListenOpts {
        ack: false,
        assign: assign
            .iter()
            .map(|(n, i)| ((*n).to_owned(), (*i).to_owned()))
            .collect(),
        tls: None, // plaintext
        ..ListenOpts::default()
    };
    tokio::spawn(session::serve(listener, opts, tx, stop.clone()));

    let cfg = config::load(&s.agent_yaml(), None).unwrap();
    let link = LinkConfig {
        coalesce: Duration::from_millis(5),
        ..LinkConfig::default()
    };
    let agent = Agent::start(
        cfg,
        "node001".into(),
        Arc::new(common::NoBuiltins),
        xce_agent::probe::supervisor::Supervisor::uncontained(),
        link,
    );
    (s, agent, events, stop)
}

/// The first ok value of `name` that arrives after a hello that announced it shared.
async fn shared_value(events: &mut mpsc::Receiver<session::Event>, name: &str) -> Resval {
    let found = tokio::time::timeout(GUARD, async {
        let mut announced = false;
        while let Some(ev) = events.recv().await {
            match ev.kind {
                EventKind::Hello(h) => {
                    announced |= h.resources.iter().any(|d| d.name == name && d.shared);
                }
                EventKind::Batch { batch, .. } if announced => {
                    if let Some(r) = batch
                        .resvals
                        .iter()
                        .find(|r| r.name == name && r.status == Status::Ok)
                    {
                        return r.clone();
                    }
                }
                _ => {}
            }
        }
        panic!("receiver ended");
    });
    found.await.unwrap()
}

#[tokio::test]
async fn welcome_assigns_a_shared_instance_and_its_value_arrives() {
    // node001 is second in the list: node000 reports the pool unless the controller says so.
    let (_s, mut agent, mut events, stop) = start(
        "resources:
  - name: own
    interval: 1s
    probe: {kind: exec, command: [seven.sh]}
  - name: pool
    interval: 1s
    resourcemap: [{location: [node000, node001]}]
    probe: {kind: exec, command: [seven.sh]}
",
        &[("pool", "node000,node001")],
    )
    .await;
    assert!(
        agent.plan().tasks.iter().all(|t| t.name != "pool"),
        "not ours before the welcome"
    );

    // The welcome comes after the first hello; the daemon loop re-plans on it.
    tokio::time::timeout(GUARD, agent.assignment_changed())
        .await
        .unwrap();
    let config = agent.config.clone();
    agent.replan(config);
    assert!(agent
        .plan()
        .tasks
        .iter()
        .any(|t| t.name == "pool" && t.instance == "node000,node001"));

    let found = shared_value(&mut events, "pool").await;
    assert_eq!(found.instance, "node000,node001");
    assert_eq!(found.value, Value::Numeric(7.0));
    agent.stop(Duration::from_secs(5)).await;
    stop.cancel();
}

/// A host probe whose ELIM line also carries an `all` instance's value: the host drops it
/// until the controller assigns the instance to it, then feeds it from the same probe.
#[tokio::test]
async fn welcome_assigns_a_shared_instance_a_host_probe_provides() {
    let (_s, mut agent, mut events, stop) = start(
        "resources:
  - name: own
    interval: 1s
    probe: {kind: exec, command: [elim.sh], format: elim, provides: [pool]}
  - name: pool
    interval: 1s
    resourcemap: [{location: [all]}]
",
        &[("pool", "all")],
    )
    .await;
    let feeds = |agent: &Agent| -> Vec<(String, String)> {
        agent.plan().tasks[0]
            .feeds
            .iter()
            .map(|f| (f.name.clone(), f.instance.clone()))
            .collect()
    };
    assert_eq!(feeds(&agent), [("own".to_owned(), String::new())]);
    assert_eq!(agent.plan().tasks[0].dropped, ["pool"]);
    tokio::time::timeout(GUARD, agent.assignment_changed())
        .await
        .unwrap();
    agent.apply_assignment();
    assert_eq!(
        feeds(&agent),
        [
            ("own".to_owned(), String::new()),
            ("pool".to_owned(), "all".to_owned())
        ]
    );
    let found = shared_value(&mut events, "pool").await;
    assert_eq!(found.instance, "all");
    assert_eq!(found.value, Value::Numeric(12.0));
    agent.stop(Duration::from_secs(5)).await;
    stop.cancel();
}
