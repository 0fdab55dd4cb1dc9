//! The real `kvol agent` binary end to end: real mounts (in a private mount namespace of the test thread, which the agent inherits), the bundled CSI driver, the example and test Flexvolume drivers, `kill -9` at each step and restarts.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kvol_node::report::status::{Phase, StatusReport, VolumeStatus, read_status};
use kvol_plugin::{MountPoint, Mounter, SystemMounter};
use nix::mount::MsFlags;
use nix::sched::CloneFlags;

fn enter_private_mount_namespace() {
    nix::sched::unshare(CloneFlags::CLONE_NEWNS).expect("unshare the mount namespace (needs root)");
    nix::mount::mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
        .expect("make every mount private");
}

/// A Flexvolume test driver: attachable; `attach` records itself; `mountdevice` and `mount`
/// mount a tmpfs; every command first waits while `<KVOL_TEST_DIR>/slow-<command>` exists and
/// fails while `<KVOL_TEST_DIR>/fail-<command>` exists.
const TEST_DRIVER: &str = r#"#!/bin/sh
cmd="$1"; shift
printf '%s\n' "$cmd $*" >> "$KVOL_TEST_DIR/args.log"
log() { echo "$cmd $*" >> "$KVOL_TEST_DIR/driver.log"; }
ok() { printf '{"status":"Success"%s}\n' "$1"; exit 0; }
while [ -e "$KVOL_TEST_DIR/slow-$cmd" ]; do sleep 0.1; done
if [ -e "$KVOL_TEST_DIR/fail-$cmd" ]; then
  printf '{"status":"Failure","message":"test driver told to fail %s"}\n' "$cmd"; exit 1
fi
case "$cmd" in
  init) ok ',"capabilities":{"attach":true}' ;;
  attach) log "$2"; ok ',"device":"/dev/test-volume"' ;;
  waitforattach) ok ",\"device\":\"$1\"" ;;
  isattached) ok ',"attached":true' ;;
  detach) log "$1"; ok ;;
  mountdevice)
    mkdir -p "$1"
    grep -q " $1 " /proc/self/mountinfo || mount -t tmpfs -o size=1m test-device "$1"
    log "$1"; ok ;;
  unmountdevice) umount "$1" 2>/dev/null; rmdir "$1" 2>/dev/null; log "$1"; ok ;;
  mount)
    mkdir -p "$1"
    grep -q " $1 " /proc/self/mountinfo || mount -t tmpfs -o size=1m test-volume "$1"
    log "$1"; ok ;;
  unmount) umount "$1" 2>/dev/null; rmdir "$1" 2>/dev/null; log "$1"; ok ;;
  *) echo '{"status":"Not supported"}'; exit 1 ;;
esac
"#;

struct Node {
    root: PathBuf,
    /// The agent log as it was when the current agent started.
    log_before_start: String,
    manifests: PathBuf,
    child: Option<Child>,
    /// `KVOL_LOG` for the agent.
    log_level: &'static str,
    /// Serve metrics here (`None`: `--no-metrics`).
    metrics: Option<std::net::SocketAddr>,
    _dir: kvol_test_support::ScratchRoot,
}

impl Node {
    fn new() -> Node {
        let dir = kvol_test_support::ScratchRoot::new();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        let manifests = root.join("manifests");
        std::fs::create_dir_all(&manifests).unwrap();
        let driver_dir = root.join("flexvolume/test~slow");
        std::fs::create_dir_all(&driver_dir).unwrap();
        let script = driver_dir.join("slow");
        std::fs::write(&script, TEST_DRIVER).unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        Node {
            root,
            manifests,
            child: None,
            log_level: "info",
            metrics: None,
            _dir: dir,
            log_before_start: String::new(),
        }
    }

    /// A node whose agent logs at debug level and serves /metrics on a free local port.
    fn debug_with_metrics() -> (Node, std::net::SocketAddr) {
        let mut node = Node::new();
        node.log_level = "debug";
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = free.local_addr().unwrap();
        drop(free);
        node.metrics = Some(address);
        (node, address)
    }

    fn start(&mut self) {
        self.start_with(&[]);
    }

    fn start_with(&mut self, extra: &[&str]) {
        self.log_before_start = self.agent_log();
        let log =
            std::fs::OpenOptions::new().create(true).append(true).open(self.root.join("agent.log")).unwrap();
        let metrics = match self.metrics {
            Some(address) => vec!["--metrics-address".to_string(), address.to_string()],
            None => vec!["--no-metrics".to_string()],
        };
        let child = Command::new(env!("CARGO_BIN_EXE_kvol"))
            .arg("agent")
            .args(metrics)
            .args(["--resync-seconds", "1", "--node-name", "node-a", "--root"])
            .arg(&self.root)
            .args(extra)
            .env("KVOL_TEST_DIR", &self.root)
            .env("KVOL_LOG", self.log_level)
            .env_remove("KVOL_CONFIG")
            .env_remove("KVOL_FEATURE_GATES")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("the kvol binary runs");
        self.child = Some(child);
    }

    fn kill_9(&mut self) {
        let mut child = self.child.take().expect("running");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    fn sigterm(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("running");
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::SIGTERM)
            .unwrap();
        child.wait().unwrap()
    }

    fn write(&self, name: &str, text: &str) {
        // Atomically, as an operator's tooling would: the agent never reads a half-written file.
        let tmp = self.manifests.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, self.manifests.join(name)).unwrap();
    }

    fn remove(&self, name: &str) {
        std::fs::remove_file(self.manifests.join(name)).unwrap();
    }

    fn marker(&self, name: &str, on: bool) {
        let path = self.root.join(name);
        if on {
            std::fs::write(path, "").unwrap();
        } else {
            let _ = std::fs::remove_file(path);
        }
    }

    fn driver_log(&self) -> Vec<String> {
        std::fs::read_to_string(self.root.join("driver.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    fn agent_log(&self) -> String {
        std::fs::read_to_string(self.root.join("agent.log")).unwrap_or_default()
    }

    /// Waits until the agent's status satisfies `ok`; panics with the status and log on timeout.
    fn wait(&self, what: &str, ok: impl Fn(&StatusReport) -> bool) -> StatusReport {
        let start = Instant::now();
        loop {
            if let Ok(report) = read_status(&self.root) {
                let current = self.child.as_ref().is_some_and(|c| c.id() == report.pid);
                if current && ok(&report) {
                    return report;
                }
            }
            if start.elapsed() > Duration::from_secs(40) {
                panic!(
                    "timed out waiting for {what}\nstatus: {:#?}\nlog:\n{}",
                    read_status(&self.root),
                    self.agent_log()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn mounts(&self) -> Vec<MountPoint> {
        SystemMounter.mounts_under(&self.root.join("kubelet")).unwrap()
    }

    /// Every mount point under the kubelet dir appears once: nothing mounted twice.
    fn assert_no_double_mounts(&self) {
        let mut targets: Vec<PathBuf> = self.mounts().into_iter().map(|m| m.target).collect();
        let n = targets.len();
        targets.sort();
        targets.dedup();
        assert_eq!(targets.len(), n, "a path is mounted twice: {:#?}", self.mounts());
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let mut left = self.mounts();
        left.sort_by_key(|m| std::cmp::Reverse(m.target.components().count()));
        for m in left {
            let _ = nix::mount::umount2(&m.target, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

fn volume<'a>(report: &'a StatusReport, pod: &str, name: &str) -> Option<&'a VolumeStatus> {
    report.volumes.iter().find(|v| v.pod == pod && v.volume == name)
}

fn phase(report: &StatusReport, pod: &str, name: &str) -> Option<Phase> {
    volume(report, pod, name).map(|v| v.phase)
}

fn pod(name: &str, volumes: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  containers: {}\n  volumes:\n{volumes}",
        kvol_test_support::pods::containers_using("app", volumes)
    )
}

const STORAGE: &str = r#"apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: kvol-hostpath}
provisioner: hostpath.csi.kvol.io
---
apiVersion: storage.k8s.io/v1
kind: CSIDriver
metadata: {name: hostpath.csi.kvol.io}
spec: {attachRequired: false, podInfoOnMount: true, volumeLifecycleModes: [Persistent, Ephemeral]}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: data, namespace: default}
spec:
  storageClassName: kvol-hostpath
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 16Mi}}
"#;

/// Pods added, changed and removed; a malformed manifest; SIGTERM leaving volumes mounted and a
/// restart picking them up without mounting anything twice.
#[test]
fn pods_come_and_go_and_volumes_outlive_the_agent() {
    enter_private_mount_namespace();
    let mut node = Node::new();
    let host_dir = node.root.join("host-data");
    node.write("00-storage.yaml", STORAGE);
    let web = pod(
        "web",
        &format!(
            "  - {{name: cache, emptyDir: {{}}}}\n  - {{name: host, hostPath: {{path: {}, type: DirectoryOrCreate}}}}\n  - {{name: data, persistentVolumeClaim: {{claimName: data}}}}\n",
            host_dir.display()
        ),
    );
    node.write("web.yaml", &web);
    node.write(
        "tools.yaml",
        &pod("tools", "  - {name: fast, flexVolume: {driver: kvol/tmpfs, options: {size: 8Mi}}}\n  - {name: scratch, csi: {driver: hostpath.csi.kvol.io}}\n"),
    );
    node.start();
    let all = ["web/cache", "web/host", "web/data", "tools/fast", "tools/scratch"];
    let published = |r: &StatusReport| {
        all.iter().all(|v| {
            let (p, n) = v.split_once('/').unwrap();
            phase(r, &format!("default/{p}"), n) == Some(Phase::Published)
        })
    };
    let report = node.wait("every volume published", published);
    let csi_node = report.csi_node.as_ref().expect("the CSINode is in the status");
    assert!(
        csi_node.spec.drivers.iter().any(|d| d.name == "hostpath.csi.kvol.io" && d.node_id == "node-a"),
        "{csi_node:?}"
    );
    let fast = volume(&report, "default/tools", "fast").unwrap().target.clone().unwrap();
    assert!(
        node.mounts().iter().any(|m| m.target == fast && m.fstype == "tmpfs"),
        "the flex tmpfs is mounted"
    );
    let data = volume(&report, "default/web", "data").unwrap().target.clone().unwrap();
    std::fs::write(data.join("mount/kept"), "written through the pod's volume").unwrap();
    node.assert_no_double_mounts();

    // A malformed manifest is reported; the others are unaffected.
    node.write("broken.yaml", "apiVersion: v1\nkind: Pod\nmetadata: [oops\n");
    let report = node.wait("the problem reported", |r| r.problems.iter().any(|p| p.contains("broken.yaml")));
    assert!(published(&report));
    // An edit that breaks a pod's manifest keeps its last good objects: nothing is torn down.
    node.write("web.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: web, namespace: default\n");
    let report = node.wait("the broken edit reported", |r| {
        r.problems.iter().any(|p| p.contains("web.yaml") && p.contains("keeping the 1 object(s)"))
    });
    assert!(published(&report), "{report:#?}");
    node.write("web.yaml", &web);
    node.wait("the edit fixed", |r| !r.problems.iter().any(|p| p.contains("web.yaml")));

    // A pod removed: its volumes come down, the other pod's stay.
    node.remove("tools.yaml");
    node.wait("tools torn down", |r| {
        volume(r, "default/tools", "fast").is_none() && volume(r, "default/tools", "scratch").is_none()
    });
    assert!(!node.mounts().iter().any(|m| m.target.starts_with(&fast)), "the flex volume is unmounted");

    // SIGTERM: the agent stops, the volumes stay mounted.
    let before = node.mounts().len();
    assert!(node.sigterm().success(), "{}", node.agent_log());
    assert_eq!(node.mounts().len(), before, "SIGTERM must not unmount volumes pods still use");
    node.start();
    let report = node.wait("web still published after restart", |r| {
        ["cache", "host", "data"].iter().all(|v| phase(r, "default/web", v) == Some(Phase::Published))
    });
    node.assert_no_double_mounts();
    assert_eq!(node.mounts().len(), before, "a restart mounts nothing twice");
    let data = volume(&report, "default/web", "data").unwrap().target.clone().unwrap();
    assert_eq!(std::fs::read_to_string(data.join("mount/kept")).unwrap(), "written through the pod's volume");

    // Everything removed: nothing left mounted.
    node.remove("web.yaml");
    node.wait("everything torn down", |r| r.volumes.is_empty());
    node.wait_for_no_mounts();
    assert!(host_dir.is_dir(), "host data is never deleted");
}

impl Node {
    /// The pids of the test-driver calls running: the script runs through its checked
    /// descriptor (`/bin/sh /proc/<agent>/fd/<n>`), so the call is known by the executable
    /// path in its environment (`KVOL_FLEXVOLUME_DRIVER`); it leads its process group (its
    /// children inherit the environment but not the lead).
    fn driver_call_pids(&self) -> Vec<u32> {
        let driver = self.root.join("flexvolume/test~slow/slow").display().to_string();
        let marker = format!("KVOL_FLEXVOLUME_DRIVER={driver}\0");
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter(|e| {
                let Ok(environ) = std::fs::read(e.path().join("environ")) else { return false };
                let environ = [environ.as_slice(), b"\0"].concat();
                let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else { return false };
                let fields: Vec<&str> =
                    stat.rsplit_once(')').map(|(_, r)| r.split_whitespace().collect()).unwrap_or_default();
                let leads = fields.get(2).is_some_and(|g| e.file_name().to_str() == Some(*g));
                String::from_utf8_lossy(&environ).contains(marker.as_str())
                    && leads
                    && fields.first() != Some(&"Z")
            })
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .collect()
    }

    /// Waits until none of `pids` runs any more (the new agent killed them).
    fn wait_gone(&self, pids: &[u32], step: &str) {
        let start = Instant::now();
        while self.driver_call_pids().iter().any(|p| pids.contains(p)) {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "{step}: the leftover call {pids:?} still runs"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits until the blocked driver call is running (the status says the operation started
    /// a moment before the driver process exists).
    /// Waits until the driver call of `step` runs: its own command (a short call of another
    /// command, such as the prober's `init`, is not the one held up, and a kill while only it
    /// ran would leave no call for the next agent to stop).
    fn wait_until_driver_call_runs(&self, step: &str) {
        let command = match step {
            "stage" => "mountdevice",
            "publish" => "mount",
            "teardown" => "unmount",
            other => other,
        };
        let runs_command = |pid: &u32| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            cmdline.split(|b| *b == 0).skip(1).any(|arg| arg == command.as_bytes())
        };
        let start = Instant::now();
        while !self.driver_call_pids().iter().any(runs_command) {
            assert!(start.elapsed() < Duration::from_secs(20), "{step}: the driver call never started");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits until the agent's log has more lines containing `needle` than it had when the
    /// current agent started.
    fn wait_for_log(&self, what: &str, needle: &str) {
        let start = Instant::now();
        let count = |log: &str| log.lines().filter(|l| l.contains(needle)).count();
        let before = count(&self.log_before_start);
        while count(&self.agent_log()) <= before {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "timed out waiting for {what}:\n{}",
                self.agent_log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn wait_for_no_mounts(&self) {
        let start = Instant::now();
        while !self.mounts().is_empty() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "mounts left: {:#?}\n{}",
                self.mounts(),
                self.agent_log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// `kill -9` while attach, stage, publish and teardown are in flight; each restart finishes
/// the job with no leaked mount and no second mount.
#[test]
fn kill_9_at_every_step_then_restart() {
    enter_private_mount_namespace();
    let mut node = Node::new();
    node.write("00-storage.yaml", STORAGE);
    let slow_pod = pod("slow", "  - {name: vol, flexVolume: {driver: test/slow}}\n");
    for (step, marker, phase_seen) in [
        ("attach", "slow-attach", Phase::Attaching),
        ("stage", "slow-mountdevice", Phase::Staging),
        ("publish", "slow-mount", Phase::Publishing),
    ] {
        node.marker(marker, true);
        node.write("slow.yaml", &slow_pod);
        node.start();
        node.wait(&format!("{step} in flight"), |r| phase(r, "default/slow", "vol") == Some(phase_seen));
        node.wait_until_driver_call_runs(step);
        node.kill_9();
        // The driver call the dead agent started is still blocked; the new agent stops it
        // before anything else, so it never runs beside the new agent's own call.
        let leftover = node.driver_call_pids();
        assert!(!leftover.is_empty(), "{step}: the dead agent's call goes on");
        node.start();
        node.wait_for_log(&format!("{step}: the leftover call killed"), "killing a flexvolume driver call");
        node.wait_gone(&leftover, step);
        node.marker(marker, false);
        node.wait(&format!("published after a kill during {step}"), |r| {
            phase(r, "default/slow", "vol") == Some(Phase::Published)
        });
        node.assert_no_double_mounts();
        let mounts = node.mounts();
        assert_eq!(mounts.iter().filter(|m| m.source == "test-volume").count(), 1, "{step}: {mounts:#?}");
        assert_eq!(mounts.iter().filter(|m| m.source == "test-device").count(), 1, "{step}: {mounts:#?}");

        // Teardown interrupted too: kill during unmount, restart, nothing left behind.
        node.marker("slow-unmount", true);
        node.remove("slow.yaml");
        node.wait("teardown in flight", |r| phase(r, "default/slow", "vol") == Some(Phase::TearingDown));
        node.wait_until_driver_call_runs("teardown");
        node.kill_9();
        let leftover = node.driver_call_pids();
        node.start();
        node.wait_for_log("teardown: the leftover call killed", "killing a flexvolume driver call");
        node.wait_gone(&leftover, "teardown");
        node.marker("slow-unmount", false);
        // Torn down: no pod volume, nothing staged or attached on the node, no mount left.
        node.wait("torn down after a kill during teardown", |r| {
            r.volumes.is_empty() && r.node_volumes.is_empty()
        });
        assert!(
            !node.mounts().iter().any(|m| m.source.starts_with("test-")),
            "{step}: leaked {:#?}",
            node.mounts()
        );
        // The driver saw the volume attached, staged, published, then taken down in reverse.
        let log: Vec<String> =
            node.driver_log().iter().map(|l| l.split(' ').next().unwrap_or_default().to_string()).collect();
        let last = |cmd: &str| log.iter().rposition(|c| c == cmd);
        let first = |cmd: &str| log.iter().position(|c| c == cmd);
        assert!(
            first("attach").is_some()
                && first("attach") < first("mountdevice")
                && first("mountdevice") < first("mount")
                && last("mount") < last("unmount")
                && last("unmount") < last("unmountdevice")
                && last("unmountdevice") < last("detach"),
            "{step}: {log:?}\n{}",
            node.agent_log()
        );
        node.kill_9();
        std::fs::remove_file(node.root.join("driver.log")).unwrap();
    }
}

/// A claim bound after its pod appeared; a driver failing, then recovering.
#[test]
fn pending_claims_and_failing_drivers_recover() {
    enter_private_mount_namespace();
    let mut node = Node::new();
    node.write("app.yaml", &pod("app", "  - {name: late, persistentVolumeClaim: {claimName: late}}\n"));
    node.marker("fail-mount", true);
    node.write("flaky.yaml", &pod("flaky", "  - {name: vol, flexVolume: {driver: test/slow}}\n"));
    node.start();
    let report = node.wait("the claim pending and the driver failing", |r| {
        phase(r, "default/app", "late") == Some(Phase::Pending)
            && volume(r, "default/flaky", "vol").is_some_and(|v| {
                v.phase == Phase::Failed
                    && v.last_error.as_deref().is_some_and(|e| e.contains("told to fail"))
            })
    });
    let late = volume(&report, "default/app", "late").unwrap();
    assert!(late.pending_reason.as_deref().unwrap().contains("default/late does not exist"), "{late:?}");
    let flaky = volume(&report, "default/flaky", "vol").unwrap();
    assert!(flaky.last_error.as_deref().unwrap().contains("test driver told to fail mount"), "{flaky:?}");

    let dir = node.root.join("late-data");
    std::fs::create_dir(&dir).unwrap();
    node.write(
        "late.yaml",
        &format!(
            "apiVersion: v1\nkind: PersistentVolume\nmetadata: {{name: late-pv}}\nspec:\n  accessModes: [ReadWriteOnce]\n  capacity: {{storage: 1Gi}}\n  hostPath: {{path: {}}}\n  claimRef: {{namespace: default, name: late}}\n---\napiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{name: late, namespace: default}}\nspec: {{volumeName: late-pv, accessModes: [ReadWriteOnce]}}\n",
            dir.display()
        ),
    );
    node.marker("fail-mount", false);
    node.wait("both published", |r| {
        phase(r, "default/app", "late") == Some(Phase::Published)
            && phase(r, "default/flaky", "vol") == Some(Phase::Published)
    });
    node.assert_no_double_mounts();
}

/// A CSIDriver with `requiresRepublish: true`: the agent calls NodePublishVolume again each
/// period for a published volume, and the volume stays published throughout.
#[test]
fn a_driver_that_requires_republish_is_published_again() {
    enter_private_mount_namespace();
    let mut node = Node::new();
    node.write(
        "00-driver.yaml",
        "apiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata: {name: hostpath.csi.kvol.io}\nspec: {attachRequired: false, podInfoOnMount: true, requiresRepublish: true, volumeLifecycleModes: [Ephemeral]}\n",
    );
    node.write("app.yaml", &pod("app", "  - {name: scratch, csi: {driver: hostpath.csi.kvol.io}}\n"));
    node.start_with(&["--republish-seconds", "1"]);
    let report = node.wait("published", |r| phase(r, "default/app", "scratch") == Some(Phase::Published));
    let target = volume(&report, "default/app", "scratch").unwrap().target.clone().unwrap();
    let publishes = || {
        let needle = format!("target={}", target.join("mount").display());
        node.agent_log().lines().filter(|l| l.contains("NodePublishVolume") && l.contains(&needle)).count()
    };
    let first = publishes();
    assert!(first >= 1, "{}", node.agent_log());
    let start = Instant::now();
    while publishes() < first + 2 {
        assert!(start.elapsed() < Duration::from_secs(20), "not published again:\n{}", node.agent_log());
        std::thread::sleep(Duration::from_millis(100));
    }
    let report =
        node.wait("still published", |r| phase(r, "default/app", "scratch") == Some(Phase::Published));
    assert!(volume(&report, "default/app", "scratch").unwrap().last_error.is_none(), "{report:#?}");
    node.assert_no_double_mounts();
}

/// Fails when any of `secrets` appears in any of the named `outputs`.
fn assert_nowhere(secrets: &[&str], outputs: &[(&str, &String)]) {
    for (what, text) in outputs {
        for secret in secrets {
            assert!(!text.contains(secret), "{what} shows {secret}:\n{text}");
        }
    }
}

/// The `/metrics` text of an agent serving at `address`.
fn metrics_text(address: std::net::SocketAddr) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address).expect("the metrics endpoint answers");
    stream.write_all(b"GET /metrics HTTP/1.0\r\nHost: kvol\r\n\r\n").unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    assert!(text.contains("kvol_"), "not the metrics: {text}");
    text
}

/// A Secret's value reaches the Flexvolume driver through attach, stage and publish, a kill -9
/// in the middle of the publish call and a restart, with the agent logging at debug level;
/// neither the value nor its base64 appears in the agent's output, status.json or /metrics.
#[test]
fn secrets_never_reach_the_log_the_status_or_the_metrics() {
    const VALUE: &str = "s3cr3t-Value-7f2a";
    const BASE64: &str = "czNjcjN0LVZhbHVlLTdmMmE=";
    enter_private_mount_namespace();
    let (mut node, address) = Node::debug_with_metrics();
    node.write(
        "00-secret.yaml",
        &format!(
            "apiVersion: v1\nkind: Secret\nmetadata: {{name: creds, namespace: default}}\ntype: test/slow\nstringData: {{password: {VALUE}}}\n"
        ),
    );
    node.write(
        "pod.yaml",
        &pod("app", "  - {name: vol, flexVolume: {driver: test/slow, secretRef: {name: creds}}}\n"),
    );
    node.marker("slow-mount", true);
    node.start();
    node.wait("publish in flight", |r| phase(r, "default/app", "vol") == Some(Phase::Publishing));
    node.wait_until_driver_call_runs("publish");
    node.kill_9();
    node.start();
    node.wait_for_log("the leftover call killed", "killing a flexvolume driver call");
    node.marker("slow-mount", false);
    node.wait("published after the restart", |r| phase(r, "default/app", "vol") == Some(Phase::Published));
    let metrics = metrics_text(address);

    // Not vacuous: the volume went through attach and mountdevice, and the driver got the
    // secret (base64, as Flexvolume passes it) in mount, before and after the kill (upstream
    // passes secrets to mount only); the agent did log the calls' arguments, redacted.
    let driver_args = std::fs::read_to_string(node.root.join("args.log")).unwrap();
    let calls = |command: &str| driver_args.lines().filter(|l| l.starts_with(&format!("{command} "))).count();
    assert!(calls("attach") == 1 && calls("mountdevice") == 1, "{driver_args}");
    let with_secret = driver_args.lines().filter(|l| l.starts_with("mount ") && l.contains(BASE64)).count();
    assert_eq!(with_secret, 2, "mount gets the secret, killed once: {driver_args}");
    let log = node.agent_log();
    assert!(log.contains("calling flexvolume driver") && log.contains("<redacted>"), "{log}");
    let status = std::fs::read_to_string(node.root.join("status.json")).unwrap();
    let outputs = [("the agent's output", &log), ("status.json", &status), ("/metrics", &metrics)];
    assert_nowhere(&[VALUE, BASE64], &outputs);
}

/// A claim of a class whose parameters name node-stage and node-publish secrets (as the
/// external-provisioner reads them): the provisioned PV carries both references, the bundled
/// driver receives the Secret's keys in NodeStageVolume and NodePublishVolume, and with the
/// agent (and the in-process driver) logging at debug level, through a kill -9 and a restart,
/// the value appears nowhere: not in the output, status.json, the provisioned PV record or
/// /metrics.
#[test]
fn csi_stage_and_publish_secrets_reach_the_driver_and_never_the_log_the_status_or_the_metrics() {
    const VALUE: &str = "csi-Pa55word-91c3";
    const BASE64: &str = "Y3NpLVBhNTV3b3JkLTkxYzM=";
    enter_private_mount_namespace();
    let (mut node, address) = Node::debug_with_metrics();
    node.write(
        "00-secret.yaml",
        &format!(
            "apiVersion: v1\nkind: Secret\nmetadata: {{name: disk-key, namespace: default}}\nstringData: {{passphrase: {VALUE}}}\n"
        ),
    );
    let class = "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata: {name: sealed}\n\
                 provisioner: hostpath.csi.kvol.io\nparameters:\n\
                 \x20 csi.storage.k8s.io/node-stage-secret-name: disk-key\n\
                 \x20 csi.storage.k8s.io/node-stage-secret-namespace: ${pvc.namespace}\n\
                 \x20 csi.storage.k8s.io/node-publish-secret-name: disk-key\n\
                 \x20 csi.storage.k8s.io/node-publish-secret-namespace: default\n---\n\
                 apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: sealed, namespace: default}\n\
                 spec: {storageClassName: sealed, accessModes: [ReadWriteOnce], resources: {requests: {storage: 16Mi}}}\n";
    node.write("01-class.yaml", class);
    node.write("pod.yaml", &pod("app", "  - {name: data, persistentVolumeClaim: {claimName: sealed}}\n"));
    node.start();
    node.wait("published", |r| phase(r, "default/app", "data") == Some(Phase::Published));
    // A kill -9 and a restart: rebuilding state and re-registering the driver print nothing secret.
    node.kill_9();
    node.start();
    node.wait_for_log("the journal read again", "actual state rebuilt");
    node.wait("published after the restart", |r| phase(r, "default/app", "data") == Some(Phase::Published));
    let metrics = metrics_text(address);

    // Not vacuous: the PV names both secrets, and the driver got the Secret's key in both calls.
    let record = std::fs::read_to_string(node.root.join("provisioned/default~sealed.json")).unwrap();
    let pv: serde_json::Value = serde_json::from_str(&record).unwrap();
    let reference = serde_json::json!({"name": "disk-key", "namespace": "default"});
    assert_eq!(pv["spec"]["csi"]["nodeStageSecretRef"], reference, "{record}");
    assert_eq!(pv["spec"]["csi"]["nodePublishSecretRef"], reference, "{record}");
    let log = node.agent_log();
    // The bundled driver is a component process: its output is kept in its own log.
    let driver_log = std::fs::read_to_string(node.root.join("logs/hostpath.log")).unwrap();
    for rpc in ["NodeStageVolume", "NodePublishVolume"] {
        let carried = driver_log
            .lines()
            .any(|l| l.contains("call carries secrets") && l.contains(rpc) && l.contains("keys=passphrase"));
        assert!(carried, "{rpc} got no secret:\n{driver_log}");
    }
    let status = std::fs::read_to_string(node.root.join("status.json")).unwrap();
    let outputs = [
        ("the agent's output", &log),
        ("the driver's output", &driver_log),
        ("status.json", &status),
        ("/metrics", &metrics),
        ("the PV record", &record),
    ];
    assert_nowhere(&[VALUE, BASE64], &outputs);
}

/// The README's first command, as the README spells it (its root moved to a scratch one, its
/// binary this build's): it succeeds; where loop devices can be made its claim is a filesystem
/// image on one, which the status's component line says; and once the command has exited, its
/// mount namespace gone with it, no loop device holds anything under its root.
#[test]
fn the_readmes_first_command_serves_its_claim_from_a_loop_device_and_leaves_none() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    let command = readme
        .split("## Two commands")
        .nth(1)
        .and_then(|rest| rest.split("```sh\n").nth(1))
        .and_then(|block| block.lines().next())
        .expect("the first command under \"Two commands\"");
    let command = command.strip_prefix("cargo build -q && ").expect("it builds first");
    let scratch = kvol_test_support::ScratchRoot::new();
    let root = scratch.path().join("demo");
    let words: Vec<String> = command
        .split_whitespace()
        .map(|w| match w {
            "/tmp/kvol-demo" => root.display().to_string(),
            "target/debug/kvol" => env!("CARGO_BIN_EXE_kvol").to_string(),
            other => other.to_string(),
        })
        .collect();
    assert_eq!(words[0], "unshare", "{command}");
    let started = Instant::now();
    let out = Command::new(&words[0])
        .args(&words[1..])
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .env_remove("KVOL_CONFIG")
        .env_remove("KVOL_VOLUME_BACKING")
        .output()
        .expect("unshare runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    eprintln!("the README's first command took {:?}", started.elapsed());
    let line = stdout.lines().find(|l| l.starts_with("component hostpath: ")).expect("the component's line");
    let volumes: Vec<PathBuf> =
        std::fs::read_dir(root.join("csi-hostpath/volumes")).unwrap().map(|e| e.unwrap().path()).collect();
    let claim = stdout.lines().find(|l| l.starts_with("default/csi-persistent ")).expect("the claim's pod");
    assert!(claim.contains(" published "), "{claim}");
    if kvol_hostpath::backing::probe().problems().is_empty() {
        assert!(line.contains("volume-backing: loop (chosen automatically"), "{line}");
        assert!(
            volumes.len() == 1 && volumes[0].extension().is_some_and(|e| e == "img"),
            "the claim is an image: {volumes:?}"
        );
        assert_eq!(std::fs::metadata(&volumes[0]).unwrap().len(), 64 << 20, "its size, 64Mi");
    } else {
        assert!(line.contains("volume-backing: directory (loop devices cannot be made here"), "{line}");
    }
    let left = kvol_test_support::loop_devices_of(scratch.path());
    assert!(left.is_empty(), "loop devices left after the command exited: {left:?}");
    assert!(scratch.leftovers().is_empty(), "{}", scratch.leftovers());
}

#[test]
fn a_volume_no_container_uses_is_not_set_up_and_status_says_why() {
    enter_private_mount_namespace();
    let mut node = Node::new();
    node.write("storage.yaml", STORAGE);
    // The claim is not mounted here (a RWO claim would block another node);
    // the emptyDir no container uses gets no directory; the one used is published.
    let pod = "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: idle, namespace: default}\nspec: {storageClassName: kvol-hostpath, accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Mi}}}\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: app, namespace: default, uid: 5e1d0a11-0000-4000-8000-000000000001}\nspec:\n  initContainers: [{name: init, image: busybox, volumeMounts: [{name: used, mountPath: /u}]}]\n  containers: [{name: c, image: busybox}]\n  volumes:\n  - {name: used, emptyDir: {}}\n  - {name: spare, emptyDir: {}}\n  - {name: claim, persistentVolumeClaim: {claimName: idle}}\n";
    node.write("pod.yaml", pod);
    node.start();
    let report =
        node.wait("the used volume published", |r| phase(r, "default/app", "used") == Some(Phase::Published));
    for name in ["spare", "claim"] {
        let v = volume(&report, "default/app", name).unwrap_or_else(|| panic!("{name} is listed"));
        assert_eq!(v.phase, Phase::Unused, "{name}");
        let reason = v.pending_reason.as_deref().unwrap_or_default();
        assert!(
            reason.contains("no container of pod default/app mounts volume") && reason.contains(name),
            "{reason}"
        );
    }
    let pod_dir = node.root.join("kubelet/pods/5e1d0a11-0000-4000-8000-000000000001/volumes");
    assert!(pod_dir.join("kubernetes.io~empty-dir/used").is_dir());
    assert!(!pod_dir.join("kubernetes.io~empty-dir/spare").exists(), "an unused emptyDir is not made");
    assert!(!pod_dir.join("kubernetes.io~csi").exists(), "an unused claim is not mounted");
    // `kvol status` says it too, and a runner's wait is not held up by it.
    let out =
        Command::new(env!("CARGO_BIN_EXE_kvol")).args(["status", "--root"]).arg(&node.root).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.contains("spare")).unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains("unused") && line.contains("no container of pod default/app mounts"), "{line}");
    // A container that starts using it: set up.
    node.write(
        "pod.yaml",
        &pod.replace(
            "containers: [{name: c, image: busybox}]",
            "containers: [{name: c, image: busybox, volumeMounts: [{name: spare, mountPath: /s}]}]",
        ),
    );
    node.wait("the spare volume published once used", |r| {
        phase(r, "default/app", "spare") == Some(Phase::Published)
    });
    node.remove("pod.yaml");
    node.wait("every volume gone", |r| r.volumes.is_empty());
}
