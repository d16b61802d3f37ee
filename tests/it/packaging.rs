//! Packaging: man pages and completions generated from the clap definition, and the .deb and
//! .rpm built from the release profile, listed, unpacked into throwaway roots and run there.

use crate::support as common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

fn xce_agent() -> Command {
    Command::new(env!("CARGO_BIN_EXE_xce-agent"))
}

/// `xce-agent generate-assets` into a fresh directory.
fn generated_assets() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = xce_agent()
        .arg("generate-assets")
        .arg(dir.path())
        .output()
        .expect("run generate-assets");
    assert!(out.status.success(), "{out:?}");
    dir
}

#[test]
fn generate_assets_writes_man_pages_and_completions_from_the_cli() {
    let dir = generated_assets();
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

/// The `.B NAME` items of a generated man page: the fields it documents.
fn documented_fields(page: &str) -> BTreeSet<String> {
    page.lines()
        .filter_map(|l| l.strip_prefix(".B "))
        .map(|f| f.replace("\\-", "-"))
        .collect()
}

#[test]
fn section_5_pages_list_every_field_the_parser_knows() {
    use xce_agent::config::{self, agent, probe_spec};
    let dir = generated_assets();
    let read = |p: &str| std::fs::read_to_string(dir.path().join(p)).expect(p);

    let agent_page = read("man/xce-agent.yaml.5");
    assert!(
        agent_page.starts_with(".TH xce\\-agent.yaml 5 "),
        "{agent_page}"
    );
    let (fields, tls) = agent::parsed_fields();
    let want: BTreeSet<String> = fields
        .iter()
        .map(|f| f.to_string())
        .chain(tls.iter().map(|f| format!("tls.{f}")))
        .collect();
    assert_eq!(documented_fields(&agent_page), want);

    let resources_page = read("man/xce-resources.yaml.5");
    assert!(
        resources_page.starts_with(".TH xce\\-resources.yaml 5 "),
        "{resources_page}"
    );
    let want: BTreeSet<String> = config::RESOURCE_FIELDS
        .iter()
        .chain(config::INSTANCE_FIELDS)
        .chain(config::probe_spec::FIELDS.iter().map(|(f, _)| f))
        .map(|f| f.to_string())
        .chain(
            probe_spec::parsed_limit_fields()
                .iter()
                .map(|f| format!("limits.{f}")),
        )
        .collect();
    assert_eq!(documented_fields(&resources_page), want);
    // Each probe field says which kinds take it, as the parser's table does.
    for (field, takes) in probe_spec::FIELDS {
        let kinds = match takes {
            probe_spec::Takes::Every => "every kind".to_owned(),
            probe_spec::Takes::Only(kinds) => kinds.join(", "),
        };
        let item = resources_page
            .split(".TP\n")
            .find(|item| item.starts_with(&format!(".B {field}\n")))
            .unwrap_or_else(|| panic!("no item for {field}"));
        assert!(
            item.contains(&format!("Kinds: {kinds}.")),
            "{field}: {item}"
        );
    }
    // The duration grammar is stated on both pages.
    for page in [&agent_page, &resources_page] {
        assert!(page.contains("30s, 5m, 1h, 1d"), "{page}");
    }
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

/// Without rpmbuild the script says how to install it before building anything: PATH holds
/// only `dirname` and a stand-in `cargo` that records what it is asked to do.
#[test]
fn build_rpm_without_rpmbuild_says_how_to_install_it_before_building() {
    use std::os::unix::fs::PermissionsExt;
    let bin = tempfile::tempdir().expect("tempdir");
    let calls = bin.path().join("calls");
    let cargo = bin.path().join("cargo");
    std::fs::write(
        &cargo,
        format!("#!/bin/sh\necho \"$*\" >> {}\n", calls.display()),
    )
    .expect("write stand-in cargo");
    std::fs::set_permissions(&cargo, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::os::unix::fs::symlink("/usr/bin/dirname", bin.path().join("dirname")).expect("symlink");
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(repo.join("packaging/build-rpm.sh"))
        .env("PATH", bin.path())
        .output()
        .expect("run packaging/build-rpm.sh");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        "build-rpm.sh: rpmbuild is not installed; install it with: apt-get install rpm \
         (Debian/Ubuntu) or dnf install rpm-build"
    );
    assert!(!calls.exists(), "nothing was built");
}

/// What the packages must install (the .deb's paths; the .rpm holds the same files, mapped by
/// `rpm_path`); man pages are gzipped by both.
const PACKAGED: &[&str] = &[
    "/usr/bin/xce-agent",
    "/usr/libexec/xce-agent/plugins/scratch_free",
    "/lib/systemd/system/xce-agent.service",
    "/etc/xce/agent.yaml",
    "/etc/xce/resources.yaml",
    "/usr/share/man/man1/xce-agent.1.gz",
    "/usr/share/man/man1/xce-agent-check.1.gz",
    "/usr/share/man/man5/xce-agent.yaml.5.gz",
    "/usr/share/man/man5/xce-resources.yaml.5.gz",
    "/usr/share/bash-completion/completions/xce-agent",
    "/usr/share/zsh/vendor-completions/_xce-agent",
    "/usr/share/fish/vendor_completions.d/xce-agent.fish",
    "/usr/share/doc/xce-agent/PLUGINS.md",
    // The monitoring mixin (monitoring/), for Prometheus's rule_files and Grafana's import.
    "/usr/share/xce-agent/monitoring/README.md",
    "/usr/share/xce-agent/monitoring/prometheus/alerts.yaml",
    "/usr/share/xce-agent/monitoring/prometheus/rules.yaml",
    "/usr/share/xce-agent/monitoring/grafana/xce-agent.json",
];

/// Files in the .deb only: cargo-deb writes the copyright file Debian policy requires; an
/// RPM carries its license in its header.
const DEB_ONLY: &[&str] = &["/usr/share/doc/xce-agent/copyright"];

/// Where an RPM distribution keeps a file the .deb installs at `deb` (the same two moves the
/// spec's install section makes).
fn rpm_path(deb: &str) -> String {
    if let Some(unit) = deb.strip_prefix("/lib/systemd/system/") {
        format!("/usr/lib/systemd/system/{unit}")
    } else if let Some(zsh) = deb.strip_prefix("/usr/share/zsh/vendor-completions/") {
        format!("/usr/share/zsh/site-functions/{zsh}")
    } else {
        deb.to_owned()
    }
}

/// Both packages, built the way a site builds them (release profile), listed by the
/// distributions' own tools, unpacked into throwaway roots and run from there.
#[test]
#[ignore = "needs cargo-deb, dpkg-deb, rpmbuild, rpm2cpio and cpio; CI runs it with `cargo test -- --ignored`"]
fn deb_and_rpm_from_the_release_build_hold_the_same_files_and_their_check_passes() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    common::require_tool(
        &cargo,
        &["deb", "--version"],
        "cargo install cargo-deb --locked",
    );
    common::require_tool("dpkg-deb", &["--version"], "apt-get install dpkg");
    common::require_tool("rpmbuild", &["--version"], "apt-get install rpm");
    // rpm2cpio has no --version: ask the shell whether it is on PATH.
    common::require_tool(
        "sh",
        &["-c", "command -v rpm2cpio"],
        "rpm2cpio: apt-get install rpm2cpio",
    );
    common::require_tool("cpio", &["--version"], "apt-get install cpio");
    let work = tempfile::tempdir().expect("tempdir");
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));

    let debs = work.path().join("debs");
    run_ok(
        Command::new(repo.join("packaging/build-deb.sh"))
            .arg("-o")
            .arg(format!("{}/", debs.display()))
            .env("CARGO", &cargo),
    );
    let rpms = work.path().join("rpms");
    run_ok(
        Command::new(repo.join("packaging/build-rpm.sh"))
            .arg("--define")
            .arg(format!("_rpmdir {}", rpms.display()))
            .env("CARGO", &cargo),
    );
    let deb = find_file(&debs, "deb");
    let rpm = find_file(&rpms, "rpm");
    // The release profile, not a debug build: the release binary is what both packaged.
    let release = std::fs::read(repo.join("target/release/xce-agent")).expect("release binary");

    // Regular files as "mode path", e.g. "-rwxr-xr-x /usr/bin/xce-agent".
    let deb_files = listed(Command::new("dpkg-deb").arg("-c").arg(&deb), |line| {
        // "-rwxr-xr-x root/root  123 2026-01-01 00:00 ./usr/bin/xce-agent"
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (mode, path) = (fields.first()?, fields.get(5)?.trim_start_matches('.'));
        mode.starts_with('-').then(|| format!("{mode} {path}"))
    });
    let rpm_files = listed(
        Command::new("rpm")
            .args(["-qp", "--qf", "[%{FILEMODES:perms} %{FILENAMES}\\n]"])
            .arg(&rpm),
        |line| line.starts_with('-').then(|| line.to_owned()),
    );
    println!("{}:\n  {}", deb.display(), deb_files.join("\n  "));
    println!("{}:\n  {}", rpm.display(), rpm_files.join("\n  "));
    for wanted in PACKAGED {
        assert!(
            deb_files.iter().any(|f| f.ends_with(&format!(" {wanted}"))),
            "{wanted} missing from the .deb"
        );
    }
    // The complete lists, modes included, agree: a file packaged by one and not the other
    // fails here.
    let deb_as_rpm: BTreeSet<String> = deb_files
        .iter()
        .filter_map(|f| {
            let (mode, path) = f.split_once(' ')?;
            (!DEB_ONLY.contains(&path)).then(|| format!("{mode} {}", rpm_path(path)))
        })
        .collect();
    let rpm_set: BTreeSet<String> = rpm_files.iter().cloned().collect();
    let only_deb: Vec<_> = deb_as_rpm.difference(&rpm_set).collect();
    let only_rpm: Vec<_> = rpm_set.difference(&deb_as_rpm).collect();
    assert!(
        only_deb.is_empty() && only_rpm.is_empty(),
        "the packages differ (the .deb's paths mapped to the .rpm's):\n only in the .deb: \
         {only_deb:?}\n only in the .rpm: {only_rpm:?}"
    );

    // The configs are conffiles: an upgrade keeps the admin's edits.
    let ctrl = work.path().join("control");
    run_ok(Command::new("dpkg-deb").arg("-e").arg(&deb).arg(&ctrl));
    let conffiles = std::fs::read_to_string(ctrl.join("conffiles")).expect("conffiles");
    assert_eq!(
        conffiles.lines().collect::<Vec<_>>(),
        ["/etc/xce/agent.yaml", "/etc/xce/resources.yaml"]
    );
    let rpm_config = listed(Command::new("rpm").arg("-qcp").arg(&rpm), |l| {
        Some(l.to_string())
    });
    assert_eq!(
        rpm_config,
        ["/etc/xce/agent.yaml", "/etc/xce/resources.yaml"]
    );
    // Both make the key directory root-only on install.
    let postinst = std::fs::read_to_string(ctrl.join("postinst")).expect("postinst");
    let scripts = run_ok(Command::new("rpm").arg("-qp").arg("--scripts").arg(&rpm));
    for script in [&postinst, &scripts] {
        assert!(
            script.contains("install -d -m 0700 -o root -g root /etc/xce/tls"),
            "{script}"
        );
        // An upgrade restarts a running agent on the new binary.
        assert!(
            script.contains("systemctl try-restart xce-agent.service"),
            "{script}"
        );
    }
    // Removal stops the service (and its probes): the .deb's prerm, the .rpm's preun.
    let prerm = std::fs::read_to_string(ctrl.join("prerm")).expect("prerm");
    assert!(
        prerm.contains("\"$1\" = \"remove\"") && prerm.contains("systemctl stop xce-agent.service"),
        "{prerm}"
    );
    assert!(ctrl.join("postrm").exists(), "no postrm");
    let preun = scripts
        .split("preuninstall scriptlet")
        .nth(1)
        .expect("a preun scriptlet");
    assert!(
        preun.contains("disable --now xce-agent.service"),
        "{scripts}"
    );
    let control = run_ok(Command::new("dpkg-deb").arg("-f").arg(&deb).arg("Package"));
    assert_eq!(control.trim(), "xce-agent");

    let deb_root = work.path().join("deb-root");
    run_ok(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&deb_root));
    let rpm_root = work.path().join("rpm-root");
    std::fs::create_dir(&rpm_root).expect("mkdir");
    run_ok(
        Command::new("sh")
            .arg("-c")
            .arg("rpm2cpio \"$1\" | cpio -idm --quiet")
            .arg("sh")
            .arg(&rpm)
            .current_dir(&rpm_root),
    );
    for (root, unit) in [
        (&deb_root, "lib/systemd/system/xce-agent.service"),
        (&rpm_root, "usr/lib/systemd/system/xce-agent.service"),
    ] {
        let binary = std::fs::read(root.join("usr/bin/xce-agent")).expect("packaged binary");
        assert!(
            binary == release,
            "{} holds the release binary",
            root.display()
        );
        check_passes_in(root, work.path());
        // The monitoring mixin as the checkout has it (tests/it/monitoring.rs checks that).
        for file in [
            "README.md",
            "prometheus/alerts.yaml",
            "prometheus/rules.yaml",
            "grafana/xce-agent.json",
        ] {
            let packaged = std::fs::read(root.join("usr/share/xce-agent/monitoring").join(file))
                .unwrap_or_else(|e| panic!("{} lacks monitoring/{file}: {e}", root.display()));
            let checkout = std::fs::read(repo.join("monitoring").join(file)).expect("checkout");
            assert!(
                packaged == checkout,
                "monitoring/{file} differs in {}",
                root.display()
            );
        }
        // The unit starts the binary the package installs, with the config it installs.
        let unit = std::fs::read_to_string(root.join(unit)).expect("unit");
        assert!(unit.contains("ExecStart=/usr/bin/xce-agent --config /etc/xce/agent.yaml"));
        assert!(unit.contains("Type=notify") && unit.contains("PrivateTmp=no"));
    }
}

/// The packaged agent.yaml names /etc/xce and /usr/libexec paths; the test's copy points
/// them into the throwaway root, nothing else changed, and the packaged binary checks it.
fn check_passes_in(root: &Path, work: &Path) {
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
    let agent_yaml = work.join("agent.yaml");
    std::fs::write(&agent_yaml, relocated).expect("write agent.yaml");
    let stdout = run_ok(
        Command::new(root.join("usr/bin/xce-agent"))
            .arg("check")
            .arg("--config")
            .arg(&agent_yaml),
    );
    assert!(stdout.contains("configuration OK"), "{stdout}");
    assert!(stdout.contains("scratch_free_mb"), "{stdout}");
}

/// Run to success and return stdout; on failure, show what it printed.
fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn listed(cmd: &mut Command, path_of: impl Fn(&str) -> Option<String>) -> Vec<String> {
    run_ok(cmd).lines().filter_map(path_of).collect()
}

/// The one package a build wrote under `dir` (rpmbuild puts it in an <arch>/ subdirectory).
fn find_file(dir: &Path, ext: &str) -> std::path::PathBuf {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).expect("read package dir").flatten() {
            let p = entry.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|e| e == ext) {
                return p;
            }
        }
    }
    panic!("no .{ext} under {}", dir.display())
}

/// The C library's packages for the controller host (`packaging/build-receiver.sh`, release
/// profile), as a distribution would accept them: lintian reports no error; the runtime
/// package holds the stripped library (soname, links, symbols file), the -dev package the
/// header, .pc, static library, suppressions and the example, the dbgsym package the debug
/// information by build id; the .rpms have the same split. The example builds with a plain
/// `make` where the -dev package installs it (pkg-config pointed at the unpacked tree) and
/// runs valgrind-clean against the packaged release library, with the shipped suppressions.
#[tokio::test]
#[ignore = "needs dpkg-deb, dpkg-shlibdeps, lintian, rpmbuild, readelf, pkg-config, cc, make, openssl and valgrind; CI runs it with `cargo test -- --ignored`"]
async fn the_receiver_library_packages_pass_lintian_and_their_example_runs_valgrind_clean() {
    common::require_tool("dpkg-deb", &["--version"], "apt-get install dpkg");
    common::require_tool("dpkg-shlibdeps", &["--version"], "apt-get install dpkg-dev");
    common::require_tool("lintian", &["--version"], "apt-get install lintian");
    common::require_tool("rpmbuild", &["--version"], "apt-get install rpm");
    common::require_tool("readelf", &["--version"], "apt-get install binutils");
    common::require_tool("pkg-config", &["--version"], "apt-get install pkg-config");
    common::require_tool("cc", &["--version"], "apt-get install gcc");
    common::require_tool("make", &["--version"], "apt-get install make");
    common::require_tool("valgrind", &["--version"], "apt-get install valgrind");
    common::require_tool("openssl", &["version"], "apt-get install openssl");
    let work = tempfile::tempdir().expect("tempdir");
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    run_ok(
        Command::new(repo.join("packaging/build-receiver.sh"))
            .arg("-o")
            .arg(work.path())
            .current_dir(repo),
    );
    let find = |name: &str| {
        walk(work.path())
            .into_iter()
            .find(|p| {
                p.file_name()
                    .is_some_and(|f| f.to_string_lossy().starts_with(name))
            })
            .unwrap_or_else(|| panic!("no {name}* in {}", work.path().display()))
    };
    let runtime = find("libxce-receiver0_");
    let dev = find("libxce-receiver-dev_");
    let dbgsym = find("libxce-receiver0-dbgsym_");

    // lintian: no errors (and no warnings, today; overrides would need a reason).
    let out = Command::new("lintian")
        .args(["--no-cfg", "--fail-on", "error,warning"])
        .args([&runtime, &dev, &dbgsym])
        .output()
        .expect("run lintian");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "lintian:\n{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !said
            .lines()
            .any(|l| l.starts_with("E:") || l.starts_with("W:")),
        "{said}"
    );

    let lib = "/usr/lib/x86_64-linux-gnu";
    let contents = |deb: &Path| run_ok(Command::new("dpkg-deb").arg("-c").arg(deb));
    let (rt_files, dev_files, dbg_files) = (contents(&runtime), contents(&dev), contents(&dbgsym));
    for f in [
        format!("{lib}/libxce_receiver.so.0.2.0"),
        "libxce_receiver.so.0 -> libxce_receiver.so.0.2.0".to_owned(),
        "/usr/share/doc/libxce-receiver0/copyright".to_owned(),
    ] {
        assert!(
            rt_files.contains(&f),
            "{f} not in the runtime package:\n{rt_files}"
        );
    }
    assert!(
        !rt_files.contains(".a\n") && !rt_files.contains(".h\n"),
        "{rt_files}"
    );
    for f in [
        "libxce_receiver.so -> libxce_receiver.so.0",
        &format!("{lib}/libxce_receiver.a"),
        &format!("{lib}/pkgconfig/xce_receiver.pc"),
        "/usr/include/xce_receiver.h",
        "/usr/share/xce_receiver/valgrind.supp",
        "/usr/share/doc/libxce-receiver-dev/copyright",
        "/usr/share/doc/libxce-receiver-dev/examples/Makefile",
        "/usr/share/doc/libxce-receiver-dev/examples/xce-controller-example.c",
    ] {
        assert!(
            dev_files.contains(f),
            "{f} not in the -dev package:\n{dev_files}"
        );
    }
    assert!(
        dbg_files.contains("/usr/lib/debug/.build-id/"),
        "{dbg_files}"
    );
    let ctrl = work.path().join("ctrl");
    run_ok(Command::new("dpkg-deb").arg("-e").arg(&runtime).arg(&ctrl));
    let symbols = std::fs::read_to_string(ctrl.join("symbols")).expect("DEBIAN/symbols");
    assert_eq!(
        symbols,
        std::fs::read_to_string(repo.join("capi/libxce_receiver.symbols")).expect("symbols")
    );
    let triggers = std::fs::read_to_string(ctrl.join("triggers")).expect("DEBIAN/triggers");
    assert!(triggers.contains("activate-noawait ldconfig"), "{triggers}");

    let root = work.path().join("root");
    for deb in [&runtime, &dev, &dbgsym] {
        run_ok(Command::new("dpkg-deb").arg("-x").arg(deb).arg(&root));
    }
    let libdir = root.join("usr/lib/x86_64-linux-gnu");
    let so = libdir.join("libxce_receiver.so.0.2.0");
    let dynamic = run_ok(Command::new("readelf").arg("-d").arg(&so));
    assert!(
        dynamic.contains("Library soname: [libxce_receiver.so.0]"),
        "{dynamic}"
    );
    // Stripped, with a link to its debug file, which is the dbgsym package's.
    let sections = run_ok(Command::new("readelf").arg("-S").arg(&so));
    assert!(
        !sections.contains(".debug_info"),
        "the library is not stripped"
    );
    assert!(sections.contains(".gnu_debuglink"), "{sections}");
    let notes = run_ok(Command::new("readelf").arg("-n").arg(&so));
    let build_id = notes
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .expect("a build id")
        .to_owned();
    let debug = root.join(format!(
        "usr/lib/debug/.build-id/{}/{}.debug",
        &build_id[..2],
        &build_id[2..]
    ));
    let debug_sections = run_ok(Command::new("readelf").arg("-S").arg(&debug));
    assert!(debug_sections.contains(".debug_info"), "{debug_sections}");

    // The rpms: the same split.
    let rpms = |name: &str| run_ok(Command::new("rpm").arg("-qlp").arg(find(name)));
    let rpm_rt = rpms("xce-receiver-0.2.0");
    let rpm_devel = rpms("xce-receiver-devel-");
    let rpm_debug = rpms("xce-receiver-debuginfo-");
    assert!(
        rpm_rt.contains("/usr/lib64/libxce_receiver.so.0.2.0"),
        "{rpm_rt}"
    );
    assert!(
        rpm_rt.contains("/usr/share/licenses/xce-receiver/copyright"),
        "{rpm_rt}"
    );
    assert!(!rpm_rt.contains("xce_receiver.h"), "{rpm_rt}");
    for f in [
        "/usr/lib64/libxce_receiver.so\n",
        "/usr/lib64/libxce_receiver.a",
        "/usr/lib64/pkgconfig/xce_receiver.pc",
        "/usr/include/xce_receiver.h",
        "/usr/share/xce_receiver/valgrind.supp",
        "/usr/share/doc/xce-receiver-devel/examples/Makefile",
    ] {
        assert!(rpm_devel.contains(f), "{f} not in -devel:\n{rpm_devel}");
    }
    assert!(
        rpm_debug.contains(&format!("{}.debug", &build_id[2..])),
        "{rpm_debug}"
    );
    let scripts = run_ok(
        Command::new("rpm")
            .arg("-qp")
            .arg("--scripts")
            .arg(find("xce-receiver-0.2.0")),
    );
    assert!(scripts.contains("/sbin/ldconfig"), "{scripts}");

    // The example, built where the -dev package put it with a plain `make` (pkg-config on the
    // unpacked tree), under valgrind against the packaged library with the shipped
    // suppressions.
    let examples = root.join("usr/share/doc/libxce-receiver-dev/examples");
    let example = crate::capi::built_with_make(&examples, &root, &libdir);
    // The library is stripped and the suppressions name functions: valgrind needs the debug
    // file. Installed, the dbgsym package's /usr/lib/debug/.build-id/ is where it looks;
    // unpacked here, it finds it by the library's debuglink in the library's .debug/.
    let beside = libdir.join(".debug");
    std::fs::create_dir_all(&beside).expect("mkdir .debug");
    std::os::unix::fs::symlink(&debug, beside.join(format!("{}.debug", &build_id[2..])))
        .expect("link the debug file");
    assert!(
        example.suppressions.starts_with(&root),
        "{}",
        example.suppressions.display()
    );
    crate::capi::controller_life_is_valgrind_clean(&example).await;
}

/// Every file under `dir`, recursively.
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}
