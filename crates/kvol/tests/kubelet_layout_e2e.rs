//! The real `kvol agent` on a root laid out exactly as kubelet lays it out (`--root-dir`, `--volume-plugin-dir`, `--state-dir` under a scratch `/`): drivers register through `<root-dir>/plugins_registry` (the bundled driver's own registrar, and the upstream node-driver-registrar when `KVOL_NODE_DRIVER_REGISTRAR` names it) and volumes land in kubelet's tree.

// Only the process and path helpers are used here; the churn parts serve other tests.
#[allow(dead_code)]
mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use kvol_node::report::status::{Phase, StatusReport};
use kvol_plugin::{Mounter, SystemMounter};
use support::{Daemon, enter_private_mount_namespace, wait_for_path};

const BUNDLED: &str = "hostpath.csi.kvol.io";
const OTHER: &str = "registrar.csi.kvol.test";

/// A scratch `/` with kubelet's and kvol's default directories below it.
struct KubeletNode {
    top: PathBuf,
    _dir: kvol_test_support::ScratchRoot,
}

impl KubeletNode {
    fn new() -> KubeletNode {
        let dir = kvol_test_support::ScratchRoot::new();
        let top = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir_all(top.join("manifests")).unwrap();
        KubeletNode { top, _dir: dir }
    }

    /// `path` (absolute, as on a real node) below the scratch `/`.
    fn host(&self, path: &str) -> PathBuf {
        self.top.join(path.trim_start_matches('/'))
    }

    fn root_dir(&self) -> PathBuf {
        self.host("/var/lib/kubelet")
    }

    fn state_dir(&self) -> PathBuf {
        self.host("/var/lib/kvol")
    }

    fn write(&self, name: &str, text: &str) {
        let tmp = self.top.join("manifests").join(format!(".{name}.tmp"));
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, self.top.join("manifests").join(name)).unwrap();
    }

    /// `kvol agent` with kubelet's three directories given as flags, as a DaemonSet would.
    fn start_agent(&self, extra: &[&str]) -> Daemon {
        let mut command = Command::new(env!("CARGO_BIN_EXE_kvol"));
        command
            .args(["agent", "--node-name", "node-a"])
            .args(extra)
            .arg("--root-dir")
            .arg(self.root_dir())
            .arg("--volume-plugin-dir")
            .arg(self.host("/usr/libexec/kubernetes/kubelet-plugins/volume/exec"))
            .arg("--state-dir")
            .arg(self.state_dir())
            .arg("--manifests")
            .arg(self.top.join("manifests"))
            .env("KVOL_LOG", "info")
            .env_remove("KVOL_CONFIG")
            .env_remove("KVOL_FEATURE_GATES");
        Daemon::spawn("kvol agent", command, &self.top.join("agent.log"))
    }

    fn wait_published(&self, agent: &mut Daemon, pod: &str, volume: &str) -> StatusReport {
        let start = std::time::Instant::now();
        loop {
            agent.assert_running();
            if let Ok(report) = kvol_node::report::status::read_status(&self.state_dir())
                && report
                    .volumes
                    .iter()
                    .any(|v| v.pod == pod && v.volume == volume && v.phase == Phase::Published)
            {
                return report;
            }
            if start.elapsed() >= Duration::from_secs(60) {
                let logs: Vec<String> = ["agent.log", "driver.log", "registrar.log"]
                    .iter()
                    .filter_map(|name| {
                        let text = std::fs::read_to_string(self.top.join(name)).ok()?;
                        Some(format!("--- {name}:\n{text}"))
                    })
                    .collect();
                panic!("{pod}/{volume} never published; logs:\n{}", logs.join("\n"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Checks that `pod`'s CSI volume `volume` is mounted at kubelet's publish path.
    fn assert_in_kubelets_tree(&self, report: &StatusReport, pod: &str, volume: &str) {
        let v = report.volumes.iter().find(|v| v.pod == pod && v.volume == volume).unwrap();
        let expected =
            self.root_dir().join("pods").join(&v.pod_uid).join("volumes/kubernetes.io~csi").join(volume);
        assert_eq!(v.target.as_deref(), Some(expected.as_path()), "{pod}/{volume}: the pod volume directory");
        let mounted = SystemMounter.mounts_under(&self.root_dir()).unwrap();
        let publish = expected.join("mount");
        assert!(
            mounted.iter().any(|m| m.target == publish),
            "{} is not mounted: {mounted:#?}",
            publish.display()
        );
    }
}

impl Drop for KubeletNode {
    fn drop(&mut self) {
        let mut left = SystemMounter.mounts_under(&self.top).unwrap_or_default();
        left.sort_by_key(|m| std::cmp::Reverse(m.target.components().count()));
        for m in left {
            let _ = nix::mount::umount2(&m.target, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

fn csi_pod(name: &str, driver: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  containers: [{{name: app, image: busybox, volumeMounts: [{{name: scratch, mountPath: /s}}]}}]\n  volumes:\n  - {{name: scratch, csi: {{driver: {driver}}}}}\n---\napiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata: {{name: {driver}}}\nspec: {{attachRequired: false, podInfoOnMount: true, volumeLifecycleModes: [Ephemeral]}}\n"
    )
}

/// A pod with an emptyDir and a Flexvolume (the example driver kvol/tmpfs) volume.
const OTHER_PLUGINS: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: others, namespace: default}\nspec:\n  containers: [{name: app, image: busybox, volumeMounts: [{name: cache, mountPath: /c}, {name: fast, mountPath: /f}]}]\n  volumes:\n  - {name: cache, emptyDir: {}}\n  - {name: fast, flexVolume: {driver: kvol/tmpfs, options: {size: 8Mi}}}\n";

/// The address the agent serves metrics on, from its log (it was told port 0).
fn metrics_address(node: &KubeletNode) -> String {
    let log = std::fs::read_to_string(node.top.join("agent.log")).unwrap();
    let line =
        log.lines().find(|l| l.contains("serving metrics")).expect("the agent logs its metrics address");
    let start = line.find("address=").expect("an address field") + "address=".len();
    line[start..].split_whitespace().next().unwrap().to_string()
}

/// `GET /metrics` over a plain socket; the body.
fn scrape(address: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    stream.write_all(b"GET /metrics HTTP/1.0\r\nHost: kvol\r\n\r\n").unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").expect("an http response");
    assert!(head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"), "{head}");
    body.to_string()
}

/// Every metric the example dashboard queries is one this agent serves (and kubelet serves:
/// the dashboard uses kubelet's names only); the volume stats need a claim published.
fn assert_dashboard_metrics_are_served(metrics: &str) {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/grafana/node-volumes.json");
    let dashboard: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut names = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                if word.starts_with("storage_")
                    || word.starts_with("csi_")
                    || word.starts_with("volume_manager_")
                    || word.starts_with("kubelet_volume_stats_")
                {
                    names.push(word.trim_end_matches("_bucket").trim_end_matches("_count").to_string());
                }
            }
        }
    }
    assert!(names.len() >= 3, "the dashboard queries {names:?}");
    for name in names {
        assert!(metrics.lines().any(|l| l.starts_with(&format!("# TYPE {name} "))), "{name} is not served");
    }
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn the_bundled_driver_registers_in_kubelets_registry_and_publishes_into_kubelets_tree() {
    enter_private_mount_namespace();
    let node = KubeletNode::new();
    let mut agent = node.start_agent(&["--metrics-address", "127.0.0.1:0"]);
    // The bundled driver's registrar serves where kubelet's plugin watcher looks, and its CSI
    // socket is where a DaemonSet's `--kubelet-registration-path` would point.
    let registration = node.root_dir().join("plugins_registry").join(format!("{BUNDLED}-reg.sock"));
    wait_for_path(&registration, "the bundled driver's registration socket", Duration::from_secs(30));
    wait_for_path(
        &node.root_dir().join("plugins").join(BUNDLED).join("csi.sock"),
        "the bundled driver's csi socket",
        Duration::from_secs(30),
    );
    node.write("app.yaml", &csi_pod("app", BUNDLED));
    node.write("other.yaml", OTHER_PLUGINS);
    let report = node.wait_published(&mut agent, "default/app", "scratch");
    node.assert_in_kubelets_tree(&report, "default/app", "scratch");
    for volume in ["cache", "fast"] {
        node.wait_published(&mut agent, "default/others", volume);
    }
    // kubelet's `volume_plugin` label for each kind of plugin, read from the real endpoint.
    let metrics = scrape(&metrics_address(&node));
    for plugin in ["kubernetes.io/csi:hostpath.csi.kvol.io", "kubernetes.io/empty-dir", "kvol/tmpfs"] {
        let line = format!(
            "storage_operation_duration_seconds_count{{migrated=\"false\",operation_name=\"volume_mount\",status=\"success\",volume_plugin=\"{plugin}\"}} 1"
        );
        assert!(metrics.lines().any(|l| l == line), "no line {line} in\n{metrics}");
        for state in ["desired_state_of_world", "actual_state_of_world"] {
            let line =
                format!("volume_manager_total_volumes{{plugin_name=\"{plugin}\",state=\"{state}\"}} 1");
            assert!(metrics.lines().any(|l| l == line), "no line {line} in\n{metrics}");
        }
    }
    // kubelet's root holds kubelet's directories only; kvol's own files are in the state dir.
    assert_eq!(entries(&node.root_dir()), ["plugins", "plugins_registry", "pods"]);
    let state = entries(&node.state_dir());
    for wanted in ["csi-hostpath", "state.redb", "status.json"] {
        assert!(state.iter().any(|n| n == wanted), "{wanted} missing from the state dir: {state:?}");
    }
    assert!(
        node.host("/usr/libexec/kubernetes/kubelet-plugins/volume/exec").is_dir(),
        "the volume plugin dir is created"
    );
}

/// The upstream node-driver-registrar, started with kubelet's default paths (relative to the
/// scratch `/`), registers a second `kvol csi-driver` with the agent.
#[test]
fn the_upstream_registrar_with_kubelets_paths_registers_a_driver_with_the_agent() {
    let Some(registrar) = std::env::var_os("KVOL_NODE_DRIVER_REGISTRAR") else {
        eprintln!("skipped: KVOL_NODE_DRIVER_REGISTRAR does not name a node-driver-registrar binary");
        return;
    };
    enter_private_mount_namespace();
    let node = KubeletNode::new();
    let socket = node.host(&format!("/var/lib/kubelet/plugins/{OTHER}/csi.sock"));
    let mut command = Command::new(env!("CARGO_BIN_EXE_kvol"));
    command
        .args(["csi-driver", "--name", OTHER, "--node-name", "node-a", "--no-register", "--state-dir"])
        .arg(node.host("/var/lib/kvol-other"))
        .arg("--csi-socket")
        .arg(&socket);
    let mut driver = Daemon::spawn("kvol csi-driver", command, &node.top.join("driver.log"));
    wait_for_path(&socket, "the driver's csi socket", Duration::from_secs(30));
    let mut agent = node.start_agent(&["--no-metrics", "--no-example-flex-drivers"]);
    // The registrar binds in the registration directory, which the agent makes at start (as
    // kubelet does; a DaemonSet's hostPath is DirectoryOrCreate).
    wait_for_path(
        &node.root_dir().join("plugins_registry"),
        "the registration directory",
        Duration::from_secs(30),
    );
    let mut command = Command::new(registrar);
    command
        .arg(format!("--csi-address={}", socket.display()))
        .arg(format!("--kubelet-registration-path={}", socket.display()))
        .arg(format!("--plugin-registration-path={}", node.root_dir().join("plugins_registry").display()));
    let mut registrar = Daemon::spawn("node-driver-registrar", command, &node.top.join("registrar.log"));
    node.write("app.yaml", &csi_pod("app", OTHER));
    let report = node.wait_published(&mut agent, "default/app", "scratch");
    node.assert_in_kubelets_tree(&report, "default/app", "scratch");
    driver.assert_running();
    registrar.assert_running();
}

/// A pod with a claim of the bundled driver (provisioned by the agent), a claim of a local PV
/// at `local_path`, an emptyDir and a Flexvolume volume.
fn claims_pod(local_path: &Path) -> String {
    format!(
        r#"apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {{name: kvol-hostpath}}
provisioner: {BUNDLED}
---
apiVersion: storage.k8s.io/v1
kind: CSIDriver
metadata: {{name: {BUNDLED}}}
spec: {{attachRequired: false, volumeLifecycleModes: [Persistent]}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: data, namespace: default}}
spec: {{storageClassName: kvol-hostpath, accessModes: [ReadWriteOnce], resources: {{requests: {{storage: 16Mi}}}}}}
---
apiVersion: v1
kind: PersistentVolume
metadata: {{name: local-pv}}
spec:
  capacity: {{storage: 1Gi}}
  accessModes: [ReadWriteOnce]
  local: {{path: {}}}
  claimRef: {{namespace: default, name: local}}
  nodeAffinity:
    required:
      nodeSelectorTerms:
      - matchExpressions: [{{key: kubernetes.io/hostname, operator: In, values: [node-a]}}]
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: local, namespace: default}}
spec: {{volumeName: local-pv, accessModes: [ReadWriteOnce], resources: {{requests: {{storage: 1Gi}}}}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: db, namespace: default}}
spec:
  containers:
  - name: app
    image: busybox
    volumeMounts: [{{name: data, mountPath: /d}}, {{name: local, mountPath: /l}}, {{name: cache, mountPath: /c}}, {{name: fast, mountPath: /f}}]
  volumes:
  - {{name: data, persistentVolumeClaim: {{claimName: data}}}}
  - {{name: local, persistentVolumeClaim: {{claimName: local}}}}
  - {{name: cache, emptyDir: {{}}}}
  - {{name: fast, flexVolume: {{driver: kvol/tmpfs, options: {{size: 8Mi}}}}}}
"#,
        local_path.display()
    )
}

/// Scrapes until `ok` holds for the text (at most 30 s); the last text.
fn scrape_until(address: &str, what: &str, ok: impl Fn(&str) -> bool) -> String {
    let start = std::time::Instant::now();
    loop {
        let text = scrape(address);
        if ok(&text) {
            return text;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "never {what}; last scrape:\n{text}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The value of the sample `series` (name and labels, exactly), if served.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

fn claim_series(name: &str, claim: &str) -> String {
    format!("{name}{{namespace=\"default\",persistentvolumeclaim=\"{claim}\"}}")
}

/// The real agent's `/metrics`, line by line against kubelet's names, types and labels, for a
/// CSI claim, a local claim, an emptyDir and a Flexvolume volume; the volume stats follow what
/// is written, the driver's volume condition, and the pod's going.
#[test]
fn the_agents_metrics_are_kubelets_line_by_line() {
    enter_private_mount_namespace();
    let node = KubeletNode::new();
    let local_path = node.host("/mnt/disks/ssd0");
    std::fs::create_dir_all(&local_path).unwrap();
    let mut agent =
        node.start_agent(&["--metrics-address", "127.0.0.1:0", "--volume-stats-agg-period", "100ms"]);
    node.write("db.yaml", &claims_pod(&local_path));
    for volume in ["data", "local", "cache", "fast"] {
        node.wait_published(&mut agent, "default/db", volume);
    }
    let address = metrics_address(&node);
    let capacity = |claim: &str| claim_series("kubelet_volume_stats_capacity_bytes", claim);
    let text = scrape_until(&address, "measured both claims", |t| {
        sample(t, &capacity("data")).is_some() && sample(t, &capacity("local")).is_some()
    });

    // Each metric is declared with kubelet's type.
    for (name, kind) in [
        ("storage_operation_duration_seconds", "histogram"),
        ("csi_operations_seconds", "histogram"),
        ("volume_manager_total_volumes", "gauge"),
        ("kubelet_volume_stats_capacity_bytes", "gauge"),
        ("kubelet_volume_stats_available_bytes", "gauge"),
        ("kubelet_volume_stats_used_bytes", "gauge"),
        ("kubelet_volume_stats_inodes", "gauge"),
        ("kubelet_volume_stats_inodes_free", "gauge"),
        ("kubelet_volume_stats_inodes_used", "gauge"),
        ("kubelet_volume_stats_health_status_abnormal", "gauge"),
    ] {
        let line = format!("# TYPE {name} {kind}");
        assert!(text.lines().any(|l| l == line), "no line {line} in\n{text}");
    }
    assert_dashboard_metrics_are_served(&text);
    // Each plugin's operations and volumes, labelled as kubelet labels them.
    for plugin in [
        "kubernetes.io/csi:hostpath.csi.kvol.io",
        "kubernetes.io/local-volume",
        "kubernetes.io/empty-dir",
        "kvol/tmpfs",
    ] {
        let mount = format!(
            "storage_operation_duration_seconds_count{{migrated=\"false\",operation_name=\"volume_mount\",status=\"success\",volume_plugin=\"{plugin}\"}}"
        );
        assert_eq!(sample(&text, &mount), Some(1.0), "{mount} in\n{text}");
        for state in ["desired_state_of_world", "actual_state_of_world"] {
            let total = format!("volume_manager_total_volumes{{plugin_name=\"{plugin}\",state=\"{state}\"}}");
            assert_eq!(sample(&text, &total), Some(1.0), "{total} in\n{text}");
        }
    }
    let stats_call = "csi_operations_seconds_count{driver_name=\"hostpath.csi.kvol.io\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Node/NodeGetVolumeStats\",migrated=\"false\"}";
    assert!(sample(&text, stats_call).is_some_and(|n| n >= 1.0), "{stats_call} in\n{text}");

    // The CSI claim: its size as the driver reports it — the provisioned 16 MiB for a
    // directory volume, the filesystem's own total for a loop-backed one (the embedded
    // default's where loop devices can be made) —, the driver's condition; the local claim:
    // its filesystem as statvfs sees it, and no condition (only CSI drivers report one).
    let report = kvol_node::report::status::read_status(&node.state_dir()).unwrap();
    let data = report.volumes.iter().find(|v| v.volume == "data").unwrap().target.clone().unwrap();
    let volumes = node.state_dir().join("csi-hostpath/volumes");
    let size = if entries(&volumes).iter().any(|n| n.ends_with(".img")) {
        let fs = nix::sys::statvfs::statvfs(&data.join("mount")).unwrap();
        assert!(
            fs.blocks() * fs.fragment_size() < 16 << 20,
            "a loop-backed volume's filesystem is within it"
        );
        (fs.blocks() * fs.fragment_size()) as f64
    } else {
        16.0 * 1024.0 * 1024.0
    };
    assert_eq!(sample(&text, &capacity("data")), Some(size), "{text}");
    let health = |claim: &str| claim_series("kubelet_volume_stats_health_status_abnormal", claim);
    assert_eq!(sample(&text, &health("data")), Some(0.0), "{text}");
    assert_eq!(sample(&text, &health("local")), None, "{text}");
    let fs = nix::sys::statvfs::statvfs(&local_path).unwrap();
    assert_eq!(sample(&text, &capacity("local")), Some((fs.blocks() * fs.fragment_size()) as f64), "{text}");
    let inodes = claim_series("kubelet_volume_stats_inodes", "local");
    assert_eq!(sample(&text, &inodes), Some(fs.files() as f64), "{text}");
    // Only claims are measured: the emptyDir and the Flexvolume volume have no stats.
    let measured: Vec<&str> =
        text.lines().filter(|l| l.starts_with("kubelet_volume_stats_capacity_bytes{")).collect();
    assert_eq!(measured.len(), 2, "{measured:?}");

    // What the pod writes shows in the next measuring.
    std::fs::write(data.join("mount/blob"), vec![7u8; 1 << 20]).unwrap();
    let used = claim_series("kubelet_volume_stats_used_bytes", "data");
    scrape_until(&address, "counted the written MiB", |t| sample(t, &used).is_some_and(|u| u >= 1048576.0));

    // The driver's data gone behind its back: the claim turns abnormal, and healthy when back.
    let id = entries(&volumes).pop().expect("the provisioned volume's data");
    std::fs::rename(volumes.join(&id), node.top.join("moved-away")).unwrap();
    scrape_until(&address, "reported the claim abnormal", |t| sample(t, &health("data")) == Some(1.0));
    std::fs::rename(node.top.join("moved-away"), volumes.join(&id)).unwrap();
    scrape_until(&address, "reported the claim healthy again", |t| sample(t, &health("data")) == Some(0.0));

    // The pod gone: its claims' stats go with it.
    std::fs::remove_file(node.top.join("manifests/db.yaml")).unwrap();
    scrape_until(&address, "dropped the stats of the pod's claims", |t| {
        !t.lines().any(|l| l.starts_with("kubelet_volume_stats_"))
    });
    agent.assert_running();
}
