//! Component processes the agent runs: started, health-checked through CSI `Probe`, restarted with backoff, stopped on request.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use kvol_api::Backoff;
use kvol_csi::client::{CsiClient, Timeouts};
use tokio::process::{Child, Command};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// One supervised process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessSpec {
    /// The component's name, for logs and status.
    pub name: String,
    /// Program and arguments, placeholders already filled.
    pub command: Vec<String>,
    /// The CSI socket `Probe` is asked on; none: the process is only kept running.
    pub csi_socket: Option<PathBuf>,
    /// Standard output and error are appended here, a header line per start.
    pub log_file: PathBuf,
    /// Where the running process's pid is kept. A supervisor that was killed (kill -9 of the
    /// agent) leaves its process running; the next one finds it here and stops it before
    /// starting its own, so two never serve the same socket and state. `None`: not kept.
    pub pid_file: Option<PathBuf>,
    /// The component's own config file (its definition's `{config}`), when its command names
    /// one: a change of the copy is passed on as `reload` says.
    pub config: Option<crate::component_config::ComponentConfig>,
    /// How the process learns its config file changed: SIGHUP, or a restart.
    pub reload: kvol_components::definition::Reload,
}

/// How supervision is paced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SupervisorSettings {
    /// The wait before restart, growing with each start that did not last.
    pub backoff: Backoff,
    /// A run this long resets the backoff.
    pub stable_after: Duration,
    /// How often `Probe` is asked once the process answered healthy, and its deadline.
    pub probe_every: Duration,
    /// How often it is asked until then (a startup probe): the status says healthy, and the
    /// version is known, soon after the process binds its socket.
    pub probe_until_healthy_every: Duration,
    /// Failed probes are not counted for this long after a start (the process binds its socket).
    pub startup_grace: Duration,
    /// Consecutive failed probes (after the grace) that get the process killed and restarted.
    pub failed_probes_to_restart: u32,
    /// Between SIGTERM and SIGKILL when stopping.
    pub stop_grace: Duration,
}

impl Default for SupervisorSettings {
    /// Kubelet's liveness-probe habits: every 10 s, 3 failures restart, after a grace.
    fn default() -> Self {
        SupervisorSettings {
            backoff: Backoff::default(),
            stable_after: Duration::from_secs(60),
            probe_every: Duration::from_secs(10),
            probe_until_healthy_every: Duration::from_secs(1),
            startup_grace: Duration::from_secs(30),
            failed_probes_to_restart: 3,
            stop_grace: Duration::from_secs(10),
        }
    }
}

/// What is known about a supervised process now.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcessState {
    /// The running process, if any.
    pub pid: Option<u32>,
    /// How many times it was started.
    pub starts: u32,
    /// Why the last run ended (exit status, failed probes, or a start that failed).
    pub last_exit: Option<String>,
    /// The last probe's answer: `None` before the first answer of this run.
    pub healthy: Option<bool>,
    /// The last failed probe's error.
    pub probe_error: Option<String>,
    /// What the running process says it is (CSI `GetPluginInfo`: `<name> <vendor version>`),
    /// asked once per run after its first healthy probe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// What else it says of itself in that answer (`GetPluginInfo`'s manifest; the bundled
    /// driver: its volume backing and why).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub manifest: std::collections::BTreeMap<String, String>,
    /// Runs in a row that ended before [`SupervisorSettings::stable_after`], the last one
    /// included (a run that lasted counts as the first of a new row).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub crashes_in_a_row: u32,
    /// While the process waits to be started again: the back-off it waits, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_backoff_ms: Option<u64>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// What the end of a run means for the next start: the crashes in a row, this one included
/// (a run of `stable_after` or longer starts a new row), and the back-off before the next
/// start. Pure.
pub fn next_restart(
    crashes_before: u32,
    ran_for: Duration,
    settings: &SupervisorSettings,
) -> (u32, Duration) {
    let crashes = if ran_for >= settings.stable_after { 1 } else { crashes_before.saturating_add(1) };
    (crashes, settings.backoff.delay(crashes))
}

/// A process under supervision; `stop` stops it and waits, dropping the handle stops it too.
#[derive(Debug)]
pub struct Supervised {
    name: String,
    state: Arc<Mutex<ProcessState>>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Supervised {
    /// Starts `spec` and keeps it running until [`Supervised::stop`]. Must be called inside a
    /// tokio runtime.
    pub fn start(spec: ProcessSpec, settings: SupervisorSettings) -> Supervised {
        let state = Arc::new(Mutex::new(ProcessState::default()));
        let (stop, stop_rx) = watch::channel(false);
        let name = spec.name.clone();
        let task = tokio::spawn(supervise(spec, settings, Arc::clone(&state), stop_rx));
        Supervised { name, state, stop, task }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn state(&self) -> ProcessState {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Sends `signal` to the running process, if one runs; whether it was sent.
    pub fn signal(&self, signal: nix::sys::signal::Signal) -> bool {
        let Some(pid) = self.state().pid.and_then(|p| i32::try_from(p).ok()) else { return false };
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal).is_ok()
    }

    /// The live state, for a reader that outlives this borrow (the status report).
    pub fn state_handle(&self) -> Arc<Mutex<ProcessState>> {
        Arc::clone(&self.state)
    }

    /// Stops the process (SIGTERM, then SIGKILL after the grace) and supervision.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

/// How one run of the process ended.
enum RunEnd {
    Exited(String),
    Unhealthy(String),
    Stopped,
}

async fn supervise(
    spec: ProcessSpec,
    settings: SupervisorSettings,
    state: Arc<Mutex<ProcessState>>,
    mut stop: watch::Receiver<bool>,
) {
    let mut crashes = 0;
    if let Some(pid_file) = &spec.pid_file {
        stop_left_behind(&spec.name, pid_file, &spec.command, settings.stop_grace).await;
    }
    loop {
        let started = Instant::now();
        let end = match spawn(&spec) {
            Ok(child) => run_once(&spec, &settings, &state, child, &mut stop).await,
            Err(e) => RunEnd::Exited(e),
        };
        let reason = match end {
            RunEnd::Stopped => {
                if let Some(pid_file) = &spec.pid_file {
                    let _ = std::fs::remove_file(pid_file);
                }
                return update(&state, |s| s.pid = None);
            }
            RunEnd::Exited(reason) | RunEnd::Unhealthy(reason) => reason,
        };
        let (in_a_row, backoff) = next_restart(crashes, started.elapsed(), &settings);
        crashes = in_a_row;
        let backoff_ms = u64::try_from(backoff.as_millis()).unwrap_or(u64::MAX);
        tracing::warn!(component = %spec.name, reason = %reason, crashes_in_a_row = crashes, backoff_ms,
            "component process ended; restarting after a back-off");
        update(&state, |s| {
            s.pid = None;
            s.last_exit = Some(reason);
            // What the dead run answered is no health of a process that does not run.
            s.healthy = None;
            s.crashes_in_a_row = crashes;
            s.restart_backoff_ms = Some(backoff_ms);
        });
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            () = stopped(&mut stop) => return,
        }
    }
}

/// Starts the process with its output appended to the log file.
fn spawn(spec: &ProcessSpec) -> Result<Child, String> {
    let (program, args) = spec.command.split_first().ok_or("the command line is empty")?;
    let mut log = open_log(&spec.log_file)?;
    let stamp = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_secs();
    let _ =
        writeln!(log, "--- kvol: starting {} at unix time {stamp}: {}", spec.name, spec.command.join(" "));
    let stderr = log.try_clone().map_err(|e| format!("cannot share log {}: {e}", spec.log_file.display()))?;
    let child = Command::new(program)
        .args(args)
        .env(PARENT_PID_ENV, std::process::id().to_string())
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(stderr)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot start {program}: {e}"))?;
    if let (Some(pid_file), Some(pid)) = (&spec.pid_file, child.id()) {
        write_pid_file(pid_file, pid)?;
    }
    Ok(child)
}

/// Set in every component process's environment: the supervising agent's pid. A kvol
/// component ([`follow_parent`]) ends with the agent, so a kill -9 of the agent leaves no
/// driver behind; other programs ignore it, and the pid file covers them.
pub const PARENT_PID_ENV: &str = "KVOL_SUPERVISOR_PID";

/// In a process the supervisor started (its [`PARENT_PID_ENV`] set): asks the kernel for
/// SIGTERM when the supervisor dies, and ends at once if it already has. Does nothing in a
/// process started by anyone else.
pub fn follow_parent() {
    let Some(parent) = std::env::var(PARENT_PID_ENV).ok().and_then(|p| p.parse::<i32>().ok()) else {
        return;
    };
    if let Err(e) = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM) {
        tracing::warn!(error = %e, "cannot ask to end with the supervising agent");
    }
    // The agent may have died between starting this process and the request above.
    if nix::unistd::getppid().as_raw() != parent {
        tracing::warn!(parent, "the supervising agent is gone; exiting");
        std::process::exit(0);
    }
}

/// Records `pid` in `path`, replaced atomically.
fn write_pid_file(path: &Path, pid: u32) -> Result<(), String> {
    let text = format!("{pid}\n");
    kvol_plugin::atomic_file::replace(path, text.as_bytes(), kvol_plugin::atomic_file::Durability::AtomicOnly)
        .map_err(|e| format!("cannot record pid {pid} in {}: {e}", path.display()))
}

/// Whether the pid file names a live process running exactly `command` (a recycled pid running
/// something else is left alone).
fn left_behind(pid_file: &Path, command: &[String]) -> Option<i32> {
    let pid: i32 = std::fs::read_to_string(pid_file).ok()?.trim().parse().ok()?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let running: Vec<&[u8]> = cmdline.strip_suffix(b"\0").unwrap_or(&cmdline).split(|b| *b == 0).collect();
    let same = running.len() == command.len() && running.iter().zip(command).all(|(a, b)| *a == b.as_bytes());
    same.then_some(pid)
}

/// Stops the process an earlier supervisor left running: SIGTERM, SIGKILL after `grace`.
async fn stop_left_behind(name: &str, pid_file: &Path, command: &[String], grace: Duration) {
    use nix::sys::signal::{Signal, kill};
    let Some(pid) = left_behind(pid_file, command) else { return };
    tracing::warn!(component = %name, pid, "a process an earlier agent left running is stopped first");
    let pid = nix::unistd::Pid::from_raw(pid);
    let _ = kill(pid, Signal::SIGTERM);
    let deadline = Instant::now() + grace;
    while left_behind(pid_file, command).is_some() {
        if Instant::now() >= deadline {
            let _ = kill(pid, Signal::SIGKILL);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn open_log(path: &Path) -> Result<File, String> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create log directory {}: {e}", dir.display()))?;
    }
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| format!("cannot open log {}: {e}", path.display()))
}

async fn run_once(
    spec: &ProcessSpec,
    settings: &SupervisorSettings,
    state: &Mutex<ProcessState>,
    mut child: Child,
    stop: &mut watch::Receiver<bool>,
) -> RunEnd {
    update(state, |s| {
        s.pid = child.id();
        s.starts += 1;
        s.restart_backoff_ms = None;
        s.healthy = None;
        s.probe_error = None;
        s.version = None;
        s.manifest.clear();
    });
    tracing::info!(component = %spec.name, pid = ?child.id(), "component process started");
    tokio::select! {
        status = child.wait() => RunEnd::Exited(describe_exit(status)),
        reason = watch_health(spec, settings, state) => {
            let _ = child.kill().await;
            RunEnd::Unhealthy(reason)
        }
        () = stopped(stop) => {
            terminate(&mut child, settings.stop_grace).await;
            RunEnd::Stopped
        }
    }
}

fn describe_exit(status: std::io::Result<ExitStatus>) -> String {
    match status {
        Ok(status) => format!("the process {status}"),
        Err(e) => format!("cannot wait for the process: {e}"),
    }
}

/// Probes until too many consecutive probes fail; never returns for a process without a socket.
async fn watch_health(
    spec: &ProcessSpec,
    settings: &SupervisorSettings,
    state: &Mutex<ProcessState>,
) -> String {
    let Some(socket) = &spec.csi_socket else { return std::future::pending().await };
    let started = Instant::now();
    let timeouts = Timeouts { call: settings.probe_every, connect: settings.probe_every };
    let mut failed = 0;
    let mut answered_healthy = false;
    loop {
        let wait = if answered_healthy {
            settings.probe_every
        } else {
            settings.probe_until_healthy_every.min(settings.probe_every)
        };
        tokio::time::sleep(wait).await;
        let client = CsiClient::new(spec.name.clone(), socket, timeouts).map_err(|e| e.to_string());
        let answer = match &client {
            Ok(client) => client.probe().await.map_err(|e| e.to_string()),
            Err(e) => Err(e.clone()),
        };
        if let (Ok(true), Ok(client)) = (&answer, &client)
            && state.lock().unwrap_or_else(|p| p.into_inner()).version.is_none()
            && let Ok(info) = client.plugin_info().await
        {
            update(state, |s| {
                s.version = Some(format!("{} {}", info.name, info.vendor_version));
                s.manifest = info.manifest.into_iter().collect();
            });
        }
        let error = match answer {
            Ok(true) => None,
            Ok(false) => Some("probe answered not ready".to_string()),
            Err(e) => Some(e),
        };
        update(state, |s| {
            s.healthy = Some(error.is_none());
            if let Some(e) = &error {
                s.probe_error = Some(e.clone());
            }
        });
        match error {
            None => {
                failed = 0;
                answered_healthy = true;
            }
            Some(_) if started.elapsed() < settings.startup_grace => {}
            Some(e) => {
                failed += 1;
                if failed >= settings.failed_probes_to_restart {
                    return format!("{failed} probes in a row failed, the last: {e}");
                }
            }
        }
    }
}

/// SIGTERM, then SIGKILL if the process outlives `grace`.
async fn terminate(child: &mut Child, grace: Duration) {
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGTERM);
    }
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        let _ = child.kill().await;
    }
}

/// Resolves once a stop is asked for (or the supervisor handle is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

fn update(state: &Mutex<ProcessState>, change: impl FnOnce(&mut ProcessState)) {
    change(&mut state.lock().unwrap_or_else(|p| p.into_inner()));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crashes_in_a_row_double_the_back_off_to_its_cap_and_a_run_that_lasted_starts_a_new_row() {
        let settings = SupervisorSettings {
            backoff: Backoff { initial: Duration::from_millis(500), max: Duration::from_secs(4) },
            stable_after: Duration::from_secs(60),
            ..SupervisorSettings::default()
        };
        // (crashes before, seconds the run lasted, crashes in a row, back-off in ms)
        let rows: &[(u32, u64, u32, u64)] = &[
            (0, 0, 1, 500),
            (1, 1, 2, 1_000),
            (2, 59, 3, 2_000),
            (3, 0, 4, 4_000),
            (4, 0, 5, 4_000),
            (9, 60, 1, 500),
            (9, 3_600, 1, 500),
            (u32::MAX, 0, u32::MAX, 4_000),
        ];
        for &(before, ran, crashes, ms) in rows {
            let (got, backoff) = next_restart(before, Duration::from_secs(ran), &settings);
            assert_eq!((got, backoff.as_millis() as u64), (crashes, ms), "{before} crashes, ran {ran} s");
        }
    }
}
