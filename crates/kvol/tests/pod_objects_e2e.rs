//! The real `kvol agent` serving configMap, secret, downwardAPI and projected volumes from manifests: kubelet's tree (tmpfs or disk, modes, fsGroup, links), updates that land whole, a crash mid-write put right, and teardown.

// Only the node and namespace helpers are used here.
#[allow(dead_code)]
mod support;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use kvol_node::report::status::{Phase, StatusReport};
use support::{Node, enter_private_mount_namespace};

const UID: &str = "5e0a11e2-0000-4000-8000-000000000028";
const LIMIT: Duration = Duration::from_secs(30);

fn config_map(a: &str, b: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: app-config, namespace: default}}\n\
         data: {{a.txt: {a:?}, b.txt: {b:?}}}\nbinaryData: {{blob: AAEC}}\n"
    )
}

const SECRET: &str = "apiVersion: v1\nkind: Secret\nmetadata: {name: app-secret, namespace: default}\n\
                      data: {username: YWRtaW4=}\nstringData: {password: s3cr3t}\n";

/// The kubelet oracle's pod, with `labels` and a projected token when asked.
fn pod(tier: &str, token: bool) -> String {
    let token_mount = if token { ", {name: tok, mountPath: /tok}" } else { "" };
    let token = if token {
        "\n  - name: tok\n    projected: {sources: [{serviceAccountToken: {path: token}}]}"
    } else {
        ""
    };
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: app
  namespace: default
  uid: {UID}
  labels: {{app: oracle, tier: {tier}}}
  annotations: {{note: hello}}
spec:
  securityContext: {{fsGroup: 1234}}
  containers:
  - name: main
    image: busybox
    resources: {{limits: {{cpu: 100m, memory: 64Mi}}}}
    volumeMounts: [{{name: cm, mountPath: /cm}}, {{name: sec, mountPath: /sec}}, {{name: dapi, mountPath: /dapi}}, {{name: proj, mountPath: /proj}}{token_mount}]
  volumes:
  - name: cm
    configMap:
      name: app-config
      items: [{{key: a.txt, path: a.txt, mode: 0600}}, {{key: b.txt, path: sub/dir/b.txt}}]
  - name: sec
    secret: {{secretName: app-secret, defaultMode: 0400}}
  - name: dapi
    downwardAPI:
      items:
      - {{path: labels, fieldRef: {{fieldPath: metadata.labels}}}}
      - {{path: mem_limit, resourceFieldRef: {{containerName: main, resource: limits.memory, divisor: 1Mi}}}}
  - name: proj
    projected:
      sources:
      - configMap: {{name: app-config, items: [{{key: a.txt, path: cm/a.txt}}, {{key: b.txt, path: cm/b.txt}}]}}
      - secret: {{name: app-secret, items: [{{key: username, path: sec/username, mode: 0400}}]}}
      - downwardAPI: {{items: [{{path: dapi/annotations, fieldRef: {{fieldPath: metadata.annotations}}}}]}}{token}
"#
    )
}

fn volume_dir(node: &Node, plugin: &str, volume: &str) -> PathBuf {
    node.root.join("kubelet/pods").join(UID).join("volumes").join(plugin).join(volume)
}

fn published(report: &StatusReport, volumes: &[&str]) -> bool {
    volumes.iter().all(|v| report.volumes.iter().any(|s| s.volume == *v && s.phase == Phase::Published))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| format!("<{e}>"))
}

/// (mode, gid) of `path`, not following a final link.
fn mode_gid(path: &Path) -> (u32, u32) {
    let m = std::fs::symlink_metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (m.permissions().mode() & 0o7777, m.gid())
}

fn wait_for(what: &str, limit: Duration, ok: impl Fn() -> bool) -> Duration {
    let start = Instant::now();
    while !ok() {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
    start.elapsed()
}

#[test]
fn the_four_volumes_are_kubelets_follow_their_objects_and_go() {
    enter_private_mount_namespace();
    let mut node = Node::new();
    node.write("config.yaml", &config_map("alpha\n", "bravo\n"));
    node.write("secret.yaml", SECRET);
    node.write("pod.yaml", &pod("test", true));
    node.start();
    let report = node
        .wait(LIMIT, |r| published(r, &["cm", "sec", "dapi", "proj"]))
        .unwrap_or_else(|last| panic!("not published: {last}\n{}", node.agent_log()));

    // Standalone: the token has nobody to mint it, said in status; the other four go on.
    let tok = report.volumes.iter().find(|v| v.volume == "tok").expect("the token volume is listed");
    assert_eq!(tok.phase, Phase::Pending);
    assert!(tok.pending_reason.as_deref().unwrap_or_default().contains("serviceAccountToken"), "{tok:?}");
    for v in report.volumes.iter().filter(|v| v.volume != "tok") {
        let plugin = v.plugin.as_deref().unwrap_or_default();
        assert!(plugin.starts_with("kubernetes.io/"), "{v:?}");
    }

    // The tree, as the kubelet peer writes it (fsGroup 1234).
    let cm = volume_dir(&node, "kubernetes.io~configmap", "cm");
    let sec = volume_dir(&node, "kubernetes.io~secret", "sec");
    let dapi = volume_dir(&node, "kubernetes.io~downward-api", "dapi");
    let proj = volume_dir(&node, "kubernetes.io~projected", "proj");
    assert_eq!(mode_gid(&cm), (0o2777, 1234), "a configMap is on disk");
    for dir in [&sec, &dapi, &proj] {
        assert_eq!(mode_gid(dir), (0o3777, 1234), "{} is a tmpfs root", dir.display());
    }
    let mounts = node.mounts();
    let tmpfs: Vec<_> = mounts.iter().filter(|m| m.fstype == "tmpfs").map(|m| m.target.clone()).collect();
    assert!(!tmpfs.contains(&cm), "configMap on disk: {tmpfs:?}");
    for dir in [&sec, &dapi, &proj] {
        assert!(tmpfs.contains(dir), "{} on tmpfs: {tmpfs:?}", dir.display());
    }
    let sizes = std::fs::read_to_string("/proc/thread-self/mountinfo").unwrap();
    let sec_line = sizes.lines().find(|l| l.contains(sec.to_str().unwrap())).expect("the secret's tmpfs");
    assert!(sec_line.contains("size=65536k"), "sized by the pod's memory limit: {sec_line}");
    assert_eq!(read(&cm.join("a.txt")), "alpha\n");
    assert_eq!(read(&cm.join("sub/dir/b.txt")), "bravo\n");
    assert_eq!(mode_gid(&cm.join("..data/a.txt")), (0o640, 1234), "0600 gains g+r");
    assert_eq!(mode_gid(&cm.join("..data/sub/dir/b.txt")), (0o644, 1234));
    let data = std::fs::read_link(cm.join("..data")).unwrap();
    assert!(data.to_string_lossy().starts_with("..20"), "{data:?}");
    assert_eq!(mode_gid(&cm.join(&data)), (0o2755, 1234));
    assert_eq!(std::fs::read_link(cm.join("a.txt")).unwrap(), Path::new("..data/a.txt"));
    assert_eq!(std::fs::read_link(cm.join("sub")).unwrap(), Path::new("..data/sub"));
    assert_eq!(read(&sec.join("password")), "s3cr3t");
    assert_eq!(mode_gid(&sec.join("..data/username")), (0o440, 1234));
    assert_eq!(read(&dapi.join("labels")), "app=\"oracle\"\ntier=\"test\"");
    assert_eq!(read(&dapi.join("mem_limit")), "64");
    assert_eq!(read(&proj.join("cm/a.txt")), "alpha\n");
    assert_eq!(read(&proj.join("sec/username")), "admin");
    assert_eq!(read(&proj.join("dapi/annotations")), "note=\"hello\"");

    // A ConfigMap change reaches both volumes, whole: a reader that resolves `..data` once (as
    // a program reading its configuration does, by opening the directory) never sees a.txt
    // and b.txt of two versions, nor a version half-written.
    let stop = Arc::new(AtomicBool::new(false));
    let mixed = Arc::new(AtomicU64::new(0));
    let reads = Arc::new(AtomicU64::new(0));
    let gone = Arc::new(AtomicU64::new(0));
    let reader = {
        let (stop, mixed, reads, proj) = (stop.clone(), mixed.clone(), reads.clone(), proj.clone());
        let gone = gone.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let Ok(dir) = std::fs::File::open(proj.join("..data")) else { continue };
                let at =
                    PathBuf::from(format!("/proc/thread-self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&dir)));
                let (Ok(a), Ok(b)) = (
                    std::fs::read_to_string(at.join("cm/a.txt")),
                    std::fs::read_to_string(at.join("cm/b.txt")),
                ) else {
                    // The old payload, removed right after the swap while this reader held it
                    // (kubelet's layout does the same): read again through `..data`.
                    gone.fetch_add(1, Ordering::Relaxed);
                    continue;
                };
                if a.trim_start_matches("a-") != b.trim_start_matches("b-")
                    && !(a == "alpha\n" && b == "bravo\n")
                {
                    mixed.fetch_add(1, Ordering::Relaxed);
                    eprintln!("mixed read: {a:?} {b:?}");
                }
                reads.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let updates = 1000;
    let mut latencies = Vec::new();
    for n in 0..updates {
        let written = Instant::now();
        node.write("config.yaml", &config_map(&format!("a-{n}"), &format!("b-{n}")));
        // Every fiftieth update is waited for, to measure; the rest follow at once.
        if n % 50 == 49 || n == updates - 1 {
            let want = format!("a-{n}");
            wait_for("the update", Duration::from_secs(10), || read(&proj.join("cm/a.txt")) == want);
            latencies.push(written.elapsed());
        }
    }
    wait_for("the configMap volume", Duration::from_secs(10), || {
        read(&cm.join("a.txt")) == format!("a-{}", updates - 1)
    });
    stop.store(true, Ordering::Relaxed);
    reader.join().unwrap();
    latencies.sort();
    eprintln!(
        "{updates} configMap updates: file in place after median {:?}, max {:?}; {} concurrent reads, {} mixed, \
         {} of a payload removed under the reader",
        latencies[latencies.len() / 2],
        latencies.last().unwrap(),
        reads.load(Ordering::Relaxed),
        mixed.load(Ordering::Relaxed),
        gone.load(Ordering::Relaxed)
    );
    assert_eq!(mixed.load(Ordering::Relaxed), 0, "a reader saw two versions at once");
    let timestamped = |dir: &Path| {
        std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("..20"))
            .count()
    };
    assert_eq!(timestamped(&proj), 1, "old payloads are removed");

    // A label change reaches the downward API.
    node.write("pod.yaml", &pod("prod", true));
    wait_for("the labels", Duration::from_secs(10), || {
        read(&dapi.join("labels")) == "app=\"oracle\"\ntier=\"prod\""
    });

    // Nothing changed: nothing written (the payload's directory stays the same).
    let before = std::fs::read_link(sec.join("..data")).unwrap();
    node.write("secret.yaml", SECRET);
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(std::fs::read_link(sec.join("..data")).unwrap(), before);

    // The ConfigMap deleted: the last content stays (kubelet's behaviour), the volume published.
    node.remove("config.yaml");
    let report = node
        .wait(LIMIT, |r| {
            r.volumes.iter().any(|v| {
                v.volume == "cm"
                    && v.phase == Phase::Published
                    && v.pending_reason
                        .as_deref()
                        .is_some_and(|p| p.contains("configmap default/app-config does not exist"))
            })
        })
        .unwrap_or_else(|last| panic!("no status line for the deleted configmap: {last}"));
    assert!(report.volumes.iter().filter(|v| v.volume != "tok").all(|v| v.phase == Phase::Published));
    assert_eq!(read(&cm.join("a.txt")), format!("a-{}", updates - 1));

    // The pod goes: every volume torn down, no mount left, no directory left.
    node.remove("pod.yaml");
    node.wait(LIMIT, |r| r.volumes.is_empty()).unwrap_or_else(|last| panic!("{last}\n{}", node.agent_log()));
    let left: Vec<_> =
        node.mounts().into_iter().filter(|m| m.target.starts_with(node.root.join("kubelet/pods"))).collect();
    assert!(left.is_empty(), "{left:?}");
    let pod_dir = node.root.join("kubelet/pods").join(UID);
    let left = || {
        String::from_utf8_lossy(&std::process::Command::new("find").arg(&pod_dir).output().unwrap().stdout)
            .into_owned()
    };
    let start = Instant::now();
    while pod_dir.exists() {
        assert!(start.elapsed() < LIMIT, "the pod directory stays: {}\n{}", left(), node.agent_log());
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_write_cut_short_by_kill_9_is_put_right_at_the_next_start() {
    enter_private_mount_namespace();
    let mut node = Node::new();
    node.write("config.yaml", &config_map("one", "one"));
    node.write("secret.yaml", SECRET);
    node.write("pod.yaml", &pod("test", false));
    node.start();
    node.wait(LIMIT, |r| published(r, &["cm", "sec", "dapi", "proj"]))
        .unwrap_or_else(|last| panic!("{last}\n{}", node.agent_log()));
    node.kill_9();
    // What a write cut short leaves: a half-written timestamped directory, a `..data_tmp`, and
    // a user-visible link gone.
    let cm = volume_dir(&node, "kubernetes.io~configmap", "cm");
    std::fs::create_dir(cm.join("..2030_01_01_00_00_00.123")).unwrap();
    std::fs::write(cm.join("..2030_01_01_00_00_00.123/a.txt"), "half").unwrap();
    std::os::unix::fs::symlink("..2030_01_01_00_00_00.123", cm.join("..data_tmp")).unwrap();
    std::fs::remove_file(cm.join("sub")).unwrap();
    node.write("config.yaml", &config_map("two", "two"));
    node.start();
    wait_for("the new content", LIMIT, || read(&cm.join("a.txt")) == "two");
    let names: Vec<String> = std::fs::read_dir(&cm)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!names.iter().any(|n| n == "..data_tmp" || n == "..2030_01_01_00_00_00.123"), "{names:?}");
    assert_eq!(read(&cm.join("sub/dir/b.txt")), "two", "the missing link is made again");
    assert!(node.agent_log().contains("put right what an interrupted write left"), "{}", node.agent_log());
}
