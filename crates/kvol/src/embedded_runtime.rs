//! `--container-runtime-endpoint embedded`: a private containerd under the state directory, supervised as the bundled driver is, with the example image made from the host's static busybox — or, where that cannot be, the reason the agent stays volumes-only.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use kvol_components_runtime::supervisor::{ProcessSpec, Supervised, SupervisorSettings};
use sha2::{Digest, Sha256};

/// The flag's value that asks for it.
pub const EMBEDDED: &str = "embedded";
/// The example pods' image, made here from the host's busybox.
pub const EXAMPLE_IMAGE: &str = "kvol.local/busybox:1";
/// The sandbox ("pause") image: the same busybox, sleeping.
pub const PAUSE_IMAGE: &str = "kvol.local/pause:1";
const BUSYBOX: &str = "/bin/busybox";

/// The private containerd, running.
#[derive(Debug)]
pub struct EmbeddedRuntime {
    dir: PathBuf,
    supervised: Supervised,
}

/// Why no private containerd can run here (not root, a tool missing, no static busybox), or
/// `None` when it can.
pub fn unavailable() -> Option<String> {
    if !nix::unistd::Uid::effective().is_root() {
        return Some("not root".into());
    }
    for tool in ["containerd", "ctr", "runc"] {
        if which(tool).is_none() {
            return Some(format!("{tool} is not on PATH (apt-get install containerd runc busybox-static)"));
        }
    }
    match std::fs::read(BUSYBOX) {
        Ok(bytes) if is_static_elf(&bytes) => None,
        Ok(_) => Some(format!("{BUSYBOX} is not a static busybox (apt-get install busybox-static)")),
        Err(e) => Some(format!("no busybox at {BUSYBOX}: {e}")),
    }
}

fn which(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join(tool)).find(|p| p.is_file())
}

/// A 64-bit ELF executable without a PT_INTERP program header (no dynamic loader).
pub fn is_static_elf(file: &[u8]) -> bool {
    if file.len() < 64 || &file[..4] != b"\x7fELF" || file[4] != 2 {
        return false;
    }
    let u16_at = |at: usize| u16::from_le_bytes([file[at], file[at + 1]]) as usize;
    let Ok(phoff) = file[0x20..0x28].try_into().map(u64::from_le_bytes) else { return false };
    let (size, count) = (u16_at(0x36), u16_at(0x38));
    (0..count).all(|i| {
        let at = phoff as usize + i * size;
        file.get(at..at + 4).is_some_and(|t| t != 3u32.to_le_bytes())
    })
}

/// containerd's config: its own root, state and socket under `dir`, runc, the local pause
/// image, and what these machines need (`restrict_oom_score_adj`, no AppArmor).
pub fn containerd_config(dir: &Path) -> String {
    let root = dir.display();
    format!(
        r#"version = 2
root = "{root}/root"
state = "{root}/state"
[grpc]
  address = "{root}/containerd.sock"
[plugins."io.containerd.internal.v1.opt"]
  path = "{root}/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
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
"#
    )
}

/// The CRI endpoint of the private containerd of the state directory `state_dir`.
pub fn endpoint_in(state_dir: &Path) -> String {
    format!("unix://{}", state_dir.join("containerd/containerd.sock").display())
}

impl EmbeddedRuntime {
    /// Starts containerd under `<state dir>/containerd`, waits until it answers, and imports
    /// the example image unless it is there.
    pub async fn start(state_dir: &Path) -> anyhow::Result<EmbeddedRuntime> {
        let dir = state_dir.join("containerd");
        std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let config = dir.join("config.toml");
        std::fs::write(&config, containerd_config(&dir))
            .with_context(|| format!("cannot write {}", config.display()))?;
        let command = ["containerd", "--config", &config.to_string_lossy()].map(str::to_string).to_vec();
        let spec = ProcessSpec {
            name: "containerd".into(),
            command,
            csi_socket: None,
            log_file: dir.join("containerd.log"),
            pid_file: Some(dir.join("containerd.pid")),
            config: None,
            reload: Default::default(),
        };
        let settings = SupervisorSettings { stop_grace: Duration::from_secs(5), ..Default::default() };
        let runtime = EmbeddedRuntime { supervised: Supervised::start(spec, settings), dir };
        runtime.wait_until_answering(Duration::from_secs(30)).await?;
        if runtime.ctr(&["images", "ls", "-q", &format!("name=={EXAMPLE_IMAGE}")]).await?.trim().is_empty() {
            let archive = build_busybox_image(
                &runtime.dir.join("image"),
                Path::new(BUSYBOX),
                &[EXAMPLE_IMAGE, PAUSE_IMAGE],
            )?;
            runtime.ctr(&["images", "import", &archive.to_string_lossy()]).await?;
            tracing::info!(image = EXAMPLE_IMAGE, "the example image was made from the host's busybox");
        }
        Ok(runtime)
    }

    /// Stops and removes every pod sandbox (their containers with them), until none is left
    /// or 20 s pass.
    async fn remove_every_pod(&self) {
        let endpoint = format!("unix://{}", self.dir.join("containerd.sock").display());
        let cri = match kvol_cri::CriClient::new(&endpoint, Default::default()) {
            Ok(cri) => cri,
            Err(e) => {
                return tracing::warn!(error = %e, "cannot reach the private containerd to remove its pods");
            }
        };
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(20) {
            let listed = match cri.list_pod_sandbox(Default::default()).await {
                Ok(list) => list.items,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot list the pods of the private containerd");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            if listed.is_empty() {
                return;
            }
            for sandbox in listed {
                let id = sandbox.id;
                let stopped =
                    cri.stop_pod_sandbox(kvol_cri::StopPodSandboxRequest { pod_sandbox_id: id.clone() });
                if let Err(e) = stopped.await {
                    tracing::warn!(sandbox = %id, error = %e, "cannot stop a pod of the private containerd");
                }
                let removed =
                    cri.remove_pod_sandbox(kvol_cri::RemovePodSandboxRequest { pod_sandbox_id: id.clone() });
                if let Err(e) = removed.await {
                    tracing::warn!(sandbox = %id, error = %e, "cannot remove a pod of the private containerd");
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tracing::warn!("pods were still in the private containerd after 20 s");
    }

    async fn wait_until_answering(&self, limit: Duration) -> anyhow::Result<()> {
        let start = Instant::now();
        loop {
            if self.ctr(&["version"]).await.is_ok() {
                return Ok(());
            }
            if start.elapsed() > limit {
                let log = std::fs::read_to_string(self.dir.join("containerd.log")).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(5).collect();
                bail!(
                    "the private containerd did not answer within {limit:?}; its log ends:\n{}",
                    tail.join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `ctr -a <socket> -n k8s.io ARGS`: its output, or its error.
    async fn ctr(&self, args: &[&str]) -> anyhow::Result<String> {
        let socket = self.dir.join("containerd.sock");
        let out = tokio::process::Command::new("ctr")
            .arg("-a")
            .arg(&socket)
            .args(["-n", "k8s.io"])
            .args(args)
            .output()
            .await
            .context("cannot run ctr")?;
        if !out.status.success() {
            bail!("ctr {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Stops containerd (its containers' shims keep running, for the next start to find).
    pub async fn stop(self) {
        self.supervised.stop().await;
    }

    /// Removes every pod, stops containerd, and waits (5 s at most) until no process of its
    /// own is left (the shims end a moment after their last container).
    pub async fn stop_leaving_nothing(self) {
        self.remove_every_pod().await;
        let socket = self.dir.join("containerd.sock").to_string_lossy().into_owned();
        self.supervised.stop().await;
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(5) && !processes_naming(&socket).is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let left = processes_naming(&socket);
        if !left.is_empty() {
            tracing::warn!(?left, "processes of the private containerd still run");
        }
    }
}

/// The pids of the processes whose command line names `needle` (the shims name their
/// containerd's socket).
fn processes_naming(needle: &str) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            String::from_utf8_lossy(&cmdline).contains(needle)
        })
        .collect()
}

/// A one-layer docker-archive image (`ctr images import`'s input) of `busybox` and its applet
/// links, tagged `tags`, written under `dir`; the archive's path.
pub fn build_busybox_image(dir: &Path, busybox: &Path, tags: &[&str]) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let layer = busybox_layer(busybox)?;
    let layer_digest = hex(&Sha256::digest(&layer));
    let config = serde_json::json!({
        "architecture": "amd64", "os": "linux",
        "config": {"Env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"], "Cmd": ["sleep", "100000"]},
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{layer_digest}")]}
    });
    let config = serde_json::to_vec(&config)?;
    let config_name = format!("{}.json", hex(&Sha256::digest(&config)));
    let manifest = serde_json::json!([{"Config": config_name, "RepoTags": tags, "Layers": ["layer.tar"]}]);
    let archive = dir.join("busybox.tar");
    let file =
        std::fs::File::create(&archive).with_context(|| format!("cannot create {}", archive.display()))?;
    let mut out = tar::Builder::new(file);
    append(&mut out, "layer.tar", &layer, 0o644)?;
    append(&mut out, &config_name, &config, 0o644)?;
    append(&mut out, "manifest.json", &serde_json::to_vec(&manifest)?, 0o644)?;
    out.into_inner()?.sync_all()?;
    Ok(archive)
}

/// The layer: `/bin/busybox`, a link to it for each applet it lists, and the directories a
/// container expects.
fn busybox_layer(busybox: &Path) -> anyhow::Result<Vec<u8>> {
    let binary = std::fs::read(busybox).with_context(|| format!("cannot read {}", busybox.display()))?;
    let listed = std::process::Command::new(busybox)
        .arg("--list-full")
        .output()
        .with_context(|| format!("cannot run {} --list-full", busybox.display()))?;
    let mut layer = tar::Builder::new(Vec::new());
    for dir in ["bin/", "sbin/", "usr/", "usr/bin/", "usr/sbin/", "tmp/", "etc/", "proc/", "sys/", "dev/"] {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Directory);
        header.set_mode(if dir == "tmp/" { 0o1777 } else { 0o755 });
        header.set_size(0);
        layer.append_data(&mut header, dir, std::io::empty())?;
    }
    append(&mut layer, "bin/busybox", &binary, 0o755)?;
    for applet in String::from_utf8_lossy(&listed.stdout).lines().filter(|a| *a != "bin/busybox") {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Symlink);
        header.set_mode(0o777);
        header.set_size(0);
        layer.append_link(&mut header, applet, "/bin/busybox")?;
    }
    Ok(layer.into_inner()?)
}

fn append<W: Write>(out: &mut tar::Builder<W>, name: &str, data: &[u8], mode: u32) -> anyhow::Result<()> {
    let mut header = tar::Header::new_gnu();
    header.set_size(data.len() as u64);
    header.set_mode(mode);
    header.set_entry_type(tar::EntryType::Regular);
    out.append_data(&mut header, name, data)?;
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_and_dynamic_executables() {
        // This test binary is dynamically linked: it names its loader.
        let own = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        assert!(!is_static_elf(&own));
        assert!(!is_static_elf(b"#!/bin/sh\n"));
    }

    #[test]
    fn the_config_keeps_everything_under_its_directory() {
        let config = containerd_config(Path::new("/var/lib/kvol/containerd"));
        for line in [
            "root = \"/var/lib/kvol/containerd/root\"",
            "address = \"/var/lib/kvol/containerd/containerd.sock\"",
            "restrict_oom_score_adj = true",
        ] {
            assert!(config.contains(line), "{line} in\n{config}");
        }
    }
}
