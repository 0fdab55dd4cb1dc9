//! The node's part of expansion through the real `kvol agent` and its bundled driver: a published claim's PersistentVolume grows (as the external-resizer grows it after ControllerExpandVolume), and the agent calls NodeExpandVolume on the published volume without unpublishing it — once, and not again after a `kill -9`.

#[allow(dead_code)]
mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use kvol_csi::proto::csi::controller_client::ControllerClient;
use kvol_csi::proto::csi::volume_capability::{AccessMode, AccessType, MountVolume, access_mode::Mode};
use kvol_csi::proto::csi::{
    CapacityRange, ControllerExpandVolumeRequest, CreateVolumeRequest, VolumeCapability,
};
use kvol_node::report::status::Phase;
use support::grow::{
    LOOP_DRIVER, claim_of, data_mount, fill_near_full, fs_bytes, loop_backing_missing, loop_claim, loop_node,
    may_grow_mounted_ext4, node_for,
};
use support::{Node, enter_private_mount_namespace};

const DRIVER: &str = "hostpath.csi.kvol.io";

fn storage(handle: &str, size: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: PersistentVolume
metadata: {{name: pv-grow}}
spec:
  capacity: {{storage: {size}}}
  accessModes: [ReadWriteOnce]
  csi: {{driver: {DRIVER}, volumeHandle: {handle}}}
  claimRef: {{namespace: default, name: grow}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: grow, namespace: default}}
spec: {{volumeName: pv-grow, accessModes: [ReadWriteOnce], resources: {{requests: {{storage: {size}}}}}}}
"#
    )
}

const POD: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: db, namespace: default}\n\
                   spec: {containers: [{name: c, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}], volumes: [{name: data, persistentVolumeClaim: {claimName: grow}}]}\n";

async fn controller(socket: &Path) -> ControllerClient<tonic::transport::Channel> {
    let start = Instant::now();
    loop {
        let endpoint =
            tonic::transport::Endpoint::from_shared(format!("unix://{}", socket.display())).unwrap();
        match endpoint.connect().await {
            Ok(channel) => return ControllerClient::new(channel),
            Err(e) => assert!(start.elapsed() < Duration::from_secs(30), "the bundled driver's socket: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A node whose bundled driver keeps its volumes in directories: the tests below that use it
/// are about the agent's part of expansion (when it expands, once, not again after a kill), not
/// about the driver's sizes. On the embedded default's loop backing an ext4 volume grows online
/// only with CAP_SYS_RESOURCE, which sandboxes (and this project's CI) drop; the loop backing's
/// growth in a pod's filesystem is the xfs test's below, and kvol-hostpath's loop tests'.
fn node_on_directories() -> Node {
    let mut node = Node::new();
    node.agent_env.push(("KVOL_VOLUME_BACKING".into(), "directory".into()));
    node
}

/// A runtime for the test's calls and the controller service of CSI driver `name`, registered
/// with `node`.
fn controller_of(
    node: &Node,
    name: &str,
) -> (tokio::runtime::Runtime, ControllerClient<tonic::transport::Channel>) {
    let socket = node.root.join("kubelet/plugins").join(name).join("csi.sock");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let driver = runtime.block_on(controller(&socket));
    (runtime, driver)
}

/// CreateVolume of `bytes` through the driver's controller, single-node-writer with `access`;
/// the volume's handle.
async fn create_volume(
    driver: &mut ControllerClient<tonic::transport::Channel>,
    name: &str,
    bytes: u64,
    access: AccessType,
) -> String {
    let capability = VolumeCapability {
        access_type: Some(access),
        access_mode: Some(AccessMode { mode: Mode::SingleNodeWriter as i32 }),
    };
    let request = CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(CapacityRange { required_bytes: bytes as i64, limit_bytes: 0 }),
        volume_capabilities: vec![capability],
        ..CreateVolumeRequest::default()
    };
    driver.create_volume(request).await.unwrap().into_inner().volume.unwrap().volume_id
}

/// ControllerExpandVolume of `handle` to `bytes`, as the resizer asks it.
async fn expand_volume(
    driver: &mut ControllerClient<tonic::transport::Channel>,
    handle: &str,
    bytes: u64,
) -> Result<tonic::Response<kvol_csi::proto::csi::ControllerExpandVolumeResponse>, tonic::Status> {
    let request = ControllerExpandVolumeRequest {
        volume_id: handle.into(),
        capacity_range: Some(CapacityRange { required_bytes: bytes as i64, limit_bytes: 0 }),
        ..ControllerExpandVolumeRequest::default()
    };
    driver.controller_expand_volume(request).await
}

fn expansions_in(log: &str) -> usize {
    log.lines().filter(|l| l.contains("operation succeeded") && l.contains("volume_fs_resize")).count()
}

#[test]
fn a_grown_volume_is_expanded_on_the_node_while_it_stays_published() {
    enter_private_mount_namespace();
    let mut node = node_on_directories();
    node.start();
    let (runtime, mut driver) = controller_of(&node, DRIVER);
    let handle = runtime.block_on(create_volume(
        &mut driver,
        "grow",
        16 << 20,
        AccessType::Mount(MountVolume::default()),
    ));
    node.write("storage.yaml", &storage(&handle, "16Mi"));
    node.write("pod.yaml", POD);
    let published = |r: &kvol_node::report::status::StatusReport| {
        r.volumes.iter().any(|v| v.volume == "data" && v.phase == Phase::Published)
    };
    let report = node
        .wait(Duration::from_secs(30), published)
        .unwrap_or_else(|last| panic!("{last}\n{}", node.agent_log()));
    let target = report.volumes.iter().find(|v| v.volume == "data").unwrap().target.clone().unwrap();
    std::fs::write(target.join("mount/kept"), "written before the expansion").unwrap();
    assert_eq!(expansions_in(&node.agent_log()), 0, "nothing to expand yet");

    // The resizer's part: the driver grows the volume, then the PV says so.
    let expanded = runtime.block_on(expand_volume(&mut driver, &handle, 32 << 20)).unwrap().into_inner();
    assert!(expanded.node_expansion_required, "{expanded:?}");
    let changed = Instant::now();
    node.write("storage.yaml", &storage(&handle, "32Mi"));
    while expansions_in(&node.agent_log()) == 0 {
        assert!(changed.elapsed() < Duration::from_secs(30), "never expanded:\n{}", node.agent_log());
        std::thread::sleep(Duration::from_millis(10));
    }
    eprintln!("PV grown → NodeExpandVolume done in {:?}", changed.elapsed());
    let log = node.agent_log();
    assert!(!log.contains("volume_unmount"), "the volume was never unpublished:\n{log}");
    assert_eq!(std::fs::read_to_string(target.join("mount/kept")).unwrap(), "written before the expansion");
    let report = node.status().unwrap();
    assert!(published(&report), "{report:#?}");

    // Expanded once: the size the node made is journalled, a restart does not expand again.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(expansions_in(&node.agent_log()), 1, "{}", node.agent_log());
    node.kill_9();
    node.start();
    node.wait(Duration::from_secs(30), published).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(expansions_in(&node.agent_log()), 1, "not again after the restart:\n{}", node.agent_log());

    node.remove("pod.yaml");
    node.wait(Duration::from_secs(30), |r| r.volumes.is_empty()).unwrap();
}

#[test]
fn a_loop_backed_xfs_volume_grows_in_the_pods_filesystem_without_an_unpublish() {
    if !Path::new("/dev/loop-control").exists() {
        eprintln!("skipped: no /dev/loop-control on this machine");
        return;
    }
    let has_mkfs_xfs =
        std::process::Command::new("mkfs.xfs").arg("-V").output().is_ok_and(|o| o.status.success());
    if !has_mkfs_xfs {
        eprintln!("skipped: mkfs.xfs (xfsprogs) is not installed");
        return;
    }
    enter_private_mount_namespace();
    let (node, _driver) = loop_node(&[]);
    let (runtime, mut driver) = controller_of(&node, LOOP_DRIVER);
    let size = 300u64 << 20;
    let handle = runtime.block_on(create_volume(
        &mut driver,
        "grow-xfs",
        size,
        AccessType::Mount(MountVolume { fs_type: "xfs".into(), ..MountVolume::default() }),
    ));
    let pv = |bytes: u64| {
        storage(&handle, &bytes.to_string())
            .replace(&format!("driver: {DRIVER}"), &format!("driver: {LOOP_DRIVER}, fsType: xfs"))
    };
    node.write("storage.yaml", &pv(size));
    node.write("pod.yaml", POD);
    let published = |r: &kvol_node::report::status::StatusReport| {
        r.volumes.iter().any(|v| v.volume == "data" && v.phase == Phase::Published)
    };
    let report = node
        .wait(Duration::from_secs(60), published)
        .unwrap_or_else(|last| panic!("{last}\n{}", node.agent_log()));
    let mount =
        report.volumes.iter().find(|v| v.volume == "data").unwrap().target.clone().unwrap().join("mount");
    let before = fs_bytes(&mount);
    assert!(before <= size, "a {size}-byte volume shows {before} bytes");

    let grown = size + (64 << 20);
    runtime.block_on(expand_volume(&mut driver, &handle, grown)).unwrap();
    let changed = Instant::now();
    node.write("storage.yaml", &pv(grown));
    while fs_bytes(&mount) <= before {
        assert!(changed.elapsed() < Duration::from_secs(30), "never grew:\n{}", node.agent_log());
        std::thread::sleep(Duration::from_millis(5));
    }
    let after = fs_bytes(&mount);
    eprintln!(
        "PV grown → the pod's filesystem {} MiB → {} MiB in {:?} (loop device, xfs_growfs, no unpublish)",
        before >> 20,
        after >> 20,
        changed.elapsed()
    );
    assert!(after > before + (48 << 20), "{before} → {after}");
    assert!(!node.agent_log().contains("volume_unmount"), "{}", node.agent_log());
    node.remove("pod.yaml");
    node.wait(Duration::from_secs(60), |r| r.volumes.is_empty()).unwrap();
}

fn claims(data: &str, fixed: &str) -> String {
    format!(
        r#"apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {{name: grows}}
provisioner: {DRIVER}
allowVolumeExpansion: true
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {{name: fixed}}
provisioner: {DRIVER}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: data, namespace: default}}
spec: {{storageClassName: grows, accessModes: [ReadWriteOnce], resources: {{requests: {{storage: {data}}}}}}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: other, namespace: default}}
spec: {{storageClassName: fixed, accessModes: [ReadWriteOnce], resources: {{requests: {{storage: {fixed}}}}}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: app, namespace: default}}
spec:
  containers: [{{name: c, image: busybox, volumeMounts: [{{name: data, mountPath: /data}}, {{name: other, mountPath: /other}}]}}]
  volumes: [{{name: data, persistentVolumeClaim: {{claimName: data}}}}, {{name: other, persistentVolumeClaim: {{claimName: other}}}}]
"#
    )
}

#[test]
fn a_claim_edited_to_more_is_grown_by_its_driver_and_then_on_the_node_standalone() {
    enter_private_mount_namespace();
    let mut node = node_on_directories();
    node.write("claims.yaml", &claims("16Mi", "16Mi"));
    node.start();
    let both = |r: &kvol_node::report::status::StatusReport| {
        r.volumes.iter().filter(|v| v.phase == Phase::Published).count() == 2
    };
    node.wait(Duration::from_secs(30), both).unwrap_or_else(|last| panic!("{last}\n{}", node.agent_log()));

    // Grown, in a class that allows it: ControllerExpandVolume, then NodeExpandVolume.
    let edited = Instant::now();
    node.write("claims.yaml", &claims("32Mi", "16Mi"));
    while expansions_in(&node.agent_log()) == 0 {
        assert!(edited.elapsed() < Duration::from_secs(30), "never expanded:\n{}", node.agent_log());
        std::thread::sleep(Duration::from_millis(10));
    }
    eprintln!("claim edited → grown by the driver and on the node in {:?}", edited.elapsed());
    let log = node.agent_log();
    assert!(log.contains("volume expanded by its driver"), "{log}");
    assert!(!log.contains("volume_unmount"), "{log}");

    // A shrink, and a growth its class does not allow: refused, each with a status line.
    node.write("claims.yaml", &claims("8Mi", "32Mi"));
    let report = node
        .wait(Duration::from_secs(30), |r| {
            let said = |s: &str| r.problems.iter().any(|p| p.contains(s));
            said("persistentvolumeclaim default/data asks for 8388608 bytes, less than")
                && said("persistentvolumeclaim default/other asks for 33554432 bytes")
                && said("does not allow volume expansion")
        })
        .unwrap_or_else(|last| panic!("no refusal in status: {last}"));
    assert!(both(&report), "the volumes stay published: {report:#?}");
    assert_eq!(expansions_in(&node.agent_log()), 1, "nothing more was expanded");
    node.remove("claims.yaml");
    node.wait(Duration::from_secs(30), |r| r.volumes.is_empty()).unwrap();
}

/// A claim of a loop-backed `fs` volume, written near full, edited to twice its size while its
/// pod keeps it published: the pod's filesystem shows the new size (statvfs) without an
/// unpublish, the claim's status says so, and the data is intact.
fn a_claim_edited_to_twice_its_size_grows_the_pods_filesystem(fs: &str) {
    if let Some(why) = loop_backing_missing(fs) {
        eprintln!("skipped: {why}");
        return;
    }
    if fs == "ext4" && !may_grow_mounted_ext4() {
        eprintln!("skipped: growing a mounted ext4 needs CAP_SYS_RESOURCE, which this process lacks");
        return;
    }
    enter_private_mount_namespace();
    let (node, _driver) = loop_node(&[]);
    node.write("claims.yaml", &loop_claim(fs, "300Mi", true));
    let report = node
        .wait(Duration::from_secs(60), |r| data_mount(r).is_some())
        .unwrap_or_else(|last| panic!("{last}\n{}", node.agent_log()));
    let mount = data_mount(&report).unwrap();
    let before = fs_bytes(&mount);
    assert!(before <= 300 << 20, "a 300Mi {fs} volume shows {before} bytes");
    let filled = fill_near_full(&mount);
    let overflow = std::fs::write(mount.join("more"), vec![0u8; 8 << 20]);
    assert!(overflow.is_err(), "a full {fs} volume took 8 MiB more: it does not hold its size");
    let _ = std::fs::remove_file(mount.join("more"));

    let edited = Instant::now();
    node.write("claims.yaml", &loop_claim(fs, "600Mi", true));
    while fs_bytes(&mount) <= before {
        assert!(edited.elapsed() < Duration::from_secs(60), "never grew:\n{}", node.agent_log());
        std::thread::sleep(Duration::from_millis(5));
    }
    let after = fs_bytes(&mount);
    eprintln!(
        "{fs}: claim edited 300Mi → 600Mi with {} MiB written: the pod's filesystem {} → {} MiB in {:?}",
        filled >> 20,
        before >> 20,
        after >> 20,
        edited.elapsed()
    );
    assert!(after > 500 << 20, "{fs}: {before} → {after}");
    std::fs::write(mount.join("more"), vec![0u8; 64 << 20]).expect("the grown volume takes more");
    assert_eq!(
        std::fs::metadata(mount.join("fill")).unwrap().len(),
        filled,
        "the data written before is kept"
    );
    let log = node.agent_log();
    assert!(!log.contains("volume_unmount"), "the volume was never unpublished:\n{log}");
    assert!(!log.contains(" WARN "), "nothing went wrong on the way:\n{log}");
    let report = node
        .wait(Duration::from_secs(30), |r| {
            r.claims.iter().any(|c| c.name == "default/data" && c.capacity_bytes == Some(600 << 20))
        })
        .unwrap_or_else(|last| panic!("the claim's status never said 600Mi: {last}"));
    let claim = report.claims.iter().find(|c| c.name == "default/data").unwrap();
    assert!(claim.conditions.is_empty(), "{claim:?}");
    node.remove("claims.yaml");
    node.wait(Duration::from_secs(60), |r| r.volumes.is_empty()).unwrap();
}

#[test]
fn a_claim_of_a_loop_backed_xfs_volume_edited_to_twice_its_size_grows_online() {
    a_claim_edited_to_twice_its_size_grows_the_pods_filesystem("xfs");
}

#[test]
fn a_claim_of_a_loop_backed_ext4_volume_edited_to_twice_its_size_grows_online() {
    a_claim_edited_to_twice_its_size_grows_the_pods_filesystem("ext4");
}

/// A driver that grows volumes offline only: the claim's edit waits (with a status line)
/// while its pod uses the volume; once the pod is gone the driver grows it, the agent is
/// killed (-9) between that controller step and the node's, and when the pod comes back the
/// restarted agent grows the ext4 filesystem at its publish: statvfs shows the new size, the
/// data written near full is kept, the claim's status leaves `FileSystemResizePending`.
#[test]
fn an_offline_only_drivers_volume_grows_when_no_pod_uses_it_across_a_kill_9() {
    if let Some(why) = loop_backing_missing("ext4") {
        eprintln!("skipped: {why}");
        return;
    }
    enter_private_mount_namespace();
    let (mut node, _driver) = loop_node(&["--offline-expansion"]);
    node.write("claims.yaml", &loop_claim("ext4", "64Mi", true));
    let report = node
        .wait(Duration::from_secs(60), |r| data_mount(r).is_some())
        .unwrap_or_else(|last| panic!("{last}\n{}", node.agent_log()));
    let mount = data_mount(&report).unwrap();
    let before = fs_bytes(&mount);
    let filled = fill_near_full(&mount);

    // In use: the edit waits, and says why.
    node.write("claims.yaml", &loop_claim("ext4", "128Mi", true));
    let report = node
        .wait(Duration::from_secs(30), |r| {
            r.problems.iter().any(|p| p.contains("grows volumes offline only"))
        })
        .unwrap_or_else(|last| panic!("no waiting line: {last}"));
    let claim = report.claims.iter().find(|c| c.name == "default/data").unwrap();
    assert_eq!((claim.requested_bytes, claim.capacity_bytes), (Some(128 << 20), Some(64 << 20)), "{claim:?}");
    assert!(!node.agent_log().contains("volume expanded by its driver"), "{}", node.agent_log());

    // The pod goes: the driver grows the volume, the claim waits for the node.
    node.write("claims.yaml", &loop_claim("ext4", "128Mi", false));
    let report = node
        .wait(Duration::from_secs(60), |r| {
            r.volumes.is_empty()
                && r.claims.iter().any(|c| {
                    c.name == "default/data"
                        && c.volume_bytes == Some(128 << 20)
                        && c.conditions.iter().any(|t| t == "FileSystemResizePending")
                })
        })
        .unwrap_or_else(|last| panic!("never grown by the driver: {last}\n{}", node.agent_log()));
    assert!(report.problems.iter().all(|p| !p.contains("offline only")), "{:?}", report.problems);

    // Killed between the controller's step and the node's; the pod comes back after.
    node.kill_9();
    node.start();
    let back = Instant::now();
    node.write("claims.yaml", &loop_claim("ext4", "128Mi", true));
    let report = node
        .wait(Duration::from_secs(60), |r| {
            data_mount(r).is_some_and(|m| fs_bytes(&m) > before)
                && r.claims.iter().any(|c| {
                    c.name == "default/data" && c.capacity_bytes == Some(128 << 20) && c.conditions.is_empty()
                })
        })
        .unwrap_or_else(|last| panic!("never grown on the node: {last}\n{}", node.agent_log()));
    let mount = data_mount(&report).unwrap();
    let after = fs_bytes(&mount);
    eprintln!(
        "offline ext4: pod back → published and grown {} → {} MiB, claim status 128Mi, in {:?}",
        before >> 20,
        after >> 20,
        back.elapsed()
    );
    assert!(after > 100 << 20, "{before} → {after}");
    assert_eq!(
        std::fs::metadata(mount.join("fill")).unwrap().len(),
        filled,
        "the data written before is kept"
    );
    std::fs::write(mount.join("more"), vec![0u8; 32 << 20]).expect("the grown volume takes more");
    node.remove("claims.yaml");
    node.wait(Duration::from_secs(60), |r| r.volumes.is_empty()).unwrap();
}

/// The upstream hostpath driver (`KVOL_UPSTREAM_HOSTPATH`, registered by the upstream
/// `node-driver-registrar`): a claim it provisioned for the standalone control plane, edited to
/// twice its size while its pod keeps it published, is grown by its ControllerExpandVolume
/// and NodeExpandVolume, and the claim's status says the new size.
#[test]
fn the_upstream_hostpath_driver_grows_a_claim_through_the_agent() {
    const UPSTREAM: &str = "hostpath.csi.k8s.io";
    let Some((driver, registrar)) = support::upstream_hostpath_and_registrar() else { return };
    enter_private_mount_namespace();
    let node = node_for(UPSTREAM);
    let socket = node.root.join("kubelet/plugins").join(UPSTREAM).join("csi.sock");
    std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
    let mut command = std::process::Command::new(driver);
    command
        .arg(format!("--endpoint=unix://{}", socket.display()))
        .args(["--nodeid=node-a", &format!("--drivername={UPSTREAM}")])
        .arg(format!("--statedir={}", node.root.join("upstream-state").display()));
    let _driver = support::Daemon::spawn("hostpathplugin", command, &node.root.join("hostpathplugin.log"));
    support::wait_for_path(&socket, "hostpathplugin", Duration::from_secs(30));
    let mut command = std::process::Command::new(registrar);
    command
        .arg(format!("--csi-address={}", socket.display()))
        .arg(format!("--kubelet-registration-path={}", socket.display()))
        .arg(format!("--plugin-registration-path={}", node.registration_dir().display()));
    let _registrar =
        support::Daemon::spawn("node-driver-registrar", command, &node.root.join("registrar.log"));
    let claim = |size: &str| claim_of(UPSTREAM, "ext4", size, true);
    node.write("claims.yaml", &claim("16Mi"));
    node.wait(Duration::from_secs(60), |r| data_mount(r).is_some()).unwrap_or_else(|last| {
        panic!("never published through the upstream driver: {last}\n{}", node.agent_log())
    });

    let edited = Instant::now();
    node.write("claims.yaml", &claim("32Mi"));
    let report = node
        .wait(Duration::from_secs(60), |r| {
            r.claims.iter().any(|c| {
                c.name == "default/data"
                    && c.volume_bytes == Some(32 << 20)
                    && c.capacity_bytes == Some(32 << 20)
                    && c.conditions.is_empty()
            })
        })
        .unwrap_or_else(|last| panic!("never grown: {last}\n{}", node.agent_log()));
    eprintln!(
        "upstream hostpath: claim edited 16Mi → 32Mi, grown by the driver and on the node in {:?}",
        edited.elapsed()
    );
    let log = node.agent_log();
    assert_eq!(expansions_in(&log), 1, "one NodeExpandVolume:\n{log}");
    assert!(log.contains("volume expanded by its driver"), "{log}");
    assert!(!log.contains("volume_unmount"), "never unpublished:\n{log}");
    assert!(data_mount(&report).is_some());
    node.remove("claims.yaml");
    node.wait(Duration::from_secs(60), |r| r.volumes.is_empty() && r.node_volumes.is_empty())
        .unwrap_or_else(|last| panic!("{last}\n{}", node.agent_log()));
}

/// A raw block volume whose PersistentVolume grew: the node tells the driver
/// (`NodeExpandVolume` on the block publish file, no filesystem to grow) without unmapping it,
/// as kubelet does, and once; the bundled driver's loop device rereads its grown image, so the
/// pod's device is the new size.
#[test]
fn a_grown_block_volume_grows_in_the_pod_while_it_stays_mapped() {
    if !Path::new("/dev/loop-control").exists() {
        eprintln!("skipped: the bundled driver's block volumes are loop devices; no /dev/loop-control here");
        return;
    }
    enter_private_mount_namespace();
    let mut node = Node::new();
    node.start();
    let (runtime, mut driver) = controller_of(&node, DRIVER);
    use kvol_csi::proto::csi::volume_capability::BlockVolume;
    let handle = runtime.block_on(create_volume(
        &mut driver,
        "grow-block",
        16 << 20,
        AccessType::Block(BlockVolume::default()),
    ));
    let block = |size: &str| {
        storage(&handle, size)
            .replace(
                "accessModes: [ReadWriteOnce]\n  csi:",
                "accessModes: [ReadWriteOnce]\n  volumeMode: Block\n  csi:",
            )
            .replace("spec: {volumeName: pv-grow,", "spec: {volumeName: pv-grow, volumeMode: Block,")
    };
    node.write("storage.yaml", &block("16Mi"));
    node.write(
        "pod.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: db, namespace: default}\n\
         spec: {containers: [{name: c, image: busybox, volumeDevices: [{name: data, devicePath: /dev/xvda}]}], \
         volumes: [{name: data, persistentVolumeClaim: {claimName: grow}}]}\n",
    );
    let published = |r: &kvol_node::report::status::StatusReport| {
        r.volumes.iter().any(|v| v.volume == "data" && v.phase == Phase::Published)
    };
    let report = node
        .wait(Duration::from_secs(30), published)
        .unwrap_or_else(|last| panic!("{last}\n{}", node.agent_log()));
    let device = report.volumes.iter().find(|v| v.volume == "data").unwrap().target.clone().unwrap();
    let device_bytes = |path: &Path| {
        use std::io::Seek;
        std::fs::File::open(path).unwrap().seek(std::io::SeekFrom::End(0)).unwrap()
    };
    assert_eq!(device_bytes(&device), 16 << 20, "the pod's device at {}", device.display());
    runtime.block_on(expand_volume(&mut driver, &handle, 32 << 20)).unwrap();
    let changed = Instant::now();
    node.write("storage.yaml", &block("32Mi"));
    while expansions_in(&node.agent_log()) == 0 {
        assert!(changed.elapsed() < Duration::from_secs(30), "never told:\n{}", node.agent_log());
        std::thread::sleep(Duration::from_millis(10));
    }
    eprintln!("block PV grown → NodeExpandVolume on the publish file in {:?}", changed.elapsed());
    assert_eq!(device_bytes(&device), 32 << 20, "the pod's device grew");
    std::thread::sleep(Duration::from_millis(1500));
    let log = node.agent_log();
    assert_eq!(expansions_in(&log), 1, "once:\n{log}");
    assert!(!log.contains("volume_unmount") && !log.contains("unmap"), "never unmapped:\n{log}");
    node.remove("pod.yaml");
    node.wait(Duration::from_secs(30), |r| r.volumes.is_empty()).unwrap();
}

/// Where a mounted ext4 cannot grow (no `CAP_SYS_RESOURCE`, as in these sandboxes), the
/// bundled driver says so (FailedPrecondition) and the agent does not ask again while the pod
/// uses the volume — a status line says it grows when published again, as kubelet waits for
/// the next mount; when the pod comes back the volume is staged again, grown, and the claim's
/// status says the new size.
#[test]
fn a_mounted_ext4_that_cannot_grow_here_grows_when_published_again() {
    if let Some(why) = loop_backing_missing("ext4") {
        eprintln!("skipped: {why}");
        return;
    }
    if may_grow_mounted_ext4() {
        eprintln!("skipped: this process may grow a mounted ext4, so the driver never defers");
        return;
    }
    enter_private_mount_namespace();
    let (node, _driver) = loop_node(&[]);
    node.write("claims.yaml", &loop_claim("ext4", "64Mi", true));
    let report = node
        .wait(Duration::from_secs(60), |r| data_mount(r).is_some())
        .unwrap_or_else(|last| panic!("{last}\n{}", node.agent_log()));
    let before = fs_bytes(&data_mount(&report).unwrap());
    node.write("claims.yaml", &loop_claim("ext4", "128Mi", true));
    let said = "grows to 128Mi when it is published again";
    node.wait(Duration::from_secs(60), |r| r.problems.iter().any(|p| p.contains(said)))
        .unwrap_or_else(|last| panic!("no deferral line: {last}\n{}", node.agent_log()));
    std::thread::sleep(Duration::from_millis(1500));
    let asked = node.agent_log().matches("NodeExpandVolume driver=").count();
    assert_eq!(asked, 1, "not asked again while in use:\n{}", node.agent_log());

    let back = Instant::now();
    node.write("claims.yaml", &loop_claim("ext4", "128Mi", false));
    node.wait(Duration::from_secs(60), |r| r.volumes.is_empty()).unwrap();
    node.write("claims.yaml", &loop_claim("ext4", "128Mi", true));
    let report = node
        .wait(Duration::from_secs(60), |r| {
            data_mount(r).is_some_and(|m| fs_bytes(&m) > before)
                && r.claims.iter().any(|c| c.name == "default/data" && c.capacity_bytes == Some(128 << 20))
                && r.problems.iter().all(|p| !p.contains("when it is published again"))
        })
        .unwrap_or_else(|last| panic!("never grown when published again: {last}\n{}", node.agent_log()));
    let after = fs_bytes(&data_mount(&report).unwrap());
    eprintln!(
        "ext4 without CAP_SYS_RESOURCE: {} → {} MiB once published again ({:?})",
        before >> 20,
        after >> 20,
        back.elapsed()
    );
    node.remove("claims.yaml");
    node.wait(Duration::from_secs(60), |r| r.volumes.is_empty()).unwrap();
}
