//! The real kubelet (v1.26, `KVOL_KUBELET`, on an in-memory CRI, `KVOL_FAKECRI`) as the oracle: it and the real `kvol agent` run against one real kube-apiserver (`KVOL_KUBE_APISERVER`, `KVOL_ETCD`) as two nodes, each given the same pod. Compared: the pod-volume trees of configMap, secret, downwardAPI, projected and emptyDir volumes (entries, modes, owners, links, contents) and their mounts (tmpfs or disk, size); and, for a claim of the bundled CSI driver grown by the resizer's steps done by hand, the claim each node writes back (status, the fields it owns) and its Events on the claim and the pod. Skipped, with the reason, when any of the four is unset (the claim test also needs `KVOL_NODE_DRIVER_REGISTRAR`).
//!
//! Every difference is printed in a table. A test fails on any difference that no entry of its
//! list ([`KNOWN`], [`RESIZE_KNOWN`]) covers; each entry gives its reason, and is either
//! intended or `OPEN` (found here and reported: kvol to be changed, or the difference
//! documented).
//!
//! To run them here: `. /work/peers/env.sh` (with `KVOL_KUBELET=/work/peers/bin/kubelet` and
//! `KVOL_FAKECRI=/work/peers/bin/fakecri`), then, as root,
//! `cargo test -p kvol --test kubelet_oracle_e2e -- --nocapture` (the pod volumes about 15 s;
//! the grown claim 1–2 min: the kubelet finds a grown PV at its next periodic sync of the pod,
//! every minute and up to half a minute more).
//!
//! What the kubelet needs of the host, and how it is kept from it: it writes `/var/log/pods`
//! and `/var/lib/kubelet/device-plugins` whatever `--root-dir` says, so in the test thread's
//! private mount namespace (where the kubelet, the agent and the API server run) scratch
//! directories are bind-mounted over `/var/log` and `/var/lib/kubelet`; it sets the sysctls
//! kernel.panic, kernel.panic_on_oops and vm.overcommit_memory, which are put back when the
//! test ends, also when it fails. Its mounts are made in that same namespace, so this thread
//! sees the kubelet's mounts beside the agent's (and the drivers').

#[path = "support/kubelet_host.rs"]
mod kubelet_host;
#[path = "../../kvol-cluster/tests/support/mod.rs"]
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{
    ConfigMap, Node, PersistentVolume, PersistentVolumeClaim, Pod, Secret, ServiceAccount,
};
use k8s_openapi::api::storage::v1::{CSIDriver, CSINode};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use kubelet_host::{HostDirs, Sysctls, free_port};
use kvol_node::report::status::{Phase, read_status};
use kvol_plugin::{Mounter, SystemMounter};
use nix::mount::{MntFlags, MsFlags};
use nix::sched::CloneFlags;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::json;

const KUBELET_NODE: &str = "kubelet-node";
const KVOL_NODE: &str = "kvol-node";
const KUBELET_POD: &str = "oracle-kubelet";
const KVOL_POD: &str = "oracle-kvol";
/// The volume the ServiceAccount admission plugin adds (`kube-api-access-<5 random>`); the same
/// name on both pods, so the trees compare without renaming.
const API_ACCESS: &str = "kube-api-access-x7k2q";
/// Every volume of the pod, as the agent's status names them.
const VOLUMES: [&str; 7] = ["cm", "sec", "dapi", "proj", API_ACCESS, "scratch", "mem"];
/// The volume directories, relative to `pods/<uid>/volumes`, and whether the atomic writer
/// fills them (a `..data` link once written).
const VOLUME_DIRS: [(&str, bool); 7] = [
    ("kubernetes.io~configmap/cm", true),
    ("kubernetes.io~secret/sec", true),
    ("kubernetes.io~downward-api/dapi", true),
    ("kubernetes.io~projected/proj", true),
    ("kubernetes.io~projected/kube-api-access-x7k2q", true),
    ("kubernetes.io~empty-dir/scratch", false),
    ("kubernetes.io~empty-dir/mem", false),
];
/// Generous: a 2-core CI machine runs the API server, the kubelet and the agent at once.
const LIMIT: Duration = Duration::from_secs(120);

/// A process the test started: asked to stop with SIGTERM, killed after its grace; on drop too.
#[derive(Debug)]
struct Process {
    what: &'static str,
    child: Child,
    log: PathBuf,
    grace: Duration,
}

impl Process {
    fn spawn(what: &'static str, mut command: Command, log: PathBuf, grace: Duration) -> Process {
        let out = std::fs::File::create(&log).expect("a log file");
        let child = command
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("the log file"))
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
        Process { what, child, log, grace }
    }

    fn assert_running(&mut self) {
        if let Some(status) = self.child.try_wait().expect("wait") {
            panic!("{} exited ({status}); its log, last lines:\n{}", self.what, tail(&self.log, 40));
        }
    }

    /// SIGTERM, then SIGKILL after the grace; how long it took.
    fn stop(&mut self) -> Duration {
        let start = Instant::now();
        if self.child.try_wait().ok().flatten().is_some() {
            return start.elapsed();
        }
        let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGTERM);
        while start.elapsed() < self.grace {
            if self.child.try_wait().ok().flatten().is_some() {
                return start.elapsed();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("{} did not stop within {:?} of SIGTERM: killed", self.what, self.grace);
        let _ = self.child.kill();
        let _ = self.child.wait();
        start.elapsed()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The last `lines` lines of a log file.
fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The pod, as the test gives it to either node: the kubelet oracle's pod plus the volume the
/// ServiceAccount admission plugin would add (the plugin is off in the test's API server).
fn pod(name: &str, node: &str) -> serde_json::Value {
    json!({
        "metadata": {"name": name, "namespace": "default",
            "labels": {"app": "oracle", "tier": "test"}, "annotations": {"note": "hello"}},
        "spec": {
            "nodeName": node,
            "serviceAccountName": "default",
            "securityContext": {"fsGroup": 1234},
            "containers": [{
                "name": "main",
                "image": "example.invalid/busybox:oracle",
                "imagePullPolicy": "IfNotPresent",
                "command": ["sleep", "3600"],
                "resources": {"limits": {"cpu": "100m", "memory": "64Mi"}},
                "volumeMounts": [
                    {"name": "cm", "mountPath": "/etc/cm"},
                    {"name": "sec", "mountPath": "/etc/sec"},
                    {"name": "dapi", "mountPath": "/etc/dapi"},
                    {"name": "proj", "mountPath": "/etc/proj"},
                    {"name": "scratch", "mountPath": "/scratch"},
                    {"name": "mem", "mountPath": "/mem"},
                    {"name": API_ACCESS, "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                        "readOnly": true}
                ]
            }],
            "volumes": [
                {"name": "cm", "configMap": {"name": "oracle-cm", "defaultMode": 0o644, "items": [
                    {"key": "a.txt", "path": "a.txt", "mode": 0o600},
                    {"key": "b.txt", "path": "sub/dir/b.txt"}]}},
                {"name": "sec", "secret": {"secretName": "oracle-secret", "defaultMode": 0o400}},
                {"name": "dapi", "downwardAPI": {"items": [
                    {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
                    {"path": "mem_limit", "resourceFieldRef":
                        {"containerName": "main", "resource": "limits.memory", "divisor": "1Mi"}},
                    // No divisor: the API server fills in "0", which kubelet reads as 1.
                    {"path": "cpu_limit", "resourceFieldRef": {"containerName": "main", "resource": "limits.cpu"}}]}},
                {"name": "proj", "projected": {"sources": [
                    {"configMap": {"name": "oracle-cm", "items": [{"key": "a.txt", "path": "cm/a.txt"}]}},
                    {"secret": {"name": "oracle-secret",
                        "items": [{"key": "username", "path": "sec/username", "mode": 0o400}]}},
                    {"downwardAPI": {"items": [
                        {"path": "dapi/annotations", "fieldRef": {"fieldPath": "metadata.annotations"}}]}},
                    {"serviceAccountToken": {"audience": "oracle", "expirationSeconds": 3600, "path": "token"}}]}},
                // As plugin/pkg/admission/serviceaccount adds it (v1.26).
                {"name": API_ACCESS, "projected": {"defaultMode": 0o644, "sources": [
                    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                    {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                    {"downwardAPI": {"items": [{"path": "namespace",
                        "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}},
                {"name": "scratch", "emptyDir": {}},
                {"name": "mem", "emptyDir": {"medium": "Memory"}}
            ]
        }
    })
}

/// One entry of a pod's volume tree, not following links.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Entry {
    /// `d`, `f`, `l` or `?`.
    kind: char,
    /// Permission bits with setuid, setgid and sticky.
    mode: u32,
    uid: u32,
    gid: u32,
    /// A link's target (timestamped names normalised).
    target: Option<String>,
    /// A file's bytes.
    content: Option<Vec<u8>>,
}

impl Entry {
    fn summary(&self) -> String {
        let mut out = format!("{} {:04o} {}:{}", self.kind, self.mode, self.uid, self.gid);
        if let Some(target) = &self.target {
            out.push_str(&format!(" -> {target}"));
        }
        if let Some(content) = &self.content {
            out.push_str(&format!(" {}", show(content)));
        }
        out
    }
}

/// Bytes as a short readable string.
fn show(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    if text.chars().count() <= 40 {
        format!("{text:?}")
    } else {
        let head: String = text.chars().take(24).collect();
        format!("{head:?}… ({} bytes)", bytes.len())
    }
}

/// Whether `name` is the atomic writer's timestamped directory, `..YYYY_MM_DD_HH_MM_SS.<digits>`.
fn is_timestamped(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("..") else { return false };
    let b = rest.as_bytes();
    if b.len() < 21 || b[19] != b'.' || !b[20..].iter().all(u8::is_ascii_digit) {
        return false;
    }
    b[..19]
        .iter()
        .enumerate()
        .all(|(i, c)| if [4, 7, 10, 13, 16].contains(&i) { *c == b'_' } else { c.is_ascii_digit() })
}

/// A path or link target with every timestamped name written `..<ts>`.
fn normalise(path: &str) -> String {
    path.split('/')
        .map(|part| if is_timestamped(part) { "..<ts>" } else { part })
        .collect::<Vec<_>>()
        .join("/")
}

/// Every entry below (and including, as `.`) `base`, by normalised relative path. Two
/// timestamped directories side by side (a write in progress) are told apart with `#2`.
fn walk(base: &Path) -> BTreeMap<String, Entry> {
    fn visit(dir: &Path, relative: &str, out: &mut BTreeMap<String, Entry>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        let mut names: Vec<String> =
            entries.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        let mut timestamped = 0;
        for name in names {
            let path = dir.join(&name);
            let mut shown = normalise(&name);
            if is_timestamped(&name) {
                timestamped += 1;
                if timestamped > 1 {
                    shown = format!("{shown}#{timestamped}");
                }
            }
            let child = format!("{relative}/{shown}");
            if let Some(entry) = entry(&path) {
                let is_dir = entry.kind == 'd';
                out.insert(child.clone(), entry);
                if is_dir {
                    visit(&path, &child, out);
                }
            }
        }
    }
    let mut out = BTreeMap::new();
    if let Some(root) = entry(base) {
        out.insert(".".to_string(), root);
        visit(base, ".", &mut out);
    }
    out
}

fn entry(path: &Path) -> Option<Entry> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    let kind = meta.file_type();
    let (kind, target, content) = if kind.is_symlink() {
        let target = std::fs::read_link(path).ok()?.to_string_lossy().into_owned();
        ('l', Some(normalise(&target)), None)
    } else if kind.is_dir() {
        ('d', None, None)
    } else if kind.is_file() {
        ('f', None, std::fs::read(path).ok())
    } else {
        ('?', None, None)
    };
    Some(Entry {
        kind,
        mode: meta.permissions().mode() & 0o7777,
        uid: meta.uid(),
        gid: meta.gid(),
        target,
        content,
    })
}

/// The mounts at or below `volumes` (a pod's volumes directory), by relative path: file system
/// type and options.
fn mounts(volumes: &Path) -> BTreeMap<String, String> {
    SystemMounter
        .mounts_under(volumes)
        .expect("the mount table")
        .into_iter()
        .map(|m| {
            let relative = m.target.strip_prefix(volumes).unwrap_or(&m.target).to_string_lossy().into_owned();
            (format!("./{relative}"), format!("{} {}", m.fstype, m.options.join(",")))
        })
        .collect()
}

/// A difference between the kubelet's tree and kvol's.
#[derive(Debug)]
struct Diff {
    path: String,
    /// `entry`, `type`, `mode`, `owner`, `link`, `content`, `mount`, `token claims`; in the
    /// resize test, the field's dotted path.
    field: String,
    kubelet: String,
    kvol: String,
    /// The two files' bytes, for a content difference.
    contents: Option<(Vec<u8>, Vec<u8>)>,
}

fn compare_trees(kubelet: &BTreeMap<String, Entry>, kvol: &BTreeMap<String, Entry>) -> Vec<Diff> {
    let mut diffs = Vec::new();
    let paths: BTreeSet<&String> = kubelet.keys().chain(kvol.keys()).collect();
    for path in paths {
        let diff = |field: &str, kubelet: String, kvol: String| Diff {
            path: path.clone(),
            field: field.to_string(),
            kubelet,
            kvol,
            contents: None,
        };
        match (kubelet.get(path), kvol.get(path)) {
            (Some(k), Some(v)) => {
                if k.kind != v.kind {
                    diffs.push(diff("type", k.summary(), v.summary()));
                    continue;
                }
                if k.mode != v.mode {
                    diffs.push(diff("mode", format!("{:04o}", k.mode), format!("{:04o}", v.mode)));
                }
                if (k.uid, k.gid) != (v.uid, v.gid) {
                    diffs.push(diff("owner", format!("{}:{}", k.uid, k.gid), format!("{}:{}", v.uid, v.gid)));
                }
                if k.target != v.target {
                    diffs.push(diff(
                        "link",
                        k.target.clone().unwrap_or_default(),
                        v.target.clone().unwrap_or_default(),
                    ));
                }
                if k.content != v.content {
                    let (kc, vc) =
                        (k.content.clone().unwrap_or_default(), v.content.clone().unwrap_or_default());
                    diffs.push(Diff {
                        contents: Some((kc.clone(), vc.clone())),
                        ..diff("content", show(&kc), show(&vc))
                    });
                }
            }
            (Some(k), None) => diffs.push(diff("entry", k.summary(), "(absent)".into())),
            (None, Some(v)) => diffs.push(diff("entry", "(absent)".into(), v.summary())),
            (None, None) => {}
        }
    }
    diffs
}

fn compare_mounts(kubelet: &BTreeMap<String, String>, kvol: &BTreeMap<String, String>) -> Vec<Diff> {
    let paths: BTreeSet<&String> = kubelet.keys().chain(kvol.keys()).collect();
    paths
        .into_iter()
        .filter(|p| kubelet.get(*p) != kvol.get(*p))
        .map(|p| Diff {
            path: p.clone(),
            field: "mount".into(),
            kubelet: kubelet.get(p).cloned().unwrap_or_else(|| "(not a mount: on disk)".into()),
            kvol: kvol.get(p).cloned().unwrap_or_else(|| "(not a mount: on disk)".into()),
            contents: None,
        })
        .collect()
}

/// Base64url without padding (a JWT's parts), decoded.
fn base64url(text: &str) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u32, 0);
    for c in text.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'-' | b'+' => 62,
            b'_' | b'/' => 63,
            b'=' => break,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    Some(out)
}

/// A token's claims with what must differ between two pods taken out: the pod's name and uid
/// become `<pod>`/`<uid>`, the times become lifetimes relative to `iat`.
fn token_claims(token: &[u8], pod_name: &str, pod_uid: &str) -> serde_json::Value {
    let text = String::from_utf8_lossy(token);
    let Some(payload) = text.split('.').nth(1).and_then(base64url) else {
        return json!({"unreadable token": text.to_string()});
    };
    let Ok(mut claims) = serde_json::from_slice::<serde_json::Value>(&payload) else {
        return json!({"unreadable payload": String::from_utf8_lossy(&payload).to_string()});
    };
    let iat = claims["iat"].as_i64().unwrap_or_default();
    for key in ["exp", "nbf"] {
        if let Some(t) = claims[key].as_i64() {
            claims[key] = json!(format!("iat{:+}", t - iat));
        }
    }
    claims["iat"] = json!("<iat>");
    let k8s = &mut claims["kubernetes.io"];
    if let Some(t) = k8s["warnafter"].as_i64() {
        k8s["warnafter"] = json!(format!("iat{:+}", t - iat));
    }
    if k8s["pod"]["name"] == pod_name {
        k8s["pod"]["name"] = json!("<pod>");
    }
    if k8s["pod"]["uid"] == pod_uid {
        k8s["pod"]["uid"] = json!("<uid>");
    }
    claims
}

/// The downward API's `metadata.annotations` file as kvol should write it from the kubelet's:
/// without the annotations the kubelet adds to the pod it holds.
fn without_kubelet_annotations(content: &[u8]) -> Vec<u8> {
    String::from_utf8_lossy(content)
        .split('\n')
        .filter(|line| {
            !line.starts_with("kubernetes.io/config.seen=")
                && !line.starts_with("kubernetes.io/config.source=")
        })
        .collect::<Vec<_>>()
        .join("\n")
        .into_bytes()
}

/// A known difference between the kubelet's tree and kvol's: which diffs it covers and why.
#[derive(Debug)]
struct Known {
    /// Found by this test and reported, not yet decided: kvol is to be changed (then this
    /// entry goes) or the difference documented (then it becomes an intended one). Printed as
    /// `OPEN`, and listed at the end when it no longer matches anything.
    open: bool,
    reason: &'static str,
    covers: fn(&Diff) -> bool,
}

/// The first column of the pod-volume tables.
const TREE_PATHS: &str = "path (. = pods/<uid>/volumes)";

/// Every known difference between the pod volumes. A difference none of these covers fails the
/// test.
const KNOWN: &[Known] = &[
    // A projected token file: each side asks the TokenRequest API for its own token (bound to
    // its own pod, issued at its own time). What the tokens say is compared separately, with
    // the pod's name and uid and the times taken out (the "token claims" table).
    Known {
        open: false,
        reason: "each side mints its own token; claims compared separately",
        covers: |d| d.field == "content" && d.path.ends_with("/token"),
    },
    // The downward API's metadata.annotations: the kubelet adds kubernetes.io/config.seen (when
    // it first saw the pod) and kubernetes.io/config.source ("api") to the pod it holds and
    // writes them with the pod's own; kvol writes the API object's annotations. Covered only
    // when those two lines are the whole difference.
    Known {
        open: false,
        reason: "kubelet's own config.seen/config.source annotations",
        covers: |d| {
            d.field == "content"
                && d.path.ends_with("/annotations")
                && d.contents
                    .as_ref()
                    .is_some_and(|(kubelet, kvol)| without_kubelet_annotations(kubelet) == *kvol)
        },
    },
    // On purpose (README, "Differences from upstream"): kvol's tmpfs mounts are nosuid,nodev
    // (SystemMounter::mount adds both to every mount); the kubelet's carry only size=. Same
    // size. A container's bind mount keeps the flags: under kvol a setuid program or a device
    // node on an emptyDir of medium Memory does not work (for the four kinds of API objects no
    // file can be setuid: modes are at most 0777).
    Known {
        open: false,
        reason: "tmpfs mounted nosuid,nodev on purpose; kubelet's without",
        covers: |d| {
            d.field == "mount" && d.kvol == d.kubelet.replacen("tmpfs rw,", "tmpfs rw,nosuid,nodev,", 1)
        },
    },
];

/// Prints the table of differences (`path_header` heads the first column); returns those no
/// entry of `known` covers. `matched` counts how many diffs each entry covered.
fn report(
    title: &str,
    path_header: &str,
    diffs: &[Diff],
    known: &[Known],
    matched: &mut [usize],
) -> Vec<String> {
    let mut unexpected = Vec::new();
    let rows: Vec<[String; 5]> = diffs
        .iter()
        .map(|d| {
            let verdict = match known.iter().position(|k| (k.covers)(d)) {
                Some(i) => {
                    matched[i] += 1;
                    let known = &known[i];
                    format!("{}: {}", if known.open { "OPEN" } else { "allowed" }, known.reason)
                }
                None => {
                    unexpected
                        .push(format!("{} {}: kubelet {} / kvol {}", d.path, d.field, d.kubelet, d.kvol));
                    "UNEXPECTED".to_string()
                }
            };
            [d.path.clone(), d.field.clone(), d.kubelet.clone(), d.kvol.clone(), verdict]
        })
        .collect();
    let header = [path_header, "field", "kubelet", "kvol", "verdict"].map(String::from);
    let mut widths = header.clone().map(|h| h.chars().count());
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |row: &[String; 5]| {
        row.iter()
            .zip(widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect::<Vec<_>>()
            .join(" | ")
            .trim_end()
            .to_string()
    };
    eprintln!("\n== {title}: {} difference(s), {} not known", rows.len(), unexpected.len());
    if !rows.is_empty() {
        eprintln!("{}", line(&header));
        eprintln!("{}", widths.iter().map(|w| "-".repeat(*w)).collect::<Vec<_>>().join("-+-"));
        for row in &rows {
            eprintln!("{}", line(row));
        }
    }
    unexpected
}

/// The volume directories that exist under a pod's directory (`volumes/<plugin>/<volume>`).
fn volume_dirs_left(pod_dir: &Path) -> Vec<String> {
    let mut left = Vec::new();
    for plugin in std::fs::read_dir(pod_dir.join("volumes")).into_iter().flatten().flatten() {
        for volume in std::fs::read_dir(plugin.path()).into_iter().flatten().flatten() {
            left.push(format!(
                "{}/{}",
                plugin.file_name().to_string_lossy(),
                volume.file_name().to_string_lossy()
            ));
        }
    }
    left
}

/// Whether every volume of the pod is set up on disk: each atomic-writer volume has its
/// `..data` link, each emptyDir its directory.
fn volumes_on_disk(volumes: &Path) -> bool {
    VOLUME_DIRS.iter().all(|(dir, atomic)| {
        let dir = volumes.join(dir);
        if *atomic { std::fs::symlink_metadata(dir.join("..data")).is_ok() } else { dir.is_dir() }
    })
}

/// The entries of a pod's directory outside `volumes/`, the directory itself as `.`
/// (informational: the runtime's files, plugin markers), normalised as the volume tree is.
fn outside_volumes(pod_dir: &Path) -> Vec<String> {
    walk(pod_dir)
        .into_iter()
        .filter(|(path, _)| path != "./volumes" && !path.starts_with("./volumes/"))
        .map(|(path, e)| format!("{path} {}", e.summary()))
        .collect()
}

fn seconds(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

/// The peers' binaries, as the environment names them.
#[derive(Debug)]
struct Peers {
    apiserver: PathBuf,
    etcd: PathBuf,
    kubelet: PathBuf,
    fakecri: PathBuf,
}

impl Peers {
    /// The four binaries, or `None` with the reason printed (`compare`: what the test compares).
    fn from_env(compare: &str) -> Option<Peers> {
        let (apiserver, etcd) = support::binaries()?;
        let (Some(kubelet), Some(fakecri)) =
            (std::env::var_os("KVOL_KUBELET"), std::env::var_os("KVOL_FAKECRI"))
        else {
            eprintln!(
                "skipped: set KVOL_KUBELET (a kubelet v1.26 binary) and KVOL_FAKECRI (the in-memory CRI, \
                 `fakecri --listen <socket>`) to compare {compare}"
            );
            return None;
        };
        Some(Peers { apiserver, etcd, kubelet: kubelet.into(), fakecri: fakecri.into() })
    }
}

/// What both nodes share: this thread in a private mount namespace (the kubelet's mounts, the
/// agent's and the host directories bound over are seen here and nowhere else), the sysctls
/// saved, a real kube-apiserver and its admin client, the scratch root with `/var/log` and
/// `/var/lib/kubelet` bound over from it, and kvol's Node object. Fields drop in order: the
/// host directories first, then the sysctls (after every process is stopped), the turn last.
struct Cluster {
    _host_dirs: HostDirs,
    _dir: kvol_test_support::ScratchRoot,
    scratch: PathBuf,
    client: kube::Client,
    server: support::ApiServer,
    runtime: tokio::runtime::Runtime,
    sysctls: Sysctls,
    /// One test of this file at a time: each saves the sysctls before its kubelet changes
    /// them, and two at once would save (and put back) the other kubelet's values.
    _turn: std::sync::MutexGuard<'static, ()>,
}

/// Whose turn it is to run a kubelet (see [`Cluster`]).
static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl Cluster {
    fn start(peers: &Peers) -> Cluster {
        // A test that failed holding the turn put everything back as it unwound.
        let turn = TURN.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        nix::sched::unshare(CloneFlags::CLONE_NEWNS).expect("unshare the mount namespace (needs root)");
        nix::mount::mount(
            None::<&str>,
            "/",
            None::<&str>,
            MsFlags::MS_REC | MsFlags::MS_PRIVATE,
            None::<&str>,
        )
        .expect("make every mount private");
        let sysctls = Sysctls::save();
        let runtime =
            tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let server = support::ApiServer::start(&peers.apiserver, &peers.etcd);
        let client = runtime.block_on(server.client());
        let dir = kvol_test_support::ScratchRoot::new();
        let scratch = dir.path().to_path_buf();
        let host_dirs = HostDirs::bind(&scratch);
        runtime.block_on(support::create(
            &Api::<Node>::all(client.clone()),
            json!({"metadata": {"name": KVOL_NODE}}),
        ));
        Cluster { _host_dirs: host_dirs, _dir: dir, scratch, client, server, runtime, sysctls, _turn: turn }
    }
}

/// The two nodes: fakecri and the kubelet as [`KUBELET_NODE`] (root `<scratch>/kubelet`), and
/// `kvol agent --no-components --kubeconfig` as [`KVOL_NODE`] (root `<scratch>/kvol`). Fields
/// drop in order: the agent, the kubelet, fakecri.
struct Nodes {
    agent: Process,
    kubelet: Process,
    fakecri: Process,
    kubelet_root: PathBuf,
    kvol_root: PathBuf,
    kubelet_log: PathBuf,
}

impl Nodes {
    /// Starts both nodes and waits until both are ready: the kubelet's node Ready, the agent's
    /// status written.
    fn start(cluster: &Cluster, peers: &Peers) -> Nodes {
        let scratch = &cluster.scratch;
        // fakecri, then the kubelet (as /work/peers/oracle/run-kubelet-oracle.sh starts it).
        for sub in ["cri", "kubelet", "kubelet-pki", "manifests", "flexvolume", "kvol"] {
            std::fs::create_dir_all(scratch.join(sub)).unwrap();
        }
        let socket = scratch.join("cri/cri.sock");
        let mut fakecri_cmd = Command::new(&peers.fakecri);
        fakecri_cmd.arg("--listen").arg(&socket);
        let mut fakecri =
            Process::spawn("fakecri", fakecri_cmd, scratch.join("fakecri.log"), Duration::from_secs(5));
        let start = Instant::now();
        while !socket.exists() {
            fakecri.assert_running();
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "fakecri never listened on {}",
                socket.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let kubelet_root = scratch.join("kubelet");
        let (port, healthz) = (free_port(), free_port());
        let endpoint = format!("unix://{}", socket.display());
        let mut kubelet_cmd = Command::new(&peers.kubelet);
        kubelet_cmd
            .arg(format!("--kubeconfig={}", cluster.server.kubeconfig.display()))
            .arg(format!("--container-runtime-endpoint={endpoint}"))
            .arg(format!("--image-service-endpoint={endpoint}"))
            .arg(format!("--root-dir={}", kubelet_root.display()))
            .arg(format!("--cert-dir={}", scratch.join("kubelet-pki").display()))
            .args(["--cgroups-per-qos=false", "--enforce-node-allocatable=", "--fail-swap-on=false"])
            .args(["--cgroup-driver=cgroupfs", "--register-node=true"])
            .arg(format!("--hostname-override={KUBELET_NODE}"))
            .arg(format!("--pod-manifest-path={}", scratch.join("manifests").display()))
            .arg(format!("--volume-plugin-dir={}", scratch.join("flexvolume").display()))
            .args(["--read-only-port=0", "--address=127.0.0.1", "--healthz-bind-address=127.0.0.1"])
            .arg(format!("--port={port}"))
            .arg(format!("--healthz-port={healthz}"))
            .args(["--make-iptables-util-chains=false", "--v=2"]);
        let kubelet_log = scratch.join("kubelet.log");
        let kubelet =
            Process::spawn("the kubelet", kubelet_cmd, kubelet_log.clone(), Duration::from_secs(15));

        // kvol's agent for the other node, under its own root.
        let kvol_root = scratch.join("kvol");
        let mut agent_cmd = Command::new(env!("CARGO_BIN_EXE_kvol"));
        agent_cmd
            .args(["agent", "--no-metrics", "--no-components", "--node-name", KVOL_NODE, "--kubeconfig"])
            .arg(&cluster.server.kubeconfig)
            .arg("--root")
            .arg(&kvol_root)
            .env("KVOL_LOG", "info")
            .env_remove("KVOL_CONFIG")
            .env_remove("KVOL_FEATURE_GATES");
        let agent =
            Process::spawn("the agent", agent_cmd, scratch.join("agent.log"), Duration::from_secs(15));
        let mut nodes = Nodes { agent, kubelet, fakecri, kubelet_root, kvol_root, kubelet_log };

        // Both ready before the pods exist: the kubelet's node Ready, the agent's status written.
        let api = Api::<Node>::all(cluster.client.clone());
        let start = Instant::now();
        loop {
            nodes.assert_running();
            let ready = cluster.runtime.block_on(api.get_opt(KUBELET_NODE)).ok().flatten().is_some_and(|n| {
                n.status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
            });
            let agent_up = read_status(&nodes.kvol_root).is_ok_and(|r| r.pid == nodes.agent.child.id());
            if ready && agent_up {
                break;
            }
            assert!(
                start.elapsed() < LIMIT,
                "not ready: kubelet node Ready {ready}, agent status {agent_up}\nkubelet log:\n{}\nagent log:\n{}",
                tail(&nodes.kubelet_log, 30),
                tail(&nodes.agent.log, 30)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!(
            "kubelet node Ready and kvol agent up {} after the kubelet started",
            seconds(start.elapsed())
        );
        nodes
    }

    /// Panics (with the log) when the kubelet or the agent has exited.
    fn assert_running(&mut self) {
        self.kubelet.assert_running();
        self.agent.assert_running();
    }
}

/// Stops everything the test started (the agent, the kubelet, fakecri, then the `drivers`,
/// which the kubelet and the agent may call until they stop), puts the sysctls back, and checks
/// that nothing is left mounted under the scratch root but the kubelet's own bind mount of its
/// root directory (it makes the root rshared and leaves it), which it unmounts.
fn finish(cluster: Cluster, mut nodes: Nodes, drivers: Vec<Process>) {
    let stopped = [nodes.agent.stop(), nodes.kubelet.stop(), nodes.fakecri.stop()];
    eprintln!(
        "stopped: agent in {}, kubelet in {}, fakecri in {}",
        seconds(stopped[0]),
        seconds(stopped[1]),
        seconds(stopped[2])
    );
    for mut driver in drivers {
        let took = driver.stop();
        eprintln!("stopped: {} in {}", driver.what, seconds(took));
    }
    for change in cluster.sysctls.restore() {
        eprintln!("sysctl restored: {change}");
    }
    let left: Vec<PathBuf> = kvol_test_support::mounts_below(&cluster.scratch);
    for mount in left.iter().rev() {
        assert_eq!(mount, &nodes.kubelet_root, "left mounted: {left:?}");
        nix::mount::umount2(mount, MntFlags::MNT_DETACH).expect("unmount the kubelet's root bind mount");
    }
    assert!(kvol_test_support::mounts_below(&cluster.scratch).is_empty());
    drop(cluster);
}

/// How many diffs each known difference covered, and what that means.
fn print_known(known: &[Known], matched: &[usize]) {
    eprintln!("\n== known differences");
    for (known, n) in known.iter().zip(matched) {
        let state = match (known.open, *n) {
            (true, 0) => "OPEN, matched nothing: kvol now does as the kubelet does? then remove the entry",
            (true, _) => "OPEN: found by this test, kvol to be changed or the difference documented",
            (false, _) => "intended",
        };
        eprintln!("{:>2} × {} ({state})", n, known.reason);
    }
}

#[test]
fn kvol_writes_the_pod_volumes_the_real_kubelet_writes() {
    let Some(peers) = Peers::from_env("kvol's pod volumes with the real kubelet's") else { return };
    let cluster = Cluster::start(&peers);
    let (runtime, client) = (&cluster.runtime, cluster.client.clone());

    // The objects the pods reference, created as the oracle script creates them (not applied:
    // apply's last-applied annotation on a pod would show in its downward annotations file).
    let ca = std::fs::read_to_string(cluster.server.dir.path().join("certs/apiserver.crt"))
        .expect("a PEM certificate");
    runtime.block_on(async {
        let accounts = Api::<ServiceAccount>::namespaced(client.clone(), "default");
        support::create(&accounts, json!({"metadata": {"name": "default"}})).await;
        let config_maps = Api::<ConfigMap>::namespaced(client.clone(), "default");
        support::create(
            &config_maps,
            json!({"metadata": {"name": "oracle-cm"}, "data": {"a.txt": "alpha\n", "b.txt": "bravo\n"}}),
        )
        .await;
        support::create(&config_maps, json!({"metadata": {"name": "kube-root-ca.crt"}, "data": {"ca.crt": ca}}))
            .await;
        support::create(
            &Api::<Secret>::namespaced(client.clone(), "default"),
            json!({"metadata": {"name": "oracle-secret"}, "stringData": {"username": "admin", "password": "s3cr3t"}}),
        )
        .await;
    });

    let mut nodes = Nodes::start(&cluster, &peers);
    let (kubelet_root, kvol_root) = (nodes.kubelet_root.clone(), nodes.kvol_root.clone());
    let kubelet_log = nodes.kubelet_log.clone();

    // The two pods, created back to back; each side timed from its own pod's creation.
    let pods = Api::<Pod>::namespaced(client.clone(), "default");
    let kubelet_created = Instant::now();
    let kubelet_uid =
        runtime.block_on(support::create(&pods, pod(KUBELET_POD, KUBELET_NODE))).metadata.uid.expect("a uid");
    let kvol_created = Instant::now();
    let kvol_uid =
        runtime.block_on(support::create(&pods, pod(KVOL_POD, KVOL_NODE))).metadata.uid.expect("a uid");
    let kubelet_pod_dir = kubelet_root.join("pods").join(&kubelet_uid);
    let kvol_pod_dir = kvol_root.join("kubelet/pods").join(&kvol_uid);
    let (kubelet_volumes, kvol_volumes) = (kubelet_pod_dir.join("volumes"), kvol_pod_dir.join("volumes"));
    let kvol_pod_key = format!("default/{KVOL_POD}");

    let (mut kubelet_on_disk, mut kubelet_running, mut kvol_on_disk, mut kvol_published) =
        (None, None, None, None);
    let mut polls = 0u64;
    loop {
        polls += 1;
        if kubelet_on_disk.is_none() && volumes_on_disk(&kubelet_volumes) {
            kubelet_on_disk = Some(kubelet_created.elapsed());
        }
        if kvol_on_disk.is_none() && volumes_on_disk(&kvol_volumes) {
            kvol_on_disk = Some(kvol_created.elapsed());
        }
        if kvol_published.is_none()
            && read_status(&kvol_root).is_ok_and(|r| {
                VOLUMES.iter().all(|v| {
                    r.volumes
                        .iter()
                        .any(|s| s.pod == kvol_pod_key && s.volume == *v && s.phase == Phase::Published)
                })
            })
        {
            kvol_published = Some(kvol_created.elapsed());
        }
        if kubelet_running.is_none() && polls.is_multiple_of(10) {
            let phase = runtime
                .block_on(pods.get_opt(KUBELET_POD))
                .ok()
                .flatten()
                .and_then(|p| p.status)
                .and_then(|s| s.phase);
            if phase.as_deref() == Some("Running") {
                kubelet_running = Some(kubelet_created.elapsed());
            }
        }
        if kubelet_running.is_some()
            && kubelet_on_disk.is_some()
            && kvol_published.is_some()
            && kvol_on_disk.is_some()
        {
            break;
        }
        if kubelet_created.elapsed() > LIMIT {
            panic!(
                "not ready within {LIMIT:?}: kubelet volumes on disk {kubelet_on_disk:?}, pod Running \
                 {kubelet_running:?}; kvol volumes on disk {kvol_on_disk:?}, all published {kvol_published:?}\n\
                 kvol status: {:#?}\nkubelet log:\n{}\nagent log:\n{}",
                read_status(&kvol_root).map(|r| r.volumes),
                tail(&kubelet_log, 40),
                tail(&nodes.agent.log, 40)
            );
        }
        nodes.assert_running();
        std::thread::sleep(Duration::from_millis(10));
    }
    let (kubelet_on_disk, kubelet_running) = (kubelet_on_disk.unwrap(), kubelet_running.unwrap());
    let (kvol_on_disk, kvol_published) = (kvol_on_disk.unwrap(), kvol_published.unwrap());
    eprintln!(
        "\n== from pod creation to volumes ready\n\
         kubelet: every volume on disk (the last `..data` link) after {}, pod Running after {}\n\
         kvol:    every volume on disk (the last `..data` link) after {}, all published in status after {}",
        seconds(kubelet_on_disk),
        seconds(kubelet_running),
        seconds(kvol_on_disk),
        seconds(kvol_published)
    );

    // The trees, once they stay the same for 500 ms (the user-visible links follow `..data`).
    let mut trees = (walk(&kubelet_volumes), walk(&kvol_volumes));
    let start = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let again = (walk(&kubelet_volumes), walk(&kvol_volumes));
        if again == trees || start.elapsed() > Duration::from_secs(30) {
            trees = again;
            break;
        }
        trees = again;
    }
    let (mut kubelet_tree, mut kvol_tree) = trees;
    // The pod's directory itself as `..`: both make it, as they make `volumes/`.
    for (tree, pod_dir) in [(&mut kubelet_tree, &kubelet_pod_dir), (&mut kvol_tree, &kvol_pod_dir)] {
        tree.insert("..".to_string(), entry(pod_dir).expect("the pod directory"));
    }
    let (kubelet_mounts, kvol_mounts) = (mounts(&kubelet_volumes), mounts(&kvol_volumes));

    eprintln!("\n== the kubelet's tree (pods/<uid>/volumes, timestamped names as ..<ts>)");
    for (path, e) in &kubelet_tree {
        eprintln!("{} {path}", e.summary());
    }
    eprintln!("\n== mounts: kubelet");
    for (path, m) in &kubelet_mounts {
        eprintln!("{path}: {m}");
    }
    eprintln!("== mounts: kvol");
    for (path, m) in &kvol_mounts {
        eprintln!("{path}: {m}");
    }

    // What the tokens say, less what must differ between two pods.
    let mut token_diffs = Vec::new();
    for (path, k) in &kubelet_tree {
        let (Some(kc), Some(vc)) = (&k.content, kvol_tree.get(path).and_then(|e| e.content.as_ref())) else {
            continue;
        };
        if !path.ends_with("/token") {
            continue;
        }
        let kclaims = token_claims(kc, KUBELET_POD, &kubelet_uid);
        let vclaims = token_claims(vc, KVOL_POD, &kvol_uid);
        eprintln!("\n== token claims of {path} (normalised)\nkubelet: {kclaims}\nkvol:    {vclaims}");
        if kclaims != vclaims {
            token_diffs.push(Diff {
                path: path.clone(),
                field: "token claims".into(),
                kubelet: kclaims.to_string(),
                kvol: vclaims.to_string(),
                contents: None,
            });
        }
    }

    let mut matched = vec![0; KNOWN.len()];
    let mut unexpected = report(
        "pod volume trees",
        TREE_PATHS,
        &compare_trees(&kubelet_tree, &kvol_tree),
        KNOWN,
        &mut matched,
    );
    unexpected.extend(report("token claims", TREE_PATHS, &token_diffs, KNOWN, &mut matched));
    let mount_diffs = compare_mounts(&kubelet_mounts, &kvol_mounts);
    unexpected.extend(report(
        "mounts (tmpfs or disk, options)",
        TREE_PATHS,
        &mount_diffs,
        KNOWN,
        &mut matched,
    ));
    print_known(KNOWN, &matched);

    // Outside volumes/ (informational, not compared: the kubelet's runtime half writes
    // containers/ and etc-hosts; the kubelet marks each emptyDir it set up, its own and those
    // under the four kinds of API objects, with plugins/kubernetes.io~empty-dir/<name>/ready,
    // which kvol does not write).
    eprintln!("\n== pod directory outside volumes/ (informational)");
    for (side, pods_dir) in
        [("kubelet", &kubelet_root.join("pods")), ("kvol", &kvol_root.join("kubelet/pods"))]
    {
        let pods_dir = entry(pods_dir).map(|e| e.summary()).unwrap_or_default();
        eprintln!("{side}'s pods/ directory: {pods_dir}");
    }
    eprintln!("kubelet:");
    for line in outside_volumes(&kubelet_pod_dir) {
        eprintln!("  {line}");
    }
    eprintln!("kvol:");
    for line in outside_volumes(&kvol_pod_dir) {
        eprintln!("  {line}");
    }

    // Teardown: both pods removed from the API at once (grace 0: no runtime on kvol's node
    // would finish a graceful deletion), each side timed until its volumes, then its pod
    // directory, are gone.
    let now = DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() };
    let deleted = Instant::now();
    runtime.block_on(async {
        pods.delete(KUBELET_POD, &now).await.expect("deleted");
        pods.delete(KVOL_POD, &now).await.expect("deleted");
    });
    let mut gone: [Option<Duration>; 4] = [None; 4];
    loop {
        let sides = [(&kubelet_pod_dir, 0), (&kvol_pod_dir, 2)];
        for (pod_dir, i) in sides {
            if gone[i].is_none()
                && volume_dirs_left(pod_dir).is_empty()
                && SystemMounter.mounts_under(pod_dir).expect("the mount table").is_empty()
            {
                gone[i] = Some(deleted.elapsed());
            }
            if gone[i + 1].is_none() && !pod_dir.exists() {
                gone[i + 1] = Some(deleted.elapsed());
            }
        }
        let kvol_status_clear =
            read_status(&kvol_root).is_ok_and(|r| !r.volumes.iter().any(|v| v.pod == kvol_pod_key));
        if gone.iter().all(Option::is_some) && kvol_status_clear {
            break;
        }
        assert!(
            deleted.elapsed() < LIMIT,
            "teardown not done within {LIMIT:?} ({gone:?}, kvol status clear {kvol_status_clear}); left:\n\
             kubelet: {:?} {:?}\nkvol: {:?} {:?}",
            volume_dirs_left(&kubelet_pod_dir),
            SystemMounter.mounts_under(&kubelet_pod_dir),
            volume_dirs_left(&kvol_pod_dir),
            SystemMounter.mounts_under(&kvol_pod_dir)
        );
        nodes.assert_running();
        std::thread::sleep(Duration::from_millis(20));
    }
    let t = gone.map(|g| seconds(g.unwrap()));
    eprintln!(
        "\n== from pod deletion (grace 0) to teardown\n\
         kubelet: volumes unmounted and removed after {}, pod directory removed after {}\n\
         kvol:    volumes unmounted and removed after {}, pod directory removed after {}",
        t[0], t[1], t[2], t[3]
    );

    finish(cluster, nodes, Vec::new());

    assert!(
        unexpected.is_empty(),
        "{} difference(s) between the kubelet's pod volumes and kvol's that are not known (see the tables above):\n{}",
        unexpected.len(),
        unexpected.join("\n")
    );
}

/// The bundled CSI driver's name, as both nodes run it (each its own `kvol csi-driver`).
const DRIVER: &str = "hostpath.csi.kvol.io";
/// A claim's size before the resizer's steps, as a quantity and in bytes.
const OLD_SIZE: (&str, i64) = ("1Mi", 1 << 20);
/// A claim's size after them.
const NEW_SIZE: (&str, i64) = ("2Mi", 2 << 20);
/// How long a side may take to grow a claim and say so: the kubelet sees a grown PV only when
/// it syncs the pod again (every `--sync-frequency`, 1 min, plus up to half that in jitter).
const GROW_LIMIT: Duration = Duration::from_secs(180);
/// How long after the kubelet's pod is Running the resizer's steps come: past the syncs of the
/// pod's start (the container started, its status written), as for a claim grown under a pod
/// that has been running for a while.
const SETTLE: Duration = Duration::from_secs(10);
/// The condition the external-resizer puts on a claim whose volume it grew and whose node is
/// to grow the filesystem (as its `markPVCAsFSResizeRequired` writes it, time aside).
const PENDING_MESSAGE: &str =
    "Waiting for user to (re-)start a pod to finish file system resize of volume on node.";

/// One node's share of the resize test: its kubelet directory, its own `kvol csi-driver`, and
/// the claim, PV and pod the resizer grows.
#[derive(Debug)]
struct Side {
    /// `kubelet` or `kvol`.
    label: &'static str,
    node: &'static str,
    pod: &'static str,
    claim: &'static str,
    pv: &'static str,
    /// The node's kubelet directory: the kubelet's root, or `<kvol root>/kubelet`.
    kubelet_dir: PathBuf,
    /// The node's driver: how its process is named, where it keeps its volumes.
    driver: &'static str,
    driver_state: PathBuf,
    /// The upstream node-driver-registrar that registers the driver in the node's
    /// `plugins_registry`, where the driver's own registration socket will not do (the
    /// kubelet's); else the driver registers itself.
    registrar: Option<PathBuf>,
}

impl Side {
    /// The driver's CSI socket, where each node looks for it: `plugins/<driver>/csi.sock`.
    fn socket(&self) -> PathBuf {
        self.kubelet_dir.join("plugins").join(DRIVER).join("csi.sock")
    }

    /// Starts this node's driver, registered through the node's `plugins_registry` (by itself
    /// or by the registrar, started once the driver listens), as a driver's DaemonSet would be;
    /// the processes, the registrar first.
    fn start_driver(&self, scratch: &Path) -> Vec<Process> {
        let registration_dir = self.kubelet_dir.join("plugins_registry");
        let mut command = Command::new(env!("CARGO_BIN_EXE_kvol"));
        command
            .args(["csi-driver", "--name", DRIVER, "--node-name", self.node, "--volume-backing", "directory"])
            .arg("--state-dir")
            .arg(&self.driver_state)
            .arg("--csi-socket")
            .arg(self.socket());
        if self.registrar.is_some() {
            command.arg("--no-register");
        } else {
            command.arg("--registration-dir").arg(&registration_dir);
        }
        command.env("KVOL_LOG", "info").env_remove("KVOL_CONFIG");
        let log = scratch.join(format!("driver-{}.log", self.label));
        let mut driver = Process::spawn(self.driver, command, log, Duration::from_secs(5));
        let start = Instant::now();
        while !self.socket().exists() {
            driver.assert_running();
            assert!(start.elapsed() < LIMIT, "{} never listened on {}", self.driver, self.socket().display());
            std::thread::sleep(Duration::from_millis(20));
        }
        let Some(registrar) = &self.registrar else { return vec![driver] };
        let mut command = Command::new(registrar);
        command
            .arg(format!("--csi-address={}", self.socket().display()))
            .arg(format!("--kubelet-registration-path={}", self.socket().display()))
            .arg(format!("--plugin-registration-path={}", registration_dir.display()));
        let log = scratch.join(format!("registrar-{}.log", self.label));
        vec![
            Process::spawn("the kubelet's node-driver-registrar", command, log, Duration::from_secs(5)),
            driver,
        ]
    }

    /// `text` with this side's names written as placeholders: the pod's and the claim's uids,
    /// the node, the PV, the claim, the pod.
    fn normalise(&self, text: &str, uids: &[(&str, &str)]) -> String {
        let mut text = text.to_string();
        for (uid, placeholder) in uids {
            if !uid.is_empty() {
                text = text.replace(uid, placeholder);
            }
        }
        for (name, placeholder) in
            [(self.node, "<node>"), (self.pv, "<pv>"), (self.claim, "<claim>"), (self.pod, "<pod>")]
        {
            text = text.replace(name, placeholder);
        }
        text
    }
}

/// A pod on `node` that mounts claim `claim` (a volume no container mounts the kubelet skips).
fn claim_pod(name: &str, node: &str, claim: &str) -> serde_json::Value {
    json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node,
            "containers": [{
                "name": "main",
                "image": "example.invalid/busybox:oracle",
                "imagePullPolicy": "IfNotPresent",
                "command": ["sleep", "3600"],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}]
            }],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]
        }
    })
}

/// A channel to the driver at `socket`.
async fn csi_channel(socket: &Path) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(format!("unix://{}", socket.display()))
        .unwrap()
        .connect()
        .await
        .unwrap_or_else(|e| panic!("the driver's socket {}: {e}", socket.display()))
}

/// CreateVolume of a filesystem volume `name` of `bytes` on the driver at `socket`; its id.
async fn create_volume(socket: &Path, name: &str, bytes: i64) -> String {
    use kvol_csi::proto::csi::controller_client::ControllerClient;
    use kvol_csi::proto::csi::volume_capability::{AccessMode, AccessType, MountVolume, access_mode::Mode};
    use kvol_csi::proto::csi::{CapacityRange, CreateVolumeRequest, VolumeCapability};
    let capability = VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume::default())),
        access_mode: Some(AccessMode { mode: Mode::SingleNodeWriter as i32 }),
    };
    let answer = ControllerClient::new(csi_channel(socket).await)
        .create_volume(CreateVolumeRequest {
            name: name.into(),
            capacity_range: Some(CapacityRange { required_bytes: bytes, limit_bytes: 0 }),
            volume_capabilities: vec![capability],
            ..CreateVolumeRequest::default()
        })
        .await
        .expect("CreateVolume");
    answer.into_inner().volume.expect("a volume").volume_id
}

/// What the external-resizer does to grow `side`'s claim (volume `handle`) to [`NEW_SIZE`]:
/// ControllerExpandVolume on the driver, the PV's capacity raised, the claim's status marked
/// `FileSystemResizePending`.
async fn resizer_steps(client: &kube::Client, side: &Side, handle: &str) {
    use kvol_csi::proto::csi::controller_client::ControllerClient;
    use kvol_csi::proto::csi::{CapacityRange, ControllerExpandVolumeRequest};
    let answer = ControllerClient::new(csi_channel(&side.socket()).await)
        .controller_expand_volume(ControllerExpandVolumeRequest {
            volume_id: handle.to_string(),
            capacity_range: Some(CapacityRange { required_bytes: NEW_SIZE.1, limit_bytes: 0 }),
            ..ControllerExpandVolumeRequest::default()
        })
        .await
        .expect("ControllerExpandVolume")
        .into_inner();
    assert!(answer.node_expansion_required, "the driver asks the node to grow it: {answer:?}");
    let pv = json!({"spec": {"capacity": {"storage": NEW_SIZE.0}}});
    Api::<PersistentVolume>::all(client.clone())
        .patch(side.pv, &as_test(), &Patch::Merge(&pv))
        .await
        .expect("the PV's capacity raised");
    let now = k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    let pending = json!({"status": {"conditions": [{"type": "FileSystemResizePending", "status": "True",
        "lastTransitionTime": now, "message": PENDING_MESSAGE}]}});
    Api::<PersistentVolumeClaim>::namespaced(client.clone(), "default")
        .patch_status(side.claim, &as_test(), &Patch::Merge(&pending))
        .await
        .expect("the claim marked FileSystemResizePending");
}

/// `value` flattened into dotted paths: a list of objects with a `type` keyed by it (as
/// conditions are), other lists by index; strings bare, other values as JSON.
fn flatten(value: &serde_json::Value, path: &str, out: &mut BTreeMap<String, String>) {
    let join = |key: &str| if path.is_empty() { key.to_string() } else { format!("{path}.{key}") };
    match value {
        serde_json::Value::Object(map) if !map.is_empty() => {
            for (key, value) in map {
                flatten(value, &join(key), out);
            }
        }
        serde_json::Value::Array(items) if !items.is_empty() => {
            for (i, item) in items.iter().enumerate() {
                let key = item["type"].as_str().map_or_else(|| i.to_string(), str::to_string);
                flatten(item, &format!("{path}[{key}]"), out);
            }
        }
        serde_json::Value::String(text) => {
            out.insert(path.to_string(), text.clone());
        }
        other => {
            out.insert(path.to_string(), other.to_string());
        }
    }
}

/// An object (a claim, an Event) as the resize test compares it: flattened, `managedFields`
/// left out (printed apart), every timestamp and `resourceVersion` as `(set)`, an Event's
/// generated name `<object>.<hex>` as `<object>.<hex>`, and `side`'s names and the `uids` as
/// placeholders.
fn comparable(value: &serde_json::Value, side: &Side, uids: &[(&str, &str)]) -> BTreeMap<String, String> {
    let mut flat = BTreeMap::new();
    flatten(value, "", &mut flat);
    flat.into_iter()
        .filter(|(path, _)| !path.starts_with("metadata.managedFields"))
        .map(|(path, value)| {
            let last = path.rsplit('.').next().unwrap_or_default();
            let set = last.ends_with("Timestamp")
                || last.ends_with("Time")
                || last == "resourceVersion"
                || path == "metadata.uid" && uids.iter().all(|(uid, _)| *uid != value);
            let value = if set && value != "null" {
                "(set)".to_string()
            } else {
                let value = side.normalise(&value, uids);
                match value.rsplit_once('.') {
                    Some((object, hex))
                        if path == "metadata.name"
                            && !hex.is_empty()
                            && hex.chars().all(|c| c.is_ascii_hexdigit()) =>
                    {
                        format!("{object}.<hex>")
                    }
                    _ => value,
                }
            };
            (path, value)
        })
        .collect()
}

/// The differences between two flattened objects, one row a field, under `path`.
fn compare_flat(
    path: &str,
    kubelet: &BTreeMap<String, String>,
    kvol: &BTreeMap<String, String>,
) -> Vec<Diff> {
    let fields: BTreeSet<&String> = kubelet.keys().chain(kvol.keys()).collect();
    fields
        .into_iter()
        .filter(|f| kubelet.get(*f) != kvol.get(*f))
        .map(|f| Diff {
            path: path.to_string(),
            field: f.clone(),
            kubelet: kubelet.get(f).cloned().unwrap_or_else(|| "(absent)".into()),
            kvol: kvol.get(f).cloned().unwrap_or_else(|| "(absent)".into()),
            contents: None,
        })
        .collect()
}

/// The Events written since `before` (name → count) about `side`'s claim or pod, each flattened
/// as [`comparable`], keyed `Event on <kind>: <reason>` (`#2`… for a second of the same).
fn new_events(
    events: &[k8s_openapi::api::core::v1::Event],
    before: &BTreeMap<String, i32>,
    side: &Side,
    uids: &[(&str, &str)],
) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    let mut mine: Vec<&k8s_openapi::api::core::v1::Event> = events
        .iter()
        .filter(|e| {
            let name = e.metadata.name.clone().unwrap_or_default();
            before.get(&name) != Some(&e.count.unwrap_or_default())
        })
        .filter(|e| {
            let o = &e.involved_object;
            matches!(
                (o.kind.as_deref(), o.name.as_deref()),
                (Some("PersistentVolumeClaim"), Some(n)) if n == side.claim
            ) || matches!((o.kind.as_deref(), o.name.as_deref()), (Some("Pod"), Some(n)) if n == side.pod)
        })
        .collect();
    mine.sort_by_key(|e| (e.first_timestamp.clone().map(|t| t.0), e.metadata.name.clone()));
    for event in mine {
        let kind = event.involved_object.kind.clone().unwrap_or_default();
        let reason = event.reason.clone().unwrap_or_default();
        let mut key = format!("Event on {kind}: {reason}");
        let mut n = 1;
        while out.contains_key(&key) {
            n += 1;
            key = format!("Event on {kind}: {reason} #{n}");
        }
        let value = serde_json::to_value(event).expect("an Event as JSON");
        out.insert(key, comparable(&value, side, uids));
    }
    out
}

/// The field manager of the test's own writes (the objects, and the resizer's steps done by
/// hand), so that the node's writes stand apart in a claim's managedFields.
const TEST_MANAGER: &str = "oracle-test";

/// Creates the object `body` describes, as [`TEST_MANAGER`].
async fn create_as_test<K>(api: &Api<K>, body: serde_json::Value) -> K
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let object: K = serde_json::from_value(body).expect("a valid object");
    let params = kube::api::PostParams { field_manager: Some(TEST_MANAGER.into()), ..Default::default() };
    api.create(&params, &object).await.expect("created")
}

/// A patch as [`TEST_MANAGER`].
fn as_test() -> PatchParams {
    PatchParams { field_manager: Some(TEST_MANAGER.into()), ..PatchParams::default() }
}

/// The claim's managedFields entries of every writer but the test (the node's), flattened by
/// subresource: `managedFields[<subresource>].manager`, `.operation`, `.fieldsV1`.
fn node_writes(claim: &PersistentVolumeClaim) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for entry in claim.metadata.managed_fields.iter().flatten() {
        if entry.manager.as_deref() == Some(TEST_MANAGER) {
            continue;
        }
        let at = format!("managedFields[{}]", entry.subresource.as_deref().unwrap_or("main"));
        out.insert(format!("{at}.manager"), entry.manager.clone().unwrap_or_default());
        out.insert(format!("{at}.operation"), entry.operation.clone().unwrap_or_default());
        let fields = entry.fields_v1.as_ref().map(|f| f.0.to_string()).unwrap_or_default();
        out.insert(format!("{at}.fieldsV1"), fields);
    }
    out
}

/// Every known difference between the claim and Events the kubelet writes after growing a
/// claim's filesystem and those kvol writes. A difference none of these covers fails the test.
const RESIZE_KNOWN: &[Known] = &[
    // The writer's own name (source component naming aside): kubelet's recorder signs its
    // Events `kubelet`, kvol's `kvol`.
    Known {
        open: false,
        reason: "the writer's name: kubelet's Events come from `kubelet`, kvol's from `kvol`",
        covers: |d| d.path.starts_with("Event on ") && d.field == "source.component",
    },
    // The newer fields of the same: kubelet v1.26's core/v1 recorder leaves reportingComponent
    // and reportingInstance empty; kvol fills them with its name and the node (as the
    // events.k8s.io API asks of a reporter).
    Known {
        open: false,
        reason: "kvol fills reportingComponent/reportingInstance (kvol, the node); kubelet v1.26 leaves them empty",
        covers: |d| {
            d.path.starts_with("Event on ")
                && d.kubelet.is_empty()
                && ((d.field == "reportingComponent" && d.kvol == "kvol")
                    || (d.field == "reportingInstance" && d.kvol == "<node>"))
        },
    },
    // Not about volumes: the kubelet's runtime half warns at every sync of a pod with the
    // ClusterFirst DNS policy that it has no cluster DNS (none is configured here); the sync
    // that finds the grown PV counts one more. kvol runs no pods.
    Known {
        open: false,
        reason: "kubelet's runtime half: MissingClusterDNS at each pod sync; kvol runs no pods",
        covers: |d| d.path == "Event on Pod: MissingClusterDNS" && d.field == "event" && d.kvol == "(none)",
    },
    // The writer's name again: the API server names the field manager of an update after the
    // client's User-Agent (`kubelet/v1.26…`, `kvol/<version>`). What each wrote (fieldsV1) is
    // compared apart and is the same.
    Known {
        open: false,
        reason: "the field manager is the writer's name: `kubelet`, `kvol`",
        covers: |d| {
            d.path == "claim" && d.field.ends_with("].manager") && d.kubelet == "kubelet" && d.kvol == "kvol"
        },
    },
    // Found here (claim and pod): kubelet's involvedObject carries the version of the object
    // it acted on. kvol's Event on the claim does now (as it names the claim's uid, and kvol's
    // writes are the field manager `kvol`: both found here too, fixed); its Event on the pod
    // does not (kvol's pod record keeps no version).
    Known {
        open: true,
        reason: "kvol's Event on the pod has no involvedObject.resourceVersion (kubelet's: the pod's version)",
        covers: |d| {
            d.path.starts_with("Event on Pod")
                && d.field == "involvedObject.resourceVersion"
                && d.kubelet == "(set)"
                && d.kvol == "(absent)"
        },
    },
];

#[test]
fn kvol_writes_a_grown_claims_status_and_events_as_the_real_kubelet_does() {
    use kube::api::ListParams;
    let Some(peers) =
        Peers::from_env("the status and Events kvol writes for a claim it grew with the real kubelet's")
    else {
        return;
    };
    // kubelet v1.26 dials a plugin's registration socket with the socket's path as the HTTP/2
    // `:authority` (the plugin manager's dial sets none; its CSI client says `localhost`), which
    // the h2 server under `kvol csi-driver`'s own registration socket refuses (GetInfo answered
    // RST_STREAM PROTOCOL_ERROR, retried for ever): the kubelet's node registers the driver
    // through the upstream registrar instead, as a driver's DaemonSet would.
    let Some(registrar) = std::env::var_os("KVOL_NODE_DRIVER_REGISTRAR").map(PathBuf::from) else {
        eprintln!(
            "skipped: set KVOL_NODE_DRIVER_REGISTRAR (the upstream node-driver-registrar) to register \
             `kvol csi-driver` with the real kubelet"
        );
        return;
    };
    let cluster = Cluster::start(&peers);
    let (runtime, client, scratch) = (&cluster.runtime, cluster.client.clone(), cluster.scratch.clone());
    runtime.block_on(create_as_test(
        &Api::<CSIDriver>::all(client.clone()),
        json!({"metadata": {"name": DRIVER}, "spec": {"attachRequired": false}}),
    ));
    let mut nodes = Nodes::start(&cluster, &peers);
    let sides = [
        Side {
            label: "kubelet",
            node: KUBELET_NODE,
            pod: "grow-kubelet",
            claim: "data-kubelet",
            pv: "pv-kubelet",
            kubelet_dir: nodes.kubelet_root.clone(),
            driver: "the kubelet's driver",
            driver_state: scratch.join("driver-kubelet"),
            registrar: Some(registrar),
        },
        Side {
            label: "kvol",
            node: KVOL_NODE,
            pod: "grow-kvol",
            claim: "data-kvol",
            pv: "pv-kvol",
            kubelet_dir: nodes.kvol_root.join("kubelet"),
            driver: "kvol's driver",
            driver_state: scratch.join("driver-kvol"),
            registrar: None,
        },
    ];
    let mut drivers: Vec<Process> = sides.iter().flat_map(|s| s.start_driver(&scratch)).collect();
    let start = Instant::now();
    let csinodes = Api::<CSINode>::all(client.clone());
    for side in &sides {
        loop {
            let csinode = runtime.block_on(csinodes.get_opt(side.node)).ok().flatten();
            if csinode.is_some_and(|n| n.spec.drivers.iter().any(|d| d.name == DRIVER)) {
                break;
            }
            assert!(
                start.elapsed() < LIMIT,
                "{DRIVER} never appeared in the CSINode of {}\n{}\nkubelet log:\n{}\nagent log:\n{}",
                side.node,
                drivers
                    .iter()
                    .map(|d| format!("{}'s log:\n{}", d.what, tail(&d.log, 20)))
                    .collect::<Vec<_>>()
                    .join("\n"),
                tail(&nodes.kubelet_log, 30),
                tail(&nodes.agent.log, 30)
            );
            for driver in &mut drivers {
                driver.assert_running();
            }
            nodes.assert_running();
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    eprintln!(
        "both drivers registered (in each node's CSINode) {} after they started",
        seconds(start.elapsed())
    );

    // Per node: a volume, its claim bound to a PV of it (as the PV controller leaves them), and
    // a pod using the claim.
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), "default");
    let pvs = Api::<PersistentVolume>::all(client.clone());
    let pods = Api::<Pod>::namespaced(client.clone(), "default");
    let mut handles = Vec::new();
    let mut claim_uids = Vec::new();
    for side in &sides {
        let handle = runtime.block_on(create_volume(&side.socket(), side.pv, OLD_SIZE.1));
        let claim = runtime.block_on(async {
            let claim = create_as_test(
                &claims,
                json!({"metadata": {"name": side.claim}, "spec": {"accessModes": ["ReadWriteOnce"],
                    "storageClassName": "", "volumeName": side.pv,
                    "resources": {"requests": {"storage": OLD_SIZE.0}}}}),
            )
            .await;
            let bound = json!({"status": {"phase": "Bound", "accessModes": ["ReadWriteOnce"],
                "capacity": {"storage": OLD_SIZE.0}}});
            claims.patch_status(side.claim, &as_test(), &Patch::Merge(&bound)).await.expect("bound");
            create_as_test(
                &pvs,
                json!({"metadata": {"name": side.pv}, "spec": {
                    "capacity": {"storage": OLD_SIZE.0}, "accessModes": ["ReadWriteOnce"],
                    "storageClassName": "", "persistentVolumeReclaimPolicy": "Retain",
                    "claimRef": {"kind": "PersistentVolumeClaim", "apiVersion": "v1", "namespace": "default",
                        "name": side.claim, "uid": claim.metadata.uid},
                    "csi": {"driver": DRIVER, "volumeHandle": handle}}}),
            )
            .await;
            pvs.patch_status(side.pv, &as_test(), &Patch::Merge(&json!({"status": {"phase": "Bound"}})))
                .await
                .expect("the PV bound");
            claim
        });
        handles.push(handle);
        claim_uids.push(claim.metadata.uid.expect("a uid"));
    }
    let created = Instant::now();
    let mut pod_uids = Vec::new();
    for side in &sides {
        let pod = runtime.block_on(create_as_test(&pods, claim_pod(side.pod, side.node, side.claim)));
        pod_uids.push(pod.metadata.uid.expect("a uid"));
    }
    let uids: Vec<[(&str, &str); 2]> = (0..2)
        .map(|i| [(pod_uids[i].as_str(), "<pod uid>"), (claim_uids[i].as_str(), "<claim uid>")])
        .collect();

    // Each node publishes the claim's volume: the kubelet's mount point (and its pod Running),
    // kvol's status.
    let kubelet_pod_dir = nodes.kubelet_root.join("pods").join(&pod_uids[0]);
    let kubelet_mount = kubelet_pod_dir.join("volumes/kubernetes.io~csi").join(sides[0].pv).join("mount");
    let kvol_pod_key = format!("default/{}", sides[1].pod);
    let (mut kubelet_mounted, mut kubelet_running, mut kvol_published) = (None, None, None);
    let mut polls = 0u64;
    while kubelet_mounted.is_none() || kubelet_running.is_none() || kvol_published.is_none() {
        polls += 1;
        if kubelet_mounted.is_none()
            && SystemMounter
                .mounts_under(&kubelet_pod_dir)
                .is_ok_and(|m| m.iter().any(|m| m.target == kubelet_mount))
        {
            kubelet_mounted = Some(created.elapsed());
        }
        if kubelet_running.is_none() && polls.is_multiple_of(10) {
            let pod = runtime.block_on(pods.get_opt(sides[0].pod)).ok().flatten();
            if pod.and_then(|p| p.status).and_then(|s| s.phase).as_deref() == Some("Running") {
                kubelet_running = Some(created.elapsed());
            }
        }
        if kvol_published.is_none()
            && read_status(&nodes.kvol_root).is_ok_and(|r| {
                r.volumes
                    .iter()
                    .any(|v| v.pod == kvol_pod_key && v.volume == "data" && v.phase == Phase::Published)
            })
        {
            kvol_published = Some(created.elapsed());
        }
        assert!(
            created.elapsed() < LIMIT,
            "not published within {LIMIT:?}: kubelet mount {kubelet_mounted:?}, pod Running {kubelet_running:?}; \
             kvol {kvol_published:?}\nkvol status: {:#?}\nkubelet log:\n{}\nagent log:\n{}",
            read_status(&nodes.kvol_root).map(|r| r.volumes),
            tail(&nodes.kubelet_log, 40),
            tail(&nodes.agent.log, 40)
        );
        nodes.assert_running();
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!(
        "\n== from pod creation to the claim's volume published\n\
         kubelet: {} mounted after {}, pod Running after {}\n\
         kvol:    published in its status after {}",
        kubelet_mount.strip_prefix(&nodes.kubelet_root).unwrap_or(&kubelet_mount).display(),
        seconds(kubelet_mounted.unwrap()),
        seconds(kubelet_running.unwrap()),
        seconds(kvol_published.unwrap())
    );

    // Past the pod's start: the kubelet syncs a new pod several times while it starts it, and a
    // PV grown then is found at once; a claim grown under a running pod is found at the next
    // periodic sync. The resizer's steps come [`SETTLE`] after the pod is Running.
    let running_for = created.elapsed().saturating_sub(kubelet_running.unwrap());
    std::thread::sleep(SETTLE.saturating_sub(running_for));

    // The Events so far (the kubelet's about its pod's container), left out of the comparison.
    let events = Api::<k8s_openapi::api::core::v1::Event>::namespaced(client.clone(), "default");
    let list_events = || runtime.block_on(events.list(&ListParams::default())).expect("the Events").items;
    let before: BTreeMap<String, i32> = list_events()
        .into_iter()
        .map(|e| (e.metadata.name.unwrap_or_default(), e.count.unwrap_or_default()))
        .collect();
    let resize_events = |side: &Side, uids: &[(&str, &str)]| new_events(&list_events(), &before, side, uids);

    // The resizer's steps, for the kubelet's claim then kvol's; each side timed from its own
    // first step until its claim's status says the new size with the condition gone, and until
    // both its Events (claim and pod) are there.
    let began = created.elapsed().saturating_sub(kubelet_running.unwrap());
    let mut asked = Vec::new();
    for (side, handle) in sides.iter().zip(&handles) {
        asked.push(Instant::now());
        runtime.block_on(resizer_steps(&client, side, handle));
    }
    let (mut grown, mut told): ([Option<Duration>; 2], [Option<Duration>; 2]) = ([None; 2], [None; 2]);
    while grown.iter().chain(&told).any(Option::is_none) {
        for (i, side) in sides.iter().enumerate() {
            if grown[i].is_none() {
                let claim = runtime.block_on(claims.get(side.claim)).expect("the claim");
                let status = claim.status.unwrap_or_default();
                let capacity = status.capacity.as_ref().and_then(|c| c.get("storage")).map(|q| q.0.as_str());
                let pending =
                    status.conditions.iter().flatten().any(|c| c.type_ == "FileSystemResizePending");
                if capacity == Some(NEW_SIZE.0) && !pending {
                    grown[i] = Some(asked[i].elapsed());
                }
            }
            if told[i].is_none()
                && resize_events(side, &uids[i])
                    .keys()
                    .filter(|k| k.ends_with(": FileSystemResizeSuccessful"))
                    .count()
                    >= 2
            {
                told[i] = Some(asked[i].elapsed());
            }
        }
        assert!(
            asked[0].elapsed() < GROW_LIMIT,
            "not grown and told within {GROW_LIMIT:?} of the resizer's steps: status kubelet {:?}, kvol {:?}; \
             Events kubelet {:?}, kvol {:?}\nclaims: {:#?}\nkubelet log:\n{}\nagent log:\n{}",
            grown[0],
            grown[1],
            told[0],
            told[1],
            sides
                .iter()
                .map(|s| runtime.block_on(claims.get(s.claim)).ok().and_then(|c| c.status))
                .collect::<Vec<_>>(),
            tail(&nodes.kubelet_log, 40),
            tail(&nodes.agent.log, 40)
        );
        nodes.assert_running();
        std::thread::sleep(Duration::from_millis(100));
    }
    // A moment for anything more either writes.
    std::thread::sleep(Duration::from_secs(2));
    eprintln!(
        "\n== from the resizer's steps (ControllerExpandVolume, PV capacity {}, claim FileSystemResizePending; \
         begun {} after the kubelet's pod was Running) to the claim's status written ({} and the condition \
         gone), and to the node's two FileSystemResizeSuccessful Events\n\
         kubelet: status after {}, Events after {}\n\
         kvol:    status after {}, Events after {}",
        NEW_SIZE.0,
        seconds(began),
        NEW_SIZE.0,
        seconds(grown[0].unwrap()),
        seconds(told[0].unwrap()),
        seconds(grown[1].unwrap()),
        seconds(told[1].unwrap())
    );
    eprintln!("the kubelet's log on it:");
    for line in std::fs::read_to_string(&nodes.kubelet_log).unwrap_or_default().lines() {
        if line.contains("NodeExpandVolume") || line.contains("volume_fs_resize") {
            eprintln!("  {}", line.trim_start_matches("??? "));
        }
    }

    // The two claims (with what the node wrote of them, by managedFields) and the Events, side
    // by side.
    let claim_objects: Vec<PersistentVolumeClaim> =
        sides.iter().map(|s| runtime.block_on(claims.get(s.claim)).expect("the claim")).collect();
    let flat_claims: Vec<BTreeMap<String, String>> = sides
        .iter()
        .zip(&claim_objects)
        .zip(&uids)
        .map(|((side, claim), uids)| {
            let mut flat = comparable(&serde_json::to_value(claim).unwrap(), side, uids);
            flat.extend(node_writes(claim));
            flat
        })
        .collect();
    let flat_events: Vec<BTreeMap<String, BTreeMap<String, String>>> =
        sides.iter().zip(&uids).map(|(side, uids)| resize_events(side, uids)).collect();
    for (i, side) in sides.iter().enumerate() {
        eprintln!("\n== {}'s claim after (normalised; managedFields: the node's writes)", side.label);
        for (field, value) in &flat_claims[i] {
            eprintln!("  {field}: {value}");
        }
        eprintln!("== {}'s Events since the resizer's steps (normalised)", side.label);
        for (key, event) in &flat_events[i] {
            eprintln!("  {key}");
            for (field, value) in event {
                eprintln!("    {field}: {value}");
            }
        }
    }
    let mut event_diffs = Vec::new();
    let keys: BTreeSet<&String> = flat_events[0].keys().chain(flat_events[1].keys()).collect();
    for key in keys {
        match (flat_events[0].get(key), flat_events[1].get(key)) {
            (Some(k), Some(v)) => event_diffs.extend(compare_flat(key, k, v)),
            (k, v) => event_diffs.push(Diff {
                path: key.clone(),
                field: "event".into(),
                kubelet: k.map_or("(none)".into(), |e| e.get("message").cloned().unwrap_or_default()),
                kvol: v.map_or("(none)".into(), |e| e.get("message").cloned().unwrap_or_default()),
                contents: None,
            }),
        }
    }
    let mut matched = vec![0; RESIZE_KNOWN.len()];
    let mut unexpected = report(
        "the claim (metadata, spec, status)",
        "object",
        &compare_flat("claim", &flat_claims[0], &flat_claims[1]),
        RESIZE_KNOWN,
        &mut matched,
    );
    unexpected.extend(report(
        "the Events on the claim and the pod",
        "event",
        &event_diffs,
        RESIZE_KNOWN,
        &mut matched,
    ));
    print_known(RESIZE_KNOWN, &matched);

    // Teardown: both pods removed (grace 0), each node unpublishes (and the kubelet unstages).
    let now = DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() };
    let deleted = Instant::now();
    runtime.block_on(async {
        for side in &sides {
            pods.delete(side.pod, &now).await.expect("deleted");
        }
    });
    loop {
        let left: Vec<PathBuf> = kvol_test_support::mounts_below(&scratch)
            .into_iter()
            .filter(|m| *m != nodes.kubelet_root)
            .collect();
        let kvol_clear =
            read_status(&nodes.kvol_root).is_ok_and(|r| !r.volumes.iter().any(|v| v.pod == kvol_pod_key));
        if left.is_empty() && kvol_clear && !kubelet_pod_dir.exists() {
            break;
        }
        assert!(
            deleted.elapsed() < LIMIT,
            "teardown not done within {LIMIT:?}: mounted {left:?}, kvol status clear {kvol_clear}, \
             kubelet pod directory there {}",
            kubelet_pod_dir.exists()
        );
        nodes.assert_running();
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!(
        "\nboth pods torn down (volumes unmounted, the kubelet's staging too) {} after deletion",
        seconds(deleted.elapsed())
    );
    finish(cluster, nodes, drivers);

    assert!(
        unexpected.is_empty(),
        "{} difference(s) between what the kubelet and kvol write after growing a claim that are not known \
         (see the tables above):\n{}",
        unexpected.len(),
        unexpected.join("\n")
    );
}
