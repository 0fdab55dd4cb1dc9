//! A private containerd for the runner's tests and bench: Debian's containerd with runc under a scratch directory, a busybox image built from the host's static busybox, cleaned up (tasks killed and removed, then containerd stopped, shims and mounts taken by the scratch directory) even on failure.
// Compiled into every test binary that has `support`; only the runner's use it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{Daemon, Node, wait_for_path};

/// The image the pods run: the embedded runtime's example image.
pub const IMAGE: &str = kvol::embedded_runtime::EXAMPLE_IMAGE;
/// The sandbox image containerd is configured with; the same busybox, sleeping.
pub const PAUSE: &str = kvol::embedded_runtime::PAUSE_IMAGE;

/// The static busybox to build the image from, or why the tools are missing.
pub fn tools() -> Result<PathBuf, String> {
    if !nix::unistd::Uid::effective().is_root() {
        return Err("not root".into());
    }
    for tool in ["containerd", "ctr", "runc"] {
        let found = std::env::var_os("PATH")
            .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(tool).is_file()));
        if !found {
            return Err(format!("{tool} is not on PATH (apt-get install containerd runc busybox-static)"));
        }
    }
    let busybox = PathBuf::from(std::env::var_os("KVOL_BUSYBOX").unwrap_or_else(|| "/bin/busybox".into()));
    let file = std::fs::read(&busybox).map_err(|e| format!("no busybox at {}: {e}", busybox.display()))?;
    if !kvol::embedded_runtime::is_static_elf(&file) {
        return Err(format!(
            "{} is not a static busybox (apt-get install busybox-static)",
            busybox.display()
        ));
    }
    Ok(busybox)
}

/// A one-layer docker-archive image of busybox and its applet links, tagged `tags` (the
/// embedded runtime's own).
pub fn build_image(dir: &Path, busybox: &Path, tags: &[&str]) -> PathBuf {
    kvol::embedded_runtime::build_busybox_image(&dir.join("image"), busybox, tags).expect("the image is made")
}

/// A private containerd under a scratch directory; on drop every task is killed and removed
/// before containerd stops, and the scratch directory takes the rest (shims, mounts).
pub struct Containerd {
    pub dir: kvol_test_support::ScratchRoot,
    socket: PathBuf,
    daemon: Option<Daemon>,
    /// The pods' network, when it has one (dropped after containerd stops).
    network: Option<PodNetwork>,
}

/// A bridge network for pods through the CNI plugins of `KVOL_CNI_BIN` (bridge, host-local):
/// a bridge of its own and a /16 of its own, so tests can run side by side; the bridge removed
/// and `net.ipv4.ip_forward` (which the bridge plugin turns on) put back on drop. No portmap
/// and no masquerade: nothing is written to the host's firewall.
struct PodNetwork {
    bridge: String,
    ip_forward: String,
}

const IP_FORWARD: &str = "/proc/sys/net/ipv4/ip_forward";

impl PodNetwork {
    /// The network's config and plugins under `root/cni`, where containerd's config looks.
    fn set_up(root: &Path, plugins: &Path) -> PodNetwork {
        // The process's networks count up, so that two of one test never share a subnet.
        static NETWORKS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let k = NETWORKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let n = std::process::id() % 10_000 + fastrand::u32(0..1000) * 10_000 + k;
        let bridge = format!("kvol{:x}", n);
        let subnet = format!("10.{}.0.0/16", 100 + n % 150);
        std::fs::create_dir_all(root.join("cni/conf")).unwrap();
        std::os::unix::fs::symlink(plugins, root.join("cni/bin")).unwrap();
        let conflist = serde_json::json!({"cniVersion": "1.0.0", "name": "kvol-test", "plugins": [{
            "type": "bridge", "bridge": bridge, "isGateway": true, "ipMasq": false, "hairpinMode": true,
            "ipam": {"type": "host-local", "ranges": [[{"subnet": subnet}]], "routes": [{"dst": "0.0.0.0/0"}],
                     "dataDir": root.join("cni/ipam")}}]});
        std::fs::write(root.join("cni/conf/10-kvol.conflist"), conflist.to_string()).unwrap();
        let ip_forward = std::fs::read_to_string(IP_FORWARD).unwrap_or_default();
        PodNetwork { bridge, ip_forward }
    }
}

impl Drop for PodNetwork {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["link", "delete", &self.bridge]).output();
        if !self.ip_forward.is_empty() {
            let _ = std::fs::write(IP_FORWARD, &self.ip_forward);
        }
    }
}

impl Containerd {
    pub fn start() -> Containerd {
        Containerd::start_with(None)
    }

    /// A private containerd whose pods not on the host's network get a bridge network of
    /// their own from the CNI plugins in `plugins`.
    fn start_with(plugins: Option<&Path>) -> Containerd {
        let dir = kvol_test_support::ScratchRoot::new();
        let root = dir.path().to_path_buf();
        let network = plugins.map(|plugins| PodNetwork::set_up(&root, plugins));
        let socket = root.join("containerd.sock");
        let config = kvol::embedded_runtime::containerd_config(&root);
        std::fs::write(root.join("config.toml"), config).unwrap();
        let mut command = Command::new("containerd");
        command.arg("--config").arg(root.join("config.toml"));
        command.arg("--root").arg(root.join("root")).arg("--state").arg(root.join("state"));
        command.arg("--address").arg(&socket);
        let daemon = Daemon::spawn("containerd", command, &root.join("containerd.log"));
        wait_for_path(&socket, "containerd's socket", Duration::from_secs(30));
        let containerd = Containerd { dir, socket, daemon: Some(daemon), network };
        // The CRI plugin answers a moment after the socket appears.
        let start = Instant::now();
        while containerd.ctr(&["version"]).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "containerd never answered\n{}",
                containerd.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        containerd
    }

    /// A private containerd with the busybox image (and the sandbox image) imported.
    pub fn with_image(busybox: &Path) -> Containerd {
        Containerd::with_image_on(busybox, None)
    }

    /// [`Containerd::with_image`] with a pod network from the CNI plugins `KVOL_CNI_BIN`
    /// names; `None`, said, when it is unset.
    pub fn with_pod_network(busybox: &Path) -> Option<Containerd> {
        let Some(plugins) = std::env::var_os("KVOL_CNI_BIN").filter(|p| !p.is_empty()) else {
            eprintln!(
                "skipped: set KVOL_CNI_BIN to a directory of CNI plugins (bridge, host-local) for pods on a pod network"
            );
            return None;
        };
        Some(Containerd::with_image_on(busybox, Some(Path::new(&plugins))))
    }

    fn with_image_on(busybox: &Path, plugins: Option<&Path>) -> Containerd {
        let containerd = Containerd::start_with(plugins);
        let image = build_image(containerd.dir.path(), busybox, &[IMAGE, PAUSE]);
        containerd.ctr(&["images", "import", image.to_str().unwrap()]).expect("the image imports");
        containerd
    }

    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("containerd.log")).unwrap_or_default()
    }

    /// `ctr -a SOCK -n k8s.io ARGS`: its stdout, or its stderr as the error.
    pub fn ctr(&self, args: &[&str]) -> Result<String, String> {
        let out = Command::new("ctr").arg("-a").arg(&self.socket).args(["-n", "k8s.io"]).args(args).output();
        let out = out.map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// Container ids (`ctr containers ls -q`) and running tasks (`ctr tasks ls`).
    pub fn containers(&self) -> Vec<String> {
        self.ctr(&["containers", "ls", "-q"]).unwrap_or_default().lines().map(str::to_string).collect()
    }

    pub fn tasks(&self) -> Vec<String> {
        self.ctr(&["tasks", "ls", "-q"]).unwrap_or_default().lines().map(str::to_string).collect()
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        for task in self.tasks() {
            let _ = self.ctr(&["tasks", "kill", "-s", "SIGKILL", &task]);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            let tasks = self.tasks();
            for task in &tasks {
                let _ = self.ctr(&["tasks", "delete", "-f", task]);
            }
            if self.tasks().is_empty() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        for container in self.containers() {
            let _ = self.ctr(&["containers", "delete", &container]);
        }
        if std::thread::panicking() {
            eprintln!("containerd's log:\n{}", self.log());
        }
        self.daemon.take();
        // The scratch directory, dropped next, stops the shims and unmounts what is left.
    }
}

/// The runner's status of the pod of `uid`, from `<root>/runner/pods.json`.
pub fn pod_status(node: &Node, uid: &str) -> Option<Value> {
    let text = std::fs::read_to_string(node.root.join("runner/pods.json")).ok()?;
    let file: Value = serde_json::from_str(&text).ok()?;
    file["pods"].as_array()?.iter().find(|p| p["uid"] == uid).cloned()
}

/// Waits until `ok` holds of the pod's status; panics with the status and the agent's log.
pub fn wait_pod(node: &Node, uid: &str, limit: Duration, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
    let start = Instant::now();
    loop {
        if let Some(status) = pod_status(node, uid).filter(|s| ok(s)) {
            return status;
        }
        assert!(
            start.elapsed() < limit,
            "{what}: not within {limit:?}; status {:#?}\n{}",
            pod_status(node, uid),
            node.agent_log()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub fn main_container(status: &Value) -> &Value {
    &status["containers"][0]
}

/// The container's log (`<root>/logs/pods/<ns>_<name>_<uid>/<container>/0.log`) once it holds
/// `needle`, its CRI prefixes (`<time> stdout F `) taken off; panics with it and the agent's
/// log after `limit`.
pub fn wait_log(
    node: &Node,
    pod: (&str, &str, &str),
    container: &str,
    needle: &str,
    limit: Duration,
) -> String {
    let (namespace, name, uid) = pod;
    let file = node.root.join(format!("logs/pods/{namespace}_{name}_{uid}/{container}/0.log"));
    let start = Instant::now();
    loop {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        let lines: Vec<&str> = text.lines().map(|l| l.splitn(4, ' ').nth(3).unwrap_or(l)).collect();
        if lines.iter().any(|l| l.contains(needle)) {
            return lines.join("\n") + "\n";
        }
        assert!(
            start.elapsed() < limit,
            "{} never said {needle:?} within {limit:?}:\n{text}\n{}",
            file.display(),
            node.agent_log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
