//! Manifest → container running through the real agent and its runner on a private containerd (Debian's, with runc): one pod at a time, then many at once, the agent's RSS with them running, and every pod removed → nothing left.
//!
//! `cargo bench -p kvol --bench runner` (root: a private mount namespace of the bench thread
//! that containerd and the agent inherit; needs `containerd`, `ctr`, `runc` and a static
//! busybox, else it says so). One pod (a configMap and an emptyDir, host network, busybox
//! sleeping) is written and removed `KVOL_BENCH_ROUNDS` times (default 5), each timed from the
//! manifest's rename to the runner's status showing its container running; then
//! `KVOL_BENCH_PODS` (default 50) pods are written at once and timed until all run. Numbers are
//! printed, never asserted; the goals (issue 37): ≤ 0.3 s for one pod, 50 pods ≥ 5× sooner than
//! kubelet (kubelet v1.26 takes 0.6–1.05 s for one pod here, its 1 s relist).

#[path = "../tests/support/mod.rs"]
#[allow(dead_code)]
mod support;

use std::time::{Duration, Instant};

use serde_json::Value;
use support::containerd::{Containerd, IMAGE, PAUSE, build_image, tools};

fn pod(i: usize) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: p{i}, namespace: default, uid: 5e4c0000-0000-4000-8000-{i:012}}}
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 0
  containers:
  - name: main
    image: {IMAGE}
    command: [sleep, "100000"]
    volumeMounts: [{{name: cfg, mountPath: /cfg}}, {{name: scratch, mountPath: /scratch}}]
  volumes:
  - {{name: cfg, configMap: {{name: app}}}}
  - {{name: scratch, emptyDir: {{}}}}
"#
    )
}

const CONFIG_MAP: &str =
    "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: app, namespace: default}\ndata: {a: b}\n";

/// The pods the runner's status shows running, and all it shows.
fn running(node: &support::Node) -> (usize, usize) {
    let text = std::fs::read_to_string(node.root.join("runner/pods.json")).unwrap_or_default();
    let status: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    let pods = status["pods"].as_array().cloned().unwrap_or_default();
    let up = pods.iter().filter(|p| p["containers"][0]["state"] == "running").count();
    (up, pods.len())
}

fn wait(node: &support::Node, what: &str, limit: Duration, ok: impl Fn((usize, usize)) -> bool) -> Duration {
    let start = Instant::now();
    while !ok(running(node)) {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}\n{}", node.agent_log());
        std::thread::sleep(Duration::from_millis(5));
    }
    start.elapsed()
}

/// The resident memory of the agent of `root` (the `kvol agent` whose command names it).
fn agent_rss_kib(root: &std::path::Path) -> Option<u64> {
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let command = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if command.contains(" agent ") && command.contains(&*root.to_string_lossy()) {
            let status = std::fs::read_to_string(entry.path().join("status")).ok()?;
            let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
            return line.split_whitespace().nth(1)?.parse().ok();
        }
    }
    None
}

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
    let rounds = std::env::var("KVOL_BENCH_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(5);
    let many: usize = std::env::var("KVOL_BENCH_PODS").ok().and_then(|v| v.parse().ok()).unwrap_or(50);
    let containerd = Containerd::start();
    let image = build_image(containerd.dir.path(), &busybox, &[IMAGE, PAUSE]);
    containerd.ctr(&["images", "import", image.to_str().unwrap()]).expect("the image imports");
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
}
