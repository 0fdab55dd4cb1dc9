//! Two attachable Flexvolume drivers whose pods name their volumes alike: each volume is attached, staged, published and torn down by its own driver (unique volume names carry the plugin).
//!
//! Runs the real agent on kvol's own test drivers; when `KVOL_E2E_FLEXVOLUME_DIR` names the
//! Kubernetes e2e Flexvolume drivers, again with upstream's `dummy-attachable` installed under
//! two names.

#[allow(dead_code)]
mod support;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kvol_node::report::status::Phase;
use support::{Node, enter_private_mount_namespace};

/// An attachable driver that logs each call to `calls.log` beside itself and stages a tmpfs
/// holding a file `driver` with its own name; kvol binds the staged mount into the pod.
fn test_driver(name: &str, log: &Path) -> String {
    format!(
        r#"#!/bin/sh
echo "$*" >> {log}
op=$1; shift
case "$op" in
  init) echo '{{"status":"Success","capabilities":{{"attach":true}}}}' ;;
  attach|waitforattach) echo '{{"status":"Success","device":"/dev/{name}"}}' ;;
  isattached) echo '{{"status":"Success","attached":true}}' ;;
  detach) echo '{{"status":"Success"}}' ;;
  mountdevice)
    mkdir -p "$1" && mount -t tmpfs {name} "$1" && echo {name} > "$1/driver" || {{ echo '{{"status":"Failure","message":"mount failed"}}'; exit 1; }}
    echo '{{"status":"Success"}}' ;;
  unmountdevice) umount "$1" && echo '{{"status":"Success"}}' ;;
  *) echo '{{"status":"Not supported"}}' ;;
esac
"#,
        log = log.display()
    )
}

fn install(flex_dir: &Path, dir_name: &str, script: &[u8]) {
    let dir = flex_dir.join(dir_name);
    fs::create_dir_all(&dir).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
    let driver = dir_name.split_once('~').unwrap().1;
    let path = dir.join(driver);
    fs::write(&path, script).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
}

fn pod(name: &str, driver: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  containers: [{{name: app, image: busybox, volumeMounts: [{{name: v, mountPath: /v}}]}}]\n  volumes:\n  - {{name: v, flexVolume: {{driver: {driver}}}}}\n"
    )
}

/// Publishes one pod per driver (both volumes named `v`), checks each pod sees its own driver's
/// volume and removes the pods; `marker` names the file each staged volume holds with its
/// driver's name (written by the test for upstream's drivers). Returns once the pods' volumes
/// are gone; the caller checks the node-level teardown.
fn two_drivers_one_name(node: &mut Node, drivers: [&str; 2], write_marker: bool) {
    node.start();
    node.write("a.yaml", &pod("a", drivers[0]));
    node.write("b.yaml", &pod("b", drivers[1]));
    let published = |r: &kvol_node::report::status::StatusReport| {
        r.volumes.len() == 2 && r.volumes.iter().all(|v| v.phase == Phase::Published)
    };
    let report = node
        .wait(Duration::from_secs(60), published)
        .unwrap_or_else(|last| panic!("both pods' volumes published: {last}\n{}", node.agent_log()));
    let mut node_volumes: Vec<&str> = report.node_volumes.iter().map(|v| v.unique_name.as_str()).collect();
    node_volumes.sort();
    let mut want: Vec<String> = drivers.iter().map(|d| format!("{d}/v")).collect();
    want.sort();
    assert_eq!(node_volumes, want, "one node-level record per driver");
    for (pod, driver) in ["a", "b"].iter().zip(drivers) {
        let v = report.volumes.iter().find(|v| v.pod == format!("default/{pod}")).unwrap();
        let staging = v.staging_path.clone().expect("an attachable volume is staged");
        assert!(
            staging.to_string_lossy().contains(driver),
            "{pod}'s volume is staged by {driver}: {}",
            staging.display()
        );
        if write_marker {
            fs::write(staging.join("driver"), format!("{driver}\n")).unwrap();
        }
        let target: PathBuf = v.target.clone().unwrap();
        let seen = fs::read_to_string(target.join("driver")).unwrap();
        assert!(
            driver.ends_with(seen.trim()),
            "pod {pod} sees {seen:?} through {}, not {driver}'s volume",
            target.display()
        );
    }
    node.remove("a.yaml");
    node.remove("b.yaml");
    node.wait(Duration::from_secs(60), |r| r.volumes.is_empty())
        .unwrap_or_else(|last| panic!("the pods' volumes torn down: {last}\n{}", node.agent_log()));
    assert!(node.pod_volume_dirs().is_empty(), "directories left: {:?}", node.pod_volume_dirs());
}

/// Everything came down: no node-level record, no mount.
fn assert_all_torn_down(node: &Node) {
    node.wait(Duration::from_secs(60), |r| r.node_volumes.is_empty())
        .unwrap_or_else(|last| panic!("everything torn down: {last}\n{}", node.agent_log()));
    assert!(node.mounts().is_empty(), "mounts left: {:?}", node.mounts());
}

#[test]
fn two_flexvolume_drivers_never_share_a_volume_of_the_same_name() {
    enter_private_mount_namespace();
    let mut node = Node::new();
    let flex = node.root.join("flexvolume");
    let logs: Vec<PathBuf> = ["alpha", "beta"].iter().map(|n| node.root.join(format!("{n}.calls"))).collect();
    install(&flex, "acme~alpha", test_driver("alpha", &logs[0]).as_bytes());
    install(&flex, "acme~beta", test_driver("beta", &logs[1]).as_bytes());
    two_drivers_one_name(&mut node, ["acme/alpha", "acme/beta"], false);
    assert_all_torn_down(&node);
    for (log, name) in logs.iter().zip(["alpha", "beta"]) {
        let calls = fs::read_to_string(log).unwrap();
        let ops: Vec<&str> =
            calls.lines().filter_map(|l| l.split_whitespace().next()).filter(|op| *op != "init").collect();
        for op in ["attach", "mountdevice", "unmountdevice", "detach"] {
            assert_eq!(ops.iter().filter(|o| **o == op).count(), 1, "{name}: one {op} in {ops:?}");
        }
        assert!(calls.contains(&format!("acme/{name}/mounts/v")), "{name} staged its own volume:\n{calls}");
    }
    node.kill_9();
}

#[test]
fn upstream_e2e_flexvolume_drivers_never_share_a_volume_of_the_same_name() {
    let Ok(dir) = std::env::var("KVOL_E2E_FLEXVOLUME_DIR") else {
        eprintln!("skipped: KVOL_E2E_FLEXVOLUME_DIR is unset (the Kubernetes e2e Flexvolume drivers)");
        return;
    };
    enter_private_mount_namespace();
    let mut node = Node::new();
    let script = fs::read(Path::new(&dir).join("dummy-attachable"))
        .expect("dummy-attachable in KVOL_E2E_FLEXVOLUME_DIR");
    let flex = node.root.join("flexvolume");
    install(&flex, "k8s~dummy-attachable", &script);
    install(&flex, "k8s~dummy-twin", &script);
    two_drivers_one_name(&mut node, ["k8s/dummy-attachable", "k8s/dummy-twin"], true);
    // Upstream's dummy-attachable checks that `unmountdevice` is given the device as a second
    // argument, but kubelet (and kvol, as kubelet) passes only the mount path, so the driver
    // answers Failure and the volume stays staged. kvol keeps it staged and mounted (nothing is
    // lost), retries with backoff, and says which driver refused and why.
    let refused = |r: &kvol_node::report::status::StatusReport| {
        r.node_volumes.len() == 2
            && r.node_volumes.iter().all(|v| {
                v.last_error.as_deref().is_some_and(|e| {
                    e.contains(&format!("flexvolume driver {}", v.plugin))
                        && e.contains("unmountdevice")
                        && e.contains("expected device foo")
                })
            })
    };
    let report = node.wait(Duration::from_secs(30), refused).unwrap_or_else(|last| {
        panic!("both unstages refused, with the reason: {last}\n{}", node.agent_log())
    });
    let mounts = node.mounts();
    for v in &report.node_volumes {
        let staging = v.staging_path.clone().unwrap();
        assert!(
            mounts.iter().any(|m| m.target == staging),
            "{} stays mounted: {mounts:?}",
            staging.display()
        );
        assert!(staging.join("index.html").exists(), "the driver's data under {} is kept", staging.display());
    }
    node.kill_9();
}
