//! Growing loop-backed volumes through the real agent, shared by the expansion tests and the expansion benchmark: the bundled driver on loop devices beside an agent, its claims, a filesystem's size.
// Only the expansion tests and benchmark use these; the other users of `support` do not.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use kvol_node::report::status::{Phase, StatusReport};

use super::{Daemon, Node};

/// The filesystem size at `path` (statvfs).
pub fn fs_bytes(path: &Path) -> u64 {
    let fs = nix::sys::statvfs::statvfs(path).unwrap();
    fs.blocks() as u64 * fs.fragment_size() as u64
}

/// Whether this process may grow a mounted ext4 (`EXT4_IOC_RESIZE_FS` needs
/// `CAP_SYS_RESOURCE`), from the effective capability set in `/proc/self/status`.
pub fn may_grow_mounted_ext4() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let effective = status.lines().find_map(|l| l.strip_prefix("CapEff:")).map(str::trim);
    effective.and_then(|hex| u64::from_str_radix(hex, 16).ok()).is_some_and(|caps| caps & (1 << 24) != 0)
}

/// Why the loop backing cannot be shown here, if it cannot: no loop devices, or no mkfs for `fs`.
pub fn loop_backing_missing(fs: &str) -> Option<String> {
    if !Path::new("/dev/loop-control").exists() {
        return Some("no /dev/loop-control on this machine".into());
    }
    let mkfs = format!("mkfs.{fs}");
    let present = std::process::Command::new(&mkfs).arg("-V").output().is_ok_and(|o| o.status.success());
    (!present).then(|| format!("{mkfs} is not installed"))
}

pub const LOOP_DRIVER: &str = "grow.csi.kvol.test";

/// A node whose agent runs without components, beside the bundled driver on loop-backed
/// volumes as `LOOP_DRIVER` (with `extra` arguments), the standalone control plane
/// provisioning and growing its claims.
pub fn loop_node(extra: &[&str]) -> (Node, Daemon) {
    let node = node_for(LOOP_DRIVER);
    let socket = node.root.join("kubelet/plugins").join(LOOP_DRIVER).join("csi.sock");
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_kvol"));
    command
        .args(["csi-driver", "--name", LOOP_DRIVER, "--node-name", "node-a", "--volume-backing", "loop"])
        .args(extra)
        .arg("--state-dir")
        .arg(node.root.join("loop-driver"))
        .arg("--csi-socket")
        .arg(&socket)
        .arg("--registration-dir")
        .arg(node.registration_dir());
    let driver = Daemon::spawn("the loop-backed driver", command, &node.root.join("loop-driver.log"));
    (node, driver)
}

/// A started agent without components whose manifests say CSI driver `driver` attaches
/// nothing; the driver itself is the caller's to start.
pub fn node_for(driver: &str) -> Node {
    let mut node = Node::new();
    node.agent_args = vec!["--no-components".into()];
    node.write(
        "driver.yaml",
        &format!("apiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata: {{name: {driver}}}\nspec: {{attachRequired: false}}\n"),
    );
    node.start();
    node
}

/// A class of `LOOP_DRIVER` that allows expansion, a claim of `size` formatted `fs`, and (with
/// `pod`) a pod using it.
pub fn loop_claim(fs: &str, size: &str, pod: bool) -> String {
    claim_of(LOOP_DRIVER, fs, size, pod)
}

/// As [`loop_claim`], for the class of CSI driver `driver`.
pub fn claim_of(driver: &str, fs: &str, size: &str, pod: bool) -> String {
    let mut text = format!(
        r#"apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {{name: grows}}
provisioner: {driver}
allowVolumeExpansion: true
parameters: {{csi.storage.k8s.io/fstype: {fs}}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: data, namespace: default}}
spec: {{storageClassName: grows, accessModes: [ReadWriteOnce], resources: {{requests: {{storage: {size}}}}}}}
"#
    );
    if pod {
        text.push_str(
            "---\napiVersion: v1\nkind: Pod\nmetadata: {name: app, namespace: default}\n\
             spec: {containers: [{name: c, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}], volumes: [{name: data, persistentVolumeClaim: {claimName: data}}]}\n",
        );
    }
    text
}

/// Fills the filesystem at `dir` to within 2 MiB of full with one file, `fill`; the bytes
/// written.
pub fn fill_near_full(dir: &Path) -> u64 {
    let fs = nix::sys::statvfs::statvfs(dir).unwrap();
    let free = fs.blocks_available() as u64 * fs.fragment_size() as u64;
    let bytes = free.saturating_sub(2 << 20);
    let file = std::fs::File::create(dir.join("fill")).unwrap();
    let chunk = vec![0x5a_u8; 1 << 20];
    let mut written = 0;
    let mut writer = std::io::BufWriter::new(file);
    while written < bytes {
        let n = chunk.len().min((bytes - written) as usize);
        std::io::Write::write_all(&mut writer, &chunk[..n]).unwrap();
        written += n as u64;
    }
    std::io::Write::flush(&mut writer).unwrap();
    writer.get_ref().sync_all().unwrap();
    written
}

/// The published `data` volume's `mount` directory in `report`, if published.
pub fn data_mount(report: &StatusReport) -> Option<PathBuf> {
    let v = report.volumes.iter().find(|v| v.volume == "data" && v.phase == Phase::Published)?;
    Some(v.target.clone()?.join("mount"))
}
