//! A private containerd for the runner's tests and bench: Debian's containerd with runc under a scratch directory, a busybox image built from the host's static busybox, cleaned up (tasks killed and removed, then containerd stopped, shims and mounts taken by the scratch directory) even on failure.
// Compiled into every test binary that has `support`; only the runner's use it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{Daemon, Node, wait_for_path};

/// The image the pods run.
pub const IMAGE: &str = "kvol.test/busybox:1";
/// The sandbox image containerd is configured with; the same busybox, sleeping.
pub const PAUSE: &str = "kvol.test/pause:1";

/// The static busybox to build the image from, or why the tools are missing.
pub fn tools() -> Result<PathBuf, String> {
    if !nix::unistd::Uid::effective().is_root() {
        return Err("not root".into());
    }
    for tool in ["containerd", "ctr", "runc", "tar", "sha256sum"] {
        let found = std::env::var_os("PATH")
            .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(tool).is_file()));
        if !found {
            return Err(format!("{tool} is not on PATH (apt-get install containerd runc busybox-static)"));
        }
    }
    let busybox = PathBuf::from(std::env::var_os("KVOL_BUSYBOX").unwrap_or_else(|| "/bin/busybox".into()));
    let file = std::fs::read(&busybox).map_err(|e| format!("no busybox at {}: {e}", busybox.display()))?;
    if !is_static_elf(&file) {
        return Err(format!(
            "{} is not a static busybox (apt-get install busybox-static)",
            busybox.display()
        ));
    }
    Ok(busybox)
}

/// A 64-bit ELF executable without a PT_INTERP program header (no dynamic loader).
fn is_static_elf(file: &[u8]) -> bool {
    if file.len() < 64 || &file[..4] != b"\x7fELF" || file[4] != 2 {
        return false;
    }
    let u16_at = |at: usize| u16::from_le_bytes([file[at], file[at + 1]]) as usize;
    let phoff = u64::from_le_bytes(file[0x20..0x28].try_into().unwrap()) as usize;
    let (size, count) = (u16_at(0x36), u16_at(0x38));
    (0..count).all(|i| {
        let at = phoff + i * size;
        file.get(at..at + 4).is_some_and(|t| u32::from_le_bytes(t.try_into().unwrap()) != 3)
    })
}

fn run(command: &mut Command) -> String {
    let out = command.output().unwrap_or_else(|e| panic!("{command:?}: {e}"));
    assert!(out.status.success(), "{command:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn sha256(file: &Path) -> String {
    run(Command::new("sha256sum").arg(file)).split_whitespace().next().unwrap().to_string()
}

/// A one-layer docker-archive image of busybox and its applet links, tagged `tags`.
pub fn build_image(dir: &Path, busybox: &Path, tags: &[&str]) -> PathBuf {
    let rootfs = dir.join("rootfs");
    let out = dir.join("image");
    for sub in ["bin", "tmp", "etc", "proc", "sys", "dev"] {
        std::fs::create_dir_all(rootfs.join(sub)).unwrap();
    }
    std::fs::create_dir_all(&out).unwrap();
    std::fs::copy(busybox, rootfs.join("bin/busybox")).unwrap();
    for applet in run(Command::new(busybox).arg("--list-full")).lines() {
        let link = rootfs.join(applet);
        if applet == "bin/busybox" || link.exists() {
            continue;
        }
        std::fs::create_dir_all(link.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink("/bin/busybox", link).unwrap();
    }
    let layer = out.join("layer.tar");
    run(Command::new("tar")
        .args(["--numeric-owner", "--owner=0", "--group=0", "-C"])
        .arg(&rootfs)
        .arg("-cf")
        .arg(&layer)
        .arg("."));
    let config = serde_json::json!({
        "architecture": "amd64", "os": "linux",
        "config": {"Env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"], "Cmd": ["sleep", "100000"]},
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{}", sha256(&layer))]}
    });
    let config_file = out.join("config.json");
    std::fs::write(&config_file, serde_json::to_vec(&config).unwrap()).unwrap();
    let config_name = format!("{}.json", sha256(&config_file));
    std::fs::rename(&config_file, out.join(&config_name)).unwrap();
    let manifest = serde_json::json!([{"Config": config_name, "RepoTags": tags, "Layers": ["layer.tar"]}]);
    std::fs::write(out.join("manifest.json"), serde_json::to_vec(&manifest).unwrap()).unwrap();
    let archive = dir.join("busybox.tar");
    run(Command::new("tar").arg("-C").arg(&out).arg("-cf").arg(&archive).arg("."));
    archive
}

/// A private containerd under a scratch directory; on drop every task is killed and removed
/// before containerd stops, and the scratch directory takes the rest (shims, mounts).
pub struct Containerd {
    pub dir: kvol_test_support::ScratchRoot,
    socket: PathBuf,
    daemon: Option<Daemon>,
}

impl Containerd {
    pub fn start() -> Containerd {
        let dir = kvol_test_support::ScratchRoot::new();
        let root = dir.path().to_path_buf();
        let socket = root.join("containerd.sock");
        let config = format!(
            r#"version = 2
root = "{root}/root"
state = "{root}/state"
[grpc]
  address = "{socket}"
[plugins."io.containerd.internal.v1.opt"]
  path = "{root}/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE}"
  restrict_oom_score_adj = true
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{root}/cni/bin"
    conf_dir = "{root}/cni/conf"
"#,
            root = root.display(),
            socket = socket.display(),
        );
        std::fs::write(root.join("config.toml"), config).unwrap();
        let mut command = Command::new("containerd");
        command.arg("--config").arg(root.join("config.toml"));
        command.arg("--root").arg(root.join("root")).arg("--state").arg(root.join("state"));
        command.arg("--address").arg(&socket);
        let daemon = Daemon::spawn("containerd", command, &root.join("containerd.log"));
        wait_for_path(&socket, "containerd's socket", Duration::from_secs(30));
        let containerd = Containerd { dir, socket, daemon: Some(daemon) };
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
