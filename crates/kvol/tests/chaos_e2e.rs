//! A chaos run on the real agent with real mounts: pods with claims of the bundled driver (and of the upstream hostpath driver behind its registrar, when `KVOL_UPSTREAM_HOSTPATH` and `KVOL_NODE_DRIVER_REGISTRAR` name them), an emptyDir and a configMap come and go while, at a random moment of each round, one fault strikes — the agent killed with -9, frozen (SIGSTOP) for longer than its deadlines, its journal damaged between a kill and the restart, a driver killed, the state directory's filesystem full for a while. Each pod writes a file into each claim once it has it. At the end the books balance: every wanted volume published once (the mount table and `kvol status` agree), nothing else mounted under the node's root, no loop device, every file written into a wanted claim there with its content; then every pod goes and nothing is left.

#[allow(dead_code)]
mod support;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use kvol_node::report::status::{Phase, StatusReport, VolumeStatus};
use nix::sys::signal::Signal;
use support::churn::{rounds_from, seed_from, storage};
use support::crashing::{Crashing, Supervised, UPSTREAM, Upstream};
use support::faults::{JOURNAL_DAMAGES, fill, small_state_filesystem};
use support::{Daemon, Node};

const BUNDLED: &str = "hostpath.csi.kvol.io";
const LIMIT: Duration = Duration::from_secs(90);
/// Longer than every deadline the agent keeps here: its driver calls (2 s), republish and
/// resync (1 s).
const FREEZE: Duration = Duration::from_secs(3);
/// How long the state directory stays full.
const FULL: Duration = Duration::from_secs(2);
/// The books are checked every this many rounds, and after the last.
const CHECKPOINT_EVERY: usize = 10;
/// The file a pod writes into each of its claims.
const WRITTEN: &str = "written-by-the-pod";
/// What the agent says of a target a driver said it unpublished but left mounted.
const LEFT_BY_DRIVER: &str = "is still mounted after NodeUnpublishVolume";

const CONFIG_MAP: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: chaos, namespace: default}\ndata: {app.conf: \"colour=blue\"}\n";

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    Kill9,
    Freeze,
    DamagedJournal,
    DriverKilled,
    StateFull,
}

const FAULTS: [Fault; 5] =
    [Fault::Kill9, Fault::Freeze, Fault::DamagedJournal, Fault::DriverKilled, Fault::StateFull];

/// Pod `name`: a claim `d<i>` of each driver's class `sc<i>` (in the same file), an emptyDir
/// `cache` and the configMap `conf`.
fn pod(name: &str, drivers: usize) -> String {
    let mut docs = Vec::new();
    let mut lines = Vec::new();
    for i in 0..drivers {
        lines.push(format!("  - {{name: d{i}, persistentVolumeClaim: {{claimName: {name}-d{i}}}}}"));
        docs.push(format!(
            "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{name: {name}-d{i}, namespace: default}}\nspec: {{storageClassName: sc{i}, accessModes: [ReadWriteOnce], resources: {{requests: {{storage: 1Mi}}}}}}\n"
        ));
    }
    lines.push("  - {name: cache, emptyDir: {}}".to_string());
    lines.push("  - {name: conf, configMap: {name: chaos}}".to_string());
    let volumes = lines.join("\n");
    let containers = kvol_test_support::pods::containers_using("app", &volumes);
    docs.push(format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  containers: {containers}\n  volumes:\n{volumes}\n"
    ));
    docs.join("---\n")
}

/// Where a container sees a volume: a CSI volume's `mount` below its target, else the target.
fn seen_at(v: &VolumeStatus) -> Option<PathBuf> {
    let target = v.target.as_ref()?;
    Some(if v.volume.starts_with('d') { target.join("mount") } else { target.clone() })
}

/// Loop devices under `root` that are not the one device of a node volume in `report`: the
/// bundled driver backs each volume with `<volume handle>.img` on a loop device.
fn loop_devices_not_wanted(root: &std::path::Path, report: &StatusReport) -> Vec<String> {
    let mut problems = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for (device, file) in kvol_test_support::loop_devices_of(root) {
        let handle = file.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        let wanted = report.node_volumes.iter().any(|nv| nv.unique_name.ends_with(&format!("^{handle}")));
        if !wanted || !seen.insert(handle) {
            problems.push(format!(
                "loop device {device} on {} is not a wanted volume's one device",
                file.display()
            ));
        }
    }
    problems
}

/// node-driver-registrar, started again when it has exited as a DaemonSet's kubelet restarts
/// its container: it exits when the agent answers a registration failed (the driver it asked
/// about was down), as it does beside kubelet.
struct Registrar {
    binary: PathBuf,
    process: Daemon,
    restarts: usize,
}

impl Registrar {
    fn tend(&mut self, driver: &Upstream, node: &Node) {
        if self.process.exited() {
            self.process = support::start_registrar(&self.binary, &driver.socket, &driver.socket, node);
            self.restarts += 1;
        }
    }
}

/// Each file below `dir` with its size in KiB (what fills a state directory).
fn files_with_sizes(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        match std::fs::symlink_metadata(&path) {
            Ok(meta) if meta.is_dir() => out.extend(files_with_sizes(&path)),
            Ok(meta) => out.push(format!("{} {} KiB", path.display(), meta.len() / 1024)),
            Err(_) => {}
        }
    }
    out
}

/// The node, its drivers, the pods wanted, the files written, and what struck.
struct Chaos {
    node: Node,
    /// The state directory, on a small filesystem of its own.
    state: PathBuf,
    bundled: Supervised,
    upstream: Option<(Upstream, Registrar)>,
    drivers: usize,
    rng: fastrand::Rng,
    live: Vec<String>,
    /// `(pod, volume)` → the file the pod wrote into that claim.
    written: BTreeMap<(String, String), PathBuf>,
    /// How often each fault (with its kind: which damage, which driver) struck.
    counts: BTreeMap<String, usize>,
    /// When the last fault was over.
    calm_since: Instant,
    /// The agent's last words each time it exited on its own (and was started again).
    agent_exits: Vec<String>,
    /// Files written into claims over the run.
    files_written: usize,
    checkpoints: usize,
}

impl Chaos {
    /// A pod added or removed (or both), as the churn does.
    fn change(&mut self, round: usize) {
        let add = self.live.len() < 2 || (self.live.len() < 6 && self.rng.f64() < 0.6);
        let remove = !add || (self.live.len() > 3 && self.rng.bool());
        if remove && !self.live.is_empty() {
            let gone = self.live.remove(self.rng.usize(0..self.live.len()));
            self.node.remove(&format!("{gone}.yaml"));
            self.written.retain(|(pod, _), _| *pod != gone);
        }
        if add {
            let name = format!("p{round}");
            self.node.write(&format!("{name}.yaml"), &pod(&name, self.drivers));
            self.live.push(name);
        }
    }

    /// Strikes `fault`; returns what struck, with its kind.
    fn strike(&mut self, fault: Fault, round: usize) -> String {
        match fault {
            Fault::Kill9 => {
                self.node.kill_9();
                self.node.start();
                "kill -9".to_string()
            }
            Fault::Freeze => self.freeze(round),
            Fault::DamagedJournal => {
                self.node.kill_9();
                let (what, damage, _) = JOURNAL_DAMAGES[self.rng.usize(0..JOURNAL_DAMAGES.len())];
                let journal = self.state.join("state.redb");
                // A kill in the first moments of a start may come before the journal is made.
                let what = if journal.is_file() { what } else { "not made yet" };
                if journal.is_file() {
                    damage(&journal);
                }
                self.node.start();
                format!("journal {what} between a kill and the restart")
            }
            Fault::DriverKilled => self.kill_a_driver(),
            Fault::StateFull => {
                fill(&self.state);
                std::thread::sleep(FULL);
                std::fs::remove_file(self.state.join("filler")).unwrap();
                format!("state directory full for {FULL:?}")
            }
        }
    }

    /// SIGSTOP for longer than the agent's deadlines, a pod changed meanwhile half the time.
    fn freeze(&mut self, round: usize) -> String {
        self.node.signal(Signal::SIGSTOP);
        let changed = self.rng.bool();
        if changed {
            // A name no round gives.
            self.change(round + 100_000);
        }
        std::thread::sleep(FREEZE);
        self.node.signal(Signal::SIGCONT);
        format!("frozen for {FREEZE:?}{}", if changed { ", pods changed meanwhile" } else { "" })
    }

    /// The bundled driver killed by its pid (the agent's supervisor starts it again), or the
    /// upstream one killed and started again by the test; waits until it serves again.
    fn kill_a_driver(&mut self) -> String {
        let upstream = self.upstream.as_mut().filter(|_| self.rng.bool());
        let (crashing, which): (&mut dyn Crashing, &str) = match upstream {
            Some((driver, _)) => (driver, "upstream"),
            None => (&mut self.bundled, "bundled"),
        };
        crashing.kill(&self.node);
        crashing.back(&self.node, &mut |_| {});
        format!("{which} driver killed")
    }

    /// Starts the agent again when it has exited (as its service manager would: the agent
    /// exits when it cannot open its journal for an I/O error such as `ENOSPC`, and is started
    /// again), and the registrar when it has.
    fn tend(&mut self) {
        if self.node.exited().is_some() {
            let last_words = self.node.agent_log().lines().last().unwrap_or_default().to_string();
            self.agent_exits.push(last_words);
            self.node.start_again_if_exited();
        }
        self.tend_registrar();
    }

    /// Starts the registrar again when it has exited.
    fn tend_registrar(&mut self) {
        if let Some((driver, registrar)) = self.upstream.as_mut() {
            registrar.tend(driver, &self.node);
        }
    }

    /// Each pod writes a file into each claim it has (published, and mounted in the table)
    /// and has not written into yet.
    fn write_into_claims(&mut self) {
        let Some(report) = self.node.status() else { return };
        let mounts = kvol_test_support::mounts_below(&self.node.root);
        for v in report.volumes.iter().filter(|v| v.volume.starts_with('d') && v.phase == Phase::Published) {
            let pod = v.pod.trim_start_matches("default/").to_string();
            let key = (pod.clone(), v.volume.clone());
            if !self.live.contains(&pod) || self.written.contains_key(&key) {
                continue;
            }
            let Some(seen) = seen_at(v).filter(|s| mounts.contains(s)) else { continue };
            let file = seen.join(WRITTEN);
            if std::fs::write(&file, format!("{pod}/{}", v.volume)).is_ok() {
                self.written.insert(key, file);
                self.files_written += 1;
            }
        }
    }

    /// Whether `v`, of a pod that is gone, was left mounted by the upstream driver's own doing
    /// (see [`Upstream::lists`]): kvol says so and asks again.
    fn left_by_upstream(&self, v: &VolumeStatus) -> bool {
        let said =
            v.last_error.as_deref().is_some_and(|e| e.contains(LEFT_BY_DRIVER) && e.contains(UPSTREAM));
        let not_listed = self.upstream.as_ref().zip(seen_at(v)).is_some_and(|((u, _), seen)| !u.lists(&seen));
        said && not_listed
    }

    /// What does not balance: each problem, naming the pod, volume or path.
    fn books(&self, report: &StatusReport) -> Vec<String> {
        let mounts = kvol_test_support::mounts_below(&self.node.root);
        let mut problems = Vec::new();
        // The state directory's own filesystem, and what is at or below each wanted path.
        let mut accounted = Vec::new();
        for pod in &self.live {
            problems.extend(self.wanted_volumes(report, pod, &mounts, &mut accounted));
        }
        for v in report.volumes.iter().filter(|v| !self.live.iter().any(|p| v.pod == format!("default/{p}")))
        {
            if self.left_by_upstream(v) {
                accounted.extend(seen_at(v));
            } else {
                problems.push(format!("{}/{} of a pod that is gone is left: {:?}", v.pod, v.volume, v.phase));
            }
        }
        for nv in &report.node_volumes {
            let wanted =
                report.volumes.iter().any(|v| v.staging_path.is_some() && v.staging_path == nv.staging_path);
            match &nv.staging_path {
                Some(staging) if wanted => accounted.push(staging.clone()),
                _ => problems.push(format!("node volume {} is not wanted: {:?}", nv.unique_name, nv.phase)),
            }
        }
        let unaccounted = |m: &&PathBuf| **m != self.state && !accounted.iter().any(|a| m.starts_with(a));
        for m in mounts.iter().filter(unaccounted) {
            problems.push(format!("{} is mounted, yet no wanted volume's", m.display()));
        }
        problems.extend(loop_devices_not_wanted(&self.node.root, report));
        problems.extend(self.lost_files());
        problems
    }

    /// `pod`'s volumes in `report`: each published, a claim mounted exactly once where a
    /// container sees it, anything else at most once; their paths added to `accounted`.
    fn wanted_volumes(
        &self,
        report: &StatusReport,
        pod: &str,
        mounts: &[PathBuf],
        accounted: &mut Vec<PathBuf>,
    ) -> Vec<String> {
        let names = (0..self.drivers).map(|i| format!("d{i}")).chain(["cache".into(), "conf".into()]);
        let mut problems = Vec::new();
        for name in names {
            let found = report.volumes.iter().find(|v| v.pod == format!("default/{pod}") && v.volume == name);
            let Some(v) = found.filter(|v| v.phase == Phase::Published) else {
                problems.push(format!("{pod}/{name} is not published: {found:?}"));
                continue;
            };
            let Some(seen) = seen_at(v) else { continue };
            let n = mounts.iter().filter(|m| **m == seen).count();
            let want = if name.starts_with('d') { 1..=1 } else { 0..=1 };
            if !want.contains(&n) {
                problems.push(format!("{pod}/{name} is mounted {n} time(s) at {}", seen.display()));
            }
            accounted.push(v.target.clone().unwrap_or(seen));
        }
        problems
    }

    /// Files written into claims still wanted that are gone or changed.
    fn lost_files(&self) -> Vec<String> {
        let mut problems = Vec::new();
        for ((pod, volume), file) in &self.written {
            let want = format!("{pod}/{volume}");
            match std::fs::read_to_string(file) {
                Ok(text) if text == want => {}
                found => problems.push(format!("{pod}/{volume}: {} reads {found:?}", file.display())),
            }
        }
        problems
    }

    /// Waits until the books balance, or returns the last problems.
    fn settle(&mut self) -> Result<(), Vec<String>> {
        let start = Instant::now();
        loop {
            self.tend();
            let problems = match self.node.status() {
                Some(report) => self.books(&report),
                None => vec!["no status from the current agent".to_string()],
            };
            if problems.is_empty() {
                return Ok(());
            }
            if start.elapsed() > LIMIT {
                return Err(problems);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The books checked in the middle of the run: each claim's file written so far checked
    /// while its pod is still there.
    fn checkpoint(&mut self, seed: u64, round: usize) {
        if let Err(problems) = self.settle() {
            self.fail(seed, &format!("at the checkpoint after round {round}"), &problems);
        }
        self.checkpoints += 1;
        self.write_into_claims();
    }

    fn fail(&self, seed: u64, when: &str, problems: &[String]) -> ! {
        let log = self.node.agent_log();
        let tail: Vec<&str> = log.lines().rev().take(80).collect();
        panic!(
            "seed {seed} (KVOL_CHAOS_SEED={seed} repeats the schedule): the books do not balance {when}:\n{}\nfaults: {:#?}\nthe agent exited on its own: {:#?}\nthe state directory holds: {}\nlast lines of the agent log:\n{}",
            problems.join("\n"),
            self.counts,
            self.agent_exits,
            files_with_sizes(&self.state).join(", "),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
}

/// `KVOL_CHAOS_ROUNDS` rounds (default 50), seeded by `KVOL_CHAOS_SEED` (else the clock).
#[test]
fn chaos_of_every_fault_during_pod_churn_leaves_the_books_balanced() {
    support::enter_private_mount_namespace();
    let seed = seed_from("KVOL_CHAOS_SEED");
    let rounds = rounds_from("KVOL_CHAOS_ROUNDS", 50);
    eprintln!(
        "chaos seed {seed} (KVOL_CHAOS_SEED={seed} repeats the schedule; timing varies), {rounds} rounds"
    );
    let mut node = Node::new();
    let state = small_state_filesystem(&mut node, "64m");
    node.agent_args = [
        "--csi-call-timeout-seconds",
        "2",
        "--republish-seconds",
        "1",
        "--component-restart-backoff-max-seconds",
        "2",
    ]
    .map(String::from)
    .to_vec();
    let upstream = support::upstream_hostpath_and_registrar().map(|(hostpath, binary)| {
        let (driver, process) = Upstream::behind_registrar(&node, hostpath, &binary, seed);
        (driver, Registrar { binary, process, restarts: 0 })
    });
    if upstream.is_none() {
        eprintln!("the chaos run goes on with the bundled driver alone");
    }
    let mut drivers = vec![BUNDLED.to_string()];
    drivers.extend(upstream.as_ref().map(|_| UPSTREAM.to_string()));
    node.write("00-storage.yaml", &format!("{}---\n{CONFIG_MAP}", storage(&drivers)));
    node.start();
    node.wait(LIMIT, |r| support::crashing::hostpath(r).is_some_and(|c| c.state.healthy == Some(true)))
        .unwrap_or_else(|e| panic!("the bundled driver never served: {e}\n{}", node.agent_log()));
    let mut chaos = Chaos {
        node,
        state,
        bundled: Supervised { killed: Vec::new() },
        upstream,
        drivers: drivers.len(),
        rng: fastrand::Rng::with_seed(seed),
        live: Vec::new(),
        written: BTreeMap::new(),
        counts: BTreeMap::new(),
        calm_since: Instant::now(),
        agent_exits: Vec::new(),
        files_written: 0,
        checkpoints: 0,
    };
    let started = Instant::now();
    let mut by_fault: BTreeMap<Fault, usize> = BTreeMap::new();
    for round in 0..rounds {
        chaos.tend();
        chaos.change(round);
        let fault = FAULTS[chaos.rng.usize(0..FAULTS.len())];
        std::thread::sleep(Duration::from_millis(chaos.rng.u64(0..800)));
        let what = chaos.strike(fault, round);
        chaos.calm_since = Instant::now();
        *by_fault.entry(fault).or_default() += 1;
        *chaos.counts.entry(what).or_default() += 1;
        chaos.tend();
        chaos.write_into_claims();
        if (round + 1) % CHECKPOINT_EVERY == 0 && round + 1 < rounds {
            chaos.checkpoint(seed, round);
        }
    }
    if let Err(problems) = chaos.settle() {
        chaos.fail(seed, "after the last fault", &problems);
    }
    let settled_after_last_fault = chaos.calm_since.elapsed();
    // Files written since the last fault too: every claim now has its file.
    chaos.write_into_claims();
    let claims = chaos.live.len() * chaos.drivers;
    eprintln!(
        "chaos (seed {seed}): {rounds} rounds in {:?}, the books balanced at {} checkpoints; {} files written into claims, {} of them (in the {claims} claims of the {} pods wanted at the end) checked at the end; faults: {by_fault:?}; by kind: {:#?}; the books balanced {settled_after_last_fault:?} after the last fault",
        started.elapsed(),
        chaos.checkpoints,
        chaos.files_written,
        chaos.written.len(),
        chaos.live.len(),
        chaos.counts,
    );
    if let Err(problems) = chaos.settle() {
        chaos.fail(seed, "with every claim's file written", &problems);
    }
    assert_eq!(chaos.written.len(), claims, "every wanted claim got its file");
    // Every pod goes: nothing is left but what the upstream driver itself left mounted.
    for pod in std::mem::take(&mut chaos.live) {
        chaos.node.remove(&format!("{pod}.yaml"));
    }
    chaos.written.clear();
    if let Err(problems) = chaos.settle() {
        chaos.fail(seed, "after every pod was removed", &problems);
    }
    let left = chaos.node.status().map(|r| r.volumes.len()).unwrap_or_default();
    eprintln!(
        "every pod removed: nothing left mounted but {left} target(s) the upstream driver lost track of"
    );
    eprintln!("the agent exited on its own and was started again: {:#?}", chaos.agent_exits);
    if let Some((_, registrar)) = &chaos.upstream {
        eprintln!("node-driver-registrar started again {} time(s) after it exited", registrar.restarts);
    }
}
