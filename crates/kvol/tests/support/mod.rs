//! Shared support of the churn tests: a node (the real `kvol agent` under a temporary root, killed and restarted at will), driver processes, the misbehaving CSI proxy, and the churn itself with its figures.

pub mod churn;
pub mod claim_pods;
pub mod cluster_node;
pub mod containerd;
pub mod crashing;
pub mod csi_peers;
pub mod faults;
pub mod footprint;
pub mod grow;
pub mod kubelet_host;
pub mod proxy;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kvol_node::report::status::{StatusReport, read_status};
use kvol_plugin::{MountPoint, Mounter, SystemMounter};
use nix::mount::MsFlags;
use nix::sched::CloneFlags;

/// Puts the calling thread (and every process and thread it starts from now on) into a private
/// mount namespace: the test's mounts are nobody else's.
pub fn enter_private_mount_namespace() {
    nix::sched::unshare(CloneFlags::CLONE_NEWNS).expect("unshare the mount namespace (needs root)");
    nix::mount::mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
        .expect("make every mount private");
}

/// A child process killed when dropped.
pub struct Daemon {
    pub what: String,
    child: Child,
}

impl Daemon {
    /// Starts `command` with its output appended to `log`.
    pub fn spawn(what: &str, mut command: Command, log: &Path) -> Daemon {
        let out = std::fs::OpenOptions::new().create(true).append(true).open(log).unwrap();
        let child = command
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
        Daemon { what: what.to_string(), child }
    }

    /// Whether the process has exited.
    #[allow(dead_code)] // not every test that shares this module uses it
    pub fn exited(&mut self) -> bool {
        self.child.try_wait().unwrap().is_some()
    }

    /// Panics naming the process when it has exited.
    pub fn assert_running(&mut self) {
        if let Some(status) = self.child.try_wait().unwrap() {
            panic!("{} exited: {status}", self.what);
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until `path` exists; panics naming `what` after `limit`.
pub fn wait_for_path(path: &Path, what: &str, limit: Duration) {
    let start = Instant::now();
    while !path.exists() {
        assert!(start.elapsed() < limit, "{what}: {} never appeared", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The real `kvol agent` under a temporary root.
pub struct Node {
    pub root: PathBuf,
    pub manifests: PathBuf,
    /// kvol's own files (`--state-dir`): the root unless a test puts them elsewhere, when the
    /// agent runs with the kubelet layout's flags in place of `--root`.
    pub state_dir: PathBuf,
    /// Extra arguments of every start.
    pub agent_args: Vec<String>,
    /// Extra environment of every start (the components it starts inherit it).
    pub agent_env: Vec<(String, String)>,
    child: Option<Child>,
    pub starts: usize,
    /// Dropped after the agent is killed: see `Drop for Node`.
    _dir: kvol_test_support::ScratchRoot,
}

impl Node {
    pub fn new() -> Node {
        let dir = kvol_test_support::ScratchRoot::new();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        let manifests = root.join("manifests");
        std::fs::create_dir_all(&manifests).unwrap();
        Node {
            state_dir: root.clone(),
            root,
            manifests,
            agent_args: Vec::new(),
            agent_env: Vec::new(),
            child: None,
            starts: 0,
            _dir: dir,
        }
    }

    pub fn registration_dir(&self) -> PathBuf {
        self.root.join("kubelet/plugins_registry")
    }

    pub fn agent_log_path(&self) -> PathBuf {
        self.root.join("agent.log")
    }

    pub fn start(&mut self) {
        assert!(self.child.is_none(), "the agent already runs");
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.agent_log_path()).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_kvol"))
            .args(["agent", "--no-metrics", "--no-example-flex-drivers", "--resync-seconds", "1"])
            .args(["--node-name", "node-a"])
            .args(self.layout_args())
            .args(&self.agent_args)
            .env("KVOL_LOG", std::env::var("KVOL_CHURN_AGENT_LOG").unwrap_or_else(|_| "info".into()))
            .env_remove("KVOL_CONFIG")
            .env_remove("KVOL_FEATURE_GATES")
            .env_remove("KVOL_VOLUME_BACKING")
            .envs(self.agent_env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("the kvol binary runs");
        self.child = Some(child);
        self.starts += 1;
    }

    /// `--root`, or the three directories and the manifests when the state is elsewhere.
    fn layout_args(&self) -> Vec<std::ffi::OsString> {
        if self.state_dir == self.root {
            return vec!["--root".into(), self.root.clone().into()];
        }
        let flag = |name: &str, path: PathBuf| [std::ffi::OsString::from(name), path.into_os_string()];
        [
            flag("--state-dir", self.state_dir.clone()),
            flag("--root-dir", self.root.join("kubelet")),
            flag("--volume-plugin-dir", self.root.join("flexvolume")),
            flag("--manifests", self.manifests.clone()),
        ]
        .into_iter()
        .flatten()
        .collect()
    }

    pub fn kill_9(&mut self) {
        let mut child = self.child.take().expect("the agent runs");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// Stops the agent as a service manager does: SIGTERM, then waits for it to exit.
    #[allow(dead_code)] // not every test that shares this module uses it
    pub fn terminate(&mut self) {
        let mut child = self.child.take().expect("the agent runs");
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        child.wait().unwrap();
    }

    /// Sends `signal` to the running agent (SIGSTOP freezes it, SIGCONT thaws it).
    #[allow(dead_code)] // not every test that shares this module uses it
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        let child = self.child.as_ref().expect("the agent runs");
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), signal).unwrap();
    }

    /// The agent's exit status, when it has exited on its own.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.as_mut().and_then(|c| c.try_wait().unwrap())
    }

    /// Starts the agent again when it has exited on its own, as its service manager would;
    /// whether it had.
    #[allow(dead_code)] // not every test that shares this module uses it
    pub fn start_again_if_exited(&mut self) -> bool {
        if self.exited().is_none() {
            return false;
        }
        self.child = None;
        self.start();
        true
    }

    pub fn running(&self) -> bool {
        self.child.is_some()
    }

    pub fn write(&self, name: &str, text: &str) {
        let tmp = self.manifests.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, self.manifests.join(name)).unwrap();
    }

    pub fn remove(&self, name: &str) {
        std::fs::remove_file(self.manifests.join(name)).unwrap();
    }

    /// The current agent's status, once it has written one.
    pub fn status(&self) -> Option<StatusReport> {
        let report = read_status(&self.state_dir).ok()?;
        let current = self.child.as_ref().is_some_and(|c| c.id() == report.pid);
        current.then_some(report)
    }

    /// Waits up to `limit` until the current agent's status satisfies `ok`; the last status
    /// seen (if any) as the error.
    pub fn wait(&self, limit: Duration, ok: impl Fn(&StatusReport) -> bool) -> Result<StatusReport, String> {
        let start = Instant::now();
        loop {
            let report = self.status();
            if let Some(report) = &report
                && ok(report)
            {
                return Ok(report.clone());
            }
            if start.elapsed() > limit {
                return Err(format!("{report:#?}"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The agent's runtime API socket, once it is there (30 s at most).
    #[allow(dead_code)] // not every test that shares this module uses it
    pub fn runtime_socket(&self) -> PathBuf {
        let socket = self.root.join("runtime.sock");
        let start = Instant::now();
        while !socket.exists() {
            assert!(start.elapsed() < Duration::from_secs(30), "no runtime api socket\n{}", self.agent_log());
            std::thread::sleep(Duration::from_millis(20));
        }
        socket
    }

    pub fn agent_log(&self) -> String {
        std::fs::read_to_string(self.agent_log_path()).unwrap_or_default()
    }

    /// Every mount at or below the root, as this thread's mount table shows it.
    pub fn mounts(&self) -> Vec<MountPoint> {
        SystemMounter.mounts_under(&self.root).unwrap()
    }

    /// `kubelet/pods/<uid>/volumes/<plugin>/<name>` directories on disk.
    pub fn pod_volume_dirs(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for pod in children(&self.root.join("kubelet/pods")) {
            for plugin in children(&pod.join("volumes")) {
                out.extend(children(&plugin));
            }
        }
        out.sort();
        out
    }
}

impl Default for Node {
    fn default() -> Node {
        Node::new()
    }
}

impl Node {
    /// Copies the root's `*.log` files and the journal-free state files out of the temporary
    /// root (removed on drop) into `<tmp>/kvol-churn-<pid>-<n>/`, and says where.
    fn keep_logs(&self) {
        let dest = std::env::temp_dir().join(format!("kvol-churn-{}-{}", std::process::id(), self.starts));
        let _ = std::fs::create_dir_all(&dest);
        let wanted = |p: &Path| p.extension().is_some_and(|e| e == "log" || e == "json") && p.is_file();
        let mut files: Vec<PathBuf> = children(&self.root).into_iter().filter(|p| wanted(p)).collect();
        for dir in children(&self.root).into_iter().filter(|p| p.is_dir()) {
            files.extend(children(&dir).into_iter().filter(|p| wanted(p)));
        }
        for file in files {
            let name = file.strip_prefix(&self.root).unwrap().display().to_string().replace('/', "_");
            let _ = std::fs::copy(&file, dest.join(name));
        }
        eprintln!("logs and state files kept in {}", dest.display());
    }
}

fn children(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir).map(|d| d.flatten().map(|e| e.path()).collect()).unwrap_or_default()
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            self.keep_logs();
        }
        // The scratch root, dropped next, stops what the agent left running (the components
        // that outlive a killed agent), unmounts what is below the root and removes it.
    }
}

/// Upstream's hostpathplugin `binary` as driver `name` of node `node-a`, serving CSI on
/// `socket` (its directory made) with its state in `state_dir`; its log in `log`.
pub fn start_hostpathplugin(
    binary: &Path,
    name: &str,
    socket: &Path,
    state_dir: &Path,
    log: &Path,
) -> Daemon {
    let mut command = Command::new(binary);
    command
        .arg(format!("--endpoint=unix://{}", socket.display()))
        .args(["--nodeid=node-a", &format!("--drivername={name}")])
        .arg(format!("--statedir={}", state_dir.display()));
    std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
    Daemon::spawn("hostpathplugin", command, log)
}

/// Upstream's node-driver-registrar `binary` with kubelet's flags: the driver at `csi_address`,
/// registered for `node`'s agent to reach at `kubelet_path`; its log beside the agent's.
pub fn start_registrar(binary: &Path, csi_address: &Path, kubelet_path: &Path, node: &Node) -> Daemon {
    let mut command = Command::new(binary);
    command
        .arg(format!("--csi-address={}", csi_address.display()))
        .arg(format!("--kubelet-registration-path={}", kubelet_path.display()))
        .arg(format!("--plugin-registration-path={}", node.registration_dir().display()));
    std::fs::create_dir_all(node.registration_dir()).unwrap();
    Daemon::spawn("node-driver-registrar", command, &node.root.join("registrar.log"))
}

/// The upstream peers `KVOL_UPSTREAM_HOSTPATH` (hostpathplugin) and `KVOL_NODE_DRIVER_REGISTRAR`
/// (node-driver-registrar); `None`, with the reason printed, unless both name binaries.
pub fn upstream_hostpath_and_registrar() -> Option<(PathBuf, PathBuf)> {
    let peer = |var: &str| std::env::var_os(var).filter(|v| !v.is_empty()).map(PathBuf::from);
    let both = peer("KVOL_UPSTREAM_HOSTPATH").zip(peer("KVOL_NODE_DRIVER_REGISTRAR"));
    if both.is_none() {
        eprintln!(
            "skipped: KVOL_UPSTREAM_HOSTPATH (hostpathplugin) and KVOL_NODE_DRIVER_REGISTRAR (node-driver-registrar) must both name binaries"
        );
    }
    both
}
