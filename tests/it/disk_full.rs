//! A full /tmp: the `tmp` index reads 0 MB (a value, not a failure), and a probe that needs to
//! write there fails with the reason the kernel gave, while everything else goes on.
//! Needs root to mount a small tmpfs (CI runs as root); elsewhere it says so and passes.

use std::process::Command;
use std::time::Instant;

use crate::support::{script, task_from_yaml};
use xce_agent::probe::builtin::{Roots, Sampler};
use xce_agent::probe::{run_once, Outcome};
use xce_agent::value::{Reading, Value};

struct Mount(std::path::PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

fn full_tmpfs(dir: &std::path::Path) -> Option<Mount> {
    let ok = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
        .arg(dir)
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        return None;
    }
    let m = Mount(dir.to_owned());
    // Fill it: the write fails with ENOSPC once the 64 KiB are used.
    let _ = std::fs::write(dir.join("filler"), vec![0u8; 256 * 1024]);
    Some(m)
}

#[tokio::test]
async fn full_tmp_reads_zero_and_writing_probes_fail_with_the_reason() {
    let outer = tempfile::tempdir().unwrap();
    let tmp = outer.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let Some(_mount) = full_tmpfs(&tmp) else {
        eprintln!("note: cannot mount a tmpfs here (not root?); disk-full test skipped");
        return;
    };

    let mut sampler = Sampler::new(Roots {
        tmp: tmp.clone(),
        ..Roots::host()
    });
    let now = Instant::now();
    sampler.fast_tick(now);
    sampler.slow_tick(now);
    assert_eq!(
        sampler.reading("tmp"),
        Some(Reading::Ok(Value::Numeric(0.0)))
    );
    assert!(
        matches!(sampler.reading("mem"), Some(Reading::Ok(_))),
        "other indices go on"
    );

    let plugins = tempfile::tempdir().unwrap();
    script(
        plugins.path(),
        "writer.sh",
        &format!(
            "#!/bin/sh\nset -e\nhead -c 100000 /dev/zero > {}/state\necho 1\n",
            tmp.display()
        ),
    );
    let y = "resources:\n  - name: w\n    interval: 30\n    probe: {kind: exec, command: [writer.sh]}\n";
    let (task, ctx) = task_from_yaml(y, "w", plugins.path());
    let run = run_once(&task, &ctx).await;
    assert_eq!(run.outcome, Outcome::Failed);
    match &run.readings[0].1 {
        Reading::Failed(e) => assert!(e.to_string().contains("No space left on device"), "{e}"),
        other => panic!("expected failure, got {other:?}"),
    }
}
