//! Node scale: N pods with five volumes each (a configMap shared by all, a secret, a downwardAPI, a projected and an emptyDir), set up, idle, updated and removed, for 200 and 1,000 pods in one run, with the ratio between the two.
//!
//! `cargo bench -p kvol --bench scale` (root: it mounts, in a private mount namespace of the
//! bench thread that the agent inherits). `KVOL_BENCH_SCALE` lists the pod counts (default
//! `200,1000`), `KVOL_BENCH_IDLE_SECONDS` the idle window (default 20). Each count gets a fresh
//! agent and state directory. Numbers are printed, never asserted; the goals for 1,000 pods:
//! set up ≤ 5 s, idle CPU ≤ 1 % of a core, teardown ≤ 5 s, RSS ≤ 100 MB, and every figure at
//! most 5.5× the one for 200 pods.

use kvol_test_support::write_whole as write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kvol_node::report::status::{Phase, StatusReport, read_status};
use nix::mount::MsFlags;
use nix::sched::CloneFlags;

const VOLUMES_PER_POD: usize = 5;

fn shared_config(version: u32) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: shared, namespace: default}}\ndata: {{setting: \"v{version}\"}}\n"
    )
}

/// Pod `i` and its own secret, as one manifest file.
fn pod(i: usize) -> String {
    let volumes = [
        "  - {name: config, configMap: {name: shared}}".to_string(),
        format!("  - {{name: secret, secret: {{secretName: s{i}}}}}"),
        "  - {name: about, downwardAPI: {items: [{path: name, fieldRef: {fieldPath: metadata.name}}]}}".to_string(),
        format!(
            "  - {{name: both, projected: {{sources: [{{configMap: {{name: shared}}}}, {{secret: {{name: s{i}}}}}]}}}}"
        ),
        "  - {name: scratch, emptyDir: {}}".to_string(),
    ]
    .join("\n");
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: s{i}, namespace: default}}\ndata: {{token: dG9rZW4=}}\n---\napiVersion: v1\nkind: Pod\nmetadata: {{name: p{i}, namespace: default, labels: {{app: scale}}}}\nspec:\n  containers: {}\n  volumes:\n{volumes}\n",
        kvol_test_support::pods::containers_using("app", &volumes)
    )
}

struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The agent's status when it is this agent's and readable (it is renamed into place whole).
fn status(root: &Path, pid: u32) -> Option<StatusReport> {
    read_status(root).ok().filter(|r| r.pid == pid)
}

fn published(report: &StatusReport) -> usize {
    report.volumes.iter().filter(|v| v.phase == Phase::Published).count()
}

/// Polls (every 50 ms) until `done` holds; the time it took.
fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "{what}: not after {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    start.elapsed()
}

/// Waits until the agent's status satisfies `done`, reading it again only when the agent
/// renames a new one into place (inotify): a status of thousands of volumes is costly to
/// parse, and the bench must not take the agent's CPU.
fn wait_for_status(
    root: &Path,
    pid: u32,
    what: &str,
    limit: Duration,
    done: impl Fn(&StatusReport) -> bool,
) -> Duration {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
    use std::os::fd::AsFd;
    let inotify = Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK).unwrap();
    inotify.add_watch(root, AddWatchFlags::IN_MOVED_TO).unwrap();
    let start = Instant::now();
    while !status(root, pid).is_some_and(|r| done(&r)) {
        assert!(start.elapsed() < limit, "{what}: not after {limit:?}");
        let mut fds = [PollFd::new(inotify.as_fd(), PollFlags::POLLIN)];
        if poll(&mut fds, PollTimeout::from(500u16)).unwrap_or(0) > 0 {
            let _ = inotify.read_events();
        }
    }
    start.elapsed()
}

/// CPU time (user + system) the process has used so far.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> =
        stat.rsplit_once(')').map(|(_, rest)| rest.split_whitespace().collect()).unwrap_or_default();
    // After the command: state is field 3, utime 14 and stime 15 (1-based), so 11 and 12 here.
    let ticks: u64 = [11, 12].iter().filter_map(|&i| fields.get(i)?.parse::<u64>().ok()).sum();
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100) as u64;
    Duration::from_millis(ticks * 1000 / hz)
}

fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// What one run with `pods` pods measured.
struct Run {
    pods: usize,
    set_up: Duration,
    rss_mib: f64,
    idle_cpu_share: f64,
    config_changed: Duration,
    removed: Duration,
    agent_cpu: Duration,
}

fn run(pods: usize, idle_window: Duration) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let root: PathBuf = std::fs::canonicalize(dir.path()).unwrap();
    let manifests = root.join("manifests");
    std::fs::create_dir_all(&manifests).unwrap();
    write(&manifests, "00-shared.yaml", &shared_config(1));
    let agent = Agent(
        Command::new(env!("CARGO_BIN_EXE_kvol"))
            .args([
                "agent",
                "--no-metrics",
                "--no-example-flex-drivers",
                "--no-components",
                "--node-name",
                "bench",
                "--root",
            ])
            .arg(&root)
            .env("KVOL_LOG", std::env::var("KVOL_BENCH_AGENT_LOG").unwrap_or_else(|_| "warn".into()))
            .stdout(Stdio::null())
            .stderr(kvol_test_support::bench_agent_log())
            .spawn()
            .unwrap(),
    );
    let pid = agent.0.id();
    wait_until("the agent's first status", Duration::from_secs(30), || root.join("status.json").exists());
    let cpu_at_start = cpu_time(pid);

    let start = Instant::now();
    for i in 0..pods {
        write(&manifests, &format!("p{i:04}.yaml"), &pod(i));
    }
    let want = pods * VOLUMES_PER_POD;
    wait_for_status(&root, pid, "every volume set up", Duration::from_secs(600), |r| published(r) == want);
    let set_up = start.elapsed();

    std::thread::sleep(Duration::from_secs(2));
    let rss = rss_mib(pid);
    let before = cpu_time(pid);
    std::thread::sleep(idle_window);
    let idle_cpu_share = (cpu_time(pid) - before).as_secs_f64() / idle_window.as_secs_f64();

    let report = status(&root, pid).expect("the agent's status");
    let config_files: Vec<PathBuf> = report
        .volumes
        .iter()
        .filter(|v| v.volume == "config")
        .filter_map(|v| v.target.as_ref().map(|t| t.join("setting")))
        .collect();
    assert_eq!(config_files.len(), pods, "every pod's configMap volume has a target");
    let start = Instant::now();
    write(&manifests, "00-shared.yaml", &shared_config(2));
    let config_changed = wait_until("every pod's configMap file changed", Duration::from_secs(600), || {
        config_files.iter().all(|f| std::fs::read_to_string(f).is_ok_and(|s| s == "v2"))
    });

    let start_removal = Instant::now();
    for i in 0..pods {
        std::fs::remove_file(manifests.join(format!("p{i:04}.yaml"))).unwrap();
    }
    let pods_dir = root.join("kubelet/pods");
    wait_for_status(&root, pid, "every pod's volume gone", Duration::from_secs(600), |r| {
        r.volumes.is_empty()
    });
    // The status says so once every operation has ended; the table is read after it, not
    // while the agent works (each read formats every mount).
    wait_until("every pod's mount gone", Duration::from_secs(60), || {
        kvol_test_support::mounts_below(&pods_dir).is_empty()
    });
    let removed = start_removal.elapsed();
    let _ = start;
    let agent_cpu = cpu_time(pid) - cpu_at_start;
    drop(agent);
    Run { pods, set_up, rss_mib: rss, idle_cpu_share, config_changed, removed, agent_cpu }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    nix::sched::unshare(CloneFlags::CLONE_NEWNS).expect("unshare the mount namespace (the bench needs root)");
    nix::mount::mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
        .expect("make every mount private");
    let counts: Vec<usize> = std::env::var("KVOL_BENCH_SCALE")
        .unwrap_or_else(|_| "200,1000".into())
        .split(',')
        .filter_map(|n| n.trim().parse().ok())
        .collect();
    let idle = Duration::from_secs(
        std::env::var("KVOL_BENCH_IDLE_SECONDS").ok().and_then(|v| v.parse().ok()).unwrap_or(20),
    );
    let runs: Vec<Run> = counts
        .iter()
        .map(|&n| {
            let r = run(n, idle);
            println!(
                "{n} pods ({} volumes): set up {:.2} s, RSS {:.1} MiB, idle CPU {:.1} % of a core, shared ConfigMap changed → every pod's file {:.2} s, every pod removed → every mount gone {:.2} s (agent CPU over the run {:.1} s)",
                n * VOLUMES_PER_POD,
                r.set_up.as_secs_f64(),
                r.rss_mib,
                r.idle_cpu_share * 100.0,
                r.config_changed.as_secs_f64(),
                r.removed.as_secs_f64(),
                r.agent_cpu.as_secs_f64()
            );
            r
        })
        .collect();
    print_table(&runs);
}

/// A line of the table: its name, its figure of a run, its goal.
type Row = (&'static str, fn(&Run) -> f64, &'static str);

fn print_table(runs: &[Run]) {
    let rows: [Row; 5] = [
        ("every volume set up (s)", |r| r.set_up.as_secs_f64(), "≤ 5 s"),
        ("RSS (MiB)", |r| r.rss_mib, "≤ 100 MB"),
        ("idle CPU (% of a core)", |r| r.idle_cpu_share * 100.0, "≤ 1 %"),
        ("shared ConfigMap changed → every pod's file (s)", |r| r.config_changed.as_secs_f64(), ""),
        ("every pod removed → every mount gone (s)", |r| r.removed.as_secs_f64(), "≤ 5 s"),
    ];
    let header: Vec<String> = runs.iter().map(|r| format!("{} pods", r.pods)).collect();
    println!("\n| | {} | last ÷ first (goal ≤ 5.5) | goal at 1,000 |", header.join(" | "));
    println!("|---|{}---|---|", "---|".repeat(runs.len()));
    for (name, value, goal) in rows {
        let cells: Vec<String> = runs.iter().map(|r| format!("{:.2}", value(r))).collect();
        let ratio = match (runs.first(), runs.last()) {
            (Some(a), Some(b)) if runs.len() > 1 => format!("{:.1}", value(b) / value(a).max(1e-9)),
            _ => "—".into(),
        };
        println!("| {name} | {} | {ratio} | {goal} |", cells.join(" | "));
    }
}
