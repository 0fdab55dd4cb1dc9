//! Claim edited → the new size in the pod's filesystem, through the real agent and the bundled driver: loop-backed xfs (the loop device, `xfs_growfs`), and ext4 where this process may grow a mounted ext4, beside the directory backing (no filesystem to grow) measured in the same run.
//!
//! `cargo bench -p kvol --bench expansion` (root: loop devices and mounts, in a private mount
//! namespace of the bench thread that the agents inherit). For each backing, one claim of a
//! class with `allowVolumeExpansion` is published into a pod and edited `KVOL_BENCH_ROUNDS`
//! times (default 10), 32 MiB more each time; each round is timed from the manifest's rename
//! to (loop) `statvfs` in the pod's volume showing the new size, or (directory) the agent's
//! log saying the node's expansion (`volume_fs_resize`) succeeded. Numbers are printed, never
//! asserted; the goal: ≤ 200 ms on a 2-core machine with the loop device and the resize.

#[path = "../tests/support/mod.rs"]
#[allow(dead_code)]
mod support;

use std::time::{Duration, Instant};

use support::Node;
use support::grow::{
    LOOP_DRIVER, claim_of, data_mount, fs_bytes, loop_backing_missing, loop_node, may_grow_mounted_ext4,
};

const MI: u64 = 1 << 20;

/// A claim of `size` MiB of driver `driver`'s class, formatted `fs`, in a pod.
fn claim(driver: &str, fs: &str, size: u64) -> String {
    claim_of(driver, fs, &format!("{size}Mi"), true)
}

fn node_expansions(node: &Node) -> usize {
    let log = node.agent_log();
    log.lines().filter(|l| l.contains("operation succeeded") && l.contains("volume_fs_resize")).count()
}

/// Edits the claim `rounds` times and returns each round's time; `grown` says whether round
/// `i`'s size (bytes) has arrived.
fn rounds(
    node: &Node,
    driver: &str,
    fs: &str,
    start: u64,
    rounds: usize,
    grown: impl Fn(usize, u64) -> bool,
) -> Vec<Duration> {
    let mut times = Vec::new();
    for round in 1..=rounds {
        let size = start + 32 * round as u64;
        let edited = Instant::now();
        node.write("claims.yaml", &claim(driver, fs, size));
        while !grown(round, size * MI) {
            assert!(
                edited.elapsed() < Duration::from_secs(60),
                "round {round} never grew:\n{}",
                node.agent_log()
            );
            std::thread::sleep(Duration::from_micros(500));
        }
        times.push(edited.elapsed());
    }
    times
}

fn median(mut times: Vec<Duration>) -> (Duration, Duration, Duration) {
    times.sort();
    (times[0], times[times.len() / 2], times[times.len() - 1])
}

fn published(node: &Node) -> std::path::PathBuf {
    let report = node
        .wait(Duration::from_secs(60), |r| data_mount(r).is_some())
        .unwrap_or_else(|last| panic!("{last}\n{}", node.agent_log()));
    data_mount(&report).unwrap()
}

/// The directory backing (the embedded default's driver told so): the node's step is
/// NodeExpandVolume and nothing to grow.
fn directory(count: usize) -> Vec<Duration> {
    let mut node = Node::new();
    node.agent_env.push(("KVOL_VOLUME_BACKING".into(), "directory".into()));
    node.start();
    let driver = "hostpath.csi.kvol.io";
    node.write("claims.yaml", &claim(driver, "ext4", 64));
    published(&node);
    rounds(&node, driver, "ext4", 64, count, |round, _| node_expansions(&node) >= round)
}

/// A loop-backed `fs`: the image file, the loop device's capacity and the filesystem grow.
fn looped(fs: &str, count: usize) -> Vec<Duration> {
    let (node, _driver) = loop_node(&[]);
    node.write("claims.yaml", &claim(LOOP_DRIVER, fs, 320));
    let mount = published(&node);
    // statvfs shows the filesystem's size, which is below the volume's by its metadata: a round
    // is done when the size grew by most of the 32 MiB asked.
    let last = std::cell::Cell::new(fs_bytes(&mount));
    let times = rounds(&node, LOOP_DRIVER, fs, 320, count, |_, _| {
        let now = fs_bytes(&mount);
        let done = now >= last.get() + 24 * MI;
        if done {
            last.set(now);
        }
        done
    });
    for line in node.agent_log().lines().filter(|l| l.contains("WARN") || l.contains("ERROR")) {
        println!("  agent said: {line}");
    }
    node.remove("claims.yaml");
    node.wait(Duration::from_secs(60), |r| r.volumes.is_empty()).unwrap();
    times
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    support::enter_private_mount_namespace();
    let count = std::env::var("KVOL_BENCH_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(10);
    let show = |what: &str, times: Vec<Duration>| {
        let (min, med, max) = median(times);
        println!(
            "{what}: claim edited → grown, median {med:.1?} (min {min:.1?}, max {max:.1?}) over {count} rounds"
        );
        med
    };
    let baseline = show("directory backing (NodeExpandVolume only)", directory(count));
    for fs in ["xfs", "ext4"] {
        if let Some(why) = loop_backing_missing(fs) {
            println!("loop-backed {fs}: skipped: {why}");
            continue;
        }
        if fs == "ext4" && !may_grow_mounted_ext4() {
            println!(
                "loop-backed ext4: skipped: growing a mounted ext4 needs CAP_SYS_RESOURCE, which this process lacks"
            );
            continue;
        }
        let med = show(&format!("loop-backed {fs} (statvfs in the pod)"), looped(fs, count));
        println!(
            "  ratio to the directory backing: {:.1}x; goal ≤ 200 ms: {}",
            med.as_secs_f64() / baseline.as_secs_f64(),
            if med <= Duration::from_millis(200) { "met" } else { "not met" }
        );
    }
}
