//! Pods of one CSI driver for the fault tests: each with a claim of its own, a CSI ephemeral volume and an emptyDir; whether they are published or gone, and the identity of their mounts (a volume torn down and set up again has other ones).

#![allow(dead_code)] // not every test that shares this module uses all of it

use std::path::PathBuf;

use kvol_node::report::status::{Phase, StatusReport};

/// The StorageClass (named as the driver) and the CSIDriver object of `driver`.
pub fn storage(driver: &str) -> String {
    format!(
        "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata: {{name: {driver}}}\nprovisioner: {driver}\n---\napiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata: {{name: {driver}}}\nspec: {{attachRequired: false, podInfoOnMount: true, volumeLifecycleModes: [Persistent, Ephemeral]}}\n"
    )
}

/// Pod `name` with a claim of its own of `driver`'s class (in the same file), an ephemeral
/// volume of `driver` and an emptyDir.
pub fn pod(name: &str, driver: &str) -> String {
    format!(
        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{name: {name}, namespace: default}}\nspec: {{storageClassName: {driver}, accessModes: [ReadWriteOnce], resources: {{requests: {{storage: 8Mi}}}}}}\n---\napiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  containers: [{{name: c, image: busybox, volumeMounts: [{{name: data, mountPath: /d}}, {{name: scratch, mountPath: /s}}, {{name: cache, mountPath: /c}}]}}]\n  volumes:\n  - {{name: data, persistentVolumeClaim: {{claimName: {name}}}}}\n  - {{name: scratch, csi: {{driver: {driver}}}}}\n  - {{name: cache, emptyDir: {{}}}}\n"
    )
}

/// Whether the three volumes of [`pod`] `pod` are published.
pub fn published(report: &StatusReport, pod: &str) -> bool {
    let of_pod: Vec<_> = report.volumes.iter().filter(|v| v.pod == format!("default/{pod}")).collect();
    of_pod.len() == 3 && of_pod.iter().all(|v| v.phase == Phase::Published)
}

/// Whether no volume of `pod` is left.
pub fn gone(report: &StatusReport, pod: &str) -> bool {
    !report.volumes.iter().any(|v| v.pod == format!("default/{pod}"))
}

/// The published targets of `pod`, each with its inode and the ids of the mounts at or below
/// it (from this thread's mount table).
pub fn identities(report: &StatusReport, pod: &str) -> Vec<(PathBuf, u64, Vec<u64>)> {
    use std::os::unix::fs::MetadataExt;
    let table = std::fs::read_to_string("/proc/thread-self/mountinfo").unwrap();
    let mut out: Vec<_> = report
        .volumes
        .iter()
        .filter(|v| v.pod == format!("default/{pod}"))
        .filter_map(|v| v.target.clone())
        .map(|target| {
            let ids = table
                .lines()
                .filter_map(|line| {
                    let fields: Vec<&str> = line.split(' ').collect();
                    PathBuf::from(fields[4]).starts_with(&target).then(|| fields[0].parse().unwrap())
                })
                .collect();
            let inode = std::fs::metadata(&target).unwrap().ino();
            (target, inode, ids)
        })
        .collect();
    out.sort();
    out
}
