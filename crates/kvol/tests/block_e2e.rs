//! Raw block volumes through the real `kvol agent`: a claim of the bundled driver with `volumeMode: Block` on a real loop device, and a local block PV, in a private mount namespace; kill -9 and restart; every block path gone after the pod.

#[allow(dead_code)]
mod support;

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use kvol_node::report::status::{Phase, StatusReport};
use support::{Node, enter_private_mount_namespace};

const MIB: usize = 1 << 20;
const LIMIT: Duration = Duration::from_secs(30);

/// The loop devices holding `file` (`losetup -j`).
fn loop_devices_of(file: &Path) -> Vec<PathBuf> {
    let Ok(out) = Command::new("losetup").arg("-j").arg(file).output() else { return Vec::new() };
    kvol_hostpath::block::parse_associations(&String::from_utf8_lossy(&out.stdout))
}

/// Detaches, when dropped, every loop device holding a `block.img` below `dir` or one of
/// `files`: a failing test leaves no loop device behind.
struct LoopGuard {
    dir: PathBuf,
    files: Vec<PathBuf>,
}

impl LoopGuard {
    fn images(&self) -> Vec<PathBuf> {
        let volumes = fs::read_dir(&self.dir).into_iter().flatten().flatten();
        let mut out: Vec<PathBuf> =
            volumes.map(|e| e.path().join(kvol_hostpath::block::IMAGE_FILE)).filter(|p| p.exists()).collect();
        out.extend(self.files.iter().cloned());
        out
    }
}

impl Drop for LoopGuard {
    fn drop(&mut self) {
        for image in self.images() {
            for device in loop_devices_of(&image) {
                let _ = Command::new("losetup").arg("-d").arg(&device).status();
            }
        }
    }
}

fn loop_devices_usable() -> bool {
    let usable = Path::new("/dev/loop-control").exists()
        && Command::new("losetup").arg("--version").output().is_ok_and(|o| o.status.success());
    if !usable {
        eprintln!("skipped: no losetup or /dev/loop-control on this machine");
    }
    usable
}

fn pod(name: &str, claim: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  containers:\n  - name: db\n    image: busybox\n    volumeDevices: [{{name: data, devicePath: /dev/xvda}}]\n  volumes:\n  - {{name: data, persistentVolumeClaim: {{claimName: {claim}}}}}\n"
    )
}

const STORAGE: &str = r#"apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: kvol-hostpath}
provisioner: hostpath.csi.kvol.io
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: blk, namespace: default}
spec:
  storageClassName: kvol-hostpath
  volumeMode: Block
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 16Mi}}
"#;

/// The pod device link of the pod's `data` volume, once it is published.
fn published(node: &Node, pod: &str) -> PathBuf {
    let is_published = |r: &StatusReport| {
        r.volumes.iter().any(|v| v.pod == format!("default/{pod}") && v.phase == Phase::Published)
    };
    let report = node
        .wait(LIMIT, is_published)
        .unwrap_or_else(|last| panic!("{pod} never published: {last}\nlog:\n{}", node.agent_log()));
    let v = report.volumes.iter().find(|v| v.pod == format!("default/{pod}")).unwrap();
    v.target.clone().expect("a published volume has a target")
}

/// Writes 1 MiB at 1 MiB into the device at `path` and syncs it.
fn write_pattern(path: &Path, seed: u8) -> Vec<u8> {
    let data: Vec<u8> = (0..MIB).map(|i| (i % 251) as u8 ^ seed).collect();
    let mut dev = fs::OpenOptions::new().write(true).open(path).unwrap();
    dev.seek(SeekFrom::Start(MIB as u64)).unwrap();
    dev.write_all(&data).unwrap();
    dev.sync_all().unwrap();
    data
}

fn read_back(path: &Path, len: usize) -> Vec<u8> {
    let mut back = vec![0u8; len];
    let mut dev = fs::File::open(path).unwrap();
    dev.seek(SeekFrom::Start(MIB as u64)).unwrap();
    dev.read_exact(&mut back).unwrap();
    back
}

fn is_block_device(path: &Path) -> bool {
    fs::metadata(path).is_ok_and(|m| m.file_type().is_block_device())
}

/// Every path below `dir` (recursively), for a failure message and the "nothing left" check.
fn tree(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            out.extend(tree(&path));
        }
        out.push(path);
    }
    out
}

#[test]
fn a_block_claim_of_the_bundled_driver_is_a_loop_device_in_the_pod_across_kill_9() {
    if !loop_devices_usable() {
        return;
    }
    enter_private_mount_namespace();
    let mut node = Node::new();
    let _guard = LoopGuard { dir: node.root.join("csi-hostpath/volumes"), files: Vec::new() };
    node.write("00-storage.yaml", STORAGE);
    node.write("db.yaml", &pod("db", "blk"));
    node.start();
    let link = published(&node, "db");
    let kubelet = node.root.join("kubelet");
    assert!(link.starts_with(kubelet.join("pods")), "{}", link.display());
    assert!(link.parent().unwrap().ends_with("volumeDevices/kubernetes.io~csi"), "{}", link.display());
    assert!(
        fs::symlink_metadata(&link).unwrap().file_type().is_symlink(),
        "the pod device link is a symlink"
    );
    assert!(is_block_device(&link), "the pod's device is a block device");
    let spec_name = link.file_name().unwrap().to_str().unwrap().to_string();
    let csi_block = kubelet.join("plugins/kubernetes.io/csi/volumeDevices");
    assert!(csi_block.join("staging").join(&spec_name).is_dir(), "{:#?}", tree(&csi_block));
    assert!(csi_block.join(&spec_name).join("data/vol_data.json").is_file(), "{:#?}", tree(&csi_block));

    let images = _guard.images();
    assert_eq!(images.len(), 1, "one block volume: {images:?}");
    let devices = loop_devices_of(&images[0]);
    assert_eq!(devices.len(), 1, "one loop device: {devices:?}");
    let data = write_pattern(&link, 0);
    assert!(read_back(&devices[0], data.len()) == data, "what the pod wrote is on the loop device");

    node.kill_9();
    node.start();
    let after = published(&node, "db");
    assert_eq!(after, link, "the same device path after a restart");
    assert!(is_block_device(&after));
    assert!(read_back(&after, data.len()) == data, "the data is still there after kill -9");
    assert_eq!(loop_devices_of(&images[0]), devices, "no second loop device after a restart");
    let log = node.agent_log();
    assert_eq!(
        log.matches("NodePublishVolume (block)").count(),
        1,
        "published once, not again after the restart:\n{log}"
    );

    node.remove("db.yaml");
    node.wait(LIMIT, |r| r.volumes.is_empty() && r.node_volumes.is_empty())
        .unwrap_or_else(|last| panic!("never torn down: {last}\nlog:\n{}", node.agent_log()));
    assert!(fs::symlink_metadata(&link).is_err(), "the pod device link is gone");
    assert!(!link.parent().unwrap().parent().unwrap().exists(), "pods/<uid>/volumeDevices is gone");
    let left: Vec<PathBuf> =
        tree(&csi_block).into_iter().filter(|p| p.to_string_lossy().contains(&spec_name)).collect();
    assert!(left.is_empty(), "block paths left: {left:#?}");
    assert!(loop_devices_of(&images[0]).is_empty(), "the loop device is detached");
    assert!(node.mounts().iter().all(|m| !m.target.starts_with(&kubelet)), "{:#?}", node.mounts());
}

#[test]
fn a_local_block_pv_is_its_device_in_the_pod() {
    if !loop_devices_usable() {
        return;
    }
    enter_private_mount_namespace();
    let mut node = Node::new();
    let image = node.root.join("disk.img");
    fs::File::create(&image).unwrap().set_len(8 * MIB as u64).unwrap();
    let _guard = LoopGuard { dir: node.root.join("none"), files: vec![image.clone()] };
    let out = Command::new("losetup").args(["-f", "--show"]).arg(&image).output().unwrap();
    assert!(out.status.success(), "losetup: {}", String::from_utf8_lossy(&out.stderr));
    let device = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    node.write(
        "00-local.yaml",
        &format!(
            r#"apiVersion: v1
kind: PersistentVolume
metadata: {{name: local-blk}}
spec:
  volumeMode: Block
  capacity: {{storage: 8Mi}}
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
spec: {{volumeName: local-blk, volumeMode: Block, accessModes: [ReadWriteOnce]}}
"#,
            device.display()
        ),
    );
    node.write("db.yaml", &pod("db", "local"));
    node.start();
    let link = published(&node, "db");
    assert!(link.ends_with("volumeDevices/kubernetes.io~local-volume/local-blk"), "{}", link.display());
    assert_eq!(fs::read_link(&link).unwrap(), device);
    let data = write_pattern(&link, 7);
    assert!(read_back(&image, data.len()) == data, "what the pod wrote is in the device's backing file");
    let global = node.root.join("kubelet/plugins/kubernetes.io/local-volume/volumeDevices/local-blk/dev");
    assert_eq!(tree(&global).len(), 1, "one global map file: {:#?}", tree(&global));

    node.remove("db.yaml");
    node.wait(LIMIT, |r| r.volumes.is_empty() && r.node_volumes.is_empty())
        .unwrap_or_else(|last| panic!("never torn down: {last}\nlog:\n{}", node.agent_log()));
    assert!(fs::symlink_metadata(&link).is_err(), "the pod device link is gone");
    assert!(!global.parent().unwrap().exists(), "the global map path is gone");
    assert!(is_block_device(&device), "the device itself stays");
}
