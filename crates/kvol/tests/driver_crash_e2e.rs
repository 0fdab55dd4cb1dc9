//! A CSI driver that crashes again and again, on the real agent with real mounts: the bundled driver killed while the agent's supervisor runs it, and the upstream hostpath driver behind node-driver-registrar killed and started again by the test (as a DaemonSet's kubelet would). Published volumes stay the same mounts with their data; a call in flight when the driver dies is uncertain and done again, never counted as done; the supervisor restarts its driver with a growing back-off and says so in the log and `kvol status`; new pods' volumes are served once the driver is back.

#[allow(dead_code)]
mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kvol_node::report::status::{Phase, StatusReport, render_table};
use support::Node;
use support::claim_pods::{identities, pod, published, storage};
use support::crashing::{Crashing, Supervised, UPSTREAM, Upstream, hostpath};

const LIMIT: Duration = Duration::from_secs(60);
const BUNDLED: &str = "hostpath.csi.kvol.io";
/// The agent's `--component-restart-backoff-max-seconds` here: ten kills stay within a minute.
const BACKOFF_MAX_SECONDS: u64 = 4;

/// `KVOL_DRIVER_KILLS` when set, else 10.
fn kills() -> usize {
    std::env::var("KVOL_DRIVER_KILLS").ok().and_then(|s| s.parse().ok()).unwrap_or(10)
}

/// What a crash loop measured.
#[derive(Debug, Default)]
struct Figures {
    kills: usize,
    /// Kills as the agent said a stage or publish call to the driver began.
    during_publish: usize,
    /// From each kill to the driver serving again.
    down: Vec<Duration>,
    /// Status snapshots taken while a driver was down: no published volume without its mount.
    snapshots: usize,
    /// `kvol status` lines of the component while it waited to be restarted.
    backoff_lines: Vec<String>,
    /// From the first new pod written after the last kill to every pod published.
    settled_after_last_kill: Duration,
    /// Targets the driver said it unpublished at the end but left mounted.
    left_by_driver: Vec<PathBuf>,
}

/// Every published CSI volume (`data`, `scratch`) of `report` has its mount: a volume whose
/// call died with the driver is not counted as published.
fn published_means_mounted(report: &StatusReport) -> Result<(), String> {
    let table = std::fs::read_to_string("/proc/thread-self/mountinfo").unwrap();
    let mounted = |p: &Path| table.lines().any(|l| l.split(' ').nth(4) == Some(&*p.to_string_lossy()));
    for v in &report.volumes {
        let csi = v.volume == "data" || v.volume == "scratch";
        let Some(target) = v.target.as_ref().filter(|_| csi && v.phase == Phase::Published) else { continue };
        // Still mounted now, or torn down since the report was written (not in this test).
        if !mounted(&target.join("mount")) {
            return Err(format!("{}/{} said published without its mount: {v:#?}", v.pod, v.volume));
        }
    }
    Ok(())
}

/// Kills the driver `kills` times at random moments, every other time as the agent says a
/// stage or publish call of a new pod began (a call in flight), otherwise while the driver
/// serves; a new pod arrives with
/// each kill. The pod `kept`, published before, must stay the same mounts with its data
/// throughout, and every pod must be published at the end, each CSI volume mounted once.
fn crash_loop(node: &mut Node, driver: &str, crashing: &mut dyn Crashing, seed: u64) -> Figures {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut figures = Figures::default();
    node.write("storage.yaml", &storage(driver));
    node.write("kept.yaml", &pod("kept", driver));
    if !node.running() {
        node.start();
    }
    let report =
        node.wait(LIMIT, |r| published(r, "kept")).unwrap_or_else(|e| panic!("{e}\n{}", node.agent_log()));
    let kept = identities(&report, "kept");
    let data = report.volumes.iter().find(|v| v.pod == "default/kept" && v.volume == "data").unwrap();
    let file = data.target.clone().unwrap().join("mount/written-before");
    std::fs::write(&file, "kept through every crash").unwrap();
    let mut pods = vec!["kept".to_string()];
    let mut last_written = Instant::now();
    for i in 0..kills() {
        let name = format!("p{i}");
        let during = i % 2 == 0;
        if during {
            let offset = node.agent_log().len();
            node.write(&format!("{name}.yaml"), &pod(&name, driver));
            last_written = Instant::now();
            // The kill follows the agent's word of a stage or publish call to the driver.
            let start = Instant::now();
            while !node.agent_log()[offset..].lines().any(|l| driver_call(l, driver)) {
                assert!(start.elapsed() < LIMIT, "no stage or publish call for {name}\n{}", node.agent_log());
                std::thread::sleep(Duration::from_millis(1));
            }
            std::thread::sleep(Duration::from_millis(rng.u64(0..5)));
            figures.during_publish += 1;
        } else {
            std::thread::sleep(Duration::from_millis(rng.u64(0..1500)));
        }
        crashing.kill(node);
        let killed = Instant::now();
        figures.kills += 1;
        if !during {
            node.write(&format!("{name}.yaml"), &pod(&name, driver));
            last_written = Instant::now();
        }
        pods.push(name);
        let mut look = |report: &StatusReport| {
            figures.snapshots += 1;
            published_means_mounted(report).unwrap_or_else(|e| panic!("kill {i}: {e}"));
            let waiting = report.components.iter().find(|c| c.state.pid.is_none());
            if let Some(line) = waiting.and_then(|_| component_line(report)) {
                figures.backoff_lines.push(line);
            }
        };
        crashing.back(node, &mut look);
        figures.down.push(killed.elapsed());
        let now = node.wait(LIMIT, |_| true).unwrap();
        assert_eq!(identities(&now, "kept"), kept, "kill {i}: the kept pod's volumes are the same mounts");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "kept through every crash", "kill {i}");
    }
    let report = node.wait(LIMIT, |r| pods.iter().all(|p| published(r, p))).unwrap_or_else(|e| {
        panic!("not every pod was served once the driver was back: {e}\n{}", node.agent_log())
    });
    figures.settled_after_last_kill = last_written.elapsed();
    published_means_mounted(&report).unwrap();
    assert_eq!(identities(&report, "kept"), kept, "the kept pod's volumes are the same mounts");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "kept through every crash");
    let mounts = node.mounts();
    for v in report.volumes.iter().filter(|v| v.volume != "cache") {
        let at = v.target.as_ref().unwrap().join("mount");
        let n = mounts.iter().filter(|m| m.target == at).count();
        assert_eq!(n, 1, "{}/{} is mounted {n} time(s) at {}", v.pod, v.volume, at.display());
    }
    for p in &pods {
        node.remove(&format!("{p}.yaml"));
    }
    let report = node
        .wait(LIMIT, |r| r.volumes.iter().all(left_mounted_by_driver))
        .unwrap_or_else(|e| panic!("{e}\n{}", node.agent_log()));
    figures.left_by_driver = report.volumes.iter().map(|v| v.target.clone().unwrap().join("mount")).collect();
    figures
}

/// A volume its driver said it unpublished but left mounted: kvol leaves the mount in place,
/// says so and asks again.
fn left_mounted_by_driver(v: &kvol_node::report::status::VolumeStatus) -> bool {
    v.last_error.as_deref().is_some_and(|e| e.contains("is still mounted after NodeUnpublishVolume"))
}

/// Whether a line of the agent's log says a stage or publish call to `driver` starts.
fn driver_call(line: &str, driver: &str) -> bool {
    (line.contains("NodeStageVolume driver=") || line.contains("NodePublishVolume driver="))
        && line.contains(&format!("driver={driver} "))
}

/// The component's line of `kvol status` (what `render_table` prints for it).
fn component_line(report: &StatusReport) -> Option<String> {
    render_table(report, 0).lines().find(|l| l.starts_with("component hostpath")).map(str::to_string)
}

/// Lines of the agent's log saying a driver call failed with its outcome unknown.
fn uncertain_failures(log: &str) -> usize {
    log.lines().filter(|l| l.contains("operation failed") && l.contains("uncertain=true")).count()
}

#[test]
fn a_bundled_driver_crashing_again_and_again_is_restarted_with_backoff_and_no_published_volume_is_touched() {
    support::enter_private_mount_namespace();
    let seed = support::churn::seed();
    let mut node = Node::new();
    node.agent_args = vec!["--component-restart-backoff-max-seconds".into(), BACKOFF_MAX_SECONDS.to_string()];
    let mut crashing = Supervised { killed: Vec::new() };
    let started = Instant::now();
    let figures = crash_loop(&mut node, BUNDLED, &mut crashing, seed);
    let log = node.agent_log();
    let backoffs: Vec<u64> = log
        .lines()
        .filter(|l| l.contains("component process ended"))
        .filter_map(|l| {
            l.split("backoff_ms=").nth(1)?.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
        })
        .collect();
    eprintln!(
        "seed {seed}: {} kills ({} as a stage or publish call began), driver back after {:?}; back-offs said in the log (ms): {backoffs:?}; {} status snapshots while down, {} showing the back-off, e.g. {:?}; {} driver calls failed uncertain; every pod published {:?} after the last was written; {:?} in all",
        figures.kills,
        figures.during_publish,
        figures.down,
        figures.snapshots,
        figures.backoff_lines.len(),
        figures.backoff_lines.last(),
        uncertain_failures(&log),
        figures.settled_after_last_kill,
        started.elapsed(),
    );
    // The supervisor: each death said with its growing back-off, capped; `kvol status` said so.
    assert_eq!(backoffs.len(), figures.kills, "one log line per death with its back-off:\n{log}");
    let cap = BACKOFF_MAX_SECONDS * 1000;
    let want: Vec<u64> = (0..figures.kills).map(|i| (500u64 << i.min(20)).min(cap)).collect();
    assert_eq!(backoffs, want, "the back-off doubles from 500 ms to its cap");
    assert!(
        figures.backoff_lines.iter().any(|l| l.contains("back-off")),
        "kvol status never said the driver waits to be restarted: {:?}",
        figures.backoff_lines
    );
    let report = node.wait(LIMIT, |_| true).unwrap();
    let state = &hostpath(&report).unwrap().state;
    assert_eq!(state.starts as usize, figures.kills + 1, "{state:?}");
    assert_eq!(state.last_exit.as_deref(), Some("the process signal: 9 (SIGKILL)"));
    assert!(uncertain_failures(&log) >= 1, "no call was cut short by a death:\n{log}");
    assert_eq!(figures.left_by_driver, Vec::<PathBuf>::new(), "the bundled driver left mounts behind");
}

#[test]
fn an_upstream_driver_crashing_again_and_again_behind_its_registrar_touches_no_published_volume() {
    let Some((hostpath, registrar)) = support::upstream_hostpath_and_registrar() else { return };
    support::enter_private_mount_namespace();
    let seed = support::churn::seed();
    let mut node = Node::new();
    node.agent_args = vec!["--no-components".into()];
    let (mut crashing, mut registrar) = Upstream::behind_registrar(&node, hostpath, &registrar, seed);
    let started = Instant::now();
    let figures = crash_loop(&mut node, UPSTREAM, &mut crashing, seed);
    let log = node.agent_log();
    eprintln!(
        "seed {seed}: {} kills ({} as a stage or publish call began), driver serving again after {:?}; {} status snapshots while down; {} driver calls failed uncertain; every pod published {:?} after the last was written; {:?} in all",
        figures.kills,
        figures.during_publish,
        figures.down,
        figures.snapshots,
        uncertain_failures(&log),
        figures.settled_after_last_kill,
        started.elapsed(),
    );
    registrar.assert_running();
    assert!(uncertain_failures(&log) >= 1, "no call was cut short by a death:\n{log}");
    for target in &figures.left_by_driver {
        assert!(!crashing.lists(target), "{} is the driver's, yet left mounted", target.display());
    }
    eprintln!(
        "{} target(s) the driver lost track of and left mounted: {:?}",
        figures.left_by_driver.len(),
        figures.left_by_driver
    );
}
