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
use xce_agent::value::{Status, Value};

/// A hang guard, not a timing assertion.
const GUARD: Duration = Duration::from_secs(60);

#[tokio::test]
async fn welcome_assigns_a_shared_instance_and_its_value_arrives() {
    // node001 is second in the list: node000 reports the pool unless the controller says so.
    let s = common::Setup::new(
        "resources:
  - name: own
    interval: 1s
    probe: {kind: exec, command: [seven.sh]}
  - name: pool
    interval: 1s
    resourcemap: [{location: [node000, node001]}]
    probe: {kind: exec, command: [seven.sh]}
",
    );
    s.script("seven.sh", "#!/bin/sh\necho 7\n");
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
    let (tx, mut events) = mpsc::channel(1024);
    let stop = CancellationToken::new();
    let opts = ListenOpts {
        ack: false,
        assign: vec![("pool".into(), "node000,node001".into())],
        tls: None, // plaintext
        ..ListenOpts::default()
    };
    tokio::spawn(session::serve(listener, opts, tx, stop.clone()));

    let cfg = config::load(&s.agent_yaml(), None).unwrap();
    let link = LinkConfig {
        coalesce: Duration::from_millis(5),
        ..LinkConfig::default()
    };
    let mut agent = Agent::start(
        cfg,
        "node001".into(),
        Arc::new(common::NoBuiltins),
        xce_agent::probe::supervisor::Supervisor::uncontained(),
        link,
    );
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

    let found = tokio::time::timeout(GUARD, async {
        let mut announced = false;
        while let Some(ev) = events.recv().await {
            match ev.kind {
                EventKind::Hello(h) => {
                    announced |= h.resources.iter().any(|d| d.name == "pool" && d.shared);
                }
                EventKind::Batch { batch, .. } if announced => {
                    if let Some(r) = batch
                        .resvals
                        .iter()
                        .find(|r| r.name == "pool" && r.status == Status::Ok)
                    {
                        return r.clone();
                    }
                }
                _ => {}
            }
        }
        panic!("receiver ended");
    })
    .await
    .unwrap();
    assert_eq!(found.instance, "node000,node001");
    assert_eq!(found.value, Value::Numeric(7.0));
    agent.stop(Duration::from_secs(5)).await;
    stop.cancel();
}
