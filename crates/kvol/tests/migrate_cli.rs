//! `kvol migrate check` as a user runs it: the example in-tree objects, what blocks their migration, and the exit code once nothing does.

use std::path::PathBuf;
use std::process::{Command, Output};

fn kvol(args: &[&str]) -> Output {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    Command::new(env!("CARGO_BIN_EXE_kvol"))
        .args(args)
        .current_dir(root)
        .env_remove("KVOL_CONFIG")
        .env_remove("KVOL_FEATURE_GATES")
        .output()
        .expect("the kvol binary runs")
}

/// What the example objects lack: the Secrets their translated volumes reference, and nodes
/// that run the drivers with the same gates.
const MISSING: &str = r#"
apiVersion: v1
kind: Secret
metadata: {name: azure-storage-account-media-secret, namespace: shop}
---
apiVersion: v1
kind: Secret
metadata: {name: azure-storage-account-acct1-secret, namespace: web}
---
apiVersion: v1
kind: Secret
metadata: {name: px-user, namespace: portworx}
---
apiVersion: v1
kind: Secret
metadata: {name: ceph-secret, namespace: default}
"#;

fn csi_node(name: &str, migrated: &str) -> String {
    let drivers = [
        "ebs.csi.aws.com",
        "pd.csi.storage.gke.io",
        "disk.csi.azure.com",
        "file.csi.azure.com",
        "cinder.csi.openstack.org",
        "csi.vsphere.vmware.com",
        "pxd.portworx.com",
        "rbd.csi.ceph.com",
    ]
    .map(|d| format!("{{name: {d}, nodeID: {name}}}"))
    .join(", ");
    format!(
        "---\napiVersion: storage.k8s.io/v1\nkind: CSINode\nmetadata: {{name: {name}, annotations: {{storage.alpha.kubernetes.io/migrated-plugins: \"{migrated}\"}}}}\nspec: {{drivers: [{drivers}]}}\n"
    )
}

#[test]
fn migrate_check_lists_what_blocks_and_exits_zero_only_when_nothing_does() {
    // The examples alone: missing secrets block, named one per line.
    let out = kvol(&["migrate", "check", "examples/in-tree"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("kubernetes.io/azure-file") && stdout.contains("file.csi.azure.com"), "{stdout}");
    for secret in ["shop/azure-storage-account-media-secret", "portworx/px-user"] {
        assert!(
            stdout.lines().any(|l| l.starts_with("- secret") && l.contains(secret)),
            "{secret}: {stdout}"
        );
    }

    // With the secrets and two nodes that run every driver with the same gates: nothing blocks.
    let dir = tempfile::tempdir().unwrap();
    let same = "kubernetes.io/aws-ebs,kubernetes.io/gce-pd";
    std::fs::write(
        dir.path().join("extra.yaml"),
        format!("{MISSING}{}{}", csi_node("n1", same), csi_node("n2", same)),
    )
    .unwrap();
    let extra = dir.path().display().to_string();
    let out = kvol(&["migrate", "check", "examples/in-tree", &extra, "-o", "json"]);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(report["blockers"], serde_json::json!([]), "{report:#}");
    assert_eq!(report["migrationBlocked"], false);
    assert_eq!(out.status.code(), Some(0));
    let ebs =
        report["plugins"].as_array().unwrap().iter().find(|p| p["csiDriver"] == "ebs.csi.aws.com").unwrap();
    assert_eq!(ebs["registeredOn"], serde_json::json!(["n1", "n2"]));

    // A node whose gates differ: the skew blocks, naming both nodes.
    std::fs::write(dir.path().join("skew.yaml"), csi_node("n3", "kubernetes.io/aws-ebs")).unwrap();
    let out = kvol(&["migrate", "check", "examples/in-tree", &extra]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("nodes disagree about the migrated plugins") && stdout.contains("n3"),
        "{stdout}"
    );
}
