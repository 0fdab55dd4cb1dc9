//! The real `kvol status` binary over a status file written as the agent writes it: JSON, the table, a dead agent, and no or a corrupt status.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kvol_node::report::status::{
    NodeVolumeStatus, Phase, StatusReport, VolumeStatus, status_path, write_status,
};

/// A scratch directory removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("kvol-status-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn kvol_status(root: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvol"))
        .arg("status")
        .arg(format!("--root={}", root.display()))
        .args(extra)
        .env_remove("KVOL_CONFIG")
        .env_remove("KVOL_FEATURE_GATES")
        .output()
        .expect("the kvol binary runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
}

/// A report of this (living) test process, with a published and a failing volume.
fn report() -> StatusReport {
    let now = now_ms();
    StatusReport {
        node: "node-a".into(),
        pid: std::process::id(),
        started_unix_ms: now - 600_000,
        updated_unix_ms: now - 2_000,
        metrics_address: Some("127.0.0.1:10256".into()),
        volumes: vec![
            VolumeStatus {
                pod: "default/web".into(),
                pod_uid: "u-1".into(),
                volume: "data".into(),
                plugin: Some("kubernetes.io/csi:hostpath.csi.kvol.io".into()),
                phase: Phase::Published,
                migrated: false,
                device_path: None,
                staging_path: Some("/var/lib/kvol/kubelet/plugins/kubernetes.io/csi/x/globalmount".into()),
                target: Some("/var/lib/kvol/kubelet/pods/u-1/volumes/kubernetes.io~csi/data/mount".into()),
                last_error: None,
                pending_reason: None,
                progress: None,
            },
            VolumeStatus {
                pod: "default/db".into(),
                pod_uid: "u-2".into(),
                volume: "disk".into(),
                plugin: Some("kubernetes.io/csi:ebs.csi.aws.com".into()),
                phase: Phase::TearingDown,
                migrated: true,
                device_path: Some("/dev/xvdf".into()),
                staging_path: None,
                target: None,
                last_error: Some(
                    "csi driver ebs.csi.aws.com: NodeUnstageVolume failed (Internal): busy".into(),
                ),
                pending_reason: None,
                progress: None,
            },
        ],
        problems: vec!["pods.yaml document 3: no kind".into()],
        plugins: vec!["kubernetes.io/csi:hostpath.csi.kvol.io".into(), "kubernetes.io/nfs".into()],
        node_volumes: vec![NodeVolumeStatus {
            unique_name: "vol-0a1".into(),
            plugin: "kubernetes.io/csi:ebs.csi.aws.com".into(),
            phase: Phase::Failed,
            attached: true,
            device_path: Some("/dev/xvdf".into()),
            staging_path: Some("/var/lib/kvol/kubelet/plugins/kubernetes.io/csi/ebs/globalmount".into()),
            last_error: Some("mount_device failed 1 time(s): busy".into()),
            progress: None,
        }],
        csi_node: None,
        components: Vec::new(),
        snapshots: Vec::new(),
        claims: Vec::new(),
    }
}

#[test]
fn json_is_the_report_as_written() {
    let scratch = Scratch::new("json");
    let written = report();
    write_status(&scratch.0, &written).unwrap();
    let out = kvol_status(&scratch.0, &["-o", "json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let read: StatusReport = serde_json::from_slice(&out.stdout).expect("stdout is the report as JSON");
    // `updated` is the later of the report's own time and the file's (an idle agent touches
    // the file instead of writing the same report again).
    assert!(
        read.updated_unix_ms >= written.updated_unix_ms + 1_000,
        "the file's time: {}",
        read.updated_unix_ms
    );
    assert_eq!(StatusReport { updated_unix_ms: written.updated_unix_ms, ..read }, written);
    let value: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(value["volumes"][1]["phase"], "tearing-down");
    assert_eq!(value["volumes"][0]["podUid"], "u-1");
    assert_eq!(value["nodeVolumes"][0]["uniqueName"], "vol-0a1");
}

#[test]
fn the_table_is_the_default_and_shows_each_volume() {
    let scratch = Scratch::new("table");
    write_status(&scratch.0, &report()).unwrap();
    let out = kvol_status(&scratch.0, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    let lines: Vec<&str> = table.lines().collect();
    let header = format!("node node-a, agent pid {}, started 10m ago, updated ", std::process::id());
    assert!(lines[0].starts_with(&header), "{table}");
    assert!(lines[0].ends_with(", metrics on 127.0.0.1:10256"), "{table}");
    assert!(!table.contains("stale"), "this process is alive:\n{table}");
    assert!(lines.contains(&"plugins: kubernetes.io/csi:hostpath.csi.kvol.io, kubernetes.io/nfs"), "{table}");
    assert!(lines.contains(&"  pods.yaml document 3: no kind"), "{table}");
    assert_eq!(
        lines.last(),
        Some(&"pods: volumes only (no container runtime: start the agent with --container-runtime-endpoint)"),
        "{table}"
    );
    let columns = lines.iter().position(|l| l.starts_with("POD ")).expect("a column header");
    let words = |line: &str| line.split_whitespace().map(str::to_string).collect::<Vec<_>>();
    assert_eq!(words(lines[columns]), ["POD", "VOLUME", "PLUGIN", "PHASE", "DEVICE/PATH", "LAST", "ERROR"]);
    assert_eq!(
        words(lines[columns + 1]),
        [
            "default/web",
            "data",
            "kubernetes.io/csi:hostpath.csi.kvol.io",
            "published",
            "/var/lib/kvol/kubelet/pods/u-1/volumes/kubernetes.io~csi/data/mount",
            "-"
        ]
    );
    let failing = lines[columns + 2];
    assert!(failing.starts_with("default/db   disk "), "{table}");
    assert!(failing.contains(" tearing-down (migrated) "), "{table}");
    assert!(failing.ends_with("NodeUnstageVolume failed (Internal): busy"), "{table}");
    // The columns line up: every row has its PHASE where the header has it.
    let phase = lines[columns].find("PHASE").unwrap();
    assert_eq!(lines[columns + 1][phase..].split(' ').next(), Some("published"));
    assert_eq!(lines[columns + 2][phase..].split(' ').next(), Some("tearing-down"));
    // The node's own table: what is attached or staged, pods or not.
    let node = lines.iter().position(|l| *l == "attached or staged on the node:").expect("a node table");
    assert_eq!(words(lines[node + 1]), ["VOLUME", "PLUGIN", "PHASE", "DEVICE/PATH", "LAST", "ERROR"]);
    assert!(
        lines[node + 2].starts_with("vol-0a1  kubernetes.io/csi:ebs.csi.aws.com  failed  /dev/xvdf → "),
        "{table}"
    );
}

#[test]
fn a_report_of_a_dead_agent_is_called_stale() {
    let scratch = Scratch::new("stale");
    let mut dead = report();
    dead.pid = 1 << 23; // above any pid_max Linux allows
    write_status(&scratch.0, &dead).unwrap();
    let out = kvol_status(&scratch.0, &["-o", "table"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    assert!(
        table.lines().any(|l| l == "warning: agent pid 8388608 is not running: this status may be stale"),
        "{table}"
    );
}

#[test]
fn no_status_or_a_corrupt_one_fails_with_the_reason() {
    let scratch = Scratch::new("missing");
    let root = scratch.0.join("agent");
    let out = kvol_status(&root, &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    assert_eq!(
        text(&out.stderr),
        format!(
            "kvol: no status at {}: is the agent running with --state-dir {}?\n",
            status_path(&root).display(),
            root.display()
        )
    );

    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(status_path(&root), "{\"node\": ").unwrap();
    let out = kvol_status(&root, &["-o", "json"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let err = text(&out.stderr);
    assert!(
        err.starts_with(&format!("kvol: the status at {} is corrupt: ", status_path(&root).display())),
        "{err}"
    );
}
