//! Packaging: man pages and completions generated from the clap definition, and the .deb
//! built, unpacked into a throwaway root (`dpkg -x`) and run from there.

use crate::support as common;

use std::path::Path;
use std::process::Command;

fn xce_agent() -> Command {
    Command::new(env!("CARGO_BIN_EXE_xce-agent"))
}

#[test]
fn generate_assets_writes_man_pages_and_completions_from_the_cli() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = xce_agent()
        .arg("generate-assets")
        .arg(dir.path())
        .output()
        .expect("run generate-assets");
    assert!(out.status.success(), "{out:?}");
    let read = |p: &str| std::fs::read_to_string(dir.path().join(p)).expect(p);
    let man = read("man/xce-agent.1");
    assert!(
        man.starts_with(".ie") || man.contains(".TH xce-agent 1"),
        "{man}"
    );
    assert!(man.contains("\\-\\-config"), "options documented: {man}");
    assert!(read("man/xce-agent-check.1").contains(".TH xce-agent-check 1"));
    assert!(read("completions/xce-agent.bash").contains("--config"));
    assert!(read("completions/_xce-agent").contains("#compdef xce-agent"));
    assert!(read("completions/xce-agent.fish").contains("complete -c xce-agent"));
    let status = read("man/xce-agent-status.1");
    assert!(
        status.contains("\\-\\-watch"),
        "status documented: {status}"
    );
    assert!(read("man/xce-agent-listen.1").contains("table"));
    assert!(read("completions/xce-agent.bash").contains("status"));
    assert!(read("completions/_xce-agent").contains("--watch"));
    // The generator itself stays out of the user-facing docs and completions.
    assert!(!man.contains("generate\\-assets"));
    assert!(!dir.path().join("man/xce-agent-generate-assets.1").exists());
}

#[test]
fn generate_assets_into_an_unwritable_place_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("a-file");
    std::fs::write(&file, "x").expect("write");
    let out = xce_agent()
        .arg("generate-assets")
        .arg(file.join("sub"))
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("cannot write assets into"), "{stderr}");
}

/// Without cargo-deb the script says how to install it before building anything: a stand-in
/// `cargo` first on PATH has no `deb` subcommand and records what it is asked to do.
#[test]
fn build_deb_without_cargo_deb_says_how_to_install_it_before_building() {
    use std::os::unix::fs::PermissionsExt;
    let bin = tempfile::tempdir().expect("tempdir");
    let calls = bin.path().join("calls");
    let cargo = bin.path().join("cargo");
    std::fs::write(
        &cargo,
        format!(
            "#!/bin/sh\necho \"$*\" >> {}\n[ \"$1\" = deb ] && exit 101\nexit 0\n",
            calls.display()
        ),
    )
    .expect("write stand-in cargo");
    std::fs::set_permissions(&cargo, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(repo.join("packaging/build-deb.sh"))
        .env("PATH", format!("{}:/usr/bin:/bin", bin.path().display()))
        .output()
        .expect("run packaging/build-deb.sh");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        "build-deb.sh: cargo-deb is not installed; install it with: cargo install cargo-deb --locked"
    );
    let asked = std::fs::read_to_string(&calls).unwrap_or_default();
    assert_eq!(asked.trim(), "deb --version", "nothing was built");
}

/// Builds the .deb from a debug build (a release build would take minutes; what is checked
/// is the package's layout and that the packaged binary and configs work together).
#[test]
#[ignore = "needs cargo-deb and dpkg-deb; CI runs it with `cargo test -- --ignored`"]
fn deb_installs_into_a_throwaway_root_and_check_passes() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    common::require_tool(
        &cargo,
        &["deb", "--version"],
        "cargo install cargo-deb --locked",
    );
    common::require_tool("dpkg-deb", &["--version"], "apt-get install dpkg");
    let work = tempfile::tempdir().expect("tempdir");
    let debs = work.path().join("debs");
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let build = Command::new(repo.join("packaging/build-deb.sh"))
        .args(["--profile", "dev", "-o"])
        .arg(format!("{}/", debs.display()))
        .env("CARGO", &cargo)
        .output()
        .expect("run packaging/build-deb.sh");
    assert!(
        build.status.success(),
        "build-deb.sh failed:\n{}",
        String::from_utf8_lossy(&build.stderr)
    );
    let deb = std::fs::read_dir(&debs)
        .expect("deb dir")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .expect("a .deb was built");

    let root = work.path().join("root");
    let x = Command::new("dpkg-deb")
        .arg("-x")
        .arg(&deb)
        .arg(&root)
        .output()
        .expect("dpkg-deb -x");
    assert!(x.status.success(), "{x:?}");
    for path in [
        "usr/bin/xce-agent",
        "usr/libexec/xce-agent/plugins/scratch_free",
        "lib/systemd/system/xce-agent.service",
        "etc/xce/agent.yaml",
        "etc/xce/resources.yaml",
        "usr/share/man/man1/xce-agent.1.gz",
        "usr/share/bash-completion/completions/xce-agent",
    ] {
        assert!(root.join(path).exists(), "{path} missing from the package");
    }
    let control = Command::new("dpkg-deb")
        .arg("-f")
        .arg(&deb)
        .arg("Package")
        .output()
        .expect("dpkg-deb -f");
    assert_eq!(String::from_utf8_lossy(&control.stdout).trim(), "xce-agent");
    // The configs are conffiles: an upgrade keeps the admin's edits.
    let ctrl = work.path().join("control");
    let e = Command::new("dpkg-deb")
        .arg("-e")
        .arg(&deb)
        .arg(&ctrl)
        .output()
        .expect("dpkg-deb -e");
    assert!(e.status.success(), "{e:?}");
    let conffiles = std::fs::read_to_string(ctrl.join("conffiles")).expect("conffiles");
    assert_eq!(
        conffiles.lines().collect::<Vec<_>>(),
        ["/etc/xce/agent.yaml", "/etc/xce/resources.yaml"]
    );

    // The packaged agent.yaml names /etc/xce and /usr/libexec paths; the test's copy points
    // them into the throwaway root, nothing else changed.
    let packaged = std::fs::read_to_string(root.join("etc/xce/agent.yaml")).expect("agent.yaml");
    assert!(packaged.contains("/usr/libexec/xce-agent/plugins"));
    let relocated = packaged
        .replace(
            "/usr/libexec/xce-agent/plugins",
            &root.join("usr/libexec/xce-agent/plugins").to_string_lossy(),
        )
        .replace(
            "/etc/xce/resources.yaml",
            &root.join("etc/xce/resources.yaml").to_string_lossy(),
        );
    let agent_yaml = work.path().join("agent.yaml");
    std::fs::write(&agent_yaml, relocated).expect("write agent.yaml");
    let check = Command::new(root.join("usr/bin/xce-agent"))
        .arg("check")
        .arg("--config")
        .arg(&agent_yaml)
        .output()
        .expect("run the packaged xce-agent");
    let stdout = String::from_utf8_lossy(&check.stdout);
    assert!(
        check.status.success(),
        "packaged check failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&check.stderr)
    );
    assert!(stdout.contains("configuration OK"), "{stdout}");
    assert!(stdout.contains("scratch_free_mb"), "{stdout}");

    // The unit starts the binary the package installs, with the config the package installs.
    let unit =
        std::fs::read_to_string(root.join("lib/systemd/system/xce-agent.service")).expect("unit");
    assert!(unit.contains("ExecStart=/usr/bin/xce-agent --config /etc/xce/agent.yaml"));
    assert!(unit.contains("Type=notify") && unit.contains("PrivateTmp=no"));
}
