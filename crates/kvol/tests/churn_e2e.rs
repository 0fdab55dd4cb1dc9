//! Pod churn against the real `kvol agent` killed with SIGKILL at random points: the bundled driver, a misbehaving CSI driver (a proxy in front of a real `kvol csi-driver` that answers `UNAVAILABLE` or never answers after doing the work), and, when their binaries are named, the upstream hostpath driver registered by the upstream node-driver-registrar; after every pod is removed nothing may be left mounted, no pod volume directory may remain, and the drivers' books must balance.

mod support;

use std::process::Command;
use std::time::Duration;

use support::churn::{ChurnConfig, churn, rounds, seed};
use support::proxy::{ChaosConfig, ChaosDriver};
use support::{Daemon, Node, enter_private_mount_namespace, wait_for_path};

const BUNDLED: &str = "hostpath.csi.kvol.io";
const CHAOS: &str = "chaos.csi.kvol.test";
const UPSTREAM: &str = "hostpath.csi.k8s.io";

/// `KVOL_CHURN_ROUNDS` rounds (default 50) with the bundled driver and the misbehaving one.
#[test]
fn churn_with_kill_9_and_a_misbehaving_driver_leaves_nothing_behind() {
    enter_private_mount_namespace();
    let seed = seed();
    eprintln!("churn seed {seed} (KVOL_CHURN_SEED={seed} repeats the schedule; timing varies)");
    let mut node = Node::new();
    // A short CSI deadline: a call the proxy never answers ends by the agent's deadline.
    node.agent_args = vec!["--csi-call-timeout-seconds".to_string(), "3".to_string()];
    let root = node.root.clone();
    let backend = root.join("chaos-backend/csi.sock");
    let mut command = Command::new(env!("CARGO_BIN_EXE_kvol"));
    command
        .args(["csi-driver", "--name", CHAOS, "--node-name", "node-a", "--no-register", "--state-dir"])
        .arg(root.join("chaos-state"))
        .arg("--csi-socket")
        .arg(&backend)
        .env("KVOL_LOG", "info");
    let mut backend_process =
        Daemon::spawn("the driver behind the proxy", command, &root.join("chaos-backend.log"));
    wait_for_path(&backend, "the driver behind the proxy", Duration::from_secs(20));
    let chaos = ChaosDriver::start(ChaosConfig {
        name: CHAOS,
        socket: &root.join("kubelet/plugins").join(CHAOS).join("csi.sock"),
        backend: &backend,
        registration_dir: Some(&node.registration_dir()),
        weights: [6, 3, 1],
        seed: seed.rotate_left(17),
    });
    let config = ChurnConfig {
        rounds: rounds(50),
        seed,
        drivers: vec![BUNDLED.to_string(), CHAOS.to_string()],
        kill_chance: 0.3,
        min_kills: 10,
        checkpoint_every: 10,
        settle: Duration::from_secs(45),
        driver_state_files: vec![root.join("csi-hostpath/state.json"), root.join("chaos-state/state.json")],
    };
    let figures = churn(&mut node, Some(&chaos), &config);
    eprintln!("{}", figures.summary(seed));
    backend_process.assert_running();
    figures.assert_clean(seed, &node.agent_log());
}

/// The upstream hostpath driver (`KVOL_UPSTREAM_HOSTPATH`) registered by the upstream
/// node-driver-registrar (`KVOL_NODE_DRIVER_REGISTRAR`) with kubelet's flags, a counting proxy
/// between them and the agent; `KVOL_CHURN_ROUNDS` rounds (default 20), ten kills or more.
#[test]
fn churn_with_kill_9_against_the_upstream_hostpath_driver_and_registrar() {
    let Some((hostpath, registrar)) = support::upstream_hostpath_and_registrar() else { return };
    enter_private_mount_namespace();
    let seed = seed();
    eprintln!("churn seed {seed} (KVOL_CHURN_SEED={seed} repeats the schedule; timing varies)");
    let mut node = Node::new();
    let root = node.root.clone();
    let upstream = root.join("upstream/csi.sock");
    let mut driver = support::start_hostpathplugin(
        &hostpath,
        UPSTREAM,
        &upstream,
        &root.join("upstream-state"),
        &root.join("hostpathplugin.log"),
    );
    wait_for_path(&upstream, "hostpathplugin", Duration::from_secs(20));
    // The agent reaches the driver through a proxy that only counts (it never misbehaves), so
    // the driver's publish/unpublish and stage/unstage books can be checked.
    let proxied = root.join("kubelet/plugins").join(UPSTREAM).join("csi.sock");
    let counter = ChaosDriver::start(ChaosConfig {
        name: UPSTREAM,
        socket: &proxied,
        backend: &upstream,
        registration_dir: None,
        weights: [1, 0, 0],
        seed,
    });
    let mut registrar = support::start_registrar(&registrar, &upstream, &proxied, &node);
    let config = ChurnConfig {
        rounds: rounds(20),
        seed,
        drivers: vec![UPSTREAM.to_string(), BUNDLED.to_string()],
        kill_chance: 0.5,
        min_kills: 10,
        checkpoint_every: 5,
        settle: Duration::from_secs(45),
        driver_state_files: vec![root.join("csi-hostpath/state.json")],
    };
    let figures = churn(&mut node, Some(&counter), &config);
    eprintln!("{}", figures.summary(seed));
    driver.assert_running();
    registrar.assert_running();
    figures.assert_clean(seed, &node.agent_log());
}

/// `kill -9` in the first moments of an agent's very first start (while it creates its
/// journal) on fresh roots: the next start must come up and write its status.
#[test]
fn a_kill_during_the_first_start_never_bricks_the_agent() {
    enter_private_mount_namespace();
    let seed = seed();
    eprintln!("first-start kills seed {seed}");
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut bricked = Vec::new();
    let tries = 20;
    for i in 0..tries {
        let mut node = Node::new();
        node.agent_args = vec!["--no-bundled-driver".to_string()];
        node.start();
        std::thread::sleep(Duration::from_millis(rng.u64(0..60)));
        node.kill_9();
        let size = std::fs::metadata(node.root.join("state.redb")).map(|m| m.len()).ok();
        node.start();
        let start = std::time::Instant::now();
        loop {
            if node.status().is_some() {
                break;
            }
            if let Some(status) = node.exited() {
                let log = node.agent_log();
                bricked.push(format!(
                    "try {i}: journal of {size:?} bytes after the kill; the restart exited {status}: {}",
                    log.lines().last().unwrap_or_default()
                ));
                break;
            }
            if start.elapsed() > Duration::from_secs(30) {
                bricked.push(format!("try {i}: no status 30 s after the restart"));
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    assert!(
        bricked.is_empty(),
        "{} of {tries} restarts failed (seed {seed}):\n{}",
        bricked.len(),
        bricked.join("\n")
    );
}
