//! A frozen agent (SIGSTOP, longer than every deadline it keeps) on the real binary with real mounts: on thaw no deadline that passed while it was frozen turns into a teardown of a wanted volume, and what changed meanwhile is applied.

#[allow(dead_code)]
mod support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use kvol_node::report::status::{Phase, StatusReport};
use nix::sys::signal::Signal;
use support::Node;

const LIMIT: Duration = Duration::from_secs(60);

const STORAGE: &str = "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata: {name: kvol-hostpath}\nprovisioner: hostpath.csi.kvol.io\n---\napiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata: {name: hostpath.csi.kvol.io}\nspec: {attachRequired: false, podInfoOnMount: true, volumeLifecycleModes: [Persistent, Ephemeral]}\n";

/// Pod `name` with a claim of its own (in the same file), a CSI ephemeral volume and an emptyDir.
fn pod(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{name: {name}, namespace: default}}\nspec: {{storageClassName: kvol-hostpath, accessModes: [ReadWriteOnce], resources: {{requests: {{storage: 8Mi}}}}}}\n---\napiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  containers: [{{name: c, image: busybox, volumeMounts: [{{name: data, mountPath: /d}}, {{name: scratch, mountPath: /s}}, {{name: cache, mountPath: /c}}]}}]\n  volumes:\n  - {{name: data, persistentVolumeClaim: {{claimName: {name}}}}}\n  - {{name: scratch, csi: {{driver: hostpath.csi.kvol.io}}}}\n  - {{name: cache, emptyDir: {{}}}}\n"
    )
}

fn published(report: &StatusReport, pod: &str) -> bool {
    let of_pod: Vec<_> = report.volumes.iter().filter(|v| v.pod == format!("default/{pod}")).collect();
    of_pod.len() == 3 && of_pod.iter().all(|v| v.phase == Phase::Published)
}

fn gone(report: &StatusReport, pod: &str) -> bool {
    !report.volumes.iter().any(|v| v.pod == format!("default/{pod}"))
}

/// The pod's published targets, each with its inode and the ids of the mounts at or below it
/// (from this thread's mount table): a volume torn down and set up again has other ones.
fn identities(report: &StatusReport, pod: &str) -> Vec<(PathBuf, u64, Vec<u64>)> {
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

#[test]
fn a_frozen_agent_applies_what_changed_on_thaw_and_tears_down_nothing_wanted() {
    support::enter_private_mount_namespace();
    let mut node = Node::new();
    // Short deadlines, so freezing outlasts each: driver calls, resync, republish.
    node.agent_args =
        ["--csi-call-timeout-seconds", "2", "--republish-seconds", "1"].map(String::from).to_vec();
    node.write("storage.yaml", STORAGE);
    node.write("kept.yaml", &pod("kept"));
    node.write("leaving.yaml", &pod("leaving"));
    node.start();
    let report = node
        .wait(LIMIT, |r| published(r, "kept") && published(r, "leaving"))
        .unwrap_or_else(|e| panic!("{e}\n{}", node.agent_log()));
    let kept_before = identities(&report, "kept");
    let mounts: usize = kept_before.iter().map(|(_, _, ids)| ids.len()).sum();
    assert!(mounts >= 2, "the claim and the ephemeral volume are mounts: {kept_before:?}");
    let data = report.volumes.iter().find(|v| v.pod == "default/kept" && v.volume == "data").unwrap();
    let file = data.target.clone().unwrap().join("written-before");
    std::fs::write(&file, "kept through the freeze").unwrap();

    node.signal(Signal::SIGSTOP);
    let frozen = Instant::now();
    node.remove("leaving.yaml");
    node.write("arriving.yaml", &pod("arriving"));
    std::thread::sleep(Duration::from_secs(8));
    node.signal(Signal::SIGCONT);

    let report = node
        .wait(LIMIT, |r| published(r, "arriving") && gone(r, "leaving") && published(r, "kept"))
        .unwrap_or_else(|e| panic!("{e}\n{}", node.agent_log()));
    eprintln!("frozen for 8 s; settled {:?} after the freeze began", frozen.elapsed());
    assert_eq!(identities(&report, "kept"), kept_before, "the kept pod's volumes are the same mounts");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "kept through the freeze");
    let log = node.agent_log();
    let kept_uid = &report.volumes.iter().find(|v| v.pod == "default/kept").unwrap().pod_uid;
    let torn: Vec<&str> =
        log.lines().filter(|l| l.contains("volume_unmount") && l.contains(kept_uid.as_str())).collect();
    assert!(torn.is_empty(), "nothing of the kept pod was unpublished: {torn:?}");
    assert!(report.volumes.iter().all(|v| v.last_error.is_none()), "{:#?}", report.volumes);
    node.remove("kept.yaml");
    node.remove("arriving.yaml");
    node.wait(LIMIT, |r| r.volumes.is_empty()).unwrap_or_else(|e| panic!("{e}\n{}", node.agent_log()));
}
