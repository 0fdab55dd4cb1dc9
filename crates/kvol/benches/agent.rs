//! The agent end to end: N pods with one CSI volume each, time until all are published and the agent's memory; one more volume through the agent against the same work done straight on the bundled driver.
//!
//! `cargo bench -p kvol --bench agent` (root: it mounts, in a private mount namespace of the
//! bench thread that the agent inherits). `KVOL_BENCH_PODS` sets N (default 200); `KVOL_BENCH_AGENT_LOG` sets the agent's `KVOL_LOG` and `KVOL_BENCH_AGENT_LOG_FILE` where its log goes.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kvol_csi::proto::csi::controller_client::ControllerClient;
use kvol_csi::proto::csi::node_client::NodeClient;
use kvol_csi::proto::csi::volume_capability::{AccessMode, AccessType, MountVolume, access_mode::Mode};
use kvol_csi::proto::csi::{
    CreateVolumeRequest, NodePublishVolumeRequest, NodeStageVolumeRequest, NodeUnpublishVolumeRequest,
    NodeUnstageVolumeRequest, VolumeCapability,
};
use kvol_node::status::{Phase, read_status};
use nix::mount::MsFlags;
use nix::sched::CloneFlags;

const STORAGE: &str = "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata: {name: fast}\nprovisioner: hostpath.csi.kvol.io\n---\napiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata: {name: hostpath.csi.kvol.io}\nspec: {attachRequired: false}\n";

fn pod_with_claim(i: usize) -> String {
    format!(
        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{name: c{i}, namespace: default}}\nspec: {{storageClassName: fast, accessModes: [ReadWriteOnce], resources: {{requests: {{storage: 1Mi}}}}}}\n---\napiVersion: v1\nkind: Pod\nmetadata: {{name: p{i}, namespace: default}}\nspec:\n  containers: [{{name: app, image: busybox}}]\n  volumes: [{{name: data, persistentVolumeClaim: {{claimName: c{i}}}}}]\n"
    )
}

fn published(root: &Path, pid: u32) -> usize {
    match read_status(root) {
        Ok(r) if r.pid == pid => r.volumes.iter().filter(|v| v.phase == Phase::Published).count(),
        _ => 0,
    }
}

fn wait_published(root: &Path, pid: u32, n: usize, limit: Duration) -> Duration {
    let start = Instant::now();
    while published(root, pid) < n {
        assert!(start.elapsed() < limit, "only {} of {n} published after {limit:?}", published(root, pid));
        std::thread::sleep(Duration::from_millis(2));
    }
    start.elapsed()
}

/// `VmHWM` (peak) and `VmRSS` of a process, in MiB.
fn memory(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<f64>().ok())
            .map_or(0.0, |kb| kb / 1024.0)
    };
    (field("VmHWM:"), field("VmRSS:"))
}

fn write(dir: &Path, name: &str, text: &str) {
    let tmp = dir.join(format!(".{name}"));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, dir.join(name)).unwrap();
}

struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    nix::sched::unshare(CloneFlags::CLONE_NEWNS).expect("unshare the mount namespace (the bench needs root)");
    nix::mount::mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
        .expect("make every mount private");
    let n: usize = std::env::var("KVOL_BENCH_PODS").ok().and_then(|v| v.parse().ok()).unwrap_or(200);
    let dir = tempfile::tempdir().unwrap();
    let root: PathBuf = std::fs::canonicalize(dir.path()).unwrap();
    let manifests = root.join("manifests");
    std::fs::create_dir_all(&manifests).unwrap();
    write(&manifests, "00-storage.yaml", STORAGE);
    let agent = Agent(
        Command::new(env!("CARGO_BIN_EXE_kvol"))
            .args(["agent", "--no-metrics", "--no-example-flex-drivers", "--node-name", "bench", "--root"])
            .arg(&root)
            .env("KVOL_LOG", std::env::var("KVOL_BENCH_AGENT_LOG").unwrap_or_else(|_| "warn".into()))
            .stdout(Stdio::null())
            .stderr(match std::env::var_os("KVOL_BENCH_AGENT_LOG_FILE") {
                Some(path) => Stdio::from(std::fs::File::create(path).unwrap()),
                None => Stdio::null(),
            })
            .spawn()
            .unwrap(),
    );
    let pid = agent.0.id();
    let csi_socket = root.join("kubelet/plugins/hostpath.csi.kvol.io/csi.sock");
    let start = Instant::now();
    while !csi_socket.exists() {
        assert!(start.elapsed() < Duration::from_secs(20), "the bundled driver never started");
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(500));
    let (_, idle_before) = memory(pid);

    // N pods at once.
    let start = Instant::now();
    for i in 0..n {
        write(&manifests, &format!("p{i}.yaml"), &pod_with_claim(i));
    }
    let all = wait_published(&root, pid, n, Duration::from_secs(300));
    let (peak, _) = memory(pid);
    std::thread::sleep(Duration::from_secs(3));
    let (_, idle_after) = memory(pid);
    println!("{n} pods, each with a provisioned CSI volume (create, stage, publish on real bind mounts)");
    println!(
        "  all published {:.2} s after the manifests were written ({:.1} ms per volume); wall {:.2} s",
        all.as_secs_f64(),
        all.as_secs_f64() * 1e3 / n as f64,
        start.elapsed().as_secs_f64()
    );
    println!(
        "  agent memory: {idle_before:.1} MiB idle before, {peak:.1} MiB peak, {idle_after:.1} MiB idle after (target idle < 20 MB)"
    );

    // One more volume through the agent, against the same three calls made straight.
    let rounds = 10;
    let mut through_agent = Vec::new();
    for i in 0..rounds {
        let start = Instant::now();
        write(&manifests, &format!("q{i}.yaml"), &pod_with_claim(n + i));
        wait_published(&root, pid, n + i + 1, Duration::from_secs(60));
        through_agent.push(start.elapsed());
    }
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let direct: Vec<Duration> = runtime.block_on(async {
        let channel = tonic::transport::Endpoint::from_shared(format!("unix://{}", csi_socket.display()))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let capability = VolumeCapability {
            access_type: Some(AccessType::Mount(MountVolume::default())),
            access_mode: Some(AccessMode { mode: Mode::SingleNodeWriter as i32 }),
        };
        let mut out = Vec::new();
        for i in 0..rounds {
            let stage = root.join(format!("direct/s{i}"));
            let target = root.join(format!("direct/t{i}"));
            std::fs::create_dir_all(&stage).unwrap();
            let start = Instant::now();
            let volume = ControllerClient::new(channel.clone())
                .create_volume(CreateVolumeRequest {
                    name: format!("direct-{i}"),
                    volume_capabilities: vec![capability.clone()],
                    ..CreateVolumeRequest::default()
                })
                .await
                .unwrap()
                .into_inner()
                .volume
                .unwrap()
                .volume_id;
            let mut node = NodeClient::new(channel.clone());
            node.node_stage_volume(NodeStageVolumeRequest {
                volume_id: volume.clone(),
                staging_target_path: stage.display().to_string(),
                volume_capability: Some(capability.clone()),
                ..NodeStageVolumeRequest::default()
            })
            .await
            .unwrap();
            node.node_publish_volume(NodePublishVolumeRequest {
                volume_id: volume.clone(),
                staging_target_path: stage.display().to_string(),
                target_path: target.display().to_string(),
                volume_capability: Some(capability.clone()),
                ..NodePublishVolumeRequest::default()
            })
            .await
            .unwrap();
            out.push(start.elapsed());
            node.node_unpublish_volume(NodeUnpublishVolumeRequest {
                volume_id: volume.clone(),
                target_path: target.display().to_string(),
            })
            .await
            .unwrap();
            node.node_unstage_volume(NodeUnstageVolumeRequest {
                volume_id: volume,
                staging_target_path: stage.display().to_string(),
            })
            .await
            .unwrap();
        }
        out
    });
    let median = |mut v: Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    let (a, d) = (median(through_agent), median(direct));
    println!("one more pod with one CSI volume ({rounds} rounds, medians; target agent overhead < 10 ms)");
    println!(
        "  manifest written → published {:.1} ms through the agent; CreateVolume + NodeStage + NodePublish straight to the driver {:.1} ms; agent adds {:.1} ms (incl. the 50 ms manifest debounce)",
        a.as_secs_f64() * 1e3,
        d.as_secs_f64() * 1e3,
        a.saturating_sub(d).as_secs_f64() * 1e3
    );
    drop(agent);
}
