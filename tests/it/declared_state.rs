//! One byte budget per probe for what it declares (issue 36): a Netdata plugin declaring
//! ever more charts and dimensions, through the real daemon, keeps reporting its provided
//! resource, costs the log one warning, and the agent's resident memory stays within the
//! budget plus a constant. Gated by FIFOs and the status socket, never by sleeps.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;

use crate::support::{wait_status, Site};
use xce_agent::output::DECLARED_STATE_BYTES;
use xce_agent::status::StatusReport;
use xce_agent::value::Value;

const RESOURCES: &str = "resources:
  - {name: load1, valtype: numeric, interval: 60s, resourcemap: [{location: [default]}], probe: {kind: stream, command: [flood], format: netdata}}
";

/// Charts of the flood, each with [`FLOOD_DIMENSIONS`] dimensions: 200,000 declarations in
/// about 3 MB of lines. Kept whole they would take over 20 MiB (a hash map slot and a heap
/// block per dimension); the count limits before the budget (10,000 charts x 1,000
/// dimensions) kept them all.
const FLOOD_CHARTS: usize = 200;
const FLOOD_DIMENSIONS: usize = 1000;

/// A plugin that declares `system.load` and sends load1 = 1 (0.01 after its divisor), waits
/// for `go`, declares the flood, sends load1 = 2, waits for `end` and aborts (exit 97: not
/// restarted).
fn flood_script(dir: &std::path::Path) -> String {
    let d = dir.display();
    format!(
        "#!/bin/sh
printf 'CHART system.load \"\" Load load load system.load line 100 1\\nDIMENSION load1 \"\" absolute 1 100\\n'
printf 'BEGIN system.load\\nSET load1 = 1\\nEND\\n'
read x < '{d}/go'
awk 'BEGIN {{ for (c = 0; c < {FLOOD_CHARTS}; c++) {{ print \"CHART flood.\" c; for (i = 0; i < {FLOOD_DIMENSIONS}; i++) print \"DIMENSION d\" i }} }}'
printf 'BEGIN system.load\\nSET load1 = 2\\nEND\\n'
read x < '{d}/end'
exit 97
"
    )
}

fn fifo(site: &Site, name: &str) -> std::path::PathBuf {
    let path = site.file(name);
    nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o666)).expect("mkfifo");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    path
}

async fn release(fifo: &std::path::Path) {
    let fifo = fifo.to_owned();
    tokio::task::spawn_blocking(move || std::fs::write(fifo, "go\n").expect("write fifo"))
        .await
        .expect("join");
}

fn load1(r: &StatusReport) -> Option<Value> {
    r.resources
        .iter()
        .find(|x| x.name == "load1")
        .map(|x| x.value.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_netdata_stream_declaring_for_ever_stays_within_its_declared_state_budget() {
    let site = Site::new(&[], RESOURCES);
    std::fs::OpenOptions::new()
        .append(true)
        .open(site.agent_yaml())
        .and_then(|mut f| f.write_all(b"status_socket: status.sock\n"))
        .expect("append to agent.yaml");
    let (go, end) = (fifo(&site, "go"), fifo(&site, "end"));
    site.script("flood", &flood_script(site.path()));
    let mut agent = site.spawn_agent();

    wait_status(&site, "the plugin's first update", |r| {
        load1(r) == Some(Value::Numeric(0.01))
    })
    .await;
    let before = agent.rss_kib();
    release(&go).await;
    // The update after the flood: the chart declared before it still reports.
    wait_status(&site, "the update after the flood", |r| {
        load1(r) == Some(Value::Numeric(0.02))
    })
    .await;
    let after = agent.rss_kib();
    agent.assert_alive();

    // A memory bound, not a timing one: the declared state is at most the budget; the rest
    // of the bound is for the allocator's slack around what the flood's lines cost while
    // they were read.
    let bound_kib = (DECLARED_STATE_BYTES / 1024 + 6 * 1024) as u64;
    eprintln!(
        "agent RSS {before} KiB before the flood of {} declarations, {after} KiB after (bound: +{bound_kib} KiB)",
        FLOOD_CHARTS * (FLOOD_DIMENSIONS + 1)
    );
    assert!(
        after <= before + bound_kib,
        "the agent grew from {before} KiB to {after} KiB under the flood (bound +{bound_kib} KiB)"
    );

    release(&end).await;
    agent.wait_log("not restarted", 1).await;
    let log = agent.log_text();
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("declared-state budget"))
        .collect();
    assert_eq!(warnings.len(), 1, "{log}");
    assert!(
        warnings[0].contains(&format!("of {DECLARED_STATE_BYTES} bytes")),
        "the warning gives the figures: {}",
        warnings[0]
    );
    // The dropped declarations were not errors (an error fails the provided resource).
    assert!(!log.contains("bad netdata line"), "{log}");
}
