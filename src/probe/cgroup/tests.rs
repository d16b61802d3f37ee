//! The manager's whole lifecycle against a temp-dir tree ([`kernel::fake`]): no root, no
//! real cgroupfs. The real kernel's part (clone3 into a leaf, `cgroup.kill` ending a
//! setsid daemon) is in `tests/it/containment.rs`.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::host::{cgroup_dir, v2_mount};
use super::kernel::fake;
use super::leaf::dir_name;
use super::liveness::CgroupId;
use super::liveness::{LockDir, LockDirError, SubtreeLock, Unsafe, Wait};
use super::subtree::{is_subtree_name, judge, start_time, Verdict};
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
        locks: locks_beside(own),
    }
}

/// The lock directory of the trees under `own`: `<tmp>/locks`, beside it.
fn locks_beside(own: &Path) -> PathBuf {
    own.parent().expect("own has a parent").join("locks")
}

/// The lock an agent takes on `subtree`, in the lock directory of the trees beside it;
/// `None` where another holds it.
fn try_lock(subtree: &Path) -> Option<SubtreeLock> {
    let own = subtree.parent().unwrap();
    LockDir::open(&locks_beside(own))
        .unwrap()
        .lock(subtree, Wait::No)
        .unwrap()
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
        try_lock(&tree.base).is_none(),
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
    assert!(run.spawn_dir().is_some());
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
    // Its agent made `agent/` and never moved in (it would have made `probes/` after).
    let never_moved_in = sibling("xce-agent.16.1", Some(false));
    fake::mkdir(&abandoned.join("probes/p/run-3")).unwrap();
    let old_name = sibling("xce-agent.11", Some(false));
    fake::mkdir(&old_name.join("probes")).unwrap();
    let locked = sibling("xce-agent.12.1", Some(false));
    fake::mkdir(&locked.join("probes")).unwrap();
    let _held = try_lock(&locked).expect("free");
    let agent_inside = sibling("xce-agent.13.1", Some(true));
    let setting_up = sibling("xce-agent.14.1", None);
    let not_ours = sibling("other.15.1", Some(false));
    let tree = Tree::set_up(layout(&own, "xce-agent.1.2")).unwrap();
    assert!(!abandoned.exists());
    assert!(!old_name.exists());
    for kept in [
        &locked,
        &agent_inside,
        &setting_up,
        &never_moved_in,
        &not_ours,
        &tree.base,
    ] {
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
    let sib = &dir.path().join("xce-agent.1.2");
    fs::create_dir(sib).unwrap();
    let held = try_lock(sib).expect("free");
    assert!(try_lock(sib).is_none(), "flock is per open file");
    assert_eq!(judge(sib, None), Verdict::Locked);
    assert_eq!(judge(sib, Some(&held)), Verdict::SettingUp);
    fs::create_dir(sib.join("agent")).unwrap();
    fs::write(
        sib.join("agent/cgroup.events"),
        "populated 0
frozen 0
",
    )
    .unwrap();
    assert_eq!(
        judge(sib, Some(&held)),
        Verdict::SettingUp,
        "no probes/: its agent may not have moved in yet"
    );
    fs::create_dir(sib.join("probes")).unwrap();
    fs::write(sib.join("agent/cgroup.events"), "populated 1\nfrozen 0\n").unwrap();
    assert_eq!(judge(sib, Some(&held)), Verdict::AgentInside);
    fs::write(sib.join("agent/cgroup.events"), "populated 0\nfrozen 0\n").unwrap();
    assert_eq!(judge(sib, Some(&held)), Verdict::Abandoned);
    drop(held);
    assert!(try_lock(sib).is_some());
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

#[test]
fn lock_files_are_named_by_the_cgroup_and_closed_to_other_users() {
    let (_d, own) = own_cgroup("pids");
    let locks = LockDir::open(&locks_beside(&own)).unwrap();
    let meta = fs::metadata(locks.path()).unwrap();
    assert_eq!(meta.permissions().mode() & 0o7777, 0o700);
    let (a, b) = (own.join("xce-agent.1.2"), own.join("xce-agent.1.2.1"));
    fake::mkdir(&a).unwrap();
    fake::mkdir(&b).unwrap();
    let held = locks.lock(&a, Wait::No).unwrap().expect("free");
    let file = held.path();
    assert_eq!(file.parent(), Some(locks.path()));
    assert_eq!(
        file.file_name().unwrap().to_str().unwrap(),
        CgroupId::of(&a).unwrap().file_name()
    );
    assert_eq!(
        fs::symlink_metadata(&file).unwrap().permissions().mode() & 0o7777,
        0o600
    );
    // The same cgroup by another spelling of its path: the same lock.
    let spelled = own.join("..").join("own").join("xce-agent.1.2");
    assert!(locks.lock(&spelled, Wait::No).unwrap().is_none());
    // Another cgroup, even one whose name extends this one's: a lock of its own.
    let other = locks.lock(&b, Wait::No).unwrap().expect("another file");
    assert_ne!(other.path(), file);
}

#[test]
fn a_lock_file_its_holder_unlinked_is_made_afresh_and_proves_the_next_holder() {
    let (_d, own) = own_cgroup("pids");
    let locks = LockDir::open(&locks_beside(&own)).unwrap();
    let sub = own.join("xce-agent.1.2");
    fake::mkdir(&sub).unwrap();
    let first = locks.lock(&sub, Wait::No).unwrap().expect("free");
    first.remove_file();
    assert!(!first.path().exists());
    // The first holder let go of its proof: the next locker holds a new file, which the
    // directory names, and a third is refused.
    let second = locks
        .lock(&sub, Wait::Yes)
        .unwrap()
        .expect("waits for nothing");
    assert!(second.path().exists());
    assert!(locks.lock(&sub, Wait::No).unwrap().is_none());
    // The first holder's second unlink (its shutdown, then its drop) leaves the file the
    // second one holds, and so its proof.
    first.remove_file();
    assert!(second.path().exists());
    assert!(locks.lock(&sub, Wait::No).unwrap().is_none());
    drop(first);
}

/// A lock directory another user could enter, or that could be swapped under the agent, is
/// refused with the reason; set-up then fails before it makes anything (the agent runs
/// uncontained, and says why).
#[test]
fn a_lock_directory_another_user_could_enter_or_replace_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let refused = |path: &Path| match LockDir::open(path) {
        Err(LockDirError::Unsafe { why, .. }) => why,
        other => panic!("{}: {other:?}", path.display()),
    };
    let good = dir.path().join("good");
    LockDir::open(&good).unwrap();
    // Directories made above it stay readable (the status socket's is one); it is closed.
    let deep = dir.path().join("made/above/locks");
    LockDir::open(&deep).unwrap();
    let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    assert_eq!(
        (mode(&dir.path().join("made")), mode(&deep)),
        (0o755, 0o700)
    );
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&good, &link).unwrap();
    assert_eq!(refused(&link), Unsafe::Symlink);
    let file = dir.path().join("file");
    fs::write(&file, "").unwrap();
    assert_eq!(refused(&file), Unsafe::NotDirectory);
    let open = dir.path().join("open");
    fs::create_dir(&open).unwrap();
    fs::set_permissions(&open, fs::Permissions::from_mode(0o750)).unwrap();
    assert_eq!(refused(&open), Unsafe::Mode(0o750));
    let shared = dir.path().join("shared");
    fs::create_dir(&shared).unwrap();
    fs::set_permissions(&shared, fs::Permissions::from_mode(0o775)).unwrap();
    assert_eq!(
        refused(&shared.join("locks")),
        Unsafe::AncestorWritable {
            dir: shared.clone(),
            mode: 0o775
        }
    );
    // Sticky, as /tmp: others cannot rename or remove what is ours in it.
    fs::set_permissions(&shared, fs::Permissions::from_mode(0o1777)).unwrap();
    LockDir::open(&shared.join("locks")).unwrap();

    let (_d, own) = own_cgroup("pids");
    let e = Tree::set_up(Layout {
        locks: link,
        ..layout(&own, "xce-agent.1.2")
    })
    .unwrap_err();
    assert!(
        matches!(
            &e,
            SetUpError::LockDir(LockDirError::Unsafe {
                why: Unsafe::Symlink,
                ..
            })
        ),
        "{e}"
    );
    assert!(e.to_string().contains("symbolic link"), "{e}");
    assert!(!own.join("xce-agent.1.2").exists());

    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped the ownership cases: only root can give a directory to another user; CI runs as root");
        return;
    }
    let nobody = Some(nix::unistd::Uid::from_raw(65534));
    let theirs = dir.path().join("theirs");
    fs::create_dir(&theirs).unwrap();
    fs::set_permissions(&theirs, fs::Permissions::from_mode(0o700)).unwrap();
    nix::unistd::chown(&theirs, nobody, None).unwrap();
    assert_eq!(refused(&theirs), Unsafe::Owner(65534));
    assert_eq!(
        refused(&theirs.join("locks")),
        Unsafe::AncestorOwner {
            dir: theirs.clone(),
            uid: 65534
        }
    );
}

thread_local! {
    /// How many more times [`busy_rmdir`] answers EBUSY on this thread.
    static STILL_BUSY: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// A cgroup whose killed processes are still exiting: EBUSY while [`STILL_BUSY`] counts
/// down, then the removal (a plain directory's).
fn busy_rmdir(path: &Path) -> std::io::Result<()> {
    if STILL_BUSY.get() > 0 {
        STILL_BUSY.set(STILL_BUSY.get() - 1);
        return Err(std::io::Error::from_raw_os_error(libc::EBUSY));
    }
    fs::remove_dir(path)
}

/// A removal waits out a cgroup that stays busy for a while (a loaded host running the
/// killed processes' exits late), and gives up, without hanging, on one that stays busy.
#[test]
fn a_busy_cgroup_is_removed_once_free_and_left_after_the_patience() {
    let kernel = Kernel {
        rmdir: busy_rmdir,
        ..fake::KERNEL
    };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run-1");
    fs::create_dir(&dir).unwrap();
    STILL_BUSY.set(12);
    assert!(subtree::remove_dir_patiently(&kernel, &dir));
    assert!(!dir.exists(), "removed once free");
    assert_eq!(STILL_BUSY.get(), 0);

    fs::create_dir(&dir).unwrap();
    STILL_BUSY.set(u32::MAX);
    let soon = std::time::Instant::now() + std::time::Duration::from_millis(20);
    assert!(!subtree::remove_dir_by(&kernel, &dir, soon));
    assert!(
        dir.is_dir(),
        "left, with a warning, once the patience is spent"
    );
}

thread_local! {
    /// The directories [`stuck_rmdir`] was asked to remove, in order.
    static RMDIRS: std::cell::RefCell<Vec<PathBuf>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A cgroup named `stuck` never empties (its process is in uninterruptible sleep on a hung
/// filesystem); every other one is removed. Each call is noted in [`RMDIRS`].
fn stuck_rmdir(path: &Path) -> std::io::Result<()> {
    RMDIRS.with_borrow_mut(|calls| calls.push(path.to_owned()));
    if path.ends_with("stuck") {
        return Err(std::io::Error::from_raw_os_error(libc::EBUSY));
    }
    fake::rmdir(path)
}

/// A subtree with a cgroup that never empties: its siblings go, the cgroups above it are
/// not waited for (they cannot go while it stays: one patience for the whole removal, not
/// one per level), and the removal says it left something.
#[test]
fn a_subtree_with_a_stuck_cgroup_is_waited_for_once_and_its_parents_not_at_all() {
    let kernel = Kernel {
        rmdir: stuck_rmdir,
        ..fake::KERNEL
    };
    let tmp = tempfile::tempdir().unwrap();
    let probes = tmp.path().join("probes");
    for dir in ["", "hung", "hung/stuck", "fine", "fine/run-1"] {
        fake::mkdir(&probes.join(dir)).unwrap();
    }
    RMDIRS.with_borrow_mut(Vec::clear);
    let soon = std::time::Instant::now() + std::time::Duration::from_millis(20);
    assert!(!subtree::remove_tree_by(&kernel, &probes, soon));
    assert!(
        !probes.join("fine").exists(),
        "the healthy probe's cgroups removed"
    );
    assert!(probes.join("hung/stuck").is_dir());
    let calls = RMDIRS.with_borrow(Clone::clone);
    assert!(
        calls
            .iter()
            .all(|p| p.ends_with("stuck") || p.starts_with(probes.join("fine"))),
        "a parent of the stuck cgroup was tried: {calls:?}"
    );
}
