//! The real agent running its storage components: the bundled driver started as a child process that meets the agent only through registration, restarted when killed, gone with a killed agent, not started when the config turns it off, its data kept.

#[allow(dead_code)]
mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kvol_components_runtime::components::ComponentStatus;
use kvol_node::report::status::{Phase, StatusReport};
use kvol_plugin::{Mounter, SystemMounter};
use support::Node;

const STORAGE: &str = "\
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: kvol-hostpath}
provisioner: hostpath.csi.kvol.io
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: data, namespace: default}
spec:
  storageClassName: kvol-hostpath
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 16Mi}}
---
apiVersion: v1
kind: Pod
metadata: {name: app, namespace: default, uid: 7d1c0c55-0000-4000-8000-000000000001}
spec:
  containers: [{name: c, image: none, volumeMounts: [{name: data, mountPath: /data}]}]
  volumes: [{name: data, persistentVolumeClaim: {claimName: data}}]
";

const LIMIT: Duration = Duration::from_secs(60);

fn hostpath(report: &StatusReport) -> Option<&ComponentStatus> {
    report.components.iter().find(|c| c.name == "hostpath")
}

fn published(report: &StatusReport) -> bool {
    report.volumes.iter().any(|v| v.pod == "default/app" && v.volume == "data" && v.phase == Phase::Published)
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
}

fn wait_gone(pid: u32, what: &str) {
    let start = Instant::now();
    while alive(pid) {
        assert!(start.elapsed() < Duration::from_secs(10), "{what}: pid {pid} still runs");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The published volume's directory, its data in the driver's state directory.
fn publish_dir(report: &StatusReport) -> PathBuf {
    let v = report.volumes.iter().find(|v| v.pod == "default/app").expect("the volume");
    v.target.clone().expect("a target").join("mount")
}

/// What `file` holds in the data of the driver's volume `volume` (an entry of
/// [`driver_volumes`]): read from it, a directory; or, a loop-backed volume's image (the
/// embedded default's where loop devices can be made), through the pod's mount of it at
/// `published`, which stays while the driver is off as it would stay for a running container.
fn read_kept(volume: &Path, published: &Path, file: &str) -> String {
    if volume.is_dir() {
        return std::fs::read_to_string(volume.join(file)).unwrap();
    }
    assert!(volume.extension().is_some_and(|e| e == "img") && volume.is_file(), "{}", volume.display());
    let mounted = SystemMounter.mounts_under(published.parent().unwrap()).unwrap();
    assert!(
        mounted.iter().any(|m| m.target == published),
        "{} is still mounted: {mounted:?}",
        published.display()
    );
    std::fs::read_to_string(published.join(file)).unwrap()
}

fn driver_volumes(root: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(root.join("csi-hostpath/volumes"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .collect();
    out.sort();
    out
}

#[test]
fn the_bundled_driver_is_a_supervised_component_and_the_config_turns_it_off() {
    support::enter_private_mount_namespace();
    let mut node = Node::new();
    node.write("storage.yaml", STORAGE);
    node.start();

    // Started as a child, registered, serving: the claim is provisioned and published.
    let report = node
        .wait(LIMIT, |r| published(r) && hostpath(r).is_some_and(|c| c.state.pid.is_some()))
        .unwrap_or_else(|last| panic!("never published through the component: {last}\n{}", node.agent_log()));
    let first = hostpath(&report).unwrap().state.pid.unwrap();
    assert!(report.plugins.iter().any(|p| p == "hostpath.csi.kvol.io"), "{:?}", report.plugins);
    let target = publish_dir(&report);
    std::fs::write(target.join("kept"), "written through the component").unwrap();
    let log = std::fs::read_to_string(node.root.join("logs/hostpath.log")).unwrap();
    assert!(log.contains("--- kvol: starting hostpath"), "{log}");

    // Killed, it is started again and registers again; the pod's volume stays.
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(first as i32), nix::sys::signal::Signal::SIGKILL)
        .unwrap();
    let report = node
        .wait(LIMIT, |r| hostpath(r).is_some_and(|c| c.state.starts == 2 && c.state.pid.is_some()))
        .unwrap_or_else(|last| panic!("never restarted: {last}"));
    let second = hostpath(&report).unwrap().state.pid.unwrap();
    assert_ne!(second, first);
    assert_eq!(
        hostpath(&report).unwrap().state.last_exit.as_deref(),
        Some("the process signal: 9 (SIGKILL)")
    );
    assert!(published(&report));
    assert_eq!(std::fs::read_to_string(target.join("kept")).unwrap(), "written through the component");

    // The agent killed with -9 takes its driver with it: nothing is left serving the socket.
    node.kill_9();
    wait_gone(second, "the driver of a killed agent");

    // Restarted with the driver turned off: not started, its data left exactly where it is.
    let config = node.root.join("kvol.yaml");
    std::fs::write(&config, "storage:\n  driver: none\n").unwrap();
    node.agent_args = vec!["--config".into(), config.display().to_string()];
    node.start();
    let report = node
        .wait(LIMIT, |r| r.plugins.iter().any(|p| p == "kubernetes.io/empty-dir"))
        .unwrap_or_else(|last| panic!("the agent never reported: {last}\n{}", node.agent_log()));
    std::thread::sleep(Duration::from_secs(2));
    let report = node.wait(LIMIT, |_| true).unwrap_or(report);
    assert!(report.components.is_empty(), "{:?}", report.components);
    assert!(!report.plugins.iter().any(|p| p == "hostpath.csi.kvol.io"), "{:?}", report.plugins);
    let volumes = driver_volumes(&node.root);
    assert_eq!(volumes.len(), 1, "{volumes:?}");
    assert_eq!(read_kept(&volumes[0], &target, "kept"), "written through the component");

    // On again (no config): started, the same volume served.
    node.kill_9();
    node.agent_args.clear();
    node.start();
    node.wait(LIMIT, |r| {
        published(r) && hostpath(r).is_some_and(|c| c.state.starts == 1 && c.state.pid.is_some())
    })
    .unwrap_or_else(|last| panic!("never back: {last}\n{}", node.agent_log()));
    assert_eq!(driver_volumes(&node.root), volumes, "no new volume was made");
}

/// An agent on the claim and pod of [`STORAGE`], started with `--config` holding `text`; the
/// node and its config file's path.
fn started_with_config(text: &str) -> (Node, PathBuf) {
    let mut node = Node::new();
    node.write("storage.yaml", STORAGE);
    let config = node.root.join("etc/kvol.yaml");
    std::fs::create_dir_all(config.parent().unwrap()).unwrap();
    std::fs::write(&config, text).unwrap();
    node.agent_args = vec!["--config".into(), config.display().to_string()];
    node.start();
    (node, config)
}

/// Saves `text` as an editor does: a temporary file renamed over the config.
fn rename_save(path: &Path, text: &str) {
    let tmp = path.with_file_name(".kvol.yaml.tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// An agent whose config turns the bundled driver on, its claim published through it; the
/// node, the config file, the report and the driver's pid.
fn serving_with_hostpath() -> (Node, PathBuf, StatusReport, u32) {
    let (node, config) = started_with_config("storage:\n  driver: hostpath\n");
    let report = node
        .wait(LIMIT, |r| published(r) && hostpath(r).is_some_and(|c| c.state.pid.is_some()))
        .unwrap_or_else(|last| panic!("never published: {last}\n{}", node.agent_log()));
    let pid = hostpath(&report).unwrap().state.pid.unwrap();
    (node, config, report, pid)
}

fn config_problem(report: &StatusReport) -> Option<&String> {
    report.problems.iter().find(|p| p.starts_with("config change not applied"))
}

#[test]
fn a_config_change_is_applied_while_the_agent_runs_and_a_bad_one_is_not() {
    support::enter_private_mount_namespace();
    let (node, config, report, pid) = serving_with_hostpath();
    let target = publish_dir(&report);
    std::fs::write(target.join("kept"), "before the reload").unwrap();

    // Turned off by a rename-save: the driver stops, its data stays.
    rename_save(&config, "storage:\n  driver: none\n");
    node.wait(LIMIT, |r| r.components.is_empty())
        .unwrap_or_else(|last| panic!("the driver was not stopped: {last}\n{}", node.agent_log()));
    wait_gone(pid, "the turned-off driver");
    let volumes = driver_volumes(&node.root);
    assert_eq!(volumes.len(), 1, "{volumes:?}");
    assert_eq!(read_kept(&volumes[0], &target, "kept"), "before the reload");

    // A truncated write and an invalid section are refused, with the reason; nothing starts.
    let invalid_file = format!("invalid config file {}", config.display());
    let rows = [
        ("a truncated write", "storage:\n  driver: [hostp", invalid_file.as_str()),
        ("an unknown driver", "storage:\n  driver: nfs\n", "nfs"),
        (
            "none beside a component",
            "storage:\n  optionalCsiComponents: [none, snapshot-controller]\n",
            "none",
        ),
    ];
    for (what, text, reason) in rows {
        std::fs::write(&config, text).unwrap();
        let report = node
            .wait(LIMIT, |r| config_problem(r).is_some_and(|p| p.contains(reason)))
            .unwrap_or_else(|last| panic!("{what}: no problem naming {reason:?}: {last}"));
        assert!(report.components.is_empty(), "{what}: {:?}", report.components);
    }

    // A valid save again: the driver starts, the problem goes, the same volume is served.
    rename_save(&config, "storage:\n  driver: hostpath\n");
    let report = node
        .wait(LIMIT, |r| config_problem(r).is_none() && hostpath(r).is_some_and(|c| c.state.pid.is_some()))
        .unwrap_or_else(|last| panic!("never started again: {last}\n{}", node.agent_log()));
    assert_ne!(hostpath(&report).unwrap().state.pid, Some(pid));
    assert_eq!(driver_volumes(&node.root), volumes, "no new volume was made");
    assert!(published(&report));
}

fn kvol(args: &[&str], config: &Path) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_kvol"))
        .args(args)
        .arg("--config")
        .arg(config)
        .env_remove("KVOL_CONFIG")
        .output()
        .unwrap()
}

#[test]
fn status_shows_each_components_footprint_and_uninstall_refuses_while_data_depends_on_it() {
    support::enter_private_mount_namespace();
    let (node, config, _, pid) = serving_with_hostpath();
    let state_dir = node.root.display().to_string();

    // Once probed, the driver has said what it is (its version and manifest).
    node.wait(LIMIT, |r| hostpath(r).is_some_and(|c| !c.state.manifest.is_empty()))
        .unwrap_or_else(|last| panic!("the driver never said its backing: {last}"));
    // The footprint: the driver's process with its memory and CPU, and the volume it serves.
    let out = kvol(&["components", "status", "--state-dir", &state_dir, "-o", "json"], &config);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let row = rows.as_array().unwrap().iter().find(|r| r["name"] == "hostpath").expect("a hostpath row");
    assert_eq!(row["decision"], "run");
    assert_eq!(row["state"], "running");
    assert_eq!(row["pid"], pid);
    assert_eq!(row["volumes_published"], 1, "{row}");
    assert!(row["rss_bytes"].as_u64().is_some_and(|b| b > 1 << 20), "{row}");
    assert!(row["cpu_seconds"].as_f64().is_some(), "{row}");
    // What the driver says of itself: its volume backing, loop where loop devices can be made.
    let backing = row["manifest"]["volume-backing"].as_str().unwrap_or_else(|| panic!("no backing: {row}"));
    let want = if kvol_hostpath::backing::probe().problems().is_empty() {
        "loop (chosen automatically: loop devices can be made here"
    } else {
        "directory (loop devices cannot be made here: "
    };
    assert!(backing.starts_with(want), "{backing}");
    let volumes = driver_volumes(&node.root);
    let image = volumes.iter().any(|v| v.extension().is_some_and(|e| e == "img"));
    assert_eq!(image, want.starts_with("loop"), "the claim's volume is of that backing: {volumes:?}");
    let lvm = rows.as_array().unwrap().iter().find(|r| r["name"] == "lvm").expect("an lvm row");
    assert_eq!(lvm["state"], "stopped");

    let uninstall = |force: bool| {
        let mut args = vec!["components", "uninstall", "hostpath", "--state-dir", &state_dir];
        if force {
            args.push("--force");
        }
        kvol(&args, &config)
    };
    // On in the config: refused.
    let out = uninstall(false);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is on in the config"), "{out:?}");

    // Off, but its claim and volume remain: refused, each named; nothing removed.
    rename_save(&config, "storage:\n  driver: none\n");
    node.wait(LIMIT, |r| r.components.is_empty()).unwrap_or_else(|last| panic!("not stopped: {last}"));
    wait_gone(pid, "the turned-off driver");
    let out = uninstall(false);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("PersistentVolumeClaim default/data"), "{stderr}");
    assert!(stderr.contains("PersistentVolume pvc-"), "{stderr}");
    assert!(node.root.join("csi-hostpath/volumes").is_dir(), "refused, yet data was removed");

    // The claim deleted while the driver runs again (its volume deleted through it), then off:
    // nothing depends on it any more, and uninstall removes its data.
    rename_save(&config, "storage:\n  driver: hostpath\n");
    node.wait(LIMIT, |r| hostpath(r).is_some_and(|c| c.state.pid.is_some())).unwrap();
    // The claim and its pod deleted: the agent deletes the claim's volume through the driver.
    node.write("storage.yaml", STORAGE.split("---").next().unwrap());
    let start = Instant::now();
    while std::fs::read_dir(node.root.join("provisioned")).is_ok_and(|d| d.count() > 0) {
        assert!(start.elapsed() < LIMIT, "the claim's volume was never deleted\n{}", node.agent_log());
        std::thread::sleep(Duration::from_millis(50));
    }
    rename_save(&config, "storage:\n  driver: none\n");
    node.wait(LIMIT, |r| r.components.is_empty()).unwrap();
    let out = uninstall(false);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("component hostpath uninstalled"), "{stdout}");
    assert!(!node.root.join("csi-hostpath").exists(), "its data directory is gone");
    assert!(!node.root.join("logs/hostpath.log").exists(), "its log is gone");
}

const SNAPSHOT: &str = "\
apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshotClass
metadata:
  name: hostpath-snapshots
  annotations: {snapshot.storage.kubernetes.io/is-default-class: \"true\"}
driver: hostpath.csi.kvol.io
deletionPolicy: Delete
---
apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshot
metadata: {name: before, namespace: default}
spec:
  source: {persistentVolumeClaimName: data}
";

const RESTORED: &str = "\
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: restored, namespace: default}
spec:
  storageClassName: kvol-hostpath
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 16Mi}}
  dataSource: {apiGroup: snapshot.storage.k8s.io, kind: VolumeSnapshot, name: before}
---
apiVersion: v1
kind: Pod
metadata: {name: restorer, namespace: default}
spec:
  containers: [{name: c, image: none, volumeMounts: [{name: data, mountPath: /data}]}]
  volumes: [{name: data, persistentVolumeClaim: {claimName: restored}}]
";

fn snapshot_of<'a>(
    report: &'a StatusReport,
    name: &str,
) -> Option<&'a kvol_node::report::status::SnapshotStatus> {
    report.snapshots.iter().find(|s| s.name == name)
}

/// An agent with `config`, its claim published and "in the snapshot" written in `kept`.
fn published_with_data(config: &str) -> (Node, PathBuf, PathBuf) {
    let (node, config) = started_with_config(config);
    let report = node
        .wait(LIMIT, published)
        .unwrap_or_else(|last| panic!("never published: {last}\n{}", node.agent_log()));
    let dir = publish_dir(&report);
    std::fs::write(dir.join("kept"), "in the snapshot").unwrap();
    (node, config, dir)
}

/// With the bundled driver turned off, `kvol components uninstall hostpath` refuses and names
/// `holder`; the driver is then turned on again.
fn assert_uninstall_refused_naming(node: &Node, config: &Path, holder: &str) {
    rename_save(config, "storage:\n  driver: none\n  optionalCsiComponents: [snapshot-controller]\n");
    node.wait(LIMIT, |r| r.components.is_empty()).unwrap_or_else(|last| panic!("not stopped: {last}"));
    let state_dir = node.root.display().to_string();
    let out = kvol(&["components", "uninstall", "hostpath", "--state-dir", &state_dir], config);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(holder), "{stderr}");
    rename_save(config, "storage:\n  optionalCsiComponents: [snapshot-controller]\n");
    node.wait(LIMIT, |r| hostpath(r).is_some_and(|c| c.state.pid.is_some())).unwrap();
}

/// Writes `restored` (a claim restored from a snapshot and its pod `restorer`) and returns the
/// restored volume's directory once it is published.
fn restored_dir(node: &Node, restored: &str) -> PathBuf {
    node.write("restored.yaml", restored);
    let report = node
        .wait(LIMIT, |r| r.volumes.iter().any(|v| v.pod == "default/restorer" && v.phase == Phase::Published))
        .unwrap_or_else(|last| {
            panic!("the restored claim was never published: {last}\n{}", node.agent_log())
        });
    let restored = report.volumes.iter().find(|v| v.pod == "default/restorer").unwrap();
    restored.target.clone().unwrap().join("mount")
}

#[test]
fn a_snapshot_manifest_makes_a_real_snapshot_that_a_new_claim_restores_from() {
    support::enter_private_mount_namespace();
    // Snapshots off first: a VolumeSnapshot is left alone, and the status says why.
    let (node, config, data) = published_with_data("storage:\n  optionalCsiComponents: [none]\n");
    node.write("snapshot.yaml", SNAPSHOT);
    node.wait(LIMIT, |r| r.problems.iter().any(|p| p.contains("the snapshot-controller component is off")))
        .unwrap_or_else(|last| panic!("no word on snapshots being off: {last}"));
    assert!(node.status().unwrap().snapshots.is_empty());

    // On (a rename-save): the snapshot is taken through the driver and recorded.
    rename_save(&config, "storage:\n  optionalCsiComponents: [snapshot-controller]\n");
    let report = node
        .wait(LIMIT, |r| snapshot_of(r, "default/before").is_some_and(|s| s.ready_to_use))
        .unwrap_or_else(|last| panic!("never taken: {last}\n{}", node.agent_log()));
    let taken = snapshot_of(&report, "default/before").unwrap().clone();
    assert_eq!(taken.driver, "hostpath.csi.kvol.io");
    assert_eq!(taken.source_claim, "default/data");
    // Written after the snapshot: the restored volume must not have it.
    std::fs::write(data.join("later"), "after the snapshot").unwrap();

    // A claim restored from it: its pod sees the data as it was.
    let restored_dir = restored_dir(&node, RESTORED);
    assert_eq!(std::fs::read_to_string(restored_dir.join("kept")).unwrap(), "in the snapshot");
    assert!(!restored_dir.join("later").exists(), "the restore holds what was written after the snapshot");

    // The driver turned off, uninstall refuses and names the snapshot among what depends on it.
    let snapshots_dir = node.root.join("csi-hostpath/snapshots");
    let held = || -> Vec<std::path::PathBuf> {
        std::fs::read_dir(&snapshots_dir).map(|d| d.flatten().map(|e| e.path()).collect()).unwrap_or_default()
    };
    assert_eq!(held().len(), 1, "the driver holds the snapshot: {:?}", held());
    assert_uninstall_refused_naming(&node, &config, "VolumeSnapshot default/before");

    // The VolumeSnapshot deleted: its snapshot is deleted on the driver and forgotten.
    node.remove("snapshot.yaml");
    node.write("class.yaml", SNAPSHOT.split("---").next().unwrap());
    node.wait(LIMIT, |r| r.snapshots.is_empty())
        .unwrap_or_else(|last| panic!("the snapshot was never deleted: {last}\n{}", node.agent_log()));
    let snapshots_dir = node.root.join("csi-hostpath/snapshots");
    let left: Vec<_> = std::fs::read_dir(&snapshots_dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "the driver still holds {left:?}");
    assert!(!node.root.join("snapshots/default~before.json").exists());
}

/// A Retain class, so a snapshot outlives its VolumeSnapshot, and one taken with it.
const RETAINED: &str = "\
apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshotClass
metadata: {name: retained}
driver: hostpath.csi.kvol.io
deletionPolicy: Retain
---
apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshot
metadata: {name: before, namespace: default}
spec:
  volumeSnapshotClassName: retained
  source: {persistentVolumeClaimName: data}
";

/// A pre-provisioned VolumeSnapshotContent of `handle`, bound to VolumeSnapshot
/// `default/<snapshot>`, and the VolumeSnapshot `default/<name>` that names it.
fn imported(content: &str, handle: &str, snapshot: &str, name: &str) -> String {
    format!(
        "apiVersion: snapshot.storage.k8s.io/v1\nkind: VolumeSnapshotContent\nmetadata: {{name: {content}}}\n\
         spec:\n  driver: hostpath.csi.kvol.io\n  deletionPolicy: Delete\n  source: {{snapshotHandle: {handle}}}\n  \
         volumeSnapshotRef: {{name: {snapshot}, namespace: default}}\n---\n\
         apiVersion: snapshot.storage.k8s.io/v1\nkind: VolumeSnapshot\nmetadata: {{name: {name}, namespace: default}}\n\
         spec:\n  source: {{volumeSnapshotContentName: {content}}}\n"
    )
}

#[test]
fn a_pre_provisioned_content_brings_in_a_snapshot_the_driver_already_has() {
    support::enter_private_mount_namespace();
    let (node, config, _) = published_with_data("storage:\n  optionalCsiComponents: [snapshot-controller]\n");

    // A snapshot taken with a Retain class, its VolumeSnapshot then deleted: the snapshot stays
    // on the driver, as a retained content would.
    node.write("retained.yaml", RETAINED);
    let report = node
        .wait(LIMIT, |r| snapshot_of(r, "default/before").is_some_and(|s| s.ready_to_use))
        .unwrap_or_else(|last| panic!("never taken: {last}\n{}", node.agent_log()));
    let handle = snapshot_of(&report, "default/before").unwrap().snapshot_handle.clone();
    node.write("retained.yaml", RETAINED.split("---").next().unwrap());

    // Contents that do not fit say why and bring nothing in: one bound to another snapshot, one
    // whose handle the driver does not have.
    node.write("stray.yaml", &imported("stray", &handle, "someone-else", "stray"));
    node.write("ghost.yaml", &imported("ghost", "no-such-snapshot", "ghost", "ghost"));
    node.wait(LIMIT, |r| {
        r.problems.iter().any(|p| {
            p.contains("snapshot default/stray") && p.contains("is for VolumeSnapshot default/someone-else")
        }) && r
            .problems
            .iter()
            .any(|p| p.contains("snapshot default/ghost") && p.contains("the driver has no such snapshot"))
    })
    .unwrap_or_else(|last| panic!("no word on the contents that do not fit: {last}\n{}", node.agent_log()));
    let report = node.status().unwrap();
    assert!(
        snapshot_of(&report, "default/stray").is_none() && snapshot_of(&report, "default/ghost").is_none()
    );
    node.remove("stray.yaml");
    node.remove("ghost.yaml");

    // The content that names the snapshot back is brought in: asked about with ListSnapshots.
    node.write("imported.yaml", &imported("imported", &handle, "imported", "imported"));
    let report = node
        .wait(LIMIT, |r| snapshot_of(r, "default/imported").is_some_and(|s| s.ready_to_use))
        .unwrap_or_else(|last| panic!("never brought in: {last}\n{}", node.agent_log()));
    let brought = snapshot_of(&report, "default/imported").unwrap();
    assert_eq!(brought.content.as_deref(), Some("imported"));
    assert_eq!(brought.snapshot_handle, handle);
    assert!(brought.size_bytes > 0, "the driver's size, from ListSnapshots: {brought:?}");
    let text = std::process::Command::new(env!("CARGO_BIN_EXE_kvol"))
        .args(["status", "--state-dir"])
        .arg(&node.root)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("snapshot default/imported: ready")
            && text.contains("from VolumeSnapshotContent imported"),
        "{text}"
    );

    // A claim restored from it sees the data as it was.
    let restored_dir = restored_dir(&node, &RESTORED.replace("name: before", "name: imported"));
    assert_eq!(std::fs::read_to_string(restored_dir.join("kept")).unwrap(), "in the snapshot");

    // Uninstall names the content among what depends on the driver.
    assert_uninstall_refused_naming(&node, &config, "VolumeSnapshotContent imported");

    // Its VolumeSnapshot deleted, the content's Delete policy deletes the snapshot on the driver.
    node.remove("restored.yaml");
    node.write(
        "imported.yaml",
        imported("imported", &handle, "imported", "imported").split("---").next().unwrap(),
    );
    node.wait(LIMIT, |r| snapshot_of(r, "default/imported").is_none())
        .unwrap_or_else(|last| panic!("never deleted: {last}\n{}", node.agent_log()));
    let left: Vec<_> = std::fs::read_dir(node.root.join("csi-hostpath/snapshots"))
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "the driver still holds {left:?}");
}

/// Two user components that record their lives: one told of a change of its config file by
/// SIGHUP, one restarted. Both have their config checked: a candidate saying `bad` is refused.
/// The ticker has defaults, the restarter none.
const USER_COMPONENTS: &[(&str, &str)] = &[
    (
        "ticker.yaml",
        "name: ticker\nrole: optional\nstandalone:\n  process:\n    command: [sh, -c, \"trap 'echo reloaded >> {state-dir}.log' HUP; echo started >> {state-dir}.log; while true; do sleep 0.05; done\", \"{config}\"]\n    reload: sighup\n    config:\n      defaults: {level: 0, name: ticker}\n      check: [sh, -c, \"if grep -q bad \\\"$0\\\"; then echo the level is bad >&2; exit 1; fi\", \"{candidate}\"]\n",
    ),
    (
        "restarter.yaml",
        "name: restarter\nrole: optional\nstandalone:\n  process:\n    command: [sh, -c, \"echo started >> {state-dir}.log; exec sleep 600\", \"{config}\"]\n    reload: restart\n    config:\n      check: [sh, -c, \"! grep -q bad \\\"$0\\\"\", \"{candidate}\"]\n",
    ),
];

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path).unwrap_or_default().lines().map(String::from).collect()
}

/// Whether `done` holds within [`LIMIT`].
fn wait_until(done: impl Fn() -> bool) -> bool {
    let start = Instant::now();
    while !done() {
        if start.elapsed() >= LIMIT {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

fn wait_for(what: &str, done: impl Fn() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < LIMIT, "never {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The status line about a component's config file, if any.
fn component_config_problem<'a>(report: &'a StatusReport, component: &str) -> Option<&'a String> {
    let prefix = format!("component {component}: config not applied");
    report.problems.iter().find(|p| p.starts_with(&prefix))
}

#[test]
fn a_change_of_a_components_own_config_file_reaches_it_as_its_definition_says() {
    support::enter_private_mount_namespace();
    let mut node = Node::new();
    let definitions = node.root.join("components.d");
    std::fs::create_dir_all(&definitions).unwrap();
    for (file, text) in USER_COMPONENTS {
        std::fs::write(definitions.join(file), text).unwrap();
    }
    let etc = node.root.join("etc");
    std::fs::create_dir_all(&etc).unwrap();
    let config = etc.join("kvol.yaml");
    std::fs::write(&config, "storage:\n  driver: none\n  optionalCsiComponents: [ticker, restarter]\n")
        .unwrap();
    // The restarter's file is refused from the start, and it has no earlier copy to run with.
    std::fs::write(etc.join("restarter.yaml"), "level: bad\n").unwrap();
    node.agent_args = vec![
        "--config".into(),
        config.display().to_string(),
        "--component-definitions-dir".into(),
        definitions.display().to_string(),
    ];
    node.start();
    let ticker_log = node.root.join("csi-ticker.log");
    let restarter_log = node.root.join("csi-restarter.log");
    let ticker_copy = node.root.join("components/ticker.yaml");
    let restarter_copy = node.root.join("components/restarter.yaml");
    let copy = |path: &Path| std::fs::read_to_string(path).unwrap_or_default();
    wait_for("the ticker started", || lines(&ticker_log) == ["started"]);
    assert!(copy(&ticker_copy).contains("level: 0"), "no user file: the defaults\n{}", copy(&ticker_copy));
    let report = node
        .wait(LIMIT, |r| component_config_problem(r, "restarter").is_some_and(|p| p.contains("not started")))
        .unwrap();
    let problem = component_config_problem(&report, "restarter").unwrap();
    assert!(problem.contains(&etc.join("restarter.yaml").display().to_string()), "{problem}");
    assert!(!restarter_log.exists() && !restarter_copy.exists(), "held until its config is valid");

    // Fixed: the restarter starts with its copy in place.
    rename_save(&etc.join("restarter.yaml"), "level: 1\n");
    wait_for("the restarter started", || lines(&restarter_log) == ["started"]);
    assert!(copy(&restarter_copy).contains("level: 1"), "{}", copy(&restarter_copy));
    node.wait(LIMIT, |r| component_config_problem(r, "restarter").is_none()).unwrap();
    // The ticker's shell must have its trap in place before the signal.
    std::thread::sleep(Duration::from_millis(300));

    // SIGHUP for the ticker, once its copy holds the change over its defaults.
    rename_save(&etc.join("ticker.yaml"), "level: 1\n");
    // Said in full if it never comes: the ticker's own log, its copy, and the agent's.
    let told = wait_until(|| lines(&ticker_log) == ["started", "reloaded"]);
    assert!(
        told,
        "never the ticker told by SIGHUP: ticker log {:?}, copy {:?}\nagent log:\n{}",
        lines(&ticker_log),
        copy(&ticker_copy),
        node.agent_log()
    );
    let text = copy(&ticker_copy);
    assert!(
        text.contains("level: 1") && text.contains("name: ticker"),
        "the user's level over the defaults:\n{text}"
    );
    // The restarter restarts.
    std::fs::write(etc.join("restarter.yaml"), "level: 2\n").unwrap();
    wait_for("the restarter restarted", || lines(&restarter_log) == ["started", "started"]);
    let report = node
        .wait(LIMIT, |r| r.components.iter().any(|c| c.name == "restarter" && c.state.starts == 1))
        .unwrap();
    assert!(
        report.components.iter().any(|c| c.name == "ticker" && c.state.starts == 1),
        "{:?}",
        report.components
    );

    // Refused edits (the check says no; a save cut short) reach nobody, keep the copy, and
    // the status says why.
    for (text, words) in [("level: bad\n", "the level is bad"), ("", "is empty")] {
        std::fs::write(etc.join("ticker.yaml"), text).unwrap();
        let report = node
            .wait(LIMIT, |r| component_config_problem(r, "ticker").is_some_and(|p| p.contains(words)))
            .unwrap();
        let problem = component_config_problem(&report, "ticker").unwrap();
        assert!(problem.contains("keeps running with its last good config"), "{problem}");
        assert!(copy(&ticker_copy).contains("level: 1"), "the copy stays:\n{}", copy(&ticker_copy));
    }
    assert_eq!(lines(&ticker_log), ["started", "reloaded"]);

    // Saving the good content again clears the problem and tells nobody, as does another file.
    rename_save(&etc.join("ticker.yaml"), "level: 1\n");
    node.wait(LIMIT, |r| component_config_problem(r, "ticker").is_none()).unwrap();
    std::fs::write(etc.join("unrelated.yaml"), "x: 1\n").unwrap();
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(lines(&ticker_log), ["started", "reloaded"]);
    assert_eq!(lines(&restarter_log), ["started", "started"]);

    // Removed: back to the defaults, and the ticker told.
    std::fs::remove_file(etc.join("ticker.yaml")).unwrap();
    wait_for("the ticker told of its defaults", || lines(&ticker_log) == ["started", "reloaded", "reloaded"]);
    assert!(copy(&ticker_copy).contains("level: 0"), "{}", copy(&ticker_copy));
}

/// The upstream hostpath driver (`KVOL_UPSTREAM_HOSTPATH`) and node-driver-registrar
/// (`KVOL_NODE_DRIVER_REGISTRAR`) as a user's component: the agent runs both from a definition
/// file, meets the driver through the registrar's registration, provisions and publishes a
/// claim on it, restarts the driver when it is killed, and reports both processes.
#[test]
fn an_upstream_driver_with_its_registrar_is_a_component_like_any_other() {
    let Some((driver, registrar)) = support::upstream_hostpath_and_registrar() else { return };
    support::enter_private_mount_namespace();
    let mut node = Node::new();
    let definitions = node.root.join("components.d");
    std::fs::create_dir_all(&definitions).unwrap();
    std::fs::write(
        definitions.join("upstream.yaml"),
        format!(
            "name: upstream-hostpath\nrole: driver\nprovides: {{csiDriver: hostpath.csi.k8s.io}}\nstandalone:\n  process:\n    \
             command: [{driver:?}, \"--endpoint=unix://{{socket}}\", \"--nodeid={{node}}\", --drivername=hostpath.csi.k8s.io, \
             \"--statedir={{state-dir}}\"]\n    \
             registrar: [{registrar:?}, \"--csi-address={{socket}}\", \"--kubelet-registration-path={{socket}}\", \
             \"--plugin-registration-path={{registration-dir}}\"]\n"
        ),
    )
    .unwrap();
    let config = node.root.join("kvol.yaml");
    std::fs::write(&config, "storage:\n  driver: upstream-hostpath\n  optionalCsiComponents: [none]\n")
        .unwrap();
    node.agent_args = vec![
        "--config".into(),
        config.display().to_string(),
        "--component-definitions-dir".into(),
        definitions.display().to_string(),
    ];
    node.write(
        "storage.yaml",
        &STORAGE.replace("provisioner: hostpath.csi.kvol.io", "provisioner: hostpath.csi.k8s.io"),
    );
    node.start();
    let component = |r: &StatusReport, name: &str| r.components.iter().find(|c| c.name == name).cloned();
    let report = node
        .wait(LIMIT, |r| {
            published(r) && component(r, "upstream-hostpath").is_some_and(|c| c.state.version.is_some())
        })
        .unwrap_or_else(|last| {
            panic!("never published through the upstream driver: {last}\n{}", node.agent_log())
        });
    let upstream = component(&report, "upstream-hostpath").unwrap();
    assert!(upstream.state.version.as_deref().unwrap().starts_with("hostpath.csi.k8s.io "), "{upstream:?}");
    assert!(component(&report, "upstream-hostpath-registrar").is_some_and(|c| c.state.pid.is_some()));
    assert!(!report.plugins.iter().any(|p| p == "hostpath.csi.kvol.io"), "the bundled driver is not chosen");
    let target = publish_dir(&report);
    std::fs::write(target.join("kept"), "through upstream").unwrap();

    // Killed, the upstream driver is started again; the pod's volume and its data stay.
    let first = upstream.state.pid.unwrap();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(first as i32), nix::sys::signal::Signal::SIGKILL)
        .unwrap();
    let report = node
        .wait(LIMIT, |r| {
            component(r, "upstream-hostpath")
                .is_some_and(|c| c.state.starts == 2 && c.state.healthy == Some(true))
        })
        .unwrap_or_else(|last| panic!("never restarted: {last}\n{}", node.agent_log()));
    assert!(published(&report));
    assert_eq!(std::fs::read_to_string(target.join("kept")).unwrap(), "through upstream");

    // Pod and claim gone: the volume is unpublished and deleted through the upstream driver.
    node.remove("storage.yaml");
    node.wait(LIMIT, |r| r.volumes.is_empty() && r.node_volumes.is_empty())
        .unwrap_or_else(|last| panic!("never torn down: {last}\n{}", node.agent_log()));
    let log = node.agent_log();
    assert!(log.contains("claim deleted: its volume deleted"), "{log}");
}
