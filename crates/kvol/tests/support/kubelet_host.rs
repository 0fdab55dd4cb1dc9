//! The real kubelet beside the tests and what running it takes on the host: its command and process, the sysctls it changes put back, and scratch directories bound over the host paths it writes whatever `--root-dir` says.
// Compiled into every test binary that has `support`; only the kubelet's users call it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::mount::{MntFlags, MsFlags};

/// The sysctls a starting kubelet sets (the first three) or may set (the keys), under /proc/sys.
pub const SYSCTLS: [&str; 5] = [
    "kernel/panic",
    "kernel/panic_on_oops",
    "vm/overcommit_memory",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
];

/// The sysctls as they were before the kubelet started; put back when dropped (after it
/// stopped, also on a panic).
#[derive(Debug)]
pub struct Sysctls(Vec<(PathBuf, String)>);

impl Sysctls {
    /// Reads those of [`SYSCTLS`] that the kernel has.
    pub fn save() -> Sysctls {
        let read =
            |path: PathBuf| Some((path.clone(), std::fs::read_to_string(&path).ok()?.trim().to_string()));
        Sysctls(SYSCTLS.iter().filter_map(|name| read(Path::new("/proc/sys").join(name))).collect())
    }

    /// Puts back every value that changed; what changed (`name: now -> before`).
    pub fn restore(&self) -> Vec<String> {
        let mut changed = Vec::new();
        for (path, before) in &self.0 {
            let now = std::fs::read_to_string(path).unwrap_or_default().trim().to_string();
            if now != *before {
                let name =
                    path.strip_prefix("/proc/sys").unwrap_or(path).display().to_string().replace('/', ".");
                match std::fs::write(path, before) {
                    Ok(()) => changed.push(format!("{name}: {now} -> {before}")),
                    Err(e) => eprintln!("cannot put back sysctl {name} ({now} -> {before}): {e}"),
                }
            }
        }
        changed
    }
}

impl Drop for Sysctls {
    fn drop(&mut self) {
        for change in self.restore() {
            eprintln!("sysctl put back: {change}");
        }
    }
}

/// Scratch directories bound over `/var/log` and `/var/lib/kubelet` in this thread's mount
/// namespace; unbound when dropped, and `/var/lib/kubelet` removed if it was made for them.
#[derive(Debug)]
pub struct HostDirs {
    made_var_lib_kubelet: bool,
    bound: Vec<PathBuf>,
}

impl HostDirs {
    /// Binds `<scratch>/var-log` and `<scratch>/var-lib-kubelet` over the host's.
    pub fn bind(scratch: &Path) -> HostDirs {
        let var_lib_kubelet = Path::new("/var/lib/kubelet");
        let mut dirs = HostDirs { made_var_lib_kubelet: false, bound: Vec::new() };
        if !var_lib_kubelet.exists() {
            std::fs::create_dir(var_lib_kubelet).expect("make the mount point /var/lib/kubelet");
            dirs.made_var_lib_kubelet = true;
        }
        for (source, target) in [("var-log", "/var/log"), ("var-lib-kubelet", "/var/lib/kubelet")] {
            let source = scratch.join(source);
            std::fs::create_dir_all(&source).expect("a scratch directory");
            nix::mount::mount(Some(&source), target, None::<&str>, MsFlags::MS_BIND, None::<&str>)
                .unwrap_or_else(|e| panic!("bind {} over {target}: {e}", source.display()));
            dirs.bound.push(PathBuf::from(target));
        }
        dirs
    }
}

impl Drop for HostDirs {
    fn drop(&mut self) {
        for target in self.bound.iter().rev() {
            if let Err(e) = nix::mount::umount2(target, MntFlags::MNT_DETACH) {
                eprintln!("cannot unmount {}: {e}", target.display());
            }
        }
        if self.made_var_lib_kubelet
            && let Err(e) = std::fs::remove_dir("/var/lib/kubelet")
        {
            eprintln!("cannot remove /var/lib/kubelet, which was made as a mount point: {e}");
        }
    }
}

/// A port nobody listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("a free port").local_addr().expect("its address").port()
}

/// The kubelet binary `KVOL_KUBELET` names, or why there is none.
pub fn kubelet_binary() -> Result<PathBuf, String> {
    let Some(binary) = std::env::var_os("KVOL_KUBELET").filter(|v| !v.is_empty()) else {
        return Err("set KVOL_KUBELET to a kubelet v1.26 binary".into());
    };
    let binary = PathBuf::from(binary);
    if !binary.is_file() {
        return Err(format!("KVOL_KUBELET={} is not a file", binary.display()));
    }
    Ok(binary)
}

/// Waits up to `limit` until no other kubelet runs (its sysctls would be saved as the host's
/// and put back after it); the pid of one still running then.
pub fn other_kubelet(limit: Duration) -> Option<i32> {
    let start = Instant::now();
    loop {
        let pid = std::fs::read_dir("/proc").ok()?.flatten().find_map(|entry| {
            let comm = std::fs::read_to_string(entry.path().join("comm")).ok()?;
            (comm.trim() == "kubelet").then(|| entry.file_name().to_str()?.parse::<i32>().ok()).flatten()
        });
        match pid {
            None => return None,
            Some(pid) if start.elapsed() >= limit => return Some(pid),
            Some(pid) => {
                if start.elapsed() < Duration::from_secs(1) {
                    println!("kubelet: waiting for another kubelet (pid {pid}) to end first");
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    }
}

/// The kubelet's command as the tests run it on a private containerd (`endpoint`), whatever
/// its source of pods: node `node`, everything it keeps under `dir`, cgroupfs without QoS
/// cgroups or node allocatable, no swap check, no iptables chains, its API on a free loopback
/// port and no other port, the containerd support's sandbox image.
pub fn kubelet_command(binary: &Path, dir: &Path, endpoint: &str, node: &str) -> Command {
    let path = |name: &str| dir.join(name).into_os_string();
    let mut command = Command::new(binary);
    command
        .args(["--container-runtime-endpoint", endpoint, "--image-service-endpoint", endpoint])
        .arg("--root-dir")
        .arg(path("kubelet-root"))
        .arg("--cert-dir")
        .arg(path("kubelet-pki"))
        .arg("--volume-plugin-dir")
        .arg(path("kubelet-flexvolume"))
        .args(["--cgroup-driver", "cgroupfs", "--cgroups-per-qos=false", "--enforce-node-allocatable="])
        .args(["--fail-swap-on=false", "--make-iptables-util-chains=false"])
        .args(["--hostname-override", node, "--address", "127.0.0.1"])
        .args(["--port", &free_port().to_string(), "--read-only-port", "0", "--healthz-port", "0"])
        .args(["--pod-infra-container-image", kvol::embedded_runtime::PAUSE_IMAGE, "--v=2"]);
    command
}

/// The real kubelet under a scratch directory; stopped (SIGTERM, then SIGKILL) when dropped,
/// and its root directory's mounts (its bind mount on itself) undone.
pub struct Kubelet {
    child: Child,
    pub dir: PathBuf,
}

impl Kubelet {
    /// Starts `command` (made by [`kubelet_command`] for `dir`), its output in `<dir>/kubelet.log`.
    pub fn spawn(mut command: Command, dir: &Path) -> Kubelet {
        let log = std::fs::File::create(dir.join("kubelet.log")).expect("the kubelet's log");
        let child = command
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("the kubelet's log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start the kubelet {command:?}: {e}"));
        Kubelet { child, dir: dir.to_path_buf() }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The last 40 lines of its log.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.dir.join("kubelet.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// Its `--root-dir`.
    pub fn root(&self) -> PathBuf {
        self.dir.join("kubelet-root")
    }

    /// Polls `ok` every 10 ms until it holds; how long that took. Panics, with the log's end,
    /// when the kubelet exited or after `limit`.
    pub fn wait(&mut self, what: &str, limit: Duration, mut ok: impl FnMut() -> bool) -> Duration {
        let start = Instant::now();
        while !ok() {
            self.assert_running(what);
            assert!(start.elapsed() < limit, "kubelet: {what}: not within {limit:?}\n{}", self.log_tail());
            std::thread::sleep(Duration::from_millis(10));
        }
        start.elapsed()
    }

    /// Panics, saying `what` was awaited and the log's end, when the kubelet has exited.
    pub fn assert_running(&mut self, what: &str) {
        if let Some(status) = self.child.try_wait().expect("wait for the kubelet") {
            panic!("kubelet: {what}: the kubelet exited ({status})\n{}", self.log_tail());
        }
    }

    /// SIGTERM, then SIGKILL after 10 s; how long it took to exit (zero if it had).
    pub fn stop(&mut self) -> Duration {
        let start = Instant::now();
        if self.child.try_wait().ok().flatten().is_some() {
            return Duration::ZERO;
        }
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        while start.elapsed() < Duration::from_secs(10) {
            if self.child.try_wait().ok().flatten().is_some() {
                return start.elapsed();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        eprintln!("kubelet: did not exit within 10 s of SIGTERM: killed");
        let _ = self.child.kill();
        let _ = self.child.wait();
        start.elapsed()
    }
}

impl Drop for Kubelet {
    /// Stops it, then unmounts what is mounted at or below its root, deepest first.
    fn drop(&mut self) {
        self.stop();
        for mount in kvol_test_support::mounts_below(&self.root()).iter().rev() {
            if let Err(e) = nix::mount::umount2(mount, MntFlags::MNT_DETACH) {
                eprintln!("kubelet: cannot unmount {}: {e}", mount.display());
            }
        }
    }
}

/// The kubelet and what it takes from the host, dropped in this order: the kubelet stopped, the
/// host's directories given back, the sysctls put back, the scratch directory removed.
pub struct KubeletSide {
    pub kubelet: Kubelet,
    _host_dirs: HostDirs,
    _sysctls: Sysctls,
    _dir: kvol_test_support::ScratchRoot,
}

impl KubeletSide {
    /// Once no other kubelet runs (10 min at most, else the error says so): the host's
    /// sysctls saved, its directories bound over, and the kubelet `command` makes for its
    /// scratch directory started. Needs the thread's private mount namespace.
    pub fn start(command: impl FnOnce(&Path) -> Command) -> Result<KubeletSide, String> {
        if let Some(pid) = other_kubelet(Duration::from_secs(600)) {
            return Err(format!("another kubelet, pid {pid}, still runs after 10 min"));
        }
        let dir = kvol_test_support::ScratchRoot::new();
        let sysctls = Sysctls::save();
        let host_dirs = HostDirs::bind(dir.path());
        let kubelet = Kubelet::spawn(command(dir.path()), dir.path());
        Ok(KubeletSide { kubelet, _host_dirs: host_dirs, _sysctls: sysctls, _dir: dir })
    }
}
