//! Agent start-up with many pod volume directories on disk: time from `exec` to "actual state rebuilt", to the first "reconcile pass", and to a status showing every volume published (or every orphan gone), beside an agent starting on an empty root in the same run.
//!
//! `cargo bench -p kvol --bench startup` (root: it mounts, in a private mount namespace of the
//! bench thread that the agents inherit). A first agent publishes `KVOL_BENCH_VOLUMES` (default
//! 1,000) CSI ephemeral volumes of the bundled driver (real bind mounts, `vol_data.json` beside
//! each), four per pod, and is stopped with SIGTERM (volumes stay mounted). Then the agent is
//! started again (a) with the same pods wanted and (b) after `kill -9` with every pod removed,
//! so each directory is an orphan to reconstruct and tear down, and (c) as (b) beside
//! `KVOL_BENCH_UNRELATED_MOUNTS` (default 10,000) unrelated bind mounts. Numbers are printed,
//! never asserted; the goals: the first pass ≤ 1 s, all torn down ≤ 5 s, with or without the
//! unrelated mounts.

use kvol_test_support::write_whole as write;
use std::io::{BufRead, BufReader, Seek};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kvol_node::report::status::{Phase, read_status};
use nix::mount::MsFlags;
use nix::sched::CloneFlags;

const VOLUMES_PER_POD: usize = 4;

const DRIVER: &str = "apiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata: {name: hostpath.csi.kvol.io}\nspec: {attachRequired: false, podInfoOnMount: true, volumeLifecycleModes: [Ephemeral]}\n";

fn pod(i: usize) -> String {
    let volumes: Vec<String> = (0..VOLUMES_PER_POD)
        .map(|v| format!("  - {{name: v{v}, csi: {{driver: hostpath.csi.kvol.io}}}}"))
        .collect();
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: p{i}, namespace: default}}\nspec:\n  containers: {}\n  volumes:\n{}\n",
        kvol_test_support::pods::containers_using("app", &volumes.join("\n")),
        volumes.join("\n")
    )
}

struct Agent {
    child: Child,
    log: PathBuf,
    started: Instant,
}

impl Agent {
    fn start(root: &Path, log: PathBuf) -> Agent {
        let out = std::fs::File::create(&log).unwrap();
        let started = Instant::now();
        let child = Command::new(env!("CARGO_BIN_EXE_kvol"))
            .args(["agent", "--no-metrics", "--no-example-flex-drivers", "--node-name", "bench", "--root"])
            .arg(root)
            .env("KVOL_LOG", "info,kvol_node::agent=debug")
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()
            .unwrap();
        Agent { child, log, started }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn stop(mut self, signal: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), signal).unwrap();
        self.child.wait().unwrap();
    }

    /// Times from start to the first log line containing each of `needles` (in order), and to
    /// `done` holding; `None` for what did not happen within `limit`.
    fn milestones(
        &self,
        needles: &[&str],
        done: impl Fn() -> bool,
        limit: Duration,
    ) -> Vec<Option<Duration>> {
        let mut seen: Vec<Option<Duration>> = vec![None; needles.len() + 1];
        let mut reader = BufReader::new(std::fs::File::open(&self.log).unwrap());
        let mut line = String::new();
        let mut position = 0;
        while self.started.elapsed() < limit && seen.iter().any(Option::is_none) {
            loop {
                line.clear();
                let n = reader.read_line(&mut line).unwrap();
                if n == 0 || !line.ends_with('\n') {
                    reader.seek(std::io::SeekFrom::Start(position)).unwrap();
                    break;
                }
                position += n as u64;
                for (i, needle) in needles.iter().enumerate() {
                    if seen[i].is_none() && line.contains(needle) {
                        seen[i] = Some(self.started.elapsed());
                    }
                }
            }
            if seen[needles.len()].is_none() && done() {
                seen[needles.len()] = Some(self.started.elapsed());
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        seen
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn published(root: &Path, pid: u32) -> usize {
    match read_status(root) {
        Ok(r) if r.pid == pid => r.volumes.iter().filter(|v| v.phase == Phase::Published).count(),
        _ => 0,
    }
}

/// `kubelet/pods/<uid>/volumes/<plugin>/<name>` directories, and the mounts at or below the root.
fn on_disk(root: &Path) -> (usize, usize) {
    let count = |dir: &Path| {
        std::fs::read_dir(dir).map(|d| d.flatten().map(|e| e.path()).collect()).unwrap_or_else(|_| Vec::new())
    };
    let mut dirs = 0;
    for pod in count(&root.join("kubelet/pods")) {
        for plugin in count(&pod.join("volumes")) {
            dirs += count(&plugin).len();
        }
    }
    let root_text = root.display().to_string();
    let mounts = std::fs::read_to_string("/proc/thread-self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| l.split(' ').nth(4).is_some_and(|t| t.starts_with(&root_text)))
        .count();
    (dirs, mounts)
}

fn show(what: &str, needles: &[&str], done: &str, times: &[Option<Duration>]) {
    let labels: Vec<&str> = needles.iter().copied().chain(std::iter::once(done)).collect();
    let parts: Vec<String> = labels
        .iter()
        .zip(times)
        .map(|(label, t)| match t {
            Some(t) => format!("{label} {:.0} ms", t.as_secs_f64() * 1e3),
            None => format!("{label} not seen"),
        })
        .collect();
    println!("  {what}: {}", parts.join(", "));
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    nix::sched::unshare(CloneFlags::CLONE_NEWNS).expect("unshare the mount namespace (the bench needs root)");
    nix::mount::mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
        .expect("make every mount private");
    let n: usize = std::env::var("KVOL_BENCH_VOLUMES").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
    let pods = n.div_ceil(VOLUMES_PER_POD);
    let n = pods * VOLUMES_PER_POD;
    let needles = ["actual state rebuilt", "reconcile pass"];
    let limit = Duration::from_secs(600);

    // The baseline: an empty root.
    let empty = tempfile::tempdir().unwrap();
    let empty_root = std::fs::canonicalize(empty.path()).unwrap();
    std::fs::create_dir_all(empty_root.join("manifests")).unwrap();
    let agent = Agent::start(&empty_root, empty_root.join("agent.log"));
    let baseline =
        agent.milestones(&needles, || read_status(&empty_root).is_ok_and(|r| r.pid == agent.pid()), limit);
    agent.stop(nix::sys::signal::Signal::SIGTERM);

    // The first run publishes every volume.
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    let manifests = root.join("manifests");
    std::fs::create_dir_all(&manifests).unwrap();
    write(&manifests, "00-driver.yaml", DRIVER);
    for i in 0..pods {
        write(&manifests, &format!("p{i}.yaml"), &pod(i));
    }
    let first = Agent::start(&root, root.join("first.log"));
    let pid = first.pid();
    let setup = first.milestones(&[], || published(&root, pid) == n, limit);
    first.stop(nix::sys::signal::Signal::SIGTERM);
    let (dirs, mounts) = on_disk(&root);
    println!(
        "start-up with {dirs} pod volume directories ({mounts} mounts) of {pods} pods on disk (first run published {n} in {:.1} s)",
        setup[0].map_or(f64::NAN, |d| d.as_secs_f64())
    );
    show("empty root (baseline)", &needles, "status written", &baseline);

    // (a) The same pods wanted: every volume found published again.
    let again = Agent::start(&root, root.join("again.log"));
    let pid = again.pid();
    let times = again.milestones(&needles, || published(&root, pid) == n, limit);
    show("(a) pods still wanted", &needles, "all published in status", &times);

    // (b) Killed, every pod removed, started again: every directory an orphan.
    again.stop(nix::sys::signal::Signal::SIGKILL);
    for i in 0..pods {
        std::fs::remove_file(manifests.join(format!("p{i}.yaml"))).unwrap();
    }
    let orphans = Agent::start(&root, root.join("orphans.log"));
    let times = orphans.milestones(&needles, || on_disk(&root) == (0, 0), Duration::from_secs(120));
    show("(b) every pod gone", &needles, "no directory or mount left", &times);
    let (dirs, mounts) = on_disk(&root);
    println!("  (b) left after the run: {dirs} pod volume directories, {mounts} mounts");
    drop(orphans);

    // (c) As (b), beside 10,000 unrelated mounts (a node running containers has thousands of
    // overlay mounts): no decision that reads the mount table may become a parse per volume.
    let unrelated = tempfile::tempdir().unwrap();
    let source = unrelated.path().join("source");
    std::fs::create_dir_all(&source).unwrap();
    let extra: usize =
        std::env::var("KVOL_BENCH_UNRELATED_MOUNTS").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000);
    let mut targets = Vec::with_capacity(extra);
    for i in 0..extra {
        let target = unrelated.path().join(format!("m{i}"));
        std::fs::create_dir(&target).unwrap();
        nix::mount::mount(Some(&source), &target, None::<&str>, MsFlags::MS_BIND, None::<&str>).unwrap();
        targets.push(target);
    }
    for i in 0..pods {
        write(&manifests, &format!("p{i}.yaml"), &pod(i));
    }
    let republish = Agent::start(&root, root.join("republish.log"));
    let pid = republish.pid();
    republish.milestones(&[], || published(&root, pid) == n, limit);
    republish.stop(nix::sys::signal::Signal::SIGKILL);
    for i in 0..pods {
        std::fs::remove_file(manifests.join(format!("p{i}.yaml"))).unwrap();
    }
    let crowded = Agent::start(&root, root.join("crowded.log"));
    let times = crowded.milestones(&needles, || on_disk(&root) == (0, 0), Duration::from_secs(120));
    show(
        &format!("(c) every pod gone, beside {extra} unrelated mounts"),
        &needles,
        "no directory or mount left",
        &times,
    );
    drop(crowded);
    for target in targets.iter().rev() {
        let _ = nix::mount::umount2(target, nix::mount::MntFlags::MNT_DETACH);
    }
    let mut left: Vec<String> = std::fs::read_to_string("/proc/thread-self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
        .filter(|t| t.starts_with(&root.display().to_string()))
        .collect();
    left.sort_by_key(|t| std::cmp::Reverse(t.len()));
    for target in left {
        let _ = nix::mount::umount2(target.as_str(), nix::mount::MntFlags::MNT_DETACH);
    }
}
