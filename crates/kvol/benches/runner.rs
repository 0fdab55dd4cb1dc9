//! Manifest → container running through the real agent and its runner on a private containerd (Debian's, with runc): one pod at a time, then many at once, the agent's RSS with them running, and every pod removed → nothing left; then the same for the real kubelet v1.26 on the same containerd, side by side, when `KVOL_KUBELET` names one.
//!
//! `cargo bench -p kvol --bench runner` (root: a private mount namespace of the bench thread
//! that containerd and the agent inherit; needs `containerd`, `ctr`, `runc` and a static
//! busybox, else it says so). One pod (a configMap and an emptyDir, host network, busybox
//! sleeping) is written and removed `KVOL_BENCH_ROUNDS` times (default 5), each timed from the
//! manifest's rename to the runner's status showing its container running; then
//! `KVOL_BENCH_PODS` (default 50) pods are written at once and timed until all run. Numbers are
//! printed, never asserted; the goals (issue 37): ≤ 0.3 s for one pod, 50 pods ≥ 5× sooner than
//! kubelet (kubelet v1.26 takes 0.6–1.05 s for one pod here, its 1 s relist).
//!
//! The kubelet (`KVOL_KUBELET`, set by `. /work/peers/env.sh`; unset, the bench says
//! `kubelet: skipped …` and stops after kvol): not interleaved but after kvol's rounds, with
//! kvol's agent stopped first (a kubelet kills every pod on its runtime it does not know). It
//! runs standalone (no API server, no `--kubeconfig`: static pods from `--pod-manifest-path`)
//! and gets the same pods as `k<i>` with other uids (its pods `k<i>-kubelet-bench`), save that
//! the configMap volume is a downwardAPI volume (a standalone kubelet reads no configMap), and
//! that each one-pod round gives its pod a new uid: a pod re-added under the uid of one whose
//! exited container is still in the runtime (its container GC is a minute away) is to the
//! kubelet a crashed container restarting, held back 10 s, 20 s, 40 s… Timed the same way:
//! from the manifest's rename into its manifest directory to the pod's container running as CRI
//! shows it (`ListContainers`, state running, label `io.kubernetes.pod.name`, every 10 ms); a
//! round ends when the pod is gone (no ready sandbox, no running container, its pod directory
//! removed). Then kvol and the kubelet side by side with the ratios kubelet/kvol, and each one's
//! RSS. What the kubelet would change on the host is kept from it: scratch directories are bound
//! over `/var/log` and `/var/lib/kubelet` in the bench's mount namespace, the sysctls it sets
//! (kernel.panic, kernel.panic_on_oops, vm.overcommit_memory) are put back once it has stopped
//! (SIGTERM, then SIGKILL), its root's bind mount on itself is undone, and the sandboxes it
//! leaves behind are removed through CRI.

#[path = "../tests/support/mod.rs"]
#[allow(dead_code)]
mod support;

#[path = "runner/floor.rs"]
mod floor;

use std::collections::HashSet;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use kvol_cri::{
    ContainerFilter, ContainerState, ContainerStateValue, CriClient, Deadlines, ListContainersRequest,
    ListPodSandboxRequest, PodSandboxFilter, PodSandboxState, PodSandboxStateValue, RemovePodSandboxRequest,
    StopPodSandboxRequest,
};
use serde_json::Value;
use support::containerd::{Containerd, IMAGE, tools};
use support::footprint::vm_rss_kib;
use support::kubelet_host::{Kubelet, KubeletSide, kubelet_binary};

/// A pod of busybox sleeping on the host network, mounting the volume `cfg` (of `source`) and an
/// emptyDir.
fn manifest(name: &str, uid: &str, source: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: default, uid: {uid}}}
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 0
  containers:
  - name: main
    image: {IMAGE}
    command: [sleep, "100000"]
    volumeMounts: [{{name: cfg, mountPath: /cfg}}, {{name: scratch, mountPath: /scratch}}]
  volumes:
  - {{name: cfg, {source}}}
  - {{name: scratch, emptyDir: {{}}}}
"#
    )
}

/// kvol's pod `p<i>`, its configMap from the manifest directory.
fn pod(i: usize) -> String {
    manifest(&format!("p{i}"), &format!("5e4c0000-0000-4000-8000-{i:012}"), "configMap: {name: app}")
}

const CONFIG_MAP: &str =
    "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: app, namespace: default}\ndata: {a: b}\n";

/// What one side measured: one pod's times (sorted), all pods running, its RSS idle and then.
struct Figures {
    one: Vec<Duration>,
    all_up: Duration,
    idle_kib: Option<u64>,
    rss_kib: Option<u64>,
}

/// The pods the runner's status shows running, and all it shows.
fn running(node: &support::Node) -> (usize, usize) {
    let text = std::fs::read_to_string(node.root.join("runner/pods.json")).unwrap_or_default();
    let status: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    let pods = status["pods"].as_array().cloned().unwrap_or_default();
    let up = pods.iter().filter(|p| p["containers"][0]["state"] == "running").count();
    (up, pods.len())
}

/// Polls the runner's status every 5 ms until `ok`; how long that took.
fn wait(node: &support::Node, what: &str, limit: Duration, ok: impl Fn((usize, usize)) -> bool) -> Duration {
    let start = Instant::now();
    while !ok(running(node)) {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}\n{}", node.agent_log());
        std::thread::sleep(Duration::from_millis(5));
    }
    start.elapsed()
}

/// The resident memory of the agent of `root` (the `kvol agent` whose command names it).
fn agent_rss_kib(root: &Path) -> Option<u64> {
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let command = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if command.contains(" agent ") && command.contains(&*root.to_string_lossy()) {
            return vm_rss_kib(entry.file_name().to_str()?.parse().ok()?);
        }
    }
    None
}

/// The bench's count of something from the environment, or `default`.
fn env_count(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The bench: containerd and its image, kvol's side, then the kubelet's and the table.
fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let busybox = match tools() {
        Ok(busybox) => busybox,
        Err(why) => {
            println!("skipped: {why}");
            return;
        }
    };
    support::enter_private_mount_namespace();
    let rounds = env_count("KVOL_BENCH_ROUNDS", 5);
    let many = env_count("KVOL_BENCH_PODS", 50);
    let containerd = Containerd::with_image(&busybox);
    let kvol = kvol_side(&containerd, rounds, many);
    let floor = floor::cri_floor(&containerd, rounds, many);
    let kubelet = match kubelet_binary() {
        Ok(binary) => kubelet_side(&containerd, &binary, rounds, many),
        Err(why) => {
            println!("kubelet: skipped ({why})");
            None
        }
    };
    print_table(&kvol, &floor, kubelet.as_ref(), many);
}

/// kvol's rounds through the real agent (stopped at the end): one pod, then `many` at once.
fn kvol_side(containerd: &Containerd, rounds: usize, many: usize) -> Figures {
    let mut node = support::Node::new();
    node.agent_args =
        vec!["--container-runtime-endpoint".into(), containerd.endpoint(), "--no-components".into()];
    node.start();
    node.runtime_socket();
    node.write("cm.yaml", CONFIG_MAP);
    let idle = agent_rss_kib(&node.root);

    let mut one = Vec::new();
    for _ in 0..rounds {
        node.write("p0.yaml", &pod(0));
        one.push(wait(&node, "one pod running", Duration::from_secs(60), |(up, _)| up == 1));
        node.remove("p0.yaml");
        wait(&node, "one pod gone", Duration::from_secs(60), |(_, all)| all == 0);
    }
    one.sort();
    println!(
        "one pod: manifest → container running, median {:.0?} (min {:.0?}, max {:.0?}) over {rounds} rounds",
        one[one.len() / 2],
        one[0],
        one[one.len() - 1]
    );

    let written = Instant::now();
    for i in 0..many {
        node.write(&format!("p{i}.yaml"), &pod(i));
    }
    wait(&node, "all pods running", Duration::from_secs(600), |(up, _)| up == many);
    let all_up = written.elapsed();
    let rss = agent_rss_kib(&node.root);
    println!(
        "{many} pods written at once → all running {:.2?} after the first manifest; agent RSS {} KiB idle, {} KiB with {many} running",
        all_up,
        idle.unwrap_or(0),
        rss.unwrap_or(0)
    );
    let removed = Instant::now();
    for i in 0..many {
        node.remove(&format!("p{i}.yaml"));
    }
    wait(&node, "all pods gone", Duration::from_secs(600), |(_, all)| all == 0);
    println!(
        "{many} pods removed → nothing of them left in {:.2?} (containers: {})",
        removed.elapsed(),
        containerd.containers().len()
    );
    Figures { one, all_up, idle_kib: idle, rss_kib: rss }
}

// The kubelet side.

/// The kubelet's node name: its static pod `k<i>` is `k<i>-kubelet-bench` to CRI.
const KUBELET_NODE: &str = "kubelet-bench";
/// The kubelet's pod's volume `cfg`: a downwardAPI volume (the same atomic writer as a
/// configMap's), since a kubelet without an API server cannot read configMaps.
const KUBELET_CFG: &str = "downwardAPI: {items: [{path: a, fieldRef: {fieldPath: metadata.name}}]}";
/// The label CRI names a pod by.
const POD_NAME: &str = "io.kubernetes.pod.name";

/// The uid of the kubelet's pod `k<i>` of generation `generation` (apart from kvol's uids): each
/// of its one-pod rounds is a generation of its own, the pods written at once generation 0.
fn kubelet_uid(i: usize, generation: usize) -> String {
    format!("6b1e{generation:04x}-0000-4000-8000-{i:012}")
}

/// The kubelet's pod `k<i>`: kvol's `p<i>` under another name and uid, with [`KUBELET_CFG`].
fn kubelet_pod(i: usize, generation: usize) -> String {
    manifest(&format!("k{i}"), &kubelet_uid(i, generation), KUBELET_CFG)
}

/// Whether the CRI pod name is one of the kubelet's static pods.
fn is_kubelets(pod_name: &str) -> bool {
    pod_name.strip_suffix(KUBELET_NODE).is_some_and(|rest| rest.ends_with('-'))
}

/// The kubelet's command: standalone (no `--kubeconfig`), static pods from
/// `<dir>/kubelet-manifests`, all it keeps under `dir`.
fn kubelet_command(binary: &Path, dir: &Path, endpoint: &str, many: usize) -> Command {
    std::fs::create_dir_all(dir.join("kubelet-manifests")).expect("the manifest directory");
    let mut command = support::kubelet_host::kubelet_command(binary, dir, endpoint, KUBELET_NODE);
    command
        .arg("--pod-manifest-path")
        .arg(dir.join("kubelet-manifests"))
        .args(["--register-node=false", "--file-check-frequency", "1s"])
        .args(["--max-pods", &(many + 10).max(110).to_string()]);
    command
}

/// The standalone kubelet's own steps: its readiness and its manifests.
impl Kubelet {
    /// Waits until its sync loop has run (the runtime found ready) and its volume reconciler
    /// has started: then a pod written is a pod it takes at once.
    fn wait_ready(&mut self) {
        let log = self.dir.join("kubelet.log");
        self.wait("ready", Duration::from_secs(60), || {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            text.contains(r#""SyncLoop ADD" source="file""#)
                && text.contains("Reconciler: start to sync state")
        });
    }

    /// Writes the pod `k<i>` of `generation` into its manifest directory: a hidden file (which
    /// it ignores) renamed into place.
    fn write(&self, i: usize, generation: usize) {
        let dir = self.dir.join("kubelet-manifests");
        let tmp = dir.join(format!(".k{i}.yaml.tmp"));
        std::fs::write(&tmp, kubelet_pod(i, generation)).unwrap();
        std::fs::rename(&tmp, dir.join(format!("k{i}.yaml"))).unwrap();
    }

    /// Removes the pod `k<i>`'s manifest.
    fn remove(&self, i: usize) {
        std::fs::remove_file(self.dir.join(format!("kubelet-manifests/k{i}.yaml"))).unwrap();
    }
}

/// A CRI client of the private containerd, on a tokio runtime of its own (the bench is not
/// async).
struct Cri {
    runtime: tokio::runtime::Runtime,
    client: CriClient,
}

impl Cri {
    /// A client of `endpoint`.
    fn new(endpoint: &str) -> Cri {
        let runtime =
            tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a tokio runtime");
        let client = {
            let _inside = runtime.enter();
            CriClient::new(endpoint, Deadlines::default()).expect("a CRI client")
        };
        Cri { runtime, client }
    }

    /// The kubelet's pods with a running container, among those `pod_name` (if any) selects.
    fn running(&self, pod_name: Option<&str>) -> HashSet<String> {
        let filter = ContainerFilter {
            state: Some(ContainerStateValue { state: ContainerState::ContainerRunning as i32 }),
            label_selector: pod_name
                .map(|name| (POD_NAME.to_string(), name.to_string()))
                .into_iter()
                .collect(),
            ..Default::default()
        };
        let request = ListContainersRequest { filter: Some(filter) };
        let containers = self.runtime.block_on(self.client.list_containers(request));
        let containers = containers.map(|r| r.containers).unwrap_or_default();
        containers.iter().filter_map(|c| c.labels.get(POD_NAME)).filter(|n| is_kubelets(n)).cloned().collect()
    }

    /// The ids of the kubelet's pods' sandboxes, the ready ones or all.
    fn sandboxes(&self, ready_only: bool) -> Vec<String> {
        let ready = PodSandboxStateValue { state: PodSandboxState::SandboxReady as i32 };
        let filter = PodSandboxFilter { state: ready_only.then_some(ready), ..Default::default() };
        let request = ListPodSandboxRequest { filter: Some(filter) };
        let sandboxes = self.runtime.block_on(self.client.list_pod_sandbox(request));
        let sandboxes = sandboxes.map(|r| r.items).unwrap_or_default();
        let kubelets = |s: &&kvol_cri::PodSandbox| s.labels.get(POD_NAME).is_some_and(|n| is_kubelets(n));
        sandboxes.iter().filter(kubelets).map(|s| s.id.clone()).collect()
    }

    /// Stops and removes every sandbox of the kubelet's pods (with their containers); how many.
    fn remove_kubelets_sandboxes(&self) -> usize {
        let ids = self.sandboxes(false);
        for id in &ids {
            let stop = StopPodSandboxRequest { pod_sandbox_id: id.clone() };
            if let Err(e) = self.runtime.block_on(self.client.stop_pod_sandbox(stop)) {
                eprintln!("kubelet: stop sandbox {id}: {e}");
            }
            let remove = RemovePodSandboxRequest { pod_sandbox_id: id.clone() };
            if let Err(e) = self.runtime.block_on(self.client.remove_pod_sandbox(remove)) {
                eprintln!("kubelet: remove sandbox {id}: {e}");
            }
        }
        ids.len()
    }

    /// Whether the kubelet's pods are all gone: no ready sandbox, no running container, and no
    /// pod directory left under `pods` (the kubelet has forgotten them).
    fn all_gone(&self, pods: &Path) -> bool {
        let dirs = std::fs::read_dir(pods).map(|d| d.count()).unwrap_or(0);
        dirs == 0 && self.sandboxes(true).is_empty() && self.running(None).is_empty()
    }
}

/// The kubelet's rounds (after kvol's, on the same containerd): one pod, then `many` at once;
/// `None`, said, when another kubelet runs all along.
fn kubelet_side(containerd: &Containerd, binary: &Path, rounds: usize, many: usize) -> Option<Figures> {
    let side = KubeletSide::start(|dir| kubelet_command(binary, dir, &containerd.endpoint(), many));
    let mut side = match side {
        Ok(side) => side,
        Err(why) => {
            println!("kubelet: skipped ({why})");
            return None;
        }
    };
    let started = Instant::now();
    side.kubelet.wait_ready();
    println!("kubelet: {} ready in {:.2?}", binary.display(), started.elapsed());
    let cri = Cri::new(&containerd.endpoint());
    let idle = vm_rss_kib(side.kubelet.pid());
    let one = kubelet_rounds(&mut side.kubelet, &cri, rounds);
    println!(
        "kubelet: one pod: manifest → container running, median {:.0?} (min {:.0?}, max {:.0?}) over {rounds} rounds",
        one[one.len() / 2],
        one[0],
        one[one.len() - 1]
    );
    let (all_up, rss) = kubelet_many(&mut side.kubelet, &cri, many, idle);
    let stopped = side.kubelet.stop();
    let removed = cri.remove_kubelets_sandboxes();
    println!(
        "kubelet: stopped {stopped:.2?} after SIGTERM; its {removed} sandboxes left then removed through CRI (containers: {})",
        containerd.containers().len()
    );
    drop(side);
    Some(Figures { one, all_up, idle_kib: idle, rss_kib: rss })
}

/// One pod, `rounds` times (a new uid each time): written, timed until its container runs,
/// removed, waited for until gone.
fn kubelet_rounds(kubelet: &mut Kubelet, cri: &Cri, rounds: usize) -> Vec<Duration> {
    let name = format!("k0-{KUBELET_NODE}");
    let pods = kubelet.root().join("pods");
    let mut one = Vec::new();
    for round in 1..=rounds {
        kubelet.write(0, round);
        one.push(
            kubelet.wait("one pod running", Duration::from_secs(60), || !cri.running(Some(&name)).is_empty()),
        );
        kubelet.remove(0);
        kubelet.wait("one pod gone", Duration::from_secs(60), || cri.all_gone(&pods));
    }
    one.sort();
    one
}

/// `many` pods written at once and timed until all run, the kubelet's RSS then (said, with
/// `idle`), all removed and waited for until gone; the time and the RSS.
fn kubelet_many(kubelet: &mut Kubelet, cri: &Cri, many: usize, idle: Option<u64>) -> (Duration, Option<u64>) {
    let pods = kubelet.root().join("pods");
    let written = Instant::now();
    for i in 0..many {
        kubelet.write(i, 0);
    }
    kubelet.wait("all pods running", Duration::from_secs(600), || cri.running(None).len() == many);
    let all_up = written.elapsed();
    let rss = vm_rss_kib(kubelet.pid());
    println!(
        "kubelet: {many} pods written at once → all running {:.2?} after the first manifest; kubelet RSS {} KiB idle, {} KiB with {many} running",
        all_up,
        idle.unwrap_or(0),
        rss.unwrap_or(0)
    );
    let removed = Instant::now();
    for i in 0..many {
        kubelet.remove(i);
    }
    kubelet.wait("all pods gone", Duration::from_secs(600), || cri.all_gone(&pods));
    println!("kubelet: {many} pods removed → all stopped and forgotten in {:.2?}", removed.elapsed());
    (all_up, rss)
}

/// kvol, the runtime's floor and the kubelet (when it ran) side by side, with the ratios to
/// kvol.
fn print_table(kvol: &Figures, floor: &floor::Floor, kubelet: Option<&Figures>, many: usize) {
    let ms = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1e3);
    let ratio = |a: Duration, b: Option<Duration>| {
        b.map(|b| format!("{:.1}×", b.as_secs_f64() / a.as_secs_f64())).unwrap_or_else(|| "-".into())
    };
    let row = |what: &str, a: Duration, f: Duration, b: Option<Duration>| {
        let kubelet = b.map(ms).unwrap_or_else(|| "-".into());
        println!(
            "{what:<30} {:>12} {:>12} {:>12} {:>14} {:>12}",
            ms(a),
            ms(f),
            kubelet,
            ratio(a, b),
            format!("{:.0}%", 100.0 * f.as_secs_f64() / a.as_secs_f64())
        );
    };
    let median = |one: &[Duration]| one[one.len() / 2];
    println!(
        "\n{:<30} {:>12} {:>12} {:>12} {:>14} {:>12}",
        "", "kvol", "cri floor", "kubelet", "kubelet/kvol", "floor/kvol"
    );
    row(
        &format!("one pod, median of {}", kvol.one.len()),
        median(&kvol.one),
        median(&floor.one),
        kubelet.map(|k| median(&k.one)),
    );
    row("one pod, min", kvol.one[0], floor.one[0], kubelet.map(|k| k.one[0]));
    row(&format!("{many} pods, all running"), kvol.all_up, floor.all_up, kubelet.map(|k| k.all_up));
    let kib_row = |what: &str, a: Option<u64>, b: Option<u64>| {
        let ratio =
            a.zip(b).map(|(a, b)| format!("{:.1}×", b as f64 / a as f64)).unwrap_or_else(|| "-".into());
        let kib = |v: Option<u64>| v.map(|v| format!("{v} KiB")).unwrap_or_else(|| "-".into());
        println!("{what:<30} {:>12} {:>12} {:>12} {:>14}", kib(a), "", kib(b), ratio);
    };
    kib_row("RSS idle", kvol.idle_kib, kubelet.and_then(|k| k.idle_kib));
    kib_row(&format!("RSS with {many} running"), kvol.rss_kib, kubelet.and_then(|k| k.rss_kib));
}
