//! The real `kvol csi-driver` binary: it binds its sockets, stops cleanly on SIGTERM or SIGINT and removes them, and refuses what it must refuse.
//!
//! No volume is mounted here (the driver mounts only when asked over gRPC, which the kvol-csi
//! tests do), so these tests need no mount namespace.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A scratch directory removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("kvol-csi-driver-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    fn path(&self, relative: &str) -> PathBuf {
        self.0.join(relative)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn driver(scratch: &Scratch, extra: &[&str]) -> Child {
    driver_with_env(scratch, extra, &[])
}

fn driver_with_env(scratch: &Scratch, extra: &[&str], env: &[(&str, &str)]) -> Child {
    let state = scratch.path("state");
    let csi = scratch.path("plugins/csi.sock");
    let reg = scratch.path("registry");
    let mut args = vec![
        "csi-driver".to_string(),
        "--node-name=node-a".to_string(),
        format!("--state-dir={}", state.display()),
        format!("--csi-socket={}", csi.display()),
    ];
    if !extra.contains(&"--no-register") {
        args.push(format!("--registration-dir={}", reg.display()));
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    Command::new(env!("CARGO_BIN_EXE_kvol"))
        .args(&args)
        .env_remove("KVOL_CONFIG")
        .env_remove("KVOL_FEATURE_GATES")
        .env_remove("KVOL_VOLUME_BACKING")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the kvol binary runs")
}

/// Waits until every path exists, or the child exits, or 20 seconds pass.
fn wait_for(child: &mut Child, paths: &[&Path]) {
    let start = Instant::now();
    while !paths.iter().all(|p| p.exists()) {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("kvol csi-driver exited early with {status}");
        }
        assert!(start.elapsed() < Duration::from_secs(20), "sockets never appeared: {paths:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn signal(child: &Child, name: &str) {
    let status =
        Command::new("kill").args(["-s", name, &child.id().to_string()]).status().expect("kill runs");
    assert!(status.success());
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn it_serves_until_sigterm_then_removes_its_sockets() {
    let scratch = Scratch::new("term");
    let csi = scratch.path("plugins/csi.sock");
    let reg = scratch.path("registry/hostpath.csi.kvol.io-reg.sock");
    let mut child = driver(&scratch, &[]);
    wait_for(&mut child, &[&csi, &reg]);
    for dir in ["state/volumes", "state/snapshots", "state/ephemeral"] {
        assert!(scratch.path(dir).is_dir(), "{dir} is created");
    }
    signal(&child, "TERM");
    let out: Output = child.wait_with_output().unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(!csi.exists() && !reg.exists(), "both sockets are removed");
    assert!(
        err.contains(&format!(
            "kvol: csi driver hostpath.csi.kvol.io on node node-a serving {}",
            csi.display()
        )),
        "{err}"
    );
    assert!(err.contains(&format!("registers through {}", reg.display())), "{err}");
    assert!(err.ends_with("kvol: csi driver hostpath.csi.kvol.io stopped; sockets removed\n"), "{err}");
}

#[test]
fn without_registration_it_serves_the_csi_socket_only_and_stops_on_sigint() {
    let scratch = Scratch::new("int");
    let csi = scratch.path("plugins/csi.sock");
    let mut child = driver(&scratch, &["--no-register", "--name=other.example"]);
    wait_for(&mut child, &[&csi]);
    assert!(!scratch.path("registry").exists(), "no registration directory is touched");
    signal(&child, "INT");
    let out = child.wait_with_output().unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("kvol: csi driver other.example serves no registration socket"), "{err}");
    assert!(!csi.exists());
}

#[test]
fn a_file_in_the_sockets_place_fails_the_start_with_its_name() {
    let scratch = Scratch::new("busy");
    let csi = scratch.path("plugins/csi.sock");
    std::fs::create_dir_all(csi.parent().unwrap()).unwrap();
    std::fs::write(&csi, "mine").unwrap();
    let out = driver(&scratch, &[]).wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr),
        format!(
            "kvol: plugin socket {}: something other than a socket is there; refusing to replace it\n",
            csi.display()
        )
    );
    assert_eq!(std::fs::read_to_string(&csi).unwrap(), "mine");
}

#[test]
fn a_bad_driver_name_is_refused_before_anything_is_bound() {
    let scratch = Scratch::new("name");
    let out = driver(&scratch, &["--name=bad name"]).wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.starts_with("kvol: csi driver bad name: driver name \"bad name\" may hold only"), "{err}");
    assert!(!scratch.path("plugins").exists());
}

#[test]
fn kvol_plugins_lists_a_registered_csi_driver_with_its_version_and_csidriver_settings() {
    let scratch = Scratch::new("plugins");
    let mut child = driver(&scratch, &[]);
    let reg = scratch.path("registry/hostpath.csi.kvol.io-reg.sock");
    wait_for(&mut child, &[&scratch.path("plugins/csi.sock"), &reg]);
    let manifests = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/csi/hostpath-csidriver.yaml");
    let out = Command::new(env!("CARGO_BIN_EXE_kvol"))
        .args(["plugins", "-o", "json", "--node-name", "node-a"])
        .arg(format!("--registration-dir={}", scratch.path("registry").display()))
        .arg(format!("--flex-dir={}", scratch.path("no-flex").display()))
        .arg(format!("--manifests={}", manifests.display()))
        .env_remove("KVOL_CONFIG")
        .env_remove("KVOL_FEATURE_GATES")
        .output()
        .unwrap();
    signal(&child, "TERM");
    let _ = child.wait();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    let row = rows.iter().find(|r| r["name"] == "hostpath.csi.kvol.io").expect("the driver is listed");
    assert_eq!(row["kind"], "csi");
    assert_eq!(row["registered"], true);
    assert_eq!(row["source"], "csi");
    assert_eq!(row["details"]["version"], "1.0.0");
    assert_eq!(row["details"]["nodeID"], "node-a");
    assert_eq!(row["details"]["endpoint"], scratch.path("plugins/csi.sock").display().to_string());
    assert!(row["details"]["nodeCapabilities"].as_str().unwrap().contains("STAGE_UNSTAGE_VOLUME"), "{row}");
    assert!(
        row["details"]["csiDriver"].as_str().unwrap().starts_with("attachRequired=false podInfoOnMount=true"),
        "{row}"
    );
    assert!(row["capabilities"].as_array().unwrap().contains(&"stage".into()), "{row}");
}

/// The line the driver says at start about its volume backing, once it serves (then stopped).
fn backing_line(tag: &str, extra: &[&str], env: &[(&str, &str)]) -> String {
    let scratch = Scratch::new(tag);
    let mut child = driver_with_env(&scratch, &[&["--no-register"], extra].concat(), env);
    wait_for(&mut child, &[&scratch.path("plugins/csi.sock")]);
    signal(&child, "TERM");
    let out = child.wait_with_output().unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let prefix = "kvol: csi driver hostpath.csi.kvol.io: ";
    let line =
        err.lines().find_map(|l| l.strip_prefix(prefix)).unwrap_or_else(|| panic!("no backing line: {err}"));
    line.to_string()
}

/// By default the backing is decided at start, and said: loop where loop devices can be made
/// here, directories where they cannot (here: a PATH without losetup or mkfs.ext4), each with
/// why; `--volume-backing` or `KVOL_VOLUME_BACKING` (the agent's bundled driver) choose.
#[test]
fn the_volume_backing_is_decided_at_start_and_said_with_why() {
    let here = kvol_hostpath::backing::probe();
    let line = backing_line("auto", &[], &[]);
    if here.problems().is_empty() {
        assert!(
            line.starts_with("volume backing: loop (chosen automatically: loop devices can be made here"),
            "{line}"
        );
        assert!(line.ends_with("a volume holds its size and no more"), "{line}");
    } else {
        let want =
            format!("volume backing: directory (loop devices cannot be made here: {}", here.problems()[0]);
        assert!(line.starts_with(&want), "{line}");
    }

    let line = backing_line("no-tools", &[], &[("PATH", "/nonexistent-kvol-bin")]);
    assert!(line.starts_with("volume backing: directory (loop devices cannot be made here: "), "{line}");
    assert!(line.contains("losetup is not installed (not found in PATH)"), "{line}");
    assert!(line.contains("mkfs.ext4 is not installed (not found in PATH)"), "{line}");
    assert!(line.ends_with("); volumes' sizes are not enforced"), "{line}");

    let asked = "volume backing: directory (asked for); volumes' sizes are not enforced";
    assert_eq!(backing_line("env", &[], &[("KVOL_VOLUME_BACKING", "directory")]), asked);
    assert_eq!(
        backing_line("flag", &["--volume-backing=directory"], &[("KVOL_VOLUME_BACKING", "loop")]),
        asked
    );
}
