//! Pod churn with `kill -9`: pods with CSI (ephemeral and claim-backed) and emptyDir volumes come and go while the agent is killed at random points and restarted; checkpoints check every wanted volume is published exactly once; the end removes every pod and counts what was left behind.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kvol_hostpath::state::State;
use kvol_node::report::status::{Phase, StatusReport};
use kvol_plugin::MountPoint;

use super::Node;
use super::proxy::{ChaosDriver, Ledger};

/// How a churn runs.
pub struct ChurnConfig {
    pub rounds: usize,
    pub seed: u64,
    /// CSI drivers whose volumes pods get: an inline (ephemeral) volume and a claim of a
    /// StorageClass the driver provisions, each at random.
    pub drivers: Vec<String>,
    /// The chance, per round, of a `kill -9` at a random moment after the round's change.
    pub kill_chance: f64,
    /// At least this many kills over the run (forced in the last rounds when chance fell short).
    pub min_kills: usize,
    /// A checkpoint every this many rounds (and after the last).
    pub checkpoint_every: usize,
    /// How long a checkpoint, and the end, wait for the agent to settle.
    pub settle: Duration,
    /// State files of kvol's hostpath drivers (bundled or run as `kvol csi-driver`), whose
    /// staged and published records must be empty at the end.
    pub driver_state_files: Vec<PathBuf>,
}

/// What a churn left behind, and what went wrong on the way.
#[derive(Debug, Default)]
pub struct Figures {
    pub rounds: usize,
    pub pods_created: usize,
    pub kills: usize,
    pub checkpoints: usize,
    /// Whether the end state (no volumes, no node volumes, no mounts, no directories) was reached.
    pub settled: bool,
    pub mounts_left: Vec<MountPoint>,
    /// Each directory left, with the names of what it holds.
    pub pod_volume_dirs_left: Vec<String>,
    pub node_volumes_left: Vec<String>,
    /// `(state file, volume id, what)` records a hostpath driver still holds.
    pub driver_records_left: Vec<String>,
    pub ledger: Option<Ledger>,
    /// Checkpoint failures: a wanted volume not published, or mounted other than once.
    pub problems: Vec<String>,
    pub orphan_log_lines: usize,
}

impl Figures {
    pub fn summary(&self, seed: u64) -> String {
        let ledger = self.ledger.as_ref().map_or(String::new(), |l| {
            format!(
                "; proxied driver: {} publishes ({} repeats) / {} unpublishes, {} stages / {} unstages, {} left published, {} left staged, {} unavailable and {} hangs injected",
                l.publishes,
                l.republishes,
                l.unpublishes,
                l.stages,
                l.unstages,
                l.published.len(),
                l.staged.len(),
                l.unavailable_injected,
                l.hangs_injected
            )
        });
        format!(
            "churn (seed {seed}): {} rounds, {} pods, {} kills, {} checkpoints, {} checkpoint problems; after removing every pod: settled {}, {} mounts left, {} pod volume directories left, {} node volumes left, {} driver records left, {} 'orphan' log lines{ledger}",
            self.rounds,
            self.pods_created,
            self.kills,
            self.checkpoints,
            self.problems.len(),
            self.settled,
            self.mounts_left.len(),
            self.pod_volume_dirs_left.len(),
            self.node_volumes_left.len(),
            self.driver_records_left.len(),
            self.orphan_log_lines,
        )
    }

    /// Panics with every failure when anything leaked or a checkpoint failed.
    pub fn assert_clean(&self, seed: u64, log: &str) {
        let clean = self.problems.is_empty()
            && self.mounts_left.is_empty()
            && self.pod_volume_dirs_left.is_empty()
            && self.node_volumes_left.is_empty()
            && self.driver_records_left.is_empty()
            && self.ledger.as_ref().is_none_or(Ledger::balanced);
        if !clean {
            let tail: Vec<&str> = log.lines().rev().take(60).collect();
            panic!(
                "{}\nproblems: {:#?}\nmounts left: {:#?}\npod volume directories left: {:#?}\nnode volumes left: {:#?}\ndriver records left: {:#?}\nproxied driver: {:#?}\nlast lines of the agent log:\n{}",
                self.summary(seed),
                self.problems,
                self.mounts_left.iter().map(|m| &m.target).collect::<Vec<_>>(),
                self.pod_volume_dirs_left,
                self.node_volumes_left,
                self.driver_records_left,
                self.ledger,
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
    }
}

/// The seed: `KVOL_CHURN_SEED` when set, else the clock.
pub fn seed() -> u64 {
    seed_from("KVOL_CHURN_SEED")
}

/// The seed: `var` when set, else the clock.
pub fn seed_from(var: &str) -> u64 {
    std::env::var(var).ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    })
}

/// `KVOL_CHURN_ROUNDS` when set, else `default`.
pub fn rounds(default: usize) -> usize {
    rounds_from("KVOL_CHURN_ROUNDS", default)
}

/// `var` when set, else `default`.
pub fn rounds_from(var: &str, default: usize) -> usize {
    std::env::var(var).ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

/// A StorageClass `sc<i>` and a CSIDriver object for each driver.
pub fn storage(drivers: &[String]) -> String {
    drivers
        .iter()
        .enumerate()
        .map(|(i, d)| {
            format!(
                "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata: {{name: sc{i}}}\nprovisioner: {d}\n---\napiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata: {{name: {d}}}\nspec: {{attachRequired: false, podInfoOnMount: true, volumeLifecycleModes: [Persistent, Ephemeral]}}\n"
            )
        })
        .collect::<Vec<_>>()
        .join("---\n")
}

/// One pod of the churn: its name and its volumes (name, whether the volume is a mount).
#[derive(Clone, Debug)]
struct PodPlan {
    name: String,
    volumes: Vec<(String, bool)>,
}

impl PodPlan {
    fn file(&self) -> String {
        format!("{}.yaml", self.name)
    }
}

/// A pod with a random choice of volumes, and its manifest (the pod and its claims).
fn random_pod(rng: &mut fastrand::Rng, name: &str, drivers: &[String]) -> (PodPlan, String) {
    let mut volumes = Vec::new();
    let mut docs = Vec::new();
    let mut lines = Vec::new();
    for (i, driver) in drivers.iter().enumerate() {
        if rng.bool() {
            volumes.push((format!("eph{i}"), true));
            lines.push(format!("  - {{name: eph{i}, csi: {{driver: {driver}}}}}"));
        }
        if rng.bool() {
            let claim = format!("{name}-c{i}");
            volumes.push((format!("pvc{i}"), true));
            lines.push(format!("  - {{name: pvc{i}, persistentVolumeClaim: {{claimName: {claim}}}}}"));
            docs.push(format!(
                "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{name: {claim}, namespace: default}}\nspec: {{storageClassName: sc{i}, accessModes: [ReadWriteOnce], resources: {{requests: {{storage: 1Mi}}}}}}\n"
            ));
        }
    }
    if volumes.is_empty() || rng.bool() {
        volumes.push(("scratch".to_string(), false));
        lines.push("  - {name: scratch, emptyDir: {}}".to_string());
    }
    docs.push(format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  containers: {}\n  volumes:\n{}\n",
        kvol_test_support::pods::containers_using("app", &lines.join("\n")),
        lines.join("\n")
    ));
    (PodPlan { name: name.to_string(), volumes }, docs.join("---\n"))
}

fn phase_of(report: &StatusReport, pod: &str, volume: &str) -> Option<Phase> {
    report.volumes.iter().find(|v| v.pod == format!("default/{pod}") && v.volume == volume).map(|v| v.phase)
}

/// Runs the churn on `node` (started here if it is not running) and returns the figures.
pub fn churn(node: &mut Node, chaos: Option<&ChaosDriver>, config: &ChurnConfig) -> Figures {
    let mut rng = fastrand::Rng::with_seed(config.seed);
    let mut figures = Figures { rounds: config.rounds, ..Figures::default() };
    node.write("00-storage.yaml", &storage(&config.drivers));
    if !node.running() {
        node.start();
    }
    // The first start completes before any kill (a kill during the very first start is
    // a_kill_during_the_first_start_never_bricks_the_agent's business).
    node.wait(config.settle, |_| true).expect("the agent's first start writes its status");
    let mut live: Vec<PodPlan> = Vec::new();
    for round in 0..config.rounds {
        // The change: add a pod, or remove one, or both.
        let add = live.len() < 2 || (live.len() < 6 && rng.f64() < 0.6);
        let remove = !add || (live.len() > 3 && rng.bool());
        if remove && !live.is_empty() {
            let gone = live.remove(rng.usize(0..live.len()));
            node.remove(&gone.file());
        }
        if add {
            let (plan, text) = random_pod(&mut rng, &format!("p{round}"), &config.drivers);
            node.write(&plan.file(), &text);
            live.push(plan);
            figures.pods_created += 1;
        }
        // A kill at a random moment, or a random pause.
        let pause = Duration::from_millis(rng.u64(0..800));
        let must = config.min_kills.saturating_sub(figures.kills) >= config.rounds - round;
        if must || rng.f64() < config.kill_chance {
            std::thread::sleep(pause);
            node.kill_9();
            figures.kills += 1;
            node.start();
        } else {
            std::thread::sleep(pause);
        }
        if (round + 1) % config.checkpoint_every == 0 || round + 1 == config.rounds {
            checkpoint(node, chaos, &live, round, config.settle, &mut figures);
        }
    }
    // The end: every pod removed, the agent killed once more, then left to settle.
    for plan in live.drain(..) {
        node.remove(&plan.file());
    }
    if let Some(chaos) = chaos {
        chaos.set_calm(true);
    }
    node.kill_9();
    figures.kills += 1;
    node.start();
    let start = Instant::now();
    figures.settled = loop {
        let report = node.status();
        let quiet = report.is_some_and(|r| r.volumes.is_empty() && r.node_volumes.is_empty());
        if quiet && node.mounts().is_empty() && node.pod_volume_dirs().is_empty() {
            break true;
        }
        if start.elapsed() > config.settle {
            break false;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    figures.mounts_left = node.mounts();
    figures.pod_volume_dirs_left = node.pod_volume_dirs().iter().map(|d| with_entries(d)).collect();
    figures.node_volumes_left = node
        .status()
        .map(|r| r.node_volumes.iter().map(|v| format!("{} {:?}", v.unique_name, v.phase)).collect())
        .unwrap_or_else(|| vec!["no status from the current agent".to_string()]);
    figures.driver_records_left = config.driver_state_files.iter().flat_map(|f| records_left(f)).collect();
    figures.ledger = chaos.map(ChaosDriver::ledger);
    figures.orphan_log_lines = node.agent_log().lines().filter(|l| l.contains("orphan")).count();
    figures
}

/// Calms the proxy, restarts the agent if a call hangs, waits until every wanted volume is
/// published, and checks each CSI volume is mounted exactly once at its target.
fn checkpoint(
    node: &mut Node,
    chaos: Option<&ChaosDriver>,
    live: &[PodPlan],
    round: usize,
    settle: Duration,
    figures: &mut Figures,
) {
    figures.checkpoints += 1;
    if let Some(chaos) = chaos {
        chaos.set_calm(true);
        if chaos.hanging() > 0 {
            // The agent's deadline or its death ends a call that never answers: a kill
            // here keeps the checkpoint short whatever the deadline.
            node.kill_9();
            figures.kills += 1;
            node.start();
        }
    }
    let all_published = |r: &StatusReport| {
        live.iter().all(|p| p.volumes.iter().all(|(v, _)| phase_of(r, &p.name, v) == Some(Phase::Published)))
    };
    match node.wait(settle, all_published) {
        Err(last) => figures.problems.push(format!(
            "round {round}: not every wanted volume was published within {settle:?}; last status: {last}"
        )),
        Ok(report) => {
            let mounts = node.mounts();
            for plan in live {
                for (volume, mounted) in &plan.volumes {
                    let Some(status) = report
                        .volumes
                        .iter()
                        .find(|v| v.pod == format!("default/{}", plan.name) && &v.volume == volume)
                    else {
                        continue;
                    };
                    let Some(target) = &status.target else {
                        figures.problems.push(format!("round {round}: {}/{volume} has no target", plan.name));
                        continue;
                    };
                    let at = if *mounted { target.join("mount") } else { target.clone() };
                    let n = mounts.iter().filter(|m| m.target == at).count();
                    let want = usize::from(*mounted);
                    if n != want || !at.is_dir() {
                        figures.problems.push(format!(
                            "round {round}: {}/{volume} is mounted {n} time(s) at {} (want {want})",
                            plan.name,
                            at.display()
                        ));
                    }
                }
            }
        }
    }
    if let Some(chaos) = chaos {
        chaos.set_calm(false);
    }
}

/// `dir [entry, …]`.
fn with_entries(dir: &Path) -> String {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    names.sort();
    format!("{} [{}]", dir.display(), names.join(", "))
}

/// What a kvol hostpath driver's state file still records as staged or published.
fn records_left(file: &Path) -> Vec<String> {
    let Ok(text) = std::fs::read_to_string(file) else {
        return Vec::new();
    };
    let state: State = match serde_json::from_str(&text) {
        Ok(state) => state,
        Err(e) => return vec![format!("{}: unreadable: {e}", file.display())],
    };
    let mut out = Vec::new();
    for (id, volume) in &state.volumes {
        for path in &volume.staged {
            out.push(format!("{}: {id} staged at {}", file.display(), path.display()));
        }
        for path in volume.published.keys() {
            out.push(format!("{}: {id} published at {}", file.display(), path.display()));
        }
    }
    out
}
