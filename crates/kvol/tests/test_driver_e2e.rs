//! `kvol test-driver` end to end: against kvol's bundled driver (every case that applies passes, in well under a minute), against the upstream hostpath driver with its project's own definition (when `KVOL_UPSTREAM_HOSTPATH` names it), and against broken drivers, each caught by a named case whose message points at the bug.

#[allow(dead_code)]
mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use support::proxy::{ChaosConfig, ChaosDriver, Fault};
use support::{Daemon, enter_private_mount_namespace, wait_for_path};

const BUNDLED: &str = "hostpath.csi.kvol.io";

/// kvol's bundled driver as the test-driver YAML its authors would write: an xfs class (so a
/// loop-backed volume grows online without CAP_SYS_RESOURCE), snapshots, clones, expansion,
/// fsGroup, one inline volume; `block: true` is added where loop devices can be made.
const BUNDLED_DEFINITION: &str = "
StorageClass:
  FromFile: xfs-class.yaml
SnapshotClass:
  FromName: true
DriverInfo:
  Name: hostpath.csi.kvol.io
  SupportedSizeRange:
    Min: 300Mi
  SupportedFsType: {xfs: {}}
  Capabilities:
    persistence: true
    exec: true
    multipods: true
    snapshotDataSource: true
    pvcDataSource: true
    controllerExpansion: true
    nodeExpansion: true
    singleNodeVolume: true
    fsGroup: true
InlineVolumes:
- Attributes: {}
";

const XFS_CLASS: &str = "
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: kvol-xfs
provisioner: hostpath.csi.kvol.io
parameters:
  csi.storage.k8s.io/fstype: xfs
";

/// The hostpath project's definition in our words, for when its source is not at hand.
const HOSTPATH_DEFINITION: &str = "
StorageClass: {FromName: true}
SnapshotClass: {FromName: true}
DriverInfo:
  Name: hostpath.csi.k8s.io
  SupportedSizeRange: {Min: 1Mi}
  Capabilities:
    block: true
    controllerExpansion: true
    exec: true
    multipods: true
    nodeExpansion: true
    persistence: true
    singleNodeVolume: true
    snapshotDataSource: true
    topology: true
    FSResizeFromSourceNotSupported: true
InlineVolumes:
- shared: true
";

/// A run of `kvol test-driver`: its output and how long it took.
struct Run {
    output: Output,
    elapsed: Duration,
    junit: String,
}

impl Run {
    fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.output.stdout).into_owned()
    }

    /// The table's line for `case` and the lines under it (a failure's details).
    fn case_lines(&self, case: &str) -> Vec<String> {
        let stdout = self.stdout();
        let lines: Vec<&str> = stdout.lines().collect();
        let Some(at) = lines.iter().position(|l| l.split_whitespace().next() == Some(case)) else {
            panic!("case {case} is not in the table:\n{stdout}");
        };
        let details = lines[at + 1..].iter().take_while(|l| l.starts_with("    "));
        std::iter::once(lines[at]).chain(details.copied()).map(str::to_string).collect()
    }

    fn result_of(&self, case: &str) -> String {
        self.case_lines(case)[0].split_whitespace().nth(1).unwrap_or_default().to_string()
    }
}

fn kvol() -> &'static str {
    env!("CARGO_BIN_EXE_kvol")
}

/// Runs `kvol test-driver` with `args` (its work directory and JUnit file under `dir`).
fn test_driver(dir: &Path, definition: &Path, args: &[&str]) -> Run {
    let junit = dir.join("junit.xml");
    let started = Instant::now();
    let output = Command::new(kvol())
        .arg("test-driver")
        .arg("--driver-definition")
        .arg(definition)
        .arg("--work-dir")
        .arg(dir.join("work"))
        .arg("--junit")
        .arg(&junit)
        .arg("--show-skipped")
        .args(args)
        .env_remove("KVOL_VOLUME_BACKING")
        .output()
        .unwrap();
    let elapsed = started.elapsed();
    let run = Run { output, elapsed, junit: std::fs::read_to_string(&junit).unwrap_or_default() };
    println!("{}", run.stdout());
    eprintln!("{}", String::from_utf8_lossy(&run.output.stderr));
    run
}

/// The bundled driver's command line for `--driver-command`, its state under `dir`.
fn bundled_command(dir: &Path) -> String {
    format!(
        "{} csi-driver --csi-socket {{socket}} --no-register --node-name kvol-test-node --state-dir {}",
        kvol(),
        dir.join("driver-state").display()
    )
}

/// Whether `tool` is an executable in one of PATH's directories.
fn in_path(tool: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).any(|dir| dir.join(tool).is_file())
}

/// Whether the bundled driver can back raw block volumes here (loop devices).
fn loop_devices_usable() -> bool {
    Path::new("/dev/loop-control").exists()
        && Command::new("losetup").arg("--version").output().is_ok_and(|o| o.status.success())
}

fn write_bundled_definition(dir: &Path) -> PathBuf {
    std::fs::write(dir.join("xfs-class.yaml"), XFS_CLASS).unwrap();
    let definition = dir.join("bundled.yaml");
    let mut text = BUNDLED_DEFINITION.to_string();
    if !in_path("mkfs.xfs") {
        // Loop-backed ext4 then, which grows online only with CAP_SYS_RESOURCE: said as the
        // driver's authors would say it.
        println!("no mkfs.xfs here: the bundled driver's definition uses ext4 and offline expansion only");
        text = text
            .replace("  FromFile: xfs-class.yaml", "  FromName: true")
            .replace("  SupportedFsType: {xfs: {}}\n", "")
            .replace(
                "    controllerExpansion: true\n",
                "    controllerExpansion: true\n    onlineExpansion: false\n",
            );
    }
    if loop_devices_usable() {
        text = text.replace("    fsGroup: true\n", "    fsGroup: true\n    block: true\n");
    } else {
        println!("no loop devices here: the bundled driver's definition leaves out block");
    }
    std::fs::write(&definition, text).unwrap();
    definition
}

fn scratch() -> (kvol_test_support::ScratchRoot, PathBuf) {
    let root = kvol_test_support::ScratchRoot::new();
    let path = std::fs::canonicalize(root.path()).unwrap();
    (root, path)
}

fn assert_passed(run: &Run, cases: &[&str]) {
    for case in cases {
        assert_eq!(run.result_of(case), "passed", "{case}: {:?}", run.case_lines(case));
    }
}

#[test]
fn the_bundled_driver_passes_every_case_that_applies_to_it() {
    enter_private_mount_namespace();
    let (_root, dir) = scratch();
    let definition = write_bundled_definition(&dir);
    let run = test_driver(&dir, &definition, &["--driver-command", &bundled_command(&dir)]);
    println!("kvol test-driver against the bundled driver: {:.1}s", run.elapsed.as_secs_f64());
    assert!(run.output.status.success(), "a case failed (exit {})", run.output.status);
    assert_passed(
        &run,
        &[
            "provision-defaults",
            "provision-from-snapshot",
            "provision-from-claim",
            "snapshottable",
            "volumes-store-data",
            "volumes-exec",
            "volume-io",
            "volumemode-filesystem-as-block",
            "subpath-non-existent",
            "subpath-existing-directory",
            "subpath-file",
            "subpath-symlink-outside",
            "subpath-backstepping",
            "multivolume-two-volumes",
            "multivolume-same-volume-two-pods",
            "multivolume-read-only",
            "fsgroup-always",
            "fsgroup-on-root-mismatch",
            "expand-offline",
            "ephemeral-read-write",
            "ephemeral-read-only",
            "ephemeral-two-pods",
            "ephemeral-multiple",
            "generic-ephemeral-read-write",
            "volume-stats",
            "driver-restart-stage-publish",
        ],
    );
    if loop_devices_usable() {
        assert_passed(&run, &["block-store-data", "volumemode-block-as-filesystem"]);
    }
    if in_path("mkfs.xfs") {
        assert_passed(&run, &["expand-online"]);
    }
    // With runc and busybox (the environment's KVOL_RUNC, KVOL_BUSYBOX) three cases check in
    // real containers; without them every case says it checked host-side.
    let stderr = String::from_utf8_lossy(&run.output.stderr);
    let containers = std::env::var_os("KVOL_RUNC").is_some() && std::env::var_os("KVOL_BUSYBOX").is_some();
    let said = if containers {
        "volumes-store-data, volumes-exec, fsgroup-always check in containers"
    } else {
        "every case checks host-side"
    };
    assert!(stderr.contains(said), "{stderr}");
    // The one case the definition does not allow, with upstream's reason.
    assert_eq!(run.result_of("provision-mount-options"), "skipped");
    assert!(run.stdout().contains("skipped provision-mount-options: driver \"hostpath.csi.kvol.io\" does not define supported mount option"));
    let skipped = 1 + if loop_devices_usable() { 0 } else { 2 } + if in_path("mkfs.xfs") { 0 } else { 1 };
    let counts = format!("tests=\"30\" failures=\"0\" errors=\"0\" skipped=\"{skipped}\"");
    assert!(run.junit.contains(&counts), "{}", run.junit);
    assert!(run.junit.contains(
        "name=\"External Storage [Driver: hostpath.csi.kvol.io] [Testpattern: Dynamic PV (default fs)] volumes should store data\""
    ));
    assert!(run.elapsed < Duration::from_secs(60), "the run took {:?}", run.elapsed);
    // Nothing is left mounted or on disk in the run's directory.
    let left: Vec<_> = std::fs::read_dir(dir.join("work")).unwrap().flatten().map(|e| e.path()).collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// The hostpath project's own definition, `deploy/kubernetes-latest/test-driver.yaml` of its
/// checkout: `KVOL_UPSTREAM_HOSTPATH_SRC`, else the one beside the binary
/// (`<peers>/bin/hostpathplugin` → `<peers>/src/csi-driver-host-path`); else our equivalent.
fn hostpath_definition(binary: &Path, dir: &Path) -> PathBuf {
    let source = std::env::var_os("KVOL_UPSTREAM_HOSTPATH_SRC")
        .map(PathBuf::from)
        .or_else(|| Some(binary.parent()?.parent()?.join("src/csi-driver-host-path")));
    let shipped = source
        .map(|s| s.join("deploy/kubernetes-latest/test-driver.yaml"))
        .and_then(|file| std::fs::canonicalize(file).ok());
    if let Some(file) = shipped {
        println!("using the hostpath project's definition {}", file.display());
        return file;
    }
    println!(
        "the hostpath project's source is not at hand (set KVOL_UPSTREAM_HOSTPATH_SRC): using our equivalent"
    );
    let file = dir.join("hostpath.yaml");
    std::fs::write(&file, HOSTPATH_DEFINITION).unwrap();
    file
}

#[test]
fn the_upstream_hostpath_driver_passes_with_its_projects_own_definition() {
    let Some(binary) =
        std::env::var_os("KVOL_UPSTREAM_HOSTPATH").filter(|v| !v.is_empty()).map(PathBuf::from)
    else {
        eprintln!("skipped: set KVOL_UPSTREAM_HOSTPATH to the upstream csi-driver-host-path hostpathplugin");
        return;
    };
    enter_private_mount_namespace();
    let (_root, dir) = scratch();
    let definition = hostpath_definition(&binary, &dir);
    let command = format!(
        "{} --endpoint=unix://{{socket}} --nodeid=kvol-test-node --drivername=hostpath.csi.k8s.io --statedir={}",
        binary.display(),
        dir.join("hostpath-state").display()
    );
    let run = test_driver(&dir, &definition, &["--driver-command", &command]);
    println!("kvol test-driver against the upstream hostpath driver: {:.1}s", run.elapsed.as_secs_f64());
    assert!(run.output.status.success(), "a case failed (exit {})", run.output.status);
    assert_passed(
        &run,
        &[
            "provision-defaults",
            "provision-from-snapshot",
            "snapshottable",
            "volumes-store-data",
            "volumes-exec",
            "volume-io",
            "subpath-symlink-outside",
            "multivolume-two-volumes",
            "multivolume-same-volume-two-pods",
            "multivolume-read-only",
            "expand-offline",
            "expand-online",
            "ephemeral-read-write",
            "ephemeral-two-pods",
            "generic-ephemeral-read-write",
            "volume-stats",
            "driver-restart-stage-publish",
        ],
    );
    if loop_devices_usable() {
        assert_passed(&run, &["block-store-data"]);
    }
    // Its definition has no pvcDataSource and no fsGroup: skipped as upstream skips them.
    assert_eq!(run.result_of("provision-from-claim"), "skipped");
    assert_eq!(run.result_of("fsgroup-always"), "skipped");
    assert_eq!(run.result_of("fsgroup-on-root-mismatch"), "skipped");
    assert!(run.elapsed < Duration::from_secs(120), "the run took {:?}", run.elapsed);
}

/// The bundled driver behind the misbehaving proxy, told `fault`; `kvol test-driver` runs
/// `cases` against it. The same cases are first run with the proxy behaving, and pass.
fn broken_driver_run(fault: Fault, cases: &str) -> Run {
    enter_private_mount_namespace();
    let (_root, dir) = scratch();
    let definition = write_bundled_definition(&dir);
    let backend = dir.join("backend.sock");
    let mut driver = Command::new(kvol());
    driver
        .args(["csi-driver", "--no-register", "--node-name", "kvol-test-node", "--csi-socket"])
        .arg(&backend)
        .arg("--state-dir")
        .arg(dir.join("driver-state"))
        .env_remove("KVOL_VOLUME_BACKING");
    let _driver = Daemon::spawn("the bundled driver", driver, &dir.join("driver.log"));
    wait_for_path(&backend, "the bundled driver's socket", Duration::from_secs(30));
    let socket = dir.join("proxy.sock");
    let proxy = ChaosDriver::start(ChaosConfig {
        name: BUNDLED,
        socket: &socket,
        backend: &backend,
        registration_dir: None,
        weights: [1, 0, 0],
        seed: 1,
    });
    let socket_arg = socket.display().to_string();
    let args = ["--driver-socket", socket_arg.as_str(), "--focus", cases];
    let control = test_driver(&dir, &definition, &args);
    assert!(control.output.status.success(), "the cases fail against the driver without {fault:?}");
    proxy.set_fault(Some(fault));
    let run = test_driver(&dir, &definition, &args);
    proxy.set_fault(None);
    assert_eq!(run.output.status.code(), Some(1), "a driver with {fault:?} was not caught");
    run
}

/// Checks that `case` failed with a message holding every one of `words`.
fn assert_caught(run: &Run, case: &str, words: &[&str]) {
    let lines = run.case_lines(case);
    assert_eq!(run.result_of(case), "FAILED", "{lines:?}");
    let text = lines.join("\n");
    for word in words {
        assert!(text.contains(word), "{case}'s failure does not say {word:?}:\n{text}");
    }
}

#[test]
fn a_driver_that_ignores_readonly_is_caught_by_the_read_only_cases() {
    let run = broken_driver_run(Fault::IgnoreReadonly, "multivolume-read-only,ephemeral-read-only");
    assert_caught(
        &run,
        "multivolume-read-only",
        &[
            "is not mounted read-only",
            "the driver ignored NodePublishVolume's readonly",
            "call:    NodePublishVolume",
            "readonly=true",
        ],
    );
    assert_caught(
        &run,
        "ephemeral-read-only",
        &["the driver ignored NodePublishVolume's readonly", "call:    NodePublishVolume"],
    );
}

#[test]
fn a_driver_that_loses_data_across_unstage_is_caught_by_volumes_should_store_data() {
    let run = broken_driver_run(Fault::LoseDataOnUnstage, "volumes-store-data,multivolume-two-volumes");
    assert_caught(
        &run,
        "volumes-store-data",
        &["the data did not survive the volume's NodeUnstageVolume", "index.html"],
    );
    assert_caught(&run, "multivolume-two-volumes", &["unstaged and staged again in between", "/data"]);
    assert!(run.stdout().contains("0 passed, 2 failed, 0 skipped"), "only the focused cases are listed");
}

#[test]
fn a_driver_whose_volume_stats_lie_is_caught_by_the_stats_case() {
    let run = broken_driver_run(Fault::LyingStats, "volume-stats");
    assert_caught(
        &run,
        "volume-stats",
        &["NodeGetVolumeStats lies: used_bytes is 0 after", "call:    NodeGetVolumeStats"],
    );
}

#[test]
fn a_driver_that_mounts_at_the_wrong_path_is_caught_when_it_publishes() {
    let run = broken_driver_run(Fault::WrongPath, "volumes-store-data");
    assert_caught(
        &run,
        "volumes-store-data",
        &[
            "NodePublishVolume answered OK but nothing is mounted at its target_path",
            "/mount:",
            "somewhere else",
        ],
    );
}

#[test]
fn a_run_that_cannot_start_says_why_and_leaves_nothing() {
    let (_root, dir) = scratch();
    let definition = write_bundled_definition(&dir);
    let nameless = dir.join("nameless.yaml");
    std::fs::write(&nameless, "StorageClass: {FromName: true}\nDriverInfo: {Capabilities: {block: true}}\n")
        .unwrap();
    // (definition, driver arguments, exit code, what stderr says)
    let table: [(&Path, &[&str], i32, &str); 4] = [
        (&definition, &[], 2, "<--driver-socket <DRIVER_SOCKET>|--driver-command <DRIVER_COMMAND>>"),
        (
            &nameless,
            &["--driver-command", "/bin/true {socket}"],
            1,
            "nameless.yaml: DriverInfo.Name: not set",
        ),
        (
            &definition,
            &["--driver-command", "/bin/true"],
            1,
            "it does not name the socket: put {socket} where",
        ),
        (
            &definition,
            &["--driver-command", "/bin/false {socket}"],
            1,
            "the driver exited (exit status: 1); its output is in",
        ),
    ];
    for (file, args, code, said) in table {
        let run = test_driver(&dir, file, args);
        let stderr = String::from_utf8_lossy(&run.output.stderr);
        assert_eq!(run.output.status.code(), Some(code), "{args:?}: {stderr}");
        assert!(stderr.contains(said), "{args:?}: {stderr}");
        assert!(run.junit.is_empty(), "no report without a run");
    }
    let left: Vec<_> =
        std::fs::read_dir(dir.join("work")).into_iter().flatten().flatten().map(|e| e.path()).collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}
