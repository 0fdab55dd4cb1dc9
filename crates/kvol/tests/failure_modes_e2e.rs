//! What kubelet's users run into, tried on the real agent with real mounts: a mount whose outcome is unknown is never shown as published, and an emptyDir takes the pod's fsGroup.

#[allow(dead_code)]
mod support;

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kvol_node::report::status::{Phase, StatusReport};
use support::Node;
use support::faults::{JOURNAL_DAMAGES, KeptAside, fill, small_state_filesystem};

const LIMIT: Duration = Duration::from_secs(60);

fn volume<'a>(
    report: &'a StatusReport,
    pod: &str,
    volume: &str,
) -> Option<&'a kvol_node::report::status::VolumeStatus> {
    report.volumes.iter().find(|v| v.pod == pod && v.volume == volume)
}

/// A Flexvolume driver (`kvol/garbage`) whose `mount` answers something that is not a status:
/// the call's outcome is unknown.
const GARBAGE_DRIVER: &str = "#!/bin/sh\ncase \"$1\" in\n  init) echo '{\"status\": \"Success\", \"capabilities\": {\"attach\": false}}' ;;\n  mount) mkdir -p \"$2\"; echo 'this is not json' ;;\n  unmount) echo '{\"status\": \"Success\"}' ;;\n  *) echo '{\"status\": \"Not supported\"}' ;;\nesac\n";

#[test]
fn a_mount_that_answered_garbage_is_uncertain_never_published() {
    support::enter_private_mount_namespace();
    let mut node = Node::new();
    let driver_dir = node.root.join("flexvolume/kvol~garbage");
    std::fs::create_dir_all(&driver_dir).unwrap();
    let script = driver_dir.join("garbage");
    std::fs::write(&script, GARBAGE_DRIVER).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    node.write(
        "pod.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: app, namespace: default}\nspec:\n  containers: [{name: c, image: busybox, volumeMounts: [{name: vol, mountPath: /v}]}]\n  volumes: [{name: vol, flexVolume: {driver: kvol/garbage}}]\n",
    );
    node.start();
    // Failed at least twice: the record is kept (uncertain, for teardown) and retried.
    let report = node
        .wait(LIMIT, |r| {
            volume(r, "default/app", "vol")
                .and_then(|v| v.last_error.as_deref())
                .is_some_and(|e| e.contains("failed 2 time"))
        })
        .unwrap();
    let v = volume(&report, "default/app", "vol").unwrap();
    assert_eq!(v.phase, Phase::Uncertain, "{v:#?}");
    // Watched for a while: never published, whatever pass the status comes from.
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(3) {
        if let Some(report) = node.status() {
            let v = volume(&report, "default/app", "vol").unwrap();
            assert_ne!(v.phase, Phase::Published, "a mount of unknown outcome shown as published: {v:#?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // The pod goes: the uncertain volume is torn down through its driver.
    node.remove("pod.yaml");
    node.wait(LIMIT, |r| r.volumes.is_empty()).unwrap();
}

#[test]
fn an_empty_dir_takes_the_pods_fs_group_on_disk_and_in_memory() {
    support::enter_private_mount_namespace();
    let mut node = Node::new();
    node.write(
        "pod.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: app, namespace: default}\nspec:\n  securityContext: {fsGroup: 4321}\n  containers: [{name: c, image: busybox, volumeMounts: [{name: disk, mountPath: /d}, {name: memory, mountPath: /m}]}]\n  volumes:\n  - {name: disk, emptyDir: {}}\n  - {name: memory, emptyDir: {medium: Memory}}\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: plain, namespace: default}\nspec:\n  containers: [{name: c, image: busybox, volumeMounts: [{name: disk, mountPath: /d}]}]\n  volumes: [{name: disk, emptyDir: {}}]\n",
    );
    node.start();
    let report = node
        .wait(LIMIT, |r| r.volumes.len() == 3 && r.volumes.iter().all(|v| v.phase == Phase::Published))
        .unwrap();
    // As kubelet's emptyDir: rwx for everyone and the setgid bit, over the directory's 0777 on
    // disk and the tmpfs root's 1777 in memory (kubelet keeps the bits it finds).
    for (name, mode) in [("disk", 0o2777), ("memory", 0o3777)] {
        let v = volume(&report, "default/app", name).unwrap();
        let meta = std::fs::metadata(v.target.as_ref().unwrap()).unwrap();
        assert_eq!(meta.gid(), 4321, "{name}: the fsGroup owns the volume");
        assert_eq!(meta.mode() & 0o7777, mode, "{name}: {:o}", meta.mode());
    }
    let plain = volume(&report, "default/plain", "disk").unwrap();
    let meta = std::fs::metadata(plain.target.as_ref().unwrap()).unwrap();
    assert_eq!((meta.gid(), meta.mode() & 0o7777), (0, 0o777), "no fsGroup: root's group, no setgid");
}

/// Each file below `dir` with its mode and change time (ns): what an fsGroup walk changes.
fn modes_and_ctimes(dir: &Path) -> BTreeMap<PathBuf, (u32, i64)> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let meta = std::fs::symlink_metadata(&path).unwrap();
        if meta.is_dir() {
            out.extend(modes_and_ctimes(&path));
        }
        out.insert(path, (meta.mode(), meta.ctime() * 1_000_000_000 + meta.ctime_nsec()));
    }
    out
}

#[test]
fn fs_group_on_root_mismatch_walks_no_emptydir_again_after_a_restart_a_kill_or_a_lost_journal() {
    support::enter_private_mount_namespace();
    let mut node = Node::new();
    node.write(
        "pod.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: app, namespace: default}\nspec:\n  securityContext: {fsGroup: 4321, fsGroupChangePolicy: OnRootMismatch}\n  containers: [{name: c, image: busybox, volumeMounts: [{name: disk, mountPath: /d}, {name: memory, mountPath: /m}]}]\n  volumes:\n  - {name: disk, emptyDir: {}}\n  - {name: memory, emptyDir: {medium: Memory}}\n",
    );
    node.start();
    let published =
        |r: &StatusReport| r.volumes.len() == 2 && r.volumes.iter().all(|v| v.phase == Phase::Published);
    let report = node.wait(LIMIT, published).unwrap();
    // What a container wrote since: files 0644 (umask 022) in the setgid root, so of the
    // fsGroup but without g+w — a walk would give them g+w, and a new change time.
    let roots: Vec<PathBuf> = report.volumes.iter().map(|v| v.target.clone().unwrap()).collect();
    for root in &roots {
        for d in 0..10 {
            let sub = root.join(format!("d{d}"));
            std::fs::create_dir(&sub).unwrap();
            for f in 0..200 {
                std::fs::write(sub.join(format!("f{f}")), "x").unwrap();
                std::fs::set_permissions(sub.join(format!("f{f}")), std::fs::Permissions::from_mode(0o644))
                    .unwrap();
            }
        }
    }
    let before: Vec<_> = roots.iter().map(|r| modes_and_ctimes(r)).collect();
    assert!(before.iter().all(|files| files.len() == 2010), "the files are there");

    for how in ["a restart (SIGTERM)", "a kill -9", "a kill -9 and a lost journal"] {
        match how {
            "a restart (SIGTERM)" => node.terminate(),
            _ => node.kill_9(),
        }
        if how.ends_with("lost journal") {
            std::fs::remove_file(node.root.join("state.redb")).unwrap();
        }
        node.start();
        let report =
            node.wait(LIMIT, published).unwrap_or_else(|e| panic!("{how}: {e}\n{}", node.agent_log()));
        for (root, was) in roots.iter().zip(&before) {
            let v = report.volumes.iter().find(|v| v.target.as_ref() == Some(root)).unwrap();
            let now = modes_and_ctimes(root);
            let changed = was.iter().filter(|(path, old)| now.get(*path) != Some(old)).count();
            assert_eq!(
                changed,
                0,
                "{how}: volume {} walked again: {changed} of {} files changed",
                v.volume,
                was.len()
            );
        }
    }
}

#[test]
fn the_directory_of_a_pod_that_is_gone_goes_even_with_files_in_it_but_never_through_a_mount() {
    support::enter_private_mount_namespace();
    let mut node = Node::new();
    let pods = node.root.join("kubelet/pods");
    // What kubelet leaves beside volumes: a file, a container's directory, a link out of the tree.
    let gone = pods.join("0b6c3f0e-0000-4000-8000-000000000001");
    std::fs::create_dir_all(gone.join("containers/app")).unwrap();
    std::fs::write(gone.join("etc-hosts"), "127.0.0.1 localhost\n").unwrap();
    std::fs::write(gone.join("containers/app/0a1b"), "log").unwrap();
    let outside = node.root.join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("keep"), "not the pod's").unwrap();
    std::os::unix::fs::symlink(&outside, gone.join("plugins")).unwrap();
    // Another with a mount below it.
    let busy = pods.join("0b6c3f0e-0000-4000-8000-000000000002");
    let mount = busy.join("containers/app");
    std::fs::create_dir_all(&mount).unwrap();
    std::fs::write(busy.join("etc-hosts"), "127.0.0.1 localhost\n").unwrap();
    nix::mount::mount(Some("tmpfs"), &mount, Some("tmpfs"), nix::mount::MsFlags::empty(), None::<&str>)
        .unwrap();
    std::fs::write(mount.join("data"), "on the mount").unwrap();
    node.start();

    let report = node
        .wait(LIMIT, |r| !gone.exists() && r.problems.iter().any(|p| p.contains(&busy.display().to_string())))
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(outside.join("keep")).unwrap(),
        "not the pod's",
        "the link's target stays"
    );
    let problem = report.problems.iter().find(|p| p.contains(&busy.display().to_string())).unwrap();
    assert!(problem.contains("stays"), "{problem}");
    assert_eq!(
        std::fs::read_to_string(mount.join("data")).unwrap(),
        "on the mount",
        "nothing removed through a mount"
    );
    // Said once, not every resync.
    std::thread::sleep(Duration::from_secs(3));
    let said = node.agent_log().matches("pod directory left").count();
    assert_eq!(said, 1, "{}", node.agent_log());

    // The mount gone, the directory goes, and so does the problem.
    nix::mount::umount2(&mount, nix::mount::MntFlags::MNT_DETACH).unwrap();
    node.wait(LIMIT, |r| !busy.exists() && !r.problems.iter().any(|p| p.contains("stays"))).unwrap();
}

const STORAGE: &str = "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata: {name: kvol-hostpath}\nprovisioner: hostpath.csi.kvol.io\n---\napiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata: {name: hostpath.csi.kvol.io}\nspec: {attachRequired: false, podInfoOnMount: true, volumeLifecycleModes: [Persistent, Ephemeral]}\n---\napiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: data, namespace: default}\nspec:\n  storageClassName: kvol-hostpath\n  accessModes: [ReadWriteOnce]\n  resources: {requests: {storage: 16Mi}}\n";

const CSI_POD: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: app, namespace: default}\nspec:\n  containers: [{name: c, image: busybox, volumeMounts: [{name: data, mountPath: /d}, {name: scratch, mountPath: /s}]}]\n  volumes:\n  - {name: data, persistentVolumeClaim: {claimName: data}}\n  - {name: scratch, csi: {driver: hostpath.csi.kvol.io}}\n";

#[test]
fn a_lost_empty_or_corrupt_vol_data_json_does_not_keep_a_volume_mounted() {
    support::enter_private_mount_namespace();
    type Damage = fn(&std::path::Path);
    let damages: [(&str, Damage); 3] = [
        ("deleted", |f| std::fs::remove_file(f).unwrap()),
        ("empty", |f| std::fs::write(f, "").unwrap()),
        ("not json", |f| std::fs::write(f, "{\"driverName\": ").unwrap()),
    ];
    for (what, damage) in damages {
        let mut node = Node::new();
        node.write("00-storage.yaml", STORAGE);
        node.write("pod.yaml", CSI_POD);
        node.start();
        let report = node
            .wait(LIMIT, |r| r.volumes.len() == 2 && r.volumes.iter().all(|v| v.phase == Phase::Published))
            .unwrap_or_else(|s| panic!("{what}: never published: {s}"));
        let targets: Vec<std::path::PathBuf> =
            report.volumes.iter().map(|v| v.target.clone().unwrap()).collect();
        // Killed, the pod removed meanwhile, and each volume's vol_data.json damaged.
        node.kill_9();
        node.remove("pod.yaml");
        for target in &targets {
            damage(&target.join("vol_data.json"));
        }
        // The staging path's record too (the claim's volume is staged by the bundled driver).
        let staging_records = staging_records(&node.root.join("kubelet/plugins/kubernetes.io/csi"));
        assert!(!staging_records.is_empty(), "{what}: the claim's volume is staged");
        for record in &staging_records {
            damage(record);
        }
        node.start();
        node.wait(LIMIT, |r| r.volumes.is_empty() && r.node_volumes.is_empty())
            .unwrap_or_else(|s| panic!("{what}: the volumes were never torn down: {s}"));
        for target in &targets {
            assert!(!target.join("mount").exists(), "{what}: {} left", target.display());
        }
        assert!(
            node.mounts().iter().all(|m| !m.target.starts_with(node.root.join("kubelet/pods"))),
            "{what}: {:#?}",
            node.mounts()
        );
    }
}

/// A Flexvolume driver `kvol/<name>` whose `init` runs `init` (a shell fragment), and whose
/// `mount` makes the directory.
fn flex_driver(node: &Node, name: &str, init: &str) {
    let dir = node.root.join(format!("flexvolume/kvol~{name}"));
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join(name);
    let text = format!(
        "#!/bin/sh\ncase \"$1\" in\n  init) {init} ;;\n  mount) mkdir -p \"$2\"; echo '{{\"status\": \"Success\"}}' ;;\n  unmount) rmdir \"$2\" 2>/dev/null; echo '{{\"status\": \"Success\"}}' ;;\n  *) echo '{{\"status\": \"Not supported\"}}' ;;\nesac\n"
    );
    std::fs::write(&script, text).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn a_hung_flexvolume_driver_holds_up_only_its_own_volumes_at_start() {
    support::enter_private_mount_namespace();
    let mut node = Node::new();
    const LOADED: &str = "echo '{\"status\": \"Success\", \"capabilities\": {\"attach\": false}}'";
    flex_driver(&node, "healthy", LOADED);
    flex_driver(&node, "hung", "sleep 600");
    let pod = |name: &str, volume: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  containers: {}\n  volumes: [{volume}]\n",
            kvol_test_support::pods::containers_using("c", &format!("[{volume}]"))
        )
    };
    node.write("a.yaml", &pod("cache", "{name: v, emptyDir: {}}"));
    node.write("b.yaml", &pod("healthy", "{name: v, flexVolume: {driver: kvol/healthy}}"));
    node.write("c.yaml", &pod("hung", "{name: v, flexVolume: {driver: kvol/hung}}"));
    let start = Instant::now();
    node.start();
    let published =
        |r: &StatusReport, pod: &str| volume(r, pod, "v").is_some_and(|v| v.phase == Phase::Published);
    let report =
        node.wait(LIMIT, |r| published(r, "default/cache") && published(r, "default/healthy")).unwrap();
    let took = start.elapsed();
    eprintln!(
        "the other drivers' and plugins' volumes published {took:?} after start, the hung driver's init still running"
    );
    assert!(took < Duration::from_secs(8), "held up by the hung driver: {took:?}");
    assert!(!published(&report, "default/hung"), "{:#?}", report.volumes);
    assert!(node.agent_log().contains("starting without them"), "{}", node.agent_log());
}

#[test]
fn a_leftover_that_cannot_be_settled_is_said_once_not_re_decided_every_pass() {
    support::enter_private_mount_namespace();
    let mut node = Node::new();
    // A CSI pod volume directory of a pod that is gone, its record naming a driver that is not
    // registered, nothing mounted.
    let dir = node
        .root
        .join("kubelet/pods/0b6c3f0e-0000-4000-8000-000000000003/volumes/kubernetes.io~csi/pv-stray");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("vol_data.json"),
        r#"{"driverName": "gone.csi.example", "volumeHandle": "h-1", "specVolID": "pv-stray", "volumeLifecycleMode": "Persistent"}"#,
    )
    .unwrap();
    node.start();
    node.wait(LIMIT, |r| !r.volumes.is_empty()).unwrap();
    // Resyncs every second: ten of them.
    std::thread::sleep(Duration::from_secs(10));
    let log = node.agent_log();
    let lines = |words: &str| log.lines().filter(|l| l.contains(words)).count();
    let (adopted, republished) =
        (lines("adopted a pod volume directory"), lines("published volume's mount is gone"));
    eprintln!("in ~10 s: adopted {adopted}, mount gone {republished}");
    assert!(adopted <= 1 && republished == 0, "re-decided every pass:\n{log}");
    let report = node.status().unwrap();
    let v = report.volumes.first().unwrap();
    assert!(v.last_error.is_some(), "the reason is shown: {v:#?}");
}

#[test]
fn a_flexvolume_directory_churning_logs_a_line_a_second_not_one_per_event() {
    support::enter_private_mount_namespace();
    let mut node = Node::new();
    let plugins = node.root.join("flexvolume");
    std::fs::create_dir_all(&plugins).unwrap();
    node.start();
    node.wait(LIMIT, |_| true).unwrap();
    let dir = plugins.join("churn~driver");
    let start = Instant::now();
    for _ in 0..10_000 {
        std::fs::create_dir(&dir).unwrap();
        std::fs::remove_dir(&dir).unwrap();
    }
    let churned = start.elapsed();
    std::thread::sleep(Duration::from_secs(2));
    let log = node.agent_log();
    let lines = log.lines().filter(|l| l.contains("churn~driver")).count();
    let seconds = churned.as_secs() + 3;
    eprintln!("10,000 create/delete cycles in {churned:?}: {lines} log lines about the directory");
    // Three kinds of line (not loaded, gone, cannot watch), each at most once a second.
    assert!(lines as u64 <= 3 * seconds, "{lines} lines in ~{seconds} s:\n{log}");
}

/// The `vol_data.json` files of staging directories under `dir` (`<driver>/<hash>/`).
fn staging_records(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let children = |d: &std::path::Path| -> Vec<std::path::PathBuf> {
        std::fs::read_dir(d).map(|r| r.flatten().map(|e| e.path()).collect()).unwrap_or_default()
    };
    children(dir)
        .iter()
        .flat_map(|driver| children(driver))
        .map(|volume| volume.join("vol_data.json"))
        .filter(|record| record.is_file())
        .collect()
}

/// The pod that stays across the damage (an emptyDir and a claim of the bundled driver), and
/// the one removed while the agent is down (an emptyDir and an inline CSI volume).
const KEPT_AND_GONE_PODS: [(&str, &str); 2] = [
    (
        "kept.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: kept, namespace: default}\nspec:\n  containers: [{name: c, image: busybox, volumeMounts: [{name: data, mountPath: /d}, {name: cache, mountPath: /c}]}]\n  volumes:\n  - {name: data, persistentVolumeClaim: {claimName: data}}\n  - {name: cache, emptyDir: {}}\n",
    ),
    (
        "gone.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: gone, namespace: default}\nspec:\n  containers: [{name: c, image: busybox, volumeMounts: [{name: scratch, mountPath: /s}, {name: cache, mountPath: /c}]}]\n  volumes:\n  - {name: scratch, csi: {driver: hostpath.csi.kvol.io}}\n  - {name: cache, emptyDir: {}}\n",
    ),
];

const NEW_POD: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: new, namespace: default}\nspec:\n  containers: [{name: c, image: busybox, volumeMounts: [{name: scratch, mountPath: /s}, {name: cache, mountPath: /c}]}]\n  volumes:\n  - {name: scratch, csi: {driver: hostpath.csi.kvol.io}}\n  - {name: cache, emptyDir: {}}\n";

/// The mount id (`/proc/thread-self/mountinfo`'s first field: the test thread has its own namespace) of the mount at `target`, if any.
fn mount_id(target: &Path) -> Option<u64> {
    let table = std::fs::read_to_string("/proc/thread-self/mountinfo").unwrap();
    let target = target.display().to_string();
    table.lines().rev().find_map(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        (fields.get(4) == Some(&target.as_str())).then(|| fields[0].parse().unwrap())
    })
}

/// Where a container sees a volume published at `target`: its `mount` for CSI, else itself.
fn seen_at(target: &Path) -> PathBuf {
    let csi = target.join("mount");
    if csi.is_dir() { csi } else { target.to_path_buf() }
}

/// What shows a volume was left alone: its mount id (none for an emptyDir on disk), the
/// device and inode of what a container sees, and the file a container wrote into it.
fn identity(target: &Path) -> (Option<u64>, u64, u64, String) {
    let seen = seen_at(target);
    let meta = std::fs::metadata(&seen).unwrap();
    let written = std::fs::read_to_string(seen.join("written-before")).unwrap_or_default();
    (mount_id(&seen), meta.dev(), meta.ino(), written)
}

#[test]
fn a_damaged_journal_is_kept_aside_and_the_state_rebuilt_from_the_node() {
    support::enter_private_mount_namespace();
    for (what, damage, kept_aside) in JOURNAL_DAMAGES {
        let mut node = Node::new();
        node.write("00-storage.yaml", STORAGE);
        for (file, pod) in KEPT_AND_GONE_PODS {
            node.write(file, pod);
        }
        node.start();
        let all_published = |r: &StatusReport, n: usize| {
            r.volumes.len() == n && r.volumes.iter().all(|v| v.phase == Phase::Published)
        };
        let report = node.wait(LIMIT, |r| all_published(r, 4)).unwrap_or_else(|s| panic!("{what}: {s}"));
        let targets = |report: &StatusReport, pod: &str| -> Vec<PathBuf> {
            report.volumes.iter().filter(|v| v.pod == pod).map(|v| v.target.clone().unwrap()).collect()
        };
        let (kept, gone) = (targets(&report, "default/kept"), targets(&report, "default/gone"));
        for target in kept.iter().chain(&gone) {
            std::fs::write(seen_at(target).join("written-before"), target.display().to_string()).unwrap();
        }
        let before: Vec<_> = kept.iter().map(|t| identity(t)).collect();
        assert!(before.iter().any(|(mount, ..)| mount.is_some()), "{what}: the claim is a mount");

        node.kill_9();
        node.remove("gone.yaml");
        let journal = node.root.join("state.redb");
        damage(&journal);
        let started = Instant::now();
        node.start();
        let said = |r: &StatusReport| r.problems.iter().any(|p| p.contains("state.redb.damaged-"));
        let report = node
            .wait(LIMIT, |r| all_published(r, 2) && (kept_aside != KeptAside::Always || said(r)))
            .unwrap_or_else(|s| panic!("{what}: never started with the volumes: {s}\n{}", node.agent_log()));
        let took = started.elapsed();
        assert!(node.exited().is_none(), "{what}: the agent exited");
        let aside: Vec<PathBuf> = std::fs::read_dir(&node.root)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.display().to_string().contains("state.redb.damaged-"))
            .collect();
        let found = match kept_aside {
            KeptAside::Always => true,
            KeptAside::Never => false,
            KeptAside::WhenFound => !aside.is_empty(),
        };
        assert_eq!(aside.len(), usize::from(found), "{what}: {aside:?}");
        assert_eq!(said(&report), found, "{what}: {:#?}", report.problems);
        if let Some(aside) = aside.first() {
            let problem = report.problems.iter().find(|p| p.contains("state.redb.damaged-")).unwrap();
            assert!(problem.contains(&aside.display().to_string()), "{what}: {problem}");
            let aside_len = std::fs::symlink_metadata(aside).unwrap().len();
            eprintln!(
                "{what}: started with its volumes in {took:?}; kept {} ({aside_len} bytes); {problem}",
                aside.display()
            );
        } else {
            let read =
                if kept_aside == KeptAside::Never { "" } else { " (only free pages hit: read as it was)" };
            eprintln!("{what}: started with its volumes in {took:?}{read}");
        }

        // The wanted volumes were left alone: the same mounts, the same directories, the data.
        let now: Vec<_> = kept.iter().map(|t| identity(t)).collect();
        assert_eq!(now, before, "{what}: a wanted volume was touched");
        // The pod removed meanwhile lost its volumes.
        node.wait(LIMIT, |r| r.volumes.iter().all(|v| v.pod == "default/kept"))
            .unwrap_or_else(|s| panic!("{what}: the gone pod's volumes stay: {s}"));
        for target in &gone {
            assert!(mount_id(&target.join("mount")).is_none(), "{what}: {} mounted", target.display());
            let start = Instant::now();
            while target.exists() && start.elapsed() < LIMIT {
                std::thread::sleep(Duration::from_millis(50));
            }
            assert!(!target.exists(), "{what}: {} left", target.display());
        }
        // It keeps working: a new pod gets its volumes.
        node.write("new.yaml", NEW_POD);
        node.wait(LIMIT, |r| all_published(r, 4)).unwrap_or_else(|s| panic!("{what}: the new pod: {s}"));
        let log = node.agent_log();
        assert_eq!(
            log.matches("the journal was damaged").count(),
            usize::from(found),
            "{what}: said once\n{log}"
        );
        assert!(journal.is_file(), "{what}: a new journal");
    }
}

/// A pod `name` with one emptyDir, `cache`.
fn empty_dir_pod(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  containers: [{{name: c, image: busybox, volumeMounts: [{{name: cache, mountPath: /c}}]}}]\n  volumes: [{{name: cache, emptyDir: {{}}}}]\n"
    )
}

#[test]
fn a_full_state_directory_runs_nothing_unjournalled_and_converges_when_space_returns() {
    support::enter_private_mount_namespace();
    let mut node = Node::new();
    let state = small_state_filesystem(&mut node, "4m");
    node.agent_args.push("--no-components".into());
    node.write("a.yaml", &empty_dir_pod("a"));
    node.start();
    let published = |r: &StatusReport, pods: &[&str]| {
        r.volumes.len() == pods.len()
            && pods.iter().all(|p| {
                volume(r, &format!("default/{p}"), "cache").is_some_and(|v| v.phase == Phase::Published)
            })
    };
    node.wait(LIMIT, |r| published(r, &["a"])).unwrap();
    let dirs_before = node.pod_volume_dirs();
    let a_inode = std::fs::metadata(&dirs_before[0]).unwrap().ino();
    std::fs::write(dirs_before[0].join("written-before"), "a's").unwrap();

    fill(&state);
    let full = Instant::now();
    node.write("b.yaml", &empty_dir_pod("b"));
    std::thread::sleep(Duration::from_secs(4));
    // Nothing ran that the journal could not record: b has no volume directory; a is as it was.
    assert_eq!(node.pod_volume_dirs(), dirs_before, "an operation ran unjournalled");
    assert_eq!(std::fs::metadata(&dirs_before[0]).unwrap().ino(), a_inode);
    assert_eq!(std::fs::read_to_string(dirs_before[0].join("written-before")).unwrap(), "a's");
    let log = node.agent_log();
    let said = |words: &str| log.lines().filter(|l| l.contains(words)).count();
    let failed_ops = said("cannot journal volume_mount");
    eprintln!("full for 4 s: {failed_ops} tries of b's publish refused, none run");
    assert!(failed_ops >= 2, "retried with backoff:\n{log}");
    assert_eq!(said("the journal cannot be written"), 1, "said once:\n{log}");
    assert_eq!(said("cannot write the status file"), 1, "said once:\n{log}");
    // kvol status still answers (from the last status written: the file is on the full disk).
    let shown = node.status().expect("kvol status answers");
    let a = volume(&shown, "default/a", "cache").expect("a is shown");
    assert_eq!(a.phase, Phase::Published, "{shown:#?}");

    std::fs::remove_file(state.join("filler")).unwrap();
    let freed = Instant::now();
    node.wait(LIMIT, |r| published(r, &["a", "b"]))
        .unwrap_or_else(|s| panic!("never converged: {s}\n{}", node.agent_log()));
    eprintln!(
        "space back: b published {:?} later ({:?} after the disk filled), without a restart",
        freed.elapsed(),
        full.elapsed()
    );
    let log = node.agent_log();
    assert!(log.contains("the journal is written again") && log.contains("the status file is written again"));

    // A kill -9 that follows: nothing doubled or forgotten.
    node.kill_9();
    node.start();
    let report = node.wait(LIMIT, |r| published(r, &["a", "b"])).unwrap();
    assert_eq!(node.pod_volume_dirs().len(), 2, "{:#?}", report.volumes);
    assert_eq!(std::fs::metadata(&dirs_before[0]).unwrap().ino(), a_inode, "a was left alone");
    assert!(!node.agent_log().contains("reconstructed a published volume"), "the journal knew both");
}

const REBOOT_UID: &str = "3c9a0000-0000-4000-8000-0000000000b7";

/// A claim of the bundled driver and a pod using it.
fn claim_pod() -> String {
    format!(
        r#"apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {{name: kvol-hostpath}}
provisioner: hostpath.csi.kvol.io
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: data, namespace: default}}
spec: {{storageClassName: kvol-hostpath, accessModes: [ReadWriteOnce], resources: {{requests: {{storage: 16Mi}}}}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: keeper, namespace: default, uid: {REBOOT_UID}}}
spec:
  containers: [{{name: c, image: i, volumeMounts: [{{name: data, mountPath: /data}}]}}]
  volumes: [{{name: data, persistentVolumeClaim: {{claimName: data}}}}]
"#
    )
}

#[test]
fn after_every_mount_is_lost_a_claim_is_staged_and_published_again_before_it_is_said_ready() {
    support::enter_private_mount_namespace();
    let mut node = Node::new();
    node.start();
    node.write("claim.yaml", &claim_pod());
    let published = node
        .wait(LIMIT, |r| volume(r, "default/keeper", "data").is_some_and(|v| v.phase == Phase::Published));
    let report = published.unwrap_or_else(|r| panic!("never published: {r}\n{}", node.agent_log()));
    // A CSI volume is mounted at `<its pod volume directory>/mount`, as kubelet mounts it.
    let target =
        volume(&report, "default/keeper", "data").unwrap().target.clone().expect("its target").join("mount");
    std::fs::write(target.join("kept"), "written before the loss").unwrap();

    // The agent dies, then every mount and loop device goes, as in a reboot.
    node.kill_9();
    kvol_test_support::lose_mounts_and_loop_devices(&node.root);
    assert!(
        !target.join("kept").exists(),
        "the file is on the volume, not in the directory beneath: {} left mounted {:#?}",
        target.display(),
        kvol_test_support::mounts_below(&node.root)
    );

    // The next agent: the runtime API says ready only once the volume is really back.
    node.start();
    let socket = node.runtime_socket();
    let wait = std::process::Command::new(env!("CARGO_BIN_EXE_kvol"))
        .args(["pod", "wait", REBOOT_UID, "--timeout", "60", "--socket"])
        .arg(&socket)
        .output()
        .unwrap();
    assert!(wait.status.success(), "{}\n{}", String::from_utf8_lossy(&wait.stderr), node.agent_log());
    assert!(
        kvol_test_support::mounts_below(&node.root).contains(&target),
        "said ready with {} not mounted\n{}",
        target.display(),
        node.agent_log()
    );
    assert_eq!(std::fs::read_to_string(target.join("kept")).unwrap(), "written before the loss");
    let log = node.agent_log();
    assert!(log.contains("staged volume's mounts are gone; staging it again"), "{log}");
    node.remove("claim.yaml");
}
