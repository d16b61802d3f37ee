//! The manager's whole lifecycle against a temp-dir tree ([`kernel::fake`]): no root, no
//! real cgroupfs. The real kernel's part (clone3 into a leaf, `cgroup.kill` ending a
//! setsid daemon) is in `tests/it/containment.rs`.

use std::fs;
use std::path::{Path, PathBuf};

use super::host::{cgroup_dir, v2_mount};
use super::kernel::fake;
use super::leaf::dir_name;
use super::subtree::{is_subtree_name, judge, lock_subtree, start_time, Verdict, Wait};
use super::*;
use crate::config::Limits;

/// `<tmp>/own`, a cgroup the agent is in, whose parent enabled `enabled` for it (so its
/// children are offered them).
fn own_cgroup(enabled: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let own = dir.path().join("own");
    fake::mkdir(&own).unwrap();
    fs::write(own.join("cgroup.controllers"), enabled).unwrap();
    fs::write(own.join("cgroup.subtree_control"), enabled).unwrap();
    (dir, own)
}

fn layout(own: &Path, name: &str) -> Layout {
    Layout {
        own: own.to_owned(),
        delegated: false,
        name: name.to_owned(),
        move_in: true,
        kernel: fake::KERNEL,
    }
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A process in the cgroup at `dir`, as the kernel would show it.
fn populate(dir: &Path, populated: bool) {
    let n = u8::from(populated);
    fs::write(
        dir.join("cgroup.events"),
        format!("populated {n}\nfrozen 0\n"),
    )
    .unwrap();
}

fn limits(memory: Option<u64>, pids: Option<u64>) -> Limits {
    Limits {
        memory,
        pids,
        ..Limits::default()
    }
}

#[test]
fn set_up_makes_locks_and_enters_the_subtree_with_the_offered_controllers() {
    let (_d, own) = own_cgroup("cpu pids hugetlb");
    let tree = Tree::set_up(layout(&own, "xce-agent.7.99")).unwrap();
    assert_eq!(tree.base, own.join("xce-agent.7.99"));
    assert_eq!(read(&tree.base.join("agent/cgroup.procs")), "0");
    assert!(tree.base.join("probes").is_dir());
    // Of what it wants (cpu memory pids), what the parent offers; never hugetlb.
    assert_eq!(tree.controllers, ["cpu", "pids"]);
    assert_eq!(read(&tree.base.join("cgroup.subtree_control")), "cpu pids");
    assert!(
        lock_subtree(&tree.base, Wait::No).unwrap().is_none(),
        "the subtree is locked while the tree lives"
    );
    // A second tree of the same name (another PID namespace's pid and start): a suffix.
    let second = Tree::set_up(layout(&own, "xce-agent.7.99")).unwrap();
    assert_eq!(second.base, own.join("xce-agent.7.99.1"));
}

#[test]
fn set_up_fails_with_the_path_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let own = dir.path().join("missing");
    let e = Tree::set_up(layout(&own, "xce-agent.1.2")).unwrap_err();
    assert!(
        matches!(&e, SetUpError::Create { path, .. } if path.starts_with(&own)),
        "{e}"
    );
    assert!(!own.exists());
}

#[test]
fn limits_are_written_where_their_controller_is_enabled_and_only_when_changed() {
    let (_d, own) = own_cgroup("cpu pids");
    let tree = Tree::set_up(layout(&own, "xce-agent.1.2")).unwrap();
    let cg = tree
        .probe("gpu/../free", &limits(Some(1 << 20), Some(10)))
        .unwrap();
    assert_eq!(cg.path, tree.base.join("probes/gpu____free"));
    assert_eq!(read(&cg.path.join("pids.max")), "10");
    // No memory controller here: memory.max is left as the kernel made it.
    assert_eq!(read(&cg.path.join("memory.max")), "max\n");
    fs::write(cg.path.join("pids.max"), "changed by someone").unwrap();
    tree.probe("gpu/../free", &limits(Some(1 << 20), Some(10)))
        .unwrap();
    assert_eq!(
        read(&cg.path.join("pids.max")),
        "changed by someone",
        "unchanged: not rewritten"
    );
    tree.probe("gpu/../free", &limits(None, None)).unwrap();
    assert_eq!(read(&cg.path.join("pids.max")), "max");
}

#[test]
fn a_leaf_left_empty_is_reused_and_one_left_populated_is_killed_and_retired() {
    let (_d, own) = own_cgroup("pids");
    let tree = Tree::set_up(layout(&own, "xce-agent.1.2")).unwrap();
    let cg = tree.probe("p", &Limits::default()).unwrap();
    let run = cg.checkout().unwrap();
    let first = run.path().unwrap().to_owned();
    assert_eq!(first, cg.path.join("run-1"));
    assert!(run.spawn_fds().is_some());
    drop(run);
    let mut run = cg.checkout().unwrap();
    assert_eq!(
        run.path(),
        Some(first.as_path()),
        "an empty leaf is used again"
    );
    // The run left a process behind: the end of the run kills it, and the leaf retires.
    populate(&first, true);
    run.kill();
    assert_eq!(read(&first.join("cgroup.kill")), "1");
    drop(run);
    let next = cg.checkout().unwrap();
    assert_eq!(
        next.path(),
        Some(cg.path.join("run-2").as_path()),
        "never cloned into again"
    );
    // The retired leaf goes once its processes have: at a later checkout.
    assert!(first.is_dir(), "still busy");
    populate(&first, false);
    drop(next);
    drop(cg.checkout().unwrap());
    assert!(!first.exists());
}

#[test]
fn a_run_that_leaves_a_process_without_being_killed_is_killed_at_check_in() {
    let (_d, own) = own_cgroup("pids");
    let tree = Tree::set_up(layout(&own, "xce-agent.1.2")).unwrap();
    let cg = tree.probe("p", &Limits::default()).unwrap();
    let run = cg.checkout().unwrap();
    let leaf = run.path().unwrap().to_owned();
    populate(&leaf, true);
    drop(run);
    assert_eq!(read(&leaf.join("cgroup.kill")), "1");
    let next = cg.checkout().unwrap();
    assert_ne!(next.path(), Some(leaf.as_path()));
    // The kill took: the shutdown finds the leaf empty.
    populate(&leaf, false);
}

#[test]
fn leaf_names_are_never_reused_within_a_tree() {
    let (_d, own) = own_cgroup("pids");
    let tree = Tree::set_up(layout(&own, "xce-agent.1.2")).unwrap();
    let a = tree.probe("a", &Limits::default()).unwrap();
    let b = tree.probe("b", &Limits::default()).unwrap();
    let (ra, rb) = (a.checkout().unwrap(), b.checkout().unwrap());
    assert_eq!(ra.path(), Some(a.path.join("run-1").as_path()));
    assert_eq!(rb.path(), Some(b.path.join("run-2").as_path()));
    // Another tree counts on its own.
    let other = Tree::set_up(layout(&own, "xce-agent.3.4")).unwrap();
    let c = other.probe("a", &Limits::default()).unwrap();
    assert_eq!(
        c.checkout().unwrap().path(),
        Some(c.path.join("run-1").as_path())
    );
}

#[test]
fn retain_removes_unused_probes_now_and_one_in_use_when_its_run_ends() {
    let (_d, own) = own_cgroup("pids");
    let tree = Tree::set_up(layout(&own, "xce-agent.1.2")).unwrap();
    let idle = tree.probe("idle", &Limits::default()).unwrap();
    drop(idle.checkout().unwrap());
    let busy = tree.probe("busy", &Limits::default()).unwrap();
    let kept = tree.probe("kept", &Limits::default()).unwrap();
    let run = busy.checkout().unwrap();
    tree.retain(&["kept"]);
    assert!(!idle.path.exists(), "removed with its idle leaf");
    assert!(busy.path.is_dir(), "its run is still ending: not cut short");
    assert!(kept.path.is_dir());
    assert!(tree.probe_if_made("busy").is_none());
    drop(run);
    assert!(
        !busy.path.exists(),
        "the last run removed it as it checked in"
    );
    assert_eq!(
        Containment::Cgroups(tree).usage_by_probe(),
        vec![("kept".to_owned(), Usage::default())]
    );
}

#[test]
fn shut_down_removes_every_cgroup_and_moves_the_agent_back() {
    let (_d, own) = own_cgroup("pids");
    let containment = Containment::Cgroups(Tree::set_up(layout(&own, "xce-agent.1.2")).unwrap());
    let tree = containment.tree().unwrap();
    let cg = tree.probe("p", &Limits::default()).unwrap();
    // A run still ending at shutdown: its leaf goes too.
    let run = cg.checkout().unwrap();
    let base = tree.base.clone();
    containment.shut_down();
    assert_eq!(read(&own.join("cgroup.procs")), "0");
    assert!(!base.exists(), "{}", base.display());
    drop(run);
    drop(containment);
    assert!(matches!(cg.checkout(), Err(CgroupError::ShutDown)));
}

#[test]
fn only_abandoned_sibling_subtrees_are_removed() {
    let (_d, own) = own_cgroup("pids");
    let sibling = |name: &str, agent: Option<bool>| {
        let dir = own.join(name);
        fake::mkdir(&dir).unwrap();
        if let Some(populated) = agent {
            fake::mkdir(&dir.join("agent")).unwrap();
            populate(&dir.join("agent"), populated);
        }
        dir
    };
    let abandoned = sibling("xce-agent.10.1", Some(false));
    // With probe cgroups of its own, removed deepest first.
    fake::mkdir(&abandoned.join("probes")).unwrap();
    fake::mkdir(&abandoned.join("probes/p")).unwrap();
    fake::mkdir(&abandoned.join("probes/p/run-3")).unwrap();
    let old_name = sibling("xce-agent.11", Some(false));
    let locked = sibling("xce-agent.12.1", Some(false));
    let _held = lock_subtree(&locked, Wait::No).unwrap().expect("free");
    let agent_inside = sibling("xce-agent.13.1", Some(true));
    let setting_up = sibling("xce-agent.14.1", None);
    let not_ours = sibling("other.15.1", Some(false));
    let tree = Tree::set_up(layout(&own, "xce-agent.1.2")).unwrap();
    assert!(!abandoned.exists());
    assert!(!old_name.exists());
    for kept in [&locked, &agent_inside, &setting_up, &not_ours, &tree.base] {
        assert!(kept.is_dir(), "{} was removed", kept.display());
    }
}

#[test]
fn a_delegated_cgroup_is_taken_over_once_and_cleared_of_the_previous_agents_probes() {
    let (_d, own) = own_cgroup("cpu memory pids");
    // What an agent that crashed in this unit left.
    fake::mkdir(&own.join("probes")).unwrap();
    fake::mkdir(&own.join("probes/old")).unwrap();
    let delegated = Layout {
        delegated: true,
        ..layout(&own, "unused")
    };
    let tree = Tree::set_up(delegated.clone()).unwrap();
    assert_eq!(tree.base, own);
    assert!(!own.join("probes/old").exists());
    assert_eq!(tree.controllers, ["cpu", "memory", "pids"]);
    let e = Tree::set_up(delegated).unwrap_err();
    assert!(matches!(&e, SetUpError::Taken(p) if *p == own), "{e}");
    Containment::Cgroups(tree).shut_down();
    assert!(own.is_dir(), "systemd's cgroup is systemd's to remove");
    assert!(!own.join("agent").exists());
    assert!(!own.join("probes").exists());
}

#[test]
fn finds_the_unified_mount_of_a_hybrid_host() {
    let mi = "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n\
              32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n\
              41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";
    assert_eq!(
        v2_mount(mi),
        Some(("/sys/fs/cgroup/unified".into(), "/".into()))
    );
}

#[test]
fn the_agents_own_cgroup_is_found_below_the_mount() {
    let (mount, root) = (Path::new("/sys/fs/cgroup"), Path::new("/"));
    // Under systemd: the unit's cgroup, not the mount (the hierarchy's root).
    assert_eq!(
        cgroup_dir(mount, root, "/system.slice/xce-agent.service"),
        Path::new("/sys/fs/cgroup/system.slice/xce-agent.service")
    );
    assert_eq!(cgroup_dir(mount, root, "/"), mount);
    // Only a subtree mounted (a container's view): paths are below its root.
    assert_eq!(
        cgroup_dir(
            mount,
            Path::new("/machine.slice/c1"),
            "/machine.slice/c1/init.scope"
        ),
        Path::new("/sys/fs/cgroup/init.scope")
    );
    assert_eq!(
        cgroup_dir(mount, Path::new("/machine.slice/c1"), "/machine.slice/c1"),
        mount
    );
}

#[test]
fn a_v1_only_host_has_no_v2_mount() {
    let mi = "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n";
    assert_eq!(v2_mount(mi), None);
}

#[test]
fn only_agent_subtree_names_are_considered() {
    for ok in [
        "xce-agent.4242.123456",
        "xce-agent.4242",
        "xce-agent.1.99.2",
    ] {
        assert!(is_subtree_name(ok), "{ok}");
    }
    for not in [
        "xce-agent.service",
        "xce-agent.4242.x",
        "xce-agent.",
        "xce-agent.1..2",
        "xce-agent.1.2.3.4",
        "other.4242",
        "",
    ] {
        assert!(!is_subtree_name(not), "{not}");
    }
}

/// The verdicts on a plain directory tree (no cgroupfs needed: the lock is a flock, the
/// events a file).
#[test]
fn a_sibling_is_abandoned_only_when_unlocked_set_up_and_empty() {
    let dir = tempfile::tempdir().unwrap();
    let sib = dir.path();
    let held = lock_subtree(sib, Wait::No).unwrap().expect("free");
    assert!(
        lock_subtree(sib, Wait::No).unwrap().is_none(),
        "flock is per open file"
    );
    assert_eq!(judge(sib, None), Verdict::Locked);
    assert_eq!(judge(sib, Some(&held)), Verdict::SettingUp);
    fs::create_dir(sib.join("agent")).unwrap();
    fs::write(sib.join("agent/cgroup.events"), "populated 1\nfrozen 0\n").unwrap();
    assert_eq!(judge(sib, Some(&held)), Verdict::AgentInside);
    fs::write(sib.join("agent/cgroup.events"), "populated 0\nfrozen 0\n").unwrap();
    assert_eq!(judge(sib, Some(&held)), Verdict::Abandoned);
    drop(held);
    assert!(lock_subtree(sib, Wait::No).unwrap().is_some());
}

#[test]
fn this_process_has_a_start_time_and_a_dead_pid_has_none() {
    assert!(start_time(std::process::id()).is_some());
    // Above the largest pid_max Linux allows.
    assert_eq!(start_time(4_194_305), None);
}

#[test]
fn probe_names_never_make_paths() {
    assert_eq!(dir_name("../etc"), "___etc");
    assert_eq!(dir_name("gpu_free-1"), "gpu_free-1");
}

#[test]
fn a_tree_that_leaves_the_process_where_it_is_moves_nothing() {
    let (_d, own) = own_cgroup("pids");
    let stay = Layout {
        move_in: false,
        ..layout(&own, "xce-agent.1.2")
    };
    let tree = Tree::set_up(stay).unwrap();
    let base = tree.base.clone();
    assert_eq!(read(&base.join("agent/cgroup.procs")), "");
    drop(tree);
    assert_eq!(read(&own.join("cgroup.procs")), "", "nothing moved back");
    assert!(!base.exists());
}

#[test]
fn a_limit_that_cannot_be_written_is_said_and_the_probe_still_gets_its_cgroup() {
    let (_d, own) = own_cgroup("pids");
    let tree = Tree::set_up(layout(&own, "xce-agent.1.2")).unwrap();
    let cg = tree.probe("p", &Limits::default()).unwrap();
    // Something the kernel would refuse: the file cannot be written.
    fs::remove_file(cg.path.join("pids.max")).unwrap();
    fs::create_dir(cg.path.join("pids.max")).unwrap();
    let again = tree.probe("p", &limits(None, Some(5))).unwrap();
    assert!(again.checkout().is_ok());
    fs::remove_dir(cg.path.join("pids.max")).unwrap();
}
