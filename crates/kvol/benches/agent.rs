//! The agent end to end: one pod's CSI volume and N pods' volumes published after their manifests land, each beside the same work done straight on the bundled driver; the agent's memory idle and with 100 volumes.
//!
//! `cargo bench -p kvol --bench agent` (root: it mounts, in a private mount namespace of the
//! bench thread that the agent inherits). `KVOL_BENCH_PODS` sets N (default 50); `KVOL_BENCH_AGENT_LOG` sets the agent's `KVOL_LOG` and `KVOL_BENCH_AGENT_LOG_FILE` where its log goes.

use kvol_test_support::write_whole as write;
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
use kvol_node::report::status::{Phase, read_status};
use std::os::fd::AsFd;

use nix::mount::MsFlags;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sched::CloneFlags;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

const STORAGE: &str = "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata: {name: fast}\nprovisioner: hostpath.csi.kvol.io\n---\napiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata: {name: hostpath.csi.kvol.io}\nspec: {attachRequired: false}\n";

fn pod_with_claim(i: usize) -> String {
    format!(
        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{name: c{i}, namespace: default}}\nspec: {{storageClassName: fast, accessModes: [ReadWriteOnce], resources: {{requests: {{storage: 1Mi}}}}}}\n---\napiVersion: v1\nkind: Pod\nmetadata: {{name: p{i}, namespace: default}}\nspec:\n  containers: [{{name: app, image: busybox, volumeMounts: [{{name: data, mountPath: /data}}]}}]\n  volumes: [{{name: data, persistentVolumeClaim: {{claimName: c{i}}}}}]\n"
    )
}

fn published(root: &Path, pid: u32) -> usize {
    match read_status(root) {
        Ok(r) if r.pid == pid => r.volumes.iter().filter(|v| v.phase == Phase::Published).count(),
        _ => 0,
    }
}

/// Waits until the agent's status file shows `n` volumes published, reading it again each time
/// the agent renames a new one into place (inotify: no polling to compete with the agent).
fn wait_published(status: &StatusWatch, n: usize, limit: Duration) -> Duration {
    let start = Instant::now();
    while published(&status.root, status.pid) < n {
        assert!(
            start.elapsed() < limit,
            "only {} of {n} published after {limit:?}",
            published(&status.root, status.pid)
        );
        status.next_change(Duration::from_millis(100));
    }
    start.elapsed()
}

/// The agent's state directory, watched for new status files.
struct StatusWatch {
    root: PathBuf,
    pid: u32,
    inotify: Inotify,
}

impl StatusWatch {
    fn new(root: &Path, pid: u32) -> StatusWatch {
        let inotify = Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK).unwrap();
        inotify.add_watch(root, AddWatchFlags::IN_MOVED_TO).unwrap();
        StatusWatch { root: root.to_path_buf(), pid, inotify }
    }

    /// Returns after a file is renamed into the state directory, or after `at_most`.
    fn next_change(&self, at_most: Duration) {
        let mut fds = [PollFd::new(self.inotify.as_fd(), PollFlags::POLLIN)];
        let timeout = PollTimeout::try_from(at_most).unwrap_or(PollTimeout::MAX);
        if poll(&mut fds, timeout).unwrap_or(0) > 0 {
            let _ = self.inotify.read_events();
        }
    }
}

/// The pid of the bundled driver's process, as the agent's status reports it.
fn driver_pid(root: &Path) -> u32 {
    let report = kvol_node::report::status::read_status(root).expect("the agent's status");
    let component = report.components.iter().find(|c| c.name == "hostpath").expect("the hostpath component");
    component.state.pid.expect("the bundled driver runs")
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
    let n: usize = std::env::var("KVOL_BENCH_PODS").ok().and_then(|v| v.parse().ok()).unwrap_or(50);
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
            .stderr(kvol_test_support::bench_agent_log())
            .spawn()
            .unwrap(),
    );
    let pid = agent.0.id();
    let status = StatusWatch::new(&root, pid);
    let csi_socket = root.join("kubelet/plugins/hostpath.csi.kvol.io/csi.sock");
    let start = Instant::now();
    while !csi_socket.exists() {
        assert!(start.elapsed() < Duration::from_secs(20), "the bundled driver never started");
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(500));
    let (_, idle) = memory(pid);
    let driver_process = driver_pid(&root);
    let (_, driver_idle) = memory(driver_process);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let driver = runtime.block_on(Driver::connect(&csi_socket, &root));

    // One pod at a time, against CreateVolume + NodeStage + NodePublish straight to the driver.
    let rounds = 10;
    let mut through_agent = Vec::new();
    for i in 0..rounds {
        let start = Instant::now();
        write(&manifests, &format!("q{i}.yaml"), &pod_with_claim(i));
        wait_published(&status, i + 1, Duration::from_secs(60));
        through_agent.push(start.elapsed());
    }
    let direct: Vec<Duration> =
        (0..rounds).map(|i| runtime.block_on(driver.publish(&format!("one-{i}")))).collect();
    let (a, d) = (median(through_agent), median(direct));
    println!(
        "one pod with one CSI volume ({rounds} rounds, medians): manifest renamed into place → published"
    );
    println!(
        "  {:.1} ms through the agent; CreateVolume + NodeStage + NodePublish straight to the driver {:.1} ms; agent adds {:.1} ms; goal <= 15 ms, {}",
        ms(a),
        ms(d),
        ms(a.saturating_sub(d)),
        verdict(a <= Duration::from_millis(15))
    );

    // N pods at once, against N of the same three calls made one after another.
    let start = Instant::now();
    for i in rounds..rounds + n {
        write(&manifests, &format!("p{i}.yaml"), &pod_with_claim(i));
    }
    let all = wait_published(&status, rounds + n, Duration::from_secs(300));
    // The calls' own time, one after another (the cleanup between them not counted).
    let serial: Duration = (0..n).map(|i| runtime.block_on(driver.publish(&format!("many-{i}")))).sum();
    println!("{n} pods, each with a provisioned CSI volume, written at once (real bind mounts)");
    println!(
        "  all published {:.1} ms after the manifests were written; {n} serial create + stage + publish straight to the driver {:.1} ms; ratio {:.2}x; goal <= 1.2x, {} (wall {:.2} s)",
        ms(all),
        ms(serial),
        all.as_secs_f64() / serial.as_secs_f64().max(1e-9),
        verdict(all.as_secs_f64() <= 1.2 * serial.as_secs_f64()),
        start.elapsed().as_secs_f64()
    );

    // Memory with 100 published volumes.
    let mut published_now = rounds + n;
    if published_now < 100 {
        for i in published_now..100 {
            write(&manifests, &format!("r{i}.yaml"), &pod_with_claim(i));
        }
        published_now = 100;
        wait_published(&status, published_now, Duration::from_secs(300));
    }
    std::thread::sleep(Duration::from_secs(3));
    let (peak, with_volumes) = memory(pid);
    let (driver_peak, driver_with_volumes) = memory(driver_process);
    println!(
        "agent memory (VmRSS of the agent process; the bundled driver is a component process of its own)"
    );
    println!(
        "  idle {idle:.1} MiB (goal <= 15 MB, {}); with {published_now} published volumes {with_volumes:.1} MiB (goal <= 25 MB, {}); peak {peak:.1} MiB",
        verdict(idle * 1.048_576 <= 15.0),
        verdict(with_volumes * 1.048_576 <= 25.0)
    );
    println!("  {}", code_layout());
    println!(
        "  the bundled driver (pid {driver_process}): idle {driver_idle:.1} MiB, with {published_now} volumes {driver_with_volumes:.1} MiB, peak {driver_peak:.1} MiB; agent and driver together {:.1} / {:.1} MiB",
        idle + driver_idle,
        with_volumes + driver_with_volumes
    );
    drop(agent);
}

/// How much of `link/hot-text.txt` (the functions placed together at link time) this binary
/// still has: a stale list shows here as a lower share, and as more resident code.
fn code_layout() -> String {
    let list = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/link/hot-text.txt"))
        .unwrap_or_default();
    let listed: std::collections::HashSet<&str> = list.lines().filter(|l| !l.starts_with('#')).collect();
    let symbols = match Command::new("nm").args(["--defined-only", env!("CARGO_BIN_EXE_kvol")]).output() {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).into_owned(),
        _ => return "code layout: not checked (nm did not run)".into(),
    };
    let present = symbols
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2))
        .filter(|name| listed.contains(name))
        .count();
    format!(
        "code layout: {present} of the {} functions in link/hot-text.txt are in this binary (fewer: regenerate it, see link/README.md)",
        listed.len()
    )
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "NOT MET" }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// The bundled driver, called straight over its socket: the baseline.
struct Driver {
    channel: tonic::transport::Channel,
    work: PathBuf,
    capability: VolumeCapability,
}

impl Driver {
    async fn connect(socket: &Path, root: &Path) -> Driver {
        let channel = tonic::transport::Endpoint::from_shared(format!("unix://{}", socket.display()))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let capability = VolumeCapability {
            access_type: Some(AccessType::Mount(MountVolume::default())),
            access_mode: Some(AccessMode { mode: Mode::SingleNodeWriter as i32 }),
        };
        Driver { channel, work: root.join("direct"), capability }
    }

    /// CreateVolume + NodeStageVolume + NodePublishVolume of a new volume `name`, timed; the
    /// volume is unpublished and unstaged afterwards, outside the time.
    async fn publish(&self, name: &str) -> Duration {
        let stage = self.work.join(format!("s-{name}"));
        let target = self.work.join(format!("t-{name}"));
        std::fs::create_dir_all(&stage).unwrap();
        let start = Instant::now();
        let volume = ControllerClient::new(self.channel.clone())
            .create_volume(CreateVolumeRequest {
                name: format!("direct-{name}"),
                volume_capabilities: vec![self.capability.clone()],
                ..CreateVolumeRequest::default()
            })
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap()
            .volume_id;
        let mut node = NodeClient::new(self.channel.clone());
        node.node_stage_volume(NodeStageVolumeRequest {
            volume_id: volume.clone(),
            staging_target_path: stage.display().to_string(),
            volume_capability: Some(self.capability.clone()),
            ..NodeStageVolumeRequest::default()
        })
        .await
        .unwrap();
        node.node_publish_volume(NodePublishVolumeRequest {
            volume_id: volume.clone(),
            staging_target_path: stage.display().to_string(),
            target_path: target.display().to_string(),
            volume_capability: Some(self.capability.clone()),
            ..NodePublishVolumeRequest::default()
        })
        .await
        .unwrap();
        let took = start.elapsed();
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
        took
    }
}
